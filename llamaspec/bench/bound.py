"""The copy-drafting bound: the speedup an oracle copy-drafter reaches on this machine.

A verify batch is not free on every machine (on a 2-core CPU an 8-token batch with every row's
logits costs about 3.4 one-token steps, 64 tokens about 15), so a fixed target such as "2.5x on a
code rewrite" says little. The yardstick here is the machine's own: record the target's greedy
output once; at each step an oracle drafter looks, among the earlier places of the text (prompt +
output so far) whose last `match` tokens equal the text's last `match` tokens, for the one whose
copy runs longest into the real output, drafts exactly the a tokens that will be accepted (at most
`max_draft`) and pays the measured cost t(a+1) of a batch of a+1 tokens with every row's logits.
The bound is len(output) / the summed costs, in units of one one-token step: what a drafter that
copies from the text with a 2-token key could give on that output and this machine if it were
never wrong. (It is a yardstick, not a proven maximum: on a curve where t(a+1) > a+1 drafting
less would do better, and drafters that do not copy, or key on one token, can find other tokens.)

`copy_bound` is the pure algorithm; `measure_curve` measures t(n)/t(1) on a loaded target at a
prompt's depth (llama.cpp's runtime Context, batches with outputs for every row, medians);
`bound_for` does both for `bench` (suite.py). Nothing here imports llama_cpp at module level.
"""

from __future__ import annotations

import bisect
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

if TYPE_CHECKING:
    from llamaspec.runtime.llama import Model

__all__ = ["BATCH_SIZES", "MATCH", "MAX_DRAFT", "Bound", "bound_for", "copy_bound", "interpolate", "measure_curve"]

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)   # the n of t(n) that are measured; between them, interpolated
MATCH = 2                                # tokens of the text's end a copy source must repeat
MAX_DRAFT = 63                           # a+1 <= 64: the largest measured batch


@dataclass
class Bound:
    """The copy-drafting bound of one output on one cost curve (costs in one-token steps)."""

    speedup: float              # tokens / cost
    tokens: int                 # the output's length
    steps: int                  # verify steps the oracle takes
    copied: int                 # tokens drafted (all accepted)
    cost: float                 # summed t(a+1)/t(1)
    longest: int                # the longest draft
    curve: dict[int, float] = field(default_factory=dict)   # t(n)/t(1) it was computed with
    t1_ms: float | None = None  # the measured one-token step, when measured
    depth: int | None = None    # the KV depth the curve was measured at

    def to_dict(self) -> dict:
        return {"speedup": self.speedup, "tokens": self.tokens, "steps": self.steps, "copied": self.copied,
                "cost": self.cost, "longest": self.longest, "t1_ms": self.t1_ms, "depth": self.depth,
                "curve": {str(n): r for n, r in sorted(self.curve.items())}}


def interpolate(curve: Mapping[int, float], n: float) -> float:
    """t(n) from measured points, linear between them; outside them, the nearest end's value
    extended along its last segment (never below 0)."""
    xs = sorted(curve)
    if not xs:
        raise ValueError("an empty cost curve")
    if len(xs) == 1:
        return float(curve[xs[0]])
    i = min(max(bisect.bisect_left(xs, n), 1), len(xs) - 1)   # the segment xs[i-1]..xs[i] holding n
    x0, x1 = xs[i - 1], xs[i]
    y0, y1 = curve[x0], curve[x1]
    return max(0.0, y0 + (y1 - y0) * (n - x0) / (x1 - x0))


