"""Ctrl-C (SIGINT) and SIGTERM during run, batch, bench, tune and pull, in real child processes.

Each signal is sent once the child is producing (a line on stdout or stderr, a record in the
output file, bytes in the download's partial file). Then: the documented exit code (130 for
SIGINT, 143 for SIGTERM), no traceback, partial results kept (run: the text so far and its stats;
batch: every finished record, valid JSONL, resumable; a download: its .incomplete file, resumed by
the next pull), and nothing half-written where a good file was (the tune store, the HF cache).
`CASES` counts the cases per command.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import hub_server
from child_process import GENERATING, HANG_GUARD_S, Child, child_env, default_signals, marking_generation
from hub_server import big_vocab_gguf, hub, hub_home  # noqa: F401 - fixtures

CASES: Counter = Counter()
CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
SIGNALS = [pytest.param(signal.SIGINT, id="SIGINT"), pytest.param(signal.SIGTERM, id="SIGTERM")]


def clean_exit(c: Child, code: int, sig: int) -> None:
    assert code == CODES[sig], (code, c.stderr[:1500], c.stderr[-3000:])
    assert "Traceback" not in c.stderr and "Exception ignored" not in c.stderr, c.stderr[-3000:]


# ---- run ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", SIGNALS)
def test_run_keeps_the_text_so_far_and_prints_stats(tiny_models, sig):
    c = Child("run", tiny_models["target"], "-p", "Once upon a time", "-n", "1900", "--temp", "0", "-t", "1",
              "--spec-type", "none", "--raw")
    c.wait_for(lambda: len(c.stdout) >= 20, "text on stdout")
    code = c.stop(sig)
    clean_exit(c, code, sig)
    assert len(c.stdout) >= 20
    assert "stop: interrupted" in c.stderr and "tok/s" in c.stderr
    CASES["run"] += 1


@pytest.mark.parametrize("sig", SIGNALS)
def test_run_json_interrupted_is_still_one_json_object(tiny_models, sig):
    c = Child(argv=marking_generation("run", tiny_models["target"], "-p", "Once upon a time", "-n", "1900",
                                      "--temp", "0", "-t", "1", "--spec-type", "none", "--raw", "--json"))
    c.wait_for(lambda: GENERATING in c.stderr, "generation under way (a decode listener's line)")
    code = c.stop(sig)
    clean_exit(c, code, sig)
    doc = json.loads(c.stdout)
    assert doc["stop_reason"] == "interrupted" and doc["n_generated"] == len(doc["tokens"]) > 0
    CASES["run"] += 1


@pytest.mark.parametrize("sig", SIGNALS)
def test_run_interrupted_while_the_model_loads_exits_instead_of_going_on(tiny_models, sig):
    """A signal landing in llama.cpp's log callback used to be printed as a traceback by ctypes and
    dropped: the run went on and exited 0. With --log-verbose the callback is busy from the first line."""
    c = Child("run", tiny_models["target"], "-p", "hi", "-n", "1900", "--temp", "0", "-t", "1", "--log-verbose",
              "--spec-type", "none", "--raw")
    # llama.cpp's own first line, printed once the handlers are in place (a bare "load" also
    # matched any earlier line with "download" or "payload" in it)
    c.wait_for(lambda: "llama_model_loader: loaded meta data" in c.stderr, "llama.cpp's load log")
    code = c.stop(sig)
    clean_exit(c, code, sig)
    CASES["run"] += 1


CLOSE_LOOP = """
import os, random, signal, sys, threading, time
from pathlib import Path
from llamaspec.cli._errors import install_signal_handlers
from llamaspec.runtime.context import Context, ContextConfig
from llamaspec.runtime.llama import Model

install_signal_handlers()
model = Model(Path(sys.argv[1]), n_gpu_layers=0)
rng = random.Random(int(sys.argv[2]))
for _ in range(4):
    t = threading.Timer(rng.uniform(0.02, 0.12), os.kill, (os.getpid(), signal.SIGTERM))
    t.start()
    live = []
    try:
        while True:
            live.append(Context(model, ContextConfig(n_ctx=256, n_threads=1)))
            live[-1].close()
            live.pop()
    except KeyboardInterrupt:
        pass
    for c in live:   # what the interrupted code's cleanup does: close again
        c.close()
