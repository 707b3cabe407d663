"""Bounds on what a request may ask the grammar compilers to build, checked before any of them
runs (the JSON schema converter, llama.cpp's GBNF parser): a schema or grammar past one is a
GrammarError naming the field, in microseconds, whatever the input.

Why each bound (measured on llama.cpp's parser and llama-cpp-python's converter; docs/structured.md
has the numbers): the GBNF parser recurses once per nesting level (`((((...))))` 60000 deep
overflows the C stack: SIGSEGV), the grammar engine de-duplicates its stacks in O(S^2) per token
(an enum of 100000 values holds a slot for minutes), and bounded repetitions (`maxLength`,
`{m,n}`) expand into one rule per repetition. The limits are looser than OpenAI's strict mode
(5000 properties, 10 levels of nesting, 1000 enum values, 120000 characters of names and values)
and tight enough that a schema at every limit at once still compiles in about a second.

All walks are iterative: a bound is checked before anything recurses over the input.
"""

from __future__ import annotations

import json
import re
from typing import Any

from llamaspec.runtime.grammar_errors import GrammarError

MAX_SCHEMA_CHARS = 1_000_000    # a JSON schema's JSON text
MAX_SCHEMA_DEPTH = 32           # subschemas nested in subschemas (OpenAI strict: 10)
MAX_PROPERTIES = 10_000         # object properties in the whole schema (OpenAI strict: 5000)
MAX_OPTIONAL = 100              # optional (not required) properties of one object
MAX_ENUM = 4_000                # enum values in the whole schema, a const counting one (OpenAI: 1000)
MAX_NAME_CHARS = 250_000        # characters of property names and enum/const values (OpenAI: 120000)
MAX_REPEAT = 100_000            # maxLength/maxItems, a GBNF {m,n}'s n
MAX_MIN_REPEAT = 2_000          # minLength/minItems, a GBNF {m,n}'s m (llama.cpp's parser refuses more)
MAX_SUBSCHEMAS = 50_000         # subschemas of any kind in the whole schema
MAX_GBNF_CHARS = 2_000_000      # a GBNF grammar's text (a schema's converted grammar included)
MAX_GBNF_DEPTH = 256            # ( ) nesting in a GBNF rule
MAX_GBNF_RULES = 100_000        # rule definitions in a GBNF grammar

_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "dependentSchemas", "patternProperties")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
                  "unevaluatedProperties", "unevaluatedItems", "additionalItems")
_REPEATS = ("minLength", "maxLength", "minItems", "maxItems")


class BoundError(GrammarError):
    """A schema or grammar past one of the bounds; `field` names where it came from."""

    def __init__(self, message: str, field: str):
        super().__init__(message, field, "see 'Limits' in docs/structured.md")


def _path(parent: str, key: Any) -> str:
    return f"{parent}[{key}]" if isinstance(key, int) else f"{parent}.{key}" if parent else str(key)


def check_schema(schema: Any, field: str, text_chars: int | None = None) -> None:
    """Raise BoundError (naming `field` and where in the schema) when `schema` (parsed JSON) is
    past a bound. `text_chars`: the length of the JSON text it came from, when it came as text."""
    def fail(what: str) -> None:
        raise BoundError(f"{field}: {what}", field)

    if text_chars is None:
        try:
            text_chars = len(json.dumps(schema))
        except (ValueError, TypeError, RecursionError):
            fail(f"the schema is not JSON or nests deeper than {MAX_SCHEMA_DEPTH} levels")
    if text_chars > MAX_SCHEMA_CHARS:
        fail(f"the schema is {text_chars:,} characters of JSON, over the limit of {MAX_SCHEMA_CHARS:,}")
    props = enums = chars = count = 0
    stack: list[tuple[Any, str, int]] = [(schema, "", 1)]
    while stack:
        node, where, depth = stack.pop()
        if not isinstance(node, dict):
            continue
        count += 1
        if count > MAX_SUBSCHEMAS:
            fail(f"the schema has more than {MAX_SUBSCHEMAS:,} subschemas")
        if depth > MAX_SCHEMA_DEPTH:
            fail(f"the schema nests subschemas more than {MAX_SCHEMA_DEPTH} deep (at {where})")
        for key in _REPEATS:
            n = node.get(key)
            if isinstance(n, bool) or (n is not None and not isinstance(n, int)):
                fail(f"{key} (at {where or 'schema'}) must be a non-negative integer, got {str(n)[:40]}")
            limit = MAX_MIN_REPEAT if key.startswith("min") else MAX_REPEAT
            if n is not None and not 0 <= n <= limit:
                fail(f"{key} {n} (at {where or 'schema'}) is over the limit of {limit:,}")
        values = node.get("enum")
        if values is not None:
            if not isinstance(values, list):
                fail(f"enum (at {where or 'schema'}) must be an array")
            enums += len(values)
            chars += sum(len(v) if isinstance(v, str) else len(json.dumps(v)) for v in values[:MAX_ENUM + 1])
        if "const" in node:
            enums += 1
            v = node["const"]
            chars += len(v) if isinstance(v, str) else len(json.dumps(v))
        if enums > MAX_ENUM:
            fail(f"the schema has more than {MAX_ENUM:,} enum values (at {where or 'schema'})")
        properties = node.get("properties")
        if isinstance(properties, dict):
            props += len(properties)
            chars += sum(len(k) for k in properties)
            if props > MAX_PROPERTIES:
                fail(f"the schema has more than {MAX_PROPERTIES:,} properties (at {where or 'schema'})")
            required = node.get("required")
            optional = len(set(properties) - set(required if isinstance(required, list) else ()))
            if optional > MAX_OPTIONAL:
                fail(f"{where or 'schema'} has {optional:,} optional properties, over the limit of {MAX_OPTIONAL} "
                     "per object (list them in required, or nest them)")
        if chars > MAX_NAME_CHARS:
            fail(f"the schema's property names and enum values are over {MAX_NAME_CHARS:,} characters")
        _check_shape(node, where, fail)
        for key in _SUBSCHEMA_MAPS:
            sub = node.get(key)
            if isinstance(sub, dict):
                stack.extend((v, _path(_path(where, key), k), depth + 1) for k, v in sub.items())
        for key in _SUBSCHEMA_LISTS:
            sub = node.get(key)
            if isinstance(sub, list):
                stack.extend((v, _path(_path(where, key), i), depth + 1) for i, v in enumerate(sub))
        for key in _SUBSCHEMA_ONE:
            sub = node.get(key)
            if isinstance(sub, dict):
                stack.append((sub, _path(where, key), depth + 1))
            elif isinstance(sub, list):
                stack.extend((v, _path(_path(where, key), i), depth + 1) for i, v in enumerate(sub))


