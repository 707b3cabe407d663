"""The opening draft at the n_batch boundary: a grammar's opening draft rides in the prompt's last
n_batch chunk (sequence.py `_open_with`), and only the last chunk of a decode has output rows. A
prompt whose last chunk is (nearly) full left no room for the draft's rows: `decode` was asked for
rows of an earlier chunk and the request failed. Prompts of every length just below, at and just
above multiples of a small n_batch, under a JSON schema, on the real SmolLM2 Q4_1: each answers
as plain decoding does, and the opening draft still fires where the last chunk has room."""

from __future__ import annotations

import pytest

from llamaspec.runtime.context import Context, ContextConfig
from llamaspec.runtime.grammar import grammar_from_schema
from llamaspec.runtime.llama import Model
from llamaspec.speculative.drafters.factory import build_drafter
from llamaspec.speculative.engine import SpecEngine
from llamaspec.speculative.options import SpecOptions, parse_spec_types
from llamaspec.speculative.sampling_params import SamplingParams
from llamaspec.speculative.sequence import GenerationConfig, SequenceRun

pytestmark = pytest.mark.real

N_BATCH = 32
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
# numbers, not a repeated word: prompts cut from its front share no prefix with one another
FILLER = ", ".join(str(i) for i in range(100, 160)) + ". Describe a person as JSON with a name and an age."


@pytest.fixture(scope="module")
def model(smollm2_q4):
    m = Model(smollm2_q4)
    yield m
    m.close()


def _engine(model, spec: str):
    ctx = Context(model, ContextConfig(n_ctx=512, n_batch=N_BATCH, n_threads=1))
    sp = SamplingParams(temperature=0.0)
    built = build_drafter(SpecOptions(spec_types=parse_spec_types(spec), n_threads=1), model, ctx, sp)
    return SpecEngine(model, ctx, built.drafter), built, ctx


def _run(engine, prompt: list[int]) -> tuple[list[int], int]:
    """(tokens, tokens out of the prompt's own batch); the prompt evaluated whole, not from cache."""
    engine.cached.pop(0, None)
    config = GenerationConfig(max_tokens=12, sampling=SamplingParams(temperature=0.0), draft_max=16,
                              grammar=grammar_from_schema(SCHEMA))
    seq = SequenceRun(engine, 0, prompt, config, None)
    try:
        seq.start()
        opened = len(seq.out.tokens)
        while not seq.done:
            engine.step([seq])
    except BaseException:
        seq.abandon()
        raise
    return seq.finish().tokens, opened


def test_prompts_ending_at_the_n_batch_boundary_answer_as_plain_decoding(model):
    text = model.tokenize(FILLER, add_special=False, parse_special=False)
    assert len(text) > 2 * N_BATCH + 4
    plain, p_built, p_ctx = _engine(model, "none")
    spec, s_built, s_ctx = _engine(model, "grammar")
    try:
        _run(spec, text[-40:])   # the layout after `{` is learnt from an output: a longer opening
        lengths = [N_BATCH - 7, N_BATCH - 1, N_BATCH] + [2 * N_BATCH + d for d in (-5, -3, -2, -1, 0, 2)]
        opened = {}
        for n in lengths:
            prompt = text[-n:]
            want, _ = _run(plain, prompt)
            got, opened[n] = _run(spec, prompt)
            assert got == want, (n, model.detokenize(got), model.detokenize(want))
    finally:
        for b, c in ((p_built, p_ctx), (s_built, s_ctx)):
            b.close()
            c.close()
    # the opening draft still comes with the prompt where its last chunk has room for it
    assert opened[N_BATCH - 7] > 2 and opened[2 * N_BATCH + 2] > 2, opened
