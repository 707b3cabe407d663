"""Judging a greedy flip: llama.cpp's batch noise on a model, measured, and the gap at the flip.

Greedy speculative decoding is lossless in exact arithmetic, but ggml's kernels give slightly
different logits for a token evaluated inside a batch than alone: plain decoding evaluates each
generated token alone, a verify step the last token and its draft together, `--parallel` several
sequences' rows in one batch. Where the target's two best logits are closer than that noise, a
correct engine can take the other token; a bug diverges where they are clearly apart.

    measure_noise(target, prompts)  evaluates the first tokens of plain greedy decoding alone, then
        the same tokens in batches of several shapes (one batch, verify-sized batches, beside a
        second sequence's rows): `Noise.diff` is the largest change seen of a difference between
        a row's best logit and one of the next best (what moves a greedy choice; a shift of the
        whole row moves none), `Noise.bound` = max(FLOOR, FACTOR * diff), the gap under which a
        flip is noise.
    judge_flip(target, prompt, plain, other, bound)  at the first token where `other` leaves
        `plain`, the target's logits after the prompt and plain's tokens before it, evaluated as
        plain decoding does (the prompt in one batch, then token by token): the gap between the
        two tokens the runs took (the top-2 gap at a flip of noise; the top-2 gap when a run ended
        there). `Flip.near_tie` is gap < bound.

The bound is measured per model and thread count (noise on a random-weight tiny model, an F16 and a
Q4_K_M differ by orders of magnitude; SmolLM2 Q4_1 after a 390-token prompt measured 0 with one
thread and 0.56 with two), never a constant. Nothing here imports llama_cpp at module level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import numpy as np

    from llamaspec.runtime.llama import Model

# A gap is the difference of two logits, each of which may move by the largest difference seen;
# and the shapes measured are not every shape a run meets: twice the gap's worst case.
FACTOR = 2.0
FLOOR = 0.01          # logits: a model without measurable noise still judges a flip this close noise
TOP_K = 8             # the best tokens of a row whose differences to the first are compared
N_TOKENS = 24         # tokens per prompt evaluated alone and in batches
N_PROMPTS = 3
VERIFY_ROWS = 5       # a verify batch: the last token and a draft of 4


@dataclass(frozen=True)
class Noise:
    diff: float                # the largest change of (top logit - a next best one), alone against in a batch
    max_abs: float             # the largest |logit difference| anywhere in a row (a whole row shifts too)
    rows: int                  # rows compared
    shapes: tuple[tuple[str, float], ...] = ()   # each batch shape's `diff`

    @property
    def bound(self) -> float:
        return noise_bound(self.diff)

    def to_dict(self) -> dict:
        return {"diff": self.diff, "max_abs": self.max_abs, "rows": self.rows, "shapes": dict(self.shapes),
                "bound": self.bound, "factor": FACTOR, "floor": FLOOR}

    @classmethod
    def from_dict(cls, d: dict) -> "Noise":
        return cls(float(d["diff"]), float(d["max_abs"]), int(d["rows"]),
                   tuple((str(k), float(v)) for k, v in dict(d.get("shapes", {})).items()))

    @property
    def text(self) -> str:
        return (f"batch noise: the target's logit differences move by up to {self.diff:.3g} in a batch against "
                f"alone ({self.rows} rows); a flip where the two tokens are closer than {self.bound:.3g} is noise")


def noise_bound(max_diff: float) -> float:
    return max(FLOOR, FACTOR * max_diff)


@dataclass(frozen=True)
class Flip:
    index: int                 # the first differing token
    plain_token: int | None    # None: that run ended there
    other_token: int | None
    gap: float
    bound: float

    @property
    def near_tie(self) -> bool:
        return self.gap < self.bound

    @property
    def note(self) -> str:
        if self.near_tie:
            return f"flip at a near-tie (gap {self.gap:.3g} < bound {self.bound:.3g})"
        return f"a real divergence (gap {self.gap:.3g} >= bound {self.bound:.3g})"


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# ---- the measurements (llama.cpp) -------------------------------------------------------------------


def _context(target: "Model", n_ctx: int, threads: int | None, n_seq: int = 1):
    from llamaspec.runtime.context import Context, ContextConfig

    # as the pipeline makes it: n_ctx per sequence, padded to 256 (speculative/pipeline.py)
    n_ctx = -(-max(1, n_ctx) // 256) * 256
    return Context(target, ContextConfig(n_ctx=n_ctx * n_seq, n_threads=threads, n_seq_max=n_seq))


def plain_rows(ctx, prompt: Sequence[int], tokens: Sequence[int], seq_id: int = 0,
               last_only: bool = False) -> "np.ndarray":
    """Logits rows as plain decoding computes them: the prompt in one batch (its last row), then
    each of `tokens` alone (its row). Returns len(tokens) + 1 rows; row i predicts tokens[i]
    (last_only: the last row alone, shape (1, n_vocab): a 150k vocabulary is 1.2 MB a row)."""
    import numpy as np

    n = ctx.decode(list(prompt), 0, seq_id, "last")
    rows = [ctx.logits(n)[0].astype(np.float64)]
    for j, t in enumerate(tokens):
        n = ctx.decode([int(t)], len(prompt) + j, seq_id, "last")
        if last_only and j < len(tokens) - 1:
            continue
        row = ctx.logits(n)[0].astype(np.float64)
        rows = [row] if last_only else rows + [row]
    return np.stack(rows)


def _greedy(ctx, prompt: Sequence[int], n: int) -> tuple[list[int], "np.ndarray"]:
    """n tokens of plain greedy decoding and their rows (row j: after token j)."""
    import numpy as np

    k = ctx.decode(list(prompt), 0, 0, "last")
    row = ctx.logits(k)[0]
    toks, rows = [], []
    for j in range(n):
        toks.append(int(np.argmax(row)))
        k = ctx.decode([toks[-1]], len(prompt) + j, 0, "last")
        row = ctx.logits(k)[0]
        rows.append(row.astype(np.float64))
    return toks, np.stack(rows)


def _batched(ctx, prompt: Sequence[int], toks: Sequence[int], size: int) -> "np.ndarray":
    """The rows of `toks` evaluated in batches of `size` after the prompt (already in the KV)."""
    import numpy as np

    rows = []
    for i in range(0, len(toks), size):
        chunk = list(toks[i:i + size])
        k = ctx.decode(chunk, len(prompt) + i, 0, "all")
        rows.append(ctx.logits(k)[:k].astype(np.float64))
    return np.concatenate(rows)


def _side_by_side(ctx, prompts: Sequence[Sequence[int]], conts: Sequence[Sequence[int]],
                  size: int) -> list["np.ndarray"]:
    """Two sequences' continuations in batches of `size` rows each, both in every batch (as
    --parallel pairs sequences): the rows of each."""
    import numpy as np

    for s, p in enumerate(prompts):
        ctx.decode(list(p), 0, s, "last")
    rows: list[list] = [[] for _ in prompts]
    for i in range(0, max(len(c) for c in conts), size):
        segs = [(list(c[i:i + size]), len(p) + i, s) for s, (p, c) in enumerate(zip(prompts, conts)) if c[i:i + size]]
        firsts = ctx.decode_many(segs, outputs="all")
        out = ctx.logits(sum(len(t) for t, _, _ in segs))
        for (t, _, s), f in zip(segs, firsts):
            rows[s].append(out[f:f + len(t)].astype(np.float64))
    return [np.concatenate(r) for r in rows]


def measure_noise(target: "Model", prompts: Sequence[Sequence[int]], *, n_tokens: int = N_TOKENS,
                  n_prompts: int = N_PROMPTS, depth: int = 0, n_ctx: int = 4096,
                  threads: int | None = None) -> Noise:
    """Each of the first `n_prompts` prompts, then `n_tokens` of its plain greedy continuation
    evaluated alone (as plain decoding does) and again in batches: all at once, verify-sized
    (VERIFY_ROWS), and verify-sized beside a second sequence's rows (another prompt's; two
    sequences in a unified KV cache, as --parallel). Returns the largest differences seen.

    The noise grows with the context (measured: none at all after a 45-token prompt of SmolLM2
    Q4_1, 0.56 after 387 tokens): with `depth` (the positions a run reaches, prompt + tokens),
    each prompt is measured a second time after a prefix that long (the prompt, then the prompts
    again as filler; a prefix is evaluated in one batch either way, so what it says matters little)."""
    prompts = [list(p) for p in prompts[:max(1, n_prompts)] if p]
    if not prompts:
        raise ValueError("no prompt to measure batch noise on")
    filler = [t for p in prompts for t in p]
    starts = [p for p in prompts]
    starts += [(p + filler * (depth // len(filler) + 1))[:depth - n_tokens] for p in prompts
               if depth - n_tokens > len(p)]
    n_ctx = max(n_ctx, 2 * (max(len(p) for p in starts) + n_tokens))
    shapes: dict[str, float] = {}
    max_abs, n_rows = 0.0, 0
    conts, alones = [], []

    def seen(shape: str, alone, got) -> None:
        nonlocal max_abs, n_rows
        diff, big = _compare(alone, got)
        shapes[shape] = max(shapes.get(shape, 0.0), diff)
        max_abs, n_rows = max(max_abs, big), n_rows + len(got)

    for p in starts:
        ctx = _context(target, n_ctx, threads)
        try:
            toks, alone = _greedy(ctx, p, n_tokens)
            for shape, size in ((f"one batch of {n_tokens}", n_tokens), (f"batches of {VERIFY_ROWS}", VERIFY_ROWS)):
                ctx.seq_rm(0, len(p), -1)
                seen(shape, alone, _batched(ctx, p, toks, size))
        finally:
            ctx.close()
        conts.append(toks)
        alones.append(alone)
    for i in range(0, len(starts), 2):   # two by two (the last beside the first when they are odd)
        pair = [i, i + 1] if i + 1 < len(starts) else [i, 0]
        ctx = _context(target, n_ctx, threads, n_seq=2)
        try:
            got = _side_by_side(ctx, [starts[k] for k in pair], [conts[k] for k in pair], VERIFY_ROWS)
        finally:
            ctx.close()
        for k, rows in zip(pair, got) if pair[0] != pair[1] else [(i, got[0])]:
            seen(f"batches of {VERIFY_ROWS} beside another sequence's", alones[k], rows)
    return Noise(max(shapes.values()), max_abs, n_rows, tuple(shapes.items()))


def _compare(alone: "np.ndarray", got: "np.ndarray") -> tuple[float, float]:
    """(largest change of a difference between a row's top logit and one of its TOP_K - 1 next
    best, as evaluated alone; largest |logit difference| anywhere) over the rows. A shift of a
    whole row changes no choice: what can flip a greedy token is the first, and it is measured
    where the choice is made, among the best tokens."""
    import numpy as np

    n = min(len(alone), len(got))
    if not n:
        return 0.0, 0.0
    a, b = alone[:n], got[:n]
    d = b - a
    top = np.argsort(-a, axis=1)[:, :TOP_K]
    dt = np.take_along_axis(d, top, 1)
    return float(np.max(np.abs(dt[:, 1:] - dt[:, :1]))), float(np.max(np.abs(d)))


def judge_flip(target: "Model", prompt: Sequence[int], plain: Sequence[int], other: Sequence[int], bound: float,
               *, n_ctx: int = 4096, threads: int | None = None) -> Flip | None:
    """The first token where `other` leaves `plain` (None: identical), judged as the module says."""
    import numpy as np

    i = first_difference(plain, other)
    if i is None:
        return None
    a = int(plain[i]) if i < len(plain) else None
    b = int(other[i]) if i < len(other) else None
    ctx = _context(target, max(n_ctx, len(prompt) + i + 1), threads)
    try:
        row = plain_rows(ctx, prompt, plain[:i], last_only=True)[-1]
    finally:
        ctx.close()
    if a is not None and b is not None:
        gap = abs(float(row[a] - row[b]))
    else:   # a run ended there: the model's own two best
        top = np.sort(row)[-2:]
        gap = float(top[1] - top[0])
    return Flip(i, a, b, gap, bound)


def make_judge(target: "Model", prompts: Sequence[Sequence[int]], bound: float, *, n_ctx: int = 4096,
               threads: int | None = None):
    """A sweep's Judge (tune/measure.py) on these prompts: judge_flip, each flip evaluated once."""
    seen: dict[tuple, Flip | None] = {}

    def judge(i: int, plain: Sequence[int], other: Sequence[int]) -> Flip | None:
        at = first_difference(plain, other)
        if at is None:
            return None
        key = (i, tuple(plain[:at + 1]), other[at] if at < len(other) else None)
        if key not in seen:
            seen[key] = judge_flip(target, prompts[i], plain, other, bound, n_ctx=n_ctx, threads=threads)
        return seen[key]

    return judge


