"""Text <-> tokens for drafting with a model of another vocabulary (drafters/translated.py).

Pure functions on strings and bytes; the tokenizers come in as callables, so the rules can be
tested without a model:

  replace_with_offsets  `--spec-replace` pairs applied in one pass (longest match first), with
                        the (result, source) offsets where each unchanged run starts and ends
  complete_utf8_len     the length of the longest prefix of bytes that is whole UTF-8 characters
  tokenize_tail         re-tokenize only the tail of a growing text: which draft tokens to keep,
                        and the new tokens with the text offsets where each one ends
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


def _char_offsets(text: str) -> list[int]:
    """Byte offset of each character start in text's UTF-8 (plus the end)."""
    out, b = [0], 0
    for ch in text:
        b += len(ch.encode("utf-8"))
        out.append(b)
    return out


def tokenize_tail(text: str, ends: Sequence[int | None], keep_tail: int, floor: int,
                  tokenize: Tokenize, piece: Piece, pairs: Sequence[tuple[str, str]] = ()
                  ) -> tuple[int, list[int], list[int | None]]:
    """Tokenize the end of a growing `text` for the draft, re-using its earlier tokens.

    ends: for each draft token already made, the offset in `text` (characters) where its text
    ends, or None where that is not a clean place to restart (inside a replaced string, or a
    round trip that did not give the text back). keep_tail: how many of the last tokens are
    re-tokenized (a word the new text continues merges differently); floor: never keep fewer
    tokens than this (tokens the caller cannot re-evaluate). Returns (k, new tokens, their ends):
    the first k tokens stay, the new ones follow them and cover text[ends[k - 1]:].

        >>> toks = {"ab": 1, "a": 2, "b": 3, "c": 4, "abc": 5}
        >>> tok = lambda s: [toks[s]] if s in toks else [toks[c] for c in s]
        >>> rev = {v: k.encode() for k, v in toks.items()}
        >>> tokenize_tail("abc", [2], 1, 0, tok, rev.get)      # "ab" was one token, "abc" is one
        (0, [5], [3])
    """
    floor = min(floor, len(ends))
    k = j = max(floor, len(ends) - keep_tail)
    while j > floor and ends[j - 1] is None:
        j -= 1
    if j > 0 and ends[j - 1] is None:   # no clean place back to the floor: the first one after
        j = k
        while j < len(ends) and ends[j - 1] is None:
            j += 1
    k = j
    start = ends[k - 1] if k > 0 else 0
    assert start is not None  # the last token's end is always known
    window = text[start:]
    if not window:
        return k, [], []
    dtext, anchors = replace_with_offsets(window, pairs)
    new = tokenize(dtext)
    pieces = [piece(t) for t in new]
    joined = b"".join(pieces)
    want = dtext.encode("utf-8")
    chars = _char_offsets(dtext)
    out_ends: list[int | None] = []
    if joined == want:
        b = 0
        for p in pieces:
            b += len(p)
            j = bisect_right(chars, b) - 1
            src = source_offset(anchors, j) if chars[j] == b else None
            out_ends.append(None if src is None else start + src)
    else:   # the tokenizer did not give the text back (a space prefix, normalization): only the end is sure
        out_ends = [None] * len(new)
    if out_ends:
        out_ends[-1] = len(text)
    return k, new, out_ends


def draft_to_target(context: bytes, context_tokens: Sequence[int], drafted: str, tokenize: Tokenize,
                    piece: Piece, is_stable: Callable[[int], bool] = lambda t: False) -> list[int]:
    """Target tokens for `drafted`, the text the draft wrote after the target's text.

    context: the text of the target's last tokens (`context_tokens`). The drafted text is
    tokenized after it with the target's tokenizer; the tokens kept are those after the place
    where the re-tokenized context ends exactly and agrees with `context_tokens`. When the
    drafted text merges into the context's last token (or the target's own split differs), the
    drafted text is tokenized alone instead: the target's text ends there, so the draft must
    start there. The last token is dropped unless `is_stable` says it cannot grow (an end of
    generation): the drafted text may stop inside a word the target writes as one longer token.

        >>> vocab = {"he": 1, "llo": 2, " wor": 3, "ld": 4, " world": 5, "h": 6, "e": 7}
        >>> def tok(s):
        ...     out = []
        ...     while s:
        ...         w = max((w for w in vocab if s.startswith(w)), key=len)
        ...         out.append(vocab[w]); s = s[len(w):]
        ...     return out
        >>> rev = {v: k.encode() for k, v in vocab.items()}
        >>> draft_to_target(b"hello", [1, 2], " world wor", tok, rev.get)
        [5]
    """
    if not drafted:
        return []
    toks = tokenize(context.decode("utf-8", errors="replace") + drafted) if context else []
    cut, b = None, 0
    for i, t in enumerate(toks):
        if b == len(context):
            cut = i
            break
        b += len(piece(t))
    if cut and context_tokens and toks[cut - 1] == context_tokens[-1]:
        out = list(toks[cut:])   # the boundary falls where the target's own last token ends
    else:
        out = tokenize(drafted)
    if out and not is_stable(out[-1]):
        out.pop()
    return out
