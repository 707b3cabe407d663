"""The theoretical speedup of a speculative run, from its own measured acceptance and costs.

The standard model (Leviathan et al. 2023; Chen et al. 2023), with every cost in units of one plain
decode step t1 (the plain run of the same repetition: its generation time per step, everything a
plain step costs):

    expected tokens per step  E(k) = 1 + sum_{i<k} alpha_i
    cost of a step            C(k) = c_draft * k + c_verify(k)
    theoretical speedup       S(k) = E(k) / C(k)

- alpha_i: the acceptance of draft position i, measured: of the drafts that reached position i,
  the fraction whose tokens 0..i were all accepted (accepted_per_position[i] / drafted_per_position[i]).
- c_draft: seconds spent drafting per draft token / t1 (the drafter's own time: a draft model's
  decodes, an n-gram lookup).
- c_verify(k) = 1 + (b / t1) * k: a step verifying k draft tokens costs a plain step plus b per
  extra token in the batch (t(n) = a + b * n, the line the adaptive controller fits too). b comes
  from the run itself: its verify batches held steps + drafted tokens and took verify_seconds, and
  a one-token batch takes v1 (the plain run's verify seconds per step), so
  verify_seconds = steps * v1 + b * drafted.

`for_run` evaluates the model at the run's own mix of draft lengths (steps without a draft are
k = 0 steps): E = (steps + accepted) / steps, C = draft seconds per step / t1 + 1 + b' * k_mean.
That is the speedup the run would have had if a speculative step cost a plain step plus only its
drafting and its larger verify batch: measured / theoretical is how much of it the implementation
delivered (the speculative loop's own extra work, KV bookkeeping and timing noise make up the rest). `best_k` is the fixed draft length the same
acceptance and costs favour, and its speedup.

Pure functions; no llama_cpp.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

__all__ = ["Theory", "acceptance_by_position", "expected_tokens", "step_cost", "speedup", "for_run",
           "median_theory"]


def acceptance_by_position(drafted_per_position: Sequence[int], accepted_per_position: Sequence[int]) -> list[float]:
    """alpha_i = accepted[i] / drafted[i]: of the drafts that had a position i, the fraction accepted
    through it. Stops at the first position no draft reached."""
    out = []
    for i, d in enumerate(drafted_per_position):
        if d <= 0:
            break
        a = accepted_per_position[i] if i < len(accepted_per_position) else 0
        out.append(a / d)
    return out


def expected_tokens(alpha: Sequence[float], k: int) -> float:
    """Tokens a verify step with a k-token draft yields on average: 1 (the target's own token,
    or the bonus token) + the expected accepted prefix. Positions past the measured ones count 0."""
    return 1.0 + sum(alpha[:max(0, k)])


def step_cost(k: float, draft_cost: float, verify_slope: float) -> float:
    """(c_draft * k + c_verify(k)) in plain decode steps, with c_verify(k) = 1 + verify_slope * k."""
    return draft_cost * k + 1.0 + verify_slope * k


def speedup(alpha: Sequence[float], k: int, draft_cost: float, verify_slope: float) -> float:
    """S(k) = E(k) / C(k): the standard theoretical speedup at a fixed draft length k."""
    return expected_tokens(alpha, k) / step_cost(k, draft_cost, verify_slope)


@dataclass
class Theory:
    """The model evaluated for one run (see the module docstring). Costs in plain decode steps."""

    speedup: float                      # S at the run's own mix of draft lengths
    tokens_per_step: float              # E: (steps + accepted) / steps
    mean_draft_length: float            # k_mean: drafted / steps (steps without a draft count 0)
    draft_cost: float | None            # c_draft per draft token (None: nothing was drafted)
    verify_slope: float                 # b / t1: c_verify(k) = 1 + verify_slope * k
    step_cost: float                    # C at the run's mix
    best_k: int | None = None           # the fixed draft length with the highest S(k)
    best_k_speedup: float | None = None
    of_theory: float | None = None      # measured speedup / speedup (filled by the caller)

    def to_dict(self) -> dict:
        return asdict(self)


def for_run(*, steps: int, drafted: int, accepted: int, drafted_per_position: Sequence[int],
            accepted_per_position: Sequence[int], draft_seconds: float, verify_seconds: float,
            plain_step_seconds: float, plain_verify_seconds: float | None = None) -> Theory | None:
    """The theoretical speedup of one run against a plain run whose steps took `plain_step_seconds`
    each (generation time / steps) and `plain_verify_seconds` each inside the target's batch (None:
    the same). None when there is nothing to measure by."""
    t1 = plain_step_seconds
    v1 = plain_verify_seconds if plain_verify_seconds is not None else t1
    if steps <= 0 or not t1 > 0:
        return None
    e = (steps + accepted) / steps
    k_mean = drafted / steps
    slope = max(0.0, (verify_seconds - steps * v1) / drafted / t1) if drafted else 0.0
    draft_per_step = max(0.0, draft_seconds) / steps / t1
    cost = draft_per_step + 1.0 + slope * k_mean      # = c_draft * k_mean + c_verify(k_mean)
    c_draft = max(0.0, draft_seconds) / drafted / t1 if drafted else None
    best_k = best = None
    alpha = acceptance_by_position(drafted_per_position, accepted_per_position)
    for k in range(1, len(alpha) + 1):
        s = speedup(alpha, k, c_draft or 0.0, slope)
        if best is None or s > best:
            best_k, best = k, s
    return Theory(speedup=e / cost, tokens_per_step=e, mean_draft_length=k_mean, draft_cost=c_draft,
                  verify_slope=slope, step_cost=cost, best_k=best_k, best_k_speedup=best)


def median_theory(theories: Sequence[Theory | None]) -> Theory | None:
    """Per-field medians over repetitions (best_k: the median rep's, by best_k_speedup)."""
    import statistics

    ts = [t for t in theories if t is not None]
    if not ts:
        return None

    def med(name: str) -> float | None:
        vs = [getattr(t, name) for t in ts if getattr(t, name) is not None]
        return statistics.median(vs) if vs else None

    with_k = sorted((t for t in ts if t.best_k_speedup is not None), key=lambda t: t.best_k_speedup)
    mid = with_k[(len(with_k) - 1) // 2] if with_k else None
    return Theory(speedup=med("speedup"), tokens_per_step=med("tokens_per_step"),
                  mean_draft_length=med("mean_draft_length"), draft_cost=med("draft_cost"),
                  verify_slope=med("verify_slope"), step_cost=med("step_cost"),
                  best_k=mid.best_k if mid else None, best_k_speedup=mid.best_k_speedup if mid else None,
                  of_theory=med("of_theory"))
