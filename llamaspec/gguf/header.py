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
import copy
import os
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from llamaspec.errors import ModelFileError
from llamaspec.gguf.file_memo import memo
from llamaspec.gguf.checks import corrupt as _corrupt, data_start, check_metadata, data_end

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
ARRAY_CODES = {t: "B" if s.format == "<?" else s.format[1:] for t, s in SCALAR_TYPES.items()}
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
_MAX_STRING = 1 << 30  # bound for a string when the stream's size is unknown
_MAX_READ = 1 << 26    # one read from the stream never asks for more than this (64 MiB)

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

    def missing_data(self) -> str | None:
        """What is missing when the file is shorter than its tensor data says; None if complete
        (or the file's size is unknown)."""
        if self.file_size is None or not self.tensors:
            return None
        end, last = data_end(self.tensors, self.metadata, self.bytes_read)
        if end <= self.file_size:
            return None
        return (f"truncated GGUF: {self.source} is {self.file_size:,} bytes but its tensor data runs to byte "
                f"{end:,} (tensor {last!r}): the header is complete, the weights are cut off")

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
    """Pulls bytes from a stream on demand into a buffer; counts what it fetched.

    `size` (the file's size, when known) bounds every length and count before anything is
    allocated, so a corrupt count fails at once instead of reading or allocating gigabytes.
    `where` names the field being read, for the error messages."""

    def __init__(self, stream: BinaryIO, source: str, chunk: int, size: int | None = None):
        self.stream = stream
        self.source = source
        self.chunk = chunk
        self.size = size
        self.buf = b""
        self.pos = 0
        self.fetched = 0
        self.where = "the header"

    def _fill(self, need: int) -> None:
        """Make at least `need` unread bytes available, or fail as truncated."""
        parts = [self.buf[self.pos:]]
        have = len(parts[0])
        while have < need:
            data = self.stream.read(max(self.chunk, min(need - have, _MAX_READ)))
            if not data:
                self.fetched += have - len(parts[0])
                raise ModelFileError(
                    f"truncated GGUF: {self.source} ends at byte {self.fetched}, inside {self.where}",
                    "the file is incomplete; download it again",
                )
            parts.append(data)
            have += len(data)
        self.fetched += have - len(parts[0])
        self.buf = b"".join(parts)
        self.pos = 0

    def corrupt(self, what: str, at: int | None = None) -> ModelFileError:
        return _corrupt(self.source, f"{what} (byte {self.offset if at is None else at}, {self.where})")

    def _room(self, n: int, what: str, at: int) -> None:
        """Fail before reading `n` bytes that cannot be there."""
        if self.size is not None and at + n > self.size:
            raise ModelFileError(
                f"truncated or corrupt GGUF: {self.source} is {self.size:,} bytes, but {what} at byte {at:,} "
                f"claims {n:,} bytes ({self.where})",
                "the file is incomplete or damaged; download it again",
            )

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

    def string(self, errors: str = "surrogateescape") -> str:
        at = self.offset
        n = self.u64()
        if n > _MAX_STRING and self.size is None:
            raise self.corrupt(f"string of {n} bytes", at)
        self._room(n, "the string", at)
        # Keys and names keep bytes that are not UTF-8 (llama.cpp compares bytes); string values
        # are shown to users, so such bytes become U+FFFD there.
        return self.take(n).decode("utf-8", errors=errors)

    def strings(self, count: int, decode: bool = True) -> list[str]:
        """A string array; the hot loop for 100k+ token vocabularies, so it works on the buffer.
        decode=False walks over the strings (lengths and room checked) and gives a SkippedStrings."""
        out: list[str] = []
        append = out.append
        unpack = U64.unpack_from
        done = 0
        while done < count:
            buf, pos, end = self.buf, self.pos, len(self.buf)
            while done < count and pos + 8 <= end:
                n = unpack(buf, pos)[0]
                stop = pos + 8 + n
                if stop > end:
                    break
                if decode:
                    append(buf[pos + 8:stop].decode("utf-8", errors="surrogateescape"))
                pos, done = stop, done + 1
            self.pos = pos
            if done < count:
                # Need at least the next length prefix, and the whole next string once known.
                need = 8
                if pos + 8 <= end:
                    need = 8 + unpack(buf, pos)[0]
                    if need > _MAX_STRING and self.size is None:
                        raise self.corrupt(f"string {done} of {need - 8} bytes")
                    self._room(need - 8, f"string {done} of the array", self.offset)
                self._fill(need)
        return out if decode else SkippedStrings(count)

    def value(self, vtype: int, decode: bool = True) -> Any:
        """A value of type `vtype`; decode=False walks over a string array's strings (lengths and
        room checked) and gives a SkippedStrings."""
        scalar = SCALAR_TYPES.get(vtype)
        if scalar is not None:
            return scalar.unpack(self.take(scalar.size))[0]
        if vtype == T_STRING:
            return self.string(errors="replace")
        if vtype == T_ARRAY:
            at = self.offset
            etype = self.u32()
            count = self.u64()
            if etype == T_ARRAY:  # llama.cpp's reader refuses them too; no recursion on hostile input
                raise self.corrupt("array of arrays", at)
            if etype != T_STRING and etype not in ARRAY_CODES:
                raise self.corrupt(f"unknown array element type {etype}", at)
            item = 8 if etype == T_STRING else SCALAR_TYPES[etype].size
            if count > _MAX_ITEMS:
                raise self.corrupt(f"array of {count} items", at)
            self._room(count * item, f"the array of {count:,} items", at)
            if etype == T_STRING:
                return self.strings(count, decode)
            arr = array.array(ARRAY_CODES[etype])
            arr.frombytes(self.take(count * arr.itemsize))
            if sys.byteorder != "little":
                arr.byteswap()
            return arr
        raise self.corrupt(f"unknown value type {vtype}", self.offset - 4)

    @property
    def offset(self) -> int:
        return self.fetched - (len(self.buf) - self.pos)


