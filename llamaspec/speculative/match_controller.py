"""Adaptive draft length per match length, for drafters that know how long a match a draft was
copied after (Draft.match: prompt-lookup).

A draft copied after a long match of context is far likelier to be right than one after a
two-token match (on the bundled code-rewrite prompt with SmolLM2: 0-2 tokens accepted after
matches of 2, 11-64 after matches of 3 or more). One `DraftLengthController` for all of them
would average the two and draft a middling length for both. So each match bucket gets its own
controller (its acceptance, its pauses and probes), all sharing one cost model: long drafts
where long matches earned them, none where short matches keep failing, and each bucket's probes
within the controller's probe budget.
"""

from __future__ import annotations

from typing import Callable

from llamaspec.speculative.controller import CostModel, DraftLengthController

__all__ = ["MATCH_EDGES", "PRIOR_ALPHA", "match_bucket", "MatchController"]

# Match lengths are pooled into buckets: <= 2, <= 4, <= 8, longer.
MATCH_EDGES = (2, 4, 8)
# Acceptance expected before any draft of a bucket was verified (the rest of a text is short, so
# starting from the middle wastes its best stretches): a 2-token match is weak evidence of a copy,
# 9+ tokens strong. Measured acceptance takes over after a few drafts (prior weight 2).
PRIOR_ALPHA = {0: 0.6, 1: 0.4, 2: 0.6, 3: 0.8, 4: 0.9}


def match_bucket(match: int | None) -> int:
    """Bucket of a draft's match length: 0 when not given, else 1.. by MATCH_EDGES.

        >>> [match_bucket(m) for m in (None, 1, 2, 3, 8, 9, 40)]
        [0, 1, 1, 2, 3, 4, 4]
    """
    if match is None:
        return 0
    for i, edge in enumerate(MATCH_EDGES):
        if match <= edge:
            return i + 1
    return len(MATCH_EDGES) + 1


class MatchController:
    """The DraftLengthController interface (choose / observe / observe_cost), one controller per
    match bucket underneath. `make(cost, prior_alpha)` builds a bucket's controller around the shared cost."""

    def __init__(self, make: Callable[[CostModel, float], DraftLengthController], cost: CostModel | None = None):
        self.cost = cost if cost is not None else CostModel()
        self._make = make
        self.buckets: dict[int, DraftLengthController] = {}
        self._last = 0  # bucket of the draft sized by the last choose()

    def _ctl(self, bucket: int) -> DraftLengthController:
        ctl = self.buckets.get(bucket)
        if ctl is None:
            ctl = self.buckets[bucket] = self._make(self.cost, PRIOR_ALPHA[bucket])
        return ctl

    def choose(self, match: int | None = None) -> int:
        self._last = match_bucket(match)
        return self._ctl(self._last).choose()

    def observe(self, n_drafted: int, n_accepted: int, verify_seconds: float | None = None,
                draft_seconds: float | None = None) -> None:
        if n_drafted > 0:
            self._ctl(self._last).observe(n_drafted, n_accepted, verify_seconds, draft_seconds)
        elif verify_seconds is not None:  # a plain step: only the shared costs learn from it
            self.cost.observe_verify(1, verify_seconds)

    def observe_cost(self, n_tokens: int, seconds: float) -> None:
        self.cost.observe_verify(n_tokens, seconds)

    @property
    def n_pauses(self) -> int:
        return sum(c.n_pauses for c in self.buckets.values())

    @property
    def paused(self) -> bool:
        return bool(self.buckets) and all(c.paused for c in self.buckets.values())
