"""Drafters: one per method behind the small `Drafter` interface (see base.py)."""

from llamaspec.speculative.drafters.base import Draft, Drafter
from llamaspec.speculative.drafters.chain import ChainDrafter
from llamaspec.speculative.drafters.ngram_mod import NgramModDrafter
from llamaspec.speculative.drafters.ngram_simple import NgramSimpleDrafter

__all__ = [
    "Draft",
    "Drafter",
    "ChainDrafter",
    "NgramSimpleDrafter",
    "NgramModDrafter",
]
