"""Will a draft model pay here (pairing/draft_value.py), and the default's use of it: the cold-start
rule fed the layouts measured on 2-core CPUs (refused) and GPU-like numbers (taken), measured
costs stored per pair by a run that used the draft (tune/draft_costs.py), and `run` / `pair` on a
real F16 target with its same-size Q4_1 beside it."""

from __future__ import annotations

import doctest
import os
from pathlib import Path

import pytest

from llamaspec.pairing import draft_value
from llamaspec.pairing.draft_value import DraftCosts, cold_costs, expected_speedup, value
from llamaspec.tune import draft_costs

# file sizes of the real pairs (REFERENCE.md section 3, MEASURED.md)
SMOLLM2_F16, SMOLLM2_Q4_1 = 270_885_952, 98_362_432
QWEN_1_5B, QWEN_0_5B = 1_117_320_768, 491_400_064
# the 1.5B's verify curve measured on the 2-core EPYC, t(n)/t(1) at n = 1, 2, 4, 8, 16, 32
QWEN_CURVE = {1: 1.0, 2: 1.79, 4: 2.96, 8: 4.87, 16: 5.78, 32: 10.1}


def _dense(points: dict[int, float], n_max: int = 33) -> tuple[float, ...]:
    xs = sorted(points)
    out = []
    for n in range(1, n_max + 1):
        lo = max(x for x in xs if x <= n) if n >= xs[0] else xs[0]
        hi = min((x for x in xs if x >= n), default=xs[-1])
        out.append(points[lo] if hi == lo else points[lo] + (points[hi] - points[lo]) * (n - lo) / (hi - lo))
    return tuple(out)


def test_docstring_examples():
    assert doctest.testmod(draft_value).failed == 0


def test_cold_rule_refuses_both_cpu_pairs_that_lost_here():
    # SmolLM2 F16 + its Q4_1 (0.45-0.95x measured), Qwen2.5-Coder 1.5B + 0.5B (0.75-0.79x measured)
    for target, draft in [(SMOLLM2_F16, SMOLLM2_Q4_1), (QWEN_1_5B, QWEN_0_5B)]:
        v = value(cold_costs(target, draft, gpu=False))
        assert not v.pays and v.speedup < 1.0, v


def test_cold_rule_takes_a_small_draft_of_a_7b_on_a_gpu():
    v = value(cold_costs(4.7e9, 0.4e9, gpu=True))   # a 7B Q4_K_M and a 0.5B Q4_K_M
    assert v.pays and v.speedup > 1.5 and v.k >= 3, v


def test_measured_numbers_decide_both_ways():
    # the Qwen pair as measured here: 100 % accepted and still a loss under its steep verify curve
    qwen = DraftCosts(0.45, _dense(QWEN_CURVE), 1.0, "measured")
    assert not value(qwen).pays
    # GPU-like measured numbers: a cheap draft, nearly free batches, 80 % accepted
    gpu = DraftCosts(0.1, tuple(1.0 + 0.01 * (n - 1) for n in range(1, 34)), 0.8, "measured")
    v = value(gpu)
    assert v.pays and v.speedup > 2.0


def test_expected_speedup_by_hand():
    # k=1 at a = 1: 2 tokens for c + t(2)/t(1) = 0.5 + 1.5 = 2 steps: exactly plain's rate
    s, k = expected_speedup(0.5, [1.0, 1.5], 1.0, k_max=1)
    assert (k, s) == (1, 1.0)


def test_draft_costs_store_round_trip(tmp_path):
    t, d = tmp_path / "t.gguf", tmp_path / "d.gguf"
    t.write_bytes(b"GGUF" + b"\0" * 64)
    d.write_bytes(b"GGUF" + b"\1" * 32)
    assert draft_costs.measured(t, d) is None
    draft_costs.record(t, d, DraftCosts(0.3, (1.0, 1.2, 1.4), 0.7, "measured"), drafts=12)
    got = draft_costs.measured(t, d)
    assert got is not None and got.source == "measured" and got.cost_ratio == 0.3 and got.verify == (1.0, 1.2, 1.4)
    assert "12 drafts" in got.detail
    d.write_bytes(b"GGUF" + b"\2" * 32)   # another file at the same path: the measurement is not its
    assert draft_costs.measured(t, d) is None


# ---- the default on a real layout: SmolLM2 F16 with its Q4_1 beside it --------------------------


def _put(src: Path, dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(src, dst)
    return dst


@pytest.fixture
def sibling_layout(smollm2_f16, smollm2_q4, tmp_path):
    folder = tmp_path / "models"
    return _put(smollm2_f16, folder / "smollm2-f16.gguf"), _put(smollm2_q4, folder / "smollm2-q4_1.gguf")


@pytest.mark.real
def test_the_same_size_sibling_is_not_loaded_by_default_and_pair_says_why(run_cli, sibling_layout):
    target, sib = sibling_layout
    r = run_cli("run", target, "-p", "Write a haiku.", "-n", "8", "--temp", "0", "--json")
    assert r.exit_code == 0, r.stderr
    assert r.json()["draft_model"] is None and "draft-simple" not in r.json()["spec_type"]
    first = r.stderr.splitlines()[0]
    assert "smollm2-q4_1.gguf found but not expected to pay here" in first and "forces it" in first
    auto = run_cli("run", target, "--draft", "auto", "-v", "-p", "hi", "-n", "4", "--temp", "0", "--json")
    assert auto.json()["draft_model"] is None and "not expected to pay" in auto.stderr
    assert "expected 0." in auto.stderr and "first-run estimate for a CPU" in auto.stderr   # -v: why
    p = run_cli("pair", target, "--offline", "--json").json()["auto"]
    assert p["refused"] == str(sib) and p["value"]["pays"] is False and p["value"]["costs"]["source"] == "cold"


@pytest.mark.real
def test_a_stored_measurement_that_pays_brings_the_sibling_in(run_cli, sibling_layout, draft_pays):
    target, sib = sibling_layout
    draft_pays(target, sib)
    r = run_cli("run", target, "-p", "Write a haiku.", "-n", "8", "--temp", "0", "--json")
    assert r.exit_code == 0, r.stderr
    assert Path(r.json()["draft_model"]).name == "smollm2-q4_1.gguf" and "draft-simple" in r.json()["spec_type"]
    assert r.stderr.splitlines()[0].startswith("speculation: draft-simple with smollm2-q4_1.gguf beside the target")


@pytest.mark.real
def test_a_forced_draft_run_stores_what_the_draft_cost_and_the_next_default_uses_it(run_cli, sibling_layout):
    target, sib = sibling_layout
    r = run_cli("run", target, "--draft", sib, "-p", "Write a story about a fox.", "-n", "24", "--temp", "0",
                "--json")
    assert r.exit_code == 0, r.stderr
    got = draft_costs.measured(target, sib)
    assert got is not None and got.source == "measured" and got.cost_ratio > 0.0
    assert got.verify[0] == 1.0 and all(b >= a for a, b in zip(got.verify, got.verify[1:]))
    again = run_cli("run", target, "-v", "-p", "hi", "-n", "4", "--temp", "0", "--json")
    assert again.exit_code == 0, again.stderr
    # on this CPU the measurement refuses it as the cold rule did; either way -v says the numbers are measured
    if again.json()["draft_model"] is None:
        assert "measured here" in again.stderr
