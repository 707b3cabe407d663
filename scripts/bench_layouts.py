#!/usr/bin/env python3
"""The default against plain and against the best fixed text chain, per model folder layout (issue 33).

A layout is a target file in the folder a user keeps it in: `f16-alone=/tmp/a/smollm2-f16.gguf`
(nothing beside it), `f16-sibling=/tmp/b/smollm2-f16.gguf` (its Q4_1 beside it, which the default
may take as a draft). For every layout, prompt and -n, one `llamaspec run` per mode, as a user runs it:

  plain     llamaspec run MODEL -p PROMPT -n N --temp T -t THREADS --spec-type none
  default   the same without --spec-type (what `run` picks in this folder: drafts, MTP, text)
  chains    the same with --spec-type X for X in ngram-simple, ngram-mod, ngram-map-k,
            prompt-lookup, suffix and prompt-lookup,suffix (--chains replaces the list);
            "best chain" is, per cell, the chain with the highest median ratio over plain
            whose greedy text matched plain's in every repetition

Every run is its own process, timed from its start to the last token (the time its last
stdout chunk arrives: `run` streams each token, and its final newline is written when the last
step ends), so model and draft loading, the draft's prompt and its cost probes are all in it.
tok/s = the generated tokens (`run`'s stats line) over that time; `wall` (to the process's exit)
is kept in the JSON. Repetitions are interleaved: within a repetition every layout, prompt and
-n runs each mode once, the modes in an order rotating with the repetition; a ratio is over
plain of the same repetition, and cells give medians of those ratios. Before the first
repetition each layout runs plain and default once, untimed (4 tokens): the first process to map
a model pays for reading it from disk.

Greedy (--temp 0, the default here): every mode's text is compared with plain's of the same
repetition and a mode whose text differs is flagged (`!` in the table, `text_differs` and the
first differing character in the JSON) and never a best chain. With --temp 0.8 --seeds 5, every
repetition runs each mode once per seed (-s 1..5), tok/s pooled over the seeds; sampled texts
are not compared (a speculative run samples another path than plain with the same seed).

Prompts: the four code edits of scripts/code_edits.jsonl and one prose prompt (`story`, the
bench preset); --prompt ID (repeatable) keeps some.

    .venv/bin/python scripts/bench_layouts.py --layout f16-alone=/tmp/a/smollm2-f16.gguf \\
        --layout f16-sibling=/tmp/b/smollm2-f16.gguf [-n 32 -n 256] [--reps 5] [-t 2] \\
        [--temp 0.8 --seeds 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_serve import BenchError, run_script  # noqa: E402

from llamaspec.bench.prompts import preset_text  # noqa: E402

CHAINS = ["ngram-simple", "ngram-mod", "ngram-map-k", "prompt-lookup", "suffix", "prompt-lookup,suffix"]
RUN_TIMEOUT = 900.0
_GEN = re.compile(r"generated (\d+) tokens in")
_SPEC = re.compile(r"^spec (\S+)(?:\s+draft (\S+))?", re.M)


def read_prompts(only: list[str] | None) -> list[tuple[str, str]]:
    lines = [json.loads(x) for x in (HERE / "code_edits.jsonl").read_text().splitlines() if x.strip()]
    prompts = [(str(d["id"]), d["prompt"]) for d in lines] + [("story", preset_text("story"))]
    if only:
        unknown = sorted(set(only) - {p for p, _ in prompts})
        if unknown:
            raise BenchError(f"--prompt: no prompt {', '.join(unknown)} (ids: {', '.join(p for p, _ in prompts)})")
        prompts = [p for p in prompts if p[0] in only]
    return prompts


def parse_layouts(values: list[str]) -> list[tuple[str, Path]]:
    out = []
    for v in values:
        name, sep, path = v.partition("=")
        if not sep or not name or not path:
            raise BenchError(f"--layout {v!r}: expected NAME=DIR/model.gguf")
        p = Path(path).expanduser()
        if not p.is_file():
            raise BenchError(f"--layout {name}: no such file: {p}")
        if name in {n for n, _ in out}:
            raise BenchError(f"--layout {name}: given twice")
        out.append((name, p))
    if not out:
        raise BenchError("give at least one --layout NAME=DIR/model.gguf")
    return out


def mode_args(mode: str) -> list[str]:
    return [] if mode == "default" else ["--spec-type", "none" if mode == "plain" else mode]


def run_once(model: Path, prompt: str, n: int, temp: float, threads: int, mode: str, seed: int | None) -> dict:
    """One `llamaspec run` in its own process: text, tokens, time to the last token and to exit."""
    cmd = [sys.executable, "-m", "llamaspec", "run", str(model), "-p", prompt, "-n", str(n), "--temp", str(temp),
           "-t", str(threads), "--offline", *mode_args(mode)] + (["-s", str(seed)] if seed is not None else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))}
    chunks: list[bytes] = []
    last = [0.0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)

    def read_out() -> None:
        while True:
            b = os.read(proc.stdout.fileno(), 65536)
            if not b:
                return
            chunks.append(b)
            last[0] = time.perf_counter() - t0

    reader = threading.Thread(target=read_out, daemon=True)
    reader.start()
    try:
        err = proc.stderr.read().decode("utf-8", "replace")
        proc.wait(timeout=RUN_TIMEOUT)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    wall = time.perf_counter() - t0
    reader.join()
    if proc.returncode != 0:
        tail = " | ".join(err.strip().splitlines()[-3:])
        raise BenchError(f"{model.name} {mode}: `llamaspec run` exited {proc.returncode}: {tail}")
    m = _GEN.search(err)
    if not m:
        raise BenchError(f"{model.name} {mode}: no 'generated N tokens' line in run's stats: {err[-300:]}")
    spec = _SPEC.search(err)
    tokens = int(m.group(1))
    to_last = last[0] or wall
    return {"text": b"".join(chunks).decode("utf-8", "replace"), "tokens": tokens, "to_last_s": round(to_last, 4),
            "wall_s": round(wall, 4), "tok_s": tokens / to_last if to_last > 0 else 0.0,
            "spec": spec.group(1) if spec else None, "draft": spec.group(2) if spec else None}


def first_diff(a: str, b: str) -> int | None:
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def measure(layouts, prompts, ns, modes, reps: int, temp: float, seeds: int, threads: int, progress) -> list[dict]:
    """Every (layout, prompt, n) cell: per mode, one entry per repetition (pooled over seeds)."""
    cells = {(lay, pid, n): {m: [] for m in modes} for lay, _ in layouts for pid, _ in prompts for n in ns}
    seed_list: list[int | None] = list(range(1, seeds + 1)) if temp > 0 else [None]
    for lay, path in layouts:   # untimed: page the weights (and a draft beside them) in first
        for m in ("plain", "default"):
            run_once(path, prompts[0][1], 4, temp, threads, m, seed_list[0])
    for rep in range(reps):
        order = modes[rep % len(modes):] + modes[:rep % len(modes)]
        for lay, path in layouts:
            for pid, text in prompts:
                for n in ns:
                    runs = {m: [] for m in modes}
                    for seed in seed_list:
                        for m in order:
                            runs[m].append(run_once(path, text, n, temp, threads, m, seed))
                    plain_text = runs["plain"][0]["text"]
                    for m in modes:
                        rs = runs[m]
                        tok = sum(r["tokens"] for r in rs)
                        t_last = sum(r["to_last_s"] for r in rs)
                        wall = sum(r["wall_s"] for r in rs)
                        entry = {"tokens": tok, "to_last_s": round(t_last, 4), "wall_s": round(wall, 4),
                                 "tok_s": tok / t_last if t_last > 0 else 0.0, "spec": rs[0]["spec"],
                                 "draft": rs[0]["draft"],
                                 "diff_at": first_diff(plain_text, rs[0]["text"]) if temp == 0 else None,
                                 "text": rs[0]["text"] if temp == 0 else None}
                        cells[(lay, pid, n)][m].append(entry)
                    plain_tps = cells[(lay, pid, n)]["plain"][-1]["tok_s"]
                    for m in modes:
                        e = cells[(lay, pid, n)][m][-1]
                        e["ratio"] = e["tok_s"] / plain_tps if plain_tps > 0 else None
                    progress(rep + 1, lay, pid, n, {m: cells[(lay, pid, n)][m][-1] for m in modes})
    return [summarize_cell(lay, pid, n, per_mode, temp) for (lay, pid, n), per_mode in cells.items()]


def _median(values):
    vs = [v for v in values if v is not None]
    return statistics.median(vs) if vs else None


def summarize_cell(layout: str, pid: str, n: int, per_mode: dict, temp: float) -> dict:
    modes = {}
    for m, entries in per_mode.items():
        differing = [e for e in entries if e["diff_at"] is not None]
        modes[m] = {"tok_s": round(statistics.median(e["tok_s"] for e in entries), 2),
                    "ratio": _median([e["ratio"] for e in entries]),
                    "ratios": [round(e["ratio"], 3) if e["ratio"] is not None else None for e in entries],
                    "tokens": entries[0]["tokens"], "to_last_s": _median([e["to_last_s"] for e in entries]),
                    "wall_s": _median([e["wall_s"] for e in entries]), "spec": entries[0]["spec"],
                    "draft": entries[0]["draft"], "text_checked": temp == 0,
                    "text_differs": bool(differing), "differing_reps": len(differing),
                    "first_diff_char": differing[0]["diff_at"] if differing else None}
    chains = [c for c in modes if c not in ("plain", "default")]
    ok = [c for c in chains if not modes[c]["text_differs"] and modes[c]["ratio"] is not None]
    best = max(ok, key=lambda c: modes[c]["ratio"], default=None)
    d = modes.get("default", {})
    # the default against the best chain, per repetition (both over the same plain)
    vs_best = None
    if best is not None and "default" in per_mode:
        vs_best = _median([a["tok_s"] / b["tok_s"] if b["tok_s"] > 0 else None
                           for a, b in zip(per_mode["default"], per_mode[best])])
    return {"layout": layout, "prompt": pid, "n": n, "temp": temp, "modes": modes, "best_chain": best,
            "best_chain_ratio": modes[best]["ratio"] if best else None,
            "default_ratio": d.get("ratio"), "default_vs_best": vs_best,
            "default_spec": d.get("spec"), "default_draft": d.get("draft"),
            "default_text_differs": d.get("text_differs")}


def geomean(values):
    vs = [v for v in values if v is not None and v > 0]
    return math.exp(sum(map(math.log, vs)) / len(vs)) if vs else None


def overall(cells: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for c in cells:
        groups.setdefault((c["layout"], c["n"]), []).append(c)
    return [{"layout": lay, "n": n, "prompts": len(cs),
             "default_vs_plain": geomean([c["default_ratio"] for c in cs]),
             "best_chain_vs_plain": geomean([c["best_chain_ratio"] for c in cs]),
             "default_vs_best": geomean([c["default_vs_best"] for c in cs]),
             "min_default_vs_plain": min((c["default_ratio"] for c in cs if c["default_ratio"]), default=None),
             "min_default_vs_best": min((c["default_vs_best"] for c in cs if c["default_vs_best"]), default=None),
             "default_text_differs": [c["prompt"] for c in cs if c["default_text_differs"]]}
            for (lay, n), cs in groups.items()]


def _x(v) -> str:
    return f"{v:.2f}x" if v is not None else "-"


def print_table(cells: list[dict], summary: list[dict], reps: int, temp: float, seeds: int) -> None:
    how = "greedy, texts checked" if temp == 0 else f"--temp {temp:g}, {seeds} seeds pooled, texts not checked"
    print(f"medians of {reps} interleaved repetition(s), {how}; tok/s = tokens / time from process start to the last "
          "token; ratios over plain in the same repetition; ! = text differs from plain")
    print(f"{'layout':<14} {'prompt':<11} {'n':>4} {'plain':>7} {'default':>8} {'(its spec)':<34} "
          f"{'best chain':<21} {'ratio':>6} {'def/best':>8}  chains")
    for c in cells:
        m = c["modes"]
        flag = lambda k: "!" if m[k]["text_differs"] else ""   # noqa: E731
        spec = (c["default_spec"] or "?") + (f" @{c['default_draft'].rsplit('/', 1)[-1]}" if c["default_draft"] else "")
        chains = " ".join(f"{k}={_x(m[k]['ratio'])}{flag(k)}" for k in m if k not in ("plain", "default"))
        print(f"{c['layout']:<14} {c['prompt']:<11} {c['n']:>4} {m['plain']['tok_s']:>7.1f} "
              f"{_x(c['default_ratio']) + flag('default'):>8} {spec[:34]:<34} {(c['best_chain'] or '-'):<21} "
              f"{_x(c['best_chain_ratio']):>6} {_x(c['default_vs_best']):>8}  {chains}")
    print()
    print(f"{'layout':<14} {'n':>4} {'default/plain':>14} {'best/plain':>11} {'default/best':>13} {'min d/p':>8} "
          f"{'min d/b':>8}  (geometric means over prompts; min: the worst prompt)")
    for s in summary:
        differ = f"  text differs: {', '.join(s['default_text_differs'])}" if s["default_text_differs"] else ""
        print(f"{s['layout']:<14} {s['n']:>4} {_x(s['default_vs_plain']):>14} {_x(s['best_chain_vs_plain']):>11} "
              f"{_x(s['default_vs_best']):>13} {_x(s['min_default_vs_plain']):>8} "
              f"{_x(s['min_default_vs_best']):>8}{differ}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layout", action="append", default=[], metavar="NAME=DIR/model.gguf",
                    help="a target in its folder (repeatable)")
    ap.add_argument("-n", type=int, action="append", help="tokens per run (repeatable; default 32 and 256)")
    ap.add_argument("--reps", type=int, default=5, help="interleaved repetitions (default 5); medians")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--temp", type=float, default=0.0, help="0 (default): greedy, texts checked")
    ap.add_argument("--seeds", type=int, default=5, help="with --temp > 0: seeds 1..N per repetition (default 5)")
    ap.add_argument("--chains", help=f"comma-separated fixed chains, ';' between them (default: {';'.join(CHAINS)})")
    ap.add_argument("--prompt", action="append", metavar="ID", help="keep only these prompts (repeatable)")
    ap.add_argument("--json", metavar="FILE", help="also write the whole result as JSON ('-': stdout, no table)")
    args = ap.parse_args()
    layouts = parse_layouts(args.layout)
    ns = args.n or [32, 256]
    if min(ns) < 1 or args.reps < 1 or args.threads < 1 or args.seeds < 1 or args.temp < 0:
        raise BenchError("-n, --reps, -t and --seeds must be at least 1, --temp at least 0")
    chains = [c.strip() for c in args.chains.split(";")] if args.chains else CHAINS
    modes = ["plain", "default", *chains]
    prompts = read_prompts(args.prompt)

    def progress(rep, lay, pid, n, entries):
        parts = " ".join(f"{m}={e['tok_s']:.1f}" + ("!" if e["diff_at"] is not None else "")
                         for m, e in entries.items())
        print(f"[rep {rep}/{args.reps}] {lay} {pid} n={n}: {parts}", file=sys.stderr, flush=True)

    started = time.time()
    cells = measure(layouts, prompts, ns, modes, args.reps, args.temp, args.seeds, args.threads, progress)
    summary = overall(cells)
    folders = {n: sorted(x.name for x in p.parent.iterdir() if x.suffix == ".gguf") for n, p in layouts}
    result = {"layouts": {n: str(p) for n, p in layouts}, "folders": folders,
              "n": ns, "reps": args.reps, "threads": args.threads, "temp": args.temp,
              "seeds": args.seeds if args.temp > 0 else None, "modes": modes, "prompts": [p for p, _ in prompts],
              "loadavg_end": [round(x, 2) for x in os.getloadavg()], "seconds": round(time.time() - started, 1),
              "cells": cells, "overall": summary}
    if args.json == "-":
        print(json.dumps(result, indent=1))
        return 0
    print_table(cells, summary, args.reps, args.temp, args.seeds)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    run_script(main, "bench_layouts")
