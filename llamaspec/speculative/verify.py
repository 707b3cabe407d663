"""Acceptance rules of a verify step, as pure functions on numpy arrays.

A verify step evaluates the target on [last token] + draft (k tokens) and reads k + 1 rows of
logits: row i is the target's prediction after the last token and the first i draft tokens.
Each rule returns (n_accepted, next_token): the first n_accepted draft tokens are kept, then
next_token (the target's own token: a correction at the first rejection, or the bonus token when
the whole draft was accepted) is appended. So every step yields n_accepted + 1 tokens.

- `verify_greedy`: accept while the draft token is the target's argmax (temperature 0).
- `verify_sample_and_match`: llama-server's rule (common_sampler_sample_and_accept_n): sample
  the target at each position with its full sampler chain, accept while the sample equals the
  draft token. Every emitted token is a genuine sample of the target: lossless at any temperature.
- `verify_rejection`: speculative sampling (Leviathan et al. / Chen et al., llama.cpp's
  `llama-speculative` example): accept x with probability min(1, p(x)/q(x)), else sample the
  residual normalize(max(0, p - q)). Lossless too, and accepts more when q is a real distribution.

The target's distribution is the one llama.cpp samples from: `target_distribution` applies
llama.cpp's default sampler chain (common_params_sampling.samplers) with the stages that are on by
default: penalties -> top-k -> top-p -> min-p -> temperature -> dist. (DRY, top-n-sigma,
typical-p and XTC sit in between in that chain but are disabled by default and not supported here.)

End-of-generation tokens: pass `eog` (a set of ids). As in llama.cpp, an accepted draft token
that is an EOG ends the step: it is returned as next_token (n_accepted counts the tokens before it).
"""

from __future__ import annotations

import math
from typing import Callable, Collection, Sequence

import numpy as np

from llamaspec.speculative.sampling_params import SamplingParams

__all__ = [
    "SamplingParams",
    "target_candidates",
    "target_distribution",
    "sample_token",
    "step_sampler",
    "verify_greedy",
    "verify_sample_and_match",
    "verify_rejection",
    "rejection_step",
    "fit_to_vocab",
    "sample_dense",
]


def _apply_penalties(logits: np.ndarray, params: SamplingParams,
                     recent_tokens: Sequence[int]) -> np.ndarray:
    n = params.repeat_last_n
    recent = recent_tokens if n < 0 else recent_tokens[-n:] if n > 0 else ()
    if len(recent) == 0:
        return logits
    ids, counts = np.unique(np.asarray(recent, dtype=np.int64), return_counts=True)
    out = logits.copy()
    vals = out[ids]
    rp = np.float32(params.repeat_penalty)
    vals = np.where(vals <= 0, vals * rp, vals / rp)
    vals = vals - (counts.astype(np.float32) * np.float32(params.frequency_penalty)
                   + np.float32(params.presence_penalty))
    out[ids] = vals
    return out


