"""Which slot a request takes, and what that slot's KV cache starts with: llama-server's rule (the
free slot whose cached prompt shares the longest prefix with the new one) and the RAM prompt cache
(speculative/prompt_cache.py) saving a slot's KV before a different prompt cuts it.
"""

from __future__ import annotations

from typing import Collection, Mapping

from llamaspec.speculative.prefix import common_prefix


def pick_slot(cached: Mapping[int, list[int]], parallel: int, busy: Collection[int],
              last_used: Mapping[int, int], tokens: list[int]) -> tuple[int, int]:
    """The free slot whose KV cache (`cached`: slot -> its tokens) shares the longest prefix with
    `tokens` (ties: the least recently used), and that prefix's length. How much of it is reused
    is the engine's to say (a drafter fed by the target's hidden states may need part of it
    evaluated again): stats' n_prompt_cached.

        >>> pick_slot({0: [1, 2, 3], 1: [1, 9]}, 3, busy=(), last_used={0: 2, 1: 1, 2: 0}, tokens=[1, 2, 3, 4])
        (0, 3)
        >>> pick_slot({0: [1, 2, 3], 1: [1, 9]}, 3, busy=(0,), last_used={0: 2, 1: 1, 2: 0}, tokens=[1, 2, 3, 4])
        (1, 1)
    """
    best = None
    for slot in range(parallel):
        if slot in busy:
            continue
        n = common_prefix(cached.get(slot, []), tokens, limit=len(tokens) - 1)
        key = (n, -last_used[slot])
        if best is None or key > best[0]:
            best = (key, slot, n)
    return best[1], best[2]
