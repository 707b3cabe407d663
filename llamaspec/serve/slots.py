"""Which slot a request takes, and what that slot's KV cache starts with: llama-server's rule (the
free slot whose cached prompt shares the longest prefix with the new one) and the RAM prompt cache
(serve/prompt_cache.py) saving a slot's KV before a different prompt cuts it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Collection, Mapping

from llamaspec.errors import LlamaspecError
from llamaspec.serve.prompt_cache import MIN_TOKENS, PromptCache
from llamaspec.speculative.prefix import common_prefix

if TYPE_CHECKING:
    from llamaspec.speculative.engine import SpecEngine


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


def swap_in(cache: PromptCache | None, engine: "SpecEngine", slot: int, tokens: list[int], here: int) -> None:
    """Before `tokens` take `slot`, whose KV shares `here` tokens with them: save the slot's KV to
    the RAM prompt cache if the new prompt would cut much of it, and restore a saved state that
    shares a longer prefix with it."""
    ctx = engine.ctx
    if cache is None:
        return
    cached = engine._cached.get(slot, [])
    if len(cached) - here >= MIN_TOKENS:
        cache.put(cached, ctx.save_seq(slot))
    # (the last prompt token is always evaluated, for its logits)
    key, n = cache.best(tokens, limit=len(tokens) - 1)
    if key is None or n < here + MIN_TOKENS:
        return
    try:
        ctx.load_seq(cache.get(key), slot)
    except LlamaspecError:   # no room for it in the KV cache now: evaluate as usual
        ctx.seq_rm(slot, 0, -1)
        engine._cached[slot] = []
        return
    engine._cached[slot] = list(key)
