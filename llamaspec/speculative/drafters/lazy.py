"""A draft model loaded beside the first steps, not before them (issue 33: a draft model that is
used costs nothing before it pays).

A draft model's load (mapping and repacking its weights, making its context) and cost probe used
to come before the target's first token, and its prompt evaluation at its first draft, on the
main thread. `LazyDrafter` moves the load to a background worker started when the pipeline is
built: the target evaluates the prompt and decodes meanwhile, and the chain's other members
(prompt-lookup, suffix) draft as usual; the draft joins at the first step after its load, its
cost per token timed then (`Drafter.time_token`: two one-token decodes of its empty memory, over
the target step the controllers time themselves). The prompt is evaluated in the draft only when
its controller first wants a draft (`Drafter.prefill`, in the worker: that step and the next
ones go on without the draft model until it is done), so a draft that does not pay, paused from
the start, never evaluates it (SmolLM2 F16 with its Q4_1 forced, a 222-token prompt, 32 tokens:
0.67 s of the draft's prompt evaluation for one 4-token probe, on a 0.36 s answer).

Only a draft the default chose (`--draft auto`, or none given) loads so, and only where a GPU or
a free core can do it (`decide`: where the target's threads take every core, a load beside its
steps only competes with them); a draft file the user names loads before the first step, so
that one llama.cpp cannot load is refused at once with its error and exit code (a bad file is a
user's error, not a warning mid-answer).

Threads: the draft's model and context are the worker's until it is idle (loaded, nothing queued)
and the main thread's while it is; a `begin` or `end` while it works is queued for it, in order,
under `_cv`. The target's context is never touched by the worker. A load that fails (out of
memory, or a chosen file whose header passed the pair check but that llama.cpp refuses) is a
warning and generation goes on without the draft: nothing already produced is lost, and the
output is the same (drafts only propose). A seed at T > 0 waits for the load and for each
prompt's evaluation (`steady`): which positions a draft model drafts decides rejection
sampling's random draws, so it must not follow a clock.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Callable, Sequence

import numpy as np

from llamaspec.speculative.drafters.base import Draft, Drafter

__all__ = ["ENV", "LazyDrafter", "decide"]

log = logging.getLogger(__name__)

#: LLAMASPEC_LAZY_DRAFT=0: a draft the default chose always loads before the first step; =1: always
#: beside the first steps (also on a CPU); unset: `decide`
ENV = "LLAMASPEC_LAZY_DRAFT"


def decide(n_threads: int | None, n_gpu_layers: int) -> tuple[bool, str]:
    """(load a chosen draft beside the first steps?, why). Where something is free to do it: a
    target on a GPU, or CPU cores its threads leave idle. Measured on the 2-core EPYC (SmolLM2 F16
    with its Q4_1 chosen as draft, a 32-token code edit, from start to exit, medians of 5): at -t 1,
    a core free, 1.81 s beside against 2.18 s first (plain 1.72 s); at -t 2, every core taken,
    1.61 s against 1.61 s, the target's prompt slowed by the load (0.47-0.73 s against 0.34-0.50 s)."""
    forced = os.environ.get(ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1", ("beside the first steps" if forced == "1" else "before the first step") + f" ({ENV}={forced})"
    if n_gpu_layers != 0:
        return True, "beside the first steps (the target decodes on a GPU: the CPU is free to load it)"
    cores = os.cpu_count() or 1
    threads = n_threads or cores
    if threads < cores:
        return True, f"beside the first steps ({cores - threads} of {cores} cores left free by the target's {threads} threads)"
    return False, (f"before the first step (the target's {threads} threads take all {cores} cores: a load "
                   "beside them only competes with them)")


class LazyDrafter(Drafter):
    """`load()` -> (drafter, model), run in a background worker, which then evaluates prompts
    (`prefill`) as the controllers ask for drafts; this drafter stands in for the loaded one and
    drafts only while the worker is idle.

    name, cost_hint and resume_tokens are the loaded drafter's, given beforehand (the engine reads
    them when a sequence starts); `samples` is the loaded drafter's once it is there (a draft of
    another vocabulary does not sample)."""

    def __init__(self, load: Callable[[], tuple[Drafter, object]], *, name: str, cost_hint: float,
                 resume_tokens: int):
        self.name = name
        self.cost_hint = cost_hint
        # measured_cost stays 0 (unknown): a run that ends before the draft joins must not leave
        # the sizes' estimate in draft_costs.json as if it were measured (tune/draft_costs.py)
        self.resume_tokens = resume_tokens
        self._inner: Drafter | None = None
        self._model = None
        self._error: BaseException | None = None
        self._seconds: float | None = None
        self._joined = False
        self._cold: set[int] = set()   # sequences begun whose prompt the draft has not evaluated
        self._steady: set[int] = set()   # sequences whose drafts must not follow a clock (`steady`)
        self._cv = threading.Condition()
        self._queue: list[Callable[[Drafter], None]] = []   # the worker's, in order
        self._idle = False      # loaded (or failed) and nothing queued: the main thread's turn
        self._closing = False
        self._thread = threading.Thread(target=self._work, args=(load,), name="llamaspec-draft-load", daemon=True)
        self._thread.start()

    def _work(self, load: Callable[[], tuple[Drafter, object]]) -> None:
        try:
            self._inner, self._model = load()
            while True:
                with self._cv:
                    while not self._queue:
                        self._idle = True
                        self._cv.notify_all()
                        if self._closing:
                            return
                        self._cv.wait()
                    job = self._queue.pop(0)
                job(self._inner)
        except BaseException as e:   # (reported on the main thread, at the next step)
            self._error = e
            if self._inner is not None:
                self._inner.close()
            if self._model is not None:
                self._model.close()   # type: ignore[attr-defined]
            self._inner = self._model = None
            with self._cv:
                self._queue.clear()
                self._idle = True
                self._cv.notify_all()

    def _submit(self, job: Callable[[Drafter], None]) -> None:
        """Run job(drafter) in the worker, after what it has queued; the drafter is the worker's
        until then."""
        with self._cv:
            self._queue.append(job)
            self._idle = False
            self._cv.notify_all()

    # -- the loaded drafter, when it is the main thread's ----------------------------------------
    @property
    def loaded(self) -> bool:
        return self._idle and self._inner is not None

    @property
    def samples(self) -> bool:   # type: ignore[override]
        return self._inner is not None and self._inner.samples

    @property
    def model(self):
        """The draft model, once loaded (None before, or after a failed load)."""
        return self._model if self._idle else None

    def _ready(self) -> Drafter | None:
        """The loaded drafter while the worker is idle, joined (its cost timed); None while it
        loads or evaluates a prompt, or after its load failed."""
        if not self._idle:
            return None
        if self._inner is None:
            if self._error is not None:
                log.warning("the draft model could not be loaded (%s): going on without it", self._error)
                self._error = None
            return None
        if not self._joined:
            self._joined = True
            self._seconds = self._inner.time_token()
        return self._inner

    def wait(self) -> None:
        with self._cv:
            self._cv.wait_for(lambda: self._idle)

    def steady(self, seq_id: int) -> None:
        self._steady.add(seq_id)
        self.wait()

    def draft_token_seconds(self) -> float | None:
        return self._seconds

    # -- the Drafter interface --------------------------------------------------------------------
    def begin(self, seq_id: int, prompt_tokens: Sequence[int], rng: np.random.Generator | None = None) -> None:
        if self._idle and self._inner is None:   # no draft model: nothing to begin
            return
        self._cold.add(seq_id)
        inner = self._ready()
        if inner is not None:
            inner.begin(seq_id, prompt_tokens, rng)
        else:
            prompt = list(prompt_tokens)
            self._submit(lambda d: d.begin(seq_id, prompt, rng))

    def _warm(self, seq_id: int, history: Sequence[int]) -> None:
        """The controller wants a draft of a sequence whose prompt the draft has not evaluated:
        the worker evaluates it; the draft drafts again once it is done."""
        self._cold.discard(seq_id)
        upto = list(history)
        self._submit(lambda d: d.prefill(seq_id, upto))
        if seq_id in self._steady:   # then drafts in this step, as if loaded first
            self.wait()

    def batch_member(self) -> Drafter | None:
        return self if self._inner is not None and self._inner.batch_member() is self._inner else None

    def propose(self, seq_id: int, history: Sequence[int], n_max: int) -> Draft:
        return self.propose_within(seq_id, history, lambda d, match=None: n_max)

    def propose_within(self, seq_id: int, history: Sequence[int], limit: Callable[..., int]) -> Draft:
        inner = self._ready()   # loading or busy: no draft, and the controller is not asked
        if inner is None:
            return Draft([])
        if seq_id in self._cold:
            if limit(self) <= 0:
                return Draft([])
            self._warm(seq_id, history)   # wanted: its prompt first, in the worker
            inner = self._ready()
            if inner is None:
                return Draft([])
        return inner.propose_within(seq_id, history, limit)

    def propose_many(self, requests: Sequence[tuple[int, Sequence[int], int]]) -> list[Draft]:
        inner = self._ready()
        if inner is None:
            return [Draft([]) for _ in requests]
        cold = [(s, h) for s, h, n in requests if s in self._cold and n > 0]
        for s, h in cold:
            self._warm(s, h)
        inner = self._ready() if cold else inner
        if inner is None:
            return [Draft([]) for _ in requests]
        return inner.propose_many(requests)   # type: ignore[attr-defined]

    def accepted(self, seq_id: int, n_accepted: int, new_tokens: Sequence[int], is_other: bool = False) -> None:
        inner = self._ready()
        if inner is not None:
            inner.accepted(seq_id, n_accepted, new_tokens, is_other)

    def end(self, seq_id: int) -> None:
        self._cold.discard(seq_id)
        self._steady.discard(seq_id)
        inner = self._ready()
        if inner is not None:
            inner.end(seq_id)
        elif not (self._idle and self._inner is None):
            self._submit(lambda d: d.end(seq_id))

    def close(self) -> None:
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        self._thread.join()   # a load or prompt in flight finishes first: its model is freed here
        if self._inner is not None:
            self._inner.close()
        if self._model is not None:
            self._model.close()   # type: ignore[attr-defined]
        self._inner = self._model = None
