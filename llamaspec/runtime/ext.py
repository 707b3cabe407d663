"""llama.cpp's staging C API (`src/llama-ext.h`) and its extended batch, for the draft types that
read the target's hidden layers (draft-eagle3, draft-dflash, draft-dspark).

The staging functions are C++ (mangled names) and not part of llama.h; llama-cpp-python binds a
few of them in `llama_cpp.llama_cpp_ext` and not the layer-extraction ones, so they are bound here
the same way (plain name, then the Itanium and MSVC manglings). `missing()` names what a given
libllama lacks, so a spec type can refuse with that name instead of crashing mid-generation.
The extended batch (`llama_batch_ext_*`, `llama_process`) is plain C in llama.h: an entry may
carry a token id, an embedding row, or both (what EAGLE-3's decoder and DFlash's injection need).
"""

from __future__ import annotations

import ctypes
from typing import Any, Iterable

import numpy as np

import llama_cpp

_lib = llama_cpp.llama_cpp._lib
_ctx_p = llama_cpp.llama_context_p_ctypes
_model_p = llama_cpp.llama_model_p_ctypes
_float_p = ctypes.POINTER(ctypes.c_float)

_MISSING: dict[str, str] = {}  # function -> why it is unavailable


def _bind(name: str, mangled: Iterable[str], argtypes: list[Any], restype: Any):
    for sym in (name, *mangled):
        fn = getattr(_lib, sym, None)
        if fn is not None:
            fn.argtypes = argtypes
            fn.restype = restype
            return fn
    _MISSING[name] = "not exported by libllama"
    return None


# void llama_set_embeddings_layer_inp(llama_context *, uint32_t lid, bool value)
set_embeddings_layer_inp = _bind(
    "llama_set_embeddings_layer_inp",
    ("_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
     "?llama_set_embeddings_layer_inp@@YAXPEAUllama_context@@I_N@Z"),
    [_ctx_p, ctypes.c_uint32, ctypes.c_bool], None)
# float * llama_get_embeddings_layer_inp(llama_context *, uint32_t lid): one row per batch token
get_embeddings_layer_inp = _bind(
    "llama_get_embeddings_layer_inp",
    ("_Z30llama_get_embeddings_layer_inpP13llama_contextj",
     "?llama_get_embeddings_layer_inp@@YAPEAMPEAUllama_context@@I@Z"),
    [_ctx_p, ctypes.c_uint32], _float_p)
set_embeddings_nextn = _bind(
    "llama_set_embeddings_nextn",
    ("_Z26llama_set_embeddings_nextnP13llama_contextbb",
     "?llama_set_embeddings_nextn@@YAXPEAUllama_context@@_N1@Z"),
    [_ctx_p, ctypes.c_bool, ctypes.c_bool], None)
get_embeddings_nextn = _bind(
    "llama_get_embeddings_nextn",
    ("_Z26llama_get_embeddings_nextnP13llama_context",
     "?llama_get_embeddings_nextn@@YAPEAMPEAUllama_context@@@Z"),
    [_ctx_p], _float_p)
get_embeddings_nextn_ith = _bind(
    "llama_get_embeddings_nextn_ith",
    ("_Z30llama_get_embeddings_nextn_ithP13llama_contexti",
     "?llama_get_embeddings_nextn_ith@@YAPEAMPEAUllama_context@@H@Z"),
    [_ctx_p, ctypes.c_int32], _float_p)
_target_layer_ids = _bind(
    "llama_model_target_layer_ids",
    ("_Z28llama_model_target_layer_idsPK11llama_model",
     "?llama_model_target_layer_ids@@YAPEBHPEBUllama_model@@@Z"),
    [_model_p], ctypes.POINTER(ctypes.c_int32))
_target_layer_ids_n = _bind(
    "llama_model_target_layer_ids_n",
    ("_Z30llama_model_target_layer_ids_nPK11llama_model",
     "?llama_model_target_layer_ids_n@@YAIPEBUllama_model@@@Z"),
    [_model_p], ctypes.c_uint32)
_dflash_selector_top_k = _bind(
    "llama_model_dflash_selector_top_k",
    ("_Z33llama_model_dflash_selector_top_kPK11llama_model",
     "?llama_model_dflash_selector_top_k@@YAHPEBUllama_model@@@Z"),
    [_model_p], ctypes.c_int32)

