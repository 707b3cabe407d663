"""Speculation on a recurrent target (and draft): rollback by sequence checkpoints is lossless.

llama.cpp cannot remove the tail of a Mamba sequence, so when a draft is only partly accepted the
engine restores the state saved before the verify batch and replays `[last] + accepted`; a
recurrent draft model rolls back its own context the same way. The models are tiny `mamba` GGUFs
(llamaspec.testing.tiny_recurrent): a 2-layer target, a copy of it (drafts always accepted), its
first layer alone (usually accepted, sometimes not) and an unrelated model (almost always rejected).
"""

from __future__ import annotations

import numpy as np
import pytest

import llamaspec.speculative.sequence as sequence_mod
from engine_helpers import PROMPTS, assert_lossless, generate, prompt_tokens
from llamaspec.speculative.drafters.model import ModelDrafter
from llamaspec.runtime.llama import Model
from llamaspec.runtime.context import Context, ContextConfig
from llamaspec.speculative.metrics import SpecStats
from llamaspec.testing.tiny_recurrent import GENERATOR_VERSION, make_recurrent_set
from llamaspec.speculative.verify import SamplingParams, target_distribution

N = 48


@pytest.fixture(scope="session")
def recurrent_models(test_models_dir):
    return make_recurrent_set(test_models_dir / f"recurrent-v{GENERATOR_VERSION}")


@pytest.fixture(scope="module")
def mamba(recurrent_models):
    m = Model(recurrent_models["target"])
    yield m
    m.close()


@pytest.fixture
def steps(monkeypatch):
    """(drafted, accepted) of every engine step, whatever builds the engine."""
    log: list[tuple[int, int]] = []

    class Recording(SpecStats):
        def record_step(self, n_drafted, n_accepted, n_new, source=""):
            log.append((n_drafted, n_accepted))
            super().record_step(n_drafted, n_accepted, n_new, source)

    monkeypatch.setattr(sequence_mod, "SpecStats", Recording)
    return log


@pytest.fixture
def restores(monkeypatch):
    """Paths of the models whose context restored a checkpoint, one entry per restore."""
    log: list[str] = []
    real = Context.load_seq

    def spy(self, state, seq_id):
        log.append(self.model.path.stem)
        return real(self, state, seq_id)

    monkeypatch.setattr(Context, "load_seq", spy)
    return log


def _partial(steps) -> int:
    return sum(1 for d, a in steps if 0 < a < d)


def _echo_prompt(target: Model, text: str) -> list[int]:
    """prompt + the target's own greedy continuation + prompt again: an n-gram drafter proposes the
    continuation, which the target then follows for a while (its state is short-lived) and leaves."""
    p = prompt_tokens(target, text)
    return p + generate(target, "none", p, n=40).tokens + p


SHORT_PROMPTS = {k: v for k, v in PROMPTS.items() if k != "code"}  # echoed, "code" overflows n_ctx


# ---- the model really is what the engine has to work around -------------------------------------
def test_tiny_mamba_cannot_drop_a_tail(mamba):
    import llama_cpp

    assert llama_cpp.llama_model_is_recurrent(mamba.ptr)
    assert mamba.needs_checkpoints
    ctx = Context(mamba, ContextConfig(n_ctx=256, n_threads=1))
    try:
        toks = prompt_tokens(mamba, PROMPTS["chat"])
        ctx.decode(toks, 0, 0)
        assert ctx.seq_pos_max(0) == len(toks) - 1
        assert ctx.seq_rm(0, len(toks) - 3, -1) is False  # the reason for checkpoints
        assert ctx.seq_pos_max(0) == len(toks) - 1         # and nothing was removed
        assert ctx.seq_rm(0, 0, -1) is True                # a whole sequence can go
        assert ctx.seq_pos_max(0) == -1
    finally:
        ctx.close()


def test_checkpoint_restore_and_replay_equals_straight_decode(mamba):
    toks = prompt_tokens(mamba, PROMPTS["story"])
    head, tail = toks[:-6], toks[-6:]
    ctx = Context(mamba, ContextConfig(n_ctx=256, n_threads=1))
    ref_ctx = Context(mamba, ContextConfig(n_ctx=256, n_threads=1))
    try:
        ctx.decode(head, 0, 0, outputs=0)
        state = ctx.save_seq(0)
        ctx.decode([7, 8, 9, 10], len(head), 0, outputs=0)   # a rejected "draft"
        ctx.load_seq(state, 0)
        assert ctx.seq_pos_max(0) == len(head) - 1
        n = ctx.decode(tail, len(head), 0, outputs="all")
        got = ctx.logits(n).copy()
        n = ref_ctx.decode(toks, 0, 0, outputs=len(tail))
        ref = ref_ctx.logits(n).copy()
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-3)
        # The state carries the history: without the restore the same tokens give other logits,
        # so a wrong rollback would show in the outputs below.
        ctx.seq_rm(0, 0, -1)
        ctx.decode(head + [7, 8], 0, 0, outputs=0)
        n = ctx.decode(tail, len(head) + 2, 0, outputs="all")
        assert np.abs(ctx.logits(n) - ref).max() > 1.0
    finally:
        ctx.close()
        ref_ctx.close()


