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
    scripts/replay_drafters.py --record MODEL --prompts suite.jsonl -o he.json   # he.ID.json each
    scripts/replay_drafters.py code.json --curve "$(scripts/replay_drafters.py --measure MODEL)"
    # the code-edit suite of scripts/bench_bound.py, the default chain only, geomean over traces:
    scripts/replay_drafters.py --record MODEL --prompts scripts/code_edits.jsonl -o ce.json
    scripts/replay_drafters.py ce.*.json --drafter prompt-lookup,suffix --curve 1:1,2:1.9,4:2.27,8:3.36,16:5.07,32:8.88,64:15.15

"adaptive" gives the controllers the curve; "learnt costs" makes them learn it from the replayed
step times as the engine does from measured ones (closer to a real run: the first drafts are
sized before anything is measured).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from llamaspec.bench.bound import copy_bound, measure_curve
from llamaspec.speculative.controller import DraftLengthController
from llamaspec.speculative.costs import CostModel
from llamaspec.speculative.drafters.ngram_mod import NgramModDrafter
from llamaspec.speculative.drafters.ngram_simple import NgramSimpleDrafter
from llamaspec.speculative.drafters.chain import ChainDrafter
from llamaspec.speculative.drafters.prompt_lookup import PromptLookupDrafter
from llamaspec.speculative.drafters.suffix import SuffixDrafter
from llamaspec.speculative.options import MAX_DRAFT
from llamaspec.speculative.match_controller import MatchController, count_steps

DRAFTERS = {
    "prompt-lookup": lambda eog: PromptLookupDrafter(size_m=MAX_DRAFT, is_stop=eog.__contains__),
    "prompt-lookup,suffix": lambda eog: ChainDrafter([PromptLookupDrafter(size_m=MAX_DRAFT, is_stop=eog.__contains__),
                                                      SuffixDrafter(size_m=MAX_DRAFT)]),   # the default
    "ngram-simple": lambda eog: NgramSimpleDrafter(size_n=6, size_m=48),
    "ngram-mod": lambda eog: NgramModDrafter(n_match=6, n_min=4, n_max=64),
}
T1 = 0.013   # seconds of a one-token step, when costs are learnt from replayed timings (any value)


def replay(make, prompt: list[int], out: list[int], curve: dict[int, float], k_max: int = 32,
           adaptive: bool = True, learn_costs: bool = False, eog: frozenset = frozenset()) -> tuple[int, float]:
    """(verify steps, modelled speedup) of generating `out` after `prompt` with this drafter.

    learn_costs: the controllers start knowing nothing of the curve and learn it from each step's
    replayed time, T1 * t(n), as the engine does from measured ones (else they are given it)."""
    xs, ys = zip(*sorted(curve.items()))
    cost = lambda n: float(np.interp(n, xs, ys))  # noqa: E731

    def controller(c: CostModel, prior: float = 0.6) -> DraftLengthController:
        return DraftLengthController(n_min=1, n_max=k_max, cost=c, prior_alpha=prior)

    drafter = make(eog)
    ctls = {}
    for m in drafter.members():
        c = CostModel() if learn_costs else CostModel(verify_ratio_fn=lambda k: cost(k + 1), draft_ratio_value=0.0)
        ctls[m.name] = MatchController(controller, c) if m.sizes_by_match else controller(c)
    drafter.begin(0, list(prompt), np.random.default_rng(0))
    history, pos, steps, spent = list(prompt), 0, 0, 0.0
    while pos < len(out):
        room = min(k_max, len(out) - pos - 1)   # as the engine: the last token is never drafted
        draft = drafter.propose_within(
            0, history, lambda d, match=None: min(room, ctls[d.name].choose(match) if adaptive else k_max))
        toks = list(draft.tokens)[:room]
        acc = 0
        while acc < len(toks) and pos + acc < len(out) and toks[acc] == out[pos + acc]:
            acc += 1
        new = out[pos:pos + acc + 1]
        seconds = T1 * cost(len(toks) + 1) if learn_costs else None
        count_steps(ctls)
        for name, ctl in ctls.items():   # as the engine: the author learns, the others see the cost
            if not toks:
                ctl.observe(0, 0, verify_seconds=seconds)
            elif name == draft.source:
                ctl.observe(len(toks), acc, verify_seconds=seconds, draft_seconds=0.0 if learn_costs else None)
            elif seconds is not None:
                ctl.observe_cost(len(toks) + 1, seconds)
        drafter.accepted(0, acc, new, is_other=not toks)
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
            target = g.pipeline.target
            eog = [t for t in range(target.n_vocab) if target.is_eog(t)]
            out_path.write_text(json.dumps({"prompt": prompt, "out": result.tokens, "eog": eog}))
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
    ap.add_argument("--curve", help="verify cost t(n)/t(1) as n:ratio pairs, measured on this machine "
                                    "(--measure MODEL prints it); required to replay: another machine's "
                                    "curve models another machine")
    ap.add_argument("--k-max", type=int, default=32)
    ap.add_argument("--drafter", action="append", choices=sorted(DRAFTERS),
                    help="replay only these (repeatable; default: all)")
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
    if a.trace and not a.curve:
        ap.error("--curve is required to replay a trace: measure this machine's with --measure MODEL")
    curve = {int(k): float(v) for k, v in (p.split(":") for p in a.curve.split(","))} if a.curve else {}
    fractions: dict[tuple[str, str], list[float]] = {}
    for trace in a.trace:
        data = json.loads(trace.read_text())
        b = copy_bound(data["prompt"], data["out"], curve)
        print(f"{trace.name}  {'copy bound':20s} {'oracle':14s} {b.steps:4d} steps  {b.speedup:.2f}x modelled "
              f"({b.copied} of {b.tokens} tokens copied)")
        eog = frozenset(data.get("eog", ()))
        for name in a.drafter or DRAFTERS:
            for how, kw in (("adaptive", {}), ("learnt costs", {"learn_costs": True}),
                            (f"fixed k={a.k_max}", {"adaptive": False})):
                steps, speed = replay(DRAFTERS[name], data["prompt"], data["out"], curve, a.k_max, eog=eog, **kw)
                fractions.setdefault((name, how), []).append(speed / b.speedup)
                print(f"{trace.name}  {name:20s} {how:14s} {steps:4d} steps  {speed:.2f}x modelled, "
                      f"{speed / b.speedup:.2f} of the bound")
    if len(a.trace) > 1:   # the geometric mean over traces: what `bench --prompts` reports as of bound
        for (name, how), fr in fractions.items():
            geo = math.exp(sum(math.log(f) for f in fr) / len(fr))
            print(f"geomean of {len(fr)} traces  {name:20s} {how:14s} {geo:.3f} of the bound")

if __name__ == "__main__":
    main()