for _name in ("llama_batch_ext_init", "llama_batch_ext_free", "llama_batch_ext_clear", "llama_batch_ext_add_token",
              "llama_batch_ext_add_embd", "llama_batch_ext_set_embd_token", "llama_batch_ext_set_pos",
              "llama_batch_ext_set_output_logits", "llama_process", "llama_set_causal_attn", "llama_vocab_mask",
              "llama_n_ubatch"):
    if not hasattr(llama_cpp, _name):
        _MISSING[_name] = "not bound by this llama-cpp-python"

PROCESS_ENCODE = getattr(llama_cpp, "LLAMA_PROCESS_TYPE_ENCODE", 0)
PROCESS_DECODE = getattr(llama_cpp, "LLAMA_PROCESS_TYPE_DECODE", 1)


def missing(names: Iterable[str] | None = None) -> list[str]:
    """The C functions (of `names`, default all used here) this llama.cpp build does not provide."""
    return [n for n in (names if names is not None else _MISSING) if n in _MISSING]


def target_layer_ids(model_ptr) -> list[int]:
    """The target layers a draft model (eagle3 / dflash) reads: `<arch>.target_layers`."""
    n = int(_target_layer_ids_n(model_ptr))
    ptr = _target_layer_ids(model_ptr)
    return [int(ptr[i]) for i in range(n)] if n and ptr else []


def dflash_selector_top_k(model_ptr) -> int:
    """> 0 for a DFlash2 draft (candidate-selector lattice instead of plain logits)."""
    return int(_dflash_selector_top_k(model_ptr))


def vocab_mask(vocab) -> int:
    """The vocabulary's mask token (`tokenizer.ggml.mask_token_id`), -1 when it has none."""
    return int(llama_cpp.llama_vocab_mask(vocab))


def rows(ptr, n_rows: int, width: int) -> np.ndarray:
    """A numpy view of n_rows x width floats at ptr (valid until the context's next decode)."""
    return np.ctypeslib.as_array(ptr, shape=(n_rows, width))


class ExtBatch:
    """One reusable `llama_batch_ext` of a context: entries with a token id, an embedding row, or
    both, each with its own position, sequence and output flag; llama.cpp copies the rows in."""

    def __init__(self, ctx_ptr):
        self.ctx = ctx_ptr
        self.ptr = llama_cpp.llama_batch_ext_init(ctx_ptr)
        if not self.ptr:
            raise MemoryError("llama_batch_ext_init failed")
        self._pos = (llama_cpp.llama_pos * 4)()
        self.n = 0

    def clear(self) -> None:
        llama_cpp.llama_batch_ext_clear(self.ptr)
        self.n = 0

    def _embd(self, row: np.ndarray):
        return llama_cpp.llama_embd(row.ctypes.data_as(_float_p), 1, row.shape[-1])

    def _finish(self, idx: int, pos: int, output: bool) -> None:
        if idx < 0:
            raise ValueError(f"llama_batch_ext: cannot add entry {self.n} (error {idx}; batch full?)")
        self._pos[0] = self._pos[1] = self._pos[2] = pos
        llama_cpp.llama_batch_ext_set_pos(self.ptr, idx, self._pos)
        if output:
            llama_cpp.llama_batch_ext_set_output_logits(self.ptr, idx, True)
        self.n += 1

    def add_token(self, seq_id: int, token: int, pos: int, output: bool, embd: np.ndarray | None = None) -> int:
        """A token entry, with an embedding row too when `embd` is given (float32, contiguous)."""
        idx = llama_cpp.llama_batch_ext_add_token(self.ptr, seq_id, int(token))
        if embd is not None and idx >= 0 and not llama_cpp.llama_batch_ext_set_embd_token(self.ptr, idx, self._embd(embd)):
            raise ValueError(f"llama_batch_ext: embedding of width {embd.shape[-1]} refused")
        self._finish(idx, pos, output)
        return idx

    def add_embd(self, seq_id: int, embd: np.ndarray, pos: int, output: bool) -> int:
        """An embedding-only entry (float32, contiguous row)."""
        idx = llama_cpp.llama_batch_ext_add_embd(self.ptr, seq_id, self._embd(embd))
        self._finish(idx, pos, output)
        return idx

    def process(self, encode: bool = False) -> int:
        """llama_process of this batch: llama_decode's return codes (0 ok)."""
        return int(llama_cpp.llama_process(self.ctx, PROCESS_ENCODE if encode else PROCESS_DECODE, self.ptr))

    def close(self) -> None:
        if self.ptr:
            llama_cpp.llama_batch_ext_free(self.ptr)
            self.ptr = None
