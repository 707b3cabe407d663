"""The tuning search on made-up timings: what it tries, what it rejects, what it chooses."""

from __future__ import annotations

import pytest

from llamaspec.errors import UsageError
from llamaspec.bench import RepResult
from llamaspec.speculative.options import SPEC_TYPES, needs_draft_model
from llamaspec.tune.measure import Round, agreeing, pair_ratio, round_size
from llamaspec.tune.sweep import (Candidate, Plan, Score, applicable_types, chain_candidates, coarse_candidates,
                                  combine, neighbours, run_sweep)

PLAIN_TOKENS = list(range(20))


def fake_runner(speed, differ=(), broken=(), calls=None):
    """speed(candidate) -> tok/s ratio over plain (plain runs at 100 tok/s); labels in `differ`
    produce other tokens; spec types in `broken` raise like a draft that cannot serve them."""

    def run(c, i):
        if calls is not None:
            calls.append((c.label if c else "plain", i))
        if c is None:
            return RepResult("plain", 20, 100.0, 0.2, tokens=list(PLAIN_TOKENS))
        if any(t in broken for t in c.spec.split(",")):
            raise UsageError(f"{c.spec} cannot run here")
        tokens = list(PLAIN_TOKENS) if c.label not in differ else PLAIN_TOKENS[:5] + [99] * 15
        return RepResult(c.label, 20, 100.0 * speed(c), 0.2, drafted=10, accepted=5, tokens=tokens)

    return run


def test_applicable_types_come_from_the_table():
    ngram, model = applicable_types(has_draft=True, has_mtp=False)
    assert all(SPEC_TYPES[t].implemented and not SPEC_TYPES[t].needs_draft_model for t in ngram)
    assert model and all(needs_draft_model(t) for t in model)
    assert applicable_types(has_draft=False, has_mtp=False)[1] == []
    assert "draft-mtp" in applicable_types(has_draft=False, has_mtp=True)[1]
    specs = [c.spec for c in coarse_candidates(has_draft=True, has_mtp=False)]
    assert "draft-simple" in specs and "ngram-mod" in specs and not any("," in s for s in specs)
    assert not any(needs_draft_model(s) for s in (c.spec for c in coarse_candidates(False, False)))


def test_chains_are_the_best_ngram_types_with_each_model_type_that_ran():
    def sc(spec, ratio, accepted=3, rejected=None):
        return Score(Candidate(spec), ratios=[[ratio]], accepted=accepted, rejected=rejected)

    coarse = Round("coarse", [sc("draft-simple", 1.5), sc("draft-eagle3", 0, rejected="cannot run: x"),
                              sc("ngram-simple", 1.1), sc("ngram-mod", 1.3), sc("ngram-cache", 1.2),
                              sc("ngram-map-k", 2.0, accepted=0)])   # never accepted a draft: noise
    assert [c.spec for c in chain_candidates(coarse, 2)] == ["ngram-mod,draft-simple", "ngram-cache,draft-simple"]


def test_neighbours_change_one_setting_each():
    ns = neighbours(Candidate("ngram-mod,draft-simple"))
    assert {n.spec for n in ns} == {"ngram-mod,draft-simple"}
    assert {n.draft_max for n in ns} >= {4, 16}               # draft-simple's default 8, halved and doubled
    assert {n.draft_p_min for n in ns} >= {0.5}                # a drafting model: p-min
    assert {dict(n.ngram).get("mod_n_match") for n in ns} >= {3, 12}
    for n in ns:
        changed = (n.draft_max is not None) + bool(n.draft_p_min) + len(n.ngram)
        assert changed == 1
    assert all(not n.draft_p_min for n in neighbours(Candidate("ngram-simple")))


def test_fastest_identical_candidate_is_chosen_and_stored_settings_follow_it():
    speed = lambda c: 2.0 if c.spec == "ngram-mod" and c.draft_max == 64 else 1.5 if c.spec == "ngram-mod" else 0.9
    res = run_sweep(fake_runner(speed), 2, has_draft=False, has_mtp=False)
    assert [r.name for r in res.rounds] == ["coarse", "fine", "confirm"]
    assert res.chosen is not None and res.chosen.candidate == Candidate("ngram-mod", draft_max=64)
    cfg = res.config()
    assert (cfg.spec_type, cfg.draft_max, cfg.ngram) == ("ngram-mod", 64, {})
    assert cfg.ratio == pytest.approx(2.0)


