"""`prompt-lookup`: copy what followed the longest earlier match of the text's end (llamaspec's own).

Not one of llama.cpp's types. It is prompt-lookup decoding as vLLM's `ngram` proposer and
transformers' `prompt_lookup_num_tokens` do it: find the earlier place in prompt + output whose
preceding tokens match the end of the sequence for the longest stretch (at least `n_min`, looked
at up to `n_max` back), and draft the tokens that followed it there.

Why llamaspec adds it and uses it for `--draft auto` when no draft model is on disk: llama.cpp's
n-gram types match a fixed n (ngram-simple, map-k: the latest occurrence of the last n tokens;
ngram-mod: a hash of the last n), so after the output departs from its source they need n new
tokens before drafting again, and a short fixed n picks the latest occurrence even when an older
one matches far longer. The longest match recovers after two tokens and picks the better source;
on the bundled code-rewrite prompt with SmolLM2 it needs 35 verify steps for 256 tokens where a
fixed n = 6 needs 64 (replay of the target's own output, same draft lengths).

Each draft carries `match`, the length of the match behind it: a draft copied after a long match
is far likelier to be right (on that prompt: matches of 2 tokens gave 0-2 accepted tokens, of 3+
gave 11-64), so the adaptive controller keeps its acceptance estimates per match length and
drafts long only where the matches earned it (controller.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from llamaspec.speculative.drafters.base import Draft, Drafter, announce
from llamaspec.speculative.drafters.copy_learner import EVIDENCE_MAX, PREDICTION_MAX, CopyLearner, contested
from llamaspec.speculative.match_controller import CopyEvidence

__all__ = ["prompt_lookup_draft", "PromptLookupDrafter"]

#: earlier occurrences of the last n_min tokens looked at per step (the latest ones): bounds the
#: work per step on texts where a short n-gram (a newline and an indent) occurs thousands of times
MAX_CANDIDATES = 64
#: how far back the chosen match is followed for `Draft.match` (the source is chosen on n_max
#: tokens): inside a long copy the agreement runs to hundreds of tokens, and the controller
#: drafts longer the longer it is (match_controller.py)
MATCH_REPORT_MAX = 512


def _match_length(h: Sequence[int], j: int, n_max: int) -> int:
    """How many tokens ending at h[j] equal the tokens ending at h[-1] (at most n_max)."""
    end = len(h) - 1
    n = 0
    while n < n_max and j - n >= 0 and h[j - n] == h[end - n]:
        n += 1
    return n


def prompt_lookup_draft(history: Sequence[int], n_max_draft: int, n_min: int = 2,
                        n_max: int = 16) -> tuple[list[int], int]:
    """(draft, match length): the tokens that followed the longest earlier match of history's end.

    A match ends at position j < len(history) - 1 when history[j-n+1 .. j] equals the last n
    tokens, n >= n_min (n counted up to n_max). The longest match wins, the latest on ties; the
    draft is history[j+1 : j+1+n_max_draft]. No match: ([], 0). Reference implementation of what
    `PromptLookupDrafter` computes incrementally.

    Worked example: history 1 2 3 9 | 7 2 3 4 5 | 1 2 3. The end "2 3" also ends at positions 2
    and 6; at 2 the match runs back over "1 2 3" (length 3), at 6 only over "2 3" (length 2), so
    the draft copies what followed position 2::

        >>> prompt_lookup_draft([1, 2, 3, 9, 7, 2, 3, 4, 5, 1, 2, 3], 3)
        ([9, 7, 2], 3)
        >>> prompt_lookup_draft([1, 2, 3, 9, 7, 2, 3, 4, 5, 1, 2, 3], 3, n_min=4)   # none of 4 tokens
        ([], 0)
    """
    best_j, best_n = -1, 0
    for j in range(len(history) - 2, -1, -1):
        n = _match_length(history, j, n_max)
        if n >= n_min and n > best_n:
            best_j, best_n = j, n
            if n >= n_max:
                break
    if best_j < 0:
        return [], 0
    return [int(t) for t in history[best_j + 1:best_j + 1 + n_max_draft]], best_n


@dataclass
class _Seq:
    ends: dict = field(default_factory=dict)  # last n_min tokens (tuple) -> positions where they end
    indexed: int = 0                          # positions < indexed are in `ends`
    first: int = -1                           # history[0] when indexed, to notice a new history
    learner: CopyLearner = field(default_factory=CopyLearner)   # what copies did in this text
    n_prompt: int = 0                         # history[:n_prompt] is the prompt


class PromptLookupDrafter(Drafter):
    """Longest-match prompt lookup (see the module docstring), indexed incrementally.

    Per sequence, a dict from each n_min-gram to the positions where it ends; a step looks at the
    latest MAX_CANDIDATES of them and extends each match backwards, so it costs O(candidates x
    n_max) whatever the length of the text. Gives `prompt_lookup_draft`'s result whenever the
    best match is among those candidates.
    """

    name = "prompt-lookup"
    copies = True
    sizes_by_match = True

    def __init__(self, n_min: int = 2, n_max: int = 16, size_m: int = 64,
                 is_stop: Callable[[int], bool] | None = None):
        if not 1 <= n_min <= n_max or size_m < 1:
            raise ValueError("prompt-lookup needs 1 <= n_min <= n_max and size_m >= 1")
        self.n_min, self.n_max, self.size_m = n_min, n_max, size_m
        # end-of-generation tokens: a draft ends at one (what follows it in the text is the chat
        # template's next turn, which the target never writes: generation stops there)
        self.is_stop = is_stop
        self._seqs: dict[int, _Seq] = {}

    def begin(self, seq_id: int, prompt_tokens: Sequence[int],
              rng: np.random.Generator | None = None) -> None:
        s = self._seqs[seq_id] = _Seq(n_prompt=len(prompt_tokens))
        self._index(s, prompt_tokens, len(prompt_tokens) - 1)

    def end(self, seq_id: int) -> None:
        self._seqs.pop(seq_id, None)

    def close(self) -> None:
        self._seqs.clear()

    def _index(self, s: _Seq, h: Sequence[int], upto: int) -> None:
        """Index the n_min-grams ending at positions [s.indexed, upto)."""
        n = self.n_min
        if len(h):
            s.first = h[0]
        ends = s.ends
        for j in range(max(s.indexed, n - 1), upto):
            key = tuple(h[j - n + 1:j + 1])
            lst = ends.get(key)
            if lst is None:
                ends[key] = [j]
            else:
                lst.append(j)
        s.indexed = max(s.indexed, upto)

    def find(self, seq_id: int, history: Sequence[int]) -> tuple[int, int]:
        """(j, n): the match ends at history[j] and runs n tokens back (followed up to
        MATCH_REPORT_MAX when it reaches n_max); (-1, 0) for none."""
        j, n, _ = self.locate(seq_id, history)
        return j, n

    def locate(self, seq_id: int, history: Sequence[int]) -> tuple[int, int, int]:
        """(j, n, rival): `find`'s match, and the longest match (up to n_max) among the places
        whose next token differs from history[j + 1] (0 when none): when rival >= n the text's
        end does not single the source out (the 3 tokens "⏎⏎def" before every function)."""
        s = self._seq(seq_id, history)
        last = len(history) - 1
        self._index(s, history, last)  # every end position before the last token
        if last < self.n_min:
            return -1, 0, 0
        cands = s.ends.get(tuple(history[last - self.n_min + 1:]))
        if not cands:
            return -1, 0, 0
        found = [(_match_length(history, j, self.n_max), j) for j in reversed(cands[-MAX_CANDIDATES:])]
        best_n, best_j = found[0]
        for n, j in found:
            if n > best_n:
                best_j, best_n = j, n
        nxt = history[best_j + 1]
        rival = max((n for n, j in found if history[j + 1] != nxt), default=0)
        if best_n >= self.n_max:  # how long the copy has really agreed: the controller's evidence
            best_n = _match_length(history, best_j, MATCH_REPORT_MAX)
        return best_j, best_n, rival

    def _seq(self, seq_id: int, history: Sequence[int]) -> _Seq:
        s = self._seqs.get(seq_id)
        if s is None or (len(history) and history[0] != s.first) or s.indexed > len(history):
            s = self._seqs[seq_id] = _Seq(n_prompt=len(history))
        return s

    def continuation(self, seq_id: int, history: Sequence[int], start: int, match: int,
                     own: bool = False) -> CopyEvidence:
        """`match` with the probabilities that the text follows the copy history[start:] at each
        position: p(agreement) of the sequence's statistics, times (held + 1) / (held + refused
        + 1) of the source token (a token the text refused to copy before is likely refused
        again); at most size_m positions, up to and including an end-of-generation token."""
        src = history[start:start + min(self.size_m, EVIDENCE_MAX)]
        if self.is_stop is not None:
            for i, t in enumerate(src):
                if self.is_stop(int(t)):
                    src = src[:i + 1]
                    break
        return self._seqs[seq_id].learner.evidence(match, src, own=own)

    def evidence(self, n: int, rival: int) -> int:
        """The match length the controller sizes a draft by: n, or n_min when another place with
        another next token matches as long (a guess between them, however long n is)."""
        return contested(n, rival, self.n_min, self.n_max)

    def propose_within(self, seq_id: int, history: Sequence[int],
                       limit: Callable[..., int]) -> Draft:
        # The match comes first so the controller can size the draft by it.
        announce(limit, self)
        self._seq(seq_id, history).learner.learn(history)
        j, n, rival = self.locate(seq_id, history)
        if j < 0:
            return Draft([], None, self.name)
        own = j >= self._seqs[seq_id].n_prompt    # the source is the output itself (statistics apart)
        ev = self.continuation(seq_id, history, j + 1, self.evidence(n, rival), own)
        self._seqs[seq_id].learner.expect(history[j + 1:j + 1 + PREDICTION_MAX], len(history), int(ev), own)
        k = min(limit(self, ev), len(ev.probs))
        if k <= 0:
            return Draft([], None, self.name)
        return Draft([int(t) for t in history[j + 1:j + 1 + k]], None, self.name, match=ev)

    def propose(self, seq_id: int, history: Sequence[int], n_max: int) -> Draft:
        return self.propose_within(seq_id, history, lambda d, match=None: n_max)
