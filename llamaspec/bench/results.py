"""The data of a benchmark: settings, one run's result, per-mode summaries (medians over
repetitions, the token check), and the choice of the best mode. Pure Python; no llama_cpp.

Used by bench/runner.py (the runner), bench/suite.py (targets x drafts x prompts) and cli/bench.py.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from llamaspec.bench import theory as bench_theory

if TYPE_CHECKING:
    from llamaspec.bench.bound import Bound
    from llamaspec.speculative.options import NgramParams

PLAIN = "plain"
NATIVE_PREFIX = "native "


# ---- settings and results -----------------------------------------------------------------------


@dataclass
class BenchSettings:
    """What every run of a benchmark shares. Decoding is always greedy."""

    n: int = 256                        # tokens to generate per run
    threads: int | None = None          # None: all cores
    ctx: int = 4096
    draft_path: Path | None = None      # for modes that need a draft model
    draft_max: int | None = None        # None: the pipeline's default for the mode
    draft_p_min: float = 0.0
    adaptive: bool = True               # False: always draft draft_max tokens
    native_draft_max: int = 4           # llama-speculative-simple's --spec-draft-n-max (draft modes)
    ngram: "NgramParams | None" = None  # None: the pipeline's defaults; native runs get the same values


@dataclass(frozen=True)
class Config:
    """One thing to measure against plain decoding: a mode (canonical spec types, a comma list) with
    the draft model it uses (None for modes without one). `label` is unique within a benchmark."""

    label: str
    spec: str
    draft_path: Path | None = None
    # BenchSettings fields this configuration sets for itself (a stored `tune` result: draft_max,
    # draft_p_min, ngram); the benchmark's own settings otherwise
    overrides: tuple[tuple[str, Any], ...] = ()

    @property
    def draft(self) -> str | None:
        return self.draft_path.name if self.draft_path is not None else None


def as_config(mode: "str | Config", settings: "BenchSettings") -> Config:
    """A mode name as a Config: the label is the mode, the draft settings.draft_path when it needs one."""
    if isinstance(mode, Config):
        return mode
    from llamaspec.speculative.options import needs_draft_model

    return Config(mode, mode, settings.draft_path if needs_draft_model(mode) else None)


@dataclass
class RepResult:
    """One repetition of one mode. Ratios are against plain decoding of the same repetition."""

    mode: str
    n: int                              # tokens generated
    tps: float                          # generation tokens/s (prompt excluded)
    e2e_s: float                        # prompt processing (target and draft) + generation, seconds
    acceptance: float | None = 0.0   # None: not measured (a native log without its accept line)
    drafted: int = 0
    accepted: int = 0
    drafts: int = 0
    steps: int = 0
    mean_accepted_length: float | None = None
    overhead_ms: float | None = None    # Python time per step outside llama_decode
    tokens: list[int] | None = None     # None for native runs (their text is checked as pieces: native.py)
    native: bool = False
    n_decoded: int | None = None        # native: every token it decoded (past -n too); `n` counts the first -n
    top2_gap: float | None = None       # native, text differs: the target's top-2 logit gap there, on our side
    ratio: float | None = None
    e2e_ratio: float | None = None
    identical: bool | None = None       # None: plain itself, or a native run whose text was not checked
    first_difference: int | None = None
    spec: str = ""                      # canonical spec types ("none" for plain)
    draft: str | None = None            # the draft model's file name
    gen_seconds: float = 0.0            # generation wall time (prompt excluded)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    theory: "bench_theory.Theory | None" = None

    @property
    def e2e_tps(self) -> float:
        """Generated tokens per second of wall time, prompt processing included."""
        return self.n / self.e2e_s if self.e2e_s > 0 else 0.0

    def compare_to(self, plain: "RepResult") -> "RepResult":
        """Fill ratios (and the token check, for llamaspec runs) against plain of the same rep."""
        self.ratio = self.tps / plain.tps if plain.tps > 0 else None
        self.e2e_ratio = self.e2e_tps / plain.e2e_tps if plain.e2e_tps > 0 else None
        if self.tokens is not None and plain.tokens is not None:
            self.first_difference = first_difference(plain.tokens, self.tokens)
            self.identical = self.first_difference is None
        if not self.native and plain.steps:
            self.theory = bench_theory.for_run(
                steps=self.steps, drafted=self.drafted, accepted=self.accepted,
                drafted_per_position=self.drafted_per_position, accepted_per_position=self.accepted_per_position,
                draft_seconds=self.draft_seconds, verify_seconds=self.verify_seconds,
                plain_step_seconds=plain.gen_seconds / plain.steps,
                plain_verify_seconds=plain.verify_seconds / plain.steps)
            if self.theory is not None and self.ratio is not None and self.theory.speedup > 0:
                self.theory.of_theory = self.ratio / self.theory.speedup
        return self


@dataclass
class ModeSummary:
    """Medians over repetitions of one mode."""

    mode: str
    native: bool
    reps: int
    tok_s: float
    ratio_vs_plain: float | None
    ratios: list[float | None]
    e2e_ratio_vs_plain: float | None
    acceptance: float | None            # None: not measured (a native log without its accept line)
    mean_accepted_length: float | None
    drafted: int                        # median over reps
    accepted: int                       # median over reps
    identical_to_plain: bool | None     # None: plain itself, or a native row whose text was not checked
    first_difference: int | None        # first differing token index, in the first rep that differed
    differing_reps: int
    overhead_ms_per_step: float | None
    n_generated: int
    spec_type: str = ""
    draft: str | None = None
    drafts: int = 0                     # median over reps: verify steps with a draft
    theory: "bench_theory.Theory | None" = None       # medians over reps
    drafted_per_position: list[int] = field(default_factory=list)   # summed over reps
    accepted_per_position: list[int] = field(default_factory=list)
    bound: float | None = None          # the prompt's copy-drafting bound on this machine (bound.py)
    of_bound: float | None = None       # ratio_vs_plain / bound (None for plain)
    n_decoded: int | None = None        # native: the most tokens a rep decoded (it runs past -n)
    top2_gap: float | None = None       # native, text differs: our target's top-2 gap where (first rep)
    measured_ratio: float | None = None  # native, text differs: the ratio it would have had (another text)

    @property
    def per_position_acceptance(self) -> list[float]:
        """llama.cpp's 'acc rate/pos' over all reps: drafts whose token i was accepted / drafts."""
        n = self.drafted_per_position[0] if self.drafted_per_position else 0
        return [a / n for a in self.accepted_per_position] if n else []

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "spec_type": self.spec_type,
            "draft": self.draft,
            "native": self.native,
            "reps": self.reps,
            "tok_s": self.tok_s,
            "ratio_vs_plain": self.ratio_vs_plain,
            "ratios": self.ratios,
            "e2e_ratio_vs_plain": self.e2e_ratio_vs_plain,
            "acceptance": self.acceptance,
            "mean_accepted_length": self.mean_accepted_length,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "drafts": self.drafts,
            "identical_to_plain": self.identical_to_plain,
            "first_difference": self.first_difference,
            "differing_reps": self.differing_reps,
            "overhead_ms_per_step": self.overhead_ms_per_step,
            "n_generated": self.n_generated,
            "theory": self.theory.to_dict() if self.theory is not None else None,
            "per_position_acceptance": self.per_position_acceptance,
            "drafted_per_position": self.drafted_per_position,
            "accepted_per_position": self.accepted_per_position,
            "bound": self.bound,
            "of_bound": self.of_bound,
            "n_decoded": self.n_decoded,
            "top2_gap": self.top2_gap,
            "measured_ratio_other_text": self.measured_ratio,
        }


