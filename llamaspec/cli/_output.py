"""The one printer: human (Rich), JSON or quiet. Data goes to stdout, everything else to stderr.

Commands build plain data (dicts, lists) and hand it to `Output.data` with a renderer for humans;
they never print directly. That keeps `--json` complete and `-q` quiet for every command.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from rich.console import Console

from llamaspec.errors import Explained


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if hasattr(obj, "__fspath__"):
        return str(obj)
    return str(obj)


def to_json(obj: Any) -> str:
    return json.dumps(obj, default=_json_default, ensure_ascii=False)


@dataclass
class Output:
    json: bool = False
    quiet: bool = False
    verbose: bool = False
    stdout: Console = field(default_factory=lambda: Console(file=sys.stdout, highlight=False, soft_wrap=True))
    stderr: Console = field(default_factory=lambda: Console(file=sys.stderr, highlight=False, soft_wrap=True))

    # ---- data (stdout) -------------------------------------------------------------------------
    def data(self, obj: Any, human: Callable[[Console], None] | None = None, quiet: str | None = None) -> None:
        """Print a command's result: JSON object, a human rendering, or just `quiet` in -q mode."""
        if self.json:
            sys.stdout.write(to_json(obj) + "\n")
            sys.stdout.flush()
        elif self.quiet:
            if quiet is not None:
                sys.stdout.write(quiet + "\n")
                sys.stdout.flush()
        elif human is not None:
            human(self.stdout)
        else:
            self.stdout.print(obj)

    def write(self, text: str) -> None:
        """Stream raw text to stdout (generated tokens); never styled, flushed at once."""
        sys.stdout.write(text)
        sys.stdout.flush()

    # ---- diagnostics (stderr) ------------------------------------------------------------------
    def info(self, message: str) -> None:
        if not self.quiet:
            self.stderr.print(message)

    def detail(self, message: str) -> None:
        if self.verbose and not self.quiet:
            self.stderr.print(f"[dim]{message}[/dim]")

    def warn(self, message: str) -> None:
        self.stderr.print(f"[yellow]warning:[/yellow] {message}")

    def error(self, explained: Explained) -> None:
        line = f"[bold red]error:[/bold red] {_escape(explained.message)}"
        if explained.hint:
            line += f" [dim]({_escape(explained.hint)})[/dim]"
        self.stderr.print(line)

    @property
    def progress_enabled(self) -> bool:
        """Progress bars only for a human at a terminal."""
        return not self.quiet and not self.json and self.stderr.is_terminal


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


# The process-wide printer; the CLI replaces it once flags are parsed.
_current = Output()


def current() -> Output:
    return _current


def configure(*, json: bool = False, quiet: bool = False, verbose: bool = False) -> Output:
    global _current
    _current = Output(json=json, quiet=quiet, verbose=verbose)
    return _current
