#!/usr/bin/env python3
"""Replay the drafting chain under a JSON schema against recorded greedy outputs (issue 26).

Greedy verification under a grammar accepts a draft exactly as far as it matches what plain
decoding under the same grammar writes, so with those outputs recorded once, drafting policies
can be compared in seconds and without machine noise. The replay does what the engine does per
step: the chain proposes (the grammar drafter reads the live grammar state), the draft is cut at
the first token the grammar refuses, the accepted part and the target's token enter the grammar
state, and every member is told. A step's cost comes from a verify-cost curve t(n)/t(1) measured
at the job's depth (--measure); drafting is counted as free. The replay starts after the first
token, so the opening draft (the forced text verified with the prompt) is not in it. Modelled, not
measured: confirm with scripts/bench_structured.py.

    .venv/bin/python scripts/replay_structured.py --record MODEL -o /tmp/extract.json
    .venv/bin/python scripts/replay_structured.py --measure MODEL      # prints the curve
    .venv/bin/python scripts/replay_structured.py /tmp/extract.json --model MODEL --curve CURVE [-v]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_JOB = HERE / "extraction_batch.jsonl"
T1 = 0.0115   # seconds of a one-token step in the replayed timings (any value: costs are ratios)


def _job(path: Path):
    for line in path.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            body = rec["body"]
            yield rec["custom_id"], body["messages"], body["response_format"]["json_schema"]["schema"], body.get("max_tokens", 160)


def record(model_path: str, job: Path, out: Path, threads: int) -> None:
    from llamaspec.runtime.context import Context, ContextConfig
    from llamaspec.runtime.grammar import grammar_from_schema
    from llamaspec.runtime.llama import Model
    from llamaspec.speculative.engine import SpecEngine
    from llamaspec.speculative.sequence import GenerationConfig

    target = Model(model_path)
    ctx = Context(target, ContextConfig(n_ctx=4096, n_threads=threads))
    eng = SpecEngine(target, ctx, None)
    traces = []
    for cid, msgs, schema, n in _job(job):
        prompt = target.tokenize_prompt(target.chat_prompt(msgs))
        g = eng.generate(prompt, GenerationConfig(max_tokens=n, grammar=grammar_from_schema(schema)))
        # the end-of-generation token ends the output: it is a step of its own, or a draft's last
        toks = g.tokens + ([target.eos] if g.stop_reason == "eos" else [])
        traces.append({"id": cid, "prompt": prompt, "out": toks, "schema": schema, "stop": g.stop_reason})
        print(f"{cid}: {len(prompt)} prompt tokens, {len(g.tokens)} generated", file=sys.stderr)
    out.write_text(json.dumps(traces))
    ctx.close()
    target.close()


def measure(model_path: str, job: Path, threads: int) -> str:
    from llamaspec.bench.bound import measure_curve
    from llamaspec.runtime.llama import Model

    target = Model(model_path)
    _, msgs, _, _ = next(_job(job))
    prompt = target.tokenize_prompt(target.chat_prompt(msgs))
    curve, t1 = measure_curve(target, prompt, threads=threads, sizes=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32), reps=7)
    print(f"t(1) = {1000 * t1:.2f} ms at depth {len(prompt)}", file=sys.stderr)
    target.close()
    return ",".join(f"{n}:{r:.2f}" for n, r in curve.items())


def replay_one(target, drafter, trace: dict, cost, k_max: int, verbose: bool, risks: dict | None = None):
    """(verify steps, modelled cost in one-token steps, per-source [drafted, accepted, cut])."""
    from llamaspec.runtime.grammar import grammar_from_schema, GrammarState
    from llamaspec.speculative.controller import DraftLengthController
    from llamaspec.speculative.costs import CostModel
    from llamaspec.speculative.match_controller import MatchController, RiskBudget, count_steps

    risks = {} if risks is None else risks   # as the engine: each drafter's budget outlives a request
    prompt, out = list(trace["prompt"]), list(trace["out"])
    state = GrammarState(target, grammar_from_schema(trace["schema"]))
    grammars = {0: state}
    drafter.bind_grammars(grammars)
    ctls = {}
    for m in drafter.members():
        def make(c, prior=0.6, resume=m.resume_tokens):
            return DraftLengthController(n_min=1, n_max=k_max, cost=c, prior_alpha=prior, resume_tokens=resume)
        # learnt from each step's replayed time, as the engine learns them from measured ones
        c = CostModel(draft_ratio_prior=m.measured_cost)
        risk = risks.setdefault(m.name, RiskBudget()) if m.bounded_risk else RiskBudget.unbounded()
        ctls[m.name] = MatchController(make, c, risk=risk) if m.sizes_by_match else make(c)
    drafter.begin(0, prompt, np.random.default_rng(0))
    # the first token comes from the prompt's own decode
    state.accept(out[0])
    drafter.accepted(0, 0, [out[0]], is_other=True)
    history, pos, steps, spent = prompt + [out[0]], 1, 0, 0.0
    per: dict[str, list[int]] = {}
    while pos < len(out):
        room = min(k_max, len(out) - pos - 1)
        draft = drafter.propose_within(0, history, lambda d, match=None: min(room, ctls[d.name].choose(match)))
        toks = list(draft.tokens)[:room]
        probe = state.clone()
        n_ok = probe.accept_all(toks)
        probe.close()
        cut = len(toks) - n_ok
        toks = toks[:n_ok]
        acc = 0
        while acc < len(toks) and toks[acc] == out[pos + acc]:
            acc += 1
        new = out[pos:pos + acc + 1]
        if verbose:
            print(f"  {draft.source or '-':14s} d={len(toks):2d} a={acc:2d} cut={cut:2d} "
                  f"{target.detokenize(toks)!r:40.40s} -> {target.detokenize(new)!r}")
        if toks or cut:
            s = per.setdefault(draft.source, [0, 0, 0])
            s[0] += len(toks)
            s[1] += acc
            s[2] += cut
        seconds = T1 * cost(len(toks) + 1)
        count_steps(ctls)
        for name, ctl in ctls.items():
            if not toks:
                ctl.observe(0, 0, verify_seconds=seconds)
            elif name == draft.source:
                ctl.observe(len(toks), acc, verify_seconds=seconds, draft_seconds=0.0)
            else:
                ctl.observe_cost(len(toks) + 1, seconds)
        for t in new:
            if not target.is_eog(t):   # (the end: the engine stops there; llguidance's own end token may differ)
                state.accept(t)
        drafter.accepted(0, acc, new, is_other=not toks)
        history += new
        pos += len(new)
        steps += 1
        spent += cost(len(toks) + 1)
    drafter.end(0)
    state.close()
    return steps, spent, per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", nargs="?", type=Path)
    ap.add_argument("--record", metavar="MODEL")
    ap.add_argument("--measure", metavar="MODEL")
    ap.add_argument("--model", help="with a trace: the model (its vocabulary and grammar)")
    ap.add_argument("--job", type=Path, default=DEFAULT_JOB)
    ap.add_argument("--curve", help="t(n)/t(1) as n:ratio pairs (--measure prints it)")
    ap.add_argument("--spec-type", action="append", help="the chain's types (default: as --draft auto)")
    ap.add_argument("--drop", action="append", default=[], help="leave this member out of the chain")
    ap.add_argument("--set", action="append", help="ATTR=VALUE on the members that have it")
    ap.add_argument("--k-max", type=int, default=32)
    ap.add_argument("--only", help="replay only traces whose id starts with this")
    ap.add_argument("-o", type=Path)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    if a.record:
        record(a.record, a.job, a.o or Path("structured_trace.json"), a.threads)
        return
    if a.measure:
        print(measure(a.measure, a.job, a.threads))
        return
    if not (a.trace and a.model and a.curve):
        ap.error("a trace needs --model and --curve")
    from llamaspec.runtime.llama import Model
    from llamaspec.speculative.drafters.factory import build_drafter
    from llamaspec.speculative.options import SpecOptions
    from llamaspec.speculative.sampling_params import SamplingParams

    curve = {int(k): float(v) for k, v in (p.split(":") for p in a.curve.split(","))}
    xs, ys = zip(*sorted(curve.items()))
    cost = lambda n: float(np.interp(n, xs, ys))  # noqa: E731
    target = Model(a.model)
    built = build_drafter(SpecOptions(spec_types=a.spec_type or ["prompt-lookup", "suffix"]), target, None,
                          SamplingParams(temperature=0.0))
    drafter = built.drafter
    for m in drafter.members():
        for kv in a.set or []:
            k, v = kv.split("=")
            if hasattr(m, k):
                setattr(m, k, type(getattr(m, k))(v))
    if a.drop:
        from llamaspec.speculative.drafters.chain import ChainDrafter
        drafter = ChainDrafter([m for m in drafter.members() if m.name not in a.drop])
    traces = json.loads(a.trace.read_text())
    tot_tokens = tot_steps = 0
    tot_cost = 0.0
    per: dict[str, Counter] = {}
    risks: dict = {}
    for tr in traces:
        if a.only and not tr["id"].startswith(a.only):
            continue
        if a.verbose:
            print(f"{tr['id']}: {target.detokenize(tr['out'])}")
        steps, spent, p = replay_one(target, drafter, tr, cost, a.k_max, a.verbose, risks)
        tot_tokens += len(tr["out"])
        tot_steps += steps
        tot_cost += spent
        for k, v in p.items():
            per.setdefault(k, Counter()).update({"drafted": v[0], "accepted": v[1], "cut": v[2]})
        if a.verbose:
            print(f"  -> {len(tr['out'])} tokens, {steps} steps, cost {spent:.1f}")
    plain = tot_tokens - (len([t for t in traces if not a.only or t["id"].startswith(a.only)]))
    print(f"{tot_tokens} tokens, {tot_steps} steps (plain: {plain}), modelled cost {tot_cost:.1f} steps: "
          f"{plain / tot_cost:.3f}x over plain generation")
    for k, v in per.items():
        print(f"  {k:14s} drafted {v['drafted']:5d} accepted {v['accepted']:5d} cut {v['cut']:4d}")


if __name__ == "__main__":
    main()
