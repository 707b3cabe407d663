"""The speculative engine on real GGUFs in real llama-cpp-python: lossless, and it really drafts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine_helpers import PROMPTS, assert_lossless, generate, prompt_tokens
from llamaspec.speculative.drafters.base import Draft, Drafter
from llamaspec.speculative.engine import GenerationConfig, SpecEngine, StopStrings
from llamaspec.speculative.options import MAX_DRAFT
from llamaspec.runtime.llama import Model
from llamaspec.runtime.context import Context, ContextConfig
from llamaspec.speculative.sampling_params import SamplingParams

SPEC_TYPES = ["ngram-simple", "ngram-mod", "ngram-map-k", "ngram-map-k4v", "ngram-cache", "draft",
              "draft,ngram-simple"]


@pytest.fixture(scope="module")
def tiny_target(tiny_models):
    m = Model(tiny_models["target"])
    yield m
    m.close()


# ---- greedy: identical tokens -------------------------------------------------------------------
@pytest.mark.parametrize("spec", SPEC_TYPES)
def test_tiny_greedy_lossless(tiny_target, tiny_models, spec):
    for name, text in PROMPTS.items():
        prompt = prompt_tokens(tiny_target, text)
        ref = generate(tiny_target, "none", prompt, n=64)
        got = generate(tiny_target, spec, prompt, draft=tiny_models["draft"], n=64)
        assert len(got.tokens) == len(ref.tokens) == 64
        # Tiny models are F32: no batch-size noise worth a tolerance.
        assert_lossless(tiny_target, prompt, ref.tokens, got.tokens, eps=1e-3, label=f"{spec}/{name}")


def test_tiny_draft_model_really_drafts(tiny_target, tiny_models):
    prompt = prompt_tokens(tiny_target, PROMPTS["story"])
    run = generate(tiny_target, "draft", prompt, draft=tiny_models["draft"], n=64, adaptive=False, draft_max=4)
    s = run.stats
    assert s.drafts > 5 and s.drafted >= 4 * (s.drafts - 1)
    # The tiny draft agrees with the target ~80% of the time: most drafted tokens are accepted.
    assert 0.4 < s.acceptance <= 1.0
    assert s.steps < 64  # fewer target steps than tokens: speculation did something
    assert s.mean_accepted_length == pytest.approx(1 + s.accepted / s.drafts)


def test_fixed_k_and_adaptive_agree(tiny_target, tiny_models):
    prompt = prompt_tokens(tiny_target, PROMPTS["code"])
    fixed = generate(tiny_target, "draft", prompt, draft=tiny_models["draft"], n=48, adaptive=False, draft_max=6)
    adaptive = generate(tiny_target, "draft", prompt, draft=tiny_models["draft"], n=48, draft_max=6)
    assert fixed.tokens == adaptive.tokens


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("spec", ["ngram-simple", "ngram-mod", "ngram-map-k", "ngram-map-k4v", "ngram-cache"])
def test_ngram_drafts_on_code_rewrite(smollm2_f16, spec):
    # Random tiny models never copy their prompt; a real model rewriting code does.
    target = Model(smollm2_f16)
    try:
        prompt = prompt_tokens(target, PROMPTS["code"])
        ref = generate(target, "none", prompt, n=96, threads=2)
        run = generate(target, spec, prompt, n=96, threads=2)
        assert_lossless(target, prompt, ref.tokens, run.tokens, eps=0.25, label=spec)
        assert run.stats.drafted > 0 and run.stats.accepted > 0
        assert run.stats.steps < len(run.tokens)
    finally:
        target.close()


# ---- T > 0: the same distribution -------------------------------------------------------------------
def _chi2_sf(x: float, k: int) -> float:
    """Upper tail of chi-square with k degrees of freedom (Wilson-Hilferty; fine for a test)."""
    if k <= 0:
        return 1.0
    z = ((x / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(z / math.sqrt(2))


def _exact_joint(target: Model, prompt: list[int], params: SamplingParams, n: int) -> dict[tuple, float]:
    """P(t1..tn) under the target's sampling chain, enumerated (small top-k keeps it finite)."""
    from llamaspec.speculative.verify import target_distribution

    ctx = Context(target, ContextConfig(n_ctx=256, n_threads=1))
    out: dict[tuple, float] = {}

    def walk(prefix: list[int], p: float) -> None:
        ctx.seq_rm(0, 0, -1)
        k = ctx.decode(prompt + prefix, 0, 0, "last")
        dist = target_distribution(ctx.logits(k)[0].copy(), params, ())
        for tok in np.flatnonzero(dist > 0):
            q = p * float(dist[tok])
            if len(prefix) + 1 == n:
                out[tuple(prefix + [int(tok)])] = q
            else:
                walk(prefix + [int(tok)], q)

    walk([], 1.0)
    ctx.close()
    return out


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["rejection", "sample-and-match"])
def test_sampling_matches_target_distribution(tiny_target, tiny_models, rule):
    """At T > 0 the speculative output has the target's exact distribution.

    rejection: the draft model samples its proposals and hands over their probabilities.
    sample-and-match: the draft proposes greedily with no probabilities (as n-gram drafters do).
    """
    from llamaspec.speculative.drafters.model import ModelDrafter
    from llamaspec.speculative.verify import target_distribution

    params = SamplingParams(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0)
    prompt = prompt_tokens(tiny_target, PROMPTS["story"])
    n_tok = 3
    exact = _exact_joint(tiny_target, prompt, params, n_tok)
    draft_model = Model(tiny_models["draft"])
    dctx = Context(draft_model, ContextConfig(n_ctx=256, n_threads=1))
    dist = (lambda row, recent: target_distribution(row, params, recent)) if rule == "rejection" else None
    drafter = ModelDrafter(dctx, distribution=dist)
    ctx = Context(tiny_target, ContextConfig(n_ctx=256, n_threads=1))
    engine = SpecEngine(tiny_target, ctx, drafter)
    counts: dict[tuple, int] = {}
    runs, drafted = 1200, 0
    for seed in range(runs):
        sp = SamplingParams(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0, seed=seed)
        g = engine.generate(prompt, GenerationConfig(max_tokens=n_tok, sampling=sp, draft_max=4, adaptive=False))
        drafted += g.stats.drafted
        counts[tuple(g.tokens)] = counts.get(tuple(g.tokens), 0) + 1
    drafter.close()
    draft_model.close()
    ctx.close()
    assert drafted > runs // 2, "the drafter must actually draft for this test to mean anything"
    assert set(counts) <= set(exact), "sampled a sequence the target cannot produce"
    p_value, chi2, df = _chi2_p_value(exact, counts, runs)
    assert p_value > 1e-3, f"{rule}: chi2={chi2:.1f} df={df} p={p_value:.2e}"

