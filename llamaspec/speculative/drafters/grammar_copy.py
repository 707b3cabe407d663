"""`grammar-copy`: copy the prompt's text into the free parts of a grammar's output, and close it
with the text the grammar then forces (llamaspec's own).

Extraction under a JSON schema writes values taken from the prompt ("Maria Lopez", an email, a
date) between keys the grammar forces. Token-level prompt lookup copies them badly: a value opens
a JSON string, where a name has no leading space (`Tom` here, ` Tom` in the prose it comes from:
other tokens), and the keys before it match the prompt's worked example, whose value is another
record's. So this drafter matches text, not tokens, and only the text the model chose freely:

- It follows the output byte by byte on its own copy of the grammar state and notes which bytes
  the grammar forced (one byte allowed). The *free run* is the output after the last forced byte:
  `Tom` in `{"name": "Tom`. The keys, quotes and colons before it are the grammar's, not evidence.
- The longest end of the free run (MIN_MATCH bytes or more) found in the prompt + output so far,
  latest place first, is where the value is being copied from; what follows there is the draft,
  in the target's own tokenization, as far as the grammar allows it.
- Where the grammar refuses the source's next token (a newline inside a JSON string), the value
  ends: the draft goes on with the byte that closes it (the allowed punctuation after which the
  grammar forces the most text: `"`) and that forced text (`, "email": "`), as the grammar drafter
  (grammar_jump.py) would propose it one step later. One step then verifies the rest of the value
  and the next key, and the target's own token is the next value's first.

Worked example: output `{"name": "Tom`, prompt "...Best,\\nTom Becker\\nHead of Sales...". The free
run is `Tom`; " Becker\\nHead" follows it in the prompt; the grammar refuses "\\n" in a string, so
the draft is ` Becker` + `"` + `, "email": "` = ` Becker`, `",`, ` "`, `email`, `":`, ` "`.

Drafts carry their match length (bytes of free run matched, as `Draft.match`): the engine sizes
them per match length (match_controller.py). Silent (not asked, not timed) without a grammar, and
until the grammar has forced a byte (a lazy tool-call grammar before its trigger; `json_object`'s
any JSON value, which forces little): there the other drafters copy as without a grammar.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import numpy as np

from llamaspec.speculative.drafters.base import Draft, Drafter, announce
from llamaspec.speculative.drafters.grammar_jump import WS, Layout, vocab_of, forced_text, spell

if TYPE_CHECKING:
    from llamaspec.runtime.grammar import GrammarState
    from llamaspec.runtime.llama import Model

__all__ = ["GrammarCopyDrafter", "longest_source"]

#: bytes of free run a match needs: "Tom", "C-0"; one or two bytes occur everywhere
MIN_MATCH = 3
#: bytes of free run looked for at most (a longer match says no more)
MAX_MATCH = 64
#: bytes of source text copied per draft at most
MAX_COPY = 96
#: where a copied value most likely ends in its source: a delimiter; a sentence's end (". ", not
#: "Mr." or "3.2.0"; a "." that ends the text copied from says nothing); a dash or slash between
#: blanks; a word that joins a value to the prose around it ("Data Summit on 2025-06-12 in
#: Berlin", "Rex building kit by Blockworks": English; elsewhere the delimiters still end values)
_VALUE_END = re.compile(rb"[\n\r\t,;:|()\[\]{}<>]|[.!?](?=[ \n])| (?:-|\xe2\x80\x93|/|on|in|at|by|for|from|with"
                        rb"|and|or|was|were|is|are|has|have|had|to|will|who|which|that|via)(?= )")
#: bytes tried first when asking whether a byte was forced: in free text one of them is allowed
_FREE_PROBES = b'ea 0"-,'


def value_end(source: bytes) -> int:
    """Where a value copied from `source` most likely ends: its first delimiter, or len(source).

        >>> value_end(b" Becker | Head of Sales"), value_end(b". Ali Hassan, ok"), value_end(b"x")
        (7, 0, 1)
        >>> value_end(b" Summit on 2025-06-12"), value_end(b"3.2.0 and 3.3"), value_end(b" Bonnet")
        (7, 5, 7)
    """
    m = _VALUE_END.search(source)
    if not m:
        return len(source)
    end = m.start()
    while end > 0 and source[end - 1] in b" \t":   # "Becker | Head": the value is "Becker"
        end -= 1
    return end


def longest_source(haystack: bytes, end: int, run: bytes, min_match: int = MIN_MATCH) -> tuple[int, int]:
    """(position after the match, match length): the longest end of `run` (at least `min_match`
    bytes) that occurs in haystack[:end], its latest occurrence. (-1, 0) when none does.

        >>> longest_source(b"Tom Becker, Tim Becker", 22, b'"Tim B')
        (17, 5)
        >>> longest_source(b"Tom Becker", 10, b"Xy")
        (-1, 0)
    """
    best = (-1, 0)
    n = min_match
    while n <= min(len(run), MAX_MATCH):
        i = haystack.rfind(run[-n:], 0, end)
        if i < 0:
            break
        best = (i + n, n)
        n += 1
    return best


class _Seq:
    """One sequence's text and its own grammar state, advanced byte by byte."""

    def __init__(self, prompt_text: bytes, shadow: "GrammarState | None"):
        self.text = bytearray(prompt_text)   # prompt + output: where values are copied from
        self.n_prompt = len(prompt_text)
        self.shadow = shadow
        self.run_start = len(self.text)      # the free run: text[run_start:]
        self.constrained = False             # the grammar forced a byte yet


