"""The one question every KV-reuse path asks: how many leading tokens do two token lists share?

The engine (a prompt on a sequence id that already holds tokens), the server's slot routing, and
each drafter with KV or hidden rows of its own keep what still matches and redo the rest.

    >>> common_prefix([1, 2, 3, 4], [1, 2, 9])
    2
    >>> common_prefix([1, 2, 3], [1, 2, 3], limit=2)   # e.g. the last prompt token is redone
    2
    >>> common_prefix([1, 2, 3, 4], [1, 2, 3, 5], start=2)   # the first two known to match
    3
    >>> common_prefix([], [], limit=-1)   # an empty prompt: nothing to reuse
    0
"""

from __future__ import annotations

from typing import Sequence


def common_prefix(a: Sequence[int], b: Sequence[int], *, start: int = 0, limit: int | None = None) -> int:
    """The first index i >= start with a[i] != b[i], at most min(len(a), len(b), limit); tokens
    before `start` are taken as matching (the caller knows they cannot have changed)."""
    end = min(len(a), len(b)) if limit is None else max(0, min(len(a), len(b), limit))
    i = min(start, end)
    while i < end and a[i] == b[i]:
        i += 1
    return i