# ---- the measured noise, kept per model file, llama.cpp build and device -----------------------------

CACHE_NAME = "batch-noise.json"


def cached_noise(target_path, n_gpu_layers: int | None, threads: int | None, measure) -> tuple[Noise, bool]:
    """The noise stored for this target file, thread count, build and device, else `measure()`
    (stored beside tune's store). Returns (noise, whether it came from the store). A cache that
    cannot be read or written only costs a measurement. (The thread count is part of the key:
    SmolLM2 Q4_1 after a 390-token prompt measured 0 with one thread, 0.56 with two.)"""
    import json
    import os
    import tempfile

    from llamaspec.tune.identity import build_identity, device_identity, file_identity
    from llamaspec.tune.store import config_dir

    path = config_dir() / CACHE_NAME
    ident = file_identity(target_path)
    key = "/".join([ident.edges, str(ident.size), str(ident.mtime_ns), build_identity().id,
                    device_identity(n_gpu_layers).id, f"t{threads or 0}"])
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
        return Noise.from_dict(entries[key]), True
    except (OSError, ValueError, KeyError, TypeError):
        pass
    noise = measure()
    try:
        try:
            entries = json.loads(path.read_text(encoding="utf-8"))
            entries = entries if isinstance(entries, dict) else {}
        except (OSError, ValueError):
            entries = {}
        entries[key] = {**noise.to_dict(), "path": ident.path}
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{CACHE_NAME}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(entries, f, indent=1)
        os.replace(tmp, path)
    except OSError:
        pass
    return noise, False
