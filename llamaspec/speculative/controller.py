"""Adaptive draft length: pick k from measured acceptance and measured costs.

No fixed k is right (MEASURED.md: on an easy prompt k=32 wins, on a harder one k=8), so before
each step the engine asks `DraftLengthController.choose()` for k and afterwards reports what
happened with `observe()`.

Model. A step that drafts k tokens yields E(k) tokens in expectation, the bonus token included:

    E(k) = 1 + sum_{j=1..k} prod_{i=1..j} a_i

where a_i is the probability that draft position i is accepted given that positions 1..i-1 were.
With one geometric rate a_i = alpha this is (1 - alpha^(k+1)) / (1 - alpha). The step costs,
in units of one plain decode step,

    C(k) = c(k) + d * k

with c(k) the cost of verifying k draft tokens (a target batch of k+1 tokens) and d the cost of
drafting one token (about 0 for n-gram drafters, which the timings show by themselves: no
branching on the drafter type). The controller picks the k in [n_min, n_max] that maximises the
rate E(k) / C(k); a plain decode step has rate 1.

Estimates:
- a_i: per-position counts of accepted / observed with exponential forgetting (`decay` per step),
  shrunk towards a pooled rate (itself shrunk towards `prior_alpha`), so positions never drafted
  yet fall back to the pooled rate. A step with k drafted and n accepted observes positions
  1..n as accepted and position n+1 (when n < k) as rejected: the censored-geometric counts.
- c(k), d: `CostModel` (costs.py), fitted online from step timings (t = a + b * n_tokens by decayed least
  squares) or given.

Fallback: when the per-token acceptance over the last `window` drafted steps (accepted /
(accepted + rejections)) is below `off_acceptance`, or when even the best k is not worth it
(rate < `min_gain`), the controller returns 0 (do not draft) for a pause, then probes once with
`probe_k` tokens. A good probe (something accepted, and then the best rate >= `min_gain`)
resumes drafting, with `window` drafted steps of grace before the acceptance window may pause it
again; drafting that lasts through the grace resets the pause to `pause` steps. A failed probe,
or drafting that stops again within the grace (the probe was luck), doubles the pause, up to a
cap that depends on why drafting stopped:
- it cannot pay by cost: even if every draft token were accepted, no k reaches `min_gain` (a
  draft model as slow as the target). Acceptance cannot change that, only re-measured costs can
  (the draft's cost timed at load may have been noise), so the first pause is already the cap,
  priced so that a failed probe costs at most `cost_probe_budget` (1 %) of plain decoding, and
  each failed probe doubles it: a 256-token run probes at most once, a long one O(log n) times.
- the drafts are bad right now: the cap is `recover_pause`, so drafting resumes soon after the
  text becomes predictable again, raised for a costly drafter so that failed probes (cost
  C(probe_k) - 1 each) cost at most `probe_budget` of plain decoding; a costly drafter's pause
  after a failed probe is at least its drafting work over that budget (`drafting_floor`).
The text moves on while drafting is paused, so each skipped step forgets the acceptance counts
as a drafted step does (`decay`): after a pause the estimates are close to the prior and the
probe's own outcome decides, rather than counts from a stretch the text has left.

Everything is deterministic given the observations.
"""

from __future__ import annotations

import math
from collections import deque

from llamaspec.speculative.costs import CostModel  # the controller's cost model, re-exported

__all__ = ["CostModel", "DraftLengthController", "expected_tokens_geometric"]

#: verify batches timed before their measured cost alone may say drafting cannot pay: the first
#: batch of a new size can take many plain steps (llama.cpp builds its graph; on a loaded machine
#: another process had the cores), and one such timing paused a grammar drafter whose every draft
#: was accepted for the rest of the sequence. Until then, only costs that cannot pay even on the
#: prior batch curve (a draft model as slow as the target) give the long pause.
COST_EVIDENCE = 3



def expected_tokens_geometric(alpha: float, k: int) -> float:
    """Expected tokens per step with draft length k and per-token acceptance alpha (bonus included).

        >>> expected_tokens_geometric(0.5, 2)     # 1 + .5 + .25
        1.75
        >>> expected_tokens_geometric(1.0, 4)
        5.0
    """
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class DraftLengthController:
    """Chooses the draft length k of each step for one sequence (see the module docstring).

    choose() -> k (0: do not draft this step); observe(n_drafted, n_accepted, ...) after each
    step, plain steps included (n_drafted=0). One controller per sequence; a CostModel may be
    shared between them.
    """

    def __init__(self, n_min: int = 1, n_max: int = 16, cost: CostModel | None = None, *,
                 decay: float = 0.9, prior_alpha: float = 0.6, prior_weight: float = 2.0,
                 position_weight: float = 2.0, min_gain: float = 1.05,
                 off_acceptance: float = 0.1, window: int = 16, pause: int = 8,
                 max_pause: int = 128, recover_pause: int = 32, probe_budget: float = 0.03,
                 cost_probe_budget: float = 0.01, probe_k: int | None = None, split_runs: bool = True,
                 resume_tokens: int = 0, first_resume: int = 0):
        if not 0 <= n_min <= n_max:
            raise ValueError(f"need 0 <= n_min <= n_max (got {n_min}, {n_max})")
        self.n_min = max(1, n_min)
        self.n_max = n_max
        self.cost = cost if cost is not None else CostModel()
        self.decay = decay
        self.prior_alpha = prior_alpha
        self.prior_weight = prior_weight
        self.position_weight = position_weight
        self.min_gain = min_gain
        self.off_acceptance = off_acceptance
        self.window = window
        self.pause = pause
        self.max_pause = max_pause
        self.recover_pause = recover_pause
        self.probe_budget = probe_budget
        self.cost_probe_budget = cost_probe_budget
        self.resume_tokens = resume_tokens  # what the drafter re-reads to draft after a pause
        # and before its first draft of the sequence (a draft model: the prompt, evaluated there):
        # a first probe of a draft that does not pay would cost a whole prompt evaluation
        self.first_resume = first_resume
        self._first_pending = first_resume > resume_tokens
        self.probe_k = min(n_max, max(self.n_min, 4)) if probe_k is None else probe_k
        self.split_runs = split_runs
        self._pool_num = 0.0  # decayed accepted counts, all positions
        self._pool_den = 0.0  # decayed observed counts (accepted + rejections)
        # Per-position counts, split by the outcome of the previous draft: acceptance comes in runs
        # (a draft copied from the prompt is right until the text departs from it), so after a
        # fully accepted draft the next one is likelier to be right than the average says.
        self._state = 0  # 1: the previous draft was accepted in full
        self._state_num = [[0.0] * n_max, [0.0] * n_max]  # decayed accepted counts per position
        self._state_den = [[0.0] * n_max, [0.0] * n_max]  # decayed observed counts per position
        self._state_pool = [[0.0, 0.0], [0.0, 0.0]]  # [accepted, accepted + rejections] per state
        self._recent: deque[tuple[int, int]] = deque(maxlen=window)
        self._pause_left = 0
        self._pause_len = pause
        self._probing = False
        self._skipped = 0  # plain steps of the current pause, not yet forgotten
        self._grace = 0
        self.n_pauses = 0
        self._batches_timed = 0   # verify batches whose time reached the cost model
        # undecayed totals of the whole run (what tune/draft_costs.py stores per pair)
        self.n_drafts = self.n_accepted = self.n_rejected = 0

    # -- estimates ----------------------------------------------------------------------------

    @property
    def alpha(self) -> float:
        """Pooled acceptance rate (per position, conditional on the previous ones accepted)."""
        w = self.prior_weight
        return (self._pool_num + w * self.prior_alpha) / (self._pool_den + w)

    def position_alphas(self) -> list[float]:
        """a_i for i = 1..n_max, given the outcome of the previous draft: that state's counts per
        position, shrunk towards that state's pooled rate (itself shrunk towards the overall one),
        so positions not drafted yet in this state get the state's rate."""
        w = self.position_weight
        acc, seen = self._state_pool[self._state]
        pooled = (acc + self.prior_weight * self.alpha) / (seen + self.prior_weight)
        sn, sd = self._state_num[self._state], self._state_den[self._state]
        return [(num + w * pooled) / (den + w) for num, den in zip(sn, sd)]

    def expected_tokens(self, k: int) -> float:
        """E(k): expected tokens of a step drafting k tokens, bonus included."""
        total, run = 1.0, 1.0
        for a in self.position_alphas()[:k]:
            run *= a
            total += run
        return total

    def rate(self, k: int) -> float:
        """E(k) / C(k): expected tokens per unit of plain-decode cost."""
        if k <= 0:
            return 1.0
        return self.expected_tokens(k) / (self.cost.verify_ratio(k) + self.cost.draft_ratio * k)

    def best(self) -> tuple[int, float]:
        """(k, rate) maximising the rate over [n_min, n_max] (the smallest k on ties)."""
        alphas = self.position_alphas()
        d = self.cost.draft_ratio
        c = self.cost.verify_ratios(self.n_max)
        first = self.first_cost() if self._first_pending else 0.0   # a first draft reads the prompt too
        best_k, best_r = self.n_min, -1.0
        total, run = 1.0, 1.0
        for k in range(1, self.n_max + 1):
            run *= alphas[k - 1]
            total += run
            if k < self.n_min:
                continue
            r = total / (c[k] + d * k + first)
            if r > best_r + 1e-12:
                best_k, best_r = k, r
        return best_k, best_r

    def first_cost(self) -> float:
        """What a draft model's first draft of the sequence costs before it drafts, in plain
        steps: the prompt (`first_resume` tokens) read. On a GPU a few hundredths of a step; on a
        CPU, where a 0.5B draft of a 1.5B target read a 210-token prompt in 1.9 s at -t 1, dozens
        of steps, which a first draft's rate must carry."""
        return self._reading(self.first_resume)

    def _reading(self, n: int) -> float:
        """n tokens the drafter evaluates before it drafts, as one batch priced on the verify
        curve at the draft's cost ratio, in plain steps."""
        return self.cost.draft_ratio * self.cost.verify_ratio(n - 1) if n > 0 else 0.0

    # -- decisions ----------------------------------------------------------------------------

    def choose(self, match: int | None = None) -> int:
        """Draft length for the next step; 0 means: do not draft (plain decode step).
        `match` (Draft.match) is not used here: MatchController keeps a controller per match length."""
        if self.n_max <= 0:
            return 0
        if self.cost.needs_decode_timing:  # a plain step, timed: what every ratio is relative to
            return 0
        if self._pause_left > 0:
            self._pause_left -= 1
            self._skipped += 1
            return 0
        if self._skipped:  # the pause is over: forget as if the skipped steps had been drafted
            self._forget(self.decay ** self._skipped)
            self._skipped = 0
        if self._probing:
            return self.probe_k
        k, r = self.best()
        if r < self.min_gain:
            self._start_pause()
            return self.choose()
        return k

    def observe(self, n_drafted: int, n_accepted: int, verify_seconds: float | None = None,
                draft_seconds: float | None = None) -> None:
        """Report a step: `n_drafted` draft tokens verified (0: plain step), `n_accepted` accepted;
        optional timings of the target step and of drafting."""
        if n_accepted > n_drafted:
            raise ValueError(f"accepted {n_accepted} > drafted {n_drafted}")
        if verify_seconds is not None:
            self.cost.observe_verify(n_drafted + 1, verify_seconds)
            self._batches_timed += n_drafted > 0
        if draft_seconds is not None:
            self.cost.observe_draft(n_drafted, draft_seconds)
        if n_drafted <= 0:
            return
        self._first_pending = False
        self.n_drafts += 1
        self.n_accepted += n_accepted
        self.n_rejected += n_accepted < n_drafted
        g = self.decay
        self._pool_num *= g
        self._pool_den *= g
        sn, sd = self._state_num[self._state], self._state_den[self._state]
        for i in range(self.n_max):
            sn[i] *= g
            sd[i] *= g
        sp = self._state_pool[self._state]
        sp[0] = sp[0] * g + n_accepted
        sp[1] = sp[1] * g + n_accepted + (1 if n_accepted < n_drafted else 0)
        limit = min(n_drafted, self.n_max)
        for i in range(min(n_accepted, limit)):
            sn[i] += 1.0
            sd[i] += 1.0
        if n_accepted < limit:
            sd[n_accepted] += 1.0
        self._state = 1 if n_accepted == n_drafted and self.split_runs else 0
        self._pool_num += n_accepted
        self._pool_den += n_accepted + (1 if n_accepted < n_drafted else 0)
        if self._grace > 0:
            self._grace -= 1
            if self._grace == 0:  # drafting lasted since the probe: the next pause starts short
                self._pause_len = self.pause
        if self._probing:
            self._probing = False
            if n_accepted > 0 and self.best()[1] >= self.min_gain:
                self._grace = self.window  # the probe worked: resume, re-measure for a while
            else:
                self._start_pause(longer=True)
            return
        self._recent.append((n_accepted, 1 if n_accepted < n_drafted else 0))
        if len(self._recent) == self.window and self._grace == 0:
            if self.window_alpha() < self.off_acceptance:
                self._start_pause()

    @property
    def run_alpha(self) -> float:
        """Per-token acceptance over the whole run (censored geometric: accepted / (accepted +
        rejections)); 0 before any draft."""
        return self.n_accepted / max(1, self.n_accepted + self.n_rejected)

    def window_alpha(self) -> float:
        """Per-token acceptance over the last `window` drafted steps: accepted / (accepted +
        rejections), the censored-geometric estimate (it does not depend on the draft lengths)."""
        acc = sum(a for a, _ in self._recent)
        rej = sum(r for _, r in self._recent)
        return acc / (acc + rej) if acc + rej else 1.0

    def observe_cost(self, n_tokens: int, seconds: float) -> None:
        """A target step of `n_tokens` tokens (the verify batch; 1 for a plain step) took
        `seconds`, in a step this controller's drafter had no part in (another drafter of a
        chain drafted): it feeds only the cost model, not the acceptance estimates or the pause."""
        self.cost.observe_verify(n_tokens, seconds)
        self._batches_timed += n_tokens > 1

    def max_rate(self) -> float:
        """The best rate if every draft token were accepted: below `min_gain`, drafting cannot
        pay by cost, whatever the drafts."""
        c = self.cost.verify_ratios(self.n_max)
        d = self.cost.draft_ratio
        return max(((k + 1) / (c[k] + d * k) for k in range(self.n_min, self.n_max + 1)), default=0.0)

    def cannot_pay(self) -> bool:
        """Drafting cannot pay by cost (max_rate below min_gain), on evidence: costs given as
        functions, COST_EVIDENCE timed batches, or a draft that cannot pay on the prior batch curve
        either."""
        if self.max_rate() >= self.min_gain:
            return False
        if self.cost.verify_ratio_fn is not None or self._batches_timed >= COST_EVIDENCE:
            return True
        c, d = CostModel(default_slope=self.cost.default_slope).verify_ratios(self.n_max), self.cost.draft_ratio
        return max(((k + 1) / (c[k] + d * k) for k in range(self.n_min, self.n_max + 1)), default=0.0) < self.min_gain

    def pause_cap(self) -> int:
        """Longest pause between probes, so that failed probes (C(probe_k) - 1 each) cost at most
        a budget of plain decoding. When drafting cannot pay by cost: `cost_probe_budget` (1 %:
        such a probe only re-measures costs, in case the load-time timing was noise), at least
        `max_pause` and at most 8x that (failed probes then double it, `_start_pause`); else
        `probe_budget`, at least `recover_pause`, at most 8x `max_pause`."""
        loss = self.probe_loss()
        if self.cannot_pay():  # only re-measured costs can change this: probe rarely
            by_cost = math.ceil(loss / self.cost_probe_budget) if self.cost_probe_budget > 0 else self.max_pause
            return max(self.max_pause, min(by_cost, 8 * self.max_pause))
        by_cost = math.ceil(loss / self.probe_budget) if self.probe_budget > 0 else self.max_pause
        return max(self.pause, self.recover_pause, min(by_cost, 8 * self.max_pause))

    def probe_loss(self) -> float:
        """What a failed probe costs over a plain step, in plain steps: C(probe_k) - 1, plus the
        drafter's catch-up after a pause (`resume_tokens` drafted as one batch, priced on the
        verify curve: a draft model evaluates the last SYNC_WINDOW tokens before drafting, and
        the prompt before its first draft)."""
        k, d = self.probe_k, self.cost.draft_ratio
        resume = self._reading(self.first_resume if self._first_pending else self.resume_tokens)
        return self.cost.verify_ratio(k) + d * k - 1.0 + resume

    def drafting_floor(self) -> int:
        """Shortest pause after a failed probe: the probe's drafting work (its catch-up and
        d * probe_k plain steps: a draft model's decodes) spread over `probe_budget`. 0 for a free drafter, whose
        pauses double from `pause` so that it resumes soon; a draft model as dear as the
        target (d ~ 0.9, 4 tokens: 120 steps) no longer probes 8, 16, 32 steps apart, which cost
        a 256-token story 5-10 % in failed probes."""
        if self.probe_budget <= 0:
            return 0
        return math.ceil((self.probe_loss() - self.cost.verify_ratio(self.probe_k) + 1.0) / self.probe_budget)

    def _forget(self, f: float) -> None:
        """Scale every acceptance count by f (estimates move towards the prior)."""
        self._pool_num *= f
        self._pool_den *= f
        for rows in (self._state_num, self._state_den, self._state_pool):
            for row in rows:
                row[:] = [x * f for x in row]

    def _start_pause(self, longer: bool = False) -> None:
        """Stop drafting for the pause length (at most the current cap), then probe once. The
        length doubles after a failed probe (`longer`) and when drafting stops again within the
        grace after a good probe (that probe was luck). When drafting cannot pay by cost, the
        pause is the whole cap at once: no acceptance could change that, so short first pauses
        would only buy probes that cannot succeed (each one costing a draft and a verify)."""
        failed = longer or self._grace > 0
        if failed:
            self._pause_len *= 2
        self._grace = 0
        cap = self.pause_cap()
        if self.cannot_pay():
            # the whole cap at once, then doubling with each failed probe (exponential backoff:
            # a long run pays O(log n) probes), up to 64x max_pause
            self._pause_len = min(max(cap, self._pause_len), 64 * self.max_pause)
        else:
            # a first probe that would evaluate the prompt in the draft waits as a failed one does
            floor = self.drafting_floor() if failed or self._first_pending else 0
            self._pause_len = min(max(self._pause_len, floor), cap)
        self._pause_left = self._pause_len
        self._probing = True
        self._recent.clear()
        self.n_pauses += 1

    @property
    def paused(self) -> bool:
        return self._pause_left > 0