def _chi2_p_value(exact: dict[tuple, float], counts: dict[tuple, int], runs: int) -> tuple[float, float, int]:
    """(p-value, chi2, df) of observed sequence counts against exact probabilities, cells with an
    expectation below 5 pooled."""
    chi2, df, pooled_e, pooled_o = 0.0, -1, 0.0, 0
    for key, p in exact.items():
        e, o = p * runs, counts.get(key, 0)
        if e < 5:
            pooled_e, pooled_o = pooled_e + e, pooled_o + o
            continue
        chi2 += (o - e) ** 2 / e
        df += 1
    if pooled_e > 0:
        chi2 += (pooled_o - pooled_e) ** 2 / pooled_e
        df += 1
    return _chi2_sf(chi2, df), chi2, df


# name -> (target, draft p-min): the production pipeline as `run` builds it (`load_pipeline` with
# run's defaults: adaptive draft length, default draft-max, a seed per run, a fresh pipeline per run).
PRODUCTION_CASES = {
    # seeded: drafter and verifier streams from one --seed must be independent
    "seeded": ("target", 0.0),
    # --draft-p-min at T > 0: stop decided from the distribution, not from the drawn token
    "p-min": ("target", 0.5),
    # a draft vocabulary 128 tokens smaller than the target's (allowed by llama.cpp's rules)
    "smaller-draft-vocab": ("target_wide", 0.5),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(PRODUCTION_CASES))
