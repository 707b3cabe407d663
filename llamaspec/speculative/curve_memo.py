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
import platform
from pathlib import Path
from typing import Sequence

from llamaspec.gguf import file_memo

VERSION = 2
ENV = "LLAMASPEC_CURVE_MEMO"

Curve = tuple[tuple[float, float, float], ...]   # ((batch size n, t(n) / t(1), timings), ...) by n
#: the most timings a kept point counts for against a new run's (see merge)
WEIGHT_CAP = 16.0


def memo_dir() -> Path | None:
    return file_memo.memo_dir(ENV, under="verify-curves")


def key(model_path: str | os.PathLike[str], n_threads: int, n_gpu_layers: int) -> str | None:
    """The curve's key, or None when the model file cannot be stat'ed."""
    import llama_cpp

    try:
        st = os.stat(model_path)
    except OSError:
        return None
    what = [VERSION, os.path.realpath(model_path), st.st_size, st.st_mtime_ns, n_threads, n_gpu_layers,
            getattr(llama_cpp, "__version__", "?"), platform.machine(), os.cpu_count()]
    return hashlib.sha256(repr(what).encode("utf-8", "surrogateescape")).hexdigest()


def load(k: str | None) -> Curve | None:
    curve = file_memo.read(memo_dir(), k) if k is not None else None
    if curve is None:
        return None
    try:
        return tuple((float(n), float(r), float(w)) for n, r, w in curve)   # type: ignore[union-attr]
    except (TypeError, ValueError):   # damaged, or an older layout: a cold start
        return None


def merge(old: Sequence[Sequence[float]] | None, new: Sequence[Sequence[float]]) -> Curve:
    """Points (n, t(n)/t(1), timings) of both, one per power-of-two size bucket: where both have
    one, their average weighted by timings (the kept side's counting at most `WEIGHT_CAP`, so a
    machine that changed is followed within a few runs, and one odd timing moves little).

        >>> merge([(2, 1.9, 8), (32, 14.5, 2)], [(2, 1.5, 8), (6, 5.1, 1)])
        ((2.0, 1.7, 16.0), (6.0, 5.1, 1.0), (32.0, 14.5, 2.0))
        >>> merge([(8, 7.0, 3)], [(8, 3.0, 1)])        # one odd timing against three
        ((8.0, 6.0, 4.0),)
    """
    from llamaspec.speculative.costs import size_bucket

    points: dict[int, tuple[float, float, float]] = {}
    for n, r, *w in (old or ()):
        points[size_bucket(round(n))] = (float(n), float(r), min(float(w[0]) if w else 1.0, WEIGHT_CAP))
    for n, r, *w in new:
        b, wn = size_bucket(round(n)), float(w[0]) if w else 1.0
        if b in points:
            n0, r0, w0 = points[b]
            points[b] = ((n0 * w0 + n * wn) / (w0 + wn), (r0 * w0 + r * wn) / (w0 + wn), w0 + wn)
        else:
            points[b] = (float(n), float(r), wn)
    return tuple(points[b] for b in sorted(points))


def save(k: str | None, measured: Sequence[Sequence[float]]) -> None:
    """Keep what this run measured (merged over what was kept). Best effort, never raises."""
    folder = memo_dir()
    if k is None or folder is None or not measured:
        return
    file_memo.store(folder, k, merge(load(k), measured))
