"""A tool round trip through `llamaspec serve` with the official openai client (issue 26): SmolLM2 F16
(its template takes no tools: the generic form) with the default speculation. tool_choice "required"
or a named function gives calls whose arguments validate against the function's parameters schema
(jsonschema); the call and the tool's result go back in the history (the SDK's own message object,
then a `tool` message) and the follow-up with tool_choice "none" answers in text; streamed tool-call
deltas join to the non-streamed calls; the SDK's pydantic_function_tool + parse reads the arguments
back into the model."""

from __future__ import annotations

import json
from typing import Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel

from test_serve import Server

pytestmark = [pytest.mark.real, pytest.mark.slow]

WEATHER = {"type": "object", "properties": {"city": {"type": "string"},
                                            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Current time in a time zone",
                                           "parameters": TIME}}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]


@pytest.fixture(scope="module")
def server(smollm2_f16, tmp_path_factory):
    s = Server(smollm2_f16, tmp=tmp_path_factory.mktemp("serve-tools"))   # default speculation, as users get it
    yield s
    assert s.stop() == 0, s.log.read_text()


def _valid_calls(calls) -> list[tuple[str, dict]]:
    out = []
    for c in calls:
        assert c.type == "function" and c.id, c
        args = json.loads(c.function.arguments)
        jsonschema.validate(args, SCHEMAS[c.function.name])
        out.append((c.function.name, args))
    return out


def test_required_call_round_trip(server):
    client = server.client()
    r = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="required",
                                       parallel_tool_calls=False, temperature=0, max_tokens=100)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert len(choice.message.tool_calls) == 1, choice.message
    [(name, args)] = _valid_calls(choice.message.tool_calls)
    result = {"city": args.get("city", "Paris"), "temperature": 18, "unit": "celsius", "sky": "sunny"}
    # the history as SDK users send it: the reply's own message object, then the tool's result
    history = ASK + [choice.message, {"role": "tool", "tool_call_id": choice.message.tool_calls[0].id,
                                      "content": json.dumps(result)}]
    final = client.chat.completions.create(model="m", messages=history, tools=TOOLS, tool_choice="none",
                                           temperature=0, max_tokens=100)
    answer = final.choices[0]
    assert answer.finish_reason == "stop", answer
    assert not answer.message.tool_calls and isinstance(answer.message.content, str) and answer.message.content.strip()


def test_a_named_function_is_the_one_called(server):
    r = server.client().chat.completions.create(
        model="m", messages=ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}},
        parallel_tool_calls=False, temperature=0, max_tokens=100)
    assert r.choices[0].finish_reason == "tool_calls", r.choices[0]
    assert [name for name, _ in _valid_calls(r.choices[0].message.tool_calls)] == ["get_time"]


def test_parallel_required_calls_all_validate(server):
    r = server.client().chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="required",
                                                temperature=0, max_tokens=100)
    calls = r.choices[0].message.tool_calls
    assert calls and r.choices[0].finish_reason in ("tool_calls", "length"), r.choices[0]
    _valid_calls(calls)   # every whole call the reply holds (a call cut by max_tokens is not returned)
    assert len({c.id for c in calls}) == len(calls)


def test_streamed_tool_call_deltas_join_to_the_whole_call(server):
    client = server.client()
    kw = dict(model="m", messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
              temperature=0, max_tokens=100)
    whole = client.chat.completions.create(**kw).choices[0].message.tool_calls
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(**kw, stream=True):
        if not chunk.choices:
            continue
        finish = chunk.choices[0].finish_reason or finish
        for d in chunk.choices[0].delta.tool_calls or []:
            if d.index not in calls:   # OpenAI's shape: a call's first delta carries its id, type and name
                assert d.id and d.type == "function" and d.function.name, d
                calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
            else:
                assert d.id is None and not d.function.name, d
            calls[d.index]["arguments"] += d.function.arguments or ""
    assert finish == "tool_calls"
    assert sorted(calls) == list(range(len(calls)))
    assert [(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == \
        [(c.function.name, c.function.arguments) for c in whole]


class GetWeather(BaseModel):
    city: str
    unit: Literal["celsius", "fahrenheit"]


def test_pydantic_function_tool_arguments_parse_into_the_model(server):
    r = server.client().chat.completions.parse(model="m", messages=ASK, tools=[openai.pydantic_function_tool(GetWeather)],
                                               tool_choice="required", parallel_tool_calls=False, temperature=0,
                                               max_tokens=100)
    [call] = r.choices[0].message.tool_calls
    assert call.function.name == "GetWeather" and isinstance(call.function.parsed_arguments, GetWeather), call
    assert "Paris" in call.function.parsed_arguments.city
