"""The default's draft choice, kept while nothing it was made from has changed.

Why: before the model loads, a default `run` looks for drafts: it imports the pairing code and
reads its target's and its neighbours' headers (each kept per file version by gguf/file_memo.py,
still ~35 ms of imports and unpickling on SmolLM2 F16). A 32-token answer takes ~1 s from process
start there, so the default ran 3-4 % behind the same chain given with --spec-type (issue 33's bar:
within 0.97x). Nothing changed since the last run, a run reads one small pickle and stats the
places the last one looked at.

The key is what the choice was asked with: the target file's version, the search dirs, offline,
-ngl and the device kind, the environment that says where models and stores live. The witnesses
are what it read, each with its stamp (mtime_ns and size; None when missing, so a folder that
appears counts): every directory discovery listed and every store it would have listed, every GGUF
it found (a file replaced in place), the pairing registry's files and the stored draft costs.
One witness changed: the choice is made again. LLAMASPEC_CHOICE_MEMO=0 turns it off (=DIR moves
it); without the header memo (LLAMASPEC_GGUF_MEMO=0) it is off too.

    >>> # kept = lookup(key(...)); on a miss: with witnessed() as seen: ...; save(key, seen, value)
"""

from __future__ import annotations

import hashlib
import os
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Iterator, Sequence

from llamaspec.gguf import file_memo

VERSION = 1
ENV = "LLAMASPEC_CHOICE_MEMO"
#: the environment a choice depends on: where models, the registry and the stores are
_ENV_PREFIXES = ("LLAMASPEC_", "HF_", "HUGGINGFACE_", "XDG_", "OLLAMA_")

_SEEN: ContextVar[dict[str, tuple[int, int] | None] | None] = ContextVar("choice_witnesses", default=None)


def stamp(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """(mtime_ns, size) of a path (a symlink's target), None when it is missing."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def witness(path: str | os.PathLike[str]) -> None:
    """Discovery read `path` (listed a directory, found a file, looked for a store): recorded
    when a choice is being witnessed, else nothing."""
    seen = _SEEN.get()
    if seen is not None and str(path) not in seen:
        seen[str(path)] = stamp(path)


@contextmanager
def witnessed() -> Iterator[dict[str, tuple[int, int] | None]]:
    """The paths discovery reads inside the block, with their stamps."""
    token = _SEEN.set({})
    try:
        yield _SEEN.get()   # type: ignore[misc]
    finally:
        _SEEN.reset(token)


def memo_dir() -> Path | None:
    return file_memo.memo_dir(ENV, under="choices")


def key(target: str | os.PathLike[str], search: Sequence[str | os.PathLike[str]], *parts: object) -> str:
    """The choice's key: the target's version, the search dirs, `parts` (offline, -ngl, device),
    the environment it depends on and this code's version."""
    from llamaspec._version import __version__

    real = os.path.realpath(target)
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES) or k == "HOME")
    what = [VERSION, __version__, real, stamp(real), [str(s) for s in search], parts, env]
    return hashlib.sha256(repr(what).encode("utf-8", "surrogateescape")).hexdigest()


def lookup(k: str) -> object | None:
    """The value saved under `k` if every witness still has its stamp, else None."""
    try:
        witnesses, value = file_memo.read(memo_dir(), k)   # type: ignore[misc]
    except (TypeError, ValueError):   # absent, damaged, from another Python: choose again
        return None
    if any(stamp(path) != st for path, st in witnesses.items()):
        return None
    return value


def save(k: str, witnesses: dict[str, tuple[int, int] | None], value: object) -> None:
    folder = memo_dir()
    if folder is not None:
        file_memo.store(folder, k, (dict(witnesses), value))
