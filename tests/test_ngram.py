"""Tests of the n-gram drafters: llama.cpp parity, incremental indexing, ngram-mod pool rules."""

from __future__ import annotations

import doctest
import random

import numpy as np
import pytest

from llamaspec.speculative.drafters import ngram_mod, ngram_simple
from llamaspec.speculative.drafters.ngram_mod import (
    EMPTY,
    LCG_MULTIPLIER,
    NGRAM_MOD_POOL_SIZE,
    NgramModDrafter,
    NgramModPool,
    ngram_mod_draft,
    ngram_mod_hash,
)
from llamaspec.speculative.drafters.ngram_simple import NgramSimpleDrafter, ngram_simple_draft

# Golden values printed by a C++ harness compiled against llama.cpp 0c1e570's own
# common/ngram-mod.cpp (common_ngram_mod::idx/add/get) and common_ngram_simple_draft copied
# verbatim from common/ngram-map.cpp; ngram-mod drafting is draft_one's loop from
# common/speculative.cpp. Inputs come from `gen` below (the same LCG in the harness).
LLAMA_IDX = [(1, 2930274, 959554), (2, 3935499, 1684), (3, 1838176, 763572), (4, 3153509, 921357),
 (5, 1498218, 203969), (6, 1522141, 285842)]
LLAMA_SIMPLE = [(1, [2, 1, 2, 0]), (2, []), (3, [1, 1, 0]), (4, [2, 2, 0, 0, 2, 1, 1]), (5, []), (6, [1, 1, 1]),
 (7, [2, 0, 1]), (8, []), (9, [1, 0, 1, 1, 1, 1, 1]), (10, []), (11, []), (12, [0, 0, 0, 0, 1]),
 (13, [0, 1, 1, 0, 2, 2]), (14, [3, 2, 0, 0, 3, 0, 2]), (15, []), (16, [2, 2, 1, 0]),
 (17, [0, 0, 1, 2, 2]), (18, [1, 0, 0, 0]), (19, []), (20, []), (21, []), (22, [1, 1, 2, 0, 0]),
 (23, []), (24, [0, 0, 0, 0, 0, 1, 1]), (25, [1, 0, 0]), (26, []), (27, [1, 0, 0]), (28, []),
 (29, [3, 3, 1, 1, 3, 3, 3]), (30, [0, 0]), (31, []), (32, []), (33, [0, 1]),
 (34, [2, 2, 1, 0, 2, 0, 0]), (35, []), (36, []), (37, [1, 0, 0, 1, 1]), (38, [1, 0, 1, 1, 3, 3]),
 (39, [1, 0]), (40, [0, 2, 2])]
LLAMA_MOD = [(1, [2, 2, 1, 1, 0, 0, 2, 2, 0, 0, 2, 2], 18), (2, [], 50), (3, [], 53),
 (4, [1, 1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 0], 4), (5, [2, 1, 1, 0, 2, 2, 0, 0, 2, 1, 2, 0], 20),
 (6, [], 88), (7, [0, 4, 1], 77), (8, [0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1], 4),
 (9, [2, 1, 0, 0, 2, 0, 1, 0, 0, 2, 0, 1], 21), (10, [2, 1, 1, 0, 0, 1, 1, 2, 0, 1, 2, 2], 116),
 (11, [0, 0, 1, 2, 1, 2, 0, 3, 0, 4, 4, 4], 81), (12, [0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1], 4),
 (13, [1, 0, 1, 2, 2, 0, 0, 1, 0, 1, 2, 2], 21), (14, [], 146),
 (15, [1, 1, 0, 1, 2, 0, 1, 1, 1, 4, 0, 4], 90), (16, [1, 1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 0], 4),
 (17, [], 17), (18, [], 59), (19, [0], 57), (20, [0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1], 4)]


def gen(seed: int, n: int, vocab: int) -> list[int]:
    """Deterministic tokens: x = (x * 1103515245 + 12345) mod 2**31, token = (x >> 16) % vocab."""
    x, out = seed, []
    for _ in range(n):
        x = (x * 1103515245 + 12345) % 2147483648
        out.append((x >> 16) % vocab)
    return out


