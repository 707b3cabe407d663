"""The cost side of the adaptive draft length: one-token steps timed apart from batches, a plain
step taken to time t(1) when drafting runs every step, a measured draft cost before the first
draft, a pause that takes the whole cap when drafting cannot pay, and the draft model's bounded
catch-up after a pause (lossless on real tiny models)."""

from __future__ import annotations

import numpy as np
import pytest

from llamaspec.runtime.context import Context, ContextConfig
from llamaspec.runtime.llama import Model
from llamaspec.speculative.controller import DraftLengthController
from llamaspec.speculative.costs import RECALIBRATE_STEPS, CostModel, marginal_charges, shared_step_ratios
from llamaspec.speculative.drafters.model import SYNC_WINDOW, ModelDrafter
from tests.engine_helpers import generate, prompt_tokens


def test_a_plain_step_is_timed_when_every_step_drafts():
    ctl = DraftLengthController(n_max=8)
    assert ctl.choose() > 0                      # nothing timed yet: draft from the prior
    ctl.observe(4, 4, verify_seconds=0.02)       # a batch was timed, t(1) never was
    assert ctl.choose() == 0                     # so one plain step, to time it
    ctl.observe(0, 0, verify_seconds=0.01)
    assert ctl.choose() > 0 and not ctl.cost.needs_decode_timing
    for _ in range(RECALIBRATE_STEPS):
        ctl.cost.observe_verify(5, 0.02)
    assert ctl.cost.needs_decode_timing          # and again after a long stretch of batches
    # fixed costs (seeded runs) never ask for it
    assert not CostModel(verify_ratio_fn=lambda k: 1.0).needs_decode_timing


def test_a_measured_draft_cost_stops_drafting_before_the_first_draft():
    """A draft token timed at load at 1.2 target steps cannot pay whatever its acceptance: the
    first choice is already a pause, and it lasts the whole cap (no short probes first)."""
    ctl = DraftLengthController(n_max=8, cost=CostModel(draft_ratio_prior=1.2))
    assert ctl.choose() == 0 and ctl.paused
    assert ctl._pause_left + 1 == ctl.pause_cap() >= ctl.max_pause
    free = DraftLengthController(n_max=8, cost=CostModel(draft_ratio_prior=0.0))
    assert free.choose() > 0


def test_cost_driven_pause_is_priced_by_the_probe_budget():
    expensive = DraftLengthController(n_max=8, cost=CostModel(draft_ratio_value=2.0), probe_budget=0.03)
    # a failed probe of 4 tokens costs about 4 * 2.0 + verify - 1 > 7 steps: >= 7 / 0.03 steps apart
    assert expensive.pause_cap() >= 7 / 0.03
    assert expensive.pause_cap() <= 8 * expensive.max_pause


def test_draft_catch_up_after_a_pause_is_bounded_and_positions_stay_consistent(tiny_models):
    """After a long stretch without drafting, the draft evaluates at most SYNC_WINDOW tokens (spliced
    after what its KV holds), and drafting, rejection rollback and the next catch-up keep working."""
    target = Model(tiny_models["target"])
    draft = Model(tiny_models["draft"])
    dctx = Context(draft, ContextConfig(n_ctx=512, n_threads=1))
    seen: list[int] = []
    dctx.add_decode_listener(lambda ctx, toks, pos, seq: seen.append(len(toks)))
    d = ModelDrafter(dctx)
    prompt = prompt_tokens(target, "The sea is wide and the sky is blue.")
    d.begin(0, prompt)
    assert seen == []                          # the prompt waits for the first draft
    history = prompt + [int(t) for t in np.random.default_rng(0).integers(5, target.n_vocab, 100)]
    first = d.propose(0, history, 4)
    # the prompt and the last SYNC_WINDOW tokens, in one batch; then one decode per draft token
    assert seen[0] == len(prompt) + SYNC_WINDOW and len(first) == 4
    assert dctx.seq_pos_max(0) + 1 == len(prompt) + SYNC_WINDOW + 3
    d.accepted(0, 1, first.tokens[:1] + [7])
    history += first.tokens[:1] + [7]           # 3 draft tokens rejected: rolled back next time
    seen.clear()
    second = d.propose(0, history, 3)
    assert seen[0] <= 3 and len(second) == 3
    history += [11] * 40
    assert len(d.propose(0, history, 2)) == 2   # a second splice
    d.end(0)
    d.close()
    target.close()
    draft.close()


@pytest.mark.parametrize("fixed", [True, False])
def test_draft_model_stays_lossless_with_pauses_and_catch_ups(tiny_models, fixed):
    target = Model(tiny_models["target"])
    prompt = prompt_tokens(target, "Once upon a time there was a lighthouse keeper who")
    plain = generate(target, "none", prompt, n=80)
    spec = generate(target, "draft", prompt, draft=tiny_models["draft"], n=80, adaptive=not fixed)
    assert spec.tokens == plain.tokens
    target.close()


# -- several sequences in one batch: each charged the marginal cost of its draft rows -------------

def test_docstring_examples():
    import doctest

    from llamaspec.speculative import costs

    assert doctest.testmod(costs).failed == 0


