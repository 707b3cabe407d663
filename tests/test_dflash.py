"""`draft-dflash` and `draft-dspark`: block-diffusion drafts over injected target features.

Tiny models (llamaspec/testing/tiny_spec_drafts.py), block size 8: `dflash` is aligned with
`bigram_target` on its first block position only (uniform attention reads the anchor token),
`dspark`'s Markov head is the bigram itself, so its whole block follows the target; the `_random`
variants use the target's embeddings and head (ctx_other) with random weights.
Losslessness is checked through the CLI, as users run it, against `--spec-type none`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_helpers import PROMPTS, generate, prompt_tokens
from llamaspec.errors import UsageError
from llamaspec.runtime.context import Context, ContextConfig
from llamaspec.runtime.llama import Model
from llamaspec.speculative.drafters.dflash import DFlashDrafter
from llamaspec.testing.tiny_models import GENERATOR_VERSION
from llamaspec.testing.tiny_spec_drafts import make_spec_draft_set, write_dflash_model

COMMON = ("--temp", "0", "--json", "--threads", "1", "-n", "48")
KINDS = ("dflash", "dspark")


@pytest.fixture(scope="module")
def spec_drafts(test_models_dir) -> dict[str, Path]:
    return make_spec_draft_set(test_models_dir / f"tiny-spec-v{GENERATOR_VERSION}")


def _run_pair(run_cli, target: Path, kind: str, draft: Path, prompt: str, *extra: str) -> tuple[dict, dict]:
    spec = run_cli("run", target, "-p", prompt, *COMMON, "--spec-type", f"draft-{kind}", "--draft", draft, *extra)
    assert spec.exit_code == 0, spec.stderr
    plain = run_cli("run", target, "-p", prompt, *COMMON, "--spec-type", "none", *extra)
    assert plain.exit_code == 0, plain.stderr
    return spec.json(), plain.json()


# ---- lossless through the CLI, and the aligned drafts get their drafts accepted ------------------
@pytest.mark.parametrize("kind, min_acceptance", [("dflash", 0.1), ("dspark", 0.4)])
def test_cli_aligned_lossless_and_accepted(run_cli, spec_drafts, kind, min_acceptance):
    # measured with whole blocks (7-8 tokens a draft): dflash ~15% (its first block position ~96%,
    # the rest ~0: uniform attention reads only the last token), dspark ~65% (whole blocks)
    drafted = accepted = 0
    for name, text in PROMPTS.items():
        # --fixed-draft: acceptance of the drafts is the point here; whether drafting pays is the
        # adaptive controller's call, by timings that mean little on tiny models
        got, ref = _run_pair(run_cli, spec_drafts["bigram_target"], kind, spec_drafts[kind], text, "--fixed-draft")
        assert got["spec_type"] == f"draft-{kind}"
        assert got["tokens"] == ref["tokens"], name
        assert got["n_generated"] == 48
        drafted += got["drafted"]
        accepted += got["accepted"]
    assert drafted > 0 and accepted / drafted > min_acceptance, f"{kind}: acceptance {accepted}/{drafted}"


@pytest.mark.parametrize("kind", KINDS)
def test_cli_random_draft_lossless_on_standard_target(run_cli, spec_drafts, tiny_models, kind):
    got, ref = _run_pair(run_cli, tiny_models["target"], kind, spec_drafts[f"{kind}_random"], PROMPTS["story"],
                         "--draft-max", "4", "--fixed-draft")
    assert got["tokens"] == ref["tokens"]
    assert got["drafted"] > 0


@pytest.mark.parametrize("kind, cap", [("dflash", 7), ("dspark", 8)])
def test_block_caps_the_draft_length(spec_drafts, kind, cap):
    """block_size 8: DFlash drafts at most 7 (the anchor takes a slot), anchor-first DSpark 8;
    asking for more is clamped, as in llama.cpp."""
    target = Model(spec_drafts["bigram_target"])
    try:
        prompt = prompt_tokens(target, PROMPTS["repetitive"])
        ref = generate(target, "none", prompt, n=40)
        got = generate(target, f"draft-{kind}", prompt, draft=spec_drafts[kind], n=40, adaptive=False, draft_max=20)
        assert got.tokens == ref.tokens
        assert len(got.stats.drafted_per_position) == cap
        assert got.stats.accepted > 0
    finally:
        target.close()


@pytest.mark.parametrize("kind", KINDS)
def test_long_prompt_and_reused_prefix(spec_drafts, kind):
    """A prompt longer than n_batch (injected in several batches), then a second prompt extending
    the first generation on the same pipeline (the target's cached prefix and the injected rows
    are reused)."""
    from llamaspec.speculative.options import SpecOptions
    from llamaspec.speculative.pipeline import load_pipeline
    from llamaspec.speculative.sampling_params import SamplingParams

    target = Model(spec_drafts["bigram_target"])
    try:
        prompt = target.tokenize_prompt(" ".join(PROMPTS.values()))
        while len(prompt) < 700:
            prompt = prompt + prompt[1:]
        sampling = SamplingParams(temperature=0.0)
        outs = {}
        for spec in ("none", f"draft-{kind}"):
            opts = SpecOptions(spec_types=[spec] if spec != "none" else [], n_ctx=2048, n_threads=1,
                               draft_path=spec_drafts[kind] if spec != "none" else None)
            pipe = load_pipeline(target.path, opts, sampling, target=target)
            try:
                first = pipe.engine.generate(prompt, pipe.config(max_tokens=24, sampling=sampling))
                second = pipe.engine.generate(prompt + first.tokens + prompt[1:40],
                                              pipe.config(max_tokens=24, sampling=sampling))
                outs[spec] = (first.tokens, second.tokens, second.stats)
            finally:
                pipe.close(keep_target=True)
        assert outs[f"draft-{kind}"][:2] == outs["none"][:2]
        assert outs[f"draft-{kind}"][2].accepted > 0
    finally:
        target.close()


# ---- DSpark's confidence head and --draft-p-min -------------------------------------------------
def test_dspark_confidence_gates_drafts(spec_drafts):
    # The tiny confidence head says ~0.99 everywhere: p_min 0.5 keeps whole blocks, 0.999 none.
    target = Model(spec_drafts["bigram_target"])
    draft = Model(spec_drafts["dspark"])
    ctx = Context(target, ContextConfig(n_ctx=256, n_threads=1))
    try:
        prompt = target.tokenize_prompt("The quick brown fox")
        sizes = []
        for p_min in (0.0, 0.5, 0.999):
            d = DFlashDrafter(target, ctx, draft, dspark=True, p_min=p_min, n_threads=1)
            try:
                ctx.seq_rm(0, 0, -1)
                ctx.decode(prompt, 0, 0)  # after the drafter exists: it taps the target's decodes
                sizes.append(len(d.propose(0, prompt + [356], 6)))
            finally:
                d.close()
        assert sizes == [6, 6, 0]
    finally:
        ctx.close()
        draft.close()
        target.close()


def test_dspark_without_confidence_head_refuses_p_min(spec_drafts, tmp_path):
    path = write_dflash_model(tmp_path / "ds-noconf.gguf", dspark=True, confidence_head=False)
    target = Model(spec_drafts["bigram_target"])
    draft = Model(path)
    ctx = Context(target, ContextConfig(n_ctx=128, n_threads=1))
    try:
        with pytest.raises(UsageError, match="no confidence head"):
            DFlashDrafter(target, ctx, draft, dspark=True, p_min=0.5)
        DFlashDrafter(target, ctx, draft, dspark=True, p_min=0.0).close()
    finally:
        ctx.close()
        draft.close()
        target.close()


# ---- refusals ---------------------------------------------------------------------------------
@pytest.mark.parametrize("spec, file, message", [
    ("draft-dspark", "dflash", "is a dflash draft"),
    ("draft-dflash", "dspark", "is a dspark draft"),
    ("draft-dflash", "eagle3", "not a DFlash/DSpark draft"),
])
def test_cli_wrong_draft_kind(run_cli, spec_drafts, spec, file, message):
    r = run_cli("run", spec_drafts["bigram_target"], "-p", "hi", "-n", "4", "--threads", "1",
                "--spec-type", spec, "--draft", spec_drafts[file])
    assert r.exit_code == 2
    assert message in r.stderr
    assert f"--spec-type draft-{file}" in r.stderr  # the hint names the type the file is for


def test_layers_beyond_the_target_refused(spec_drafts, tmp_path):
    bad = write_dflash_model(tmp_path / "df-deep.gguf", aligned=False, target_layers=(1, 5))
    target = Model(spec_drafts["bigram_target"])
    draft = Model(bad)
    ctx = Context(target, ContextConfig(n_ctx=128, n_threads=1))
    try:
        with pytest.raises(UsageError, match=r"reads target layers \[1, 5\].*has 4 layers"):
            DFlashDrafter(target, ctx, draft)
    finally:
        ctx.close()
        draft.close()
        target.close()


def test_parallel_refused(spec_drafts):
    target = Model(spec_drafts["bigram_target"])
    draft = Model(spec_drafts["dflash"])
    ctx = Context(target, ContextConfig(n_ctx=256, n_threads=1, n_seq_max=2))
    try:
        with pytest.raises(UsageError, match="--parallel with draft-dflash"):
            DFlashDrafter(target, ctx, draft)
    finally:
        ctx.close()
        draft.close()
        target.close()
