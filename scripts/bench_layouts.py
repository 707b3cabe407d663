#!/usr/bin/env python3
"""The default against plain and against the best fixed text chain, per model folder layout (issue 33).

A layout is a target file in the folder a user keeps it in: `f16-alone=/tmp/a/smollm2-f16.gguf`
(nothing beside it), `f16-sibling=/tmp/b/smollm2-f16.gguf` (its Q4_1 beside it, which the default
may take as a draft). Every cell runs each mode as a user runs it:

  plain     --spec-type none
  default   no --spec-type (what this folder gives: drafts, MTP, text)
  chains    --spec-type X for X in ngram-simple, ngram-mod, ngram-map-k, prompt-lookup, suffix and
            prompt-lookup,suffix (--chains replaces the list); "best chain" is, per cell, the chain
            with the highest median ratio over plain whose greedy texts matched plain's in every
            repetition (and every record)

Cell kinds (--cells run,batch,serve; default all three), per layout:

  run-N      per prompt and -n (32 and 256): one `llamaspec run MODEL -p PROMPT -n N --temp T -t T`
             process per mode, timed from its start to the last token (the time its last stdout chunk
             arrives: `run` streams each token), so model and draft loading, the draft's prompt and
             its cost probes are all in it; tok/s = `run`'s generated tokens over that time (`wall`,
             to the exit, is in the JSON)
  batch-pP   one `llamaspec batch MODEL JOB -o OUT --parallel P -n BATCH_N` process per mode on a
             JSONL of all the prompts kept (default P 4, --batch-n 128), timed from its start to its
             exit; tokens = the records' n_generated (batch's own seconds, after loading: `job_s`)
  serve-npP  one `llamaspec serve MODEL --parallel P -c 8192 -t T` per mode under
             scripts/bench_serve.py's mixed load (16 code/extraction/prose chat prompts, 8 clients x 2
             requests, max_tokens 128: --serve-n), after an untimed warm-up request; tok/s = completion
             tokens / first request to last answer, p50/p95 of request latency (the default's over
             plain's in the JSON and the table)

Prompts (run and batch cells): the four code edits of scripts/code_edits.jsonl, one prose prompt
(`story`, the bench preset), and three extractions of scripts/extraction_batch.jsonl (contact-0,
order-0, bug-0: a system message and the worked example folded into the user message) without
(`extract`) and with their JSON schema (`extract+schema`: `run -j SCHEMA`, the batch line's
`json_schema`). --prompt ID|KIND (repeatable) keeps some: an id (he-close, contact-0+schema) or a
kind (code, prose, extract, extract+schema).

Repetitions are interleaved: within a repetition every layout and cell runs each mode once, the
modes in an order rotating with the repetition; a ratio is over plain of the same repetition, and
cells give medians of those ratios. Before the first repetition each layout runs plain and default
once, untimed (4 tokens): the first process to map a model pays for reading it from disk.

Greedy (--temp 0, the default here): every mode's texts are compared with plain's of the same
repetition, record by record in batch and serve cells; a mode whose text differs is flagged (`!`
in the table; `text_differs`, `differing_records` and the first differing character per record in
the JSON) and never a best chain. With --temp 0.8 --seeds 5, every repetition runs each mode once
per seed (-s 1..5; serve: the load once per seed on one server, each request with that seed),
tok/s pooled over the seeds; sampled texts are not compared (a speculative run samples another
path than plain with the same seed).

The table gives per cell the default's ratio over plain and over the best chain; then geometric
means per layout and cell kind (over prompts; `code only` over the code edits, `code gen` the same
over run's own generation speed, prompt and loading excluded, as issue 33 measured its HumanEval
geomean); then per layout how many default cells are >= 0.97x plain and >= 0.97x the
best chain, and which are not (and where the default's text differs). A failed command or Ctrl-C /
SIGTERM stops the measuring: the cells measured so far are still summarized and written (`stopped`
in the JSON says why), exit 2.

    .venv/bin/python scripts/bench_layouts.py --layout f16-alone=/tmp/a/smollm2-f16.gguf \\
        --layout f16-sibling=/tmp/b/smollm2-f16.gguf [--cells run,batch,serve] [-n 32 -n 256] [--reps 5] \\
        [-t 2] [--parallel 4] [--batch-n 128] [--serve-n 128] [--chains "A;B"] [--prompt ID|KIND] \\
        [--temp 0.8 --seeds 5] [--json FILE]

The issue-33 matrix (four layouts; models from scripts/fetch_real_models.py; each layout a folder
of its own; long on 2 cores, so split it by --cells and run each part on a quiet machine):

    F16=$(.venv/bin/python -c "from llamaspec.testing import real_models; print(real_models.smollm2_f16())")
    Q41=$(.venv/bin/python -c "from llamaspec.hub.bundled import bundled_model; print(bundled_model())")
    R=~/.cache/llamaspec/real-models   # Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf and its 0.5B
    mkdir -p /tmp/lay/f16 /tmp/lay/f16-sib /tmp/lay/qwen /tmp/lay/qwen-sib
    ln -s $F16 /tmp/lay/f16/ ; ln -s $F16 $Q41 /tmp/lay/f16-sib/
    ln -s $R/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf /tmp/lay/qwen/
    ln -s $R/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf $R/Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf /tmp/lay/qwen-sib/
    F=SmolLM2-135M-Instruct.F16.gguf Q=Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf
    L="--layout f16-alone=/tmp/lay/f16/$F --layout f16-sibling=/tmp/lay/f16-sib/$F
       --layout qwen-alone=/tmp/lay/qwen/$Q --layout qwen-sibling=/tmp/lay/qwen-sib/$Q"
    .venv/bin/python scripts/bench_layouts.py $L --cells run --reps 5 --json run.json
    .venv/bin/python scripts/bench_layouts.py $L --cells batch,serve --reps 5 --json load.json
    # at the default temperature, 5 seeds (texts not compared):
    .venv/bin/python scripts/bench_layouts.py $L --temp 0.8 --seeds 5 --reps 5 --json sampled.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_serve import BenchError, run_script  # noqa: E402
from layout_cells import pooled_latency, run_batch, run_once, run_serve, select_prompts, serve_load  # noqa: E402

CHAINS = ["ngram-simple", "ngram-mod", "ngram-map-k", "prompt-lookup", "suffix", "prompt-lookup,suffix"]
CELL_KINDS = ["run", "batch", "serve"]
BAR = 0.97


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


def first_diff(a: str, b: str) -> int | None:
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def text_diffs(plain: dict, other: dict) -> dict | None:
    """{record id: first differing character} of the records whose text differs from plain's; None if none does."""
    out = {k: first_diff(plain[k] or "", other.get(k) or "") for k in plain}
    out = {k: v for k, v in out.items() if v is not None}
    return out or None


