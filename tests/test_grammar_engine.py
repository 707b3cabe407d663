"""Generation under a grammar (speculative/constrained.py): llama.cpp's "sample first, mask only
when refused" rule as pure functions, then real models through the pipeline `run` builds: greedy
output identical between plain decoding and every drafter, valid against its grammar or schema;
drafts cut at the first refused token; T > 0 with the constrained distribution."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from engine_helpers import PROMPTS, prompt_tokens
from llamaspec.errors import UsageError
from llamaspec.runtime.context import Context, ContextConfig
from llamaspec.runtime.grammar import GrammarError, GrammarSpec, GrammarState, grammar_from_schema
from llamaspec.runtime.llama import Model
from llamaspec.speculative.constrained import bias_vector, constrained_distribution, masked_row, pick
from llamaspec.speculative.drafters.base import Draft, Drafter
from llamaspec.speculative.engine import GenerationConfig, SpecEngine
from llamaspec.speculative.options import SpecOptions, parse_spec_types
from llamaspec.speculative.pipeline import load_pipeline
from llamaspec.speculative.sampling_params import SamplingParams
from llamaspec.speculative.verify import target_candidates
from test_engine import _chi2_p_value


# ---- the rule, as pure functions -------------------------------------------------------------------
class _SetGrammar:
    """A grammar that allows a fixed set of token ids: what the pure functions ask of a grammar."""

    def __init__(self, allowed):
        self.allowed = set(allowed)

    def allows(self, tok):
        return tok in self.allowed

    def allowed_mask(self, n):
        m = np.zeros(n, dtype=bool)
        m[list(self.allowed)] = True
        return m

    def mask(self, row):
        out = np.array(row, dtype=np.float32, copy=True)
        out[~self.allowed_mask(row.shape[0])] = -np.inf
        return out

    def allowed_ids(self, cands):
        return [int(t) for t in cands if t in self.allowed]


P = np.array([0.30, 0.05, 0.25, 0.10, 0.20, 0.10])
ROW = np.log(P).astype(np.float32)
ALLOWED = {1, 3, 4}


def _freqs(params, n, seed=0):
    rng, g = np.random.default_rng(seed), _SetGrammar(ALLOWED)
    counts, masked = np.zeros(len(P)), 0
    for _ in range(n):
        tok, m = pick(ROW, params, (), rng, g, fallback=0)
        counts[tok] += 1
        masked += m
    return counts / n, masked / n


def test_sample_first_resample_masked_is_exact():
    """y ~ p kept when allowed, else y ~ p restricted to A: exactly p(y) / p(A) (no truncation)."""
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    want = np.where(np.isin(np.arange(len(P)), list(ALLOWED)), P, 0.0) / P[list(ALLOWED)].sum()
    dist, masked = constrained_distribution(ROW, params, (), _SetGrammar(ALLOWED), fallback=0)
    assert masked and np.allclose(dist, want, atol=1e-6)
    freq, mask_rate = _freqs(params, 40_000)
    assert np.abs(freq - want).max() < 0.01, (freq, want)
    assert set(np.flatnonzero(freq)) <= ALLOWED
    # the whole-row mask only when the first draw is refused: 1 - p(A) of the time
    assert abs(mask_rate - (1 - P[list(ALLOWED)].sum())) < 0.01


def test_a_truncating_chain_gives_llama_cpps_mixture():
    """With top-k, the first draw comes from the truncated chain (ids 0 and 2 here, both refused)
    and the resample from the chain over the masked row: constrained_distribution writes out that
    mixture, and the sampled frequencies follow it (not p / p(A) over the chain's candidates)."""
    params = SamplingParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0)
    dist, _ = constrained_distribution(ROW, params, (), _SetGrammar(ALLOWED), fallback=0)
    # top-2 of the masked row: ids 4 (.20) and 3 (.10), renormalized
    assert np.allclose(dist, [0, 0, 0, 1 / 3, 2 / 3, 0], atol=1e-6)
    freq, mask_rate = _freqs(params, 20_000, seed=1)
    assert np.abs(freq - dist).max() < 0.015 and mask_rate == 1.0
    # one allowed token among the chain's candidates: it keeps its own mass
    g = _SetGrammar({2, 4, 3})
    dist, _ = constrained_distribution(ROW, params, (), g, fallback=0)
    p2 = 0.25 / 0.55   # id 2's share of the top-2 {0, 2}
    assert np.allclose(dist[[2, 3, 4]], [p2 + (1 - p2) * 0.25 / 0.45, 0, (1 - p2) * 0.20 / 0.45], atol=1e-6)


