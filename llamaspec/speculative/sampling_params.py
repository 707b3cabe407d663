"""Target sampling settings (`SamplingParams`, llama.cpp's defaults) and the seed rules, validated
once for every way in: CLI flags, the Generator, batch lines and server requests.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    """Target sampling settings, llama.cpp's defaults (common_params_sampling).

    temperature <= 0 means greedy. top_k <= 0, top_p >= 1, min_p <= 0 disable those stages.
    Penalties (llama.cpp's `penalties` sampler) look at the last `repeat_last_n` tokens
    (-1: all; 0: off) and are off while repeat_penalty == 1 and the other two are 0.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    min_keep: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        """Validated once, here, for every way in (CLI flags, Generator, batch lines, requests)."""
        from llamaspec.errors import SAMPLING_NUMBER, UsageError, sampling_number_ok

        for name, ok, rule in (("temperature", lambda v: v >= 0, ">= 0 (0 = greedy)"),
                               ("top_p", lambda v: 0 < v <= 1, "in (0, 1]"),
                               ("min_p", lambda v: 0 <= v <= 1, "in [0, 1]"),
                               ("repeat_penalty", lambda v: v > 0, "> 0 (1 = off)"),
                               ("repeat_last_n", lambda v: v >= -1, ">= -1 (-1: every token, 0: off)"),
                               # OpenAI's range; llama.cpp takes any value, but outside it a token's
                               # logit moves by more than any sane request means
                               ("frequency_penalty", lambda v: -2 <= v <= 2, "in [-2, 2] (0 = off)"),
                               ("presence_penalty", lambda v: -2 <= v <= 2, "in [-2, 2] (0 = off)")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
                raise UsageError(f"{name} must be a number {rule}, not {value!r}", field=name)
            if not sampling_number_ok(value):   # inf, NaN, 1e-310, 1e300: logits would turn inf or NaN
                raise UsageError(f"{name} must be {SAMPLING_NUMBER}, not {value!r}", field=name)
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool):
            raise UsageError(f"top_k must be an integer (<= 0: off), not {self.top_k!r}", field="top_k")
        object.__setattr__(self, "seed", check_seed(self.seed))

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def penalties_on(self) -> bool:
        return self.repeat_last_n != 0 and not (
            self.repeat_penalty == 1.0 and self.frequency_penalty == 0.0
            and self.presence_penalty == 0.0)

    def rng(self) -> np.random.Generator:
        """A numpy Generator seeded with `seed` (fresh entropy when None)."""
        return np.random.default_rng(seed_entropy(self.seed))


#: seeds that mean "a random seed", as in llama.cpp: -1 and LLAMA_DEFAULT_SEED (0xFFFFFFFF)
RANDOM_SEEDS = (-1, 0xFFFFFFFF)


def check_seed(seed: object) -> int | None:
    """A seed as every way in gives it -> the one SamplingParams keeps: None (fresh entropy) for
    None and the RANDOM_SEEDS, else the int64 itself; anything else is a UsageError naming `seed`.

        >>> check_seed(-1), check_seed(4294967295), check_seed(-5)
        (None, None, -5)
        >>> check_seed(1 << 63)
        Traceback (most recent call last):
        ...
        llamaspec.errors.UsageError: seed must be a 64-bit integer (between -2^63 and 2^63-1; -1: random), not 9223372036854775808
    """
    from llamaspec.errors import INT64_MAX, INT64_MIN, UsageError

    if seed is None:
        return None
    if isinstance(seed, bool) or not hasattr(seed, "__index__"):   # int, numpy integers
        raise UsageError(f"seed must be an integer (-1: random), not {seed!r}", field="seed")
    seed = operator.index(seed)
    if not INT64_MIN <= seed <= INT64_MAX:
        raise UsageError(f"seed must be a 64-bit integer (between -2^63 and 2^63-1; -1: random), not {seed}",
                         field="seed")
    return None if seed in RANDOM_SEEDS else seed


def seed_entropy(seed: int | None) -> int | None:
    """What numpy's SeedSequence takes for a checked seed: a negative int64 becomes its two's
    complement (an unsigned 64-bit value, so -5 and 5 stay different seeds); None stays None.

        >>> seed_entropy(-5), seed_entropy(5), seed_entropy(None)
        (18446744073709551611, 5, None)
    """
    return None if seed is None else seed % (1 << 64)
