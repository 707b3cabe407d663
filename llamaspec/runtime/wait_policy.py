"""How llama.cpp's OpenMP threads wait at a barrier: a bounded spin, or passive under a sustained load.

llama.cpp's CPU backend runs its threads under OpenMP; ggml_barrier is `#pragma omp barrier`. A
thread that arrives first spins, then (past a spin count) sleeps on a futex. The two fixed ends
both lose badly somewhere (SmolLM2 F16, -t 2, 2 cores, native llama-bench, MEASURED.md):
spinning (libgomp's default, ~300000 spins, ~3 ms) runs 96 tok/s alone but 6 tok/s beside 4 busy
processes, a spinning thread burning scheduler slices while its peer waits for a core;
OMP_WAIT_POLICY=PASSIVE keeps 30 tok/s there but halves the quiet speed (42 tok/s: every barrier
pays a futex wake-up). The pre-issue-25 rule picked between them from ~40 ms of /proc/stat before
llama.cpp loaded, so a busy loop that ran for 3 s at start made a whole run passive (41 vs 91
tok/s): a moment decided hours.

Now, on libgomp: a bounded spin (GOMP_SPINCOUNT=SPINCOUNT) by default, near the spinning speed
alone and far from spinning's collapse beside other work; PASSIVE only when the CPUs have been
oversubscribed for a while, not a moment: Linux's CPU pressure (/proc/pressure/cpu, the share of
time some runnable task waited for a CPU) over both 10 s and 60 s; without it, the load average
and the threads runnable now must both exceed what the cores hold. Under heavy oversubscription
a thread that sleeps at once is also scheduled sooner (it used little CPU), so PASSIVE beats any
spin there. scripts/bench_threads.py measures the candidates in the regimes (quiet, a transient
competitor at start, sustained oversubscription) and reports the minimax choice (docs/machines.md).
libgomp reads its variables once, when it loads: this runs before llama_cpp is imported.

Which OpenMP: read from llama_cpp's shared libraries (their DT_NEEDED) before they load.
GOMP_SPINCOUNT is libgomp's alone; for LLVM/Intel libomp (KMP_BLOCKTIME) or an unknown runtime
nothing is measured yet, so the old sampled rule stays there (PASSIVE when other threads want the
cores now). A build without OpenMP (ggml's own threadpool) reads none of these. The user's
OMP_WAIT_POLICY, GOMP_SPINCOUNT or KMP_BLOCKTIME always wins.

    >>> choose(2, runtime="libgomp", pressure=(3.0, 10.0), env={}).env
    {'GOMP_SPINCOUNT': '1000'}
    >>> choose(2, runtime="libgomp", pressure=(90.0, 70.0), env={}).env
    {'OMP_WAIT_POLICY': 'PASSIVE'}
    >>> choose(2, runtime="libgomp", pressure=(90.0, 70.0), env={"OMP_WAIT_POLICY": "ACTIVE"}).env
    {}
    >>> choose(2, runtime=None, load=11.0, cores=2, env={}).env
    {'OMP_WAIT_POLICY': 'PASSIVE'}
"""

from __future__ import annotations

import os
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

VAR = "OMP_WAIT_POLICY"
SPINCOUNT = 1000   # GOMP_SPINCOUNT when not oversubscribed for a while (docs/machines.md)
# CPU pressure ("some", percent of time) over 10 s and over 60 s at or above which the CPUs count as
# oversubscribed for a while: ~17 s of full contention reaches both, a 3 s burst neither
PRESSURE_10S, PRESSURE_60S = 50.0, 25.0
USER_VARS = (VAR, "GOMP_SPINCOUNT", "KMP_BLOCKTIME")   # any of these set: the user chose
LINE_PREFIX = "thread waiting:"   # how `run -v` starts the line (bench_threads.py reads it)
DETECT = "detect"
# DT_NEEDED sonames (and the names Mach-O / PE imports carry) of the OpenMP runtimes
_RUNTIMES = (("libgomp", (b"libgomp",)), ("libomp", (b"libomp.", b"libiomp5", b"libomp5")),
             ("vcomp", (b"vcomp",)))
_MACHO = {bytes.fromhex(m) for m in ("cffaedfe", "cefaedfe", "feedfacf", "feedface", "cafebabe")}


@dataclass(frozen=True)
class WaitPolicy:
    env: dict[str, str] = field(default_factory=dict)   # variables to set; empty: leave them as they are
    reason: str = ""

    @property
    def line(self) -> str:
        return f"{LINE_PREFIX} {self.reason}"


# -- which OpenMP llama.cpp links -------------------------------------------------------------------

