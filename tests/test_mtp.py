"""`draft-mtp`: drafting with the target's own NextN/MTP heads (tiny mimo2 models).

The standard tiny `mtp` model's NextN block is aligned with the trunk (eh_proj = [I | 0]): it
ignores the target's hidden state, so high acceptance alone does not prove the (token p, h p-1)
pairing. `test_first_draft_token_matches_oracle` does, on a variant whose NextN block reads h.
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import numpy as np
import pytest

import llama_cpp
import llama_cpp.llama_cpp_ext as llama_ext

from engine_helpers import PROMPTS, assert_lossless, generate, prompt_tokens
from llamaspec.speculative.drafters.mtp import MtpDrafter
from llamaspec.speculative.engine import GenerationConfig, SpecEngine
from llamaspec.errors import UsageError
from llamaspec.speculative.options import SpecOptions
from llamaspec.speculative.pipeline import load_pipeline
from llamaspec.runtime.llama import Model
from llamaspec.runtime.context import Context, ContextConfig
from llamaspec.speculative.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def mtp_model(tiny_models):
    m = Model(tiny_models["mtp"], load_mtp=True)
    yield m
    m.close()


def write_mimo2(path: Path, *, n_nextn: int = 1, h_mix: float = 0.0) -> Path:
    """The tiny MTP model with `n_nextn` NextN blocks (chained heads) and an eh_proj whose
    hidden-state half is a random matrix scaled by h_mix (0: the aligned model's [I | 0])."""
    from llamaspec.testing.tiny_models import write_mtp_model

    return write_mtp_model(path, n_nextn=n_nextn, h_mix=h_mix, name="tiny-mtp-variant")


# ---- lossless, and the aligned heads get their drafts accepted -----------------------------------
def test_greedy_lossless_and_accepted(mtp_model):
    drafted = accepted = 0
    for name, text in PROMPTS.items():
        prompt = prompt_tokens(mtp_model, text)
        ref = generate(mtp_model, "none", prompt, n=64)
        # fixed length (llama.cpp's default 3): acceptance of the heads is the point here; whether
        # drafting pays on a tiny model is the adaptive controller's call, by timings
        got = generate(mtp_model, "mtp", prompt, n=64, adaptive=False, draft_max=3)
        assert len(got.tokens) == len(ref.tokens) == 64
        assert_lossless(mtp_model, prompt, ref.tokens, got.tokens, eps=1e-3, label=f"mtp/{name}")
        assert got.stats.drafts > 0, f"{name}: no drafts"
        drafted += got.stats.drafted
        accepted += got.stats.accepted
    assert accepted / drafted > 0.6, f"acceptance {accepted}/{drafted}"


@pytest.mark.parametrize("k, min_acceptance", [(1, 0.85), (3, 0.8)])
def test_fixed_k_acceptance(mtp_model, k, min_acceptance):
    # llama.cpp's default --spec-draft-n-max is 3; measured here: k=1 99%, k=3 93%.
    drafted = accepted = 0
    for name, text in PROMPTS.items():
        prompt = prompt_tokens(mtp_model, text)
        ref = generate(mtp_model, "none", prompt, n=48)
        got = generate(mtp_model, "mtp", prompt, n=48, adaptive=False, draft_max=k)
        assert got.tokens == ref.tokens, name
        assert len(got.stats.drafted_per_position) <= k
        drafted += got.stats.drafted
        accepted += got.stats.accepted
    assert drafted > 0 and accepted / drafted > min_acceptance, f"k={k}: {accepted}/{drafted}"


def _long_prompt(model: Model, n: int = 800) -> list[int]:
    """n prompt tokens (more than one n_batch of 512), from the test prompts."""
    text = " ".join(PROMPTS.values())
    toks = model.tokenize_prompt(text)
    while len(toks) < n:
        text += " " + text
        toks = model.tokenize_prompt(text)
    return toks[:n]


def test_long_prompt_over_several_batches(mtp_model):
    # > n_batch (512) prompt tokens: the target evaluates the prompt in chunks; the drafter must
    # have caught up on all of them (its listener adds confirmed chunks as they pass).
    prompt = _long_prompt(mtp_model)
    ref = generate(mtp_model, "none", prompt, n=48)
    got = generate(mtp_model, "mtp", prompt, n=48, adaptive=False, draft_max=3)
    assert got.tokens == ref.tokens
    assert got.stats.acceptance > 0.7


def test_p_min_stops_unsure_drafts(mtp_model):
    """llama.cpp's p_min: a draft stops at the first token whose top-10 probability is below p_min."""
    prompt = prompt_tokens(mtp_model, PROMPTS["story"])
    ref = generate(mtp_model, "none", prompt, n=48)
    runs = {}
    for p_min in (0.0, 0.6, 1.0):
        ctx = Context(mtp_model, ContextConfig(n_ctx=1024, n_threads=1))
        drafter = MtpDrafter(mtp_model, ctx, p_min=p_min)
        g = SpecEngine(mtp_model, ctx, drafter).generate(
            prompt, GenerationConfig(max_tokens=48, sampling=SamplingParams(temperature=0), draft_max=4,
                                     adaptive=False))
        drafter.close()
        ctx.close()
        assert g.tokens == ref.tokens, p_min
        runs[p_min] = g.stats
    assert runs[1.0].drafted == 0                     # nothing is ever that sure among 10 candidates
    assert 0 < runs[0.6].drafted < runs[0.0].drafted  # fewer, surer drafts
    assert runs[0.6].acceptance >= runs[0.0].acceptance


def test_chained_with_ngram(mtp_model):
    prompt = prompt_tokens(mtp_model, PROMPTS["repetitive"])
    ref = generate(mtp_model, "none", prompt, n=64)
    got = generate(mtp_model, "ngram-simple,mtp", prompt, n=64)
    assert got.tokens == ref.tokens


def test_sampling_same_seed_same_output(mtp_model):
    prompt = prompt_tokens(mtp_model, PROMPTS["story"])
    for seed in (1, 42):
        sp = SamplingParams(temperature=0.9, seed=seed)
        a = generate(mtp_model, "mtp", prompt, n=40, sampling=sp, adaptive=False, draft_max=3)
        b = generate(mtp_model, "mtp", prompt, n=40, sampling=sp, adaptive=False, draft_max=3)
        assert a.tokens == b.tokens
        assert a.stats.drafted > 0 and a.stats.accepted > 0
        # Sample-and-match draws one sample per emitted token from the same generator, in order,
        # exactly as plain decoding does: with the same seed the output is plain decoding's.
        plain = generate(mtp_model, "none", prompt, n=40, sampling=sp)
        assert a.tokens == plain.tokens


# ---- the wiring: (token p, target h p-1), the MTP KV in step with the sequence ----------------------
def _oracle_first_tokens(model: Model, seq: list[int]) -> np.ndarray:
    """argmax of the MTP head at every position p of `seq`, fed (seq[p], target h[p-1]) in one batch."""
    n = len(seq)
    cfg = ContextConfig(n_ctx=2048, n_batch=2048, n_threads=1)
    tctx = Context(model, cfg)
    mctx = Context(model, cfg, ctx_type=llama_cpp.LLAMA_CONTEXT_TYPE_MTP, ctx_other=tctx.ptr)
    batch = llama_cpp.llama_batch_init(n, model.n_embd, 1)
    toks = (llama_cpp.llama_token * n)(*seq)
    batch.token = toks
    try:
        llama_ext.llama_set_embeddings_nextn(tctx.ptr, True, False)
        llama_ext.llama_set_embeddings_nextn(mctx.ptr, True, True)
        tctx.decode(seq, 0, 0, "last")
        h = np.ctypeslib.as_array(llama_ext.llama_get_embeddings_nextn(tctx.ptr), shape=(n, model.n_embd)).copy()
        embd = np.ctypeslib.as_array(batch.embd, shape=(n, model.n_embd))
        embd[0] = 0.0
        embd[1:] = h[:-1]
        for i in range(n):
            batch.pos[i] = i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1
        batch.n_tokens = n
        assert llama_cpp.llama_decode(mctx.ptr, batch) == 0
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits(mctx.ptr), shape=(n, model.n_vocab)).argmax(1)
    finally:
        batch.token = ctypes.POINTER(llama_cpp.llama_token)()
        llama_cpp.llama_batch_free(batch)
        mctx.close()
        tctx.close()


