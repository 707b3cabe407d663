"""The Typer application and its root options (--version, --debug, --log-verbose, --log-file; cli/_argv.py
lets them follow the command too); shared flags are in _options.py."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from llamaspec import __version__

app = typer.Typer(
    name="llamaspec",
    help="Speculative decoding for local GGUF models with llama.cpp: faster, token for token.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,  # our own error table prints user errors; bugs re-raise
    rich_markup_mode=None,  # click's plain help: wraps long option names instead of cutting them
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"llamaspec {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        Optional[bool],
        typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit."),
    ] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for every error (also after the command).")] = False,
    log_verbose: Annotated[bool, typer.Option(
        "--log-verbose", help="Print llama.cpp's own log to stderr (-v is llamaspec's detail only).")] = False,
    log_file: Annotated[Optional[str], typer.Option(
        "--log-file", metavar="FILE", help="Append llama.cpp's own log to FILE.")] = None,
) -> None:
    """llamaspec: speculative decoding for GGUF models, token for token identical to plain decoding."""
    from llamaspec.runtime import llama_log

    llama_log.route(to_stderr=log_verbose, file=log_file)
