"""The tuning sweep: which speculative settings decode a pair fastest here, against plain decoding.

Successive halving in three rounds, each measured side by side with plain decoding (plain runs
before every few candidates on the same prompt, ratios over that plain run, as `bench` does):

1. coarse: every spec type the pair allows, and n-gram + model chains, at their defaults;
2. fine (skipped by `quick`): around the best few, one setting at a time: draft-max halved and
   doubled, p-min for drafting models, the n-gram match length halved and doubled; plus the best
   of each setting combined;
3. confirm: the best few again, `reps` passes, scored on this round alone.

A candidate whose greedy tokens ever differ from plain decoding is rejected for good; one that
never had a draft token accepted cannot win (its ratio is noise). Plain decoding ("none") is
chosen unless the best confirmed candidate beats it by `margin`. A score is the geometric mean
over the prompts of the generation tok/s ratio. Timing comes from `runner`, so the search logic
can be tested with made-up numbers. Nothing here imports llama_cpp.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

from llamaspec.errors import LlamaspecError
from llamaspec.speculative.options import (
    MAX_DRAFT, SPEC_TYPES, NgramParams, default_draft_max, loads_mtp_layers, needs_draft_model, order_by_priority,
)

if TYPE_CHECKING:
    from llamaspec.bench import RepResult
    from llamaspec.tune.store import TunedConfig

_NGRAM_FIELDS = set(NgramParams.__dataclass_fields__)


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


@dataclass
class Score:
    candidate: Candidate
    ratios: list[list[float]] = field(default_factory=list)   # per pass, per prompt
    accepted: int = 0
    drafted: int = 0
    rejected: str | None = None          # why it cannot be chosen (tokens differ from plain)

    @property
    def passes(self) -> list[float]:
        return [_geomean(r) for r in self.ratios if r]

    @property
    def score(self) -> float | None:
        p = self.passes
        return statistics.median(p) if p else None

    @property
    def eligible(self) -> bool:
        return self.rejected is None and self.accepted > 0 and self.score is not None

    def to_dict(self) -> dict:
        return {**self.candidate.to_dict(), "score": self.score, "ratios": self.ratios, "accepted": self.accepted,
                "drafted": self.drafted, "rejected": self.rejected}


@dataclass
class Round:
    name: str
    scores: list[Score]
    plain_tps: list[float] = field(default_factory=list)

    def ranked(self) -> list[Score]:
        return sorted((s for s in self.scores if s.eligible), key=lambda s: -(s.score or 0.0))

    def to_dict(self) -> dict:
        return {"name": self.name, "candidates": [s.to_dict() for s in self.scores]}


@dataclass
class SweepResult:
    rounds: list[Round]
    chosen: Score | None          # None: plain decoding
    best: Score | None            # the best confirmed candidate, chosen or not
    margin: float
    plain_tok_s: float | None
    rejected: list[Score]

    def config(self, measured: dict | None = None) -> "TunedConfig":
        from llamaspec.tune.store import TunedConfig

        c = self.chosen.candidate if self.chosen else None
        return TunedConfig(spec_type=c.spec if c else "none", draft_max=c.effective_draft_max if c else None,
                           draft_p_min=c.draft_p_min if c else 0.0, ngram=dict(c.ngram) if c else {},
                           ratio=self.chosen.score if self.chosen else 1.0, plain_tok_s=self.plain_tok_s,
                           measured=dict(measured or {}))

    def to_dict(self) -> dict:
        return {"chosen": self.chosen.to_dict() if self.chosen else None,
                "best": self.best.to_dict() if self.best else None, "margin": self.margin,
                "plain_tok_s": self.plain_tok_s, "rounds": [r.to_dict() for r in self.rounds],
                "rejected": [s.to_dict() for s in self.rejected]}


def _geomean(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else 0.0


# ---- what to try ---------------------------------------------------------------------------------


def applicable_types(has_draft: bool, has_mtp: bool) -> tuple[list[str], list[str]]:
    """(n-gram types, model types) llamaspec implements that this pair can use, from the table."""
    ngram, model = [], []
    for t in SPEC_TYPES.values():
        if not t.implemented or t.draft_max is None:
            continue
        if t.needs_draft_model or t.loads_mtp_layers:
            if (t.needs_draft_model and has_draft) or (t.loads_mtp_layers and has_mtp):
                model.append(t.name)
        else:
            ngram.append(t.name)
    return ngram, model


def coarse_candidates(has_draft: bool, has_mtp: bool) -> list[Candidate]:
    """Every applicable type at its defaults: models, n-gram types, then each n-gram + model chain."""
    ngram, model = applicable_types(has_draft, has_mtp)
    chains = [",".join(order_by_priority([n, m])) for m in model for n in ngram]
    return [Candidate(s) for s in model + ngram + chains]


def _match_field(type_name: str) -> str | None:
    """The first NgramParams field among a type's llama.cpp flags: its n-gram (match) length."""
    return next((key for _, key in SPEC_TYPES[type_name].native_flags if key in _NGRAM_FIELDS), None)


