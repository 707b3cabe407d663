"""Several sequences at once (--parallel N): one forward pass per step, and each prompt gets the
tokens it gets alone."""

from __future__ import annotations

from collections import deque

import pytest

import llamaspec.runtime.llama as llama_mod
from engine_helpers import assert_lossless
from llamaspec.errors import ContextFullError
from llamaspec.api.generator import Generator
from llamaspec.runtime.context import Context, ContextConfig
from llamaspec.runtime.llama import Model


def _ubatches(ctx: Context, segments) -> int:
    """How many ubatches (forward passes) llama.cpp cut one decode_many into: its batch debug log
    (LLAMA_BATCH_DEBUG, read when the context was made) says "added ubatch" once per ubatch."""
    llama_mod.LOG_TAIL.clear()
    ctx.decode_many(segments)
    ctx.logits(sum(len(t) for t, _, _ in segments))
    return sum("added ubatch" in line for line in llama_mod.LOG_TAIL)


@pytest.mark.parametrize("order, lengths", [
    ([0, 1, 2, 3], [1, 1, 1, 1]),
    ([1, 3, 0, 2], [1, 1, 1, 1]),   # sequence ids as slots are refilled: were 3 passes
    ([0, 1, 2, 3], [1, 5, 1, 3]),   # drafts of unequal lengths: were 3 passes
    ([0, 2, 3], [2, 1, 4]),         # a finished sequence leaves a gap: were 3 passes
])
def test_a_multi_sequence_step_is_one_forward_pass(tiny_models, monkeypatch, order, lengths):
    """The verify rows of every active sequence go through the model once, whatever their sequence
    ids and lengths (llama.cpp's per-sequence KV split cut such batches into several passes, each
    as dear as a whole step: --parallel 4 scaled 1.3x where llama.cpp's own batched-bench gets 2x)."""
    monkeypatch.setenv("LLAMA_BATCH_DEBUG", "1")
    monkeypatch.setattr(llama_mod, "LOG_TAIL", deque(maxlen=100_000))
    model = Model(tiny_models["target"])
    ctx = Context(model, ContextConfig(n_ctx=1024, n_threads=1, n_seq_max=4))
    try:
        for s in range(4):
            ctx.decode([1, 2, 3, 4 + s], 0, s, outputs="last")
        segments = [([5 + i for i in range(n)], 4, s) for s, n in zip(order, lengths)]
        assert _ubatches(ctx, segments) == 1
        firsts = ctx.decode_many([([7], 4 + n, s) for s, n in zip(order, lengths)])
        assert firsts == list(range(len(order)))  # rows stay in the order the segments were given
    finally:
        ctx.close()
        model.close()


def test_a_plain_context_splits_its_cache_and_orders_its_rows(tiny_models, monkeypatch):
    """--spec-type none: one row per sequence, where llama.cpp's per-sequence cache is faster than
    the unified one (each row attends to its own cells only), so the pipeline asks for it; rows are
    sent in sequence-id order (split ubatches take consecutive ids), so slots refilled out of order
    still cost one pass, and each segment's rows are still found where it was given."""
    monkeypatch.setenv("LLAMA_BATCH_DEBUG", "1")
    monkeypatch.setattr(llama_mod, "LOG_TAIL", deque(maxlen=100_000))
    with Generator(tiny_models["target"], spec_type="none", parallel=4, threads=1, tuned=False) as g:
        assert g.pipeline.ctx.unified is False
    with Generator(tiny_models["target"], spec_type="prompt-lookup", parallel=4, threads=1, tuned=False) as g:
        assert g.pipeline.ctx.unified is True
    model = Model(tiny_models["target"])
    ctx = Context(model, ContextConfig(n_ctx=1024, n_threads=1, n_seq_max=4, kv_unified=False))
    try:
        for s in range(4):
            ctx.decode([1, 2, 3, 4 + s], 0, s, outputs="last")
        order = [1, 3, 0, 2]
        assert _ubatches(ctx, [([9], 4, s) for s in order]) == 1
        firsts = ctx.decode_many([([7 + s], 5, s) for s in order])
        rows = ctx.logits(4)
        assert firsts == [1, 3, 0, 2]   # sent in id order: each segment is told where its row is
        alone = Context(model, ContextConfig(n_ctx=1024, n_threads=1))
        try:   # the row found for each segment is its own sequence's, as decoded alone
            for s, first in zip(order, firsts):
                alone.seq_rm(0, 0)
                alone.decode([1, 2, 3, 4 + s, 9, 7 + s], 0, 0, outputs="last")
                assert abs(alone.logits(1)[0] - rows[first]).max() < 1e-2
        finally:
            alone.close()
    finally:
        ctx.close()
        model.close()