def test_greedy_takes_the_argmax_of_what_the_grammar_allows():
    greedy = SamplingParams(temperature=0.0)
    rng = np.random.default_rng(0)
    assert pick(ROW, greedy, (), rng, _SetGrammar({0, 4}), fallback=9) == (0, False)   # argmax allowed
    assert pick(ROW, greedy, (), rng, _SetGrammar({1, 4}), fallback=9) == (4, True)    # refused: masked
    banned = ROW.copy()
    banned[4] = -np.inf   # the only allowed token banned (a -inf logit_bias): end of generation
    assert pick(banned, greedy, (), rng, _SetGrammar({4}), fallback=9) == (9, True)


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0),
                                    SamplingParams(temperature=1.0, top_k=40, top_p=0.95, min_p=0.05),
                                    SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)])
def test_probing_the_best_tokens_gives_the_whole_masks_chain(params):
    """masked_row asks the grammar about the row's best 64 (then 1024) tokens first: the chain's
    candidates must be those of the whole-vocabulary mask, wherever the allowed tokens rank."""
    rng = np.random.default_rng(7)
    row = (rng.normal(size=5000) * 4).astype(np.float32)
    order, probed_only = np.argsort(-row), 0
    for allowed in (order[:50], order[::3], order[30:2000:17], order[900:950], order[-10:], [order[5]]):
        g = _SetGrammar(allowed)
        full, probed = g.mask(row), masked_row(row, params, g)
        a, b = target_candidates(full, params), target_candidates(probed, params)
        assert np.array_equal(a[0], b[0]) and np.allclose(a[1], b[1]), len(allowed)
        probed_only += np.isfinite(probed).sum() < np.isfinite(full).sum()
    assert probed_only >= (2 if params.greedy or params.top_k else 0)   # (top-k 0: the whole mask)


def test_bias_vector_refuses_ids_outside_the_vocabulary():
    assert bias_vector({3: 2.5}, 4)[3] == np.float32(2.5)
    for bad in ({4: 1.0}, {-1: 1.0}, {"3": 1.0}, {1: float("nan")}, {1: float("inf")}):
        with pytest.raises(UsageError, match="logit_bias"):
            bias_vector(bad, 4)


# ---- real models -----------------------------------------------------------------------------------
SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"},
                         "tier": {"enum": ["gold", "silver", "bronze"]}},
          "required": ["name", "age", "city", "tier"]}
RECORD = r'''root ::= "name=" word "\nage=" [0-9] [0-9]? "\ncity=" word "\nmember=" ("yes" | "no") "\n"
word ::= [A-Z] [a-z]+'''
RECORD_RE = re.compile(r"name=[A-Z][a-z]+\nage=[0-9]{1,2}\ncity=[A-Z][a-z]+\nmember=(yes|no)\n")
EXTRACT = ("Anna Berg is 34, lives in Oslo and has a gold card. Omar Haddad is 51, lives in Cairo and "
           "has a silver card. Write the record of Anna Berg: name Anna, age 34, city Oslo.")


def _run(target, spec, prompt, config_kw, *, draft=None, threads=2, sampling=None, fixed=False):
    sampling = sampling or SamplingParams(temperature=0.0)
    opts = SpecOptions(spec_types=parse_spec_types(spec), draft_path=draft, n_ctx=1024, n_threads=threads,
                       **({"adaptive": False, "draft_max": 4, "draft_p_min": 0.0} if fixed else {}))
    pipe = load_pipeline(target.path, opts, sampling, target=target)
    try:
        g = pipe.engine.generate(prompt, pipe.config(sampling=sampling, **config_kw))
        assert pipe.engine.grammars == {}, "the live state is dropped when the sequence ends"
        return g
    finally:
        pipe.close(keep_target=True)