def _line(a: float, b: float):
    return lambda n: a + b * n


@pytest.mark.parametrize("n_seqs", [2, 4, 8])
def test_marginal_charges_price_draft_rows_by_the_curve_not_by_their_share(n_seqs):
    """One sequence drafts 8 among plain ones. On a flat curve (t(n) = 1 + 0.01 n) its extra
    rows cost almost nothing, whatever the number of slots; the rows' share priced them at 9
    plain rows. On a steep one (t(n) = n) the marginal is the rows themselves."""
    rows = [9] + [1] * (n_seqs - 1)
    flat = marginal_charges(rows, 0, 1.0, _line(1.0, 0.01))
    t0, t = 1.0 + 0.01 * n_seqs, 1.0 + 0.01 * (n_seqs + 8)
    assert flat[0] == pytest.approx((t0 / n_seqs + t - t0) / t)
    assert all(c == pytest.approx(t0 / n_seqs / t) for c in flat[1:])
    assert flat[0] / flat[1] < 1.0 + 0.1 * n_seqs          # rows' share: 9 every time
    steep = marginal_charges(rows, 0, 1.0, _line(0.0, 1.0))
    assert steep[0] / steep[1] == pytest.approx(9.0)
    # a prompt chunk in the batch is nobody's charge, and a sequence alone pays the whole step
    with_chunk = marginal_charges([3], 20, 2.0, _line(1.0, 0.1))
    assert with_chunk[0] == pytest.approx(2.0 * (3.1 / 21 + 3.3 - 3.1) / 3.3)
    assert marginal_charges([5], 0, 0.04, _line(1.0, 0.1)) == [pytest.approx(0.04)]


def test_a_drafting_sequence_among_plain_ones_keeps_drafting_on_a_flat_curve():
    """Timings a sequence's controller sees at --parallel 4 on a flat curve (a step of 4 rows or
    4 + 8 rows costs about the same), the first draft token of each draft accepted (2 tokens a
    step): charged the marginal cost (8 draft tokens: ~1.3 plain steps, 2 tokens: ~1.1) it drafts
    at nearly every step; charged its rows' share (9 / 12 of the step against 1 / 4: 8 draft
    tokens cost 3 plain steps, 2 tokens 2) it pauses and probes now and then."""
    def run(charge) -> int:
        ctl = DraftLengthController(n_max=8, cost=CostModel())
        drafted = 0
        for _ in range(60):
            k = ctl.choose()
            rows = [k + 1, 1, 1, 1]
            seconds = 0.01 * (1.0 + 0.01 * sum(rows))
            ctl.observe(k, min(k, 1), verify_seconds=charge(rows, seconds))
            drafted += k > 0
        return drafted

    curve = _line(1.0, 0.01)
    marginal = run(lambda rows, s: marginal_charges(rows, 0, s, curve)[0])
    share = run(lambda rows, s: s * rows[0] / sum(rows))
    assert marginal >= 55
    assert share <= 5


def test_cost_curve_as_a_function():
    cm = CostModel()
    for n, t in [(1, 0.010), (4, 0.020), (8, 0.030)] * 3:
        cm.observe_verify(n, t)
    curve = cm.batch_curve(8)
    assert curve(1) == 1.0 and curve(8) == pytest.approx(3.0) and curve(12) == curve(8)


@pytest.mark.parametrize("seed", range(20))
def test_one_verify_ratio_equals_the_whole_curves_point(seed):
    """verify_ratio(k) reads a few sizes, not 0..k (a first draft is priced with its prompt, up to
    32k tokens): it must equal verify_ratios(k)[k], the running maximum, on noisy curves (sizes
    timed out of order, a batch that looked cheaper than a smaller one) with and without a kept prior."""
    rng = np.random.default_rng(seed)
    prior = [(float(n), 1.0 + 0.3 * n * rng.uniform(0.5, 1.5), 4.0) for n in (2, 8, 64)] if seed % 2 else None
    cm = CostModel(prior=prior)
    for _ in range(int(rng.integers(0, 30))):
        n = int(rng.integers(1, 80))
        cm.observe_verify(n, 0.01 * (1 + 0.2 * n) * rng.uniform(0.6, 1.6))
    whole = cm.verify_ratios(300)
    for k in (0, 1, 2, 3, 7, 8, 9, 31, 64, 65, 100, 300):
        assert cm.verify_ratio(k) == pytest.approx(whole[k], rel=1e-12), k


# SmolLM2 F16 on 2 EPYC cores, 4 sequences at depth 400 in one unified cache: whole steps of n rows (ms)
SHARED_STEPS_MS = [(4, 25.6), (5, 26.8), (6, 29.4), (8, 37.3), (12, 47.2), (16, 59.7), (20, 72.6), (28, 97.6)]


def _shared_curve() -> CostModel:
    cm = CostModel()
    for n, ms in SHARED_STEPS_MS * 3:
        cm.observe_verify(n, ms / 1000)
    return cm


