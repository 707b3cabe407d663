"""Plain vs speculative decoding, side by side in one process, reported as ratios.

Each repetition runs plain decoding and then every speculative mode on the same loaded target,
so a ratio compares runs made moments apart on the same machine state; summaries are medians
over repetitions (of per-repetition ratios, not ratios of medians). Decoding is greedy, so every
speculative run is checked token for token against plain decoding of the same repetition, and a
difference is reported, never hidden.

Optionally, llama.cpp's own `llama-speculative-simple` (built from the same source; `native`)
runs in the same repetition loop on exactly our prompt tokens, so its numbers sit beside ours.
Its ratios are over *llamaspec's* plain decoding of the same repetition (the same llama.cpp
kernels through llama-cpp-python), over its first -n tokens, and its greedy text is compared
with that plain decoding's: a native row whose text differs is flagged with the target's top-2
logit gap there and given no ratio (native.py says how).

Used by `llamaspec bench` (cli/bench.py, through bench/suite.py for several targets, drafts
and prompts) and `scripts/bench_engine.py`. The data lives in results.py, the theoretical
speedup in theory.py, the native runs in native.py. Nothing here imports llama_cpp at
module level.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from llamaspec.bench.native import (
    NATIVE_EXE, NativeRunError, native_command, native_exe, native_prompt, native_type, pieces, run_native, top2_gap,
)
from llamaspec.bench.prompts import (
    PROMPT_PRESETS, format_prompt, load_prompt, preset_text,
)
from llamaspec.bench.results import (
    NATIVE_PREFIX, PLAIN, BenchResult, BenchSettings, Config, ModeSummary, RepResult, as_config, best_mode,
    first_difference, summarise,
)

if TYPE_CHECKING:
    from llamaspec.runtime.llama import Model

__all__ = ["NATIVE_EXE", "NATIVE_PREFIX", "PLAIN", "PROMPT_PRESETS", "BenchResult", "BenchSettings", "Config",
           "ModeSummary", "NativeRunError", "RepResult", "as_config", "best_mode", "first_difference",
           "format_prompt", "load_prompt", "native_command", "native_exe", "native_type", "preset_text",
           "run_bench", "run_mode", "run_native", "summarise"]


# ---- one run ------------------------------------------------------------------------------------


def run_mode(target: "Model", spec: str, prompt: Sequence[int], settings: BenchSettings,
             label: str | None = None) -> RepResult:
    """One greedy generation of `spec` ("none" = plain) on an already loaded target."""
    from llamaspec.speculative.options import SpecOptions, needs_draft_model, parse_spec_types
    from llamaspec.speculative.pipeline import load_pipeline
    from llamaspec.speculative.sampling_params import SamplingParams

    types = parse_spec_types(spec)
    opts = SpecOptions(spec_types=types, draft_path=settings.draft_path, n_ctx=settings.ctx,
                       n_threads=settings.threads, draft_max=settings.draft_max,
                       adaptive=settings.adaptive, draft_p_min=settings.draft_p_min)
    if settings.ngram is not None:
        opts.ngram = settings.ngram
    sampling = SamplingParams(temperature=0.0)
    pipe = load_pipeline(target.path, opts, sampling, target=target)
    try:
        if pipe.drafter is not None:   # a mode is measured with its draft model there from the start,
            pipe.drafter.wait()        # as llama.cpp's tools load it (drafters/lazy.py)
        g = pipe.engine.generate(list(prompt), pipe.config(max_tokens=settings.n, sampling=sampling))
    finally:
        pipe.close(keep_target=True)
    s = g.stats
    return RepResult(
        mode=label or (",".join(types) or PLAIN), n=len(g.tokens), tps=s.tokens_per_second,
        e2e_s=s.prompt_seconds + s.gen_seconds, acceptance=s.acceptance, drafted=s.drafted,
        accepted=s.accepted,
        drafts=s.drafts, steps=s.steps, mean_accepted_length=s.mean_accepted_length,
        overhead_ms=1000 * s.overhead_seconds / s.steps if s.steps else 0.0, tokens=list(g.tokens),
        spec=",".join(types) or "none",
        draft=settings.draft_path.name if settings.draft_path is not None and types and needs_draft_model(types)
        else None,
        gen_seconds=s.gen_seconds, draft_seconds=s.draft_seconds, verify_seconds=s.verify_seconds,
        drafted_per_position=list(s.drafted_per_position), accepted_per_position=list(s.accepted_per_position))


def run_bench(target: "Model", prompt: Sequence[int], modes: "Sequence[str | Config]", settings: BenchSettings,
              reps: int = 3, *, native: Path | None = None, formatted_prompt: str | None = None,
              on_run: Callable[[int, RepResult], None] | None = None, warmup: bool = True) -> BenchResult:
    """`reps` repetitions of plain decoding then every mode (then every native mode); `on_run(rep,
    result)` after each run (rep counts from 1), with its ratios to this repetition's plain run.
    A mode is a Config (a mode with its draft model), or a mode name that uses settings.draft_path.

    `warmup` first runs plain and every mode once, untimed, on a few tokens: the first decode in a
    process pays for paging in mmap'd weights and first-use allocations (measured on the tiny test
    model: 0.38 s against 0.01 s), which would otherwise land on the first plain run and inflate
    every ratio of repetition 1.
    """
    if reps < 1:
        raise ValueError("reps must be >= 1")
    configs = [as_config(m, settings) for m in modes]
    if len({c.label for c in configs}) != len(configs):
        raise ValueError("config labels must be unique")
    if warmup:
        short = replace(settings, n=min(settings.n, 8))
        run_mode(target, "none", prompt, short)
        for c in configs:
            run_mode(target, c.spec, prompt, replace(short, draft_path=c.draft_path, **dict(c.overrides)))
    runs: dict[str, list[RepResult]] = {PLAIN: []}
    notes: list[str] = []
    prompt_file: Path | None = None
    prompt_pieces: list[str] = []
    gaps: dict[int, float | None] = {}
    if native is not None:
        if formatted_prompt is None:
            raise ValueError("native runs need formatted_prompt (the text llama.cpp tokenizes)")
        try:
            text = native_prompt(target, formatted_prompt, prompt)   # exactly our tokens, or no native row
        except NativeRunError as e:
            notes.append(f"{NATIVE_PREFIX}rows: {e}")
            native = None
        else:
            # bytes as they are, read with -bf: the trailing newline of "<|im_start|>assistant\n" stays
            fd, name = tempfile.mkstemp(prefix="llamaspec-bench-", suffix=".txt")
            with os.fdopen(fd, "wb") as f:
                f.write(text.encode("utf-8"))
            prompt_file = Path(name)
            prompt_pieces = pieces(target, prompt)
    try:
        for rep in range(1, reps + 1):
            plain = run_mode(target, "none", prompt, settings, label=PLAIN)
            plain.ratio = plain.e2e_ratio = 1.0
            runs[PLAIN].append(plain)
            if on_run:
                on_run(rep, plain)
            for c in configs:
                cs = replace(settings, draft_path=c.draft_path, **dict(c.overrides))
                r = run_mode(target, c.spec, prompt, cs, label=c.label).compare_to(plain)
                runs.setdefault(c.label, []).append(r)
                if on_run:
                    on_run(rep, r)
            if native is not None and prompt_file is not None:
                plain_pieces = pieces(target, plain.tokens or [])
                for c in configs:
                    cs = replace(settings, draft_path=c.draft_path, **dict(c.overrides))
                    try:
                        nr = run_native(native, target.path, c.spec, prompt_file, cs, prompt_pieces,
                                        plain_pieces).compare_to(plain)
                    except NativeRunError as e:
                        msg = f"{NATIVE_PREFIX}{c.label}: {e}"
                        if msg not in notes:
                            notes.append(msg)
                        continue
                    nr.mode, nr.spec, nr.draft = NATIVE_PREFIX + c.label, c.spec, c.draft
                    if nr.identical is False and nr.first_difference is not None:
                        nr.top2_gap = _gap(gaps, target, prompt, plain.tokens or [], nr.first_difference,
                                           settings.threads)
                    runs.setdefault(nr.mode, []).append(nr)
                    if on_run:
                        on_run(rep, nr)
    finally:
        if prompt_file is not None:
            prompt_file.unlink(missing_ok=True)
    return BenchResult(prompt_tokens=len(prompt), reps=reps, settings=settings, runs=runs,
                       summaries=summarise(runs), notes=notes)


def _gap(cache: dict[int, float | None], target: "Model", prompt: Sequence[int], plain: Sequence[int], i: int,
         threads: int | None) -> float | None:
    """The target's top-2 gap where a native text leaves plain decoding's (token i), once per i."""
    if i not in cache:
        cache[i] = top2_gap(target, prompt, plain[:i], threads) if i <= len(plain) else None
    return cache[i]
