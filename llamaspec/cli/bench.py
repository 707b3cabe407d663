"""`llamaspec bench`: plain vs speculative decoding side by side, as measured ratios.

The measuring lives in llamaspec/bench.py (shared with scripts/bench_engine.py); this module reads
flags, resolves models, prints. Nothing here imports llama_cpp at module level.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from llamaspec.cli._options import (
    CTX_SIZE_CHECK, AmxOpt, ChatOpt, DraftMaxMeasuredOpt, DraftPMinOpt, FileOpt, FixedDraftOpt, ForceDraftOpt,
    OfflineOpt, PromptOpt, ThreadsOpt, at_least, ngram_flags, output_flags, read_prompt_file,
)
from llamaspec.cli._output import Output, escape
from llamaspec.cli.app import app
from llamaspec.errors import UsageError

if TYPE_CHECKING:
    from llamaspec.spec.bench import BenchResult, ModeSummary
    from llamaspec.spec.options import NgramParams

_DEFAULT_PRESET = "code"   # of llamaspec.spec.bench.PROMPT_PRESETS; "code-raw" without a chat template

_SPEC_HELP = ("A speculative mode to measure; repeat for several (each is run against plain decoding). "
              "A comma list is one chained mode (draft,ngram-simple). Names: draft, ngram-simple, "
              "ngram-mod, mtp (or llama.cpp's draft-simple, draft-mtp). Default: ngram-simple and "
              "ngram-mod, plus draft when --draft is given.")


@app.command()
@output_flags
@ngram_flags
def bench(
    model: Annotated[str, typer.Argument(help="Target GGUF: a path or Hub reference (org/repo:QUANT).")],
    draft: Annotated[Optional[str], typer.Option(
        "--draft", "-md", "--model-draft", help="Draft model for the draft mode: a GGUF path or Hub ref.")] = None,
    spec_type: Annotated[Optional[list[str]], typer.Option("--spec-type", help=_SPEC_HELP)] = None,
    prompt: PromptOpt = None,
    file: FileOpt = None,
    preset: Annotated[Optional[str], typer.Option(
        "--prompt-preset",
        help="A bundled prompt: code (rewrite a Python module; the default), code-raw (the same "
             "without a chat template), story.")] = None,
    n_predict: Annotated[int, typer.Option(
        "-n", "--n-predict", help="Tokens to generate per run.", callback=at_least("-n", 1))] = 256,
    reps: Annotated[int, typer.Option(
        "--reps", help="Repetitions; results are medians over them.", callback=at_least("--reps", 1))] = 3,
    threads: ThreadsOpt = None,
    ctx_size: Annotated[int, typer.Option("-c", "--ctx-size", help="Context size in tokens.",
                                          callback=CTX_SIZE_CHECK)] = 4096,
    draft_max: DraftMaxMeasuredOpt = None,
    draft_p_min: DraftPMinOpt = 0.0,
    fixed_k: FixedDraftOpt = False,
    chat: ChatOpt = None,
    native: Annotated[Optional[Path], typer.Option(
        "--native", metavar="BIN_DIR",
        help="Also run llama.cpp's llama-speculative-simple from BIN_DIR on the same prompt.")] = None,
    native_draft_max: Annotated[int, typer.Option(
        "--native-draft-max", help="--spec-draft-n-max for native draft modes.",
        callback=at_least("--native-draft-max", 1))] = 4,
    offline: OfflineOpt = False,
    force_draft: ForceDraftOpt = False,
    amx: AmxOpt = None,
    *,
    ngram: NgramParams,
    out: Output,
) -> None:
    """Measure plain vs speculative decoding (greedy) in one process: tok/s ratios, acceptance,
    and a token-for-token check against plain decoding."""
    at_least("-t/--threads", 1)(threads)  # (run reads -t 0 as all cores)
    text, source = _prompt(prompt, file, preset)
    if native is not None:
        from llamaspec.spec.bench import native_exe

        if native_exe(native) is None:
            raise UsageError(f"--native: no executable llama-speculative-simple in {native}",
                             "build it in llama.cpp: cmake -B build && cmake --build build "
                             "--target llama-speculative-simple; pass build/bin")

    from llamaspec import hub
    from llamaspec.spec.bench import BenchSettings, format_prompt, preset_text, run_bench
    from llamaspec.runtime.llama import Model, default_threads, set_llama_log
    from llamaspec.spec.options import loads_mtp_layers, needs_draft_model

    modes = _modes(spec_type, draft)       # flags first: no download before a usage error
    set_llama_log(out.verbose)
    target_path = hub.resolve_model(model, offline=offline)
    draft_path = None
    if draft is not None:
        from llamaspec.pairing.autodraft import check_explicit_draft

        draft_path = hub.resolve_model(draft, offline=offline)
        check_explicit_draft(str(target_path), str(draft_path), force_draft, offline=offline)
        if not any(needs_draft_model(m) for m in modes):
            out.warn("--draft is given but no mode uses it; add --spec-type draft")

    out.detail(f"loading {target_path}")
    from llamaspec.runtime.info import buffer_decision

    out.detail(buffer_decision(amx).reason)
    # The draft model (draft mode) follows the target's AMX choice (drafters/factory.py).
    target = Model(target_path, load_mtp=any(loads_mtp_layers(m) for m in modes), amx=amx)
    try:
        if text is None:  # the default preset: its completion form when no chat template is used
            use_chat = chat if chat is not None else target.chat_template is not None
            source = _DEFAULT_PRESET if use_chat else "code-raw"
            text = preset_text(source)
            source = f"preset {source}"
        if not text.strip():
            raise UsageError("the prompt is empty", "give text with -p, -f or --prompt-preset")
        formatted, tokens, used_chat = format_prompt(target, text, chat)
        n_ctx = ctx_size or target.n_ctx_train
        if len(tokens) + n_predict > n_ctx:
            raise UsageError(f"prompt ({len(tokens)} tokens) + -n {n_predict} exceeds the context ({n_ctx})",
                             "raise -c/--ctx-size or lower -n")
        settings = BenchSettings(n=n_predict, threads=threads or default_threads(), ctx=ctx_size,
                                 draft_path=draft_path, draft_max=draft_max, draft_p_min=draft_p_min,
                                 adaptive=not fixed_k, native_draft_max=native_draft_max,
                                 ngram=ngram)
        out.info(f"{escape(source)}: {len(tokens)} tokens{' (chat template)' if used_chat else ''}; "
                 f"modes: plain, {', '.join(modes)}; {reps} rep(s) of {n_predict} tokens, "
                 f"{settings.threads} thread(s), greedy")

        def progress(rep: int, r) -> None:
            line = f"rep {rep}/{reps} {r.mode}: {r.tps:.1f} tok/s"
            if r.mode != "plain" and r.ratio is not None:
                line += f" ({r.ratio:.2f}x)"
            if r.identical is False:
                line += f" [red]tokens differ from plain at token {r.first_difference}[/red]"
            out.info(line)

        result = run_bench(target, tokens, modes, settings, reps, native=native,
                           formatted_prompt=formatted, on_run=progress)
    finally:
        target.close()

    for note in result.notes:
        out.warn(note)
    for s in result.differing:
        out.warn(_differ_note(s))
    info = _to_dict(result, model=model, target_path=target_path, draft=draft, draft_path=draft_path,
                    source=source, chat=used_chat)
    best = result.best
    out.data(info, human=lambda console: _render(console, result, info),
             quiet=f"{best.mode} {best.ratio_vs_plain:.2f}x")


# ---- flags ----------------------------------------------------------------------------------------


def _prompt(prompt: str | None, file: Path | None, preset: str | None) -> tuple[str | None, str]:
    """(text, where it came from); text None means the default preset (chosen once the model is loaded)."""
    given = [name for name, v in (("-p", prompt), ("-f", file), ("--prompt-preset", preset)) if v is not None]
    if len(given) > 1:
        raise UsageError(f"give one prompt source, not {' and '.join(given)}")
    if prompt is not None:
        return prompt, "prompt"
    if file is not None:
        return read_prompt_file(file), f"file {file}"
    if preset is not None:
        from llamaspec.spec.bench import PROMPT_PRESETS, preset_text

        if preset not in PROMPT_PRESETS:
            raise UsageError(f"unknown --prompt-preset {preset!r}", f"one of: {', '.join(PROMPT_PRESETS)}")
        return preset_text(preset), f"preset {preset}"
    return None, f"preset {_DEFAULT_PRESET}"


def _modes(spec_type: list[str] | None, draft: str | None) -> list[str]:
    """--spec-type values -> canonical mode labels (each a priority-ordered comma list), deduplicated."""
    from llamaspec.spec.options import default_bench_modes, needs_draft_model, parse_spec_types

    if draft is not None and draft.lower() in ("auto", "none"):
        raise UsageError(f"bench takes a draft path or Hub ref, not --draft {draft}",
                         "`llamaspec run --draft auto -v` shows which draft auto picks")
    given = spec_type or default_bench_modes(with_draft_model=draft is not None)
    modes: list[str] = []
    for value in given:
        label = ",".join(parse_spec_types(value))
        if not label:
            continue  # "none": plain decoding runs in every repetition anyway
        if label not in modes:
            modes.append(label)
    if not modes:
        raise UsageError("no speculative mode to measure", "e.g. --spec-type ngram-simple --spec-type ngram-mod")
    if draft is None and any(needs_draft_model(m) for m in modes):
        raise UsageError("--spec-type draft needs a draft model", "add --draft PATH")
    return modes


# ---- output ---------------------------------------------------------------------------------------


def _differ_note(s: "ModeSummary") -> str:
    return (f"{s.mode}: greedy tokens differ from plain decoding in {s.differing_reps} of {s.reps} rep(s) "
            f"(first at token {s.first_difference}); see the README on near-tie flips")


def _mode_notes(result: "BenchResult") -> list[str]:
    """What a reader must know to read the ratios right: differences, and modes that never drafted."""
    notes = []
    for m in result.summaries:
        if m.mode == "plain" or m.native:
            continue
        if m.identical_to_plain is False:
            notes.append(_differ_note(m))
        if m.drafted == 0:
            notes.append(f"{m.mode}: no drafts (nothing to draft from in this text); it did plain "
                         "decoding's work, so its ratio is timing noise around 1x, not a speedup")
        elif m.accepted == 0:
            notes.append(f"{m.mode}: no draft token was accepted; its ratio is the cost of drafting")
    return notes



def _to_dict(result: "BenchResult", *, model: str, target_path: Path, draft: str | None,
             draft_path: Path | None, source: str, chat: bool) -> dict[str, Any]:
    s, best = result.settings, result.best
    checked = [m for m in result.summaries if m.identical_to_plain is not None]
    return {
        "model": model,
        "model_path": str(target_path),
        "draft": draft,
        "draft_path": str(draft_path) if draft_path else None,
        "prompt": source,
        "chat": chat,
        "prompt_tokens": result.prompt_tokens,
        "n": s.n,
        "threads": s.threads,
        "ctx": s.ctx,
        "reps": result.reps,
        "greedy": True,
        "adaptive": s.adaptive,
        "draft_max": s.draft_max,
        "results": [m.to_dict() for m in result.summaries],
        "best": {"mode": best.mode, "ratio_vs_plain": best.ratio_vs_plain},
        "all_identical": all(m.identical_to_plain for m in checked),
        "notes": _mode_notes(result) + result.notes,
    }


def _x(v: float | None) -> str:
    return f"{v:.2f}x" if v is not None else "-"


def _render(console, result: "BenchResult", info: dict[str, Any]) -> None:
    from rich.table import Table

    s = result.settings
    medians = "medians of" if result.reps > 1 else "a single measurement, no median:"
    table = Table(
        title=f"{escape(Path(info['model_path']).name)}, {escape(info['prompt'])} ({result.prompt_tokens} tokens"
              f"{', chat template' if info['chat'] else ''}), n={s.n}, {s.threads} thread(s), greedy",
        caption=f"{medians} {result.reps} rep(s). tok/s and ratio: generation only, over plain decoding "
                "in the same rep; e2e: wall time with prompt processing (target and draft)."
                + (" native ratios are over llamaspec's plain decoding; their tokens are not checked."
                   if any(m.native for m in result.summaries) else ""),
        caption_justify="left",
        box=None,
        pad_edge=False,
        header_style="bold",
    )
    # (header, justify, min width when folded); numbers never fold, and no column may vanish
    for col, justify, min_width in (("mode", "left", 12), ("tok/s", "right", None), ("ratio", "right", None),
                                    ("e2e", "right", None), ("accept", "right", None), ("MAL", "right", None),
                                    ("identical", "left", 9), ("ovh ms", "right", None),
                                    ("per-rep ratios", "left", 7)):
        table.add_column(col, justify=justify, no_wrap=min_width is None, overflow="fold", min_width=min_width)
    best = result.best.mode
    for m in result.summaries:
        plain = m.mode == "plain"
        if plain or m.native:
            ident = "-" if m.native else "ref"
        elif m.identical_to_plain:
            ident = "[green]yes[/green]"
        else:
            ident = f"[bold red]NO[/bold red] ({m.differing_reps}/{m.reps} reps, from token {m.first_difference})"
        ratio = _x(m.ratio_vs_plain)
        if not plain and m.ratio_vs_plain is not None:
            ratio = f"[green]{ratio}[/green]" if m.ratio_vs_plain > 1 else f"[red]{ratio}[/red]"
        has_drafts = not plain and not m.native and m.drafted > 0
        table.add_row(
            f"[bold]{m.mode}[/bold]" if m.mode == best and not plain else m.mode,
            f"{m.tok_s:.1f}",
            ratio,
            _x(m.e2e_ratio_vs_plain),
            f"{100 * m.acceptance:.1f}%" if not plain and (m.native or has_drafts) else "-",
            f"{m.mean_accepted_length:.2f}" if has_drafts and m.mean_accepted_length is not None else "-",
            ident,
            f"{m.overhead_ms_per_step:.3f}" if m.overhead_ms_per_step is not None else "-",
            "-" if plain else " ".join(_x(r) for r in m.ratios),
        )
    if not console.is_terminal:
        # A pipe or file gets whole lines instead of a table folded to 80 columns (as `models`).
        from rich.console import Console

        console = Console(file=console.file, width=1000, highlight=False, color_system=None)
    console.print(table)
    for note in _mode_notes(result) + result.notes:
        console.print(f"note: {escape(note)}")
    if best == "plain":
        console.print("best: plain decoding (no speculative mode measured faster with accepted drafts "
                      "and identical tokens)")
    else:
        console.print(f"best: [bold]{best}[/bold] {_x(result.best.ratio_vs_plain)} vs plain"
                      + (" (one repetition)" if result.reps == 1 else f" (median of {result.reps})")
                      + ", tokens identical to plain decoding")