def test_a_candidate_whose_tokens_differ_is_never_chosen():
    speed = lambda c: 3.0 if c.spec == "ngram-simple" else 1.4 if c.spec == "ngram-mod" else 0.8
    res = run_sweep(fake_runner(speed, differ={"ngram-simple"}), 1, has_draft=False, has_mtp=False,
                    plan=Plan(quick=True))
    assert res.chosen.candidate.spec == "ngram-mod"
    bad = [s for s in res.rejected if s.candidate.label == "ngram-simple"]
    assert bad and "differ from plain" in bad[0].rejected


def test_plain_wins_unless_beaten_by_the_margin():
    res = run_sweep(fake_runner(lambda c: 1.03), 1, has_draft=False, has_mtp=False, plan=Plan(quick=True))
    assert res.chosen is None and res.best is not None and res.config().spec_type == "none"
    res = run_sweep(fake_runner(lambda c: 1.03), 1, has_draft=False, has_mtp=False, plan=Plan(quick=True, margin=0.01))
    assert res.chosen is not None


def test_a_type_that_cannot_run_is_dropped_with_its_chains():
    calls: list = []
    res = run_sweep(fake_runner(lambda c: 1.2, broken={"draft-simple"}, calls=calls), 1, has_draft=True,
                    has_mtp=False, plan=Plan(quick=True))
    tried = [label for label, _ in calls if "draft-simple" in label.split(" ")[0].split(",")]
    assert tried == ["draft-simple"]   # it failed once; no chain with it was made
    assert "draft-simple" in {s.candidate.spec for s in res.rejected}
    assert res.chosen is not None and "draft-simple" not in res.chosen.candidate.spec


def test_every_candidate_run_stands_between_two_plain_runs_on_its_prompt():
    calls: list = []
    res = run_sweep(fake_runner(lambda c: 1.2, calls=calls), 2, has_draft=True, has_mtp=False,
                    plan=Plan(quick=True))
    assert [r.name for r in res.rounds] == ["coarse", "chains", "confirm"]   # quick: no fine round
    for k, (label, i) in enumerate(calls):
        if label != "plain":
            assert calls[k - 1] == ("plain", i) and calls[k + 1] == ("plain", i)
    assert len(res.rounds[-1].scores[0].ratios) == 1     # quick: one confirming pass
    full = run_sweep(fake_runner(lambda c: 1.2), 2, has_draft=False, has_mtp=False, plan=Plan())
    assert len(full.rounds[-1].scores[0].ratios) == 2


def test_pair_ratio_is_over_the_faster_neighbour():
    assert pair_ratio(150, 100, 100) == pytest.approx(1.5)
    assert pair_ratio(150, 20, 100) == pytest.approx(1.5)     # a plain run slowed by other work
    assert pair_ratio(150, 100, 30) == pytest.approx(1.5)
    assert pair_ratio(150, 0, 0) is None


def slowed_runner(speed, slow_runs, factor=8.0, calls=None):
    """plain at 100 tok/s and candidates at speed(c) * 100, except the runs numbered in slow_runs
    (counting every run from 0), slowed by `factor` as a busy machine does."""
    n = [0]

    def run(c, i):
        k, n[0] = n[0], n[0] + 1
        tps = (100.0 if c is None else 100.0 * speed(c)) / (factor if k in slow_runs else 1.0)
        if calls is not None:
            calls.append(c.label if c else "plain")
        if c is None:
            return RepResult("plain", 20, tps, 0.2, tokens=list(PLAIN_TOKENS))
        return RepResult(c.label, 20, tps, 0.2, drafted=10, accepted=5, tokens=list(PLAIN_TOKENS))

    return run


def test_a_slowed_plain_run_does_not_make_a_candidate_win():
    """Every plain run that opens a prompt is slowed 8x: against that one plain run (the old way)
    the first candidates read 8x faster; paired with the plain run after them, they are at 1.0x."""
    calls: list = []
    slow = set(range(0, 400, 15))
    res = run_sweep(slowed_runner(lambda c: 1.0, slow, calls=calls), 2, has_draft=False, has_mtp=False,
                    plan=Plan(quick=True))
    assert calls[0] == "plain"
    assert res.chosen is None and res.unstable is None and res.config().spec_type == "none"


