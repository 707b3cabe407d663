"""JSON schema -> GBNF: llama-cpp-python's converter (its port of llama.cpp's
json_schema_to_grammar.py), run on a private copy of its module with these fixed:

- a `type` list handled before everything else dropped `enum`, `const`, `properties`, `pattern`,
  `items`, ... (`{"type": ["string", "null"], "enum": ["red"]}` allowed any string): such a schema
  is rewritten first into an `anyOf` of one branch per type, each with the keywords that apply to
  its type (`split_types`), `enum` and `const` filtered by type;
- a `$ref` resolved by its last path segment, so `#/$defs/a/$defs/X` and `#/$defs/X` (or a
  property named X) shared one rule: refs get rules of their own, keyed by the whole path;
- a bounded repetition (`maxLength`, `maxItems`, a pattern's `{m,n}`) nested one ( ) per
  repetition, which llama.cpp's parser recurses into (`maxLength` 100000: SIGSEGV): it is GBNF's
  own `x{m,n}` now, as llama.cpp's C++ converter writes it;
- a rule name taken by a different rule searched a free one from 0 each time (quadratic in
  properties that sanitise alike): a counter per name;
- a `pattern`'s `.`, negated classes `[^...]` and literals admitted a raw `"`, `\\` or control
  character inside the JSON string: they are kept inside what a JSON string may hold raw;
- a string `enum` with many values was one flat alternation (llama.cpp's grammar keeps one stack
  per live alternative and de-duplicates them in O(S^2) per token): it is a radix tree of rules.

Also set as llama.cpp's own converter has them: `char` (no raw control characters) and `space`
(line breaks with indentation, as llama-server allows).
"""

from __future__ import annotations

import importlib.util
import json
import re
from typing import Any

JSON_CHAR = r'char ::= [^"\\\x7F\x00-\x1F] | [\\] (["\\/bfnrt] | "u" [0-9a-fA-F]{4})'
JSON_SPACE = r'space ::= | " " | "\n"{1,2} [ \t]{0,20}'
_RULES = ((re.compile(r"^char ::= .*$", re.M), JSON_CHAR), (re.compile(r"^space ::= .*$", re.M), JSON_SPACE))
_INVALID = re.compile(r"[^a-zA-Z0-9-]+")
_NOT_RAW = (0x22, 0x5C)   # '"' and '\\': never raw inside a JSON string (controls neither: < 0x20, 0x7F)


def as_llama_cpp(gbnf: str) -> str:
    for rule, text in _RULES:
        gbnf = rule.sub(lambda m: text, gbnf)
    return gbnf


def _build_repetition(item_rule, min_items, max_items, separator_rule=None, item_rule_is_literal=False):
    """llama.cpp's build_repetition (common/json-schema-to-grammar.cpp): GBNF's x{m,n}."""
    if max_items == 0:
        return ""
    if min_items == 0 and max_items == 1:
        return f"{item_rule}?"
    if not separator_rule:
        if min_items == 1 and max_items is None:
            return f"{item_rule}+"
        if min_items == 0 and max_items is None:
            return f"{item_rule}*"
        return f"{item_rule}{{{min_items},{'' if max_items is None else max_items}}}"
    rest = _build_repetition(f"({separator_rule} {item_rule})", max(min_items - 1, 0),
                             None if max_items is None else max_items - 1)
    result = f"{item_rule} {rest}".rstrip()
    return f"({result})?" if min_items == 0 else result


_MOD = None


def _module():
    """A private copy of llama_cpp.llama_grammar with the fixed module-level pieces."""
    global _MOD
    if _MOD is None:
        spec = importlib.util.find_spec("llama_cpp.llama_grammar")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        mod._build_repetition = _build_repetition
        mod.GRAMMAR_LITERAL_ESCAPE_RE = re.compile(r'[\r\n"\\]')   # (a backslash in an enum value or name)
        mod.GRAMMAR_LITERAL_ESCAPES = {"\r": "\\r", "\n": "\\n", '"': '\\"', "\\": "\\\\"}
        _MOD = mod
    return _MOD


