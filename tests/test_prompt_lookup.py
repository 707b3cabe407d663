"""prompt-lookup (llamaspec's own longest-match drafter) and the per-match-length controller:
pure functions against hand-worked examples, the incremental drafter against the reference
function, and lossless generation through `run` on real tiny models."""

from __future__ import annotations

import doctest
import json
import random

import numpy as np
import pytest

from llamaspec.speculative import match_controller
from llamaspec.speculative.controller import CostModel, DraftLengthController
from llamaspec.speculative.drafters import copy_learner, prompt_lookup
from llamaspec.speculative.drafters.prompt_lookup import PromptLookupDrafter, prompt_lookup_draft
from llamaspec.speculative.match_controller import CopyStats, MatchController


def test_docstring_examples():
    for mod in (prompt_lookup, match_controller, copy_learner):
        result = doctest.testmod(mod)
        assert result.failed == 0 and result.attempted > 0


def test_longest_match_beats_the_latest_one():
    # "5 6" ends at 2 (after 4 5 6: a 3-token match with the end "4 5 6") and at 6 (after 8 5 6:
    # 2 tokens). A fixed-n drafter takes the latest occurrence (6) and drafts 9; the longest
    # match drafts 7 7.
    h = [4, 5, 6, 7, 7, 8, 5, 6, 9, 4, 5, 6]
    assert prompt_lookup_draft(h, 2) == ([7, 7], 3)
    assert prompt_lookup_draft(h, 2, n_min=4) == ([], 0)
    # ties: the latest of equally long matches
    assert prompt_lookup_draft([1, 2, 3, 1, 2, 4, 1, 2], 1) == ([4], 2)
    # the match may not be the end itself, and nothing follows an end that has no successor
    assert prompt_lookup_draft([1, 2], 3) == ([], 0)


def test_incremental_drafter_equals_the_reference_on_random_text():
    rng = random.Random(7)
    for trial in range(30):
        vocab = rng.choice([3, 5, 12])
        prompt = [rng.randrange(vocab) for _ in range(rng.randrange(3, 60))]
        d = PromptLookupDrafter(n_min=2, n_max=8, size_m=64)
        d.begin(0, prompt)
        h = list(prompt)
        for step in range(40):
            j, n, _ = d.locate(0, h)
            got = d.propose_within(0, h, lambda dr, match=None: 5)
            want, want_n = prompt_lookup_draft(h, 5, n_min=2, n_max=8)
            # the match is followed past n_max for the controller; the source is chosen on n_max
            assert (got.tokens, min(n, 8) if j >= 0 else 0) == (want, want_n), (trial, step)
            new = [rng.randrange(vocab) for _ in range(rng.randrange(1, 4))]
            d.accepted(0, 0, new)
            h += new


def test_drafter_asks_the_limit_with_its_match_and_keeps_it_on_the_draft():
    d = PromptLookupDrafter()
    h = [1, 2, 3, 4, 5, 6, 7, 9, 1, 2, 3, 4]
    d.begin(0, h[:6])
    asked = []
    draft = d.propose_within(0, h, lambda dr, match=None: asked.append(match) or 3)
    assert asked == [4] and draft.tokens == [5, 6, 7] and draft.match == 4
    assert draft.truncated(1).match == 4
    # limit 0: the controller said no for this match length
    assert not d.propose_within(0, h, lambda dr, match=None: 0)
    # a rewritten history (another prompt on the same sequence id) is re-indexed
    assert d.propose_within(0, [8, 8, 8, 8], lambda dr, match=None: 2).tokens == [8]


def _match_controller(curve=lambda k: 1.0 + 0.2 * k):
    cost = CostModel(verify_ratio_fn=curve, draft_ratio_value=0.0)
    return MatchController(lambda c, prior: DraftLengthController(n_min=1, n_max=32, cost=c, prior_alpha=prior),
                           cost)


def test_long_matches_earn_long_drafts_and_short_ones_stop():
    """Drafts after long matches are always right, after 2-token matches always wrong (a match
    length as a plain int: the controller keeps the statistics): the long drafts grow, the short
    ones stop, and the failures of one never shorten the other."""
    mc = _match_controller()
    long_k, short_k = [], []
    for _ in range(40):
        k = mc.choose(12)
        long_k.append(k)
        mc.observe(k, k)
        k = mc.choose(2)
        short_k.append(k)
        mc.observe(k, 0)
    assert long_k[-1] >= long_k[0] and long_k[-1] >= 16
    assert short_k[:2] != [0, 0] and sum(1 for k in short_k[-20:] if k) <= 2
    assert mc.n_pauses >= 1


def test_copy_learner_prices_a_refused_token_and_learns_undrafted_steps():
    from llamaspec.speculative.drafters.copy_learner import CopyLearner

    c = CopyLearner()
    # draft positions at agreements 8, 9, 10: the priors of buckets 6-8 and 9-16
    assert c.probs(8, [5, 6, 7]) == [0.92, 0.96, 0.96]
    # a lookup that was not drafted still teaches: the text followed 5 6 for 2 tokens after a
    # 10-token match, then wrote 4 where the source has 7 (a confident copy refused 7)
    c.expect([5, 6, 7, 8], at=2, match=10)
    c.learn([0, 1, 5, 6, 4])
    assert c.refused == {7: 1} and c.held == {5: 1, 6: 1} and c.pending is None
    after = c.probs(8, [5, 6, 7])
    # 7 held 0 times, refused once: (0 + 1) / (0 + 1 + 1) of its agreement's p
    assert after[2] == pytest.approx(c.stats.p(10) / 2) and after[0] == pytest.approx(c.stats.p(8))
    # a prediction the text has not reached yet teaches nothing
    seen = list(c.stats.seen)
    c.expect([9], at=5, match=3)
    c.learn([0, 1, 5, 6, 4])
    assert c.stats.seen == seen and c.pending is None


