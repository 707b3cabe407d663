"""Drafts of another vocabulary on disk: translated pairs (compat.Verdict.kind == "translated").

discovery.scan rules out files whose vocabulary type or size differ from the target's before
any token text is read (they cannot be token-exact). An ordinary model among them can still draft
through text (speculative/drafters/translated.py), so `pair` and `--draft auto` give those that
are clearly smaller than the target a full verdict here. `--draft auto` takes one only where a
measurement says it pays (`pays`: api/resolve.py asks the `tune` store); the registry's translated
pairs are taken in autodraft.registry_choice.
"""

from __future__ import annotations

import os
from typing import Callable, Sequence

from llamaspec.errors import LlamaspecError
from llamaspec.gguf.header import GGUFHeader, read_file
from llamaspec.gguf.vocab import VocabInfo
from llamaspec.pairing import compat, discovery

#: a translated draft tokenizes text both ways each step: only clearly smaller files are worth a look
MAX_SIZE_RATIO = 0.6


def add_translated(header: GGUFHeader, candidates: Sequence[discovery.Candidate],
                   vocab: VocabInfo | None = None) -> list[discovery.Candidate]:
    """Give the ordinary models the vocabulary prefilter ruled out (another vocabulary type or
    size), and that are at most MAX_SIZE_RATIO of the target's size, their verdict; returns the
    candidates that can draft translated (those with a verdict already included)."""
    target_size = header.file_size or 0
    out = []
    for c in candidates:
        if c.draft_kind != "draft-simple" or discovery.is_mtp_sidecar_name(c.path.name):
            continue
        if c.verdict is None and c.skipped and c.skipped.startswith("vocabulary "):
            if target_size and c.size > MAX_SIZE_RATIO * target_size:
                continue
            try:
                h = read_file(c.path)
                c.verdict = compat.check_headers(header, h, target_vocab=vocab)
                c.n_params, c.file_type = h.n_params, h.file_type
                c.skipped = h.missing_data()
            except LlamaspecError as exc:
                c.skipped = exc.message
                continue
        if c.verdict is not None and c.verdict.kind == "translated" and not c.skipped:
            out.append(c)
    return out


def kind_of(c: discovery.Candidate) -> str:
    """token-exact, translated or incompatible (skipped files: incompatible)."""
    if c.skipped or c.verdict is None:
        return "incompatible"
    return c.verdict.kind


def pick_translated(header: GGUFHeader, candidates: Sequence[discovery.Candidate],
                    pays: Callable[[str], bool] | None) -> tuple[discovery.Candidate | None, str]:
    """The smallest translated draft on disk that a measurement says pays, and why (or why none)."""
    found = [c for c in candidates if kind_of(c) == "translated"]
    if not found:
        return None, "no translated draft (another vocabulary) on disk"
    paying = [c for c in found if pays is not None and pays(os.fspath(c.path))]
    if not paying:
        return None, (f"{len(found)} translated draft(s) on disk (another vocabulary), none measured to pay "
                      "(`llamaspec tune TARGET --draft FILE` measures one)")
    best = min(paying, key=lambda c: c.size)
    return best, f"translated draft {best.label} (another vocabulary), measured faster than plain decoding by `tune`"

