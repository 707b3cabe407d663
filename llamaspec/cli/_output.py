"""The one printer: human (Rich), JSON or quiet. Data goes to stdout, everything else to stderr.

Commands build plain data (dicts, lists) and hand it to `Output.data` with a renderer for humans;
they never print directly. That keeps `--json` complete and `-q` quiet for every command.

The layers below cli/ never print: they log (`logging`, loggers under "llamaspec") and report
downloads to a progress callback. `configure` routes both here: log records at INFO become
`detail` lines (-v), WARNING and above `warn` lines; Hub downloads get a Rich bar at a terminal,
else one `downloading ...` line per file.
"""

from __future__ import annotations

import json
import logging
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator

from rich.console import Console

if TYPE_CHECKING:
    from llamaspec.cli._errors import Explained


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

    def error(self, explained: "Explained") -> None:
        line = f"[bold red]error:[/bold red] {escape(explained.message)}"
        if explained.hint:
            line += f" [dim]({escape(explained.hint)})[/dim]"
        self.stderr.print(line)

    @property
    def progress_enabled(self) -> bool:
        """Progress bars only for a human at a terminal."""
        return not self.quiet and not self.json and self.stderr.is_terminal

    @contextmanager
    def download_progress(self) -> Iterator[Callable[[str, int, int], None]]:
        """What Hub downloads report to (llamaspec.hub.download.Progress): a Rich bar per file for
        a human at a terminal, else a line per file as it starts (none with -q)."""
        from llamaspec.hub.download import human_size

        if not self.progress_enabled:
            started: set[str] = set()

            def line(label: str, done: int, total: int) -> None:
                if label not in started:
                    started.add(label)
                    note = f" (resuming at {human_size(done)})" if done else ""
                    self.info(escape(f"downloading {label} ({human_size(total)}){note}"))

            yield line
            return
        from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                                   TransferSpeedColumn)

        with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                      TimeRemainingColumn(), console=self.stderr, transient=False) as bars:
            tasks: dict[str, Any] = {}

            def bar(label: str, done: int, total: int) -> None:
                if label in tasks:
                    bars.update(tasks[label], completed=done)
                else:
                    tasks[label] = bars.add_task(escape(label.rsplit("/", 1)[-1]), total=total, completed=done)

            yield bar


def escape(text: object) -> str:
    """`text` as literal text inside Rich markup (brackets in paths, reasons, model names)."""
    from rich.markup import escape as rich_escape

    return rich_escape(str(text))


class _ToOutput(logging.Handler):
    """Log records of the layers below cli/ -> the current printer (found at each record, so a
    printer replaced later, as tests do, still gets them)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = escape(record.getMessage())
            if record.levelno >= logging.WARNING:
                current().warn(message)
            elif record.levelno >= logging.INFO:
                current().detail(message)
        except Exception:  # noqa: BLE001 - logging's own contract: a broken record is no crash
            self.handleError(record)


def _route_reports() -> None:
    """Send the lower layers' log records and download progress to the current printer (once)."""
    logger = logging.getLogger("llamaspec")
    if not any(isinstance(h, _ToOutput) for h in logger.handlers):
        logger.addHandler(_ToOutput())
        logger.setLevel(logging.INFO)
    from llamaspec.hub import download

    download.install_progress(lambda: current().download_progress())


# The process-wide printer; the CLI replaces it once flags are parsed.
_current = Output()


def current() -> Output:
    return _current


def configure(*, json: bool = False, quiet: bool = False, verbose: bool = False) -> Output:
    """The printer for a command's flags, with the lower layers' reports routed to it."""
    global _current
    _current = Output(json=json, quiet=quiet, verbose=verbose)
    _route_reports()
    return _current
