"""`grammar`: draft the text the grammar forces (SGLang's "jump-forward", made lossless).

Where a sequence's grammar admits only one continuation for some characters (a JSON schema's keys
and punctuation, an enum's tail once its start is unique, `true`/`false`/`null` once started),
those characters are proposed as a draft, in the target's own tokenization. SGLang appends such
text without asking the model; here the target verifies it like any draft, so the output is what
plain decoding under the grammar gives even where the model would have tokenized it differently.

How the forced text is found: from a clone of the sequence's live grammar state (the engine's
`grammars[seq_id]`, never advanced here), one probe per byte asks which of a small candidate set
the grammar allows: one token per single byte (printable ASCII, whitespace, and the byte tokens a
vocabulary has for the rest), and the end-of-generation tokens. Exactly one byte allowed, and no
EOG: that byte is forced; the clone accepts its token and the next byte is probed. Optional
whitespace (llama.cpp's bounded `space` rule after every `:` and `,` of a schema) allows a blank
and another byte; the drafter then does what this output did after the same text before
(a space after each `:`), and stops where the output has no such place yet.

The forced text is tokenized by the target's tokenizer. Its last token may be one the model would
merge with the free text that follows (`"` + `:` after a key is `":` in SmolLM2); `tail="check"`
drops it when longer tokens continue it with a quarter or more of the bytes the grammar allows
next, so ` "` before a free string value stays (only ` "+`, ` "$`, ... continue it). Replayed on
8 SmolLM2 F16 extraction answers (443 tokens): "check" drafted 157 tokens and 155 were accepted
(288 verify steps), "keep" 169 / 155 (288), "drop" 121 / 121 (322); without the whitespace
guess 61 / 61 (382).

Where it sits in a chain: first (options.SPEC_TYPES), and the first non-empty draft wins as in
llama.cpp. Forced text then the copy drafters continuing after it would need them to look up a
history that is not the sequence's yet (prompt-lookup and suffix index the history as it grows);
replayed, grammar-first drafted fewer rejected tokens than grammar-last for about the same steps.

Cost: a clone, one apply over ~250 candidate tokens per probed byte (~40 us on SmolLM2) and an
accept per forced byte; per-vocabulary tables are made once, at the first grammar draft.
Sequences without a grammar cost a dictionary lookup and are not counted as calls.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import numpy as np

from llamaspec.speculative.drafters.base import Draft, Drafter, announce
from llamaspec.speculative.match_controller import CopyEvidence

if TYPE_CHECKING:
    from llamaspec.runtime.grammar import GrammarState
    from llamaspec.runtime.llama import Model

__all__ = ["GrammarJumpDrafter", "Layout", "forced_text", "spell"]

#: bytes of forced text looked at per draft at most (a long key and its punctuation fit)
MAX_BYTES = 96
#: how likely the target takes each token of the forced text, for pricing its drafts: forced text
#: is near certain (tests/test_grammar_drafter.py: >= 0.8 of it taken, the misses a last token the
#: model merged with the free text after it), so on a steep verify curve (SmolLM2 on 1 core: t(2) =
#: 2.4 t(1)) a forced stretch of 2+ tokens is drafted where a draft of unknown acceptance is not
FORCED_P = 0.95
#: earlier places in the output looked at for an optional whitespace decision
MAX_LOOKBACK = 16
#: the tail token is dropped ("check") when longer tokens continue it with at least this share of
#: the bytes the grammar allows next: `name"` before ' ' or ':' (`":` is a token: dropped), not
#: ` "` before a free string (` "$`, ` "+` are tokens, but few of the bytes a string may start with)
TAIL_SHARE = 0.25
WS = frozenset(b" \t\n\r")
#: bytes of the latest finished output kept for the next one's whitespace choices
LAYOUT_BYTES = 1024


class _Vocab:
    """What the drafter needs to know about one vocabulary, made once: a token per single byte,
    the EOG tokens, and which single-token texts a longer token extends (for the tail check).
    Kept per model file (gguf/file_memo.py): made from every token's text, 0.2 s on SmolLM2's 49k
    tokens and 0.6 s on Qwen2.5's 151k, ~10 % of a short structured answer; read back in ~30 ms."""

    def __init__(self, model: "Model"):
        path = getattr(model, "path", None)
        if path is None:
            tok_of, eog, ext = _tables(model)
        else:
            import llama_cpp

            from llamaspec.gguf.file_memo import memo

            # llama.cpp's version too: it renders the token texts
            tok_of, eog, ext = memo(f"grammar-vocab {llama_cpp.__version__}", [path], lambda: _tables(model))
        self.tok_of = tok_of
        self.byte_of = {t: b for b, t in tok_of.items()}
        self.eog = eog
        self.eog_set = frozenset(self.eog)
        self.eos = model.eos if model.eos in self.eog_set else (self.eog[0] if self.eog else -1)
        self.candidates = np.array(sorted(tok_of.values()) + self.eog, dtype=np.int32)
        self.extends = ext


