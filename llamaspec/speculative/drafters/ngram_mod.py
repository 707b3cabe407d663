"""`ngram-mod`: llama.cpp's hashed n-gram pool drafter, in Python.

Like ngram-simple (ngram_simple.py) it drafts by copying what followed the last tokens earlier in
the text, but from a fixed pool of slots (slot = hash(n-gram) % size) shared by all sequences, and
it drafts by rolling the pool one token at a time.

`NgramModPool`, `ngram_mod_hash` and `ngram_mod_draft` follow llama.cpp's common/ngram-mod.cpp
and common/speculative.cpp (`draft_one`) at 0c1e570 line by line. `NgramModDrafter` indexes
incrementally, so a step costs O(new tokens).

Conventions: `history` is every token of the sequence so far, the last one being the token whose
successors we want. llama.cpp splits it into `tokens` (= history[:-1], what is in the KV cache)
and `sampled`/`id_last` (= history[-1]).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from llamaspec.speculative.drafters.base import Draft, Drafter

__all__ = [
    "LCG_MULTIPLIER",
    "NGRAM_MOD_POOL_SIZE",
    "EMPTY",
    "ngram_mod_hash",
    "ngram_mod_draft",
    "NgramModPool",
    "NgramModDrafter",
]

#: multiplier of ngram-mod's LCG-style n-gram hash (common_ngram_mod::idx)
LCG_MULTIPLIER = 6364136223846793005
#: number of slots of ngram-mod's pool (4M int32 slots = 16 MiB), as in llama.cpp
NGRAM_MOD_POOL_SIZE = 4 * 1024 * 1024
#: value of an empty pool slot (common_ngram_mod::EMPTY)
EMPTY = -1

_MASK64 = (1 << 64) - 1
_MUL_U64 = np.uint64(LCG_MULTIPLIER)


def ngram_mod_hash(tokens: Sequence[int], start: int = 0, n: int = 24) -> int:
    """64-bit hash of tokens[start:start+n], as `common_ngram_mod::idx` computes it before `% size`.

    res = 0; for each token t: res = res * 6364136223846793005 + t   (mod 2**64, size_t arithmetic;
    a negative int32 token converts to size_t by wrapping, as in C). The pool slot is res % size.

    Worked example (n=2): (0 * M + 1) * M + 2 = M + 2, and with a 4M-slot pool the slot is
    (M + 2) % 4194304::

        >>> ngram_mod_hash([1, 2], n=2)
        6364136223846793007
        >>> ngram_mod_hash([1, 2, 3], n=3) == ((LCG_MULTIPLIER + 2) * LCG_MULTIPLIER + 3) % 2**64
        True
        >>> ngram_mod_hash([1, 2], n=2) % NGRAM_MOD_POOL_SIZE
        1408815
    """
    res = 0
    for i in range(start, start + n):
        res = (res * LCG_MULTIPLIER + tokens[i]) & _MASK64
    return res


class NgramModPool:
    """`common_ngram_mod`: a fixed pool of slots, slot = hash(n-gram) % size, holding the next token.

    Collisions overwrite: the pool remembers the latest token seen after any n-gram hashing to a
    slot. `used` counts non-empty slots. The entries are a numpy int32 array (16 MiB at the default
    size); `add_range` hashes many n-grams at once with numpy's wrapping uint64 arithmetic.
    """

    def __init__(self, n: int = 24, size: int = NGRAM_MOD_POOL_SIZE):
        if n < 1 or size < 1:
            raise ValueError("ngram-mod needs n >= 1 and size >= 1")
        self.n = n
        self.size = size
        self.entries = np.full(size, EMPTY, dtype=np.int32)
        self._mv = memoryview(self.entries)  # fast scalar reads from Python
        self.used = 0
        self.pow_n1 = pow(LCG_MULTIPLIER, n - 1, 1 << 64)  # M**(n-1) mod 2**64, to roll the hash

    @property
    def occupancy(self) -> float:
        """Fraction of used slots."""
        return self.used / self.size

    def idx(self, tokens: Sequence[int], start: int = 0) -> int:
        """Slot of the n-gram tokens[start:start+n]."""
        return ngram_mod_hash(tokens, start, self.n) % self.size

    def get(self, tokens: Sequence[int], start: int = 0) -> int:
        """Token stored for the n-gram tokens[start:start+n], EMPTY (-1) if none."""
        return self._mv[self.idx(tokens, start)]

    def add(self, tokens: Sequence[int], start: int = 0) -> None:
        """Store tokens[start+n] as the successor of the n-gram tokens[start:start+n]."""
        i = self.idx(tokens, start)
        if self._mv[i] == EMPTY:
            self.used += 1
        self._mv[i] = int(tokens[start + self.n])

    def add_range(self, tokens: Sequence[int], start: int, stop: int) -> None:
        """`add(tokens, i)` for i in range(start, stop), in that order (needs len(tokens) >= stop + n)."""
        n = self.n
        count = stop - start
        if count <= 0:
            return
        if count <= 128:  # few n-grams (the per-step case): roll the hash in Python
            if len(tokens) < stop + n:
                raise ValueError("add_range: tokens too short for the n-grams asked for")
            win = [int(t) for t in tokens[start:stop + n]]
            mv, size, p, used = self._mv, self.size, self.pow_n1, 0
            h = 0
            for t in win[:n]:
                h = (h * LCG_MULTIPLIER + t) & _MASK64
            for i in range(count):
                if i:
                    h = ((h - win[i - 1] * p) * LCG_MULTIPLIER + win[i + n - 1]) & _MASK64
                slot = h % size
                if mv[slot] == EMPTY:
                    used += 1
                mv[slot] = win[i + n]
            self.used += used
            return
        arr = np.asarray(tokens[start:stop + n], dtype=np.int64)
        if arr.shape[0] < count + n:
            raise ValueError("add_range: tokens too short for the n-grams asked for")
        u = arr.astype(np.uint64)  # wraps negative ids the way C's int32 -> size_t does
        h = np.zeros(count, dtype=np.uint64)
        for j in range(n):
            h *= _MUL_U64
            h += u[j:j + count]
        slots = (h % np.uint64(self.size)).astype(np.int64)
        values = arr[n:n + count].astype(np.int32)
        if count > 1:
            # sequential adds: the last write to a slot wins
            uniq, first_in_rev = np.unique(slots[::-1], return_index=True)
            values = values[::-1][first_in_rev]
            slots = uniq
        self.used += int(np.count_nonzero(self.entries[slots] == EMPTY))
        self.entries[slots] = values

    def reset(self) -> None:
        self.entries.fill(EMPTY)
        self.used = 0


def ngram_mod_draft(pool: NgramModPool, history: Sequence[int], n_max: int = 64, n_min: int = 48,
                    limit: int | None = None) -> list[int]:
    """Draft by rolling the pool: look up the last n tokens, append the stored token, repeat.

    Stops at an empty slot or after `n_max` tokens; a draft that stops before `n_min` tokens is
    dropped (empty result), as in llama.cpp's `draft_one`. `limit` (the caller's n_max) cuts the
    result afterwards, exactly like llama.cpp truncating to `dp.n_max`: lookups go on only as far
    as needed to apply the `n_min` rule (max(limit, n_min) tokens). Needs len(history) > n.
    The hash is rolled in O(1) per drafted token (it is a polynomial in M mod 2**64).

    Worked example (n=2, a 64-slot pool): after indexing [5, 6, 7, 5, 6] the pool knows
    (5,6)->7, (6,7)->5, (7,5)->6, so from [.., 5, 6] it cycles 7, 5, 6, 7, ...::

        >>> pool = NgramModPool(n=2, size=64)
        >>> pool.add_range([5, 6, 7, 5, 6], 0, 3)
        >>> pool.used
        3
        >>> ngram_mod_draft(pool, [5, 6, 7, 5, 6], n_max=5, n_min=0)
        [7, 5, 6, 7, 5]
        >>> ngram_mod_draft(pool, [5, 6, 7, 5, 6], n_max=5, n_min=0, limit=2)
        [7, 5]
        >>> ngram_mod_draft(pool, [1, 2, 3], n_max=5, n_min=0)   # (2, 3) unknown
        []
    """
    n = pool.n
    if len(history) - 1 < n:
        return []
    stop = n_max if limit is None else min(n_max, max(limit, n_min))
    win = [int(t) for t in history[-n:]]
    h = 0
    for t in win:
        h = (h * LCG_MULTIPLIER + t) & _MASK64
    mv = pool._mv
    size = pool.size
    p = pool.pow_n1
    out: list[int] = []
    for i in range(stop):
        tok = mv[h % size]
        if tok == EMPTY:
            if i < n_min:
                return []
            break
        out.append(tok)
        h = ((h - win[i] * p) * LCG_MULTIPLIER + tok) & _MASK64
        win.append(tok)
    if limit is not None and len(out) > limit:
        del out[limit:]
    return out


@dataclass
class _ModSeq:
    i_last: int = 0        # n-grams starting before i_last are in the pool
    n_draft_last: int = 0  # length of the last draft proposed (0: none)
    n_low: int = 0         # consecutive verify steps with acceptance fraction < low_acceptance


class NgramModDrafter(Drafter):
    """llama.cpp's `ngram-mod` (defaults n_match=24, n_min=48, n_max=64, 4M-slot pool).

    - One pool shared by all sequences.
    - begin(): index the prompt's n-grams, then reset the pool if it is more than
      `reset_occupancy` (25%) full (llama.cpp checks after adding the prompt, and so does this).
    - propose(): index new n-grams in chunks, once more than `index_chunk` (32) tokens are pending,
      then roll the pool from the last n_match tokens (`ngram_mod_draft`). Drafts shorter than
      n_min are dropped; the result is cut to the `n_max` passed to propose.
    - accepted(): after `low_rounds` (5) consecutive own drafts with accepted/drafted <
      `low_acceptance` (0.25), reset the pool (and re-index this sequence from its start).

    One deliberate difference: the acceptance fraction divides by the length of the draft actually
    returned (after the caller's cap); llama.cpp divides by the uncut length, which is the same
    when the caller does not cap (llama-server caps only at the context end).
    """

    name = "ngram-mod"
    copies = True

    def __init__(self, n_match: int = 24, n_min: int = 48, n_max: int = 64,
                 pool_size: int = NGRAM_MOD_POOL_SIZE, index_chunk: int = 32,
                 reset_occupancy: float = 0.25, low_acceptance: float = 0.25, low_rounds: int = 5):
        self.n_match = n_match
        self.n_min = n_min
        self.n_max = n_max
        self.index_chunk = index_chunk
        self.reset_occupancy = reset_occupancy
        self.low_acceptance = low_acceptance
        self.low_rounds = low_rounds
        self.pool = NgramModPool(n_match, pool_size)
        self.n_resets = 0
        self._seqs: dict[int, _ModSeq] = {}

    def begin(self, seq_id: int, prompt_tokens: Sequence[int],
              rng: np.random.Generator | None = None) -> None:
        s = self._seqs.setdefault(seq_id, _ModSeq())
        s.i_last = 0
        s.n_draft_last = 0  # (llama.cpp keeps n_low across requests of a slot; so does this)
        n = self.pool.n
        if len(prompt_tokens) < n:
            return
        self.pool.add_range(prompt_tokens, 0, len(prompt_tokens) - n)
        s.i_last = len(prompt_tokens) - n
        if self.pool.occupancy > self.reset_occupancy:
            self.pool.reset()
            self.n_resets += 1

    def end(self, seq_id: int) -> None:
        self._seqs.pop(seq_id, None)

    def close(self) -> None:
        self._seqs.clear()

    def propose(self, seq_id: int, history: Sequence[int], n_max: int) -> Draft:
        s = self._seqs.get(seq_id)
        if s is None:
            s = self._seqs[seq_id] = _ModSeq()
        s.n_draft_last = 0
        n = self.pool.n
        cur_len = len(history) - 1  # llama.cpp's prompt = history without id_last
        if n_max <= 0 or cur_len < n:
            return Draft([], None, self.name)
        if s.i_last + self.index_chunk < cur_len:
            self.pool.add_range(history, s.i_last, cur_len - n)
            s.i_last = cur_len - n
        tokens = ngram_mod_draft(self.pool, history, self.n_max, self.n_min, limit=n_max)
        s.n_draft_last = len(tokens)
        return Draft(tokens, None, self.name)

    def accepted(self, seq_id: int, n_accepted: int, new_tokens: Sequence[int],
                 is_other: bool = False) -> None:
        s = self._seqs.get(seq_id)
        if s is None or s.n_draft_last <= 0:
            return
        n_draft = s.n_draft_last
        s.n_draft_last = 0  # each proposal is judged once
        if is_other:
            return
        f_acc = n_accepted / n_draft
        if f_acc < self.low_acceptance:
            s.n_low += 1
            if s.n_low >= self.low_rounds:
                self.pool.reset()
                self.n_resets += 1
                s.n_low = 0
                s.i_last = 0
        else:
            s.n_low = 0