# ---- greedy: identical to plain decoding ----------------------------------------------------------
@pytest.mark.parametrize("draft", ["same", "draft", "other"])
def test_greedy_draft_model_lossless(mamba, recurrent_models, steps, restores, draft):
    notes, n_rejecting = [], 0
    for name, text in PROMPTS.items():
        prompt = prompt_tokens(mamba, text)
        ref = generate(mamba, "none", prompt, n=N)
        steps.clear()
        got = generate(mamba, "draft", prompt, draft=recurrent_models[draft], n=N, adaptive=False, draft_max=4)
        n_rejecting += sum(1 for d, a in steps if a < d)
        assert len(got.tokens) == len(ref.tokens) == N
        notes.append(assert_lossless(mamba, prompt, ref.tokens, got.tokens, eps=1e-3, label=f"{draft}/{name}"))
        s = got.stats
        assert s.drafts >= 5
        if draft == "same":  # the draft is the target: (nearly) everything is accepted
            assert s.accepted >= 0.95 * s.drafted
        elif draft == "draft":
            assert _partial(steps) >= 1, f"{name}: no partial acceptance in {steps}"
        else:
            assert s.acceptance < 0.2
    # One target checkpoint restored per step that rejected a draft token, and only then.
    assert restores.count("target") == n_rejecting
    if draft != "same":  # the recurrent draft model rolled its own state back by checkpoint too
        assert n_rejecting >= 10 and restores.count(draft) >= 10, restores
    print("\n".join(notes))


@pytest.mark.parametrize("spec", ["ngram-simple", "draft,ngram-simple"])
def test_greedy_ngram_lossless_with_partial_acceptance(mamba, recurrent_models, steps, restores, spec):
    n_partial = 0
    for name, text in SHORT_PROMPTS.items():
        prompt = _echo_prompt(mamba, text)
        ref = generate(mamba, "none", prompt, n=N)
        steps.clear()
        # A fixed draft length: the adaptive one follows measured step times, so which drafts are
        # only partly accepted would vary from run to run.
        got = generate(mamba, spec, prompt, draft=recurrent_models["draft"], n=N, adaptive=False, draft_max=8)
        print(assert_lossless(mamba, prompt, ref.tokens, got.tokens, eps=1e-3, label=f"{spec}/{name}"))
        assert got.stats.accepted > 0
        n_partial += _partial(steps)
    assert n_partial >= len(SHORT_PROMPTS)
    assert restores.count("target") >= n_partial


def test_draft_model_rollback_drafts_what_a_fresh_context_drafts(mamba, recurrent_models, monkeypatch):
    """The recurrent draft model's state after rollbacks is right: each draft equals the greedy
    continuation of the draft model run from scratch on the same history."""
    calls: list[tuple[list[int], list[int]]] = []
    real = ModelDrafter.propose

    def spy(self, seq_id, history, n_max):
        d = real(self, seq_id, history, n_max)
        calls.append((list(history), list(d.tokens)))
        return d

    monkeypatch.setattr(ModelDrafter, "propose", spy)
    prompt = prompt_tokens(mamba, PROMPTS["story"])
    got = generate(mamba, "draft", prompt, draft=recurrent_models["draft"], n=N, adaptive=False, draft_max=4)
    assert got.stats.accepted < got.stats.drafted and len(calls) >= 8
    dm = Model(recurrent_models["draft"])
    try:
        for history, draft in calls:
            ctx = Context(dm, ContextConfig(n_ctx=1024, n_threads=1))
            n = ctx.decode(history, 0, 0)
            want = []
            for _ in range(len(draft)):
                want.append(int(ctx.logits(n)[0].argmax()))
                n = ctx.decode(want[-1:], len(history) + len(want) - 1, 0)
            ctx.close()
            assert draft == want
    finally:
        dm.close()


