"""Issue 34: every hostile schema or grammar is refused before any compiler runs (a GrammarError
naming the field, fast), a schema inside the bounds converts quickly, and the converter's own
mistakes are fixed in our preprocessing (type lists, $ref by path, {m,n}, JSON-safe patterns).
No model here: grammar_safety tests run the grammars on SmolLM2."""

from __future__ import annotations

import itertools
import json
import time

import pytest

from llamaspec.openai.fields import RequestError
from llamaspec.openai.requests import parse_chat
from llamaspec.runtime import grammar_bounds as B
from llamaspec.runtime.grammar import GrammarError, GrammarSpec, grammar_from_schema
from llamaspec.runtime.grammar_schema import json_safe_class, json_safe_pattern_rule, schema_to_gbnf
from llamaspec.runtime.grammar_types import Unsatisfiable, split_types

LETTERS = [chr(c) for c in range(0xE0, 0x100)]


def colliding_names(n: int) -> list[str]:
    """Property names that all sanitise to the same rule name ("a" + three letters from à-ÿ)."""
    return ["a" + "".join(t) for t in itertools.islice(itertools.product(LETTERS, repeat=3), n)]


def _nested(depth: int) -> dict:
    d: dict = {"type": "string"}
    for _ in range(depth - 1):
        d = {"type": "object", "properties": {"x": d}, "required": ["x"]}
    return d


HOSTILE = {
    "50000 colliding properties": {"type": "object", "properties": {n: {} for n in colliding_names(50_000)}},
    "100000 enum values": {"enum": [f"v{i}" for i in range(100_000)]},
    "nesting 40 deep": _nested(40),
    "minLength 5000": {"type": "string", "minLength": 5000},
    "maxItems 10**6": {"type": "array", "items": {"type": "integer"}, "maxItems": 1_000_000},
    "300 optional properties": {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(300)}},
    "a property that is not a schema": {"type": "object", "properties": {"city": "string"}},
    "properties not an object": {"type": "object", "properties": ["city"]},
    "anyOf not an array": {"anyOf": {"type": "string"}},
    "an unknown type": {"type": "strin"},
    "a maxLength that is not a number": {"type": "string", "maxLength": "10"},
    "more than a megabyte of JSON": {"type": "object", "properties": {"x": {"type": "string", "description": "d" * 1_100_000}}},
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_schema_is_refused_naming_the_field_at_once(name):
    t = time.perf_counter()
    with pytest.raises(GrammarError) as e:
        grammar_from_schema(HOSTILE[name], "response_format")
    assert e.value.field == "response_format" and e.value.message.startswith("response_format: ")
    assert time.perf_counter() - t < 2.0


def test_as_json_text_too():
    with pytest.raises(GrammarError, match="over the limit of 1,000,000"):
        grammar_from_schema(json.dumps(HOSTILE["more than a megabyte of JSON"]), "json_schema")
    with pytest.raises(GrammarError, match="nests too deep"):
        grammar_from_schema("[" * 100_000, "json_schema")


@pytest.mark.parametrize("gbnf, why", [
    ("root ::= " + "(" * 60_000 + '"a"' + ")" * 60_000, "nests"),
    ('root ::= "a"{2001}', "repetition"),
    ('root ::= "a"{0,100001}', "repetition"),
    ("root ::= " + '"x" ' * 600_000, "characters"),
])
def test_a_hostile_gbnf_is_refused_before_the_parser(gbnf, why):
    with pytest.raises(GrammarError, match=why) as e:
        B.check_gbnf(gbnf, "grammar")
    assert e.value.field == "grammar"


def test_parentheses_in_literals_classes_and_comments_do_not_count():
    B.check_gbnf('root ::= "(((((" [(((] # ((((((\n' * 100 + "root ::= " + "(" * 250 + '"a"' + ")" * 250, "grammar")


