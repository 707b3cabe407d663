"""Several drafters tried in priority order; the first non-empty draft wins (llama.cpp's way).

llama.cpp (`common_speculative_draft` / `common_speculative_accept`):
- the implementations are tried in a fixed priority order (n-gram types first, then the ones with
  a draft model; `priority` in options.SPEC_TYPES); the first one that returns a non-empty draft wins and is credited with it;
  the draft is cut to the caller's n_max;
- after verification, the winner gets `accept(seq, n_accepted, is_other=false)` and is credited
  with the accepted tokens; every other implementation gets `accept(..., is_other=true)` so it can
  keep its own state in sync.
`ChainDrafter` does the same. llamaspec's grammar drafter (grammar_jump.py) joins every chain,
first: it drafts only where a sequence's grammar forces text, and is silent (not asked, not timed)
for a sequence without one. `bind_grammars` reaches every member. It is a `Drafter` itself, so the engine drives one drafter. What each
member drafted, and what of it was accepted, is counted once, by the engine (`SpecStats.per_drafter`).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from llamaspec.speculative.drafters.base import Draft, Drafter

__all__ = ["ChainDrafter"]


class ChainDrafter(Drafter):
    """Try `drafters` in the given order; the first non-empty draft wins (its `source` names it).

    Build the list in priority order (see `options.order_by_priority`).
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

    def reuse_prefix(self, seq_id: int, prompt_tokens: Sequence[int], keep: int) -> int:
        # every member is told (each resets its own state); the target starts where the neediest asks
        return min([d.reuse_prefix(seq_id, prompt_tokens, keep) for d in self.drafters])

    def bind_grammars(self, grammars) -> None:
        for d in self.drafters:
            d.bind_grammars(grammars)

    def members(self) -> list[Drafter]:
        return [m for d in self.drafters for m in d.members()]

    def wait(self) -> None:
        for d in self.drafters:
            d.wait()

    def steady(self, seq_id: int) -> None:
        for d in self.drafters:
            d.steady(seq_id)

    def batch_member(self) -> Drafter | None:
        # the one member that batches, when the others only join every chain (the grammar
        # drafter, silent for sequences without a grammar): --draft X --parallel N keeps batching
        from llamaspec.speculative.options import chain_joiners

        batching = [d.batch_member() for d in self.drafters if d.name not in chain_joiners()]
        return batching[0] if len(batching) == 1 else None

    def drafted_by(self, seq_id: int, member: Drafter) -> None:
        self._winner[seq_id] = member

    def propose(self, seq_id: int, history: Sequence[int], n_max: int) -> Draft:
        return self.propose_within(seq_id, history, lambda d, match=None: n_max)

    def propose_within(self, seq_id: int, history: Sequence[int],
                       limit: Callable[..., int]) -> Draft:
        self._winner.pop(seq_id, None)
        hold = False
        for d in self.drafters:
            if hold and d.copies:   # a grammar copy drafter spoke for this step's copying
                continue
            draft = d.propose_within(seq_id, history, limit)
            if draft.tokens:
                if not draft.source:
                    draft.source = d.name
                self._winner[seq_id] = d
                return draft
            hold = hold or draft.hold
        return Draft([], None, "")

    def opening(self, seq_id: int, prompt: Sequence[int], n_max: int) -> Draft:
        # (before `begin`: the engine names the winner with drafted_by once the sequence began)
        for d in self.drafters:
            draft = d.opening(seq_id, prompt, n_max)
            if draft.tokens:
                draft.source = draft.source or d.name
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