#: string arrays no llamaspec code reads, walked over instead of decoded: a BPE model's merges
#: are as many as its tokens (151,387 for Qwen2.5), and decoding them was half of the 0.3 s the
#: default run spent reading the target's header before loading it
SKIPPED_ARRAYS = frozenset({"tokenizer.ggml.merges"})


class SkippedStrings(list):
    """A string array that was not decoded: empty, with the array's length as len()."""

    def __init__(self, count: int):
        super().__init__()
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"<{self.count} strings, not read>"


def read_header(stream: BinaryIO, *, source: str = "<stream>", chunk: int = 1 << 20,
                file_size: int | None = None) -> GGUFHeader:
    """Parse a GGUF header from `stream`, reading only as far as the end of the tensor infos."""
    r = _Reader(stream, source, chunk, file_size)
    try:
        magic = r.take(4)
    except ModelFileError:
        raise ModelFileError(f"not a GGUF file: {source} is empty or too short", "give a .gguf model file") from None
    if magic != GGUF_MAGIC:
        raise ModelFileError(f"not a GGUF file: {source} (starts with {magic!r})", "give a .gguf model file")
    r.where = "the header's version and counts"
    version = r.u32()
    if version not in GGUF_VERSIONS:
        raise ModelFileError(
            f"unsupported GGUF version {version} in {source} (llama.cpp reads versions 2 and 3)",
            "convert the model with a current llama.cpp",
        )
    n_tensors, n_kv = r.u64(), r.u64()
    for count, at, what in ((n_tensors, 8, "tensors"), (n_kv, 16, "keys")):
        if count > _MAX_ITEMS or (file_size is not None and count > file_size):
            raise r.corrupt(f"{count:,} {what} declared", at)
    # Each key takes at least 13 bytes (length, type, one byte of value), each tensor info 24.
    if file_size is not None and 24 + 24 * n_tensors + 13 * n_kv > file_size:
        raise ModelFileError(
            f"truncated GGUF: {source} is {file_size:,} bytes, too short for the {n_tensors} tensors and "
            f"{n_kv} keys its header declares (counts at byte 8)", "the file is incomplete; download it again")
    metadata: dict[str, Any] = {}
    for i in range(n_kv):
        r.where = f"key #{i}"
        key = r.string()
        r.where = f"key #{i} {key!r}"
        if key in metadata:
            raise r.corrupt("the key appears twice")
        metadata[key] = r.value(r.u32(), decode=key not in SKIPPED_ARRAYS)
    check_metadata(metadata, source)
    tensors = []
    names: set[str] = set()
    for j in range(n_tensors):
        r.where = f"tensor info #{j}"
        name = r.string()
        r.where = f"tensor info #{j} {name!r}"
        if name in names:
            raise r.corrupt("the tensor name appears twice")
        names.add(name)
        n_dims = r.u32()
        if n_dims > MAX_DIMS:
            raise r.corrupt(f"{n_dims} dimensions", r.offset - 4)
        shape = tuple(r.u64() for _ in range(n_dims))
        tensors.append(TensorInfo(name, shape, r.u32(), r.u64()))
    return GGUFHeader(version, metadata, tensors, r.offset, source, file_size)


def read_file(path: str | os.PathLike[str]) -> GGUFHeader:
    """Read the header of a local GGUF file, with clear errors for missing or damaged files.

    A file whose header is complete but whose tensor data is cut off is returned (header-only
    commands work on it); `header.missing_data()` says what is missing, `require_data` raises."""
    p = Path(path)
    if not p.exists():
        raise ModelFileError(f"model file not found: {p}", "check the path, or give a Hub reference org/repo:QUANT")
    if p.is_dir():
        raise ModelFileError(f"{p} is a directory, not a GGUF file", "give the path of a .gguf file")
    header = copy.copy(memo("header", [p], lambda: _read_path(p)))   # (a copy: callers may set file_size)
    header.source = str(p)   # the path as given (a symlink's folder is where its siblings are)
    return header


def _read_path(p: Path) -> GGUFHeader:
    size = p.stat().st_size
    with open(p, "rb") as f:
        return read_header(f, source=str(p), file_size=size)


def require_data(header: GGUFHeader) -> GGUFHeader:
    """Raise if the file is shorter than its tensor data (a cut-off download)."""
    missing = header.missing_data()
    if missing:
        raise ModelFileError(missing, "the file is incomplete; download it again")
    return header


def last_tensor_start(tensors: list[TensorInfo], metadata: dict[str, Any], header_end: int) -> int:
    """File offset where the header says its last tensor's data starts (0 without tensors).

    A file shorter than this is a cut-off download.
    """
    if not tensors:
        return 0
    return data_start(metadata, header_end) + max(t.offset for t in tensors)


