"""Read a GGUF file's header (metadata and tensor infos) without touching its weights.

Works on any binary stream with `.read(n)`: a local file, or a ranged reader over HTTP that
fetches only the bytes asked for (so a Hub file's header is read without downloading the model).
Pure Python and incremental: the parser pulls bytes as it needs them, so `bytes_read` tells how
much of the file was fetched. The `gguf` package's GGUFReader is not used here: it maps the whole
file and builds numpy views for every array element (5-20 s on a 262k-token vocabulary) and
fails with a bare IndexError on a truncated file.

GGUF layout (v2/v3): magic "GGUF", u32 version, u64 n_tensors, u64 n_kv, then n_kv
(key string, u32 type, value) pairs, then n_tensors (name, u32 n_dims, u64 dims..., u32 ggml type,
u64 offset). Strings are u64 length + UTF-8 bytes; arrays are u32 element type + u64 count + items.
"""

from __future__ import annotations

import array
import os
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from llamaspec.errors import ModelFileError

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
MAX_DIMS = 8  # GGML_MAX_DIMS is 4; more than 8 can only be a damaged file

# GGUF value types (gguf.h's enum gguf_type) -> little-endian struct (`.size`, `.unpack_from`).
# The one table of value types and sizes: peek.py's memory-mapped reads use it too.
T_STRING, T_ARRAY = 8, 9  # handled apart: u64 length + bytes; u32 element type + u64 count + items
SCALAR_TYPES: dict[int, struct.Struct] = {
    t: struct.Struct("<" + code) for t, code in
    {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}.items()
}
# array.array codes for arrays of scalars (array has no bool: GGUF bools are bytes 0/1)
_ARRAY_CODES = {t: "B" if s.format == "<?" else s.format[1:] for t, s in SCALAR_TYPES.items()}
U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")

# llama.h's llama_ftype, the names people know them by.
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M",
    30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE",
    39: "NVFP4", 40: "Q1_0", 41: "Q2_0",
}

# ggml_type ids -> names, for the per-tensor quantization summary.
GGML_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
    17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S",
    23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16",
    34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4",
}

_MAX_ITEMS = 1 << 31  # sanity bound: a corrupt count must not make us allocate forever


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass
class GGUFHeader:
    version: int
    metadata: dict[str, Any]
    tensors: list[TensorInfo]
    bytes_read: int
    source: str = "<stream>"
    file_size: int | None = None

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def arch_get(self, suffix: str, default: Any = None) -> Any:
        """An `<arch>.<suffix>` key, e.g. arch_get("context_length")."""
        return self.metadata.get(f"{self.architecture}.{suffix}", default)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    @property
    def name(self) -> str | None:
        return self.metadata.get("general.name")

    @property
    def file_type(self) -> str | None:
        ft = self.metadata.get("general.file_type")
        if ft is None:
            return self._dominant_tensor_type()
        return FILE_TYPES.get(int(ft), f"type {ft}")

    @property
    def n_params(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    @property
    def context_length(self) -> int | None:
        return self.arch_get("context_length")

    @property
    def block_count(self) -> int | None:
        return self.arch_get("block_count")

    @property
    def nextn_predict_layers(self) -> int:
        return int(self.arch_get("nextn_predict_layers", 0) or 0)

    @property
    def chat_template(self) -> str | None:
        return self.metadata.get("tokenizer.chat_template")

    def tensor_type_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for t in self.tensors:
            key = GGML_TYPES.get(t.ggml_type, str(t.ggml_type))
            counts[key] = counts.get(key, 0) + 1
        return counts

    def _dominant_tensor_type(self) -> str | None:
        counts = self.tensor_type_counts()
        return max(counts, key=counts.get) if counts else None


class _Reader:
    """Pulls bytes from a stream on demand into a buffer; counts what it fetched."""

    def __init__(self, stream: BinaryIO, source: str, chunk: int):
        self.stream = stream
        self.source = source
        self.chunk = chunk
        self.buf = b""
        self.pos = 0
        self.fetched = 0

    def _fill(self, need: int) -> None:
        """Make at least `need` unread bytes available, or fail as truncated."""
        parts = [self.buf[self.pos:]]
        have = len(parts[0])
        while have < need:
            data = self.stream.read(max(self.chunk, need - have))
            if not data:
                raise ModelFileError(
                    f"truncated GGUF: {self.source} ends after {self.fetched} bytes, inside its header",
                    "the file is incomplete; download it again",
                )
            self.fetched += len(data)
            parts.append(data)
            have += len(data)
        self.buf = b"".join(parts)
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.buf):
            self._fill(n)
        data = self.buf[self.pos:self.pos + n]
        self.pos += n
        return data

    def u32(self) -> int:
        return U32.unpack(self.take(4))[0]

    def u64(self) -> int:
        return U64.unpack(self.take(8))[0]

    def string(self) -> str:
        n = self.u64()
        if n > (1 << 30):
            raise _corrupt(self.source, f"string of {n} bytes")
        return self.take(n).decode("utf-8", errors="surrogateescape")

    def strings(self, count: int) -> list[str]:
        """A string array; the hot loop for 100k+ token vocabularies, so it works on the buffer."""
        out: list[str] = []
        append = out.append
        unpack = U64.unpack_from
        while len(out) < count:
            buf, pos, end = self.buf, self.pos, len(self.buf)
            while len(out) < count and pos + 8 <= end:
                n = unpack(buf, pos)[0]
                stop = pos + 8 + n
                if stop > end:
                    break
                append(buf[pos + 8:stop].decode("utf-8", errors="surrogateescape"))
                pos = stop
            self.pos = pos
            if len(out) < count:
                # Need at least the next length prefix, and the whole next string once known.
                need = 8
                if pos + 8 <= end:
                    need = 8 + unpack(buf, pos)[0]
                    if need > (1 << 30):
                        raise _corrupt(self.source, "string too long")
                self._fill(need)
        return out

    def value(self, vtype: int) -> Any:
        scalar = SCALAR_TYPES.get(vtype)
        if scalar is not None:
            return scalar.unpack(self.take(scalar.size))[0]
        if vtype == T_STRING:
            return self.string()
        if vtype == T_ARRAY:
            etype = self.u32()
            count = self.u64()
            if count > _MAX_ITEMS:
                raise _corrupt(self.source, f"array of {count} items")
            if etype == T_STRING:
                return self.strings(count)
            if etype == T_ARRAY:
                return [self.value(T_ARRAY) for _ in range(count)]
            if etype not in _ARRAY_CODES:
                raise _corrupt(self.source, f"unknown array element type {etype}")
            code = _ARRAY_CODES[etype]
            arr = array.array(code)
            arr.frombytes(self.take(count * arr.itemsize))
            if sys.byteorder != "little":
                arr.byteswap()
            return arr
        raise _corrupt(self.source, f"unknown value type {vtype}")

    @property
    def offset(self) -> int:
        return self.fetched - (len(self.buf) - self.pos)


