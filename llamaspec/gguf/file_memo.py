"""What was read from a GGUF file, kept per file version so a second run does not read it again.

Why: a default `run` reads its target's header and compares it with each GGUF beside it before the
model loads. In Python that is ~0.1 s for Qwen2.5-Coder's 151,936-token vocabulary and ~0.15 s of
a 32-token answer's ~1.6 s on SmolLM2 (issue 33: the default must not lose to a fixed text chain
at 32 tokens, start-up included); unpickling the same result takes a few milliseconds.

A result is keyed by what it was computed from: each file's real path, size and mtime_ns, plus
`VERSION` (raise it when a reader's output changes) and the caller's kind. Stored as pickles
under $XDG_CACHE_HOME/llamaspec/gguf-memo (~/.cache/...); LLAMASPEC_GGUF_MEMO=0 turns it off,
LLAMASPEC_GGUF_MEMO=DIR moves it. A damaged or unreadable entry is recomputed, never an error;
a failed write leaves the result uncached. The newest `KEEP` entries are kept.

    >>> # memo("header", [path], lambda: read_header_slowly(path))   # computed once per file version
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
import threading
from pathlib import Path
from typing import Callable, Sequence, TypeVar

VERSION = 1
KEEP = 256
ENV = "LLAMASPEC_GGUF_MEMO"

T = TypeVar("T")
_LOCK = threading.Lock()
_IN_PROCESS: dict[str, object] = {}   # this process's results (a run reads its target twice)


def memo_dir(env: str = ENV, under: str | None = None) -> Path | None:
    """Where entries are kept: $`env` ("0": nowhere, else that folder), else the folder `under`
    this memo's own (nowhere when this one is off), else ~/.cache/llamaspec/gguf-memo."""
    where = os.environ.get(env, "")
    if where == "0":
        return None
    if where:
        return Path(where).expanduser()
    if under is not None:
        base = memo_dir()
        return None if base is None else base / under
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "llamaspec" / "gguf-memo"


def _fingerprint(path: str | os.PathLike[str]) -> list:
    real = os.path.realpath(path)
    st = os.stat(real)
    return [real, st.st_size, st.st_mtime_ns]


def memo(kind: str, files: Sequence[str | os.PathLike[str]], compute: Callable[[], T]) -> T:
    """compute(), or what it gave before for these files unchanged. Exceptions are not kept."""
    try:
        prints = [_fingerprint(f) for f in files]
    except OSError:   # a missing file: let compute() raise its own clear error
        return compute()
    key = hashlib.sha256(repr([VERSION, kind, prints]).encode("utf-8", "surrogateescape")).hexdigest()
    with _LOCK:
        if key in _IN_PROCESS:
            return _IN_PROCESS[key]   # type: ignore[return-value]
    folder = memo_dir()
    value = read(folder, key)
    if value is not None:
        _keep(key, value)
        return value
    value = compute()
    _keep(key, value)
    if folder is not None:
        store(folder, key, value)
    return value


def _keep(key: str, value: object) -> None:
    with _LOCK:
        _IN_PROCESS[key] = value
        while len(_IN_PROCESS) > 64:
            _IN_PROCESS.pop(next(iter(_IN_PROCESS)))


def read(folder: Path | None, key: str) -> object | None:
    """The entry kept under `key` in `folder`, or None: absent, damaged, from another Python, or
    no folder (the memo is off). Never raises."""
    if folder is None:
        return None
    try:
        with open(folder / f"{key}.pkl", "rb") as f:
            return pickle.load(f)
    except Exception:
        return None


def store(folder: Path, key: str, value: object) -> None:
    """Write one entry (atomically), keeping the newest KEEP of the folder; never raises."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, folder / f"{key}.pkl")   # readers see a whole entry or none
        entries = sorted(folder.glob("*.pkl"), key=lambda p: p.stat().st_mtime_ns)
        for old in entries[:-KEEP]:
            old.unlink(missing_ok=True)
    except Exception:   # a read-only or full disk: the result is simply not kept
        try:
            os.unlink(tmp)   # type: ignore[possibly-undefined]
        except Exception:
            pass
