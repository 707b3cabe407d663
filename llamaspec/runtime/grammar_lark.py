"""GBNF (llama.cpp's grammar format) as llguidance's Lark, with llama.cpp's meaning kept.

llguidance's own `gbnf_to_lark` turns every rule made of terminals into one lexeme, and
llguidance's lexer is greedy: `root ::= x "a"` with `x ::= [a-z]+` then refuses "zza" (the lexeme
`x` takes the "a"), and `w w` with `w ::= [a-z]+` refuses "ab" -- strings llama.cpp accepts. Here
every rule stays a parser rule and every lexeme is one character (a literal's characters one by
one, a character class as one character), so no lexeme can grow into the next one and the
language is llama.cpp's. The price is the whole-vocabulary mask (~0.4-1.3 ms on 49k tokens
instead of ~25 us); one-token checks stay ~1 us, and llama.cpp's own engine takes ~5-18 ms a mask.

The GBNF text is parsed by llguidance's parser (`GrammarParser`), its literals and classes read
here. Anything it cannot read (token references, odd escapes) is a GbnfToLarkError: the caller
then leaves the grammar to llama.cpp's engine. Recursion is per ( ) nesting level, bounded by
grammar_bounds.MAX_GBNF_DEPTH before this runs; a RecursionError is the caller's to catch.
"""

from __future__ import annotations

import re

from llguidance.gbnf_to_lark import (AlternativeNode, GbnfToLarkError, GrammarParser, LiteralNode, RegexNode,
                                     RepetitionNode, RuleRefNode, SequenceNode)

__all__ = ["gbnf_to_lark", "GbnfToLarkError"]

_SIMPLE = {"n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\", "[": "[", "]": "]"}


def _decode(token: str) -> str:
    """One character as GrammarParser._parse_char returns it (raw, or an escape) as itself."""
    if len(token) == 1:
        return token
    kind, rest = token[1], token[2:]
    if kind in _SIMPLE and not rest:
        return _SIMPLE[kind]
    if kind in "xuU":   # (the parser strips the leading zeros of \u and \U: the value is kept)
        return chr(int(rest or "0", 16))
    raise ValueError(f"unknown escape {token!r}")


def _class_char(c: str) -> str:
    return c if c.isascii() and c.isalnum() else f"\\x{{{ord(c):x}}}"


def _literal_char(c: str) -> str:
    if c in '"\\':
        return "\\" + c
    return c if c.isprintable() and c != "\x7f" else f"\\u{ord(c):04x}" if ord(c) < 0x10000 else c


class _CharParser(GrammarParser):
    """llguidance's GBNF parser, with literals split into one lexeme per character and character
    classes read as llama.cpp reads them (`^` negates, `a-z` ranges, a `-` before `]` is itself)."""

    def _parse_literal(self, pos):
        if pos.current() != '"':
            raise GbnfToLarkError(pos, "Expected '\"'")
        pos = pos.advance()
        chars = []
        while True:
            if pos.current() == '"':
                pos = pos.advance()
                break
            c, pos = self._parse_char(pos)
            chars.append(LiteralNode(_literal_char(_decode(c))))
        if len(chars) == 1:
            return chars[0], pos
        return SequenceNode(chars), pos   # ("" is an empty sequence: the empty string)

    def _parse_char_class(self, pos):
        if pos.current() != "[":
            raise GbnfToLarkError(pos, "Expected '['")
        pos = pos.advance()
        out = "["
        if pos.current() == "^":
            out += "^"
            pos = pos.advance()
        n = 0
        while pos.current() != "]":
            if not pos.current():
                raise GbnfToLarkError(pos, "Unexpected end of input")
            c, pos = self._parse_char(pos)
            lo = _decode(c)
            if pos.current() == "-" and pos.peek(2)[1:] not in ("]", ""):
                pos = pos.advance()
                c, pos = self._parse_char(pos)
                out += f"{_class_char(lo)}-{_class_char(_decode(c))}"
            else:
                out += _class_char(lo)
            n += 1
        if not n:
            raise GbnfToLarkError(pos, "empty character class")
        return RegexNode(out + "]"), pos.advance()


def _rewrite(node, names: dict[str, str]):
    """The node with rule references renamed and `.` as any character (newline too, as in
    llama.cpp; a regex `.` stops at a newline)."""
    if isinstance(node, RuleRefNode):
        if node.name not in names:
            raise ValueError(f"Undefined rule identifier '{node.name}'")
        return RuleRefNode(names[node.name])
    if isinstance(node, RegexNode):
        return RegexNode("(?s:.)") if node.rx == "." else node
    if isinstance(node, SequenceNode):
        return SequenceNode([_rewrite(n, names) for n in node.nodes])
    if isinstance(node, AlternativeNode):
        return AlternativeNode([_rewrite(n, names) for n in node.alternatives])
    if isinstance(node, RepetitionNode):
        return RepetitionNode(_rewrite(node.node, names), node.min_times, node.max_times)
    return node


_NAME = re.compile(r"[^a-z0-9_]+")


def gbnf_to_lark(text: str, root: str = "root") -> str:
    """The Lark text of GBNF `text` whose start is rule `root`. Raises GbnfToLarkError or
    ValueError for what it cannot read (RecursionError past Python's stack)."""
    rules = _CharParser().parse(text)
    if root not in rules:
        raise ValueError(f"grammar does not contain a '{root}' symbol")
    names = {name: "start" if name == root else f"r{i}_{_NAME.sub('_', name.lower())[:40]}"
             for i, name in enumerate(rules)}
    lines = ["%llguidance {}"]
    for name, rule in rules.items():
        body = _rewrite(rule.alternatives, names).simplify()
        lines.append(f"{names[name]}: {body.top_str() if isinstance(body, AlternativeNode) else body}")
    return "\n".join(lines) + "\n"
