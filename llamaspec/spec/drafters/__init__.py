"""Drafters: one per method behind the small `Drafter` interface (see base.py)."""

from llamaspec.spec.drafters.base import Draft, Drafter
from llamaspec.spec.drafters.chain import ChainDrafter
from llamaspec.spec.drafters.ngram_mod import NgramModDrafter
from llamaspec.spec.drafters.ngram_simple import NgramSimpleDrafter

__all__ = [
    "Draft",
    "Drafter",
    "ChainDrafter",
    "NgramSimpleDrafter",
    "NgramModDrafter",
]
