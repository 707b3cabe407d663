"""`ngram-cache`: llama.cpp's lookup-decoding drafter (3-level n-gram cache), in Python.

Three caches map an n-gram to the counts of the tokens that followed it:
- context: built from this sequence's own tokens (n-grams of sizes 1..4, `NGRAM_MIN..NGRAM_MAX`);
- dynamic: loaded from `--lookup-cache-dynamic` (earlier generations), checked with strict thresholds;
- static:  loaded from `--lookup-cache-static` (a big corpus, 2-grams, `NGRAM_STATIC`); it re-weights
  the candidates of the two others (x100 when it has seen the token) and drafts as a last resort.
A draft is built one token at a time (largest n-gram first) until no cache is confident enough.

`ngram_cache_update`, `ngram_cache_draft`, `load_ngram_cache`, `save_ngram_cache` and
`merge_ngram_caches` follow common/ngram-cache.cpp (llama-cpp-python 0.3.36's vendored copy); the
drafter follows common/speculative.cpp's common_speculative_impl_ngram_cache. A cache is a dict
{4-tuple of token ids, padded with NULL_TOKEN (-1): {token: count}}, exactly what the file holds.

Deviations (documented, deliberate):
- ties between candidates go to the token first added to the cache (insertion order); llama.cpp's
  follow the iteration order of std::unordered_map (implementation-defined);
- n-gram positions before the first token read as NULL_TOKEN (llama.cpp reads out of bounds there
  when the history is shorter than 4 tokens);
- the draft length is min(n_max, n_draft) (llama.cpp: always n_draft = 8, hard-coded).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Sequence

import numpy as np

from llamaspec.speculative.drafters.base import Draft, Drafter

__all__ = [
    "NGRAM_MIN", "NGRAM_MAX", "NGRAM_STATIC", "NULL_TOKEN",
    "MIN_SAMPLE_SIZE_LAX", "MIN_PERCENT_LAX", "MIN_SAMPLE_SIZE_STRICT", "MIN_PERCENT_STRICT",
    "ngram_cache_update", "ngram_cache_draft", "merge_ngram_caches", "load_ngram_cache",
    "save_ngram_cache", "NgramCacheDrafter",
]

NGRAM_MIN, NGRAM_MAX, NGRAM_STATIC = 1, 4, 2     # LLAMA_NGRAM_MIN / _MAX / _STATIC
NULL_TOKEN = -1                                  # LLAMA_TOKEN_NULL
# If sample size or percentage are below these thresholds (index: n-gram size - 1) the draft stops:
MIN_SAMPLE_SIZE_LAX = (2, 2, 1, 1)
MIN_PERCENT_LAX = (66, 50, 50, 50)
MIN_SAMPLE_SIZE_STRICT = (4, 3, 2, 2)
MIN_PERCENT_STRICT = (75, 66, 66, 66)

_KEY = struct.Struct("<4i")    # common_ngram: llama_token tokens[LLAMA_NGRAM_MAX]
_I32 = struct.Struct("<i")     # ntokens
_PAIR = struct.Struct("<2i")   # token, count

Cache = dict  # {tuple[int, int, int, int]: {int: int}}


def _key(tokens: Sequence[int], start: int, size: int) -> tuple:
    """common_ngram(&tokens[start], size): size tokens, padded to NGRAM_MAX with NULL_TOKEN."""
    return tuple(int(tokens[j]) if 0 <= j < len(tokens) else NULL_TOKEN
                 for j in range(start, start + size)) + (NULL_TOKEN,) * (NGRAM_MAX - size)


def ngram_cache_update(cache: Cache, tokens: Sequence[int], nnew: int,
                       ngram_min: int = NGRAM_MIN, ngram_max: int = NGRAM_MAX) -> None:
    """`common_ngram_cache_update`: count the token after every n-gram (sizes ngram_min..ngram_max)
    that ends among the last `nnew` tokens of `tokens` (only whole n-grams inside `tokens`).

    >>> c = {}
    >>> ngram_cache_update(c, [1, 2, 1, 2], 4, 1, 2)
    >>> c[(1, -1, -1, -1)], c[(2, -1, -1, -1)], c[(1, 2, -1, -1)], c[(2, 1, -1, -1)]
    ({2: 2}, {1: 1}, {1: 1}, {2: 1})
    """
    n = len(tokens)
    for size in range(ngram_min, ngram_max + 1):
        for i in range(max(n - nnew, size), n):
            part = cache.setdefault(_key(tokens, i - size, size), {})
            tok = int(tokens[i])
            part[tok] = part.get(tok, 0) + 1


def _try_static(nc_static: Cache, key: tuple) -> int:
    """try_draft(nc_static, ngram_static): the static cache alone, lax thresholds of a 2-gram."""
    part = nc_static.get(key)
    if not part:
        return NULL_TOKEN
    max_token, max_count, total = NULL_TOKEN, 0, 0
    for tok, cnt in part.items():
        if cnt > max_count:
            max_token, max_count = tok, cnt
        total += cnt
    if total < MIN_SAMPLE_SIZE_LAX[NGRAM_STATIC - 1]:
        return NULL_TOKEN
    if 100 * max_count < MIN_PERCENT_LAX[NGRAM_STATIC - 1] * total:
        return NULL_TOKEN
    return max_token


def _try_primary(nc: Cache, keys: list, part_static: dict, min_size: Sequence[int],
                 min_percent: Sequence[int]) -> int:
    """try_draft(nc_primary, ...): the largest n-gram whose best follower passes the thresholds;
    candidates are ranked by count x (100 x static count, or 1 if the static cache lacks them)."""
    for i in range(len(keys) - 1, -1, -1):
        part = nc.get(keys[i])
        if part is None:
            continue
        max_token, max_primary, max_static, total = NULL_TOKEN, 0, 0, 0
        for tok, cnt in part.items():
            st = 100 * part_static[tok] if tok in part_static else 1
            if cnt * st > max_primary * max_static:
                max_token, max_primary, max_static = tok, cnt, st
            total += cnt
        if total < min_size[i] or 100 * max_primary < min_percent[i] * total:
            continue
        return max_token
    return NULL_TOKEN


def ngram_cache_draft(inp: Sequence[int], n_draft: int, nc_context: Cache, nc_dynamic: Cache,
                      nc_static: Cache, ngram_min: int = NGRAM_MIN,
                      ngram_max: int = NGRAM_MAX) -> list[int]:
    """`common_ngram_cache_draft`: up to `n_draft` tokens to follow `inp` (its last token is the
    one just sampled). Context first (lax thresholds), then dynamic (strict), then static alone.

    Worked example: after [1, 2, 3, 1, 2, 3, 1, 2] the context cache has (2, 3, 1, 2) -> {3: 1}
    (1 sample >= 1, 100% >= 50%: draft 3), then (1, 2, 3) -> {1: 2} (4-gram (3, 1, 2, 3) unseen),
    then (1, 2, 3, 1) -> {2: 2}, ...::

        >>> h = [1, 2, 3, 1, 2, 3, 1, 2]
        >>> ctx = {}
        >>> ngram_cache_update(ctx, h, len(h))
        >>> ngram_cache_draft(h, 5, ctx, {}, {})
        [3, 1, 2, 3, 1]

    After [5, 6, 5, 7, 5] only the 1-gram (5,) -> {6: 1, 7: 1} matches: 2 samples, but 50% < 66%
    (the lax threshold of a 1-gram), so nothing is drafted; a static cache that saw (7, 5) -> 6
    twice (its own lax thresholds: 2 samples, 50%) drafts 6::

        >>> h = [5, 6, 5, 7, 5]
        >>> ctx = {}
        >>> ngram_cache_update(ctx, h, len(h))
        >>> ngram_cache_draft(h, 3, ctx, {}, {})
        []
        >>> ngram_cache_draft(h, 1, ctx, {}, {(7, 5, -1, -1): {6: 2}})
        [6]
    """
    if len(inp) < NGRAM_STATIC:
        return []
    seq = [int(t) for t in inp]
    n_inp = len(seq)
    while len(seq) - n_inp < n_draft:
        n = len(seq)
        key_static = _key(seq, n - NGRAM_STATIC, NGRAM_STATIC)
        part_static = nc_static.get(key_static, {})
        keys = [_key(seq, n - s, s) for s in range(ngram_min, ngram_max + 1)]
        tok = _try_primary(nc_context, keys, part_static, MIN_SAMPLE_SIZE_LAX, MIN_PERCENT_LAX)
        if tok == NULL_TOKEN:
            tok = _try_primary(nc_dynamic, keys, part_static, MIN_SAMPLE_SIZE_STRICT, MIN_PERCENT_STRICT)
        if tok == NULL_TOKEN:
            tok = _try_static(nc_static, key_static)
        if tok == NULL_TOKEN:
            break
        seq.append(tok)
    return seq[n_inp:]


def merge_ngram_caches(target: Cache, add: Cache) -> None:
    """`common_ngram_cache_merge`: add the counts of `add` to `target`."""
    for key, part in add.items():
        tp = target.setdefault(key, {})
        for tok, cnt in part.items():
            tp[tok] = tp.get(tok, 0) + cnt


def save_ngram_cache(cache: Cache, path: str | Path) -> None:
    """`common_ngram_cache_save`: per n-gram, 4 x int32 tokens, int32 ntokens, then ntokens x
    (int32 token, int32 count), little-endian (llama.cpp writes native order: x86/ARM are LE)."""
    out = bytearray()
    for key, part in cache.items():
        if not part or any(c <= 0 for c in part.values()):
            raise ValueError(f"n-gram {key}: empty part or non-positive count")
        out += _KEY.pack(*key) + _I32.pack(len(part))
        for tok, cnt in part.items():
            out += _PAIR.pack(tok, cnt)
    Path(path).write_bytes(bytes(out))


def _check_ids(p: Path, key: tuple, part: dict, n_vocab: int | None, off: int) -> None:
    """Token ids a model can have: drafted ids >= 0 (a negative one made llama_decode fail with a
    misleading "raise --ctx-size"), n-gram slots >= -1 (LLAMA_TOKEN_NULL pads short n-grams), all
    below n_vocab when it is known (a cache made for another vocabulary)."""
    hi = n_vocab if n_vocab is not None else 2 ** 31
    bad = [t for t in part if not 0 <= t < hi] + [t for t in key if not -1 <= t < hi]
    if bad:
        where = f" (the model's vocabulary is 0..{n_vocab - 1})" if n_vocab is not None else ""
        raise ValueError(f"n-gram cache {p}: token id {bad[0]} near byte {off} is not a token{where}; "
                         "the file is corrupt or was made for another model")


def load_ngram_cache(path: str | Path, n_vocab: int | None = None) -> Cache:
    """`common_ngram_cache_load`: read a file written by save_ngram_cache / llama.cpp's
    llama-lookup-create. Raises FileNotFoundError for a missing file, ValueError for a corrupt one
    or one with token ids outside 0..n_vocab-1."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"n-gram cache file not found: {p}")
    data = p.read_bytes()
    cache: Cache = {}
    off, size = 0, len(data)
    while off < size:
        if off + _KEY.size + _I32.size > size:
            raise ValueError(f"corrupt n-gram cache {p}: truncated n-gram header at byte {off}")
        key = _KEY.unpack_from(data, off)
        (ntok,) = _I32.unpack_from(data, off + _KEY.size)
        off += _KEY.size + _I32.size
        if ntok <= 0:
            raise ValueError(f"corrupt n-gram cache {p}: token count {ntok} at byte {off - 4}")
        if off + ntok * _PAIR.size > size:
            raise ValueError(f"corrupt n-gram cache {p}: truncated token counts at byte {off}")
        part: dict = {}
        for tok, cnt in _PAIR.iter_unpack(data[off:off + ntok * _PAIR.size]):
            if cnt <= 0:
                raise ValueError(f"corrupt n-gram cache {p}: count {cnt} for token {tok}")
            part.setdefault(tok, cnt)   # unordered_map::emplace keeps the first
        _check_ids(p, key, part, n_vocab, off)
        off += ntok * _PAIR.size
        cache.setdefault(key, part)
    return cache


