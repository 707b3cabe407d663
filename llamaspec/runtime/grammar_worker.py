"""Compiling request input where a crash cannot reach the server: warm worker processes
(grammar_child.py) compile JSON schemas and grammars first, under a wall-time limit (the worker
is killed and replaced past it) and a memory limit (RLIMIT_AS in the worker). Only a grammar that
compiled there is compiled in this process. A `try` cannot catch a SIGSEGV and a thread cannot be
stopped: a process can.

    why = check_llg(model_path, grammar, field)   # llguidance: '' or why not; GrammarError on a crash
    grammar = to_llg(model_path, gbnf, root, field)   # GBNF for llguidance, or None: llama.cpp's then
    gbnf = convert(schema, field)                 # llama.cpp's converter (tool-call grammars)
    check_parses(model_path, spec)                # llama.cpp's GBNF parser

Idle workers are kept (MAX_IDLE) and reused; each caller takes one of its own, so a slow grammar
holds up only its own request. LLAMASPEC_GRAMMAR_SANDBOX=0 compiles in this process instead (no
isolation: for a process whose grammars are all its own).
"""

from __future__ import annotations

import json
import os
import select
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from llamaspec.runtime.grammar_errors import GrammarError

TIME_LIMIT = 5.0          # seconds one conversion or parse may take
START_LIMIT = 60.0        # seconds a worker may take to start (import llama_cpp) on a busy machine
MAX_IDLE = 2
MAX_WORKERS = 4           # workers at once (more callers wait their turn: a flood of grammars cannot fork-bomb)
SANDBOX_ENV = "LLAMASPEC_GRAMMAR_SANDBOX"

_idle: list["_Worker"] = []
_lock = threading.Lock()
_slots = threading.BoundedSemaphore(MAX_WORKERS)
_owner = os.getpid()   # a forked child does not share its parent's workers (their pipes are the parent's)


def sandboxed() -> bool:
    return os.environ.get(SANDBOX_ENV, "1") != "0"


class _Died(Exception):
    pass


class _TimedOut(Exception):
    pass