def test_docstring_examples():
    for module in (ngram_simple, ngram_mod):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0


# -- hash ------------------------------------------------------------------------------------

def test_hash_is_llama_cpp_formula():
    toks = [3, 141, 59, 26535, 8979]
    expect = 0
    for t in toks:
        expect = (expect * 6364136223846793005 + t) % 2**64
    assert ngram_mod_hash(toks, 0, 5) == expect
    # as a polynomial: sum t_i * M^(n-1-i) mod 2^64
    assert expect == sum(t * pow(LCG_MULTIPLIER, 4 - i, 2**64) for i, t in enumerate(toks)) % 2**64
    # offset
    assert ngram_mod_hash([9, 9] + toks, 2, 5) == expect


@pytest.mark.parametrize("seed,idx_4m,idx_prime", LLAMA_IDX)
def test_hash_matches_compiled_llama_cpp(seed, idx_4m, idx_prime):
    toks = gen(seed, 24, 50000 if seed < 4 else 262144)
    assert NgramModPool(24, NGRAM_MOD_POOL_SIZE).idx(toks) == idx_4m
    assert ngram_mod_hash(toks, 0, 24) % 1000003 == idx_prime


def test_hash_of_negative_token_wraps_like_size_t():
    # C: size_t res = 0*M + (int32)-1  ->  2^64 - 1
    assert ngram_mod_hash([-1], 0, 1) == 2**64 - 1


def test_numpy_hashes_equal_python_hashes():
    rng = random.Random(5)
    toks = [rng.randrange(262144) for _ in range(300)]
    pool = NgramModPool(24, 1 << 20)
    pool.add_range(toks, 0, len(toks) - 24)
    for i in range(len(toks) - 24):
        assert pool.entries[ngram_mod_hash(toks, i, 24) % (1 << 20)] != EMPTY


# -- ngram-simple ----------------------------------------------------------------------------

@pytest.mark.parametrize("seed,expect", LLAMA_SIMPLE)
def test_ngram_simple_matches_compiled_llama_cpp(seed, expect):
    h = gen(seed, 20 + (seed * 7) % 60, 2 + seed % 3)
    n, m = 2 + seed % 3, 3 + seed % 5
    assert ngram_simple_draft(h[:-1], h[-1], n, m) == expect
    d = NgramSimpleDrafter(n, m)
    d.begin(0, h[:10])
    assert d.propose(0, h, 1000).tokens == expect


def test_ngram_simple_hand_cases():
    # too short: needs len(tokens) > size_n + size_m + 1
    assert ngram_simple_draft([1, 2, 3, 1], 2, size_n=2, size_m=1) == []
    # latest match wins: [1, 2] occurs at 1 and 5 -> copy after position 5
    toks = [0, 1, 2, 3, 3, 1, 2, 4, 4, 9, 9, 9, 1]
    assert ngram_simple_draft(toks, 2, size_n=2, size_m=2) == [4, 4]
    # fewer than size_n tokens follow the latest match (j=9) -> no draft, although the older
    # match at j=1 has plenty after it (llama.cpp does not fall back)
    toks = [0, 1, 2, 3, 3, 3, 3, 3, 3, 1, 2, 1]
    assert ngram_simple_draft(toks, 2, size_n=2, size_m=4) == []
    # exactly size_n tokens follow the match -> drafted
    toks = [0, 7, 7, 7, 7, 7, 7, 7, 1, 2, 5, 1]
    assert ngram_simple_draft(toks, 2, size_n=2, size_m=4) == [5, 1]
    # position 0 never matches
    toks = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1]
    assert ngram_simple_draft(toks, 2, size_n=2, size_m=3) == []


def test_ngram_simple_drafter_caps_at_n_max():
    toks = [7, 1, 2, 3, 4, 5, 8, 1, 2]
    d = NgramSimpleDrafter(2, 3)
    assert d.propose(0, toks, 8).tokens == [3, 4, 5]
    assert d.propose(0, toks, 2).tokens == [3, 4]
    assert d.propose(0, toks, 0).tokens == []
    assert d.propose(0, toks, 2).source == "ngram-simple"
    assert d.propose(0, toks, 2).probs is None


