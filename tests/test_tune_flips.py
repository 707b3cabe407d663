"""tune judges a flip before it rejects a mode (llamaspec/tune/flips.py): llama.cpp's batch noise
measured on the model, and the gap between the two tokens where a run first leaves plain decoding.

Real engine parts on real GGUFs: the flips are made by the engine's own verify step, once made
noisy as batch noise is (at a near-tie of the target, the other token) and once broken (every
draft token accepted: a real divergence, which tune must still reject).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from llamaspec.bench import BenchSettings, RepResult
from llamaspec.runtime.llama import Model
from llamaspec.tune import flips
from llamaspec.tune.calibrate import bench_runner
from llamaspec.tune.measure import Candidate, measure
from tune_fixtures import config_dir, model_pair  # noqa: F401 - fixtures

PROMPTS = ["Tell me about the sea. The sea, the sea.", "Write about topic number 28: rivers, stones and 28 birds.",
           "Write about topic number 3: rivers, stones and 3 birds."]


def noisy_verify(eps: float):
    """The engine's greedy verify, with batch noise made visible: where a verify row's two best
    logits are closer than eps, the row takes the second (plain decoding does not verify)."""

    def verify(draft, rows, eog=()):
        rows = np.asarray(rows)
        for i in range(len(draft) + 1):
            order = np.argsort(-rows[i], kind="stable")
            top = int(order[1] if rows[i][order[0]] - rows[i][order[1]] < eps else order[0])
            if i == len(draft) or top != draft[i] or top in eog:
                return i, top
        raise AssertionError("unreachable")

    return verify


def broken_verify(draft, rows, eog=()):
    """A bug: every draft token accepted, whatever the target says."""
    return len(draft), int(np.argmax(np.asarray(rows)[len(draft)]))


@pytest.fixture(scope="module")
def tiny(tiny_models):
    m = Model(tiny_models["target"])
    yield m
    m.close()


def _tokens(model: Model, prompts=PROMPTS) -> list[list[int]]:
    return [model.tokenize_prompt(model.chat_prompt([{"role": "user", "content": p}])) for p in prompts]


def _round(model: Model, draft, prompts, bound: float, cands, n: int = 96):
    """One measured round of `cands` (each run between plain runs, as tune does) with the judge."""
    settings = BenchSettings(n=n, threads=1, ctx=1024, draft_path=draft, adaptive=False)
    judge = flips.make_judge(model, prompts, bound, n_ctx=1024, threads=1)
    rejected: dict = {}
    return measure("coarse", cands, bench_runner(model, prompts, settings), len(prompts), 1, rejected, judge=judge)


# ---- the noise --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_batch_noise_is_measured_per_model(tiny, smollm2_q4):
    from engine_helpers import CODE_REWRITE

    toks = _tokens(tiny)
    n1 = flips.measure_noise(tiny, toks, n_tokens=32, n_ctx=1024, threads=1)
    q4 = Model(smollm2_q4)
    try:   # (one thread, or a short prompt, and SmolLM2's logits are the same alone and in a batch)
        n2 = flips.measure_noise(q4, _tokens(q4, [CODE_REWRITE]), n_tokens=8, n_ctx=1024, threads=2)
    finally:
        q4.close()
    for nz in (n1, n2):
        assert nz.rows > 0 and {s for s, _ in nz.shapes} >= {"batches of 5", "batches of 5 beside another sequence's"}
        assert nz.bound == max(flips.FLOOR, flips.FACTOR * nz.diff) and nz.max_abs >= 0
    # a Q4_1 of a real model is far noisier than the random-weight tiny one (measured: ~0.5 against ~1e-4)
    assert n2.diff > 10 * n1.diff and n2.bound > 0.05, (n1, n2)
    assert "batch noise" in n2.text and f"{n2.bound:.3g}" in n2.text


def test_the_noise_is_kept_per_model_file(tiny_models, tmp_path, config_dir):
    target = tmp_path / "t.gguf"
    target.write_bytes(tiny_models["target"].read_bytes())
    calls = []

    def measure_once():
        calls.append(1)
        return flips.Noise(0.003, 0.004, 10, (("one batch", 0.003),))

    first, cached = flips.cached_noise(target, 0, 1, measure_once)
    again, cached2 = flips.cached_noise(target, 0, 1, measure_once)
    assert (cached, cached2, len(calls)) == (False, True, 1) and again == first
    assert flips.cached_noise(target, 0, 2, measure_once)[1] is False   # per thread count
    assert json.loads((config_dir / flips.CACHE_NAME).read_text())   # beside tune.json
    import os

    os.utime(target, ns=(1, 1))   # another file (as tune's store knows files): measured again
    assert flips.cached_noise(target, 0, 1, measure_once)[1] is False and len(calls) == 3


# ---- the judge in a sweep --------------------------------------------------------------------------


def _made_up(tokens, tps=10.0) -> RepResult:
    return RepResult(mode="x", n=len(tokens), tps=tps, e2e_s=1.0, acceptance=0.5, drafted=4, accepted=2, drafts=1,
                     steps=1, mean_accepted_length=1.0, overhead_ms=0.0, tokens=list(tokens))


@pytest.mark.parametrize("gap,kept", [(0.004, True), (0.5, False)])
def test_a_near_tie_flip_is_kept_and_a_real_divergence_rejected_by_the_rules(gap, kept):
    """The rule alone: a judge saying the gap is below (above) the bound keeps (rejects) the mode."""
    runner = lambda c, i: _made_up([1, 2, 3] if c is None else [1, 2, 4])   # noqa: E731
    judge = lambda i, a, b: flips.Flip(flips.first_difference(a, b), a[2], b[2], gap, 0.01)   # noqa: E731
    rejected: dict = {}
    rnd = measure("coarse", [Candidate("ngram-mod")], runner, 2, 1, rejected, judge=judge)
    s = rnd.scores[0]
    if kept:
        assert s.rejected is None and not rejected and s.eligible
        assert s.flips == [f"prompt {i} token 2: flip at a near-tie (gap 0.004 < bound 0.01)" for i in (1, 2)]
    else:
        assert s.rejected == ("greedy tokens differ from plain decoding on prompt 1 from token 2: "
                              "a real divergence (gap 0.5 >= bound 0.01)") and s.candidate in rejected


def test_a_flip_at_a_near_tie_of_the_real_engine_is_kept(tiny, tiny_models, monkeypatch):
    """The engine's verify flips at near-ties (< FLOOR / 2, below any bound): tune keeps the mode
    and says where; without the judge (as before) the same runs would have rejected it."""
    import llamaspec.speculative.engine as engine

    toks = _tokens(tiny)
    noise = flips.measure_noise(tiny, toks, n_tokens=32, n_ctx=1024, threads=1)
    monkeypatch.setattr(engine, "verify_greedy", noisy_verify(flips.FLOOR / 2))
    rnd = _round(tiny, tiny_models["draft"], toks, noise.bound, [Candidate("draft-simple")])
    s = rnd.scores[0]
    assert s.rejected is None and s.flips, s
    for note in s.flips:
        gap = float(note.split("(gap ")[1].split(" <")[0])
        assert gap < flips.FLOOR / 2 + 10 * noise.diff and f"< bound {noise.bound:.3g})" in note, note
    print(s.flips)
    no_judge = measure("coarse", [Candidate("draft-simple")], bench_runner(tiny, toks, BenchSettings(
        n=96, threads=1, ctx=1024, draft_path=tiny_models["draft"], adaptive=False)), len(toks), 1, {})
    assert no_judge.scores[0].rejected.startswith("greedy tokens differ")   # as tune did before


def test_a_real_divergence_is_still_rejected(tiny, tiny_models, monkeypatch):
    """A broken verify (every draft token accepted) on the real engine: rejected, with the gap."""
    import llamaspec.speculative.engine as engine

    toks = _tokens(tiny)
    noise = flips.measure_noise(tiny, toks, n_tokens=32, n_ctx=1024, threads=1)
    monkeypatch.setattr(engine, "verify_greedy", broken_verify)
    rnd = _round(tiny, tiny_models["draft"], toks, noise.bound, [Candidate("draft-simple")])
    s = rnd.scores[0]
    assert s.rejected and s.rejected.startswith("greedy tokens differ from plain decoding on prompt 1"), s
    assert "a real divergence (gap " in s.rejected and not s.flips, s.rejected
    print(s.rejected)


def test_tune_says_which_flips_it_kept(run_cli, model_pair, tmp_path, monkeypatch):
    """End to end: the noise line on stderr, each kept flip in the report, the noise in --json."""
    import llamaspec.speculative.engine as engine

    t, d = model_pair
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    import functools

    import llamaspec.bench

    monkeypatch.setattr(engine, "verify_greedy", noisy_verify(flips.FLOOR / 2))
    # drafts of a fixed length (the controller would pause the tiny draft at its own pace): the
    # near-ties fall in verify batches, where the noisy verify can flip them, whatever the timings
    monkeypatch.setattr(llamaspec.bench, "BenchSettings", functools.partial(BenchSettings, adaptive=False))
    args = ("tune", t, "--draft", d, "--prompts", prompts, "--quick", "--max-spread", "1000", "-n", "96", "-t", "1",
            "-c", "1024", "--no-save")
    r = run_cli(*args)
    assert r.exit_code == 0, r.stderr
    assert "batch noise: the target's logit differences move by up to" in r.stderr
    assert "flip at a near-tie (gap " in r.stdout and "kept: " in r.stdout, r.stdout
    print(r.stdout)
    info = run_cli(*args, "--json").json()
    assert info["batch_noise"]["cached"] is True and info["batch_noise"]["bound"] >= flips.FLOOR
    kept = [c for x in info["sweep"]["rounds"] for c in x["candidates"] if c["flips"]]
    assert kept and all(c["rejected"] is None for c in kept)