@pytest.mark.parametrize("long_prompt", [False, True])
def test_first_draft_token_matches_oracle(tmp_path, long_prompt):
    """Each draft's first token is what the MTP head predicts from the target's own states of the
    final sequence: the catch-up feeds (token p, target h p-1) and keeps the MTP KV = the sequence.
    The model's NextN block reads h (h_mix), so a pairing off by one would disagree."""
    model = Model(write_mimo2(tmp_path / "mix.gguf", h_mix=1.0), load_mtp=True)
    ctx = Context(model, ContextConfig(n_ctx=2048, n_threads=1))
    drafter = MtpDrafter(model, ctx)
    firsts: list[tuple[int, int]] = []
    in_step: list[bool] = []
    orig = drafter.propose

    def propose(seq_id, history, n_max):
        d = orig(seq_id, history, n_max)
        if d:
            firsts.append((len(history) - 1, d.tokens[0]))
        s = drafter._seqs[seq_id]
        # MTP KV after drafting: exactly positions 0..n, the tokens of the sequence.
        in_step.append(drafter.ctx.seq_pos_max(seq_id) == len(history) - 1 and s.mtp_toks == list(history))
        return d

    drafter.propose = propose
    engine = SpecEngine(model, ctx, drafter)
    prompt = _long_prompt(model, 1100) if long_prompt else model.tokenize_prompt(PROMPTS["story"])
    try:
        g = engine.generate(prompt, GenerationConfig(max_tokens=48, sampling=SamplingParams(temperature=0),
                                                     draft_max=3, adaptive=False))
        seq = prompt + g.tokens
        oracle = _oracle_first_tokens(model, seq)
    finally:
        drafter.close()
        ctx.close()
        model.close()
    assert len(firsts) > 10 and all(in_step)
    agree = sum(int(oracle[n]) == tok for n, tok in firsts)
    assert agree == len(firsts), f"first draft tokens agree with the oracle {agree}/{len(firsts)}"