def _masked_gap(target, prompt, spec, prefix):
    """The top-2 gap of the target's logits among the tokens the grammar allows after `prefix`."""
    state = GrammarState(target, spec)
    assert state.accept_all(prefix) == len(prefix)
    ctx = Context(target, ContextConfig(n_ctx=1024, n_threads=2))
    try:
        row = state.mask(ctx.logits(ctx.decode(prompt + prefix, 0, 0, "last"))[0])
    finally:
        ctx.close()
        state.close()
    top = np.sort(row[np.isfinite(row)].astype(np.float64))
    return float(top[-1] - top[-2]) if top.shape[0] > 1 else np.inf


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["schema", "gbnf"])
def test_greedy_under_a_grammar_is_plain_decoding(f16, smollm2_q4, kind):
    """Plain decoding and each drafter (prompt-lookup, n-gram, a draft model; the grammar drafter
    joins each chain) give the same tokens under the grammar, and every output is valid."""
    spec = grammar_from_schema(SCHEMA) if kind == "schema" else GrammarSpec(RECORD)
    prompt = prompt_tokens(f16, EXTRACT + (" Answer in JSON." if kind == "schema" else ""))
    kw = {"max_tokens": 64, "grammar": spec}
    ref = _run(f16, "none", prompt, kw)
    assert ref.stop_reason == "eos", ref.text   # the grammar completed: only EOG was left
    runs = {t: _run(f16, t, prompt, kw, draft=Path(smollm2_q4)) for t in ("prompt-lookup", "ngram-simple", "draft")}
    for name, g in [("none", ref)] + list(runs.items()):
        print(f"{kind}/{name}: {g.text!r} drafted {g.stats.drafted} accepted {g.stats.accepted} "
              f"cut {g.stats.grammar_cut} masks {g.stats.grammar_masks}")
        if kind == "schema":
            jsonschema.validate(json.loads(g.text), SCHEMA)
        else:
            assert RECORD_RE.fullmatch(g.text), (name, g.text)
        if g.tokens != ref.tokens:   # F16 batch noise (~0.08 here) may flip a near tie, nothing else
            i = next(i for i, (a, b) in enumerate(zip(ref.tokens, g.tokens)) if a != b)
            gap = _masked_gap(f16, prompt, spec, ref.tokens[:i])
            assert gap < 0.25, f"{name}: diverged at token {i} with an allowed top-2 gap of {gap:.3f}"
    assert sum(g.stats.drafted for g in runs.values()) > 0 and runs["draft"].stats.accepted > 0


class _Oracle(Drafter):
    """Proposes the reference continuation with the token of `wrong` at draft index `at`: a draft
    the grammar refuses from there on. Records the live grammar state it was bound to."""

    name = "oracle"

    def __init__(self, prompt_len, reference, wrong, at):
        self.prompt_len, self.reference, self.wrong, self.at = prompt_len, reference, wrong, at
        self.grammars, self.seen = None, []

    def bind_grammars(self, grammars):
        self.grammars = grammars

    def propose(self, seq_id, history, n_max):
        done = len(history) - self.prompt_len
        self.seen.append(seq_id in self.grammars)
        tokens = list(self.reference[done:done + n_max])
        if len(tokens) > self.at:
            tokens[self.at] = self.wrong
        return Draft(tokens, None, self.name)


@pytest.mark.real
def test_a_draft_is_cut_at_the_first_token_the_grammar_refuses(tiny_models):
    target = Model(tiny_models["target"])
    ctx = Context(target, ContextConfig(n_ctx=512, n_threads=1))
    try:
        spec = GrammarSpec('root ::= "the " ("fox" | "dog") " is " [0-9] [0-9] [0-9] " and " [0-9] [0-9]')
        prompt = prompt_tokens(target, PROMPTS["story"])
        cfg = GenerationConfig(max_tokens=40, grammar=spec, draft_max=6, adaptive=False)
        ref = SpecEngine(target, ctx).generate(prompt, cfg)
        wrong = target.tokenize("l", add_special=False)[0]   # refused wherever it comes
        oracle = _Oracle(len(prompt), ref.tokens, wrong, at=2)
        engine = SpecEngine(target, ctx, oracle)
        got = engine.generate(prompt, cfg)
    finally:
        ctx.close()
        target.close()
    assert got.tokens == ref.tokens and got.stop_reason == ref.stop_reason == "eos"
    s = got.stats
    assert s.grammar_cut > 0 and s.per_drafter["oracle"].grammar_cut == s.grammar_cut
    assert len(s.drafted_per_position) == 2, "no verify row was spent on a refused token or after it"
    assert s.accepted == s.drafted > 0   # what was left of each draft was the target's own
    assert oracle.seen and all(oracle.seen) and engine.grammars == {}


