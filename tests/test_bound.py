"""The copy-drafting bound (llamaspec/bench/bound.py): the algorithm on hand-made token lists and
hand-made cost curves, and the verify-cost curve measured in real llama.cpp on tiny GGUFs (a llama
target, and a recurrent one whose memory cannot drop a tail). Speed is never asserted."""

from __future__ import annotations

import doctest

import pytest

from llamaspec.bench import bound as bound_mod
from llamaspec.bench.bound import BATCH_SIZES, MAX_DRAFT, bound_for, copy_bound, interpolate, measure_curve

# SmolLM2 F16, 2 threads, a 2-core EPYC (MEASURED.md, 2026-12-03)
CURVE = {1: 1.0, 2: 1.90, 4: 2.27, 8: 3.36, 16: 5.07, 32: 8.88, 64: 15.15}


def test_the_docstring_example_holds():
    assert doctest.testmod(bound_mod, raise_on_error=False).failed == 0
    b = copy_bound([1, 2, 3, 4, 5, 1, 2], [3, 4, 5, 9, 1, 2, 3], {1: 1.0, 2: 1.5, 4: 2.0, 8: 3.0})
    assert (b.steps, b.copied, b.longest, b.tokens) == (4, 3, 3, 7)
    assert b.cost == pytest.approx(5.0) and b.speedup == pytest.approx(1.4)


def test_interpolate_between_and_beyond_the_points():
    assert interpolate(CURVE, 1) == 1.0 and interpolate(CURVE, 64) == 15.15
    assert interpolate(CURVE, 3) == pytest.approx((1.90 + 2.27) / 2)
    assert interpolate(CURVE, 48) == pytest.approx((8.88 + 15.15) / 2)
    assert interpolate(CURVE, 96) == pytest.approx(15.15 + (15.15 - 8.88))   # the last segment, extended
    assert interpolate({1: 2.0}, 10) == 2.0
    with pytest.raises(ValueError):
        interpolate({}, 1)


@pytest.mark.parametrize("curve", [CURVE, {1: 2.0, 2: 3.8, 64: 30.0}])
def test_nothing_to_copy_is_one_token_steps_and_exactly_1x(curve):
    # every 2-token end of the text is new: the oracle never drafts, every step costs t(1)
    b = copy_bound(list(range(100, 150)), list(range(200, 300)), curve)
    assert (b.steps, b.copied, b.longest) == (100, 0, 0)
    assert b.speedup == pytest.approx(1.0) and b.cost == pytest.approx(100.0)   # costs are in units of t(1)


def test_a_fully_repeated_text_is_capped_by_the_63_token_limit():
    body = list(range(1000, 1200))              # 200 distinct tokens
    context = [1, 2] + body + [1, 2]            # the text's end (1 2) occurs before the body
    b = copy_bound(context, body, CURVE)
    # 64 + 64 + 64 tokens (63 copied + the target's own each time), then 8 (7 copied: the output ends)
    assert (b.steps, b.copied, b.longest) == (4, 3 * 63 + 7, MAX_DRAFT)
    assert b.cost == pytest.approx(3 * 15.15 + 3.36)
    assert b.speedup == pytest.approx(200 / (3 * 15.15 + 3.36))             # 4.10x on this machine
    # with free batches the bound is large and only the 63-token limit holds it: 200 tokens in 4 steps
    free = copy_bound(context, body, {1: 1.0, 64: 1.0})
    assert free.steps == 4 and free.speedup == pytest.approx(50.0)
    assert copy_bound(context, body, {1: 1.0, 256: 1.0}, max_draft=255).speedup == pytest.approx(200.0)


def test_the_longest_copy_wins():
    #          (7 8) then 1 2 | (7 8) then 1 2 3 4 5 | end (7 8)
    context = [7, 8, 1, 2, 9, 7, 8, 1, 2, 3, 4, 5, 9, 7, 8]
    b = copy_bound(context, [1, 2, 3, 4, 5, 6], CURVE)
    assert (b.steps, b.copied) == (1, 5)        # the second place: 5 tokens, then the target's 6
    assert b.speedup == pytest.approx(6 / interpolate(CURVE, 6))


def test_the_output_so_far_is_a_place_to_copy_from():
    out = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 6]
    b = copy_bound([9], out, CURVE)
    # 1 2 3 4 5 1 2 one token each (no 2-token end repeats yet), then 1 2 repeats: 3 4 5 copied + 6
    assert (b.steps, b.copied) == (8, 3)
    assert b.cost == pytest.approx(7 + CURVE[4])


def test_the_match_is_two_tokens():
    context, out = [5, 1, 2, 3], [6, 1, 2, 3, 4]
    two = copy_bound(context, out, CURVE)
    assert (two.steps, two.copied) == (4, 1)    # "1" alone after 6 is no match; "1 2" is: 3, then 4
    one = copy_bound(context, out, CURVE, match=1)
    assert (one.steps, one.copied) == (3, 2)    # with a 1-token key, "1" already copies 2 3


def test_a_callable_cost_and_bad_costs():
    b = copy_bound([1, 2, 3, 1, 2], [3, 4], lambda n: 2.0 * n)
    assert b.copied == 1 and b.cost == pytest.approx(2.0) and b.curve == {}
    assert copy_bound([1], [], CURVE).speedup == 1.0
    with pytest.raises(ValueError):
        copy_bound([1], [2], {1: 0.0, 2: 1.0})


# ---- the curve, measured in real llama.cpp -----------------------------------------------------------


def _check_curve(curve: dict[int, float], t1: float) -> None:
    assert list(curve) == list(BATCH_SIZES)
    assert curve[1] == 1.0 and t1 > 0
    assert all(v > 0 for v in curve.values())


def test_measure_curve_on_the_loaded_tiny_target(tiny_models):
    from llamaspec.runtime.llama import Model

    m = Model(tiny_models["target"])
    try:
        prompt = m.tokenize("def fibonacci(n):\n    if n < 2:\n        return n\n")
        curve, t1 = measure_curve(m, prompt, threads=1, reps=2)
        _check_curve(curve, t1)
        # a short prompt is repeated to fill the largest batch; the bound uses the curve measured now
        b = bound_for(m, prompt[:3], prompt * 2, threads=1, reps=1)
        assert b.depth == 3 and b.t1_ms > 0 and list(b.curve) == list(BATCH_SIZES)
        assert b.tokens == 2 * len(prompt) and b.copied > 0 and b.speedup > 0
    finally:
        m.close()


def test_measure_curve_on_a_recurrent_target_rolls_back_by_checkpoint(test_models_dir):
    # a Mamba state cannot drop the measured batch (seq_rm fails): the curve restores a checkpoint
    from llamaspec.runtime.llama import Model
    from llamaspec.testing.tiny_recurrent import GENERATOR_VERSION, make_recurrent_set

    models = make_recurrent_set(test_models_dir / f"recurrent-v{GENERATOR_VERSION}")
    m = Model(models["target"])
    try:
        assert m.needs_checkpoints
        curve, t1 = measure_curve(m, m.tokenize("The quick brown fox jumps over the lazy dog."), threads=1, reps=1)
        _check_curve(curve, t1)
    finally:
        m.close()
