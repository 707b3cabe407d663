"""Drafters: one per method behind the small `Drafter` interface (see base.py)."""

from llamaspec.drafters.base import Draft, Drafter
from llamaspec.drafters.chain import PRIORITY, ChainDrafter, canonical_name, order_by_priority
from llamaspec.drafters.ngram import NgramModDrafter, NgramSimpleDrafter

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
