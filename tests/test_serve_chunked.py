"""`serve`'s admission path: prompts rendered and tokenized in preparing threads, long prompts
evaluated in chunks inside the shared steps (llamaspec/serve/scheduler.py, serve/prefill.py).

The scheduler is driven in-process, built as `llamaspec serve` builds it (Generator.from_options,
Scheduler), so the order of its events can be read exactly: the engine thread emits them one at a
time. Real SmolLM2 F16 (and a tiny GGUF for the template), real llama.cpp.
"""

from __future__ import annotations

import dataclasses
import doctest
import threading

import pytest

from engine_helpers import assert_lossless

from llamaspec.api.options import GenerationOptions
from llamaspec.api.generator import Generator, Request
from llamaspec.runtime import chat_template
from llamaspec.serve import prefill
from llamaspec.serve.scheduler import Job, Scheduler
from llamaspec.speculative.sampling_params import SamplingParams
from llamaspec.testing.tiny_models import BASE_SEED, bpe_vocab, write_llama_model

HANG_GUARD_S = 600   # a request that never ends fails the test instead of hanging it
EPS = 0.25           # F16: batch-shape noise moves a logit by up to ~0.09; a real bug diverges far above
SENTENCES = ["The river bends twice before it reaches the old mill by the bridge.",
             "Farmers bring apples, pears and honey to the market every Saturday morning.",
             "A lighthouse keeper writes the weather into a notebook at dawn and dusk."]


def _notes(n: int) -> str:
    return " ".join(f"({i}) {SENTENCES[i % len(SENTENCES)]}" for i in range(n))


class Events:
    """Every event of every job, in the order the scheduler emitted them (plus marks of our own)."""

    def __init__(self):
        self.log: list[tuple[str, tuple]] = []
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.jobs: list[Job] = []

    def job(self, name: str, prompt, **fields) -> Job:
        def emit(ev: tuple) -> None:
            self.mark(name, *ev)
        self.jobs.append(Job(name, Request(prompt, **fields), emit, stream=True))
        return self.jobs[-1]

    def mark(self, name: str, *ev) -> None:
        with self.lock:
            self.log.append((name, tuple(ev)))
            self.changed.notify_all()

    def wait(self, name: str, *kinds: str) -> tuple:
        """The first event of `name` whose kind is one of `kinds` (failing after HANG_GUARD_S)."""
        def first():
            return next((ev for who, ev in self.log if who == name and ev[0] in kinds), None)
        with self.lock:
            assert self.changed.wait_for(first, HANG_GUARD_S), f"{name}: no {kinds} within the hang guard"
            return first()

    def end(self, name: str) -> tuple:
        return self.wait(name, "done", "error")

    def ended(self, name: str) -> bool:
        with self.lock:
            return any(who == name and ev[0] in ("done", "error") for who, ev in self.log)

    def between(self, name: str, after: tuple[str, str], before: tuple[str, str]) -> int:
        """How many text events of `name` came after the first `after` event and before the first
        `before` event ((job, kind) each)."""
        with self.lock:
            log = list(self.log)
        i = next(k for k, (who, ev) in enumerate(log) if (who, ev[0]) == after)
        j = next(k for k, (who, ev) in enumerate(log) if (who, ev[0]) == before)
        return sum(1 for who, ev in log[i + 1:j] if who == name and ev[0] == "text")


def _generator(model, **kw) -> Generator:
    opts = GenerationOptions(ctx_size=4096, threads=2, parallel=2, sampling=SamplingParams(temperature=0.0), **kw)
    return Generator.from_options(model, opts)


def _serve(gen: Generator, **kw) -> Scheduler:
    sched = Scheduler(gen, 2, cache_ram_mib=256, **kw)
    sched.start()
    return sched


def _stop(sched: Scheduler, ev: "Events") -> None:
    """Cancel what still runs, wait for the in-flight count to reach 0, stop the engine thread
    (always: the Generator must not be closed under it)."""
    try:
        for job in ev.jobs:
            sched.cancel(job)
        assert sched.wait_idle(HANG_GUARD_S), "requests still in flight after the hang guard"
    finally:
        sched.stop()
    assert sched.in_flight == 0


def test_the_chunk_budget_doctests():
    assert doctest.testmod(prefill).failed == 0


@pytest.mark.real
@pytest.mark.slow
def test_a_stream_keeps_receiving_tokens_while_a_long_prompt_is_admitted(smollm2_f16):
    """Between the long request's acceptance and its first token, the running stream gets tokens:
    the prompt's chunks share its steps. Evaluated in one piece (chunked_prefill=False, printed
    for the record) the stream gets at most the one step that was under way."""
    counts = {}
    with _generator(smollm2_f16, spec_type="none") as gen:
        for chunked in (True, False):
            sched, ev = _serve(gen, chunked_prefill=chunked), Events()
            try:
                stream = ev.job("stream", "Tell me a long story about a lighthouse keeper.", max_tokens=-1,
                                ignore_eos=True)
                assert sched.submit(stream)
                assert ev.wait("stream", "text", "error")[0] == "text"
                long = ev.job("long", _notes(80) + "\nWhich sentence mentions honey?", max_tokens=4)
                assert sched.submit(long)
                assert ev.end("long")[0] == "done"
                sched.cancel(stream)   # (a cancelled job gets no answer: its client is gone)
                counts[chunked] = ev.between("stream", ("long", "accepted"), ("long", "text"))
                n_prompt = ev.end("long")[1].n_prompt
            finally:
                _stop(sched, ev)
    print(f"stream tokens while a {n_prompt}-token prompt was admitted: chunked {counts[True]}, "
          f"in one piece {counts[False]}")
    assert n_prompt > 1000
    assert counts[True] >= 2, counts
    assert counts[False] <= 1, counts


