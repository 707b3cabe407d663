"""`ngram-map-k` and `ngram-map-k4v`: llama.cpp's keyed n-gram map drafters, in Python.

Both look the last `size_n` tokens (the *key*) up in the history and draft the `size_m` tokens
(the *value*, an m-gram) that followed an earlier occurrence. `ngram-map-k` drafts whenever the key
is found; `ngram-map-k4v` also counts up to 4 distinct values seen after each key and drafts only
when the most frequent one outweighs the others 2:1, after the key was looked up `min_hits` times.
Each (key, value) remembers how many tokens of its last draft were accepted and caps its next
draft to that (so a value whose draft was wholly rejected never drafts again, as in llama.cpp).

`NgramMap`, `ngram_map_begin`, `ngram_map_draft` and `ngram_map_accept` follow llama.cpp's
common/ngram-map.cpp (llama-cpp-python 0.3.36's vendored copy) line by line, quirks included:
- the hash index (key_map) keeps the FIRST position stored for a hash slot: prompt positions
  (latest first) before generated ones, hash collisions included; positions between
  begin_len-n-m-1 and begin_len are never indexed nor searched;
- k4v's statistics rescan from the previous match position, so that occurrence counts again;
- k4v drafts the tokens after the matched occurrence (match_pos), not those of the winning value
  slot (the slot only gates the draft and receives the acceptance);
- ngram-map-k ignores min_hits (llama.cpp checks it after the key-only return).

Conventions: `history` is every token of the sequence so far; llama.cpp's `inp` is history[:-1]
(what is in the KV cache) and `sampled` is history[-1].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from llamaspec.speculative.drafters.base import Draft, Drafter

__all__ = [
    "LCG_FACTOR", "MAX_VALUES", "HASH_MAP_SIZE", "MAX_VALUE_COUNT",
    "ngram_map_hash", "NgramMap", "ngram_map_begin", "ngram_map_draft", "ngram_map_accept",
    "NgramMapKDrafter", "NgramMapK4vDrafter",
]

LCG_FACTOR = 2654435761        # 32-bit LCG multiplier of the n-gram hash (~ (sqrt(5)-1)/2 * 2**32)
MAX_VALUES = 4                 # COMMON_NGRAM_MAX_VALUES: value m-grams tracked per key
HASH_MAP_SIZE = 262144         # COMMON_NGRAM_HASH_MAP_SIZE: slots of the hash -> position index
MAX_VALUE_COUNT = 16380        # COMMON_NGRAM_MAX_VALUE_COUNT: counters saturate here (uint16)
_MASK32 = 0xFFFFFFFF


def ngram_map_hash(tokens: Sequence[int], start: int, n: int) -> int:
    """`common_ngram_map_hash`: h = h * 2654435761 + t over tokens[start:start+n], mod 2**32.

    >>> ngram_map_hash([1, 2], 0, 2) == (LCG_FACTOR + 2) % 2**32
    True
    >>> ngram_map_hash([1, 2], 0, 2) % HASH_MAP_SIZE
    227763
    """
    h = 0
    for i in range(start, start + n):
        h = (h * LCG_FACTOR + int(tokens[i])) & _MASK32  # int32 -> uint32 wraps like C
    return h


@dataclass
class _Value:
    value_idx: int = 0     # start of this m-gram in the history (0: slot unused)
    value_num: int = 0     # times seen after the key
    n_accepted: int = -1   # tokens accepted at its last draft: caps the next one


@dataclass
class _Key:
    key_idx: int           # a position of the key n-gram in the history
    stat_idx: int = 0      # statistics are counted up to here
    key_num: int = 0       # lookups that found this key ("hits")
    values: list = field(default_factory=list)


@dataclass
class NgramMap:
    """`common_ngram_map`: the state of one sequence (llama.cpp keeps one per sequence)."""

    size_n: int
    size_m: int
    key_only: bool                 # True: ngram-map-k, False: ngram-map-k4v
    min_hits: int = 1
    keys: list = field(default_factory=list)       # _Key, in creation order (searched linearly)
    key_map: dict = field(default_factory=dict)    # hash slot -> position; absent = llama.cpp's 0
    key_map_last_idx: int = 0
    size_last_begin: int = 0
    idx_last_check: int = 0
    last_key: _Key | None = None   # key and value slot of the last draft (None: no draft)
    last_value: int = 0


def ngram_map_begin(mp: NgramMap, tokens: Sequence[int]) -> None:
    """`common_ngram_map_begin`: a (new) prompt. If the history got shorter than what was already
    seen (e.g. a reasoning block was dropped), forget positions from the cut on."""
    n, m = mp.size_n, mp.size_m
    size_begin = len(tokens)
    cleanup = mp.size_last_begin
    if cleanup > size_begin:
        cleanup = size_begin - n - m if size_begin > n + m else 0
    if size_begin < mp.idx_last_check:
        mp.key_map = {s: j for s, j in mp.key_map.items() if j < cleanup}
        mp.key_map_last_idx = cleanup - 1 if cleanup > 0 else 0
        for i in range(len(mp.keys) - 1, -1, -1):
            key = mp.keys[i]
            if key.key_idx >= cleanup:
                del mp.keys[i]
                continue
            if mp.key_only:
                continue
            vals = key.values
            for j in range(MAX_VALUES - 1, -1, -1):
                if vals[j].value_idx != 0 and vals[j].value_idx >= cleanup:
                    # shift left; the freed last slot keeps the old last slot's n_accepted (as in C)
                    last_acc = vals[-1].n_accepted
                    del vals[j]
                    vals.append(_Value(0, 0, last_acc))
            if vals[0].value_idx == 0:
                del mp.keys[i]
    mp.idx_last_check = size_begin
    mp.size_last_begin = size_begin


def _rfind(h: list, key: list, hi: int, lo: int) -> int:
    """Largest j in (lo, hi] with h[j:j+len(key)] == key, else 0 (llama.cpp's "no match")."""
    n = len(key)
    for j in range(hi, lo, -1):
        if h[j:j + n] == key:
            return j
    return 0


def _index(mp: NgramMap, h: list, hi: int, lo: int) -> None:
    """Store j in (lo, hi], descending, in empty hash slots only (first stored wins)."""
    km, n = mp.key_map, mp.size_n
    for j in range(hi, lo, -1):
        km.setdefault(ngram_map_hash(h, j, n) % HASH_MAP_SIZE, j)


def ngram_map_draft(mp: NgramMap, history: Sequence[int]) -> list[int]:
    """`common_ngram_map_draft(map, inp=history[:-1], sampled=history[-1])`: the draft (maybe empty).

    Needs len(inp) >= 2n+m; earlier occurrences of the key are looked for at positions
    1..len(inp)-n-m-1 (so a full m-gram and more follow them). Updates the map's state.

    Worked example, ngram-map-k with n=2, m=2. The prompt [9, 1, 2, 3, 4, 8, 8, 1] then 2 is
    sampled: the key [1, 2] occurred at position 1, followed by [3, 4]::

        >>> mp = NgramMap(size_n=2, size_m=2, key_only=True)
        >>> ngram_map_begin(mp, [9, 1, 2, 3, 4, 8, 8, 1])
        >>> ngram_map_draft(mp, [9, 1, 2, 3, 4, 8, 8, 1, 2])
        [3, 4]

    The target accepts 1 token: this key's next draft is capped at 1. The index keeps position 1
    for [1, 2] (first stored wins), though [1, 2] also occurs at 7::

        >>> ngram_map_accept(mp, 1)
        >>> ngram_map_draft(mp, [9, 1, 2, 3, 4, 8, 8, 1, 2, 3, 9, 1, 2])
        [3]

    ngram-map-k4v, n=1, m=1: after key [5] came 1, 1, then 2. Value [1] (2 times) vs [2] (once):
    2 >= 2*1, so it drafts, taking the tokens after the latest match (position 5) — [2], llama.cpp's
    behaviour; with a third value the 2:1 rule fails and nothing is drafted::

        >>> mp = NgramMap(size_n=1, size_m=1, key_only=False)
        >>> ngram_map_begin(mp, [0, 5, 1, 5, 1, 5, 2, 9])
        >>> ngram_map_draft(mp, [0, 5, 1, 5, 1, 5, 2, 9, 5])
        [2]
        >>> mp = NgramMap(size_n=1, size_m=1, key_only=False)
        >>> ngram_map_begin(mp, [0, 5, 1, 5, 1, 5, 3, 5, 2, 9])
        >>> ngram_map_draft(mp, [0, 5, 1, 5, 1, 5, 3, 5, 2, 9, 5])
        []
    """
    mp.last_key, mp.last_value = None, 0
    h = history if isinstance(history, list) else [int(t) for t in history]
    cur_len = len(h) - 1
    n, m = mp.size_n, mp.size_m
    if cur_len < 2 * n + m:
        return []
    if mp.idx_last_check > cur_len or mp.size_last_begin > cur_len:
        raise ValueError("ngram_map_draft: history shorter than already seen; call ngram_map_begin")
    mp.idx_last_check = cur_len
    key = h[cur_len - n + 1:cur_len + 1]
    hi = cur_len - n - m - 1           # latest start whose m-gram (and one more token) is known
    lo = mp.key_map_last_idx
    begin = mp.size_last_begin
    prompt_hi = begin - n - m - 1 if begin > n + m + 1 else None

    # 1. the hash index (verified: slots collide); 2. unindexed prompt; 3. unindexed new tokens
    match_pos = 0
    idx_key = mp.key_map.get(ngram_map_hash(key, 0, n) % HASH_MAP_SIZE, 0)
    if idx_key != 0 and idx_key < hi and h[idx_key:idx_key + n] == key:
        match_pos = idx_key
    if match_pos == 0 and prompt_hi is not None:
        match_pos = _rfind(h, key, prompt_hi, lo)
    if match_pos == 0:
        match_pos = _rfind(h, key, hi, max(begin, lo))

    # index what was just searched, in the same order
    if prompt_hi is not None:
        _index(mp, h, prompt_hi, lo)
    _index(mp, h, hi, max(begin, lo))
    mp.key_map_last_idx = max(hi, lo)

    if match_pos == 0:
        return []
    ck = next((k for k in mp.keys if h[k.key_idx:k.key_idx + n] == key), None)
    if ck is None:
        ck = _Key(match_pos, values=[_Value(0, 0, m) for _ in range(MAX_VALUES)])
        mp.keys.append(ck)
    ck.key_num = min(ck.key_num + 1, MAX_VALUE_COUNT)

    if mp.key_only:  # (min_hits is not consulted here, as in llama.cpp)
        mp.last_key, mp.last_value = ck, 0
        return h[match_pos + n:match_pos + n + min(m, ck.values[0].n_accepted)]

    if ck.key_num < mp.min_hits:
        return []
    # count the values after each occurrence of the key in [stat_idx, match_pos]
    vals = ck.values
    for i in range(ck.stat_idx, match_pos + 1):
        if h[i:i + n] != key:
            continue
        vb = i + n
        for v in vals:
            if v.value_idx == 0:       # a new value: take the free slot
                v.value_idx, v.value_num, v.n_accepted = vb, 0, m
            elif h[vb:vb + m] != h[v.value_idx:v.value_idx + m]:
                continue
            v.value_num = min(v.value_num + 1, MAX_VALUE_COUNT)
            break                      # (a 5th distinct value is not counted)
    ck.stat_idx = match_pos

    slot_max, max_occur = 0, 0
    for s, v in enumerate(vals):
        if v.value_num > max_occur:
            slot_max, max_occur = s, v.value_num
    sum_occur = sum(v.value_num for s, v in enumerate(vals) if s != slot_max)
    if sum_occur > 0 and max_occur < 2 * sum_occur:
        return []                      # no value dominates: not worth a draft
    mp.last_key, mp.last_value = ck, slot_max
    return h[match_pos + n:match_pos + n + min(m, vals[slot_max].n_accepted)]


def ngram_map_accept(mp: NgramMap, n_accepted: int) -> None:
    """`common_ngram_map_accept`: the value of the last draft remembers how much was accepted."""
    if mp.last_key is not None:
        mp.last_key.values[mp.last_value].n_accepted = n_accepted


class _NgramMapDrafter(Drafter):
    """One `NgramMap` per sequence, driven like llama.cpp's common_speculative_impl_ngram_map_k."""

    copies = True

    key_only = True

    def __init__(self, size_n: int = 12, size_m: int = 48, min_hits: int = 1):
        if size_n < 1 or size_m < 1 or min_hits < 1:
            raise ValueError(f"{self.name} needs size_n, size_m, min_hits >= 1")
        self.size_n, self.size_m, self.min_hits = size_n, size_m, min_hits
        self._maps: dict[int, NgramMap] = {}

    def _new(self) -> NgramMap:
        return NgramMap(self.size_n, self.size_m, self.key_only, self.min_hits)

    def begin(self, seq_id: int, prompt_tokens: Sequence[int],
              rng: np.random.Generator | None = None) -> None:
        # llama.cpp keeps a sequence's map across begin() calls (same slot, growing chat);
        # end() drops it here
        ngram_map_begin(self._maps.setdefault(seq_id, self._new()), prompt_tokens)

    def end(self, seq_id: int) -> None:
        self._maps.pop(seq_id, None)

    def close(self) -> None:
        self._maps.clear()

    def propose(self, seq_id: int, history: Sequence[int], n_max: int) -> Draft:
        if n_max <= 0:  # llama.cpp does not call the drafter then: no state change
            return Draft([], None, self.name)
        mp = self._maps.get(seq_id)
        if mp is None:
            mp = self._maps[seq_id] = self._new()
        cur_len = len(history) - 1
        if cur_len < mp.idx_last_check or cur_len < mp.size_last_begin:
            # rewritten history: what llama-server does on a new, shorter request
            ngram_map_begin(mp, list(history[:-1]))
        tokens = ngram_map_draft(mp, history)
        return Draft([int(t) for t in tokens[:n_max]], None, self.name)

    def accepted(self, seq_id: int, n_accepted: int, new_tokens: Sequence[int],
                 is_other: bool = False) -> None:
        mp = self._maps.get(seq_id)
        if mp is not None and not is_other:  # only the author of the draft learns
            ngram_map_accept(mp, n_accepted)


class NgramMapKDrafter(_NgramMapDrafter):
    """llama.cpp's `ngram-map-k` (defaults size_n=12, size_m=48, min_hits=1; min_hits unused)."""

    name = "ngram-map-k"
    key_only = True


class NgramMapK4vDrafter(_NgramMapDrafter):
    """llama.cpp's `ngram-map-k4v` (defaults size_n=12, size_m=48, min_hits=1)."""

    name = "ngram-map-k4v"
    key_only = False