@pytest.mark.parametrize("seed", range(12))
def test_ngram_simple_incremental_equals_scan(seed):
    rng = random.Random(seed)
    vocab = rng.choice([2, 3, 5, 20])
    n, m = rng.choice([(1, 3), (2, 4), (3, 8), (12, 48)]) if vocab > 3 else rng.choice([(2, 4), (3, 5)])
    if n == 12:
        vocab = 3
    prompt = [rng.randrange(vocab) for _ in range(rng.randrange(1, 80))]
    d = NgramSimpleDrafter(n, m)
    d.begin(7, prompt)
    h = list(prompt)
    for _ in range(150):
        h.extend(rng.randrange(vocab) for _ in range(rng.randrange(1, 6)))
        cap = rng.choice([1, 3, 8, 100])
        expect = ngram_simple_draft(h[:-1], h[-1], n, m)[:cap]
        assert d.propose(7, h, cap).tokens == expect


def test_ngram_simple_rewritten_history_is_reindexed():
    d = NgramSimpleDrafter(2, 3)
    rng = random.Random(1)
    h1 = [rng.randrange(3) for _ in range(60)]
    d.propose(0, h1, 10)
    h2 = [rng.randrange(3) for _ in range(60)]  # a different history of the same length, no begin()
    assert d.propose(0, h2, 10).tokens == ngram_simple_draft(h2[:-1], h2[-1], 2, 3)
    h3 = h2[:30]  # shorter
    assert d.propose(0, h3, 10).tokens == ngram_simple_draft(h3[:-1], h3[-1], 2, 3)


def test_ngram_simple_sequences_are_independent():
    d = NgramSimpleDrafter(2, 3)
    a = [7, 1, 2, 3, 4, 5, 8, 1, 2]
    b = [7, 1, 2, 9, 9, 9, 8, 1, 2]
    assert d.propose(0, a, 8).tokens == [3, 4, 5]
    assert d.propose(1, b, 8).tokens == [9, 9, 9]
    d.end(0)
    assert d.propose(1, b, 8).tokens == [9, 9, 9]


# -- ngram-mod pool --------------------------------------------------------------------------

@pytest.mark.parametrize("seed,expect,used", LLAMA_MOD)
def test_ngram_mod_matches_compiled_llama_cpp(seed, expect, used):
    h = gen(seed, 40 + (seed * 13) % 200, 2 + seed % 4)
    n = 2 + seed % 4
    pool = NgramModPool(n, 97 if seed % 2 else NGRAM_MOD_POOL_SIZE)
    pool.add_range(h, 0, len(h) - 1 - n)
    assert ngram_mod_draft(pool, h, n_max=12, n_min=seed % 3) == expect
    assert pool.used == used


@pytest.mark.parametrize("seed", range(6))
def test_add_range_equals_sequential_add(seed):
    rng = random.Random(seed)
    n = rng.choice([1, 2, 3, 24])
    toks = [rng.randrange(50) for _ in range(400)]
    a, b = NgramModPool(n, 61), NgramModPool(n, 61)  # tiny pool: many collisions
    stop = len(toks) - n
    cut = rng.randrange(stop)
    a.add_range(toks, 0, cut)
    a.add_range(toks, cut, stop)
    for i in range(stop):
        b.add(toks, i)
    assert np.array_equal(a.entries, b.entries)
    assert a.used == b.used == int(np.count_nonzero(a.entries != EMPTY))
    for i in range(stop):
        assert a.get(toks, i) == b.get(toks, i)


def _draft_by_rehash(pool: NgramModPool, history, n_max, n_min):
    """llama.cpp's draft loop literally: re-hash the n-gram window for every drafted token."""
    n = pool.n
    if len(history) - 1 < n:
        return []
    result = list(history[-n:])
    for i in range(n_max):
        tok = pool.get(result, i)
        if tok == EMPTY:
            if i < n_min:
                return []
            break
        result.append(tok)
    return result[n:]


