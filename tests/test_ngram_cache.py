"""ngram-cache drafter: llama.cpp's lookup decoding (common/ngram-cache.cpp), pure Python."""

from __future__ import annotations

import doctest
import struct

import pytest

from llamaspec.speculative.drafters import ngram_cache as nc
from llamaspec.speculative.drafters.ngram_cache import (
    NgramCacheDrafter, load_ngram_cache, merge_ngram_caches, ngram_cache_draft, ngram_cache_update,
    save_ngram_cache,
)

N = -1


def _ctx(h):
    c = {}
    ngram_cache_update(c, h, len(h))
    return c


def test_doctests():
    assert doctest.testmod(nc).failed == 0


def test_update_counts_by_hand():
    c = _ctx([1, 2, 3, 1, 2])
    assert c[(1, N, N, N)] == {2: 2}
    assert c[(1, 2, N, N)] == {3: 1}
    assert c[(2, 3, 1, N)] == {2: 1}
    assert c[(1, 2, 3, 1)] == {2: 1}
    assert (3, 1, 2, N) not in c           # nothing follows the last token yet
    # nnew: only n-grams ending in the last nnew tokens
    c = {}
    ngram_cache_update(c, [1, 2, 3, 1, 2], 1)
    assert c == {(1, N, N, N): {2: 1}, (3, 1, N, N): {2: 1}, (2, 3, 1, N): {2: 1}, (1, 2, 3, 1): {2: 1}}


def test_hand_worked_draft():
    h = [1, 2, 3, 1, 2, 3, 1, 2]
    assert ngram_cache_draft(h, 8, _ctx(h), {}, {}) == [3, 1, 2, 3, 1, 2, 3, 1]
    assert ngram_cache_draft(h, 2, _ctx(h), {}, {}) == [3, 1]
    assert ngram_cache_draft([7], 4, _ctx([7]), {}, {}) == []   # fewer than NGRAM_STATIC tokens


def test_lax_thresholds_per_size():
    key1 = (5, N, N, N)
    # 1-gram: 2 samples and 66%
    assert ngram_cache_draft([9, 5], 1, {key1: {6: 1}}, {}, {}) == []          # 1 sample < 2
    assert ngram_cache_draft([9, 5], 1, {key1: {6: 2}}, {}, {}) == [6]
    assert ngram_cache_draft([9, 5], 1, {key1: {6: 2, 7: 1}}, {}, {}) == [6]   # 66.7% >= 66
    assert ngram_cache_draft([9, 5], 1, {key1: {6: 1, 7: 1}}, {}, {}) == []    # 50% < 66
    # 2-gram: 2 samples and 50%
    key2 = (9, 5, N, N)
    assert ngram_cache_draft([9, 5], 1, {key2: {6: 1}}, {}, {}) == []
    assert ngram_cache_draft([9, 5], 1, {key2: {6: 1, 7: 1}}, {}, {}) == [6]   # tie: first added
    # 3-gram: 1 sample is enough
    assert ngram_cache_draft([8, 9, 5], 1, {(8, 9, 5, N): {4: 1}}, {}, {}) == [4]
    # the largest n-gram that passes wins; a failing larger one falls back to a smaller one
    ctx = {(8, 9, 5, N): {4: 1, 3: 1, 2: 1}, key1: {6: 3}}
    assert ngram_cache_draft([8, 9, 5], 1, ctx, {}, {}) == [6]


def test_strict_thresholds_dynamic():
    key1 = (5, N, N, N)
    assert ngram_cache_draft([9, 5], 1, {}, {key1: {6: 3}}, {}) == []          # 3 < 4 samples
    assert ngram_cache_draft([9, 5], 1, {}, {key1: {6: 4}}, {}) == [6]
    assert ngram_cache_draft([9, 5], 1, {}, {key1: {6: 5, 7: 2}}, {}) == []    # 71% < 75
    assert ngram_cache_draft([9, 5], 1, {}, {key1: {6: 6, 7: 2}}, {}) == [6]   # 75%
    key2 = (9, 5, N, N)
    assert ngram_cache_draft([9, 5], 1, {}, {key2: {6: 2}}, {}) == []          # 2 < 3
    assert ngram_cache_draft([9, 5], 1, {}, {key2: {6: 2, 7: 1}}, {}) == [6]   # 66.7%
    # context is asked first: lax passes there before dynamic is consulted
    assert ngram_cache_draft([9, 5], 1, {key1: {7: 2}}, {key1: {6: 9}}, {}) == [7]


def test_static_cache_influences_draft():
    key2 = (9, 5, N, N)
    ctx = {key2: {6: 1, 7: 1}}
    assert ngram_cache_draft([9, 5], 1, ctx, {}, {}) == [6]
    # the static 2-gram saw 7 after (9, 5): 7 weighs 1 x 100 against 6's 1 x 1
    assert ngram_cache_draft([9, 5], 1, ctx, {}, {key2: {7: 1}}) == [7]
    # weighting changes the pick, not the thresholds (computed on primary counts)
    ctx = {(5, N, N, N): {6: 1, 7: 1}}
    assert ngram_cache_draft([9, 5], 1, ctx, {}, {key2: {7: 1}}) == []          # 50% < 66; static alone: 1 < 2
    # static alone: lax 2-gram thresholds
    assert ngram_cache_draft([9, 5], 1, {}, {}, {key2: {7: 2}}) == [7]
    assert ngram_cache_draft([9, 5], 1, {}, {}, {key2: {7: 1, 8: 2}}) == [8]
    assert ngram_cache_draft([9, 5], 1, {}, {}, {key2: {7: 1, 8: 1, 3: 1}}) == []  # 33% < 50
    # static drafts continue over drafted tokens: (5, 7) -> 1
    st = {key2: {7: 2}, (5, 7, N, N): {1: 3}}
    assert ngram_cache_draft([9, 5], 4, {}, {}, st) == [7, 1]


