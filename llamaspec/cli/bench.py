"""`llamaspec bench`: plain vs speculative decoding side by side, as measured ratios.

One run measures every target x (draft x mode) x prompt against plain decoding of the same target
(bench/suite.py; the measuring itself is bench/runner.py, shared with scripts/bench_engine.py).
This module reads flags, resolves models, checks pairs and hands the result to _bench_render.py
(tables, chart, JSON) and _bench_html.py (--html). Nothing here imports llama_cpp at module level.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from llamaspec import knobs
from llamaspec.cli._options import (
    CTX_SIZE_CHECK, AmxOpt, ChatOpt, DraftMaxMeasuredOpt, DraftPMinOpt, FileOpt, FixedDraftOpt, ForceDraftOpt,
    OfflineOpt, PromptOpt, ThreadsOpt, at_least, check_draft_exists, draft_size_warning, ngram_flags, output_flags,
    read_prompt_file,
)
from llamaspec.cli._errors import raise_if_interrupted
from llamaspec.cli._output import Output, escape
from llamaspec.cli.app import app
from llamaspec.errors import UsageError

if TYPE_CHECKING:
    from llamaspec.bench.prompts import SuitePrompt
    from llamaspec.bench.suite import Target
    from llamaspec.speculative.options import NgramParams

_DEFAULT_PRESET = "code"   # of llamaspec.bench.PROMPT_PRESETS; "code-raw" without a chat template

_SPEC_HELP = ("A speculative mode to measure; repeat for several (each is run against plain decoding). "
              "A comma list is one chained mode (draft,ngram-simple). Names: draft, ngram-simple, "
              "ngram-mod, mtp (or llama.cpp's draft-simple, draft-mtp). Default: ngram-simple and "
              "ngram-mod, plus draft when --draft is given.")

@app.command()
@output_flags
@ngram_flags
def bench(
    models: Annotated[list[str], typer.Argument(
        metavar="MODEL",
        help="Target GGUF(s): paths or Hub references (org/repo:QUANT). Several targets are each "
             "measured against their own plain decoding, in one run.")],
    draft: Annotated[Optional[list[str]], typer.Option(
        "--draft", "-md", "--model-draft",
        help="Draft model for the draft modes: a GGUF path or Hub ref. Repeat for several: every "
             "draft mode runs once per draft (a draft incompatible with a target is skipped for it).")] = None,
    spec_type: Annotated[Optional[list[str]], typer.Option("--spec-type", help=_SPEC_HELP)] = None,
    prompt: PromptOpt = None,
    file: FileOpt = None,
    preset: Annotated[Optional[str], typer.Option(
        "--prompt-preset",
        help="A bundled prompt: code (rewrite a Python module; the default), code-raw (the same "
             "without a chat template), story.")] = None,
    prompts: Annotated[Optional[Path], typer.Option(
        "--prompts", metavar="FILE",
        help='A suite: JSONL, one {"id": ..., "prompt": ...} per line. Per-prompt and overall tables '
             "(geometric means over prompts).")] = None,
    n_predict: Annotated[int, typer.Option(
        "-n", "--n-predict", help="Tokens to generate per run.", callback=at_least("-n", 1))] = 256,
    reps: Annotated[int, typer.Option(
        "--reps", help="Repetitions; results are medians over them.", callback=at_least("--reps", 1))] = 3,
    threads: ThreadsOpt = None,
    ctx_size: Annotated[int, typer.Option("-c", "--ctx-size", help="Context size in tokens.",
                                          callback=CTX_SIZE_CHECK)] = 4096,
    draft_max: DraftMaxMeasuredOpt = knobs.DEFAULT.draft_max,
    draft_p_min: DraftPMinOpt = knobs.DEFAULT.draft_p_min,
    fixed_k: FixedDraftOpt = False,
    chat: ChatOpt = None,
    html: Annotated[Optional[Path], typer.Option(
        "--html", metavar="FILE",
        help="Also write a self-contained interactive report (throughput, speedup, theory, acceptance "
             "per position); needs pip install 'llamaspec[html]'.")] = None,
    native: Annotated[Optional[Path], typer.Option(
        "--native", metavar="BIN_DIR",
        help="Also run llama.cpp's llama-speculative-simple from BIN_DIR on exactly our prompt tokens: its "
             "first -n tokens counted, its greedy text checked against ours (another text gets no ratio).")] = None,
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
    """Measure plain vs speculative decoding (greedy) in one process: every target x draft x mode
    (x prompt) against plain decoding of the same target; tok/s ratios, acceptance, the theoretical
    speedup, a token-for-token check, and a bar chart."""
    at_least("-t/--threads", 1)(threads)  # (run reads -t 0 as all cores)
    suite_prompts = _prompts(prompt, file, preset, prompts)
    if html is not None:
        from llamaspec.cli import _bench_html

        _bench_html.require_plotly()
        if not html.parent.is_dir():
            raise UsageError(f"--html: no directory {html.parent}", "give a path in an existing directory")
    if native is not None:
        from llamaspec.bench import native_exe

        if native_exe(native) is None:
            raise UsageError(f"--native: no executable llama-speculative-simple in {native}",
                             "build it in llama.cpp: cmake -B build && cmake --build build "
                             "--target llama-speculative-simple; pass build/bin")

    from llamaspec import hub
    from llamaspec.runtime.llama import default_threads, set_llama_log
    from llamaspec.bench import BenchSettings
    from llamaspec.bench.suite import run_suite
    from llamaspec.speculative.options import needs_draft_model

    drafts_given = list(dict.fromkeys(draft or []))
    for d in drafts_given:
        check_draft_exists(d)
    modes = _modes(spec_type, drafts_given)       # flags first: no download before a usage error
    set_llama_log()
    drafts = [(ref, hub.resolve_model(ref, offline=offline)) for ref in drafts_given]
    if drafts and not any(needs_draft_model(m) for m in modes):
        out.warn("--draft is given but no mode uses it; add --spec-type draft")
    targets = _targets(list(dict.fromkeys(models)), drafts, modes, force_draft, offline, out,
                       explicit_modes=spec_type is not None)

    from llamaspec.runtime.info import buffer_decision
    from llamaspec.runtime.memory import check_load

    for t in targets:   # a context that does not fit in RAM: one line now, not an OOM kill later
        for d in [None, *{c.draft_path for c in t.configs if c.draft_path is not None}]:
            check_load(t.path, d, n_ctx=ctx_size, default_ctx=4096)
    out.detail(buffer_decision(amx).reason)
    settings = BenchSettings(n=n_predict, threads=threads or default_threads(), ctx=ctx_size,
                             draft_max=draft_max, draft_p_min=draft_p_min, adaptive=not fixed_k,
                             native_draft_max=native_draft_max, ngram=ngram)
    several = len(targets) > 1 or len(suite_prompts) > 1

    loaded: set[Path] = set()

    def on_prompt(t: "Target", source: str, n_tokens: int, used_chat: bool) -> None:
        if t.path not in loaded:
            loaded.add(t.path)
            out.detail(escape(f"loaded {t.path}"))
        out.info(f"{escape((t.label + ': ') if len(targets) > 1 else '')}{escape(source)}: {n_tokens} tokens"
                 f"{' (chat template)' if used_chat else ''}; modes: plain, "
                 f"{escape(', '.join(c.label for c in t.configs))}; {reps} rep(s) of {n_predict} tokens, "
                 f"{settings.threads} thread(s), greedy")

    def progress(t: "Target", pid: str, rep: int, r) -> None:
        raise_if_interrupted()   # a run cut short by Ctrl-C/SIGTERM is not a measurement: stop here
        where = " / ".join(([t.label] if len(targets) > 1 else []) + ([pid] if len(suite_prompts) > 1 else []))
        line = (escape(f"[{where}] ") if several else "") + f"rep {rep}/{reps} {escape(r.mode)}: {r.tps:.1f} tok/s"
        other_text = r.native and r.identical is False
        if r.mode != "plain" and r.ratio is not None and not other_text:
            line += f" ({r.ratio:.2f}x)"
        if r.native and r.n_decoded is not None and r.n_decoded > r.n:
            line += f" (first {r.n} of {r.n_decoded} decoded)"
        if other_text:
            line += f" [red]text differs from ours at token {r.first_difference}[/red]"
        elif r.identical is False:
            line += f" [red]tokens differ from plain at token {r.first_difference}[/red]"
        out.info(line)

    suite = run_suite(targets, suite_prompts, settings, reps, chat=chat, amx=amx, native=native,
                      on_run=progress, on_prompt=on_prompt)

    from llamaspec.cli import _bench_render as render

    for note in suite.notes:
        out.warn(escape(note))
    for run in suite.runs:
        for s in run.result.differing:
            note = render.native_notes(s, settings.n)[0] if s.native else render.differ_note(s)
            out.warn(escape((f"[{run.target.label} / {run.prompt_id}] " if several else "") + note))
    info = render.to_dict(suite, drafts=drafts)
    if html is not None:
        from llamaspec.cli import _bench_html

        _write_report(html, _bench_html.render(info))
        out.info(f"wrote {escape(html)}")
    out.data(info, human=lambda console: render.render(console, suite), quiet=render.quiet_line(suite))


def _write_report(path: Path, text: str) -> None:
    """Beside and renamed over: a full disk or an interrupt never leaves half a report in place of
    a good one."""
    import os

    from llamaspec.errors import LlamaspecError, disk_full

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        raise disk_full(path, e, "free some space; the previous report, if any, is as it was") or \
            LlamaspecError(f"cannot write {path}: {e.strerror or e}", "check the --html path") from None
    finally:
        tmp.unlink(missing_ok=True)


# ---- flags ----------------------------------------------------------------------------------------


def _prompts(prompt: str | None, file: Path | None, preset: str | None, prompts: Path | None) -> list["SuitePrompt"]:
    """The prompts to measure; a text of None is the default preset (chosen per target once loaded)."""
    from llamaspec.bench.prompts import PROMPT_PRESETS, SuitePrompt, preset_text, read_prompts

    given = [name for name, v in (("-p", prompt), ("-f", file), ("--prompt-preset", preset), ("--prompts", prompts))
             if v is not None]
    if len(given) > 1:
        raise UsageError(f"give one prompt source, not {' and '.join(given)}")
    if prompts is not None:
        return read_prompts(prompts)
    if prompt is not None:
        return [SuitePrompt("prompt", prompt)]
    if file is not None:
        return [SuitePrompt(f"file {file}", read_prompt_file(file))]
    if preset is not None:
        if preset not in PROMPT_PRESETS:
            raise UsageError(f"unknown --prompt-preset {preset!r}", f"one of: {', '.join(PROMPT_PRESETS)}")
        return [SuitePrompt(f"preset {preset}", preset_text(preset))]
    return [SuitePrompt(f"preset {_DEFAULT_PRESET}", None)]


def _modes(spec_type: list[str] | None, drafts: list[str]) -> list[str]:
    """--spec-type values -> canonical mode labels (each a priority-ordered comma list), deduplicated."""
    from llamaspec.speculative.options import default_bench_modes, needs_draft_model, parse_spec_types

    for d in drafts:
        if d.lower() in ("auto", "none"):
            raise UsageError(f"bench takes a draft path or Hub ref, not --draft {d}",
                             "`llamaspec run --draft auto -v` shows which draft auto picks")
    given = spec_type or default_bench_modes(with_draft_model=bool(drafts))
    modes: list[str] = []
    for value in given:
        label = ",".join(parse_spec_types(value))
        if not label:
            continue  # "none": plain decoding runs in every repetition anyway
        if label not in modes:
            modes.append(label)
    if not modes:
        raise UsageError("no speculative mode to measure", "e.g. --spec-type ngram-simple --spec-type ngram-mod")
    if not drafts and any(needs_draft_model(m) for m in modes):
        raise UsageError("--spec-type draft needs a draft model", "add --draft PATH")
    return modes


def _targets(models: list[str], drafts: list[tuple[str, Path]], modes: list[str], force_draft: bool,
             offline: bool, out: Output, explicit_modes: bool = True) -> list["Target"]:
    """Each target with its configurations: its modes, draft modes once per compatible draft. With
    one target and one draft an incompatible pair is an error (as `run`); in a sweep it is skipped
    with a warning, and so is a target left with nothing to measure."""
    from llamaspec import hub
    from llamaspec.errors import IncompatiblePairError
    from llamaspec.pairing.check import check_explicit_draft
    from llamaspec.bench.suite import Target, make_configs

    sweep = len(models) > 1 or len(drafts) > 1
    targets = []
    for ref in models:
        path = hub.resolve_model(ref, offline=offline)
        usable = []
        for dref, dpath in drafts:
            try:
                check_explicit_draft(str(path), str(dpath), force_draft, offline=offline)
            except IncompatiblePairError as e:
                if not sweep:
                    raise
                out.warn(escape(f"skipping this pair: {e.message}"))
                continue
            usable.append(dpath)
            if warning := draft_size_warning(path, dpath):
                out.warn(escape(warning))
        configs = make_configs(modes, usable)
        if not explicit_modes:
            configs += _tuned_configs(path, usable, out)
        if not configs:
            out.warn(escape(f"skipping {ref}: no mode to measure (no compatible draft)"))
            continue
        targets.append(Target(ref, path, configs))
    if not targets:
        raise IncompatiblePairError("no target has a compatible draft for the modes asked",
                                    "`llamaspec pair TARGET` lists compatible drafts, or add an n-gram --spec-type")
    return targets


def _tuned_configs(target: Path, drafts: list[Path], out: Output) -> list["Config"]:
    """With no --spec-type, what `llamaspec tune` stored for this target (alone, and with each
    draft) is measured too, labelled `tuned (...)`, with its own draft length and n-gram settings."""
    from dataclasses import replace

    from llamaspec.bench.results import Config
    from llamaspec.speculative.options import NgramParams, needs_draft_model
    from llamaspec.tune.store import lookup

    configs = []
    for d in [None, *drafts]:
        cfg = lookup(target, d)
        if cfg is None:
            continue
        if cfg.spec_type == "none":
            out.info(escape(f"tuned {cfg.date} for {target.name}" + (f" + {d.name}" if d else "")
                            + ": plain decoding measured fastest"))
            continue
        overrides = (("draft_max", cfg.draft_max), ("draft_p_min", cfg.draft_p_min),
                     ("ngram", replace(NgramParams(), **cfg.ngram)))
        label = f"tuned ({cfg.spec_type}{' @ ' + d.name if d else ''})"
        configs.append(Config(label, cfg.spec_type, d if needs_draft_model(cfg.spec_type) else None, overrides))
    return configs
