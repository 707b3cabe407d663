"""A child process for the tests that signal one: started as from a user's shell, read as it runs.

`default_signals` is the preexec_fn of every child a test signals (subprocess.Popen, pexpect.spawn).
A runner that ignores SIGINT or SIGTERM (a shell's background job ignores SIGINT) passes that on
through fork and exec; Python then installs no KeyboardInterrupt handler, the signal is dropped and
the child runs to its end: the test fails for the runner, not for the code.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# A hang guard, not a speed bound: how long a child may take to reach an event or to exit.
HANG_GUARD_S = 90


def default_signals() -> None:
    """SIGINT and SIGTERM at their default dispositions in the child, whatever the runner ignores."""
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_DFL)


def child_env(env: dict | None = None) -> dict:
    """os.environ plus `env`, importing this checkout's llamaspec."""
    full = {**os.environ, **(env or {})}
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), full.get("PYTHONPATH")]))
    return full


class Child:
    """`python ARGV` (default: `-m llamaspec ARGS`) in a child, its stdout and stderr collected by threads.

    The pipes are shrunk to one page: the child cannot run more than 4 KiB of output ahead of what
    this process has read. With the default 64 KiB a whole tiny-model run fits in the pipes, and on
    a busy machine the child could finish before the test saw its first line, so the signal meant
    for the middle of the run found a process that had already exited 0 (a CI failure)."""

    def __init__(self, *args, env: dict | None = None, argv: list[str] | None = None):
        cmd = [sys.executable, *(argv if argv is not None else ["-m", "llamaspec", *map(str, args)])]
        self.p = subprocess.Popen(cmd, env=child_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, preexec_fn=default_signals)
        for stream in (self.p.stdout, self.p.stderr):
            if hasattr(fcntl, "F_SETPIPE_SZ"):
                fcntl.fcntl(stream.fileno(), fcntl.F_SETPIPE_SZ, 4096)
        self.out: list[str] = []
        self.err: list[str] = []
        self._threads = [threading.Thread(target=self._pump, args=(s, buf), daemon=True)
                         for s, buf in ((self.p.stdout, self.out), (self.p.stderr, self.err))]
        for t in self._threads:
            t.start()

    @staticmethod
    def _pump(stream, buf: list[str]) -> None:
        while chunk := stream.read(1):
            buf.append(chunk)

    @property
    def stdout(self) -> str:
        return "".join(self.out)

    @property
    def stderr(self) -> str:
        return "".join(self.err)

    def wait_for(self, cond, what: str, timeout: float = HANG_GUARD_S) -> None:
        """Poll `cond` (an event the child shows: a line, a file) until it holds; the child ending
        first, or no event within the hang guard, fails the test."""
        deadline = time.monotonic() + timeout
        while not cond():
            if self.p.poll() is not None:
                pytest.fail(f"the child ended ({self.p.returncode}) before {what}: {self.stderr[-2000:]}")
            if time.monotonic() > deadline:
                self.p.kill()
                pytest.fail(f"no {what} within the hang guard ({timeout} s): {self.stderr[-2000:]}")
            time.sleep(0.01)

    def stop(self, sig: int) -> int:
        """Send `sig`, wait for the exit (a hang fails the test), return the exit code."""
        if self.p.poll() is not None:   # the signal would test nothing: say so, not "exit 0 != 143"
            pytest.fail(f"the child ended ({self.p.returncode}) before the signal: {self.stderr[-2000:]}")
        self.p.send_signal(sig)
        try:
            code = self.p.wait(timeout=HANG_GUARD_S)
        except subprocess.TimeoutExpired:
            self.p.kill()
            pytest.fail(f"hung after {signal.Signals(sig).name}: {self.stderr[-2000:]}")
        for t in self._threads:
            t.join(10)
        return code


# `llamaspec ARGS` with one line on stderr once generation is under way: every Context reports its
# third successful decode (the prompt is the first; with --spec-type none each token is one more).
# The event a signal test waits for when the command prints nothing while it generates (--json).
GENERATING = "llamaspec-test: generating"
_MARK_GENERATION = f"""
import os, sys
from llamaspec.cli import main
from llamaspec.runtime.context import Context

_init = Context.__init__

def __init__(self, *a, **kw):
    _init(self, *a, **kw)
    n = [0]

    def on_decode(*_):
        n[0] += 1
        if n[0] == 3:
            os.write(2, b"{GENERATING}\\n")

    self.add_decode_listener(on_decode)

Context.__init__ = __init__
main(sys.argv[1:])
"""


def marking_generation(*args) -> list[str]:
    """The argv (for Child(argv=...)) of `llamaspec ARGS` that prints GENERATING to stderr once it generates."""
    return ["-c", _MARK_GENERATION, *map(str, args)]