def _corrupt(source: str, what: str) -> ModelFileError:
    return ModelFileError(f"corrupt GGUF header in {source}: {what}", "the file is damaged; download it again")


def read_header(stream: BinaryIO, *, source: str = "<stream>", chunk: int = 1 << 20,
                file_size: int | None = None) -> GGUFHeader:
    """Parse a GGUF header from `stream`, reading only as far as the end of the tensor infos."""
    r = _Reader(stream, source, chunk)
    try:
        magic = r.take(4)
    except ModelFileError:
        raise ModelFileError(f"not a GGUF file: {source} is empty or too short", "give a .gguf model file") from None
    if magic != GGUF_MAGIC:
        raise ModelFileError(f"not a GGUF file: {source} (starts with {magic!r})", "give a .gguf model file")
    version = r.u32()
    if version not in GGUF_VERSIONS:
        raise ModelFileError(
            f"unsupported GGUF version {version} in {source}", "convert the model with a current llama.cpp"
        )
    n_tensors, n_kv = r.u64(), r.u64()
    if n_tensors > _MAX_ITEMS or n_kv > _MAX_ITEMS:
        raise _corrupt(source, f"{n_tensors} tensors / {n_kv} keys")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = r.string()
        metadata[key] = r.value(r.u32())
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        n_dims = r.u32()
        if n_dims > MAX_DIMS:
            raise _corrupt(source, f"tensor {name!r} with {n_dims} dimensions")
        shape = tuple(r.u64() for _ in range(n_dims))
        tensors.append(TensorInfo(name, shape, r.u32(), r.u64()))
    return GGUFHeader(version, metadata, tensors, r.offset, source, file_size)


def read_file(path: str | os.PathLike[str]) -> GGUFHeader:
    """Read the header of a local GGUF file, with clear errors for missing or damaged files."""
    p = Path(path)
    if not p.exists():
        raise ModelFileError(f"model file not found: {p}", "check the path, or give a Hub reference org/repo:QUANT")
    if p.is_dir():
        raise ModelFileError(f"{p} is a directory, not a GGUF file", "give the path of a .gguf file")
    size = p.stat().st_size
    with open(p, "rb") as f:
        header = read_header(f, source=str(p), file_size=size)
    # A header that claims tensor data beyond the end of the file means a cut-off download.
    claimed = last_tensor_start(header.tensors, header.metadata, header.bytes_read)
    if claimed > size:
        raise ModelFileError(
            f"truncated GGUF: {p} is {size} bytes but its tensors extend past {claimed}",
            "the file is incomplete; download it again",
        )
    return header


def last_tensor_start(tensors: list[TensorInfo], metadata: dict[str, Any], header_end: int) -> int:
    """File offset where the header says its last tensor's data starts (0 without tensors).

    A file shorter than this is a cut-off download.
    """
    if not tensors:
        return 0
    alignment = int(metadata.get("general.alignment", 32) or 32)
    data_start = -(-header_end // alignment) * alignment
    return data_start + max(t.offset for t in tensors)
