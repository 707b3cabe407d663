"""The tuning sweep: which speculative settings decode a pair fastest here, against plain decoding.

Successive halving, every run measured beside plain decoding (measure.py: each candidate run
between two plain runs on its prompt, its ratio over the faster of them):

1. coarse: every spec type the pair allows, alone, at its defaults;
2. chains: the best `chain_ngram` n-gram types (quick: the best) chained with each model type
   that ran (a chain's n-gram half only helps where that n-gram type drafts well alone);
3. fine (skipped by `quick`): around the best few, one setting at a time: draft-max halved and
   doubled, p-min for drafting models, the n-gram match length halved and doubled; plus the best
   of each setting combined;
4. confirm: the best few again, `reps` passes (quick: one), scored on this round alone; then the
   spread check: the best one's passes in every round must agree within `spread`, else the
   finalists are measured again (up to `retries` passes) and, still disagreeing, nothing is
   chosen (`SweepResult.unstable` says why; the CLI stores nothing).

A candidate whose greedy tokens ever differ from plain decoding is rejected for good, unless
`judge` finds the flip at a near-tie of the target (flips.py: batch noise, kept); one that
never had a draft token accepted cannot win (its ratio is noise). Plain decoding ("none") is
chosen unless the best confirmed candidate beats it by `margin`. A score is the median over
passes of the geometric mean over the prompts of the generation tok/s ratio. Timing comes from
`runner`, so the search logic can be tested with made-up numbers. Nothing here imports llama_cpp.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from llamaspec.speculative.options import (
    MAX_DRAFT, SPEC_TYPES, NgramParams, loads_mtp_layers, needs_draft_model, order_by_priority,
)
from llamaspec.tune.measure import (  # noqa: F401 - Candidate, Score, Round, Tick are this module's API too
    Candidate, Judge, OnRun, Round, Runner, Score, Tick, agreeing, geomean, measure, measure_pass, pair_ratio,
    round_size,
)

if TYPE_CHECKING:
    from llamaspec.tune.store import TunedConfig

_NGRAM_FIELDS = set(NgramParams.__dataclass_fields__)


@dataclass
class SweepResult:
    rounds: list[Round]
    chosen: Score | None          # None: plain decoding (or nothing, when unstable)
    best: Score | None            # the best confirmed candidate, chosen or not
    margin: float
    plain_tok_s: float | None
    rejected: list[Score]
    unstable: str | None = None   # the passes disagreed even after measuring again: do not store

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
                "plain_tok_s": self.plain_tok_s, "unstable": self.unstable,
                "rounds": [r.to_dict() for r in self.rounds], "rejected": [s.to_dict() for s in self.rejected]}


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
    """Every applicable type alone at its defaults: model types, then n-gram types."""
    ngram, model = applicable_types(has_draft, has_mtp)
    return [Candidate(s) for s in model + ngram]


def chain_candidates(coarse: Round, n_best: int) -> list[Candidate]:
    """The best `n_best` n-gram types of the coarse round (eligible: tokens identical, drafts
    accepted) chained with each model type that could run."""
    models = [s.candidate.spec for s in coarse.scores if s.rejected is None
              and (needs_draft_model(s.candidate.spec) or loads_mtp_layers(s.candidate.spec))]
    ngrams = [s.candidate.spec for s in coarse.ranked()
              if not (needs_draft_model(s.candidate.spec) or loads_mtp_layers(s.candidate.spec))][:n_best]
    return [Candidate(",".join(order_by_priority([n, m]))) for m in models for n in ngrams]


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


# ---- the search ----------------------------------------------------------------------------------


@dataclass
class Plan:
    """How much to measure. quick: no fine round, fewer survivors, one confirming pass."""

    quick: bool = False
    reps: int | None = None   # confirming passes; None: 1 when quick, else 2
    margin: float = 0.05      # a candidate must beat plain by this much to be chosen
    keep: int = 3             # survivors of the coarse round refined in the fine round
    finalists: int = 3        # candidates confirmed
    chain_ngram: int = 2      # n-gram types chained with the model types (quick: 1)
    spread: float = 1.5       # the best candidate's passes must agree within this factor...
    retries: int = 2          # ...else the finalists are measured again, at most this many times

    @property
    def passes(self) -> int:
        return max(1, self.reps if self.reps is not None else 1 if self.quick else 2)


# on_round(name, runs planned in it, runs estimated for the rounds after it)
OnRound = Callable[[str, int, int], None]
# on_unsteady(one line): the best candidate's passes disagree, and what happens now
OnUnsteady = Callable[[str], None]


def _x(v: float) -> str:
    return f"{v:.2f}x"


def evidence(rounds: Sequence[Round], cand: Candidate) -> list[float]:
    """Every pass of `cand` in every round (its coarse pass included: a second opinion)."""
    return [v for r in rounds for s in r.scores if s.candidate == cand for v in s.passes]


def run_sweep(runner: Runner, n_prompts: int, has_draft: bool, has_mtp: bool, plan: Plan | None = None,
              on_run: OnRun | None = None, on_round: OnRound | None = None,
              on_unsteady: OnUnsteady | None = None, judge: Judge | None = None) -> SweepResult:
    """The rounds of the module docstring; on_round before each, on_run after every run; `judge`
    decides whether tokens that differ from plain decoding are a near-tie flip (None: never)."""
    plan = plan or Plan()
    rejected: dict[Candidate, str] = {}
    rounds: list[Round] = []
    keep, finalists = (min(plan.keep, 2), min(plan.finalists, 2)) if plan.quick else (plan.keep, plan.finalists)
    ngram_types, model_types = applicable_types(has_draft, has_mtp)
    # runs still to come after each round, estimated before they are planned (for the time left)
    confirm_runs = round_size(finalists, n_prompts, plan.passes)
    fine_runs = 0 if plan.quick else round_size(keep * 6, n_prompts, 1)
    chain_runs = round_size(len(model_types) * min(1 if plan.quick else plan.chain_ngram, len(ngram_types)),
                            n_prompts, 1)
    estimate = {"coarse": chain_runs + fine_runs + confirm_runs, "chains": fine_runs + confirm_runs,
                "fine": confirm_runs}

    def do(name: str, cands: Sequence[Candidate], passes: int) -> Round:
        cands = [c for c in dict.fromkeys(cands) if c not in rejected]
        if on_round:
            on_round(name, round_size(len(cands), n_prompts, passes), estimate.get(name, 0))
        rnd = measure(name, cands, runner, n_prompts, passes, rejected, on_run, judge)
        rounds.append(rnd)
        return rnd

    coarse = do("coarse", coarse_candidates(has_draft, has_mtp), 1)
    pool: dict[Candidate, Score] = {s.candidate: s for s in coarse.scores}
    chains = chain_candidates(coarse, 1 if plan.quick else plan.chain_ngram)   # quick: the best one
    if chains:
        pool.update({s.candidate: s for s in do("chains", chains, 1).scores})
    leaders = [s.candidate for s in _ranked(pool, rejected)[:keep]]
    if leaders and not plan.quick:
        fine = do("fine", [n for c in leaders for n in neighbours(c)], 1)
        pool.update({s.candidate: s for s in fine.scores})
        extra = [combine(c, list(pool.values())) for c in leaders]
        leaders = [s.candidate for s in _ranked(pool, rejected)[:finalists]]
        leaders += [c for c in extra if c is not None and c not in leaders]
    else:
        leaders = leaders[:finalists]
    best = chosen = None
    unstable = None
    plain_tok_s = statistics.median(coarse.plain_tps) if coarse.plain_tps else None
    if leaders:
        confirm = do("confirm", leaders, plan.passes)
        for attempt in range(plan.retries + 1):
            doubt = _spread_check(confirm, rounds, plan)
            ranked = confirm.ranked()
            best = ranked[0] if ranked else None
            if not doubt:
                break
            if attempt == plan.retries:
                unstable = doubt
                break
            if on_unsteady:
                on_unsteady(f"{doubt}: measuring the finalists again")
            live = sum(1 for s in confirm.scores if s.rejected is None)
            if on_round:
                on_round("confirm again", round_size(live, n_prompts, 1), 0)
            measure_pass(confirm, runner, n_prompts, rejected, on_run, judge=judge)
        plain_tok_s = statistics.median(confirm.plain_tps) if confirm.plain_tps else plain_tok_s
        if unstable is None and best is not None and (best.score or 0.0) >= 1.0 + plan.margin:
            chosen = best
    all_rejected = {s.candidate: s for r in rounds for s in r.scores if s.rejected}
    return SweepResult(rounds, chosen, best, plan.margin, plain_tok_s, list(all_rejected.values()), unstable)


def _spread_check(confirm: Round, rounds: Sequence[Round], plan: Plan) -> str | None:
    """Each finalist's passes (every round's) must agree within plan.spread, by a majority; its
    score then counts only the passes in the agreed range. Returns why the decision cannot be
    taken yet: a finalist whose passes disagree and reach the margin (it might be the winner)."""
    doubt = None
    for s in confirm.scores:
        if s.rejected is not None:
            continue
        seen = evidence(rounds, s.candidate)
        group = agreeing(seen, plan.spread)
        s.agreed = (min(group), max(group)) if group else None
        if group is None and seen and max(seen) >= 1.0 + plan.margin and doubt is None:
            doubt = (f"{s.candidate.label} measured {', '.join(_x(v) for v in seen)} in {len(seen)} passes, "
                     f"more than {plan.spread:g}x apart")
    return doubt


def _ranked(pool: dict[Candidate, Score], rejected: dict[Candidate, str]) -> list[Score]:
    return sorted((s for s in pool.values() if s.eligible and s.candidate not in rejected),
                  key=lambda s: -(s.score or 0.0))
