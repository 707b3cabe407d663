"""`draft-simple`: a separate, smaller GGUF with the target's vocabulary, in a context of its own.

The draft context's KV cache is kept in step with the sequence incrementally: each `propose`
removes the draft tokens the target rejected, evaluates only the tokens the draft has not seen
(usually the accepted ones plus the target's bonus token, in one batch; the prompt at the first
draft), then drafts one token per decode: greedily (temperature 0), or at T > 0 by sampling from
the target's sampling chain applied to the draft's logits, recording that distribution q for
rejection sampling.

Stopping early (llama.cpp's --spec-draft-p-min): the decision is taken from the distribution
before a token is drawn, never from the drawn token, so every kept draft token is distributed as
its q (deciding after the draw keeps likely tokens more often than q says, which biases the
output at T > 0). Greedy: stop when the top token's probability among the 10 best, renormalised,
is below p_min: llama.cpp's draft sampler is top-k 10 then softmax. T > 0: stop when the most
likely token of q is below p_min.

Vocabularies may differ by up to 128 tokens (llama.cpp's rule): each logits row is cut or padded to
the target's vocabulary first, so drafts only hold ids the target has and q has the target's length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from llamaspec.speculative.drafters.base import Draft, Drafter
from llamaspec.runtime.context import Context
from llamaspec.speculative.verify import fit_to_vocab, sample_dense
from llamaspec.speculative.prefix import common_prefix

#: llama.cpp's draft sampler keeps the 10 best candidates before its softmax (common/speculative.cpp)
P_MIN_TOP_K = 10
#: most tokens evaluated to bring the draft's KV up to date (see ModelDrafter._sync)
SYNC_WINDOW = 16
#: stands in `_cached` for the positions of a skipped stretch (never equal to a token id)
GAP = -1


def top_probability(row: np.ndarray, top_k: int = P_MIN_TOP_K) -> tuple[int, float]:
    """Greedy token of a logits row and its probability among the top_k best, renormalised
    (what llama.cpp compares with p_min).

        >>> tok, p = top_probability(np.array([0., 2., 1.] + [-50.] * 20))
        >>> tok, round(p, 3)    # e^2 / (e^0 + e^2 + e^1 + 7 e^-50)
        (1, 0.665)
    """
    tok = int(row.argmax())
    n = row.shape[0]
    top = row if n <= top_k else np.partition(row, n - top_k)[n - top_k:]
    return tok, 1.0 / float(np.exp(top.astype(np.float64) - float(row[tok])).sum())


@dataclass
class _Drafting:
    """One sequence's draft in the making."""
    seq_id: int
    n_max: int
    recent: list[int]
    rng: np.random.Generator
    probs: list[np.ndarray] | None
    tokens: list[int] = field(default_factory=list)


def _chunks(lengths: list[int], limit: int) -> list[tuple[int, int]]:
    """[lo, hi) runs of consecutive segments, each run at most `limit` tokens (a segment longer
    than that alone: Context.decode_many refuses it, which never happens with SYNC_WINDOW)."""
    runs, lo, total = [], 0, 0
    for i, n in enumerate(lengths):
        if total + n > limit and i > lo:
            runs.append((lo, i))
            lo, total = i, 0
        total += n
    if lo < len(lengths):
        runs.append((lo, len(lengths)))
    return runs


def roll_back(ctx: Context, seq_id: int, checkpoint: tuple[int, bytearray] | None, p: int) -> int:
    """A memory that cannot be cut at p (recurrent state): restore `checkpoint` (tokens, state) if
    it is at or before p, else start the sequence over. Returns the new number of cached tokens.
    ModelDrafter and TranslatedDrafter both roll back this way."""
    if checkpoint is not None and checkpoint[0] <= p:
        ctx.load_seq(checkpoint[1], seq_id)
        return checkpoint[0]
    ctx.seq_rm(seq_id, 0, -1)  # removing a whole sequence always works
    return 0


