"""Tests of the adaptive draft-length controller and its cost model."""

from __future__ import annotations

import doctest
import random

import pytest

from llamaspec.speculative import controller as controller_mod
from llamaspec.speculative.controller import CostModel, DraftLengthController, expected_tokens_geometric


def flat(k: int) -> float:
    return 1.0


def test_docstring_examples():
    assert doctest.testmod(controller_mod).failed == 0


def fixed_alpha(alpha: float, **kw) -> DraftLengthController:
    """A controller whose estimates are pinned to alpha (prior with overwhelming weight)."""
    return DraftLengthController(prior_alpha=alpha, prior_weight=1e12, position_weight=1e12, **kw)


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.8, 0.99])
def test_expected_tokens_is_the_geometric_formula(alpha):
    c = fixed_alpha(alpha, n_max=20)
    for k in (0, 1, 5, 20):
        assert c.expected_tokens(k) == pytest.approx(expected_tokens_geometric(alpha, k))
        assert c.expected_tokens(k) == pytest.approx(sum(alpha ** j for j in range(k + 1)))


def test_rate_hand_computed():
    cost = CostModel(verify_ratio_fn=lambda k: 1.0 + 0.1 * k, draft_ratio_value=0.05)
    c = fixed_alpha(0.5, n_max=8, cost=cost)
    # k=2: E = 1 + .5 + .25 = 1.75 ; C = 1.2 + 2 * .05 = 1.3
    assert c.rate(2) == pytest.approx(1.75 / 1.3)
    assert c.rate(0) == 1.0


def test_best_k_grows_with_acceptance():
    # verify cost nearly flat (a batch of 8 about one step): the length follows the acceptance alone
    cheap = lambda: CostModel(verify_ratio_fn=lambda k: (1.0 + 0.02 * (k + 1)) / 1.02)  # noqa: E731
    ks = [fixed_alpha(a, n_max=64, cost=cheap()).best()[0] for a in (0.3, 0.6, 0.8, 0.9, 0.95)]
    assert ks == sorted(ks) and ks[0] < ks[-1]
    assert 1 <= ks[0] <= 4 and ks[-1] >= 24


def test_best_k_shrinks_with_verify_cost_and_draft_cost():
    cheap = fixed_alpha(0.85, n_max=64, cost=CostModel(verify_ratio_fn=lambda k: 1 + 0.01 * k))
    steep = fixed_alpha(0.85, n_max=64, cost=CostModel(verify_ratio_fn=lambda k: 1 + 0.2 * k))
    drafty = fixed_alpha(0.85, n_max=64, cost=CostModel(verify_ratio_fn=lambda k: 1 + 0.01 * k,
                                                        draft_ratio_value=0.3))
    assert steep.best()[0] < cheap.best()[0]
    assert drafty.best()[0] < cheap.best()[0]
    # free verification and drafting: the longest draft is best for any alpha > 0
    assert fixed_alpha(0.5, n_max=32, cost=CostModel(verify_ratio_fn=flat)).best()[0] == 32


def test_clamped_to_n_min_n_max():
    assert fixed_alpha(0.99, n_min=2, n_max=5).choose() == 5
    assert fixed_alpha(0.35, n_min=6, n_max=10, min_gain=0.0).choose() == 6
    with pytest.raises(ValueError):
        DraftLengthController(n_min=5, n_max=4)
    assert DraftLengthController(n_min=0, n_max=0).choose() == 0


def test_not_worth_drafting_returns_zero():
    # an expensive draft model at mediocre acceptance: every k is slower than plain decoding
    cost = CostModel(verify_ratio_fn=lambda k: 1.0 + 0.05 * k, draft_ratio_value=0.6)
    c = fixed_alpha(0.5, n_max=8, cost=cost)
    assert c.best()[1] < 1.0
    assert c.choose() == 0


