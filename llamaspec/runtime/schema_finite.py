"""Finite values under a JSON schema: llama.cpp's bounds, added where a schema gives none.

llguidance enforces a schema's language exactly, and that language has values without end: a
`number` may carry any count of digits, a `format: time` any count of fraction digits, an email
any length. A small model under greedy decoding then writes digits until `max_tokens` (SmolLM2
wrote `"20:00:00.000000000000000012345678900000..."`): valid so far, never finished. llama.cpp's
converter bounds them (`integral-part ::= [0] | [1-9] [0-9]{0,15}`, `decimal-part ::= [0-9]{1,16}`,
a time's fraction to 3 digits). This pass adds such bounds as ordinary keywords, only where the
schema states none, so every output is still an instance of the schema as written:

    >>> finite({"type": "number"})
    {'type': 'number', 'minimum': -9007199254740991, 'maximum': 9007199254740991, 'multipleOf': 1e-10}
    >>> finite({"type": "string", "format": "time"})
    {'type': 'string', 'format': 'time', 'maxLength': 24}

Numbers: at most 16 integer digits (llama.cpp's; up to 2**53 - 1) and 10 fraction digits, no exponent
(`multipleOf: 1e-10`, the finest step llguidance takes: 1e-11 is "too many digits"). Formats: the
RFC length limits where there is one (email 254 with a local part of 64, hostname 253), the
longest usual form otherwise (a time with nanoseconds and an offset is 24 characters).
"""

from __future__ import annotations

from typing import Any

__all__ = ["finite", "INT_LIMIT", "FRACTION_STEP", "FORMAT_MAX_LENGTH", "FORMAT_PATTERN"]

# 16 digits as llama.cpp's integral-part, and exact: llguidance reads bounds as doubles, so
# 10**16 - 1 would be 1e16 and let a 17th digit through; 2**53 - 1 is I-JSON's (RFC 7493) safe integer
INT_LIMIT = 2**53 - 1
FRACTION_STEP = 1e-10       # 10 fraction digits
FORMAT_MAX_LENGTH = {
    "time": 24,             # 23:59:60.123456789+05:30
    "date-time": 35,        # 2024-02-29T + a time
    "duration": 40,         # P9999Y12M31DT23H59M59.123456S and room
    "email": 254,           # RFC 5321's path limit
    "hostname": 253,        # RFC 1123
    "uri": 256,             # no RFC limit; longer than almost any address a person would type
}
# an email's local part at most 64 characters (RFC 5321) and its domain one label's 63 (RFC 1035
# allows 253: a narrowing, so that a run of junk before the '@' or after it ends early)
FORMAT_PATTERN = {"email": r"^[^@\s]{1,64}@[^@\s]{1,63}$"}
_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_ONES = ("items", "additionalProperties", "additionalItems")


def _types(node: dict) -> set:
    t = node.get("type")
    return {t} if isinstance(t, str) else set(t) if isinstance(t, list) else set()


def _fraction_digits(x: Any) -> int:
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return 0
    text = repr(float(x)) if isinstance(x, float) else str(x)
    if "e" in text:
        return 99
    return len(text.split(".")[1].rstrip("0")) if "." in text else 0


def _numbers(node: dict) -> None:
    lower = [node[k] for k in ("minimum", "exclusiveMinimum") if isinstance(node.get(k), (int, float))]
    upper = [node[k] for k in ("maximum", "exclusiveMaximum") if isinstance(node.get(k), (int, float))]
    if not lower and all(v > -INT_LIMIT for v in upper):
        node["minimum"] = -INT_LIMIT
    if not upper and all(v < INT_LIMIT for v in lower):
        node["maximum"] = INT_LIMIT
    bounds = lower + upper
    if "number" in _types(node) and "multipleOf" not in node and all(_fraction_digits(v) <= 10 for v in bounds):
        node["multipleOf"] = FRACTION_STEP


def finite(schema: Any) -> Any:
    """`schema` with llama.cpp's bounds on numbers and format lengths where it has none (a copy;
    the input is not changed). Recursion is bounded by grammar_bounds' depth check."""
    if isinstance(schema, list):
        return [finite(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    types = _types(out)
    if types & {"number", "integer"} and "enum" not in out and "const" not in out:
        _numbers(out)
    fmt = out.get("format")
    if ("string" in types or not types) and fmt in FORMAT_MAX_LENGTH and "maxLength" not in out:
        out["maxLength"] = FORMAT_MAX_LENGTH[fmt]
    if ("string" in types or not types) and fmt in FORMAT_PATTERN and "pattern" not in out:
        out["pattern"] = FORMAT_PATTERN[fmt]
    for key in _MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: finite(v) for k, v in out[key].items()}
    for key in _LISTS + _ONES:
        if isinstance(out.get(key), (dict, list)):
            out[key] = finite(out[key])
    return out
