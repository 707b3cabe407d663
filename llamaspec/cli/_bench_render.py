"""What `bench` prints: the JSON object (`--json`, and the data of `--html`), the tables and the
terminal bar chart for humans, and the `-q` line. Built from bench/suite.py's SuiteResult."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from llamaspec.cli._charts import Bar, speedup_chart
from llamaspec.cli._output import escape

if TYPE_CHECKING:
    from llamaspec.bench import BenchResult, ModeSummary
    from llamaspec.bench.suite import PromptRun, SuiteResult


# ---- notes ----------------------------------------------------------------------------------------


def differ_note(s: "ModeSummary") -> str:
    return (f"{s.mode}: greedy tokens differ from plain decoding in {s.differing_reps} of {s.reps} rep(s) "
            f"(first at token {s.first_difference}); see docs/speculative-types.md on near-tie flips")


def native_differs(m: Any) -> str:
    """`differs from ours at token i (top-2 gap g)`: where a native row's greedy text left ours."""
    gap = getattr(m, "top2_gap", None)
    return (f"differs from ours at token {m.first_difference}" + (f" (top-2 gap {gap:.3g})" if gap is not None else ""))


def native_notes(m: "ModeSummary", n: int) -> list[str]:
    """A native row: another text (no ratio), an unchecked text, tokens decoded past -n."""
    notes = []
    if m.identical_to_plain is False:
        notes.append(f"{m.mode}: its greedy text {native_differs(m)} in {m.differing_reps} of {m.reps} rep(s): "
                     "another text, so no ratio is given (its tok/s measures that other text)")
    elif m.identical_to_plain is None:
        notes.append(f"{m.mode}: its text was not checked (its log has no per-token lines); "
                     "its tok/s counts every token it decoded")
    if m.n_decoded is not None and m.n_decoded > n:
        counted = f"the first {n}" if m.identical_to_plain is not None else f"all {m.n_decoded}"
        notes.append(f"{m.mode}: decoded up to {m.n_decoded} tokens for -n {n}; {counted} are counted")
    return notes


def mode_notes(result: "BenchResult") -> list[str]:
    """What a reader must know to read the ratios right: differences, and modes that never drafted."""
    notes = []
    for m in result.summaries:
        if m.native:
            notes += native_notes(m, result.settings.n)
            continue
        if m.mode == "plain":
            continue
        if m.identical_to_plain is False:
            notes.append(differ_note(m))
        if m.drafted == 0:
            from llamaspec.cli._report import PAUSED

            why = PAUSED if m.draft else "no drafts (nothing to draft from in this text)"   # a model always has a draft
            notes.append(f"{m.mode}: {why}; it did plain decoding's work, so its ratio is timing noise "
                         "around 1x, not a speedup")
        elif m.accepted == 0:
            notes.append(f"{m.mode}: no draft token was accepted; its ratio is the cost of drafting")
    return notes


def _run_tag(run: "PromptRun", suite: "SuiteResult") -> str:
    """Which run a note is about, when there are several: target and/or prompt."""
    parts = (([run.target.label] if len(suite.targets) > 1 else [])
             + ([run.prompt_id] if len(_prompt_ids(suite)) > 1 else []))
    return " / ".join(parts)


def _prompt_ids(suite: "SuiteResult") -> list[str]:
    return list(dict.fromkeys(r.prompt_id for r in suite.runs))


def all_notes(suite: "SuiteResult") -> list[str]:
    """Every run's notes, each once: `[story, code] ngram-mod: no drafts ...`."""
    tags: dict[str, list[str]] = {}
    for run in suite.runs:
        for n in mode_notes(run.result):
            tags.setdefault(n, []).append(_run_tag(run, suite))
    out = [f"[{', '.join(t for t in ts if t)}] {n}" if any(ts) else n for n, ts in tags.items()]
    return out + suite.notes


# ---- JSON -----------------------------------------------------------------------------------------


def _best(mode: Any) -> dict[str, Any]:
    return {"mode": mode.mode, "ratio_vs_plain": mode.ratio_vs_plain}


def run_dict(run: "PromptRun") -> dict[str, Any]:
    res = run.result
    checked = [m for m in res.summaries if m.identical_to_plain is not None and not m.native]   # ours
    return {"model": run.target.ref, "model_path": str(run.target.path), "prompt_id": run.prompt_id,
            "prompt": run.source, "chat": run.chat, "prompt_tokens": res.prompt_tokens,
            "results": [m.to_dict() for m in res.summaries], "best": _best(res.best),
            "all_identical": all(m.identical_to_plain for m in checked), "notes": mode_notes(res),
            "bound": res.bound.to_dict() if res.bound is not None else None}


