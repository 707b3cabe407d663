"""`llamaspec pull` and `llamaspec models`, and Hub refs in other commands, against the local Hub.

The must-show scenarios run in a child process (huggingface_hub reads its environment at import),
with HF_ENDPOINT at the local server and a fresh HF_HOME.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest
from rich.console import Console

from hub_server import TOKEN, big_vocab_gguf, hub, hub_home  # noqa: F401 - fixtures
from llamaspec.cli import _output as output
from llamaspec.gguf.header import read_file
from llamaspec.hub.download import human_size
from llamaspec.gguf.vocab import vocab_from_header


HANG_GUARD_S = 60   # a hang guard, not a speed bound: speed belongs to benchmarks

def file_bytes(server, name: str) -> int:
    return sum(r.sent for r in server.matching("GET") if name in r.path and not r.path.startswith("/api/"))


# ---- the must-show scenarios, as a user runs them ---------------------------------------------------


def test_pull_prints_the_cached_path_and_a_second_pull_makes_no_get(hub, hub_home, run_cli_subprocess):
    r = run_cli_subprocess("pull", "org/main:Q8_0", env=hub_home)
    assert r.exit_code == 0, r.stderr
    path = Path(r.stdout.strip())
    assert r.stdout == f"{path}\n"  # stdout is the path alone: $(llamaspec pull ...) works
    assert path.is_file() and path.is_relative_to(Path(hub_home["HF_HUB_CACHE"]))
    assert f"org/main:Q8_0: downloaded {human_size(path.stat().st_size)}" in r.stderr
    assert hub.count("GET") >= 2

    hub.reset()
    r2 = run_cli_subprocess("pull", "org/main:q8_0", env=hub_home)
    assert r2.exit_code == 0 and r2.stdout == r.stdout
    assert "already in the cache" in r2.stderr
    assert hub.count("GET") == 0 and hub.count() == 0


def test_check_decides_from_headers_alone(hub, hub_home, run_cli_subprocess, tiny_models):
    r = run_cli_subprocess("check", "org/main:Q8_0", "org/draft:Q4_K_M", "--json", env=hub_home)
    assert r.exit_code == 0, r.stderr
    assert r.json()["compatible"] is True
    main_size = tiny_models["target"].stat().st_size + 64
    draft_size = tiny_models["draft"].stat().st_size
    fetched = file_bytes(hub, "main-Q8_0") + file_bytes(hub, "draft-Q4_K_M")
    assert fetched <= 2 * 128 * 1024 < (main_size + draft_size) / 5
    assert not list(Path(hub_home["HF_HUB_CACHE"]).rglob("*.gguf"))  # nothing downloaded

    # another vocabulary: a translated pair (it drafts through text), still decided from headers alone
    other = run_cli_subprocess("check", "org/main:Q8_0", "org/other", "-q", env=hub_home)
    assert other.exit_code == 0 and other.stdout.startswith("translated: "), other.stdout


def test_stopped_server_gives_a_clear_error_fast(hub, hub_home, run_cli_subprocess):
    hub.stop()
    start = time.monotonic()
    r = run_cli_subprocess("pull", "org/main:Q8_0", env=hub_home)
    elapsed = time.monotonic() - start
    assert r.exit_code == 1
    assert r.stderr.startswith(f"error: cannot reach the Hugging Face Hub at {hub.url}")
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert elapsed < HANG_GUARD_S, elapsed  # no retrying for minutes on a dead network


def test_inspect_reads_a_hub_header(hub, hub_home, run_cli_subprocess):
    r = run_cli_subprocess("inspect", "org/big", "--json", env=hub_home)
    assert r.exit_code == 0, r.stderr
    assert r.json()["vocab"]["size"] == 150_000
    assert file_bytes(hub, "big-F32") < r.json()["file_size"] / 5
    assert "ranged request" not in r.stderr
    v = run_cli_subprocess("inspect", "org/big", "-v", env=hub_home)
    assert v.exit_code == 0 and "big-F32.gguf: header read from the Hub with " in v.stderr  # the Hub's log, -v
    assert f" of {r.json()['file_size']:,} bytes" in v.stderr


def test_run_accepts_hub_refs(hub, hub_home, run_cli_subprocess):
    args = ("run", "org/main:Q8_0", "--draft", "org/draft:Q4_K_M", "-p", "The quick brown", "-n", "8",
            "--temp", "0", "--json")
    r = run_cli_subprocess(*args, env=hub_home)
    assert r.exit_code == 0, r.stderr
    assert r.json()["n_generated"] == 8
    assert "downloading org/main/main-Q8_0.gguf" in r.stderr and "downloading org/draft/draft-Q4_K_M.gguf" in r.stderr
    hub.reset()
    again = run_cli_subprocess(*args, "-v", env=hub_home)
    assert again.exit_code == 0 and again.json()["tokens"] == r.json()["tokens"]
    assert hub.count() == 0  # both models come from the cache
    assert "org/main:Q8_0 -> " in again.stderr and "main-Q8_0.gguf (cached)" in again.stderr  # the Hub's log, -v
    assert "downloading" not in again.stderr and " -> " not in r.stderr


# ---- pull details (in-process) ----------------------------------------------------------------------


def test_pull_json_and_quiet(hub, hub_home, run_cli):
    r = run_cli("pull", "org/sharded:Q8_0", "--json")
    assert r.exit_code == 0, r.stderr
    data = r.json()
    assert data["repo"] == "org/sharded" and data["revision"] == "main" and len(data["paths"]) == 3
    assert data["path"].endswith("model-Q8_0-00001-of-00003.gguf") and data["downloaded"] == data["size"]
    assert Path(data["path"]).is_file()
    q = run_cli("pull", "org/sharded:Q8_0", "-q")
    assert q.stdout == data["path"] + "\n" and q.stderr == ""


def test_pull_errors_are_one_line_with_a_hint(hub, hub_home, run_cli):
    cases = {
        ("org/main:Q3_K",): "error: no Q3_K file in org/main@main (available quants: Q4_K_M, Q8_0)",
        ("org/gated",): "error: org/gated is gated: downloading it needs a token",
        ("org/nope",): "error: repository org/nope not found on the Hub",
        ("org/main@v9",): "error: revision v9 not found in org/main",
        ("org/main:Q8_0", "--offline"): "error: org/main:Q8_0 is not in the cache and offline mode is on",
    }
    for args, line in cases.items():
        r = run_cli("pull", *args)
        assert r.exit_code == 1, (args, r.stderr)
        assert r.stderr.startswith(line), r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and r.stdout == ""


def test_pull_of_a_local_path_is_a_usage_error(run_cli, tmp_path):
    r = run_cli("pull", str(tmp_path / "model.gguf"))
    assert r.exit_code == 2 and "is a local path, not a Hub reference" in r.stderr


def test_pull_uses_the_token_from_the_environment(hub, hub_home, run_cli, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    r = run_cli("pull", "org/private")
    assert r.exit_code == 0, r.stderr
    assert Path(r.stdout.strip()).name == "private-Q4_K_M.gguf"


def test_progress_bars_only_on_a_terminal(hub, hub_home, monkeypatch, tiny_models):
    """The Hub reports a download to a callback; the CLI's draws a bar at a terminal, else a line."""
    from llamaspec import hub as H

    buf = io.StringIO()
    tty = output.Output(stderr=Console(file=buf, force_terminal=True, width=100))
    H.pull("org/main:Q8_0", progress=tty.download_progress)
    assert "main-Q8_0.gguf" in buf.getvalue() and "━" in buf.getvalue()  # a Rich bar

    buf = io.StringIO()
    plain = output.Output(stderr=Console(file=buf, force_terminal=False, width=100))
    H.pull("org/draft:Q8_0", progress=plain.download_progress)
    size = human_size(tiny_models["draft"].stat().st_size + 32)
    assert buf.getvalue() == f"downloading org/draft/draft-Q8_0.gguf ({size})\n"


