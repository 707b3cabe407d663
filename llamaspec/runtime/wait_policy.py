"""How llama.cpp's OpenMP threads wait at a barrier, chosen from how busy the machine is now.

llama.cpp's CPU backend runs its threads under OpenMP, which spins at every barrier by default. On
a machine where other work already runs, a spinning thread burns whole scheduler slices waiting
for a descheduled peer: measured here, 32 tokens of SmolLM2 at -t 2 under a load of 11 on 2 cores
took 74 s spinning and 4 s waiting passively. So when our threads would not have the cores to
themselves, they wait passively (OMP_WAIT_POLICY=PASSIVE), unless the user set the variable.
libgomp reads it once, so this must run before llama_cpp is loaded.

Passive waiting is not free: on a quiet machine it halves single-stream decoding (SmolLM2 F16,
-t 2, 2 cores: 23.5 tok/s passive, 52 tok/s spinning). So "busy" is the other threads that want a
CPU right now (Linux: /proc/stat's procs_running, sampled a few times), not the load average: that
is a minute's memory, which counts our own previous run (a second `llamaspec run` after a first one
saw a load of ~1.3 on 2 cores and went passive). Without /proc, the load average is the fallback.

    >>> choose(threads=2, load=11.0, cores=2, env={}).value
    'PASSIVE'
    >>> choose(threads=2, load=0.1, cores=2, env={}).value is None
    True
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Mapping

VAR = "OMP_WAIT_POLICY"


@dataclass(frozen=True)
class WaitPolicy:
    value: str | None     # what to set ("PASSIVE"), or None: leave OpenMP's default
    reason: str


def _own_running() -> int:
    """This process's threads in state R (running or runnable), the calling one included."""
    n = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:   # the thread ended meanwhile
            continue
        n += stat[stat.rindex(")") + 2:][:1] == "R"
    return max(1, n)


def others_running(samples: int = 5, interval: float = 0.01) -> float | None:
    """Threads of other processes that want a CPU now: /proc/stat's procs_running (runnable threads
    system-wide) minus this process's own runnable threads (a Generator made in a program with busy
    threads of its own must not count them), averaged over `samples` reads `interval` seconds
    apart. None where there is no /proc."""
    counts = []
    try:
        for i in range(samples):
            if i:
                time.sleep(interval)
            with open("/proc/stat") as f:
                running = [int(line.split()[1]) for line in f if line.startswith("procs_running ")]
            counts += [r - _own_running() for r in running]
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, sum(counts) / len(counts)) if counts else None


def choose(threads: int | None, *, load: float | None = None, cores: int | None = None,
           env: Mapping[str, str] | None = None) -> WaitPolicy:
    """`load`: other threads that want a CPU (default: measured now, see the module docstring)."""
    env = os.environ if env is None else env
    if env.get(VAR):
        return WaitPolicy(None, f"{VAR}={env[VAR]} (set by you)")
    what = "other threads running"
    if load is None:
        load = others_running()
    if load is None:
        if not hasattr(os, "getloadavg"):
            return WaitPolicy(None, "OpenMP's default (no load measure on this system)")
        load, what = os.getloadavg()[0], "load average"
    cores = cores or os.cpu_count() or 1
    if load + (threads or cores) <= cores + 0.5:
        return WaitPolicy(None, f"OpenMP's default ({what} {load:.1f} on {cores} cores)")
    return WaitPolicy("PASSIVE", f"the machine is busy ({what} {load:.1f} on {cores} cores): llama.cpp's "
                                 f"threads wait passively ({VAR}=PASSIVE; set {VAR} to choose)")


_applied: str | None = None


def apply(threads: int | None) -> str | None:
    """Set the policy for this process when it is still possible and the machine is busy; returns
    the one-line note to show, or None when nothing was changed. The CLI calls it first thing
    (cli/__init__.py main, with -t), the Python API when a Generator loads."""
    global _applied
    if "llama_cpp" in sys.modules:   # too late: OpenMP may already have read it
        return None
    policy = choose(threads)
    if policy.value is None:
        return None
    os.environ[VAR] = policy.value
    _applied = policy.reason
    return policy.reason


def applied() -> str | None:
    """The note of the policy this process set, if it set one (and it is still in effect)."""
    return _applied if os.environ.get(VAR) == "PASSIVE" else None


def threads_from_args(args: list[str]) -> int | None:
    """-t/--threads N from a command line (None when absent or not a number).

        >>> threads_from_args(["run", "m.gguf", "-t", "2"]), threads_from_args(["run", "--threads=4"])
        (2, 4)
    """
    for i, a in enumerate(args):
        value = args[i + 1] if a in ("-t", "--threads") and i + 1 < len(args) else (
            a.split("=", 1)[1] if a.startswith("--threads=") else None)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return None
    return None
