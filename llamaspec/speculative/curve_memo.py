"""The target's verify curve, t(n)/t(1), kept per model file and machine between runs.

Why: every run's controllers priced their first drafts by a prior line (costs.DEFAULT_SLOPE: a
2-token batch at ~1.4 plain steps) until their own timings took over. That suits SmolLM2 F16 on a
2-core CPU (1.3-1.7); Qwen2.5-Coder-1.5B Q4_K_M there costs 1.86 at 2 tokens and 7.0 at 8, so its
first drafts were priced at half their cost, and on a 32-token answer those drafts were most of
what drafting did (replayed on 13 prompts: 0.92x plain modelled, against 1.02x with the curve
known). What one run measured, the next one starts from; its own timings still replace each size
as soon as it has them.

Keyed by the model file's version (path, size, mtime), the threads, -ngl, the llama.cpp build and
the machine kind; kept under the GGUF memo's folder (`verify-curves`; LLAMASPEC_CURVE_MEMO=0 turns
it off, =DIR moves it). A damaged entry is a cold start, never an error.

    >>> # prior = load(k); ...run...; save(k, cost.measured_curve())
"""

from __future__ import annotations

import hashlib
import os
import pickle
import platform
from pathlib import Path
from typing import Sequence

from llamaspec.gguf import file_memo

VERSION = 1
ENV = "LLAMASPEC_CURVE_MEMO"

Curve = tuple[tuple[float, float], ...]   # ((batch size n, t(n) / t(1)), ...) by n


def memo_dir() -> Path | None:
    return file_memo.memo_dir(ENV, under="verify-curves")


def key(model_path: str | os.PathLike[str], n_threads: int, n_gpu_layers: int, *parts: object) -> str | None:
    """The curve's key, or None when the model file cannot be stat'ed."""
    import llama_cpp

    try:
        st = os.stat(model_path)
    except OSError:
        return None
    what = [VERSION, os.path.realpath(model_path), st.st_size, st.st_mtime_ns, n_threads, n_gpu_layers,
            getattr(llama_cpp, "__version__", "?"), platform.machine(), os.cpu_count(), parts]
    return hashlib.sha256(repr(what).encode("utf-8", "surrogateescape")).hexdigest()


def load(k: str | None) -> Curve | None:
    folder = memo_dir()
    if k is None or folder is None:
        return None
    try:
        with open(folder / f"{k}.pkl", "rb") as f:
            curve = pickle.load(f)
        return tuple((float(n), float(r)) for n, r in curve)
    except Exception:   # absent, damaged, from another Python: a cold start
        return None


def merge(old: Sequence[tuple[float, float]] | None, new: Sequence[tuple[float, float]]) -> Curve:
    """`new`'s points, and `old`'s at the sizes `new` did not measure (a power-of-two bucket each).

        >>> merge([(2, 1.9), (8, 7.0), (32, 14.5)], [(2, 1.8), (6, 5.1)])
        ((2, 1.8), (6, 5.1), (32, 14.5))
    """
    from llamaspec.speculative.costs import size_bucket

    have = {size_bucket(round(n)) for n, _ in new}
    kept = [(n, r) for n, r in (old or ()) if size_bucket(round(n)) not in have]
    return tuple(sorted([*new, *kept]))


def save(k: str | None, measured: Sequence[tuple[float, float]]) -> None:
    """Keep what this run measured (merged over what was kept). Best effort, never raises."""
    folder = memo_dir()
    if k is None or folder is None or not measured:
        return
    file_memo.store(folder, k, merge(load(k), measured))
