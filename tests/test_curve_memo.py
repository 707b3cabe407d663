"""The target's verify curve kept between runs (speculative/curve_memo.py): a run's controllers
price their first drafts by what this model's batches cost here before, not by a prior line."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import pytest

from llamaspec.speculative import costs, curve_memo
from llamaspec.speculative.costs import CostModel
from llamaspec.speculative.match_controller import MatchController
from llamaspec.speculative.controller import DraftLengthController

# Qwen2.5-Coder-1.5B Q4_K_M on a 2-core EPYC (scripts/replay_drafters.py --measure): t(n)/t(1)
QWEN = ((2, 1.86), (4, 3.22), (8, 7.0), (16, 8.38), (32, 14.48))


def test_doctests():
    assert doctest.testmod(curve_memo).failed == 0


def _controller(cost: CostModel) -> MatchController:
    return MatchController(lambda c, a: DraftLengthController(n_min=1, n_max=16, cost=c, prior_alpha=a), cost)


def test_a_kept_curve_prices_sizes_not_yet_timed_and_gives_way_to_timings():
    cold, kept = CostModel(), CostModel(prior=QWEN)
    assert cold.verify_ratio(1) < 1.5                        # the prior line: a 2-token batch ~1.4 steps
    assert kept.verify_ratio(1) == pytest.approx(1.86)
    assert kept.verify_ratio(7) == pytest.approx(7.0)
    assert kept.verify_ratio(5) == pytest.approx(3.22 + (7.0 - 3.22) * 2 / 4)   # between 4 and 8
    for _ in range(3):                                      # this run times one-token steps and 2-token batches
        kept.observe_verify(1, 0.030)
        kept.observe_verify(2, 0.045)
    assert kept.verify_ratio(1) == pytest.approx(1.5)       # its own timing replaces the kept 1.86
    assert kept.verify_ratio(7) == pytest.approx(7.0)       # sizes it has not timed keep the kept price
    assert kept.measured_curve() == ((2.0, 1.5, 3.0),)        # (n, t(n)/t(1), timings)


def test_the_first_draft_of_a_weak_match_is_declined_on_a_dear_curve():
    """The story case (issue 33): a 2-token match of a prose prompt, the continuation priors. On
    the cold line a draft looks worth it; on the 1.5B's own curve it is not."""
    assert _controller(CostModel()).choose(2) > 0
    assert _controller(CostModel(prior=QWEN)).choose(2) == 0


def test_merge_keeps_the_old_points_of_sizes_not_measured_again_and_weighs_the_others():
    got = curve_memo.merge(QWEN, ((2.0, 1.7, 1.0), (12.0, 8.0, 3.0), (64.0, 24.0, 2.0)))
    assert [costs.size_bucket(round(n)) for n, _, _ in got] == [0, 1, 2, 3, 4, 5]  # one point per bucket
    assert got[0][1] == pytest.approx((1.86 + 1.7) / 2)        # a kept point without a count weighs 1
    assert got[1:3] == ((4.0, 3.22, 1.0), (8.0, 7.0, 1.0))    # sizes not timed again: kept
    assert got[3] == pytest.approx((13.0, 8.095, 4.0))        # 9-16: (16, 8.38) once and (12, 8.0) thrice
    assert got[5] == (64.0, 24.0, 2.0)                         # a size only the new run timed
    # a point kept over many runs counts for at most WEIGHT_CAP timings: a changed machine is followed
    old = ((8.0, 7.0, 1000.0),)
    assert curve_memo.merge(old, ((8.0, 3.0, 16.0),))[0][1] == pytest.approx(5.0)


def test_a_damaged_entry_is_a_cold_start(tmp_path, monkeypatch, smollm2_f16):
    monkeypatch.setenv(curve_memo.ENV, str(tmp_path))
    k = curve_memo.key(smollm2_f16, 2, 0)
    (tmp_path / f"{k}.pkl").write_bytes(b"not a pickle")
    assert curve_memo.load(k) is None
    curve_memo.save(k, ((2.0, 1.5, 4.0),))
    assert curve_memo.load(k) == ((2.0, 1.5, 4.0),)
    assert curve_memo.key(smollm2_f16, 4, 0) != k            # other threads: another curve
    assert curve_memo.key(tmp_path / "missing.gguf", 2, 0) is None


def test_a_second_run_starts_from_the_curve_the_first_measured(run_cli, smollm2_f16, tmp_path, monkeypatch):
    """`run` as users run it (the default chain, -t 2), twice: the first leaves the curve its verify
    batches measured, the second's controllers start from it."""
    monkeypatch.setenv(curve_memo.ENV, str(tmp_path / "curves"))
    priors: list[tuple] = []
    real_init = CostModel.__init__

    def spy(self, *a, **kw):
        real_init(self, *a, **kw)
        priors.append(self.prior)

    monkeypatch.setattr(CostModel, "__init__", spy)
    edit = json.loads((Path(__file__).parents[1] / "scripts" / "code_edits.jsonl").read_text().splitlines()[1])
    first = run_cli("run", smollm2_f16, "-p", edit["prompt"], "-n", "64", "--temp", "0", "-t", "2", "--json")
    assert first.exit_code == 0, first.stderr
    assert json.loads(first.stdout)["drafted"] > 0
    assert priors and all(p == () for p in priors)          # nothing kept yet: the prior line
    kept = curve_memo.load(curve_memo.key(smollm2_f16, 2, 0))
    assert kept and all(n >= 2 and r >= 1.0 and w >= 1 for n, r, w in kept)
    priors.clear()
    second = run_cli("run", smollm2_f16, "-p", edit["prompt"], "-n", "64", "--temp", "0", "-t", "2", "--json")
    assert second.exit_code == 0, second.stderr
    assert json.loads(second.stdout)["text"] == json.loads(first.stdout)["text"]
    assert kept in priors                                    # the controllers' cost models start from it
