"""Will a draft model pay here? Expected speedup of draft-simple over plain decoding, from costs.

A draft model joins the default chain only when this says it pays on this machine: a same-size
quant beside the model, or llama.cpp's recommended 0.5B draft of a 1.5B on a 2-core CPU, loses
(MEASURED.md: 0.45-0.95x and 0.75-0.79x plain), while a 0.5B draft of a 7B target on a GPU wins.

Model (as the adaptive controller's, controller.py). Drafting k tokens at per-token acceptance a
yields E(k) = (1 - a^(k+1)) / (1 - a) tokens, the bonus token included, and costs, in plain
decode steps, C(k) = k * c + V(k + 1): c the draft's cost per token over a target step, V(n) the
target's verify curve t(n) / t(1). The expected speedup is max over k of E(k) / C(k). A draft
joins when that is at least MIN_GAIN: the model leaves out the draft's own prompt evaluation,
sampling and the steps a rejection wastes, so a draft that is priced to break even loses.

Worked example: the SmolLM2-135M F16 target with its Q4_1 beside it on a CPU, no measurement yet.
Cold estimate c = (98 MB + 150 MB) / (270 MB + 150 MB) = 0.59 (decoding reads every weight once
per token, plus a fixed cost per decode worth ~150 MB of reads on the 2-core CPUs measured here);
V(n) = 1 + 0.5 (n - 1); a = 0.85. k = 1: E = 1.85, C = 0.59 + 1.5 = 2.09: 0.89x. Longer drafts do
worse: refused. A 0.5B Q4 (0.4 GB) drafting for a 7B Q4 (4.7 GB) on a GPU: c = (0.4 + 1) / (4.7 + 1)
= 0.25 (a GPU's fixed cost per decode is worth ~1 GB of reads), V(n) = 1 + 0.02 (n - 1);
k = 4: E = 3.71, C = 0.98 + 1.08 = 2.06: 1.80x: taken.

    >>> cpu = cold_costs(270e6, 98e6, gpu=False)
    >>> round(cpu.cost_ratio, 2), value(cpu).pays
    (0.59, False)
    >>> gpu = cold_costs(4.7e9, 0.4e9, gpu=True)
    >>> v = value(gpu); v.pays, v.k, round(v.speedup, 2)
    (True, 4, 1.8)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

__all__ = ["DraftCosts", "DraftValue", "cold_costs", "expected_speedup", "for_draft", "value", "MIN_GAIN"]

#: a draft joins only when its expected speedup is at least this (the margin for what the model
#: leaves out: the draft's prompt evaluation, its sampling and the Python around both)
MIN_GAIN = 1.1
#: the draft lengths weighed: the engine's draft-max for a draft model (README: "up to 8")
K_MAX = 8
#: acceptance is capped here in the decision: a run's "100 %" over a few drafts says little, and
#: at a = 1 the longest draft always looks best
MAX_ACCEPTANCE = 0.95
#: a decode's fixed cost (graph, synchronisation, sampling, Python) as bytes of weights read:
#: SmolLM2-135M F16 (270 MB) 27.1 ms and its Q4_1 (98 MB) 16.3 ms on one 2-core CPU, 8.3 ms and
#: ~4.9 ms with the 1.5B Q4_K_M (1.1 GB) at 25 ms on another: both fit t = bytes / BW + F with
#: F * BW of 150-160 MB. A GPU reads far faster, so its launch overhead is worth more bytes.
CPU_FIXED_BYTES = 150e6
GPU_FIXED_BYTES = 1e9
#: t(n)/t(1) before this target's curve is measured: on the CPUs here 2: 1.31-1.90, 8: 2.4-4.9
#: (SmolLM2 F16 cheapest, Qwen2.5-Coder-1.5B Q4_K_M dearest); a GPU's batches are nearly free
CPU_VERIFY_SLOPE = 0.5
GPU_VERIFY_SLOPE = 0.02
#: per-token acceptance before any is seen: same-family instruct pairs accept 80-100 % (llama.cpp
#: reports 96-99 % on SmolLM2 F16/Q4_1, 100 % on the Qwen2.5-Coder pair on a code edit)
COLD_ACCEPTANCE = 0.85


@dataclass(frozen=True)
class DraftCosts:
    """What the decision is fed: measured on this machine, or the cold-start estimate."""

    cost_ratio: float                       # c: the draft's seconds per token / a target step's
    verify: tuple[float, ...]               # verify[n - 1] = t(n) / t(1), n = 1..len
    acceptance: float                       # per-token acceptance (geometric)
    source: str = "cold"                    # "cold" (from file sizes) or "measured"
    detail: str = ""                        # one phrase on where the numbers come from

    def verify_ratio(self, n: int) -> float:
        """t(n)/t(1), extended past the last point along the last segment's slope."""
        v = self.verify
        if n <= len(v):
            return v[max(n, 1) - 1]
        slope = (v[-1] - v[-2]) if len(v) >= 2 else 0.0
        return v[-1] + slope * (n - len(v))

    def to_dict(self) -> dict:
        return {"cost_ratio": round(self.cost_ratio, 4), "verify": [round(x, 4) for x in self.verify],
                "acceptance": round(self.acceptance, 4), "source": self.source, "detail": self.detail}


