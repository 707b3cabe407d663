"""`--help` of every command: whole option names wrapped at the terminal width, no llama_cpp import and
no server stack (fastapi, uvicorn) import."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

COMMANDS = ["run", "chat", "serve", "batch", "bench", "pair", "check", "inspect", "models", "pull", "doctor", "tune"]

_PROBE = """
import sys
from llamaspec.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
sys.stderr.write("LLAMA_CPP_IMPORTED=%s" % ("llama_cpp" in sys.modules))
sys.stderr.write(" SERVER_STACK_IMPORTED=%s" % any(m in sys.modules for m in ("fastapi", "uvicorn", "sse_starlette")))
"""


@pytest.mark.parametrize("command", COMMANDS)
def test_help_wraps_whole_option_names_and_imports_no_llama_cpp(command):
    env = dict(os.environ, COLUMNS="80", TERM="dumb")
    r = subprocess.run([sys.executable, "-c", _PROBE, command, "--help"], capture_output=True,
                       text=True, env=env, timeout=60)
    assert "Usage:" in r.stdout, r.stderr
    assert all(len(line) <= 80 for line in r.stdout.splitlines()), r.stdout
    assert "…" not in r.stdout  # no option name cut short
    assert "LLAMA_CPP_IMPORTED=False" in r.stderr and "SERVER_STACK_IMPORTED=False" in r.stderr, r.stderr[-2000:]


def test_run_help_names_the_ngram_flags_in_full():
    r = subprocess.run([sys.executable, "-m", "llamaspec", "run", "--help"], capture_output=True, text=True,
                       env=dict(os.environ, COLUMNS="80"), timeout=60)
    for flag in ("--spec-ngram-simple-size-n", "--spec-ngram-mod-n-match", "--spec-draft-p-min"):
        assert flag in r.stdout
