"""ngram-map-k / ngram-map-k4v: llama.cpp's common/ngram-map.cpp ported to llamaspec/speculative/drafters/ngram_map.py."""

from __future__ import annotations

import doctest
import random

from llamaspec.speculative.drafters import ngram_map
from llamaspec.speculative.drafters.ngram_map import (
    HASH_MAP_SIZE,
    LCG_FACTOR,
    NgramMap,
    NgramMapK4vDrafter,
    NgramMapKDrafter,
    ngram_map_accept,
    ngram_map_begin,
    ngram_map_draft,
    ngram_map_hash,
)


def test_docstring_examples():
    result = doctest.testmod(ngram_map)
    assert result.attempted >= 8 and result.failed == 0


def test_hash_is_llama_cpp_formula():
    assert ngram_map_hash([7], 0, 1) == 7
    assert ngram_map_hash([3, 1, 4], 0, 3) == ((3 * LCG_FACTOR + 1) * LCG_FACTOR + 4) % 2**32
    assert ngram_map_hash([9, 3, 1, 4], 1, 3) == ngram_map_hash([3, 1, 4], 0, 3)
    assert ngram_map_hash([-1], 0, 1) == 2**32 - 1  # int32 -> uint32 as in C


# --- ngram-map-k, by hand --------------------------------------------------------------------

def test_k_hand_example_and_minimum_length():
    mp = NgramMap(size_n=2, size_m=2, key_only=True)
    ngram_map_begin(mp, [9, 1, 2, 3, 4, 8, 8, 1])
    # len(inp) = 8 >= 2n+m = 6; key [1, 2] at position 1 (search range 1..8-5=3) -> [3, 4]
    assert ngram_map_draft(mp, [9, 1, 2, 3, 4, 8, 8, 1, 2]) == [3, 4]
    mp = NgramMap(size_n=2, size_m=2, key_only=True)
    ngram_map_begin(mp, [1, 2, 3, 4, 1])
    assert ngram_map_draft(mp, [1, 2, 3, 4, 1, 2]) == []  # len(inp) = 5 < 6
    mp = NgramMap(size_n=2, size_m=2, key_only=True)
    ngram_map_begin(mp, [9, 1, 2, 3, 4, 8, 8, 1])
    assert ngram_map_draft(mp, [9, 1, 2, 3, 4, 8, 8, 1, 7]) == []  # [1, 7] never seen


def test_k_match_must_leave_room_for_m_plus_one_tokens():
    # [1, 2] only at position 4 > len(inp)-n-m-1 = 3: not a candidate
    mp = NgramMap(size_n=2, size_m=2, key_only=True)
    ngram_map_begin(mp, [9, 8, 7, 6, 1, 2, 3, 1])
    assert ngram_map_draft(mp, [9, 8, 7, 6, 1, 2, 3, 1, 2]) == []


def test_k_acceptance_caps_next_draft_and_zero_silences_the_key():
    d = NgramMapKDrafter(size_n=2, size_m=3)
    prompt = [9, 1, 2, 3, 4, 5, 8, 8, 8, 1]
    d.begin(0, prompt)
    h = prompt + [2]
    assert d.propose(0, h, 10).tokens == [3, 4, 5]
    d.accepted(0, 2, [3, 4, 7])                          # 2 accepted: cap 2
    h = h + [3, 4, 7, 1, 2]
    assert d.propose(0, h, 10).tokens == [3, 4]
    d.accepted(0, 0, [6], is_other=True)                 # another drafter's draft: no change
    h = h + [6, 1, 2]
    assert d.propose(0, h, 10).tokens == [3, 4]
    d.accepted(0, 0, [6])                                # wholly rejected: cap 0, for good
    h = h + [6, 1, 2]
    assert d.propose(0, h, 10).tokens == []


