"""Suffix decoding's frequency-scored drafts (SuffixDecoding, arXiv 2411.04975), on token lists.

SuffixDecoding keeps a suffix tree over earlier texts. A node is a string s that occurred, with
count(s) = how often it occurred; its children are the strings s + t. To draft after a context it
takes a suffix of the context (the match, L tokens) whose node exists, then walks down: the most
frequent child next, each token's probability the product of the shares count(child)/count(node)
along the path, stopping below `min_prob`; the draft is at most `factor * L + offset` tokens (a
longer match earns a longer draft). Every match length is tried and the path with the best score
(the sum of its token probabilities: the tokens it expects to be accepted) wins.

Here the tree is implicit. A `SuffixIndex` keeps the texts and, for each n-gram, the positions
where it ends. The occurrences of the matched suffix are the node, and the tokens that follow
them are its children with their counts: the numbers the explicit tree stores, read at drafting
time. Why not the tree itself: in Python a node per (position, depth) costs hundreds of bytes, a
bounded-depth tree holds up to depth x tokens nodes, and a long code prompt would take tens of MB
and a noticeable pause to insert; the index costs a few words per token and inserts in O(tokens).
Memory is bounded: past `max_tokens`, the oldest texts are evicted.

Worked example: three earlier texts, and a context ending in "2 3"::

    text 1: 1 2 3 4 5        "2 3" occurs 3 times; all three go on with 4 (share 3/3),
    text 2: 1 2 3 4 6        then 5 twice and 6 once (share 2/3): path 4 5, probabilities
    text 3: 7 2 3 4 5        1 and 2/3, score 1.67

    >>> ix = SuffixIndex(n=2)
    >>> for text in ([1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [7, 2, 3, 4, 5]):
    ...     ix.add(text)
    >>> d = speculate(ix, [9, 2, 3], 8)
    >>> d.tokens, [round(p, 2) for p in d.probs], d.match
    ([4, 5], [1.0, 0.67], 2)

The context "1 2 3" also matches 3 tokens in texts 1 and 2, where 5 has only half the votes (1.5)
against 2/3 for "2 3" (1.67): the more frequent continuation wins. A higher `min_prob` stops the
path before a doubtful token, and `factor * L + offset` caps its length::

    >>> speculate(ix, [1, 2, 3], 8).tokens, speculate(ix, [1, 2, 3], 8).match
    ([4, 5], 2)
    >>> speculate(ix, [9, 2, 3], 8, min_prob=0.7).tokens
    [4]
    >>> speculate(ix, [9, 2, 3], 8, factor=0.5).tokens     # L = 2: one token
    [4]
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

__all__ = ["SEP", "MAX_CANDIDATES", "SuffixIndex", "SuffixDraft", "follow", "shares", "speculate"]

#: ends every text in the index: no token id equals it, so no match or path crosses two texts
SEP = -1
#: occurrences of the last n tokens looked at per draft (the latest ones): bounds the work per step
#: where a short n-gram (a quote and a comma) occurs thousands of times
MAX_CANDIDATES = 64


@dataclass
class SuffixDraft:
    tokens: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)   # path probability after each token
    score: float = 0.0                                  # sum of probs: tokens expected accepted
    match: int = 0                                      # L, the context tokens matched
    positions: list[int] = field(default_factory=list)  # where those L tokens end (the node)
    rival: int = 0          # the longest match among the places whose next token differs


class SuffixIndex:
    """Texts (token lists) and, per n-gram, the absolute positions where it ends (ascending).

    `add` stores a finished text, evicting the oldest past `max_tokens`; `extend` appends to the
    last text (the current request, growing as it is generated). Positions are absolute: they
    keep their meaning when older texts are dropped from the front.
    """

    def __init__(self, n: int = 2, max_tokens: int | None = None):
        if n < 1 or (max_tokens is not None and max_tokens < 1):
            raise ValueError("SuffixIndex needs n >= 1 and max_tokens >= 1")
        self.n, self.max_tokens = n, max_tokens
        self.toks: list[int] = []      # the texts, each but an open last one followed by SEP
        self.base = 0                  # absolute position of toks[0]
        self.ends: dict[tuple, list[int]] = {}
        self.texts: deque[list] = deque()   # [start, end, live]: absolute, end exclusive
        self._open = False             # the last text takes `extend`s

    # -- building ---------------------------------------------------------------------------
    def add(self, tokens: Sequence[int]) -> None:
        """Store a finished text. One of the last few texts that is a shorter prefix of it (a
        chat's previous turn, which this one repeats) is dropped, not counted twice."""
        self._close()
        tokens = list(tokens)
        for t in list(self.texts)[-8:]:
            s, e, live = t
            if live and e - s < len(tokens) and self.toks[s - self.base:e - self.base] == tokens[:e - s]:
                self._drop(t)
        self._append(tokens)
        self._close()
        if self.max_tokens is not None:
            while len(self.toks) > self.max_tokens and len(self.texts) > 1:
                self._drop(self.texts[0])
            if len(self.toks) > self.max_tokens:   # a text longer than the whole budget is not kept
                self._drop(self.texts[0])

    def extend(self, tokens: Sequence[int]) -> None:
        """Append to the open last text (a new one if none is open)."""
        self._append(tokens)

    def _append(self, tokens: Sequence[int]) -> None:
        if not self._open:
            p = self.base + len(self.toks)
            self.texts.append([p, p, True])
            self._open = True
        text = self.texts[-1]
        start, n, toks, ends = text[0], self.n, self.toks, self.ends
        toks.extend(int(t) for t in tokens)
        for p in range(max(text[1], start + n - 1), self.base + len(toks)):
            i = p - self.base
            key = tuple(toks[i - n + 1:i + 1])
            lst = ends.get(key)
            if lst is None:
                ends[key] = [p]
            else:
                lst.append(p)
        text[1] = self.base + len(toks)

    def _close(self) -> None:
        if self._open:
            self.toks.append(SEP)
            self._open = False

    def _drop(self, text: list) -> None:
        """Unindex a text; drop the dead texts at the front from memory."""
        s, e, _ = text
        text[2] = False
        n, ends = self.n, self.ends
        for p in range(s + n - 1, e):
            i = p - self.base
            key = tuple(self.toks[i - n + 1:i + 1])
            lst = ends.get(key)
            if lst:
                a = bisect_left(lst, s)
                b = bisect_left(lst, e, a)
                del lst[a:b]
                if not lst:
                    del ends[key]
        while self.texts and not self.texts[0][2] and not (len(self.texts) == 1 and self._open):
            s0, e0, _ = self.texts.popleft()
            cut = e0 + 1 - self.base   # the text and its SEP
            del self.toks[:cut]
            self.base += cut

    # -- reading ----------------------------------------------------------------------------
    @property
    def end(self) -> int:
        """Absolute position after the last token stored."""
        return self.base + len(self.toks)

    def at(self, p: int) -> int:
        """Token at absolute position p; SEP past the end."""
        i = p - self.base
        return self.toks[i] if 0 <= i < len(self.toks) else SEP

    def live_tokens(self) -> int:
        return sum(e - s for s, e, live in self.texts if live)

    def matches(self, context: Sequence[int], n_max: int, before: int | None = None) -> list[tuple[int, int]]:
        """(position, L) for the latest MAX_CANDIDATES places where the last n tokens of `context`
        end (before absolute position `before`, if given): L tokens there equal the end of
        `context` (n <= L <= n_max)."""
        n = self.n
        if len(context) < n:
            return []
        cands = self.ends.get(tuple(context[-n:]))
        if not cands:
            return []
        hi = len(cands) if before is None else bisect_left(cands, before)
        toks, base, last = self.toks, self.base, len(context) - 1
        out = []
        for p in reversed(cands[max(0, hi - MAX_CANDIDATES):hi]):
            i, L = p - base, n
            while L < n_max and L <= last and i - L >= 0 and toks[i - L] == context[last - L]:
                L += 1
            out.append((p, L))
        return out


def follow(ix: SuffixIndex, positions: Sequence[int], n_tokens: int, min_prob: float) -> SuffixDraft:
    """Walk down from the node whose occurrences end at `positions`: the most frequent next token
    (ties: the one after the first position), while the path probability stays >= min_prob."""
    d = SuffixDraft()
    alive, prob, j = list(positions), 1.0, 1
    while alive and len(d.tokens) < n_tokens:
        if len(alive) == 1:   # one occurrence: its continuation, at the current probability
            p = alive[0]
            while len(d.tokens) < n_tokens and (t := ix.at(p + j)) != SEP:
                d.tokens.append(t)
                d.probs.append(prob)
                d.score += prob
                j += 1
            break
        counts: dict[int, int] = {}
        for p in alive:
            t = ix.at(p + j)
            if t != SEP:
                counts[t] = counts.get(t, 0) + 1
        if not counts:
            break
        best = max(counts, key=counts.__getitem__)   # insertion order breaks ties
        prob *= counts[best] / len(alive)   # texts that end here count in the node, not a child
        if prob < min_prob:
            break
        d.tokens.append(best)
        d.probs.append(prob)
        d.score += prob
        alive = [p for p in alive if ix.at(p + j) == best]
        j += 1
    return d


def speculate(ix: SuffixIndex, context: Sequence[int], n_tokens: int, *, factor: float = 1.0,
              offset: float = 0.0, min_prob: float = 0.1, n_max: int = 32,
              before: int | None = None) -> SuffixDraft:
    """The best-scoring draft over every match length L found (ties: the longer match), each at
    most min(n_tokens, factor * L + offset) tokens. An empty SuffixDraft when nothing matches."""
    found = ix.matches(context, n_max, before)
    best = SuffixDraft()
    if not found:
        return best
    found.sort(key=lambda m: -m[1])   # stable: latest first within one length
    i = 0
    while i < len(found):
        L = found[i][1]
        while i < len(found) and found[i][1] >= L:
            i += 1
        cap = min(n_tokens, int(factor * L + offset + 1e-6))
        if cap <= best.score:   # even a certain path this long would not beat the best
            break
        d = follow(ix, [p for p, _ in found[:i]], cap, min_prob)
        if d.tokens and d.score > best.score:
            d.match, d.positions = L, [p for p, _ in found[:i]]
            best = d
    if best.tokens:
        best.rival = max((L for p, L in found if ix.at(p + 1) != best.tokens[0]), default=0)
    return best


def shares(probs: Sequence[float]) -> list[float]:
    """Each token's share of the occurrences still on the path before it (path probabilities
    -> conditional ones): what fraction of the earlier places that agreed so far go on this way.

        >>> [round(s, 2) for s in shares([1.0, 0.67, 0.67, 0.33])]
        [1.0, 0.67, 1.0, 0.49]
    """
    out, prev = [], 1.0
    for p in probs:
        out.append(p / prev if prev > 0 else 0.0)
        prev = p
    return out
