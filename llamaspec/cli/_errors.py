"""The one table that turns any exception into what the user sees: a line, a hint, an exit code.

`llamaspec.cli.main` asks `explain` about every exception a command raises. A `LlamaspecError`
says it all itself; parser errors, Ctrl-C, Hub/network exceptions that escaped the Hub's own
translation and a few OS errors are mapped here. None means a bug: the traceback is shown
(`--debug` or `LLAMASPEC_DEBUG=1` shows it for everything).
"""

from __future__ import annotations

from dataclasses import dataclass

from llamaspec.errors import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE, LlamaspecError


@dataclass(frozen=True)
class Explained:
    message: str
    hint: str | None
    exit_code: int


def _click_kind(exc: BaseException) -> str | None:
    """"ClickException" / "Abort" for the CLI parser's exceptions (Typer vendors click, so they
    are recognised by class name rather than imported)."""
    names = {c.__name__ for c in type(exc).__mro__}
    if "Abort" in names:
        return "Abort"
    if "ClickException" in names and hasattr(exc, "format_message"):
        return "ClickException"
    return None


def explain(exc: BaseException) -> Explained | None:
    """Map an exception to what the user sees; None means it is a bug (show the traceback)."""
    if isinstance(exc, LlamaspecError):
        return Explained(exc.message, exc.hint, exc.exit_code)
    if isinstance(exc, KeyboardInterrupt) or _click_kind(exc) == "Abort":
        return Explained("interrupted", None, EXIT_INTERRUPTED)
    if _click_kind(exc) == "ClickException":  # bad flags / arguments, found by the CLI parser
        return Explained(exc.format_message(), "add -h for usage", getattr(exc, "exit_code", EXIT_USAGE))
    if (type(exc).__module__ or "").startswith(("huggingface_hub", "httpx", "httpcore")):
        from llamaspec.hub.failures import translate  # only Hub/network errors pay for this import

        hub = translate(exc)
        if hub is not None:
            return Explained(hub.message, hub.hint, hub.exit_code)
    if isinstance(exc, FileNotFoundError):
        return Explained(f"file not found: {exc.filename}", "check the path", EXIT_FAILURE)
    if isinstance(exc, IsADirectoryError):
        return Explained(f"is a directory: {exc.filename}", "give a file path", EXIT_FAILURE)
    if isinstance(exc, PermissionError):
        return Explained(f"permission denied: {exc.filename}", "check file permissions", EXIT_FAILURE)
    if isinstance(exc, OSError) and exc.errno == 28:  # ENOSPC
        return Explained("no space left on device", "free some disk space and retry", EXIT_FAILURE)
    if isinstance(exc, OSError) and exc.errno in (27, 122):  # EFBIG (RLIMIT_FSIZE, FAT32), EDQUOT
        what = "file too large for this disk (or the process's file-size limit)" if exc.errno == 27 \
            else "disk quota exceeded"
        where = f": {exc.filename}" if exc.filename else ""
        return Explained(what + where, "free some space or write to another disk, then retry", EXIT_FAILURE)
    return None
