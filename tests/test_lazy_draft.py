"""A draft model loaded beside the first steps (speculative/drafters/lazy.py): nothing drafted and
no controller asked until the load ends, then the model drafts what an eagerly loaded one would;
a failed load is a warning and plain output; `run`'s wiring loads lazily and stays lossless;
a seed at T > 0 waits for the load, so its output does not follow a clock."""

from __future__ import annotations

import logging
import os
import re
import threading
from pathlib import Path

import pytest

from engine_helpers import PROMPTS, assert_lossless, generate, prompt_tokens
from llamaspec import Generator
from llamaspec.runtime.context import Context, ContextConfig
from llamaspec.runtime.llama import Model
from llamaspec.speculative.drafters import factory
from llamaspec.speculative.drafters.lazy import LazyDrafter
from llamaspec.speculative.drafters.model import SYNC_WINDOW, ModelDrafter
from llamaspec.speculative.engine import GenerationConfig, SpecEngine
from llamaspec.speculative.options import SpecOptions
from llamaspec.speculative.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture
def target_ctx(tiny_models):
    target = Model(tiny_models["target"])
    ctx = Context(target, ContextConfig(n_ctx=512, n_threads=1))
    yield target, ctx
    ctx.close()
    target.close()


def _lazy(load, target) -> LazyDrafter:
    return LazyDrafter(load, name="draft-simple", cost_hint=0.5, resume_tokens=SYNC_WINDOW)


def test_the_draft_loads_beside_the_steps_and_reads_the_prompt_only_when_a_draft_is_wanted(tiny_models, target_ctx):
    target, ctx = target_ctx
    opts = SpecOptions(spec_types=["draft-simple"], draft_path=tiny_models["draft"], n_threads=1, n_gpu_layers_draft=0)
    release = threading.Event()

    def load():
        release.wait()
        return factory._load_draft_model(opts, target, ctx, GREEDY, 0.5)

    lazy = _lazy(load, target)
    prompt = prompt_tokens(target, PROMPTS["story"])
    history = prompt + [target.tokenize(" The", add_special=False)[0]]
    asked = []

    def limit(k):
        def ask(d, match=None):
            asked.append(d.name)
            return k
        return ask

    lazy.begin(0, prompt)
    assert not lazy.propose_within(0, history, limit(4)) and asked == []   # loading: the controller is not asked
    assert not lazy.loaded and lazy.draft_token_seconds() is None
    release.set()
    lazy.wait()
    draft_ctx = lazy._inner.ctx
    assert lazy.loaded and draft_ctx.seq_pos_max(0) == -1    # loaded, and nothing evaluated yet
    # the controller declines (a paused draft): the prompt is not evaluated, whatever its length
    assert not lazy.propose_within(0, history, limit(0)) and asked == ["draft-simple"]
    assert draft_ctx.seq_pos_max(0) == -1 and lazy.draft_token_seconds() > 0   # its cost was timed on joining
    # the controller wants one: the worker evaluates the prompt (this step goes on without a draft)
    assert not lazy.propose_within(0, history, limit(4))
    lazy.wait()
    assert draft_ctx.seq_pos_max(0) == len(history) - 2
    got = lazy.propose_within(0, history, limit(4))
    # the draft an eagerly loaded model makes of the same history
    dm = Model(tiny_models["draft"])
    eager = ModelDrafter(Context(dm, ContextConfig(n_ctx=512, n_threads=1)))
    eager.begin(0, prompt)
    want = eager.propose(0, history, 4)
    eager.close()
    dm.close()
    assert len(got) == 4 and got.tokens == want.tokens and lazy.batch_member() is lazy
    lazy.end(0)
    lazy.close()
    assert lazy.model is None


