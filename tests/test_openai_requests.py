"""llamaspec/openai/requests.py and response_format.py: each structured-output field of a request
body (OpenAI's, llama-server's, vLLM's) becomes the Request field the engine takes, and each
refusal is one RequestError naming the field. Pure functions: no model is loaded (the JSON schema
converter is llama-cpp-python's own)."""

from __future__ import annotations

import doctest

import pytest

from llamaspec.api.generator import Request
from llamaspec.openai import messages, requests as oa_req, response_format
from llamaspec.runtime.grammar import GrammarSpec, grammar_from_schema

MSG = [{"role": "user", "content": "Hi"}]
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]


def _chat(**fields):
    return oa_req.parse_chat({"messages": MSG, **fields}).fields


def _refused(param: str, parse=oa_req.parse_chat, **fields) -> str:
    body = {"messages": MSG, **fields} if parse is oa_req.parse_chat else {"prompt": "x", **fields}
    with pytest.raises(oa_req.RequestError) as e:
        parse(body)
    assert e.value.param == param and param in e.value.message, (e.value.param, e.value.message)
    assert "\n" not in e.value.message
    return e.value.message


def test_doctests():
    for mod in (messages, response_format, oa_req):
        assert doctest.testmod(mod).failed == 0, mod.__name__


@pytest.mark.parametrize("field, value, gbnf", [
    ("response_format", {"type": "json_object"}, grammar_from_schema({}).gbnf),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON, "strict": True}},
     grammar_from_schema(PERSON).gbnf),
    ("json_schema", PERSON, grammar_from_schema(PERSON).gbnf),              # llama-server's
    ("guided_json", PERSON, grammar_from_schema(PERSON).gbnf),              # vLLM's
    ("guided_json", '{"type": "integer"}', grammar_from_schema({"type": "integer"}).gbnf),
    ("grammar", 'root ::= "yes" | "no"', 'root ::= "yes" | "no"'),
    ("guided_grammar", 'root ::= [0-9]+', 'root ::= [0-9]+'),
    ("guided_choice", ["red", 'say "hi"\n'], 'root ::= "red" | "say \\"hi\\"\\x0A"'),
])
def test_each_constraint_becomes_one_grammar_naming_its_field(field, value, gbnf):
    spec = _chat(**{field: value})["grammar"]
    assert isinstance(spec, GrammarSpec) and spec.field == field and spec.gbnf == gbnf
    Request(**_chat(**{field: value}))   # the engine's Request takes what the parser gives


def test_text_format_and_absent_fields_constrain_nothing():
    assert "grammar" not in _chat(response_format={"type": "text"})
    assert "grammar" not in _chat() and "logprobs" not in _chat() and "logit_bias" not in _chat()


@pytest.mark.parametrize("a, b", [
    ({"response_format": {"type": "json_object"}}, {"grammar": 'root ::= "x"'}),
    ({"json_schema": PERSON}, {"guided_json": PERSON}),
    ({"grammar": 'root ::= "x"'}, {"guided_choice": ["a"]}),
])
def test_two_constraints_are_refused_naming_both(a, b):
    message = _refused(next(iter(b)), **a, **b)
    assert next(iter(a)) in message


@pytest.mark.parametrize("param, fields, words", [
    ("response_format", {"response_format": {"type": "xml"}}, "one of text, json_object, json_schema"),
    ("response_format", {"response_format": {"type": "json_schema"}}, "json_schema is required"),
    ("response_format", {"response_format": {"type": "json_schema", "json_schema": {"schema": []}}},
     "response_format.json_schema.schema must be an object"),
    ("response_format", {"response_format": "json"}, "response_format must be an object"),
    ("response_format", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "n", "schema": {"type": "array", "uniqueItems": True}}}}, "'uniqueItems'"),
    ("json_schema", {"json_schema": {"not": {"type": "integer"}}}, "'not'"),
    ("json_schema", {"json_schema": 5}, "must be a JSON schema"),
    ("guided_json", {"guided_json": "{not json"}, "not valid JSON"),
    ("grammar", {"grammar": "  "}, "non-empty"),
    ("grammar", {"grammar": 5}, "grammar must be a string"),
    ("guided_choice", {"guided_choice": []}, "non-empty array of strings"),
    ("guided_choice", {"guided_choice": ["a", 1]}, "non-empty array of strings"),
    ("guided_regex", {"guided_regex": "[0-9]+"}, "guided_grammar"),
    ("logit_bias", {"logit_bias": {"abc": 1}}, "not a token id"),
    ("logit_bias", {"logit_bias": {"12": 101}}, "from -100 to 100"),
    ("logit_bias", {"logit_bias": {"12": "x"}}, "from -100 to 100"),
    ("logit_bias", {"logit_bias": [1]}, "token ids to biases"),
    ("top_logprobs", {"top_logprobs": 2}, "needs logprobs: true"),
    ("top_logprobs", {"logprobs": True, "top_logprobs": 21}, "0 to 20"),
    ("logprobs", {"logprobs": 2}, "logprobs must be a boolean"),
    ("tools", {"tools": {"type": "function"}}, "tools must be an array, got object"),
    ("parallel_tool_calls", {"tools": TOOLS, "parallel_tool_calls": "yes"}, "must be a boolean"),
])
def test_structured_fields_refused_name_the_field(param, fields, words):
    assert words in _refused(param, **fields)