class _Worker:
    def __init__(self):
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.proc = subprocess.Popen([sys.executable, "-m", "llamaspec.runtime.grammar_child"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=env, close_fds=True, start_new_session=True)
        self._buf = b""
        self.models: set[str] = set()   # the vocabularies it has loaded
        self._recv(START_LIMIT)   # {"ready": true}

    def ask(self, msg: dict, limit: float) -> dict:
        data = json.dumps(msg).encode("utf-8")
        try:
            self.proc.stdin.write(struct.pack(">I", len(data)) + data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise _Died() from None
        return self._recv(limit)

    def _recv(self, limit: float) -> dict:
        deadline = time.monotonic() + limit
        fd = self.proc.stdout.fileno()
        while True:
            if len(self._buf) >= 4:
                (n,) = struct.unpack(">I", self._buf[:4])
                if len(self._buf) >= 4 + n:
                    msg, self._buf = self._buf[4:4 + n], self._buf[4 + n:]
                    return json.loads(msg)
            left = deadline - time.monotonic()
            if left <= 0:
                raise _TimedOut()
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    raise _Died()
                self._buf += chunk

    def kill(self) -> None:
        try:
            self.proc.kill()
        except OSError:
            pass
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass

    def death(self) -> str:
        code = self.proc.wait()
        return f"signal {-code}" if code < 0 else f"exit code {code}"


def _ask(msg: dict, field: str) -> dict:
    """The worker's reply to `msg`; GrammarError naming `field` when it dies or runs out of time."""
    with _slots:
        return _ask_one(msg, field)


def _ask_one(msg: dict, field: str) -> dict:
    global _owner
    with _lock:
        if _owner != os.getpid():
            _idle.clear()
            _owner = os.getpid()
        worker = _idle.pop() if _idle else None
    if worker is None or worker.proc.poll() is not None:
        try:
            worker = _Worker()
        except (_Died, _TimedOut, OSError) as e:
            raise GrammarError(f"{field}: the grammar compiler could not be started ({type(e).__name__})", field,
                               f"{SANDBOX_ENV}=0 compiles grammars in this process instead") from None
    model = msg.get("model")
    try:   # (loading a vocabulary the first time is not the grammar's time)
        reply = worker.ask(msg, TIME_LIMIT if model is None or model in worker.models else TIME_LIMIT + START_LIMIT)
    except _TimedOut:
        worker.kill()
        raise GrammarError(f"{field}: the grammar took longer than {TIME_LIMIT:g} s to compile", field) from None
    except _Died:
        how = worker.death()
        worker.kill()
        raise GrammarError(f"{field}: the grammar crashed the compiler ({how}); it cannot be used", field) from None
    if model is not None:
        worker.models.add(model)
    with _lock:
        if len(_idle) < MAX_IDLE:
            _idle.append(worker)
            worker = None
    if worker is not None:
        worker.kill()
    return reply


def convert(schema: Any, field: str) -> str:
    """The GBNF of a checked JSON schema, converted in a worker; GrammarError naming `field`."""
    reply = _ask({"op": "schema", "schema": schema}, field)
    if "error" in reply:
        raise GrammarError(f"{field}: {reply['error']}", field)
    return reply["gbnf"]


def check_llg(model_path: str | os.PathLike | None, grammar: str, field: str) -> str:
    """Compile llguidance's `grammar` in a worker (against the model's vocabulary, with the
    parser limits, and compute its first mask; without a model: validate it): '' when it
    compiles, else llguidance's reason. GrammarError naming `field` when it crashes or runs away."""
    reply = _ask({"op": "llg", "model": None if model_path is None else str(model_path), "grammar": grammar}, field)
    return reply.get("error", "")


def to_llg(model_path: str | os.PathLike, gbnf: str, root: str, field: str) -> str | None:
    """llguidance's grammar for GBNF text, converted (grammar_lark.py) and compiled against the
    model's vocabulary in a worker; None when llguidance cannot read or compile it (llama.cpp's
    engine takes it then, its own parse checked in a worker too). GrammarError when it runs away."""
    try:
        reply = _ask({"op": "lark", "model": str(model_path), "gbnf": gbnf, "root": root}, field)
    except GrammarError as e:
        if "crashed" in e.message:
            return None
        raise
    return reply.get("grammar")


def check_parses(model_path: str | os.PathLike, gbnf: str, root: str, patterns: tuple[str, ...],
                 tokens: tuple[int, ...], field: str) -> None:
    """Build llama.cpp's grammar sampler for the grammar in a worker (against the model's
    vocabulary) and apply it once; GrammarError naming `field` when it fails, crashes or runs away."""
    reply = _ask({"op": "gbnf", "model": str(model_path), "gbnf": gbnf, "root": root,
                  "patterns": list(patterns), "tokens": list(tokens)}, field)
    if "error" in reply:
        raise GrammarError(f"{field}: the grammar does not compile: {reply['error']}", field)


def prewarm(model_path: str | os.PathLike | None = None) -> None:
    """Start an idle worker now (and load the model's vocabulary and llguidance's tokenizer of it
    in it), off the caller's thread."""
    def start() -> None:
        try:
            w = _Worker()
            if model_path is not None:
                from llamaspec.runtime.grammar_llg import lark_grammar

                w.ask({"op": "llg", "model": str(model_path), "grammar": lark_grammar('start: "a"')}, START_LIMIT)
                w.models.add(str(model_path))
        except (_Died, _TimedOut, OSError):
            return
        with _lock:
            if len(_idle) < MAX_IDLE:
                _idle.append(w)
                return
        w.kill()

    threading.Thread(target=start, name="llamaspec-grammar-prewarm", daemon=True).start()


def shutdown() -> None:
    """Stop the idle workers (they also exit by themselves when this process ends)."""
    with _lock:
        workers, _idle[:] = list(_idle), []
    for w in workers:
        w.kill()