def test_each_sequence_keeps_its_share_of_the_context(tiny_models):
    """One cache holds every sequence, but each may use only n_ctx / n_seq_max positions, so no
    sequence can take the room another needs in the middle of a job."""
    model = Model(tiny_models["target"])
    ctx = Context(model, ContextConfig(n_ctx=1024, n_threads=1, n_seq_max=4))
    try:
        assert ctx.n_ctx_seq == 256
        ctx.decode([1] * 256, 0, 0, outputs="last")   # a full share: fine
        with pytest.raises(ContextFullError):
            ctx.decode([1], 256, 0)
        with pytest.raises(ContextFullError):
            ctx.decode_many([([1], 1, 1), ([1], 256, 2)])
        for s in (1, 2, 3):                            # the others still get theirs
            ctx.decode([2] * 256, 0, s, outputs="last")
    finally:
        ctx.close()
        model.close()


TINY_PROMPTS = ["the cat sat on the mat and the cat sat on the", "once upon a time there was a",
                "one two three four five six seven", "a b c a b c a b c a b", "hello world hello",
                "the quick brown fox jumps over the lazy dog the quick", "in the beginning"]


def _job(model, prompts, parallel: int, **kw) -> dict[str, list[int]]:
    with Generator(model, parallel=parallel, threads=1, temperature=0, tuned=False, **kw) as g:
        results = list(g.generate_many(prompts, parallel=parallel))
    assert all(r.error is None for r in results)
    return {r.id: r.tokens for r in results}


@pytest.mark.parametrize("spec", ["none", "prompt-lookup", "ngram-simple", "draft"])
def test_parallel_4_gives_each_prompt_its_parallel_1_tokens_tiny(tiny_models, spec):
    """More prompts than slots (slots are refilled, sequence ids come back out of order), prompts of
    different lengths, drafts of different lengths per sequence, greedy: token for token what
    --parallel 1 gives."""
    kw = {"spec_type": spec, "max_tokens": 40, "chat": False}
    if spec == "draft":
        kw["draft"] = tiny_models["draft"]
    one = _job(tiny_models["target"], TINY_PROMPTS, 1, **kw)
    four = _job(tiny_models["target"], TINY_PROMPTS, 4, **kw)
    assert four == one


REAL_PROMPTS = ["Write a detailed explanation of how photosynthesis works.",
                "Repeat this line three times: the quick brown fox jumps over the lazy dog.",
                "Explain in two sentences what a hash map is.",
                "List the planets of the solar system in order.",
                "Write a short story about a lighthouse keeper."]


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["none", None])  # None: the default spec type (prompt-lookup here)
def test_parallel_4_gives_each_prompt_its_parallel_1_tokens_smollm2(smollm2_f16, spec):
    """Real SmolLM2 F16: --parallel 4 against --parallel 1, plain and with the default drafting.
    A batch of 4 rows may round a logit differently from a batch of 1 (llama.cpp's CPU kernels),
    so a flip where the target's two best logits nearly tie is allowed; anything else fails."""
    kw = {"max_tokens": 64} | ({"spec_type": spec} if spec else {})
    one = _job(smollm2_f16, REAL_PROMPTS, 1, **kw)
    four = _job(smollm2_f16, REAL_PROMPTS, 4, **kw)
    target = Model(smollm2_f16)
    try:
        with Generator(smollm2_f16, threads=1, tuned=False, spec_type="none") as g:
            prompts = {str(i): g.tokenize(p) for i, p in enumerate(REAL_PROMPTS)}
        notes = [assert_lossless(target, prompts[k], one[k], four[k], eps=0.1, label=f"prompt {k}")
                 for k in sorted(one)]
    finally:
        target.close()
    print("\n".join(notes))