def _planned(**fields):
    """A chat body's fields, then its tools planned and its constraint weighed against them, as
    every way in prepares a request (api/constraints.py: once, with the chat template)."""
    from llamaspec.api.constraints import constraints
    from llamaspec.api.preparation import checked

    return constraints(checked(Request(**_chat(**fields))), None, None, None)


@pytest.mark.parametrize("param, fields, words", [
    ("tool_choice", {"tool_choice": "required"}, "needs tools"),
    ("tool_choice", {"tools": TOOLS, "tool_choice": "sometimes"}, 'must be "auto", "none", "required"'),
    ("json_schema", {"tools": TOOLS, "json_schema": PERSON}, "tool_choice"),
])
def test_tool_fields_refused_where_the_request_is_prepared_naming_the_field(param, fields, words):
    with pytest.raises(oa_req.UsageError) as e:
        _planned(**fields)
    assert e.value.field == param and words in e.value.message + (e.value.hint or ""), e.value.message


def test_tools_are_checked_by_the_tool_planner_naming_the_tool():
    with pytest.raises(oa_req.UsageError) as e:
        _planned(tools=[{"type": "function", "function": {"name": "no spaces"}}])
    assert e.value.field.startswith("tools[0].function.name")
    with pytest.raises(oa_req.UsageError, match="tool_choice.function.name"):
        _planned(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "other"}})


def test_logprobs_bias_and_tools_map_to_request_fields():
    f = _chat(logprobs=True, top_logprobs=3, logit_bias={"12": -100, "7": 2.5})
    assert (f["logprobs"], f["logit_bias"]) == (3, {12: -100.0, 7: 2.5})
    assert _chat(logprobs=True)["logprobs"] == 0 and "logprobs" not in _chat(logprobs=False)
    f = _chat(tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    assert (f["tools"], f["tool_choice"], f["parallel_tool_calls"]) == (TOOLS, "required", False)
    assert _chat(tools=TOOLS, tool_choice="none", json_schema=PERSON)["grammar"].field == "json_schema"
    req = Request(**f)
    assert req.tools == TOOLS and req.tool_choice == "required"


def test_completion_logprobs_is_a_count_up_to_chats_twenty():
    """One limit for every way in (OpenAI's completions stop at 5; its chat's top_logprobs at 20)."""
    assert oa_req.parse_completion({"prompt": "x", "logprobs": 20}).fields["logprobs"] == 20
    assert oa_req.parse_completion({"prompt": "x", "logprobs": 0}).fields["logprobs"] == 0
    for bad in (21, -1, True, "2"):
        _refused("logprobs", oa_req.parse_completion, logprobs=bad)


def test_tool_history_messages_are_kept_for_the_template():
    history = [{"role": "user", "content": "Weather?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "12 C"}]
    out = oa_req.parse_messages(history)
    assert out[1] == {"role": "assistant", "content": "", "tool_calls": history[1]["tool_calls"]}
    assert out[2] == {"role": "tool", "content": "12 C", "tool_call_id": "call_1"}


@pytest.mark.parametrize("msgs, words", [
    ([{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}], "only assistant messages"),
    ([{"role": "tool", "tool_call_id": "c"}], "messages[0].content must be"),
    ([{"role": "assistant", "tool_calls": [{"function": {"name": 3}}]}],
     "messages[0].tool_calls[0].function.name must be a string, got number"),
    ([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]}],
     "arguments must be a string (JSON text)"),
    ([{"role": "tool", "content": "x", "tool_call_id": 5}], "messages[0].tool_call_id must be a string"),
])
def test_bad_tool_messages_name_the_message(msgs, words):
    with pytest.raises(oa_req.RequestError) as e:
        oa_req.parse_messages(msgs)
    assert e.value.param == "messages" and words in e.value.message, e.value.message


def test_batch_lines_take_the_same_fields_in_both_forms():
    from llamaspec.batch.requests import LineError, parse_requests

    body = {"messages": MSG, "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}},
            "logprobs": True, "top_logprobs": 1, "logit_bias": {"5": -100}}
    import json

    openai_line = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": body})
    plain_line = json.dumps({"id": "b", **body})
    bad_line = json.dumps({"id": "c", "prompt": "x", "guided_choice": ["a"], "grammar": 'root ::= "a"'})
    a, b, c = parse_requests([openai_line, plain_line, bad_line])
    for r in (a, b):
        assert r.fields["grammar"].gbnf == grammar_from_schema(PERSON).gbnf
        assert (r.fields["logprobs"], r.fields["logit_bias"]) == (1, {5: -100.0})
    assert isinstance(c, LineError) and c.param == "guided_choice" and "grammar" in c.message
