"""Reading JSON that a model may still be writing: where a value ends (or that the text ends
first), an object's members and an array's items so far, a string's decoded prefix.

Tool-call parsers run on every streamed piece, so this only finds structure (regexes jump over
strings); a complete value is then checked by json.loads. `Malformed` means the text cannot
become JSON whatever follows.

    >>> members('{"name": "f", "arguments": {"a": 1', 0)
    ([('name', 9, 12), ('arguments', 27, None)], None)
    >>> value_end('[1, "]"]', 0), value_end('{"a": [1', 0)
    (8, None)
"""

from __future__ import annotations

import json
import re

# (unrolled: a run of plain characters at a time, not one alternation per character)
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_STRING_BODY = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*', re.S)
_STRUCT = re.compile(r'["{}\[\]]')
_WS = re.compile(r"[ \t\r\n]*")
_SCALAR_START = re.compile(r"[-0-9tfn]")
_SCALAR_END = re.compile(r"[,}\]\s]")
# at the end of a string's text: a \\u escape not finished, or a high surrogate whose low half
# has not come (searched in the last characters only: this runs on every streamed piece)
_U_TAIL = re.compile(r"\\u(?:[0-9a-fA-F]{0,3}|[dD][89abAB][0-9a-fA-F]{2})$")


class Malformed(ValueError):
    """Text that no continuation makes JSON."""


def skip_ws(text: str, i: int) -> int:
    return _WS.match(text, i).end()


def value_end(text: str, i: int, final: bool = False) -> int | None:
    """End (exclusive) of the JSON value starting at text[i], or None when the text ends inside
    it. final: the text is complete, so a bare scalar runs to its end."""
    if i >= len(text):
        return None
    c = text[i]
    if c == '"':
        m = _STRING.match(text, i)
        return m.end() if m else None
    if c in "{[":
        closers: list[str] = []
        j = i
        while True:
            m = _STRUCT.search(text, j)
            if not m:
                return None
            ch, k = m.group(), m.start()
            if ch == '"':
                s = _STRING.match(text, k)
                if not s:
                    return None
                j = s.end()
                continue
            if ch in "{[":
                closers.append("}" if ch == "{" else "]")
            elif not closers or closers.pop() != ch:
                raise Malformed(f"unexpected {ch!r}")
            elif not closers:
                return k + 1
            j = k + 1
    if not _SCALAR_START.match(c):
        raise Malformed(f"unexpected {c!r}")
    m = _SCALAR_END.search(text, i)
    if m:
        return m.start()
    return len(text) if final else None   # a number may go on


def members(text: str, i: int, final: bool = False) -> tuple[list[tuple[str, int, int | None]], int | None]:
    """The members of the object opening at text[i] ('{') so far: (key, value start, value end or
    None), and the object's end (exclusive) or None while it is open. A member whose key is not
    finished is left out; one whose value has not started has start == len(text)."""
    out: list[tuple[str, int, int | None]] = []
    j = skip_ws(text, i + 1)
    if text.startswith("}", j):
        return out, j + 1
    while True:
        if j >= len(text):
            return out, None
        if text[j] != '"':
            raise Malformed("expected a key")
        m = _STRING.match(text, j)
        if not m:
            return out, None
        key = json.loads(m.group(), strict=False)
        j = skip_ws(text, m.end())
        if j >= len(text):
            return out, None
        if text[j] != ":":
            raise Malformed("expected ':'")
        j = skip_ws(text, j + 1)
        end = value_end(text, j, final)
        out.append((key, j, end))
        if end is None:
            return out, None
        j = skip_ws(text, end)
        if j >= len(text):
            return out, None
        if text[j] == "}":
            return out, j + 1
        if text[j] != ",":
            raise Malformed("expected ',' or '}'")
        j = skip_ws(text, j + 1)


def items(text: str, i: int, final: bool = False) -> tuple[list[tuple[int, int | None]], int | None]:
    """The items of the array opening at text[i] ('['): (start, end or None), and its end or None."""
    out: list[tuple[int, int | None]] = []
    j = skip_ws(text, i + 1)
    if text.startswith("]", j):
        return out, j + 1
    while True:
        if j >= len(text):
            return out, None
        end = value_end(text, j, final)
        out.append((j, end))
        if end is None:
            return out, None
        j = skip_ws(text, end)
        if j >= len(text):
            return out, None
        if text[j] == "]":
            return out, j + 1
        if text[j] != ",":
            raise Malformed("expected ',' or ']'")
        j = skip_ws(text, j + 1)


def string_prefix(text: str, i: int) -> str:
    """The decoded characters of the string opening at text[i] ('"') that the text holds so far,
    without an escape still being written (nor half a surrogate pair)."""
    body = _STRING_BODY.match(text, i + 1).group()
    while True:
        if (len(body) - len(body.rstrip("\\"))) % 2:   # a backslash whose escape has not come
            body = body[:-1]
            continue
        m = _U_TAIL.search(body, max(0, len(body) - 8))
        k = m.start() if m else 0
        while m and k > 0 and body[k - 1] == "\\":
            k -= 1
        if not m or (m.start() - k) % 2:   # (an escaped backslash before the 'u': plain text)
            return json.loads('"' + body + '"', strict=False)
        body = body[:m.start()]


def loads(text: str, start: int, end: int):
    """json.loads of text[start:end]; Malformed when it is not JSON."""
    try:
        return json.loads(text[start:end], strict=False)
    except ValueError as e:
        raise Malformed(str(e)) from None
