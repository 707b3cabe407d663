"""`suffix`: suffix decoding across requests (SuffixDecoding, arXiv 2411.04975; llamaspec's own).

Not one of llama.cpp's types (an open PR, #26283, adds one); vLLM has it through Arctic
Inference. A batch job, a server or a chat keeps one drafter for its whole life, and their
answers repeat each other: the same JSON schema, the same SQL shape, the same boilerplate. So the
drafter keeps two indexes (suffix_tree.py: SuffixDecoding's frequency-counted suffix tree, read
from n-gram positions):

- a global one over the prompts and outputs of the requests that finished on this drafter,
  bounded (`max_tokens`; the oldest requests are evicted), filled at `end(seq_id)`;
- one per running request over its prompt and output so far (what prompt-lookup searches).

Each step both choose their best-scoring match (SuffixDecoding's score: the frequency-scored path
of at most `factor * L + offset` tokens, cut where the path probability falls below `min_prob`);
the higher score wins, the request's own on ties. The draft is the whole frequent path from that
match (up to EVIDENCE_MAX tokens) and carries CopyEvidence: per position, what this request's
text did after earlier copies (continuation per agreement length, source tokens it refused:
copy_learner.py, as prompt-lookup) times the share of the earlier occurrences that go on that
way (all agree: 1; where they split, the divergence is priced). The match controller drafts the
length with the best expected gain against the verify cost (match_controller.py). Lossless like
every type: the target verifies each draft.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from llamaspec.speculative.drafters.base import Draft, Drafter, announce
from llamaspec.speculative.drafters.copy_learner import EVIDENCE_MAX, CopyLearner, contested
from llamaspec.speculative.drafters.suffix_tree import SuffixDraft, SuffixIndex, follow, shares, speculate

__all__ = ["SuffixDrafter", "DEFAULT_MAX_TOKENS"]

#: tokens of finished requests the global index keeps (a few MB: ~100 bytes a token)
DEFAULT_MAX_TOKENS = 1 << 17


class _Seq:
    def __init__(self, n: int, prompt: Sequence[int]):
        self.tokens = list(prompt)          # prompt + every token appended: what end() stores
        self.index = SuffixIndex(n)         # over the history seen by propose
        self.seen = 0                       # history tokens in `index`
        self.first = prompt[0] if len(prompt) else None
        self.learner = CopyLearner()        # how far this request's text followed earlier copies


class SuffixDrafter(Drafter):
    """Drafts from this request's text and from the requests that finished before it (see the
    module docstring). The global index outlives requests: it lives as long as the drafter."""

    name = "suffix"
    copies = True
    sizes_by_match = True

    def __init__(self, n_min: int = 2, n_max: int = 32, size_m: int = 64, *, factor: float = 1.0,
                 offset: float = 0.0, min_prob: float = 0.1, max_tokens: int = DEFAULT_MAX_TOKENS):
        if not 1 <= n_min <= n_max or size_m < 1 or max_tokens < 1 or not 0.0 <= min_prob <= 1.0:
            raise ValueError("suffix needs 1 <= n_min <= n_max, size_m >= 1, max_tokens >= 1, 0 <= min_prob <= 1")
        self.n_min, self.n_max, self.size_m = n_min, n_max, size_m
        self.factor, self.offset, self.min_prob = factor, offset, min_prob
        self.tree = SuffixIndex(n_min, max_tokens)
        self._seqs: dict[int, _Seq] = {}
        # False: finished requests are not indexed, each drafts from its own text only (a server
        # shared between people: draft timings could tell one client what another wrote)
        self.shared = True

    # -- life cycle -------------------------------------------------------------------------
    def begin(self, seq_id: int, prompt_tokens: Sequence[int],
              rng: np.random.Generator | None = None) -> None:
        self._seqs[seq_id] = _Seq(self.n_min, prompt_tokens)

    def accepted(self, seq_id: int, n_accepted: int, new_tokens: Sequence[int],
                 is_other: bool = False) -> None:
        s = self._seqs.get(seq_id)
        if s is not None:
            s.tokens.extend(int(t) for t in new_tokens)

    def end(self, seq_id: int) -> None:
        # The request's prompt and output join the global index for the requests after it.
        s = self._seqs.pop(seq_id, None)
        if self.shared and s is not None and len(s.tokens) > self.n_min:
            self.tree.add(s.tokens)

    def close(self) -> None:
        self._seqs.clear()

    # -- drafting ---------------------------------------------------------------------------
    def _local(self, seq_id: int, history: Sequence[int]) -> _Seq:
        """This request's index, brought up to `history` (rebuilt if history is not its text)."""
        s = self._seqs.get(seq_id)
        if s is None or s.seen > len(history) or (len(history) and history[0] != s.first):
            s = self._seqs[seq_id] = _Seq(self.n_min, history)
        if s.seen < len(history):
            s.index.extend(history[s.seen:])
            s.seen = len(history)
        return s

    def find(self, seq_id: int, history: Sequence[int]) -> SuffixDraft:
        """The better of this request's and the global index's drafts (a SuffixDraft), at most
        size_m tokens."""
        return self._find(self._local(seq_id, history), history)[0]

    def _find(self, s: _Seq, history: Sequence[int]) -> tuple[SuffixDraft, SuffixIndex]:
        kw = dict(factor=self.factor, offset=self.offset, min_prob=self.min_prob, n_max=self.n_max)
        # the request's own text: a match must end before its last token (that is the context)
        local = speculate(s.index, history, self.size_m, before=s.index.end - 1, **kw)
        if not self.tree.texts:
            return local, s.index
        glob = speculate(self.tree, history, self.size_m, **kw)
        return (glob, self.tree) if glob.score > local.score else (local, s.index)

    def propose_within(self, seq_id: int, history: Sequence[int],
                       limit: Callable[..., int]) -> Draft:
        announce(limit, self)   # looked for, and timed, even when nothing is found
        s = self._local(seq_id, history)
        s.learner.learn(history)
        d, ix = self._find(s, history)
        if not d.tokens:
            return Draft([], None, self.name)
        # The match was chosen by SuffixDecoding's score; the draft's length is the controller's,
        # from the whole frequent path (not only factor * L tokens): p per position is what this
        # text did after copies (agreement, refused tokens) times the share of the earlier
        # occurrences that go on this way (all agree: 1; they split: the divergence costs).
        path = follow(ix, d.positions, min(self.size_m, EVIDENCE_MAX), self.min_prob)
        match = contested(d.match, d.rival, self.n_min, self.n_max)
        ev = s.learner.evidence(match, path.tokens, shares(path.probs))
        s.learner.expect(path.tokens, len(history), match)
        k = min(limit(self, ev), len(path.tokens))
        if k <= 0:
            return Draft([], None, self.name)
        return Draft(path.tokens[:k], None, self.name, match=ev)

    def propose(self, seq_id: int, history: Sequence[int], n_max: int) -> Draft:
        return self.propose_within(seq_id, history, lambda d, match=None: n_max)
