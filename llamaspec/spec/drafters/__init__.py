"""Drafters: one per method behind the small `Drafter` interface (see base.py)."""

from llamaspec.spec.drafters.base import Draft, Drafter
from llamaspec.spec.drafters.chain import PRIORITY, ChainDrafter, canonical_name, order_by_priority
from llamaspec.spec.drafters.ngram import NgramModDrafter, NgramSimpleDrafter

__all__ = [
    "Draft",
    "Drafter",
    "ChainDrafter",
    "PRIORITY",
    "canonical_name",
    "order_by_priority",
    "NgramSimpleDrafter",
    "NgramModDrafter",
]