def pool(rs: list[dict]) -> dict:
    """One mode's results over the seeds of a repetition: tokens over time, the first seed's texts."""
    tok, t_last = sum(r["tokens"] for r in rs), sum(r["to_last_s"] for r in rs)
    return {"tokens": tok, "to_last_s": round(t_last, 4), "wall_s": round(sum(r["wall_s"] for r in rs), 4),
            "tok_s": tok / t_last if t_last > 0 else 0.0, "spec": rs[0]["spec"], "draft": rs[0]["draft"],
            "texts": rs[0]["texts"], **pooled_latency(rs),
            # run cells: run's own generation speed (prompt and loading excluded), as `run` reports it
            **({"gen_tok_s": tok / g} if (g := sum(r.get("gen_s", 0.0) for r in rs)) > 0 else {}),
            **({"job_s": round(sum(r["job_s"] for r in rs), 4)} if "job_s" in rs[0] else {})}


def measure(layouts, prompts, ns, modes, kinds, reps: int, temp: float, seeds: int, threads: int, parallel: int,
            batch_n: int, serve_ctx: int, serve_n: int, progress) -> tuple[list[dict], str | None]:
    """Every cell (layout, kind, prompt, n): per mode, one entry per repetition (pooled over seeds).
    A failure or an interrupt stops the measuring; the cells measured so far are still summarized,
    with the reason as the second value."""
    cells: dict[tuple, dict] = {}
    stopped = None
    seed_list: list[int | None] = list(range(1, seeds + 1)) if temp > 0 else [None]

    def record(key, runs, rep):
        entries = {m: pool(runs[m]) for m in modes}
        plain = entries["plain"]
        for e in entries.values():
            e["diff_at"] = text_diffs(plain["texts"], e["texts"]) if temp == 0 else None
            e["ratio"] = e["tok_s"] / plain["tok_s"] if plain["tok_s"] > 0 else None
            e["gen_ratio"] = e["gen_tok_s"] / plain["gen_tok_s"] if plain.get("gen_tok_s") and "gen_tok_s" in e else None
        for m in modes:
            entries[m].pop("texts")
            cells.setdefault(key, {x: [] for x in modes})[m].append(entries[m])
        progress(rep + 1, key, entries)

    for lay, path in layouts:   # untimed: page the weights (and a draft beside them) in first
        for m in ("plain", "default"):
            run_once(path, prompts[0], 4, temp, threads, m, seed_list[0])
    try:
        _measure_reps(layouts, prompts, ns, modes, kinds, reps, temp, seed_list, threads, parallel, batch_n,
                      serve_ctx, serve_n, record)
    except (BenchError, KeyboardInterrupt) as e:
        stopped = str(e) if isinstance(e, BenchError) else "interrupted"
        print(f"bench_layouts: stopped ({stopped}); the cells measured so far follow", file=sys.stderr)
    return [summarize_cell(key, per_mode, temp) for key, per_mode in cells.items()], stopped