def test_copies_from_the_output_itself_are_counted_apart_from_copies_from_the_prompt():
    from llamaspec.speculative.drafters.copy_learner import OWN_PRIORS
    from llamaspec.speculative.match_controller import PRIOR_CONTINUE

    def first_p(prompt, output):
        d = PromptLookupDrafter()
        d.begin(0, prompt)
        seen = []
        d.propose_within(0, prompt + output, lambda dr, match=None: seen.append(match) or 0)
        return int(seen[0]), seen[0].probs[0]

    # "2 3" repeats the prompt: a stretch the answer may be copying
    assert first_p([1, 2, 3, 4, 5], [9, 2, 3]) == (2, PRIOR_CONTINUE[0])
    # "2 3" repeats the answer's own words: more often a phrase said again than a stretch copied
    assert first_p([7, 8], [1, 2, 3, 4, 9, 2, 3]) == (2, OWN_PRIORS[0]) and OWN_PRIORS[0] < PRIOR_CONTINUE[0]


def test_plain_steps_teach_only_the_shared_costs():
    mc = _match_controller(curve=None)
    mc.cost.verify_ratio_fn = None
    mc.observe(0, 0, verify_seconds=0.010)
    mc.observe_cost(9, 0.020)
    assert mc.cost.decode_seconds == pytest.approx(0.010)
    assert mc.stats.seen == CopyStats().seen  # no acceptance was learnt


def test_cost_model_keeps_one_token_steps_apart_from_batches():
    """t(1) is a memory-bound matrix-vector product, batches a matrix product: a line through
    both would make a 1-token draft look cheap (here t(2) = 1.8 t(1), then +0.2 t(1) per token)."""
    cm = CostModel()
    for _ in range(5):
        cm.observe_verify(1, 0.010)
        for n in (2, 9, 17):
            cm.observe_verify(n, 0.016 + 0.002 * n)
    assert cm.decode_seconds == pytest.approx(0.010)
    assert cm.verify_ratio(1) == pytest.approx(2.0, rel=1e-6)     # t(2) / t(1) = 0.020 / 0.010
    assert cm.verify_ratio(16) == pytest.approx(5.0, rel=1e-6)    # t(17) = 0.050
    assert cm.verify_ratios(4)[0] == 1.0


def _run_json(run_cli, *args):
    res = run_cli("run", *args, "--json")
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout)


def test_prompt_lookup_is_lossless_through_run(run_cli, tiny_models):
    """Greedy output through `run` equals plain decoding, adaptive or not, and drafts were made (the
    tiny model's output hardly copies its prompt: the adaptive length may rightly draft nothing
    after its weak matches, so the fixed length makes sure drafts are verified)."""
    prompt = "one two three four five six seven eight nine ten " * 6
    common = (str(tiny_models["target"]), "-p", prompt, "-n", "48", "--temp", "0", "--raw")
    plain = _run_json(run_cli, *common, "--spec-type", "none")
    spec = _run_json(run_cli, *common, "--spec-type", "prompt-lookup")
    fixed = _run_json(run_cli, *common, "--spec-type", "prompt-lookup", "--fixed-draft")
    assert spec["spec_type"] == "prompt-lookup"
    assert spec["tokens"] == plain["tokens"] == fixed["tokens"]
    assert fixed["drafted"] > 0


def test_no_flags_means_speculation_from_what_is_on_disk(run_cli, tiny_models, tmp_path):
    """`run MODEL` with no --draft and no --spec-type speculates (here: prompt-lookup, no draft on
    disk beside the model), says so on stderr, and gives plain decoding's tokens."""
    lone = tmp_path / "lone.gguf"
    lone.write_bytes(tiny_models["target"].read_bytes())
    common = (str(lone), "-p", "a b c a b c a b c", "-n", "24", "--temp", "0")
    res = run_cli("run", *common, "--json")
    assert res.exit_code == 0, res.stderr
    auto = json.loads(res.stdout)
    plain = _run_json(run_cli, *common, "--spec-type", "none")
    assert auto["spec_type"] == "prompt-lookup,suffix" and plain["spec_type"] == "none"
    assert auto["tokens"] == plain["tokens"]
    assert "--spec-type none turns it off" in res.stderr


def test_calls_count_every_lookup_not_only_the_matches(run_cli, tiny_models):
    """per_drafter.calls: the times the drafter was asked (it looked for a match every step, found
    one or not); drafts: the non-empty drafts it made. It used to count only the lookups that
    matched (2 calls in 42 steps)."""
    common = (str(tiny_models["target"]), "-p", "the cat sat on the mat and the dog ran", "-n", "40", "--temp", "0",
              "--raw", "--fixed-draft", "--spec-type", "prompt-lookup")
    spec = _run_json(run_cli, *common)
    credit = spec["per_drafter"]["prompt-lookup"]
    # every step but the last (which has no room for a draft) asks the drafter
    assert credit["calls"] >= spec["steps"] - 1 > 10, (credit, spec["steps"])
    assert credit["drafts"] == spec["drafts"] < credit["calls"]
