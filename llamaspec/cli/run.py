"""`llamaspec run`: generate with speculative decoding; text streams to stdout, stats to stderr."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from llamaspec.cli.app import (
    check_draft_max,
    JsonOpt, NgramModMatchOpt, NgramModMaxOpt, NgramModMinOpt, NgramSizeMOpt, NgramSizeNOpt, QuietOpt, VerboseOpt, app,
    ngram_params, read_prompt_file, setup_output,
)
from llamaspec.runtime.cpu import AMX_HELP
from llamaspec.errors import UsageError

_SPEC_HELP = ("Speculative types, comma list: none, draft, ngram-simple, ngram-mod, mtp "
              "(llama.cpp's names draft-simple, draft-mtp also work). Default: draft when --draft is "
              "given, else none.")


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
def run(
    model: Annotated[Optional[str], typer.Argument(
        help="Target GGUF: a path or Hub reference (org/repo:QUANT). Default: the bundled SmolLM2.")] = None,
    prompt: Annotated[Optional[str], typer.Option("-p", "--prompt", help="Prompt text.")] = None,
    file: Annotated[Optional[Path], typer.Option("-f", "--file", help="Read the prompt from a file.")] = None,
    draft: Annotated[Optional[str], typer.Option(
        "--draft", "-md", "--model-draft",
        help="Draft model: a GGUF path or Hub ref, 'auto' (MTP heads, a draft on disk, the registry, "
             "else ngram-mod), or 'none'.")] = None,
    spec_type: Annotated[Optional[str], typer.Option("--spec-type", help=_SPEC_HELP)] = None,
    draft_max: Annotated[Optional[int], typer.Option(
        "--draft-max", "--spec-draft-n-max", help="Most draft tokens per step (adaptive below it).")] = None,
    draft_min: Annotated[int, typer.Option(
        "--draft-min", "--spec-draft-n-min", help="Drop drafts shorter than this.")] = 0,
    draft_p_min: Annotated[float, typer.Option(
        "--draft-p-min", "--spec-draft-p-min", help="Draft model stops when its top probability is below this.")] = 0.0,
    fixed_k: Annotated[bool, typer.Option(
        "--fixed-draft", help="Always draft --draft-max tokens (no adaptive draft length).")] = False,
    n_predict: Annotated[int, typer.Option("-n", "--n-predict", help="Tokens to generate.")] = 256,
    temp: Annotated[float, typer.Option("--temp", help="Temperature; 0 = greedy.")] = 0.8,
    top_k: Annotated[int, typer.Option("--top-k")] = 40,
    top_p: Annotated[float, typer.Option("--top-p")] = 0.95,
    min_p: Annotated[float, typer.Option("--min-p")] = 0.05,
    repeat_penalty: Annotated[float, typer.Option("--repeat-penalty")] = 1.0,
    repeat_last_n: Annotated[int, typer.Option("--repeat-last-n")] = 64,
    seed: Annotated[Optional[int], typer.Option("-s", "--seed", help="Sampling seed (same seed, same output).")] = None,
    stop: Annotated[Optional[list[str]], typer.Option("--stop", help="Stop string (repeatable).")] = None,
    ctx_size: Annotated[Optional[int], typer.Option(
        "-c", "--ctx-size", help="Context size in tokens (default 4096, capped at the model's training "
                                 "context; 0: the training context).")] = None,
    threads: Annotated[Optional[int], typer.Option("-t", "--threads", help="CPU threads (default: all).")] = None,
    ngl: Annotated[int, typer.Option("-ngl", "--n-gpu-layers", help="Target layers on the GPU.")] = 0,
    ngld: Annotated[int, typer.Option("-ngld", "--n-gpu-layers-draft", help="Draft layers on the GPU.")] = 0,
    amx: Annotated[Optional[bool], typer.Option("--amx/--no-amx", help=AMX_HELP)] = None,
    chat: Annotated[Optional[bool], typer.Option(
        "--chat/--raw", help="Apply the model's chat template (default when it has one) or send raw text.")] = None,
    system: Annotated[Optional[str], typer.Option("--system", help="System message (chat mode).")] = None,
    color: Annotated[bool, typer.Option("--color", help="Show accepted draft tokens in colour.")] = False,
    offline: Annotated[bool, typer.Option("--offline", help="Never use the network.")] = False,
    force_draft: Annotated[bool, typer.Option("--force-draft", help="Use a draft that fails the vocabulary check.")] = False,
    search: Annotated[Optional[list[Path]], typer.Option("--search", help="Also look here for drafts (--draft auto).")] = None,
    ngram_size_n: NgramSizeNOpt = None,
    ngram_size_m: NgramSizeMOpt = None,
    ngram_mod_match: NgramModMatchOpt = None,
    ngram_mod_min: NgramModMinOpt = None,
    ngram_mod_max: NgramModMaxOpt = None,
    json: JsonOpt = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Generate text with speculative decoding: token for token what the target alone would write."""
    out = setup_output(json, quiet, verbose)
    text = read_prompt(prompt, file)
    _check_ranges(n_predict=n_predict, temp=temp, top_p=top_p, min_p=min_p, ctx_size=ctx_size,
                  draft_max=draft_max, draft_min=draft_min, draft_p_min=draft_p_min)
    ngram = ngram_params(ngram_size_n, ngram_size_m, ngram_mod_match, ngram_mod_min, ngram_mod_max)

    from llamaspec.spec.pipeline import SpecOptions, load_pipeline
    from llamaspec.cli._report import generation_dict, render_stats
    from llamaspec.cli._resolve import resolve
    from llamaspec.runtime.llama import set_llama_log
    from llamaspec.spec.verify import SamplingParams

    set_llama_log(verbose)
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
        on_text = None if json else _streamer(out, color)
        gen = pipe.engine.generate(prompt_tokens, pipe.config(max_tokens=n_predict, sampling=sampling,
                                                              stop=stop or []), on_text=on_text)
    finally:
        n_ctx_used = pipe.ctx.n_ctx
        pipe.close()
    info = generation_dict(gen, spec_type=r.spec_label, draft_model=r.draft_ref, model=r.target_ref)
    if json:
        out.data(info)
    else:
        out.write("\n")
        if not quiet:
            render_stats(info, out.stderr)
    if gen.stop_reason == "context":
        out.warn(f"stopped: the context is full ({n_ctx_used} tokens); raise -c/--ctx-size for longer output")
    if gen.stop_reason == "interrupted":
        raise typer.Exit(130)


def _check_ranges(**v) -> None:
    if v["n_predict"] < 0:
        raise UsageError("-n must be >= 0")
    if v["temp"] < 0:
        raise UsageError("--temp must be >= 0", "0 means greedy")
    if not 0 < v["top_p"] <= 1:
        raise UsageError("--top-p must be in (0, 1]")
    if not 0 <= v["min_p"] <= 1:
        raise UsageError("--min-p must be in [0, 1]")
    if v["ctx_size"] is not None and v["ctx_size"] < 0:
        raise UsageError("-c/--ctx-size must be >= 0", "0 uses the model's training context")
    if v["draft_max"] is not None and v["draft_max"] < 0:
        raise UsageError("--draft-max must be >= 0")
    check_draft_max(v["draft_max"])
    if v["draft_min"] < 0 or (v["draft_max"] is not None and v["draft_min"] > v["draft_max"]):
        raise UsageError("--draft-min must be between 0 and --draft-max")
    if not 0 <= v["draft_p_min"] <= 1:
        raise UsageError("--draft-p-min must be in [0, 1]")


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