def test_pull_explicit_draft(hub, hub_home, run_cli):
    r = run_cli("pull", "org/main:Q8_0", "--draft", "org/draft:Q4_K_M", "--json")
    assert r.exit_code == 0, r.stderr
    d = r.json()["draft"]
    assert d["source"] == "explicit" and Path(d["path"]).name == "draft-Q4_K_M.gguf"
    assert d["kind"] == "draft-simple"  # llama.cpp's spec-type name, as `pair --json` reports it


def test_pull_draft_auto_pulls_the_registry_draft(hub, hub_home, run_cli_subprocess, tiny_models, tmp_path):
    fp = vocab_from_header(read_file(tiny_models["target"])).fingerprint
    pairings = tmp_path / "pairings"
    pairings.mkdir()
    (pairings / "tinyfam.yaml").write_text(f"""\
schema: 1
family: tinyfam
description: the tests' tiny llama models
architectures: [llama]
tokenizer:
  type: BPE
  fingerprints: ['{fp}']
  source: measured in the test from the tiny target
models:
- id: tiny-target
  role: main
  repo: org/main
  quant: Q8_0
  params: 0.000233
  source: the tests' local Hub
- id: tiny-draft
  role: draft
  repo: org/draft
  quant: Q4_K_M
  params: 0.000122
  source: the tests' local Hub
pairs:
- main: tiny-target
  draft: tiny-draft
  status: unverified
  recommended: true
""")
    env = {**hub_home, "LLAMASPEC_PAIRINGS": str(pairings), "HOME": str(tmp_path / "home")}
    r = run_cli_subprocess("pull", "org/main:Q8_0", "--draft", "auto", "--json", env=env)
    assert r.exit_code == 0, r.stderr
    data = r.json()
    assert data["draft"]["source"] == "registry" and data["draft"]["label"] == "org/draft:Q4_K_M"
    assert data["draft"]["kind"] == "draft-simple"
    draft_path = Path(data["draft"]["path"])
    assert draft_path.name == "draft-Q4_K_M.gguf" and draft_path.is_file()
    assert draft_path.is_relative_to(Path(hub_home["HF_HUB_CACHE"]))

    human = run_cli_subprocess("pull", "org/main:Q8_0", "--draft", "auto", env=env)
    assert human.exit_code == 0 and human.stdout.splitlines() == [data["path"], str(draft_path)]


