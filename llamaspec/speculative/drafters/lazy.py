"""A draft model loaded beside the first steps, not before them (issue 33: a draft model that is
used costs nothing before it pays).

Loading a draft GGUF (mapping and repacking its weights, making its context) and timing it took
place before the target's first token: on a 32-token answer that is time no draft can win back
when it turns out not to pay. `LazyDrafter` starts the load in a background thread when the
pipeline is built and drafts nothing until it is done: meanwhile the target evaluates the prompt
and decodes, and the chain's other members (prompt-lookup, suffix) draft as usual. Once loaded,
the model drafter joins at the next step: it begins the sequences that began meanwhile (its
prompt is evaluated at its first draft, as always: `ModelDrafter._catch_up`) and its cost per
token is timed then, on the main thread, a few one-token decodes of its still empty context
(`draft_token_seconds`); the controllers divide that by the target step they time themselves.

Threads: the loader touches only the draft's own model and context and hands them over through
`_done`; the main thread never reads them before. A load that fails (out of memory, say) is a
warning, and generation goes on without the draft: nothing already produced is lost, and the
output is the same (drafts only propose). A bad file is refused before, where the pair is
checked. Reproducible sampling (a seed at T > 0) waits for the load (`wait`): which positions a
draft model drafts decides rejection sampling's random draws, so it must not follow a clock.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Sequence

import numpy as np

from llamaspec.speculative.drafters.base import Draft, Drafter

__all__ = ["LazyDrafter"]

log = logging.getLogger(__name__)

#: one-token decodes timed on the draft when it joins (the fastest counts)
PROBE_REPS = 3


class LazyDrafter(Drafter):
    """`load()` -> (drafter, model) run in a background thread; this drafter stands in for it.

    name, cost_hint and resume_tokens are the loaded drafter's, given beforehand (the engine reads
    them when a sequence starts); `samples` is the loaded drafter's once it is there (a draft of
    another vocabulary does not sample). `probe_token`: the token the draft's cost is timed with
    (the target's BOS)."""

    def __init__(self, load: Callable[[], tuple[Drafter, object]], *, name: str, cost_hint: float,
                 resume_tokens: int, probe_token: int = 0):
        self.name = name
        self.cost_hint = cost_hint
        # measured_cost stays 0 (unknown): a run that ends before the draft joins must not leave
        # the sizes' estimate in draft_costs.json as if it were measured (tune/draft_costs.py)
        self.resume_tokens = resume_tokens
        self._probe_token = probe_token
        self._inner: Drafter | None = None
        self._model = None
        self._error: BaseException | None = None
        self._seconds: float | None = None
        self._joined = False
        self._begun: dict[int, tuple[list[int], np.random.Generator | None]] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._load, args=(load,), name="llamaspec-draft-load", daemon=True)
        self._thread.start()

    def _load(self, load: Callable[[], tuple[Drafter, object]]) -> None:
        try:
            self._inner, self._model = load()
        except BaseException as e:   # (reported on the main thread, at the next step)
            self._error = e
        finally:
            self._done.set()

    # -- the loaded drafter, once it is there ----------------------------------------------------
    @property
    def loaded(self) -> bool:
        return self._done.is_set() and self._inner is not None

    @property
    def samples(self) -> bool:   # type: ignore[override]
        return self.loaded and self._inner.samples   # type: ignore[union-attr]

    @property
    def model(self):
        """The draft model, once loaded (None before, or after a failed load)."""
        return self._model if self._done.is_set() else None

    def _ready(self) -> Drafter | None:
        """The loaded drafter, joined (its cost timed, the sequences begun meanwhile begun), or
        None while it loads or after its load failed."""
        if not self._done.is_set():
            return None
        if self._inner is None:
            if self._error is not None:
                log.warning("the draft model could not be loaded (%s): going on without it", self._error)
                self._error = None
            return None
        if not self._joined:
            self._joined = True
            ctx = getattr(self._inner, "ctx", None)
            if ctx is not None:   # its memory is still empty: nothing reached it before it joined
                self._seconds = ctx.time_one_token(max(0, self._probe_token), reps=PROBE_REPS)
        for seq_id, (prompt, rng) in self._begun.items():
            self._inner.begin(seq_id, prompt, rng)
        self._begun.clear()
        return self._inner

    def wait(self) -> None:
        self._done.wait()

    def draft_token_seconds(self) -> float | None:
        return self._seconds

    # -- the Drafter interface --------------------------------------------------------------------
    def begin(self, seq_id: int, prompt_tokens: Sequence[int], rng: np.random.Generator | None = None) -> None:
        inner = self._ready()
        if inner is None:
            self._begun[seq_id] = (list(prompt_tokens), rng)
        else:
            inner.begin(seq_id, prompt_tokens, rng)

    def batch_member(self) -> Drafter | None:
        return self if self.loaded and self._inner.batch_member() is self._inner else None   # type: ignore[union-attr]

    def propose(self, seq_id: int, history: Sequence[int], n_max: int) -> Draft:
        inner = self._ready()
        return inner.propose(seq_id, history, n_max) if inner is not None else Draft([])

    def propose_within(self, seq_id: int, history: Sequence[int], limit: Callable[..., int]) -> Draft:
        inner = self._ready()   # not loaded: no draft, and the controller is not asked
        return inner.propose_within(seq_id, history, limit) if inner is not None else Draft([])

    def propose_many(self, requests: Sequence[tuple[int, Sequence[int], int]]) -> list[Draft]:
        inner = self._ready()
        if inner is None:
            return [Draft([]) for _ in requests]
        return inner.propose_many(requests)   # type: ignore[attr-defined]

    def accepted(self, seq_id: int, n_accepted: int, new_tokens: Sequence[int], is_other: bool = False) -> None:
        if self._joined and self._inner is not None:
            self._inner.accepted(seq_id, n_accepted, new_tokens, is_other)   # type: ignore[union-attr]

    def end(self, seq_id: int) -> None:
        if self._begun.pop(seq_id, None) is None and self._joined and self._inner is not None:
            self._inner.end(seq_id)   # type: ignore[union-attr]

    def close(self) -> None:
        self._thread.join()   # a load in flight finishes first: its model is freed here
        if self._inner is not None:
            self._inner.close()
        if self._model is not None:
            self._model.close()   # type: ignore[attr-defined]
        self._inner = self._model = None
