"""Where llama.cpp's own log goes: nowhere by default, stderr with `--log-verbose`, a file with
`--log-file FILE` (llama.cpp's names). `-v` is llamaspec's detail, never llama.cpp's log (a
4-token run logs thousands of graph lines).

Kept apart from runtime/llama.py so the CLI can set the route before llama_cpp is imported (and
`llamaspec --help` never imports it); runtime/llama.py's log callback writes through `emit`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TextIO

_to_stderr = False
_file: TextIO | None = None


def route(*, to_stderr: bool = False, file: str | os.PathLike[str] | None = None) -> None:
    """Send llama.cpp's log to stderr and/or append it to `file` (opened now: a bad path fails
    before any model loads, as an OSError the CLI reports in one line)."""
    global _to_stderr, _file
    _to_stderr = to_stderr
    if _file is not None:
        _file.close()
        _file = None
    if file is not None:
        _file = open(Path(file).expanduser(), "a", encoding="utf-8")  # noqa: SIM115 - kept open for the run


def emit(text: str) -> None:
    """One piece of llama.cpp's log (called from its C callback: never raises)."""
    try:
        if _to_stderr:
            sys.stderr.write(text)
        if _file is not None:
            _file.write(text)
            _file.flush()
    except (OSError, ValueError):
        pass


def enabled() -> bool:
    return _to_stderr or _file is not None