# ---- T > 0 --------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["draft", "ngram-simple"])
def test_sampling_same_seed_same_output(mamba, recurrent_models, steps, spec):
    prompt = _echo_prompt(mamba, PROMPTS["story"])
    kw = dict(adaptive=False, draft_max=4) if spec == "draft" else {}
    runs, rollbacks = {}, 0
    for seed in range(42, 50):  # sampled text repeats (n-gram drafts) for some seeds only
        sp = SamplingParams(temperature=0.7, top_k=3, seed=seed)
        steps.clear()
        a = generate(mamba, spec, prompt, draft=recurrent_models["draft"], n=N, sampling=sp, **kw)
        rollbacks += sum(1 for d, acc in steps if acc < d)
        b = generate(mamba, spec, prompt, draft=recurrent_models["draft"], n=N, sampling=sp, **kw)
        assert a.tokens == b.tokens, f"seed {seed}: same seed, different output"
        runs[seed] = a.tokens
        # Every sampled token is one the target could sample after the true history (its top 3):
        # a state left dirty by a rejected draft would soon give tokens outside it.
        ctx = Context(mamba, ContextConfig(n_ctx=1024, n_threads=1))
        n = ctx.decode(prompt + a.tokens[:-1], 0, 0, outputs=len(a.tokens))
        rows = ctx.logits(n)
        for i, tok in enumerate(a.tokens):
            assert target_distribution(rows[i].copy(), sp, ())[tok] > 0, f"seed {seed}: token {i} impossible"
        ctx.close()
    assert rollbacks >= 2, "drafts must be rejected (checkpoints restored) for this test to mean anything"
    assert len({tuple(t) for t in runs.values()}) > 1, "different seeds should sample differently"


# ---- hybrid models: the checkpoint holds only the recurrent part ----------------------------------
def write_lfm2_model(path, *, kinds: str = "cac", seed: int = 97, n_embd: int = 64, n_head: int = 4,
                     n_head_kv: int = 2, n_ff: int = 128, l_cache: int = 3, n_layer_same: int | None = None):
    """A tiny `lfm2` GGUF (F32): a hybrid of short-convolution layers ("c", recurrent state) and
    attention layers ("a", KV cache), on the shared tiny BPE vocabulary. Layer il's weights depend
    on (seed, il) only, so a model with the first layers of another agrees with it often."""
    import gguf

    from llamaspec.testing.tiny_models import atomic_write, finish_model, normal_weights, shared_weights, bpe_vocab

    vocab = bpe_vocab()
    hd = n_embd // n_head

    def fill(tmp):
        w = gguf.GGUFWriter(str(tmp), "lfm2")
        w.add_name("tiny-lfm2")
        w.add_context_length(2048)
        w.add_embedding_length(n_embd)
        w.add_feed_forward_length(n_ff)
        w.add_block_count(len(kinds))
        w.add_head_count(n_head)
        w.add_head_count_kv([n_head_kv if k == "a" else 0 for k in kinds])  # 0: a recurrent layer
        w.add_layer_norm_rms_eps(1e-5)
        w.add_rope_freq_base(10000.0)
        w.add_shortconv_l_cache(l_cache)
        w.add_vocab_size(vocab.size)
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        vocab.write_to(w)
        embd, out_norm, head = shared_weights(seed, vocab, n_embd, 4.0, True)
        w.add_tensor("token_embd.weight", embd)
        w.add_tensor("token_embd_norm.weight", out_norm)  # llama.cpp's name for LFM2's output norm
        w.add_tensor("output.weight", head)
        for il, kind in enumerate(kinds):
            s = (seed, 700 + il)
            t = {
                "attn_norm.weight": np.ones(n_embd, np.float32),
                "ffn_norm.weight": np.ones(n_embd, np.float32),
                "ffn_gate.weight": normal_weights(s + (0,), (n_ff, n_embd), 1 / np.sqrt(n_embd)),
                "ffn_up.weight": normal_weights(s + (1,), (n_ff, n_embd), 1 / np.sqrt(n_embd)),
                "ffn_down.weight": normal_weights(s + (2,), (n_embd, n_ff), 0.5 / np.sqrt(n_ff)),
            }
            if kind == "a":
                t.update({
                    "attn_q_norm.weight": np.ones(hd, np.float32),
                    "attn_k_norm.weight": np.ones(hd, np.float32),
                    "attn_q.weight": normal_weights(s + (3,), (n_embd, n_embd), 1 / np.sqrt(n_embd)),
                    "attn_k.weight": normal_weights(s + (4,), (n_head_kv * hd, n_embd), 1 / np.sqrt(n_embd)),
                    "attn_v.weight": normal_weights(s + (5,), (n_head_kv * hd, n_embd), 1 / np.sqrt(n_embd)),
                    "attn_output.weight": normal_weights(s + (6,), (n_embd, n_embd), 1 / np.sqrt(n_embd)),
                })
            else:
                t.update({
                    "shortconv.conv.weight": normal_weights(s + (7,), (n_embd, l_cache), 1 / np.sqrt(l_cache)),
                    "shortconv.in_proj.weight": normal_weights(s + (8,), (3 * n_embd, n_embd), 1 / np.sqrt(n_embd)),
                    "shortconv.out_proj.weight": normal_weights(s + (9,), (n_embd, n_embd), 1 / np.sqrt(n_embd)),
                })
            for k, v in t.items():
                w.add_tensor(f"blk.{il}.{k}", np.ascontiguousarray(v, dtype=np.float32))
        finish_model(w)

    return atomic_write(path, fill)


