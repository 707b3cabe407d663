"""`draft-eagle3`: a one-layer EAGLE-3 draft GGUF that reads hidden states of the target.

EAGLE-3 (llama.cpp's `common_speculative_impl_draft_eagle3`, `src/models/eagle3.cpp`):

* The target context extracts the *inputs* of three of its layers (`eagle3.target_layers`,
  `llama_set_embeddings_layer_inp`) for every token it evaluates.
* The draft's encoder (`llama_process(ENCODE)`) fuses the three rows of a position P into one
  vector g(P) (`fc`), read back with `llama_get_embeddings_nextn`.
* The draft's decoder runs at position P on the pair (token at P+1, g(P)): it predicts the token
  at P+2 and outputs its own pre-norm state, which stands in for g at the next draft step.

Keeping the draft in step (one sequence at a time, like draft-mtp):

* `FeatureTap` copies the extracted rows after every target decode (prompt chunks, verify
  batches, checkpoint replays) into a per-sequence buffer; nothing is decoded there, because which
  verify rows are accepted is not known yet.
* `propose(history)` with n = len(history) - 1 (the last token, not yet in the target KV): the
  draft KV holds confirmed rows for positions < n_done. One encoder pass over the features of
  positions n_done .. n-1 and one decoder pass writing rows n_done .. n-1 (token P+1 = history,
  confirmed) give the first draft token from the last row (history[n], g(n-1)): llama.cpp's
  "deferred boundary" seed. Each further token costs one decoder row at the next position, fed
  with the previous row's pre-norm state. The chain rows are removed afterwards; rows < n stay.
* Rows whose token changed under them (a new prompt on the same sequence) are cut by comparing
  the tokens each row was built from with the history.

Drafting is greedy top-1 (llama.cpp: top-k 10, first candidate), stopping when its probability
among the top 10 is below p_min; draft tokens carry no distribution, so at T > 0 the engine
verifies by sample-and-match (lossless at any temperature).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

import llama_cpp

from llamaspec.errors import ModelLoadError, UsageError
from llamaspec.runtime import ext
from llamaspec.runtime.context import Context, ContextConfig
from llamaspec.runtime.llama import Model
from llamaspec.speculative.drafters.base import Draft, Drafter
from llamaspec.speculative.drafters.model import top_probability
from llamaspec.speculative.verify import fit_to_vocab
from llamaspec.speculative.prefix import common_prefix

#: the staging functions a draft that reads target layers needs (src/llama-ext.h)
NEEDS = ("llama_set_embeddings_layer_inp", "llama_get_embeddings_layer_inp", "llama_set_embeddings_nextn",
         "llama_get_embeddings_nextn", "llama_get_embeddings_nextn_ith", "llama_model_target_layer_ids",
         "llama_model_target_layer_ids_n", "llama_batch_ext_init", "llama_batch_ext_add_token",
         "llama_batch_ext_add_embd", "llama_batch_ext_set_embd_token", "llama_batch_ext_set_pos",
         "llama_process")


def check_runtime(spec_type: str, extra: Sequence[str] = ()) -> None:
    """UsageError naming the C functions this llama.cpp build lacks for `spec_type`."""
    gone = ext.missing(tuple(NEEDS) + tuple(extra))
    if gone:
        raise UsageError(f"--spec-type {spec_type} needs llama.cpp functions this build does not provide: "
                         f"{', '.join(gone)}", "install llama-cpp-python 0.3.36 or newer")


def check_single_sequence(spec_type: str, ctx: Context) -> None:
    if ctx.config.n_seq_max > 1:
        raise UsageError(f"--parallel with {spec_type} is not supported yet",
                         f"use --parallel 1 with --spec-type {spec_type}, or another spec type")


def check_layers(spec_type: str, draft: Model, target: Model, layer_ids: list[int]) -> int:
    """The target's layer count, after checking the draft's target layers exist in it."""
    n_layer = int(llama_cpp.llama_model_n_layer(target.ptr))
    bad = [i for i in layer_ids if not 0 <= i < n_layer]
    if not layer_ids or bad:
        raise UsageError(f"{draft.path.name} reads target layers {layer_ids}, but {target.path.name} has "
                         f"{n_layer} layers (llamaspec reads layer inputs 0..{n_layer - 1}; llama.cpp's "
                         "final-hidden-state variant is not wired)",
                         f"use the {spec_type} draft trained for this target")
    return n_layer


class _Feats:
    """A sequence's rows from position `start` on, with the tokens the target evaluated there.
    Stored in a buffer that grows by doubling and is trimmed by moving an offset: a row block is
    added after every target decode, and while drafting is paused nothing trims it, so copying the
    whole block each time (np.concatenate) cost O(n^2) over a long generation.

        >>> f = _Feats(5, np.zeros((2, 3), np.float32), [7, 8])
        >>> f.put(2, np.ones((1, 3), np.float32), [9]); f.end, f.rows[:, 0].tolist()
        (8, [0.0, 0.0, 1.0])
        >>> f.drop_front(1); f.cut(1); f.start, f.toks, f.rows.shape
        (6, [8], (1, 3))
    """

    def __init__(self, start: int, rows: np.ndarray, toks: list[int]):
        self.start, self.toks = start, list(toks)
        self._buf, self._off = rows, 0   # rows: a fresh array (the tap's copy), owned from here

    @property
    def end(self) -> int:
        return self.start + len(self.toks)

    @property
    def rows(self) -> np.ndarray:
        return self._buf[self._off:self._off + len(self.toks)]

    def put(self, keep: int, feat: np.ndarray, tokens: Sequence[int]) -> None:
        """Keep the first `keep` rows, then `feat` (rows of `tokens`)."""
        n = keep + len(feat)
        if self._off + n > len(self._buf):
            grown = np.empty((max(2 * n, 16), self._buf.shape[1]), dtype=self._buf.dtype)
            grown[:keep] = self._buf[self._off:self._off + keep]
            self._buf, self._off = grown, 0
        self._buf[self._off + keep:self._off + n] = feat
        del self.toks[keep:]
        self.toks.extend(tokens)

    def cut(self, n: int) -> None:
        del self.toks[n:]

    def drop_front(self, n: int) -> None:
        self._off += n
        self.start += n
        del self.toks[:n]


class FeatureTap:
    """Copies the target's extracted layer inputs after each of its decodes, per sequence (a
    `Context` decode listener: the rows are only readable until the next decode)."""

    def __init__(self, tctx: Context, layer_ids: list[int], n_embd: int):
        self.tctx, self.layer_ids, self.n_embd = tctx, list(layer_ids), n_embd
        self.seqs: dict[int, _Feats] = {}
        for lid in self.layer_ids:
            ext.set_embeddings_layer_inp(tctx.ptr, lid, True)
        tctx.add_decode_listener(self._on_decode)

    def _on_decode(self, ctx: Context, tokens: list[int], start_pos: int, seq_id: int) -> None:
        m = len(tokens)
        parts = []
        for lid in self.layer_ids:
            ptr = ext.get_embeddings_layer_inp(ctx.ptr, lid)
            if not ptr:
                self.seqs.pop(seq_id, None)
                return
            parts.append(ext.rows(ptr, m, self.n_embd))
        feat = np.concatenate(parts, axis=1)  # copies: llama.cpp reuses its buffer
        f = self.seqs.get(seq_id)
        if f is None or not f.start <= start_pos <= f.end:
            # a new prompt, or positions never seen: drafts need rows from here on
            self.seqs[seq_id] = _Feats(start_pos, feat, list(tokens))
            return
        f.put(start_pos - f.start, feat, tokens)  # rows at >= start_pos were re-evaluated: replace them

    def get(self, seq_id: int, p0: int, p1: int, history: Sequence[int]) -> np.ndarray | None:
        """Rows for positions p0..p1-1, if the target evaluated exactly history's tokens there."""
        f = self.seqs.get(seq_id)
        if f is None or p0 < f.start or p1 > f.end:
            return None
        if f.toks[p0 - f.start:p1 - f.start] != list(history[p0:p1]):
            return None
        return f.rows[p0 - f.start:p1 - f.start]

    def reuse(self, seq_id: int, prompt: Sequence[int], lo: int, hi: int) -> bool:
        """A new prompt whose positions from `hi` on the target evaluates again: keep the rows of
        positions lo..hi-1 if they were evaluated with `prompt`'s tokens (True), else forget the
        sequence's rows (False: the next decode starts them anew)."""
        f = self.seqs.get(seq_id)
        if f is not None and f.start <= lo and hi <= f.end and f.toks[lo - f.start:hi - f.start] == list(prompt[lo:hi]):
            f.cut(hi - f.start)
            return True
        self.seqs.pop(seq_id, None)
        return False

    def trim(self, seq_id: int, keep_from: int) -> None:
        """Forget rows before position keep_from (they are in the draft already)."""
        f = self.seqs.get(seq_id)
        drop = keep_from - f.start if f is not None else 0
        if drop > 0:
            f.drop_front(drop)

    def close(self) -> None:
        if self.tctx is not None:
            self.tctx.remove_decode_listener(self._on_decode)
            if self.tctx.ptr:
                for lid in self.layer_ids:
                    ext.set_embeddings_layer_inp(self.tctx.ptr, lid, False)
            self.tctx = None
        self.seqs.clear()