def test_k_ignores_min_hits_like_llama_cpp():
    prompt = [9, 1, 2, 3, 4, 8, 8, 1]
    d = NgramMapKDrafter(size_n=2, size_m=2, min_hits=5)
    d.begin(0, prompt)
    assert d.propose(0, prompt + [2], 8).tokens == [3, 4]


# --- ngram-map-k4v, by hand ------------------------------------------------------------------

def test_k4v_min_hits_counts_lookups_of_the_key():
    prompt = [0, 5, 1, 5, 1, 9, 9, 9]
    for min_hits, first in ((1, [1]), (2, [])):
        d = NgramMapK4vDrafter(size_n=1, size_m=1, min_hits=min_hits)
        d.begin(0, prompt)
        h = prompt + [5]
        assert d.propose(0, h, 4).tokens == first    # hit 1
        d.accepted(0, 0, [7], is_other=True)
        h = h + [7, 5]
        assert d.propose(0, h, 4).tokens == [1]      # hit 2: drafts with min_hits 1 and 2


def test_k4v_most_frequent_value_must_dominate_two_to_one():
    def draft(prompt):
        mp = NgramMap(size_n=1, size_m=1, key_only=False)
        ngram_map_begin(mp, prompt)
        return ngram_map_draft(mp, prompt + [5]), mp
    # after 5: 1, 1, 1 -> only one value: draft the token after the latest match
    assert draft([0, 5, 1, 5, 1, 5, 1, 9, 9])[0] == [1]
    # 1, 1, 2: 2 >= 2*1 -> draft; 1, 2: 1 < 2*1 -> none; 1, 1, 2, 3: 2 < 2*2 -> none
    toks, mp = draft([0, 5, 1, 5, 1, 5, 2, 9, 9])
    assert toks == [2]                                # tokens after match_pos (llama.cpp), not [1]
    assert mp.last_value == 0 and mp.last_key.values[0].value_num == 2   # slot of value [1]
    ngram_map_accept(mp, 0)
    assert mp.last_key.values[0].n_accepted == 0 and mp.last_key.values[1].n_accepted == 1
    assert draft([0, 5, 1, 5, 2, 9, 9])[0] == []
    assert draft([0, 5, 1, 5, 1, 5, 2, 5, 3, 9, 9])[0] == []


def test_k4v_keeps_at_most_four_values():
    # after 5: 1, 2, 3, 4 fill the 4 slots, then 6 six times: 6 is never counted
    prompt = [0, 5, 1, 5, 2, 5, 3, 5, 4] + [5, 6] * 6 + [9, 9]
    mp = NgramMap(size_n=1, size_m=1, key_only=False)
    ngram_map_begin(mp, prompt)
    assert ngram_map_draft(mp, prompt + [5]) == []   # 1 < 2 * 3: no value dominates
    (key,) = mp.keys
    assert [prompt[v.value_idx] for v in key.values] == [1, 2, 3, 4]
    assert [v.value_num for v in key.values] == [1, 1, 1, 1]


def test_k4v_rescan_counts_the_previous_match_again():
    # llama.cpp restarts the count at stat_idx = previous match_pos (inclusive)
    prompt = [0, 5, 1, 9, 9, 9, 9]
    mp = NgramMap(size_n=1, size_m=1, key_only=False)
    ngram_map_begin(mp, prompt)
    assert ngram_map_draft(mp, prompt + [5]) == [1]
    assert mp.keys[0].values[0].value_num == 1
    assert ngram_map_draft(mp, prompt + [5, 7, 5]) == [1]
    assert mp.keys[0].values[0].value_num == 2


# --- the drafter -----------------------------------------------------------------------------

def test_n_max_truncates_and_zero_changes_nothing():
    prompt = [9, 1, 2, 3, 4, 5, 6, 7, 8, 8, 8, 8, 1]
    d = NgramMapKDrafter(size_n=2, size_m=5)
    d.begin(0, prompt)
    assert d.propose(0, prompt + [2], 0).tokens == []
    assert d._maps[0].key_map == {} and d._maps[0].keys == []
    dr = d.propose(0, prompt + [2], 2)
    assert dr.tokens == [3, 4] and dr.probs is None and dr.source == "ngram-map-k"
    assert d.propose(0, prompt + [2], 50).tokens == [3, 4, 5, 6, 7]


