"""The copy drafter's draft-length and source policy (match_controller.py, prompt_lookup.py,
costs.py): pure functions on made-up continuation probabilities, cost curves and token lists,
and greedy generation identical to plain decoding through Generator on tiny and real models."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

from llamaspec.speculative import match_controller
from llamaspec.speculative.controller import DraftLengthController
from llamaspec.speculative.costs import CostModel
from llamaspec.speculative.drafters.prompt_lookup import PromptLookupDrafter
from llamaspec.speculative.match_controller import (CopyEvidence, CopyStats, MatchController, agreement_bucket,
                                                    RiskBudget, best_length, count_steps, expected_tokens)

# the 2-core EPYC's measured verify curve, t(n)/t(1) (MEASURED.md), and a GPU-like flat one
EPYC = {1: 1.0, 2: 1.90, 4: 2.27, 8: 3.36, 16: 5.07, 32: 8.88, 64: 15.15}


def _interp(curve: dict[int, float], n: float) -> float:
    xs = sorted(curve)
    for x0, x1 in zip(xs, xs[1:]):
        if n <= x1:
            return curve[x0] + (curve[x1] - curve[x0]) * (n - x0) / (x1 - x0)
    return curve[xs[-1]]


def verify(curve: dict[int, float], k_max: int = 63) -> list[float]:
    return [_interp(curve, k + 1) for k in range(k_max + 1)]


def flat(k_max: int = 63) -> list[float]:
    return [1.0 + 0.01 * k for k in range(k_max + 1)]


def test_docstring_examples():
    result = doctest.testmod(match_controller)
    assert result.failed == 0 and result.attempted > 0


def test_expected_tokens_by_hand():
    assert expected_tokens([1.0] * 5, 5) == 6.0
    assert expected_tokens([0.5, 0.5], 2) == pytest.approx(1.75)
    assert expected_tokens([0.9, 0.0, 1.0], 3) == pytest.approx(1.9)  # nothing past a sure break


def test_best_length_follows_the_cost_curve():
    sure = [0.99] * 63
    # verify nearly free: draft all the copy there is
    assert best_length(sure, flat())[0] == 63
    # on the EPYC a long draft of a sure copy still pays (64 tokens for 15 steps), a weak one not
    k, rate = best_length(sure, verify(EPYC))
    assert k >= 40 and rate > 3.0
    k, rate = best_length([0.5] * 63, verify(EPYC))
    assert rate < 1.0
    # a middling copy: a middling length, shorter on the dear curve than on the flat one
    k_cpu, _ = best_length([0.9] * 63, verify(EPYC))
    k_flat, _ = best_length([0.9] * 63, flat())
    assert 4 <= k_cpu < k_flat


def test_best_length_stops_before_a_likely_break():
    # position 9 is a token the text refused to copy before: draft up to it, not through it
    probs = [0.98] * 8 + [0.05] + [0.98] * 40
    assert best_length(probs, verify(EPYC))[0] == 8
    # n_min is honoured, and no positions means no length
    assert best_length([0.1] * 8, verify(EPYC), n_min=3)[0] == 3
    assert best_length([], verify(EPYC)) == (0, 1.0)
    # drafting cost counts: a draft model as dear as the target never pays
    assert best_length([0.99] * 8, flat(), draft_ratio=1.0)[1] < 1.0


def test_copy_stats_learn_per_agreement_length():
    st = CopyStats(prior_weight=2.0, decay=1.0)
    p2, p20 = st.p(2), st.p(20)
    assert p2 < st.p(3) < st.p(6) < p20  # the priors grow with the agreement
    for _ in range(10):
        st.observe(2, 4, 0)      # after 2-token matches the first token always fails
        st.observe(20, 10, 10)   # inside long copies all holds
    assert st.p(2) < p2 / 3 and st.p(20) > p20
    assert st.probs(2, 3) == [st.p(2), st.p(3), st.p(4)]
    assert [agreement_bucket(g) for g in (2, 3, 4, 6, 9, 17, 33, 65)] == list(range(8))


def _controller(curve, n_max: int = 63, **kw) -> MatchController:
    cost = CostModel(verify_ratio_fn=lambda k: _interp(curve, k + 1), draft_ratio_value=0.0)
    return MatchController(lambda c, p: DraftLengthController(n_min=1, n_max=n_max, cost=c, prior_alpha=p),
                           cost, **kw)


def test_controller_drafts_long_inside_a_copy_and_nothing_after_weak_matches():
    mc = _controller(EPYC, probe_every=1000, risk=RiskBudget(base=100.0, bank=100.0))   # a copy that has paid:
    # the loss budget (next test) allows any length
    assert mc.choose(2) == 0                     # p(2) = 0.4: a 1-token draft costs 1.9 steps
    assert mc.choose(CopyEvidence(40, [0.995] * 63)) >= 40
    assert mc.choose(CopyEvidence(40, [0.995] * 5)) == 5      # no more copy than the source has
    assert mc.choose(CopyEvidence(40, [0.995] * 6 + [0.01] + [0.995] * 20)) == 6
    assert mc.n_max == 63 and mc.n_pauses == 1


def test_first_drafts_risk_little_and_grow_with_what_drafting_saved():
    mc = _controller(EPYC, probe_every=1000)
    strong = CopyEvidence(8, [0.995] * 63)   # a copy not yet proven (< TRUSTED_AGREEMENT tokens)
    assert mc.choose(strong) == 1            # nothing saved yet: a failure may cost C(1) - 1 = 0.9 steps
    for _ in range(6):                       # six 1-token drafts accepted: 2 tokens for 1.9 steps each
        mc.observe(1, 1)
    # 0.6 saved: a draft may now risk 1.6 steps, t(5)/t(1) - 1 = 1.54 on this curve (t(6): 1.82)
    assert mc.risk.allowance() == pytest.approx(1.6) and mc.choose(strong) == 4
    for _ in range(10):                      # ten 4-token drafts accepted in full: 5 tokens for 2.54 steps
        mc.observe(4, 4)
    assert mc.risk.allowance() == mc.risk.bank == 16.0   # savings banked up to 16 steps of risk
    assert mc.choose(strong) >= 40           # a copy that paid drafts as long as the evidence says
    # on a GPU-like flat curve even a first draft is long: its failure costs a fifth of a step
    assert _controller({1: 1.0, 2: 1.01, 64: 1.2}).choose(strong) == 63


QWEN = {1: 1.0, 2: 1.86, 4: 3.22, 8: 7.00, 16: 8.38, 32: 14.48, 64: 24.82}   # the 1.5B, 2 cores


def test_a_proven_copy_risks_its_expected_loss_where_the_curve_is_known():
    """On the 1.5B's steep curve a draft of a copy that has agreed for TRUSTED_AGREEMENT tokens is
    charged (1 - p) of its cost: the module copied from the prompt is drafted long from its first
    step, where the whole cost (C(2) = 1.86 > 1 step of budget) held it to 1 token."""
    assert match_controller.TRUSTED_AGREEMENT == 12
    probs = [0.99] * 63
    fresh = lambda: _controller(QWEN, probe_every=1000)   # noqa: E731
    assert fresh().choose(CopyEvidence(11, probs)) == 1
    k = fresh().choose(CopyEvidence(12, probs))
    assert k >= 15 and (_interp(QWEN, k + 1) - 1.0) * 0.01 <= 1.0
    # evidence less sure, a shorter draft: (1 - p) * (C(k) - 1) stays within the allowance
    k_weak = fresh().choose(CopyEvidence(12, [0.9] * 63))
    assert 1 <= k_weak < k and (_interp(QWEN, k_weak + 1) - 1.0) * 0.1 <= 1.0
    # before any batch size is timed or kept (the prior line guesses the curve) the whole cost is
    # charged: a guessed price is not one to risk a long draft on
    guessed = MatchController(lambda c, p: DraftLengthController(n_min=1, n_max=63, cost=c, prior_alpha=p),
                              CostModel(), probe_every=1000)
    guessed.observe(0, 0, verify_seconds=0.03)    # t(1) timed, no batch
    whole = guessed.risk.longest(guessed.cost.verify_ratios(63), 0.0, 63)   # C(k) - 1 <= 1 step
    assert guessed.cost.known_size == 0 and guessed.choose(CopyEvidence(12, probs)) == whole < 15
    # a curve kept from an earlier run (curve_memo.py) is known up to its largest size
    kept = MatchController(lambda c, p: DraftLengthController(n_min=1, n_max=63, cost=c, prior_alpha=p),
                           CostModel(prior=[(n, r, 16.0) for n, r in QWEN.items() if n > 1]), probe_every=1000)
    kept.observe(0, 0, verify_seconds=0.03)
    assert kept.cost.known_size == 64 and kept.choose(CopyEvidence(12, probs)) >= 15


def test_a_proven_copy_that_always_fails_loses_at_most_the_budget_and_one_draft():
    mc = _controller(QWEN, probe_every=1000)
    lost = worst = 0.0
    for _ in range(400):
        k = mc.choose(CopyEvidence(30, [0.99] * 63))   # confident evidence, always wrong
        count_steps({"m": mc})
        mc.observe(k, 0)
        cost = mc.cost.verify_ratio(k) if k else 1.0
        lost += cost - 1.0
        worst = max(worst, cost - 1.0)
    assert lost <= mc.risk.base + mc.risk.share * 400 + worst
    assert worst > 1.0   # its first draft was long (and lost)


def test_drafting_that_always_fails_loses_at_most_the_budget():
    """Never slower: on a steep curve (Qwen2.5-Coder-1.5B on 2 cores) with confident evidence that is
    always wrong, the steps lost stay within base + share of the steps, plus one draft."""
    qwen = {1: 1.0, 2: 1.79, 4: 2.96, 8: 4.87, 16: 5.78, 32: 10.1, 64: 20.0}
    mc = _controller(qwen, probe_every=1000)
    lost = steps = 0.0
    for _ in range(400):
        k = mc.choose(CopyEvidence(8, [0.97] * 63))
        count_steps({"m": mc})
        mc.observe(k, 0)
        cost = mc.cost.verify_ratio(k) if k else 1.0
        lost += cost - 1.0
        steps += cost
    assert lost <= mc.risk.base + mc.risk.share * 400 + (_interp(qwen, 2) - 1.0)
    assert lost > 0.5 * mc.risk.share * 400   # it keeps probing with what the budget allows
    assert 400 / steps >= 0.96   # >= 0.97x plain but for the one draft past the budget


def test_controller_probes_a_declined_match_length_within_its_budget():
    mc = _controller(EPYC, probe_every=4, probe_budget=1.0)
    ks = [mc.choose(2) for _ in range(8)]
    assert ks[:3] == [0, 0, 0] and ks[3] > 0 and ks[4:7] == [0, 0, 0] and ks[7] > 0
    assert mc.n_probes == 2
    # a costly probe is spaced further apart: C(k) - 1 steps lost at most probe_budget of the time
    dear = _controller(EPYC, probe_every=4, probe_budget=0.03)
    assert all(dear.choose(2) == 0 for _ in range(20))


def test_controller_learns_from_plain_matches_and_hands_unmatched_drafts_to_the_fallback():
    mc = _controller({1: 1.0, 2: 1.01, 64: 1.2})
    k = mc.choose(12)
    # a GPU-like flat verify curve and a 12-token match (p >= 0.96 a token): every extra draft token
    # costs less than it is expected to yield, so the whole budget is drafted
    assert k == mc.n_max == 63
    mc.observe(k, 0)                       # a plain int: the controller's own statistics learn
    assert mc.stats.p(12) < CopyStats().p(12)
    before = list(mc.stats.seen)
    k = mc.choose(CopyEvidence(12, [0.9] * 10))
    mc.observe(k, k)                       # the drafter's evidence: the drafter keeps the statistics
    assert mc.stats.seen == before
    # no match: the fallback controller sizes the draft, as a fresh one on the same costs would
    twin = DraftLengthController(n_min=1, n_max=63, cost=mc.cost, prior_alpha=0.6)
    assert mc.choose(None) == twin.choose()
    with pytest.raises(ValueError):
        mc.observe(2, 3)


# -- the source: which earlier place, and how much its match says ---------------------------------

def _drafter(prompt, **kw) -> PromptLookupDrafter:
    d = PromptLookupDrafter(**kw)
    d.begin(0, prompt)
    return d


def test_a_match_every_function_shares_is_weak_evidence():
    # "NL NL def" (10 10 5) before three functions named 7, 8, 9: the text's end 10 10 5 matches
    # all three for 3 tokens, and each would continue with another name: a guess, sized as one
    h = [20, 10, 10, 5, 7, 21, 10, 10, 5, 8, 22, 10, 10, 5, 9, 23, 10, 10, 5]
    d = _drafter(h)
    j, n, rival = d.locate(0, h)
    assert (n, rival) == (3, 3) and d.evidence(n, rival) == 2
    # the same end with a single earlier place: the match singles its source out
    h2 = [10, 10, 5, 7, 1, 2, 3, 4, 10, 10, 5]
    d2 = _drafter(h2)
    j, n, rival = d2.locate(0, h2)
    assert h2[j + 1] == 7 and (n, rival) == (3, 0) and d2.evidence(n, rival) == 3


def test_match_reported_past_n_max_inside_a_long_copy():
    body = list(range(100, 160))
    h = body + [1] + body[:40]
    d = _drafter(h, n_max=16)
    j, n, _ = d.locate(0, h)
    assert h[j + 1] == body[40] and n == 40


def test_a_token_the_text_refused_to_copy_ends_later_drafts():
    """The source writes 99 where the answer writes 50 (a renamed identifier, or the source's blank
    line): once a confident copy broke there, the next copy through a 99 stops just before it."""
    src = [1, 2, 3, 4, 5, 6, 99, 7, 8, 11, 12, 13, 14, 15, 99, 16, 17]
    d = _drafter(src + [0])
    mc = _controller(EPYC, probe_every=1000, risk=RiskBudget(base=100.0, bank=100.0))   # sizing only
    limit = lambda dr, match=None: mc.choose(match)  # noqa: E731
    h = src + [0, 1, 2, 3]
    draft = d.propose_within(0, h, limit)
    assert draft.tokens[:3] == [4, 5, 6] and 99 in draft.tokens     # nothing known against 99 yet
    h += [4, 5, 6, 50, 7, 8]                                           # the text wrote 50 for 99
    d.propose_within(0, h, lambda dr, match=None: 0)                   # learns on the next lookup
    h += [11, 12]                                                      # "50 7 8 11 12": 4 agree
    draft = d.propose_within(0, h, limit)
    assert draft.tokens == [13, 14, 15]


def test_draft_ends_at_an_end_of_generation_token():
    eog = 2
    h = [5, 6, 7, 8, 9, 10, 11, eog, 40, 41, 42, 43, 1, 5, 6, 7]
    d = _drafter(h, is_stop=lambda t: t == eog)
    ev = d.continuation(0, h, 4, 3)
    assert len(ev.probs) == 4 and int(ev) == 3      # 8 9 10 11 eog: up to and including it... 8..11, eog
    draft = d.propose_within(0, h, lambda dr, match=None: 60)
    assert draft.tokens == [8, 9, 10, 11, eog]


# -- costs ----------------------------------------------------------------------------------------

def test_costs_after_two_long_drafts_do_not_price_short_ones_like_them():
    """Two long drafts timed (44 and 36 tokens), one-token steps between: too few points for a
    line, so t(n) used to keep a slope of 0.02 per token through them and priced a 4-token batch
    at 6.3 steps (this CPU: 2.3), and no short draft looked worth making. The prior slope carries
    the curve down from what was measured."""
    t1 = 0.013
    cm = CostModel()
    for n in (44, 1, 1, 36, 1, 1, 1, 1):
        cm.observe_verify(n, t1 * _interp(EPYC, n))
    r = cm.verify_ratios(63)
    assert r[3] == pytest.approx(_interp(EPYC, 4), rel=0.15)
    assert r[40] == pytest.approx(_interp(EPYC, 41), rel=0.05)


def test_costs_interpolate_between_measured_batch_sizes():
    t1 = 0.013
    cm = CostModel()
    cm.observe_verify(1, t1)
    for n in (3, 9, 24, 48, 3, 9, 24, 48):
        cm.observe_verify(n, t1 * _interp(EPYC, n))
    r = cm.verify_ratios(63)
    for n in (3, 9, 24, 48):
        assert r[n - 1] == pytest.approx(_interp(EPYC, n), rel=0.02)
    assert r[15] == pytest.approx(_interp(EPYC, 16), rel=0.1)
    assert all(a <= b for a, b in zip(r, r[1:]))


def test_costs_before_any_batch_err_towards_dear():
    # no batch timed: t(k+1)/t(1) from the prior slope, steep enough that a 32-token draft is
    # not priced as about free (the old prior said 1.6 steps; this CPU measures 8.9)
    r = CostModel().verify_ratios(32)
    assert r[32] > 4.0 and r[1] < 1.5


# -- lossless: greedy through Generator equals plain decoding --------------------------------------

HUMANEVAL_STYLE = '''Rewrite this function with descriptive variable names.

```python
def m(s):
    """Return the longest substring of s without repeating characters."""
    b = 0
    i = 0
    o = {}
    for j, ch in enumerate(s):
        if ch in o and o[ch] >= i:
            i = o[ch] + 1
        o[ch] = j
        if j - i + 1 > b:
            b = j - i + 1
            e = i
    return s[e:e + b] if b else ""
```'''


def _generate(model, spec: str, prompt: str, n: int, **kw):
    from llamaspec import Generator

    with Generator(str(model), spec_type=spec, temperature=0, max_tokens=n, threads=1, **kw) as g:
        return g.generate(prompt)


def _judge(model, prompt: str, plain, got, eps: float, label: str, chat: bool = True) -> str:
    """Lossless as the engine tests judge it: the same tokens, or first different at a near-tie of
    the target (drafting verifies in batches of another shape than plain decoding)."""
    from engine_helpers import assert_lossless, prompt_tokens
    from llamaspec.runtime.llama import Model

    m = Model(Path(model))
    try:
        ids = prompt_tokens(m, prompt) if chat else m.tokenize_prompt(prompt)
        assert len(ids) == plain.n_prompt   # the judge sees the prompt the Generator evaluated
        return assert_lossless(m, ids, plain.tokens, got.tokens, eps, label)
    finally:
        m.close()


def test_lossless_on_a_tiny_model(tiny_models):
    prompt = "one two three four five six seven eight nine ten " * 6
    plain = _generate(tiny_models["target"], "none", prompt, 48, chat=False)
    spec = _generate(tiny_models["target"], "prompt-lookup", prompt, 48, chat=False)
    fixed = _generate(tiny_models["target"], "prompt-lookup", prompt, 48, chat=False, adaptive=False)
    for label, got in (("adaptive", spec), ("fixed", fixed)):
        print(_judge(tiny_models["target"], prompt, plain, got, 1e-3, label, chat=False))
    assert fixed.stats["drafted"] > 0


@pytest.mark.slow
def test_lossless_on_smollm2_rewriting_a_function(smollm2_f16):
    """The real target copying a function it renames: long drafts, the target's own tokens."""
    plain = _generate(smollm2_f16, "none", HUMANEVAL_STYLE, 120)
    spec = _generate(smollm2_f16, "prompt-lookup", HUMANEVAL_STYLE, 120)
    print(_judge(smollm2_f16, HUMANEVAL_STYLE, plain, spec, 0.25, "prompt-lookup"))
    assert spec.stats["accepted"] >= 40 and spec.stats["steps"] < len(plain.tokens) / 2


def test_costs_shrug_off_steps_another_process_slowed():
    """A shared machine: now and then a one-token step takes 10x its cost. A mean of the last
    steps priced t(1) at 3.6x its cost, every batch looked free, and weak copies were drafted;
    medians keep the ratio."""
    cm = CostModel()
    for i in range(8):
        cm.observe_verify(1, 0.100 if i % 4 == 3 else 0.010)
        cm.observe_verify(9, 0.034)
    assert cm.verify_ratio(8) == pytest.approx(3.4, rel=0.05)
