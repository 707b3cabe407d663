"""Model references: a local path or a Hugging Face Hub reference, resolved to a file or a header.

(Minimal placeholder: local paths only. The Hub issue replaces the bodies, keeping these names.)
"""

from __future__ import annotations

from pathlib import Path

from llamaspec.gguf_header import GGUFHeader, read_file


def resolve_model(ref: str, *, offline: bool = False) -> Path:
    """A local GGUF path for `ref` (downloading Hub references into the HF cache)."""
    return Path(ref).expanduser()


def read_model_header(ref: str, *, offline: bool = False) -> GGUFHeader:
    """The GGUF header of `ref`, without loading weights (and without downloading for Hub refs)."""
    return read_file(resolve_model(ref, offline=offline))
