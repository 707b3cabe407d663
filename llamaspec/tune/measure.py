"""Measuring candidates against plain decoding, robust to a machine that other work slows down.

Every candidate run stands between two plain runs on the same prompt (plain, A, plain, B, plain,
...: one plain run more than candidates), and its ratio is over the faster of those two
neighbours (`pair_ratio`). Interference from other processes only ever slows a run down, so the
faster neighbour is the better estimate of plain speed at that moment, and a candidate is never
flattered by a plain run that happened to be slowed; a ratio against one plain run made minutes
earlier (or one shared by several candidates) is what let a load spike read as 26x.

A candidate whose greedy tokens differ from plain decoding is rejected, unless a `judge` (flips.py:
the target's gap between the two tokens at the first difference, against the batch noise measured
on this model) finds the flip at a near-tie: then it is kept, and the flip noted.

`agreeing` is the spread check: the passes of a candidate (its pair ratios, as a geometric mean
over the prompts) must agree within a factor, or the decision is not taken on them.
Timing comes from the runner, so all of this is testable with made-up numbers.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

from llamaspec.errors import LlamaspecError
from llamaspec.speculative.options import NgramParams, default_draft_max

if TYPE_CHECKING:
    from llamaspec.bench import RepResult
    from llamaspec.tune.flips import Flip


@dataclass(frozen=True)
class Candidate:
    spec: str                                   # llama.cpp names, priority-ordered comma list
    draft_max: int | None = None                # None: the spec type's default
    draft_p_min: float = 0.0
    ngram: tuple[tuple[str, int], ...] = ()     # NgramParams fields changed from the defaults

    @property
    def effective_draft_max(self) -> int:
        return self.draft_max if self.draft_max is not None else default_draft_max(self.spec)

    @property
    def label(self) -> str:
        parts = [self.spec]
        if self.draft_max is not None:
            parts.append(f"k={self.draft_max}")
        if self.draft_p_min:
            parts.append(f"p-min={self.draft_p_min:g}")
        parts += [f"{k.replace('_', '-')}={v}" for k, v in self.ngram]
        return " ".join(parts)

    def ngram_params(self) -> NgramParams | None:
        if not self.ngram:
            return None
        p = NgramParams()
        for k, v in self.ngram:
            setattr(p, k, v)
        return p

    def with_(self, **kw) -> "Candidate":
        d = {"spec": self.spec, "draft_max": self.draft_max, "draft_p_min": self.draft_p_min, "ngram": self.ngram}
        d.update(kw)
        d["ngram"] = tuple(sorted(dict(d["ngram"]).items()))
        return Candidate(**d)

    def to_dict(self) -> dict:
        return {"spec_type": self.spec, "draft_max": self.effective_draft_max, "draft_p_min": self.draft_p_min,
                "ngram": dict(self.ngram), "label": self.label}


# Runner(candidate, prompt index) -> one greedy run; candidate None: plain decoding.
Runner = Callable[[Candidate | None, int], "RepResult"]
# Judge(prompt index, plain's tokens, the candidate's tokens) -> the first difference judged (a
# Flip: .near_tie, .note), or None when there is none.
Judge = Callable[[int, Sequence[int], Sequence[int]], "Flip | None"]


def geomean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else 0.0


@dataclass
class Score:
    candidate: Candidate
    ratios: list[list[float]] = field(default_factory=list)   # per pass, per prompt
    accepted: int = 0
    drafted: int = 0
    rejected: str | None = None          # why it cannot be chosen (tokens differ from plain)
    flips: list[str] = field(default_factory=list)   # near-tie flips judged noise: kept
    agreed: tuple[float, float] | None = None   # the range most passes agree on (spread check)

    @property
    def passes(self) -> list[float]:
        return [geomean(r) for r in self.ratios if r]

    @property
    def score(self) -> float | None:
        """The median pass; once the spread check found a majority, of the passes in its range."""
        p = self.passes
        if self.agreed is not None:
            p = [v for v in p if self.agreed[0] <= v <= self.agreed[1]] or p
        return statistics.median(p) if p else None

    @property
    def eligible(self) -> bool:
        return self.rejected is None and self.accepted > 0 and self.score is not None

    def to_dict(self) -> dict:
        return {**self.candidate.to_dict(), "score": self.score, "passes": self.passes, "ratios": self.ratios,
                "accepted": self.accepted, "drafted": self.drafted, "rejected": self.rejected, "flips": self.flips}


@dataclass
class Round:
    name: str
    scores: list[Score]
    plain_tps: list[float] = field(default_factory=list)

    def ranked(self) -> list[Score]:
        return sorted((s for s in self.scores if s.eligible), key=lambda s: -(s.score or 0.0))

    def to_dict(self) -> dict:
        return {"name": self.name, "candidates": [s.to_dict() for s in self.scores]}


# ---- the decision rules (pure) --------------------------------------------------------------------


def pair_ratio(cand_tps: float, before_tps: float, after_tps: float) -> float | None:
    """A candidate's speed over plain decoding measured right beside it: over the faster of the
    plain runs before and after it (a slowed neighbour cannot inflate the ratio)."""
    plain = max(before_tps, after_tps)
    return cand_tps / plain if plain > 0 else None


def agreeing(values: Sequence[float], limit: float) -> list[float] | None:
    """The largest group of more than half of `values` (at least two) within a factor `limit` of
    each other, or None when there is none: the passes disagree. One value agrees with itself."""
    vals = sorted(v for v in values if v and v > 0)
    if len(vals) < 2:
        return list(vals) if len(vals) == len(values) else None
    best: list[float] = []
    for i, lo in enumerate(vals):
        group = [v for v in vals[i:] if v <= lo * limit]
        if len(group) > len(best):
            best = group
    return best if len(best) >= 2 and len(best) * 2 > len(vals) else None


# ---- measuring --------------------------------------------------------------------------------------


@dataclass
class Tick:
    """One run made: for progress lines. left: runs still planned in this round."""

    round: str
    done: int
    left: int
    candidate: Candidate | None      # None: plain decoding
    result: "RepResult"
    flip: str | None = None          # tokens differ from plain at a near-tie: kept (the judge's note)


OnRun = Callable[[Tick], None]


def round_size(n_cands: int, n_prompts: int, passes: int) -> int:
    """Runs one round makes: per prompt and pass, every candidate and one plain run after each,
    plus the plain run that opens the prompt."""
    return passes * n_prompts * (1 + 2 * n_cands) if n_cands else 0


def measure(name: str, cands: Sequence[Candidate], runner: Runner, n_prompts: int, passes: int,
            rejected: dict[Candidate, str], on_run: OnRun | None = None, judge: Judge | None = None) -> Round:
    """A new round: `passes` passes over the prompts (see `measure_pass`)."""
    rnd = Round(name, [Score(c) for c in dict.fromkeys(cands) if c not in rejected])
    for p in range(passes):
        measure_pass(rnd, runner, n_prompts, rejected, on_run, passes_after=passes - p - 1, judge=judge)
    return rnd


def measure_pass(rnd: Round, runner: Runner, n_prompts: int, rejected: dict[Candidate, str],
                 on_run: OnRun | None = None, passes_after: int = 0, judge: Judge | None = None) -> None:
    """One more pass of every live candidate of `rnd` over the prompts, each run between two plain
    runs on its prompt; appends a list of ratios to each Score. Tokens that differ from plain
    reject the candidate, unless `judge` finds the flip at a near-tie (noted in Score.flips)."""
    for s in rnd.scores:
        s.ratios.append([])
    done = 0

    def tick(j: int, i: int, cand: Candidate | None, r, flip: str | None = None) -> None:
        nonlocal done
        done += 1
        if on_run:
            live = sum(1 for s in rnd.scores if s.rejected is None)
            ahead = sum(2 for s in rnd.scores[j + 1:] if s.rejected is None) + (cand is not None)
            later = (n_prompts - i - 1) + passes_after * n_prompts
            on_run(Tick(rnd.name, done, ahead + later * (1 + 2 * live) if live else 0, cand, r, flip))

    for i in range(n_prompts):
        if all(s.rejected is not None for s in rnd.scores):
            return
        before = runner(None, i)
        rnd.plain_tps.append(before.tps)
        tick(-1, i, None, before)
        for j, s in enumerate(rnd.scores):
            if s.rejected is not None:   # cannot run with this pair (or differed): no more runs
                continue
            try:
                r = runner(s.candidate, i)
            except LlamaspecError as e:  # e.g. draft-eagle3 with a draft that is not an EAGLE-3 head
                _unusable(rnd, s, e.message, rejected)
                continue
            after = runner(None, i)
            rnd.plain_tps.append(after.tps)
            plain = after if after.tps >= before.tps else before
            r = r.compare_to(plain)   # the token check, e2e ratio
            r.ratio = pair_ratio(r.tps, before.tps, after.tps)
            s.accepted += r.accepted
            s.drafted += r.drafted
            flip = None
            if r.identical is False and s.rejected is None:
                why = f"greedy tokens differ from plain decoding on prompt {i + 1} from token {r.first_difference}"
                verdict = judge(i, plain.tokens or [], r.tokens or []) if judge is not None else None
                if verdict is not None and verdict.near_tie:
                    flip = f"prompt {i + 1} token {verdict.index}: {verdict.note}"
                    if flip not in s.flips:
                        s.flips.append(flip)
                else:
                    s.rejected = why + (f": {verdict.note}" if verdict is not None else "")
                    rejected[s.candidate] = s.rejected
            s.ratios[-1].append(r.ratio or 0.0)
            tick(j, i, s.candidate, r, flip)
            tick(j, i, None, after)
            before = after


def _unusable(rnd: Round, s: Score, message: str, rejected: dict[Candidate, str]) -> None:
    """A candidate that cannot run; when it is one type alone, every chain with that type too."""
    s.rejected = f"cannot run: {message}"
    rejected[s.candidate] = s.rejected
    if "," in s.candidate.spec:
        return
    for other in rnd.scores:
        if other.rejected is None and s.candidate.spec in other.candidate.spec.split(","):
            other.rejected = f"cannot run: {s.candidate.spec}: {message}"
            rejected[other.candidate] = other.rejected
