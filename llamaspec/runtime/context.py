"""llama.cpp contexts on the low-level C API: one reusable batch, explicit sequence ids, logits
rows read in place, sequence checkpoints. Models are in llama.py."""

from __future__ import annotations

import ctypes
from time import perf_counter as _perf
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np

import llama_cpp

from llamaspec.errors import ContextFullError, ModelLoadError
from llamaspec.runtime.llama import DecodeClock, Model, LOG_TAIL, last_log_error, default_threads


@dataclass
class ContextConfig:
    n_ctx: int = 4096
    n_batch: int = 512
    n_threads: int | None = None
    n_seq_max: int = 1
    # None: unified when several sequences share the context (verify rows of any lengths in one
    # pass); False: split per sequence, llama.cpp's and llama-server's default (see Context)
    kv_unified: bool | None = None


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
        # Several sequences share one unified KV cache. Split per sequence (llama.cpp's default),
        # a batch is cut into ubatches of consecutive sequence ids with equally many tokens each:
        # the verify rows of 4 sequences drafting 1, 5, 1 and 3 tokens cost 3 forward passes
        # instead of one. Unified, any batch is one pass; each sequence is still held to
        # n_ctx / n_seq_max positions (n_ctx_seq below), so they always fit. But unified, every
        # row attends over all sequences' cells (masked): with nothing drafted (one row per
        # sequence) split is faster (llama-batched-bench -npl 4 here: unified 0.93x at 512-token
        # prompts), so a context that never verifies drafts asks for split.
        unified = config.n_seq_max > 1 if config.kv_unified is None else config.kv_unified and config.n_seq_max > 1
        self.unified = unified
        if unified:
            p.kv_unified = True
        LOG_TAIL.clear()
        self.ptr = llama_cpp.llama_init_from_model(model.ptr, p)
        if not self.ptr:
            why = last_log_error()
            raise ModelLoadError(f"could not create a llama.cpp context for {model.path.name}"
                                 + (f": {why}" if why else ""), "try a smaller --ctx-size")
        self.n_ctx = llama_cpp.llama_n_ctx(self.ptr)
        # The positions one sequence may use: n_ctx / n_seq_max with several sequences (the
        # unified cache would let one take it all and leave another with no room mid-batch).
        self.n_ctx_seq = int(llama_cpp.llama_n_ctx_seq(self.ptr))
        if unified:
            self.n_ctx_seq = min(self.n_ctx_seq, self.n_ctx // config.n_seq_max)
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

    @property
    def has_decode_listeners(self) -> bool:
        return bool(self._decode_listeners)

    def remove_decode_listener(self, fn) -> None:
        if fn in self._decode_listeners:
            self._decode_listeners.remove(fn)

    def decode(self, tokens: list[int], start_pos: int, seq_id: int = 0,
               outputs: Literal["last", "all"] | int = "last") -> int:
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
        if start_pos + n > self.n_ctx_seq:
            raise ContextFullError(
                f"context full: {start_pos + n} tokens needed, context size is {self.n_ctx_seq}",
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

    def decode_many(self, segments: list[tuple[list[int], int, int]],
                    outputs: Literal["all", "last"] | Sequence[int] = "all") -> list[int]:
        """Evaluate several sequences' tokens in ONE llama_decode.

        segments: (tokens, start_pos, seq_id) per sequence, each non-empty; together at most
        n_batch tokens (the verify rows of every active sequence, llama.cpp's multi-sequence batch).
        outputs: "all" (every token an output row), "last" (each segment's final token: a draft
        model bringing several sequences up to date needs only their next-token rows), or per
        segment how many of its last tokens are output rows (a prompt chunk: 0, or 1 at its end).
        Returns each segment's first row in `logits(rows)`, rows = the output rows in all.
        """
        total = sum(len(t) for t, _, _ in segments)
        if total > self.n_batch:
            raise ValueError(f"{total} tokens in one multi-sequence batch; n_batch is {self.n_batch}")
        for toks, start, _ in segments:
            if start + len(toks) > self.n_ctx_seq:
                raise ContextFullError(f"context full: {start + len(toks)} tokens needed, context size is "
                                       f"{self.n_ctx_seq}", "raise --ctx-size or shorten the prompt / -n")
        if isinstance(outputs, str):
            outputs = [len(t) if outputs == "all" else 1 for t, _, _ in segments]
        firsts, j, row = [0] * len(segments), 0, 0
        slots, batch = self._seq_of_slot, self._batch
        self._out[:total] = 0
        order = range(len(segments))
        if not self.unified:   # split: ubatches take consecutive sequence ids; in order, one pass
            order = sorted(order, key=lambda i: segments[i][2])
        for i in order:
            (toks, start, seq_id), k = segments[i], outputs[i]
            m = len(toks)
            firsts[i] = row
            row += k
            self._tok[j:j + m] = toks
            self._pos[j:j + m] = np.arange(start, start + m, dtype=np.int32)
            for r in range(j, j + m):
                if slots[r] != seq_id:
                    batch.seq_id[r][0] = seq_id
                    slots[r] = seq_id
            j += m
            if k:
                self._out[j - k:j] = 1
        batch.n_tokens = total
        t0 = _perf()
        rc = llama_cpp.llama_decode(self.ptr, batch)
        DecodeClock.seconds += _perf() - t0
        if rc != 0:
            raise ModelLoadError(f"llama_decode failed with code {rc}",
                                 "the context may be full or the batch too large; raise --ctx-size")
        if self._decode_listeners:
            for toks, start, seq_id in segments:
                for fn in tuple(self._decode_listeners):
                    fn(self, list(toks), start, seq_id)
        return firsts

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

    def time_one_token(self, token: int = 0, reps: int = 3) -> float:
        """Seconds of a one-token decode on this context (the fastest of `reps`), measured on an
        empty memory, which is left empty: what a draft model costs per token against the target
        is known before the first draft (drafters.factory). Also warms the context up."""
        best = float("inf")
        for _ in range(max(1, reps)):
            t0 = _perf()
            self.decode([token], 0, 0)
            self.logits(1)
            best = min(best, _perf() - t0)
            self.clear()
        return best

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
        # Pointers are cleared before they are freed: a signal handler or __del__ running between
        # the two must find nothing left to free (a double free aborts the process).
        batch, self._batch = getattr(self, "_batch", None), None
        if batch is not None:
            llama_cpp.llama_batch_free(batch)
        ptr, self.ptr = getattr(self, "ptr", None), None
        if ptr:
            llama_cpp.llama_free(ptr)

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass
