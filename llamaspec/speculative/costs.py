"""Costs of speculative steps relative to one plain decode step, measured online.

The adaptive controller (controller.py) weighs expected tokens against these costs: c(k), a verify
batch of k draft tokens + 1, and d, drafting one token, both in units of t(1), one plain step.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Callable, Sequence

__all__ = ["CostModel", "RECALIBRATE_STEPS", "marginal_charges", "shared_step_ratios", "size_bucket"]

#: a plain step is timed again after this many timed batches without one (the cost of t(1) drifts
#: with the machine's load; one step in 200 is < 0.5% of drafting)
RECALIBRATE_STEPS = 200


#: b / a of t(n) = a + b * n before batch sizes vary enough to fit it. Errs towards dear batches:
#: a slope too low makes the first drafts long, and a long draft that fails costs many steps
#: (a 2-core EPYC: 0.15, t(64) = 15 t(1); turn 1's machine: about 0.02); a slope too high only
#: makes the first drafts short until the measurements take over.
DEFAULT_SLOPE = 0.15
#: before any batch is timed, a batch of n >= 2 tokens is priced PRIOR_BATCH_OVERHEAD t(1) above
#: the prior line: a one-token step is a matrix-vector product, a batch a matrix product with
#: other kernels (the EPYC: t(2) = 1.9 t(1)); a GPU's batches cost less, which the first timed
#: batch shows
PRIOR_BATCH_OVERHEAD = 0.3
#: timings kept per batch-size bucket (and of one-token steps) for their medians
WINDOW = 9
#: batch sizes are pooled by powers of two (2, 3-4, 5-8, ...): each bucket keeps its own mean
#: time, and the curve is interpolated between them (a line fitted to batches of 30-60 tokens
#: prices an 8-token batch at 1.3x its cost on a CPU)
_BUCKET_SIZES = (2, 4, 8, 16, 32, 64, 128, 256, 512)


def size_bucket(n: int) -> int:
    """The bucket of batch size n: 2, 3-4, 5-8, ... (0, 1, 2, ...)."""
    for i, edge in enumerate(_BUCKET_SIZES):
        if n <= edge:
            return i
    return len(_BUCKET_SIZES)


class CostModel:
    """Costs relative to one plain decode step (a target batch of 1 token).

    verify_ratio(k) = t(k + 1) / t(1), draft_ratio = seconds per drafted token / t(1).
    t(n) = a + b * n is fitted by least squares with exponential forgetting over observed
    (batch size, seconds) pairs. Until the batch sizes seen vary enough to fit a slope,
    b / a = `default_slope` (MEASURED.md: on CPU a batch of 8 costs about one decode step).
    `verify_ratio_fn` / `draft_ratio_value`, when given, replace the measurements.

        >>> cm = CostModel()
        >>> for n, t in [(1, 0.030), (5, 0.034), (9, 0.038)] * 3:
        ...     cm.observe_verify(n, t)
        >>> round(cm.verify_ratio(8), 3)            # t(9) / t(1) = 0.038 / 0.030
        1.267
        >>> cm.observe_draft(4, 0.006); round(cm.draft_ratio, 3)   # 1.5 ms per token / 30 ms
        0.05
    """

    def __init__(self, verify_ratio_fn: Callable[[int], float] | None = None,
                 draft_ratio_value: float | None = None, default_slope: float = DEFAULT_SLOPE,
                 draft_ratio_prior: float = 0.0,
                 decay: float = 0.98, prior: Sequence[Sequence[float]] | None = None,
                 draft_seconds: Callable[[], float | None] | None = None):
        self.verify_ratio_fn = verify_ratio_fn
        self.draft_ratio_value = draft_ratio_value
        self.draft_ratio_prior = draft_ratio_prior  # before any draft is timed (measured at load)
        # or, better, a drafted token's seconds timed on the drafter alone (a draft model loaded
        # beside the first steps: drafters/lazy.py), over the t(1) timed here
        self.draft_seconds = draft_seconds
        # ((n, t(n)/t(1)[, timings]), ...) this target measured before (curve_memo.py, or the
        # engine's earlier sequences): the price of a batch size until this model has timed its own
        self.prior = tuple(prior) if prior else ()
        self.default_slope = default_slope
        self.decay = decay
        self._w = self._sn = self._snn = self._st = self._snt = 0.0  # batches of 2+ (all, until one)
        self._one_w = self._one_s = 0.0  # one-token steps
        self._since_one = 0              # batches timed since the last one-token step
        self._draft_s = self._draft_n = 0.0
        # the latest timings per size bucket and of one-token steps, for medians: on a shared
        # machine a step now and then takes several times its cost (another process had the
        # cores), and a mean of those prices every batch by them
        self._recent: list[deque] = [deque(maxlen=WINDOW) for _ in range(len(_BUCKET_SIZES) + 1)]
        self._ones: deque = deque(maxlen=WINDOW)
        # each bucket's (median size, median time), and t(1)'s median, until a timing changes them:
        # the controllers price drafts every step, and ten medians a call were ~0.1 ms of a 10 ms step
        self._medians: list[tuple[float, float] | None] = [None] * len(self._recent)
        self._t1_median: float | None = None
        # While the sequence shares its steps with others, the engine prices its drafts by the
        # shared batch's curve (shared_step_ratios): k_max -> [C(0..k_max)]; None when alone.
        self.shared: Callable[[int], list[float]] | None = None

    def observe_verify(self, n_tokens: int, seconds: float) -> None:
        """A target step that evaluated `n_tokens` tokens (1 for a plain decode) took `seconds`.

        One-token steps are kept apart from the line fitted to batches: on CPUs a one-token step
        is a matrix-vector product bound by memory bandwidth and a batch a matrix product with
        other kernels (SmolLM2 F16 on a 2-core EPYC: t(2) = 1.8 t(1), then +0.2 t(1) per token),
        so one line through both would make short drafts look cheap."""
        if n_tokens < 1 or not seconds > 0.0:
            return
        g = self.decay
        self._since_one = 0 if n_tokens == 1 else self._since_one + 1
        if n_tokens == 1:
            self._one_w = self._one_w * g + 1.0
            self._one_s = self._one_s * g + seconds
            self._ones.append(seconds)
            self._t1_median = None
            if self._w > 0.0 and self._sn > self._w:  # batches seen: the line is theirs alone
                return
        elif self._w > 0.0 and self._sn <= self._w:  # the first batch: drop the one-token points
            self._w = self._sn = self._snn = self._st = self._snt = 0.0
        if n_tokens > 1:
            self._recent[size_bucket(n_tokens)].append((n_tokens, seconds))
            self._medians[size_bucket(n_tokens)] = None
        self._w = self._w * g + 1.0
        self._sn = self._sn * g + n_tokens
        self._snn = self._snn * g + n_tokens * n_tokens
        self._st = self._st * g + seconds
        self._snt = self._snt * g + n_tokens * seconds

    def batch_curve(self, n_max: int) -> Callable[[int], float]:
        """t(n) / t(1) for n = 1..n_max as a function (marginal_charges' curve)."""
        ratios = self.verify_ratios(max(0, n_max - 1))
        return lambda n: ratios[min(max(n, 1), len(ratios)) - 1]

    def observe_draft(self, n_tokens: int, seconds: float) -> None:
        """Drafting `n_tokens` tokens took `seconds`."""
        if seconds < 0.0:
            return
        g = self.decay
        self._draft_s = self._draft_s * g + seconds
        self._draft_n = self._draft_n * g + n_tokens

    def line(self) -> tuple[float, float] | None:
        """(a, b) of t(n) = a + b * n, or None before any timing."""
        if self._w <= 0.0:
            return None
        mean_n = self._sn / self._w
        mean_t = self._st / self._w
        var_n = self._snn / self._w - mean_n * mean_n
        if self._w >= 3.0 and var_n >= 0.5:
            b = (self._snt / self._w - mean_n * mean_t) / var_n
            b = max(b, 0.0)
            a = mean_t - b * mean_n
            if a <= 0.0:  # time proportional to the batch size, or noise: keep a sane intercept
                a = mean_t / (1.0 + self.default_slope * mean_n)
                b = a * self.default_slope if b <= 0.0 else (mean_t - a) / mean_n
            return a, b
        a = mean_t / (1.0 + self.default_slope * mean_n)
        return a, a * self.default_slope

    @property
    def needs_decode_timing(self) -> bool:
        """Batches are being timed but no one-token step was lately (drafting every step): the
        controller then takes one plain step, since extrapolating t(1) from batches overestimates
        it (`observe_verify`) and makes every draft look cheaper than it is. Also before the
        first step when a drafter was timed alone (`draft_seconds`): its time means nothing
        until a target step is timed to divide it by."""
        if self.verify_ratio_fn is not None:
            return False
        if self._w == 0.0:
            return (self.draft_ratio_value is None and self._draft_n <= 0.0 and self.draft_seconds is not None
                    and self.draft_seconds() is not None)
        return self._one_w == 0.0 or self._since_one >= RECALIBRATE_STEPS

    @property
    def decode_seconds(self) -> float | None:
        """Estimated time of one plain decode step t(1): measured, else from the line."""
        if self._ones:
            if self._t1_median is None:
                self._t1_median = statistics.median(self._ones)
            return self._t1_median
        ab = self.line()
        return None if ab is None else ab[0] + ab[1]

    def verify_ratio(self, k: int) -> float:
        """Cost of a verify step with k draft tokens / cost of a plain decode step: verify_ratios(k)[k],
        from the few sizes that can hold its running maximum (the curve is linear between its
        points), so a first draft priced with a 32k-token prompt costs no 32k-step loop."""
        if self.verify_ratio_fn is not None:
            return float(self.verify_ratio_fn(k))
        if self.shared is not None or k < 2:
            return self.verify_ratios(k)[k]
        a, b, t1, pts = self._curve()
        # a linear piece sampled at integers peaks at its ends: each point's neighbours, and k + 1
        sizes = {2, k + 1}
        for x, _ in pts:
            sizes.update(n for n in (math.floor(x), math.ceil(x)) if 2 <= n <= k + 1)
        return max(1.0, max(self._t_at(n, a, b, pts) for n in sizes) / t1)

    def verify_ratios(self, k_max: int) -> list[float]:
        """[verify_ratio(k) for k in 0..k_max], computed at once: t(k+1) interpolated between the
        median (size, time) of each size bucket measured (the latest WINDOW timings), past the measured ones along the fitted
        line's slope (the prior slope before batch sizes vary), over t(1); never below 1 and never
        falling with k."""
        if self.verify_ratio_fn is not None:
            return [float(self.verify_ratio_fn(k)) for k in range(k_max + 1)]
        if self.shared is not None:
            return self.shared(k_max)
        a, b, t1, pts = self._curve()
        out, top = [1.0], 1.0
        for k in range(1, k_max + 1):
            # never below 1: a batch that looked faster than one token is noise
            top = max(top, self._t_at(k + 1, a, b, pts) / t1, 1.0)
            out.append(top)
        return out

    def _curve(self) -> tuple[float, float, float, list[tuple[float, float]]]:
        """(a, b, t(1), points): the line, the one-token time and the (size, seconds) points the
        curve is interpolated between (this run's bucket medians, then the kept prior's)."""
        ab = self.line()
        if ab is None:
            a, b = 1.0, self.default_slope
        else:
            a, b = ab
        t1 = self.decode_seconds if ab is not None else a + b
        pts = self._bucket_medians()
        if self.prior:   # sizes not timed here yet: what this target measured before
            have = {size_bucket(round(n)) for n, _ in pts}
            pts = sorted(pts + [(p[0], p[1] * t1) for p in self.prior if size_bucket(round(p[0])) not in have])
        return a, b, t1, pts

    @staticmethod
    def _t_at(n: int, a: float, b: float, pts: list[tuple[float, float]]) -> float:
        """Seconds of a batch of n tokens on the curve (a, b, pts) of `_curve`."""
        if not pts:  # nothing measured: the prior line, and a batch's own overhead
            return a + b * n + PRIOR_BATCH_OVERHEAD * (a + b)
        if n <= pts[0][0]:
            return pts[0][1] - b * (pts[0][0] - n)
        if n >= pts[-1][0]:
            return pts[-1][1] + b * (n - pts[-1][0])
        i = next(i for i in range(1, len(pts)) if n <= pts[i][0])
        (x0, y0), (x1, y1) = pts[i - 1], pts[i]
        return y0 + (y1 - y0) * (n - x0) / (x1 - x0) if x1 > x0 else y1

    @property
    def known_size(self) -> float:
        """The largest batch this target's curve knows, timed here or kept from before (inf for a
        given or shared curve, 0 when every size is priced by the prior line): past it, prices
        are extrapolated along a slope that may be far below the model's (Qwen2.5-1.5B on 2
        cores: 0.4 t(1) a token against the prior's 0.15)."""
        if self.verify_ratio_fn is not None or self.shared is not None:
            return math.inf
        sizes = [n for n, _ in self._bucket_medians()] + [p[0] for p in self.prior]
        return max(sizes, default=0.0)

    def _bucket_medians(self) -> list[tuple[float, float]]:
        """(median size, median seconds) of each bucket timed, smallest first."""
        pts = []
        for i, r in enumerate(self._recent):
            if r:
                m = self._medians[i]
                if m is None:
                    m = self._medians[i] = (statistics.median(n for n, _ in r), statistics.median(t for _, t in r))
                pts.append(m)
        return pts

    def measured_curve(self) -> tuple[tuple[float, float, float], ...]:
        """((n, t(n)/t(1), timings), ...): the median of each batch-size bucket timed here over the
        median one-token step (what curve_memo.py keeps for the next run); () before a one-token
        step was timed. `timings` counts the fewer of the two medians' timings (a run that drafts
        every step times t(1) once or twice: its ratios weigh that little)."""
        if not self._ones:
            return ()
        t1 = self.decode_seconds
        return tuple((float(n), max(1.0, t / t1), float(min(len(r), len(self._ones))))
                     for (n, t), r in zip(self._bucket_medians(), (r for r in self._recent if r)))

    @property
    def draft_ratio(self) -> float:
        """Cost of drafting one token / cost of a plain decode step (the prior before any timing)."""
        if self.draft_ratio_value is not None:
            return self.draft_ratio_value
        t1 = self.decode_seconds
        if not t1:
            return self.draft_ratio_prior
        if self._draft_n <= 0.0:
            alone = self.draft_seconds() if self.draft_seconds is not None else None
            return alone / t1 if alone else self.draft_ratio_prior
        return (self._draft_s / self._draft_n) / t1


def marginal_charges(rows: Sequence[int], other_rows: int, seconds: float,
                     curve: Callable[[int], float]) -> list[float]:
    """Each sequence's charge for one shared batch that took `seconds`: `rows[i]` = 1 + the draft
    tokens of sequence i, `other_rows` tokens of no sequence's step (prompt chunks), `curve(n)`
    the time of an n-token batch in any unit (CostModel.batch_curve).

    A row of the batch without drafts (T0 = one row per sequence + other_rows) costs t(T0) / T0;
    sequence i is charged that plus the marginal cost of its k_i extra rows, t(T) - t(T - k_i),
    all scaled by seconds / t(T) (what the curve predicts against what was measured). Charging
    each its rows' share instead, (k + 1) / T of the step, prices drafting at (k + 1) plain steps
    however flat the curve: drafting looks dearer the more sequences share the batch, and stops.
    One sequence alone is charged the whole step.

        >>> flat = lambda n: 1.0 + 0.01 * n           # a GPU-like curve: t(12) = 1.12, t(4) = 1.04
        >>> c = marginal_charges([9, 1, 1, 1], 0, 1.12, flat)   # one of 4 sequences drafts 8
        >>> [round(x, 2) for x in c]                  # 1.04 / 4 + (1.12 - 1.04), and 1.04 / 4
        [0.34, 0.26, 0.26, 0.26]
        >>> round(c[0] / c[1], 2)                     # drafting 8: 1.31 plain steps (rows' share: 9)
        1.31
        >>> marginal_charges([5], 0, 0.03, flat)      # alone: the whole step
        [0.03]
        >>> steep = lambda n: n ** 0.66                 # every sequence drafts 1: together they pay t(8) - t(4)
        >>> c = marginal_charges([2, 2, 2, 2], 0, steep(8), steep)
        >>> round(sum(c), 3) == round(steep(8), 3), round(c[0] - steep(4) / 4, 3)
        (True, 0.362)
    """
    total = sum(rows) + other_rows
    if not rows or total <= 0:
        return []
    t_all = curve(total)
    n0 = len(rows) + other_rows
    base = curve(n0) / n0
    scale = seconds / t_all if t_all > 0 else 0.0
    # What drafting added to the step, t(T) - t(T0), shared by the drafting sequences in proportion
    # to their marginal costs: on a concave curve the marginals alone sum to less than that when
    # several draft at once, and drafting under load looked cheaper than it was.
    marginal = [t_all - curve(total - (r - 1)) for r in rows]
    surplus, paid = max(0.0, t_all - curve(n0)), sum(marginal)
    share = surplus / paid if paid > 0 else 0.0
    return [scale * (base + m * share) for m in marginal]


def shared_step_ratios(batch: CostModel, n_seqs: int, n_rows: int) -> Callable[[int], list[float]]:
    """C(k) = verify cost of k draft tokens over a plain step, for one of `n_seqs` sequences
    generating together in a step of `n_rows` rows without drafts (their last tokens and any
    prompt chunk), on `batch`'s curve of whole shared batches.

    A plain step costs each sequence its share of a step of plain rows, t(n_seqs) / n_seqs: that is
    what an accepted token saves. Its k draft rows cost what they add to the shared step,
    t(n_rows + k) - t(n_rows), which every sequence waits for. Under load a draft row is dear
    against a share (SmolLM2 F16, 2 cores, 4 sequences: t(4) = 1.95, t(12) = 3.59 t(1), so 8 draft
    rows cost 3.4 shares), where a new sequence's controller, pricing by a lone sequence's prior
    curve (8 rows: 2.3 steps), drafts 3 tokens at acceptance 0.6 instead of 1, and slows every
    sequence of the step down. The engine's curve is kept across requests; a sequence's own
    measurements would start again from the prior with every request.

        >>> cm = CostModel()
        >>> for n, t in [(4, 0.0256), (12, 0.0472), (20, 0.0726)] * 3:
        ...     cm.observe_verify(n, t)
        >>> [round(x, 2) for x in shared_step_ratios(cm, 4, 4)(8)][::4]   # C(0), C(4), C(8)
        [1.0, 2.69, 4.38]
    """
    memo: list[float] = []

    def ratios(k_max: int) -> list[float]:
        if len(memo) <= k_max:
            c = batch.verify_ratios(n_rows + k_max)  # c[n - 1] = t(n) / t(1)
            base = c[n_seqs - 1] / n_seqs
            memo[:] = [1.0 + (c[n_rows + k - 1] - c[n_rows - 1]) / base for k in range(k_max + 1)]
        return memo[:k_max + 1]
    return ratios
