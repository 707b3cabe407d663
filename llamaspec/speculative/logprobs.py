"""Log-probabilities of emitted tokens, OpenAI's meaning: the log-softmax of the target's raw
logits (before logit_bias, a grammar or ignore_eos), the chosen token's and the top N of its row.

A speculative step reads them off its verify rows: row i holds the target's prediction for the
i-th emitted token of the step, as the plain step's one row would (up to llama.cpp's batch-shape
noise, ~0.08 in a logit on SmolLM2 F16)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["TokenLogprob", "token_logprobs"]


@dataclass(frozen=True)
class TokenLogprob:
    """One emitted token: its logprob and the `top` (id, logprob) pairs of its row, best first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprobs(rows: np.ndarray, tokens, n_top: int) -> list[TokenLogprob]:
    """One TokenLogprob per token: tokens[i] read from rows[i] (raw logits), with the n_top best.

        >>> rows = np.log(np.array([[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]]))
        >>> lp = token_logprobs(rows, [1, 2], 1)
        >>> [round(x.logprob, 4) for x in lp], [(t, round(v, 4)) for t, v in lp[1].top]
        ([-1.3863, -0.2231], [(2, -0.2231)])
    """
    out = []
    for row, tok in zip(rows, tokens):
        x = np.asarray(row, dtype=np.float64)
        m = x.max()
        lse = m + np.log(np.exp(x - m).sum())
        top: tuple[tuple[int, float], ...] = ()
        if n_top > 0:
            k = min(n_top, x.shape[0])
            ids = np.argpartition(-x, k - 1)[:k]
            ids = ids[np.lexsort((ids, -x[ids]))]   # best first, ties by lower id
            top = tuple((int(i), float(x[i] - lse)) for i in ids)
        out.append(TokenLogprob(int(tok), float(x[int(tok)] - lse), top))
    return out