def test_the_server_bodies_are_400s_naming_the_field():
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(RequestError) as e:
        parse_chat({"messages": msgs, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": HOSTILE["100000 enum values"]}}})
    assert e.value.param == "response_format"
    with pytest.raises(RequestError) as e:
        parse_chat({"messages": msgs, "grammar": "root ::= " + "(" * 60_000 + '"a"' + ")" * 60_000})
    assert e.value.param == "grammar" or "nests" in e.value.message


def test_batch_lines_and_the_python_api_share_the_bounds():
    from llamaspec.api.constraints import grammar_of
    from llamaspec.batch.requests import LineError, parse_requests
    from llamaspec.openai.requests import check_fields

    (line,) = parse_requests([json.dumps({"prompt": "x", "json_schema": HOSTILE["100000 enum values"]})])
    assert isinstance(line, LineError) and line.param == "json_schema"
    with pytest.raises(RequestError) as e:
        check_fields({"json_schema": HOSTILE["100000 enum values"]})
    assert e.value.param == "json_schema"
    with pytest.raises(GrammarError, match="nests"):
        grammar_of("root ::= " + "(" * 60_000 + '"a"' + ")" * 60_000, None)
    with pytest.raises(GrammarError, match="properties"):
        grammar_of(None, HOSTILE["50000 colliding properties"], schema_field="-j/--json-schema")


TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}


def test_malformed_tool_fields_are_400s_naming_the_field():
    """Planned where every way in prepares a request (api/constraints.py; serve answers its UsageError 400)."""
    from llamaspec.api.constraints import constraints
    from llamaspec.api.preparation import checked
    from llamaspec.api.request import Request
    from llamaspec.errors import UsageError

    def prepared(**body):
        return constraints(checked(Request(**parse_chat({"messages": [{"role": "user", "content": "hi"}], **body}).fields)),
                           None, None, None)

    with pytest.raises(UsageError) as e:
        prepared(tools=[TOOL], tool_choice={"type": "function", "function": "get_weather"})
    assert e.value.field == "tool_choice.function"
    bad = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": "string"}}}}
    with pytest.raises(UsageError) as e:
        prepared(tools=[bad])
    assert e.value.field == "tools[0].function.parameters" and "properties.city" in e.value.message


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {n: {"type": "string"} for n in colliding_names(B.MAX_PROPERTIES)},
     "required": colliding_names(B.MAX_PROPERTIES)},
    {"enum": [f"value-{i:05d}-" + "x" * 48 for i in range(B.MAX_ENUM)]},
    _nested(B.MAX_SCHEMA_DEPTH),
    {"type": "string", "minLength": B.MAX_MIN_REPEAT, "maxLength": B.MAX_REPEAT},
    {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(B.MAX_OPTIONAL)}},
], ids=["properties", "enum", "depth", "repetition", "optional"])
def test_a_schema_at_the_limits_converts_in_seconds(schema):
    t = time.perf_counter()
    spec = grammar_from_schema(schema, "json_schema")
    assert time.perf_counter() - t < 5.0 and spec.schema is not None and spec.gbnf == ""