def test_file_round_trip_llama_format(tmp_path):
    cache = {(1, 2, N, N): {3: 4, 5: 1}, (7, N, N, N): {8: 2}}
    p = tmp_path / "static.bin"
    save_ngram_cache(cache, p)
    raw = p.read_bytes()
    # common_ngram (4 x int32), int32 ntokens, ntokens x (int32 token, int32 count)
    assert raw[:20] == struct.pack("<4ii", 1, 2, -1, -1, 2)
    assert raw[20:36] == struct.pack("<2i2i", 3, 4, 5, 1)
    assert raw[36:] == struct.pack("<4ii2i", 7, -1, -1, -1, 1, 8, 2)
    assert load_ngram_cache(p) == cache


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_ngram_cache(tmp_path / "missing.bin")
    p = tmp_path / "bad.bin"
    p.write_bytes(struct.pack("<4ii", 1, 2, -1, -1, 2) + struct.pack("<2i", 3, 4))   # 1 of 2 pairs
    with pytest.raises(ValueError, match="truncated token counts"):
        load_ngram_cache(p)
    p.write_bytes(b"\x00" * 7)
    with pytest.raises(ValueError, match="truncated n-gram header"):
        load_ngram_cache(p)
    p.write_bytes(struct.pack("<4ii", 1, 2, -1, -1, 0))
    with pytest.raises(ValueError, match="token count 0"):
        load_ngram_cache(p)
    p.write_bytes(struct.pack("<4ii2i", 1, 2, -1, -1, 1, 3, 0))
    with pytest.raises(ValueError, match="count 0"):
        load_ngram_cache(p)
    p.write_bytes(b"")
    assert load_ngram_cache(p) == {}
    with pytest.raises(FileNotFoundError):
        NgramCacheDrafter(static_path=tmp_path / "nope.bin")


def test_drafter_with_static_and_dynamic_files(tmp_path):
    sp, dp = tmp_path / "s.bin", tmp_path / "d.bin"
    save_ngram_cache({(9, 5, N, N): {7: 3}}, sp)
    save_ngram_cache({(7, N, N, N): {2: 4}}, dp)
    d = NgramCacheDrafter(static_path=sp, dynamic_path=dp)
    d.begin(0, [9])
    # context empty for (9, 5); static drafts 7, then dynamic (7,) -> 2 (strict: 4 samples)
    assert d.propose(0, [9, 5], 8).tokens == [7, 2]
    assert d.propose(0, [9, 5], 8).source == "ngram-cache"


def test_n_max_truncation_and_n_draft():
    h = [1, 2] * 10
    d = NgramCacheDrafter()
    d.begin(0, h[:-1])
    assert len(d.propose(0, h, 3)) == 3
    assert len(d.propose(0, h, 32)) == 8          # llama.cpp's fixed n_draft
    assert d.propose(0, h, 0).tokens == []
    d = NgramCacheDrafter(n_draft=None)
    assert d.propose(0, h, 12).tokens == [1, 2] * 6


def test_chunked_update_like_speculative_cpp():
    d = NgramCacheDrafter()
    h = [4, 5, 6, 9]
    assert d.propose(0, h, 4).tokens == []
    # one new token per step: speculative.cpp counts n-grams inside that 1-token chunk only: none
    for t in [4, 5, 6, 9, 4]:
        h = h + [t]
        d.propose(0, h, 4)
    assert d._seqs[0].context == _ctx([4, 5, 6, 9])
    # lookup.cpp style counts across chunks
    d2 = NgramCacheDrafter(chunked_update=False)
    h = [4, 5, 6, 9]
    d2.propose(0, h, 4)
    for t in [4, 5, 6, 9, 4]:
        h = h + [t]
        out = d2.propose(0, h, 4)
    assert d2._seqs[0].context == _ctx(h)
    assert out.tokens == [5, 6, 9, 4]


def test_per_sequence_independence(tmp_path):
    d = NgramCacheDrafter()
    a, b = [1, 2, 3, 1, 2, 3, 1, 2], [7, 8, 7, 8, 7]
    d.begin(0, a[:-1])
    d.begin(1, b[:-1])
    assert d.propose(0, a, 2).tokens == [3, 1]
    assert d.propose(1, b, 2).tokens == [8, 7]
    assert d.propose(1, [7, 8, 1, 2], 2).tokens == []   # seq 1 never saw (1, 2)
    d.accepted(0, 2, [3, 1, 2])
    d.end(0)
    assert 0 not in d._seqs and 1 in d._seqs
    assert d.propose(0, [5, 1, 2], 2).tokens == []      # a fresh seq 0
    # end() merged seq 0's context into dynamic_out; save it in llama.cpp's format
    p = tmp_path / "dyn.bin"
    d.save_dynamic(p)
    dyn = load_ngram_cache(p)
    assert dyn[(1, 2, N, N)] == {3: 3}                  # 1 2 3 (x3, the last one accepted)
    merged = {}
    merge_ngram_caches(merged, _ctx(a + [3, 1, 2]))   # the whole sequence, accepted tokens included
    assert dyn == merged
    d.close()