def _overall_dict(row: Any) -> dict[str, Any]:
    d = row.to_dict()
    if _other_text(row):   # another text on some prompt: never a speedup
        d.update(ratio_vs_plain=None, ratios=[None] * len(d["ratios"]), measured_ratio_other_text=row.ratio_vs_plain)
    return d


def to_dict(suite: "SuiteResult", *, drafts: Sequence[tuple[str, Path]]) -> dict[str, Any]:
    """The `--json` object. With one target and one prompt it also carries that run's keys at the
    top (model, prompt, results, best, ...), as bench printed before sweeps existed."""
    s = suite.settings
    runs = [run_dict(r) for r in suite.runs]
    info: dict[str, Any] = {
        "n": s.n, "threads": s.threads, "ctx": s.ctx, "reps": suite.reps, "greedy": True,
        "adaptive": s.adaptive, "draft_max": s.draft_max,
        "targets": [{"model": t.ref, "model_path": str(t.path), "configs": [c.label for c in t.configs]}
                    for t in suite.targets],
        "drafts": [{"draft": ref, "draft_path": str(path)} for ref, path in drafts],
        "prompts": _prompt_ids(suite),
        "runs": runs,
        "overall": [{"model": t.ref, "model_path": str(t.path),
                     "results": [_overall_dict(row) for row in suite.overall(t)], "best": _best(suite.best(t))}
                    for t in suite.targets],
        "all_identical": all(r["all_identical"] for r in runs),
        "notes": all_notes(suite),
    }
    if len(runs) == 1:
        one = runs[0]
        info.update({"model": one["model"], "model_path": one["model_path"],
                     "draft": drafts[0][0] if len(drafts) == 1 else None,
                     "draft_path": str(drafts[0][1]) if len(drafts) == 1 else None,
                     "prompt": one["prompt"], "chat": one["chat"], "prompt_tokens": one["prompt_tokens"],
                     "results": one["results"], "best": one["best"], "bound": one["bound"]})
    return info


def quiet_line(suite: "SuiteResult") -> str:
    lines = []
    for t in suite.targets:
        best = suite.best(t)
        ratio = f"{best.ratio_vs_plain:.2f}x" if best.ratio_vs_plain is not None else "-"
        lines.append((f"{t.label}: " if len(suite.targets) > 1 else "") + f"{best.mode} {ratio}")
    return "\n".join(lines)


# ---- human ----------------------------------------------------------------------------------------


def _x(v: float | None) -> str:
    return f"{v:.2f}x" if v is not None else "-"


def _pct(v: float | None) -> str:
    return f"{100 * v:.0f}%" if v is not None else "-"


def _other_text(m: Any) -> bool:
    """A native row (or overall row) whose greedy text differed from ours: no speedup to report."""
    return bool(m.native and m.identical_to_plain is False)


def _ratio_cell(v: float | None, plain: bool, other_text: bool = False) -> str:
    if other_text:
        return "[red]other text[/red]"   # a native row that decoded another text: no speedup to report
    if plain or v is None:
        return _x(v)
    return f"[green]{_x(v)}[/green]" if v > 1 else f"[red]{_x(v)}[/red]"


def _table(title: str | None, caption: str, columns: Sequence[tuple[str, str, int | None]]):
    from rich.table import Table

    table = Table(title=title, caption=caption, caption_justify="left", box=None, pad_edge=False,
                  header_style="bold")
    # (header, justify, min width when folded); numbers never fold, and no column may vanish
    for col, justify, min_width in columns:
        table.add_column(col, justify=justify, no_wrap=min_width is None, overflow="fold", min_width=min_width)
    return table


def _ident(m: Any) -> str:
    if m.native:
        if m.identical_to_plain is None:
            return "unchecked"
        if m.identical_to_plain:
            return "[green]yes[/green]"
        return f"[bold red]NO[/bold red]: {escape(native_differs(m))}"
    if m.mode == "plain":
        return "ref"
    if m.identical_to_plain:
        return "[green]yes[/green]"
    return f"[bold red]NO[/bold red] ({m.differing_reps}/{m.reps} reps, from token {m.first_difference})"


def _mode_cells(m: "ModeSummary") -> list[str]:
    """accept, MAL, theory, of theory, bound, of bound."""
    plain = m.mode == "plain"
    has_drafts = not plain and not m.native and m.drafted > 0
    t = m.theory
    accept = "unknown" if m.acceptance is None else f"{100 * m.acceptance:.1f}%"   # native: its log may not say
    return [accept if not plain and (m.native or has_drafts) else "-",
            f"{m.mean_accepted_length:.2f}" if has_drafts and m.mean_accepted_length is not None else "-",
            _x(t.speedup) if t is not None else "-", _pct(t.of_theory) if t is not None else "-",
            _x(m.bound), _pct(m.of_bound)]


