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

A thin wrapper over llamabench/runner.py, which `llamaspec bench` uses too.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llamaspec.bench import BenchSettings, format_prompt, load_prompt, run_bench  # noqa: E402
from llamaspec.runtime.llama import Model  # noqa: E402


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

    target = Model(args.model, load_mtp=any("mtp" in s for s in args.spec))
    formatted, prompt, _ = format_prompt(target, load_prompt(args.prompt))
    settings = BenchSettings(n=args.n, threads=args.threads, ctx=args.ctx, draft_path=args.draft,
                             draft_max=args.draft_max, draft_p_min=args.p_min, adaptive=not args.fixed,
                             native_draft_max=args.native_n_max)
    modes = list(dict.fromkeys(args.spec))

    def progress(rep: int, r) -> None:
        if r.mode == "plain" and rep > 1:  # a repetition starts with plain: the previous one is done
            print(f"rep {rep - 1}/{args.reps} done", file=sys.stderr)

    result = run_bench(target, prompt, modes, settings, args.reps, native=args.native,
                       formatted_prompt=formatted, on_run=progress)
    print(f"rep {args.reps}/{args.reps} done", file=sys.stderr)
    for note in result.notes:
        print(f"warning: {note}", file=sys.stderr)
    summary = [s.to_dict() for s in result.summaries]
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
        ratio = f"{s['ratio_vs_plain']:>7.2f}x" if s["ratio_vs_plain"] is not None else f"{'-':>8}"
        e2e = f"{s['e2e_ratio_vs_plain']:>7.2f}x" if s["e2e_ratio_vs_plain"] is not None else f"{'-':>8}"
        print(f"{s['mode']:<28}{s['tok_s']:>8.1f}{ratio}{e2e}"
              f"  {100 * s['acceptance']:>6.1f}%"
              f"{mal:>6}{ident:>7}{ovh:>8}  {s['ratios']}")


if __name__ == "__main__":
    main()
