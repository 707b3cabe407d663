"""Find GGUF models already on disk that could draft for a target, reading headers only.

Where: the Hugging Face cache (HF_HUB_CACHE / HF_HOME), LM Studio (~/.lmstudio/models,
~/.cache/lm-studio/models), Ollama's blobs (~/.ollama/models or $OLLAMA_MODELS; blobs have no
extension, so the GGUF magic is sniffed and names come from the manifests) and any --search DIR.

Fast: each file first gets a `peek` that memory-maps it and stops at the token list's count
(a few KB read): files whose vocabulary type or size rule them out are skipped before any token
text is decoded. Survivors get the compat verdict on a "light" header that reuses the target's
decoded token texts when the raw bytes are identical (else a full parse). Peeks are cached
in-process by (path, size, mtime, inode), so a file that changes is read again; nothing is
cached on disk.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from llamaspec.pairing.compat import MAX_SIZE_DIFFERENCE, Verdict, check_headers
from llamaspec.errors import LlamaspecError
from llamaspec.gguf.header import GGUFHeader, TensorInfo, read_file
from llamaspec.gguf.vocab import VOCAB_TYPES, VocabInfo, vocab_from_header

GGUF_MAGIC = b"GGUF"
_MAX_DEPTH = 8
# Sidecars and helper files, not standalone models (llama.cpp's gguf_filename_is_model).
_NOT_MODELS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
_SKIP_DIRS = {".git", "__pycache__", "node_modules", ".venv", "venv", ".tox"}


@dataclass(frozen=True)
class Root:
    """A place to look: `kind` is hf-cache, lmstudio, ollama or search."""

    path: Path
    kind: str


@dataclass(frozen=True)
class Found:
    path: Path
    kind: str
    label: str   # how people name it: org/repo/file for the HF cache, name:tag for Ollama, else the path


@dataclass(frozen=True)
class Peek:
    """What the first few KB of a GGUF say: enough to rule a file out cheaply."""

    architecture: str | None
    tokenizer_model: str | None
    n_vocab: int | None
    nextn_predict_layers: int

    @property
    def vocab_type(self) -> str | None:
        if self.tokenizer_model is None:
            return None
        return VOCAB_TYPES.get(self.tokenizer_model, self.tokenizer_model.upper())


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

    @property
    def compatible(self) -> bool:
        return self.verdict is not None and self.verdict.compatible

    def to_dict(self) -> dict:
        return {
            "path": str(self.path), "location": self.kind, "label": self.label, "size": self.size,
            "architecture": self.architecture, "n_vocab": self.n_vocab, "vocab_type": self.vocab_type,
            "n_params": self.n_params, "file_type": self.file_type, "compatible": self.compatible,
            "reason": self.verdict.reason if self.verdict else self.skipped,
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
    return [r for r in roots if r.path.is_dir()]


def search_roots(dirs: Iterable[str | os.PathLike[str]]) -> list[Root]:
    return [Root(Path(d).expanduser(), "search") for d in dirs]


# ---- walking -----------------------------------------------------------------------------------


def _is_model_name(name: str) -> bool:
    low = name.lower()
    if not low.endswith(".gguf") or any(k in low for k in _NOT_MODELS):
        return False
    m = _SPLIT.search(low)
    return m is None or int(m.group(1)) == 1  # later split parts carry no tokenizer


def _walk(top: Path, depth: int = _MAX_DEPTH) -> Iterator[Path]:
    """GGUF-named files under `top` (symlinked files followed, symlinked dirs not: no loops)."""
    try:
        entries = list(os.scandir(top))
    except OSError:
        return
    for e in entries:
        try:
            if e.is_dir(follow_symlinks=False):
                if depth > 0 and e.name not in _SKIP_DIRS and not e.name.startswith("."):
                    yield from _walk(Path(e.path), depth - 1)
            elif _is_model_name(e.name) and e.is_file():
                yield Path(e.path)
        except OSError:
            continue


def _hf_files(root: Path) -> Iterator[Found]:
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
    for dirpath, _dirs, files in os.walk(manifests):
        for f in files:
            p = Path(dirpath) / f
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


def iter_models(roots: Iterable[Root]) -> Iterator[Found]:
    """Every GGUF model file under `roots`, each real file once."""
    seen: set[str] = set()
    for root in roots:
        if root.kind == "hf-cache":
            it = _hf_files(root.path)
        elif root.kind == "ollama":
            it = _ollama_files(root.path)
        elif root.path.is_file():
            it = iter([Found(root.path, root.kind, str(root.path))])
        else:
            it = (Found(p, root.kind, str(p)) for p in _walk(root.path))
        for found in it:
            try:
                real = os.path.realpath(found.path)
            except OSError:
                continue
            if real not in seen:
                seen.add(real)
                yield found


# ---- raw GGUF bytes (memory-mapped; only what is asked for is paged in) ---------------------------

_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # scalar type -> size
_U32, _U64 = struct.Struct("<I").unpack_from, struct.Struct("<Q").unpack_from
_SCALAR_CODES = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
                 12: "<d"}
_FAST_SKIP_MODELS = ("hybriddna", "no_vocab", "none")  # token texts are rewritten or absent


def _skip_strings(mm: Any, pos: int, count: int, end: int) -> int:
    for _ in range(count):
        pos += 8 + _U64(mm, pos)[0]
        if pos > end:
            raise ValueError("truncated")
    return pos


def _skip_value(mm: Any, vtype: int, pos: int, end: int) -> int:
    if vtype in _FIXED:
        return pos + _FIXED[vtype]
    if vtype == 8:
        return pos + 8 + _U64(mm, pos)[0]
    if vtype == 9:
        etype, count = _U32(mm, pos)[0], _U64(mm, pos + 4)[0]
        pos += 12
        if etype in _FIXED:
            return pos + count * _FIXED[etype]
        if etype == 8:
            return _skip_strings(mm, pos, count, end)
        for _ in range(count):
            pos = _skip_value(mm, etype, pos, end)
        return pos
    raise ValueError(f"unknown GGUF type {vtype}")


def _str(mm: Any, pos: int) -> tuple[str, int]:
    n = _U64(mm, pos)[0]
    stop = pos + 8 + n
    if stop > len(mm):
        raise ValueError("truncated")
    return mm[pos + 8:stop].decode("utf-8", errors="surrogateescape"), stop



# ---- peeking -----------------------------------------------------------------------------------

_peek_cache: dict[tuple, Peek | None] = {}


def peek(path: str | os.PathLike[str]) -> Peek | None:
    """Architecture, tokenizer model and token count of a GGUF; None if it is not a readable GGUF."""
    p = Path(path)
    try:
        st = p.stat()
        key = (os.path.realpath(p), st.st_size, st.st_mtime_ns, st.st_ino)
    except OSError:
        return None
    if key in _peek_cache:
        return _peek_cache[key]
    try:
        with open(p, "rb") as f:
            if f.read(4) != GGUF_MAGIC:
                result = None
            else:
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                    result = _peek_mm(mm)
    except (OSError, ValueError, struct.error, IndexError):
        result = None
    _peek_cache[key] = result
    return result


def _peek_mm(mm: Any) -> Peek | None:
    if _U32(mm, 4)[0] not in (2, 3):
        return None
    end, pos = len(mm), 24
    arch = model = n_tokens = None
    nextn = 0
    for _ in range(_U64(mm, 16)[0]):
        key, pos = _str(mm, pos)
        vtype = _U32(mm, pos)[0]
        pos += 4
        if key == "general.architecture" and vtype == 8:
            arch, pos = _str(mm, pos)
        elif key == "tokenizer.ggml.model" and vtype == 8:
            model, pos = _str(mm, pos)
        elif key == "tokenizer.ggml.tokens" and vtype == 9:
            n_tokens = _U64(mm, pos + 4)[0]
            if arch is not None and model is not None:
                break  # all we need: the token texts themselves are never decoded here
            pos = _skip_value(mm, vtype, pos, end)
        elif key.endswith(".nextn_predict_layers") and vtype in (4, 5):
            nextn = _U32(mm, pos)[0]
            pos += 4
        else:
            pos = _skip_value(mm, vtype, pos, end)
        if pos > end:
            return None
    return Peek(arch, model, n_tokens, nextn)


# ---- light headers: reuse the target's decoded token texts --------------------------------------
#
# A full header parse decodes every token text (~0.25 s for a 262k vocabulary). A candidate that
# survives the prefilter usually has the very same vocabulary as the target, so instead its raw
# token bytes from id 5 on are compared with the target's in one memcmp; when they are equal its
# token list is the target's (texts decoded only for ids 0-4 and any extra ids), and only
# scalars and tensor infos are parsed. Any difference or oddity falls back to the full parser,
# so the result is always what gguf_header.read_file would give.


@dataclass
class TargetTokens:
    """The target's raw token array from id 5 on, with per-token end offsets into it."""

    raw: bytes
    ends: list[int]          # ends[k] = end of token 5+k inside `raw`
    texts: list             # the header's token list (as parsed, before llama.cpp's renaming)

    def span(self, m: int) -> int:
        """Bytes covering tokens 5..m-1."""
        return 0 if m <= 5 else self.ends[m - 6]


