"""The one table that turns any exception into what the user sees: a line, a hint, an exit code.

`llamaspec.cli.main` asks `explain` about every exception a command raises. A `LlamaspecError`
says it all itself; parser errors, Ctrl-C, Hub/network exceptions that escaped the Hub's own
translation and a few OS errors are mapped here. None means a bug: the traceback is shown
(`--debug` or `LLAMASPEC_DEBUG=1` shows it for everything).
"""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass
from typing import Callable

from llamaspec.errors import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_USAGE, LlamaspecError, Terminated


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
        if isinstance(exc, Terminated) or isinstance(exc.__cause__, Terminated) or _received == signal.SIGTERM:
            return Explained("terminated (SIGTERM)", None, EXIT_TERMINATED)
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


# ---- SIGINT and SIGTERM ----------------------------------------------------------------------------
# Both raise in the main thread (KeyboardInterrupt, Terminated), so every command keeps its partial
# results the same way: `run` prints the text so far, `batch` keeps its finished records, a download
# keeps its .incomplete file, `tune` leaves the store as it was.

_received: int | None = None
# Redeliveries not yet sent: the command may end first (the engine saw the signal and ended the
# generation, and the command raised it itself), and one sent after the interpreter has put back
# the default action would kill the process (exit -2, no message): restore() cancels them.
_PENDING: set = set()


_CLEANUP = frozenset({"close", "__exit__", "__del__"})


def _not_here(frame) -> bool:
    """Would raising at `frame` do harm? Inside a callback from C (llama.cpp's log callback,
    runtime/llama.py) ctypes prints the exception and drops it; inside a close() it can stop
    between freeing a llama.cpp object and forgetting its pointer, so a second close frees it
    twice (an abort or a segfault instead of exit 130/143)."""
    for _ in range(4):
        if frame is None:
            return False
        code = frame.f_code
        if code.co_name in _CLEANUP or (code.co_name == "_log_cb"
                                        and frame.f_globals.get("__name__") == "llamaspec.runtime.llama"):
            return True
        frame = frame.f_back
    return False


def _redeliver(signum: int) -> None:
    """Send `signum` to the main thread again in a moment (from a thread: not raised right here)."""
    import threading

    main = threading.main_thread().ident
    timer = threading.Timer(0.02, signal.pthread_kill, (main, signum))
    timer.daemon = True
    _PENDING.add(timer)
    timer.start()


def _on_signal(signum: int, frame) -> None:
    global _received
    _received = signum
    if _not_here(frame):   # delivered again until it lands outside (the C call or the close returned)
        _redeliver(signum)
        return
    _cancel_redeliveries()   # (delivered now: a later copy would interrupt the exit path)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _cancel_redeliveries() -> None:
    for timer in list(_PENDING):
        timer.cancel()
    _PENDING.clear()


def _unraisable(args) -> None:
    """The same for a signal raised in any other callback from C: not printed, delivered again."""
    if isinstance(args.exc_value, KeyboardInterrupt):
        _redeliver(signal.SIGTERM if isinstance(args.exc_value, Terminated) else signal.SIGINT)
        return
    sys.__unraisablehook__(args)


def install_signal_handlers() -> Callable[[], None]:
    """SIGINT/SIGTERM handlers for one command; returns what restores the previous ones."""
    global _received
    _received = None
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    old_hook = sys.unraisablehook
    for s in old:
        signal.signal(s, _on_signal)
    sys.unraisablehook = _unraisable

    def restore() -> None:
        _cancel_redeliveries()
        for s, h in old.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        sys.unraisablehook = old_hook

    return restore


def raise_if_interrupted() -> None:
    """Raise again a signal that was caught below (the engine ends a generation on Ctrl-C and
    returns it as "interrupted"): for commands that run many generations, bench and tune."""
    if _received is not None:
        _cancel_redeliveries()
        raise Terminated() if _received == signal.SIGTERM else KeyboardInterrupt()


def signal_received() -> bool:
    """Did SIGINT/SIGTERM arrive during this command (whether or not its raise landed)?"""
    return _received is not None


def interrupted_exit_code() -> int:
    """130 after Ctrl-C (SIGINT), 143 after SIGTERM."""
    return EXIT_TERMINATED if _received == signal.SIGTERM else EXIT_INTERRUPTED