_THEORY_CAPTION = (" theory: the speedup this mode's own acceptance per position, draft cost and verify cost "
                   "predict (E tokens per step / step cost in plain decode steps); of theory: measured / theory."
                   " bound: what an oracle copy-drafter would reach on plain decoding's output with this "
                   "machine's measured verify costs; of bound: measured / bound.")


def _single_table(run: "PromptRun", suite: "SuiteResult"):
    result, s = run.result, suite.settings
    medians = "medians of" if result.reps > 1 else "a single measurement, no median:"
    table = _table(
        f"{escape(run.target.label)}, {escape(run.source)} ({result.prompt_tokens} tokens"
        f"{', chat template' if run.chat else ''}), n={s.n}, {s.threads} thread(s), greedy",
        f"{medians} {result.reps} rep(s). tok/s and ratio: generation only, over plain decoding "
        "in the same rep; e2e: wall time with prompt processing (target and draft)." + _THEORY_CAPTION
        + (" native rows: llama.cpp's llama-speculative-simple on our prompt tokens, its first -n tokens, ratios over"
           " llamaspec's plain decoding; its greedy text is compared with ours (NO: another text, no ratio)."
           if any(m.native for m in result.summaries) else ""),
        [("mode", "left", 12), ("tok/s", "right", None), ("ratio", "right", None), ("e2e", "right", None),
         ("accept", "right", None), ("MAL", "right", None), ("theory", "right", None),
         ("of theory", "right", None), ("bound", "right", None), ("of bound", "right", None),
         ("identical", "left", 9), ("ovh ms", "right", None), ("per-rep ratios", "left", 7)])
    best = result.best.mode
    for m in result.summaries:
        plain = m.mode == "plain"
        table.add_row(
            f"[bold]{escape(m.mode)}[/bold]" if m.mode == best and not plain else escape(m.mode),
            f"{m.tok_s:.1f}", _ratio_cell(m.ratio_vs_plain, plain, _other_text(m)), _x(m.e2e_ratio_vs_plain),
            *_mode_cells(m),
            _ident(m), f"{m.overhead_ms_per_step:.3f}" if m.overhead_ms_per_step is not None else "-",
            "-" if plain else " ".join(_x(r) for r in m.ratios))
    return table


def _prompts_table(suite: "SuiteResult"):
    several = len(suite.targets) > 1
    cols = ([("target", "left", 8)] if several else []) + [
        ("prompt", "left", 8), ("mode", "left", 12), ("tok/s", "right", None), ("ratio", "right", None),
        ("accept", "right", None), ("MAL", "right", None), ("theory", "right", None), ("of theory", "right", None),
        ("bound", "right", None), ("of bound", "right", None), ("identical", "left", 9)]
    medians = "medians of" if suite.reps > 1 else "a single measurement per prompt:"
    table = _table(f"per prompt: n={suite.settings.n}, {suite.settings.threads} thread(s), greedy",
                   f"{medians} {suite.reps} rep(s) per prompt; ratio over plain decoding of the same target "
                   "in the same rep." + _THEORY_CAPTION, cols)
    for run in suite.runs:
        best = run.result.best.mode
        for i, m in enumerate(run.result.summaries):
            plain = m.mode == "plain"
            head = ([escape(run.target.label) if i == 0 else ""] if several else []) + [
                escape(f"{run.prompt_id} ({run.result.prompt_tokens} tok)") if i == 0 else ""]
            table.add_row(*head, f"[bold]{escape(m.mode)}[/bold]" if m.mode == best and not plain else escape(m.mode),
                          f"{m.tok_s:.1f}", _ratio_cell(m.ratio_vs_plain, plain, _other_text(m)), *_mode_cells(m),
                          _ident(m))
    return table