model.close()
print("ok")
"""


@pytest.mark.parametrize("seed", [1, 2])
def test_a_signal_during_close_does_not_free_twice(tiny_models, seed):
    """Raised between llama_free() and `self.ptr = None`, the interrupt made the next close free
    the context again: abort or segfault (27 of 30 runs of this loop) instead of exit 130/143."""
    p = subprocess.run([sys.executable, "-c", CLOSE_LOOP, str(tiny_models["target"]), str(seed)], capture_output=True,
                       text=True, env=child_env(), timeout=HANG_GUARD_S, preexec_fn=default_signals)
    assert p.returncode == 0 and p.stdout.strip() == "ok", (p.returncode, p.stderr[-2000:])
    CASES["run"] += 1


# ---- batch ----------------------------------------------------------------------------------------


def _requests(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"r{i}", "prompt": f"Story number {i}: once upon a time"}) + "\n"
                            for i in range(n)))
    return path


def _records(path: Path) -> list[dict]:
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n"), "a half-written last line"
    return [json.loads(line) for line in data.decode().splitlines()]


@pytest.mark.parametrize("sig", SIGNALS)
def test_batch_keeps_finished_records_and_resumes(tiny_models, tmp_path, sig):
    inp, out = _requests(tmp_path / "in.jsonl", 12), tmp_path / "out.jsonl"
    args = ["batch", tiny_models["target"], inp, "-o", out, "-n", "120", "--temp", "0", "-t", "1",
            "--spec-type", "ngram-mod"]
    c = Child(*args)
    c.wait_for(lambda: out.exists() and out.read_bytes().count(b"\n") >= 2, "two records in the output")
    code = c.stop(sig)
    clean_exit(c, code, sig)
    kept = _records(out)
    ids = [r["id"] for r in kept]
    assert len(ids) == len(set(ids)) >= 2 and all("text" in r for r in kept)
    assert "interrupted:" in c.stderr
    assert len(kept) < 12, "every record was written before the signal: nothing left to resume (a test of nothing)"
    again = subprocess.run([sys.executable, "-m", "llamaspec", *map(str, args)], capture_output=True, text=True,
                           env=child_env(), timeout=HANG_GUARD_S)
    assert again.returncode == 0, again.stderr
    assert f"resuming: {len(kept)} of 12" in again.stderr
    final = _records(out)
    assert sorted(r["id"] for r in final) == sorted(f"r{i}" for i in range(12))
    assert final[:len(kept)] == kept   # the records of the interrupted run are untouched
    CASES["batch"] += 1


# ---- bench ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", SIGNALS)
def test_bench_exits_cleanly_mid_measurement(tiny_models, tmp_path, sig):
    html = tmp_path / "report.html"
    c = Child("bench", tiny_models["target"], "-p", "Once upon a time", "-n", "1500", "--reps", "3", "-t", "1",
              "--spec-type", "ngram-mod", "--json")
    c.wait_for(lambda: "rep 1/3" in c.stderr, "a measured repetition")
    code = c.stop(sig)
    clean_exit(c, code, sig)
    assert not html.exists()
    CASES["bench"] += 1


# ---- tune -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", SIGNALS)
def test_tune_leaves_the_store_as_it_was(tiny_models, tmp_path, monkeypatch, sig):
    from llamaspec.tune import store

    config_dir = tmp_path / "config"
    monkeypatch.setenv("LLAMASPEC_CONFIG_DIR", str(config_dir))   # (the child inherits it)
    store.save(tiny_models["draft"], None, store.TunedConfig("ngram-mod", draft_max=12, ratio=1.5))
    before = (config_dir / "tune.json").read_bytes()
    c = Child("tune", tiny_models["target"], "--draft", tiny_models["draft"], "-n", "64", "-t", "1")
    c.wait_for(lambda: re.search(r"coarse \d+/\d+ ", c.stderr), "a measured candidate")
    code = c.stop(sig)
    clean_exit(c, code, sig)
    assert (config_dir / "tune.json").read_bytes() == before
    assert sorted(p.name for p in config_dir.iterdir()) in (["tune.json"], ["batch-noise.json", "tune.json"])  # (tune caches the measured batch noise beside it)   # no temporary file left
    CASES["tune"] += 1


# ---- pull -----------------------------------------------------------------------------------------

SLOW = {"on": False}


def _slow_send(self, req, status, body=b"", headers=None):
    """The Hub's _send, trickling file bodies (4 KiB every 10 ms) while SLOW is on."""
    if not (SLOW["on"] and self.command == "GET" and "/resolve/" in req.path and len(body) > 65536):
        return _orig_send(self, req, status, body, headers)
    req.status = status
    self.send_response(status)
    for k, v in (headers or {}).items():
        self.send_header(k, str(v))
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    try:
        for i in range(0, len(body), 4096):
            self.wfile.write(body[i:i + 4096])
            self.wfile.flush()
            req.sent += len(body[i:i + 4096])
            time.sleep(0.01)
    except OSError:   # the client went away (the pull was interrupted)
        self.close_connection = True