def _measure_reps(layouts, prompts, ns, modes, kinds, reps, temp, seed_list, threads, parallel, batch_n, serve_ctx,
                  serve_n, record) -> None:
    with tempfile.TemporaryDirectory(prefix="bench_layouts_") as logdir:
        for rep in range(reps):
            order = modes[rep % len(modes):] + modes[:rep % len(modes)]
            for lay, path in layouts:
                if "run" in kinds:
                    for p in prompts:
                        for n in ns:
                            runs = {m: [] for m in modes}
                            for seed in seed_list:
                                for m in order:
                                    runs[m].append(run_once(path, p, n, temp, threads, m, seed))
                            record((lay, f"run-{n}", p["id"], p["kind"], n), runs, rep)
                if "batch" in kinds:
                    runs = {m: [] for m in modes}
                    for seed in seed_list:
                        for m in order:
                            runs[m].append(run_batch(path, prompts, batch_n, temp, threads, m, seed, parallel))
                    record((lay, f"batch-p{parallel}", f"{len(prompts)} prompts", "batch", batch_n), runs, rep)
                if "serve" in kinds:
                    runs = {m: [] for m in modes}
                    for m in order:
                        runs[m] = run_serve(path, temp, seed_list, threads, m, parallel, serve_ctx, serve_n,
                                            Path(logdir))
                    record((lay, f"serve-np{parallel}", "mixed load", "serve", serve_n), runs, rep)


def _median(values):
    vs = [v for v in values if v is not None]
    return statistics.median(vs) if vs else None


def _per_rep(a: list[dict], b: list[dict], key: str):
    """The median over repetitions of a[key] / b[key]."""
    return _median([x[key] / y[key] if x.get(key) and y.get(key) else None for x, y in zip(a, b)])


