"""What the commands share: flags declared once (cli/_options.py), the error table (cli/_errors.py),
and the printer the lower layers report through (cli/_output.py: logging and download progress)."""

from __future__ import annotations

import errno
import io
import logging
from collections import defaultdict

import pytest
import typer
from rich.console import Console

from llamaspec.cli import _output as output
from llamaspec.cli._errors import Explained, explain
from llamaspec.cli.app import app
from llamaspec.errors import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE, HubError, UsageError

# ---- flags declared once ----------------------------------------------------------------------------

SHARED = ["-p", "-f", "-t", "--draft-max", "--draft-p-min", "--fixed-draft", "--chat", "--force-draft",
          "--offline", "--amx", "--json", "-q", "-v", "--spec-ngram-simple-size-n", "--spec-ngram-simple-size-m",
          "--spec-ngram-mod-n-match", "--spec-ngram-mod-n-min", "--spec-ngram-mod-n-max"]


def _flags() -> dict[str, dict[str, object]]:
    """flag -> {command: the click parameter behind it}."""
    group = typer.main.get_command(app)
    seen: dict[str, dict[str, object]] = defaultdict(dict)
    for name, command in group.commands.items():
        for param in command.params:
            for flag in [*param.opts, *getattr(param, "secondary_opts", [])]:
                seen[flag][name] = param
    return seen


def test_shared_flags_have_one_declaration_on_every_command():
    seen = _flags()
    for flag in SHARED:
        params = seen[flag]
        assert len(params) >= 2, (flag, list(params))
        assert len({(tuple(p.opts), tuple(p.secondary_opts), p.help) for p in params.values()}) == 1, flag
    assert set(seen["--offline"]) == {"run", "chat", "serve", "batch", "bench", "check", "pair", "pull", "tune"}
    assert seen["--offline"]["pull"].help == "Never use the network (local files and cache only)."
    assert set(seen["--json"]) == set(seen["-q"]) == set(seen["-v"]) == set(typer.main.get_command(app).commands)
    assert {"run", "batch", "bench"} <= set(seen["--spec-ngram-mod-n-max"])
    # run and batch take every generation option from one declaration (cli/_generation.py)
    for flag in ("--draft", "--spec-type", "--temp", "--seed", "--stop", "-n", "--system", "--search"):
        assert set(seen[flag]) >= {"run", "batch"}, flag


@pytest.mark.parametrize("command", ["run", "bench"])
@pytest.mark.parametrize("args, needle", [
    (["--draft-p-min", "1.5"], "--draft-p-min must be in [0, 1]"),
    (["--draft-max", "600"], "--draft-max must be in ["),   # ([0, 511] for run, [1, 511] for bench)
    (["--spec-ngram-simple-size-n", "0"], "--spec-ngram-simple-size-n must be >= 1"),
    (["--spec-ngram-mod-n-min", "9", "--spec-ngram-mod-n-max", "4"], "must not exceed --spec-ngram-mod-n-max"),
    (["-c", "-1"], "-c/--ctx-size must be >= 0"),
])
def test_shared_range_checks_fail_alike_before_any_model_is_opened(run_cli, tmp_path, command, args, needle):
    r = run_cli(command, tmp_path / "missing.gguf", "-p", "hi", *args)  # the model is never looked at
    assert r.exit_code == EXIT_USAGE, r.stderr
    assert needle in r.stderr and "not found" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_draft_max_zero_is_for_run_only(run_cli, tmp_path):
    r = run_cli("bench", tmp_path / "missing.gguf", "--draft-max", "0")
    assert r.exit_code == EXIT_USAGE and "--draft-max must be in [1, 511], got 0" in r.stderr
    r = run_cli("run", tmp_path / "missing.gguf", "-p", "hi", "--draft-max", "0")
    assert r.exit_code == EXIT_FAILURE and "not found" in r.stderr  # accepted; then the model is missing


# ---- the error table --------------------------------------------------------------------------------


