"""uvicorn, with llamaspec's shutdown: SIGTERM (or Ctrl-C) drains. New requests get 503 while the
ones in flight finish (at most `drain_seconds`; past that they end with what they have), then the
server stops and the command exits 0. A second signal stops at once. If the engine thread dies
(scheduler.py), the server stops at once and the command exits non-zero, for a supervisor to
restart it: for DEATH_GRACE_S it answers 503 (/health says why), then stops; a process that
cannot stop by itself within DEATH_EXIT_S is ended.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time

import uvicorn

from llamaspec.errors import EXIT_FAILURE, LlamaspecError
from llamaspec.serve.scheduler import Scheduler

DEATH_GRACE_S, DEATH_EXIT_S = 2.0, 10.0


class _DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, sched: Scheduler, drain_seconds: float):
        super().__init__(config)
        self.sched, self.drain_seconds = sched, drain_seconds
        self.signalled: int | None = None

    def handle_exit(self, sig: int, frame) -> None:
        if self.signalled is not None:   # a second signal: no more waiting
            self.force_exit = self.should_exit = True
            return
        self.signalled = sig
        self.sched.drain()
        threading.Thread(target=self._drain, name="llamaspec-drain", daemon=True).start()

    def engine_died(self) -> None:
        """Called by the dying engine thread: stop serving soon (no drain: nothing can finish)."""
        def stop() -> None:
            time.sleep(DEATH_GRACE_S)
            self.force_exit = self.should_exit = True
            time.sleep(DEATH_EXIT_S)
            os._exit(EXIT_FAILURE)

        threading.Thread(target=stop, name="llamaspec-exit", daemon=True).start()

    def _drain(self) -> None:
        if not self.sched.wait_idle(self.drain_seconds):
            print(f"llamaspec serve: requests still running after {self.drain_seconds:g} s: ending them",
                  file=sys.stderr)
            self.sched.stop()   # their clients get what was generated so far
            self.sched.wait_idle(5.0)
        self.should_exit = True

    @contextlib.contextmanager
    def capture_signals(self):
        # uvicorn raises the captured signal again after serving; a drained server exits 0 instead.
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        old = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, h in old.items():
                signal.signal(s, h)


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound here so that a port in use is one clear error."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise LlamaspecError(f"cannot resolve --host {host}: {e.strerror}", "give an IP address such as 127.0.0.1") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise LlamaspecError(f"cannot listen on {host}:{port}: {e.strerror}",
                             "choose another --port, or stop what is using it") from None
    # not listening yet: while the model loads, clients are refused rather than left hanging
    # (uvicorn's asyncio server listens on it when it starts)
    return sock


def run(app, sched: Scheduler, sock: socket.socket, *, drain_seconds: float = 30.0, verbose: bool = False) -> int | None:
    """Serve until a signal has drained the server; returns the signal (None: uvicorn stopped by
    itself)."""
    config = uvicorn.Config(app, log_level="info" if verbose else "warning", access_log=verbose, lifespan="off",
                            timeout_graceful_shutdown=5)
    server = _DrainingServer(config, sched, drain_seconds)
    sched.on_death = server.engine_died
    if not sched.alive:   # (died before the server was there to be told)
        server.engine_died()
    server.run(sockets=[sock])
    return server.signalled
