"""The grammar drafter on JSON-schema extraction: SmolLM2 F16, greedy, side by side per prompt.

Modes (one target model and context, the modes interleaved prompt by prompt so machine load
hits them alike): plain decoding under the schema; the copy drafters of the default chain
(prompt-lookup, suffix) without the grammar drafter; the grammar drafter alone (and its variants:
tail token kept / checked / dropped, optional whitespace guessed or not); the default chain as
the factory builds it (grammar first, then prompt-lookup, suffix). Prints wall-clock time, the
speedup over plain, drafted / accepted tokens per drafter, the grammar drafter's time per call,
and whether every output equals plain decoding's.

    .venv/bin/python scripts/bench_grammar_drafter.py --prompts 10 --reps 1
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from llamaspec.runtime.context import Context, ContextConfig
from llamaspec.runtime.grammar import grammar_from_schema
from llamaspec.runtime.llama import Model
from llamaspec.speculative.drafters.chain import ChainDrafter
from llamaspec.speculative.drafters.factory import build_drafter
from llamaspec.speculative.drafters.grammar_jump import GrammarJumpDrafter
from llamaspec.speculative.engine import SpecEngine
from llamaspec.speculative.metrics import SpecStats
from llamaspec.speculative.options import SpecOptions
from llamaspec.speculative.sampling_params import SamplingParams
from llamaspec.speculative.sequence import GenerationConfig

HERE = Path(__file__).resolve().parent
F16 = Path.home() / ".cache/llamaspec/test-models/SmolLM2-135M-Instruct.F16.gguf"


def jobs(path: Path, n: int) -> list[tuple[list[dict], dict, int]]:
    out = []
    for line in path.read_text().splitlines()[:n]:
        body = json.loads(line)["body"]
        schema = body["response_format"]["json_schema"]["schema"]
        out.append((body["messages"], schema, body.get("max_tokens", 160)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=F16)
    ap.add_argument("--jobs", type=Path, default=HERE / "extraction_batch.jsonl")
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variants", action="store_true", help="also the grammar drafter's variants")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per generation")
    a = ap.parse_args()

    target = Model(a.model)
    ctx = Context(target, ContextConfig(n_ctx=2048, n_threads=a.threads))
    greedy = SamplingParams(temperature=0.0)
    built = build_drafter(SpecOptions(spec_types=["prompt-lookup", "suffix"]), target, ctx, greedy)
    # the copy drafters alone: built apart (a shared suffix drafter would learn each answer in one
    # mode and draft it whole in the next)
    again = build_drafter(SpecOptions(spec_types=["prompt-lookup", "suffix"]), target, ctx, greedy)
    copy = [m for m in again.drafter.members() if m.name != "grammar"]
    modes = {
        "plain": None,
        "copy (prompt-lookup, suffix)": ChainDrafter(copy),
        "grammar alone": GrammarJumpDrafter(target),
        "default (grammar, prompt-lookup, suffix)": built.drafter,
    }
    if a.variants:
        modes["grammar, tail keep"] = GrammarJumpDrafter(target, tail="keep")
        modes["grammar, tail drop"] = GrammarJumpDrafter(target, tail="drop")
        modes["grammar, no whitespace guess"] = GrammarJumpDrafter(target, guess_whitespace=False)
    engines = {name: SpecEngine(target, ctx, d) for name, d in modes.items()}
    work = [(target.tokenize_prompt(target.chat_prompt(msgs)), grammar_from_schema(schema), n)
            for msgs, schema, n in jobs(a.jobs, a.prompts)]
    # warm-up (the per-vocabulary tables, the first decodes) on an engine of its own: a measured
    # suffix drafter must not learn the first answer beforehand
    SpecEngine(target, ctx, GrammarJumpDrafter(target)).generate(work[0][0], GenerationConfig(max_tokens=8, grammar=work[0][1]))

    seconds = {m: 0.0 for m in modes}
    cpu = {m: 0.0 for m in modes}   # this process's CPU time: steadier than wall time on a shared machine
    stats = {m: [] for m in modes}
    texts: dict[str, list[list[int]]] = {m: [] for m in modes}
    for _ in range(a.reps):
        for prompt, spec, n in work:
            for m, eng in engines.items():
                cfg = GenerationConfig(max_tokens=n, grammar=spec, draft_max=32)
                t0, c0 = time.perf_counter(), time.process_time()
                g = eng.generate(prompt, cfg)
                seconds[m] += time.perf_counter() - t0
                cpu[m] += time.process_time() - c0
                stats[m].append(g.stats)
                texts[m].append(g.tokens)
                if a.verbose:
                    print(f"  {m}: {len(g.tokens)} tokens {time.perf_counter() - t0:.2f} s "
                          f"{ {k: (v.drafted, v.accepted) for k, v in g.stats.per_drafter.items()} }", flush=True)
    base = seconds["plain"]
    n_tok = sum(len(t) for t in texts["plain"])
    print(f"{len(work)} prompts x {a.reps} reps, {n_tok} tokens (plain), {a.model.name}, greedy, JSON schema")
    for m in modes:
        s = SpecStats.sum(stats[m])
        same = sum(x == y for x, y in zip(texts[m], texts["plain"]))
        per = ", ".join(f"{k}: drafted {v.drafted} accepted {v.accepted} calls {v.calls}"
                        + (f" ({1e6 * v.draft_seconds / v.calls:.0f} us/call)" if v.calls else "")
                        for k, v in s.per_drafter.items())
        print(f"{m:42s} {seconds[m]:7.2f} s  {base / seconds[m]:5.2f}x  cpu {cpu[m]:7.2f} s  "
              f"{cpu['plain'] / cpu[m]:5.2f}x  steps {s.steps:5d}  "
              f"same as plain {same}/{len(texts[m])}  {per}")
    ctx.close()
    target.close()


if __name__ == "__main__":
    main()
