#!/usr/bin/env python3
"""Plain vs speculative decoding, side by side in one process, reported as ratios.

Each repetition runs plain decoding and then every speculative mode on the same loaded target,
so the ratios compare runs made moments apart on the same machine state; the median over
repetitions is reported. Greedy tokens are checked against plain decoding in every run.

    python scripts/bench_engine.py --model F16.gguf --draft Q4_1.gguf --prompt code \\
        --spec ngram-simple ngram-mod draft --n 256 --reps 3 --threads 2 [--native BIN_DIR]

--native runs llama.cpp's own `llama-speculative-simple` (built from the vendored source of the
installed llama-cpp-python; never committed) on the same chat-formatted prompt, in the same
repetition loop, so its numbers sit beside ours.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llamaspec.pipeline import SpecOptions, load_pipeline, parse_spec_types  # noqa: E402
from llamaspec.runtime import Model  # noqa: E402
from llamaspec.verify import SamplingParams  # noqa: E402

HERE = Path(__file__).resolve().parent
PROMPTS = {
    "code": (HERE / "prompts" / "code_rewrite.txt"),
    "code-raw": (HERE / "prompts" / "code_rewrite_raw.txt"),  # for models without a chat template
    "story": "Write a story about a lighthouse keeper who finds a message in a bottle.",
}


def load_prompt(name: str) -> str:
    p = PROMPTS.get(name, name)
    if isinstance(p, Path):
        return p.read_text()
    path = Path(p)
    return path.read_text() if path.is_file() else str(p)


def run_ours(target: Model, spec: str, prompt: list[int], args) -> dict:
    types = parse_spec_types(spec)
    opts = SpecOptions(spec_types=types, draft_path=args.draft, n_ctx=args.ctx, n_threads=args.threads,
                       draft_max=args.draft_max, adaptive=not args.fixed, draft_p_min=args.p_min)
    sampling = SamplingParams(temperature=0.0)
    pipe = load_pipeline(target.path, opts, sampling, target=target)
    try:
        g = pipe.engine.generate(prompt, pipe.config(max_tokens=args.n, sampling=sampling))
    finally:
        pipe.close(keep_target=True)
    s = g.stats
    return {"tokens": g.tokens, "tps": s.tokens_per_second, "acceptance": s.acceptance,
            "e2e_s": s.prompt_seconds + s.gen_seconds,
            "drafted": s.drafted, "steps": s.steps, "n": len(g.tokens),
            "mal": s.mean_accepted_length,
            "overhead_ms": 1000 * s.overhead_seconds / s.steps if s.steps else 0.0}


_DEC = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")
_ENC = re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_ACC = re.compile(r"accept\s+=\s+([\d.]+)%")


def run_native(bin_dir: Path, spec: str, prompt_file: Path, args) -> dict | None:
    exe = bin_dir / "llama-speculative-simple"
    cmd = [str(exe), "-m", str(args.model), "-f", str(prompt_file), "-n", str(args.n), "--temp", "0",
           "-t", str(args.threads), "-c", str(args.ctx), "--spec-type", native_type(spec)]
    if "draft" in spec and "ngram" not in spec:
        cmd += ["-md", str(args.draft), "--spec-draft-n-max", str(args.native_n_max)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    text = out.stdout + out.stderr
    m = _DEC.search(text)
    if not m:
        return None
    a = _ACC.search(text)
    e = _ENC.search(text)
    return {"tps": float(m.group(3)), "n": int(m.group(1)), "acceptance": float(a.group(1)) / 100 if a else 0.0,
            "e2e_s": float(m.group(2)) + (float(e.group(2)) if e else 0.0)}


def _e2e_tps(r: dict) -> float:
    """Generated tokens per second of wall time, prompt processing (target and draft) included."""
    return r["n"] / r["e2e_s"]


def native_type(spec: str) -> str:
    return ",".join(parse_spec_types(spec)) or "none"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--draft", type=Path)
    ap.add_argument("--prompt", default="code", help="code | code-raw | story | a file | literal text")
    ap.add_argument("--spec", nargs="+", default=["ngram-simple", "ngram-mod"])
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--draft-max", type=int, default=None)
    ap.add_argument("--p-min", type=float, default=0.0)
    ap.add_argument("--fixed", action="store_true", help="fixed draft length (no adaptive controller)")
    ap.add_argument("--native", type=Path, help="dir with llama.cpp's llama-speculative-simple")
    ap.add_argument("--native-n-max", type=int, default=4, help="native --spec-draft-n-max for draft mode")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    target = Model(args.model)
    text = load_prompt(args.prompt)
    formatted = target.chat_prompt([{"role": "user", "content": text}]) if target.chat_template else text
    prompt = target.tokenize_prompt(formatted)
    prompt_file = Path(tempfile.mkstemp(suffix=".txt")[1])
    prompt_file.write_text(formatted)

    rows: dict[str, list[dict]] = {}
    for rep in range(args.reps):
        plain = run_ours(target, "none", prompt, args)
        rows.setdefault("plain", []).append(plain)
        for spec in args.spec:
            r = run_ours(target, spec, prompt, args)
            r["ratio"] = r["tps"] / plain["tps"]
            r["e2e_ratio"] = _e2e_tps(r) / _e2e_tps(plain)
            r["identical"] = r["tokens"] == plain["tokens"]
            rows.setdefault(spec, []).append(r)
        if args.native:
            for spec in args.spec:
                nr = run_native(args.native, spec, prompt_file, args)
                if nr is not None:
                    nr["ratio"] = nr["tps"] / plain["tps"]
                    nr["e2e_ratio"] = _e2e_tps(nr) / _e2e_tps(plain)
                    rows.setdefault(f"native {spec}", []).append(nr)
        print(f"rep {rep + 1}/{args.reps} done", file=sys.stderr)

    summary = []
    for mode, rs in rows.items():
        summary.append({
            "mode": mode,
            "tok_s": statistics.median(r["tps"] for r in rs),
            "ratio_vs_plain": statistics.median(r.get("ratio", 1.0) for r in rs),
            "ratios": [round(r.get("ratio", 1.0), 3) for r in rs],
            "e2e_ratio_vs_plain": statistics.median(r.get("e2e_ratio", 1.0) for r in rs),
            "acceptance": statistics.median(r.get("acceptance", 0.0) for r in rs),
            "mean_accepted_length": statistics.median(r.get("mal", 0.0) for r in rs) if "mal" in rs[0] else None,
            "identical_to_plain": all(r.get("identical", True) for r in rs) if mode != "plain" and not mode.startswith("native") else None,
            "overhead_ms_per_step": statistics.median(r["overhead_ms"] for r in rs) if "overhead_ms" in rs[0] else None,
            "n_generated": rs[0]["n"],
        })
    if args.json:
        print(json.dumps({"model": str(args.model), "draft": str(args.draft), "prompt_tokens": len(prompt),
                          "n": args.n, "threads": args.threads, "reps": args.reps, "results": summary}, indent=1))
        return
    print(f"prompt {len(prompt)} tokens, n={args.n}, threads={args.threads}, reps={args.reps} (medians)")
    print("tok/s and ratio: generation only; e2e: wall time with prompt processing (target and draft)")
    print(f"{'mode':<28}{'tok/s':>8}{'ratio':>8}{'e2e':>8}  {'accept':>7}{'MAL':>6}{'ident':>7}{'ovh ms':>8}  per-rep ratios")
    for s in summary:
        mal = f"{s['mean_accepted_length']:.2f}" if s["mean_accepted_length"] else "-"
        ident = {True: "yes", False: "NO", None: "-"}[s["identical_to_plain"]]
        ovh = f"{s['overhead_ms_per_step']:.3f}" if s["overhead_ms_per_step"] is not None else "-"
        print(f"{s['mode']:<28}{s['tok_s']:>8.1f}{s['ratio_vs_plain']:>7.2f}x{s['e2e_ratio_vs_plain']:>7.2f}x"
              f"  {100 * s['acceptance']:>6.1f}%"
              f"{mal:>6}{ident:>7}{ovh:>8}  {s['ratios']}")


if __name__ == "__main__":
    main()
