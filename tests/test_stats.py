"""Tests of SpecStats: counters, derived figures (llama.cpp's definitions), merge, to_dict."""

from __future__ import annotations

import pytest

from llamaspec.speculative.metrics import DrafterCredit, SpecStats


def _example() -> SpecStats:
    s = SpecStats()
    s.record_step(4, 4, 5, "ngram-simple")   # all 4 accepted + bonus
    s.record_step(4, 1, 2, "ngram-simple")   # 1 accepted + correction
    s.record_step(0, 0, 1)                   # no draft: plain step
    s.record_step(2, 0, 1, "ngram-mod")      # all rejected
    s.gen_seconds = 2.0
    s.prompt_seconds = 0.5
    return s


def test_counters():
    s = _example()
    assert (s.steps, s.drafts, s.drafted, s.accepted, s.generated) == (4, 3, 10, 5, 9)
    assert s.drafted_per_position == [3, 3, 2, 2]
    assert s.accepted_per_position == [2, 1, 1, 1]


def test_derived_figures():
    s = _example()
    assert s.acceptance == pytest.approx(5 / 10)
    # llama.cpp: 1 + accepted / drafts (steps with a draft), bonus included
    assert s.mean_accepted_length == pytest.approx(1 + 5 / 3)
    assert s.tokens_per_step == pytest.approx(9 / 4)
    # llama.cpp's acc rate/pos: accepted at position i / drafts
    assert s.per_position_acceptance == pytest.approx([2 / 3, 1 / 3, 1 / 3, 1 / 3])
    assert s.tokens_per_second == pytest.approx(4.5)


def test_per_drafter_credit():
    s = _example()
    simple, mod = s.per_drafter["ngram-simple"], s.per_drafter["ngram-mod"]
    assert (simple.drafts, simple.drafted, simple.accepted) == (2, 8, 5)
    assert simple.accepted_per_position == [2, 1, 1, 1]
    assert simple.mean_accepted_length == pytest.approx(1 + 5 / 2)
    assert (mod.drafts, mod.drafted, mod.accepted, mod.acceptance) == (1, 2, 0, 0.0)


def test_empty_stats_do_not_divide_by_zero():
    s = SpecStats()
    assert (s.acceptance, s.mean_accepted_length, s.tokens_per_step, s.tokens_per_second) == (0.0, 1.0, 0.0, 0.0)
    assert s.per_position_acceptance == []
    assert DrafterCredit().acceptance == 0.0


def test_accepted_cannot_exceed_drafted():
    with pytest.raises(ValueError):
        SpecStats().record_step(2, 3, 4)


def test_merge_adds_everything():
    a = _example()
    b = SpecStats()
    b.record_step(6, 6, 7, "ngram-mod")
    b.gen_seconds, b.verify_seconds, b.draft_seconds, b.overhead_seconds = 1.0, 0.5, 0.1, 0.01
    m = a.merge(b)
    assert (m.steps, m.drafts, m.drafted, m.accepted, m.generated) == (5, 4, 16, 11, 16)
    assert m.drafted_per_position == [4, 4, 3, 3, 1, 1]
    assert m.accepted_per_position == [3, 2, 2, 2, 1, 1]
    assert m.per_drafter["ngram-mod"].drafts == 2 and m.per_drafter["ngram-mod"].accepted == 6
    assert m.per_drafter["ngram-simple"].drafts == 2
    assert m.gen_seconds == pytest.approx(3.0) and m.verify_seconds == pytest.approx(0.5)
    assert (a + b).to_dict() == m.to_dict()
    assert SpecStats.sum([a, b]).to_dict() == m.to_dict()
    # inputs untouched
    assert a.steps == 4 and a.per_drafter["ngram-mod"].drafts == 1


def test_to_dict_keys_and_values():
    d = _example().to_dict()
    for key in ["drafted", "accepted", "acceptance", "mean_accepted_length",
                "per_position_acceptance", "prompt_seconds", "gen_seconds", "tokens_per_second",
                "steps", "n_generated", "drafts", "draft_seconds", "verify_seconds",
                "overhead_seconds", "per_drafter", "tokens_per_step"]:
        assert key in d
    assert d["n_generated"] == 9 and d["mean_accepted_length"] == pytest.approx(8 / 3)
    assert d["per_drafter"]["ngram-simple"]["accepted"] == 5
    import json
    json.dumps(d)  # JSON-serialisable
