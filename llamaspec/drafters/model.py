"""`draft`: a separate, smaller GGUF with the target's vocabulary, in a context of its own.

The draft context's KV cache is kept in step with the sequence incrementally: each `propose`
removes the draft tokens the target rejected, evaluates only the tokens the draft has not seen
(usually the accepted ones plus the target's bonus token, in one batch), then drafts greedily (or
by sampling at T > 0, recording the distribution for rejection sampling) one token per decode,
stopping early when its confidence falls below p_min (llama.cpp's --spec-draft-p-min).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from llamaspec.drafters.base import Draft, Drafter
from llamaspec.runtime import Context


def _softmax_max(row: np.ndarray) -> tuple[int, float]:
    """Greedy token of a logits row and its probability."""
    tok = int(row.argmax())
    m = row[tok]
    p = 1.0 / float(np.exp(row - m).sum())
    return tok, p


class ModelDrafter(Drafter):
    name = "draft"

    def __init__(self, ctx: Context, *, p_min: float = 0.0,
                 distribution: Callable[[np.ndarray, Sequence[int]], np.ndarray] | None = None,
                 rng: np.random.Generator | None = None):
        """ctx: the draft model's context. distribution: None for greedy drafting; else maps a
        logits row and recent tokens to the probabilities to sample from (the target's sampling
        chain), so drafts come with the probabilities rejection sampling needs."""
        self.ctx = ctx
        self.p_min = p_min
        self.distribution = distribution
        self.rng = rng or np.random.default_rng(0)
        self._cached: dict[int, list[int]] = {}   # tokens in the draft KV cache, per sequence
        self._synced: dict[int, int] = {}         # history length known equal to _cached
        # Recurrent/hybrid draft models cannot drop a tail of their memory (seq_rm fails): keep
        # one checkpoint per sequence, (n tokens, state) taken when the draft memory held
        # exactly history[:n], and roll back to it instead.
        self._checkpoint: dict[int, tuple[int, bytes]] = {}

    def begin(self, seq_id: int, prompt_tokens: Sequence[int]) -> None:
        """Evaluate the prompt in the draft now: it is prompt processing, timed as such."""
        self.ctx.seq_rm(seq_id, 0, -1)
        self._cached[seq_id] = []
        self._synced[seq_id] = 0
        self._checkpoint.pop(seq_id, None)
        prompt = list(prompt_tokens)
        if len(prompt) > 1:
            self.ctx.decode(prompt[:-1], 0, seq_id, outputs=0)
            self._cached[seq_id] = prompt[:-1]
            self._synced[seq_id] = len(prompt) - 1

    def _sync(self, seq_id: int, history: Sequence[int]) -> int:
        """Bring the draft KV to history[:-1] and decode history[-1]; returns output rows (1)."""
        cached = self._cached.setdefault(seq_id, [])
        # History only grows at its end, so everything up to the last sync point still matches.
        p = min(self._synced.get(seq_id, 0), len(cached))
        limit = min(len(cached), len(history))
        while p < limit and cached[p] == history[p]:
            p += 1
        if p >= len(history):  # never re-use the last token's cached KV: we need its logits
            p = len(history) - 1
        if p < len(cached):
            if not self.ctx.seq_rm(seq_id, p, -1):
                p = self._roll_back(seq_id, p)
            del cached[p:]
        todo = list(history[p:])
        n_out = self.ctx.decode(todo, p, seq_id, outputs="last")
        cached.extend(todo)
        self._synced[seq_id] = len(history)
        return n_out

    def propose(self, seq_id: int, history: Sequence[int], n_max: int) -> Draft:
        if n_max <= 0 or not history:
            return Draft([])
        if len(history) + n_max > self.ctx.n_ctx:
            n_max = self.ctx.n_ctx - len(history)
            if n_max <= 0:
                return Draft([])
        self._sync(seq_id, history)
        cached = self._cached[seq_id]
        if self.ctx.model.needs_checkpoints:  # the memory holds exactly `history` now
            self._checkpoint[seq_id] = (len(cached), self.ctx.save_seq(seq_id))
        tokens: list[int] = []
        probs: list[np.ndarray] | None = [] if self.distribution is not None else None
        recent = list(history[-64:])
        while True:
            row = self.ctx.logits(1)[0]
            if self.distribution is None:
                if self.p_min > 0.0:
                    tok, p = _softmax_max(row)
                    if p < self.p_min:  # llama.cpp: only very confident drafts, the first included
                        break
                else:
                    tok = int(row.argmax())
            else:
                q = self.distribution(row, recent)
                tok = int(self.rng.choice(len(q), p=q))
                if q[tok] < self.p_min:
                    break
                probs.append(q.copy())
            tokens.append(tok)
            recent.append(tok)
            if len(tokens) >= n_max:
                break
            # Evaluate the token just drafted to draft the next one.
            self.ctx.decode([tok], len(cached), seq_id, outputs="last")
            cached.append(tok)
        return Draft(tokens, probs, self.name)

    def _roll_back(self, seq_id: int, p: int) -> int:
        """The memory cannot be cut at p (recurrent state): restore the latest checkpoint at or
        before p, else start the sequence over. Returns the new number of cached tokens."""
        ck = self._checkpoint.get(seq_id)
        if ck is not None and ck[0] <= p:
            self.ctx.load_seq(ck[1], seq_id)
            return ck[0]
        self.ctx.seq_rm(seq_id, 0, -1)  # removing a whole sequence always works
        return 0

    def end(self, seq_id: int) -> None:
        self.ctx.seq_rm(seq_id, 0, -1)
        self._cached.pop(seq_id, None)
        self._synced.pop(seq_id, None)
        self._checkpoint.pop(seq_id, None)

    def close(self) -> None:
        self.ctx.close()
