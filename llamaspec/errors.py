"""Errors users can cause, and the one table that turns any exception into a line and an exit code.

Every user-facing failure is a `LlamaspecError` (or is mapped to one by `explain`): one line
naming the problem, one hint saying what to do, an exit code. Tracebacks are for bugs only
(`--debug` or `LLAMASPEC_DEBUG=1` shows them for everything).
"""

from __future__ import annotations

from dataclasses import dataclass

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class LlamaspecError(Exception):
    """A failure the user can act on. `hint` says what to do about it."""

    exit_code = EXIT_FAILURE

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(LlamaspecError):
    """Wrong flags or flag values."""

    exit_code = EXIT_USAGE


class ModelFileError(LlamaspecError):
    """A GGUF file that is missing, unreadable, truncated or not a GGUF at all."""


class ModelLoadError(LlamaspecError):
    """llama.cpp refused to load a model or create a context."""


class IncompatiblePairError(LlamaspecError):
    """A draft whose vocabulary does not match the target's by llama.cpp's rules."""


class RegistryError(LlamaspecError):
    """A broken pairings/*.yaml file (names file and line)."""


class HubError(LlamaspecError):
    """The Hugging Face Hub could not give us a file (not found, gated, offline, network down)."""


class InputError(LlamaspecError):
    """Bad input data: an unreadable prompt file, a broken JSONL line."""


class ContextFullError(LlamaspecError):
    """Generation reached the context size."""


def _click_kind(exc: BaseException) -> str | None:
    """"ClickException" / "Abort" for the CLI parser's exceptions (Typer vendors click, so they
    are recognised by class name rather than imported)."""
    names = {c.__name__ for c in type(exc).__mro__}
    if "Abort" in names:
        return "Abort"
    if "ClickException" in names and hasattr(exc, "format_message"):
        return "ClickException"
    return None


@dataclass(frozen=True)
class Explained:
    message: str
    hint: str | None
    exit_code: int


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
    return None