def pick(ctx_ptr, idx: int, n_vocab: int, p_min: float) -> int | None:
    """Greedy token of the draft's output row `idx` (a batch index), or None below p_min."""
    row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx_ptr, idx), shape=(n_vocab,))
    if row.shape[0] != n_vocab:
        row = fit_to_vocab(row, n_vocab, -np.inf)
    if p_min > 0.0:
        tok, p = top_probability(row)
        return tok if p >= p_min else None
    return int(row.argmax())


def draft_context(draft: Model, tctx: Context, n_threads: int | None) -> Context:
    """The draft's context: as long as the target's, linked to it (`ctx_other`) so a draft without
    token embeddings or head of its own uses the target's."""
    cfg = tctx.config
    return Context(draft, ContextConfig(n_ctx=tctx.n_ctx, n_batch=cfg.n_batch, n_threads=n_threads or cfg.n_threads,
                                        n_seq_max=1), ctx_other=tctx.ptr)


def process_or_raise(batch: ext.ExtBatch, what: str, encode: bool = False) -> None:
    rc = batch.process(encode)
    if rc != 0:
        raise ModelLoadError(f"llama_process of the {what} failed with code {rc}",
                             "the draft context may be full; raise --ctx-size")


@dataclass
class _Seq:
    n_done: int = 0                                      # draft KV rows 0..n_done-1 are confirmed
    toks: list[int] = field(default_factory=list)        # history[:n_done + 1]: what they were built from


