"""Sampling and verification under a grammar and a logit_bias, llama.cpp's way
(common/sampling.cpp), for one sequence.

Order on each row: the target's raw logits -> ignore_eos -> + logit_bias -> sampler chain ->
grammar. The grammar is asked about one token: take the argmax (or sample the chain) first and
keep it when the grammar allows it; only when it refuses, mask the whole row and take (sample)
again. Sampling y ~ p, keeping it when allowed, else y ~ chain(masked row), is the distribution
`constrained_distribution` writes out: p(y) on allowed tokens plus the refused mass spread by the
masked chain (p(y) / p(A) when the chain truncates nothing). Plain decoding and every
verification rule use this one rule per row, so speculation emits what plain decoding under the
same grammar would.

Verification walks the rows in order: at row i the sequence's live grammar state has accepted the
tokens emitted before it, and a draft token enters it only once confirmed, so the real state is
advanced directly (no clone) and a rejected token never enters it. Drafts are cut at the first
token the grammar refuses before they cost a verify row (`Constraints.cut_draft`); for a sampled
draft (rejection sampling) the cut token is kept and rejected at its row as the full rule would.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from llamaspec.errors import UsageError
from llamaspec.speculative.drafters.base import Draft
from llamaspec.speculative.logprobs import TokenLogprob, token_logprobs
from llamaspec.speculative.sampling_params import SamplingParams
from llamaspec.speculative.verify import top_k_sorted, rejection_step, sample_dense, sample_token, target_candidates

__all__ = ["Constraints", "pick", "masked_row", "constrained_distribution", "bias_vector"]


def _draw(row: np.ndarray, params: SamplingParams, recent: Sequence[int], rng: np.random.Generator) -> int:
    if params.greedy and not params.penalties_on:
        return int(row.argmax())
    return sample_token(row, params, recent, rng)


# How many of a row's best tokens to ask the grammar about before masking the whole vocabulary
# (llama.cpp's engine: one apply over 64 tokens ~0.1 ms, over 1024 ~1.4 ms, over SmolLM2's 49k
# 10-36 ms; llguidance's state answers from its whole mask when that is cheaper, ~25 us for a schema).
PROBES = (64, 1024)


def masked_row(row: np.ndarray, params: SamplingParams, grammar) -> np.ndarray:
    """`row` as the sampler chain sees it under the grammar (refused tokens at -inf).

    When the chain keeps at most k tokens (greedy: 1; top-k: k; no penalties to reorder them) and
    the k-th best allowed token among the row's best n ranks above the n-th logit, no token
    outside those n can be among the chain's candidates: they are set to -inf without asking the
    grammar, and the chain gives what it gives on the whole mask, for an apply over n tokens."""
    k = 1 if params.greedy else params.top_k
    if k > 0 and not params.penalties_on:
        for n in PROBES:
            if n >= row.shape[0] or k > n:
                break
            top = top_k_sorted(row, n)
            ok = np.asarray(grammar.allowed_ids(top), dtype=np.int64)   # in the order asked: best first
            if ok.shape[0] >= k and row[ok[k - 1]] > row[top[-1]]:
                out = np.full(row.shape[0], -np.inf, dtype=np.float32)
                out[ok] = row[ok]
                return out
    return grammar.mask(row)


def pick(row: np.ndarray, params: SamplingParams, recent: Sequence[int], rng: np.random.Generator,
         grammar, fallback: int) -> tuple[int, bool]:
    """(token, masked): the target's token from `row` under `grammar` (allows / mask), llama.cpp's
    rule: the chain's token if the grammar allows it, else the chain's token of the masked row.
    `fallback` (an end-of-generation id) when the grammar allows no token with a finite logit."""
    tok = _draw(row, params, recent, rng)
    if grammar.allows(tok):
        return tok, False
    masked = masked_row(row, params, grammar)
    if not masked.max() > -np.inf:
        return fallback, True
    return _draw(masked, params, recent, rng), True


def constrained_distribution(row: np.ndarray, params: SamplingParams, recent: Sequence[int],
                             grammar, fallback: int) -> tuple[np.ndarray, bool]:
    """(p, masked): the dense distribution `pick` draws from. The whole-row mask is applied only
    when the chain's candidates include a token the grammar refuses."""
    n = row.shape[0]
    ids, probs = target_candidates(row, params, recent)
    out = np.zeros(n, dtype=np.float64)
    ok = grammar.allowed_ids(ids)
    if len(ok) == ids.shape[0]:
        out[ids] = probs
        return out, False
    keep = np.isin(ids, np.asarray(ok, dtype=np.int64))
    masked = masked_row(row, params, grammar)
    if not masked.max() > -np.inf:
        out[fallback] = 1.0
        return out, True
    ids2, probs2 = target_candidates(masked, params, recent)
    out[ids[keep]] = probs[keep]
    out[ids2] += (1.0 - float(probs[keep].sum())) * probs2
    return out, True


