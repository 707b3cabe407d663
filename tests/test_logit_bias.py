"""logit_bias (GenerationConfig.logit_bias): added to the target's raw logits before sampling and
verification, so a banned token never comes out and speculative output stays plain decoding's."""

from __future__ import annotations

import pytest

from engine_helpers import PROMPTS, prompt_tokens
from llamaspec.errors import UsageError
from llamaspec.runtime.llama import Model
from llamaspec.speculative.options import SpecOptions, parse_spec_types
from llamaspec.speculative.pipeline import load_pipeline
from llamaspec.speculative.sampling_params import SamplingParams


def _gen(target, spec, prompt, draft, n=48, sampling=None, **kw):
    sp = sampling or SamplingParams(temperature=0.0)
    opts = SpecOptions(spec_types=parse_spec_types(spec), draft_path=draft, n_ctx=1024, n_threads=1,
                       adaptive=False, draft_max=4)
    pipe = load_pipeline(target.path, opts, sp, target=target)
    try:
        return pipe.engine.generate(prompt, pipe.config(max_tokens=n, sampling=sp, **kw))
    finally:
        pipe.close(keep_target=True)


@pytest.fixture(scope="module")
def tiny_target(tiny_models):
    m = Model(tiny_models["target"])
    yield m
    m.close()


@pytest.mark.real
@pytest.mark.parametrize("ban", [float("-inf"), -100.0])
def test_a_banned_token_stays_out_and_speculation_agrees(tiny_target, tiny_models, ban):
    prompt = prompt_tokens(tiny_target, PROMPTS["story"])
    free = _gen(tiny_target, "none", prompt, None)
    # the token the free run writes most: banning it changes the text from its first use on
    banned = max(set(free.tokens), key=free.tokens.count)
    bias = {banned: ban, free.tokens[0]: 0.5}
    plain = _gen(tiny_target, "none", prompt, None, logit_bias=bias)
    assert banned not in plain.tokens and plain.tokens != free.tokens
    for spec in ("draft", "ngram-simple"):
        got = _gen(tiny_target, spec, prompt, tiny_models["draft"], logit_bias=bias)
        assert got.tokens == plain.tokens, spec   # tiny models are F32: no batch noise to allow for
    draft = _gen(tiny_target, "draft", prompt, tiny_models["draft"], logit_bias=bias)
    assert draft.stats.drafted > 0 and draft.stats.accepted > 0


@pytest.mark.real
def test_a_large_bias_forces_a_token_at_any_temperature(tiny_target, tiny_models):
    prompt = prompt_tokens(tiny_target, PROMPTS["story"])
    tok = tiny_target.tokenize(" fox", add_special=False)[-1]
    hot = SamplingParams(temperature=1.0, seed=5)
    for spec in ("none", "draft"):
        g = _gen(tiny_target, spec, prompt, tiny_models["draft"], n=10, sampling=hot, logit_bias={tok: 100.0})
        assert g.tokens == [tok] * 10, spec


@pytest.mark.real
def test_a_bias_outside_the_vocabulary_is_a_usage_error(tiny_target):
    prompt = prompt_tokens(tiny_target, PROMPTS["story"])
    n = tiny_target.n_vocab
    with pytest.raises(UsageError, match=rf"logit_bias: token id {n} is not in the model's vocabulary \(0\.\.{n - 1}\)"):
        _gen(tiny_target, "none", prompt, None, logit_bias={n: 1.0})
    with pytest.raises(UsageError, match="logit_bias: the bias of token 3 must be a number"):
        _gen(tiny_target, "none", prompt, None, logit_bias={3: float("nan")})