def neighbours(c: Candidate) -> list[Candidate]:
    """One setting changed at a time: draft-max / 2 and * 2, p-min for drafting models, the n-gram
    match length / 2 and * 2 for each n-gram type of the candidate."""
    out: list[Candidate] = []
    k = c.effective_draft_max
    for v in (k // 2, k * 2):
        if 1 <= v <= MAX_DRAFT and v != k:
            out.append(c.with_(draft_max=v))
    if needs_draft_model(c.spec) or loads_mtp_layers(c.spec):
        out += [c.with_(draft_p_min=p) for p in (0.5, 0.8) if p != c.draft_p_min]
    defaults = NgramParams()
    for name in c.spec.split(","):
        key = _match_field(name)
        if key is None:
            continue
        cur = dict(c.ngram).get(key, getattr(defaults, key))
        for v in (max(2, cur // 2), cur * 2):
            if v != cur:
                out.append(c.with_(ngram={**dict(c.ngram), key: v}))
    return list(dict.fromkeys(out))


def combine(base: Candidate, scored: Sequence[Score]) -> Candidate | None:
    """The best value of each setting (among `scored` variations of `base` that beat it) at once."""
    by_score = {s.candidate: s.score for s in scored if s.eligible}
    if base not in by_score:
        return None
    best = dict(draft_max=base.draft_max, draft_p_min=base.draft_p_min, ngram=dict(base.ngram))
    gains: dict[str, float] = {}
    for cand, score in by_score.items():
        if cand.spec != base.spec or score is None or score <= by_score[base]:
            continue
        for attr in ("draft_max", "draft_p_min"):
            if getattr(cand, attr) != getattr(base, attr) and score > gains.get(attr, 0.0):
                gains[attr], best[attr] = score, getattr(cand, attr)
        for key, v in dict(cand.ngram).items():
            if dict(base.ngram).get(key) != v and score > gains.get(key, 0.0):
                gains[key] = score
                best["ngram"][key] = v
    if len(gains) < 2:   # one setting changed: that candidate was measured already
        return None
    return base.with_(**best)


# ---- measuring -----------------------------------------------------------------------------------

# on_run(round name, runs done, runs in the round, candidate (None: plain), its result)
OnRun = Callable[[str, int, int, "Candidate | None", "RepResult"], None]


@dataclass
class Plan:
    """How much to measure. quick: no fine round, fewer survivors, one confirming pass."""

    quick: bool = False
    reps: int = 2             # confirming passes
    margin: float = 0.05      # a candidate must beat plain by this much to be chosen
    keep: int = 3             # survivors of the coarse round refined in the fine round
    finalists: int = 3        # candidates confirmed
    chunk: int = 4            # candidates measured after each plain run


def round_size(n_cands: int, n_prompts: int, passes: int, chunk: int) -> int:
    """Runs one round makes: every candidate plus a plain run per chunk, per prompt and pass."""
    return passes * n_prompts * (n_cands + math.ceil(n_cands / chunk))


def measure(name: str, cands: Sequence[Candidate], runner: Runner, n_prompts: int, passes: int, chunk: int,
            rejected: dict[Candidate, str], on_run: OnRun | None = None) -> Round:
    """`passes` passes over the prompts: plain, then `chunk` candidates, ratios over that plain run."""
    cands = [c for c in dict.fromkeys(cands) if c not in rejected]
    rnd = Round(name, [Score(c) for c in cands])
    total, done = round_size(len(cands), n_prompts, passes, chunk), 0
    for _ in range(passes):
        for s in rnd.scores:
            s.ratios.append([])
        for i in range(n_prompts):
            for j in range(0, len(rnd.scores), chunk):
                plain = runner(None, i)
                rnd.plain_tps.append(plain.tps)
                done += 1
                if on_run:
                    on_run(name, done, total, None, plain)
                for s in rnd.scores[j:j + chunk]:
                    done += 1
                    if s.rejected is not None:   # cannot run with this pair (or differed): no more runs
                        continue
                    try:
                        r = runner(s.candidate, i).compare_to(plain)
                    except LlamaspecError as e:  # e.g. draft-eagle3 with a draft that is not an EAGLE-3 head
                        _unusable(rnd, s, e.message, rejected)
                        continue
                    s.accepted += r.accepted
                    s.drafted += r.drafted
                    if r.identical is False and s.rejected is None:
                        s.rejected = (f"greedy tokens differ from plain decoding on prompt {i + 1} "
                                      f"from token {r.first_difference}")
                        rejected[s.candidate] = s.rejected
                    s.ratios[-1].append(r.ratio or 0.0)
                    if on_run:
                        on_run(name, done, total, s.candidate, r)
    return rnd


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


def run_sweep(runner: Runner, n_prompts: int, has_draft: bool, has_mtp: bool, plan: Plan | None = None,
              on_run: OnRun | None = None, on_round: Callable[[str, int], None] | None = None) -> SweepResult:
    """The three rounds (see the module docstring); on_round(name, runs planned) before each."""
    plan = plan or Plan()
    rejected: dict[Candidate, str] = {}
    rounds: list[Round] = []
    keep, finalists = (min(plan.keep, 2), min(plan.finalists, 2)) if plan.quick else (plan.keep, plan.finalists)

    def do(name: str, cands: Sequence[Candidate], passes: int) -> Round:
        cands = [c for c in dict.fromkeys(cands) if c not in rejected]
        if on_round:
            on_round(name, round_size(len(cands), n_prompts, passes, plan.chunk))
        rnd = measure(name, cands, runner, n_prompts, passes, plan.chunk, rejected, on_run)
        rounds.append(rnd)
        return rnd

    coarse = do("coarse", coarse_candidates(has_draft, has_mtp), 1)
    leaders = [s.candidate for s in coarse.ranked()[:keep]]
    pool: dict[Candidate, Score] = {s.candidate: s for s in coarse.scores}
    if leaders and not plan.quick:
        fine = do("fine", [n for c in leaders for n in neighbours(c)], 1)
        pool.update({s.candidate: s for s in fine.scores})
        extra = [combine(c, list(pool.values())) for c in leaders]
        leaders = [s.candidate for s in sorted((s for s in pool.values() if s.eligible and s.rejected is None
                                                and s.candidate not in rejected),
                                               key=lambda s: -(s.score or 0.0))[:finalists]]
        leaders += [c for c in extra if c is not None and c not in leaders]
    else:
        leaders = leaders[:finalists]
    best = chosen = None
    plain_tok_s = statistics.median(coarse.plain_tps) if coarse.plain_tps else None
    if leaders:
        confirm = do("confirm", leaders, max(1, plan.reps))
        plain_tok_s = statistics.median(confirm.plain_tps) if confirm.plain_tps else plain_tok_s
        ranked = confirm.ranked()
        best = ranked[0] if ranked else None
        if best is not None and (best.score or 0.0) >= 1.0 + plan.margin:
            chosen = best
    all_rejected = {s.candidate: s for r in rounds for s in r.scores if s.rejected}
    return SweepResult(rounds, chosen, best, plan.margin, plain_tok_s, list(all_rejected.values()))
