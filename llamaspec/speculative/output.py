"""What a sequence emits: its tokens and text, streamed as they come, held back where a stop
string may start, and why it ended (SequenceRun's output side)."""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Literal, Sequence

import numpy as np

from llamaspec.runtime.llama import Model, Utf8Stream

__all__ = ["StopReason", "TextCallback", "PieceCallback", "StopStrings", "Output", "EogSet"]

#: why a generation ended: an end-of-generation token, -n reached, a stop string, the context
#: full, or interrupted (Ctrl-C / should_stop)
StopReason = Literal["eos", "length", "stop", "context", "interrupted"]


# on_text(text, from_draft, source): streaming callback for new text; from_draft is True for
# text of accepted draft tokens (for --color), source names the drafter.
TextCallback = Callable[[str, bool, str], None]
# on_piece(text, from_draft, source, logprobs): the same text with the logprobs (TokenLogprob) of
# the tokens whose text ends in it, None when none were asked for: a stream's chunk and its
# logprobs are handed over together, never read from a list that grows later.
PieceCallback = Callable[[str, bool, str, "Sequence[Any] | None"], None]


class StopStrings:
    """Finds stop strings in streamed text, holding back what could be the start of one.

    Only the text not emitted yet is kept (at most the longest stop string but one, plus the new
    piece): a stop string found now cannot start in text emitted before, since that text was
    emitted only once no stop could begin in it. So a push costs O(piece + longest stop) per stop
    string, however long the generation.

        >>> s = StopStrings(["END"])
        >>> s.push("abcE"), s.push("N"), s.push("D tail")
        (('ab', False), ('c', False), ('', True))
    """

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.text = ""   # held back: not emitted yet

    def push(self, piece: str) -> tuple[str, bool]:
        """Add text; return (text safe to emit now, stopped)."""
        self.text += piece
        if self.stops:
            hits = [i for i in (self.text.find(s) for s in self.stops) if i >= 0]
            if hits:
                out, self.text = self.text[:min(hits)], ""
                return out, True
        safe = max(0, len(self.text) - self.hold) if self.stops else len(self.text)
        out, self.text = self.text[:safe], self.text[safe:]
        return out, False

    def flush(self) -> str:
        out, self.text = self.text, ""
        return out


class Output:
    """The generated tokens and text of one sequence: streaming, stop strings, stop reason.

    A step's text pieces are queued by emit() and handed to `on_piece` by deliver(), once the
    step's logprobs exist (they are computed after the tokens are emitted): each piece with the
    logprobs of the tokens whose text ends in it. A token's text ends at its last character; a
    token that ends inside a multi-byte character, at that character. Tokens held back (a possible
    stop string) go with the piece that releases them; those of a stop string, with none."""

    def __init__(self, target: Model, max_tokens: int, stop: Sequence[str], on_piece: PieceCallback | None):
        self.target = target
        self.max_tokens = max_tokens
        self.on_piece = on_piece
        self.tokens: list[int] = []
        self.parts: list[str] = []
        self.stop_reason: StopReason = "length"
        self._stream = Utf8Stream()
        self._stops = StopStrings(stop)
        self._chars = 0             # characters decoded so far
        self._sent_chars = 0        # characters emitted so far
        self._ends: deque[int] = deque()   # where the text of each token not yet covered ends
        self._queued: list[tuple[str, bool, str, int]] = []   # (piece, from_draft, source, tokens covered)
        self._delivered = 0         # tokens whose logprobs were handed over

    def emit(self, tokens: list[int], n_acc: int, source: str) -> bool:
        """Append tokens (the first n_acc from the draft) to the output; True to stop."""
        for j, tok in enumerate(tokens):
            if self.target.is_eog(tok):
                self.stop_reason = "eos"
                return True
            self.tokens.append(tok)
            text = self._stream.push(self.target.piece(tok))
            self._chars += len(text)
            self._ends.append(self._chars + self._stream.pending)
            piece, hit = self._stops.push(text)
            if piece:
                self._queue(piece, j < n_acc, source)
            if hit:
                self.stop_reason = "stop"
                return True
            if len(self.tokens) >= self.max_tokens:
                self.stop_reason = "length"
                return True
        return False

    def _queue(self, piece: str, from_draft: bool, source: str, final: bool = False) -> None:
        self.parts.append(piece)
        self._sent_chars += len(piece)
        ends = self._ends
        while ends and (final or ends[0] <= self._sent_chars):
            ends.popleft()
        if self.on_piece is not None:
            self._queued.append((piece, from_draft, source, len(self.tokens) - len(ends)))

    def deliver(self, logprobs: Sequence[Any] | None) -> None:
        """Hand the queued pieces to on_piece; logprobs: every output token's so far (or None)."""
        queued, self._queued = self._queued, []
        for piece, from_draft, source, n in queued:
            lps = None if logprobs is None else list(logprobs[self._delivered:n])
            self._delivered = max(self._delivered, n)
            self.on_piece(piece, from_draft, source, lps)

    def finish(self) -> None:
        """Flush text held back (incomplete UTF-8, a possible stop-string start); deliver() then."""
        if self.stop_reason == "stop":
            return
        tail = self._stops.push(self._stream.flush())[0] + self._stops.flush()
        if tail:
            self._queue(tail, False, "", final=True)


class EogSet:
    """The target's end-of-generation ids as a collection for the verifiers (`tok in eog`): an
    accepted EOG draft token ends the step, so tokens after it are never counted as accepted."""

    def __init__(self, target: Model):
        self.target = target

    def __contains__(self, tok: object) -> bool:
        return isinstance(tok, (int, np.integer)) and self.target.is_eog(int(tok))
