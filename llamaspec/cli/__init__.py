"""Command-line entry point: one module per command group, one error table for all of them."""

from __future__ import annotations

import os
import sys

from llamaspec.cli import _output as output
from llamaspec.cli._errors import explain, install_signal_handlers, interrupted_exit_code
from llamaspec.cli.app import app
from llamaspec.errors import EXIT_INTERRUPTED

# Importing a command module registers its commands on `app`. None of them imports llama_cpp
# at module level, so `llamaspec --help` stays fast.
from llamaspec.cli import batch, bench, doctor, inspect, run  # noqa: E402,F401
from llamaspec.cli import pair  # noqa: E402,F401
from llamaspec.cli import models  # noqa: E402,F401
from llamaspec.cli import tune  # noqa: E402,F401
from llamaspec.cli import serve  # noqa: E402,F401
from llamaspec.cli import chat  # noqa: E402,F401


def _debug_wanted(argv: list[str]) -> bool:
    return "--debug" in argv or os.environ.get("LLAMASPEC_DEBUG", "") not in ("", "0")


def main(argv: list[str] | None = None) -> None:
    from llamaspec.cli._generation import join_pairs

    args = join_pairs(list(sys.argv[1:] if argv is None else argv))
    if not any(a in ("-h", "--help") for a in args):
        from llamaspec.runtime import wait_policy

        wait_policy.apply(wait_policy.threads_from_args(args))   # before anything loads llama.cpp
    restore = install_signal_handlers()   # SIGTERM like Ctrl-C: partial results kept, exit 143
    try:
        try:
            import typer

            from llamaspec.cli._argv import normalize   # -m MODEL; --debug after the command

            args = normalize(args, typer.main.get_command(app))
            # Not standalone: the parser's usage errors come back as exceptions, so they get the same
            # one-line treatment as every other error instead of a multi-line panel.
            rv = app(args=args, prog_name="llamaspec", standalone_mode=False)
        except SystemExit:
            raise
        except BaseException as exc:  # noqa: BLE001 - the one place exceptions become exit codes
            explained = explain(exc)
            if explained is None or _debug_wanted(args):
                raise
            if explained.message.strip():  # (no arguments at all: the help was printed instead)
                output.current().error(explained)
            sys.exit(explained.exit_code)
        if rv == EXIT_INTERRUPTED:   # (typer turns a KeyboardInterrupt, and so SIGTERM's, into 130)
            rv = interrupted_exit_code()
        sys.exit(rv if isinstance(rv, int) else 0)
    finally:
        restore()
