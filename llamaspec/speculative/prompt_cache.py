"""Prompts that left their server slot or batch sequence, kept in RAM to be restored later
(llama-server's `--cache-ram`; `serve` and `batch` take it).

A slot keeps the KV of its last prompt and answer, so a request that comes back to it evaluates
only its new tokens. With more conversations than slots, a slot is soon taken by another prompt
and its KV cut: measured on SmolLM2 with 8 clients and 4 slots, llama-server without its RAM
cache evaluated 7377 prompt tokens, with it 3347. So before a slot's KV is cut, its state
(`llama_state_seq_get_data`) is saved here, keyed by its tokens; a request whose prompt shares a
longer prefix with a saved state than with its slot gets that state restored into the slot, and
the engine's usual prefix reuse takes it from there. Least recently used entries go first when
the byte limit is reached.

    >>> c = PromptCache(limit_bytes=10)
    >>> c.put([1, 2, 3], bytearray(4)); c.put([1, 5], bytearray(4)); c.best([1, 2, 3, 9])
    ((1, 2, 3), 3)
    >>> c.put([7, 7, 7], bytearray(4)); sorted(c.keys())   # over 10 bytes: [1, 2, 3] was oldest
    [(1, 5), (7, 7, 7)]
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

from llamaspec.errors import LlamaspecError

from llamaspec.speculative.prefix import common_prefix

MIN_TOKENS = 32   # fewer tokens to lose or to gain: evaluating them again is cheaper than the copy


class PromptCache:
    def __init__(self, limit_bytes: int):
        self.limit = limit_bytes
        self.size = 0
        self._items: OrderedDict[tuple[int, ...], bytearray] = OrderedDict()

    def keys(self) -> list[tuple[int, ...]]:
        return list(self._items)

    def best(self, tokens: Sequence[int], limit: int | None = None) -> tuple[tuple[int, ...] | None, int]:
        """The saved prompt sharing the longest prefix with `tokens` (at most `limit`), and its length."""
        best, n = None, 0
        for key in self._items:
            m = common_prefix(key, tokens, limit=limit)
            if m > n:
                best, n = key, m
        return best, n

    def get(self, key: tuple[int, ...]) -> bytearray:
        self._items.move_to_end(key)
        return self._items[key]

    def put(self, tokens: Sequence[int], state: bytearray) -> None:
        key = tuple(tokens)
        if len(state) > self.limit:
            return
        old = self._items.pop(key, None)
        if old is not None:
            self.size -= len(old)
        while self._items and self.size + len(state) > self.limit:
            _, dropped = self._items.popitem(last=False)
            self.size -= len(dropped)
        self._items[key] = state
        self.size += len(state)


def swap_in(cache: PromptCache | None, engine, slot: int, tokens: list[int], here: int) -> None:
    """Before `tokens` take `slot` (a sequence id of `engine`, the SpecEngine), whose KV shares
    `here` tokens with them: save the slot's KV to the RAM prompt cache if the new prompt would
    cut much of it, and restore a saved state that shares a longer prefix with it."""
    ctx = engine.ctx
    if cache is None:
        return
    cached = engine.cached.get(slot, [])
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
        engine.cached[slot] = []
        return
    engine.cached[slot] = list(key)