def test_explain_maps_each_kind_of_exception():
    from typer import Abort
    from typer._click.exceptions import NoSuchOption  # (Typer vendors click)

    assert explain(UsageError("bad flag", "fix it")) == Explained("bad flag", "fix it", EXIT_USAGE)
    assert explain(HubError("gone")) == Explained("gone", None, EXIT_FAILURE)
    assert explain(KeyboardInterrupt()) == Explained("interrupted", None, EXIT_INTERRUPTED)
    assert explain(Abort()) == Explained("interrupted", None, EXIT_INTERRUPTED)
    parser = explain(NoSuchOption("--bogus"))
    assert parser is not None and "--bogus" in parser.message and parser.exit_code == EXIT_USAGE
    assert parser.hint == "add -h for usage"
    assert explain(FileNotFoundError(errno.ENOENT, "x", "/no/such")).message == "file not found: /no/such"
    assert explain(OSError(errno.ENOSPC, "full")).message == "no space left on device"
    assert explain(ValueError("a bug")) is None  # bugs keep their traceback


def test_errors_module_holds_only_the_classes_and_exit_codes():
    import llamaspec.errors as errors

    assert not hasattr(errors, "explain") and not hasattr(errors, "Explained")


# ---- lower layers report through the printer ----------------------------------------------------------


@pytest.fixture
def printer(monkeypatch):
    """configure(...) as a command does, with stderr in a buffer; the previous printer comes back."""
    monkeypatch.setattr(output, "_current", output.current())
    buf = io.StringIO()

    def make(**flags) -> io.StringIO:
        buf.seek(0)
        buf.truncate()
        out = output.configure(**flags)
        out.stderr = Console(file=buf, highlight=False, soft_wrap=True, width=200)
        return buf

    return make


def test_log_records_become_detail_and_warning_lines(printer):
    hub_log, pairing_log = logging.getLogger("llamaspec.hub"), logging.getLogger("llamaspec.pairing.autodraft")
    err = printer(verbose=True)
    hub_log.info("org/repo:Q8_0 -> /cache/[x].gguf (cached)")
    pairing_log.warning("forced an incompatible draft")
    assert err.getvalue() == ("org/repo:Q8_0 -> /cache/[x].gguf (cached)\n"  # markup-escaped, as printed
                              "warning: forced an incompatible draft\n")
    for flags in ({}, {"quiet": True, "verbose": True}):
        err = printer(**flags)
        hub_log.info("a detail")
        pairing_log.warning("a warning")
        assert err.getvalue() == "warning: a warning\n", flags  # details need -v; warnings always show


def test_download_progress_is_a_line_per_file_or_a_bar():
    buf = io.StringIO()
    plain = output.Output(stderr=Console(file=buf, force_terminal=False, width=100))
    with plain.download_progress() as report:
        for done in (3 << 20, 4 << 20, 5 << 20):
            report("org/repo/sub/m-Q8_0.gguf", done, 5 << 20)
    assert buf.getvalue() == "downloading org/repo/sub/m-Q8_0.gguf (5.0 MiB) (resuming at 3.0 MiB)\n"

    quiet = output.Output(quiet=True, stderr=Console(file=buf, force_terminal=True, width=100))
    with quiet.download_progress() as report:
        report("org/repo/m.gguf", 0, 10)
    assert buf.getvalue().count("downloading") == 1

    buf = io.StringIO()
    tty = output.Output(stderr=Console(file=buf, force_terminal=True, width=100))
    with tty.download_progress() as report:
        report("org/repo/sub/m-Q8_0.gguf", 0, 5 << 20)
        report("org/repo/sub/m-Q8_0.gguf", 5 << 20, 5 << 20)
    assert "m-Q8_0.gguf" in buf.getvalue() and "sub/" not in buf.getvalue() and "━" in buf.getvalue()


def test_configure_installs_the_progress_for_hub_downloads(printer):
    from llamaspec.hub import download

    printer()
    installed = download.install_progress(None)
    try:
        assert installed is not None
        with installed() as report:  # the current printer's, found when a download starts
            report("org/repo/m.gguf", 0, 2048)
        assert output.current().stderr.file.getvalue() == "downloading org/repo/m.gguf (2.0 KiB)\n"
    finally:
        download.install_progress(installed)
