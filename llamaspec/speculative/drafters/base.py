"""The one small interface every drafter implements.

A drafter proposes draft tokens for a sequence; the engine verifies them with the target model
and tells every drafter what happened. "No draft" (an empty `Draft`) is a normal result: the
engine then decodes one token the plain way.

Life cycle of one sequence (ids are explicit so several sequences can be decoded together)::

    keep = drafter.reuse_prefix(seq_id, prompt_tokens, keep)  # before the target evaluates the prompt
    drafter.begin(seq_id, prompt_tokens, rng)
    loop:
        draft = drafter.propose(seq_id, history, n_max)   # history = prompt + generated so far
        ... verify draft with the target, append accepted + 1 token to history ...
        drafter.accepted(seq_id, n_accepted, new_tokens)  # also after a step with no draft (0, [tok])
    drafter.end(seq_id)
    drafter.close()                                       # once, when the drafter is no longer needed

`is_other` mirrors llama.cpp's `accept(seq_id, n_accepted, is_other)`: a `ChainDrafter` calls
`accepted(..., is_other=False)` on the drafter whose draft was verified and
`accepted(..., is_other=True)` on all the others, so each one can keep its state in sync while
only the author of the draft learns from its acceptance.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import numpy as np

if TYPE_CHECKING:
    from llamaspec.runtime.grammar import GrammarState

__all__ = ["Draft", "Drafter", "announce"]


def announce(limit: Callable[..., int], drafter: "Drafter") -> None:
    """Tell the engine `drafter` starts looking for a draft, for a drafter that looks before it asks
    `limit` for a length (prompt-lookup sizes its draft by the match it finds): the attempt is
    counted and timed as a call even when nothing is found. Other drafters need not: limit(d) is
    the announcement."""
    start = getattr(limit, "start", None)
    if start is not None:
        start(drafter)


@dataclass
class Draft:
    """Draft tokens proposed for one sequence.

    tokens: the proposed continuation (may be empty: "no draft").
    probs:  one full distribution over the vocabulary per draft token (the distribution the token
            was drawn from), for rejection sampling; None when the drafter has none (n-gram
            drafters: their proposals are deterministic, i.e. one-hot distributions).
    source: name of the drafter that produced the draft ("" for no draft).
    match:  how many tokens of context matched where the draft was copied from, for drafters that
            know it (prompt-lookup); None otherwise. The controller keeps acceptance per match
            length: a draft after a long match is likelier to be right.
    hold:   an empty draft that speaks for the step's copying: a chain asks no later member that
            `copies` (the grammar copy drafter at a value's first bytes, where the other copy
            drafters' only evidence is the keys the grammar forced, which match another record's
            value in a worked example); a draft model is still asked.
    """

    tokens: list[int]
    probs: list[np.ndarray] | None = None
    source: str = ""
    match: int | None = None
    hold: bool = False

    def __len__(self) -> int:
        return len(self.tokens)

    def __bool__(self) -> bool:
        return bool(self.tokens)

    def truncated(self, n: int) -> "Draft":
        """This draft cut to at most `n` tokens (the same object if it is already short enough)."""
        if len(self.tokens) <= n:
            return self
        n = max(0, n)
        probs = self.probs[:n] if self.probs is not None else None
        return Draft(self.tokens[:n], probs, self.source, self.match)


class Drafter(ABC):
    """Base of all drafters. Only `propose` is required; the other hooks default to no-ops."""

    #: drafter name, llama.cpp's spec-type name where one exists ("ngram-simple", "draft-mtp", ...)
    name: str = "drafter"
    #: True when drafts are sampled (they carry probabilities and are verified by rejection sampling)
    samples: bool = False
    #: cost of one drafted token relative to a target decode step, estimated without timing
    #: (from model sizes); used where decisions must not depend on measured time
    cost_hint: float = 0.0
    #: cost of one drafted token relative to a target decode step, timed when the drafter was
    #: built (one-token decodes of both models); the controller's estimate until drafts are timed
    measured_cost: float = 0.0
    #: True when drafts carry `Draft.match`: the engine then sizes them per match length
    #: (match_controller.py)
    sizes_by_match: bool = False
    # a copying drafter's drafts are held to a loss budget (match_controller.RiskBudget)
    bounded_risk: bool = True
    #: True when drafts are copied from earlier text by context matches (the n-gram types,
    #: prompt-lookup, suffix): they stop where a grammar copy drafter holds (`Draft.hold`)
    copies: bool = False
    #: tokens the drafter re-reads before it can draft after a pause (a draft model's catch-up
    #: window); part of what a probe costs (DraftLengthController.probe_loss)
    resume_tokens: int = 0

    def reuse_prefix(self, seq_id: int, prompt_tokens: Sequence[int], keep: int) -> int:
        """A new prompt starts on `seq_id`, and the engine means to keep the first `keep` positions
        of the target's KV cache (evaluated for an earlier prompt with the same tokens there) and
        to evaluate the prompt from position `keep` on. Returns the position the drafter needs the
        target to evaluate from (<= keep): a drafter fed by the target's hidden states sees only the
        positions the target evaluates, so one whose own state holds fewer positions asks for less
        reuse. The drafter must accept any start <= what it returns (the engine may start lower,
        at 0 when the target's memory cannot be cut). Called before `begin`, for every prompt."""
        return keep

    def begin(self, seq_id: int, prompt_tokens: Sequence[int],
              rng: np.random.Generator | None = None) -> None:
        """A new sequence starts with `prompt_tokens` (its whole prompt, already evaluated).

        rng: the random stream for drafters that sample (a draft model at T > 0). The engine
        derives it per generation, independent of the stream the verifier draws from: with one
        seed for both, the number that picks a draft token would be the one that tests it.
        """

    def prefill(self, seq_id: int, history: Sequence[int]) -> None:
        """Evaluate now what the next draft of `seq_id` would read first (a draft model: the prompt
        and what followed, all but the last token), for a drafter loaded beside the first steps:
        lazy.py calls it off the main thread. Drafters that read nothing: nothing to do."""

    def time_token(self) -> float | None:
        """Seconds of one drafted token, timed now on the drafter's own context (a draft model);
        None for drafters without one."""
        return None

    def bind_grammars(self, grammars: Mapping[int, "GrammarState"]) -> None:
        """The engine's live grammar states, seq_id -> GrammarState (runtime/grammar.py), present
        while that sequence runs under a grammar; called once when the engine is made. Drafters
        that draft from the grammar keep the mapping (read it, clone a state, never advance it);
        the others need nothing from it."""

    def wait(self) -> None:
        """Block until the drafter can draft (a draft model loading beside the first steps:
        lazy.py); drafters that are ready when built return at once."""

    def steady(self, seq_id: int) -> None:
        """`seq_id`'s drafts must not follow a clock (a seed at T > 0: which positions get drafted
        decides rejection sampling's draws): a drafter that works beside the steps (lazy.py) waits
        for that work instead. Until the sequence ends."""

    def draft_token_seconds(self) -> float | None:
        """Seconds of one drafted token, timed on the drafter alone when the target's time was not
        at hand (lazy.py: the controllers divide it by the target step they time); else None."""
        return None

    def members(self) -> list["Drafter"]:
        """The drafters this one is made of, in priority order (itself, for a single drafter)."""
        return [self]

    def batch_member(self) -> "Drafter | None":
        """The drafter that drafts several sequences in one call (`propose_many`: a draft model's
        one decode per position for all), when this one has one; the engine uses it for steps of
        several sequences without a grammar."""
        return self if hasattr(self, "propose_many") else None

    def drafted_by(self, seq_id: int, member: "Drafter") -> None:
        """`member` made this step's draft of `seq_id` outside `propose` (by propose_many): a
        chain credits it as the winner in `accepted`."""

    def propose_within(self, seq_id: int, history: Sequence[int],
                       limit: Callable[..., int]) -> Draft:
        """`propose` with a draft-length cap per member: limit(d) for each member d (0: skip it).

        The engine gives each member its own adaptive cap, so a paused draft model does not stop
        a free n-gram drafter from being tried (and the other way round). A drafter that knows
        its match length before drafting calls announce(limit, d) first and limit(d, match) when it
        has one (prompt_lookup.py)."""
        k = limit(self)
        return self.propose(seq_id, history, k).truncated(k) if k > 0 else Draft([])

    @abstractmethod
    def propose(self, seq_id: int, history: Sequence[int], n_max: int) -> Draft:
        """Draft at most `n_max` tokens to follow `history`.

        history: every token of the sequence so far (prompt + generated); the last one is the token
                 whose successors are wanted (llama.cpp's `id_last`). Between `begin` calls the
                 history of a sequence only grows at its end; drafters may index it incrementally.
        Returns an empty Draft when there is nothing worth drafting.
        """

    def opening(self, seq_id: int, prompt: Sequence[int], n_max: int) -> Draft:
        """A draft of the reply's first tokens, before the target has chosen any and before `begin`
        (no state of this sequence yet): the engine verifies it in the prompt's own batch. Only a
        drafter that knows the reply's start without the model does (the grammar drafter: the text
        a grammar forces first); the others give no draft."""
        return Draft([])

    def accepted(self, seq_id: int, n_accepted: int, new_tokens: Sequence[int],
                 is_other: bool = False) -> None:
        """Feedback after a verify step of sequence `seq_id`.

        n_accepted: how many draft tokens the target accepted (0 after a step with no draft).
        new_tokens: the tokens actually appended to the sequence (accepted draft tokens + the
                    target's own next token).
        is_other:   True when the verified draft came from another drafter (or there was none).
        """

    def end(self, seq_id: int) -> None:
        """Sequence `seq_id` is finished; drop its per-sequence state."""

    def close(self) -> None:
        """Release resources (contexts, big buffers)."""
