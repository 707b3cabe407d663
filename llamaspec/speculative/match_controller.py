"""Draft length for copying drafters, from how long the copy has agreed with the text
(Draft.match: prompt-lookup, suffix).

A copied draft is right as long as the text keeps following its source. How likely it is to
follow for one more token depends above all on how long it already has: after a 2-token match
the source is often the wrong place (on the bundled code rewrite with SmolLM2 about half of the
next tokens follow it), after 3-5 tokens mostly the right one, and a copy that has run for 16+
tokens breaks only where the answer departs from its source (a renamed identifier: 1 token in
30-40). So the statistics kept here are continuation probabilities per agreement length g:
p(g) = P(the text's next token follows the source | it has followed it for the last g tokens).
A draft of k tokens after a match of m has positions at agreement m, m+1, ..., m+k-1, so

    E(k) = 1 + sum_{j=1..k} prod_{i=1..j} p(m + i - 1)      (expected tokens, the target's own included)

and the draft length is the k maximising E(k) / C(k), C(k) = t(k+1)/t(1) + d*k the step's cost in
one-token steps (costs.py); no draft when even the best rate is below `min_gain`. On a CPU where
a 2-token batch costs 1.9 steps this drafts nothing after weak matches and long drafts (16-63)
inside a copy: what the copy-drafting bound (bench/bound.py) does with hindsight.

p(g) per bucket of g is a decayed count of the outcomes seen in this sequence (a draft of k with
a accepted: continues at agreements m..m+a-1, a break at m+a when a < k) shrunk towards a prior
(`PRIOR_CONTINUE`, with the weight of `prior_weight` observations). Buckets a strategy never
drafts in would never learn, so after `probe_every` declined drafts in a bucket one is drafted
anyway (the best k), as long as failed probes stay within `probe_budget` of plain decoding.
Drafts without a match length go to a geometric `DraftLengthController` (controller.py).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from llamaspec.speculative.controller import CostModel, DraftLengthController

__all__ = ["AGREEMENT_EDGES", "PRIOR_CONTINUE", "TRUSTED_AGREEMENT", "agreement_bucket", "best_length", "expected_tokens",
           "CopyEvidence", "CopyStats", "MatchController", "RiskBudget", "count_steps"]

# Agreement lengths are pooled into buckets by these upper edges (and one bucket past the last).
AGREEMENT_EDGES = (2, 3, 5, 8, 16, 32, 64)
# p(g) before anything was seen, per bucket. Why these: a 2-token match of code or prose is often
# some other place ("    return", "(self"), 3-5 tokens mostly the right one, a copy that has run
# for 16+ tokens breaks only where the answer departs from its source (replays of SmolLM2's
# greedy output on code rewrites: about 0.45, 0.6, 0.8, 0.9, 0.95, 0.97 and more, a story
# about 0.3 at 2 tokens). A little below what was seen: an unlearnt bucket errs towards short.
PRIOR_CONTINUE = (0.4, 0.6, 0.85, 0.92, 0.96, 0.98, 0.985, 0.99)
# A copy that has agreed with the text for this many tokens risks only its expected loss
# ((1 - p) of the draft's cost) against the loss budget, no longer the whole cost: on a steep
# verify curve (Qwen2.5-Coder-1.5B on 2 cores, C(2) = 2.45 steps) the budget held the drafts of
# a module copied from the prompt to 1-2 tokens until they had paid, where ngram-simple drafted
# it whole. Replayed on 13 recorded traces (scripts/replay_drafters.py, the model's measured
# curve): Qwen geomean at 32 / 128 tokens 1.019 / 1.042x -> 1.044 / 1.068x, the worst trace the
# same; 8 tokens lost one code edit 0.861x, 16 kept less; SmolLM2 unchanged (+-0.002).
TRUSTED_AGREEMENT = 12


def agreement_bucket(g: int) -> int:
    """Bucket index of agreement length g (0 for g <= 2).

        >>> [agreement_bucket(g) for g in (0, 2, 3, 4, 5, 6, 16, 17, 64, 65, 1000)]
        [0, 0, 1, 2, 2, 3, 4, 5, 6, 7, 7]
    """
    for i, edge in enumerate(AGREEMENT_EDGES):
        if g <= edge:
            return i
    return len(AGREEMENT_EDGES)


def expected_tokens(probs: Sequence[float], k: int) -> float:
    """E(k) = 1 + sum_{j<=k} prod_{i<=j} probs[i-1]: tokens a step drafting k yields on average.

        >>> expected_tokens([0.5, 0.5, 0.5], 2)      # 1 + .5 + .25
        1.75
    """
    total, run = 1.0, 1.0
    for p in probs[:k]:
        run *= p
        total += run
    return total


def best_length(probs: Sequence[float], verify: Sequence[float], draft_ratio: float = 0.0,
                n_min: int = 1) -> tuple[int, float]:
    """(k, rate): the draft length in [n_min, len(probs)] maximising E(k) / (verify[k] + d*k),
    the smallest k on ties; verify[k] = t(k+1)/t(1) (verify[0] unused). (0, 1.0) when no
    length is possible. Pure: the policy's whole arithmetic.

    Worked example, the 2-core EPYC's curve (t(2) = 1.9, t(4) = 2.27, t(8) = 3.36 steps): a copy
    that continues with p = 0.95 is worth drafting 7 tokens (E = 6.7 tokens for 3.36 steps: 2.0
    tokens a step), one with p = 0.5 is worth no draft at all (its best, 2 tokens, gives 1.75
    tokens for 2.085 steps: 0.84 a step, below plain decoding's 1)::

        >>> curve = [1.0, 1.90, 2.085, 2.27, 2.54, 2.81, 3.09, 3.36]
        >>> k, rate = best_length([0.95] * 7, curve); k, round(rate, 2)
        (7, 2.0)
        >>> k, rate = best_length([0.5] * 7, curve); k, round(rate, 2)
        (2, 0.84)
    """
    best_k, best_r = 0, 1.0
    total, run = 1.0, 1.0
    found = False
    for k in range(1, len(probs) + 1):
        run *= probs[k - 1]
        total += run
        if k < n_min:
            continue
        r = total / (verify[k] + draft_ratio * k)
        if not found or r > best_r + 1e-12:
            best_k, best_r, found = k, r, True
    return best_k, best_r


class RiskBudget:
    """How long a draft may be so that drafting never costs more than plain decoding by more than
    a small margin: a draft that fails at once costs C(k) - 1 steps for nothing, so a step may
    risk only its allowance: `base` steps, plus `share` of the steps taken, plus what drafting has
    saved (tokens yielded - steps paid, over the drafted steps; a loss takes it back), at most
    `bank` steps at any time (a long-lived server must not bank a thousand steps of savings and
    then lose them on one request). On a steep verify curve (Qwen2.5-Coder-1.5B on 2 CPU cores:
    t(16)/t(1) = 5.8) a copy that turns out to be the wrong place costs nearly 5 steps; before
    anything is saved the first drafts stay short, and drafts that keep paying grow as long as the
    controller wants.

    One budget per drafter of an engine, kept across its sequences (what earlier requests of a
    batch job or a server saved, a later one may risk: a short JSON record cannot earn a long
    copy's risk by itself); the controller reports its drafts (`observe`), each sequence counts its
    steps once (`count_steps`). Replayed with learnt costs on four code edits each
    (scripts/replay_drafters.py), against no budget: Qwen 1.5B 2.27 / 1.18 / 0.98 / 1.47x against
    2.27 / 1.13 / 0.90 / 1.55x, SmolLM2 F16 2.89 / 2.04 / 2.04 / 2.48x against 2.84 / 2.07 / 2.08 /
    2.37x.

        >>> r = RiskBudget(base=1.0, share=0.0)
        >>> verify = [1.0, 1.8, 2.4, 3.0, 3.5]         # t(k+1)/t(1), k = 0..4
        >>> r.longest(verify, 0.0, 4)                 # C(1) - 1 = 0.8 <= 1.0 < C(2) - 1
        1
        >>> r.observe(1, 1, 1.8); r.allowance()       # 2 tokens for 1.8 steps
        1.2
        >>> r.observe(1, 1, 1.8); r.observe(1, 1, 1.8); r.longest(verify, 0.0, 4)   # 0.6 saved
        2
        >>> for _ in range(100): r.observe(4, 4, 3.5)   # a long copy: 150 steps saved, 16 kept
        >>> r.allowance()
        16.0
    """

    def __init__(self, base: float = 1.0, share: float = 0.03, bank: float = 16.0):
        self.base = base          # steps any drafter may lose before it has saved any
        self.share = share        # and this fraction of the steps taken (0.03: >= 0.97x plain)
        self.bank = bank          # the most risk held at once, in steps
        self._room = base         # the allowance now

    @classmethod
    def unbounded(cls) -> "RiskBudget":
        return cls(base=math.inf, share=0.0, bank=math.inf)

    def allowance(self) -> float:
        return round(self._room, 9)

    def longest(self, verify: Sequence[float], draft_ratio: float, k_max: int, fail_p: float = 1.0) -> int:
        """The longest k <= k_max whose outright failure, C(k) - 1 steps weighed by its
        probability `fail_p` (1: the worst case), stays within the allowance.

            >>> r = RiskBudget(base=1.0, share=0.0)
            >>> r.longest([1.0, 1.8, 2.4, 3.0, 3.5], 0.0, 4, fail_p=0.25)   # 0.25 * 2.5 <= 1.0
            4
        """
        room = self._room
        k = 0
        while k < k_max and k + 1 < len(verify) and (verify[k + 1] + draft_ratio * (k + 1) - 1.0) * fail_p <= room + 1e-9:
            k += 1
        return k

    def observe(self, n_drafted: int, n_accepted: int, cost: float) -> None:
        """A drafted step: `cost` its price in one-token steps, C(k)."""
        if n_drafted > 0:
            self._room = min(self.bank, self._room + (n_accepted + 1) - cost)

    def count_step(self) -> None:
        self._room = min(self.bank, self._room + self.share)


class CopyEvidence(int):
    """A match length (the int) that also carries the drafter's own continuation probabilities
    for the positions of the draft it would copy (`probs`; prompt-lookup: it sees every step's
    outcome, drafted or not, and which tokens the text refused to copy). Passed where a match
    length goes (limit(d, match), Draft.match), so nothing between drafter and controller changes."""

    probs: tuple[float, ...]

    def __new__(cls, match: int, probs: Sequence[float]):
        obj = super().__new__(cls, match)
        obj.probs = tuple(probs)
        return obj


class CopyStats:
    """Continuation probabilities per agreement bucket, decayed counts shrunk towards priors."""

    def __init__(self, priors: Sequence[float] = PRIOR_CONTINUE, prior_weight: float = 8.0, decay: float = 0.95):
        if len(priors) != len(AGREEMENT_EDGES) + 1:
            raise ValueError(f"need {len(AGREEMENT_EDGES) + 1} priors, one per bucket")
        self.priors = tuple(priors)
        self.prior_weight = prior_weight
        self.decay = decay
        self.cont = [0.0] * len(self.priors)   # decayed continuations seen per bucket
        self.seen = [0.0] * len(self.priors)   # decayed continuations + breaks

    def p(self, g: int) -> float:
        b = agreement_bucket(g)
        return (self.cont[b] + self.prior_weight * self.priors[b]) / (self.seen[b] + self.prior_weight)

    def probs(self, match: int, k: int) -> list[float]:
        """p at the agreements of draft positions 1..k after a match of `match` tokens."""
        return [self.p(match + i) for i in range(k)]

    def observe(self, match: int, n_drafted: int, n_accepted: int) -> None:
        """A draft of n_drafted after a match of `match`, n_accepted of it accepted. The buckets
        it tells about forget `decay` of what they knew first (the text moves on: a copied
        stretch, then free text); the others keep theirs."""
        seen: dict[int, list[float]] = {}
        for i in range(n_accepted):
            seen.setdefault(agreement_bucket(match + i), [0.0, 0.0])[0] += 1.0
        if n_accepted < n_drafted:
            seen.setdefault(agreement_bucket(match + n_accepted), [0.0, 0.0])[1] += 1.0
        for b, (cont, broke) in seen.items():
            self.cont[b] = self.cont[b] * self.decay + cont
            self.seen[b] = self.seen[b] * self.decay + cont + broke


class MatchController:
    """The DraftLengthController interface (choose / observe / observe_cost / n_pauses / paused)
    for drafts that carry a match length (see the module docstring).

    `make(cost, prior_alpha)` builds a DraftLengthController around the shared cost: one is made
    for drafts without a match length, and it gives the draft-length range [n_min, n_max]."""

    def __init__(self, make: Callable[[CostModel, float], DraftLengthController], cost: CostModel | None = None, *,
                 stats: CopyStats | None = None, min_gain: float = 1.05, probe_every: int = 32,
                 probe_budget: float = 0.03, risk: RiskBudget | None = None):
        self.cost = cost if cost is not None else CostModel()
        self.fallback = make(self.cost, 0.6)
        self.n_min, self.n_max = self.fallback.n_min, self.fallback.n_max
        self.stats = stats if stats is not None else CopyStats()
        self.min_gain = min_gain
        self.probe_every = probe_every
        self.probe_budget = probe_budget
        self._declined = [0] * len(self.stats.priors)  # declined drafts per bucket since its last draft
        self._last: int | None = None   # match of the draft sized by the last choose() (None: fallback)
        self.n_pauses = 0               # drafts declined (a plain step where a copy was found)
        self.n_probes = 0
        self.risk = risk if risk is not None else RiskBudget()

    def choose(self, match: int | None = None) -> int:
        if match is None:
            self._last = None
            return self.fallback.choose()
        self._last = match
        if self.n_max <= 0 or self.cost.needs_decode_timing:  # a plain step, to time t(1)
            return 0
        given = getattr(match, "probs", None)
        probs = list(given[:self.n_max]) if given is not None else self.stats.probs(match, self.n_max)
        if not probs:
            return 0
        verify = self.cost.verify_ratios(len(probs))
        # never slower: a draft risks at most what drafting has saved so far plus a small budget;
        # the whole draft's cost while the copy is unproven, its expected loss once it is long
        cap = self.risk.longest(verify, self.cost.draft_ratio, len(probs))
        if int(match) >= TRUSTED_AGREEMENT:   # only at sizes whose price is known, not guessed
            known = int(min(len(probs), self.cost.known_size - 1))
            cap = max(cap, self.risk.longest(verify, self.cost.draft_ratio, known, 1.0 - probs[0]))
        if cap < self.n_min:
            self.n_pauses += 1
            return 0
        k, rate = best_length(probs[:cap], verify, self.cost.draft_ratio, self.n_min)
        if rate >= self.min_gain:
            self._declined[agreement_bucket(match)] = 0
            return k
        b = agreement_bucket(match)
        self._declined[b] += 1
        self.n_pauses += 1
        if self._declined[b] >= self._probe_gap(k):
            self._declined[b] = 0
            self.n_probes += 1
            return k
        return 0

    def _probe_gap(self, k: int) -> int:
        """Declines between probes: `probe_every`, more when a failed probe (C(k) - 1 steps)
        would cost more than `probe_budget` of the plain steps between them."""
        loss = self.cost.verify_ratio(k) + self.cost.draft_ratio * k - 1.0
        by_cost = math.ceil(loss / self.probe_budget) if self.probe_budget > 0 else self.probe_every
        return max(self.probe_every, by_cost)

    def observe(self, n_drafted: int, n_accepted: int, verify_seconds: float | None = None,
                draft_seconds: float | None = None) -> None:
        if n_drafted > 0 and self._last is None:
            self.fallback.observe(n_drafted, n_accepted, verify_seconds, draft_seconds)
            return
        if verify_seconds is not None:
            self.cost.observe_verify(n_drafted + 1, verify_seconds)
        if draft_seconds is not None and n_drafted > 0:
            self.cost.observe_draft(n_drafted, draft_seconds)
        if n_drafted > 0:
            self.risk.observe(n_drafted, n_accepted, self.cost.verify_ratio(n_drafted) + self.cost.draft_ratio * n_drafted)
        if n_drafted > 0:
            if n_accepted > n_drafted:
                raise ValueError(f"accepted {n_accepted} > drafted {n_drafted}")
            if not hasattr(self._last, "probs"):  # else the drafter keeps the statistics
                self.stats.observe(self._last, n_drafted, n_accepted)

    def observe_cost(self, n_tokens: int, seconds: float) -> None:
        self.cost.observe_verify(n_tokens, seconds)

    @property
    def paused(self) -> bool:
        return self.fallback.paused


def count_steps(ctls) -> None:
    """One step of a sequence, counted once in each risk budget its controllers share."""
    for risk in {id(r): r for c in ctls.values() if (r := getattr(c, "risk", None)) is not None}.values():
        risk.count_step()