class ModelDrafter(Drafter):
    name = "draft-simple"
    #: tokens evaluated to draft again after a pause (`_catch_up`): the controller prices probes with them
    resume_tokens = SYNC_WINDOW

    def __init__(self, ctx: Context, *, p_min: float = 0.0,
                 distribution: Callable[[np.ndarray, Sequence[int]], np.ndarray] | None = None,
                 n_vocab: int | None = None, cost_hint: float = 0.0):
        """ctx: the draft model's context. distribution: None for greedy drafting; else maps a
        logits row and recent tokens to the probabilities to sample from (the target's sampling
        chain), so drafts come with the probabilities rejection sampling needs.
        n_vocab: the target's vocabulary size (default: the draft's own).
        cost_hint: a draft token's cost relative to a target step, from the file sizes."""
        self.ctx = ctx
        self.p_min = p_min
        self.distribution = distribution
        self.samples = distribution is not None
        self.cost_hint = cost_hint
        self.n_vocab = n_vocab if n_vocab is not None else ctx.model.n_vocab
        self._rng: dict[int, np.random.Generator] = {}  # per sequence, from begin()
        self._cached: dict[int, list[int]] = {}   # tokens in the draft KV cache, per sequence
        self._synced: dict[int, int] = {}         # history length known equal to _cached
        self._shift: dict[int, int] = {}          # tokens skipped by catch-up splices (_sync)
        self._prompt_end: dict[int, int] = {}     # history the first catch-up evaluates in full
        # Recurrent/hybrid draft models cannot drop a tail of their memory (seq_rm fails): keep
        # one checkpoint per sequence, (n tokens, state) taken when the draft memory held
        # exactly history[:n], and roll back to it instead.
        self._checkpoint: dict[int, tuple[int, bytearray]] = {}

    def begin(self, seq_id: int, prompt_tokens: Sequence[int],
              rng: np.random.Generator | None = None) -> None:
        """Start a sequence. Its prompt is evaluated in the draft at the first draft (`_catch_up`),
        not now: a draft the controller never asks for (one that cannot pay, paused from the
        start) then costs nothing, where evaluating the prompt here added it to every run's prompt
        time (the story with a same-size draft: 0.93x plain end to end, 0.97x generation only,
        docs/benchmarks.md). What the draft's KV still holds from the sequence's previous prompt (`end`
        keeps it) is reused up to the first token that differs: a chat's next turn, a request
        that comes back to its server slot, evaluate only their new tokens, as the target does."""
        self._rng[seq_id] = rng if rng is not None else np.random.default_rng()
        self._checkpoint.pop(seq_id, None)
        prompt = list(prompt_tokens)
        keep = common_prefix(self._cached.get(seq_id, []), prompt, limit=max(0, len(prompt) - 1))
        if not (keep and self.ctx.seq_rm(seq_id, keep, -1)):
            keep = 0   # nothing shared, or a memory that cannot be cut: start over
            self.ctx.seq_rm(seq_id, 0, -1)
        self._cached[seq_id] = prompt[:keep]
        self._synced[seq_id] = keep
        self._shift[seq_id] = 0
        self._prompt_end[seq_id] = len(prompt)

    def prefill(self, seq_id: int, history: Sequence[int]) -> None:
        """What the next draft's catch-up (`_catch_up`) would evaluate, now, but for the last token,
        which that draft decodes for its logits (lazy.py: in the worker thread, beside the target's
        steps)."""
        if len(history) < 2 or self.ctx.model.needs_checkpoints:   # (checkpoints are taken at a sync)
            return
        todo, pos = self._catch_up(seq_id, history)
        if len(todo) > 1:
            self.ctx.decode(todo[:-1], pos, seq_id, outputs=0)
        self._cached[seq_id].pop()
        self._synced[seq_id] = len(history) - 1

    def time_token(self) -> float | None:
        """Seconds of one draft decode (the fastest of 2) on the draft's empty memory; None once it
        holds a sequence (timing would clear it)."""
        if any(self._cached.values()):
            return None
        return self.ctx.time_one_token(max(0, self.ctx.model.bos), reps=2)

    def _sync(self, seq_id: int, history: Sequence[int]) -> int:
        """Bring the draft KV to history[:-1] and decode history[-1]; returns output rows (1)."""
        todo, pos = self._catch_up(seq_id, history)
        return self.ctx.decode(todo, pos, seq_id, outputs="last")

    def _catch_up(self, seq_id: int, history: Sequence[int]) -> tuple[list[int], int]:
        """What `_sync` decodes, (tokens, start position), with the draft's records updated as if
        it were decoded (the caller decodes it next, alone or with other sequences')."""
        cached = self._cached.setdefault(seq_id, [])
        # History only grows at its end, so everything up to the last sync point still matches.
        p = common_prefix(cached, history, start=self._synced.get(seq_id, 0))
        if p >= len(history):  # never re-use the last token's cached KV: we need its logits
            p = len(history) - 1
        shift = self._shift.get(seq_id, 0)   # history index - KV position, past the last splice
        if p < len(cached):
            if not self.ctx.seq_rm(seq_id, p - shift, -1):
                p = self._roll_back(seq_id, p)
            del cached[p:]
        # evaluated in full: the prompt, at the first draft after begin (history[-1] aside: it is
        # decoded last, for its logits)
        keep = min(len(history) - 1, max(p, self._prompt_end.pop(seq_id, 0)))
        skip = len(history) - keep - SYNC_WINDOW
        if skip > 0 and not self.ctx.model.needs_checkpoints:
            # Back from a long pause: catching up on every token would cost a batch as long as
            # the pause (on a CPU, roughly one step per 4 tokens), more than the drafts it buys.
            # Only the prompt (at the first draft) and the last SYNC_WINDOW tokens are evaluated,
            # spliced right after what the draft's KV holds (llama.cpp wants consecutive
            # positions): the draft sees the prompt and the recent text. Drafts are only
            # proposals, so the output is unchanged.
            todo = list(history[p:keep]) + list(history[keep + skip:])
            cached.extend(history[p:keep])
            cached.extend([GAP] * skip)
            cached.extend(history[keep + skip:])
            self._shift[seq_id] = shift + skip
        else:
            todo = list(history[p:])
            cached.extend(todo)
        self._synced[seq_id] = len(history)
        return todo, p - shift

    def _room(self, history: Sequence[int], n_max: int) -> int:
        if n_max <= 0 or not history:
            return 0
        return min(n_max, self.ctx.n_ctx_seq - len(history))

    def _start(self, seq_id: int, history: Sequence[int], n_max: int) -> "_Drafting":
        rng = self._rng.get(seq_id) or self._rng.setdefault(seq_id, np.random.default_rng())
        return _Drafting(seq_id, n_max, list(history[-64:]), rng, [] if self.distribution is not None else None)

    def _next(self, row: np.ndarray, st: "_Drafting") -> bool:
        """Draft one token of `st` from its logits row; True when it wants another."""
        if row.shape[0] != self.n_vocab:
            row = fit_to_vocab(row, self.n_vocab, -np.inf)
        if self.distribution is None:
            if self.p_min > 0.0:
                tok, p = top_probability(row)
                if p < self.p_min:  # llama.cpp: only very confident drafts, the first included
                    return False
            else:
                tok = int(row.argmax())
        else:
            q = self.distribution(row, st.recent)
            if self.p_min > 0.0 and float(q.max()) < self.p_min:  # decided before drawing
                return False
            tok = sample_dense(q, st.rng)
            st.probs.append(q)
        st.tokens.append(tok)
        st.recent.append(tok)
        return len(st.tokens) < st.n_max

    def _extend(self, st: "_Drafting") -> tuple[list[int], int, int]:
        """The segment that evaluates the token just drafted, to draft the next one."""
        cached = self._cached[st.seq_id]
        seg = ([st.tokens[-1]], len(cached) - self._shift.get(st.seq_id, 0), st.seq_id)
        cached.append(st.tokens[-1])
        return seg

    def propose(self, seq_id: int, history: Sequence[int], n_max: int) -> Draft:
        n_max = self._room(history, n_max)
        if n_max <= 0:
            return Draft([])
        self._sync(seq_id, history)
        if self.ctx.model.needs_checkpoints:  # the memory holds exactly `history` now
            self._checkpoint[seq_id] = (len(self._cached[seq_id]), self.ctx.save_seq(seq_id))
        st = self._start(seq_id, history, n_max)
        while self._next(self.ctx.logits(1)[0], st):
            toks, pos, _ = self._extend(st)
            self.ctx.decode(toks, pos, seq_id, outputs="last")
        return Draft(st.tokens, st.probs, self.name)

    def propose_many(self, requests: Sequence[tuple[int, Sequence[int], int]]) -> list[Draft]:
        """`propose` for several sequences, (seq_id, history, n_max) each: each draft position of
        all of them in one decode (one sequence at a time, 4 sequences drafting 4 tokens cost 20
        draft decodes; together, 5). Each sequence's draft is the one `propose` would make, up to
        the rounding of a batched decode."""
        if self.ctx.model.needs_checkpoints:  # checkpoints are taken between a sync and a draft
            return [self.propose(*r) for r in requests]
        out = [Draft([])] * len(requests)
        live: list[tuple[int, _Drafting]] = []
        segments = []
        for i, (seq_id, history, n_max) in enumerate(requests):
            n_max = self._room(history, n_max)
            if n_max > 0:
                toks, pos = self._catch_up(seq_id, history)
                if len(toks) > SYNC_WINDOW:  # a prompt, at the first draft: evaluated alone,
                    head = len(toks) - 1     # only its last token shares the batch
                    self.ctx.decode(toks[:head], pos, seq_id, outputs=0)
                    toks, pos = toks[head:], pos + head
                segments.append((toks, pos, seq_id))
                live.append((i, self._start(seq_id, history, n_max)))
        while live:
            going = []
            for lo, hi in _chunks([len(t) for t, _, _ in segments], self.ctx.n_batch):
                self.ctx.decode_many(segments[lo:hi], outputs="last")
                rows = self.ctx.logits(hi - lo)
                going += [(i, st) for r, (i, st) in enumerate(live[lo:hi]) if self._next(rows[r], st)]
            for i, st in live:
                out[i] = Draft(st.tokens, st.probs, self.name)
            live = going
            segments = [self._extend(st) for _, st in live]
        return out

    def _roll_back(self, seq_id: int, p: int) -> int:
        return roll_back(self.ctx, seq_id, self._checkpoint.get(seq_id), p)

    def end(self, seq_id: int) -> None:
        """The sequence is over: its KV stays for the next prompt's prefix (`begin`), cut to what
        it really holds. A record ahead of the KV (a decode cut short by Ctrl-C) is trimmed to the
        memory's last position; a spliced record (positions shifted) or a recurrent memory is
        not worth keeping: dropped."""
        cached = self._cached.get(seq_id)
        if cached and not self._shift.get(seq_id) and not self.ctx.model.needs_checkpoints:
            n = min(len(cached), self.ctx.seq_pos_max(seq_id) + 1)
            del cached[n:]
            self.ctx.seq_rm(seq_id, n, -1)
        else:
            self.ctx.seq_rm(seq_id, 0, -1)
            self._cached.pop(seq_id, None)
        self._rng.pop(seq_id, None)
        self._synced.pop(seq_id, None)
        self._shift.pop(seq_id, None)
        self._prompt_end.pop(seq_id, None)
        self._checkpoint.pop(seq_id, None)

    def close(self) -> None:
        self.ctx.close()