def test_a_failed_load_is_a_warning_and_the_output_is_plain(target_ctx, caplog):
    target, ctx = target_ctx

    def load():
        raise MemoryError("cannot allocate the draft's KV cache")

    lazy = _lazy(load, target)
    lazy.wait()
    engine = SpecEngine(target, ctx, lazy)
    prompt = prompt_tokens(target, PROMPTS["chat"])
    config = GenerationConfig(max_tokens=16, sampling=GREEDY, draft_max=4)
    with caplog.at_level(logging.WARNING, logger="llamaspec.speculative.drafters.lazy"):
        got = engine.generate(prompt, config)
    plain = SpecEngine(target, ctx, None).generate(prompt, config)
    assert got.tokens == plain.tokens and got.stats.drafted == 0
    assert "could not be loaded" in caplog.text and "KV cache" in caplog.text
    lazy.close()


@pytest.fixture
def pair_folder(smollm2_f16, smollm2_q4, tmp_path, draft_pays, monkeypatch) -> Path:
    """The F16 target with its Q4_1 beside it, and a stored measurement saying the Q4_1 pays (a
    GPU's numbers): the default takes it as draft-simple, as it would where it pays; and loads
    it beside the first steps as it would with a core free (LLAMASPEC_LAZY_DRAFT=1: the tests
    run -t 2, which may take every core, `decide`)."""
    monkeypatch.setenv("LLAMASPEC_LAZY_DRAFT", "1")
    d = tmp_path / "SmolLM2-135M-Instruct-GGUF"
    d.mkdir()
    os.symlink(smollm2_f16, d / smollm2_f16.name)
    os.symlink(smollm2_q4, d / smollm2_q4.name)
    draft_pays(d / smollm2_f16.name, d / smollm2_q4.name)
    return d


def _lazy_member(g) -> LazyDrafter:
    return next(d for d in g.pipeline.engine.drafter.members() if isinstance(d, LazyDrafter))


def test_run_wiring_loads_a_chosen_draft_beside_the_first_steps_and_stays_lossless(pair_folder, smollm2_f16, smollm2_q4):
    """As `run` builds it with no --draft where a measurement says the sibling pays (fixed draft
    lengths: on this CPU the adaptive controller rightly pauses a Q4_1 draft of the F16): the
    draft-simple member is lazy, the greedy text is plain decoding's (or flips at a near-tie), and
    once loaded the draft drafts. A draft named with --draft loads before the first step."""
    target_path = pair_folder / smollm2_f16.name
    target = Model(target_path)
    try:   # (prose: the text drafters, first in the chain, leave it steps to draft)
        prompts = {k: prompt_tokens(target, PROMPTS[k]) for k in ("chat", "story")}
        plain = {k: generate(target, "none", p, n=64, threads=2) for k, p in prompts.items()}
    finally:
        target.close()
    with Generator(target_path, temperature=0, max_tokens=64, threads=2, adaptive=False) as g:
        lazy = _lazy_member(g)
        first = g.generate(PROMPTS["chat"])
        lazy.wait()
        second = g.generate(PROMPTS["story"])
        assert lazy.model is not None and lazy.model.path.name == smollm2_q4.name
    target = Model(target_path)
    try:
        for k, run in (("chat", first), ("story", second)):
            print(assert_lossless(target, prompts[k], plain[k].tokens, run.tokens, eps=0.25, label=k))
    finally:
        target.close()
    assert second.stats["per_drafter"]["draft-simple"]["drafted"] > 0, second.stats["per_drafter"]
    with Generator(target_path, draft=pair_folder / smollm2_q4.name, temperature=0, max_tokens=4, threads=2) as g:
        assert not any(isinstance(d, LazyDrafter) for d in g.pipeline.engine.drafter.members())


def test_a_seeded_sampled_run_waits_for_the_draft_and_repeats_itself(pair_folder, smollm2_f16):
    outs = []
    for _ in range(2):
        with Generator(pair_folder / smollm2_f16.name, temperature=0.9, seed=7, max_tokens=24, threads=2,
                       adaptive=False) as g:   # (fixed: the draft drafts every step)
            assert _lazy_member(g)
            r = g.generate("Tell me about the sea.")
            outs.append(r.tokens)
            assert r.stats["per_drafter"].get("draft-simple", {}).get("drafted", 0) > 0
    assert outs[0] == outs[1]