def summarize_cell(key: tuple, per_mode: dict, temp: float) -> dict:
    layout, kind, pid, pkind, n = key
    modes = {}
    for m, entries in per_mode.items():
        differing = [e for e in entries if e["diff_at"] is not None]
        records = sorted({k for e in differing for k in e["diff_at"]})
        modes[m] = {"tok_s": round(statistics.median(e["tok_s"] for e in entries), 2),
                    "ratio": _median([e["ratio"] for e in entries]),
                    "ratios": [round(e["ratio"], 3) if e["ratio"] is not None else None for e in entries],
                    "gen_ratio": _median([e.get("gen_ratio") for e in entries]),
                    "tokens": entries[0]["tokens"], "to_last_s": _median([e["to_last_s"] for e in entries]),
                    "wall_s": _median([e["wall_s"] for e in entries]), "spec": entries[0]["spec"],
                    "draft": entries[0]["draft"], "text_checked": temp == 0,
                    "text_differs": bool(differing), "differing_reps": len(differing),
                    "differing_records": records, "first_diff": differing[0]["diff_at"] if differing else None}
        if "job_s" in entries[0]:   # batch: its own seconds (after loading), beside the process's
            modes[m]["job_s"] = _median([e["job_s"] for e in entries])
        if "p95_s" in entries[0]:
            modes[m].update(p50_s=_median([e["p50_s"] for e in entries]), p95_s=_median([e["p95_s"] for e in entries]))
    chains = [c for c in modes if c not in ("plain", "default")]
    ok = [c for c in chains if not modes[c]["text_differs"] and modes[c]["ratio"] is not None]
    best = max(ok, key=lambda c: modes[c]["ratio"], default=None)
    d = modes.get("default", {})
    # the default against the best chain, per repetition (both over the same plain)
    vs_best = _per_rep(per_mode["default"], per_mode[best], "tok_s") if best and "default" in per_mode else None
    out = {"layout": layout, "kind": kind, "prompt": pid, "prompt_kind": pkind, "n": n, "temp": temp,
           "modes": modes, "best_chain": best, "best_chain_ratio": modes[best]["ratio"] if best else None,
           "default_ratio": d.get("ratio"), "default_gen_ratio": d.get("gen_ratio"), "default_vs_best": vs_best,
           "default_spec": d.get("spec"), "default_draft": d.get("draft"),
           "default_text_differs": d.get("text_differs"), "default_differing_records": d.get("differing_records")}
    if "p95_s" in d:   # serve: the default's latency over plain's (> 1: slower answers)
        out["default_p50_vs_plain"] = _per_rep(per_mode["default"], per_mode["plain"], "p50_s")
        out["default_p95_vs_plain"] = _per_rep(per_mode["default"], per_mode["plain"], "p95_s")
    return out


def geomean(values):
    vs = [v for v in values if v is not None and v > 0]
    return math.exp(sum(map(math.log, vs)) / len(vs)) if vs else None