class Eagle3Drafter(Drafter):
    name = "draft-eagle3"

    def __init__(self, target: Model, tctx: Context, draft: Model, *, p_min: float = 0.0,
                 n_threads: int | None = None, cost_hint: float = 0.0):
        check_runtime(self.name)
        check_single_sequence(self.name, tctx)
        self.layer_ids = ext.target_layer_ids(draft.ptr)
        if len(self.layer_ids) != 3:
            raise UsageError(f"{draft.path.name} is not an EAGLE-3 draft (it reads {len(self.layer_ids)} target "
                             "layers, EAGLE-3 reads 3)", "check the file, or use --spec-type draft-dflash")
        check_layers(self.name, draft, target, self.layer_ids)
        hidden = draft.meta("eagle3.target_hidden_size")
        if hidden is not None and int(hidden) != target.n_embd:
            raise UsageError(f"{draft.path.name} was trained for a target of width {hidden}; "
                             f"{target.path.name} has width {target.n_embd}",
                             "use the EAGLE-3 draft trained for this target")
        self.p_min, self.cost_hint = max(0.0, float(p_min)), cost_hint
        self.n_vocab = target.n_vocab
        self.ctx = draft_context(draft, tctx, n_threads)
        self.n_embd = int(llama_cpp.llama_model_n_embd(draft.ptr))
        self.n_ubatch = int(llama_cpp.llama_n_ubatch(self.ctx.ptr))
        ext.set_embeddings_nextn(self.ctx.ptr, True, True)  # g rows (encoder) and pre-norm states (decoder)
        self.batch = ext.ExtBatch(self.ctx.ptr)
        self.tap = FeatureTap(tctx, self.layer_ids, target.n_embd)
        self._seqs: dict[int, _Seq] = {}

    def _encode(self, feats: np.ndarray) -> np.ndarray:
        """g rows [k, n_embd] for feature rows [k, 3 * n_embd_target]."""
        out = np.empty((len(feats), self.n_embd), np.float32)
        for i in range(0, len(feats), self.n_ubatch):
            chunk = np.ascontiguousarray(feats[i:i + self.n_ubatch], dtype=np.float32)
            self.batch.clear()
            # The encoder is per token and ignores positions; llama.cpp gives placeholders after
            # the memory's last position, as here.
            pos = self.ctx.seq_pos_max(0) + 1
            for j in range(len(chunk)):
                self.batch.add_embd(0, chunk[j], pos + j, True)
            process_or_raise(self.batch, "EAGLE-3 encoder", encode=True)
            out[i:i + len(chunk)] = ext.rows(ext.get_embeddings_nextn(self.ctx.ptr), len(chunk), self.n_embd)
        return out

    def _valid_rows(self, seq_id: int, history: Sequence[int]) -> _Seq:
        """The sequence's state, its draft rows cut to those still valid for `history`."""
        s = self._seqs.setdefault(seq_id, _Seq())
        # Rows stay valid while the tokens they were built from still are: row P used tokens <= P+1.
        q = common_prefix(s.toks, history)
        s.n_done = max(0, min(s.n_done, q - 1))
        return s

    def reuse_prefix(self, seq_id: int, prompt_tokens: Sequence[int], keep: int) -> int:
        # The draft needs the target's features from its first invalid row on: those the tap still
        # holds for the prompt's tokens, or the target evaluates them again.
        s = self._valid_rows(seq_id, prompt_tokens)
        self.ctx.seq_rm(seq_id, s.n_done, -1)
        return keep if self.tap.reuse(seq_id, prompt_tokens, s.n_done, keep) else min(keep, s.n_done)

    def propose(self, seq_id: int, history: Sequence[int], n_max: int) -> Draft:
        n = len(history) - 1                   # position of the last token (not in the target KV)
        n_max = min(n_max, self.ctx.n_ctx_seq - n - 1)
        if n_max <= 0 or n < 1:
            return Draft([])
        s = self._valid_rows(seq_id, history)
        s.n_done = min(s.n_done, n - 1)  # the row at n-1 is redone for its output
        feats = self.tap.get(seq_id, s.n_done, n, history)
        if feats is None:
            return Draft([])
        g = self._encode(feats)
        self.ctx.seq_rm(seq_id, s.n_done, -1)
        tokens: list[int] = []
        try:
            for i in range(0, n - 1 - s.n_done, self.ctx.n_batch):  # catch-up rows, no outputs
                self.batch.clear()
                p0 = s.n_done + i
                for p in range(p0, min(p0 + self.ctx.n_batch, n - 1)):
                    self.batch.add_token(seq_id, history[p + 1], p, False, g[p - s.n_done])
                process_or_raise(self.batch, "EAGLE-3 decoder")
            # The seed row alone: the eagle3 graph computes logits for every row of a batch and
            # llama.cpp hands back the first ones, so a row read must be the only output.
            self.batch.clear()
            idx = self.batch.add_token(seq_id, history[n], n - 1, True, g[-1])
            process_or_raise(self.batch, "EAGLE-3 decoder")
            s.n_done, s.toks = n, list(history[:n + 1])
            while True:
                tok = pick(self.ctx.ptr, idx, self.n_vocab, self.p_min)
                if tok is None:
                    break
                tokens.append(tok)
                if len(tokens) >= n_max:
                    break
                prenorm = ext.rows(ext.get_embeddings_nextn_ith(self.ctx.ptr, idx), 1, self.n_embd)[0].copy()
                self.batch.clear()
                idx = self.batch.add_token(seq_id, tok, n - 1 + len(tokens), True, prenorm)
                process_or_raise(self.batch, "EAGLE-3 decoder")
        finally:
            self.ctx.seq_rm(seq_id, n, -1)  # chain rows were built from draft states, not the target's
            self.tap.trim(seq_id, s.n_done - 1)
        return Draft(tokens, None, self.name) if tokens else Draft([])

    def end(self, seq_id: int) -> None:
        # Draft rows and features are kept: the next prompt on this sequence may reuse the
        # target's cached prefix, and then their rows are still right (checked by token).
        pass

    def close(self) -> None:
        self.tap.close()
        self.batch.close()
        self.ctx.close()
        self._seqs.clear()
