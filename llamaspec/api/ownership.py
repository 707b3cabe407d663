"""Who may use a `Generator`'s llama.cpp contexts right now: one generation at a time.

llama.cpp contexts are not thread-safe, and a stream or `generate_many` holds its sequences across
its yields, so a Generator lets one generation own them from its start to its end:

- another thread that starts a generation waits until the owner ends (calls are served in turn);
- the owner's own thread starting a second one (two open streams) gets a `UsageError` at once,
  since waiting there could never end;
- `close()` marks the Generator closed at once (new calls and the next step of an open stream raise
  `UsageError`) and frees the models when no generation owns them: at once, or when the owner ends.
  So nothing frees a context under a running step, and a stream used after `close()` is an error,
  never a use of freed memory;
- tokenizing (any thread, beside a generation: it reads only the vocabulary) holds off the freeing
  too, without waiting for the owner.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator

from llamaspec.errors import UsageError

CLOSED = ("this Generator is closed", "make a new Generator (models are freed by close())")


class ContextOwner:
    def __init__(self, free: Callable[[], None]):
        self._cond = threading.Condition()
        self._owner: int | None = None   # the thread id of the generation that holds the contexts
        self._closed = False
        self._readers = 0   # threads reading the model outside a generation (tokenizing)
        self._free: Callable[[], None] | None = free

    @property
    def closed(self) -> bool:
        return self._closed

    def acquire(self) -> None:
        """Own the contexts for one generation (see the module docstring); pair with release()."""
        me = threading.get_ident()
        with self._cond:
            while True:
                if self._closed:
                    raise UsageError(*CLOSED)
                if self._owner is None:
                    self._owner = me
                    return
                if self._owner == me:
                    raise UsageError("this Generator is already generating in this thread (an open stream?)",
                                     "iterate the open stream to its end or close() it first; for several "
                                     "prompts at once use generate_many")
                self._cond.wait()

    def release(self) -> None:
        with self._cond:
            self._owner = None
            self._free_if_unused()
            self._cond.notify_all()

    def check(self) -> None:
        """Between two steps of the owner: a UsageError once close() was called."""
        if self._closed:
            raise UsageError("this Generator was closed while this generation was open", CLOSED[1])

    def close(self) -> None:
        """Closed from now on; the models are freed now, or when the owner ends (idempotent)."""
        with self._cond:
            self._closed = True
            self._free_if_unused()
            self._cond.notify_all()   # waiting threads see it closed and raise

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Around work that reads the model (the vocabulary: tokenizing) in any thread, alongside a
        generation: the models are not freed until it is done; a UsageError once closed."""
        with self._cond:
            if self._closed:
                raise UsageError(*CLOSED)
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._free_if_unused()

    def _free_if_unused(self) -> None:
        if self._closed and self._owner is None and self._readers == 0:
            free, self._free = self._free, None
            if free is not None:
                free()