def _elf_needed(path: Path) -> list[str] | None:
    """The DT_NEEDED entries of an ELF shared library; None when it is not ELF or unreadable."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF":
                return None
            is64, e = head[4] == 2, "<" if head[5] == 1 else ">"
            phoff, (phentsize, phnum) = (struct.unpack_from(e + ("Q" if is64 else "I"), head, 32 if is64 else 28)[0],
                                         struct.unpack_from(e + "HH", head, 54 if is64 else 42))
            f.seek(phoff)
            ph = f.read(phentsize * phnum)
            loads, dyn = [], None
            for i in range(phnum):
                if is64:
                    p_type, _, off, vaddr, _, size = struct.unpack_from(e + "IIQQQQ", ph, i * phentsize)
                else:
                    p_type, off, vaddr, _, size = struct.unpack_from(e + "IIIII", ph, i * phentsize)
                if p_type == 1:     # PT_LOAD: maps addresses to file offsets
                    loads.append((vaddr, off, size))
                elif p_type == 2:   # PT_DYNAMIC
                    dyn = (off, size)
            if dyn is None:
                return []
            f.seek(dyn[0])
            raw, fmt = f.read(dyn[1]), e + ("qQ" if is64 else "iI")
            step = struct.calcsize(fmt)
            entries = [struct.unpack_from(fmt, raw, i) for i in range(0, len(raw) - step + 1, step)]
            strtab = next(v for t, v in entries if t == 5)                       # DT_STRTAB
            base = next(strtab - va + off for va, off, size in loads if va <= strtab < va + size)
            names = []
            for tag, v in entries:
                if tag == 0:        # DT_NULL
                    break
                if tag == 1:        # DT_NEEDED
                    f.seek(base + v)
                    names.append(f.read(256).split(b"\0", 1)[0].decode(errors="replace"))
            return names
    except (OSError, struct.error, StopIteration, ValueError):
        return None


def _llama_libs() -> list[Path]:
    """llama_cpp's ggml/llama shared libraries, found without importing llama_cpp."""
    import importlib.util

    dirs = [Path(p) for p in os.environ.get("LLAMA_CPP_LIB_PATH", "").split(os.pathsep) if p]
    try:
        spec = importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        spec = None
    for loc in (spec.submodule_search_locations or []) if spec else []:
        dirs += [Path(loc) / "lib", Path(loc)]
    libs = [p for d in dirs if d.is_dir() for p in sorted(d.iterdir())
            if ("ggml" in p.name or "llama" in p.name) and p.suffix in (".so", ".dylib", ".dll") and p.is_file()]
    # the CPU backend (and ggml-base) hold the OpenMP calls; read them first
    return sorted(libs, key=lambda p: ("ggml-cpu" not in p.name, "ggml-base" not in p.name, p.name))


def openmp_runtime(libs: list[Path] | None = None) -> str | None:
    """"libgomp", "libomp" (LLVM/Intel), "vcomp" (MSVC), "none" (llama_cpp's libraries link no
    OpenMP: ggml's own threadpool) or None (llama_cpp's libraries not found or not readable)."""
    libs = _llama_libs() if libs is None else libs
    seen_any = False
    for lib in libs:
        needed = _elf_needed(lib)
        if needed is not None:
            blob = b"\0".join(n.encode() for n in needed)
        else:   # Mach-O / PE: the names of imported libraries are plain strings in the file
            try:
                with open(lib, "rb") as f:
                    head = f.read(4)
                    if not (head in _MACHO or head[:2] == b"MZ") or lib.stat().st_size > 64 << 20:
                        continue
                    blob = lib.read_bytes()
            except OSError:
                continue
        seen_any = True
        for name, markers in _RUNTIMES:
            if any(m in blob for m in markers):
                return name
    return "none" if seen_any else None


# -- the load now: only where no bounded spin is measured --------------------------------------------

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
    """Threads of other processes that want a CPU now: /proc/stat's procs_running minus this
    process's own runnable threads, averaged over `samples` reads `interval` seconds apart. None
    where there is no /proc."""
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


def cpu_pressure() -> tuple[float, float] | None:
    """Linux PSI: the share of time (percent) some runnable task waited for a CPU, averaged over
    10 s and 60 s (/proc/pressure/cpu "some"). None where the kernel does not provide it."""
    try:
        with open("/proc/pressure/cpu") as f:
            for line in f:
                if line.startswith("some "):
                    fields = dict(kv.split("=", 1) for kv in line.split()[1:])
                    return float(fields["avg10"]), float(fields["avg60"])
    except (OSError, ValueError, KeyError):
        pass
    return None