@pytest.mark.parametrize("seed", range(8))
def test_rolling_hash_draft_equals_rehash(seed):
    rng = random.Random(seed)
    n = rng.choice([2, 3, 24])
    pool = NgramModPool(n, rng.choice([97, 4096, NGRAM_MOD_POOL_SIZE]))
    toks = [rng.randrange(4) for _ in range(300)]
    pool.add_range(toks, 0, len(toks) - n)
    for end in range(n + 1, len(toks), 7):
        h = toks[:end]
        for n_max, n_min in [(64, 48), (16, 0), (8, 4)]:
            full = _draft_by_rehash(pool, h, n_max, n_min)
            assert ngram_mod_draft(pool, h, n_max, n_min) == full
            for cap in (1, 3, 50):  # capped drafts = llama.cpp's truncation to dp.n_max
                assert ngram_mod_draft(pool, h, n_max, n_min, limit=cap) == full[:cap]


def test_ngram_mod_draft_drops_drafts_shorter_than_n_min():
    pool = NgramModPool(n=2, size=64)
    pool.add_range([5, 6, 7, 8, 9], 0, 3)  # (5,6)->7 (6,7)->8 (7,8)->9 ; (8,9) unknown
    h = [0, 5, 6]
    assert ngram_mod_draft(pool, h, n_max=10, n_min=0) == [7, 8, 9]
    assert ngram_mod_draft(pool, h, n_max=10, n_min=3) == [7, 8, 9]
    assert ngram_mod_draft(pool, h, n_max=10, n_min=4) == []
    assert ngram_mod_draft(pool, h, n_max=2, n_min=4) == [7, 8]  # n_max reached first
    assert ngram_mod_draft(pool, h, n_max=10, n_min=4, limit=1) == []  # cap after the rule
    assert ngram_mod_draft(pool, h, n_max=10, n_min=3, limit=1) == [7]
    assert ngram_mod_draft(pool, [5, 6], n_max=10, n_min=0) == []  # needs len(history) > n


# -- ngram-mod drafter -----------------------------------------------------------------------

def _scratch_pool(history, upto, n, size):
    pool = NgramModPool(n, size)
    pool.add_range(history, 0, upto)
    return pool


@pytest.mark.parametrize("seed,chunk", [(s, c) for s in range(5) for c in (0, 32)])
def test_ngram_mod_incremental_equals_scratch(seed, chunk):
    """The drafter's pool after incremental indexing gives the same drafts as a pool built from
    scratch over the same n-grams (llama.cpp's chunk schedule: i_last + chunk < cur_len)."""
    rng = random.Random(100 + seed)
    n = rng.choice([2, 3, 4])
    size = 1 << 16
    d = NgramModDrafter(n_match=n, n_min=rng.choice([0, 2]), n_max=16, pool_size=size,
                        index_chunk=chunk)
    prompt = [rng.randrange(5) for _ in range(rng.randrange(n, 60))]
    d.begin(3, prompt)
    i_last = len(prompt) - n
    h = list(prompt)
    for _ in range(120):
        h.extend(rng.randrange(5) for _ in range(rng.randrange(1, 5)))
        cur_len = len(h) - 1
        if i_last + chunk < cur_len:
            i_last = cur_len - n
        cap = rng.choice([2, 8, 64])
        expect = ngram_mod_draft(_scratch_pool(h, i_last, n, size), h, d.n_max, d.n_min, limit=cap)
        assert d.propose(3, h, cap).tokens == expect
        assert d.pool.used == _scratch_pool(h, i_last, n, size).used
        d.accepted(3, 0, [], is_other=True)


def test_ngram_mod_chunk_zero_sees_every_ngram():
    d = NgramModDrafter(n_match=2, n_min=0, n_max=8, pool_size=1 << 12, index_chunk=0)
    d.begin(0, [1, 2])
    h = [1, 2, 3, 4, 1, 2]
    # every n-gram whose successor is before the last token is indexed: (1,2)->3 (2,3)->4 (3,4)->1;
    # (4,1)->2 is not (its successor is the last token), so the draft stops there
    assert d.propose(0, h, 8).tokens == [3, 4, 1]
    assert d.propose(0, h, 2).tokens == [3, 4]
    h = h + [7, 7, 1, 2]  # now also (4,1)->2, (1,2)->7 (the latest wins), (2,7)->7, (7,7)->1
    assert d.propose(0, h, 8).tokens == [7, 7, 1]


