"""Where a loaded server's time goes, step by step: off unless LLAMASPEC_SERVE_PROFILE names a file,
to which the engine thread appends a report when it stops (perf_counter accumulators: a few
microseconds a step, nothing when off).

Engine loop: waiting for work, admitting (with the prompt tokens evaluated outside the shared
batch), the shared step split into llama_decode, reading logits and the Python work around them
(drafting, acceptance, text), finishing. Per request: preparing (template, tokens), waiting for a
slot, generating, and delivering (the answer built in the HTTP handler after the engine finished
it), with the slowest requests' split: what p95 latency is made of.
"""

from __future__ import annotations

import os
import statistics
import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Iterator

PROFILE_ENV = "LLAMASPEC_SERVE_PROFILE"


class Profile:
    def __init__(self, path: str):
        self.path = path
        self.acc: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
        self.counts: dict[str, float] = defaultdict(float)
        self.jobs: list[dict[str, float]] = []
        self.admitted: list[float] = []   # submit times in admission order

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            a = self.acc[name]
            a[0] += 1
            a[1] += time.perf_counter() - t

    def wrap(self, obj: Any, attr: str, name: str) -> None:
        """Time every call of obj.attr under `name` (an instance attribute shadows the method)."""
        orig = getattr(obj, attr)

        def timed(*a, **k):
            with self.span(name):
                return orig(*a, **k)
        setattr(obj, attr, timed)

    def count(self, name: str, n: float = 1) -> None:
        self.counts[name] += n

    def admit(self, marks: dict[str, float], n_outside: int) -> None:
        """A request took a slot; n_outside: its prompt tokens evaluated there, outside the shared step."""
        self.admitted.append(marks.get("submit", 0.0))
        self.count("prompt tokens evaluated at admission", n_outside)

    def job(self, marks: dict[str, float]) -> None:
        if {"submit", "ready", "admit", "done", "built"} <= marks.keys():
            self.jobs.append(dict(marks))

    def report(self) -> str:
        lines = ["== llamaspec serve profile =="]
        wall = self.acc["loop"][1] or 1e-9
        for name, (n, s) in sorted(self.acc.items(), key=lambda kv: -kv[1][1]):
            lines.append(f"{name:<24}{s:>9.3f} s {100 * s / wall:>6.1f} %  calls {int(n):>7}  "
                         f"{1e3 * s / max(1, n):>8.3f} ms/call")
        for name, v in sorted(self.counts.items()):
            lines.append(f"{name:<24}{v:>12g}")
        if self.jobs:
            parts = (("prepare", "submit", "ready"), ("wait slot", "ready", "admit"), ("generate", "admit", "done"),
                     ("deliver", "done", "built"), ("total", "submit", "built"))
            lines.append(f"requests: {len(self.jobs)}   median / max seconds:")
            for label, a, b in parts:
                xs = [j[b] - j[a] for j in self.jobs]
                lines.append(f"  {label:<10}{statistics.median(xs):>8.3f}{max(xs):>8.3f}")
            slow = sorted(self.jobs, key=lambda j: j["built"] - j["submit"])[-max(1, len(self.jobs) // 20):]
            for j in slow:
                lines.append("  slowest: " + ", ".join(f"{label} {j[b] - j[a]:.2f}" for label, a, b in parts))
            order = self.admitted
            late = sum(1 for i, t in enumerate(order) if any(u < t for u in order[i + 1:]))
            lines.append(f"  admitted ahead of an earlier request: {late} of {len(order)}")
        return "\n".join(lines) + "\n"

    def write(self) -> None:
        with open(self.path, "a") as f:
            f.write(self.report())


class Off:
    """The profile when LLAMASPEC_SERVE_PROFILE is unset: every call does nothing."""

    def span(self, name: str):
        return _NULL

    def count(self, name: str, n: float = 1) -> None:
        pass

    def admit(self, marks: dict[str, float], n_outside: int) -> None:
        pass

    def job(self, marks: dict[str, float]) -> None:
        pass

    def write(self) -> None:
        pass


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        return None


_NULL = _Null()


def from_env(ctx: Any) -> "Profile | Off":
    """The profile LLAMASPEC_SERVE_PROFILE asks for; on, it times the target context `ctx`'s
    llama_decode calls and logits reads."""
    path = os.environ.get(PROFILE_ENV)
    if not path:
        return Off()
    p = Profile(path)
    for attr in ("decode", "decode_many", "logits"):
        p.wrap(ctx, attr, f"ctx.{attr} (any phase)")
    return p
