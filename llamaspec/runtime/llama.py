"""Models and contexts on llama-cpp-python's low-level C API: the only module (with the drafters
that own a context) that touches llama_cpp.

Why not the high-level `Llama` class: it keeps an n_ctx x n_vocab logits array when every
position is an output (4 GB for Gemma 3 at 4k context) and re-evaluates history to sync a draft.
Here a verify step marks only the batch positions it needs as outputs and reads their rows from
llama.cpp's own buffer, and each context keeps exactly the KV cache it needs.
"""

from __future__ import annotations

import codecs
import ctypes
import os
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from time import perf_counter as _perf

import numpy as np

import llama_cpp

from llamaspec.errors import ContextFullError, ModelLoadError

# ---- llama.cpp's log: kept quiet, but remembered so load failures can say why -----------------
_LOG_TAIL: deque[str] = deque(maxlen=30)
_VERBOSE = False


@llama_cpp.llama_log_callback
def _log_cb(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:  # pragma: no cover - C callback
    msg = text.decode("utf-8", errors="replace")
    _LOG_TAIL.append(msg)
    if _VERBOSE:
        import sys

        sys.stderr.write(msg)


def set_llama_log(verbose: bool) -> None:
    global _VERBOSE
    _VERBOSE = verbose
    # Re-install: llama_cpp's high-level Llama class replaces the process-wide callback.
    llama_cpp.llama_log_set(_log_cb, ctypes.c_void_p(0))


llama_cpp.llama_log_set(_log_cb, ctypes.c_void_p(0))
llama_cpp.llama_backend_init()


def _last_log_error() -> str:
    for line in reversed(_LOG_TAIL):
        line = line.strip()
        if line and ("error" in line.lower() or "failed" in line.lower() or "invalid" in line.lower()):
            return line
    return ""


class DecodeClock:
    """Seconds spent inside llama.cpp's decode (llama_decode, and llama_get_logits, which waits
    for the batch to finish), over all contexts: the rest of a step is our own overhead."""

    seconds = 0.0


def default_threads() -> int:
    return max(1, os.cpu_count() or 1)


# ---- model ---------------------------------------------------------------------------------------
class Model:
    """Loaded weights and vocabulary. One model can serve several contexts (target + MTP)."""

    def __init__(self, path: str | os.PathLike[str], *, n_gpu_layers: int = 0, load_mtp: bool = False,
                 amx: bool | None = None, buffers=None):
        """amx: --amx (True) / --no-amx (False) / None (LLAMASPEC_AMX, else the default policy).
        buffers: a cpu_policy.BufferDecision to apply instead of deciding (tests, scripts)."""
        from llamaspec.runtime.info import apply_buffer_policy

        self.path = Path(path)
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        if load_mtp:
            params.load_mtp = True
        self.load_mtp = bool(load_mtp)  # NextN/MTP tensors loaded (an MTP context needs them)
        if not self.path.is_file():
            from llamaspec.gguf.header import read_file

            read_file(self.path)  # raises the precise "not found" / "is a directory" error
        # CPUs with AMX: load without llama.cpp's AMX weight buffer (it crashes on quantized
        # models, llama.cpp issue 20824) but keep CPU_REPACK; see cpu_policy.py.
        self.amx = amx
        self.buffers = apply_buffer_policy(params, self.path, amx, decision=buffers)  # keeps overrides alive
        _LOG_TAIL.clear()
        self.ptr = llama_cpp.llama_model_load_from_file(str(self.path).encode(), params)
        if not self.ptr:
            from llamaspec.gguf.header import read_file

            read_file(self.path)  # a missing, truncated or non-GGUF file gets its own message
            why = _last_log_error()
            raise ModelLoadError(
                f"llama.cpp could not load {self.path}" + (f": {why}" if why else ""),
                "check that the file is a complete GGUF of an architecture this llama.cpp supports "
                "(llamaspec doctor shows the version)",
            )
        self.vocab = llama_cpp.llama_model_get_vocab(self.ptr)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.n_embd = llama_cpp.llama_model_n_embd(self.ptr)
        self.n_ctx_train = llama_cpp.llama_model_n_ctx_train(self.ptr)
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))
        self.bos = llama_cpp.llama_vocab_bos(self.vocab)
        self.eos = llama_cpp.llama_vocab_eos(self.vocab)
        # Partial KV removal is impossible on recurrent state: the engine rolls back by checkpoint.
        self.needs_checkpoints = bool(llama_cpp.llama_model_is_recurrent(self.ptr)
                                      or llama_cpp.llama_model_is_hybrid(self.ptr))
        self.n_nextn = int(llama_cpp.llama_model_n_layer_nextn(self.ptr)) if hasattr(
            llama_cpp, "llama_model_n_layer_nextn") else 0
        self._piece_cache: dict[int, bytes] = {}
        self._eog_cache: dict[int, bool] = {}

    # tokens <-> text
    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 16
        buf = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = (llama_cpp.llama_token * n_max)()
            n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """Bytes of one token as it appears in output text (special tokens rendered empty)."""
        p = self._piece_cache.get(token)
        if p is None:
            buf = ctypes.create_string_buffer(64)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, 64, 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, -n, 0, False)
            p = buf.raw[:n]
            self._piece_cache[token] = p
        return p

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def token_text(self, token: int) -> str:
        return llama_cpp.llama_vocab_get_text(self.vocab, token).decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        r = self._eog_cache.get(token)
        if r is None:
            r = self._eog_cache[token] = bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))
        return r

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(1 << 16)
        n = llama_cpp.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            llama_cpp.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    @property
    def chat_template(self) -> str | None:
        return self.meta("tokenizer.chat_template")

    def chat_prompt(self, messages: list[dict[str, str]]) -> str:
        """Render messages with the model's own chat template (Jinja, as in the GGUF)."""
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        template = self.chat_template
        if not template:
            raise ModelLoadError(f"{self.path.name} has no chat template", "use --raw for plain completion")
        fmt = Jinja2ChatFormatter(template=template, eos_token=self.token_text(self.eos) if self.eos >= 0 else "",
                                  bos_token=self.token_text(self.bos) if self.bos >= 0 else "",
                                  add_generation_prompt=True)
        return fmt(messages=messages).prompt

    def tokenize_prompt(self, text: str) -> list[int]:
        """Tokenize a full prompt, adding BOS only if the text does not already start with it."""
        bos_text = self.token_text(self.bos) if self.bos >= 0 else ""
        add = self.add_bos and not (bos_text and text.startswith(bos_text))
        toks = self.tokenize(text, add_special=False, parse_special=True)
        return ([self.bos] if add else []) + toks

    def close(self) -> None:
        if getattr(self, "ptr", None):
            llama_cpp.llama_model_free(self.ptr)
            self.ptr = None

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