# ---- models ------------------------------------------------------------------------------------------


def test_models_lists_cached_ggufs_with_fingerprints(hub, hub_home, run_cli, tiny_models):
    assert run_cli("pull", "org/main:Q8_0").exit_code == 0
    assert run_cli("pull", "org/other").exit_code == 0
    assert run_cli("pull", "org/sharded:Q8_0").exit_code == 0
    hub.reset()
    r = run_cli("models", "--json")
    assert r.exit_code == 0, r.stderr
    data = r.json()
    assert data["cache_dir"] == hub_home["HF_HUB_CACHE"]
    rows = {m["ref"]: m for m in data["models"]}
    assert list(rows) == ["org/main/main-Q8_0.gguf", "org/other/other-Q4_K_M.gguf",
                          "org/sharded/Q8_0/model-Q8_0-00001-of-00003.gguf"]
    target_fp = vocab_from_header(read_file(tiny_models["target"])).fingerprint
    other_fp = vocab_from_header(read_file(tiny_models["other_vocab"])).fingerprint
    assert rows["org/main/main-Q8_0.gguf"]["vocab_fingerprint"] == target_fp
    assert rows["org/other/other-Q4_K_M.gguf"]["vocab_fingerprint"] == other_fp != target_fp
    main = rows["org/main/main-Q8_0.gguf"]
    assert main["architecture"] == "llama" and main["size"] == Path(main["path"]).stat().st_size
    assert rows["org/sharded/Q8_0/model-Q8_0-00001-of-00003.gguf"]["parts"] == 3
    assert hub.count() == 0  # listing is local

    human = run_cli("models")
    assert "org/main/main-Q8_0.gguf" in human.stdout and target_fp in human.stdout
    quiet = run_cli("models", "-q")
    assert quiet.stdout.splitlines() == list(rows)


def test_models_on_an_empty_cache(hub_home, run_cli):
    r = run_cli("models", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["models"] == []
    human = run_cli("models")
    assert human.exit_code == 0 and "no GGUF models in the Hugging Face cache" in human.stderr
