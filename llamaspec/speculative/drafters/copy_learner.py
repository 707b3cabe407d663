"""What a copying drafter learns from its own text about how far a copy will be followed.

Shared by prompt-lookup and suffix (both copy what followed an earlier match of the text's end).
After each lookup the drafter says what the copy predicted (`expect`); at the next lookup the
prediction is compared with what the text really did, drafted or not (`learn`): continuations and
the break per agreement length (CopyStats), and per source token how often the text copied it
(`held`) or, after a confident match, refused it (`refused`: a renamed identifier, the source's
blank line where the answer writes a newline). `evidence` turns that into the continuation
probabilities of a draft (CopyEvidence), which the match controller sizes by expected gain.
"""

from __future__ import annotations

from typing import Sequence

from llamaspec.speculative.match_controller import AGREEMENT_EDGES, CopyEvidence, CopyStats, agreement_bucket

__all__ = ["CopyLearner", "contested", "EVIDENCE_MAX", "REFUSAL_AGREEMENT", "STATS_DECAY", "PREDICTION_MAX"]

#: a copy that broke after agreeing for this many tokens was refused by the model at that token
#: (a renamed identifier, "\n" for the source's "\n\n"); shorter ones were the wrong place
REFUSAL_AGREEMENT = 4
#: the continuation statistics forget this much per lookup (the text moves on: a copied stretch,
#: then free text)
STATS_DECAY = 0.95
#: tokens of a prediction kept to learn from (more than one step ever appends)
PREDICTION_MAX = 256
#: the longest copy given probabilities (so the longest draft a copying drafter makes): twice the
#: largest batch a CPU verify pays off with (64), and a lookup's work stays bounded (a path of
#: 511 tokens walked and priced every step cost ~1 ms, a tenth of a SmolLM2 step)
EVIDENCE_MAX = 128
#: p(g) before anything was seen for a copy whose source is the output itself, not the prompt: a
#: short match there is mostly a phrase the answer repeats, not a stretch it copies (replays of
#: SmolLM2 on ten code edits, 3-token matches: 71% of those in the prompt ran 4+ tokens, 20% of
#: those in the output); long ones are as sure as anywhere (a list, a repeated block)
OWN_PRIORS = (0.3, 0.4, 0.7, 0.9, 0.96, 0.98, 0.985, 0.99)
#: agreement bucket of each g up to the last edge (agreement_bucket, without its loop per token)
_BUCKET = [agreement_bucket(g) for g in range(AGREEMENT_EDGES[-1] + 1)]


def contested(n: int, rival: int, n_min: int, n_max: int) -> int:
    """The match length a draft is sized by: n, or n_min when another place with another next
    token matches nearly as long (rival >= n - 1: a guess between them, however long n is; the
    3 tokens "blank line, def" before every function).

        >>> contested(5, 2, 2, 16), contested(5, 4, 2, 16), contested(40, 15, 2, 16)
        (5, 2, 2)
    """
    return n if rival + 1 < min(n, n_max) else min(n, n_min)


class CopyLearner:
    """One sequence's continuation statistics (see the module docstring)."""

    def __init__(self) -> None:
        self.stats = CopyStats(decay=STATS_DECAY)                 # copies from the prompt (or other texts)
        self.own = CopyStats(OWN_PRIORS, decay=STATS_DECAY)      # copies from the output itself
        self.held: dict[int, int] = {}      # source token -> times the text copied it
        self.refused: dict[int, int] = {}   # source token -> times a confident copy broke there
        self.pending: tuple | None = None   # (predicted tokens, len(history), agreement) of the last lookup

    def expect(self, predicted: Sequence[int], at: int, match: int, own: bool = False) -> None:
        """The last lookup, at history length `at` after a match of `match` tokens, predicted
        that the text goes on with `predicted` (own: copied from the output itself)."""
        self.pending = (tuple(predicted[:PREDICTION_MAX]), at, match, own)

    def learn(self, history: Sequence[int]) -> None:
        """Compare the pending prediction with what the text did since (drafted or not).

        Worked example: after a 6-token match the copy predicted 5 6 7 8 9; the text wrote
        5 6 7 8 4. Agreements 6, 7, 8 continued (bucket 6-8: 3 more continuations over its prior
        0.92 weighing 8: p = (3 + 8 * 0.92) / 11 = 0.942); 9 continued and 10 broke (bucket
        9-16); 9 was refused after 10 tokens of agreement, a confident copy::

            >>> c = CopyLearner()
            >>> c.expect([5, 6, 7, 8, 9], at=3, match=6)
            >>> c.learn([1, 2, 3, 5, 6, 7, 8, 4])      # followed for 4 tokens, then refused 9
            >>> c.held[5], c.refused[9], round(c.stats.p(6), 3)
            (1, 1, 0.942)
        """
        if self.pending is None:
            return
        pred, h0, m0, own = self.pending
        self.pending = None
        new = len(history) - h0
        if new <= 0 or m0 <= 0:
            return
        i = 0
        while i < new and i < len(pred) and pred[i] == history[h0 + i]:
            self.held[pred[i]] = self.held.get(pred[i], 0) + 1
            i += 1
        broke = i < new and i < len(pred)
        (self.own if own else self.stats).observe(m0, i + (1 if broke else 0), i)
        if broke and m0 + i >= REFUSAL_AGREEMENT:
            self.refused[pred[i]] = self.refused.get(pred[i], 0) + 1

    def probs(self, match: int, src: Sequence[int], own: bool = False) -> list[float]:
        """p that the text follows `src` at each of its positions after a match of `match`: p of
        the agreement bucket, times (held + 1) / (held + refused + 1) for a source token the text
        refused before (it is likely refused again)."""
        s = self.own if own else self.stats
        # p by agreement bucket, computed once per bucket (a draft can be hundreds of tokens)
        bucket_p = [s.p(edge) for edge in AGREEMENT_EDGES] + [s.p(AGREEMENT_EDGES[-1] + 1)]
        last = AGREEMENT_EDGES[-1]
        probs = [bucket_p[_BUCKET[g]] for g in range(match, min(match + len(src), last + 1))]
        probs += [bucket_p[-1]] * (len(src) - len(probs))
        if self.refused:
            for i, t in enumerate(src):
                refused = self.refused.get(t)
                if refused:
                    held = self.held.get(t, 0)
                    probs[i] *= (held + 1) / (held + refused + 1)
        return probs

    def evidence(self, match: int, src: Sequence[int], shares: Sequence[float] | None = None,
                 own: bool = False) -> CopyEvidence:
        """CopyEvidence for copying `src` after a match of `match`; `shares` (optional, one per
        position) multiplies in what else is known: the fraction of the earlier occurrences that
        go on this way (suffix), a rival place that diverges there (prompt-lookup)."""
        probs = self.probs(match, src, own)
        if shares is not None:
            probs = [p * s for p, s in zip(probs, shares)]
        return CopyEvidence(match, probs)