def test_seeded_production_pipeline_matches_target_distribution(tiny_models, case):
    """`run --temp 1 --seed S --draft D --fixed-draft --draft-max 4 [--draft-p-min P]` for
    S = 0..N-1, a fresh pipeline each (as `run` builds it): the sequences have the
    target's exact distribution (chi-square against the enumerated joint of 4 tokens)."""
    from llamaspec.speculative.options import SpecOptions, parse_spec_types
    from llamaspec.speculative.pipeline import load_pipeline

    target_name, p_min = PRODUCTION_CASES[case]
    target = Model(tiny_models[target_name])
    try:
        prompt = prompt_tokens(target, PROMPTS["story"])  # as run makes them (chat template if any)
        params = SamplingParams(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0)
        n_tok, runs = 4, 1000
        exact = _exact_joint(target, prompt, params, n_tok)
        counts: dict[tuple, int] = {}
        drafted = short = 0
        for seed in range(runs):
            sp = SamplingParams(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0, seed=seed)
            # --fixed-draft --draft-max 4: with a seed at T > 0 the adaptive length runs on size-based
            # costs, by which this tiny draft (as costly as its target) would rarely draft at all.
            opts = SpecOptions(spec_types=parse_spec_types("draft"), draft_path=tiny_models["draft"],
                               draft_p_min=p_min, n_threads=1, adaptive=False, draft_max=4)
            pipe = load_pipeline(target.path, opts, sp, target=target)
            try:
                g = pipe.engine.generate(prompt, pipe.config(max_tokens=n_tok, sampling=sp))
            finally:
                pipe.close(keep_target=True)
            drafted += g.stats.drafted
            short += g.stats.drafted == 0  # without p-min the first step always drafts (k = 2)
            counts[tuple(g.tokens)] = counts.get(tuple(g.tokens), 0) + 1
    finally:
        target.close()
    assert drafted > runs // 4, "the drafter must actually draft for this test to mean anything"
    if p_min > 0:
        assert short > runs // 20, "p-min must cut drafts for this test to mean anything"
    assert set(counts) <= set(exact), "sampled a sequence the target cannot produce"
    p_value, chi2, df = _chi2_p_value(exact, counts, runs)
    assert p_value > 1e-3, f"{case}: chi2={chi2:.1f} df={df} p={p_value:.2e}"


def test_one_seed_one_output_on_a_reused_pipeline(tiny_models):
    """A pipeline serving several prompts (batch, the Python API) gives one output per seed."""
    from llamaspec.speculative.options import SpecOptions, parse_spec_types
    from llamaspec.speculative.pipeline import load_pipeline

    sp = SamplingParams(temperature=0.9, seed=42)
    # fixed draft lengths: adaptive, this draft (paused: it does not pay at the prior) would probe
    # only after its prompt's evaluation fits the probe budget, long after 32 tokens
    opts = SpecOptions(spec_types=parse_spec_types("draft"), draft_path=tiny_models["draft"], n_threads=1,
                       adaptive=False)
    pipe = load_pipeline(tiny_models["target"], opts, sp)
    try:
        prompt = prompt_tokens(pipe.target, PROMPTS["story"])
        runs = [pipe.engine.generate(prompt, pipe.config(max_tokens=32, sampling=sp)) for _ in range(3)]
    finally:
        pipe.close()
    assert runs[0].stats.drafted > 0
    assert runs[0].tokens == runs[1].tokens == runs[2].tokens


def test_same_seed_same_output(tiny_target, tiny_models):
    prompt = prompt_tokens(tiny_target, PROMPTS["story"])
    sp = SamplingParams(temperature=0.9, seed=42)
    # (fixed draft lengths, as above: with a seed the adaptive ones follow fixed costs, not time)
    a = generate(tiny_target, "draft", prompt, draft=tiny_models["draft"], n=32, sampling=sp, adaptive=False)
    b = generate(tiny_target, "draft", prompt, draft=tiny_models["draft"], n=32, sampling=sp, adaptive=False)
    assert a.tokens == b.tokens
    assert a.stats.drafted > 0 and a.stats.drafted == b.stats.drafted  # the same draft lengths too


# ---- stop conditions ----------------------------------------------------------------------------------
def test_stop_strings_cut_text():
    s = StopStrings(["STOP"])
    out, hit = s.push("hello ST")
    assert (out, hit) == ("hello", False)  # "ST" held back: it may start "STOP"
    out, hit = s.push("OP and more")
    assert (out, hit) == (" ", True)


