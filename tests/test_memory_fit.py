"""A context that does not fit in RAM is refused before anything is allocated (runtime/memory.py).

The estimate (weights + f16 KV cache + compute buffers, from the GGUF header) is checked against
what llama.cpp itself allocates, then the refusal through run, batch, bench and tune: one line with
the sizes and how many tokens would fit, exit 1, and no model load started (llama.cpp's log, shown
with -v, never gets to the tensors). LLAMASPEC_ASSUME_MEM_AVAILABLE fakes a small machine.
An explicit -c is not capped at the training context (as llama.cpp); the check is what stops a
size that cannot be allocated. `CASES` counts the cases per command.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from llamaspec.errors import ModelLoadError, UsageError
from llamaspec.runtime import memory

REPO = Path(__file__).resolve().parents[1]
CASES: Counter = Counter()
MIB = 1 << 20


def llamaspec(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llamaspec", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, **(env or {}), "PYTHONPATH": str(REPO)}, timeout=180)


def refused(r, *needles: str) -> None:
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "not enough memory for" in errors[0], r.stderr[-2000:]
    for n in needles:
        assert n in errors[0], (n, errors[0])
    assert "load_tensors" not in r.stderr and "llama_kv_cache" not in r.stderr, "a load was started"


# ---- the estimate -------------------------------------------------------------------------------


def test_sizes_parse():
    assert memory.parse_size("1048576") == MIB
    assert memory.parse_size("3M") == 3 * MIB and memory.parse_size("1.5GiB") == 3 << 29
    assert memory.parse_size("2g") == 2 << 30
    with pytest.raises(UsageError, match="LLAMASPEC_ASSUME_MEM_AVAILABLE"):
        memory.parse_size("lots")


def test_available_memory_comes_from_the_system_or_the_override(monkeypatch):
    monkeypatch.delenv(memory.ENV_ASSUME, raising=False)
    real = memory.available_bytes()
    assert real is not None and real > 16 * MIB
    monkeypatch.setenv(memory.ENV_ASSUME, "5M")
    assert memory.available_bytes() == 5 * MIB


@pytest.mark.parametrize("name,n_ctx", [("target", 2048), ("draft", 512), ("mtp", 1024)])
def test_the_kv_estimate_is_what_llama_cpp_allocates(tiny_models, name, n_ctx):
    """llama.cpp logs its KV cache size (--log-verbose): the header-based estimate must match it."""
    r = llamaspec("run", tiny_models[name], "-p", "hi", "-n", "1", "-c", n_ctx, "-t", "1", "--spec-type", "none",
                  "--raw", "--log-verbose")
    assert r.returncode == 0, r.stderr[-2000:]
    sizes = [float(x) for x in re.findall(r"llama_kv_cache: size =\s+([\d.]+) MiB", r.stderr)]  # (iSWA: two)
    assert sizes, r.stderr[-3000:]
    est = memory.model_needs(tiny_models[name], n_ctx)
    assert est.kv / MIB == pytest.approx(sum(sizes), abs=0.006 * len(sizes))   # (printed to 0.01)
    assert est.weights == Path(tiny_models[name]).stat().st_size


def test_check_fits_names_the_sizes_and_what_fits(tiny_models):
    need = memory.model_needs(tiny_models["target"], 4096)
    memory.check_fits(tiny_models["target"], None, n_ctx=4096, given=4096, available=need.total)   # exactly fits
    with pytest.raises(ModelLoadError) as e:
        memory.check_fits(tiny_models["target"], None, n_ctx=4096, given=4096, available=need.total - 1)
    assert "not enough memory for -c 4096" in e.value.message and "about 3,840 tokens fit" in e.value.hint
    with pytest.raises(ModelLoadError) as e:
        memory.check_fits(tiny_models["target"], tiny_models["draft"], n_ctx=512, given=None, n_seq=4,
                          available=need.weights)
    assert "a context of 512 tokens x 4 sequences" in e.value.message and "weights alone" in e.value.hint


# ---- through the commands -----------------------------------------------------------------------


def test_run_refuses_a_huge_context_before_loading(tiny_models):
    """-c 100000000 on a model trained for 2048: an explicit -c is not capped, and ~48 GiB of KV
    cache is refused in one line (it used to be left to malloc, or the OOM killer)."""
    r = llamaspec("run", tiny_models["target"], "-p", "hi", "-n", "4", "-c", "100000000", "-t", "1", "-v")
    refused(r, "-c 100000000", "KV cache", "available")
    assert re.search(r"about [\d,]+ tokens fit", r.stderr)
    r = llamaspec("run", tiny_models["target"], "-p", "hi", "-n", "4", "-c", "100000000", "--draft",
                  tiny_models["draft"], "-t", "1")
    refused(r, "-c 100000000")
    CASES["run"] += 2


def test_a_small_machine_gets_the_size_that_fits_and_that_size_runs(tiny_models):
    need = memory.model_needs(tiny_models["target"], 1024)
    env = {memory.ENV_ASSUME: str(need.total)}
    r = llamaspec("run", tiny_models["target"], "-p", "hi", "-n", "4", "-c", "4096", "-t", "1", "-v", env=env)
    refused(r, "-c 4096", "about 1,024 tokens fit")
    ok = llamaspec("run", tiny_models["target"], "-p", "hi", "-n", "4", "-c", "1024", "-t", "1", "--temp", "0",
                   env=env)
    assert ok.returncode == 0, ok.stderr
    r = llamaspec("run", tiny_models["target"], "-p", "hi", "-n", "4", "-t", "1", env={memory.ENV_ASSUME: "1M"})
    refused(r, "a context of 2,048 tokens", "weights alone")   # the default: 4096 capped at training
    bad = llamaspec("run", tiny_models["target"], "-p", "hi", env={memory.ENV_ASSUME: "plenty"})
    assert bad.returncode == 2 and "LLAMASPEC_ASSUME_MEM_AVAILABLE" in bad.stderr
    CASES["run"] += 4


def test_batch_bench_and_tune_refuse_before_loading(tiny_models, tmp_path):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text('{"id": "a", "prompt": "hi"}\n')
    four = memory.model_needs(tiny_models["target"], 4 * 2048).total
    r = llamaspec("batch", tiny_models["target"], inp, "-o", out, "--parallel", "4", "-c", "2048", "-v",
                  env={memory.ENV_ASSUME: str(four - 1)})
    refused(r, "-c 2048 x 4 sequences")
    assert not out.exists()
    r = llamaspec("bench", tiny_models["target"], "-c", "100000000", "-n", "4", "--reps", "1", "-v")
    refused(r, "-c 100000000")
    pair = sum(memory.model_needs(tiny_models[m], 4096).total for m in ("target", "draft"))  # each alone fits
    r = llamaspec("bench", tiny_models["target"], "--draft", tiny_models["draft"], "--spec-type", "draft", "-n", "4",
                  "--reps", "1", "-c", "4096", "-v", env={memory.ENV_ASSUME: str(pair - 1)})
    refused(r, "-c 4096")
    r = llamaspec("tune", tiny_models["target"], "-c", "100000000", "-n", "4", "-v")
    refused(r, "-c 100000000")
    CASES["batch"] += 1
    CASES["bench"] += 2
    CASES["tune"] += 1
