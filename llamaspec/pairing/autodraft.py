"""`--draft auto`: pick how to draft for a target, and say why.

Order (first that applies wins; each choice is named by llama.cpp's spec type):
  1. draft-mtp     the target's own MTP/NextN heads (nextn_predict_layers > 0), or a Gemma 4
                   assistant GGUF beside the target file that fits it (how Gemma 4 repos ship
                   their MTP heads: an mtp-*.gguf of architecture gemma4-assistant); other
                   mtp-*.gguf sidecars only with mtp_sidecars=True;
  1b. draft-dspark / draft-dflash / draft-eagle3  a draft made for this target (its header names
                   the target layers it reads; compat.draft_fit_rules), beside the target or on
                   disk, in llama.cpp's preference order (DSpark, DFlash, EAGLE-3);
  2. draft-simple  a compatible GGUF already on disk, clearly smaller than the target: same
                   architecture family first, very-low-bit quants last, then the smallest file
                   (discovery.places: the target's folder, $LLAMASPEC_MODELS_PATH, --search, the
                   Hugging Face cache, LM Studio, Ollama), and only when it is expected to pay on
                   this machine (draft_value.py: its measured costs, stored per pair by a run that
                   used it, else the cold estimate from file sizes); a draft that does not pay is
                   named in `considered` with why, and the chain goes on to step 4;
  3. draft-simple  the registry's recommended draft for the target's family, checked on its Hub
                   header and downloaded through hub.resolve_model (never when offline); an entry
                   with a `kind` (a registry EAGLE-3 draft) is chosen as that kind; pairs marked
                   `translated` (another vocabulary: drafts through text) after every token-exact one;
  3b. draft-simple a translated draft on disk that a measurement says pays (`pays`, the tune
                   store: translated_pairs.pick_translated);
  4. prompt-lookup drafts from the text itself: needs no model, always available.
`check` and a user-given `--draft` go through pairing/check.py.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Sequence

from llamaspec.errors import HubError, LlamaspecError
from llamaspec.gguf.drafts import kind_of_arch
from llamaspec.gguf.header import GGUFHeader, read_file
from llamaspec.gguf.peek import peek
from llamaspec.gguf.vocab import VocabInfo, vocab_from_header
from llamaspec.pairing import compat, discovery, draft_value
from llamaspec.pairing.compat import Verdict

# A draft costing more than this fraction of the target per token rarely pays off (file size is
# the cost proxy: decoding is memory-bound).
MAX_SIZE_RATIO = 0.6
# Drafts this coarse accept too few tokens to be a first choice.
_LOW_BIT = ("IQ1", "IQ2", "Q2_", "TQ1", "TQ2", "Q1_")


#: the note a broken or missing registry leaves in `considered`; callers show it always (a warning,
#: not a reason), so a bad edit to a pairings file is never silent
REGISTRY_UNAVAILABLE = "registry unavailable"


@dataclass(frozen=True)
class DraftChoice:
    kind: str                        # llama.cpp's spec type: draft-mtp | draft-dspark | draft-dflash |
                                     # draft-eagle3 | draft-simple | prompt-lookup
    path: Path | None                # the draft GGUF; for draft-mtp: a sidecar, or None = heads inside the target
    reason: str                      # one line: why this one
    verdict: Verdict | None = None   # for draft-simple: the compatibility verdict against the target
    source: str = "fallback"         # target | sidecar | disk | registry | fallback
    label: str | None = None         # how people name the draft (repo:quant, file, Ollama name)
    considered: tuple[str, ...] = ()  # what each earlier step found, for -v and `pair`
    would_download: bool = False     # dry run: the registry draft that would be downloaded (path None)
    searched: tuple[str, ...] = ()   # the places looked in for a draft on disk (Root.describe)
    value: draft_value.DraftValue | None = None   # draft-simple from disk: expected to pay? (taken or refused)
    refused: Path | None = None      # a draft on disk that was found but is not expected to pay here

    def to_dict(self) -> dict:
        return {"kind": self.kind, "path": str(self.path) if self.path else None, "label": self.label,
                "source": self.source, "reason": self.reason, "would_download": self.would_download,
                "considered": list(self.considered), "searched": list(self.searched),
                "verdict": self.verdict.to_dict() if self.verdict else None,
                "value": self.value.to_dict() if self.value else None,
                "refused": str(self.refused) if self.refused else None}


# ---- step 1: MTP -------------------------------------------------------------------------------


def _beside(target_path: Path) -> list[Path]:
    try:
        return [p for p in sorted(target_path.parent.iterdir())
                if p != target_path and p.name.lower().endswith(".gguf") and p.is_file()]
    except OSError:
        return []


def mtp_sidecars(target_path: Path) -> list[Path]:
    """MTP sidecars beside the target: Gemma 4 assistant GGUFs (any name) first, then mtp-*.gguf
    (or *-mtp-*.gguf) files whose header has MTP heads."""
    assistants, named = [], []
    for p in _beside(target_path):
        pk = peek(p)
        if pk is not None and pk.architecture == "gemma4-assistant":
            assistants.append(p)
        elif pk is not None and discovery.is_mtp_sidecar_name(p.name) and pk.nextn_predict_layers > 0:
            named.append(p)
    return assistants + named


def find_mtp_sidecar(target_path: Path) -> Path | None:
    """The first of mtp_sidecars(target_path), if any."""
    found = mtp_sidecars(target_path)
    return found[0] if found else None


def spec_drafts_beside(header: GGUFHeader, vocab: VocabInfo | None = None) -> list[discovery.Candidate]:
    """Drafts made for a target (EAGLE-3, DFlash, DSpark, assistant) beside the target file, checked."""
    src = Path(header.source)
    if not src.is_file():
        return []
    files = [p for p in _beside(src) if kind_of_arch(getattr(peek(p), "architecture", None))]
    return discovery.scan(header, [discovery.Root(p, "beside") for p in files], target_vocab=vocab)


def mtp_choice(header: GGUFHeader, *, sidecars: bool = False, notes: list[str] | None = None) -> DraftChoice | None:
    """MTP heads in the target, else a Gemma 4 assistant beside it that fits the target, else (with
    `sidecars`) another MTP sidecar file beside it.

    An mtp-*.gguf that is not an assistant holds NextN layers of its own model: without `sidecars`
    it is only reported in `notes` (untested as a separate draft: its layers expect their own
    model's embeddings and KV).
    """
    n = header.nextn_predict_layers
    if n > 0:
        return DraftChoice("draft-mtp", None, f"the target carries its own MTP heads ({n} NextN layer{'s' if n > 1 else ''}): "
                                        "no separate draft model needed", source="target", label="built-in MTP heads")
    src = Path(header.source)
    found = mtp_sidecars(src) if src.is_file() else []
    side = None
    for side in found:
        if getattr(peek(side), "architecture", None) != "gemma4-assistant":
            break
        try:
            v = compat.check_headers(header, read_file(side))
        except LlamaspecError as exc:
            v, why = None, exc.message
        else:
            why = v.reason
        if v is not None and v.compatible:
            return DraftChoice("draft-mtp", side, f"Gemma 4 assistant {side.name} beside the target (MTP heads "
                               "sharing the target's KV cache)", v, source="sidecar", label=side.name)
        if notes is not None:
            notes.append(f"assistant {side.name} beside the target does not fit it: {why}")
        side = None
    if side is None:
        return None
    if sidecars:
        return DraftChoice("draft-mtp", side, f"MTP sidecar {side.name} beside the target", source="sidecar",
                           label=side.name)
    if notes is not None:
        notes.append(f"MTP sidecar {side.name} beside the target is not used (separate MTP heads are supported "
                     "for Gemma 4 assistants only)")
    return None


# ---- step 1b: drafts made for this target ------------------------------------------------------

# llama.cpp's preference when a repo ships several (common/arg.cpp: dspark > dflash > eagle3)
_SPEC_ORDER = ("draft-mtp", "draft-dspark", "draft-dflash", "draft-eagle3")


def pick_spec_draft(candidates: Sequence[discovery.Candidate], notes: list[str]
                    ) -> tuple[discovery.Candidate | None, str]:
    """The best draft made for this target among `candidates` (EAGLE-3, DFlash, DSpark, assistant)."""
    spec = [c for c in candidates if c.draft_kind in _SPEC_ORDER]
    for c in spec:
        if not c.compatible:
            notes.append(f"{c.draft_kind} draft {c.label} does not fit: {c.verdict.reason if c.verdict else c.skipped}")
    fits = sorted((c for c in spec if c.compatible), key=lambda c: (_SPEC_ORDER.index(c.draft_kind), c.size))
    if not fits:
        return None, "no draft made for this target on disk"
    best = fits[0]
    info = (best.verdict.draft.get("draft_info") or {}) if best.verdict else {}
    layers = f", reads target layers {info['target_layers']}" if info.get("target_layers") else ""
    return best, f"{info.get('label', best.draft_kind)} made for this target: {best.label}{layers}"


# ---- step 2: on disk ---------------------------------------------------------------------------


def _low_bit(file_type: str | None) -> bool:
    return bool(file_type) and file_type.upper().startswith(_LOW_BIT)


def _mb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def pick_disk_draft(header: GGUFHeader, candidates: Sequence[discovery.Candidate]
                    ) -> tuple[discovery.Candidate | None, str]:
    """The best compatible file on disk for `header`, and one line on the pick (or on why none)."""
    target_size = header.file_size or 0
    fam = compat.arch_family(header.architecture)
    compatible = [c for c in candidates if c.compatible and c.draft_kind == "draft-simple"]
    if not compatible:
        return None, "no compatible GGUF on disk"
    usable, too_big = [], []
    for c in compatible:
        ratio = c.size / target_size if target_size else 0.0
        (usable if ratio <= MAX_SIZE_RATIO else too_big).append(c)
    if not usable:
        return None, (f"{len(too_big)} compatible GGUF(s) on disk, none small enough to pay off "
                      f"(drafts must be <= {MAX_SIZE_RATIO:.0%} of the target's size)")

    def key(c: discovery.Candidate):
        return (compat.arch_family(c.architecture or "") != fam, _low_bit(c.file_type), c.size)

    usable.sort(key=key)
    best = usable[0]
    ratio = best.size / target_size if target_size else 0.0
    same = compat.arch_family(best.architecture or "") == fam
    why = (f"smallest compatible {'same-family ' if same else ''}GGUF on disk: {best.label} "
           f"({_mb(best.size)}, {ratio:.0%} of the target's size)")
    others = len(usable) - 1 + len(too_big)
    if others:
        why += f"; {others} other compatible file{'s' if others > 1 else ''} passed over"
    if _low_bit(best.file_type):
        why += f" (note: {best.file_type} is a very low-bit quant; expect lower acceptance)"
    return best, why


# ---- step 3: registry --------------------------------------------------------------------------


def _package_file(spec: str | None, file: str | None) -> Path | None:
    """A GGUF shipped inside an installed PyPI package (registry `package` entries)."""
    if not file:
        return None
    for base in sys.path:
        p = Path(base or ".") / file
        if p.is_file():
            return p
    return None


def registry_choice(header: GGUFHeader, vocab: VocabInfo, *, offline: bool, allow_download: bool,
                    dry_run: bool, notes: list[str]) -> DraftChoice | None:
    from llamaspec import hub
    from llamaspec.pairing import registry

    try:
        reg = registry.load_registry()
    except LlamaspecError as exc:
        notes.append(f"{REGISTRY_UNAVAILABLE}: {exc.message}")
        return None
    matches = reg.match(header.architecture, vocab)
    if not matches:
        notes.append(f"registry: no family for architecture {header.architecture} with this vocabulary")
        return None
    if all(m.family.mtp for m in matches):
        notes.append(f"registry: family {matches[0].family.name} is MTP-capable, but this file has no MTP heads")
    # token-exact drafts first: a translated pair costs re-tokenization every step
    suggestions = sorted(reg.suggestions(matches, header.n_params), key=lambda s: bool(s.pair and s.pair.translated))
    if not suggestions:
        notes.append(f"registry: family {matches[0].family.name} lists no draft smaller than the target")
        return None
    hub_down = skipped_hub = False
    for s in suggestions:
        d = s.draft
        if d.package:
            p = _package_file(d.package, d.file)
            if p is None:
                notes.append(f"registry draft {d.label}: package not installed")
                continue
            try:
                v = compat.check_headers(header, read_file(p), target_vocab=vocab)
            except LlamaspecError as exc:
                notes.append(f"registry draft {d.label}: {exc.message}")
                continue
            if v.compatible or (s.pair and s.pair.translated and v.can_draft):
                return DraftChoice(d.kind, p, f"registry draft {d.id} from an installed package ({s.reason}"
                                   + ("; translated: another vocabulary" if not v.compatible else "") + ")",
                                   v, source="registry", label=d.label)
            notes.append(f"registry draft {d.label}: {v.reason}")
            continue
        if d.ref is None:
            continue  # a local requantization: nothing to fetch
        if offline or not allow_download:
            if not skipped_hub:  # one note is enough; an installed package draft may still follow
                notes.append(f"registry suggests {d.ref} ({s.pair.status if s.pair else 'unverified'}); "
                             f"{'offline' if offline else 'downloads not allowed'}: not downloading")
            skipped_hub = True
            continue
        if dry_run:
            return DraftChoice(d.kind, None, f"would download the registry's draft {d.ref} ({s.reason}; "
                               f"status {s.pair.status if s.pair else 'unverified'})", source="registry",
                               label=d.ref, would_download=True)
        if hub_down:
            continue
        try:  # check the Hub file's header before downloading the weights
            v = compat.check_headers(header, hub.read_model_header(d.ref), target_vocab=vocab)
        except HubError as exc:
            notes.append(f"registry draft {d.ref}: {exc.message}")
            # Network down (hub.failures.network_down): do not wait on every other suggestion too.
            hub_down = exc.message.startswith("cannot reach")
            continue
        except LlamaspecError as exc:
            notes.append(f"registry draft {d.ref}: {exc.message}")
            continue
        if not (v.compatible or (s.pair and s.pair.translated and v.can_draft)):
            notes.append(f"registry draft {d.ref} does not match this target: {v.reason}")
            continue
        try:
            path = Path(hub.resolve_model(d.ref))
        except LlamaspecError as exc:
            notes.append(f"registry draft {d.ref}: {exc.message}")
            continue
        if not path.is_file():
            notes.append(f"registry draft {d.ref}: download not available")
            continue
        return DraftChoice(d.kind, path, f"registry's draft {d.ref}, downloaded ({s.reason})", v,
                           source="registry", label=d.ref)
    return None


# ---- the whole chain ---------------------------------------------------------------------------


def searched_places(roots: Sequence[discovery.Root], cut: Sequence[discovery.Root] = ()) -> tuple[str, ...]:
    """One phrase per place looked in, for -v and `pair`; a place the time limit cut short says so."""
    stopped = set(cut)
    return tuple(r.describe() + (f" (stopped: the scan's {discovery.SCAN_SECONDS:g} s limit)" if r in stopped else "")
                 for r in roots)


def choose_for_header(header: GGUFHeader, *, candidates: Sequence[discovery.Candidate] | None = None,
                      search_dirs: Iterable[str | os.PathLike[str]] = (), default_dirs: bool = True,
                      offline: bool = False, allow_download: bool = True, dry_run: bool = False,
                      mtp_sidecars: bool = False, pays=None, searched: Sequence[str] = (),
                      draft_costs=None, gpu: bool = False, gate: bool = True) -> DraftChoice:
    """`choose_draft` for an already-read target header (and optionally an already-done disk scan,
    with `searched`, the places it looked in). pays(path): does a measurement say that translated
    draft beats plain decoding (step 3b)? draft_costs(path) -> DraftCosts | None: what a draft
    measured beside this target here (tune/draft_costs.py); gpu: the target decodes on a GPU
    (the cold estimate's device kind); gate=False (`pull`) takes a disk draft that does not pay,
    saying so in its reason."""
    notes: list[str] = []
    choice = mtp_choice(header, sidecars=mtp_sidecars, notes=notes)
    if choice is not None:
        return choice
    notes.insert(0, "no MTP heads in the target")
    vocab = vocab_from_header(header)
    if candidates is None:
        roots = discovery.places(header.source, search_dirs, default_dirs=default_dirs)
        cut: list[discovery.Root] = []
        candidates = discovery.scan(header, roots, target_vocab=vocab, cut=cut)
        searched = searched_places(roots, cut)
    searched_t = tuple(searched)
    seen = {os.path.realpath(c.path) for c in candidates}
    beside = [c for c in spec_drafts_beside(header, vocab) if os.path.realpath(c.path) not in seen]
    spec, why = pick_spec_draft(beside + list(candidates), notes)
    if spec is not None:
        return DraftChoice(spec.draft_kind, spec.path, why, spec.verdict, source="disk", label=spec.label,
                           considered=tuple(notes), searched=searched_t)
    best, why = pick_disk_draft(header, candidates)
    if best is not None:
        dv = draft_value.for_draft(header.file_size or 0, best.path, best.size, draft_costs, gpu=gpu)
        if dv.pays or not gate:
            return DraftChoice("draft-simple", best.path, f"{why}; {dv.why()}", best.verdict, source="disk",
                               label=best.label, considered=tuple(notes), searched=searched_t, value=dv)
        # A draft that cannot pay here is not loaded; the registry's drafts of this family are
        # the same kind of file, so the chain goes on to drafting from the text.
        notes.append(f"draft {best.label} found ({why}) but not used: {dv.why()}; --draft {best.path} forces it")
        return replace(text_fallback(tuple(notes), searched_t), value=dv, refused=Path(best.path))
    notes.append(why)
    choice = registry_choice(header, vocab, offline=offline, allow_download=allow_download, dry_run=dry_run,
                             notes=notes)
    if choice is not None:
        return DraftChoice(choice.kind, choice.path, choice.reason, choice.verdict, choice.source, choice.label,
                           tuple(notes), choice.would_download, searched_t)
    from llamaspec.pairing.translated_pairs import add_translated, pick_translated

    add_translated(header, candidates, vocab)
    best, why = pick_translated(header, candidates, pays)
    if best is not None:
        return DraftChoice("draft-simple", best.path, why, best.verdict, source="disk", label=best.label,
                           considered=tuple(notes), searched=searched_t)
    notes.append(why)
    return text_fallback(tuple(notes), searched_t)


#: what drafts when no model can: llamaspec's longest-match prompt lookup (speculative/drafters/
#: prompt_lookup.py), which recovers after two tokens where llama.cpp's fixed-n types need n
TEXT_FALLBACK = "prompt-lookup"
#: chained behind the text drafter by default: drafts from the earlier requests of a batch job,
#: server or chat where the text has no match (drafters/suffix.py; scripts/bench_suffix.py)
ACROSS_REQUESTS = "suffix"


def text_fallback(notes: Sequence[str], searched: Sequence[str] = ()) -> DraftChoice:
    """The last step of the chain: drafting from the text itself, with what the earlier steps found."""
    notes = list(notes)
    return DraftChoice(TEXT_FALLBACK, None, "no model draft available (" + "; ".join(notes[1:] or notes)
                       + f"): {TEXT_FALLBACK} drafting from the text itself", source="fallback",
                       label=TEXT_FALLBACK, considered=tuple(notes), searched=tuple(searched))


def choose_draft(target_ref: str, *, search_dirs: Iterable[str | os.PathLike[str]] = (), offline: bool = False,
                 allow_download: bool = True, default_dirs: bool = True, dry_run: bool = False,
                 mtp_sidecars: bool = False, pays=None, draft_costs=None, gpu: bool = False,
                 gate: bool = True) -> DraftChoice:
    """Resolve `--draft auto` for `target_ref` (a path or Hub ref); headers only, no weights loaded.

    offline forbids any network use; allow_download=False allows Hub header reads but no download;
    dry_run reports what would be downloaded instead of downloading it; mtp_sidecars lets an
    mtp-*.gguf beside the target count as MTP (kind "draft-mtp" with `path` = the sidecar).
    """
    from llamaspec import hub

    header = hub.read_model_header(target_ref, offline=offline)
    return choose_for_header(header, search_dirs=search_dirs, default_dirs=default_dirs, offline=offline,
                             allow_download=allow_download, dry_run=dry_run, mtp_sidecars=mtp_sidecars, pays=pays,
                             draft_costs=draft_costs, gpu=gpu, gate=gate)