def _overall_table(suite: "SuiteResult"):
    several = len(suite.targets) > 1
    n_prompts = len(_prompt_ids(suite))
    table = _table(f"overall: {n_prompts} prompt(s)",
                   "tok/s, ratio, theory, of theory, bound, of bound: geometric means over prompts; accept and "
                   "MAL: over all drafted tokens.",
                   ([("target", "left", 8)] if several else []) + [
                       ("mode", "left", 12), ("tok/s", "right", None), ("ratio", "right", None),
                       ("accept", "right", None), ("MAL", "right", None), ("theory", "right", None),
                       ("of theory", "right", None), ("bound", "right", None), ("of bound", "right", None),
                       ("identical", "left", 9), ("per-prompt ratios", "left", 7)])
    for t in suite.targets:
        best = suite.best(t).mode
        for i, r in enumerate(suite.overall(t)):
            plain = r.mode == "plain"
            if plain or (r.native and r.identical_to_plain is None):
                ident = "unchecked" if r.native else "ref"
            elif r.identical_to_plain:
                ident = "[green]yes[/green]"
            else:
                ident = f"[bold red]NO[/bold red] ({escape(', '.join(r.differing_prompts))})"
            has = not plain and r.drafted > 0
            table.add_row(*([escape(t.label) if i == 0 else ""] if several else []),
                          f"[bold]{escape(r.mode)}[/bold]" if r.mode == best and not plain else escape(r.mode),
                          f"{r.tok_s:.1f}", _ratio_cell(r.ratio_vs_plain, plain, _other_text(r)),
                          f"{100 * r.acceptance:.1f}%" if has else "-",
                          f"{r.mean_accepted_length:.2f}" if has and r.mean_accepted_length else "-",
                          _x(r.theory), _pct(r.of_theory), _x(r.bound), _pct(r.of_bound), ident,
                          "-" if plain else " ".join(_x(v) for v in r.ratios))
    return table


def bound_lines(suite: "SuiteResult") -> list[str]:
    """Per run: the copy-drafting bound, how it was reached, and the verify-cost curve it used."""
    lines = []
    for run in suite.runs:
        b = run.result.bound
        if b is None:
            continue
        tag = _run_tag(run, suite)
        curve = " ".join(f"{n}:{r:.2f}" for n, r in sorted(b.curve.items()) if n > 1)
        lines.append(escape(f"bound{f' [{tag}]' if tag else ''}: {b.speedup:.2f}x: an oracle copy-drafter "
                            f"(2-token match, at most 63 tokens, never wrong) writes plain decoding's {b.tokens} "
                            f"tokens in {b.steps} steps ({b.copied} copied); verify cost t(n)/t(1) at depth "
                            f"{b.depth}, measured: {curve}"
                            + (f" (t(1) = {b.t1_ms:.1f} ms)" if b.t1_ms is not None else "")))
    return lines


def chart(suite: "SuiteResult", width: int = 40):
    """Speedup bars: per prompt (when several), and per configuration over all prompts."""
    several_t = len(suite.targets) > 1
    groups = []
    if len(suite.runs) > 1:
        for run in suite.runs:
            title = " / ".join(([run.target.label] if several_t else []) + [run.prompt_id])
            groups.append((title, [Bar(m.mode, m.ratio_vs_plain, m.identical_to_plain)
                                   for m in run.result.summaries if m.mode != "plain"]))
    for t in suite.targets:
        rows = [r for r in suite.overall(t) if r.mode != "plain"]
        title = ("overall" + (f" {t.label}" if several_t else "")) if len(suite.runs) > 1 else None
        groups.append((title, [Bar(r.mode, None if _other_text(r) else r.ratio_vs_plain, r.identical_to_plain)
                               for r in rows]))
    return speedup_chart(groups, width)


def render(console, suite: "SuiteResult") -> None:
    if not console.is_terminal:
        # A pipe or file gets whole lines instead of a table folded to 80 columns (as `models`).
        from rich.console import Console

        console = Console(file=console.file, width=1000, highlight=False, color_system=None)
    single = len(suite.runs) == 1
    if single:
        console.print(_single_table(suite.runs[0], suite))
    else:
        console.print(_prompts_table(suite))
        console.print()
        console.print(_overall_table(suite))
    for line in bound_lines(suite):
        console.print(line)
    console.print()
    console.print("[bold]speedup over plain decoding[/bold] (1.0x where the grey part of a bar ends)")
    console.print(chart(suite))
    for note in all_notes(suite):
        console.print(f"note: {escape(note)}")
    for t in suite.targets:
        best = suite.best(t)
        where = f"{escape(t.label)}: " if len(suite.targets) > 1 else ""
        if best.mode == "plain":
            console.print(f"best: {where}plain decoding (no speculative mode measured faster with accepted "
                          "drafts and identical tokens)")
            continue
        how = (" (one repetition)" if suite.reps == 1 else f" (median of {suite.reps})") if single else \
            " (geometric mean over prompts)"
        console.print(f"best: {where}[bold]{escape(best.mode)}[/bold] {_x(best.ratio_vs_plain)} vs plain{how}"
                      ", tokens identical to plain decoding")