def test_a_draft_model_drafts_several_sequences_together(tiny_models, monkeypatch):
    """At --parallel 4 the draft model drafts the 4 sequences' position i in one decode: 4 drafts of
    4 tokens cost 4 forward passes of the draft (16 one sequence at a time), and each sequence gets
    the draft it gets alone."""
    from llamaspec.speculative.drafters.model import ModelDrafter

    monkeypatch.setenv("LLAMA_BATCH_DEBUG", "1")
    monkeypatch.setattr(llama_mod, "LOG_TAIL", deque(maxlen=100_000))
    model = Model(tiny_models["draft"])
    histories = {s: [1, 2 + s, 3, 4 + s, 5] + [6] * s for s in range(4)}

    def drafts(together: bool) -> tuple[list[list[int]], int]:
        ctx = Context(model, ContextConfig(n_ctx=1024, n_threads=1, n_seq_max=4))
        d = ModelDrafter(ctx)
        try:
            for s, h in histories.items():
                d.begin(s, h)
            llama_mod.LOG_TAIL.clear()
            if together:
                out = d.propose_many([(s, h, 4) for s, h in histories.items()])
            else:
                out = [d.propose(s, h, 4) for s, h in histories.items()]
            return [x.tokens for x in out], sum("added ubatch" in line for line in llama_mod.LOG_TAIL)
        finally:
            d.close()

    try:
        alone, passes_alone = drafts(False)
        together, passes_together = drafts(True)
    finally:
        model.close()
    assert [len(t) for t in alone] == [4] * 4
    assert together == alone
    assert (passes_alone, passes_together) == (16, 4)


CODE = '''def area(width, height):
    if width < 0 or height < 0:
        raise ValueError("negative size")
    return width * height


def perimeter(width, height):
    if width < 0 or height < 0:
        raise ValueError("negative size")
    return 2 * (width + height)
'''
MIXED_PROMPTS = [f"Rename width to w and height to h in this code:\n\n{CODE}",
                 "Write a story about a lighthouse keeper.",
                 "Explain how photosynthesis works.",
                 "Describe the water cycle in detail."]


def test_a_copying_sequence_among_plain_ones_keeps_drafting(smollm2_f16):
    """--parallel 4, one prompt that copies code among three that do not: the copying sequence is
    charged the marginal cost of its draft rows (engine.marginal_charges), so it drafts and its
    drafts are accepted as they are alone; every sequence's tokens are plain decoding's (a flip at
    a near-tie of a batch's rounding allowed)."""
    kw = {"max_tokens": 96, "threads": 2}
    with Generator(smollm2_f16, parallel=4, temperature=0, tuned=False, spec_type="prompt-lookup", **kw) as g:
        spec = {r.id: r for r in g.generate_many(MIXED_PROMPTS, parallel=4)}
    with Generator(smollm2_f16, parallel=4, temperature=0, tuned=False, spec_type="none", **kw) as g:
        plain = {r.id: r for r in g.generate_many(MIXED_PROMPTS, parallel=4)}
        prompts = {str(i): g.tokenize(p) for i, p in enumerate(MIXED_PROMPTS)}
    copying = spec["0"].stats
    assert copying["drafted"] > 0 and copying["accepted"] >= copying["drafted"] // 2
    assert copying["steps"] < 0.6 * len(spec["0"].tokens)
    target = Model(smollm2_f16)
    try:
        for k in sorted(plain):
            assert_lossless(target, prompts[k], plain[k].tokens, spec[k].tokens, eps=0.1, label=f"prompt {k}")
    finally:
        target.close()


def test_a_draft_model_behind_the_grammar_drafter_still_batches(tiny_models):
    """`--draft X --parallel N` is a chain (the grammar drafter joins every chain), yet steps of
    sequences without a grammar still draft together through the draft model's propose_many, the
    draft model is credited with the drafts, and the texts are the sequential ones."""
    from llamaspec.speculative.drafters.model import ModelDrafter

    prompts = [f"Tell me about the sea, part {i}." for i in range(3)]
    opts = dict(draft=tiny_models["draft"], temperature=0, max_tokens=24, threads=1, adaptive=False, draft_max=4)
    with Generator(tiny_models["target"], **opts) as g:
        alone = {r.id: r.tokens for r in g.generate_many(prompts, parallel=1)}
    with Generator(tiny_models["target"], parallel=3, **opts) as g:
        model = next(d for d in g.pipeline.engine.drafter.members() if isinstance(d, ModelDrafter))
        calls = []
        original = model.propose_many
        model.propose_many = lambda reqs: calls.append(len(reqs)) or original(reqs)
        got = list(g.generate_many(prompts, parallel=3))
    assert {r.id: r.tokens for r in got} == alone
    assert calls and max(calls) == 3   # the three sequences' drafts were made in one call
    assert sum(r.stats["per_drafter"].get(model.name, {}).get("drafted", 0) for r in got) > 0