def _class_items(body: str) -> list[tuple[int, int]] | None:
    """A GBNF character class body (without [ ^ ]) as code point ranges; None when it has an
    escape this does not read (llama.cpp's parser judges those)."""
    simple = {"n": 10, "r": 13, "t": 9, "\\": 92, "]": 93, "[": 91, "-": 45, '"': 34, "^": 94, "/": 47}
    items: list[tuple[int, bool]] = []   # (code point, an unescaped '-')
    i = 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            items.append((ord(c), c == "-"))
            i += 1
            continue
        e = body[i + 1:i + 2]
        width = {"x": 2, "u": 4, "U": 8}.get(e)
        if width:
            try:
                items.append((int(body[i + 2:i + 2 + width], 16), False))
            except ValueError:
                return None
            i += 2 + width
        elif e and e in simple:
            items.append((simple[e], False))
            i += 2
        else:
            return None
    ranges, j = [], 0
    while j < len(items):
        if j + 2 < len(items) and items[j + 1][1]:
            ranges.append((items[j][0], items[j + 2][0]))
            j += 3
        else:
            ranges.append((items[j][0], items[j][0]))
            j += 1
    return ranges


def _esc(cp: int) -> str:
    ch = chr(cp)
    return ch if ch.isalnum() and cp < 0x80 else f"\\x{cp:02X}" if cp < 0x100 else (
        f"\\u{cp:04X}" if cp < 0x10000 else f"\\U{cp:08X}")


def json_safe_class(cls: str) -> str:
    r"""A GBNF class that matches, raw inside a JSON string, only characters JSON lets stand raw.

        >>> json_safe_class(r'[^a-z]')
        '[^a-z"\\\\\\x00-\\x1F\\x7F]'
        >>> json_safe_class('[ -~]')
        '[\\x20-\\x21\\x23-\\x5B\\x5D-\\x7E]'
    """
    if cls.startswith("[^"):
        return cls[:-1] + '"\\\\\\x00-\\x1F\\x7F]'
    ranges = _class_items(cls[1:-1])
    if ranges is None:
        return cls
    out = []
    for a, b in ranges:
        a = max(a, 0x20)
        cuts = [c for c in (*_NOT_RAW, 0x7F) if a <= c <= b]
        for c in cuts:
            if a <= c - 1:
                out.append((a, c - 1))
            a = c + 1
        if a <= b:
            out.append((a, b))
    if not out:
        return '[^\\x00-\\U0010FFFF]'   # (matches nothing)
    return "[" + "".join(_esc(a) if a == b else f"{_esc(a)}-{_esc(b)}" for a, b in out) + "]"


_GBNF_ATOM = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]', re.S)
_WRAP_OPEN, _WRAP_CLOSE = '"\\"" ', ' "\\"" space'


def json_safe_pattern_rule(rule: str) -> str:
    """A rule of a `pattern`'s GBNF made to write the JSON string of what the regex matches: in
    literals a quote or backslash is escaped as JSON escapes it, classes keep to raw-safe chars."""
    head = tail = ""
    if rule.startswith(_WRAP_OPEN) and rule.endswith(_WRAP_CLOSE):
        head, tail, rule = _WRAP_OPEN, _WRAP_CLOSE, rule[len(_WRAP_OPEN):-len(_WRAP_CLOSE)]

    def fix(m: re.Match) -> str:
        atom = m.group(0)
        if atom.startswith("["):
            return json_safe_class(atom)
        inner = re.sub(r'\\(["\\])', lambda e: '\\\\\\' + e.group(1), atom[1:-1])
        return '"' + inner + '"'

    return head + _GBNF_ATOM.sub(fix, rule) + tail


