"""Tests of the acceptance rules and of the target distribution (llama.cpp's sampler chain)."""

from __future__ import annotations

import bisect
import doctest
import math

import numpy as np
import pytest

from llamaspec.speculative import verify
from llamaspec.speculative.verify import (
    SamplingParams,
    sample_token,
    step_sampler,
    target_candidates,
    target_distribution,
    verify_greedy,
    verify_rejection,
    verify_sample_and_match,
)


def test_docstring_examples():
    assert doctest.testmod(verify).failed == 0


def test_defaults_are_llama_cpp_defaults():
    p = SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.min_p) == (0.8, 40, 0.95, 0.05)
    assert (p.repeat_penalty, p.repeat_last_n, p.seed) == (1.0, 64, None)
    assert not p.greedy and SamplingParams(temperature=0).greedy
    assert not p.penalties_on


# -- greedy ----------------------------------------------------------------------------------

def _rows(argmaxes, vocab=10):
    rows = np.zeros((len(argmaxes), vocab), dtype=np.float32)
    for i, a in enumerate(argmaxes):
        rows[i, a] = 3.0
    return rows


@pytest.mark.parametrize("draft,argmaxes,expect", [
    ([], [4], (0, 4)),
    ([4], [4, 6], (1, 6)),
    ([3], [4, 6], (0, 4)),
    ([1, 2, 3, 4], [1, 2, 3, 4, 5], (4, 5)),
    ([1, 2, 9, 4], [1, 2, 3, 4, 5], (2, 3)),
    ([9, 2, 3, 4], [1, 2, 3, 4, 5], (0, 1)),
])
def test_verify_greedy(draft, argmaxes, expect):
    rows = _rows(argmaxes)
    assert verify_greedy(draft, rows) == expect
    assert verify_greedy(draft, list(rows)) == expect  # a list of rows works too
    argmax = lambda i, row: int(np.argmax(row))
    assert verify_sample_and_match(draft, rows, argmax) == expect


def test_greedy_ties_go_to_the_lowest_id():
    rows = np.array([[1.0, 5.0, 5.0], [0.0, 0.0, 0.0]])
    assert verify_greedy([2], rows) == (0, 1)
    assert verify_greedy([1], rows) == (1, 0)


def test_eog_ends_the_step():
    rows = _rows([1, 2, 3, 4])
    assert verify_greedy([1, 2, 3], rows, eog={2}) == (1, 2)
    assert verify_greedy([1, 2, 3], rows, eog={3}) == (2, 3)
    assert verify_greedy([1, 2, 3], rows, eog={4}) == (3, 4)  # bonus EOG: normal
    argmax = lambda i, row: int(np.argmax(row))
    assert verify_sample_and_match([1, 2, 3], rows, argmax, eog={2}) == (1, 2)
    p = np.eye(10)
    rng = np.random.default_rng(0)
    assert verify_rejection([1, 2, 3], None, p[[1, 2, 3, 4]], rng, eog={2}) == (1, 2)


def test_sample_and_match_calls_sampler_in_order_once_per_position():
    calls = []

    def sampler(i, row):
        calls.append(i)
        return [5, 6, 0, 8][i]

    assert verify_sample_and_match([5, 6, 7], _rows([0, 0, 0, 0]), sampler) == (2, 0)
    assert calls == [0, 1, 2]


# -- the target distribution -----------------------------------------------------------------

