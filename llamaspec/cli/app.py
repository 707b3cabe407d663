"""The Typer application and the options every command shares."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from llamaspec import __version__

from llamaspec.cli import _output as output

app = typer.Typer(
    name="llamaspec",
    help="Speculative decoding for local GGUF models with llama.cpp: faster, token for token.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,  # our own error table prints user errors; bugs re-raise
    rich_markup_mode=None,  # click's plain help: wraps long option names instead of cutting them
    context_settings={"help_option_names": ["-h", "--help"]},
)

# Shared flags: every command that prints data takes these three.
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object to stdout instead of tables.")]
QuietOpt = Annotated[bool, typer.Option("-q", "--quiet", help="Print only the essential result; no progress.")]
VerboseOpt = Annotated[bool, typer.Option("-v", "--verbose", help="More detail on stderr.")]


# llama.cpp's n-gram drafter flags (run and bench); None keeps llamaspec's default (NgramParams).
NgramSizeNOpt = Annotated[Optional[int], typer.Option(
    "--spec-ngram-simple-size-n", help="ngram-simple: n-gram length to match (llamaspec 6, llama.cpp 12).")]
NgramSizeMOpt = Annotated[Optional[int], typer.Option(
    "--spec-ngram-simple-size-m", help="ngram-simple: tokens copied after a match (48).")]
NgramModMatchOpt = Annotated[Optional[int], typer.Option(
    "--spec-ngram-mod-n-match", help="ngram-mod: n-gram length hashed (llamaspec 6, llama.cpp 24).")]
NgramModMinOpt = Annotated[Optional[int], typer.Option(
    "--spec-ngram-mod-n-min", help="ngram-mod: shortest draft kept (llamaspec 4, llama.cpp 48).")]
NgramModMaxOpt = Annotated[Optional[int], typer.Option(
    "--spec-ngram-mod-n-max", help="ngram-mod: longest draft (64).")]


def ngram_params(size_n: int | None, size_m: int | None, mod_match: int | None, mod_min: int | None,
                 mod_max: int | None):
    """NgramParams from the flags above, checked; unset flags keep the defaults."""
    from dataclasses import replace

    from llamaspec.errors import UsageError
    from llamaspec.spec.pipeline import NgramParams

    given = {"simple_size_n": size_n, "simple_size_m": size_m, "mod_n_match": mod_match,
             "mod_n_min": mod_min, "mod_n_max": mod_max}
    for name, value in given.items():
        if value is not None and value < 1:
            raise UsageError(f"--spec-ngram-{name.replace('_', '-')} must be >= 1")
    for name in ("simple_size_m", "mod_n_max"):  # draft lengths: one verify batch
        check_draft_max(given[name], f"--spec-ngram-{name.replace('_', '-')}")
    params = replace(NgramParams(), **{k: v for k, v in given.items() if v is not None})
    if params.mod_n_min > params.mod_n_max:
        raise UsageError("--spec-ngram-mod-n-min must not exceed --spec-ngram-mod-n-max")
    return params


def check_draft_max(value: int | None, flag: str = "--draft-max") -> None:
    """A draft length must fit one verify batch (llama.cpp's n_batch, 512, with the last token)."""
    from llamaspec.errors import UsageError
    from llamaspec.spec.pipeline import MAX_DRAFT

    if value is not None and value > MAX_DRAFT:
        raise UsageError(f"{flag} must be at most {MAX_DRAFT}",
                         f"a verify step evaluates the last token and the draft in one batch of "
                         f"{MAX_DRAFT + 1}; the adaptive length rarely goes past 32")


def read_prompt_file(path: Path) -> str:
    """The text of a -f prompt file, with one-line errors for the ways it can be wrong."""
    from llamaspec.errors import InputError

    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"prompt file not found: {path}", "check the path given to -f") from None
    except IsADirectoryError:
        raise InputError(f"prompt file is a directory: {path}", "give -f a text file") from None
    except UnicodeDecodeError:
        raise InputError(f"prompt file is not UTF-8 text: {path}", "give a text file") from None


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