# ---- context ---------------------------------------------------------------------------------------
@dataclass
class ContextConfig:
    n_ctx: int = 4096
    n_batch: int = 512
    n_threads: int | None = None
    n_seq_max: int = 1


class Context:
    """A llama.cpp context with one reusable batch and explicit sequence ids."""

    def __init__(self, model: Model, config: ContextConfig, *, ctx_type: int | None = None,
                 ctx_other=None, embeddings: bool = False):
        self.model = model
        self.config = config
        p = llama_cpp.llama_context_default_params()
        n_ctx = config.n_ctx if config.n_ctx > 0 else model.n_ctx_train
        p.n_ctx = n_ctx
        p.n_batch = config.n_batch
        p.n_ubatch = config.n_batch
        p.n_seq_max = config.n_seq_max
        threads = config.n_threads or default_threads()
        p.n_threads = threads
        p.n_threads_batch = threads
        p.no_perf = True
        if embeddings:
            p.embeddings = True
        if ctx_type is not None:
            p.ctx_type = ctx_type
        if ctx_other is not None:
            p.ctx_other = ctx_other
        _LOG_TAIL.clear()
        self.ptr = llama_cpp.llama_init_from_model(model.ptr, p)
        if not self.ptr:
            why = _last_log_error()
            raise ModelLoadError(f"could not create a llama.cpp context for {model.path.name}"
                                 + (f": {why}" if why else ""), "try a smaller --ctx-size")
        self.n_ctx = llama_cpp.llama_n_ctx(self.ptr)
        self.mem = llama_cpp.llama_get_memory(self.ptr)
        self.n_batch = config.n_batch
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, config.n_seq_max)
        b = self._batch
        # numpy views on the batch arrays: filling a batch costs a few slice assignments.
        self._tok = np.ctypeslib.as_array(b.token, shape=(self.n_batch,))
        self._pos = np.ctypeslib.as_array(b.pos, shape=(self.n_batch,))
        self._nseq = np.ctypeslib.as_array(b.n_seq_id, shape=(self.n_batch,))
        self._out = np.ctypeslib.as_array(b.logits, shape=(self.n_batch,))
        self._nseq[:] = 1
        self._logit_views: dict[tuple[int, int], np.ndarray] = {}
        self._seq_of_slot = [0] * self.n_batch
        for i in range(self.n_batch):
            b.seq_id[i][0] = 0
        self._decode_listeners: list = []

    def add_decode_listener(self, fn) -> None:
        """Call fn(ctx, tokens, start_pos, seq_id) after every successful llama_decode of this context
        (once per n_batch chunk), while the chunk's per-token outputs (e.g. the NextN embeddings an
        MTP drafter pairs with the next tokens) are still readable."""
        self._decode_listeners.append(fn)

    def remove_decode_listener(self, fn) -> None:
        if fn in self._decode_listeners:
            self._decode_listeners.remove(fn)

    def decode(self, tokens: list[int], start_pos: int, seq_id: int = 0, outputs: str | int = "last") -> int:
        """Evaluate `tokens` at positions start_pos.. of `seq_id`.

        outputs: "last" (logits of the final token), "all", or an int n (the last n tokens).
        Longer inputs are split into n_batch chunks; only the final chunk produces outputs, so
        asking for more rows than it holds is an error (a verify batch must fit one chunk).
        Returns the number of output rows available from `logits()`.
        """
        n = len(tokens)
        n_last = n - (n - 1) // self.n_batch * self.n_batch if n else 0  # size of the final chunk
        want = n if outputs == "all" else 1 if outputs == "last" else int(outputs)
        if n and want > n_last:  # rows of earlier chunks are gone once the next chunk is decoded
            raise ValueError(f"{want} output rows requested from a batch of {n} tokens; only the "
                             f"last n_batch chunk ({n_last} tokens) has outputs")
        if start_pos + n > self.n_ctx:
            raise ContextFullError(
                f"context full: {start_pos + n} tokens needed, context size is {self.n_ctx}",
                "raise --ctx-size or shorten the prompt / -n",
            )
        i = 0
        n_out = 0
        while i < n:
            m = min(self.n_batch, n - i)
            last_chunk = i + m == n
            self._tok[:m] = tokens[i:i + m]
            self._pos[:m] = np.arange(start_pos + i, start_pos + i + m, dtype=np.int32)
            self._set_seq(m, seq_id)
            self._out[:m] = 0
            if last_chunk:
                self._out[m - want:m] = 1
                n_out = want
            self._batch.n_tokens = m
            t0 = _perf()
            rc = llama_cpp.llama_decode(self.ptr, self._batch)
            DecodeClock.seconds += _perf() - t0
            if rc != 0:
                raise ModelLoadError(f"llama_decode failed with code {rc}",
                                     "the context may be full or the batch too large; raise --ctx-size")
            if self._decode_listeners:
                chunk = list(tokens[i:i + m])
                for fn in tuple(self._decode_listeners):
                    fn(self, chunk, start_pos + i, seq_id)
            i += m
        return n_out

    def _set_seq(self, m: int, seq_id: int) -> None:
        slots = self._seq_of_slot
        for j in range(m):
            if slots[j] != seq_id:
                self._batch.seq_id[j][0] = seq_id
                slots[j] = seq_id

    def logits(self, n_out: int) -> np.ndarray:
        """The output rows of the last decode, [n_out, n_vocab]; a view valid until the next decode."""
        t0 = _perf()
        ptr = llama_cpp.llama_get_logits(self.ptr)  # waits for llama.cpp to finish the batch
        DecodeClock.seconds += _perf() - t0
        key = (ctypes.addressof(ptr.contents), n_out)
        view = self._logit_views.get(key)
        if view is None:  # building a numpy view costs ~70 us; llama.cpp reuses its buffer
            if len(self._logit_views) > 64:
                self._logit_views.clear()
            view = self._logit_views[key] = np.ctypeslib.as_array(ptr, shape=(n_out, self.model.n_vocab))
        return view

    def seq_rm(self, seq_id: int, p0: int, p1: int = -1) -> bool:
        return bool(llama_cpp.llama_memory_seq_rm(self.mem, seq_id, p0, p1))

    def seq_pos_max(self, seq_id: int) -> int:
        return int(llama_cpp.llama_memory_seq_pos_max(self.mem, seq_id))

    def clear(self) -> None:
        llama_cpp.llama_memory_clear(self.mem, True)

    # Checkpoints, for targets whose memory cannot be partially removed (recurrent/hybrid).
    def save_seq(self, seq_id: int) -> bytearray:
        """A checkpoint of `seq_id`, to roll it back later with `load_seq`.

        llama.cpp writes the state straight into the returned bytearray: no copy on our side
        (a 21 MB Mamba state: 3 ms; `bytes(buf[:n])` built a Python list first: 530 ms).
        Hybrid models (attention + recurrent layers): only the recurrent part is saved
        (LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY); the attention KV, whose tail can be cut, is not
        copied at all. Pure recurrent models: the whole state (the flag changes nothing there).
        """
        flags = (llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if llama_cpp.llama_model_is_hybrid(self.model.ptr)
                 else llama_cpp.LLAMA_STATE_SEQ_FLAGS_NONE)
        size = llama_cpp.llama_state_seq_get_size_ext(self.ptr, seq_id, flags)
        state = bytearray(size)
        view = (ctypes.c_uint8 * size).from_buffer(state)
        n = llama_cpp.llama_state_seq_get_data_ext(self.ptr, view, size, seq_id, flags)
        del view  # release the export, or the bytearray cannot be resized
        if n == 0:
            raise ModelLoadError("could not save a sequence checkpoint", "report this as a bug")
        del state[n:]
        return state

    def load_seq(self, state: bytes | bytearray, seq_id: int) -> None:
        """Roll `seq_id` back to a checkpoint from `save_seq`, taken when the sequence held a
        prefix of what it holds now (positions < p, p = the checkpoint's length).

        Hybrid models: the checkpoint holds the recurrent part only. Restoring it puts the
        recurrent state back at p; the attention KV still holds the positions from p on, which
        are then cut (llama.cpp's hybrid seq_rm works once the recurrent part is no longer past
        p). The attention entries before p are kept: they are the same tokens as when saved.
        """
        hybrid = llama_cpp.llama_model_is_hybrid(self.model.ptr)
        flags = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY if hybrid else llama_cpp.LLAMA_STATE_SEQ_FLAGS_NONE
        if isinstance(state, bytearray):  # llama.cpp reads it in place: no copy either way
            src = (ctypes.c_uint8 * len(state)).from_buffer(state)
        else:
            src = ctypes.cast(ctypes.c_char_p(bytes(state)), ctypes.POINTER(ctypes.c_uint8))
        if llama_cpp.llama_state_seq_set_data_ext(self.ptr, src, len(state), seq_id, flags) == 0:
            raise ModelLoadError("could not restore a sequence checkpoint", "report this as a bug")
        if hybrid and not self.seq_rm(seq_id, self.seq_pos_max(seq_id) + 1, -1):
            raise ModelLoadError("could not cut the attention part of a restored checkpoint",
                                 "report this as a bug")

    def close(self) -> None:
        if getattr(self, "_batch", None) is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "ptr", None):
            llama_cpp.llama_free(self.ptr)
            self.ptr = None

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


class Utf8Stream:
    """Turns token bytes into text as it streams, holding back incomplete UTF-8 sequences."""

    def __init__(self) -> None:
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, data: bytes) -> str:
        return self._dec.decode(data)

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)