def test_a_type_list_keeps_enum_properties_and_pattern():
    assert split_types({"type": ["string", "null"], "enum": ["red", "green"]}) == {
        "type": "string", "enum": ["red", "green"]}
    both = split_types({"type": ["object", "null"], "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    assert both["anyOf"] == [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                             {"type": "null"}]
    gbnf = schema_to_gbnf({"type": ["string", "null"], "pattern": "^a+$"})
    assert '"a"+' in gbnf.replace(" ", "") or '"a"+' in gbnf
    with pytest.raises(Unsatisfiable):
        split_types({"type": ["integer", "null"], "enum": ["red"]})
    with pytest.raises(GrammarError, match="Unsatisfiable schema"):   # (llguidance's words)
        grammar_from_schema({"type": ["integer", "null"], "enum": ["red"]})


def test_the_type_list_enum_grammar_names_only_the_values():
    gbnf = schema_to_gbnf({"type": ["string", "null"], "enum": ["red", "green"]})
    root = next(line for line in gbnf.splitlines() if line.startswith("root ::="))
    assert root == 'root ::= "\\"red\\"" | "\\"green\\""'


def test_refs_resolve_by_their_whole_path():
    gbnf = schema_to_gbnf({"type": "object", "properties": {
        "a": {"$ref": "#/$defs/X"}, "b": {"$ref": "#/$defs/inner/$defs/X"}, "X": {"type": "boolean"}},
        "required": ["a", "b", "X"],
        "$defs": {"X": {"type": "integer"}, "inner": {"$defs": {"X": {"type": "string", "maxLength": 3}}}}})
    rules = dict(line.split(" ::= ", 1) for line in gbnf.splitlines())

    def follow(name: str) -> str:
        while rules[name] in rules:
            name = rules[name]
        return rules[name]

    assert follow(rules["a"]).startswith('("-"? integral-part)')
    assert "char{0,3}" in follow(rules["b"])
    assert rules["X-kv"].endswith(" boolean")   # the property named X keeps its own schema


def test_repetitions_are_gbnf_counts_not_nested_groups():
    assert 'char{0,100000}' in schema_to_gbnf({"type": "string", "maxLength": 100_000})
    assert '("," space integer){1,4}' in schema_to_gbnf({"type": "array", "items": {"type": "integer"},
                                                          "minItems": 2, "maxItems": 5})


def test_pattern_rules_never_write_a_raw_quote_or_backslash():
    assert json_safe_class("[^a-z]") == '[^a-z"\\\\\\x00-\\x1F\\x7F]'
    assert json_safe_class("[ -~]") == "[\\x20-\\x21\\x23-\\x5B\\x5D-\\x7E]"
    assert json_safe_class('["]') == "[^\\x00-\\U0010FFFF]"
    assert json_safe_pattern_rule('"\\"" "a\\"b" [^x] "\\"" space') == '"\\"" "a\\\\\\"b" [^x"\\\\\\x00-\\x1F\\x7F] "\\"" space'
    gbnf = schema_to_gbnf({"type": "string", "pattern": "^a.[^b]$"})
    assert 'dot ::= [^\\x0A\\x0D"\\\\\\x00-\\x1F\\x7F]' in gbnf


def test_enum_values_with_a_backslash_are_escaped_as_json():
    gbnf = schema_to_gbnf({"enum": ["a\\b"]})
    # GBNF "\"a\\\\b\"" is the JSON text "a\\b" (a backslash escaped), not "a\b" (a backspace)
    assert '"\\"a\\\\\\\\b\\""' in gbnf


def test_non_ascii_names_and_values_stay_raw_characters():
    """As before the backslash fix: the characters themselves, not the escapes json.dumps writes."""
    gbnf = schema_to_gbnf({"type": "object", "properties": {"café": {"enum": ["thé", "x\u0001"]}},
                           "required": ["café"]})
    assert '"\\"café\\""' in gbnf and '"\\"thé\\""' in gbnf
    assert '"\\"x\\\\u0001\\""' in gbnf   # a control character stays a JSON escape
    assert '"\\"é' in schema_to_gbnf({"enum": [f"é{i}" for i in range(20)]})


def test_a_large_enum_is_a_radix_tree():
    gbnf = schema_to_gbnf({"enum": [f"item-{i}" for i in range(1000)]})
    assert max(len(line) for line in gbnf.splitlines()) < 400 and "root-e" in gbnf


def test_colliding_rule_names_convert_in_linear_time():
    names = colliding_names(B.MAX_PROPERTIES)
    t = time.perf_counter()
    schema_to_gbnf({"type": "object", "properties": {n: {"type": "integer"} for n in names}, "required": names})
    assert time.perf_counter() - t < 5.0


def test_grammar_spec_is_unchanged():
    assert GrammarSpec('root ::= "a"').field == "grammar"
