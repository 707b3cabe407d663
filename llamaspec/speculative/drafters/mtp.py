"""`draft-mtp`: drafting with the NextN / MTP heads the target GGUF carries itself.

A second llama.cpp context of type MTP on the *same* model runs only the NextN block(s). Its input
at position p is the token at p together with the target's NextN hidden state ("h") at p-1; its
output at p predicts the token at p+1 and yields an h of its own, which (with the drafted token)
feeds the next draft step. llama.cpp's common/speculative.cpp (`draft-mtp`) and llama-cpp-python's
server `MTPDraftProvider` do the same.

Keeping the MTP context in step with the sequence:

* The target context calls `_on_target_decode` after every llama_decode (a `Context` decode
  listener; prompt chunks, verify batches, checkpoint replays alike). It copies that batch's
  NextN rows (the target runs with unmasked NextN embeddings: one row per token) into a small
  per-sequence buffer. Nothing is decoded there: which verify rows are accepted is not known yet.
* `begin` adds the whole prompt to the MTP KV cache (every prompt position is confirmed; prompts
  longer than n_batch are added chunk by chunk as the target evaluates them). `propose` knows the
  accepted history: it adds only the positions the target has confirmed since (token p, h p-1),
  in the same batch as the row that drafts (the last token, paired with the target's h of the
  position before it), so a step costs one MTP decode for catch-up and the first draft token plus
  one per further token. Rejected draft positions never enter the MTP KV; the rows of the draft
  chain (computed from the MTP's own h, not the target's) are removed right after drafting.
* `llama_get_ctx_other` is NULL for most architectures (mimo2, qwen35...): the MTP context has a KV
  cache of its own for the NextN layer. When it shares the target's memory (a Gemma 4 assistant,
  `heads=` another model: assistant.py) nothing is caught up and every draft step reuses the
  position of the last token, as llama.cpp does.
* Several NextN layers ("chained heads", step35-style): step i runs head i over the whole draft
  prefix, and catch-up batches are decoded once per head; n_max is capped at the number of heads.

Drafting is greedy top-1 (llama.cpp uses a top-k 10 sampler and takes its first candidate) and
stops when that candidate's probability among the top 10 falls below p_min. Draft tokens carry no
distribution, so at T > 0 the engine verifies by sample-and-match: lossless at any temperature.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

import llama_cpp
import llama_cpp.llama_cpp_ext as llama_ext

from llamaspec.runtime import llama as runtime
from llamaspec.speculative.drafters.base import Draft, Drafter
from llamaspec.errors import ModelLoadError, UsageError
from llamaspec.runtime.llama import Model
from llamaspec.runtime.context import Context, ContextConfig
from llamaspec.speculative.prefix import common_prefix

TOP_K = 10  # llama.cpp's MTP draft sampler: top-k 10, then the first candidate


@dataclass
class _SeqState:
    mtp_n: int = 0                                  # MTP KV holds positions [0, mtp_n), from target h
    mtp_toks: list[int] = field(default_factory=list)  # their tokens
    h: np.ndarray | None = None                     # target NextN rows for positions h_start..
    h_start: int = 0
    h_toks: list[int] = field(default_factory=list)  # the tokens the target evaluated there
    broken: bool = False                            # lost track (no drafts until the next prompt)

    @property
    def h_end(self) -> int:
        return self.h_start + len(self.h_toks)


class MtpDrafter(Drafter):
    name = "draft-mtp"

    def __init__(self, target: Model, ctx: Context, *, p_min: float = 0.0, n_threads: int | None = None,
                 heads: Model | None = None):
        """target: the model (loaded with load_mtp=True); ctx: the target's context (the engine's);
        heads: the model whose NextN layers draft, when not the target's own (a Gemma 4
        assistant GGUF: assistant.py checks it first)."""
        heads = heads if heads is not None else target
        if getattr(heads, "n_nextn", 0) <= 0:
            raise UsageError(f"{heads.path.name}: the model has no MTP heads; use --spec-type draft or ngram-mod",
                             "draft-mtp needs a GGUF with NextN layers (<arch>.nextn_predict_layers > 0), "
                             "or a Gemma 4 assistant GGUF given with --draft")
        if not getattr(heads, "load_mtp", True):
            # Creating an MTP context on a model loaded without its NextN tensors aborts the process.
            raise UsageError("the target was loaded without its MTP layers",
                             "load it with Model(path, load_mtp=True)")
        self.target = target
        self.tctx = ctx
        self.p_min = max(0.0, float(p_min))
        self.n_vocab = heads.n_vocab
        n_embd_out = getattr(llama_cpp, "llama_model_n_embd_out", None)
        self.n_embd = int(n_embd_out(heads.ptr)) if n_embd_out is not None else heads.n_embd
        if self.n_embd <= 0:
            self.n_embd = heads.n_embd
        cfg = ctx.config
        self.ctx = Context(heads, ContextConfig(n_ctx=ctx.n_ctx, n_batch=cfg.n_batch,
                                                 n_threads=n_threads or cfg.n_threads,
                                                 n_seq_max=cfg.n_seq_max),
                           ctx_type=llama_cpp.LLAMA_CONTEXT_TYPE_MTP, ctx_other=ctx.ptr)
        other = llama_ext.llama_get_ctx_other(self.ctx.ptr)
        self.mem_shared = bool(other) and other == ctypes.cast(ctx.ptr, ctypes.c_void_p).value
        self.n_heads = max(1, int(heads.n_nextn))
        self.chain_heads = self.n_heads > 1 and not self.mem_shared
        # The MTP batch carries token ids *and* embeddings: llama_batch_init(n, n_embd, ...) leaves
        # `token` NULL, so attach an array of our own (and detach it before llama_batch_free).
        self.n_batch = self.ctx.n_batch
        self._batch = llama_cpp.llama_batch_init(self.n_batch, self.n_embd, cfg.n_seq_max)
        b = self._batch
        self._tok_buf = (llama_cpp.llama_token * self.n_batch)()
        b.token = self._tok_buf
        self._tok = np.ctypeslib.as_array(self._tok_buf)
        self._pos = np.ctypeslib.as_array(b.pos, shape=(self.n_batch,))
        self._nseq = np.ctypeslib.as_array(b.n_seq_id, shape=(self.n_batch,))
        self._out = np.ctypeslib.as_array(b.logits, shape=(self.n_batch,))
        self._embd = np.ctypeslib.as_array(b.embd, shape=(self.n_batch, self.n_embd))
        self._nseq[:] = 1
        self._batch_seq = [0] * self.n_batch
        for i in range(self.n_batch):
            b.seq_id[i][0] = 0
        # Target: NextN rows for every token (unmasked); MTP: for its output rows only (masked).
        llama_ext.llama_set_embeddings_nextn(ctx.ptr, True, False)
        llama_ext.llama_set_embeddings_nextn(self.ctx.ptr, True, True)
        self._zero_h = np.zeros(self.n_embd, np.float32)
        self._seqs: dict[int, _SeqState] = {}
        # Counters for overhead measurements (seconds inside the MTP context's llama_decode).
        self.decode_calls = 0
        self.decode_rows = 0
        self.decode_seconds = 0.0
        ctx.add_decode_listener(self._on_target_decode)

    # -- the target's decodes -------------------------------------------------------------------
    def _on_target_decode(self, ctx: Context, tokens: list[int], start_pos: int, seq_id: int) -> None:
        s = self._seqs.get(seq_id)
        if s is None or start_pos == 0:
            s = self._seqs[seq_id] = _SeqState()
            if not self.mem_shared:
                self.ctx.seq_rm(seq_id, 0, -1)
        m = len(tokens)
        ptr = llama_ext.llama_get_embeddings_nextn(ctx.ptr)
        if not ptr:
            s.broken = True
            return
        rows = np.ctypeslib.as_array(ptr, shape=(m, self.n_embd))
        # MTP rows at re-evaluated positions stay valid only where the token is unchanged.
        if s.mtp_n > start_pos and not self.mem_shared:
            lim = min(s.mtp_n, start_pos + m) - start_pos
            j = common_prefix(s.mtp_toks[start_pos:start_pos + lim], tokens)
            if j < lim:
                s.mtp_n = start_pos + j
                del s.mtp_toks[s.mtp_n:]
        # Target rows at >= start_pos were re-evaluated: replace them by this batch's.
        if s.h is None or start_pos < s.h_start:
            if s.h is not None and s.mtp_n - 1 < start_pos:
                s.broken = True  # would need target rows before start_pos that are gone
            s.h = rows.copy()
            s.h_start = start_pos
            s.h_toks = list(tokens)
        elif start_pos > s.h_end:
            s.broken = True      # positions the target evaluated without us seeing them
            s.h, s.h_start, s.h_toks = rows.copy(), start_pos, list(tokens)
        else:
            keep = start_pos - s.h_start
            s.h = np.concatenate((s.h[:keep], rows))
            del s.h_toks[keep:]
            s.h_toks.extend(tokens)
        # Bounded memory on long prompts: positions before start_pos are confirmed, add them now.
        if not s.broken and start_pos - s.mtp_n >= self.n_batch and not self.mem_shared:
            self._catch_up(seq_id, s, start_pos, None)
            self._trim(s)

    def _trim(self, s: _SeqState) -> None:
        """Forget target rows no longer needed (keep the one before the last MTP position, and one more
        so that a repeated propose can redo its drafting row)."""
        drop = s.mtp_n - 2 - s.h_start
        if drop > 0:
            s.h = s.h[drop:]
            s.h_start += drop
            del s.h_toks[:drop]

    # -- MTP decodes ----------------------------------------------------------------------------
    def _decode(self, n: int) -> None:
        self._batch.n_tokens = n
        t0 = time.perf_counter()
        rc = llama_cpp.llama_decode(self.ctx.ptr, self._batch)
        dt = time.perf_counter() - t0
        self.decode_seconds += dt
        self.decode_calls += 1
        self.decode_rows += n
        clock = getattr(runtime, "DecodeClock", None)
        if clock is not None:
            clock.seconds += dt
        if rc != 0:
            raise ModelLoadError(f"llama_decode of the MTP context failed with code {rc}",
                                 "the context may be full; raise --ctx-size")

    def _set_seq(self, n: int, seq_id: int) -> None:
        slots = self._batch_seq
        for j in range(n):
            if slots[j] != seq_id:
                self._batch.seq_id[j][0] = seq_id
                slots[j] = seq_id

    def _h_rows(self, s: _SeqState, p0: int, p1: int) -> np.ndarray:
        """Target h rows for positions p0-1 .. p1-2 (the h paired with positions p0 .. p1-1)."""
        if p0 == 0:
            return np.concatenate((self._zero_h[None, :], s.h[0:p1 - 1 - s.h_start]))
        return s.h[p0 - 1 - s.h_start:p1 - 1 - s.h_start]

    def _fill(self, seq_id: int, toks: Sequence[int], p0: int, h: np.ndarray, want_last: bool) -> int:
        n = len(toks)
        self._tok[:n] = toks
        self._pos[:n] = np.arange(p0, p0 + n, dtype=np.int32)
        self._embd[:n] = h
        self._out[:n] = 0
        if want_last:
            self._out[n - 1] = 1
        self._set_seq(n, seq_id)
        return n

    def _fill_one(self, seq_id: int, tok: int, pos: int, h: np.ndarray) -> None:
        """The batch = one row with an output (a draft step): no array building."""
        self._tok[0] = tok
        self._pos[0] = pos
        self._embd[0] = h
        self._out[0] = 1
        if self._batch_seq[0] != seq_id:
            self._batch.seq_id[0][0] = seq_id
            self._batch_seq[0] = seq_id

    def _catch_up(self, seq_id: int, s: _SeqState, upto: int, last_token: int | None) -> int:
        """Add MTP rows for positions mtp_n..upto-1 (tokens the target evaluated), plus, when
        last_token is given, the drafting row: last_token at `upto` with an output.
        Returns the batch index of that output row (-1 without one)."""
        p0 = s.mtp_n
        toks = s.h_toks[p0 - s.h_start:upto - s.h_start] if upto > p0 else []
        if last_token is not None:
            toks = toks + [last_token]
        end = p0 + len(toks)
        if not toks:
            return -1
        h = self._h_rows(s, p0, end)
        heads = range(self.n_heads) if self.chain_heads else (None,)
        out = -1
        try:
            for head in heads:
                if head is not None:
                    llama_ext.llama_set_nextn_layer_offset(self.ctx.ptr, head)
                self.ctx.seq_rm(seq_id, p0, -1)
                for i in range(0, len(toks), self.n_batch):
                    chunk = toks[i:i + self.n_batch]
                    last_chunk = i + len(chunk) == len(toks)
                    n = self._fill(seq_id, chunk, p0 + i, h[i:i + len(chunk)], last_chunk and last_token is not None)
                    self._decode(n)
                    if last_chunk and last_token is not None:
                        out = n - 1
        finally:
            if self.chain_heads:
                llama_ext.llama_set_nextn_layer_offset(self.ctx.ptr, 0)
        s.mtp_toks.extend(toks)
        s.mtp_n = end
        return out

    def _pick(self, out: int) -> int | None:
        """Top-1 of output row `out`, or None when its top-10 probability is below p_min."""
        ptr = llama_cpp.llama_get_logits_ith(self.ctx.ptr, out)
        row = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
        tok = int(row.argmax())
        if self.p_min > 0.0:
            k = min(TOP_K, self.n_vocab)
            top = np.partition(row, self.n_vocab - k)[self.n_vocab - k:].astype(np.float64)
            if 1.0 / float(np.exp(top - row[tok]).sum()) < self.p_min:
                return None
        return tok

    def _own_h(self, out: int) -> np.ndarray:
        ptr = llama_ext.llama_get_embeddings_nextn_ith(self.ctx.ptr, out)
        if not ptr:
            raise ModelLoadError("the MTP context returned no NextN embedding", "report this as a bug")
        return np.ctypeslib.as_array(ptr, shape=(self.n_embd,))

    # -- Drafter interface ----------------------------------------------------------------------
    def reuse_prefix(self, seq_id: int, prompt_tokens: Sequence[int], keep: int) -> int:
        # A new prompt (end() keeps a sequence's state for this): MTP rows stay valid where the
        # tokens up to theirs match (row p: token p, the target's h at p-1); the target evaluates
        # again from the h the next row needs, and its rows refill the buffer from there.
        s = self._seqs.setdefault(seq_id, _SeqState())
        s.h, s.h_start, s.h_toks, s.broken = None, 0, [], False
        if self.mem_shared:  # nothing of ours in the memory: only the last prompt position's h is read
            return keep
        q = common_prefix(s.mtp_toks, prompt_tokens, limit=s.mtp_n)
        self.ctx.seq_rm(seq_id, q, -1)
        s.mtp_n = q
        del s.mtp_toks[q:]
        return min(keep, max(q - 1, 0))

    def begin(self, seq_id: int, prompt_tokens: Sequence[int],
              rng: np.random.Generator | None = None) -> None:
        # The decode listener has already seen the prompt (the engine evaluates it before begin),
        # and every prompt position is confirmed: add them to the MTP KV now (prompt time, not the
        # first draft step's).
        s = self._seqs.get(seq_id)
        if s is None or s.broken:
            return
        n = len(prompt_tokens)
        if s.h_end != n or s.h_toks != list(prompt_tokens[s.h_start:]):
            s.broken = True
            return
        if not self.mem_shared and s.mtp_n < n and s.h_start <= max(s.mtp_n - 1, 0):
            self._catch_up(seq_id, s, n, None)
            self._trim(s)

    def propose(self, seq_id: int, history: Sequence[int], n_max: int) -> Draft:
        s = self._seqs.get(seq_id)
        if n_max <= 0 or not history or s is None or s.broken or s.h is None:
            return Draft([])
        n = len(history) - 1                      # position of the last token (not in the target KV)
        n_max = min(n_max, self.ctx.n_ctx - n - 1)
        if self.chain_heads:
            n_max = min(n_max, self.n_heads)
        if n_max <= 0:
            return Draft([])
        if s.mtp_n > n:                           # proposing again for the same history
            s.mtp_n = n
            del s.mtp_toks[n:]
        # The target must have evaluated positions lo-1 .. n-1 with the tokens of `history`
        # (lo: the first position the MTP context still needs; with shared memory only n).
        lo = n if self.mem_shared else s.mtp_n
        first = max(lo - 1, 0)
        if s.h_start > first or s.h_end < n:
            return Draft([])
        if s.h_toks[first - s.h_start:n - s.h_start] != list(history[first:n]):
            s.broken = True
            return Draft([])
        if self.mem_shared:
            tokens = self._draft_shared(seq_id, s, history[n], n, n_max)
        elif self.chain_heads:
            tokens = self._draft_chain(seq_id, s, history[n], n, n_max)
        else:
            tokens = self._draft_single(seq_id, s, history[n], n, n_max)
        self._trim(s)
        return Draft(tokens, None, self.name) if tokens else Draft([])

    def _draft_single(self, seq_id: int, s: _SeqState, last: int, n: int, n_max: int) -> list[int]:
        out = self._catch_up(seq_id, s, n, last)  # confirmed positions + the drafting row, one batch
        tokens: list[int] = []
        try:
            while True:
                tok = self._pick(out)
                if tok is None:
                    break
                tokens.append(tok)
                if len(tokens) >= n_max:
                    break
                self._fill_one(seq_id, tok, n + len(tokens), self._own_h(out))
                self._decode(1)
                out = 0
        finally:
            if len(tokens) > 1:  # chain rows were computed from the MTP's own h: not the sequence's
                self.ctx.seq_rm(seq_id, n + 1, -1)
        return tokens

    def _draft_chain(self, seq_id: int, s: _SeqState, last: int, n: int, n_max: int) -> list[int]:
        self._catch_up(seq_id, s, n, None)
        chain_toks = [last]
        chain_h = [self._h_rows(s, n, n + 1)[0].copy()]
        tokens: list[int] = []
        try:
            for head in range(n_max):
                llama_ext.llama_set_nextn_layer_offset(self.ctx.ptr, head)
                self.ctx.seq_rm(seq_id, n, -1)
                k = self._fill(seq_id, chain_toks, n, np.asarray(chain_h), True)
                self._decode(k)
                tok = self._pick(k - 1)
                if tok is None:
                    break
                tokens.append(tok)
                if len(tokens) >= n_max:
                    break
                chain_toks.append(tok)
                chain_h.append(self._own_h(k - 1).copy())
        finally:
            llama_ext.llama_set_nextn_layer_offset(self.ctx.ptr, 0)
            self.ctx.seq_rm(seq_id, n, -1)
        return tokens

    def _draft_shared(self, seq_id: int, s: _SeqState, last: int, n: int, n_max: int) -> list[int]:
        # Memory shared with the target: no catch-up; every step at the last token's position.
        tokens: list[int] = []
        self._fill(seq_id, (last,), n, self._h_rows(s, n, n + 1), True)
        self._decode(1)
        while True:
            tok = self._pick(0)
            if tok is None:
                break
            tokens.append(tok)
            if len(tokens) >= n_max:
                break
            self._fill_one(seq_id, tok, n, self._own_h(0))
            self._decode(1)
        s.mtp_n = n  # only for trimming the target rows: nothing was added to the (shared) memory
        return tokens

    def close(self) -> None:
        if self.tctx is not None:
            self.tctx.remove_decode_listener(self._on_target_decode)
            if self.tctx.ptr:
                llama_ext.llama_set_embeddings_nextn(self.tctx.ptr, False, False)
            self.tctx = None
        if getattr(self, "_batch", None) is not None:
            self._batch.token = ctypes.POINTER(llama_cpp.llama_token)()
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        self.ctx.close()
        self._seqs.clear()
