"""Checks on a parsed GGUF header beyond its byte layout: value types of the keys llama.cpp relies on,
the alignment, and where the tensor data ends (a cut-off download). Used by header.py's reader and
peek.py's light reader alike, so both refuse the same files.
"""

from __future__ import annotations

from typing import Any

from llamaspec.errors import ModelFileError

# ggml_type id -> (elements per block, bytes per block), as ggml's type traits (gguf-py's
# GGML_QUANT_SIZES); the size of a tensor's data, to tell a complete file from a cut-off one.
GGML_BLOCKS = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 40),
    10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
    16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110),
    22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8),
    29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66), 39: (32, 17), 40: (64, 36), 41: (128, 18),
}

# Keys whose value type llama.cpp relies on: a file that breaks these is refused here with the key
# named (llama.cpp refuses it too, with a less clear message). "int" = any integer type.
_STR, _INT, _BOOL, _STRS = "a string", "an integer", "a boolean", "an array of strings"
KNOWN_TYPES = {
    "general.architecture": _STR, "general.name": _STR, "general.alignment": _INT, "general.file_type": _INT,
    "tokenizer.ggml.model": _STR, "tokenizer.ggml.pre": _STR, "tokenizer.ggml.tokens": _STRS,
    "tokenizer.ggml.bos_token_id": _INT, "tokenizer.ggml.eos_token_id": _INT,
    "tokenizer.ggml.add_bos_token": _BOOL, "tokenizer.ggml.add_eos_token": _BOOL, "tokenizer.chat_template": _STR,
}
ARCH_INT_KEYS = ("context_length", "block_count", "embedding_length", "vocab_size", "nextn_predict_layers")


def corrupt(source: str, what: str) -> ModelFileError:
    return ModelFileError(f"corrupt GGUF header in {source}: {what}",
                          "the file is damaged; download it again or convert the model again")


def _type_name(v: Any) -> str:
    if isinstance(v, bool):
        return _BOOL
    if isinstance(v, int):
        return _INT
    if isinstance(v, float):
        return "a float"
    if isinstance(v, str):
        return _STR
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return _STRS
    return "an array of numbers"


def check_metadata(metadata: dict[str, Any], source: str) -> None:
    """Refuse values of the wrong type for the keys llama.cpp relies on (named in the message)."""
    arch = metadata.get("general.architecture")
    wanted = dict(KNOWN_TYPES)
    if isinstance(arch, str):
        wanted.update({f"{arch}.{k}": _INT for k in ARCH_INT_KEYS})
    for key, want in wanted.items():
        if key not in metadata:
            continue
        got = _type_name(metadata[key])
        if got != want and not (want == _BOOL and got == _INT):
            raise corrupt(source, f"key {key!r} is {got}, expected {want}")
    align = metadata.get("general.alignment")
    if align is not None and (align <= 0 or align & (align - 1)):
        raise corrupt(source, f"key 'general.alignment' is {align}, expected a power of two")


def data_start(metadata: dict[str, Any], header_end: int) -> int:
    alignment = metadata.get("general.alignment", 32)
    alignment = alignment if isinstance(alignment, int) and alignment > 0 else 32
    return -(-header_end // alignment) * alignment


def data_end(tensors: list, metadata: dict[str, Any], header_end: int) -> tuple[int, str | None]:
    """(file offset where the tensor data ends, the tensor ending there); types ggml's table does
    not know count from their start only."""
    end, last = 0, None
    start = data_start(metadata, header_end)
    for t in tensors:
        block, size = GGML_BLOCKS.get(t.ggml_type, (1, 0))
        stop = start + t.offset + -(-t.n_elements // block) * size
        if stop > end:
            end, last = stop, t.name
    return end, last
