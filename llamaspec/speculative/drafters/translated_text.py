"""Text <-> tokens for drafting with a model of another vocabulary (drafters/translated.py).

Pure functions on strings and bytes; the tokenizers come in as callables, so the rules can be
tested without a model:

  replace_with_offsets  `--spec-replace` pairs applied in one pass (longest match first), with
                        the (result, source) offsets where each unchanged run starts and ends
  complete_utf8_len     the length of the longest prefix of bytes that is whole UTF-8 characters
  Encoder               a tokenizer for text in the middle of a document: SentencePiece models that
                        add a leading space (add_space_prefix: Llama 2, Mistral <= v0.3,
                        TinyLlama) tokenize a sentinel before the text and drop its tokens, and
                        every token gets the byte offset where it ends (align_ends)
  tokenize_tail         re-tokenize only the tail of a growing text, from a token end that is a
                        character boundary: which draft tokens to keep, and the new tokens with
                        the text offsets where each one ends
  draft_to_target       drafted text -> target tokens: tokenized appended to the target's own
                        text tail, keeping the tokens fully inside the drafted region that are
                        consistent with the tokens the target already has
"""

from __future__ import annotations

import re
from bisect import bisect_right
from typing import Callable, Sequence

Tokenize = Callable[[str], list[int]]
Piece = Callable[[int], bytes]


def _pattern(pairs: Sequence[tuple[str, str]]) -> re.Pattern | None:
    keys = sorted({a for a, _ in pairs if a}, key=len, reverse=True)
    return re.compile("|".join(re.escape(k) for k in keys)) if keys else None


def replace_with_offsets(text: str, pairs: Sequence[tuple[str, str]]) -> tuple[str, list[tuple[int, int]]]:
    """`text` with every pair's first string replaced by its second, in one pass (a replacement is
    never replaced again; at one place the longest match wins). Also returns the anchors
    (result offset, source offset) of the unchanged runs: offsets inside a run map linearly, an
    offset inside a replacement has no source offset.

        >>> replace_with_offsets("<a>hi<b>", [("<a>", "[A]"), ("<b>", "")])
        ('[A]hi', [(0, 0), (0, 0), (3, 3), (5, 5), (5, 8), (5, 8)])
    """
    pat = _pattern(pairs)
    if pat is None:
        return text, [(0, 0), (len(text), len(text))]
    table = dict(pairs)
    out: list[str] = []
    anchors: list[tuple[int, int]] = [(0, 0)]
    n = src = 0
    for m in pat.finditer(text):
        out.append(text[src:m.start()])
        n += m.start() - src
        anchors.append((n, m.start()))     # end of the unchanged run before the match
        rep = table[m.group(0)]
        out.append(rep)
        n += len(rep)
        src = m.end()
        anchors.append((n, src))           # start of the next unchanged run
    out.append(text[src:])
    n += len(text) - src
    anchors.append((n, len(text)))
    return "".join(out), anchors


def source_offset(anchors: Sequence[tuple[int, int]], offset: int) -> int | None:
    """The source offset of a result offset (replace_with_offsets), None inside a replacement."""
    best = None
    for i in range(0, len(anchors) - 1, 2):   # (start, end) of each unchanged run
        (r0, s0), (r1, _) = anchors[i], anchors[i + 1]
        if r0 <= offset <= r1:
            best = s0 + offset - r0            # prefer the last run: an empty replacement ends here
    return best


