"""Seeds as llama.cpp and OpenAI take them, through every way in (run -s, batch lines, Request,
generate keywords): -1 and 4294967295 (llama.cpp's LLAMA_DEFAULT_SEED) mean a random seed; any
other int64 is a seed (negative ones too: same seed, same output at T > 0); beyond int64 is a
clear error naming `seed` (run: one line, exit 2; batch: that line's error)."""

from __future__ import annotations

import json

import pytest

from llamaspec.errors import UsageError
from llamaspec.speculative.sampling_params import SamplingParams, check_seed, seed_entropy

INT64_MAX = (1 << 63) - 1
BEYOND = [str(INT64_MAX + 1), str(-(1 << 63) - 1)]


def test_seed_values():
    assert SamplingParams(seed=-1).seed is None and SamplingParams(seed=4294967295).seed is None   # random
    assert check_seed(-(1 << 63)) == -(1 << 63) and check_seed(INT64_MAX) == INT64_MAX
    # a negative seed is its own seed: not the positive one, not another negative one
    entropies = {seed_entropy(s) for s in (-7, 7, -8, 0, -(1 << 63), INT64_MAX)}
    assert len(entropies) == 6 and all(0 <= e < 1 << 64 for e in entropies)
    for bad in (1 << 63, -(1 << 63) - 1, True, "7", 1.5):
        with pytest.raises(UsageError, match="^seed must be"):
            SamplingParams(seed=bad)


def _run(run_cli, model, *args):
    r = run_cli("run", model, "-p", "Once upon a time", "-n", "24", "--temp", "1.0", "-t", "1", "--json", *args)
    assert r.exit_code == 0, r.stderr
    return r.json()["text"]


def test_run_same_negative_seed_same_text(run_cli, tiny_models):
    """Through run's wiring (draft model and all) at T = 1: a negative seed reproduces its text."""
    a, b = (_run(run_cli, tiny_models["target"], "-s", "-7") for _ in range(2))
    assert a == b and a.strip()
    assert _run(run_cli, tiny_models["target"], "-s", str(-(1 << 63))) == _run(run_cli, tiny_models["target"],
                                                                                "-s", str(-(1 << 63)))


@pytest.mark.parametrize("seed", ["-1", "4294967295"])
def test_run_random_seed(run_cli, tiny_models, seed):
    assert _run(run_cli, tiny_models["target"], "-s", seed)   # (was a numpy traceback)


@pytest.mark.parametrize("seed", BEYOND)
def test_run_seed_beyond_int64_is_a_usage_error(run_cli, seed):
    r = run_cli("run", "/nonexistent/model.gguf", "-p", "hi", "-s", seed)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "seed must be a 64-bit integer" in r.stderr and seed in r.stderr


def test_batch_lines_take_any_int64_seed(run_cli, tiny_models, tmp_path):
    """A batch line's seed: -1 runs, a negative seed repeats its text, beyond int64 is that line's error."""
    lines = [{"id": "random", "prompt": "Once", "seed": -1}, {"id": "neg1", "prompt": "Once", "seed": -5},
             {"id": "big", "prompt": "Once", "seed": 1 << 64}, {"id": "neg2", "prompt": "Once", "seed": -5}]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = run_cli("batch", tiny_models["target"], inp, "-o", out, "-n", "16", "--temp", "1.0", "-t", "1", "-q")
    recs = {x["id"]: x for x in map(json.loads, out.read_text().splitlines())}
    assert set(recs) == {"random", "neg1", "big", "neg2"}, r.stderr
    assert "seed" in json.dumps(recs["big"]["error"]) and "64-bit" in json.dumps(recs["big"]["error"])
    assert recs["neg1"]["text"] == recs["neg2"]["text"] and "error" not in recs["random"]


@pytest.fixture(scope="module")
def gen(tiny_models):
    from llamaspec import Generator

    with Generator(tiny_models["target"], temperature=1.0, threads=1) as g:
        yield g


def test_generate_and_request_seeds(gen):
    from llamaspec.api.generator import Request

    a = gen.generate("Once upon", seed=-3, max_tokens=16, chat=False).text   # raw text, as create_completion
    assert a == gen.generate(Request("Once upon", seed=-3, max_tokens=16, chat=False)).text
    assert gen.generate("Once upon", seed=-1, max_tokens=4).tokens
    with pytest.raises(UsageError, match="^seed must be a 64-bit integer"):
        gen.generate("Once upon", seed=1 << 63)
    out = gen.create_completion("Once upon", seed=-3, max_tokens=16)
    assert out["choices"][0]["text"] == a
