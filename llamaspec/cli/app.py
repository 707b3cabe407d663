"""The Typer application and the options every command shares."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from llamaspec import __version__, output

app = typer.Typer(
    name="llamaspec",
    help="Speculative decoding for local GGUF models with llama.cpp: faster, token for token.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,  # our own error table prints user errors; bugs re-raise
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)

# Shared flags: every command that prints data takes these three.
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object to stdout instead of tables.")]
QuietOpt = Annotated[bool, typer.Option("-q", "--quiet", help="Print only the essential result; no progress.")]
VerboseOpt = Annotated[bool, typer.Option("-v", "--verbose", help="More detail on stderr.")]


def setup_output(json: bool = False, quiet: bool = False, verbose: bool = False) -> output.Output:
    return output.configure(json=json, quiet=quiet, verbose=verbose)


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
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for every error.")] = False,
) -> None:
    """llamaspec: speculative decoding for GGUF models, token for token identical to plain decoding."""
