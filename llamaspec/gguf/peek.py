"""Fast GGUF header reads for scanning many files on disk: memory-mapped, only what is asked for.

`peek` memory-maps a file and stops at the token list's count (a few KB read): architecture,
tokenizer model, vocabulary size and MTP heads, enough to rule most files out cheaply. Peeks are
cached in-process by (path, size, mtime, inode), so a file that changes is read again.

`light_header` gives the full header of a file whose vocabulary is most likely the target's: a
full parse decodes every token text (~0.25 s for a 262k vocabulary), so instead the raw token
bytes from id 5 on are compared with the target's (`target_tokens`) in one memcmp; when equal,
the target's decoded texts are reused (texts decoded only for ids 0-4 and any extra ids) and
only scalars, short number arrays and tensor infos are parsed (long arrays other than the tokens,
such as scores and merges, are left out). Any difference or oddity returns None, and the caller
falls back to header.read_file.

The value types and sizes are header.py's (one table); the walking here works on the mapped bytes
directly instead of pulling them through header.py's incremental reader, which is what keeps a
scan of a whole model store fast.
"""

from __future__ import annotations

import array
import mmap
import os
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llamaspec.gguf.header import (
    ARRAY_CODES, GGUF_MAGIC, GGUF_VERSIONS, MAX_DIMS, SCALAR_TYPES, T_ARRAY, T_STRING, U32, U64, GGUFHeader,
    TensorInfo,
)
from llamaspec.gguf.checks import ARCH_INT_KEYS, KNOWN_TYPES, check_metadata, data_end
from llamaspec.errors import ModelFileError
from llamaspec.gguf.vocab import VOCAB_TYPES

_u32, _u64 = U32.unpack_from, U64.unpack_from
_SIZES = {t: s.size for t, s in SCALAR_TYPES.items()}
_FAST_SKIP_MODELS = ("hybriddna", "no_vocab", "none")  # token texts are rewritten or absent
_ERRORS = (OSError, ValueError, struct.error, IndexError, OverflowError)  # any of these: not a readable GGUF here
_SMALL_ARRAY = 4096  # number arrays up to this length are read by light_header


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


# ---- raw GGUF bytes (memory-mapped; only what is asked for is paged in) ---------------------------


def skip_strings(mm: Any, pos: int, count: int, end: int) -> int:
    for _ in range(count):
        pos += 8 + _u64(mm, pos)[0]
        if pos > end:
            raise ValueError("truncated")
    return pos


def skip_value(mm: Any, vtype: int, pos: int, end: int) -> int:
    if vtype in _SIZES:
        return pos + _SIZES[vtype]
    if vtype == T_STRING:
        return pos + 8 + _u64(mm, pos)[0]
    if vtype == T_ARRAY:
        etype, count = _u32(mm, pos)[0], _u64(mm, pos + 4)[0]
        pos += 12
        if etype in _SIZES:
            return pos + count * _SIZES[etype]
        if etype == T_STRING:
            return skip_strings(mm, pos, count, end)
        raise ValueError(f"array of GGUF type {etype}")  # arrays of arrays: llama.cpp refuses them too
    raise ValueError(f"unknown GGUF type {vtype}")


def read_str(mm: Any, pos: int) -> tuple[str, int]:
    n = _u64(mm, pos)[0]
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
    except _ERRORS:
        result = None
    _peek_cache[key] = result
    return result


def _peek_mm(mm: Any) -> Peek | None:
    if _u32(mm, 4)[0] not in GGUF_VERSIONS:
        return None
    end, pos = len(mm), 24
    arch = model = n_tokens = None
    nextn = 0
    for _ in range(_u64(mm, 16)[0]):
        key, pos = read_str(mm, pos)
        vtype = _u32(mm, pos)[0]
        pos += 4
        if key == "general.architecture" and vtype == T_STRING:
            arch, pos = read_str(mm, pos)
        elif key == "tokenizer.ggml.model" and vtype == T_STRING:
            model, pos = read_str(mm, pos)
        elif key == "tokenizer.ggml.tokens" and vtype == T_ARRAY:
            n_tokens = _u64(mm, pos + 4)[0]
            if arch is not None and model is not None:
                break  # all we need: the token texts themselves are never decoded here
            pos = skip_value(mm, vtype, pos, end)
        elif key.endswith(".nextn_predict_layers") and vtype in (4, 5):  # u32 / i32
            nextn = _u32(mm, pos)[0]
            pos += 4
        else:
            pos = skip_value(mm, vtype, pos, end)
        if pos > end:
            return None
    return Peek(arch, model, n_tokens, nextn)


# ---- light headers: reuse the target's decoded token texts --------------------------------------


@dataclass
class TargetTokens:
    """The target's raw token array from id 5 on, with per-token end offsets into it."""

    raw: bytes
    ends: list[int]          # ends[k] = end of token 5+k inside `raw`
    texts: list             # the header's token list (as parsed, before llama.cpp's renaming)

    def span(self, m: int) -> int:
        """Bytes covering tokens 5..m-1."""
        return 0 if m <= 5 else self.ends[m - 6]


