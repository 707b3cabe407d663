"""A benchmark sweep: every target x (draft x mode) x prompt against plain decoding of the same target.

Each target is loaded once; for each prompt, `run_bench` runs `reps` repetitions of plain decoding
followed by every configuration (a mode with its draft model), so every ratio compares runs made
moments apart on the same loaded target. Per-prompt results are BenchResults; `overall` folds them
per (target, configuration): the geometric mean of the per-prompt median ratios (the mean of
ratios that does not depend on which side is the numerator), acceptance over all drafted tokens,
and the token check over all prompts (a configuration whose tokens differed on any prompt is never
best). Nothing here imports llama_cpp at module level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from llamaspec.errors import UsageError
from llamaspec.bench.runner import run_bench
from llamaspec.bench.prompts import SuitePrompt, format_prompt, preset_text
from llamaspec.bench.results import PLAIN, BenchResult, BenchSettings, Config, ModeSummary, best_mode

if TYPE_CHECKING:
    from llamaspec.runtime.llama import Model

DEFAULT_PRESET = "code"   # with the target's chat template; "code-raw" without one


def make_configs(modes: Sequence[str], drafts: Sequence[Path]) -> list[Config]:
    """Every mode, and every mode that needs a draft model once per draft. Labels are the mode
    alone with one draft; with several, `mode @ draft-file-name` (the path where names collide)."""
    from llamaspec.speculative.options import needs_draft_model

    names = [d.name for d in drafts]
    tags = [d.name if names.count(d.name) == 1 else str(d) for d in drafts]
    out: list[Config] = []
    for mode in modes:
        if not needs_draft_model(mode):
            out.append(Config(mode, mode, None))
            continue
        for d, tag in zip(drafts, tags):
            out.append(Config(mode if len(drafts) == 1 else f"{mode} @ {tag}", mode, d))
    return out


@dataclass
class Target:
    """A target to measure: the reference as given, its file, and its configurations."""

    ref: str
    path: Path
    configs: list[Config]

    @property
    def label(self) -> str:
        return self.path.name


@dataclass
class PromptRun:
    """One (target, prompt): its BenchResult (plain + every configuration, per rep and summarised)."""

    target: Target
    prompt_id: str
    source: str                 # where the text came from: "prompt", "file X", "preset code", "FILE#id"
    chat: bool
    result: BenchResult


@dataclass
class OverallRow:
    """One configuration of one target, over all prompts."""

    target: str                 # the target's file name
    mode: str                   # the configuration's label
    spec_type: str
    draft: str | None
    native: bool
    prompts: int
    tok_s: float                # geometric mean over prompts
    ratio_vs_plain: float | None
    drafted: int                # sums over prompts (of the per-prompt medians over repetitions)
    accepted: int
    drafts: int
    identical_to_plain: bool | None
    differing_prompts: list[str]
    theory: float | None        # geometric mean of the per-prompt theoretical speedups
    of_theory: float | None     # geometric mean of the per-prompt measured / theoretical
    bound: float | None = None  # geometric mean of the per-prompt copy-drafting bounds (bound.py)
    of_bound: float | None = None   # geometric mean of the per-prompt measured / bound
    ratios: list[float | None] = field(default_factory=list)   # per prompt, in prompt order
    accepted_per_position: list[int] = field(default_factory=list)   # sums over prompts and repetitions
    position_drafts: int = 0                                         # drafts over prompts and repetitions

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float | None:
        return 1.0 + self.accepted / self.drafts if self.drafts else None

    @property
    def per_position_acceptance(self) -> list[float]:
        n = self.position_drafts
        return [a / n for a in self.accepted_per_position] if n else []

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "mode": self.mode, "spec_type": self.spec_type, "draft": self.draft,
                "native": self.native, "prompts": self.prompts, "tok_s": self.tok_s,
                "ratio_vs_plain": self.ratio_vs_plain, "ratios": self.ratios, "acceptance": self.acceptance,
                "mean_accepted_length": self.mean_accepted_length, "drafted": self.drafted,
                "accepted": self.accepted, "identical_to_plain": self.identical_to_plain,
                "differing_prompts": self.differing_prompts, "theory": self.theory,
                "of_theory": self.of_theory, "bound": self.bound, "of_bound": self.of_bound,
                "per_position_acceptance": self.per_position_acceptance}


@dataclass
class SuiteResult:
    targets: list[Target]
    runs: list[PromptRun]
    settings: BenchSettings
    reps: int
    notes: list[str] = field(default_factory=list)

    def runs_of(self, target: Target) -> list[PromptRun]:
        return [r for r in self.runs if r.target is target]

    def overall(self, target: Target) -> list[OverallRow]:
        return overall_rows(target.label, [(r.prompt_id, r.result.summaries) for r in self.runs_of(target)])

    def best(self, target: Target) -> OverallRow:
        return best_overall(self.overall(target))


def geometric_mean(values: Sequence[float | None]) -> float | None:
    """Of the positive values (None when there is none)."""
    vs = [v for v in values if v is not None and v > 0]
    return math.exp(sum(math.log(v) for v in vs) / len(vs)) if vs else None


def overall_rows(target: str, per_prompt: Sequence[tuple[str, Sequence[ModeSummary]]]) -> list[OverallRow]:
    """Fold per-prompt summaries (prompt id, summaries) into one row per configuration label, in
    the order the labels first appear."""
    by_label: dict[str, list[tuple[str, ModeSummary]]] = {}
    for pid, summaries in per_prompt:
        for s in summaries:
            by_label.setdefault(s.mode, []).append((pid, s))
    rows = []
    for label, items in by_label.items():
        ss = [s for _, s in items]
        first = ss[0]
        checked = [(pid, s) for pid, s in items if s.identical_to_plain is not None]
        differing = [pid for pid, s in checked if s.identical_to_plain is False]
        apos: list[int] = []
        for s in ss:
            apos += [0] * (len(s.accepted_per_position) - len(apos))
            for i, a in enumerate(s.accepted_per_position):
                apos[i] += a
        ptotal = sum(s.drafted_per_position[0] for s in ss if s.drafted_per_position)
        rows.append(OverallRow(
            target=target, mode=label, spec_type=first.spec_type, draft=first.draft, native=first.native,
            prompts=len(ss), tok_s=geometric_mean([s.tok_s for s in ss]) or 0.0,
            ratio_vs_plain=geometric_mean([s.ratio_vs_plain for s in ss]),
            drafted=sum(s.drafted for s in ss), accepted=sum(s.accepted for s in ss),
            drafts=sum(s.drafts for s in ss), position_drafts=ptotal,
            identical_to_plain=(not differing) if checked else None, differing_prompts=differing,
            theory=geometric_mean([s.theory.speedup if s.theory else None for s in ss]),
            of_theory=geometric_mean([s.theory.of_theory if s.theory else None for s in ss]),
            bound=geometric_mean([s.bound for s in ss]), of_bound=geometric_mean([s.of_bound for s in ss]),
            ratios=[s.ratio_vs_plain for s in ss], accepted_per_position=apos))
    return rows


def best_overall(rows: Sequence[OverallRow]) -> OverallRow:
    """As best_mode, over all prompts: the fastest configuration whose tokens matched plain on every
    prompt and repetition and that had draft tokens accepted; plain when nothing beat it."""
    return best_mode(rows)


def _prepare(model: "Model", prompts: Sequence[SuitePrompt], chat: bool | None, settings: BenchSettings,
             several: bool) -> list[tuple[SuitePrompt, str, str, list[int], bool]]:
    """(prompt, source, formatted text, tokens, chat used) for each prompt, checked against the context."""
    out = []
    for p in prompts:
        text, source = p.text, p.id
        if text is None:
            use_chat = chat if chat is not None else model.chat_template is not None
            name = DEFAULT_PRESET if use_chat else "code-raw"
            text, source = preset_text(name), f"preset {name}"
        where = f"prompt {p.id!r}: " if several else ""
        if not text.strip():
            raise UsageError(f"{where}the prompt is empty", "give text with -p, -f or --prompt-preset")
        formatted, tokens, used_chat = format_prompt(model, text, chat)
        n_ctx = settings.ctx or model.n_ctx_train
        if len(tokens) + settings.n > n_ctx:
            raise UsageError(f"{where}prompt ({len(tokens)} tokens) + -n {settings.n} exceeds the context "
                             f"({n_ctx})", "raise -c/--ctx-size or lower -n")
        out.append((p, source, formatted, tokens, used_chat))
    return out


def run_suite(targets: Sequence[Target], prompts: Sequence[SuitePrompt], settings: BenchSettings, reps: int = 3,
              *, chat: bool | None = None, amx: bool | None = None, native: Path | None = None,
              on_run: Callable[[Target, str, int, Any], None] | None = None,
              on_prompt: Callable[[Target, str, int, bool], None] | None = None,
              bound: bool = True) -> SuiteResult:
    """Every target (loaded once) x prompt x configuration against plain decoding.

    `on_prompt(target, source, prompt tokens, chat used)` before a prompt's runs; `on_run(target,
    prompt id, rep, RepResult)` after each run. Prompts are tokenized and checked against the
    context before a target's first run, so a prompt that does not fit fails before any timing.
    With `bound`, after a prompt's runs the target's verify-cost curve is measured at the prompt's
    depth and the copy-drafting bound of plain decoding's output attached (bound.py)."""
    from llamaspec.runtime.devices import plan_offload
    from llamaspec.runtime.llama import Model
    from llamaspec.speculative.options import loads_mtp_layers

    result = SuiteResult(list(targets), [], settings, reps)
    for t in targets:
        mtp = any(loads_mtp_layers(c.spec) for c in t.configs)
        # GPU offload as `run` does it (auto: what fits); each mode's draft is placed beside it
        ngl = plan_offload(t.path, None, n_gpu_layers=None, n_gpu_layers_draft=None, n_ctx=settings.ctx,
                           default_ctx=settings.ctx, load_mtp=mtp).n_gpu_layers
        model = Model(t.path, n_gpu_layers=ngl, load_mtp=mtp, amx=amx)
        try:
            prepared = _prepare(model, prompts, chat, settings, len(prompts) > 1)
            for i, (p, source, formatted, tokens, used_chat) in enumerate(prepared):
                if on_prompt:
                    on_prompt(t, source, len(tokens), used_chat)
                report = (lambda rep, r, t=t, pid=p.id: on_run(t, pid, rep, r)) if on_run else None
                # one warm-up per target: it pages the weights in; later prompts find them resident
                res = run_bench(model, tokens, t.configs, replace(settings), reps, native=native,
                                formatted_prompt=formatted, on_run=report, warmup=i == 0)
                if bound:
                    from llamaspec.bench.bound import bound_for

                    res.set_bound(bound_for(model, tokens, res.runs[PLAIN][0].tokens or [],
                                            threads=settings.threads))
                result.runs.append(PromptRun(t, p.id, source, used_chat, res))
                result.notes += [n for n in res.notes if n not in result.notes]
        finally:
            model.close()
    return result
