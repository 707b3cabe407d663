"""The second prompt on a pipeline drafts like the first (issue 18).

The engine keeps each sequence's KV cache between prompts and evaluates only what a new prompt
does not share with the cached tokens (at least BOS). Drafters that read the target's hidden states
(draft-mtp, draft-eagle3, draft-dflash/dspark) must then rebuild their own state from the reused
prefix: they used to stop drafting for good after the first prompt, while their hidden-state
buffers grew by a row per token.

Every drafting spec type is run as `llamaspec run` / `batch` run it (Generator, fixed draft length,
greedy), prompt A then prompt B then both again through generate_many (what `batch` does), and
each generation is compared with the same prompt on a fresh pipeline: same drafted / accepted
counts, and the tokens of plain decoding.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llamaspec.api.generator import Generator
from llamaspec.speculative.options import SPEC_TYPES, NgramParams
from llamaspec.testing.tiny_assistant import make_assistant_set
from llamaspec.testing.tiny_models import GENERATOR_VERSION
from llamaspec.testing.tiny_spec_drafts import make_spec_draft_set

# Short n-gram settings: on tiny models the texts are short, llama.cpp's defaults would never match.
NGRAM = NgramParams(simple_size_n=2, simple_size_m=8, map_k_size_n=2, map_k_size_m=8, map_k4v_size_n=2,
                    map_k4v_size_m=8, mod_n_match=2, mod_n_min=1)
DRAFT_MAX = 6
N_TOKENS = 40

# The two raw prompts share only BOS. The near-bigram target repeats itself within 48 tokens, so
# the n-gram drafters find matches in B; A is a different text.
BIGRAM_A = "one two three four five six seven eight"
BIGRAM_B = "red green blue yellow purple orange red green blue yellow purple orange"
# The standard tiny target does not repeat itself; n-gram cache drafts from a prompt that does.
TINY_A = "the cat sat on the mat and the dog ran"
TINY_B = "red green blue yellow purple orange " * 4

# spec type (or a variant) -> (target, draft or None, prompt A, prompt B), names of model fixtures' keys
CASES = {
    "ngram-simple": ("bigram_target", None, BIGRAM_A, BIGRAM_B),
    "ngram-map-k": ("bigram_target", None, BIGRAM_A, BIGRAM_B),
    "ngram-map-k4v": ("bigram_target", None, BIGRAM_A, BIGRAM_B),
    "ngram-mod": ("bigram_target", None, BIGRAM_A, BIGRAM_B),
    "ngram-cache": ("target", None, TINY_A, TINY_B),
    "prompt-lookup": ("bigram_target", None, BIGRAM_A, BIGRAM_B),
    "suffix": ("bigram_target", None, BIGRAM_A, BIGRAM_B),
    "draft-simple": ("target", "draft", TINY_A, "once upon a time there was a little fox who"),
    "draft-eagle3": ("bigram_target", "eagle3", BIGRAM_A, BIGRAM_B),
    "draft-mtp": ("mtp", None, TINY_A, "once upon a time there was a little fox who"),
    "draft-mtp+assistant": ("gemma4_target", "gemma4_assistant", TINY_A, "once upon a time there was a little fox"),
    "draft-dflash": ("bigram_target", "dflash", BIGRAM_A, BIGRAM_B),
    "draft-dspark": ("bigram_target", "dspark", BIGRAM_A, BIGRAM_B),
}
# ngram-mod's pool is shared by all sequences and kept across prompts (llama.cpp's design), and
# suffix learns from every finished request (its purpose): their reference is the same prompts in
# the same order, on one pipeline whose prefix cache is dropped.
SHARED_STATE = {"ngram-mod", "suffix"}


def test_every_drafting_spec_type_is_covered():
    drafting = {t.name for t in SPEC_TYPES.values() if t.implemented and t.draft_max is not None}
    assert drafting == {c.split("+")[0] for c in CASES}


@pytest.fixture(scope="module")
def models(tiny_models, test_models_dir) -> dict[str, Path]:
    return {**tiny_models, **make_spec_draft_set(test_models_dir / f"tiny-spec-v{GENERATOR_VERSION}"),
            **make_assistant_set(test_models_dir / "tiny-assistant-v1")}


def _generator(models, case: str, spec_type: str | None = None) -> Generator:
    target, draft, _, _ = CASES[case]
    spec = spec_type or case.split("+")[0]
    return Generator(models[target], draft=models[draft] if draft and spec != "none" else None, spec_type=spec,
                     draft_max=DRAFT_MAX, adaptive=False, threads=1, temperature=0, max_tokens=N_TOKENS,
                     chat=False, ngram=NGRAM, ctx_size=512, tuned=False)


def held_rows(drafter) -> int:
    """Hidden-state rows a drafter holds for the sequences it tracks (target rows not yet used)."""
    members = drafter.members() if drafter is not None else []
    n = 0
    for m in members:
        if hasattr(m, "tap"):                      # eagle3 / dflash: the target's layer inputs
            n += sum(len(f.toks) for f in m.tap.seqs.values())
        if hasattr(m, "mtp_n") or type(m).__name__ == "MtpDrafter":   # the target's NextN rows
            n += sum(len(s.h_toks) for s in m._seqs.values())
    return n


def _counts(result) -> tuple[int, int]:
    return result.stats["drafted"], result.stats["accepted"]


@pytest.mark.parametrize("case", list(CASES))
def test_second_prompt_drafts_like_a_fresh_pipeline(models, case):
    _, _, a, b = CASES[case]
    order = [a, b]

    with _generator(models, case, "none") as g:
        plain = {p: g.generate(p).tokens for p in (a, b)}

    # the reference: each prompt alone on a fresh pipeline (or, for a shared pool, without reuse)
    ref: dict[int, tuple[int, int]] = {}
    if case in SHARED_STATE:
        with _generator(models, case) as g:
            for i, p in enumerate(order + order):
                g.pipeline.engine.cached.clear()   # no prefix reuse: the prompt is evaluated whole
                ref[i] = _counts(g.generate(p))
    else:
        fresh = {}
        for p in (a, b):
            with _generator(models, case) as g:
                fresh[p] = _counts(g.generate(p))
        ref = {i: fresh[p] for i, p in enumerate(order + order)}
    assert ref[1][0] > 0, f"{case}: prompt B must draft for this test to mean anything"

    with _generator(models, case) as g:
        drafter = g.pipeline.drafter
        held: list[list[int]] = []   # rows held after each step (the prompt's rows wait for the first)

        def watch(*_):
            held[-1].append(held_rows(drafter))

        got = []
        for p in order:                      # `run` twice on one Generator
            held.append([])
            got.append(g.generate(p, on_text=watch))
        got += list(g.generate_many(order))  # what `batch` does
        peak = [max(h[1:], default=0) for h in held] + [held_rows(drafter)]

    for i, (p, r) in enumerate(zip(order + order, got)):
        assert r.tokens == plain[p], f"{case}: generation {i} differs from plain decoding"
        assert _counts(r) == ref[i], f"{case}: generation {i} drafted/accepted {_counts(r)}, fresh {ref[i]}"
    # Hidden rows are trimmed as the draft catches up: a few verify batches' worth, not the text.
    bound = 3 * (DRAFT_MAX + 2)
    assert max(peak) <= bound, f"{case}: {peak} hidden-state rows held (bound {bound})"


def test_a_draft_model_evaluates_only_the_new_tokens_of_a_continued_conversation(models):
    """A chat's next turn (or a request back on its server slot) starts with the previous prompt
    and answer: the draft model's KV keeps them, as the target's does, and only the new tokens are
    evaluated in the draft. The output stays plain decoding's."""
    case = "draft-simple"
    first = TINY_A
    with _generator(models, case, "none") as g:
        turn1 = g.generate(first)
        second = first + turn1.text + " and then the fox ran home"
        plain = g.generate(second).tokens

    with _generator(models, case) as g:
        dctx = g.pipeline.drafter.members()[-1].ctx   # (behind the grammar drafter)
        evaluated: list[int] = []
        real_decode = dctx.decode

        def counting(tokens, *args, **kw):
            evaluated.append(len(tokens))
            return real_decode(tokens, *args, **kw)

        dctx.decode = counting
        g.generate(first)
        evaluated.clear()
        r = g.generate(second)
        prompt_part = evaluated[0]   # the first draft: the prompt's tokens the draft had not seen, and what came since

    assert r.tokens == plain
    assert r.stats["n_prompt_cached"] > 0
    # the draft reads the prompt at its first draft (drafters/model.py), with at most SYNC_WINDOW
    # tokens generated before it: never the conversation again
    from llamaspec.speculative.drafters.model import SYNC_WINDOW

    assert prompt_part <= r.n_prompt - r.stats["n_prompt_cached"] + SYNC_WINDOW, (prompt_part, r.n_prompt, r.stats)
    assert r.stats["drafted"] > 0