def test_stop_string_ends_generation(tiny_target):
    prompt = prompt_tokens(tiny_target, PROMPTS["story"])
    ctx = Context(tiny_target, ContextConfig(n_ctx=512, n_threads=1))
    engine = SpecEngine(tiny_target, ctx)
    full = engine.generate(prompt, GenerationConfig(max_tokens=40))
    stop = full.text[10:14]
    assert stop.strip(), "need a visible stop string"
    cut = engine.generate(prompt, GenerationConfig(max_tokens=40, stop=[stop]))
    assert cut.stop_reason == "stop"
    assert cut.text == full.text[: full.text.find(stop)]
    ctx.close()


def test_context_full_stops_cleanly(tiny_target, tiny_models):
    prompt = prompt_tokens(tiny_target, PROMPTS["chat"])
    ctx = Context(tiny_target, ContextConfig(n_ctx=256, n_threads=1))  # llama.cpp may round it up
    from llamaspec.speculative.drafters.model import ModelDrafter

    draft_model = Model(tiny_models["draft"])
    drafter = ModelDrafter(Context(draft_model, ContextConfig(n_ctx=ctx.n_ctx, n_threads=1)))
    g = SpecEngine(tiny_target, ctx, drafter).generate(prompt, GenerationConfig(max_tokens=10_000, draft_max=8))
    assert g.stop_reason == "context"
    assert len(prompt) + len(g.tokens) == ctx.n_ctx + 1  # every cell used, plus the last sampled token
    drafter.close()
    draft_model.close()
    ctx.close()


# ---- real models --------------------------------------------------------------------------------------
@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("pair", ["smollm2", "gemma"])
def test_real_pairs_greedy_lossless(pair, request):
    target_path = request.getfixturevalue(f"{pair}_f16")
    draft_path = request.getfixturevalue(f"{pair}_q4")
    target = Model(target_path)
    notes = []
    try:
        for name, text in PROMPTS.items():
            prompt = prompt_tokens(target, text)
            ref = generate(target, "none", prompt, n=40, threads=2)
            for spec in ("ngram-simple", "ngram-mod", "draft"):
                got = generate(target, spec, prompt, draft=draft_path, n=40, threads=2)
                # F16 targets: batch-vs-single logits differ by up to ~0.08 here, so a flip is only
                # float noise where the top-2 gap is below 0.25.
                notes.append(assert_lossless(target, prompt, ref.tokens, got.tokens, eps=0.25,
                                             label=f"{pair}/{spec}/{name}"))
    finally:
        target.close()
    print("\n".join(notes))
    flips = [n for n in notes if "flip" in n]
    assert len(flips) <= len(notes) // 4, notes


# ---- verify batches longer than llama.cpp's n_batch ---------------------------------------------------
class _Oracle(Drafter):
    """Proposes the target's own greedy continuation (from a plain run), `wrong_at` tokens in
    (when given) one wrong token: long drafts at no cost, accepted up to where it says."""

    name = "oracle"

    def __init__(self, prompt_len: int, reference: list[int], n_vocab: int, wrong_at: int | None,
                 start: int = 0):
        self.prompt_len, self.reference = prompt_len, reference
        self.n_vocab, self.wrong_at, self.start = n_vocab, wrong_at, start
        self.longest = 0
        self.drafted_at: list[int] = []  # tokens generated when each non-empty draft was made

    def propose(self, seq_id, history, n_max):
        done = len(history) - self.prompt_len
        if done < self.start:
            return Draft([], None, self.name)
        tokens = list(self.reference[done:done + n_max])
        self.drafted_at.append(done)
        if self.wrong_at is not None and len(tokens) > self.wrong_at:
            tokens[self.wrong_at] = (tokens[self.wrong_at] + 1) % self.n_vocab
        self.longest = max(self.longest, len(tokens))
        return Draft(tokens, None, self.name)