def test_learns_per_position_acceptance():
    # position 1 always accepted, position 2 always rejected -> k = 1 once the cost rises with k
    c = DraftLengthController(n_max=16, cost=CostModel(verify_ratio_fn=lambda k: 1 + 0.1 * k))
    for _ in range(40):
        c.observe(4, 1)  # drafts of 4: the first token always accepted, the second never
    alphas = c.position_alphas()
    assert alphas[0] > 0.9 and alphas[1] < 0.15
    assert c.choose() == 1


def _simulate(alpha: float, steps: int, seed: int, cost: CostModel, n_max: int = 64):
    """Geometric acceptance with rate alpha; returns the k chosen at each step."""
    rng = random.Random(seed)
    c = DraftLengthController(n_max=n_max, cost=cost)
    ks = []
    for _ in range(steps):
        k = c.choose()
        ks.append(k)
        if k == 0:
            c.observe(0, 0)
            continue
        n = 0
        while n < k and rng.random() < alpha:
            n += 1
        c.observe(k, n)
    return ks


def test_easy_prompt_gets_long_drafts_hard_prompt_short_ones():
    """MEASURED.md: on an easy prompt k=32 wins, on a harder one k=8 (CPU: verify cost ~flat)."""
    cost = lambda: CostModel(verify_ratio_fn=lambda k: 1.0 + 0.01 * k)
    easy = _simulate(0.97, 300, 1, cost())
    hard = _simulate(0.70, 300, 2, cost())
    easy_k = sorted(easy[100:])[len(easy[100:]) // 2]
    hard_k = sorted(hard[100:])[len(hard[100:]) // 2]
    assert easy_k >= 24
    assert 3 <= hard_k <= 14


def test_deterministic():
    cost = lambda: CostModel(verify_ratio_fn=lambda k: 1.0 + 0.02 * k)
    assert _simulate(0.8, 200, 3, cost()) == _simulate(0.8, 200, 3, cost())


def test_low_acceptance_pauses_then_probes_with_backoff():
    c = DraftLengthController(n_max=8, cost=CostModel(verify_ratio_fn=flat), window=4, pause=3,
                              max_pause=12, probe_k=2, min_gain=0.0)
    for _ in range(4):  # a window of drafts that were all rejected
        k = c.choose()
        assert k > 0
        c.observe(k, 0)
    # paused for 3 steps, then one probe of probe_k tokens
    assert [c.choose() for _ in range(3)] == [0, 0, 0]
    assert c.paused is False
    assert c.choose() == 2
    c.observe(2, 0)  # failed probe: pause doubles
    assert [c.choose() for _ in range(6)] == [0] * 6
    assert c.choose() == 2
    c.observe(2, 0)
    assert [c.choose() for _ in range(12)] == [0] * 12  # 12 = max_pause
    assert c.choose() == 2
    c.observe(2, 2)  # the probe worked: drafting resumes
    assert c.choose() > 0
    assert c.n_pauses == 3


def test_probe_without_a_draft_is_repeated():
    c = DraftLengthController(n_max=8, cost=CostModel(verify_ratio_fn=flat), window=2, pause=1,
                              probe_k=3, min_gain=0.0)
    c.observe(4, 0)
    c.observe(4, 0)
    assert c.choose() == 0
    assert c.choose() == 3
    c.observe(0, 0)  # the drafter had nothing: the probe is still pending
    assert c.choose() == 3


def test_plain_steps_do_not_count_as_rejections():
    c = DraftLengthController(n_max=8, window=2, pause=5)
    for _ in range(20):
        c.observe(0, 0, verify_seconds=0.03)
    assert not c.paused and c.choose() > 0
    assert c.alpha == pytest.approx(c.prior_alpha)


def test_observe_checks_its_input():
    with pytest.raises(ValueError):
        DraftLengthController().observe(2, 3)


# -- cost model ------------------------------------------------------------------------------

def test_cost_model_default_slope_before_data():
    cm = CostModel(default_slope=0.02)
    assert cm.verify_ratio(0) == pytest.approx(1.0)
    # the prior line, plus a batch's own overhead over a one-token step (costs.PRIOR_BATCH_OVERHEAD)
    assert cm.verify_ratio(9) == pytest.approx(1.2 / 1.02 + 0.3)
    assert cm.draft_ratio == 0.0 and cm.decode_seconds is None


def test_cost_model_fits_a_line():
    cm = CostModel()
    for _ in range(5):
        for n in (1, 3, 9, 17):
            cm.observe_verify(n, 0.020 + 0.001 * n)
    a, b = cm.line()
    assert a == pytest.approx(0.020) and b == pytest.approx(0.001)
    assert cm.decode_seconds == pytest.approx(0.021)
    assert cm.verify_ratio(16) == pytest.approx(0.037 / 0.021)
    cm.observe_draft(10, 0.0021)  # 0.21 ms per drafted token
    assert cm.draft_ratio == pytest.approx(0.01)


def test_cost_model_with_one_batch_size_uses_default_slope():
    cm = CostModel(default_slope=0.05)
    for _ in range(10):
        cm.observe_verify(5, 0.05)  # always k=4: the slope cannot be measured
    assert cm.verify_ratio(4) == pytest.approx(1.0 + 0.05 * 4 / 1.05)
    assert cm.decode_seconds == pytest.approx(0.05 / 1.25 * 1.05)


def test_cost_model_never_negative_slope():
    cm = CostModel()
    for _ in range(5):
        for n in (1, 9):
            cm.observe_verify(n, 0.03 if n == 1 else 0.025)  # noise: bigger batch looked faster
    assert cm.verify_ratio(8) >= 1.0


def test_measured_costs_drive_the_choice():
    # n-gram drafting: microseconds -> negligible draft cost; verify cost measured flat
    c = fixed_alpha(0.9, n_max=32)
    for k in (0, 4, 16, 32, 8):
        c.observe(k, 0 if k == 0 else k, verify_seconds=0.025, draft_seconds=1e-5)
    c2 = fixed_alpha(0.9, n_max=32)
    for k in (0, 4, 16, 32, 8):  # a draft model costing half a decode per token
        c2.observe(k, 0 if k == 0 else k, verify_seconds=0.025, draft_seconds=0.0125 * k)
    assert c.cost.draft_ratio < 0.01 and c2.cost.draft_ratio == pytest.approx(0.5, rel=0.05)
    assert c2.best()[0] < c.best()[0]


def test_verify_ratios_agrees_with_verify_ratio():
    for cm in (CostModel(), CostModel(verify_ratio_fn=lambda k: 1 + 0.3 * k)):
        assert cm.verify_ratios(10) == pytest.approx([cm.verify_ratio(k) for k in range(11)])
        for n in (1, 4, 9):
            cm.observe_verify(n, 0.02 + 0.002 * n)
        assert cm.verify_ratios(10) == pytest.approx([cm.verify_ratio(k) for k in range(11)])


def test_acceptance_in_runs_lengthens_drafts_after_full_acceptance():
    """Copied text is accepted in runs: after a fully accepted draft the controller drafts longer
    than after a rejection (it conditions on the previous outcome, not only on the average)."""
    cost = CostModel(verify_ratio_fn=lambda k: 1 + 0.15 * k)
    c = DraftLengthController(n_max=32, cost=cost)
    # Runs: five fully accepted drafts, then two drafts rejected at the first token, repeated.
    for _ in range(6):
        for _ in range(5):
            k = c.choose()
            c.observe(k, k)
        for _ in range(2):
            k = c.choose()
            c.observe(k, 0)
    k_after_reject = c.choose()
    c.observe(k_after_reject, k_after_reject)  # now the previous draft was accepted in full
    k_after_full = c.choose()
    assert k_after_full >= 3 * max(1, k_after_reject)
    assert k_after_full >= 8


# -- recovery after a bad stretch: a deterministic simulation ----------------------------------
#
# Text positions are tokens of the output. A draft token at position p is accepted when
# `good(p)` (and all before it in the draft were); a step that drafts k tokens from position p
# yields the accepted ones plus the target's bonus token. Costs are in plain-decode steps:
# C(0) = 1, C(k) = verify_ratio(k) + draft_ratio * k.

FREE = dict(verify_ratio_fn=lambda k: 1.0 + 0.05 * k, draft_ratio_value=0.0)   # n-gram drafter
MODEL = dict(verify_ratio_fn=lambda k: 1.0 + 0.05 * k, draft_ratio_value=0.6)  # draft model
# A draft model as slow as the target, and a verify batch costing ~k: never pays, even when
# every draft token is accepted ((k + 1) / (1 + 1.28 k) < 1).
COSTLY = dict(verify_ratio_fn=lambda k: 1.0 + 0.28 * k, draft_ratio_value=1.0)


def _run(costs: dict, good, n_tokens: int, n_max: int = 16, **kw):
    """Runs a controller over `n_tokens` of text; returns [(position, k, accepted, cost)]."""
    cost = CostModel(**costs)
    c = DraftLengthController(n_max=n_max, cost=cost, **kw)
    steps, pos = [], 0
    while pos < n_tokens:
        k = c.choose()
        n = 0
        while n < k and good(pos + n):
            n += 1
        c.observe(k, n)
        steps.append((pos, k, n, cost.verify_ratio(k) + cost.draft_ratio * k if k else 1.0))
        pos += n + 1
    return c, steps


def _recovery(steps, start: int) -> int:
    """Tokens after `start` until drafting is back for good: the end of the last plain step."""
    plain = [p for p, k, _, _ in steps if p >= start and k == 0]
    return plain[-1] + 1 - start if plain else 0


def _overhead(steps, lo: int, hi: int) -> tuple[float, float]:
    """(fraction of steps that drafted, cost / tokens - 1) over the steps starting in [lo, hi)."""
    sel = [s for s in steps if lo <= s[0] < hi]
    tokens = sum(n + 1 for _, _, n, _ in sel)
    return (sum(1 for s in sel if s[1] > 0) / len(sel), sum(s[3] for s in sel) / tokens - 1.0)


@pytest.mark.parametrize("costs, bound", [(FREE, 40), (MODEL, 100)])
@pytest.mark.parametrize("bad", [300, 1000, 3000])
def test_recovers_soon_after_a_bad_stretch(costs, bound, bad):
    """All drafts rejected for `bad` tokens, then all accepted: drafting resumes within `bound`
    tokens (free drafter: a pause of at most 32 plain steps, then a probe)."""
    c, steps = _run(costs, lambda p: p >= bad, bad + 1000)
    assert _recovery(steps, bad) <= bound
    # and once back, it drafts long: the good text is almost all accepted draft tokens
    _, over = _overhead(steps, bad + bound + 20, bad + 1000)
    assert over < -0.5 if costs is FREE else over < -0.2


@pytest.mark.parametrize("costs, max_drafted, max_over", [(FREE, 0.05, 0.02), (MODEL, 0.05, 0.04)])
def test_bad_stretch_probes_are_rare(costs, max_drafted, max_over):
    """All drafts rejected: once paused, few steps draft (probes), and they cost little."""
    c, steps = _run(costs, lambda p: False, 3000)
    first_pause = next(p for p, k, _, _ in steps if k == 0)
    drafted, over = _overhead(steps, first_pause, 3000)
    assert drafted < max_drafted
    assert over < max_over


def test_mostly_bad_stretch_probes_are_rare():
    """A stretch where 1 token in 20 would be accepted: lucky probes must not keep drafting on."""
    rng = random.Random(5)
    luck = [rng.random() < 0.05 for _ in range(4000)]
    for costs, max_over in ((FREE, 0.02), (MODEL, 0.04)):
        c, steps = _run(costs, lambda p: luck[p], 3000)
        first_pause = next(p for p, k, _, _ in steps if k == 0)
        assert _overhead(steps, first_pause, 3000)[1] < max_over


def test_drafting_that_cannot_pay_by_cost_probes_rarely():
    """Every draft token would be accepted, but drafting costs more than it saves: the controller
    knows it from the costs alone and probes rarely (to re-measure them), not like bad drafts."""
    c, steps = _run(COSTLY, lambda p: True, 3000)
    drafted, over = _overhead(steps, 0, 3000)
    assert drafted < 0.01
    assert over < 0.01


def test_alternating_stretches():
    """Bad and good text alternate in stretches of 250-530 tokens: each good one is found soon."""
    edges = [0, 400, 777, 1190, 1450, 1980, 2230, 2700, 3001, 3500]
    good = lambda p: sum(1 for e in edges if e <= p) % 2 == 0
    for costs, bound in ((FREE, 40), (MODEL, 100)):
        c, steps = _run(costs, good, edges[-1])
        for start, end in zip(edges[1::2], edges[2::2]):
            assert _recovery([s for s in steps if s[0] < end], start) <= bound


def test_draft_model_pays_soon_after_a_bad_stretch():
    """A draft model (draft cost 0.6 of a step) whose tokens are accepted with probability 0.95
    after 1000 rejected ones: over the first 300 good tokens it is already ~1.2x plain decoding
    (steady state: 1.23x; the old doubling pause up to 128 steps gave 1.04x)."""
    speeds = []
    for seed in range(6):
        rng = random.Random(seed)
        acc = [rng.random() < 0.95 for _ in range(3000)]
        c, steps = _run(MODEL, lambda p: p >= 1000 and acc[p], 2000)
        speeds.append(1.0 / (1.0 + _overhead(steps, 1000, 1300)[1]))
    assert sum(speeds) / len(speeds) > 1.15


def test_observe_cost_feeds_only_the_cost_model():
    c = DraftLengthController(n_max=8)
    before = (c.alpha, c.position_alphas(), c.paused, c.n_pauses)
    for n in (1, 5, 9) * 3:
        c.observe_cost(n, 0.02 + 0.002 * n)
    assert (c.alpha, c.position_alphas(), c.paused, c.n_pauses) == before
    assert c.cost.decode_seconds == pytest.approx(0.022)


def test_a_first_probe_that_would_read_the_whole_prompt_waits_as_long_as_its_price_says():
    """A draft model evaluates the prompt before its first draft (drafters/lazy.py, model.py): a
    draft paused from the start (the rate below min_gain on the prior acceptance) probes after the
    usual short pause only when that costs nothing; with a 222-token prompt to read first, the
    probe waits until the steps it costs fit the probe budget, so a short answer never pays it."""
    def ctl(first_resume: int) -> DraftLengthController:
        return DraftLengthController(n_max=8, cost=CostModel(verify_ratio_fn=lambda k: 1.0 + 0.1 * k,
                                                             draft_ratio_value=0.5),
                                     resume_tokens=16, first_resume=first_resume)

    def first_probe(c: DraftLengthController) -> int:
        return next(i for i in range(5000) if c.choose() > 0)

    assert first_probe(ctl(0)) <= 9
    c = ctl(222)
    loss = c.probe_loss()   # C(4) + 4d - 1 + d * C(221): the prompt's evaluation priced in
    assert loss == pytest.approx(1.4 + 2.0 - 1.0 + 0.5 * (1.0 + 0.1 * 221))
    assert first_probe(c) >= (loss - 0.4) / c.probe_budget - 1
    c.observe(4, 4)   # it drafted: later probes read only the resume window again
    assert c.probe_loss() == pytest.approx(1.4 + 2.0 - 1.0 + 0.5 * (1.0 + 0.1 * 15))
