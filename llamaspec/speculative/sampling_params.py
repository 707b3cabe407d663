"""Target sampling settings (`SamplingParams`, llama.cpp's defaults) and the seed rules, validated
once for every way in: CLI flags, the Generator, batch lines and server requests. Their defaults
and ranges are the knob table's (llamaspec/knobs.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llamaspec import knobs
from llamaspec.knobs import DEFAULT


@dataclass(frozen=True)
class SamplingParams:
    """Target sampling settings, llama.cpp's defaults (common_params_sampling).

    temperature <= 0 means greedy. top_k <= 0, top_p >= 1, min_p <= 0 disable those stages.
    Penalties (llama.cpp's `penalties` sampler) look at the last `repeat_last_n` tokens
    (-1: all; 0: off) and are off while repeat_penalty == 1 and the other two are 0.
    """

    temperature: float = DEFAULT.temperature
    top_k: int = DEFAULT.top_k
    top_p: float = DEFAULT.top_p
    min_p: float = DEFAULT.min_p
    repeat_penalty: float = DEFAULT.repeat_penalty
    repeat_last_n: int = DEFAULT.repeat_last_n
    frequency_penalty: float = DEFAULT.frequency_penalty
    presence_penalty: float = DEFAULT.presence_penalty
    min_keep: int = 0
    seed: int | None = DEFAULT.seed

    def __post_init__(self) -> None:
        """Validated once, here, for every way in (CLI flags, Generator, batch lines, requests), by
        the knob table's one check (its UsageError names the field)."""
        for name in knobs.SAMPLING:
            if name != "seed":
                knobs.check(name, getattr(self, name))
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
        llamaspec.errors.UsageError: seed must be a 64-bit integer (between -2^63 and 2^63-1), got 9223372036854775808
    """
    seed = knobs.check("seed", seed)
    return None if seed in RANDOM_SEEDS else seed


def seed_entropy(seed: int | None) -> int | None:
    """What numpy's SeedSequence takes for a checked seed: a negative int64 becomes its two's
    complement (an unsigned 64-bit value, so -5 and 5 stay different seeds); None stays None.

        >>> seed_entropy(-5), seed_entropy(5), seed_entropy(None)
        (18446744073709551611, 5, None)
    """
    return None if seed is None else seed % (1 << 64)