def _tables(model: "Model") -> tuple[dict[int, int], list[int], dict[bytes, set[int]]]:
    """(byte -> its token, the EOG tokens, token text -> the bytes longer tokens continue it with)."""
    tok_of: dict[int, int] = {}
    # printable ASCII and whitespace: the tokenizer's own token for the character first
    for c in list(range(32, 127)) + [9, 10, 13]:
        toks = model.tokenize(chr(c), add_special=False, parse_special=False)
        if len(toks) == 1 and model.piece(toks[0]) == bytes([c]):
            tok_of[c] = toks[0]
    pieces = [model.piece(t) for t in range(model.n_vocab)]
    for t, p in enumerate(pieces):   # the other bytes (UTF-8 lead and continuation bytes)
        if len(p) == 1 and p[0] not in tok_of:
            tok_of[p[0]] = t
    eog = [t for t in range(model.n_vocab) if model.is_eog(t)]
    piece_set = {p for p in pieces if p}
    ext: dict[bytes, set[int]] = {}
    for p in piece_set:
        for i in range(1, len(p)):
            if p[:i] in piece_set:
                ext.setdefault(p[:i], set()).add(p[i])
    return tok_of, eog, ext


_VOCABS: "weakref.WeakKeyDictionary[Model, _Vocab]" = weakref.WeakKeyDictionary()


def vocab_of(model: "Model") -> _Vocab:
    v = _VOCABS.get(model)
    if v is None:
        v = _VOCABS[model] = _Vocab(model)
    return v