@dataclass
class BenchResult:
    prompt_tokens: int
    reps: int
    settings: BenchSettings
    runs: dict[str, list[RepResult]]    # config label -> one result per repetition (plain first)
    summaries: list[ModeSummary]
    notes: list[str] = field(default_factory=list)
    bound: "Bound | None" = None        # the copy-drafting bound of plain decoding's output

    def set_bound(self, bound: "Bound") -> None:
        """Attach the prompt's bound: every row gets it, every speculative row its fraction."""
        self.bound = bound
        for s in self.summaries:
            s.bound = bound.speedup
            s.of_bound = (s.ratio_vs_plain / bound.speedup
                          if s.mode != PLAIN and s.ratio_vs_plain is not None and bound.speedup > 0 else None)

    @property
    def best(self) -> ModeSummary:
        return best_mode(self.summaries)

    @property
    def differing(self) -> list[ModeSummary]:
        return [s for s in self.summaries if s.identical_to_plain is False]


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token (or where the shorter one ends); None if identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# ---- the loop and its summary ---------------------------------------------------------------------


def _median(values: Sequence[float | None]) -> float | None:
    vs = [v for v in values if v is not None]
    return statistics.median(vs) if vs else None


def _sum_lists(lists) -> list[int]:
    out: list[int] = []
    for xs in lists:
        out += [0] * (len(xs) - len(out))
        for i, x in enumerate(xs):
            out[i] += x
    return out