class _Seq:
    __slots__ = ("cache_size", "context", "tokens")

    def __init__(self) -> None:
        self.cache_size = 0        # tokens of the history already counted in `context`
        self.context: Cache = {}
        self.tokens: list[int] = []   # the whole sequence, for the dynamic cache at end()


class NgramCacheDrafter(Drafter):
    """llama.cpp's `ngram-cache`: a context cache per sequence, shared static/dynamic caches.

    static_path / dynamic_path: llama.cpp's --lookup-cache-static / --lookup-cache-dynamic files.
    n_draft: llama.cpp's fixed draft length (8); None: n_max alone.
    chunked_update: True (speculative.cpp): each propose counts the n-grams of the tokens added
      since the last one *within that chunk only* (so a 1-token step adds nothing); False
      (examples/lookup): n-grams across chunk boundaries are counted too.
    end(seq_id) merges the sequence's context cache into `dynamic_out` (lookup-stats style);
    save_dynamic() writes it (loaded dynamic + merged contexts) in llama.cpp's format, and close()
    does so to dynamic_path ("updated by generation", as llama.cpp's lookup example does; its
    server loads the file but never writes it). The dynamic cache read while drafting stays the
    loaded one: later sequences of the same run do not see earlier ones (llama.cpp's behaviour).
    """

    name = "ngram-cache"
    copies = True

    def __init__(self, static_path: str | Path | None = None, dynamic_path: str | Path | None = None,
                 n_draft: int | None = 8, chunked_update: bool = True, n_vocab: int | None = None):
        self.static: Cache = load_ngram_cache(static_path, n_vocab) if static_path else {}
        self.dynamic_path = Path(dynamic_path) if dynamic_path else None
        # A dynamic file that does not exist yet is created at close (llama.cpp's lookup example).
        self.dynamic: Cache = (load_ngram_cache(dynamic_path, n_vocab)
                               if self.dynamic_path is not None and self.dynamic_path.exists() else {})
        self.dynamic_out: Cache = {}
        merge_ngram_caches(self.dynamic_out, self.dynamic)
        self.n_draft, self.chunked_update = n_draft, chunked_update
        self._seqs: dict[int, _Seq] = {}

    def begin(self, seq_id: int, prompt_tokens: Sequence[int],
              rng: np.random.Generator | None = None) -> None:
        st = self._seqs.setdefault(seq_id, _Seq())   # llama.cpp: no-op (the prompt is counted at propose)
        st.tokens = [int(t) for t in prompt_tokens]

    def propose(self, seq_id: int, history: Sequence[int], n_max: int) -> Draft:
        if n_max <= 0:
            return Draft([], None, self.name)
        st = self._seqs.setdefault(seq_id, _Seq())
        h = [int(t) for t in history]
        st.tokens = h
        if st.cache_size < len(h):
            if self.chunked_update:
                new = h[st.cache_size:]
                ngram_cache_update(st.context, new, len(new))
            else:
                ngram_cache_update(st.context, h, len(h) - st.cache_size)
            st.cache_size = len(h)
        n = n_max if self.n_draft is None else min(n_max, self.n_draft)
        return Draft(ngram_cache_draft(h, n, st.context, self.dynamic, self.static), None, self.name)

    def accepted(self, seq_id: int, n_accepted: int, new_tokens: Sequence[int],
                 is_other: bool = False) -> None:
        st = self._seqs.get(seq_id)
        if st is not None:
            st.tokens.extend(int(t) for t in new_tokens)

    def end(self, seq_id: int) -> None:
        st = self._seqs.pop(seq_id, None)
        if st is not None:
            # What the dynamic file gets is lookup.cpp's context cache: every n-gram of the whole
            # sequence (the chunked drafting cache misses those spanning 1-token steps).
            whole: Cache = {}
            ngram_cache_update(whole, st.tokens, len(st.tokens))
            merge_ngram_caches(self.dynamic_out, whole)

    def save_dynamic(self, path: str | Path | None = None) -> None:
        """Write dynamic_out to `path` (default: dynamic_path)."""
        target = path if path is not None else self.dynamic_path
        if target is None:
            raise ValueError("save_dynamic: no path (and no dynamic_path given)")
        # Written beside and renamed over: an interrupted save leaves the old file whole.
        target = Path(target)
        tmp = target.with_name(target.name + ".tmp")
        save_ngram_cache(self.dynamic_out, tmp)
        tmp.replace(target)

    def close(self) -> None:
        for seq_id in list(self._seqs):   # sequences not ended (interrupted) count too
            self.end(seq_id)
        if self.dynamic_path is not None:
            self.save_dynamic()
            self.dynamic_path = None      # close twice: save once
