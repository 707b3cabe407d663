#!/usr/bin/env python3
"""Replay n-gram drafters and the adaptive controller against a recorded greedy output.

Greedy verification accepts a draft exactly as far as it matches what the target writes anyway,
so with the target's plain output recorded once, drafters and draft-length policies can be
compared deterministically and in milliseconds, without the noise of a shared machine. The cost
of a step comes from a verify-cost curve t(n)/t(1) (measure it with `--measure MODEL`); drafting
is counted as free (n-gram drafters cost microseconds). The speedup is modelled, not measured:
confirm a choice with `llamaspec bench`. Each trace also gets its copy-drafting bound on the same
curve (llamaspec/bench/bound.py: an oracle that copies, after a 2-token match, exactly what will be
accepted), the yardstick `bench` reports as `bound`.

    scripts/replay_drafters.py --record MODEL --prompt-preset code -o code.json
    scripts/replay_drafters.py --measure MODEL --prompt-preset code  # prints a curve at that depth
    scripts/replay_drafters.py code.json --curve 1:1,2:1.8,8:3.3,16:5.2,32:9.5,64:16.3
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from llamaspec.bench.bound import copy_bound, measure_curve
from llamaspec.speculative.controller import DraftLengthController
from llamaspec.speculative.costs import CostModel
from llamaspec.speculative.drafters.ngram_mod import NgramModDrafter
from llamaspec.speculative.drafters.ngram_simple import NgramSimpleDrafter
from llamaspec.speculative.drafters.prompt_lookup import PromptLookupDrafter
from llamaspec.speculative.match_controller import MatchController

DRAFTERS = {
    "prompt-lookup": lambda: PromptLookupDrafter(),
    "ngram-simple": lambda: NgramSimpleDrafter(size_n=6, size_m=48),
    "ngram-mod": lambda: NgramModDrafter(n_match=6, n_min=4, n_max=64),
}


def replay(make, prompt: list[int], out: list[int], curve: dict[int, float], k_max: int = 32,
           adaptive: bool = True) -> tuple[int, float]:
    """(verify steps, modelled speedup) of generating `out` after `prompt` with this drafter."""
    xs, ys = zip(*sorted(curve.items()))
    cost = lambda n: float(np.interp(n, xs, ys))  # noqa: E731

    def controller(c: CostModel, prior: float = 0.6) -> DraftLengthController:
        return DraftLengthController(n_min=1, n_max=k_max, cost=c, prior_alpha=prior)

    drafter = make()
    ctls = {}
    for m in drafter.members():
        c = CostModel(verify_ratio_fn=lambda k: cost(k + 1), draft_ratio_value=0.0)
        ctls[m.name] = MatchController(controller, c) if m.sizes_by_match else controller(c)
    drafter.begin(0, list(prompt), np.random.default_rng(0))
    history, pos, steps, spent = list(prompt), 0, 0, 0.0
    while pos < len(out):
        draft = drafter.propose_within(
            0, history, lambda d, match=None: ctls[d.name].choose(match) if adaptive else k_max)
        toks = list(draft.tokens)[:k_max]
        acc = 0
        while acc < len(toks) and pos + acc < len(out) and toks[acc] == out[pos + acc]:
            acc += 1
        new = out[pos:pos + acc + 1]
        for ctl in ctls.values():
            ctl.observe(len(toks), acc) if toks else ctl.observe(0, 0)
        drafter.accepted(0, acc, new)
        history += new
        pos += len(new)
        steps += 1
        spent += cost(len(toks) + 1)
    return steps, len(out) / spent


def record(model: str, preset: str, n: int, path: Path, prompts: Path | None = None) -> None:
    """Plain greedy output of the preset (or of each prompt of a JSONL suite: PATH.ID.json)."""
    from llamaspec import Generator
    from llamaspec.bench.prompts import format_prompt, preset_text, read_prompts

    jobs = [(path, preset_text(preset))] if prompts is None else [
        (path.with_name(f"{path.stem}.{p.id}.json"), p.text) for p in read_prompts(prompts)]
    with Generator(model, spec_type="none", temperature=0, max_tokens=n, threads=2) as g:
        for out_path, text in jobs:
            result = g.generate(text)
            _, prompt, _ = format_prompt(g.pipeline.target, text)
            out_path.write_text(json.dumps({"prompt": prompt, "out": result.tokens}))
            print(f"{out_path}: {len(prompt)} prompt tokens, {len(result.tokens)} generated", file=sys.stderr)


def measure(model: str, preset: str, threads: int) -> str:
    """The verify-cost curve as `bench` measures it: at the depth of the preset's formatted prompt."""
    from llamaspec.bench.prompts import format_prompt, preset_text
    from llamaspec.runtime.llama import Model

    m = Model(model)
    try:
        _, prompt, _ = format_prompt(m, preset_text(preset))
        curve, t1 = measure_curve(m, prompt, threads=threads, reps=7)
    finally:
        m.close()
    print(f"t(1) = {1000 * t1:.2f} ms at depth {len(prompt)}", file=sys.stderr)
    return ",".join(f"{n}:{r:.2f}" for n, r in curve.items())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", nargs="*", type=Path, help="recorded outputs (JSON: prompt, out)")
    ap.add_argument("--curve", default="1:1,2:1.8,4:2.2,8:3.3,16:5.2,32:9.5,64:16.3",
                    help="verify cost t(n)/t(1) as n:ratio pairs (default: SmolLM2 F16, 2 threads, "
                         "2-core AVX-512 EPYC)")
    ap.add_argument("--k-max", type=int, default=32)
    ap.add_argument("--record", metavar="MODEL")
    ap.add_argument("--prompt-preset", default="code")
    ap.add_argument("--prompts", type=Path, help="with --record: a JSONL suite (bench --prompts), one trace each")
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("-o", type=Path)
    ap.add_argument("--measure", metavar="MODEL")
    ap.add_argument("-t", "--threads", type=int, default=2)
    a = ap.parse_args()
    if a.record:
        record(a.record, a.prompt_preset, a.n, a.o or Path(f"{a.prompt_preset}.json"), a.prompts)
        return
    if a.measure:
        print(measure(a.measure, a.prompt_preset, a.threads))
        return
    curve = {int(k): float(v) for k, v in (p.split(":") for p in a.curve.split(","))}
    for trace in a.trace:
        data = json.loads(trace.read_text())
        b = copy_bound(data["prompt"], data["out"], curve)
        print(f"{trace.name}  {'copy bound':14s} {'oracle':12s} {b.steps:4d} steps  {b.speedup:.2f}x modelled "
              f"({b.copied} of {b.tokens} tokens copied)")
        for name, make in DRAFTERS.items():
            for adaptive in (True, False):
                steps, speed = replay(make, data["prompt"], data["out"], curve, a.k_max, adaptive)
                how = "adaptive" if adaptive else f"fixed k={a.k_max}"
                print(f"{trace.name}  {name:14s} {how:12s} {steps:4d} steps  {speed:.2f}x modelled")


if __name__ == "__main__":
    main()
