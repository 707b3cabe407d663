"""The theoretical speedup (bench/theory.py) on hand-worked examples, and the terminal bar chart
(cli/_charts.py) on hand-drawn ones. Pure functions: no model."""

from __future__ import annotations

import pytest
from rich.text import Text

from llamaspec.cli._charts import Bar, bar_text, speedup_chart
from llamaspec.bench import theory as th


def test_acceptance_by_position_is_conditional_on_reaching_the_position():
    # 4 drafts reached positions 0 and 1, 2 reached position 2, none position 3
    assert th.acceptance_by_position([4, 4, 2, 0], [3, 2, 1, 0]) == [0.75, 0.5, 0.5]
    assert th.acceptance_by_position([], []) == []


def test_standard_formula_by_hand():
    alpha = [0.8, 0.5]
    assert th.expected_tokens(alpha, 0) == 1.0
    assert th.expected_tokens(alpha, 1) == pytest.approx(1.8)
    assert th.expected_tokens(alpha, 2) == pytest.approx(2.3)
    assert th.expected_tokens(alpha, 5) == pytest.approx(2.3)  # unmeasured positions count 0
    # k=2, a draft token costs 0.1 plain steps, each extra verified token 0.05:
    # C = 0.1*2 + (1 + 0.05*2) = 1.3; S = 2.3 / 1.3
    assert th.step_cost(2, 0.1, 0.05) == pytest.approx(1.3)
    assert th.speedup(alpha, 2, 0.1, 0.05) == pytest.approx(2.3 / 1.3)


def test_for_run_by_hand():
    """10 steps, each with a 4-token draft; the plain step costs 10 ms (all of it in the verify batch).
    Drafting took 2 ms per step (0.5 ms per token: c_draft = 0.05); verify took 14 ms per step, so
    b = (0.14 - 10 * 0.010) / 40 = 1 ms per extra token (slope 0.1).
    E = (10 + 20) / 10 = 3; C = 0.05 * 4 + 1 + 0.1 * 4 = 1.6; S = 1.875."""
    t = th.for_run(steps=10, drafted=40, accepted=20, drafted_per_position=[10, 10, 10, 10],
                   accepted_per_position=[8, 6, 4, 2], draft_seconds=0.020, verify_seconds=0.140,
                   plain_step_seconds=0.010)
    assert t.tokens_per_step == pytest.approx(3.0)
    assert t.mean_draft_length == pytest.approx(4.0)
    assert t.draft_cost == pytest.approx(0.05)
    assert t.verify_slope == pytest.approx(0.1)
    assert t.step_cost == pytest.approx(1.6)
    assert t.speedup == pytest.approx(1.875)
    # every draft was 4 long, so the run's mix is the formula at k=4
    assert t.speedup == pytest.approx(th.speedup([0.8, 0.6, 0.4, 0.2], 4, 0.05, 0.1))
    # S(1..4) = 1.8/1.15, 2.4/1.3, 2.8/1.45, 3.0/1.6: k=3 is best
    assert t.best_k == 3 and t.best_k_speedup == pytest.approx(2.8 / 1.45)


def test_for_run_with_overhead_in_the_plain_step():
    """The plain step costs 12 ms of which 10 ms is its one-token batch: costs are in 12 ms units,
    the verify slope is measured against the 10 ms batch. b = (0.14 - 0.10) / 40 = 1 ms -> 1/12."""
    t = th.for_run(steps=10, drafted=40, accepted=20, drafted_per_position=[10] * 4,
                   accepted_per_position=[8, 6, 4, 2], draft_seconds=0.024, verify_seconds=0.140,
                   plain_step_seconds=0.012, plain_verify_seconds=0.010)
    assert t.verify_slope == pytest.approx(1 / 12)
    assert t.draft_cost == pytest.approx(0.05)
    assert t.speedup == pytest.approx(3.0 / (0.2 + 1 + 4 / 12))


def test_for_run_without_drafts_and_without_a_baseline():
    t = th.for_run(steps=10, drafted=0, accepted=0, drafted_per_position=[], accepted_per_position=[],
                   draft_seconds=0.001, verify_seconds=0.1, plain_step_seconds=0.010)
    assert t.tokens_per_step == 1.0 and t.draft_cost is None and t.best_k is None
    assert t.speedup == pytest.approx(1 / 1.01)  # lookups that found nothing cost 1% of a step
    assert th.for_run(steps=10, drafted=0, accepted=0, drafted_per_position=[], accepted_per_position=[],
                      draft_seconds=0, verify_seconds=0.1, plain_step_seconds=0.0) is None
    # a verify batch measured cheaper than a plain step (noise) is not a negative cost
    t = th.for_run(steps=2, drafted=4, accepted=4, drafted_per_position=[2, 2], accepted_per_position=[2, 2],
                   draft_seconds=0.0, verify_seconds=0.015, plain_step_seconds=0.010)
    assert t.verify_slope == 0.0 and t.speedup == pytest.approx(3.0)


def test_median_theory():
    def make(s, k, sk):
        return th.Theory(speedup=s, tokens_per_step=2.0, mean_draft_length=3.0, draft_cost=None,
                         verify_slope=0.1, step_cost=1.3, best_k=k, best_k_speedup=sk, of_theory=s / 2)

    m = th.median_theory([make(1.0, 2, 1.5), None, make(3.0, 5, 2.5), make(2.0, 4, 2.0)])
    assert m.speedup == 2.0 and m.of_theory == 1.0 and m.draft_cost is None
    assert (m.best_k, m.best_k_speedup) == (4, 2.0)
    assert th.median_theory([None]) is None


# ---- the terminal chart ---------------------------------------------------------------------------


def test_chart_by_hand():
    # scale 0..2.0 over 20 cells: 2.0x fills them, 0.5x is 5 cells, 1.0x is marked at cell 10
    text = speedup_chart([(None, [Bar("a", 2.0), Bar("b", 0.5)])], width=20).plain
    assert text == ("a ████████████████████  2.00x\n"
                    "b █████     │           0.50x\n")


def test_bar_styles_show_where_one_x_is():
    bar = bar_text(1.5, 2.0, 10)                  # 7.5 cells; 1.0x at cell 5
    assert bar.plain == "███████▌"
    dim, green = bar.spans
    assert (dim.start, dim.end, dim.style) == (0, 5, "grey50")
    assert (green.start, green.end, green.style) == (5, 8, "green")
    slow = bar_text(0.25, 1.0, 8)                 # 2 cells, red; 1.0x is the end of the scale: marked past it
    assert slow.plain == "██      │" and slow.spans[0].style == "red"


def test_chart_groups_share_one_scale_and_flag_differing_tokens():
    chart = speedup_chart([("code", [Bar("ngram", 3.0, True), Bar("wrong", 1.5, False)]),
                           ("story", [Bar("ngram", 1.0, True), Bar("never", None)])], width=12)
    lines = chart.plain.splitlines()
    assert lines[0] == "code" and lines[3] == "" and lines[4] == "story"
    assert lines[1] == "  ngram ████████████  3.00x"
    assert lines[2] == "  wrong ██████        1.50x ! tokens differ"
    assert lines[5] == "  ngram ████          1.00x"
    assert lines[6] == "  never -"
    assert isinstance(chart, Text)
