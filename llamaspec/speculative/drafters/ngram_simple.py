"""`ngram-simple`: llama.cpp's simplest n-gram drafter, in Python.

It drafts by copying: it looks the last `size_n` tokens of the sequence up in what came before and
proposes what followed them. No model, microseconds per call; it shines when the output repeats
the prompt (code edits, quoting, summaries with names). ngram_mod.py has llama.cpp's hashed
variant.

`ngram_simple_draft` follows llama.cpp's `common_ngram_simple_draft` (common/ngram-map.cpp at
0c1e570) line by line: a from-scratch backwards scan, O(history) per call. `NgramSimpleDrafter`
indexes incrementally, so a step costs O(new tokens); tests check both give the same drafts.

Conventions: `history` is every token of the sequence so far, the last one being the token whose
successors we want. llama.cpp splits it into `tokens` (= history[:-1], what is in the KV cache)
and `sampled`/`id_last` (= history[-1]).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from llamaspec.speculative.drafters.base import Draft, Drafter

__all__ = ["ngram_simple_draft", "NgramSimpleDrafter"]


def ngram_simple_draft(tokens: Sequence[int], sampled: int, size_n: int = 12,
                       size_m: int = 48) -> list[int]:
    """llama.cpp's `common_ngram_simple_draft`: match the last `size_n` tokens backwards, copy what followed.

    tokens:  the sequence without its last token (what the target has already evaluated).
    sampled: the last token of the sequence (just sampled, not yet evaluated).
    The pattern is the last `size_n` tokens of tokens + [sampled]. The latest earlier occurrence of
    the pattern in `tokens` (start position j >= 1, scanning backwards from len(tokens)-size_n-1)
    gives the draft: the up-to-`size_m` tokens that followed it inside `tokens`. No draft when the
    sequence is too short (len(tokens) <= size_n + size_m + 1), when there is no match, or when
    fewer than `size_n` tokens follow the match.

    Worked example (size_n=2, size_m=3): the pattern is [1, 2] (tokens[-1] and sampled); its latest
    earlier occurrence starts at j=1, and 3 tokens follow it::

        >>> ngram_simple_draft([7, 1, 2, 3, 4, 5, 8, 1], 2, size_n=2, size_m=3)
        [3, 4, 5]
        >>> ngram_simple_draft([7, 1, 2, 3, 4, 5, 8, 1], 9, size_n=2, size_m=3)   # [1, 9] never seen
        []
    """
    cur_len = len(tokens)
    n = size_n
    m = size_m
    if cur_len <= n + m + 1:
        return []
    pattern = list(tokens[cur_len - n + 1:cur_len]) + [sampled]
    match_pos = 0  # position 0 is ignored: 0 means "no match"
    for j in range(cur_len - n - 1, 0, -1):
        if list(tokens[j:j + n]) == pattern:
            match_pos = j
            break
    if match_pos == 0:
        return []
    copy_max = min(m, cur_len - (match_pos + n))
    if copy_max < n:
        return []
    return [int(t) for t in tokens[match_pos + n:match_pos + n + copy_max]]


@dataclass
class _SimpleSeq:
    index: dict = field(default_factory=dict)  # n-gram (tuple) -> latest start position j >= 1
    next_j: int = 1                            # next start position to index
    seen_len: int = 0                          # history[:seen_len] has been read by the index
    seen_tok: int = 0                          # history[seen_len - 1], to notice a rewritten history


class NgramSimpleDrafter(Drafter):
    """llama.cpp's `ngram-simple` (defaults size_n=12, size_m=48), indexed incrementally.

    Keeps, per sequence, a dict from each n-gram of the history to its latest start position, so a
    step costs O(new tokens). Gives exactly `ngram_simple_draft(history[:-1], history[-1], ...)`,
    cut to the `n_max` asked for (llama.cpp truncates drafts to the caller's n_max the same way).
    A history that is not an extension of the one seen before (checked cheaply) is re-indexed.
    """

    name = "ngram-simple"
    copies = True

    def __init__(self, size_n: int = 12, size_m: int = 48):
        if size_n < 1 or size_m < 1:
            raise ValueError("ngram-simple needs size_n >= 1 and size_m >= 1")
        self.size_n = size_n
        self.size_m = size_m
        self._seqs: dict[int, _SimpleSeq] = {}

    def begin(self, seq_id: int, prompt_tokens: Sequence[int],
              rng: np.random.Generator | None = None) -> None:
        s = self._seqs[seq_id] = _SimpleSeq()
        # index the prompt now (the first propose() sees prompt + 1 token: same windows)
        self._index(s, prompt_tokens, len(prompt_tokens))

    def end(self, seq_id: int) -> None:
        self._seqs.pop(seq_id, None)

    def close(self) -> None:
        self._seqs.clear()

    def _index(self, s: _SimpleSeq, history: Sequence[int], cur_len: int) -> None:
        """Index the start positions j in [s.next_j, cur_len - n - 1]: the ones llama.cpp's
        backwards scan looks at when `tokens` has cur_len tokens."""
        n = self.size_n
        upto = cur_len - n - 1
        if s.next_j <= upto:
            index = s.index
            h = history
            for j in range(s.next_j, upto + 1):
                index[tuple(h[j:j + n])] = j
            s.next_j = upto + 1
            s.seen_len = upto + n
            s.seen_tok = history[upto + n - 1]

    def propose(self, seq_id: int, history: Sequence[int], n_max: int) -> Draft:
        n = self.size_n
        cur_len = len(history) - 1
        if n_max <= 0 or cur_len <= n + self.size_m + 1:
            return Draft([], None, self.name)
        s = self._seqs.get(seq_id)
        if s is None or (s.seen_len and (len(history) < s.seen_len
                                         or history[s.seen_len - 1] != s.seen_tok)):
            s = self._seqs[seq_id] = _SimpleSeq()
        self._index(s, history, cur_len)
        j = s.index.get(tuple(history[-n:]))
        if j is None:
            return Draft([], None, self.name)
        copy_max = min(self.size_m, cur_len - (j + n))
        if copy_max < n:
            return Draft([], None, self.name)
        start = j + n
        return Draft([int(t) for t in history[start:start + min(copy_max, n_max)]], None, self.name)