def test_chained_heads(tmp_path):
    """Two NextN layers (step35-style chained heads): step i drafts with head i, n_max <= 2."""
    model = Model(write_mimo2(tmp_path / "two.gguf", n_nextn=2), load_mtp=True)
    try:
        assert model.n_nextn == 2
        drafted = accepted = 0
        for name in ("chat", "story"):
            prompt = prompt_tokens(model, PROMPTS[name])
            ref = generate(model, "none", prompt, n=48)
            got = generate(model, "mtp", prompt, n=48, adaptive=False, draft_max=4)
            assert got.tokens == ref.tokens, name
            assert 0 < len(got.stats.drafted_per_position) <= 2
            drafted += got.stats.drafted
            accepted += got.stats.accepted
        assert accepted / drafted > 0.7
    finally:
        model.close()


def test_close_detaches_from_target(mtp_model):
    ctx = Context(mtp_model, ContextConfig(n_ctx=256, n_threads=1))
    drafter = MtpDrafter(mtp_model, ctx)
    assert ctx._decode_listeners
    drafter.close()
    assert not ctx._decode_listeners
    engine = SpecEngine(mtp_model, ctx)  # the target context still works on its own
    g = engine.generate(prompt_tokens(mtp_model, PROMPTS["chat"]), GenerationConfig(max_tokens=8))
    assert len(g.tokens) == 8
    ctx.close()


# ---- errors ---------------------------------------------------------------------------------------
def test_model_without_mtp_heads_is_a_usage_error(tiny_models):
    with pytest.raises(UsageError, match="no MTP heads; use --spec-type draft or ngram-mod"):
        load_pipeline(tiny_models["target"], SpecOptions(spec_types=["draft-mtp"], n_ctx=256, n_threads=1))


def test_target_loaded_without_mtp_layers_is_a_usage_error(tiny_models):
    # Creating an MTP context on such a model would abort the process: refuse before that.
    m = Model(tiny_models["mtp"])
    ctx = Context(m, ContextConfig(n_ctx=256, n_threads=1))
    try:
        with pytest.raises(UsageError, match="without its MTP layers"):
            MtpDrafter(m, ctx)
    finally:
        ctx.close()
        m.close()


# ---- CLI ------------------------------------------------------------------------------------------
def test_cli_run_spec_type_mtp(run_cli, tiny_models):
    args = ("run", tiny_models["mtp"], "--raw", "-p", "hello", "-n", "20", "--temp", "0", "--json",
            "--threads", "1")
    # a fixed draft length: adaptive drafting on a tiny model follows noise-level timings
    r = run_cli(*args, "--spec-type", "mtp", "--fixed-draft")
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    plain = json.loads(run_cli(*args).stdout)
    assert out["spec_type"] == "draft-mtp"
    assert out["tokens"] == plain["tokens"] and out["n_generated"] == 20
    assert out["drafted"] > 0 and out["accepted"] > 0


def test_cli_mtp_on_model_without_heads(run_cli, tiny_models):
    r = run_cli("run", tiny_models["target"], "--raw", "-p", "hello", "-n", "4", "--spec-type", "mtp",
                "--threads", "1")
    assert r.exit_code == 2
    assert "no MTP heads" in r.stderr