def oversubscribed(threads: int | None, cores: int, pressure: tuple[float, float] | None,
                   load: float | None = None, loadavg: float | None = None) -> tuple[bool, str]:
    """Have the CPUs been oversubscribed for a while (not a moment)? And the evidence, for the line.
    Without CPU pressure: the 1-minute load average must exceed the cores plus our own threads
    (our previous run counts in it) and the threads of others runnable now must fill the cores."""
    if pressure is not None:
        p10, p60 = pressure
        return p10 >= PRESSURE_10S and p60 >= PRESSURE_60S, f"CPU pressure {p10:.0f}% over 10 s, {p60:.0f}% over 60 s"
    if load is None or loadavg is None:
        return False, "no CPU pressure or load measure here"
    busy = loadavg >= cores + (threads or cores) and load >= cores
    return busy, f"load average {loadavg:.1f}, other threads running {load:.1f}, on {cores} cores"


def _sampled(threads: int | None, load: float | None, cores: int | None, runtime: str | None) -> WaitPolicy:
    """The pre-issue-25 rule: PASSIVE when other threads that want a CPU now and ours exceed the cores."""
    what, which = "other threads running", runtime or "OpenMP runtime not found"
    if load is None:
        load = others_running()
    if load is None:
        if not hasattr(os, "getloadavg"):
            return WaitPolicy({}, f"OpenMP's default ({which}; no load measure on this system)")
        load, what = os.getloadavg()[0], "load average"
    cores = cores or os.cpu_count() or 1
    if load + (threads or cores) <= cores + 0.5:
        return WaitPolicy({}, f"OpenMP's default, spin ({what} {load:.1f} on {cores} cores; {which}: "
                              f"no bounded spin measured); set {VAR} to choose")
    return WaitPolicy({VAR: "PASSIVE"}, f"{VAR}=PASSIVE: the machine is busy ({what} {load:.1f} on {cores} cores; "
                                        f"{which}: no bounded spin measured); set {VAR} to choose")


def choose(threads: int | None, *, runtime: str | None = DETECT, pressure: tuple[float, float] | None | str = DETECT,
           load: float | None = None, cores: int | None = None, env: Mapping[str, str] | None = None) -> WaitPolicy:
    """The variables to set before llama.cpp loads, and why. `runtime`: openmp_runtime()'s answer;
    `pressure`: cpu_pressure()'s (both detected by default); `load`: other threads runnable now
    (measured when needed); `cores`: os.cpu_count()."""
    env = os.environ if env is None else env
    mine = [v for v in USER_VARS if env.get(v)]
    if mine:
        return WaitPolicy({}, ", ".join(f"{v}={env[v]}" for v in mine) + " (set by you)")
    if runtime == DETECT:
        runtime = openmp_runtime()
    if runtime == "none":
        return WaitPolicy({}, "llama.cpp is built without OpenMP (ggml's own threadpool): nothing to set")
    if runtime != "libgomp":
        return _sampled(threads, load, cores, runtime)
    cores = cores or os.cpu_count() or 1
    if pressure == DETECT:
        pressure = cpu_pressure()
    if pressure is None and load is None:
        load = others_running()
    loadavg = os.getloadavg()[0] if pressure is None and hasattr(os, "getloadavg") else None
    busy, evidence = oversubscribed(threads, cores, pressure, load, loadavg)
    if busy:
        return WaitPolicy({VAR: "PASSIVE"}, f"{VAR}=PASSIVE (libgomp; {evidence}): other work has held the CPUs "
                                            f"for a while, so threads sleep at a barrier at once; set {VAR} to choose")
    return WaitPolicy({"GOMP_SPINCOUNT": str(SPINCOUNT)},
                      f"GOMP_SPINCOUNT={SPINCOUNT} (libgomp; {evidence}): threads spin briefly at a barrier, then "
                      f"sleep; set {VAR} or GOMP_SPINCOUNT to choose")


_chosen: WaitPolicy | None = None


def apply(threads: int | None) -> str | None:
    """Choose once for this process and set the variables while llama.cpp is not loaded yet; returns
    the one line for `run -v` and `doctor`. The CLI calls it first thing (cli/__init__.py main, with
    -t), the Python API when a Generator loads; later calls return the first decision."""
    global _chosen
    if _chosen is None:
        if "llama_cpp" in sys.modules:   # too late: OpenMP may already have read its variables
            now = [f"{v}={os.environ[v]}" for v in USER_VARS if os.environ.get(v)]
            return WaitPolicy({}, "llama_cpp was loaded before llamaspec could choose: OpenMP keeps what it read "
                                  f"then ({', '.join(now) or 'its defaults'})").line
        _chosen = choose(threads)
        os.environ.update(_chosen.env)
    return _chosen.line


def applied() -> str | None:
    """The line of the policy this process chose, if it chose one."""
    return _chosen.line if _chosen is not None else None


def chosen() -> WaitPolicy | None:
    """The policy this process chose (its variables, for a record of how a measurement ran)."""
    return _chosen


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