def copy_bound(context: Sequence[int], output: Sequence[int], cost: "Mapping[int, float] | Callable[[int], float]",
               *, match: int = MATCH, max_draft: int = MAX_DRAFT) -> Bound:
    """The speedup of an oracle copy-drafter generating `output` after `context`, over one-token
    steps, when a batch of n tokens costs cost(n) (a curve {n: t(n)/t(1)}, interpolated, or a
    function; costs are divided by cost(1)).

    At each step, with text = context + the output so far and r tokens of output left: among the
    places j < len(text) where text[j-match:j] == text[-match:], take the copy text[j:] that agrees
    longest with the output still to come; draft those a tokens (a <= max_draft, a <= r - 1: each
    step also yields the target's own next token, and the output ends where it was recorded) and
    pay cost(a + 1). Ties go to the latest place. A step with nothing to copy drafts nothing and
    pays cost(1).

    Worked example, with curve {1: 1.0, 2: 1.5, 4: 2.0, 8: 3.0}::

        context = [1, 2, 3, 4, 5, 1, 2]          output = [3, 4, 5, 9, 1, 2, 3]

        step 1: text ends 1 2; 1 2 occurs earlier before index 2; copy 3 4 5 1 2 vs 3 4 5 9 ...
                agrees for a = 3: draft 3 4 5, the target adds 9; pay t(4) = 2.0
        step 2: text ends 5 9: no earlier 5 9; one-token step (1); pay 1
        step 3: text ends 9 1: none; one-token step (2); pay 1
        step 4: text ends 1 2 (two earlier places), but one token is left: a <= 0; (3); pay 1

        bound = 7 tokens / 5.0 = 1.4x in 4 steps, 3 tokens copied

    >>> copy_bound([1, 2, 3, 4, 5, 1, 2], [3, 4, 5, 9, 1, 2, 3], {1: 1.0, 2: 1.5, 4: 2.0, 8: 3.0}).speedup
    1.4
    """
    if match < 1:
        raise ValueError("match must be >= 1")
    fn = cost if callable(cost) else (lambda n, c=dict(cost): interpolate(c, n))
    unit = fn(1)
    if not unit > 0:
        raise ValueError("the cost of a one-token step must be positive")
    text = list(context)
    out = list(output)
    # key (the `match` tokens before j) -> every j, so a step looks only at the places that match
    places: dict[tuple[int, ...], list[int]] = {}
    for j in range(match, len(text)):
        places.setdefault(tuple(text[j - match:j]), []).append(j)
    pos = steps = copied = longest = 0
    spent = 0.0
    while pos < len(out):
        cap = min(max_draft, len(out) - pos - 1)
        best = 0
        if cap > 0 and len(text) >= match:
            for j in reversed(places.get(tuple(text[-match:]), ())):
                limit = min(cap, len(text) - j)
                a = 0
                while a < limit and text[j + a] == out[pos + a]:
                    a += 1
                if a > best:
                    best = a
                    if best == cap:
                        break
        new = out[pos:pos + best + 1]
        for tok in new:             # the text grows: each new end is a place later steps can copy from
            text.append(tok)
            if len(text) > match:
                places.setdefault(tuple(text[-match - 1:-1]), []).append(len(text) - 1)
        pos += len(new)
        steps += 1
        copied += best
        longest = max(longest, best)
        spent += fn(best + 1) / unit
    curve = {} if callable(cost) else {int(n): float(v) / unit for n, v in cost.items()}
    return Bound(speedup=len(out) / spent if spent else 1.0, tokens=len(out), steps=steps, copied=copied,
                 cost=spent, longest=longest, curve=curve)


def measure_curve(model: "Model", prompt: Sequence[int], *, threads: int | None = None,
                  sizes: Sequence[int] = BATCH_SIZES, reps: int = 5) -> tuple[dict[int, float], float]:
    """({n: t(n)/t(1)}, t(1) in seconds) on the loaded `model`, at the depth of `prompt`: the
    prompt is evaluated once, then batches of n tokens at the next positions with logits for every
    row (what a verify needs), `reps` rounds over all sizes interleaved (so drift on a shared
    machine lands on every size alike) after one untimed round, medians. Each batch is removed
    again (by checkpoint where the memory cannot drop a tail: recurrent and hybrid models)."""
    from llamaspec.runtime.context import Context, ContextConfig

    prompt = list(prompt)
    if not prompt:
        raise ValueError("measure_curve needs a prompt")
    big = max(sizes)
    filler = (prompt * (big // len(prompt) + 1))[:big]   # token ids do not change a batch's cost
    depth = len(prompt)
    ctx = Context(model, ContextConfig(n_ctx=depth + big, n_batch=max(512, big), n_threads=threads))
    try:
        ctx.decode(prompt, 0, 0)
        state = ctx.save_seq(0) if model.needs_checkpoints else None
        times: dict[int, list[float]] = {n: [] for n in sizes}
        for rnd in range(reps + 1):
            for n in sizes:
                t0 = time.perf_counter()
                ctx.decode(filler[:n], depth, 0, outputs="all")
                ctx.logits(n)           # waits for the batch to finish
                dt = time.perf_counter() - t0
                if rnd:
                    times[n].append(dt)
                if state is not None:
                    ctx.load_seq(state, 0)
                elif not ctx.seq_rm(0, depth, -1):
                    raise RuntimeError("could not remove a measured batch from the context")
    finally:
        ctx.close()
    med = {n: statistics.median(v) for n, v in times.items()}
    t1 = med[min(sizes)]
    return {n: med[n] / t1 for n in sizes}, t1


def bound_for(model: "Model", prompt: Sequence[int], output: Sequence[int], *, threads: int | None = None,
              reps: int = 5) -> Bound:
    """The copy-drafting bound of `output` (the target's recorded greedy output after `prompt`) on
    the cost curve measured now on `model` at the prompt's depth."""
    curve, t1 = measure_curve(model, prompt, threads=threads, reps=reps)
    b = copy_bound(prompt, output, curve)
    b.t1_ms, b.depth = 1000 * t1, len(prompt)
    return b