class GrammarCopyDrafter(Drafter):
    """Copies prompt text into a grammar's free text, closed by its forced text (module docstring).

    hold: where the empty draft holds the chain's copying members (`Draft.hold`): "start" (a
    value's first bytes, the default), "always" (also where no source is found) or "never";
    scripts/replay_structured.py compares them (--set hold=...)."""

    name = "grammar-copy"
    sizes_by_match = True
    # its values end where the grammar's forced text begins; a budget fresh for each engine
    # stalled a first record whose first copy missed (85 steps for 96 tokens in a CI run)
    bounded_risk = False

    def __init__(self, target: "Model", *, min_match: int = MIN_MATCH, max_copy: int = MAX_COPY,
                 hold: str = "start"):
        self.target, self.min_match, self.max_copy, self.hold = target, min_match, max_copy, hold
        self._grammars: Mapping[int, "GrammarState"] = {}
        self._seqs: dict[int, _Seq] = {}
        self.layout = Layout()

    def bind_grammars(self, grammars: Mapping[int, "GrammarState"]) -> None:
        self._grammars = grammars

    def begin(self, seq_id: int, prompt_tokens: Sequence[int], rng: np.random.Generator | None = None) -> None:
        self.end(seq_id)
        state = self._grammars.get(seq_id)
        if state is None:
            return
        text = b"".join(self.target.piece(int(t)) for t in prompt_tokens)
        self._seqs[seq_id] = _Seq(text, state.clone())

    def accepted(self, seq_id: int, n_accepted: int, new_tokens: Sequence[int], is_other: bool = False) -> None:
        s = self._seqs.get(seq_id)
        if s is None:
            return
        vocab = vocab_of(self.target)
        for t in new_tokens:
            for b in self.target.piece(int(t)):
                if s.shadow is not None:
                    forced = self._forced(s.shadow, vocab, b)
                    try:
                        s.shadow.accept(vocab.tok_of[b])
                    except (KeyError, ValueError):   # no token for the byte, or a grammar that
                        # spells a special token ([TOOL_CALLS]) bytes cannot: forced bytes are no
                        # longer known, so this sequence is left to the other drafters
                        s.shadow.close()
                        s.shadow = None
                        s.constrained = False
                        forced = False
                    if forced:
                        s.run_start = len(s.text) + 1
                        s.constrained = True
                s.text.append(b)

    @staticmethod
    def _forced(g: "GrammarState", vocab, actual: int) -> bool:
        """Whether the grammar allows only `actual` (and no end of generation) here."""
        ff = getattr(g, "forced_bytes", None)
        if ff is not None:   # llguidance: its forced bytes (its mask admits a forced word's whole token only)
            return ff()[:1] == bytes([actual])
        for b in _FREE_PROBES:
            if b != actual and b in vocab.tok_of and g.allows(vocab.tok_of[b]):
                return False
        allowed = g.allowed_ids(vocab.candidates)
        return len(allowed) == 1 and allowed[0] not in vocab.eog_set

    def end(self, seq_id: int) -> None:
        s = self._seqs.pop(seq_id, None)
        if s is not None:
            if len(s.text) > s.n_prompt:
                self.layout.remember(s.text[s.n_prompt:])
            if s.shadow is not None:
                s.shadow.close()

    def close(self) -> None:
        for seq_id in list(self._seqs):
            self.end(seq_id)

    def propose(self, seq_id: int, history: Sequence[int], n_max: int) -> Draft:
        return self.propose_within(seq_id, history, lambda d, match=None: n_max)

    def propose_within(self, seq_id: int, history: Sequence[int], limit: Callable[..., int]) -> Draft:
        s = self._seqs.get(seq_id)
        state = self._grammars.get(seq_id)
        # a grammar that has forced nothing yet (a lazy tool-call grammar before its trigger, any
        # JSON value) says nothing about where values are: the other drafters' text
        # (a lost shadow leaves `constrained` False for good)
        if s is None or state is None or not s.constrained:
            return Draft([])
        announce(limit, self)
        text = bytes(s.text)
        run = text[s.run_start:]
        if len(run) < self.min_match:   # a value's first bytes: nothing the model chose yet to go by
            return Draft([], hold=self.hold != "never")
        at, n = longest_source(text, len(text) - 1, run, self.min_match)
        if at < 0:
            return Draft([], hold=self.hold == "always")
        k = limit(self, n)
        if k <= 0:
            return Draft([], hold=self.hold == "always")
        tokens = self._draft(state, s, text[at:at + self.max_copy])
        return Draft(tokens[:k], source=self.name, match=n) if tokens else Draft([])

    def _draft(self, state: "GrammarState", s: _Seq, source: bytes) -> list[int]:
        """The source's tokens the grammar allows; where it refuses one, the closing byte and
        the forced text after it."""
        target, vocab = self.target, vocab_of(self.target)
        end = value_end(source)
        toks = spell(target, source[:end], None, [], "keep")
        if not toks:
            return []
        g = state.clone()
        try:
            n = g.accept_all(toks)
            if n == len(toks) and end == len(source):   # copied as far as we look: its last token may be cut
                return toks[:-1] if len(source) >= self.max_copy else toks
            copied = b"".join(target.piece(t) for t in toks[:n])
            seen = self.layout.before(s.text[s.n_prompt:]) + copied
            closer, data, eog, after = self._close(g, vocab, seen, self.layout.tight_end)
            if closer is None:
                return toks[:n]
            return spell(target, copied + bytes([closer]) + data, eog, after)
        finally:
            g.close()

    @staticmethod
    def _close(g: "GrammarState", vocab, seen: bytes, tight_end: bool):
        """(closing byte, forced text after it, EOG, bytes allowed after it): of the punctuation the
        grammar allows here, the byte after which it forces the most text. (None, ...) if none
        forces any."""
        best = (None, b"", None, [])
        for t in g.allowed_ids(vocab.candidates):
            b = vocab.byte_of.get(t)
            if b is None or chr(b).isalnum() or b in WS:
                continue
            h = g.clone()
            try:
                h.accept(t)
                data, eog, after = forced_text(h, vocab, 64, seen + bytes([b]), tight_end=tight_end)
            finally:
                h.close()
            if (data or eog is not None) and len(data) + (eog is not None) > len(best[1]) + (best[2] is not None):
                best = (b, data, eog, after)
        return best