def top_k_sorted(logits: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest logits, largest first (exact; prefilters by a threshold for speed)."""
    v = logits.shape[0]
    if k <= 0 or k >= v:
        return np.argsort(-logits, kind="stable")
    # An exact, cheap superset of the top k: split the row into c >= k chunks; the k-th largest
    # chunk maximum t has at least k logits >= t (the k maxima), so the top k are all >= t.
    c = 4 * k
    pool = None
    if v >= 8 * c:
        size = v // c
        maxima = logits[:size * c].reshape(c, size).max(axis=1)
        t = np.partition(maxima, c - k)[c - k]
        pool = np.flatnonzero(logits >= t)
    if pool is None or pool.shape[0] < k:
        pool = np.arange(v)
    if pool.shape[0] > k:
        part = np.argpartition(-logits[pool], k - 1)[:k]
        pool = pool[part]
    return pool[np.argsort(-logits[pool], kind="stable")]


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def target_candidates(logits_row: np.ndarray, params: SamplingParams,
                      recent_tokens: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
    """The tokens the target may sample and their probabilities, by llama.cpp's chain.

    Returns (ids, probs): int64 ids and float64 probs summing to 1; the ids are in decreasing
    probability order when a truncation stage (top-k, top-p) is on, else in id order.
    Matches llama.cpp up to float rounding (llama.cpp sums probabilities in float32).
    Stages, in llama.cpp's order and with its rules:
      penalties:   logit <= 0 -> logit * repeat_penalty, else logit / repeat_penalty; minus
                   count * frequency_penalty + presence_penalty, for ids in the recent tokens;
      top-k:       keep the k largest logits;
      top-p:       softmax of what is left, keep the shortest prefix whose mass >= top_p;
      min-p:       keep logits >= max logit + log(min_p);
      temperature: greedy keeps only the largest logit; else logits / temperature;
      dist:        softmax.
    recent_tokens: the sequence so far (prompt + generated: llama-server feeds the prompt to the
    sampler too); only the last repeat_last_n matter.

    Worked example (logits [2, 1, 0, -1], top_k=3, top_p=0.8, min_p=0, T=1): top-k drops id 3;
    softmax over [2, 1, 0] = [.665, .245, .090]; .665 < .8 <= .665 + .245, so top-p keeps ids
    0 and 1; renormalized at T=1: [e^2, e^1] / (e^2 + e^1) = [.731, .269]::

        >>> p = SamplingParams(temperature=1.0, top_k=3, top_p=0.8, min_p=0.0)
        >>> ids, probs = target_candidates(np.array([2., 1., 0., -1.]), p)
        >>> ids.tolist(), np.round(probs, 3).tolist()
        ([0, 1], [0.731, 0.269])
        >>> ids, probs = target_candidates(np.array([2., 1., 0., -1.]), SamplingParams(temperature=0))
        >>> ids.tolist(), probs.tolist()
        ([0], [1.0])
    """
    logits = np.asarray(logits_row, dtype=np.float32)
    if params.penalties_on and len(recent_tokens):
        logits = _apply_penalties(logits, params, recent_tokens)
    v = logits.shape[0]
    if params.temperature <= 0.0:
        # greedy: top-k / top-p / min-p all keep the largest logit, temperature keeps only it
        return np.array([int(np.argmax(logits))], dtype=np.int64), np.ones(1)
    ids = None  # None: every id, in id order; else ids sorted by decreasing logit
    if 0 < params.top_k < v:
        ids = top_k_sorted(logits, params.top_k)
    if params.top_p < 1.0:
        if ids is None:
            # llama.cpp's adaptive sort: try the 256 best first, sort everything only if needed
            p_all = _softmax(logits.astype(np.float64))
            ids = top_k_sorted(logits, min(256, v))
            cum = np.cumsum(p_all[ids])
            if cum[-1] < params.top_p or ids.shape[0] < params.min_keep:
                ids = top_k_sorted(logits, 0)
                cum = np.cumsum(p_all[ids])
        else:
            cum = np.cumsum(_softmax(logits[ids].astype(np.float64)))
        ok = np.flatnonzero((cum >= params.top_p) & (np.arange(1, cum.shape[0] + 1) >= params.min_keep))
        if ok.shape[0]:
            ids = ids[:ok[0] + 1]
    if ids is None:
        ids = np.arange(v, dtype=np.int64)
    cand = logits[ids]
    if params.min_p > 0.0 and ids.shape[0]:
        min_logit = cand.max() + np.float32(math.log(params.min_p))
        keep = cand >= min_logit
        if int(keep.sum()) >= max(1, params.min_keep):
            ids, cand = ids[keep], cand[keep]
        else:  # llama.cpp's sorted fallback: keep at least min_keep
            order = np.argsort(-cand, kind="stable")[:max(1, params.min_keep)]
            ids, cand = ids[order], cand[order]
    probs = _softmax(cand.astype(np.float64) / params.temperature)
    return ids.astype(np.int64), probs


def target_distribution(logits_row: np.ndarray, params: SamplingParams,
                        recent_tokens: Sequence[int] = ()) -> np.ndarray:
    """Dense version of `target_candidates`: a float64 vector over the vocabulary summing to 1.

        >>> target_distribution(np.array([0., 0., 5.]), SamplingParams(temperature=0)).tolist()
        [0.0, 0.0, 1.0]
    """
    ids, probs = target_candidates(logits_row, params, recent_tokens)
    out = np.zeros(np.asarray(logits_row).shape[0], dtype=np.float64)
    out[ids] = probs
    return out


def fit_to_vocab(row: np.ndarray, n_vocab: int, fill: float) -> np.ndarray:
    """`row` cut or padded (with `fill`) to `n_vocab` entries.

    llama.cpp lets a draft's vocabulary differ from the target's by up to 128 tokens; ids past the
    shorter one exist in one model only. Cutting a draft distribution to the target's vocabulary
    loses only mass on tokens the target can never emit (its p is 0 there), so the residual
    max(p - q, 0) is unchanged; padding adds ids the draft never proposes (q = 0)::

        >>> fit_to_vocab(np.array([.5, .3, .2]), 2, 0.0).tolist()
        [0.5, 0.3]
        >>> fit_to_vocab(np.array([1., 2.]), 4, -np.inf).tolist()
        [1.0, 2.0, -inf, -inf]
    """
    n = row.shape[0]
    if n == n_vocab:
        return row
    if n > n_vocab:
        return row[:n_vocab]
    out = np.full(n_vocab, fill, dtype=row.dtype)
    out[:n] = row
    return out


def _pick(ids: np.ndarray | None, probs: np.ndarray, u: float) -> int:
    """Inverse-CDF draw: the first index whose running mass exceeds u * total (zero-mass entries
    are never picked)."""
    cum = np.cumsum(probs)
    i = int(np.searchsorted(cum, u * cum[-1], side="right"))
    i = min(i, len(cum) - 1)
    return int(ids[i]) if ids is not None else i


def sample_dense(p: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from a dense distribution (zero-mass ids are never drawn)."""
    nz = np.flatnonzero(p > 0)
    if nz.shape[0] == 0:
        raise ValueError("cannot sample from an all-zero distribution")
    return _pick(nz, p[nz], rng.random())


def sample_token(logits_row: np.ndarray, params: SamplingParams, recent_tokens: Sequence[int],
                 rng: np.random.Generator) -> int:
    """One token from the target's distribution (greedy when temperature <= 0)."""
    ids, probs = target_candidates(logits_row, params, recent_tokens)
    if ids.shape[0] == 1:
        return int(ids[0])
    return _pick(ids, probs, rng.random())


def step_sampler(params: SamplingParams, history: Sequence[int], draft_tokens: Sequence[int],
                 rng: np.random.Generator) -> Callable[[int, np.ndarray], int]:
    """The `sampler_fn` for `verify_sample_and_match` in one verify step.

    Position i samples with recent tokens = history + draft_tokens[:i] (the draft tokens accepted
    so far, as llama.cpp's sampler has accepted them by then)."""
    if not params.penalties_on:
        return lambda i, row: sample_token(row, params, (), rng)
    n = params.repeat_last_n
    hist = list(history[-n:]) if n > 0 else list(history)

    def fn(i: int, row: np.ndarray) -> int:
        return sample_token(row, params, hist + list(draft_tokens[:i]), rng)

    return fn


def verify_greedy(draft_tokens: Sequence[int], target_logits_rows,
                  eog: Collection[int] = ()) -> tuple[int, int]:
    """Accept while each draft token is the target's argmax; then the argmax is the next token.

    target_logits_rows: k + 1 rows (array (k+1, n_vocab) or a sequence of rows); row i is the
    target's prediction after the first i draft tokens. Argmax ties go to the lowest id.
    (With repeat penalties at temperature 0 use `verify_sample_and_match` + `step_sampler`.)

    Worked example: the draft [5, 7, 9] against rows whose argmaxes are 5, 7, 2, 4: two tokens
    accepted, then the target's own 2::

        >>> rows = np.eye(10)[[5, 7, 2, 4]]
        >>> verify_greedy([5, 7, 9], rows)
        (2, 2)
        >>> verify_greedy([5, 7, 2], rows)   # all accepted: bonus token from the last row
        (3, 4)
        >>> verify_greedy([], rows[:1])      # no draft: a plain decode step
        (0, 5)
    """
    k = len(draft_tokens)
    for i in range(k):
        top = int(np.argmax(target_logits_rows[i]))
        if top != draft_tokens[i]:
            return i, top
        if top in eog:
            return i, top
    return k, int(np.argmax(target_logits_rows[k]))


def verify_sample_and_match(draft_tokens: Sequence[int], target_logits_rows,
                            sampler_fn: Callable[[int, np.ndarray], int],
                            eog: Collection[int] = ()) -> tuple[int, int]:
    """llama-server's rule: sample the target at each position, accept while it equals the draft.

    sampler_fn(i, row) draws the target's token at position i from logits row i with the full
    sampler chain (see `step_sampler`; it is called at most once per position, in order).
    Each emitted token is a sample of the target given the tokens before it, so the output has
    exactly the target's distribution; a draft token x at position i is accepted with
    probability p_i(x).

    Worked example with a sampler that returns the argmax (temperature 0)::

        >>> rows = np.eye(10)[[5, 7, 2, 4]]
        >>> argmax = lambda i, row: int(np.argmax(row))
        >>> verify_sample_and_match([5, 7, 9], rows, argmax)
        (2, 2)
        >>> verify_sample_and_match([5, 7, 2], rows, argmax, eog={7})   # 7 ends the step
        (1, 7)
    """
    k = len(draft_tokens)
    for i in range(k):
        tok = int(sampler_fn(i, target_logits_rows[i]))
        if tok != draft_tokens[i]:
            return i, tok
        if tok in eog:
            return i, tok
    return k, int(sampler_fn(k, target_logits_rows[k]))


def verify_rejection(draft_tokens: Sequence[int], draft_probs, target_probs_rows,
                     rng: np.random.Generator, eog: Collection[int] = ()) -> tuple[int, int]:
    """Speculative (rejection) sampling: exact target distribution, more accepted than matching.

    draft_probs: per draft position, the distribution q the draft token was drawn from (dense
    vector over the vocabulary), or None (for the whole draft or one position) for a
    deterministic proposal (one-hot q: n-gram drafts, a greedy draft model). A q whose length
    differs from p's (a draft vocabulary up to 128 tokens smaller or larger, as llama.cpp allows)
    is cut or zero-padded to p's length (`fit_to_vocab`).
    target_probs_rows: k + 1 dense target distributions p (see `target_distribution`).
    Position i, token x: accept with probability min(1, p(x) / q(x)) (u * q(x) < p(x), u ~ U[0,1)).
    On rejection the next token is drawn from normalize(max(0, p - q)); when all k are accepted
    the bonus token is drawn from the last row.

    Worked example: p = [.5, .5, 0], q = [0, 1, 0], draft token 1: accepted with probability
    p(1)/q(1) = .5; on rejection the residual max(0, p - q) = [.5, 0, 0] gives token 0; either way
    the emitted token is 0 or 1 with probability .5 each, as the target wants::

        >>> p = np.array([.5, .5, 0.]); q = np.array([0., 1., 0.])
        >>> rng = np.random.default_rng(1)
        >>> sorted({verify_rejection([1], [q], [p, p], rng)[0] for _ in range(50)})
        [0, 1]
        >>> verify_rejection([2], None, [p, p], rng)   # p(2) = 0: always rejected, residual = p
        (0, 0)
    """
    k = len(draft_tokens)
    for i in range(k):
        x = int(draft_tokens[i])
        fixed = rejection_step(x, draft_probs[i] if draft_probs is not None else None, target_probs_rows[i], rng)
        if fixed is not None:
            return i, fixed
        if x in eog:
            return i, x
    return k, sample_dense(np.asarray(target_probs_rows[k], dtype=np.float64), rng)


def rejection_step(x: int, q, p, rng: np.random.Generator) -> int | None:
    """One position of `verify_rejection`: None when draft token x (drawn from q; None: one-hot)
    is accepted against the target's p, else the token drawn from the residual max(0, p - q)."""
    p = np.asarray(p, dtype=np.float64)
    if q is not None:
        q = fit_to_vocab(np.asarray(q, dtype=np.float64), p.shape[0], 0.0)
    px = float(p[x]) if x < p.shape[0] else 0.0   # a token the target lacks has p = 0
    qx = float(q[x]) if q is not None and x < q.shape[0] else 1.0
    if rng.random() * qx < px:
        return None
    if q is None:
        residual = p.copy()
        if x < residual.shape[0]:
            residual[x] = 0.0
    else:
        residual = np.maximum(p - q, 0.0)
    if not residual.sum() > 0.0:
        residual = p
    return sample_dense(residual, rng)
