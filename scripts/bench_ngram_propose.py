"""Cost of one ngram drafter propose() on a long, repetitive history (median over calls).

A benchmark, not a test (tests assert no speed): `python scripts/bench_ngram_propose.py`. The
drafters are meant to cost well under a millisecond per call at 2000 tokens of history, a small
fraction of a decode step; this prints what this machine measures.
"""

from __future__ import annotations

import random
import statistics
import time

from llamaspec.speculative.drafters.ngram_mod import NgramModDrafter
from llamaspec.speculative.drafters.ngram_simple import NgramSimpleDrafter


def median_propose_seconds(drafter, history: list[int], prompt_len: int, n_max: int, reps: int = 300) -> float:
    drafter.begin(0, history[:prompt_len])
    drafter.propose(0, history[:prompt_len + 1], n_max)  # the first call indexes what begin() did not
    times = []
    for i in range(reps):
        h = history[:prompt_len + 2 + i]
        t0 = time.perf_counter()
        drafter.propose(0, h, n_max)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    rng = random.Random(0)
    block = [rng.randrange(49152) for _ in range(300)]
    history: list[int] = []
    while len(history) < 2400:  # repetitive code-like text: lots of matches
        history += block[: rng.randrange(50, 300)] + [rng.randrange(49152) for _ in range(20)]
    for drafter in (NgramSimpleDrafter(), NgramModDrafter()):
        med = median_propose_seconds(drafter, history, 2000, 16)
        print(f"{drafter.name}: median {med * 1e6:.0f} us per propose (2000-token history, n_max 16)")


if __name__ == "__main__":
    main()