def _valid_utf8_prefix(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        return data[:e.start].decode("utf-8")


def _whitespace_choice(seen: bytes, allowed: list[int]) -> int | None:
    """The byte to take where the grammar allows whitespace and at most one other byte: the one
    that followed the same context (the last 4, 2, then 1 bytes) at its latest earlier occurrence
    in `seen` (the output so far, forced text included) where what followed is allowed here.
    None when the grammar allows more than that, or the output has no such place yet.

        >>> _whitespace_choice(b'{"a": "x", "b":', [ord(" "), ord('"')])    # ': ' before
        32
        >>> _whitespace_choice(b'{"a":"x","b":', [ord(" "), ord('"')])      # ':"' before
        34
        >>> _whitespace_choice(b'{', [ord(" "), ord('"')]) is None          # nothing seen yet
        True
    """
    if sum(1 for b in allowed if b not in WS) > 1:
        return None
    if not seen:
        return None
    ok = set(allowed)
    # after a letter or digit only a whole literal's end says something (`true` then `}`): a
    # shorter context matches inside any word
    for n in ((4,) if chr(seen[-1]).isalnum() else (4, 2, 1)):
        if len(seen) <= n:
            continue
        key, end = seen[-n:], len(seen) - 1
        for _ in range(MAX_LOOKBACK):
            i = seen.rfind(key, 0, end)   # an occurrence ending before the last byte
            if i < 0:
                break
            if seen[i + n] in ok:
                return seen[i + n]
            end = i + n - 1
    return _closer_layout(seen, allowed)


_CLOSERS = b",}]"


def _closer_layout(seen: bytes, allowed: list[int]) -> int | None:
    """The closer (`,` `}` `]`) where it is the one non-whitespace byte allowed, when this output
    never wrote whitespace before a closer and did write a closer (`"paid": true` then `}`, as
    `",` before), nor a blank after an opener for `}` `]` (`{ "a": 1 }`). None otherwise.

        >>> _closer_layout(b'{"a": "x", "b": true', [ord(" "), ord("}")]) == ord("}")
        True
        >>> _closer_layout(b'{\\n  "a": "x"\\n}, true', [ord(" "), ord("}")]) is None
        True
        >>> _closer_layout(b'{ "a": "x", "b": true', [ord(" "), ord("}")]) is None
        True
    """
    others = [b for b in allowed if b not in WS]
    if len(others) != 1 or others[0] not in _CLOSERS:
        return None
    loose = sum(seen.count(bytes([w, c])) for w in WS for c in _CLOSERS)
    tight = sum(seen.count(bytes([c])) for c in _CLOSERS) - loose
    # `{ "name": ...` opens with a blank: it closes with one (` }`)
    padded = others[0] in b"}]" and any(seen.count(bytes([o, w])) for o in b"{[" for w in WS)
    return others[0] if tight and not loose and not padded else None


def forced_text(state: "GrammarState", vocab: _Vocab, max_bytes: int, seen: bytes = b"",
                guess_whitespace: bool = True, tight_end: bool = False) -> tuple[bytes, int | None, list[int]]:
    """(forced bytes, EOG token if the grammar then allows only end of generation, bytes it
    allows where the forced text stops), at most `max_bytes` of it. Works on a clone of `state`.
    tight_end: where the grammar allows the end or trailing whitespace (a schema's root ends with
    an optional space), guess the end (the latest output ended so)."""
    g = state.clone()
    out = bytearray()
    allowed_bytes: list[int] = []
    ff = getattr(g, "forced_bytes", None)   # llguidance's compute_ff_bytes: a forced run at once
    try:
        while len(out) < max_bytes:
            run = ff() if ff is not None else b""
            if run:
                run = run[:max_bytes - len(out)]
                toks = [vocab.tok_of.get(b) for b in run]
                n = toks.index(None) if None in toks else len(toks)
                n = g.accept_all(toks[:n]) if n else 0
                out += run[:n]
                if n < len(run):   # a byte without a token of its own: stop there
                    break
                continue
            allowed = g.allowed_ids(vocab.candidates)
            eog = [t for t in allowed if t in vocab.eog_set]
            allowed_bytes = [vocab.byte_of[t] for t in allowed if t not in vocab.eog_set]
            if eog:
                if not allowed_bytes or (tight_end and guess_whitespace and all(b in WS for b in allowed_bytes)):
                    # the grammar is complete: only the end (or whitespace, guessed away) may follow
                    return bytes(out), (vocab.eos if vocab.eos in eog else eog[0]), []
                break
            if len(allowed_bytes) == 1:
                b = allowed_bytes[0]
            elif guess_whitespace and len(allowed_bytes) > 1:
                b = _whitespace_choice(seen + bytes(out), allowed_bytes)
                if b is None:
                    break
            else:
                break
            g.accept(vocab.tok_of[b])
            out.append(b)
    finally:
        g.close()
    # stopped by the room, not by the grammar: what follows is forced too (no tail to drop)
    return bytes(out), None, [] if len(out) >= max_bytes else allowed_bytes


class Layout:
    """The end of the latest finished output, for the next one's whitespace choices: where this
    output has not chosen yet (its first key: `{"name":` then ' "' or '"'), the choice the latest
    output made at the same place (one model, one style); and whether it ended on its last
    value (`}` then the end) or wrote whitespace first."""

    def __init__(self):
        self.last = b""

    def remember(self, output: bytes) -> None:
        self.last = bytes(output[-LAYOUT_BYTES:])

    def before(self, output: bytes) -> bytes:
        return self.last + bytes(output)

    @property
    def tight_end(self) -> bool:
        return not self.last or self.last[-1] not in WS


class GrammarJumpDrafter(Drafter):
    """Drafts the text a sequence's grammar forces (see the module docstring).

    tail: "check" (drop the last token where a longer token could continue it into what the
    grammar allows next), "keep" or "drop" (always drop it when free text follows).
    guess_whitespace: decide optional whitespace from this output's earlier choices.
    """

    name = "grammar"
    # its drafts carry their own continuation probabilities (FORCED_P each): the match
    # controller sizes them by expected gain on this model's curve; forced text needs no budget
    sizes_by_match = True
    bounded_risk = False

    def __init__(self, target: "Model", *, tail: str = "check", guess_whitespace: bool = True,
                 max_bytes: int = MAX_BYTES):
        if tail not in ("check", "keep", "drop"):
            raise ValueError(f"tail must be check, keep or drop (got {tail!r})")
        self.target, self.tail, self.guess_whitespace, self.max_bytes = target, tail, guess_whitespace, max_bytes
        self._grammars: Mapping[int, "GrammarState"] = {}
        self._seen: dict[int, bytearray] = {}
        self.layout = Layout()

    def bind_grammars(self, grammars: Mapping[int, "GrammarState"]) -> None:
        self._grammars = grammars

    def begin(self, seq_id: int, prompt_tokens: Sequence[int], rng: np.random.Generator | None = None) -> None:
        self._seen[seq_id] = bytearray()

    def accepted(self, seq_id: int, n_accepted: int, new_tokens: Sequence[int], is_other: bool = False) -> None:
        seen = self._seen.get(seq_id)
        if seen is not None:
            for t in new_tokens:
                seen += self.target.piece(int(t))

    def end(self, seq_id: int) -> None:
        seen = self._seen.pop(seq_id, None)
        if seen:
            self.layout.remember(seen)

    def propose(self, seq_id: int, history: Sequence[int], n_max: int) -> Draft:
        return self.propose_within(seq_id, history, lambda d, match=None: n_max)

    def opening(self, seq_id: int, prompt: Sequence[int], n_max: int) -> Draft:
        # the grammar's first forced text (`{` and, as the latest output went on, `"name": "`)
        return self.propose(seq_id, prompt, n_max)

    def propose_within(self, seq_id: int, history: Sequence[int], limit: Callable[..., int]) -> Draft:
        state = self._grammars.get(seq_id)
        if state is None:   # no grammar on this sequence: not asked, not timed
            return Draft([])
        announce(limit, self)
        seen = self.layout.before(self._seen.get(seq_id, b""))
        # the forced text first (at most max_bytes: microseconds), then its length is priced
        data, eog, allowed_after = forced_text(state, vocab_of(self.target), self.max_bytes, seen,
                                               self.guess_whitespace, tight_end=self.layout.tight_end)
        if not data and eog is None:
            return Draft([])
        tokens = self._tokens(data, eog, allowed_after) if data else [eog]   # only the end may follow
        if not tokens:
            return Draft([])
        k = limit(self, CopyEvidence(len(tokens), [FORCED_P] * len(tokens)))
        return Draft(tokens[:k], source=self.name) if k > 0 else Draft([])

    def _tokens(self, data: bytes, eog: int | None, allowed_after: list[int]) -> list[int]:
        return spell(self.target, data, eog, allowed_after, self.tail)


def spell(target: "Model", data: bytes, eog: int | None, allowed_after: list[int], tail: str = "check") -> list[int]:
    """Forced bytes in the target's tokenization: the tokens whose texts spell a prefix of `data`,
    the last one dropped per `tail` where free text follows (`allowed_after`: the bytes the grammar
    allows there); the EOG token appended when the grammar ends there."""
    text = _valid_utf8_prefix(data)
    toks = target.tokenize(text, add_special=False, parse_special=False)
    keep, pos = [], 0
    for t in toks:   # a tokenizer that adds a leading space (SentencePiece) spells other bytes
        p = target.piece(t)
        if not p or data[pos:pos + len(p)] != p:
            break
        keep.append(t)
        pos += len(p)
    whole = pos == len(data)
    if whole and eog is not None:
        return keep + [eog]
    if keep and whole and allowed_after and tail != "keep":
        if tail == "drop":
            keep.pop()
        else:
            nxt = vocab_of(target).extends.get(target.piece(keep[-1]), ())
            if sum(b in nxt for b in allowed_after) >= TAIL_SHARE * len(allowed_after):
                keep.pop()
    return keep
