"""Every command that resolves a draft says under -v why it drafts as it does and where it looked
for drafts, as `run -v` does: chat, serve (its startup lines on stderr) and batch."""

from __future__ import annotations

import json
from pathlib import Path

from test_serve import Server

FLAGS = ("-t", "1", "--temp", "0", "-n", "4")


def _searched(stderr: str, model: Path) -> list[str]:
    """-v's lines naming the target's folder as a place drafts were looked for."""
    return [ln for ln in stderr.splitlines()
            if ln.startswith("looked for drafts in the target's folder") and ln.rstrip().endswith(model.parent.name)]


def test_chat_verbose_names_where_it_looked(run_cli, smollm2_q4):
    r = run_cli("chat", smollm2_q4, *FLAGS, "-v", input="Hi\n")
    assert r.exit_code == 0, r.stderr
    assert _searched(r.stderr, smollm2_q4), r.stderr
    assert any(ln.startswith("why: ") for ln in r.stderr.splitlines()), r.stderr
    quiet = run_cli("chat", smollm2_q4, *FLAGS, input="Hi\n")   # the reasons are -v's only
    assert quiet.exit_code == 0 and not _searched(quiet.stderr, smollm2_q4), quiet.stderr


def test_batch_verbose_names_where_it_looked(run_cli, smollm2_q4, tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"id": "a", "prompt": "Hello"}) + "\n")
    r = run_cli("batch", smollm2_q4, inp, "-o", tmp_path / "out.jsonl", *FLAGS, "-v")
    assert r.exit_code == 0, r.stderr
    assert _searched(r.stderr, smollm2_q4), r.stderr


def test_serve_verbose_startup_names_where_it_looked(smollm2_q4, tmp_path):
    s = Server(smollm2_q4, "-v", tmp=tmp_path)   # up once /health answers: the startup lines are written
    try:
        log = s.log.read_text()
    finally:
        assert s.stop() == 0, s.log.read_text()
    assert _searched(log, smollm2_q4), log