def summarise(runs: dict[str, list[RepResult]]) -> list[ModeSummary]:
    """Per mode: medians of per-repetition values; the token check over all repetitions."""
    out = []
    for mode, rs in runs.items():
        if not rs:
            continue
        is_native = rs[0].native
        checked = [r for r in rs if r.identical is not None]
        differing = [r for r in checked if not r.identical]
        ours_spec = mode != PLAIN and not is_native
        # a native row whose greedy text differs from ours decoded another text: never a speedup
        other_text = is_native and bool(differing)
        ratio = _median([r.ratio for r in rs])
        out.append(ModeSummary(
            mode=mode,
            native=is_native,
            reps=len(rs),
            tok_s=statistics.median(r.tps for r in rs),
            ratio_vs_plain=None if other_text else ratio,
            ratios=[round(r.ratio, 3) if r.ratio is not None and not other_text else None for r in rs],
            e2e_ratio_vs_plain=None if other_text else _median([r.e2e_ratio for r in rs]),
            acceptance=None if any(r.acceptance is None for r in rs) else statistics.median(r.acceptance for r in rs),
            mean_accepted_length=_median([r.mean_accepted_length for r in rs]),
            drafted=int(statistics.median(r.drafted for r in rs)),
            accepted=int(statistics.median(r.accepted for r in rs)),
            identical_to_plain=(not differing) if (ours_spec or is_native) and checked else None,
            first_difference=differing[0].first_difference if differing else None,
            differing_reps=len(differing),
            overhead_ms_per_step=_median([r.overhead_ms for r in rs]),
            n_generated=rs[0].n,
            spec_type=rs[0].spec,
            draft=rs[0].draft,
            drafts=int(statistics.median(r.drafts for r in rs)),
            theory=bench_theory.median_theory([r.theory for r in rs]),
            drafted_per_position=_sum_lists(r.drafted_per_position for r in rs),
            accepted_per_position=_sum_lists(r.accepted_per_position for r in rs),
            n_decoded=max((r.n_decoded for r in rs if r.n_decoded is not None), default=None),
            top2_gap=differing[0].top2_gap if differing else None,
            measured_ratio=ratio if other_text else None,
        ))
    return out


def best_mode(summaries: Sequence[ModeSummary]) -> ModeSummary:
    """The fastest of plain and llamaspec's modes whose tokens matched plain in every repetition
    and that had draft tokens accepted (without any, a mode does plain decoding's work plus its own,
    so a ratio above 1 is timing noise). Native rows are a comparison, not a choice. Plain wins
    ties and when nothing measured faster. Also serves the suite's overall rows (suite.py),
    which carry the same fields."""
    plain = next(s for s in summaries if s.mode == PLAIN)
    best = plain
    for s in summaries:
        if (s.native or s.mode == PLAIN or s.identical_to_plain is not True or s.ratio_vs_plain is None
                or s.accepted <= 0):
            continue
        if s.ratio_vs_plain > (best.ratio_vs_plain or 1.0):
            best = s
    return best
