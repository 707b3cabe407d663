"""A request as the engine thread sees it (`Job`: what to generate, where its events go), and the
test-only fault hook that lets tests fail a request at each point of its way through the scheduler.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from llamaspec.api.generator import Generator, Request

#: Test-only fault injection (tests/test_serve_faults.py), off unless this variable is "1": a
#: request whose prompt contains "<<fault:KIND>>" raises at that point. KIND is one of FAULT_KINDS:
#: prepare / admit / text / step / finish raise an ordinary exception (the request, or for step
#: the requests of that step, get a 500); engine raises past every handler (the engine thread dies).
FAULT_HOOK_ENV = "LLAMASPEC_TEST_FAULT_HOOK"
FAULT_KINDS = ("prepare", "admit", "text", "step", "finish", "engine")
_FAULTS_ON = os.environ.get(FAULT_HOOK_ENV) == "1"


class InjectedFault(RuntimeError):
    pass


class _InjectedDeath(BaseException):   # not an Exception: no handler of the loop stops it
    pass


def fault_point(job: "Job", kind: str) -> None:
    if _FAULTS_ON and f"<<fault:{kind}>>" in str(job.request.prompt):
        raise (_InjectedDeath if kind == "engine" else InjectedFault)(f"injected fault: {kind}")


@dataclass(eq=False)
class Job:
    id: str
    request: "Request"
    emit: Callable[[tuple], None]      # thread-safe: called from the engine thread
    stream: bool = False
    field_prompt: str = "messages"     # the request field holding the prompt (for errors)
    cancelled: bool = False            # set by the handler (client gone); read by the engine thread
    tokens: list[int] = field(default_factory=list)
    config: Any = None
    deadline: float = float("inf")     # time.monotonic() past which it ends (--timeout)
    error: BaseException | None = None  # a failure while its text was sent: ends it at the next reap
    ended: bool = False                # answered and counted out of the in-flight requests
    marks: dict = field(default_factory=dict)   # perf_counter times on its way (serve/profile.py)
    tools: Any = None                  # the ToolPlan its reply's calls are parsed with (None: no tools)
    seq: Any = None                    # its SequenceRun while it runs (streamed logprobs read it)

    def send(self, event: tuple) -> None:
        """emit, never raising into the engine thread (a closed event loop: the client is gone)."""
        try:
            self.emit(event)
        except Exception:  # noqa: BLE001
            self.cancelled = True


def prepare(gen: "Generator", req: "Request") -> tuple[list[int], Any, Any]:
    """(tokens, config, tool plan or None) of a request, without the length check (the server
    answers a long prompt with llama-server's error). In a preparing thread."""
    prepared = gen.prepare(req, fit=False)
    return prepared.tokens, prepared.config, prepared.tools
