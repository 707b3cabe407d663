"""The conformance corpus of test_schema_conformance.py (issue 34): a few hundred JSON schemas over
every keyword OpenAI's strict mode and llama-server accept, each with a prompt that asks for it.

Built from a small set of leaves (one value-level schema each) placed in several wrappers (the
root, a described property, an optional property, an array item, a $ref, a nullable anyOf), plus
hand-written structures (nested objects, same-named $defs, recursion, composition, required and
additionalProperties combinations). `OUTSIDE` holds keywords outside the list: each must be
enforced or refused with its name, never dropped.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from llamaspec.runtime.schema_finite import FORMAT_MAX_LENGTH


@dataclass(frozen=True)
class Case:
    id: str
    schema: dict
    prompt: str
    max_tokens: int = 160
    tags: frozenset = field(default_factory=frozenset)   # what a keyword walk cannot see ("recursive", ...)


def _s(**kw) -> dict:
    return {"type": "string", **kw}


# (property name, schema, what the prompt asks for): a value-level schema each
LEAVES: list[tuple[str, dict, str]] = [
    # strings and lengths
    ("first_name", _s(maxLength=30), "a person's first name"),
    ("fruit", _s(minLength=3, maxLength=12), "the name of a fruit"),
    ("city", _s(), 'the name of the capital of France, like "Rome" for Italy'),
    ("country_code", _s(minLength=2, maxLength=2), "a two-letter country code"),
    # pattern: anchors, classes, quantifiers, groups, alternation, escapes
    ("ticket", _s(pattern="^[A-Z]{3}-[0-9]{4}$"), "a ticket code such as ABC-1234"),
    ("hex_colour", _s(pattern="^#[0-9a-fA-F]{6}$"), "a colour as a hex code such as #1a2b3c"),
    ("variable", _s(pattern="^[a-z]{1,8}(_[a-z]{1,8}){0,2}$"), "a snake_case variable name"),
    ("phone", _s(pattern=r"^\d{3}-\d{4}$"), "a phone number such as 555-1234"),
    ("version", _s(pattern=r"^v[0-9]+\.[0-9]+\.[0-9]+$"), "a version string such as v1.2.3"),
    ("answer", _s(pattern="^(yes|no|maybe)$"), "an answer: yes, no or maybe"),
    ("full_name", _s(pattern="^[A-Z][a-z]+( [A-Z][a-z]+)?$"), "a capitalised name"),
    ("handle", _s(pattern=r"^\w{1,12}@\w{1,12}\.com$"), "an email address at a .com domain"),
    ("with_number", _s(pattern="[0-9]+", maxLength=20), "a street address with a house number"),
    ("word", _s(pattern=r"^[^\s,]{1,10}$"), "a single word"),
    ("nickname", _s(pattern="^.{1,8}$"), "a short nickname"),
    ("price_tag", _s(pattern=r"^\$[0-9]+(\.[0-9]{2})?$"), "a price such as $12.50"),
    ("path", _s(pattern=r"^/[a-z]+(/[a-z]+)?$"), "a unix path such as /usr/bin"),
    # format
    ("birthday", _s(format="date"), "a date of birth"),
    ("opens_at", _s(format="time"), "the time a shop opens, with its time zone"),
    ("created", _s(format="date-time"), "a timestamp"),
    ("uid", _s(format="uuid"), "a random UUID"),
    ("email", _s(format="email"), "an email address"),
    ("host", _s(format="hostname"), "a website's host name"),
    ("ip", _s(format="ipv4"), "an IPv4 address"),
    ("ip6", _s(format="ipv6"), "an IPv6 address"),
    ("length", _s(format="duration"), "how long a film lasts, as an ISO 8601 duration"),
    # numbers and their bounds
    ("year", {"type": "integer"}, "a year"),
    ("temperature", {"type": "number"}, "a temperature in Celsius"),
    ("rating", {"type": "integer", "minimum": 1, "maximum": 10}, "a rating from 1 to 10"),
    ("probability", {"type": "number", "minimum": 0, "maximum": 1}, "a probability"),
    ("percent", {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 100}, "a percentage"),
    ("cost", {"type": "number", "exclusiveMinimum": 0, "maximum": 1000}, "the price of a book"),
    ("minutes", {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 120},
     "a meeting length in minutes, a multiple of 5"),
    ("frost", {"type": "integer", "minimum": -40, "maximum": -1}, "a temperature below freezing"),
    ("score", {"type": "number", "minimum": -1.5, "maximum": 2.5}, "a score"),
    ("raining", {"type": "boolean"}, "whether it is raining"),
    ("nothing", {"type": "null"}, "nothing (null)"),
    # enum and const
    ("colour", {"enum": ["red", "green", "blue"]}, "a primary colour"),
    ("fib", {"enum": [1, 2, 3, 5, 8]}, "a small Fibonacci number"),
    ("mixed", {"enum": ["low", 2, 3.5, True, False]}, "a setting"),
    ("size", {"enum": ["small", "large", None]}, "a size, or null"),
    ("month", {"type": "string", "enum": ["January", "February", "March", "April", "May", "June", "July",
                                          "August", "September", "October", "November", "December"]}, "a month"),
    ("symbol", {"enum": ['say "hi"', "back\\slash", "café ✓", "two\nlines", "tab\there"]}, "a symbol"),
    ("api", {"const": "v1"}, "the API version v1"),
    ("answer_num", {"const": 42}, "the number 42"),
    ("origin", {"const": {"x": 0, "y": 0}}, "the origin point"),
    ("enabled", {"const": True}, "true"),
    # type lists
    ("middle_name", {"type": ["string", "null"]}, "a middle name, or null"),
    ("floor", {"type": ["integer", "null"]}, "a floor number, or null"),
    ("paint", {"type": ["string", "null"], "enum": ["red", "green", None]}, "a paint colour (red or green) or null"),
    ("label", {"type": ["string", "number"], "maxLength": 12}, "a label or a number"),
    ("verified", {"type": ["boolean", "null"]}, "whether the account is verified, or null"),
    ("short_note", {"type": ["string", "null"], "maxLength": 8}, "a very short note, or null"),
    ("zip", {"type": ["string", "null"], "pattern": "^[0-9]{5}$"}, "a US zip code, or null"),
    ("spouse", {"type": ["object", "null"], "properties": {"name": _s(maxLength=20)},
                "required": ["name"], "additionalProperties": False}, "the spouse's name, or null"),
    ("pets", {"type": ["array", "null"], "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3},
     "a list of pets, or null"),
    ("discount", {"type": ["number", "null"], "minimum": 0, "maximum": 50}, "a discount percentage, or null"),
    # arrays
    ("tags", {"type": "array", "items": _s(maxLength=12), "minItems": 1, "maxItems": 3}, "one to three tags"),
    ("pair", {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}, "two integers"),
    ("none_yet", {"type": "array", "maxItems": 0}, "an empty list"),
    ("point", {"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}], "items": False},
     "a point as [x, y]"),
    ("grid", {"type": "array", "items": {"type": "array", "items": {"type": "integer"}, "maxItems": 2},
              "minItems": 1, "maxItems": 2}, "a small grid of integers"),
    ("lines", {"type": "array", "items": {"type": "object", "properties": {"sku": _s(maxLength=8),
                                                                           "qty": {"type": "integer"}},
                                          "required": ["sku", "qty"], "additionalProperties": False},
               "maxItems": 2}, "order lines"),
    # objects as values
    ("location", {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                  "required": ["lat", "lon"], "additionalProperties": False}, "a latitude and longitude"),
    ("ids", {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 999}, "minItems": 1, "maxItems": 3},
     "one to three order numbers between 1 and 999"),
    ("flags", {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "boolean"}}, "required": ["a"],
               "additionalProperties": False}, "two flags, a (required) and b (optional)"),
    ("empty", {"type": "object", "properties": {}, "additionalProperties": False}, "an empty object"),
    # composition
    ("id_or_name", {"anyOf": [_s(maxLength=10), {"type": "integer"}]}, "an id number or a short name"),
    ("animal", {"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}},
         "required": ["kind", "lives"], "additionalProperties": False},
        {"type": "object", "properties": {"kind": {"const": "dog"}, "breed": _s(maxLength=20)},
         "required": ["kind", "breed"], "additionalProperties": False}]}, "a cat or a dog"),
    ("code", {"allOf": [{"type": "string"}, {"maxLength": 6}, {"pattern": "^[A-Z]+$"}]}, "a short upper-case code"),
    ("person", {"type": "object", "properties": {"name": {}, "age": {}}, "additionalProperties": False,
                "allOf": [{"properties": {"name": _s(maxLength=20)}, "required": ["name"]},
                          {"properties": {"age": {"type": "integer"}}, "required": ["age"]}]},
     'a person with a name and an age, like {"name": "Ada", "age": 36}'),
    ("maybe_score", {"anyOf": [{"type": "number"}, {"type": "null"}], "description": "null if unknown"},
     "a score or null"),
]
def _obj(props: dict, required=None, extra: Any = False, **kw) -> dict:
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": extra, **kw}


def _wrap(i: int, name: str, leaf: dict, what: str) -> list[Case]:
    """The leaf at the root and as a described property, plus one of: an optional property, an
    array item, a $ref, a nullable anyOf (by turn)."""
    desc = {"title": name.replace("_", " ").title(), "description": what}
    forms = {
        "root": (leaf, f"Give {what} as JSON."),
        "prop": (_obj({name: {**leaf, **desc}}, title="Record", description=f"A record holding {what}."),
                 f'Give a JSON object whose "{name}" is {what}.'),
        "optional": (_obj({"id": {"type": "integer"}, name: leaf}, required=["id"]),
                     f'Give a JSON object with an "id" number and, if you like, a "{name}": {what}.'),
        "items": ({"type": "array", "items": leaf, "minItems": 1, "maxItems": 2},
                  f"Give a JSON list of one or two values, each {what}."),
        "ref": (_obj({name: {"$ref": f"#/$defs/{name}"}}, **{"$defs": {name: leaf}}),
                f'Give a JSON object whose "{name}" is {what}.'),
        "nullable": (_obj({name: {"anyOf": [leaf, {"type": "null"}]}}),
                     f'Give a JSON object whose "{name}" is {what}, or null if you do not know.'),
    }
    extra = ["optional", "items", "ref", "nullable"]
    chosen = ["root", "prop", extra[i % 4]]
    return [Case(f"{name}-{form}", forms[form][0], forms[form][1] + " Reply with JSON only.") for form in chosen]


BOOK = {"title": _s(maxLength=40), "year": {"type": "integer"}, "genre": {"enum": ["novel", "poetry", "essay"]}}
_REQUIRED = {"all": None, "some": ["title"], "none": []}
_EXTRA = {"closed": False, "open": True, "typed": _s(maxLength=10)}


def _node(props: dict, required=None) -> dict:
    return _obj(props, required)


def _nest(levels: int, leaf: dict) -> dict:
    """{"l1": {"l2": ... {"l<levels>": leaf}}}: objects nested `levels` deep around a leaf (OpenAI's limit: 10)."""
    for i in range(levels, 0, -1):
        leaf = _obj({f"l{i}": leaf})
    return leaf


STRUCTURES: list[tuple[str, dict, str, set]] = [
    # $ref / $defs: same names at different paths, a pointer into properties, an escaped pointer
    ("defs-same-name-nested", _obj({"colour": {"$ref": "#/$defs/a/$defs/item"}, "count": {"$ref": "#/$defs/b/$defs/item"}},
                                   **{"$defs": {"a": {"$defs": {"item": {"enum": ["red", "blue"]}}},
                                                "b": {"$defs": {"item": {"type": "integer"}}}}}),
     'a JSON object with a "colour" (red or blue) and a "count"', {"same-named $defs"}),
    ("defs-same-name-top-and-nested", _obj({"item": {"$ref": "#/$defs/item"}, "box": {"$ref": "#/$defs/box"}},
                                           **{"$defs": {"item": _s(maxLength=15), "box": _obj(
                                               {"item": {"$ref": "#/$defs/box/$defs/item"}},
                                               **{"$defs": {"item": {"type": "boolean"}}})}}),
     'a JSON object with an "item" name and a "box" whose "item" is true or false', {"same-named $defs"}),
    ("defs-and-definitions", _obj({"a": {"$ref": "#/definitions/item"}, "b": {"$ref": "#/$defs/item"}},
                                  definitions={"item": {"type": "integer"}}, **{"$defs": {"item": {"const": "b"}}}),
     'a JSON object with a number "a" and "b" set to "b"', {"same-named $defs"}),
    ("defs-three-items", _obj({k: {"$ref": f"#/$defs/{k}/$defs/item"} for k in ("x", "y", "z")},
                              **{"$defs": {"x": {"$defs": {"item": {"const": 1}}},
                                           "y": {"$defs": {"item": {"enum": ["up", "down"]}}},
                                           "z": {"$defs": {"item": {"type": "null"}}}}}),
     'a JSON object with "x", "y" and "z"', {"same-named $defs"}),
    ("definitions-pydantic-v1", {"title": "Owner", "type": "object", "definitions": {"Pet": _obj(
        {"name": _s(maxLength=12), "kind": {"enum": ["cat", "dog"]}})},
        "properties": {"pet": {"$ref": "#/definitions/Pet"}}, "required": ["pet"], "additionalProperties": False},
     "Ada's dog Rex as JSON", set()),
    ("definitions-list", {"type": "array", "items": {"$ref": "#/definitions/step"}, "minItems": 1, "maxItems": 3,
                          "definitions": {"step": _obj({"n": {"type": "integer"}, "do": _s(maxLength=20)})}},
     "the steps 1 boil water, 2 add tea, as a JSON list", set()),
    ("ref-into-properties", _obj({"home": _obj({"city": _s(maxLength=20)}), "work": {"$ref": "#/properties/home"}}),
     'a JSON object with a "home" and a "work" city', set()),
    ("ref-escaped-pointer", _obj({"a": {"$ref": "#/$defs/x~1y"}}, **{"$defs": {"x/y": {"enum": ["p", "q"]}}}),
     'a JSON object with "a" set to p or q', set()),
    ("ref-chain", _obj({"v": {"$ref": "#/$defs/a"}}, **{"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"type": "integer"}}}),
     'a JSON object with a number "v"', set()),
    ("ref-in-items", {"type": "array", "items": {"$ref": "#/$defs/tag"}, "maxItems": 3,
                      "$defs": {"tag": {"enum": ["new", "sale", "hot"]}}}, "a JSON list of shop tags", set()),
    # recursion
    ("recursive-tree", {"$ref": "#/$defs/node", "$defs": {"node": _node(
        {"name": _s(maxLength=10), "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}})}},
     "Eve's family tree as JSON: Eve has one child, Tom, who has no children", {"recursive"}),
    ("recursive-list", {"$ref": "#/$defs/list", "$defs": {"list": _node(
        {"value": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#/$defs/list"}, {"type": "null"}]}})}},
     "the list 1, 2 as a JSON linked list", {"recursive"}),
    ("recursive-root", _obj({"name": _s(maxLength=12), "parent": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}),
     "a folder and its parent folder as JSON", {"recursive"}),
    ("recursive-expr", {"$ref": "#/$defs/expr", "$defs": {"expr": {"anyOf": [
        {"type": "number"}, _obj({"op": {"enum": ["+", "*"]}, "args": {"type": "array", "items": {"$ref": "#/$defs/expr"},
                                                                      "minItems": 2, "maxItems": 2}})]}}},
     "the expression 1 + 2 as a JSON tree", {"recursive"}),
    ("recursive-category", {"title": "Menu", "$ref": "#/$defs/Category", "$defs": {"Category": {
        "title": "Category", "type": "object", "properties": {"name": {"title": "Name", "type": "string", "maxLength": 20},
        "sub": {"title": "Sub", "type": "array", "items": {"$ref": "#/$defs/Category"}, "maxItems": 2}},
        "required": ["name", "sub"], "additionalProperties": False}}}, "", {"recursive"}),
    # nested objects and arrays
    ("nested-order", _obj({"customer": _obj({"name": _s(maxLength=30), "address": _obj(
        {"city": _s(maxLength=20), "zip": _s(pattern="^[0-9]{5}$")})}),
        "lines": {"type": "array", "items": _obj({"sku": _s(pattern="^[A-Z]{2}[0-9]{2}$"), "qty": {"type": "integer"}}),
                  "minItems": 1, "maxItems": 2}, "status": {"enum": ["open", "paid", "shipped"]}}),
     "an order as JSON: customer with address, order lines and status", set()),
    ("nested-ten-levels", _nest(9, {"type": "integer"}),
     "a JSON object nested ten levels deep (l1 to l9) with a number at the bottom", set()),
    ("nested-arrays", {"type": "array", "items": {"type": "array", "items": _s(maxLength=6), "minItems": 1, "maxItems": 2},
                       "minItems": 1, "maxItems": 2}, "a JSON list of lists of short words", set()),
    ("many-properties", _obj({f"field_{i}": {"type": "integer"} if i % 2 else _s(maxLength=6) for i in range(12)}),
     "a JSON record with fields field_0 to field_11", set()),
    ("odd-property-names", _obj({"first name": _s(maxLength=10), "a-b": {"type": "integer"}, "ünï": {"type": "boolean"},
                                 'say "x"': {"type": "null"}, "back\\slash": {"const": 1}}),
     "a JSON object with the keys it is asked for", set()),
    # strict-mode style (the openai SDK's pydantic schemas)
    ("strict-event", _obj({"name": _s(maxLength=30), "date": _s(format="date"), "start": _s(format="time"),
                           "attendees": {"type": "array", "items": _obj({"name": _s(maxLength=20), "email": _s(format="email")}),
                                         "maxItems": 2}, "room": {"type": ["string", "null"], "maxLength": 10}}),
     "a meeting as JSON: name, date, start time, attendees with emails, room or null", set()),
    ("sdk-bug", {"$defs": {"Reporter": {"properties": {"name": {"title": "Name", "type": "string", "maxLength": 30},
                                                       "email": {"title": "Email", "type": "string", "maxLength": 40}},
                                        "required": ["name", "email"], "title": "Reporter", "type": "object",
                                        "additionalProperties": False}},
                 "properties": {"title": {"title": "Title", "type": "string", "maxLength": 40},
                                "severity": {"enum": ["low", "medium", "high"], "title": "Severity", "type": "string"},
                                "reporter": {"$ref": "#/$defs/Reporter"},
                                "labels": {"items": {"type": "string", "maxLength": 15}, "title": "Labels",
                                           "type": "array", "maxItems": 3}},
                 "required": ["title", "severity", "reporter", "labels"], "title": "Bug", "type": "object",
                 "additionalProperties": False},
     "the bug report as JSON: Title: Login fails. Severity: high. Labels: ui. Reported by Nina (nina@x.org)", set()),
    ("annotated-root", {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "https://example.com/pet",
                        "title": "Pet", "description": "A pet.", "examples": [{"name": "Rex"}], "default": {"name": "Rex"},
                        **_obj({"name": {**_s(maxLength=15), "title": "Name", "description": "Its name.",
                                         "examples": ["Rex"], "default": "Rex"}}), "$comment": "test"},
     "a pet as JSON", set()),
    # composition
    ("anyof-root-object-or-array", {"anyOf": [_obj({"one": {"type": "integer"}}),
                                              {"type": "array", "items": {"type": "integer"}, "maxItems": 3}]},
     "either an object with a number or a list of numbers, as JSON", set()),
    ("oneof-refs", {"oneOf": [{"$ref": "#/$defs/circle"}, {"$ref": "#/$defs/square"}], "$defs": {
        "circle": _obj({"shape": {"const": "circle"}, "radius": {"type": "number"}}),
        "square": _obj({"shape": {"const": "square"}, "side": {"type": "number"}})}}, "a circle or a square as JSON", set()),
    ("allof-ref-and-more", {"allOf": [{"$ref": "#/$defs/base"}, {"properties": {"email": _s(format="email")},
                                                                  "required": ["email"]}],
                            "$defs": {"base": {"type": "object", "properties": {"name": _s(maxLength=20)}, "required": ["name"]}}},
     "a user as JSON with a name and an email", set()),
    ("allof-numbers", {"allOf": [{"type": "integer"}, {"minimum": 0}, {"maximum": 9}]}, "a digit as JSON", set()),
    ("anyof-nested-types", {"anyOf": [{"type": "string", "enum": ["none"]}, _obj({"count": {"type": "integer"}}),
                                      {"type": "boolean"}]}, "the count of items as JSON", set()),
    ("type-list-root", {"type": ["object", "array"], "properties": {"k": {"type": "integer"}}, "required": ["k"],
                        "additionalProperties": False, "items": {"type": "integer"}, "maxItems": 2},
     "a JSON object with k or a list of numbers", set()),
    # arrays
    ("tuple-with-rest", {"type": "array", "prefixItems": [_s(maxLength=10), {"type": "integer"}],
                         "items": {"type": "boolean"}, "maxItems": 4}, "a JSON list: a name, an age, then flags", set()),
    ("exact-three", {"type": "array", "items": {"enum": ["rock", "paper", "scissors"]}, "minItems": 3, "maxItems": 3},
     "three moves of rock paper scissors as a JSON list", set()),
    ("min-items-only", {"type": "array", "items": {"type": "integer"}, "minItems": 2}, "the numbers 4, 8 and 15 as a list",
     set()),
    # strings, enums and consts of other shapes
    ("min-length-long", _s(minLength=5, maxLength=40), "", set()),
    ("enum-forty", {"enum": [f"item-{i:02d}" for i in range(40)]}, "one of the items item-00 to item-39", set()),
    ("enum-structured", {"enum": [[1, 2], {"a": 1}, "x", None]}, "one of: [1, 2], {\"a\": 1}, \"x\" or null", set()),
    ("const-float", {"const": 3.14}, "the number 3.14", set()),
    ("const-in-anyof", {"anyOf": [{"const": "auto"}, {"type": "integer", "minimum": 1, "maximum": 64}]},
     "a thread count or auto", set()),
    # any JSON, any object
    ("json-object", {"type": "object"}, "", set()),
    ("object-open-required", {"type": "object", "properties": {"answer": _s(maxLength=30)}, "required": ["answer"]},
     'a JSON object whose "answer" is Paris, the capital of France', set()),
]
STRUCTURES += [(f"book-required-{r}-extra-{e}", _obj(BOOK, _REQUIRED[r], _EXTRA[e]),
                "a book as JSON: title, year and genre", {f"required {r}", f"additionalProperties {e}"})
               for r in _REQUIRED for e in _EXTRA]


# An instance shown in the prompt where the schema bounds nothing (recursion, open strings, lists
# and objects): a 135M model copies its shape and stops, where alone it may nest or list forever.
EXAMPLES = {
    "recursive-tree": {"name": "Ann", "children": [{"name": "Bo", "children": []}]},
    "recursive-list": {"value": 1, "next": {"value": 2, "next": None}},
    "recursive-root": {"name": "docs", "parent": {"name": "home", "parent": None}},
    "recursive-expr": {"op": "+", "args": [1, 2]},
    "sdk-bug": {"title": "Page freezes", "severity": "low", "reporter": {"name": "Ben", "email": "ben@x.org"},
                "labels": ["viewer"]},
    "allof-ref-and-more": {"name": "Ada", "email": "ada@example.com"},
    "min-items-only": [4, 8, 15],
    "object-open-required": {"answer": "Paris"},
}


PROMPTS = {   # whole prompts, where "Give <what>." does not get the model to stop
    "min-length-long": 'Copy this JSON exactly: "elephant".',
    "json-object": 'Copy this JSON exactly: {"ok": true}.',
    "recursive-category": 'Give as JSON: Food contains Fruit; Fruit contains nothing. For example, Toys containing '
                          'Dolls is {"name": "Toys", "sub": [{"name": "Dolls", "sub": []}]}.',
}


def corpus() -> list[Case]:
    cases = [c for i, (name, leaf, what) in enumerate(LEAVES) for c in _wrap(i, name, leaf, what)]
    for name, schema, what, tags in STRUCTURES:
        shown = f" For example: {json.dumps(EXAMPLES[name])}." if name in EXAMPLES else ""
        ask = PROMPTS.get(name, f"Give {what}.{shown}")
        cases.append(Case(name, schema, f"{ask} Reply with JSON only.", 256, frozenset(tags)))
    cases = [with_room(c) for c in cases]
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    assert set(PROMPTS) | set(EXAMPLES) <= set(ids), "a prompt or example for no case"
    return cases


_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames", "unevaluatedProperties")
_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


def with_room(case: Case) -> Case:
    """The case with room for its longest format value: a model writing junk at T=1 may run a
    string to the engine's bound (runtime/schema_finite.py; uri 256), about a token a character."""
    longest = max((n for f, n in FORMAT_MAX_LENGTH.items() if f"format: {f}" in keywords(case.schema)), default=0)
    return dataclasses.replace(case, max_tokens=case.max_tokens + longest) if longest else case


def keywords(schema: Any) -> set[str]:
    """The keywords a schema uses anywhere, with "type list", "enum with null", "format: X" and
    "additionalProperties: schema" told apart (annotations' and enum/const values not walked)."""
    found, stack = set(), [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        found |= set(node)
        if isinstance(node.get("type"), list):
            found.add("type list")
        if None in node.get("enum", ()):
            found.add("enum with null")
        if isinstance(node.get("format"), str):
            found.add(f"format: {node['format']}")
        if isinstance(node.get("additionalProperties"), dict):
            found.add("additionalProperties: schema")
        for k in _MAPS:
            stack.extend(node.get(k, {}).values() if isinstance(node.get(k), dict) else ())
        for k in _ONE + _LISTS:
            v = node.get(k)
            stack.extend(v if isinstance(v, list) else [v])
    return found


# Keywords outside the list: enforced (every output valid) or refused with the keyword's name.
OUTSIDE: list[tuple[str, str, dict, str]] = [
    ("not", "not", {"enum": ["red", "green", "blue"], "not": {"const": "red"}}, "the colour of a fire truck"),
    ("if-then-else", "if", {**_obj({"kind": {"enum": ["a", "b"]}, "n": {"type": "integer"}}),
                            "if": {"properties": {"kind": {"const": "a"}}}, "then": {"properties": {"n": {"const": 1}}},
                            "else": {"properties": {"n": {"const": 2}}}}, 'kind "a" with n 5'),
    ("uniqueItems", "uniqueItems", {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 2, "maxItems": 3,
                                    "uniqueItems": True}, 'the list "a", "a", "a"'),
    ("patternProperties", "patternProperties", {"type": "object", "patternProperties": {"^x_[a-z]+$": {"type": "integer"}},
                                                "minProperties": 1, "additionalProperties": False}, "x_apples: 3"),
    ("propertyNames", "propertyNames", {"type": "object", "propertyNames": {"pattern": "^[a-z]{1,5}$"},
                                        "additionalProperties": {"type": "integer"}}, "Apples: 3, Pears: 5"),
    ("minProperties", "minProperties", {"type": "object", "additionalProperties": {"type": "integer"},
                                        "minProperties": 2}, "an empty object"),
    ("contains", "contains", {"type": "array", "items": {"type": "integer"}, "contains": {"const": 7}, "maxItems": 3},
     "the numbers 1, 2"),
    ("dependentRequired", "dependentRequired", {"type": "object", "properties": {
        "card": _s(maxLength=19), "cvv": _s(pattern="^[0-9]{3}$")}, "dependentRequired": {"card": ["cvv"]},
        "additionalProperties": False}, 'a payment with "card" 4111 1111 1111 1111 and no cvv'),
    ("unevaluatedProperties", "unevaluatedProperties", {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}],
                                                        "unevaluatedProperties": False}, 'an object with "a" 1 and "b" 2'),
    ("format-uri", "uri", _s(format="uri"), "the text hello"),
]
