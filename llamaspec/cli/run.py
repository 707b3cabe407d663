"""`llamaspec run`: generate with speculative decoding; text streams to stdout, stats to stderr."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from llamaspec.cli._generation import ColorOpt, TargetArg, generation_flags
from llamaspec.cli._options import (
    FileOpt, PromptOpt, draft_size_warning, ngram_flags, output_flags, read_prompt_file,
)
from llamaspec.cli._output import Output
from llamaspec.cli.app import app
from llamaspec.errors import UsageError

if TYPE_CHECKING:
    from llamaspec.api.options import GenerationOptions
    from llamaspec.speculative.options import NgramParams


def read_prompt(prompt: str | None, file: Path | None) -> str:
    """-p, -f, or stdin (when it is not a terminal)."""
    if prompt is not None and file is not None:
        raise UsageError("give the prompt with -p or -f, not both")
    if prompt is not None:
        return prompt
    if file is not None:
        return read_prompt_file(file)
    text = "" if sys.stdin.isatty() else sys.stdin.read()
    if not text.strip():   # an empty pipe (`printf '' | llamaspec run M`, `echo |`) is no prompt, not an empty one
        raise UsageError("no prompt: give -p, -f, or text on stdin")
    return text


@app.command()
@output_flags
@ngram_flags
@generation_flags
def run(
    model: TargetArg = None,
    prompt: PromptOpt = None,
    file: FileOpt = None,
    color: ColorOpt = False,
    *,
    gen: GenerationOptions,
    ngram: NgramParams,
    out: Output,
) -> None:
    """Generate text with speculative decoding: token for token what the target alone would write.
    With no prompt at a terminal: a chat, as `llamaspec chat`."""
    if prompt is None and file is None and sys.stdin.isatty() and gen.chat is not False:
        from llamaspec.cli.chat import open_chat   # (ollama run MODEL does the same)

        return open_chat(model, replace(gen, ngram=ngram), out, color)
    text = read_prompt(prompt, file)

    from llamaspec.cli._report import render_stats
    from llamaspec.api.generator import GenerationInterrupted, Generator
    from llamaspec.runtime.llama import set_llama_log

    set_llama_log()
    with Generator.from_options(model, replace(gen, ngram=ngram)) as g:
        r = g.resolved
        for note in first_lines(g.notes, g.tuned, g.spec_label):
            out.info(note)
        for line in r.details:
            out.detail(line)
        if warning := draft_size_warning(r.target_path, r.draft_path):
            out.warn(warning)
        out.detail(f"target {r.target_path}; spec {g.spec_label}; draft {r.draft_path}")
        placed = g.pipeline.target.buffers  # the policy the load applied, not a second decision
        out.detail(placed.decision.reason + (f"; {placed.note}" if placed.note else ""))
        out.detail(f"GPU offload: {g.pipeline.offload.reason}")
        if g.thread_wait:
            out.detail(g.thread_wait)   # OMP_WAIT_POLICY chosen from the load (runtime/wait_policy.py)   # -ngl/-ngld as loaded (runtime/offload.py)
        check_prompt_fits(len(g.tokenize(text)), g.n_ctx, gen.ctx_size)
        on_text = None if out.json else _streamer(out, color)
        try:
            result = g.generate(text, on_text=on_text)
        except GenerationInterrupted as e:   # Ctrl-C / SIGTERM: the text so far and its stats, then 130/143
            result = e.result
        n_ctx_used = g.n_ctx
    info = {"text": result.text, "tokens": result.tokens, "stop_reason": result.stop_reason, **result.stats}
    if out.json:
        out.data(info)
    else:
        out.write("\n")
        if not out.quiet:
            render_stats(info, out.stderr, gen.draft_max)
    if result.stop_reason == "context":
        out.warn(f"stopped: the context is full ({n_ctx_used} tokens); raise -c/--ctx-size for longer output")
    from llamaspec.cli._errors import interrupted_exit_code, signal_received

    # A signal that arrived while the raise could not land (it is re-delivered out of llama.cpp's
    # callbacks) still ends the command as interrupted: never exit 0 after a SIGTERM.
    if result.stop_reason == "interrupted" or signal_received():
        raise typer.Exit(interrupted_exit_code())   # 130 (Ctrl-C) or 143 (SIGTERM)


def first_lines(notes: list[str], tuned: dict | None, spec_label: str) -> list[str]:
    """The lines `run` starts with: what runs and why, once. A stored `tune` configuration that
    applies replaces resolution's line (which said what would have run without it)."""
    from llamaspec.tune.apply import tuned_summary

    if not tuned or tuned.get("reason") or not tuned.get("applied"):
        return notes + ([f"speculation: {tuned_summary(tuned)}"] if tuned else [])
    ratio = f", measured {tuned['ratio']:.2f}x plain decoding" if tuned.get("ratio") else ""
    line = (f"speculation: {spec_label}, as `llamaspec tune` chose on {str(tuned.get('created', ''))[:10]} "
            f"({tuned.get('settings', '')}{ratio})")
    if tuned.get("overridden"):
        line += f"; your flags kept {', '.join(tuned['overridden'])}"
    return [line] + [n for n in notes if not n.startswith(("speculation:", "--draft auto:"))]


def check_prompt_fits(n_prompt: int, n_ctx: int, given: int | None) -> None:
    """A prompt longer than the context: one clear error before generating anything."""
    if n_prompt > n_ctx:
        from llamaspec.errors import ContextFullError

        asked = "" if given is None or given == n_ctx else f" (-c {given}, rounded up by llama.cpp)"
        raise ContextFullError(f"the prompt is {n_prompt:,} tokens, longer than the context of {n_ctx:,} tokens{asked}",
                               f"raise -c/--ctx-size to at least {n_prompt + 1:,}, or shorten the prompt")


def _streamer(out, color: bool):
    """Writes text as it is generated; with --color, text from accepted draft tokens is green."""
    if not color:
        return lambda piece, from_draft, source: out.write(piece)
    green, reset = "\x1b[32m", "\x1b[0m"
    return lambda piece, from_draft, source: out.write(f"{green}{piece}{reset}" if from_draft else piece)