def _converter_class():
    mod = _module()

    class Converter(mod.SchemaConverter):
        """The converter with rule names by counter, refs by path, pattern rules kept JSON-safe
        and enums as radix trees."""

        def __init__(self):
            super().__init__(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
            self._next: dict[str, int] = {}
            self._same: dict[tuple[str, str], str] = {}
            self._reserved: set[str] = set()
            self._ref_names: dict[str, str] = {}
            self._in_pattern = False

        def _add_rule(self, name, rule):
            esc = _INVALID.sub("-", name)
            if self._in_pattern:
                rule = json_safe_pattern_rule(rule)
            key = self._same.get((esc, rule))
            if key is not None and self._rules.get(key) == rule:
                return key
            key = esc
            if key in self._rules or key in self._reserved:
                i = self._next.get(esc, 0)
                while f"{esc}{i}" in self._rules or f"{esc}{i}" in self._reserved:
                    i += 1
                self._next[esc] = i + 1
                key = f"{esc}{i}"
            self._rules[key] = rule
            self._same[(esc, rule)] = key
            return key

        def _format_literal(self, literal):
            """A JSON string's text as GBNF, with its non-ASCII characters raw ("café", not
            "caf\\u00e9": json.dumps escapes them, and a model writes them as they are)."""
            if len(literal) > 1 and literal[0] == literal[-1] == '"' and "\\u" in literal:
                try:
                    text = json.dumps(json.loads(literal), ensure_ascii=False)
                    text.encode("utf-8")   # (a lone surrogate stays escaped)
                    literal = text
                except (ValueError, UnicodeEncodeError):
                    pass
            return super()._format_literal(literal)

        def _resolve_ref(self, ref):
            name = self._ref_names.get(ref)
            if name is None:
                base = _INVALID.sub("-", ref.split("/")[-1]) or "ref"
                name = self._add_rule(f"ref-{base}", f"(reserved {len(self._ref_names)})")
                del self._rules[name]
                self._reserved.add(name)
                self._ref_names[ref] = name
                got = self.visit(self._refs[ref], name)
                self._rules[name] = got
            return name

        def _visit_pattern(self, pattern, name):
            self._in_pattern = True
            try:
                return super()._visit_pattern(pattern, name)
            finally:
                self._in_pattern = False

        def visit(self, schema, name):
            values = schema.get("enum")
            if (isinstance(values, list) and len(values) >= 16 and not isinstance(schema.get("type"), list)
                    and not any(k in schema for k in ("$ref", "anyOf", "oneOf", "const"))):
                rule_name = name + "-" if name in mod.RESERVED_NAMES else name or "root"
                texts = (json.dumps(v, ensure_ascii=False) for v in values)
                return self._enum_tree(rule_name, list(dict.fromkeys(t for t in texts if _utf8(t))))
            return super().visit(schema, name)

        def _enum_tree(self, rule_name: str, texts: list[str]) -> str:
            """One rule per branching point of the values' radix tree (iterative: no recursion)."""
            nodes: list[tuple[list[int], int]] = [(list(range(len(texts))), 0)]
            alts: list[list[tuple[str, int | None]]] = []
            ends: list[bool] = []
            i = 0
            while i < len(nodes):
                idxs, off = nodes[i]
                groups: dict[str, list[int]] = {}
                ends.append(any(len(texts[j]) == off for j in idxs))
                for j in idxs:
                    if len(texts[j]) > off:
                        groups.setdefault(texts[j][off], []).append(j)
                mine = []
                for g in groups.values():
                    end = off + 1
                    first = texts[g[0]]
                    while all(len(texts[j]) > end for j in g) and all(texts[j][end] == first[end] for j in g):
                        end += 1
                    child = None
                    if len(g) > 1 or len(first) > end:
                        child = len(nodes)
                        nodes.append((g, end))
                    mine.append((first[off:end], child))
                alts.append(mine)
                i += 1
            names: dict[int, str] = {}
            for k in range(len(nodes) - 1, -1, -1):
                raw = mod.SchemaConverter._format_literal   # (pieces of JSON texts, written as they are)
                body = " | ".join(raw(self, lit) + (f" {names[c]}" if c is not None else "") for lit, c in alts[k])
                if ends[k]:
                    body = "| " + body
                names[k] = self._add_rule(rule_name if k == 0 else f"{rule_name}-e{k}", body)
            return names[0]

    return Converter


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:   # a lone surrogate: such a value cannot be written
        return False


_CONVERTER = None


def schema_to_gbnf(schema: dict) -> str:
    """The GBNF of a JSON schema (already checked: grammar_bounds.check_schema). Raises what the
    converter raises (ValueError, KeyError, TypeError, AssertionError, RecursionError) and
    grammar_types.Unsatisfiable."""
    from llamaspec.runtime.grammar_types import split_types

    global _CONVERTER
    if _CONVERTER is None:
        _CONVERTER = _converter_class()
    conv = _CONVERTER()
    schema = conv.resolve_refs(split_types(schema), "stdin")
    conv.visit(schema, "")
    return as_llama_cpp(conv.format_grammar())