@dataclass(frozen=True)
class DraftValue:
    pays: bool
    speedup: float          # expected, over plain decoding, at the best k
    k: int                  # the best draft length
    costs: DraftCosts = field(repr=False)

    def why(self) -> str:
        c = self.costs
        verdict = "pays" if self.pays else "does not pay"
        return (f"expected {self.speedup:.2f}x plain at k={self.k} ({verdict}; a draft needs "
                f">= {MIN_GAIN:g}x): cost ratio {c.cost_ratio:.2f}, verify t(2)/t(1) {c.verify_ratio(2):.2f} "
                f"t(8)/t(1) {c.verify_ratio(8):.2f}, acceptance {c.acceptance:.0%} ({c.detail or c.source})")

    def to_dict(self) -> dict:
        return {"pays": self.pays, "speedup": round(self.speedup, 3), "k": self.k, "costs": self.costs.to_dict()}


def expected_tokens(alpha: float, k: int) -> float:
    """E(k) = 1 + a + ... + a^k: tokens a k-token draft yields, bonus included."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def expected_speedup(cost_ratio: float, verify: Sequence[float] | DraftCosts, alpha: float,
                     k_max: int = K_MAX) -> tuple[float, int]:
    """(best E(k) / C(k), its k) over k = 1..k_max.

        >>> s, k = expected_speedup(0.05, [1.0, 1.02, 1.04, 1.06, 1.08], 0.9, k_max=4)
        >>> k, round(s, 2)
        (4, 3.2)
    """
    costs = verify if isinstance(verify, DraftCosts) else DraftCosts(cost_ratio, tuple(verify), alpha)
    best, best_k = 0.0, 1
    for k in range(1, max(1, k_max) + 1):
        rate = expected_tokens(alpha, k) / (k * cost_ratio + costs.verify_ratio(k + 1))
        if rate > best:
            best, best_k = rate, k
    return best, best_k


def value(costs: DraftCosts, k_max: int = K_MAX) -> DraftValue:
    speedup, k = expected_speedup(costs.cost_ratio, costs, min(costs.acceptance, MAX_ACCEPTANCE), k_max)
    return DraftValue(speedup >= MIN_GAIN, speedup, k, costs)


def linear_curve(slope: float, n_max: int = K_MAX + 1) -> tuple[float, ...]:
    return tuple(1.0 + slope * (n - 1) for n in range(1, n_max + 1))


def cold_costs(target_bytes: float, draft_bytes: float, *, gpu: bool) -> DraftCosts:
    """The first-run estimate from file sizes and the device kind (worked example above)."""
    fixed = GPU_FIXED_BYTES if gpu else CPU_FIXED_BYTES
    c = (draft_bytes + fixed) / max(target_bytes + fixed, 1.0)
    slope = GPU_VERIFY_SLOPE if gpu else CPU_VERIFY_SLOPE
    where = "GPU" if gpu else "CPU"
    return DraftCosts(c, linear_curve(slope), COLD_ACCEPTANCE, "cold",
                      f"first-run estimate for a {where} from file sizes; a run with the draft measures it")


def for_draft(target_bytes: float, draft_path, draft_bytes: float, measured=None, *, gpu: bool = False) -> DraftValue:
    """Is a draft file expected to pay beside a target here: from its measured costs when a run
    stored them (measured(draft_path) -> DraftCosts | None), else from the file sizes."""
    costs = measured(draft_path) if measured is not None else None
    return value(costs if costs is not None else cold_costs(target_bytes, draft_bytes, gpu=gpu))