def test_under_load_a_draft_is_priced_against_a_share_of_the_step():
    """4 sequences share a step: a draft's rows cost what they add to the step (8 rows: 21.6 ms)
    against the sequence's share of a plain step (25.6 / 4 = 6.4 ms), 4.4 plain steps, where a
    lone sequence's prior prices them at ~2.3. A text drafter's middling guess (acceptance 0.6)
    then drafts 1 token (its own prior: 3), a copy that keeps matching (0.95) still drafts long."""
    ratios = shared_step_ratios(_shared_curve(), 4, 4)(8)
    assert ratios[0] == 1.0
    assert ratios[8] == pytest.approx(1 + (47.2 - 25.6) / 6.4, rel=0.02)
    assert CostModel().verify_ratio(8) < 2.5

    def choice(p: float, shared) -> int:
        cost = CostModel()
        cost.shared = shared
        ctl = DraftLengthController(n_max=16, cost=cost, prior_alpha=p, prior_weight=1e6)
        return ctl.choose()

    load = shared_step_ratios(_shared_curve(), 4, 4)
    assert choice(0.6, load) == 1 < choice(0.6, None)
    assert choice(0.3, load) == 0
    assert choice(0.95, load) >= 3 and choice(0.99, load) >= 8
    # a prompt chunk in the step moves the draft rows up the curve; what a token saves stays a share
    with_chunk = shared_step_ratios(_shared_curve(), 4, 4 + 16)(8)
    assert with_chunk[8] == pytest.approx(1 + (72.6 - 59.7 + 59.7 - 47.2) * 8 / 8 / 6.4, rel=0.05)


def test_sequences_sharing_a_step_are_priced_by_the_shared_curve_and_alone_by_their_own(smollm2_f16):
    """The engine's wiring: in a step of several sequences every controller's cost model prices by
    the engine's curve of shared steps (what shared_step_ratios gives for that step); a sequence
    alone goes back to its own measurements."""
    from llamaspec.speculative.options import SpecOptions, parse_spec_types
    from llamaspec.speculative.pipeline import load_pipeline
    from llamaspec.speculative.sampling_params import SamplingParams
    from llamaspec.speculative.sequence import SequenceRun

    greedy = SamplingParams(temperature=0.0)
    opts = SpecOptions(spec_types=parse_spec_types("prompt-lookup,suffix"), n_ctx=512, n_threads=1, n_seq=2)
    pipe = load_pipeline(smollm2_f16, opts, greedy)
    try:
        eng, config = pipe.engine, pipe.config(max_tokens=8, sampling=greedy)
        seqs = [SequenceRun(eng, i, prompt_tokens(pipe.target, text), config, None)
                for i, text in enumerate(["Name three colours.", "Count from one to five."])]
        for s in seqs:
            s.start()
        eng.step(seqs)
        expected = shared_step_ratios(eng._batch_cost, 2, 2)(6)
        for s in seqs:
            assert s.ctls and all(c.cost.shared is not None for c in s.ctls.values())
            assert all(c.cost.verify_ratios(6) == pytest.approx(expected) for c in s.ctls.values())
        eng.step(seqs[:1])
        assert all(c.cost.shared is None for c in seqs[0].ctls.values())
        for s in seqs:
            s.abandon()
    finally:
        pipe.close()


# -- a draft model that cannot pay: paused from the start, probes rarer and rarer -------------------

def test_a_same_size_draft_does_not_probe_within_a_story():
    """A draft token timed at load at 0.9 of a target step (SmolLM2 Q4_1 for its F16 on a CPU):
    no draft in a 256-token run, and a failed probe doubles the next pause (backoff)."""
    ctl = DraftLengthController(n_max=8, cost=CostModel(draft_ratio_prior=0.9), resume_tokens=SYNC_WINDOW)
    ks = [ctl.choose() for _ in range(256)]
    assert ks == [0] * 256
    first = ctl.pause_cap()
    assert first >= ctl.probe_loss() / ctl.cost_probe_budget - 1
    while (k := ctl.choose()) == 0:
        pass
    ctl.observe(k, 0)                              # the probe fails: the next pause is twice as long
    assert ctl._pause_left == 2 * first


def test_a_costly_drafters_failed_probe_waits_for_its_drafting_work():
    """A draft model that could pay (0.3 of a step a token, cheap verify) but drafts badly now:
    after a failed probe the pause is at least its drafting work over the probe budget, instead of
    8, 16, 32 steps; a free drafter keeps the short doubling pauses."""
    def after_failed_probe(d: float) -> int:
        cost = CostModel(verify_ratio_fn=lambda k: 1.0 + 0.05 * k, draft_ratio_value=d)
        ctl = DraftLengthController(n_max=8, cost=cost, resume_tokens=SYNC_WINDOW if d else 0)
        while not ctl.paused:                      # bad drafts: the acceptance window pauses it
            ctl.observe(ctl.choose(), 0)
        first = ctl._pause_left
        while (k := ctl.choose()) == 0:
            pass
        ctl.observe(k, 0)                          # the probe fails
        assert first <= ctl.pause
        return ctl._pause_left

    assert after_failed_probe(0.3) >= 0.3 * (4 + 1.75) / 0.03
    assert after_failed_probe(0.0) <= 16
