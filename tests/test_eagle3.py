"""`draft-eagle3`: an EAGLE-3 draft GGUF reading three hidden layers of the target.

Tiny models (llamaspec/testing/tiny_spec_drafts.py): `eagle3` is aligned with `bigram_target`
(its self-attention copies the current token, so each step predicts what a near-bigram target
does), `eagle3_random` has random weights and the target's embeddings and head (ctx_other).
Losslessness is checked through the CLI, as users run it, against `--spec-type none`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_helpers import PROMPTS, generate, prompt_tokens
from llamaspec.errors import UsageError
from llamaspec.runtime.context import Context, ContextConfig
from llamaspec.runtime.llama import Model
from llamaspec.speculative.drafters.eagle3 import Eagle3Drafter
from llamaspec.testing.tiny_models import GENERATOR_VERSION
from llamaspec.testing.tiny_spec_drafts import make_spec_draft_set, write_eagle3_model

COMMON = ("--temp", "0", "--json", "--threads", "1", "-n", "48")


@pytest.fixture(scope="module")
def spec_drafts(test_models_dir) -> dict[str, Path]:
    return make_spec_draft_set(test_models_dir / f"tiny-spec-v{GENERATOR_VERSION}")


def _run_pair(run_cli, target: Path, draft: Path, prompt: str, *extra: str) -> tuple[dict, dict]:
    spec = run_cli("run", target, "-p", prompt, *COMMON, "--spec-type", "draft-eagle3", "--draft", draft, *extra)
    assert spec.exit_code == 0, spec.stderr
    plain = run_cli("run", target, "-p", prompt, *COMMON, "--spec-type", "none", *extra)
    assert plain.exit_code == 0, plain.stderr
    return spec.json(), plain.json()


# ---- lossless through the CLI, and the aligned draft gets its drafts accepted -------------------
def test_cli_aligned_lossless_and_accepted(run_cli, spec_drafts):
    drafted = accepted = 0
    for name, text in PROMPTS.items():
        # --fixed-draft: acceptance is the point here, not whether drafting pays on tiny models
        got, ref = _run_pair(run_cli, spec_drafts["bigram_target"], spec_drafts["eagle3"], text, "--fixed-draft")
        assert got["spec_type"] == "draft-eagle3"
        assert got["tokens"] == ref["tokens"], name
        assert got["n_generated"] == 48
        drafted += got["drafted"]
        accepted += got["accepted"]
    # measured: ~50% over these prompts (the target is ~90% bigram; the draft chains the bigram)
    assert drafted > 0 and accepted / drafted > 0.3, f"acceptance {accepted}/{drafted}"


def test_cli_random_draft_lossless_on_standard_target(run_cli, spec_drafts, tiny_models):
    # Random weights, no token embeddings / head of its own: llama.cpp uses the target's
    # through ctx_other. Drafts are made (and all but never accepted); output unchanged.
    got, ref = _run_pair(run_cli, tiny_models["target"], spec_drafts["eagle3_random"], PROMPTS["story"],
                         "--draft-max", "3", "--fixed-draft")
    assert got["tokens"] == ref["tokens"]
    assert got["drafted"] > 0


def test_cli_aligned_draft_lossless_on_standard_target(run_cli, spec_drafts, tiny_models):
    got, ref = _run_pair(run_cli, tiny_models["target"], spec_drafts["eagle3"], PROMPTS["chat"])
    assert got["tokens"] == ref["tokens"]
    assert got["drafted"] > 0


@pytest.mark.parametrize("k", [1, 4])
def test_fixed_draft_length(spec_drafts, k):
    target = Model(spec_drafts["bigram_target"])
    try:
        drafted = accepted = 0
        for name in ("chat", "story"):
            prompt = prompt_tokens(target, PROMPTS[name])
            ref = generate(target, "none", prompt, n=40)
            got = generate(target, "draft-eagle3", prompt, draft=spec_drafts["eagle3"], n=40, adaptive=False,
                           draft_max=k)
            assert got.tokens == ref.tokens, name
            assert 0 < len(got.stats.drafted_per_position) <= k
            drafted += got.stats.drafted
            accepted += got.stats.accepted
        assert accepted / drafted > 0.3, f"k={k}: {accepted}/{drafted}"
    finally:
        target.close()


# ---- keeping the draft in step ----------------------------------------------------------------
def test_long_prompt_and_reused_prefix(spec_drafts):
    """A prompt longer than n_batch (several target chunks, several catch-up batches), then a second
    prompt extending the first generation: the engine reuses the target's cached prefix, and the
    draft rows built for it stay (they are checked by token)."""
    target = Model(spec_drafts["bigram_target"])
    try:
        text = " ".join(PROMPTS.values())
        prompt = target.tokenize_prompt(text)
        while len(prompt) < 700:
            prompt = prompt + prompt[1:]
        from llamaspec.speculative.options import SpecOptions
        from llamaspec.speculative.pipeline import load_pipeline
        from llamaspec.speculative.sampling_params import SamplingParams

        sampling = SamplingParams(temperature=0.0)
        outs = {}
        for spec in ("none", "draft-eagle3"):
            opts = SpecOptions(spec_types=[spec] if spec != "none" else [], n_ctx=2048, n_threads=1,
                               draft_path=spec_drafts["eagle3"] if spec != "none" else None)
            pipe = load_pipeline(target.path, opts, sampling, target=target)
            try:
                first = pipe.engine.generate(prompt, pipe.config(max_tokens=24, sampling=sampling))
                second = pipe.engine.generate(prompt + first.tokens + prompt[1:40],
                                              pipe.config(max_tokens=24, sampling=sampling))
                outs[spec] = (first.tokens, second.tokens, second.stats)
            finally:
                pipe.close(keep_target=True)
        assert outs["draft-eagle3"][:2] == outs["none"][:2]
        assert outs["draft-eagle3"][2].accepted > 0
    finally:
        target.close()


def test_drafts_depend_on_target_features(spec_drafts):
    """The same history with different target features (different earlier context, same last two
    tokens) must be able to change the draft of the random model: the features reach it."""
    target = Model(spec_drafts["bigram_target"])
    draft = Model(spec_drafts["eagle3_random"])
    ctx = Context(target, ContextConfig(n_ctx=256, n_threads=1))
    d = Eagle3Drafter(target, ctx, draft, n_threads=1)
    try:
        outs = set()
        for head in ([10, 20, 30], [200, 210, 220], [400, 50, 60]):
            hist = [0] + head + [300, 356]
            ctx.seq_rm(0, 0, -1)
            ctx.decode(hist[:-1], 0, 0)
            outs.add(tuple(d.propose(0, hist, 4).tokens))
        assert len(outs) > 1, outs
    finally:
        d.close()
        ctx.close()
        draft.close()
        target.close()


# ---- refusals ---------------------------------------------------------------------------------
def test_cli_needs_draft_model(run_cli, spec_drafts):
    r = run_cli("run", spec_drafts["bigram_target"], "-p", "hi", "-n", "4", "--spec-type", "draft-eagle3")
    assert r.exit_code == 2
    assert "draft" in r.stderr


def test_cli_llama_draft_is_not_eagle3(run_cli, spec_drafts, tiny_models):
    r = run_cli("run", tiny_models["target"], "-p", "hi", "-n", "4", "--threads", "1",
                "--spec-type", "draft-eagle3", "--draft", tiny_models["draft"])
    assert r.exit_code == 2
    assert "not an EAGLE-3 draft" in r.stderr


def test_layers_beyond_the_target_refused(spec_drafts, tmp_path):
    bad = write_eagle3_model(tmp_path / "e3-deep.gguf", aligned=False, target_layers=(1, 2, 9))
    target = Model(spec_drafts["bigram_target"])
    draft = Model(bad)
    ctx = Context(target, ContextConfig(n_ctx=128, n_threads=1))
    try:
        with pytest.raises(UsageError, match=r"reads target layers \[1, 2, 9\].*has 4 layers"):
            Eagle3Drafter(target, ctx, draft)
    finally:
        ctx.close()
        draft.close()
        target.close()


def test_parallel_refused(spec_drafts):
    target = Model(spec_drafts["bigram_target"])
    draft = Model(spec_drafts["eagle3"])
    ctx = Context(target, ContextConfig(n_ctx=256, n_threads=1, n_seq_max=2))
    try:
        with pytest.raises(UsageError, match="--parallel with draft-eagle3"):
            Eagle3Drafter(target, ctx, draft)
    finally:
        ctx.close()
        draft.close()
        target.close()


def test_tiny_files_are_small(spec_drafts):
    sizes = {k: p.stat().st_size for k, p in spec_drafts.items()}
    assert all(s < 2_000_000 for s in sizes.values()), sizes


def test_feature_rows_grow_without_copying_the_whole_block_each_decode():
    """The tap adds a block of rows after every target decode; while drafting is paused nothing
    trims them. Doubling the buffer keeps the copies to O(n): few reallocations for many rows, and
    the rows read back are exactly the ones put in (replaced, cut and trimmed included)."""
    import doctest

    import numpy as np

    from llamaspec.speculative.drafters import eagle3

    assert doctest.testmod(eagle3, raise_on_error=False).failed == 0
    f = eagle3._Feats(0, np.repeat(np.arange(3, dtype=np.float32)[:, None], 4, axis=1), [0, 1, 2])
    buffers = set()
    for p in range(3, 2003):   # position p holds the value p; now and then the last row is redone
        if p % 7 == 0:
            f.put(p - 1 - f.start, np.full((1, 4), p - 1, np.float32), [p - 1])
        f.put(p - f.start, np.full((1, 4), p, np.float32), [p])
        buffers.add(id(f._buf))
    assert len(buffers) <= 12, len(buffers)   # ~log2(2000 / 16) + 1 growths, not one per decode
    assert f.end == 2003 and f.rows[:, 0].tolist() == list(range(2003)) == f.toks
    f.drop_front(1000)
    assert f.start == 1000 and f.rows[:, 0].tolist() == list(range(1000, 2003)) == f.toks
    f.cut(10)
    assert f.end == 1010 and f.rows[:, 0].tolist() == list(range(1000, 1010))
