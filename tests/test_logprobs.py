"""Logprobs of emitted tokens (speculative/logprobs.py): the log-softmax of the target's raw row,
read off the verify rows; a speculative run's equal plain decoding's within llama.cpp's batch
noise, and they ignore logit_bias and the grammar (OpenAI's meaning)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine_helpers import PROMPTS, prompt_tokens
from llamaspec.runtime.grammar import GrammarSpec
from llamaspec.runtime.llama import Model
from llamaspec.speculative.logprobs import token_logprobs
from llamaspec.speculative.options import SpecOptions, parse_spec_types
from llamaspec.speculative.pipeline import load_pipeline
from llamaspec.speculative.sampling_params import SamplingParams


def test_token_logprobs_are_the_rows_log_softmax():
    rng = np.random.default_rng(3)
    rows = rng.normal(size=(4, 50)).astype(np.float32) * 3
    toks = [7, int(rows[1].argmax()), 0, 49]
    out = token_logprobs(rows, toks, 5)
    for row, tok, lp in zip(rows, toks, out):
        ref = row.astype(np.float64) - np.log(np.exp(row.astype(np.float64)).sum())
        assert lp.token == tok and lp.logprob == pytest.approx(ref[tok], abs=1e-9)
        assert [t for t, _ in lp.top] == list(np.argsort(-ref, kind="stable")[:5])
        assert [v for _, v in lp.top] == pytest.approx(sorted(ref, reverse=True)[:5], abs=1e-9)
    assert out[1].top[0] == (toks[1], out[1].logprob)
    assert token_logprobs(rows[:1], [3], 0)[0].top == ()


def _gen(target, spec, prompt, *, draft=None, n=200, fixed=False, **kw):
    sp = SamplingParams(temperature=0.0)
    # fixed (--fixed-draft --draft-max 4): a Q4 draft of a 135M F16 target costs about as much a
    # token, and the adaptive controller would rightly stop drafting
    opts = SpecOptions(spec_types=parse_spec_types(spec), draft_path=draft, n_ctx=1024, n_threads=2,
                       **({"adaptive": False, "draft_max": 4} if fixed else {}))
    pipe = load_pipeline(target.path, opts, sp, target=target)
    try:
        return pipe.engine.generate(prompt, pipe.config(max_tokens=n, sampling=sp, **kw))
    finally:
        pipe.close(keep_target=True)


@pytest.mark.real
@pytest.mark.slow
def test_speculative_logprobs_equal_plain_decodings(f16, smollm2_q4):
    """The issue's must-show: a 200-token greedy answer on SmolLM2 F16, plain against a draft
    model (most tokens come from verify rows of 2+ tokens): every logprob within 0.2, and the top-5
    lists agree on the chosen token."""
    prompt = prompt_tokens(f16, PROMPTS["story"])
    plain = _gen(f16, "none", prompt, logprobs=5)
    spec = _gen(f16, "draft", prompt, draft=Path(smollm2_q4), logprobs=5, fixed=True)
    assert spec.stats.accepted > 50, "most tokens should come from draft rows for this to mean anything"
    n = next((i for i, (a, b) in enumerate(zip(plain.tokens, spec.tokens)) if a != b), len(plain.tokens))
    assert n >= 100, f"greedy outputs diverge at {n}: a near tie, but too early to compare 200 tokens"
    assert len(plain.logprobs) == len(plain.tokens) and len(spec.logprobs) == len(spec.tokens)
    diffs = [abs(a.logprob - b.logprob) for a, b in zip(plain.logprobs[:n], spec.logprobs[:n])]
    print(f"{n} tokens compared: max |diff| {max(diffs):.4f}, mean {np.mean(diffs):.4f}")
    assert max(diffs) < 0.2
    for a, b in zip(plain.logprobs[:n], spec.logprobs[:n]):
        assert a.token == b.token == a.top[0][0] == b.top[0][0]   # greedy: the chosen one is the best
        assert len(a.top) == len(b.top) == 5


@pytest.mark.real
def test_logprobs_are_of_the_raw_row_not_the_biased_or_constrained_one(tiny_models):
    target = Model(tiny_models["target"])
    try:
        prompt = prompt_tokens(target, PROMPTS["story"])
        free = _gen(target, "none", prompt, n=12, logprobs=3)
        banned = free.tokens[4]
        biased = _gen(target, "none", prompt, n=12, logprobs=3, logit_bias={banned: float("-inf")})
        i = next(i for i, (a, b) in enumerate(zip(free.tokens, biased.tokens)) if a != b)
        assert i <= 4 and banned not in biased.tokens
        # up to the ban the same rows: the same logprobs; at it the raw best is still the banned one
        assert [x.logprob for x in biased.logprobs[:i]] == pytest.approx([x.logprob for x in free.logprobs[:i]], abs=1e-5)
        assert biased.logprobs[i].top[0][0] == free.tokens[i] != biased.tokens[i]
        assert biased.logprobs[i].logprob < biased.logprobs[i].top[0][1]
        # under a grammar the chosen token is rarely the raw best; its logprob is still the raw one
        g = _gen(target, "none", prompt, n=12, logprobs=2, grammar=GrammarSpec('root ::= "the lazy dog"'))
        assert g.text == "the lazy dog" and len(g.logprobs) == len(g.tokens)
        assert all(x.logprob <= x.top[0][1] + 1e-9 for x in g.logprobs)
        assert any(x.token != x.top[0][0] for x in g.logprobs)
        assert _gen(target, "none", prompt, n=4).logprobs is None   # off unless asked
    finally:
        target.close()


@pytest.mark.real
def test_logprobs_survive_a_recurrent_targets_replay(test_models_dir):
    """A recurrent target restores a checkpoint and replays the accepted tokens after a partial
    acceptance (a decode that may reuse the logits buffer): the logprobs are still the step's rows'."""
    from llamaspec.testing.tiny_recurrent import GENERATOR_VERSION, make_recurrent_set

    models = make_recurrent_set(test_models_dir / f"recurrent-v{GENERATOR_VERSION}")
    target = Model(models["target"])
    try:
        prompt = prompt_tokens(target, PROMPTS["story"])
        plain = _gen(target, "none", prompt, n=40, logprobs=3)
        spec = _gen(target, "draft", prompt, draft=models["draft"], n=40, logprobs=3, fixed=True)
    finally:
        target.close()
    assert 0 < spec.stats.accepted < spec.stats.drafted, "partial acceptances (replays) are the point"
    assert spec.tokens == plain.tokens   # tiny F32 models: no batch noise worth a tolerance
    assert [x.logprob for x in spec.logprobs] == pytest.approx([x.logprob for x in plain.logprobs], abs=1e-3)
    assert [x.top[0][0] for x in spec.logprobs] == [x.top[0][0] for x in plain.logprobs]