@pytest.mark.parametrize("wrong_at", [None, 450])
def test_verify_batch_longer_than_n_batch(tiny_target, wrong_at):
    """--draft-max 600 --fixed-draft used to verify 601 tokens in two llama.cpp chunks and read
    the rows as if they all came from the last one (wrong tokens or an IndexError)."""
    prompt = prompt_tokens(tiny_target, PROMPTS["story"])
    n = 700
    ctx = Context(tiny_target, ContextConfig(n_ctx=2048, n_threads=1))
    try:
        plain = SpecEngine(tiny_target, ctx).generate(prompt, GenerationConfig(max_tokens=n))
        oracle = _Oracle(len(prompt), plain.tokens, tiny_target.n_vocab, wrong_at)
        got = SpecEngine(tiny_target, ctx, oracle).generate(
            prompt, GenerationConfig(max_tokens=n, draft_max=600, adaptive=False))
    finally:
        ctx.close()
    assert got.tokens == plain.tokens and len(got.tokens) == n
    assert oracle.longest == ctx.n_batch - 1 == 511 == MAX_DRAFT  # capped: [last] + draft fills one batch
    s = got.stats
    if wrong_at is None:
        assert s.accepted == s.drafted
    else:
        # the only drafts that reach position wrong_at are wrong there, and right up to it
        assert s.accepted < s.drafted and s.accepted_per_position[wrong_at] == 0
        assert s.accepted_per_position[wrong_at - 1] == s.drafted_per_position[wrong_at]


def test_decode_refuses_rows_from_an_earlier_chunk(tiny_target):
    ctx = Context(tiny_target, ContextConfig(n_ctx=2048, n_threads=1, n_batch=64))
    try:
        with pytest.raises(ValueError, match="only the last n_batch chunk"):
            ctx.decode(list(range(10, 110)), 0, 0, outputs="all")
        ctx.seq_rm(0, 0, -1)
        assert ctx.decode(list(range(10, 110)), 0, 0, outputs=36) == 36  # 100 = 64 + 36: fits
    finally:
        ctx.close()


@pytest.mark.parametrize("flag", ["--draft-max", "--spec-ngram-mod-n-max", "--spec-ngram-simple-size-m"])
def test_draft_lengths_past_one_batch_are_usage_errors(run_cli, tiny_models, flag):
    r = run_cli("run", tiny_models["target"], "-p", "hi", "--spec-type", "ngram-mod", flag, "600")
    assert r.exit_code == 2
    assert f"{flag} must be in [" in r.stderr and "511], got 600" in r.stderr and "Traceback" not in r.stderr


# ---- end of generation inside a draft ----------------------------------------------------------------
def test_tokens_after_an_accepted_eog_are_not_counted(tiny_target, monkeypatch):
    """A draft that runs through an end-of-generation token: the step ends at it, and the draft
    tokens after it (right as they may be) are not counted as accepted in stats or controller."""
    prompt = prompt_tokens(tiny_target, PROMPTS["story"])
    ctx = Context(tiny_target, ContextConfig(n_ctx=1024, n_threads=1))
    try:
        full = SpecEngine(tiny_target, ctx).generate(prompt, GenerationConfig(max_tokens=80)).tokens
        # Make a token the target writes at position i (its first occurrence) an EOG token.
        i = next(j for j in range(20, 80) if full[j] not in full[:j])
        eog_tok = full[i]
        monkeypatch.setattr(tiny_target, "is_eog", lambda t: t == eog_tok)
        engine = SpecEngine(tiny_target, ctx, _Oracle(len(prompt), full, tiny_target.n_vocab, None))
        got = engine.generate(prompt, GenerationConfig(max_tokens=80, draft_max=16, adaptive=False))
    finally:
        ctx.close()
    assert got.tokens == full[:i] and got.stop_reason == "eos"
    s = got.stats
    # the first token comes from the prompt step; each step adds n_accepted + 1, the last one the EOG
    assert s.accepted + s.steps == len(got.tokens)



class _Wrong(Drafter):
    """Always drafts n_max tokens, the first of them wrong: a draft model on text it cannot guess."""

    name = "wrong"

    def __init__(self, prompt_len: int, reference: list[int], n_vocab: int):
        self.prompt_len, self.reference, self.n_vocab = prompt_len, reference, n_vocab

    def propose(self, seq_id, history, n_max):
        done = len(history) - self.prompt_len
        return Draft([(self.reference[done] + 1) % self.n_vocab] * n_max, None, self.name)


