"""The real measurements behind a sweep: the calibration prompts and a runner on a loaded target.

Runs are `llamaspec.bench.run_mode` (the same greedy run `bench` times), so a tuned ratio
and a bench ratio mean the same thing. Before the sweep, llama.cpp's batch noise on the target is
measured (or read from the cache, flips.py), and a run whose tokens differ from plain decoding is
judged at its first difference against it. Nothing here imports llama_cpp at module level.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from llamaspec.errors import UsageError
from llamaspec.bench.prompts import SuitePrompt, format_prompt, preset_text, read_prompts
from llamaspec.tune.sweep import Candidate, OnRound, OnRun, OnUnsteady, Plan, SweepResult, run_sweep

if TYPE_CHECKING:
    from llamaspec.runtime.llama import Model
    from llamaspec.tune.flips import Noise

# on_noise(the batch noise measured on the target, whether it came from the cache)
OnNoise = Callable[["Noise", bool], None]

# The bundled calibration set (PROMPT_PRESETS): text that repeats its context, and text that does not.
CHAT_PRESETS = ("code", "story")
RAW_PRESETS = ("code-raw", "story")


@dataclass
class Calibration:
    ids: list[str]
    tokens: list[list[int]]


def calibration_prompts(target: "Model", prompts_file: Path | None, chat: bool | None, n: int,
                        ctx: int) -> Calibration:
    """The prompts, formatted and tokenized for `target` (its chat template unless chat is False)."""
    if prompts_file is not None:
        suite = read_prompts(prompts_file)
    else:
        use_chat = chat if chat is not None else target.chat_template is not None
        suite = [SuitePrompt(name, preset_text(name)) for name in (CHAT_PRESETS if use_chat else RAW_PRESETS)]
    ids, tokens = [], []
    for p in suite:
        _, toks, _ = format_prompt(target, p.text or "", chat)
        if len(toks) + n > ctx:
            raise UsageError(f"prompt {p.id!r} ({len(toks)} tokens) + -n {n} exceeds the context ({ctx})",
                             "raise -c/--ctx-size or lower -n")
        ids.append(p.id)
        tokens.append(toks)
    return Calibration(ids, tokens)


def bench_runner(target: "Model", prompts: Sequence[Sequence[int]], settings) -> Callable:
    """Runner(candidate, prompt index) over bench's run_mode; settings: a BenchSettings (n, threads,
    ctx, draft_path); each candidate's draft-max, p-min and n-gram settings replace its own."""
    from llamaspec.bench import run_mode

    def run(c: Candidate | None, i: int):
        if c is None:
            return run_mode(target, "none", prompts[i], settings, label="plain")
        s = replace(settings, draft_max=c.effective_draft_max, draft_p_min=c.draft_p_min,
                    ngram=c.ngram_params() or settings.ngram)
        return run_mode(target, c.spec, prompts[i], s, label=c.label)

    return run


def tune_pair(target_path: Path, draft_path: Path | None, *, prompts_file: Path | None = None,
              chat: bool | None = None, n: int = 128, threads: int | None = None, ctx: int = 4096,
              amx: bool | None = None, plan: Plan | None = None, on_run: OnRun | None = None,
              on_round: OnRound | None = None, on_unsteady: OnUnsteady | None = None,
              on_noise: OnNoise | None = None) -> tuple[SweepResult, Calibration, dict]:
    """Load the target once, calibrate, measure its batch noise, sweep. Returns the sweep, the
    prompts and the settings used (with the noise and the bound flips were judged by)."""
    from llamaspec.tune.flips import cached_noise, make_judge, measure_noise

    from llamaspec.gguf.header import read_file
    from llamaspec.runtime.llama import Model, default_threads
    from llamaspec.bench import BenchSettings

    has_mtp = read_file(target_path).nextn_predict_layers > 0
    threads = threads or default_threads()
    from llamaspec.runtime.devices import plan_offload
    from llamaspec.speculative.options import DEFAULT_CTX

    # GPU offload as `run` does it by default (auto), so what is tuned is what `run` will load
    ngl = plan_offload(Path(target_path), None, n_gpu_layers=None, n_gpu_layers_draft=None, n_ctx=ctx,
                       default_ctx=DEFAULT_CTX, load_mtp=has_mtp).n_gpu_layers
    target = Model(target_path, n_gpu_layers=ngl, load_mtp=has_mtp, amx=amx)
    try:
        n_ctx = ctx or target.n_ctx_train
        cal = calibration_prompts(target, prompts_file, chat, n, n_ctx)
        settings = BenchSettings(n=n, threads=threads, ctx=ctx, draft_path=draft_path)
        _warm_up(target, cal.tokens[0], replace(settings, n=min(n, 8)), draft_path is not None)
        noise, cached = cached_noise(target_path, ngl, threads, lambda: measure_noise(
            target, cal.tokens, depth=max(len(t) for t in cal.tokens) + n, n_ctx=n_ctx, threads=threads))
        if on_noise:
            on_noise(noise, cached)
        judge = make_judge(target, cal.tokens, noise.bound, n_ctx=n_ctx, threads=threads)
        runner = bench_runner(target, cal.tokens, settings)
        result = run_sweep(runner, len(cal.ids), has_draft=draft_path is not None, has_mtp=has_mtp, plan=plan,
                           on_run=on_run, on_round=on_round, on_unsteady=on_unsteady, judge=judge)
    finally:
        target.close()
    used = {"prompts": cal.ids, "n": n, "threads": threads, "ctx": ctx, "margin": result.margin,
            "batch_noise": {**noise.to_dict(), "cached": cached}}
    return result, cal, used


def _warm_up(target: "Model", prompt: Sequence[int], short, has_draft: bool) -> None:
    """The first decodes of a process pay for paging in the weights: not on a measured run."""
    from llamaspec.bench import run_mode
    from llamaspec.speculative.options import DRAFT_MODEL_TYPE

    run_mode(target, "none", prompt, short)
    if has_draft:
        run_mode(target, DRAFT_MODEL_TYPE, prompt, short)