def test_ngram_mod_default_chunk_lags_like_llama_cpp():
    d = NgramModDrafter(n_match=2, n_min=0, n_max=8, pool_size=1 << 12)  # index_chunk=32
    d.begin(0, [1, 2])
    h = [1, 2, 3, 4, 1, 2]
    assert d.propose(0, h, 8).tokens == []  # not indexed yet: fewer than 32 new tokens
    h = [1, 2, 3, 4] + [9] * 40 + [1, 2]  # > 32 pending: (1,2)->3 (2,3)->4 (3,4)->9 (4,9)->9 ...
    assert d.propose(0, h, 4).tokens == [3, 4, 9, 9]


def test_defaults_are_llama_cpp_defaults():
    d = NgramModDrafter()
    assert (d.n_match, d.n_min, d.n_max, d.pool.size) == (24, 48, 64, 4 * 1024 * 1024)
    assert d.pool.entries.dtype == np.int32 and d.pool.entries.nbytes == 16 * 1024 * 1024
    assert (d.reset_occupancy, d.low_acceptance, d.low_rounds, d.index_chunk) == (0.25, 0.25, 5, 32)
    s = NgramSimpleDrafter()
    assert (s.size_n, s.size_m) == (12, 48)
    assert (d.name, s.name) == ("ngram-mod", "ngram-simple")


def test_pool_reset_when_over_quarter_full_at_begin():
    d = NgramModDrafter(n_match=1, n_min=0, n_max=4, pool_size=16)
    d.begin(0, [0, 1, 2, 3, 4])  # 4 unigrams -> 4/16 = 25%: not more than 25%, kept
    assert d.pool.used == 4 and d.n_resets == 0
    d.begin(1, [5, 6])  # one more: 5/16 > 25% -> reset (after adding, as llama.cpp does)
    assert d.pool.used == 0 and d.n_resets == 1


def _mod_drafter_with_draft():
    d = NgramModDrafter(n_match=2, n_min=0, n_max=8, pool_size=1 << 12)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2]
    d.begin(0, prompt)
    return d, prompt


def test_pool_reset_after_five_low_acceptance_rounds():
    d, h = _mod_drafter_with_draft()
    for round_ in range(5):
        assert d.pool.used > 0
        draft = d.propose(0, h, 8)
        assert len(draft) == 8  # 3 4 5 6 7 8 1 2: the prompt's n-grams form a cycle
        d.accepted(0, 1, draft.tokens[:1] + [0])  # 1/8 < 0.25
    assert d.pool.used == 0 and d.n_resets == 1
    assert d._seqs[0].i_last == 0 and d._seqs[0].n_low == 0


def test_low_acceptance_streak_is_broken_by_a_good_round():
    d, h = _mod_drafter_with_draft()
    for accepted in [0, 0, 0, 0, 2, 0, 0, 0, 0]:  # 2/8 >= .25 resets the streak
        draft = d.propose(0, h, 8)
        assert draft
        d.accepted(0, accepted, [])
    assert d.n_resets == 0
    d.propose(0, h, 8)
    d.accepted(0, 0, [])
    assert d.n_resets == 1


def test_feedback_for_other_drafters_or_no_draft_is_ignored():
    d, h = _mod_drafter_with_draft()
    for _ in range(10):
        d.propose(0, h, 8)
        d.accepted(0, 0, [], is_other=True)   # someone else's draft
        d.accepted(0, 0, [0])                 # already judged / no draft pending
    assert d.n_resets == 0
    for _ in range(10):
        d.accepted(0, 0, [0])  # steps without propose (controller paused): nothing to judge
    assert d.n_resets == 0


def test_pool_is_shared_by_sequences():
    d = NgramModDrafter(n_match=2, n_min=0, n_max=8, pool_size=1 << 12)
    d.begin(0, [1, 2, 3, 4, 5])
    d.begin(1, [9, 9])
    assert d.propose(1, [9, 9, 1, 2], 8).tokens == [3, 4, 5]
