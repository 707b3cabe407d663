"""Every code block of the README that runs on the bundled model runs, as a user would paste it.

Blocks are fenced with an info string: `sh` and `python` blocks run; `sh needs-model` (a model of
your own) and `sh setup` (installs: .ci/run runs the test command itself) do not; other blocks
(`text`, no info) are output. The set-up commands must stay as .ci/run runs them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
RUNS = {"sh", "python"}
SKIPS = {"needs-model", "setup"}
HANG_GUARD_S = 300   # a block that has not finished by then is hung (each runs a 135M model for a few tokens)
TEST_COMMAND = '.venv/bin/pip install -e ".[test]" && .venv/bin/python -m pytest -q -m "slow or not slow"'


def blocks(text: str) -> list[tuple[int, str, list[str], str]]:
    """(line, language, tags, code) of each fenced block; a fence closes on the same character
    repeated at least as often (so ```` can hold ```)."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = re.match(r"^(`{3,}|~{3,})\s*(.*)$", lines[i])
        if not m:
            i += 1
            continue
        fence, info = m.group(1), m.group(2).split()
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not (lines[i].startswith(fence[0] * len(fence)) and not lines[i].strip(fence[0]).strip()):
            body.append(lines[i])
            i += 1
        out.append((start, info[0] if info else "", info[1:], "\n".join(body) + "\n"))
        i += 1
    return out


def test_blocks_parse_nested_fences():
    text = "````text\n```python\nx\n```\n````\n```sh needs-model\nllamaspec run M\n```\n"
    assert [(lang, tags) for _, lang, tags, _ in blocks(text)] == [("text", []), ("sh", ["needs-model"])]


def _runnable() -> list[tuple[int, str, str]]:
    return [(line, lang, code) for line, lang, tags, code in blocks(README.read_text(encoding="utf-8"))
            if lang in RUNS and not SKIPS & set(tags)]


def test_the_readme_has_runnable_blocks_and_every_tag_is_known():
    assert {lang for _, lang, _ in _runnable()} == RUNS
    for line, lang, tags, _ in blocks(README.read_text(encoding="utf-8")):
        assert set(tags) <= SKIPS, f"README.md:{line}: unknown tag {tags} (known: {sorted(SKIPS)})"


def test_the_setup_commands_are_the_ones_ci_runs():
    setup = [code.strip() for _, lang, tags, code in blocks(README.read_text(encoding="utf-8")) if "setup" in tags]
    assert TEST_COMMAND in setup
    assert any(c.startswith("python3 -m venv .venv && .venv/bin/pip install -e \".[demo]\" && .venv/bin/llamaspec run")
               for c in setup)
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert TEST_COMMAND in ci   # verbatim, a line of its own


@pytest.mark.parametrize("line, lang, code", _runnable(), ids=lambda v: f"README.md:{v}" if isinstance(v, int) else "")
def test_readme_block_runs(line, lang, code, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    if lang == "sh":
        cmd = ["bash", "-e", "-o", "pipefail", "-c", code]
    else:
        cmd = [sys.executable, "-c", code]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"README.md:{line} ({lang}) exit {r.returncode}:\n{code}\n{r.stderr[-3000:]}"
    assert "Traceback" not in r.stderr
