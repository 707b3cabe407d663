"""A target's verify curve, measured by one run, prices the next run's first drafts (issue 33: on a
steep curve a first 5-token copy that failed cost 2.5 of a 32-token answer's steps)."""

from __future__ import annotations

from llamaspec.generator import Generator
from llamaspec.speculative.costs import CostModel
from llamaspec.speculative.match_controller import RiskBudget
from llamaspec.tune import draft_costs

STEEP = [1.0, 1.79, 2.38, 2.96, 3.3, 3.5, 3.9, 4.4, 4.87]   # Qwen2.5-Coder-1.5B Q4_K_M, 2 cores


def test_the_prior_curve_holds_until_a_batch_is_timed():
    cold, primed = CostModel(), CostModel(verify_prior=STEEP)
    assert cold.verify_ratios(5)[5] < 2.0            # the generic line: a failed 5-token draft looks cheap
    assert primed.verify_ratios(5) == STEEP[:6]
    assert primed.verify_ratios(12)[12] > STEEP[-1]   # past its end along its last step
    # the loss budget's first draft under each: the steep curve allows one token, the line five
    assert RiskBudget().longest(primed.verify_ratios(8), 0.0, 8) == 1
    assert RiskBudget().longest(cold.verify_ratios(8), 0.0, 8) >= 4
    for _ in range(3):
        primed.observe_verify(1, 0.030)
    assert primed.verify_ratios(5) == STEEP[:6]        # one-token steps alone say nothing of batches
    primed.observe_verify(6, 0.045)
    assert primed.verify_ratios(5)[5] < 2.0           # its own batch now: measurements take over


def test_a_run_stores_its_curve_and_the_next_run_starts_from_it(smollm2_q4, monkeypatch):
    target = smollm2_q4
    monkeypatch.setattr(draft_costs, "MIN_BATCHES", 1)   # (SmolLM2-135M copies little in 96 tokens)
    # a copy asked for: prompt-lookup drafts it, batches of 2+ tokens timed
    kw = dict(spec_type="prompt-lookup", threads=1, temperature=0.0, max_tokens=96)
    prompt = ("Repeat this text exactly, twice: def area(width, height):\n    return width * height\n\n"
              "def perimeter(width, height):\n    return 2 * (width + height)\n")
    with Generator(target, **kw) as gen:
        assert gen.pipeline.engine.verify_prior is None
        gen.generate(prompt)
        timed = max(c.cost.batches_timed for c in gen.pipeline.engine.last_controllers.values())
    assert timed >= draft_costs.MIN_BATCHES, "the prompt must make the drafter draft"
    curve = draft_costs.verify_curve(target, 1)
    assert curve is not None and len(curve) == draft_costs.CURVE_K + 1 and curve[0] == 1.0
    assert draft_costs.verify_curve(target, 2) is None   # another thread count: another curve
    with Generator(target, **kw) as gen:
        assert gen.pipeline.engine.verify_prior == curve
        out = gen.generate(prompt)
        assert out.tokens
        ctl = next(iter(gen.pipeline.engine.last_controllers.values()))
        assert ctl.cost.verify_prior == curve