def test_sequences_are_independent():
    d = NgramMapKDrafter(size_n=2, size_m=2)
    a = [9, 1, 2, 3, 4, 8, 8, 1]
    b = [7, 1, 2, 6, 6, 8, 8, 1]
    d.begin(0, a)
    d.begin(1, b)
    assert d.propose(0, a + [2], 8).tokens == [3, 4]
    assert d.propose(1, b + [2], 8).tokens == [6, 6]
    d.accepted(0, 0, [5])
    assert d.propose(1, b + [2, 6, 6, 1, 2], 8).tokens == [6, 6]   # seq 1's cap untouched
    d.end(0)
    assert 0 not in d._maps and 1 in d._maps


def test_shorter_history_is_a_new_begin():
    d = NgramMapKDrafter(size_n=2, size_m=2)
    p = [9, 1, 2, 3, 4, 8, 8, 1]
    d.begin(0, p)
    d.propose(0, p + [2, 3, 4, 5, 6, 7, 1, 2], 8)
    assert d.propose(0, p + [2], 8).tokens == [3, 4]   # cleaned up, not an error


def _scratch_k(h, begin, calls, n, m, cap):
    """ngram-map-k's draft rebuilt from scratch: the hash index replayed from the lengths of all
    earlier calls, then the three-step lookup. cap: key tuple -> n_accepted of its last draft."""
    km, last = {}, 0

    def index(hi, lo):
        for j in range(hi, lo, -1):
            km.setdefault(ngram_map_hash(h, j, n) % HASH_MAP_SIZE, j)

    def rfind(hi, lo):
        return next((j for j in range(hi, lo, -1) if h[j:j + n] == key), 0)

    for c in calls:
        if begin > n + m + 1:
            index(begin - n - m - 1, last)
        index(c - n - m - 1, max(begin, last))
        last = max(c - n - m - 1, last)
    cur = len(h) - 1
    if cur < 2 * n + m:
        return [], None
    key = h[-n:]
    j = km.get(ngram_map_hash(key, 0, n) % HASH_MAP_SIZE, 0)
    pos = j if j and j < cur - n - m - 1 and h[j:j + n] == key else 0
    if not pos and begin > n + m + 1:
        pos = rfind(begin - n - m - 1, last)
    if not pos:
        pos = rfind(cur - n - m - 1, max(begin, last))
    if not pos:
        return [], None
    return h[pos + n:pos + n + min(m, cap.get(tuple(key), m))], tuple(key)


def test_incremental_index_equals_rebuilding_it_from_scratch():
    rng = random.Random(12345)
    n_drafts = 0
    for _ in range(60):
        n, m, vocab = rng.randint(1, 3), rng.randint(1, 4), rng.randint(2, 5)
        h = [rng.randrange(vocab) for _ in range(rng.randint(0, 40))]
        begin = len(h)
        d = NgramMapKDrafter(size_n=n, size_m=m)
        d.begin(0, h)
        h.append(rng.randrange(vocab))
        calls, cap = [], {}
        for _step in range(60):
            n_max = rng.choice([0, 1, 3, 8])
            want, key = _scratch_k(h, begin, calls, n, m, cap) if n_max else ([], None)
            got = d.propose(0, h, n_max).tokens
            assert got == want[:n_max]
            if n_max and len(h) - 1 >= 2 * n + m:
                calls.append(len(h) - 1)
            n_acc = rng.randint(0, len(got))
            if got:
                n_drafts += 1
                cap[key] = n_acc
            d.accepted(0, n_acc, got[:n_acc] + [0], is_other=not got)
            h += got[:n_acc] + [rng.randrange(vocab)]
    assert n_drafts > 200