def test_a_run_that_ends_before_the_draft_joins_stores_no_draft_costs(pair_folder, smollm2_f16, smollm2_q4,
                                                                       monkeypatch):
    """The sizes' estimate of a draft's cost is not a measurement: a run whose draft never joined
    leaves draft_costs.json as it was (it decides whether the next run's default takes the draft)."""
    from llamaspec.tune import draft_costs

    target, draft = pair_folder / smollm2_f16.name, pair_folder / smollm2_q4.name
    before = draft_costs.measured(target, draft)
    release = threading.Event()
    real = factory._load_draft_model

    def held(*args):
        release.wait()
        return real(*args)

    monkeypatch.setattr(factory, "_load_draft_model", held)
    with Generator(target, temperature=0, max_tokens=12, threads=2) as g:
        r = g.generate("Tell me about the sea.")
        assert r.stats["per_drafter"].get("draft-simple", {}).get("drafted", 0) == 0
        release.set()
    assert draft_costs.measured(target, draft) == before


def test_where_a_chosen_draft_loads_is_decided_by_the_machine(monkeypatch):
    """Beside the first steps for a GPU target or where the target's threads leave a core free;
    before them where they take every core (a load beside them only competes); the switch
    overrides."""
    from llamaspec.speculative.drafters.lazy import decide

    monkeypatch.delenv("LLAMASPEC_LAZY_DRAFT", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    assert decide(4, -1)[0] and "GPU" in decide(4, -1)[1]
    assert decide(2, 0)[0] and "2 of 4 cores" in decide(2, 0)[1]
    assert not decide(4, 0)[0] and not decide(None, 0)[0] and "all 4 cores" in decide(None, 0)[1]
    monkeypatch.setenv("LLAMASPEC_LAZY_DRAFT", "1")
    assert decide(4, 0)[0]
    monkeypatch.setenv("LLAMASPEC_LAZY_DRAFT", "0")
    assert not decide(2, -1)[0]


@pytest.mark.slow
def test_serve_answers_concurrent_requests_while_a_chosen_draft_loads_and_stays_lossless(pair_folder, smollm2_f16,
                                                                                         tmp_path):
    """`serve --parallel 4` where the default chose the sibling and loads it beside the first steps:
    four requests sent together as soon as /health answers (their sequences begin while the draft
    loads, and it joins them mid-answer), each as plain decoding's server answers it alone (or a
    near-tie flip), and once loaded the draft drafts (the /metrics of a second round)."""
    from test_serve import Server, _chat, _chat_together, _near_tie

    target = pair_folder / smollm2_f16.name
    prompts = ["Explain in two sentences what a hash map is.", "List five fruits.",
               "Write a haiku about autumn.", "Repeat this list: apple, pear, plum, fig, kiwi."]
    plain_server = Server(target, "--parallel", "4", "--spec-type", "none", tmp=tmp_path)
    try:
        plain = [_chat(plain_server.client(), p, max_tokens=48).choices[0].message.content for p in prompts]
    finally:
        assert plain_server.stop() == 0, plain_server.log.read_text()
    s = Server(target, "--parallel", "4", "--fixed-draft", tmp=tmp_path)
    try:
        rounds = [_chat_together(s, prompts, max_tokens=48) for _ in range(2)]
        metrics = s.metrics()
    finally:
        assert s.stop() == 0, s.log.read_text()
    log = s.log.read_text()
    assert re.search(r"spec [^)]*draft-simple", log), log   # the default took the sibling
    for answers in rounds:
        assert sorted(answers) == list(range(len(prompts))), log
        print("\n".join(_near_tie(smollm2_f16, p, plain[i], answers[i]) for i, p in enumerate(prompts)))
    drafted = metrics.get('llamaspec:drafter_draft_tokens_total{drafter="draft-simple"}', 0.0)
    assert drafted > 0, metrics["_text"]