def _reference_candidates(logits, params: SamplingParams, recent=()):
    """Straight transcription of llama.cpp's samplers on a Python list of (id, logit)."""
    cur = [(i, float(l)) for i, l in enumerate(np.asarray(logits, dtype=np.float32))]
    if params.penalties_on and recent:
        n = params.repeat_last_n
        window = list(recent) if n < 0 else list(recent)[-n:]
        counts = {}
        for t in window:
            counts[t] = counts.get(t, 0) + 1
        out = []
        for i, l in cur:
            c = counts.get(i, 0)
            if c:
                l = l * params.repeat_penalty if l <= 0 else l / params.repeat_penalty
                l -= c * params.frequency_penalty + params.presence_penalty
            out.append((i, l))
        cur = out
    if params.temperature <= 0:
        best = max(cur, key=lambda x: (x[1], -x[0]))
        return {best[0]: 1.0}
    if params.top_k > 0:
        cur = sorted(cur, key=lambda x: (-x[1], x[0]))[:params.top_k]
    if params.top_p < 1.0:
        cur = sorted(cur, key=lambda x: (-x[1], x[0]))
        mx = cur[0][1]
        z = sum(math.exp(l - mx) for _, l in cur)
        cum, keep = 0.0, len(cur)
        for j, (_, l) in enumerate(cur):
            cum += math.exp(l - mx) / z
            if cum >= params.top_p and j + 1 >= params.min_keep:
                keep = j + 1
                break
        cur = cur[:keep]
    if params.min_p > 0:
        mx = max(l for _, l in cur)
        thr = np.float32(mx) + np.float32(math.log(params.min_p))
        cur = [(i, l) for i, l in cur if np.float32(l) >= thr]
    mx = max(l for _, l in cur)
    w = {i: math.exp((l - mx) / params.temperature) for i, l in cur}
    z = sum(w.values())
    return {i: v / z for i, v in w.items()}


PARAMS = [
    SamplingParams(),
    SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
    SamplingParams(temperature=0.5, top_k=5, top_p=1.0, min_p=0.0),
    SamplingParams(temperature=1.3, top_k=0, top_p=0.7, min_p=0.0),
    SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.2),
    SamplingParams(temperature=0.7, top_k=20, top_p=0.9, min_p=0.1, repeat_penalty=1.3,
                   repeat_last_n=8, frequency_penalty=0.2, presence_penalty=0.1),
    SamplingParams(temperature=0.0, repeat_penalty=2.0),
    SamplingParams(temperature=0.0),
]


@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize("seed", range(5))
def test_target_candidates_match_reference(params, seed):
    rng = np.random.default_rng(seed)
    vocab = [30, 300, 3000][seed % 3]
    logits = (rng.standard_normal(vocab) * rng.choice([0.5, 2.0, 6.0])).astype(np.float32)
    recent = rng.integers(0, vocab, size=12).tolist()
    ids, probs = target_candidates(logits, params, recent)
    ref = _reference_candidates(logits, params, recent)
    assert sorted(ids.tolist()) == sorted(ref)
    got = dict(zip(ids.tolist(), probs.tolist()))
    for i, p in ref.items():
        assert got[i] == pytest.approx(p, rel=1e-5, abs=1e-9)
    assert probs.sum() == pytest.approx(1.0)
    dense = target_distribution(logits, params, recent)
    assert dense.shape == (vocab,) and dense.sum() == pytest.approx(1.0)
    assert np.count_nonzero(dense) == len(ref)


def test_penalties_hand_computed():
    p = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=2.0,
                       frequency_penalty=0.1, presence_penalty=0.2, repeat_last_n=3)
    logits = np.array([2.0, -1.0, 0.5], dtype=np.float32)
    # recent window = last 3 = [0, 1, 0]: id 0 twice, id 1 once
    # id0: 2/2 - (2*0.1 + 0.2) = 0.6 ; id1: -1*2 - (0.1 + 0.2) = -2.3 ; id2: 0.5
    ids, probs = target_candidates(logits, p, [1, 1, 0, 1, 0])
    z = math.exp(0.6) + math.exp(-2.3) + math.exp(0.5)
    got = dict(zip(ids.tolist(), probs.tolist()))
    assert got[0] == pytest.approx(math.exp(0.6) / z, rel=1e-5)
    assert got[1] == pytest.approx(math.exp(-2.3) / z, rel=1e-5)
    assert got[2] == pytest.approx(math.exp(0.5) / z, rel=1e-5)
    # greedy with penalties: argmax of the penalized logits
    g = SamplingParams(temperature=0, repeat_penalty=5.0)
    assert target_candidates(logits, g, [0])[0].tolist() == [2]
    assert target_candidates(logits, g, [])[0].tolist() == [0]