def reverse_pairs(pairs: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The pairs for the way back (draft text -> target text)."""
    return [(b, a) for a, b in pairs if b]


def complete_utf8_len(data: bytes) -> int:
    """Length of the longest prefix of `data` that ends on a whole UTF-8 character.

        >>> complete_utf8_len("é".encode()[:1]), complete_utf8_len(b"ab"), complete_utf8_len("aé".encode())
        (0, 2, 3)
    """
    n = len(data)
    i = n - 1
    while i >= 0 and i >= n - 4 and (data[i] & 0xC0) == 0x80:   # continuation bytes
        i -= 1
    if i < 0 or data[i] < 0x80:
        return n
    need = 4 if data[i] >= 0xF0 else (3 if data[i] >= 0xE0 else (2 if data[i] >= 0xC0 else 1))
    return n if n - i >= need else i


#: put before a window so the tokenizer's added leading space goes to them (the first that no
#: token crosses is used); newline and these are byte-fallback or lone pieces in SPM vocabularies
SENTINELS = ("\n", "\u00a7", "#")


def align_ends(text: bytes, pieces: Sequence[bytes], prefix: bytes) -> list[int | None] | None:
    """Where each piece ends in `text` (bytes), for a tokenizer that adds `prefix` before a run
    of text (SentencePiece's leading space: at the start and after each special token). None
    when the pieces do not give `text` back; an end that an added prefix follows is None:
    tokenizing again from there would not add it.

        >>> align_ends(b"a<s>b", [b" a", b"<s>", b" b"], b" ")
        [1, None, 5]
    """
    out: list[int | None] = []
    b = 0
    for p in pieces:
        if text.startswith(p, b):
            b += len(p)
        elif prefix and p.startswith(prefix) and text.startswith(p[len(prefix):], b):
            b += len(p) - len(prefix)
            if out:
                out[-1] = None
        else:
            return None
        out.append(b)
    return out if b == len(text) else None


def detect_prefix(tokenize: Tokenize, piece: Piece) -> bytes:
    """What the tokenizer adds before a text (b" " for SentencePiece with add_space_prefix)."""
    probe = b"".join(piece(t) for t in tokenize("a"))
    return probe[:-1] if probe.endswith(b"a") else b""


class Encoder:
    r"""A model's tokenizer for the two places text is tokenized here: the document's start (as a
    prompt is tokenized) and a piece of text that continues other text (a window, a draft).

        >>> sp = {"▁a": 1, "▁": 2, "a": 3, "b": 4, "\n": 5}       # adds "▁" before a text
        >>> def tok(s):
        ...     s, out = "▁" + s.replace(" ", "▁"), []
        ...     while s:
        ...         w = max((w for w in sp if s.startswith(w)), key=len)
        ...         out.append(sp[w]); s = s[len(w):]
        ...     return out
        >>> enc = Encoder(tok, {v: k.replace("▁", " ").encode() for k, v in sp.items()}.get)
        >>> enc.prefix, enc("ab", at_start=True), enc("ab")
        (b' ', ([1, 4], [1, 2]), ([3, 4], [1, 2]))
    """

    def __init__(self, tokenize: Tokenize, piece: Piece, prefix: bytes | None = None):
        self.tokenize, self.piece = tokenize, piece
        self.prefix = detect_prefix(tokenize, piece) if prefix is None else prefix

    def _aligned(self, text: str) -> tuple[list[int], list[int | None] | None]:
        toks = self.tokenize(text)
        return toks, align_ends(text.encode("utf-8"), [self.piece(t) for t in toks], self.prefix)

    def __call__(self, text: str, at_start: bool = False) -> tuple[list[int], list[int | None] | None]:
        """text's tokens, and where each ends in text's UTF-8 (None: not a clean place to start
        again; the whole list None when the tokens do not give the text back)."""
        if at_start or not self.prefix or not text:
            return self._aligned(text)
        for s in SENTINELS:
            toks, ends = self._aligned(s + text)
            n = len(s.encode("utf-8"))
            if ends is not None and n in ends:   # no token crosses the sentinel's end
                i = ends.index(n) + 1
                return toks[i:], [None if e is None else e - n for e in ends[i:]]
        return self._aligned(text)   # every sentinel merged with the text: the added space stays


def _char_offsets(text: str) -> list[int]:
    """Byte offset of each character start in text's UTF-8 (plus the end)."""
    out, b = [0], 0
    for ch in text:
        b += len(ch.encode("utf-8"))
        out.append(b)
    return out


def restart_index(ends: Sequence[int | None], keep_tail: int, floor: int) -> int:
    """How many tokens tokenize_tail keeps: all but the last keep_tail, fewer where a token's end
    is unclear (more when there is none back to the floor), never fewer than floor."""
    floor = min(floor, len(ends))
    k = j = max(floor, len(ends) - keep_tail)
    while j > floor and ends[j - 1] is None:
        j -= 1
    if j > 0 and ends[j - 1] is None:   # no clean place back to the floor: the first one after
        j = k
        while j < len(ends) and ends[j - 1] is None:
            j += 1
    return j


def tokenize_tail(text: str, ends: Sequence[int | None], keep_tail: int, floor: int, encode: Encoder,
                  pairs: Sequence[tuple[str, str]] = ()) -> tuple[int, list[int], list[int | None]]:
    """Tokenize the end of a growing `text` for the draft, re-using its earlier tokens.

    ends: for each draft token already made, the offset in `text` (characters) where its text
    ends, or None where that is not a clean place to restart (inside a character or a replaced
    string, before a space the tokenizer added, or a round trip that did not give the text
    back). keep_tail: how many of the last tokens are re-tokenized (a word the new text
    continues merges differently); floor: never keep fewer tokens than this (tokens the caller
    cannot re-evaluate). Returns (k, new tokens, their ends): the first k tokens stay, the new
    ones follow them and cover text[ends[k - 1]:]. Only that window is tokenized.

        >>> toks = {"ab": 1, "a": 2, "b": 3, "c": 4, "abc": 5}
        >>> tok = lambda s: [toks[s]] if s in toks else [toks[c] for c in s]
        >>> rev = {v: k.encode() for k, v in toks.items()}
        >>> tokenize_tail("abc", [2], 1, 0, Encoder(tok, rev.get, b""))   # "ab" was one token, "abc" is one
        (0, [5], [3])
    """
    k = restart_index(ends, keep_tail, floor)
    start = ends[k - 1] if k > 0 else 0
    assert start is not None  # the last token's end is always known
    window = text[start:]
    if not window:
        return k, [], []
    dtext, anchors = replace_with_offsets(window, pairs)
    new, byte_ends = encode(dtext, at_start=start == 0)
    chars = _char_offsets(dtext)
    out_ends: list[int | None] = [None] * len(new)
    for i, b in enumerate(byte_ends or ()):
        j = bisect_right(chars, b) - 1 if b is not None else 0
        src = source_offset(anchors, j) if b is not None and chars[j] == b else None
        out_ends[i] = None if src is None else start + src
    if out_ends:
        out_ends[-1] = len(text)
    return k, new, out_ends


def draft_to_target(context: bytes, context_tokens: Sequence[int], drafted: str, encode: Encoder,
                    is_stable: Callable[[int], bool] = lambda t: False) -> list[int]:
    """Target tokens for `drafted`, the text the draft wrote after the target's text.

    context: the text of the target's last tokens (`context_tokens`). The drafted text is
    tokenized after it with the target's tokenizer (as text that continues a document: no
    added leading space); the tokens kept are those after the place where the re-tokenized
    context ends exactly and agrees with `context_tokens`. When the drafted text merges into
    the context's last token (or the target's own split differs), the drafted text is
    tokenized alone instead: the target's text ends there, so the draft must start there. The
    last token is dropped unless `is_stable` says it cannot grow (an end of generation): the
    drafted text may stop inside a word the target writes as one longer token.

        >>> vocab = {"he": 1, "llo": 2, " wor": 3, "ld": 4, " world": 5, "h": 6, "e": 7}
        >>> def tok(s):
        ...     out = []
        ...     while s:
        ...         w = max((w for w in vocab if s.startswith(w)), key=len)
        ...         out.append(vocab[w]); s = s[len(w):]
        ...     return out
        >>> rev = {v: k.encode() for k, v in vocab.items()}
        >>> draft_to_target(b"hello", [1, 2], " world wor", Encoder(tok, rev.get, b""))
        [5]
    """
    if not drafted:
        return []
    out = None
    if context and context_tokens:
        ctx_text = context.decode("utf-8", errors="replace")
        n = len(ctx_text.encode("utf-8"))
        toks, ends = encode(ctx_text + drafted)
        if ends is not None and n in ends:
            cut = ends.index(n) + 1
            if toks[cut - 1] == context_tokens[-1]:   # the boundary falls where the target's own last token ends
                out = list(toks[cut:])
    if out is None:
        out = encode(drafted)[0]
    if out and not is_stable(out[-1]):
        out.pop()
    return out