_TYPES = ("string", "number", "integer", "boolean", "null", "object", "array")


def _check_shape(node: dict, where: str, fail) -> None:
    """The keywords the converter reads have the JSON types it expects (else it fails with an
    AttributeError or silently reads a string as its characters)."""
    at = where or "schema"
    for key in ("properties", "$defs", "definitions"):
        sub = node.get(key)
        if sub is None:
            continue
        if not isinstance(sub, dict):
            fail(f"{key} (at {at}) must be an object mapping names to schemas, got {_jtype(sub)}")
        for k, v in sub.items():
            if not isinstance(v, dict):
                fail(f"{_path(_path(where, key), k)} must be a schema (an object), got {_jtype(v)}")
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        sub = node.get(key)
        if sub is None:
            continue
        if not isinstance(sub, list) or not sub:
            fail(f"{key} (at {at}) must be a non-empty array of schemas, got {_jtype(sub)}")
        for i, v in enumerate(sub):
            if not isinstance(v, dict):
                fail(f"{_path(_path(where, key), i)} must be a schema (an object), got {_jtype(v)}")
    items = node.get("items")   # (a boolean: `false` after prefixItems is "no more items")
    if items is not None and not isinstance(items, (dict, list, bool)) or isinstance(items, list) and not all(
            isinstance(v, dict) for v in items):
        fail(f"items (at {at}) must be a schema (an object or a boolean), got {_jtype(items)}")
    extra = node.get("additionalProperties")
    if extra is not None and not isinstance(extra, (dict, bool)):
        fail(f"additionalProperties (at {at}) must be a schema or a boolean, got {_jtype(extra)}")
    t = node.get("type")
    if t is not None and not (t in _TYPES or isinstance(t, list) and t and all(x in _TYPES for x in t)):
        fail(f"type (at {at}) must be one of {', '.join(_TYPES)} or an array of them, got {json.dumps(t)[:60]}")
    required = node.get("required")
    if required is not None and not (isinstance(required, list) and all(isinstance(x, str) for x in required)):
        fail(f"required (at {at}) must be an array of property names, got {_jtype(required)}")
    for key in ("$ref", "pattern", "format"):
        if key in node and not isinstance(node[key], str):
            fail(f"{key} (at {at}) must be a string, got {_jtype(node[key])}")


def _jtype(v: Any) -> str:
    if v is None or isinstance(v, bool):
        return "null" if v is None else "boolean"
    return {str: "string", int: "number", float: "number", list: "array", dict: "object"}.get(type(v), "value")


_GBNF_TOKEN = re.compile(r'"(?:[^"\\\n]|\\.)*"|\[(?:[^\]\\\n]|\\.)*\]|#[^\n]*|::=|[()]'
                         r'|\{\s*(\d*)\s*(?:,\s*(\d*)\s*)?\}')


def check_gbnf(text: str, field: str) -> None:
    """Raise BoundError naming `field` when GBNF `text` is past a bound: its size, ( ) nesting,
    number of rules, or a {m,n} repetition count. Literals, character classes and comments are
    skipped as llama.cpp's parser reads them."""
    def fail(what: str) -> None:
        raise BoundError(f"{field}: {what}", field)

    if len(text) > MAX_GBNF_CHARS:
        fail(f"the grammar is {len(text):,} characters, over the limit of {MAX_GBNF_CHARS:,}")
    depth = rules = 0
    for m in _GBNF_TOKEN.finditer(text):
        tok = m.group(0)
        c = tok[0]
        if c == "(":
            depth += 1
            if depth > MAX_GBNF_DEPTH:
                fail(f"the grammar nests ( ) more than {MAX_GBNF_DEPTH} deep")
        elif c == ")":
            depth = max(0, depth - 1)
        elif c == ":":
            rules += 1
            if rules > MAX_GBNF_RULES:
                fail(f"the grammar has more than {MAX_GBNF_RULES:,} rules")
            depth = 0   # (a new rule: an unclosed "(" is the parser's error to report)
        elif c == "{":
            for g, limit in zip(m.groups(), (MAX_MIN_REPEAT, MAX_REPEAT)):
                if g and (len(g) > 9 or int(g) > limit):
                    fail(f"the repetition {tok} is over the limits "
                         f"(m up to {MAX_MIN_REPEAT:,}, n up to {MAX_REPEAT:,})")