@pytest.mark.real
def test_the_grammar_ends_generation_even_without_eos(tiny_models):
    """ignore_eos under a grammar that is complete: nothing else may follow, so it ends there."""
    target = Model(tiny_models["target"])
    ctx = Context(target, ContextConfig(n_ctx=512, n_threads=1))
    try:
        spec = GrammarSpec('root ::= "fox" | "dog" | "the lazy dog"')
        prompt = prompt_tokens(target, PROMPTS["story"])
        for ignore in (False, True):
            g = SpecEngine(target, ctx).generate(prompt, GenerationConfig(max_tokens=20, grammar=spec,
                                                                          ignore_eos=ignore))
            assert g.text in ("fox", "dog", "the lazy dog") and g.stop_reason == "eos"
    finally:
        ctx.close()
        target.close()


def _exact_constrained(target, prompt, spec, params, n_max):
    """P(output tokens) under the grammar, enumerated: at each prefix the distribution `pick`
    samples from (constrained_distribution), on rows decoded one prefix at a time."""
    ctx = Context(target, ContextConfig(n_ctx=512, n_threads=1))
    out: dict[tuple, float] = {}

    def walk(prefix, state, p):
        ctx.seq_rm(0, 0, -1)
        row = ctx.logits(ctx.decode(prompt + prefix, 0, 0, "last"))[0].copy()
        dist, _ = constrained_distribution(row, params, (), state, target.eos)
        for tok in np.flatnonzero(dist > 0):
            q, tok = p * float(dist[tok]), int(tok)
            if target.is_eog(tok) or len(prefix) + 1 == n_max:
                key = tuple(prefix if target.is_eog(tok) else prefix + [tok])
                out[key] = out.get(key, 0.0) + q
                continue
            nxt = state.clone()
            nxt.accept(tok)
            walk(prefix + [tok], nxt, q)
            nxt.close()

    root = GrammarState(target, spec)
    walk([], root, 1.0)
    root.close()
    ctx.close()
    return out


@pytest.mark.real
@pytest.mark.slow
def test_sampling_under_a_grammar_has_the_constrained_distribution(tiny_models):
    """T = 1 under a three-letter grammar, `run`'s pipeline with a fresh seed per generation:
    plain decoding, a sampled draft model (rejection sampling; most of its drafts are cut) and
    n-gram + grammar drafting (sample-and-match) all follow the enumerated constrained
    distribution, and each other (different seeds per mode, so the runs are independent)."""
    target = Model(tiny_models["target"])
    spec = GrammarSpec("root ::= [a-c] [a-c] [a-c]")
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    prompt = prompt_tokens(target, PROMPTS["story"])
    runs, n_max = 500, 8
    try:
        exact = _exact_constrained(target, prompt, spec, params, n_max)
        freqs, stats = {}, {}
        for m, mode in enumerate(("none", "draft", "ngram-simple")):
            opts = SpecOptions(spec_types=parse_spec_types(mode), draft_path=tiny_models["draft"], n_ctx=512,
                               n_threads=1, adaptive=False, draft_max=4, draft_p_min=0.0)
            pipe = load_pipeline(target.path, opts, params, target=target)
            counts: dict[tuple, int] = {}
            try:
                for seed in range(m * runs, (m + 1) * runs):
                    sp = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed)
                    g = pipe.engine.generate(prompt, pipe.config(max_tokens=n_max, sampling=sp, grammar=spec))
                    counts[tuple(g.tokens)] = counts.get(tuple(g.tokens), 0) + 1
                    stats[mode] = g.stats if mode not in stats else stats[mode] + g.stats
            finally:
                pipe.close(keep_target=True)
            assert set(counts) <= set(exact), f"{mode}: an output the constrained target cannot give"
            p_value, chi2, df = _chi2_p_value(exact, counts, runs)
            assert p_value > 1e-3, f"{mode}: chi2={chi2:.1f} df={df} p={p_value:.2e}"
            freqs[mode] = counts
    finally:
        target.close()
    assert stats["draft"].grammar_cut > 0 and stats["draft"].per_drafter["draft-simple"].calls > 0
    assert stats["ngram-simple"].drafted > 0     # the grammar drafter's forced EOG, sample-and-match
    keys = set(exact)
    for mode in ("draft", "ngram-simple"):   # loosely: total variation against plain's frequencies
        tv = 0.5 * sum(abs(freqs[mode].get(k, 0) - freqs["none"].get(k, 0)) for k in keys) / runs
        assert tv < 0.12, f"{mode} vs plain: total variation {tv:.3f}"