def overall(cells: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for c in cells:
        groups.setdefault((c["layout"], c["kind"]), []).append(c)
    return [{"layout": lay, "kind": kind, "prompts": len(cs),
             "default_vs_plain": geomean([c["default_ratio"] for c in cs]),
             "default_vs_plain_code": geomean([c["default_ratio"] for c in cs if c["prompt_kind"] == "code"]),
             # the same over run's own generation speed: how the issue measured its HumanEval geomean
             "default_vs_plain_code_gen": geomean([c.get("default_gen_ratio") for c in cs if c["prompt_kind"] == "code"]),
             "best_chain_vs_plain": geomean([c["best_chain_ratio"] for c in cs]),
             "default_vs_best": geomean([c["default_vs_best"] for c in cs]),
             "min_default_vs_plain": min((c["default_ratio"] for c in cs if c["default_ratio"]), default=None),
             "min_default_vs_best": min((c["default_vs_best"] for c in cs if c["default_vs_best"]), default=None),
             "default_text_differs": [c["prompt"] for c in cs if c["default_text_differs"]]}
            for (lay, kind), cs in groups.items()]


def bars(cells: list[dict]) -> list[dict]:
    """Per layout: how many default cells are >= BAR x plain and >= BAR x the best chain, and which are not."""
    out = []
    for lay in dict.fromkeys(c["layout"] for c in cells):
        cs = [c for c in cells if c["layout"] == lay]
        with_best = [c for c in cs if c["default_vs_best"] is not None]
        misses = []
        for c in cs:
            why = []
            if (c["default_ratio"] or 0) < BAR:
                why.append(f"{_x(c['default_ratio'], 3)} plain")
            if c["default_vs_best"] is not None and c["default_vs_best"] < BAR:
                why.append(f"{_x(c['default_vs_best'], 3)} {c['best_chain']}")
            if c["default_text_differs"]:
                why.append("text differs: " + ",".join(map(str, c["default_differing_records"])))
            if why:
                misses.append({"cell": f"{c['kind']} {c['prompt']}", "why": why})
        out.append({"layout": lay, "cells": len(cs),
                    "ge_plain": sum((c["default_ratio"] or 0) >= BAR for c in cs),
                    "ge_best": sum(c["default_vs_best"] >= BAR for c in with_best), "with_best": len(with_best),
                    "not_met": misses})
    return out


def _x(v, digits: int = 2) -> str:
    return f"{v:.{digits}f}x" if v is not None else "-"


def print_table(cells: list[dict], summary: list[dict], bar_rows: list[dict], reps: int, temp: float,
                seeds: int) -> None:
    how = "greedy, texts checked" if temp == 0 else f"--temp {temp:g}, {seeds} seeds pooled, texts not checked"
    print(f"medians of {reps} interleaved repetition(s), {how}; run: tok/s = tokens / time from process start to "
          "the last token; batch: to the process's exit; serve: first request to last answer; ratios over plain in "
          "the same repetition; ! = text differs from plain (batch, serve: in any record)")
    print(f"{'layout':<14} {'cell':<10} {'prompt':<17} {'n':>4} {'plain':>7} {'default':>8} {'(its spec)':<30} "
          f"{'best chain':<21} {'ratio':>6} {'def/best':>8}  chains")
    for c in cells:
        m = c["modes"]
        flag = lambda k: "!" if m[k]["text_differs"] else ""   # noqa: E731
        spec = (c["default_spec"] or "?") + (f" @{c['default_draft'].rsplit('/', 1)[-1]}" if c["default_draft"] else "")
        chains = " ".join(f"{k}={_x(m[k]['ratio'])}{flag(k)}" for k in m if k not in ("plain", "default"))
        lat = (f"  p95 plain {m['plain']['p95_s']:.2f}s default {m['default']['p95_s']:.2f}s "
               f"(d/p {_x(c['default_p95_vs_plain'])})") if "p95_s" in m["plain"] else ""
        print(f"{c['layout']:<14} {c['kind']:<10} {c['prompt']:<17} {c['n']:>4} {m['plain']['tok_s']:>7.1f} "
              f"{_x(c['default_ratio']) + flag('default'):>8} {spec[:30]:<30} {(c['best_chain'] or '-'):<21} "
              f"{_x(c['best_chain_ratio']):>6} {_x(c['default_vs_best']):>8}  {chains}{lat}")
    print()
    print(f"{'layout':<14} {'cell':<10} {'default/plain':>14} {'code only':>10} {'code gen':>9} {'best/plain':>11} "
          f"{'default/best':>13} {'min d/p':>8} {'min d/b':>8}  (geometric means over prompts; min: the worst; "
          "code gen: over run's own generation tok/s)")
    for s in summary:
        differ = f"  text differs: {', '.join(s['default_text_differs'])}" if s["default_text_differs"] else ""
        print(f"{s['layout']:<14} {s['kind']:<10} {_x(s['default_vs_plain']):>14} {_x(s['default_vs_plain_code']):>10} "
              f"{_x(s.get('default_vs_plain_code_gen')):>9} "
              f"{_x(s['best_chain_vs_plain']):>11} {_x(s['default_vs_best']):>13} {_x(s['min_default_vs_plain']):>8} "
              f"{_x(s['min_default_vs_best']):>8}{differ}")
    print()
    for b in bar_rows:
        miss = "; ".join(f"{x['cell']} ({', '.join(x['why'])})" for x in b["not_met"]) or "none"
        print(f"{b['layout']}: {b['ge_plain']}/{b['cells']} default cells >= {BAR}x plain, {b['ge_best']}/"
              f"{b['with_best']} >= {BAR}x the best chain (cells with one); not met: {miss}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layout", action="append", default=[], metavar="NAME=DIR/model.gguf",
                    help="a target in its folder (repeatable)")
    ap.add_argument("--cells", default="run,batch,serve",
                    help="cell kinds, comma-separated: run (-n each), batch, serve (default: all three)")
    ap.add_argument("-n", type=int, action="append", help="run cells: tokens per run (repeatable; default 32 and 256)")
    ap.add_argument("--parallel", type=int, default=4, help="batch --parallel and serve --parallel (default 4)")
    ap.add_argument("--batch-n", type=int, default=128, help="batch cells: tokens per record (default 128)")
    ap.add_argument("--serve-ctx", type=int, default=8192, help="serve cells: -c, shared by the slots (default 8192)")
    ap.add_argument("--serve-n", type=int, help="serve cells: max_tokens per request (default: the mixed load's 128)")
    ap.add_argument("--reps", type=int, default=5, help="interleaved repetitions (default 5); medians")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--temp", type=float, default=0.0, help="0 (default): greedy, texts checked")
    ap.add_argument("--seeds", type=int, default=5, help="with --temp > 0: seeds 1..N per repetition (default 5)")
    ap.add_argument("--chains", help=f"comma-separated fixed chains, ';' between them (default: {';'.join(CHAINS)})")
    ap.add_argument("--prompt", action="append", metavar="ID|KIND",
                    help="keep only these prompts, by id or kind (code, prose, extract, extract+schema; repeatable)")
    ap.add_argument("--json", metavar="FILE", help="also write the whole result as JSON ('-': stdout, no table)")
    args = ap.parse_args()
    layouts = parse_layouts(args.layout)
    ns = args.n or [32, 256]
    kinds = [k.strip() for k in args.cells.split(",") if k.strip()]
    if not kinds or set(kinds) - set(CELL_KINDS):
        raise BenchError(f"--cells {args.cells!r}: expected a comma list of {', '.join(CELL_KINDS)}")
    serve_prompts, serve = serve_load(args.serve_n)
    counts = ns + [args.reps, args.threads, args.seeds, args.parallel, args.batch_n, args.serve_ctx, serve["n"]]
    if min(counts) < 1 or args.temp < 0:
        raise BenchError("-n, --reps, -t, --seeds, --parallel, --batch-n, --serve-ctx and --serve-n must be at "
                         "least 1, --temp at least 0")
    chains = [c.strip() for c in args.chains.split(";")] if args.chains else CHAINS
    modes = ["plain", "default", *chains]
    prompts = select_prompts(args.prompt)

    def progress(rep, key, entries):
        lay, kind, pid, _, n = key
        parts = " ".join(f"{m}={e['tok_s']:.1f}" + ("!" if e["diff_at"] is not None else "")
                         for m, e in entries.items())
        print(f"[rep {rep}/{args.reps}] {lay} {kind} {pid} n={n}: {parts}", file=sys.stderr, flush=True)

    started = time.time()
    cells, stopped = measure(layouts, prompts, ns, modes, kinds, args.reps, args.temp, args.seeds, args.threads,
                    args.parallel, args.batch_n, args.serve_ctx, serve["n"], progress)
    summary, bar_rows = overall(cells), bars(cells)
    folders = {n: sorted(x.name for x in p.parent.iterdir() if x.suffix == ".gguf") for n, p in layouts}
    result = {"layouts": {n: str(p) for n, p in layouts}, "folders": folders, "cells_run": kinds,
              "n": ns, "parallel": args.parallel, "batch_n": args.batch_n,
              "serve": {"load": "mixed", "ctx": args.serve_ctx, "clients": serve["clients"],
                        "requests": serve["requests"], "n": serve["n"], "prompts": [p for p, _ in serve_prompts]},
              "reps": args.reps, "threads": args.threads, "temp": args.temp,
              "seeds": args.seeds if args.temp > 0 else None, "modes": modes,
              "prompts": {p["id"]: p["kind"] for p in prompts},
              "loadavg_end": [round(x, 2) for x in os.getloadavg()], "seconds": round(time.time() - started, 1),
              "stopped": stopped, "cells": cells, "overall": summary, "bars": bar_rows}
    if args.json == "-":
        print(json.dumps(result, indent=1))
        return 2 if stopped else 0
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if cells:
        print_table(cells, summary, bar_rows, args.reps, args.temp, args.seeds)
    return 2 if stopped else 0


if __name__ == "__main__":
    run_script(main, "bench_layouts")