def tokens_array(mm: Any) -> tuple[int, int]:
    """(position of the first token entry, count) of tokenizer.ggml.tokens."""
    end, pos = len(mm), 24
    for _ in range(_u64(mm, 16)[0]):
        key, pos = read_str(mm, pos)
        vtype = _u32(mm, pos)[0]
        pos += 4
        if key == "tokenizer.ggml.tokens" and vtype == T_ARRAY and _u32(mm, pos)[0] == T_STRING:
            return pos + 12, _u64(mm, pos + 4)[0]
        pos = skip_value(mm, vtype, pos, end)
    raise ValueError("no token list")


def target_tokens(header: GGUFHeader) -> TargetTokens | None:
    """The target's raw token bytes, when it is a local file with an ordinary vocabulary."""
    texts = header.metadata.get("tokenizer.ggml.tokens")
    if not texts or header.metadata.get("tokenizer.ggml.model") in _FAST_SKIP_MODELS:
        return None
    try:
        with open(header.source, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            start, count = tokens_array(mm)
            if count != len(texts):
                return None
            p5 = skip_strings(mm, start, min(5, count), len(mm))
            ends, pos, end = [], p5, len(mm)
            for _ in range(count - min(5, count)):
                pos += 8 + _u64(mm, pos)[0]
                ends.append(pos - p5)
            if pos > end:
                return None
            return TargetTokens(mm[p5:pos], ends, texts)
    except _ERRORS:
        return None


def light_header(path: str | os.PathLike[str], target: TargetTokens) -> GGUFHeader | None:
    """The header of `path` reusing the target's token texts; None when that is not exact."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return _light(mm, target, Path(path))
    except _ERRORS:
        return None


def _light(mm: Any, target: TargetTokens, path: Path) -> GGUFHeader | None:
    end = len(mm)
    if mm[:4] != GGUF_MAGIC or _u32(mm, 4)[0] not in GGUF_VERSIONS:
        return None
    version, n_tensors, n_kv = _u32(mm, 4)[0], _u64(mm, 8)[0], _u64(mm, 16)[0]
    meta: dict[str, Any] = {}
    pos = 24
    for _ in range(n_kv):
        key, pos = read_str(mm, pos)
        if key in meta:
            return None  # a duplicate key: the full parser names it
        vtype = _u32(mm, pos)[0]
        pos += 4
        scalar = SCALAR_TYPES.get(vtype)
        if scalar is not None:
            meta[key] = scalar.unpack_from(mm, pos)[0]
            pos += scalar.size
        elif vtype == T_STRING:
            text, pos = read_str(mm, pos)
            meta[key] = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")  # as read_file
        elif key == "tokenizer.ggml.tokens" and vtype == T_ARRAY and _u32(mm, pos)[0] == T_STRING:
            count = _u64(mm, pos + 4)[0]
            pos += 12
            head = []
            for _ in range(min(5, count)):
                text, pos = read_str(mm, pos)
                head.append(text)
            m = min(count, len(target.texts))
            span = target.span(m)
            if mm[pos:pos + span] != target.raw[:span]:
                return None  # texts differ somewhere: the full parser finds where
            pos += span
            tail = []
            for _ in range(count - max(m, len(head))):
                text, pos = read_str(mm, pos)
                tail.append(text)
            meta[key] = head + target.texts[len(head):m] + tail
        elif vtype == T_ARRAY and _u32(mm, pos)[0] in ARRAY_CODES and _u64(mm, pos + 4)[0] <= _SMALL_ARRAY:
            # Short number arrays (a draft's target_layers, a SWA pattern) as read_file gives them;
            # long ones (token types, scores, merges) are skipped.
            arr = array.array(ARRAY_CODES[_u32(mm, pos)[0]])
            count = _u64(mm, pos + 4)[0]
            pos += 12
            arr.frombytes(mm[pos:pos + count * arr.itemsize])
            if sys.byteorder != "little":
                arr.byteswap()
            meta[key] = arr
            pos += count * arr.itemsize
        elif key in KNOWN_TYPES or key.rsplit(".", 1)[-1] in ARCH_INT_KEYS:
            return None  # a known key of the wrong type: the full parser names it
        else:
            pos = skip_value(mm, vtype, pos, end)  # long arrays other than the tokens are not needed
        if pos > end:
            return None
    if meta.get("tokenizer.ggml.model") in _FAST_SKIP_MODELS:
        return None
    try:
        check_metadata(meta, str(path))
    except ModelFileError:
        return None  # a key of the wrong type: the full parser names it
    tensors = []
    for _ in range(n_tensors):
        name, pos = read_str(mm, pos)
        n_dims = _u32(mm, pos)[0]
        if n_dims > MAX_DIMS:
            return None
        shape = struct.unpack_from(f"<{n_dims}Q", mm, pos + 4)
        pos += 4 + 8 * n_dims
        tensors.append(TensorInfo(name, tuple(shape), _u32(mm, pos)[0], _u64(mm, pos + 4)[0]))
        pos += 12
    if pos > end or len({t.name for t in tensors}) < len(tensors) or data_end(tensors, meta, pos)[0] > end:
        return None  # a cut-off download or a damaged file: let the full parser report it
    return GGUFHeader(version, meta, tensors, pos, str(path), end)
