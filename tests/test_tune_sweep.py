"""The tuning search on made-up timings: what it tries, what it rejects, what it chooses."""

from __future__ import annotations

import pytest

from llamaspec.errors import UsageError
from llamaspec.bench import RepResult
from llamaspec.speculative.options import SPEC_TYPES, needs_draft_model
from llamaspec.tune.sweep import (Candidate, Plan, Score, applicable_types, coarse_candidates, combine, neighbours,
                                  run_sweep)

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
    assert "draft-simple" in specs and "ngram-mod" in specs and "ngram-mod,draft-simple" in specs
    assert not any(needs_draft_model(s) for s in (c.spec for c in coarse_candidates(False, False)))


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
    assert tried == ["draft-simple"]   # it failed once; its chains never ran
    dropped = {s.candidate.spec for s in res.rejected}
    assert "draft-simple" in dropped and "ngram-mod,draft-simple" in dropped
    assert res.chosen is not None and "draft-simple" not in res.chosen.candidate.spec


def test_quick_skips_the_fine_round_and_plain_runs_are_interleaved():
    calls: list = []
    res = run_sweep(fake_runner(lambda c: 1.2, calls=calls), 2, has_draft=False, has_mtp=False,
                    plan=Plan(quick=True, reps=1, chunk=3))
    assert [r.name for r in res.rounds] == ["coarse", "confirm"]
    # every chunk of 3 candidates follows a plain run on the same prompt
    since_plain = 0
    for label, i in calls:
        since_plain = 0 if label == "plain" else since_plain + 1
        assert since_plain <= 3


def test_combine_takes_the_best_value_of_each_setting():
    base = Candidate("ngram-mod")
    a, b = base.with_(draft_max=64), base.with_(ngram={"mod_n_match": 12})
    scores = []
    for c, r in ((base, 1.2), (a, 1.5), (b, 1.4), (base.with_(draft_max=16), 1.0)):
        s = Score(c, ratios=[[r]], accepted=3)
        scores.append(s)
    both = combine(base, scores)
    assert both == Candidate("ngram-mod", draft_max=64, ngram=(("mod_n_match", 12),))
