"""`llamaspec run`: generate with speculative decoding; text streams to stdout, stats to stderr."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from llamaspec.cli._options import (
    CTX_SIZE_CHECK, AmxOpt, ChatOpt, DraftMaxOpt, DraftPMinOpt, FileOpt, FixedDraftOpt, ForceDraftOpt, OfflineOpt,
    PromptOpt, ThreadsOpt, at_least, in_range, ngram_flags, output_flags, read_prompt_file,
)
from llamaspec.cli._output import Output
from llamaspec.cli.app import app
from llamaspec.errors import UsageError

if TYPE_CHECKING:
    from llamaspec.spec.options import NgramParams

from llamaspec.spec.options import spec_type_help  # the spec-type table; no llama_cpp import

_SPEC_HELP = (f"Speculative types, comma list, llama.cpp's names (aliases): {spec_type_help()}. "
              "Default: draft when --draft is given, else none.")


def read_prompt(prompt: str | None, file: Path | None) -> str:
    """-p, -f, or stdin (when it is not a terminal)."""
    if prompt is not None and file is not None:
        raise UsageError("give the prompt with -p or -f, not both")
    if prompt is not None:
        return prompt
    if file is not None:
        return read_prompt_file(file)
    if not sys.stdin.isatty():
        return sys.stdin.read()
    raise UsageError("no prompt", "give one with -p TEXT, -f FILE, or on stdin")


@app.command()
@output_flags
@ngram_flags
def run(
    model: Annotated[Optional[str], typer.Argument(
        help="Target GGUF: a path or Hub reference (org/repo:QUANT). Default: the bundled SmolLM2.")] = None,
    prompt: PromptOpt = None,
    file: FileOpt = None,
    draft: Annotated[Optional[str], typer.Option(
        "--draft", "-md", "--model-draft",
        help="Draft model: a GGUF path or Hub ref, 'auto' (MTP heads, a draft on disk, the registry, "
             "else ngram-mod), or 'none'.")] = None,
    spec_type: Annotated[Optional[str], typer.Option("--spec-type", help=_SPEC_HELP)] = None,
    draft_max: DraftMaxOpt = None,
    draft_min: Annotated[int, typer.Option(
        "--draft-min", "--spec-draft-n-min", help="Drop drafts shorter than this.")] = 0,
    draft_p_min: DraftPMinOpt = 0.0,
    fixed_k: FixedDraftOpt = False,
    n_predict: Annotated[int, typer.Option(
        "-n", "--n-predict", help="Tokens to generate.", callback=at_least("-n", 0))] = 256,
    temp: Annotated[float, typer.Option(
        "--temp", help="Temperature; 0 = greedy.", callback=at_least("--temp", 0, "0 means greedy"))] = 0.8,
    top_k: Annotated[int, typer.Option("--top-k")] = 40,
    top_p: Annotated[float, typer.Option("--top-p", callback=in_range("--top-p", 0, 1, open_low=True))] = 0.95,
    min_p: Annotated[float, typer.Option("--min-p", callback=in_range("--min-p", 0, 1))] = 0.05,
    repeat_penalty: Annotated[float, typer.Option("--repeat-penalty")] = 1.0,
    repeat_last_n: Annotated[int, typer.Option("--repeat-last-n")] = 64,
    seed: Annotated[Optional[int], typer.Option("-s", "--seed", help="Sampling seed (same seed, same output).")] = None,
    stop: Annotated[Optional[list[str]], typer.Option("--stop", help="Stop string (repeatable).")] = None,
    ctx_size: Annotated[Optional[int], typer.Option(
        "-c", "--ctx-size", help="Context size in tokens (default 4096, capped at the model's training "
                                 "context; 0: the training context).", callback=CTX_SIZE_CHECK)] = None,
    threads: ThreadsOpt = None,
    ngl: Annotated[int, typer.Option("-ngl", "--n-gpu-layers", help="Target layers on the GPU.")] = 0,
    ngld: Annotated[int, typer.Option("-ngld", "--n-gpu-layers-draft", help="Draft layers on the GPU.")] = 0,
    amx: AmxOpt = None,
    chat: ChatOpt = None,
    system: Annotated[Optional[str], typer.Option("--system", help="System message (chat mode).")] = None,
    color: Annotated[bool, typer.Option("--color", help="Show accepted draft tokens in colour.")] = False,
    offline: OfflineOpt = False,
    force_draft: ForceDraftOpt = False,
    search: Annotated[Optional[list[Path]], typer.Option("--search", help="Also look here for drafts (--draft auto).")] = None,
    *,
    ngram: NgramParams,
    out: Output,
) -> None:
    """Generate text with speculative decoding: token for token what the target alone would write."""
    text = read_prompt(prompt, file)
    if draft_min < 0 or (draft_max is not None and draft_min > draft_max):
        raise UsageError("--draft-min must be between 0 and --draft-max")

    from llamaspec.spec.options import SpecOptions
    from llamaspec.spec.pipeline import load_pipeline
    from llamaspec.cli._report import generation_dict, render_stats
    from llamaspec.resolve import resolve
    from llamaspec.runtime.llama import set_llama_log
    from llamaspec.spec.verify import SamplingParams

    set_llama_log(out.verbose)
    r = resolve(model, draft, spec_type, offline=offline, force_draft=force_draft, search=search or [])
    for note in r.notes:
        out.info(note)
    sampling = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p,
                              repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n, seed=seed)
    opts = SpecOptions(spec_types=r.spec_types, draft_path=r.draft_path,
                       draft_max=draft_max if draft_max is not None else r.draft_max,
                       draft_min=draft_min, draft_p_min=draft_p_min, adaptive=not fixed_k,
                       n_ctx=ctx_size, n_threads=threads, n_gpu_layers=ngl, n_gpu_layers_draft=ngld,
                       ngram=ngram, amx=amx)
    out.detail(f"target {r.target_path}; spec {r.spec_label}; draft {r.draft_path}")
    from llamaspec.runtime.info import buffer_decision

    out.detail(buffer_decision(amx).reason)
    pipe = load_pipeline(r.target_path, opts, sampling)
    try:
        prompt_tokens = _prompt_tokens(pipe.target, text, chat, system)
        on_text = None if out.json else _streamer(out, color)
        gen = pipe.engine.generate(prompt_tokens, pipe.config(max_tokens=n_predict, sampling=sampling,
                                                              stop=stop or []), on_text=on_text)
    finally:
        n_ctx_used = pipe.ctx.n_ctx
        pipe.close()
    info = generation_dict(gen, spec_type=r.spec_label, draft_model=r.draft_ref, model=r.target_ref)
    if out.json:
        out.data(info)
    else:
        out.write("\n")
        if not out.quiet:
            render_stats(info, out.stderr)
    if gen.stop_reason == "context":
        out.warn(f"stopped: the context is full ({n_ctx_used} tokens); raise -c/--ctx-size for longer output")
    if gen.stop_reason == "interrupted":
        raise typer.Exit(130)


def _prompt_tokens(target, text: str, chat: bool | None, system: str | None) -> list[int]:
    """Chat template by default when the model has one; --raw sends the text as is."""
    use_chat = chat if chat is not None else target.chat_template is not None
    if use_chat:
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": text}]
        text = target.chat_prompt(messages)
    elif system:
        raise UsageError("--system needs chat mode", "drop --raw, or put the system text in the prompt")
    return target.tokenize_prompt(text)


def _streamer(out, color: bool):
    """Writes text as it is generated; with --color, text from accepted draft tokens is green."""
    if not color:
        return lambda piece, from_draft, source: out.write(piece)
    green, reset = "\x1b[32m", "\x1b[0m"
    return lambda piece, from_draft, source: out.write(f"{green}{piece}{reset}" if from_draft else piece)