_orig_send = hub_server._Handler._send


@pytest.mark.parametrize("sig", SIGNALS)
def test_pull_keeps_the_partial_download_and_resumes(hub, hub_home, tiny_models, monkeypatch, sig):
    monkeypatch.setattr(hub_server._Handler, "_send", _slow_send)
    monkeypatch.setitem(SLOW, "on", True)
    cache_root = Path(hub_home["HF_HUB_CACHE"])

    def partial() -> list[Path]:
        return [p for p in cache_root.rglob("*.incomplete") if p.stat().st_size > 0] if cache_root.exists() else []

    c = Child("pull", "org/main:Q4_K_M", env=hub_home)
    c.wait_for(lambda: bool(partial()), "bytes in the partial download")
    code = c.stop(sig)
    clean_exit(c, code, sig)
    (part,) = partial()
    kept = part.stat().st_size
    want = Path(tiny_models["target"]).read_bytes()
    assert 0 < kept < len(want)
    assert not [p for p in cache_root.rglob("snapshots/*/*.gguf")], "no file in the snapshot before it is whole"
    for blob in cache_root.rglob("blobs/*"):   # nothing complete and wrong
        assert blob.name.endswith(".incomplete")

    SLOW["on"] = False
    hub.reset()
    again = subprocess.run([sys.executable, "-m", "llamaspec", "pull", "org/main:Q4_K_M", "-q"], capture_output=True,
                           text=True, env=child_env(hub_home), timeout=HANG_GUARD_S)
    assert again.returncode == 0, again.stderr
    path = Path(again.stdout.strip().splitlines()[-1])
    assert hashlib.sha256(path.read_bytes()).hexdigest() == hashlib.sha256(want).hexdigest()
    gets = [g for g in hub.matching("GET") if "/resolve/" in g.path]
    assert gets and gets[0].range and gets[0].range.startswith("bytes="), [g.range for g in gets]
    assert int(gets[0].range[len("bytes="):].rstrip("-")) >= kept   # resumed from the kept bytes
    assert not list(cache_root.rglob("*.incomplete"))
    CASES["pull"] += 1


LOST_RAISE = """
import signal, sys
from llamaspec.cli import _errors, main
from llamaspec.api.generator import Generator

real = Generator.generate

def generate(self, *a, **kw):
    _errors._received = signal.SIGTERM   # a SIGTERM recorded whose raise never landed
    return real(self, *a, **kw)

Generator.generate = generate
main(sys.argv[1:])
"""


def test_run_after_a_signal_whose_raise_never_landed_still_exits_143(tiny_models):
    """The handler records every signal; if its KeyboardInterrupt could not be raised where the
    run would stop (re-delivered out of llama.cpp's callbacks, then the run ended), `run` must
    still not exit 0 after a SIGTERM."""
    r = subprocess.run([sys.executable, "-c", LOST_RAISE, "run", str(tiny_models["target"]), "-p", "hi", "-n", "4",
                        "--temp", "0", "-t", "1", "--spec-type", "none", "--raw"], capture_output=True, text=True,
                       env=child_env(), timeout=HANG_GUARD_S)
    assert r.returncode == 143, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "stop: length" in r.stderr
