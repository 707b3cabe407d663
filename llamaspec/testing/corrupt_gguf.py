"""A corpus of malformed GGUF files, generated from a small valid one (tests/test_corpus_gguf.py).

`layout(data)` walks a valid GGUF and names every field with its byte span (header counts, each
key's length/bytes/type/value, array element type/count/items, each tensor info's name/dims/type/
offset, the alignment padding, the tensor data). `corpus(base)` derives the cases from it:
truncations at every section boundary and inside every kind of field, wrong magic and versions,
absurd counts and lengths, invalid UTF-8, wrong value types for known keys, missing tokenizer
keys, offsets past the end of the file, and files llama.cpp refuses although the header is fine.

Each case says what a reader must do with it (`expect`):
  "header"  the header reader refuses it (ModelFileError); every command fails with that line;
  "data"    the header is complete but tensor data is missing: header-only commands work,
            loading weights fails naming the truncation;
  "load"    the header is fine, llama.cpp refuses it: loading fails with llama.cpp's reason;
  "ok"      nothing wrong that matters (invalid UTF-8 in a value): every command works.
Written from the GGUF layout (magic, u32 version, u64 n_tensors, u64 n_kv, KVs, tensor infos,
padding to general.alignment, data) without the gguf package, so any byte can be set.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
T_STRING, T_ARRAY = 8, 9


@dataclass(frozen=True)
class Field:
    label: str   # "kv[3].value", "tensor[0].dims", ...
    start: int
    end: int


@dataclass
class KV:
    key: bytes
    vtype: int
    raw: bytes   # the encoded value (after the u32 type)


@dataclass
class Parsed:
    version: int
    kvs: list[KV]
    tensor_infos: list[bytes]   # raw encoded tensor infos
    tensor_names: list[str]
    alignment: int
    data: bytes                  # tensor data (from the aligned data start)
    fields: list[Field]


@dataclass(frozen=True)
class Case:
    name: str
    data: bytes
    expect: str          # "header" | "data" | "load" | "ok"
    where: str = ""      # what the message must name: a key, "byte", "truncated", llama.cpp's words

    def write(self, directory: Path) -> Path:
        path = Path(directory) / f"{self.name}.gguf"
        path.write_bytes(self.data)
        return path


def _u32(v: int) -> bytes:
    return struct.pack("<I", v)


def _u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def gstr(s: bytes | str) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return _u64(len(b)) + b


def value_raw(vtype: int, value) -> bytes:
    if vtype in _SCALAR:
        return struct.pack("<" + _SCALAR[vtype], value)
    if vtype == T_STRING:
        return gstr(value)
    etype, items = value
    return _u32(etype) + _u64(len(items)) + b"".join(value_raw(etype, x) for x in items)


# ---- walking a valid file -------------------------------------------------------------------------


def _walk_value(buf: bytes, pos: int, vtype: int, label: str, fields: list[Field]) -> int:
    if vtype in _SCALAR:
        size = struct.calcsize("<" + _SCALAR[vtype])
        fields.append(Field(label, pos, pos + size))
        return pos + size
    if vtype == T_STRING:
        n = struct.unpack_from("<Q", buf, pos)[0]
        fields += [Field(label + ".len", pos, pos + 8), Field(label + ".bytes", pos + 8, pos + 8 + n)]
        return pos + 8 + n
    etype, count = struct.unpack_from("<IQ", buf, pos)
    fields += [Field(label + ".elem_type", pos, pos + 4), Field(label + ".count", pos + 4, pos + 12)]
    start, pos = pos + 12, pos + 12
    for i in range(count):
        sub: list[Field] = []
        pos = _walk_value(buf, pos, etype, f"{label}[{i}]", sub)
        if i < 2:
            fields += sub
    fields.append(Field(label + ".items", start, pos))
    return pos


def parse(buf: bytes) -> Parsed:
    """Split a valid GGUF into its parts, naming every field's byte span."""
    assert buf[:4] == b"GGUF"
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    fields = [Field("magic", 0, 4), Field("version", 4, 8), Field("n_tensors", 8, 16), Field("n_kv", 16, 24)]
    pos, kvs, alignment = 24, [], 32
    for i in range(n_kv):
        klen = struct.unpack_from("<Q", buf, pos)[0]
        key = buf[pos + 8:pos + 8 + klen]
        fields += [Field(f"kv[{i}].key_len", pos, pos + 8), Field(f"kv[{i}].key", pos + 8, pos + 8 + klen)]
        pos += 8 + klen
        vtype = struct.unpack_from("<I", buf, pos)[0]
        fields.append(Field(f"kv[{i}].type", pos, pos + 4))
        vstart = pos + 4
        pos = _walk_value(buf, vstart, vtype, f"kv[{i}].value", fields)
        kvs.append(KV(key, vtype, buf[vstart:pos]))
        if key == b"general.alignment":
            alignment = struct.unpack_from("<I", buf, vstart)[0]
    infos, names = [], []
    for j in range(n_tensors):
        start = pos
        nlen = struct.unpack_from("<Q", buf, pos)[0]
        names.append(buf[pos + 8:pos + 8 + nlen].decode())
        fields += [Field(f"tensor[{j}].name_len", pos, pos + 8), Field(f"tensor[{j}].name", pos + 8, pos + 8 + nlen)]
        pos += 8 + nlen
        n_dims = struct.unpack_from("<I", buf, pos)[0]
        fields += [Field(f"tensor[{j}].n_dims", pos, pos + 4), Field(f"tensor[{j}].dims", pos + 4, pos + 4 + 8 * n_dims)]
        pos += 4 + 8 * n_dims
        fields += [Field(f"tensor[{j}].type", pos, pos + 4), Field(f"tensor[{j}].offset", pos + 4, pos + 12)]
        pos += 12
        infos.append(buf[start:pos])
    data_start = -(-pos // alignment) * alignment
    fields += [Field("padding", pos, data_start), Field("data", data_start, len(buf))]
    return Parsed(version, kvs, infos, names, alignment, buf[data_start:], fields)


def build(p: Parsed, *, kvs: list[KV] | None = None, infos: list[bytes] | None = None,
          version: int | None = None, data: bytes | None = None) -> bytes:
    """Serialize (a changed copy of) a parsed file: counts follow the lists, padding the alignment."""
    kvs = p.kvs if kvs is None else kvs
    infos = p.tensor_infos if infos is None else infos
    out = bytearray(b"GGUF" + _u32(p.version if version is None else version) + _u64(len(infos)) + _u64(len(kvs)))
    for kv in kvs:
        out += gstr(kv.key) + _u32(kv.vtype) + kv.raw
    for info in infos:
        out += info
    out += b"\0" * (-len(out) % p.alignment)
    return bytes(out) + (p.data if data is None else data)


def field(p: Parsed, label: str) -> Field:
    return next(f for f in p.fields if f.label == label)


def kv_index(p: Parsed, key: str) -> int:
    return next(i for i, kv in enumerate(p.kvs) if kv.key == key.encode())


# ---- the corpus -------------------------------------------------------------------------------------

# Fields cut at their first byte (a section boundary) and in their middle. kv[0] is a string
# (general.architecture), kv[2] a u32, the tokens a string array, the token types an i32 array.
_CUT_FIELDS = (
    "magic", "version", "n_tensors", "n_kv",
    "kv[0].key_len", "kv[0].key", "kv[0].type", "kv[0].value.len", "kv[0].value.bytes",
    "kv[2].key", "kv[2].value",
    "{tokens}.elem_type", "{tokens}.count", "{tokens}[0].len", "{tokens}[0].bytes", "{tokens}.items",
    "{types}.count", "{types}.items",
    "tensor[0].name_len", "tensor[0].name", "tensor[0].n_dims", "tensor[0].dims", "tensor[0].type",
    "tensor[0].offset", "{last}.offset", "padding",
)


def _cuts(buf: bytes, p: Parsed) -> list[Case]:
    tokens = f"kv[{kv_index(p, 'tokenizer.ggml.tokens')}].value"
    types = f"kv[{kv_index(p, 'tokenizer.ggml.token_type')}].value"
    last = f"tensor[{len(p.tensor_infos) - 1}]"
    data_start = field(p, "data").start
    seen: set[int] = set()
    cases = []
    for label in _CUT_FIELDS:
        f = field(p, label.format(tokens=tokens, types=types, last=last))
        short = label.format(tokens="tokens", types="token_type", last="last_tensor")
        for at, how in ((f.start, "at"), (f.start + max(1, (f.end - f.start) // 2), "inside")):
            if at in seen or at >= f.end and how == "inside" or at >= data_start:
                continue
            seen.add(at)
            expect = "data" if short == "padding" else "header"  # the tensor infos are complete
            cases.append(Case(f"cut_{how}_{short}".replace("[", "").replace("]", "").replace(".", "_"),
                              buf[:at], expect, "too short" if short == "magic" else "truncated"))
    size = len(buf)
    for at, name in ((data_start, "cut_data_start"), (data_start + (size - data_start) // 2, "cut_data_middle"),
                     (size - 1, "cut_data_last_byte")):
        cases.append(Case(name, buf[:at], "data", "truncated"))
    return cases


def _patch(buf: bytes, at: int, new: bytes) -> bytes:
    return buf[:at] + new + buf[at + len(new):]


def _set_kv(p: Parsed, key: str, vtype: int, value) -> list[KV]:
    kvs = [KV(kv.key, kv.vtype, kv.raw) for kv in p.kvs]
    raw = value if isinstance(value, bytes) and vtype == -1 else value_raw(vtype, value)
    i = next((i for i, kv in enumerate(kvs) if kv.key == key.encode()), None)
    new = KV(key.encode(), 9 if vtype == -1 else vtype, raw)
    if i is None:
        kvs.append(new)
    else:
        kvs[i] = new
    return kvs


def _without(p: Parsed, key: str) -> list[KV]:
    return [kv for kv in p.kvs if kv.key != key.encode()]


def _tensor_info(name: str, dims: tuple[int, ...], ggml_type: int, offset: int) -> bytes:
    return gstr(name) + _u32(len(dims)) + b"".join(_u64(d) for d in dims) + _u32(ggml_type) + _u64(offset)


def _info_parts(info: bytes) -> tuple[str, tuple[int, ...], int, int]:
    n = struct.unpack_from("<Q", info)[0]
    name = info[8:8 + n].decode()
    n_dims = struct.unpack_from("<I", info, 8 + n)[0]
    dims = struct.unpack_from(f"<{n_dims}Q", info, 12 + n)
    ggml_type, offset = struct.unpack_from("<IQ", info, 12 + n + 8 * n_dims)
    return name, dims, ggml_type, offset


def _bad_values(buf: bytes, p: Parsed) -> list[Case]:
    tok = kv_index(p, "tokenizer.ggml.tokens")
    tok_val = field(p, f"kv[{tok}].value.count").start
    types_count = field(p, f"kv[{kv_index(p, 'tokenizer.ggml.token_type')}].value.count").start
    last = len(p.tensor_infos) - 1
    huge = 1 << 62
    c = [
        Case("empty_file", b"", "header", "empty"),
        Case("text_file", b"this is not a model\n" * 4, "header", "not a GGUF"),
        Case("wrong_magic", b"GGUG" + buf[4:], "header", "not a GGUF"),
        Case("byteswapped_magic", b"FUGG" + buf[4:], "header", "not a GGUF"),
        Case("version_1", _patch(buf, 4, _u32(1)), "header", "version 1"),
        Case("version_4", _patch(buf, 4, _u32(4)), "header", "version 4"),
        Case("version_max", _patch(buf, 4, _u32(0xFFFFFFFF)), "header", "version"),
        Case("n_tensors_absurd", _patch(buf, 8, _u64(huge)), "header", "byte 8"),
        Case("n_kv_absurd", _patch(buf, 16, _u64(huge)), "header", "byte 16"),
        Case("n_kv_one_too_many", _patch(buf, 16, _u64(len(p.kvs) + 1)), "header", "byte"),
        Case("n_tensors_one_too_many", _patch(buf, 8, _u64(len(p.tensor_infos) + 1)), "header", "byte"),
        Case("key_len_absurd", _patch(buf, 24, _u64(huge)), "header", "byte 24"),
        Case("key_len_past_end", _patch(buf, 24, _u64(len(buf))), "header", "byte 24"),
        Case("string_len_absurd", _patch(buf, field(p, "kv[0].value.len").start, _u64(huge)), "header", "byte"),
        Case("tokens_count_absurd", _patch(buf, tok_val, _u64(huge)), "header", "tokenizer.ggml.tokens"),
        Case("tokens_count_2g", _patch(buf, tok_val, _u64((1 << 31) - 1)), "header", "tokenizer.ggml.tokens"),
        Case("token_type_count_2g", _patch(buf, types_count, _u64((1 << 31) - 1)), "header", "token_type"),
        Case("unknown_value_type", _patch(buf, field(p, "kv[0].type").start, _u32(13)), "header", "type 13"),
        Case("unknown_array_type", build(p, kvs=_set_kv(p, "x.arr", -1, _u32(13) + _u64(2) + b"\0" * 16)),
             "header", "type 13"),
        Case("nested_arrays_deep", build(p, kvs=_set_kv(p, "x.nest", -1, (_u32(9) + _u64(1)) * 20000 + _u32(4) + _u64(0))),
             "header", "x.nest"),
        Case("duplicate_key", build(p, kvs=p.kvs + [KV(b"general.name", 8, gstr("again"))]), "header", "general.name"),
        Case("key_invalid_utf8", build(p, kvs=p.kvs + [KV(b"general.\xff\xfename", 8, gstr("x"))]), "ok"),
        Case("tokens_as_int", build(p, kvs=_set_kv(p, "tokenizer.ggml.tokens", 4, 5)), "header", "tokenizer.ggml.tokens"),
        Case("tokens_as_int_array", build(p, kvs=_set_kv(p, "tokenizer.ggml.tokens", 9, (5, [1, 2, 3]))),
             "header", "tokenizer.ggml.tokens"),
        Case("architecture_as_array", build(p, kvs=_set_kv(p, "general.architecture", 9, (8, ["llama"]))),
             "header", "general.architecture"),
        Case("block_count_as_string", build(p, kvs=_set_kv(p, "llama.block_count", 8, "four")), "header", "llama.block_count"),
        Case("context_length_as_float", build(p, kvs=_set_kv(p, "llama.context_length", 6, 256.0)),
             "header", "llama.context_length"),
        Case("tokenizer_model_as_int", build(p, kvs=_set_kv(p, "tokenizer.ggml.model", 4, 2)), "header", "tokenizer.ggml.model"),
        Case("bos_id_as_string", build(p, kvs=_set_kv(p, "tokenizer.ggml.bos_token_id", 8, "1")),
             "header", "tokenizer.ggml.bos_token_id"),
        Case("alignment_zero", build(p, kvs=_set_kv(p, "general.alignment", 4, 0)), "header", "general.alignment"),
        Case("alignment_not_power_of_2", build(p, kvs=_set_kv(p, "general.alignment", 4, 48)), "header", "general.alignment"),
        Case("alignment_as_string", build(p, kvs=_set_kv(p, "general.alignment", 8, "32")), "header", "general.alignment"),
        Case("n_dims_9", _patch(buf, field(p, "tensor[0].n_dims").start, _u32(9)), "header", "dimensions"),
        Case("n_dims_absurd", _patch(buf, field(p, "tensor[0].n_dims").start, _u32(0xFFFFFFFF)), "header", "dimensions"),
        Case("duplicate_tensor", build(p, infos=p.tensor_infos + [p.tensor_infos[0]]), "header", "token_embd.weight"),
        Case("tensor_name_invalid_utf8", build(p, infos=[_tensor_info("blk.\xff", *_info_parts(p.tensor_infos[0])[1:])]
                                                + p.tensor_infos[1:]).replace(b"blk.\xc3\xbf", b"blk.\xff\xff"),
             "load", "token_embd.weight"),
    ]
    # Header complete, tensor data missing or out of the file: header-only commands still work.
    name, dims, gt, off = _info_parts(p.tensor_infos[last])
    c += [
        Case("offset_past_end", build(p, infos=p.tensor_infos[:last] + [_tensor_info(name, dims, gt, 1 << 40)]),
             "data", "truncated"),
        Case("dims_huge", build(p, infos=p.tensor_infos[:last] + [_tensor_info(name, (1 << 40,) * 2, gt, off)]),
             "data", "truncated"),
    ]
    # Header fine, llama.cpp refuses: its reason is the message.
    c += [
        Case("unknown_architecture", build(p, kvs=[KV(k.key.replace(b"llama.", b"nosucharch."), k.vtype, k.raw)
                                                    for k in _set_kv(p, "general.architecture", 8, "nosucharch")]),
             "load", "nosucharch"),
        Case("unknown_tokenizer", build(p, kvs=_set_kv(p, "tokenizer.ggml.model", 8, "nosuchtok")), "load", "nosuchtok"),
        Case("missing_tokens", build(p, kvs=_without(p, "tokenizer.ggml.tokens")), "load", "vocab"),
        Case("missing_tokenizer_model", build(p, kvs=_without(p, "tokenizer.ggml.model")), "load", "tokenizer.ggml.model"),
        Case("missing_merges", build(p, kvs=_without(p, "tokenizer.ggml.merges")), "load", "merges"),
        Case("missing_architecture", build(p, kvs=_without(p, "general.architecture")), "load", "architecture"),
        Case("missing_tensor", build(p, infos=p.tensor_infos[:last], data=p.data[:off]), "load", name),
        Case("wrong_tensor_shape", build(p, infos=p.tensor_infos[:last] + [_tensor_info(name, dims[::-1], gt, off)]),
             "load", name),
        Case("unknown_tensor_type", build(p, infos=p.tensor_infos[:last] + [_tensor_info(name, dims, 200, off)]),
             "load", "type"),
        Case("misaligned_offset", build(p, infos=p.tensor_infos[:last] + [_tensor_info(name, dims, gt, off - 1)]),
             "load", "offset"),
    ]
    # Odd but harmless: every command works.
    c += [
        Case("name_invalid_utf8", build(p, kvs=_set_kv(p, "general.name", 8, b"tiny \xff\xfe model")), "ok"),
        Case("chat_template_invalid_utf8", build(p, kvs=_set_kv(p, "tokenizer.chat_template", 8, b"{{ '\xc3' }}")), "ok"),
    ]
    return c


def corpus(base: bytes | Path) -> list[Case]:
    """Every case derived from `base` (a small valid GGUF with a BPE tokenizer and no general.alignment)."""
    buf = Path(base).read_bytes() if isinstance(base, Path) else base
    p = parse(buf)
    cases = _cuts(buf, p) + _bad_values(buf, p)
    assert len({c.name for c in cases}) == len(cases), "case names must be unique"
    return cases