def test_a_paused_drafter_does_not_stop_a_free_one_in_a_chain(tiny_target, monkeypatch):
    """Chain [n-gram-like, draft-model-like]: the second fails until its controller pauses it;
    when the first finds matches (token 120 on), they are tried at once, not after the pause."""
    from llamaspec.speculative import engine as engine_mod
    from llamaspec.speculative.controller import CostModel, DraftLengthController
    from llamaspec.speculative.drafters.chain import ChainDrafter

    # Fixed costs (a verify batch of k + 1 costs 1 + 0.05 k decodes, drafting is free): a tiny
    # model's sub-millisecond step times are too noisy to make the decisions repeatable.
    def controller(**kw):
        kw["cost"] = CostModel(verify_ratio_fn=lambda k: 1 + 0.05 * k, draft_ratio_value=0.0)
        return DraftLengthController(**kw)

    monkeypatch.setattr(engine_mod, "DraftLengthController", controller)

    prompt = prompt_tokens(tiny_target, PROMPTS["story"])
    ctx = Context(tiny_target, ContextConfig(n_ctx=1024, n_threads=1))
    try:
        full = SpecEngine(tiny_target, ctx).generate(prompt, GenerationConfig(max_tokens=200)).tokens
        free = _Oracle(len(prompt), full, tiny_target.n_vocab, None, start=120)
        chain = ChainDrafter([free, _Wrong(len(prompt), full, tiny_target.n_vocab)])
        engine = SpecEngine(tiny_target, ctx, chain)
        got = engine.generate(prompt, GenerationConfig(max_tokens=200, draft_max=8))
    finally:
        ctx.close()
    assert got.tokens == full
    assert free.drafted_at and free.drafted_at[0] <= 121
    per = got.stats.per_drafter
    assert per["oracle"].accepted > 60 and per["oracle"].calls >= per["oracle"].drafts > 0
    assert per["wrong"].calls >= per["wrong"].drafts > 0 and per["wrong"].draft_seconds > 0
    assert engine.last_controllers["wrong"].n_pauses > 0, "the failing drafter must have been paused"


def test_parallel_sequences_share_the_batch_time_by_rows(tiny_models, monkeypatch):
    """At --parallel 2 one llama_decode verifies both sequences: each is charged its rows' share
    of that time (in verify_seconds and in what its controller's cost model learns), not all of it.

    The engine's clock is a virtual one that only a decode listener moves (STEP per call: once per
    sequence's segment), so the batch times are known exactly and no wall clock is read: before,
    the sequences' verify_seconds added up to twice the time spent in decodes, and the cost model
    took a one-token step for two."""
    import types

    from llamaspec.api.generator import Generator
    from llamaspec.speculative import engine as engine_mod, sequence as sequence_mod

    STEP = 0.03
    now = [0.0]
    calls = []
    clock = types.SimpleNamespace(perf_counter=lambda: now[0])
    monkeypatch.setattr(engine_mod, "time", clock)
    monkeypatch.setattr(sequence_mod, "time", clock)

    def tick(_ctx, tokens, *_):
        now[0] += STEP
        calls.append(len(tokens))

    with Generator(tiny_models["target"], spec_type="ngram-simple", parallel=2, threads=1, temperature=0,
                   max_tokens=16, chat=False, tuned=False) as g:
        g.pipeline.ctx.add_decode_listener(tick)
        config = g.pipeline.config(max_tokens=16, sampling=g.sampling)
        jobs = [(p, g.tokenize(p), config) for p in ("the cat sat on the mat", "once upon a time there was")]
        results = [gen for _, gen in g.pipeline.engine.generate_many(jobs, parallel=2)]
        ctl = g.pipeline.engine.last_controllers["ngram-simple"]
    assert [len(r.tokens) for r in results] == [16, 16]
    verify = sum(r.stats.verify_seconds for r in results)
    prompts = 2   # one prompt decode per sequence (short prompts: one chunk each), outside any verify
    assert len(calls) > prompts
    # every verify batch's time is charged once in all, split between the sequences (not once each)
    assert verify == pytest.approx(STEP * (len(calls) - prompts)), (verify, calls)
    # the cost model's one-token step: one segment's share each, not both segments' time
    assert ctl.cost.decode_seconds < 1.5 * STEP, ctl.cost.decode_seconds