@pytest.fixture(scope="module")
def hybrid_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("lfm2")
    return {"target": write_lfm2_model(d / "tiny-lfm2-target.gguf", kinds="cacac"),
            "draft": write_lfm2_model(d / "tiny-lfm2-draft.gguf", kinds="cac")}


@pytest.fixture(scope="module")
def lfm2(hybrid_models):
    m = Model(hybrid_models["target"])
    yield m
    m.close()


def test_hybrid_checkpoint_is_the_recurrent_part_and_restores_exactly(lfm2):
    import llama_cpp

    assert llama_cpp.llama_model_is_hybrid(lfm2.ptr) and lfm2.needs_checkpoints
    toks = prompt_tokens(lfm2, PROMPTS["story"])
    head, tail = toks[:-6], toks[-6:]
    ctx = Context(lfm2, ContextConfig(n_ctx=256, n_threads=1))
    ref_ctx = Context(lfm2, ContextConfig(n_ctx=256, n_threads=1))
    try:
        ctx.decode(head, 0, 0, outputs=0)
        assert ctx.seq_rm(0, len(head) - 2, -1) is False  # the recurrent part cannot be cut
        state = ctx.save_seq(0)
        # Only the recurrent part: much smaller than the whole state, attention KV included.
        full = llama_cpp.llama_state_seq_get_size(ctx.ptr, 0)
        assert len(state) < full / 3, (len(state), full)
        ctx.decode([7, 8, 9, 10], len(head), 0, outputs=0)   # a rejected "draft"
        ctx.load_seq(state, 0)
        assert ctx.seq_pos_max(0) == len(head) - 1           # attention tail cut, recurrent back
        n = ctx.decode(tail, len(head), 0, outputs="all")
        got = ctx.logits(n).copy()
        n = ref_ctx.decode(toks, 0, 0, outputs=len(tail))
        ref = ref_ctx.logits(n).copy()
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-3)
        # The checkpoint is a bytes-like object and loads as bytes too (same result).
        ctx.decode([7, 8], len(toks), 0, outputs=0)
        ctx.load_seq(bytes(state), 0)
        n = ctx.decode(tail, len(head), 0, outputs="all")
        np.testing.assert_allclose(ctx.logits(n), ref, rtol=0, atol=1e-3)
        # Both parts carry the history: restoring the recurrent part alone over attention KV
        # of other tokens gives other logits, so a wrong cut would show above.
        ctx.seq_rm(0, 0, -1)
        ctx.decode([5] * len(head), 0, 0, outputs=0)
        ctx.load_seq(state, 0)
        n = ctx.decode(tail, len(head), 0, outputs="all")
        assert np.abs(ctx.logits(n) - ref).max() > 1.0
    finally:
        ctx.close()
        ref_ctx.close()


def test_hybrid_greedy_draft_model_lossless(lfm2, hybrid_models, steps, restores):
    """A hybrid target with a hybrid draft model (its first layers): both roll back by restoring
    the recurrent part and cutting the attention part; the output is plain decoding's."""
    n_rejecting = n_partial = n_accepted = 0
    for name, text in PROMPTS.items():
        prompt = prompt_tokens(lfm2, text)
        ref = generate(lfm2, "none", prompt, n=N)
        steps.clear()
        got = generate(lfm2, "draft", prompt, draft=hybrid_models["draft"], n=N, adaptive=False, draft_max=4)
        n_rejecting += sum(1 for d, a in steps if a < d)
        n_partial += _partial(steps)
        n_accepted += got.stats.accepted
        print(assert_lossless(lfm2, prompt, ref.tokens, got.tokens, eps=1e-3, label=f"hybrid/{name}"))
        assert len(got.tokens) == N
    # partly accepted drafts: the restore + cut + replay path ran, and the output stayed exact
    assert n_partial >= 3 and n_accepted > 0, (n_partial, n_accepted)
    assert restores.count("tiny-lfm2-target") == n_rejecting
    assert restores.count("tiny-lfm2-draft") >= 3, restores
