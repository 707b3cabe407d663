"""A full disk while writing batch output, the tune store, a bench report, a download, run's output.

Simulated with RLIMIT_FSIZE in the child (SIGXFSZ ignored, so a write past the limit fails with
EFBIG, as a write to a full disk fails with ENOSPC). Each case: one line naming the file, exit 1,
no traceback, and what was written before intact (batch's earlier records valid JSONL and resumed
by the next run; the tune store and an earlier report unchanged; a download's partial file kept
and resumed). `CASES` counts them per command.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from hub_server import big_vocab_gguf, hub, hub_home  # noqa: F401 - fixtures

REPO = Path(__file__).resolve().parents[1]
CASES: Counter = Counter()


def llamaspec(*args, limit: int | None = None, env: dict | None = None, stdout=None) -> subprocess.CompletedProcess:
    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

    return subprocess.run([sys.executable, "-m", "llamaspec", *map(str, args)],
                          env={**os.environ, **(env or {}), "PYTHONPATH": str(REPO)},
                          stdout=stdout if stdout is not None else subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=180, preexec_fn=preexec if limit is not None else None)


def one_line_failure(r, *needles: str) -> None:
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("speculation:")]
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in r.stderr, (n, r.stderr)


# ---- batch ----------------------------------------------------------------------------------------


def _requests(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"r{i}", "prompt": f"Story {i}: once upon a time"}) + "\n"
                            for i in range(n)))
    return path


def test_batch_output_disk_full_keeps_earlier_records_and_resumes(tiny_models, tmp_path):
    inp = _requests(tmp_path / "in.jsonl", 6)
    args = ["batch", tiny_models["target"], inp, "-n", "12", "--temp", "0", "-t", "1", "--spec-type", "none"]
    ref = tmp_path / "ref.jsonl"
    assert llamaspec(*args, "-o", ref).returncode == 0
    sizes = [len(line) for line in ref.read_bytes().splitlines(keepends=True)]
    manifest = len((tmp_path / "ref.jsonl.llamaspec.json").read_bytes())
    limit = sizes[0] + sizes[1] + sizes[2] // 2   # the third record is cut mid-line by the limit
    assert manifest < limit

    out = tmp_path / "out.jsonl"
    r = llamaspec(*args, "-o", out, limit=limit)
    one_line_failure(r, f"disk full writing {out}", "file too large", "run the same command again")
    data = out.read_bytes()
    assert data.endswith(b"\n") and data.count(b"\n") == 2, data[-200:]   # no half record left
    kept = [json.loads(line) for line in data.splitlines()]
    assert [k["id"] for k in kept] == ["r0", "r1"]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]

    again = llamaspec(*args, "-o", out)
    assert again.returncode == 0, again.stderr
    assert "resuming: 2 of 6" in again.stderr
    got = {x["id"]: x["text"] for x in map(json.loads, out.read_text().splitlines())}
    want = {x["id"]: x["text"] for x in map(json.loads, ref.read_text().splitlines())}
    assert got == want   # every id once, the text of the uninterrupted job
    CASES["batch"] += 1


def test_batch_manifest_disk_full_writes_nothing(tiny_models, tmp_path):
    inp = _requests(tmp_path / "in.jsonl", 2)
    out = tmp_path / "out.jsonl"
    r = llamaspec("batch", tiny_models["target"], inp, "-o", out, "-n", "4", "-t", "1", "--spec-type", "none",
                  limit=64)
    one_line_failure(r, f"disk full writing {out}.llamaspec.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]
    CASES["batch"] += 1


# ---- tune -----------------------------------------------------------------------------------------


def test_tune_store_disk_full_keeps_the_previous_store(tiny_models, tmp_path, monkeypatch):
    from llamaspec.tune import store

    config_dir = tmp_path / "config"
    monkeypatch.setenv("LLAMASPEC_CONFIG_DIR", str(config_dir))
    store.save(tiny_models["draft"], None, store.TunedConfig("ngram-mod", draft_max=12, ratio=1.5))
    before = (config_dir / "tune.json").read_bytes()
    r = llamaspec("tune", tiny_models["target"], "--quick", "-n", "16", "--reps", "1", "-t", "1", "-q",
                  limit=len(before) + 16)
    one_line_failure(r, f"disk full writing {config_dir / 'tune.json'}", "as they were")
    assert (config_dir / "tune.json").read_bytes() == before
    assert sorted(p.name for p in config_dir.iterdir()) in (["tune.json"], ["batch-noise.json", "tune.json"])  # (tune caches the measured batch noise beside it)
    # forget rewrites the store too
    store.save(tiny_models["target"], None, store.TunedConfig("ngram-simple", ratio=1.2))
    before = (config_dir / "tune.json").read_bytes()
    r = llamaspec("tune", "--forget", tiny_models["target"], limit=16)
    one_line_failure(r, "disk full writing")
    assert (config_dir / "tune.json").read_bytes() == before
    CASES["tune"] += 2


# ---- bench ----------------------------------------------------------------------------------------


def test_bench_html_disk_full_keeps_the_previous_report(tiny_models, tmp_path):
    html = tmp_path / "report.html"
    html.write_text("<html>an earlier report</html>")
    r = llamaspec("bench", tiny_models["target"], "-p", "hello", "-n", "16", "--reps", "1", "-t", "1",
                  "--spec-type", "ngram-mod", "--html", html, "-q", limit=1000)
    one_line_failure(r, f"disk full writing {html}")
    assert html.read_text() == "<html>an earlier report</html>"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]
    CASES["bench"] += 1


# ---- run ------------------------------------------------------------------------------------------


def test_run_output_to_a_full_disk_is_one_line(tiny_models, tmp_path):
    with open(tmp_path / "out.txt", "w") as f:
        r = llamaspec("run", tiny_models["target"], "-p", "hello", "-n", "300", "--temp", "0", "-t", "1",
                      "--spec-type", "none", "--raw", limit=100, stdout=f)
    one_line_failure(r, "file too large")
    assert (tmp_path / "out.txt").stat().st_size == 100
    CASES["run"] += 1


def test_run_lookup_cache_disk_full_keeps_the_previous_cache(tiny_models, tmp_path):
    lcd = tmp_path / "cache.bin"
    first = llamaspec("run", tiny_models["target"], "-p", "hello hello hello", "-n", "20", "--temp", "0", "-t", "1",
                      "--spec-type", "ngram-cache", "-lcd", lcd, "-q")
    assert first.returncode == 0, first.stderr
    before = lcd.read_bytes()
    r = llamaspec("run", tiny_models["target"], "-p", "a different prompt, with other words in it", "-n", "200",
                  "--temp", "0", "-t", "1", "--spec-type", "ngram-cache", "-lcd", lcd, "-q", limit=len(before) + 8)
    one_line_failure(r, "file too large")
    assert lcd.read_bytes() == before
    CASES["run"] += 1


# ---- pull -----------------------------------------------------------------------------------------


def test_pull_disk_full_keeps_the_partial_file_and_resumes(hub, hub_home, tiny_models):
    want = Path(tiny_models["target"]).read_bytes()
    r = llamaspec("pull", "org/main:Q4_K_M", "-q", env=hub_home, limit=300_000)
    one_line_failure(r, "too large", "main-Q4_K_M.gguf", "resume")
    root = Path(hub_home["HF_HUB_CACHE"])
    (partial,) = root.rglob("*.incomplete")
    assert partial.stat().st_size == 300_000
    assert not list(root.rglob("snapshots/*/*.gguf"))
    hub.reset()
    again = llamaspec("pull", "org/main:Q4_K_M", "-q", env=hub_home)
    assert again.returncode == 0, again.stderr
    path = Path(again.stdout.strip().splitlines()[-1])
    assert hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(want).digest()
    gets = [g for g in hub.matching("GET") if "/resolve/" in g.path]
    assert gets[0].range == "bytes=300000-"
    CASES["pull"] += 1