def _tokens_array(mm: Any) -> tuple[int, int]:
    """(position of the first token entry, count) of tokenizer.ggml.tokens."""
    end, pos = len(mm), 24
    for _ in range(_U64(mm, 16)[0]):
        key, pos = _str(mm, pos)
        vtype = _U32(mm, pos)[0]
        pos += 4
        if key == "tokenizer.ggml.tokens" and vtype == 9 and _U32(mm, pos)[0] == 8:
            return pos + 12, _U64(mm, pos + 4)[0]
        pos = _skip_value(mm, vtype, pos, end)
    raise ValueError("no token list")


def target_tokens(header: GGUFHeader) -> TargetTokens | None:
    """The target's raw token bytes, when it is a local file with an ordinary vocabulary."""
    texts = header.metadata.get("tokenizer.ggml.tokens")
    if not texts or header.metadata.get("tokenizer.ggml.model") in _FAST_SKIP_MODELS:
        return None
    try:
        with open(header.source, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            start, count = _tokens_array(mm)
            if count != len(texts):
                return None
            p5 = _skip_strings(mm, start, min(5, count), len(mm))
            ends, pos, end = [], p5, len(mm)
            for _ in range(count - min(5, count)):
                pos += 8 + _U64(mm, pos)[0]
                ends.append(pos - p5)
            if pos > end:
                return None
            return TargetTokens(mm[p5:pos], ends, texts)
    except (OSError, ValueError, struct.error, IndexError):
        return None


def light_header(path: Path, target: TargetTokens) -> GGUFHeader | None:
    """The header of `path` reusing the target's token texts; None when that is not exact."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return _light(mm, target, path)
    except (OSError, ValueError, struct.error, IndexError):
        return None


def _light(mm: Any, target: TargetTokens, path: Path) -> GGUFHeader | None:
    end = len(mm)
    if mm[:4] != GGUF_MAGIC or _U32(mm, 4)[0] not in (2, 3):
        return None
    version, n_tensors, n_kv = _U32(mm, 4)[0], _U64(mm, 8)[0], _U64(mm, 16)[0]
    meta: dict[str, Any] = {}
    pos = 24
    for _ in range(n_kv):
        key, pos = _str(mm, pos)
        vtype = _U32(mm, pos)[0]
        pos += 4
        if vtype in _SCALAR_CODES:
            meta[key] = struct.unpack_from(_SCALAR_CODES[vtype], mm, pos)[0]
            pos += _FIXED[vtype]
        elif vtype == 8:
            meta[key], pos = _str(mm, pos)
        elif key == "tokenizer.ggml.tokens" and vtype == 9 and _U32(mm, pos)[0] == 8:
            count = _U64(mm, pos + 4)[0]
            pos += 12
            head = []
            for _ in range(min(5, count)):
                text, pos = _str(mm, pos)
                head.append(text)
            m = min(count, len(target.texts))
            span = target.span(m)
            if mm[pos:pos + span] != target.raw[:span]:
                return None  # texts differ somewhere: the full parser finds where
            pos += span
            tail = []
            for _ in range(count - max(m, len(head))):
                text, pos = _str(mm, pos)
                tail.append(text)
            meta[key] = head + target.texts[len(head):m] + tail
        else:
            pos = _skip_value(mm, vtype, pos, end)  # arrays other than the tokens are not needed
        if pos > end:
            return None
    if meta.get("tokenizer.ggml.model") in _FAST_SKIP_MODELS:
        return None
    tensors = []
    for _ in range(n_tensors):
        name, pos = _str(mm, pos)
        n_dims = _U32(mm, pos)[0]
        if n_dims > 8:
            return None
        shape = struct.unpack_from(f"<{n_dims}Q", mm, pos + 4)
        pos += 4 + 8 * n_dims
        tensors.append(TensorInfo(name, tuple(shape), _U32(mm, pos)[0], _U64(mm, pos + 4)[0]))
        pos += 12
    if pos > end:
        return None
    if tensors:  # a cut-off download: let the full parser report it
        alignment = int(meta.get("general.alignment", 32) or 32)
        data_start = -(-pos // alignment) * alignment
        last = max(tensors, key=lambda t: t.offset)
        if data_start + last.offset > end:
            return None
    return GGUFHeader(version, meta, tensors, pos, str(path), end)


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
         target_vocab: VocabInfo | None = None) -> list[Candidate]:
    """Every GGUF under `roots` with its verdict against `target` (or why it was skipped)."""
    tv = target_vocab or vocab_from_header(target)
    target_real = os.path.realpath(target_path or target.source)
    raw: TargetTokens | None | bool = False  # computed on the first candidate worth comparing
    out: list[Candidate] = []
    for found in iter_models(roots):
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
        why = prefilter(tv, pk)
        if why is None:
            try:
                if raw is False:
                    raw = target_tokens(target) if os.path.isfile(target.source) else None
                header = (light_header(found.path, raw) if raw else None) or read_file(found.path)
                cand.verdict = check_headers(target, header, target_vocab=tv)
                cand.n_params, cand.file_type = header.n_params, header.file_type
            except LlamaspecError as exc:
                why = exc.message
        cand.skipped = why
        out.append(cand)
    return out