def test_a_grammar_that_does_not_compile_names_the_parsers_reason(tiny_models):
    target = Model(tiny_models["target"])
    try:
        with pytest.raises(GrammarError, match=r"^grammar: the grammar does not compile: Undefined rule identifier 'word'"):
            GrammarState(target, GrammarSpec('root ::= word "!"'))
        with pytest.raises(GrammarError, match="unexpected end of input"):
            GrammarState(target, GrammarSpec('root ::= "a" [', field="--grammar"))
        ctx = Context(target, ContextConfig(n_ctx=256, n_threads=1))
        try:   # through the engine: the sequence fails to start, with the same one-line error
            with pytest.raises(GrammarError, match="Undefined rule"):
                SpecEngine(target, ctx).generate([1, 2, 3], GenerationConfig(grammar=GrammarSpec("root ::= x")))
        finally:
            ctx.close()
    finally:
        target.close()


@pytest.mark.parametrize("schema, why", [({"$ref": "#/$defs/missing"}, "the JSON schema cannot be compiled: "
                                                                     "Pointer '/\\$defs/missing' does not exist"),
                                         ({"type": "strin"}, "type \\(at schema\\) must be one of string"),
                                         ({"type": "array", "uniqueItems": True}, "'uniqueItems' \\(at schema\\) is "
                                                                                  "not supported by llguidance"),
                                         ({"type": "string", "format": "uuid7"}, "'format: uuid7' \\(at schema\\) "
                                                                                "is not supported")])
def test_a_schema_the_engine_cannot_enforce_is_a_grammar_error(schema, why):
    """A one-line GrammarError naming the field and why (the keyword, the missing ref, the unknown
    format), never a traceback nor a constraint silently dropped."""
    with pytest.raises(GrammarError, match=rf"^response_format: {why}"):
        grammar_from_schema(schema, "response_format")


@pytest.mark.real
def test_parallel_sequences_keep_their_own_grammar_state(tiny_models):
    """--parallel 2 (generate_many, one verify batch for both): each sequence under its own grammar
    gives what it gives alone, and the live states are dropped as the sequences end."""
    target = Model(tiny_models["target"])
    try:
        opts = SpecOptions(spec_types=parse_spec_types("draft"), draft_path=tiny_models["draft"], n_ctx=512,
                           n_threads=1, n_seq=2, adaptive=False, draft_max=4)
        pipe = load_pipeline(target.path, opts, SamplingParams(temperature=0.0), target=target)
        try:
            specs = [GrammarSpec('root ::= "the " ("fox" | "dog") " is " [0-9] [0-9]'),
                     grammar_from_schema({"type": "object", "properties": {"n": {"type": "integer"}},
                                          "required": ["n"]}), None]
            jobs = [(str(i), prompt_tokens(target, PROMPTS[p]), pipe.config(max_tokens=24, grammar=g))
                    for i, (p, g) in enumerate(zip(("story", "chat", "repetitive"), specs))]
            together = dict(pipe.engine.generate_many(jobs, parallel=2))
            assert pipe.engine.grammars == {}
            alone = {key: pipe.engine.generate(prompt, cfg) for key, prompt, cfg in jobs}
        finally:
            pipe.close(keep_target=True)
    finally:
        target.close()
    for key in alone:
        assert together[key].tokens == alone[key].tokens, key
    assert re.fullmatch(r"the (fox|dog) is [0-9]{2}", alone["0"].text)
    assert isinstance(json.loads(alone["1"].text)["n"], int)
    assert sum(g.stats.drafted for g in together.values()) > 0
