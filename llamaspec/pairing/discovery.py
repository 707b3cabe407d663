"""Find GGUF models already on disk that could draft for a target, reading headers only.

Where (`places`, the one list `pair`, `run --draft auto` and `models` all use, in this order):
any --search DIR, the target's own folder and its direct subfolders (where llama.cpp users keep
their GGUFs), each directory of $LLAMASPEC_MODELS_PATH (colon-separated), then the Hugging Face
cache (HF_HUB_CACHE / HF_HOME), LM Studio (~/.lmstudio/models, ~/.cache/lm-studio/models) and
Ollama's blobs (~/.ollama/models or $OLLAMA_MODELS; blobs have no extension, so the GGUF magic is
sniffed and names come from the manifests). The walk is bounded: a depth per place, and the whole
scan stops after SCAN_SECONDS (a home directory or a network mount as the target's folder), keeping
what it found and naming the place it cut short.

Fast: each file first gets a gguf.peek.peek (a few KB of a memory-mapped file): files whose
vocabulary type or size rule them out are skipped before any token text is decoded. Survivors
get the compat verdict on gguf.peek.light_header, which reuses the target's decoded token texts
when the raw bytes are identical (else a full parse). Nothing is cached on disk.

Each candidate has a `kind`, llama.cpp's spec type it would draft as: draft-simple for an ordinary
model; draft-eagle3 / draft-dflash / draft-dspark / draft-mtp (Gemma 4 assistant) for a draft made
for a target, told from its header (gguf/drafts.py) whatever its file name, and checked against the
target's shape too (compat.draft_fit_rules). An `mtp-*.gguf` that is not an assistant holds MTP
heads for its own model: listed, never a draft.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from llamaspec.errors import LlamaspecError
from llamaspec.gguf.drafts import kind_of_arch
from llamaspec.gguf.file_memo import memo
from llamaspec.gguf.header import GGUF_MAGIC, GGUFHeader, read_file
from llamaspec.gguf.peek import Peek, TargetTokens, light_header, peek, target_tokens
from llamaspec.gguf.vocab import VocabInfo, vocab_from_header
from llamaspec.pairing.choice_memo import witness
from llamaspec.pairing.compat import MAX_SIZE_DIFFERENCE, Verdict, check_headers

_MAX_DEPTH = 8
# The target's folder: its files and one level of subfolders (~/models/<model>/<file>.gguf), never
# a deep walk (the target may sit in a home directory).
BESIDE_DEPTH = 1
# The whole scan of all places stops after this long; the files found so far are still compared.
SCAN_SECONDS = 5.0
MODELS_PATH_ENV = "LLAMASPEC_MODELS_PATH"
# Helper files, not models (llama.cpp's gguf_filename_is_model also skips its draft sidecars,
# mtp-/eagle3-/dflash-/dspark-: here they are scanned and told apart by their headers).
_NOT_MODELS = ("mmproj", "imatrix")
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
_SKIP_DIRS = {".git", "__pycache__", "node_modules", ".venv", "venv", ".tox"}


@dataclass(frozen=True)
class Root:
    """A place to look: `kind` is beside (the target's folder), models-path ($LLAMASPEC_MODELS_PATH),
    search (--search), hf-cache, lmstudio or ollama; `depth` bounds the walk below it."""

    path: Path
    kind: str
    depth: int = _MAX_DEPTH

    def describe(self) -> str:
        """'the target's folder /m', 'LLAMASPEC_MODELS_PATH /x', 'Hugging Face cache ~/.cache/...'."""
        return f"{_PLACE_NAMES.get(self.kind, self.kind)} {self.path}"


_PLACE_NAMES = {"beside": "the target's folder", "models-path": MODELS_PATH_ENV, "search": "--search",
                "hf-cache": "Hugging Face cache", "lmstudio": "LM Studio", "ollama": "Ollama"}


@dataclass(frozen=True)
class Found:
    path: Path
    kind: str
    label: str   # how people name it: org/repo/file for the HF cache, name:tag for Ollama, else the path


@dataclass
class Candidate:
    path: Path
    kind: str
    label: str
    size: int
    architecture: str | None = None
    n_vocab: int | None = None
    vocab_type: str | None = None
    n_params: int | None = None
    file_type: str | None = None
    verdict: Verdict | None = None
    skipped: str | None = None   # why it was ruled out before the full comparison
    draft_kind: str = "draft-simple"  # llama.cpp's spec type it drafts as (from its header)

    @property
    def compatible(self) -> bool:
        return self.verdict is not None and self.verdict.compatible and not self.skipped

    def to_dict(self) -> dict:
        return {
            "path": str(self.path), "location": self.kind, "label": self.label, "size": self.size,
            "draft_kind": self.draft_kind,
            "architecture": self.architecture, "n_vocab": self.n_vocab, "vocab_type": self.vocab_type,
            "n_params": self.n_params, "file_type": self.file_type, "compatible": self.compatible,
            "reason": self.skipped or (self.verdict.reason if self.verdict else None),
            "verdict": self.verdict.to_dict() if self.verdict else None,
        }


# ---- where to look ------------------------------------------------------------------------------


def hf_cache_dir() -> Path:
    """The HF hub cache, resolved exactly as llamaspec.hub resolves it (HF_HUB_CACHE / HF_HOME / ~)."""
    from llamaspec.hub.cache import cache_dir

    return cache_dir()


def default_roots() -> list[Root]:
    """The usual model stores of this machine's user, those that exist."""
    home = Path.home()
    roots = [Root(hf_cache_dir(), "hf-cache"),
             Root(home / ".lmstudio" / "models", "lmstudio"),
             Root(home / ".cache" / "lm-studio" / "models", "lmstudio")]
    ollama = os.environ.get("OLLAMA_MODELS")
    roots.append(Root(Path(ollama).expanduser() if ollama else home / ".ollama" / "models", "ollama"))
    if not ollama:  # Linux installs run Ollama as a service user with its own home
        roots.append(Root(Path("/usr/share/ollama/.ollama/models"), "ollama"))
    for r in roots:   # a store that appears later changes the choice
        witness(r.path)
    return [r for r in roots if r.path.is_dir()]


def search_roots(dirs: Iterable[str | os.PathLike[str]]) -> list[Root]:
    return [Root(Path(d).expanduser(), "search") for d in dirs]


def models_path_roots() -> list[Root]:
    """The directories of $LLAMASPEC_MODELS_PATH (colon-separated, as PATH), those that exist."""
    dirs = [d for d in os.environ.get(MODELS_PATH_ENV, "").split(os.pathsep) if d.strip()]
    roots = [Root(Path(d).expanduser(), "models-path") for d in dirs]
    for r in roots:
        witness(r.path)
    return [r for r in roots if r.path.is_dir()]


def places(target: str | os.PathLike[str] | None = None, search: Iterable[str | os.PathLike[str]] = (), *,
           default_dirs: bool = True) -> list[Root]:
    """Where drafts are looked for, in order: `search`, the folder of `target` (a local file), each
    $LLAMASPEC_MODELS_PATH directory, the usual model stores. default_dirs=False: only
    `search` (pair --no-default-dirs)."""
    roots = search_roots(search)   # named by the user: first (a file found twice keeps its first name)
    if default_dirs and target is not None and os.path.isfile(target):
        # Not resolved: a Hub-cache snapshot file is a symlink into blobs/, its siblings are beside the link.
        roots.append(Root(Path(os.path.abspath(target)).parent, "beside", BESIDE_DEPTH))
    if default_dirs:
        roots += models_path_roots()
        roots += default_roots()
    return roots


# ---- walking -----------------------------------------------------------------------------------


def is_mtp_sidecar_name(name: str) -> bool:
    """mtp-*.gguf, *-mtp-*.gguf or *-mtp.gguf: how repos ship MTP heads beside a model."""
    low = name.lower()
    return low.endswith(".gguf") and (low.startswith("mtp-") or "-mtp-" in low or low[:-5].endswith("-mtp"))


def _is_model_name(name: str) -> bool:
    low = name.lower()
    if not low.endswith(".gguf") or any(k in low for k in _NOT_MODELS):
        return False
    m = _SPLIT.search(low)
    return m is None or int(m.group(1)) == 1  # later split parts carry no tokenizer


class OutOfTime(Exception):
    """The scan's time limit passed (raised inside a walk, caught by iter_models)."""


def _check(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise OutOfTime


def _walk(top: Path, depth: int = _MAX_DEPTH, deadline: float | None = None) -> Iterator[Path]:
    """GGUF-named files under `top` (symlinked files followed, symlinked dirs not: no loops)."""
    _check(deadline)
    witness(top)
    try:
        with os.scandir(top) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError:
        return
    for e in entries:
        try:
            if e.is_dir(follow_symlinks=False):
                if depth > 0 and e.name not in _SKIP_DIRS and not e.name.startswith("."):
                    yield from _walk(Path(e.path), depth - 1, deadline)
            elif _is_model_name(e.name) and e.is_file():
                yield Path(e.path)
        except OSError:
            continue


def _hf_files(root: Path) -> Iterator[Found]:
    witness(root)
    try:
        repos = [e for e in os.scandir(root) if e.name.startswith("models--") and e.is_dir()]
    except OSError:
        return
    for repo in repos:
        repo_id = repo.name[len("models--"):].replace("--", "/")
        snaps = Path(repo.path) / "snapshots"
        for path in _walk(snaps, 6):
            rel = path.relative_to(snaps).parts[1:]  # drop the revision directory
            yield Found(path, "hf-cache", f"{repo_id}/{'/'.join(rel)}")


def _ollama_names(root: Path) -> dict[str, str]:
    """blob file name -> model name:tag, from the manifests (best effort)."""
    names: dict[str, str] = {}
    manifests = root / "manifests"
    witness(manifests)
    for dirpath, _dirs, files in os.walk(manifests):
        witness(dirpath)
        for f in files:
            p = Path(dirpath) / f
            witness(p)
            try:
                layers = json.loads(p.read_text(encoding="utf-8")).get("layers", [])
            except (OSError, ValueError, AttributeError):
                continue
            parts = p.relative_to(manifests).parts  # host/namespace/model/tag
            name = f"{parts[-2]}:{parts[-1]}" if len(parts) >= 2 else f
            if len(parts) >= 3 and parts[-3] != "library":
                name = f"{parts[-3]}/{name}"
            for layer in layers if isinstance(layers, list) else []:
                if isinstance(layer, dict) and layer.get("mediaType") == "application/vnd.ollama.image.model":
                    digest = str(layer.get("digest", "")).replace(":", "-")
                    names.setdefault(digest, name)
    return names


def _ollama_files(root: Path) -> Iterator[Found]:
    blobs = root / "blobs"
    witness(blobs)
    names = _ollama_names(root)
    try:
        entries = list(os.scandir(blobs))
    except OSError:
        return
    for e in entries:
        if not e.name.startswith("sha256") or not e.is_file():
            continue
        try:
            with open(e.path, "rb") as f:
                if f.read(4) != GGUF_MAGIC:  # blobs hold templates, licenses, params too
                    continue
        except OSError:
            continue
        yield Found(Path(e.path), "ollama", names.get(e.name, f"ollama blob {e.name[:19]}"))


def iter_models(roots: Iterable[Root], *, deadline: float | None = None,
                cut: list[Root] | None = None) -> Iterator[Found]:
    """Every GGUF model file under `roots`, each real file once. Past `deadline` (time.monotonic())
    the walk stops; the root it was in, and those not reached, are appended to `cut`."""
    seen: set[str] = set()
    roots = list(roots)
    for i, root in enumerate(roots):
        if root.kind == "hf-cache":
            it = _hf_files(root.path)
        elif root.kind == "ollama":
            it = _ollama_files(root.path)
        elif root.path.is_file():
            it = iter([Found(root.path, root.kind, str(root.path))])
        else:
            it = (Found(p, root.kind, str(p)) for p in _walk(root.path, root.depth, deadline))
        try:
            for found in it:
                try:
                    real = os.path.realpath(found.path)
                except OSError:
                    continue
                if real not in seen:
                    seen.add(real)
                    witness(found.path)
                    yield found
                _check(deadline)
        except OutOfTime:
            if cut is not None:
                cut.extend(roots[i:])
            return


# ---- comparing ---------------------------------------------------------------------------------


def prefilter(target: VocabInfo, pk: Peek | None) -> str | None:
    """Why a peeked file cannot match the target (None: worth a full comparison)."""
    if pk is None:
        return "not a readable GGUF"
    if pk.tokenizer_model is None or pk.n_vocab is None:
        return "no tokenizer in the header (a split part or a non-text model)"
    if pk.vocab_type != target.vocab_type:
        return f"vocabulary type {pk.vocab_type} != {target.vocab_type}"
    if abs(pk.n_vocab - target.n_vocab) > MAX_SIZE_DIFFERENCE:
        return f"vocabulary size {pk.n_vocab} vs {target.n_vocab}"
    return None


def scan(target: GGUFHeader, roots: Iterable[Root], *, target_path: str | os.PathLike[str] | None = None,
         target_vocab: VocabInfo | None = None, seconds: float | None = SCAN_SECONDS,
         cut: list[Root] | None = None) -> list[Candidate]:
    """Every GGUF under `roots` with its verdict against `target` (or why it was skipped). The
    walk stops after `seconds` (None: no limit); the places it did not finish go to `cut`."""
    tv = target_vocab or vocab_from_header(target)
    target_real = os.path.realpath(target_path or target.source)
    raw: TargetTokens | None | bool = False  # computed on the first candidate worth comparing
    out: list[Candidate] = []
    deadline = None if seconds is None else time.monotonic() + seconds
    for found in iter_models(roots, deadline=deadline, cut=cut):
        try:
            size = found.path.stat().st_size
        except OSError:
            continue
        cand = Candidate(found.path, found.kind, found.label, size)
        if os.path.realpath(found.path) == target_real:
            cand.skipped = "the target itself"
            out.append(cand)
            continue
        pk = peek(found.path)
        if pk is not None:
            cand.architecture, cand.n_vocab, cand.vocab_type = pk.architecture, pk.n_vocab, pk.vocab_type
            cand.draft_kind = kind_of_arch(pk.architecture) or "draft-simple"
        why = prefilter(tv, pk)
        if why is None and cand.draft_kind == "draft-simple" and is_mtp_sidecar_name(found.path.name):
            why = "MTP heads of another model (an mtp-*.gguf sidecar that is not a Gemma 4 assistant)"
        if why is None:
            def compare(path=found.path) -> tuple:
                nonlocal raw
                try:
                    if raw is False:
                        raw = target_tokens(target) if os.path.isfile(target.source) else None
                    header = (light_header(path, raw) if raw else None) or read_file(path)
                    verdict = check_headers(target, header, target_vocab=tv)
                    # a cut file has a good header but cannot draft; dflash: DFlash or DSpark by its tensors
                    return verdict, header.n_params, header.file_type, verdict.draft_kind, header.missing_data()
                except LlamaspecError as exc:
                    return None, None, None, cand.draft_kind, exc.message

            # the same two files give the same verdict: a second run in this folder reads neither
            local = os.path.isfile(target.source)
            verdict, n_params, file_type, kind, why = (
                memo("pair-verdict", [target.source, found.path], compare) if local else compare())
            cand.verdict, cand.draft_kind = verdict, kind
            if verdict is not None:
                cand.n_params, cand.file_type = n_params, file_type
        cand.skipped = why
        out.append(cand)
    return out
