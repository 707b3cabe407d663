"""Several drafters tried in priority order; the first non-empty draft wins (llama.cpp's way).

llama.cpp (`common_speculative_draft` / `common_speculative_accept`):
- the implementations are tried in a fixed priority order (n-gram types first, then the ones with
  a draft model); the first one that returns a non-empty draft wins and is credited with it;
  the draft is cut to the caller's n_max;
- after verification, the winner gets `accept(seq, n_accepted, is_other=false)` and is credited
  with the accepted tokens; every other implementation gets `accept(..., is_other=true)` so it can
  keep its own state in sync.
`ChainDrafter` does the same. It is a `Drafter` itself, so the engine drives one drafter. What each
member drafted, and what of it was accepted, is counted once, by the engine (`SpecStats.per_drafter`).
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import numpy as np

from llamaspec.spec.drafters.base import Draft, Drafter

__all__ = ["PRIORITY", "ALIASES", "canonical_name", "order_by_priority", "ChainDrafter"]

#: llama.cpp's priority order of speculative types (common_speculative_init), highest first
PRIORITY: tuple[str, ...] = (
    "ngram-simple",
    "ngram-map-k",
    "ngram-map-k4v",
    "ngram-mod",
    "ngram-cache",
    "draft-simple",
    "draft-eagle3",
    "draft-mtp",
    "draft-dflash",
    "draft-dspark",
)

#: names users type that llama.cpp does not accept, mapped to llama.cpp's names
ALIASES: dict[str, str] = {
    "mtp": "draft-mtp",
    "draft": "draft-simple",
}


def canonical_name(name: str) -> str:
    """llama.cpp's spec-type name for `name` (aliases resolved, case and spaces ignored).

    >>> canonical_name(" MTP ")
    'draft-mtp'
    >>> canonical_name("ngram-mod")
    'ngram-mod'
    """
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in PRIORITY and key != "none":
        raise ValueError(f"unknown speculative type {name!r}; known: {', '.join(PRIORITY)} "
                         f"(aliases: {', '.join(sorted(ALIASES))})")
    return key


def order_by_priority(names: Iterable[str]) -> list[str]:
    """Canonical names sorted in llama.cpp's priority order, duplicates and "none" dropped.

    >>> order_by_priority(["mtp", "ngram-mod", "ngram-simple", "ngram-mod"])
    ['ngram-simple', 'ngram-mod', 'draft-mtp']
    """
    seen = {canonical_name(n) for n in names}
    seen.discard("none")
    return [n for n in PRIORITY if n in seen]


class ChainDrafter(Drafter):
    """Try `drafters` in the given order; the first non-empty draft wins (its `source` names it).

    Build the list in priority order (see `order_by_priority`).
    """

    name = "chain"

    def __init__(self, drafters: Sequence[Drafter]):
        if not drafters:
            raise ValueError("ChainDrafter needs at least one drafter")
        names = [d.name for d in drafters]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate drafter names in chain: {names}")
        self.drafters: list[Drafter] = list(drafters)
        self._winner: dict[int, Drafter] = {}

    def begin(self, seq_id: int, prompt_tokens: Sequence[int],
              rng: np.random.Generator | None = None) -> None:
        self._winner.pop(seq_id, None)
        for d in self.drafters:
            d.begin(seq_id, prompt_tokens, rng)

    def members(self) -> list[Drafter]:
        return [m for d in self.drafters for m in d.members()]

    def propose(self, seq_id: int, history: Sequence[int], n_max: int) -> Draft:
        return self.propose_within(seq_id, history, lambda d: n_max)

    def propose_within(self, seq_id: int, history: Sequence[int],
                       limit: Callable[[Drafter], int]) -> Draft:
        self._winner.pop(seq_id, None)
        for d in self.drafters:
            draft = d.propose_within(seq_id, history, limit)
            if draft.tokens:
                if not draft.source:
                    draft.source = d.name
                self._winner[seq_id] = d
                return draft
        return Draft([], None, "")

    def accepted(self, seq_id: int, n_accepted: int, new_tokens: Sequence[int],
                 is_other: bool = False) -> None:
        winner = self._winner.pop(seq_id, None)
        for d in self.drafters:
            d.accepted(seq_id, n_accepted, new_tokens, is_other or d is not winner)

    def end(self, seq_id: int) -> None:
        self._winner.pop(seq_id, None)
        for d in self.drafters:
            d.end(seq_id)

    def close(self) -> None:
        for d in self.drafters:
            d.close()
