"""Shared pieces of the engine tests: prompts, a pipeline runner and the losslessness criterion.

Lossless in exact arithmetic is not bit-identical in floating point: llama.cpp's CPU kernels give
slightly different logits for a token evaluated in a batch of k than alone (measured here on
SmolLM2 F16 with a 440-token context: up to 0.08 in a logit; Q4_1: up to 1.05). So a greedy run
may flip where the target's two best logits are nearly tied. The criterion: identical tokens, or
at the first differing position a top-2 logit gap below `eps`. A bug diverges at clear margins.
The noise of a model, measured (what `tune` judges flips by): llamaspec.tune.flips.measure_noise;
`plain_path` for texts of byte tokens (a random-weight model's), which cannot be retokenized.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llamaspec.speculative.options import SpecOptions, parse_spec_types
from llamaspec.speculative.pipeline import load_pipeline
from llamaspec.runtime.llama import Model
from llamaspec.runtime.context import Context, ContextConfig
from llamaspec.speculative.sampling_params import SamplingParams

# The benchmark's code-rewrite prompt: a model rewriting a file copies most of it.
CODE_REWRITE = (Path(__file__).resolve().parents[1] / "llamaspec" / "prompts" / "code_rewrite.txt").read_text()

PROMPTS = {
    "chat": "Explain in two sentences what a hash map is.",
    "code": CODE_REWRITE,
    "story": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "repetitive": "Repeat this line five times: the quick brown fox jumps over the lazy dog.",
}


@dataclass
class Run:
    tokens: list[int]
    stats: object


def prompt_tokens(model: Model, text: str) -> list[int]:
    if model.chat_template:
        text = model.chat_prompt([{"role": "user", "content": text}])
    return model.tokenize_prompt(text)


def generate(target: Model, spec: str, prompt: list[int], *, draft: Path | None = None, n: int = 48,
             sampling: SamplingParams | None = None, draft_max: int | None = None, adaptive: bool = True,
             threads: int = 1) -> Run:
    sampling = sampling or SamplingParams(temperature=0.0)
    types = parse_spec_types(spec)
    opts = SpecOptions(spec_types=types, draft_path=draft, n_ctx=1024, n_threads=threads,
                       draft_max=draft_max, adaptive=adaptive)
    pipe = load_pipeline(target.path, opts, sampling, target=target)
    try:
        g = pipe.engine.generate(prompt, pipe.config(max_tokens=n, sampling=sampling))
    finally:
        pipe.close(keep_target=True)
    return Run(g.tokens, g.stats)


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def top2_gap(target: Model, prompt: list[int], generated_prefix: list[int], threads: int = 1,
             n_ctx: int = 1024) -> float:
    """Gap between the target's two best logits after prompt + generated_prefix."""
    ctx = Context(target, ContextConfig(n_ctx=n_ctx, n_threads=threads))
    try:
        n = ctx.decode(prompt + generated_prefix, 0, 0, "last")
        row = np.sort(ctx.logits(n)[0].astype(np.float64))
        return float(row[-1] - row[-2])
    finally:
        ctx.close()


def assert_lossless(target: Model, prompt: list[int], reference: list[int], got: list[int], eps: float,
                    label: str, n_ctx: int = 1024) -> str:
    """Identical, or a near-tie flip; returns a note for the report."""
    i = first_divergence(reference, got)
    if i is None:
        return f"{label}: identical ({len(got)} tokens)"
    gap = top2_gap(target, prompt, reference[:i], n_ctx=n_ctx)
    assert gap < eps, (f"{label}: diverged at token {i} where the target's top-2 logit gap is {gap:.4f} "
                       f"(>= {eps}): a real divergence, not float noise")
    return f"{label}: near-tie flip at token {i} (top-2 gap {gap:.4f})"


def same_text_or_near_tie(target: Model, prompt: list[int], reference: str, got: str, eps: float, label: str) -> str:
    """Two greedy texts of one prompt from runs whose batch shapes differ (a reused prefix, a
    stream against a whole answer, drafting): identical, or (as tokens, over their common length)
    first different where the target's top-2 logit gap is below `eps`. Returns a note."""
    if reference == got:
        return f"{label}: identical text"
    a, b = (target.tokenize(t, add_special=False, parse_special=False) for t in (reference, got))
    n = min(len(a), len(b))
    return assert_lossless(target, prompt, a[:n], b[:n], eps, label)


@dataclass
class PlainPath:
    """Plain greedy decoding of a prompt, with where its first near-tie falls: up to there every
    batch shape must write the same tokens (a flip needs a gap below the batch noise)."""

    text: str                  # plain decoding's text
    tokens: list[int]
    near_tie: int | None       # the first token whose top-2 logit gap is below the bound (None: none)
    gap: float | None          # that gap
    sure: str                  # the text of the tokens before it: every run's text starts with it


def plain_path(target: Model, prompt: list[int], text: str, tokens: list[int], bound: float, *, ended: bool,
               n_ctx: int = 1024, threads: int = 1) -> PlainPath:
    """`text` and `tokens` of plain greedy decoding of `prompt` (ended: it stopped at an end of
    generation, whose choice counts too), their top-2 gaps evaluated as plain decoding does
    (llamaspec.tune.flips.plain_rows), and the text before the first gap below `bound`, decoded
    as the output does (an incomplete UTF-8 sequence at its end left out). Works on texts of
    byte tokens, which a text cannot be replayed through (they are written as U+FFFD)."""
    import codecs

    from llamaspec.tune.flips import plain_rows

    ctx = Context(target, ContextConfig(n_ctx=max(n_ctx, len(prompt) + len(tokens) + 8), n_threads=threads))
    try:
        rows = plain_rows(ctx, prompt, tokens)
    finally:
        ctx.close()
    top = np.sort(rows, axis=1)[:, -2:]
    gaps = top[:, 1] - top[:, 0]
    if not ended:
        gaps = gaps[:-1]
    low = [i for i, g in enumerate(gaps) if g < bound]
    if not low:
        return PlainPath(text, list(tokens), None, None, text)
    dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
    sure = "".join(dec.decode(target.piece(t)) for t in tokens[:low[0]])
    return PlainPath(text, list(tokens), low[0], float(gaps[low[0]]), sure)