def test_top_p_on_a_large_vocab_uses_the_sorted_prefix():
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal(50000) * 0.3).astype(np.float32)  # flat: top-p needs > 256 ids
    params = SamplingParams(temperature=1.0, top_k=0, top_p=0.5, min_p=0.0)
    ids, probs = target_candidates(logits, params)
    ref = _reference_candidates(logits, params)
    assert len(ids) > 256 and sorted(ids.tolist()) == sorted(ref)


def test_sample_token_greedy_and_seeded():
    logits = np.array([0.0, 3.0, 2.9, -1.0], dtype=np.float32)
    rng = np.random.default_rng(0)
    assert sample_token(logits, SamplingParams(temperature=0), [], rng) == 1
    a = [sample_token(logits, SamplingParams(), [], np.random.default_rng(7)) for _ in range(3)]
    b = [sample_token(logits, SamplingParams(), [], np.random.default_rng(7)) for _ in range(3)]
    assert a == b


def test_step_sampler_sees_accepted_draft_tokens_in_penalties():
    # token 0 is the best, but heavily penalised once it appears in recent tokens
    params = SamplingParams(temperature=0, repeat_penalty=100.0, repeat_last_n=4)
    row = np.array([5.0, 4.0, 0.0], dtype=np.float32)
    fn = step_sampler(params, history=[2, 2], draft_tokens=[0, 0], rng=np.random.default_rng(0))
    assert fn(0, row) == 0  # recent = [2, 2]
    assert fn(1, row) == 1  # recent = [2, 2, 0]: token 0 penalised
    assert verify_sample_and_match([0, 0], np.stack([row] * 3), fn) == (1, 1)


# -- losslessness: statistical tests ---------------------------------------------------------

def _tv(counts: np.ndarray, p: np.ndarray) -> float:
    return 0.5 * float(np.abs(counts / counts.sum() - p).sum())


V = 6
P0 = np.array([0.30, 0.25, 0.20, 0.15, 0.10, 0.00])
P1 = np.array([0.05, 0.05, 0.10, 0.50, 0.00, 0.30])
P2 = np.array([0.20, 0.20, 0.20, 0.20, 0.10, 0.10])
Q0 = np.array([0.10, 0.50, 0.00, 0.10, 0.10, 0.20])  # mass where P0 has none, none where P0 has some
Q1 = np.array([0.40, 0.10, 0.10, 0.10, 0.20, 0.10])


def _run(n_trials, step, seed):
    """Counts of the 1st emitted token, and of the 2nd among steps that accepted draft token 1."""
    rng = np.random.default_rng(seed)
    first = np.zeros(V)
    second = np.zeros(V)
    drafts0 = rng.choice(V, size=n_trials, p=Q0).tolist()  # draft token i ~ q_i
    drafts1 = rng.choice(V, size=n_trials, p=Q1).tolist()
    for d0, d1 in zip(drafts0, drafts1):
        n, nxt = step([d0, d1], rng)
        emitted = [d0, d1][:n] + [nxt]
        first[emitted[0]] += 1
        if n >= 1:
            second[emitted[1]] += 1
    return first, second


@pytest.mark.slow
def test_rejection_sampling_reproduces_the_target_distribution():
    rows = [P0, P1, P2]
    first, second = _run(200_000, lambda d, rng: verify_rejection(d, [Q0, Q1], rows, rng), 11)
    assert _tv(first, P0) < 0.006
    assert _tv(second, P1) < 0.01
    assert first[5] == 0 and second[4] == 0  # zero-probability tokens never emitted