def _same_or_near_tie(gen: Generator, prompt: list[int], a: list[int], b: list[int], label: str) -> str:
    n = min(len(a), len(b))
    assert a[:n] != b[:n] or len(a) == len(b), (label, len(a), len(b))   # one cut short of the other
    return assert_lossless(gen.pipeline.target, prompt, a, b, EPS, label, n_ctx=4096)   # (a prompt of 1000+)


@pytest.mark.real
@pytest.mark.slow
def test_chunked_prefill_gives_the_greedy_tokens_of_unchunked_and_keeps_prefix_reuse(smollm2_f16):
    """A stream, a long prompt arriving beside it, then the same long prompt with another question
    (it goes to the slot holding the first one's KV): every request's greedy tokens are those of
    the same requests with prompts evaluated in one piece (or a near-tie flip), and the third
    reuses the long prefix either way. Default speculation (the server's), so drafts ride too."""
    notes = _notes(60)
    prompts = {"stream": "Write a short poem about the sea.",
               "long": notes + "\nWhich sentence mentions honey?",
               "again": notes + "\nWhich sentence mentions a notebook?"}
    got: dict[bool, dict] = {}
    with _generator(smollm2_f16) as gen:
        for chunked in (True, False):
            sched, ev = _serve(gen, chunked_prefill=chunked), Events()
            try:
                assert sched.submit(ev.job("stream", prompts["stream"], max_tokens=128))
                ev.wait("stream", "text", "error")
                assert sched.submit(ev.job("long", prompts["long"], max_tokens=24))
                results = {"long": ev.end("long"), "stream": ev.end("stream")}
                assert sched.submit(ev.job("again", prompts["again"], max_tokens=24))
                results["again"] = ev.end("again")
            finally:
                _stop(sched, ev)
            assert all(r[0] == "done" for r in results.values()), results
            got[chunked] = {k: (r[1].tokens, r[2]) for k, r in results.items()}
        lines = [_same_or_near_tie(gen, gen.tokenize(text), got[False][name][0], got[True][name][0], name)
                 for name, text in prompts.items()]
        a, b = gen.tokenize(prompts["long"]), gen.tokenize(prompts["again"])
        shared = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    print("\n".join(lines))
    assert shared > 800
    assert got[True]["again"][1] == got[False]["again"][1] == shared, (got[True]["again"][1], got[False]["again"][1])


@pytest.mark.real
def test_a_runaway_template_fails_its_request_alone_off_the_main_thread(tmp_path, monkeypatch):
    """A chat template that loops forever on one message is stopped by its time limit in the
    preparing thread (SIGALRM never reached there): that request gets a 400 naming the limit, the
    stream decoding meanwhile goes on (it gets text while the template spins) and ends normally,
    and the next request is served."""
    spin = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    template = ("{% for m in messages %}{% if m.content == 'spin' %}" + spin + "{% endif %}"
                "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n")
    model = write_llama_model(tmp_path / "spin.gguf", n_layer=1, seed=BASE_SEED, name="spin", context_length=32768,
                              vocab=dataclasses.replace(bpe_vocab(), chat_template=template))
    monkeypatch.setattr(chat_template, "TIME_LIMIT", 1.0)
    gen = Generator.from_options(model, GenerationOptions(ctx_size=32768, threads=1, parallel=2, spec_type="none",
                                                          sampling=SamplingParams(temperature=0.0)))
    with gen:
        sched, ev = _serve(gen), Events()
        try:
            stream = ev.job("stream", [{"role": "user", "content": "hello"}], max_tokens=-1, ignore_eos=True)
            assert sched.submit(stream)
            assert ev.wait("stream", "text", "error")[0] == "text"
            ev.mark("spin", "submitted")
            assert sched.submit(ev.job("spin", [{"role": "user", "content": "spin"}]))
            err = ev.end("spin")
            assert err[0] == "error" and err[1] == 400 and err[3] == "messages", err
            assert "did not finish within 1 s" in err[2] and "\n" not in err[2], err
            assert not ev.ended("stream"), "the stream ended before the template's limit: too short to tell"
            # the engine thread went on stepping while the template spun in its preparing thread
            assert ev.between("stream", ("spin", "submitted"), ("spin", "error")) > 0
            sched.cancel(stream)
            assert sched.wait_idle(HANG_GUARD_S)
            assert sched.submit(ev.job("after", [{"role": "user", "content": "hi again"}], max_tokens=8))
            assert ev.end("after")[0] == "done"
        finally:
            _stop(sched, ev)