def test_agreeing_passes():
    assert agreeing([1.2, 1.3], 1.5) == [1.2, 1.3]
    assert agreeing([0.37, 2.07], 1.5) is None           # the confirm passes
    assert agreeing([0.37, 2.07, 1.9], 1.5) == [1.9, 2.07]   # two of three agree: a majority
    assert agreeing([0.5, 1.0, 2.0, 4.0], 1.5) is None
    assert agreeing([1.1], 1.5) == [1.1]
    assert agreeing([], 1.5) == [] and agreeing([0.0], 1.5) is None


def test_passes_that_disagree_are_measured_again_then_not_chosen():
    told: list[str] = []
    readings = iter([2.0, 0.4, 1.0, 3.5, 0.6])

    def speed(c):   # ngram-mod never reads the same twice (the 0.37x and 2.07x); the rest never help
        return next(readings) if c.spec == "ngram-mod" else 0.9

    res = run_sweep(fake_runner(speed), 1, has_draft=False, has_mtp=False, plan=Plan(quick=True, retries=2),
                    on_unsteady=told.append)
    assert res.unstable and "ngram-mod" in res.unstable and "apart" in res.unstable
    assert res.chosen is None and len(told) == 2 and "measuring the finalists again" in told[0]
    assert res.best is not None   # the table still shows what was measured
    confirm = res.rounds[-1]
    assert confirm.name == "confirm" and len(confirm.scores[0].ratios) == 3   # 1 pass + 2 again


def test_one_outlier_pass_is_outvoted_after_measuring_again():
    seen = {"n": 0}

    def speed(c):   # ngram-mod: 4x in the coarse round (a lucky run), then 1.5x every time
        if c.spec != "ngram-mod":
            return 0.9
        seen["n"] += 1
        return 4.0 if seen["n"] == 1 else 1.5

    told: list[str] = []
    res = run_sweep(fake_runner(speed), 1, has_draft=False, has_mtp=False, plan=Plan(quick=True),
                    on_unsteady=told.append)
    assert len(told) == 1 and res.unstable is None
    assert res.chosen.candidate.spec == "ngram-mod" and res.chosen.score == pytest.approx(1.5)


def test_an_outlier_confirm_pass_does_not_sink_the_majority():
    readings = iter([1.5, 0.3, 1.6])   # coarse, confirm (slowed), confirm again

    def speed(c):
        return next(readings) if c.spec == "ngram-mod" else 0.9

    res = run_sweep(fake_runner(speed), 1, has_draft=False, has_mtp=False, plan=Plan(quick=True))
    assert res.unstable is None and res.chosen.candidate.spec == "ngram-mod"
    assert res.chosen.score == pytest.approx(1.6) and res.chosen.passes == pytest.approx([0.3, 1.6])


def test_progress_ticks_count_down_to_the_end_of_each_round():
    ticks: list = []
    rounds: list = []
    run_sweep(fake_runner(lambda c: 1.2), 2, has_draft=False, has_mtp=False, plan=Plan(quick=True),
              on_run=ticks.append, on_round=lambda name, runs, later: rounds.append((name, runs, later)))
    assert rounds[0][0] == "coarse" and rounds[0][2] > 0 and rounds[-1] == ("confirm", round_size(2, 2, 1), 0)
    for name, runs, _ in rounds:
        mine = [t for t in ticks if t.round == name]
        assert len(mine) == runs and mine[-1].left == 0
        assert all(t.done + t.left == runs for t in mine)


def test_combine_takes_the_best_value_of_each_setting():
    base = Candidate("ngram-mod")
    a, b = base.with_(draft_max=64), base.with_(ngram={"mod_n_match": 12})
    scores = []
    for c, r in ((base, 1.2), (a, 1.5), (b, 1.4), (base.with_(draft_max=16), 1.0)):
        s = Score(c, ratios=[[r]], accepted=3)
        scores.append(s)
    both = combine(base, scores)
    assert both == Candidate("ngram-mod", draft_max=64, ngram=(("mod_n_match", 12),))