def test_sample_and_match_reproduces_the_target_distribution():
    rows = [P0, P1, P2]

    cdfs = [np.cumsum(r).tolist() for r in rows]

    def step(draft, rng):
        # the target's sampler: inverse CDF of row i
        return verify_sample_and_match(
            draft, rows, lambda i, p: min(bisect.bisect_right(cdfs[i], rng.random()), V - 1))

    first, second = _run(200_000, step, 12)
    assert _tv(first, P0) < 0.006
    assert _tv(second, P1) < 0.01
    assert first[5] == 0 and second[4] == 0


def test_rejection_with_deterministic_drafts():
    """probs=None (n-gram drafts): q is one-hot, acceptance = p(x), residual = p without x."""
    rows = [P0, P1]
    rng = np.random.default_rng(5)
    counts = np.zeros(V)
    accepted = 0
    n = 60_000
    for _ in range(n):
        k, nxt = verify_rejection([1], None, rows, rng)
        counts[1 if k == 1 else nxt] += 1
        accepted += k
    assert _tv(counts, P0) < 0.01
    assert accepted / n == pytest.approx(P0[1], abs=0.01)


def test_rejection_acceptance_rate_is_sum_of_min_p_q():
    rng = np.random.default_rng(9)
    rows = [P0, P1]
    n = 60_000
    acc = 0
    for d0 in rng.choice(V, size=n, p=Q0).tolist():
        acc += verify_rejection([d0], [Q0], rows, rng)[0]
    assert acc / n == pytest.approx(np.minimum(P0, Q0).sum(), abs=0.01)  # 0.55, vs sum p*q = .2


def test_rejection_bonus_and_edge_cases():
    rng = np.random.default_rng(0)
    onehot = np.eye(4)
    # target certain of 2, draft proposes 2 with q = one-hot: always accepted; bonus from last row
    assert verify_rejection([2], [onehot[2]], [onehot[2], onehot[3]], rng) == (1, 3)
    # target certain of 1, draft 2: rejected, residual = max(0, p - q) = one-hot 1
    assert verify_rejection([2], [onehot[2]], [onehot[1], onehot[3]], rng) == (0, 1)
    # p == q: nothing left in the residual -> never rejected in practice; rows accepted
    q = np.array([0.5, 0.5, 0, 0])
    for _ in range(100):
        k, nxt = verify_rejection([0], [q], [q, onehot[0]], rng)
        assert (k, nxt) == (1, 0)
    # empty draft: a plain sample from the first row
    assert verify_rejection([], None, [onehot[3]], rng) == (0, 3)


@pytest.mark.parametrize("vocab,k", [(49152, 40), (262144, 40), (5000, 1), (5000, 600), (1300, 40)])
def test_top_k_selection_is_exact_on_large_vocabularies(vocab, k):
    rng = np.random.default_rng(vocab + k)
    logits = (rng.standard_normal(vocab) * 4).astype(np.float32)
    got = verify.top_k_sorted(logits, k)
    expect = np.argsort(-logits, kind="stable")[:k]
    assert got.tolist() == expect.tolist()


@pytest.mark.parametrize("q", [
    [0.7, 0.3, 0.0],             # a draft vocabulary smaller than the target's (id 3 missing)
    [0.4, 0.1, 0.1, 0.2, 0.2],   # larger: id 4 exists only in the draft (p = 0 there)
])
def test_rejection_sampling_with_a_draft_vocabulary_of_another_size(q):
    """llama.cpp allows vocabularies 128 apart; the output must still be distributed as p."""
    p = np.array([0.1, 0.2, 0.3, 0.4])
    q = np.array(q)
    rng = np.random.default_rng(5)
    n = 40_000
    counts = np.zeros(4)
    for _ in range(n):
        x = int(rng.choice(len(q), p=q))
        n_acc, nxt = verify_rejection([x], [q], [p, p], rng)
        counts[x if n_acc else nxt] += 1
    assert np.abs(counts / n - p).max() < 0.01, counts / n


def test_engine_and_drafter_docstring_examples():
    from llamaspec.speculative import sequence
    from llamaspec.speculative.drafters import model

    for mod in (sequence, model):
        r = doctest.testmod(mod)
        assert r.failed == 0 and r.attempted > 0