def bias_vector(logit_bias, n_vocab: int) -> np.ndarray:
    """The logit_bias mapping (token id -> bias) as a dense float32 vector; UsageError naming
    logit_bias for an id outside the vocabulary or a bias that is not a number (-inf bans).

        >>> bias_vector({1: -100, 2: float("-inf")}, 4).tolist()
        [0.0, -100.0, -inf, 0.0]
    """
    out = np.zeros(n_vocab, dtype=np.float32)
    for tok, b in logit_bias.items():
        if isinstance(tok, bool) or not isinstance(tok, (int, np.integer)) or not 0 <= tok < n_vocab:
            raise UsageError(f"logit_bias: token id {tok!r} is not in the model's vocabulary (0..{n_vocab - 1})",
                             "give token ids of this model", field="logit_bias")
        if isinstance(b, bool) or not isinstance(b, (int, float)) or math.isnan(b) or b == math.inf:
            raise UsageError(f"logit_bias: the bias of token {tok} must be a number (-inf or -100 bans it), not {b!r}",
                             field="logit_bias")
        out[int(tok)] += b
    return out


class Constraints:
    """What one sequence's sampling obeys beyond the sampler chain (logit_bias, a grammar) and the
    logprobs it reports. Made only when the config asks for one of them: without, the engine's
    plain paths run untouched."""

    def __init__(self, target, config, stats):
        from llamaspec.runtime.grammar import GrammarState

        self.target, self.stats = target, stats
        self.bias = bias_vector(config.logit_bias, target.n_vocab) if config.logit_bias else None
        self.grammar = GrammarState(target, config.grammar) if config.grammar is not None else None
        self.n_logprobs = config.logprobs
        self.logprobs: list[TokenLogprob] | None = [] if config.logprobs is not None else None
        self.fallback = target.eos if target.eos >= 0 else next(
            t for t in range(target.n_vocab) if target.is_eog(t))
        self._cut: tuple[int, np.ndarray] | None = None   # a sampled draft's refused token and its q

    def rows(self, rows: np.ndarray) -> np.ndarray:
        return rows + self.bias if self.bias is not None else rows

    def first(self, engine, row: np.ndarray, history: Sequence[int], params: SamplingParams,
              rng: np.random.Generator) -> int:
        """The first token, sampled from the prompt's last row."""
        return self.verify(engine, [], Draft([]), row[None, :], history, params, rng)[1]

    def cut_draft(self, draft: Draft) -> Draft:
        """The draft up to the first token the grammar refuses (counted in stats.grammar_cut)."""
        self._cut = None
        if self.grammar is None or not draft:
            return draft
        n = self.grammar.valid_prefix(draft.tokens)   # (llguidance: without a clone)
        if n == len(draft):
            return draft
        self.stats.record_grammar_cut(draft.source, len(draft) - n)
        if draft.probs is not None:
            self._cut = (draft.tokens[n], draft.probs[n])
        return draft.truncated(n)

    def verify(self, engine, d: list[int], draft: Draft, rows: np.ndarray, history: Sequence[int],
               params: SamplingParams, rng: np.random.Generator) -> tuple[int, int]:
        """(n accepted, next token) of this step's rows; accepted draft tokens enter the grammar."""
        rows = self.rows(rows)
        if self.grammar is None:
            if not d:
                return 0, engine.sample_plain(rows[0], history, params, rng)
            return engine.verify(d, draft, rows, history, params, rng)
        eog, g, k = engine.eog, self.grammar, len(d)
        recent = list(history[-params.repeat_last_n:] if params.repeat_last_n > 0 else history) \
            if params.penalties_on else []
        sampled = not params.greedy and draft.probs is not None
        for i in range(k + 1):
            r = recent + d[:i] if recent else ()
            if sampled:   # rejection sampling against the constrained distribution of the row
                p, masked = constrained_distribution(rows[i], params, r, g, self.fallback)
                # the token cut at the last row (refused: p = 0 there) is rejected as in full
                x, q = (d[i], draft.probs[i]) if i < k else self._cut or (None, None)
                fixed = sample_dense(p, rng) if x is None else rejection_step(x, q, p, rng)
                tok, kept = (x, True) if fixed is None else (fixed, False)
            else:
                tok, masked = pick(rows[i], params, r, rng, g, self.fallback)
                kept = i < k and tok == d[i]
            self.stats.grammar_masks += masked
            if i == k or not kept or tok in eog:
                return i, tok
            g.accept(tok)
        raise AssertionError("unreachable")

    def emitted(self, raw_rows: np.ndarray, new: list[int], n_acc: int, n_out: int) -> None:
        """A step's tokens are out: the next token enters the grammar (the accepted draft tokens did
        in verify), and the n_out tokens emitted get their logprobs from the raw rows."""
        nxt = new[n_acc]
        if self.grammar is not None and not self.target.is_eog(nxt):
            self.grammar.accept(nxt)
        if self.logprobs is not None and n_out:
            self.logprobs.extend(token_logprobs(raw_rows[:n_out], new[:n_out], self.n_logprobs))

    def close(self) -> None:
        if self.grammar is not None:
            self.grammar.close()
