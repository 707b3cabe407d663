"""`llamaspec serve` with structured output on the real SmolLM2 F16, through the official openai
client and its own types: response_format json_schema (greedy output validates with jsonschema),
vLLM's guided_choice, logprobs (chat and completions, whole and streamed), logit_bias, tool calls
(whole and streamed), and the 400s naming the field when a grammar or bias cannot be used."""

from __future__ import annotations

import json

import jsonschema
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion

from test_serve import Server, http

pytestmark = [pytest.mark.real, pytest.mark.slow]

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Describe a fictional person as JSON with a name and an age."}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.fixture(scope="module")
def server(smollm2_f16, tmp_path_factory):
    s = Server(smollm2_f16, "--parallel", "2", tmp=tmp_path_factory.mktemp("serve-structured"))
    yield s
    assert s.stop() == 0, s.log.read_text()


def _post(server, path: str, body: dict):
    return http("POST", server.url + path, json_body=body, timeout=120)


def test_json_schema_reply_validates(server):
    r = server.client().chat.completions.create(
        model="m", messages=ASK, max_tokens=80,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    assert r.choices[0].finish_reason == "stop", r
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    any_json = server.client().chat.completions.create(model="m", messages=ASK, max_tokens=60,
                                                       response_format={"type": "json_object"})
    json.loads(any_json.choices[0].message.content)


def test_guided_choice_gives_one_of_the_strings(server):
    choices = ["red", "green", 'a "blue" one']
    r = _post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Pick a colour."}],
                                               "max_tokens": 10, "guided_choice": choices})
    assert r.status_code == 200, r.text
    assert ChatCompletion.model_validate(r.json()).choices[0].message.content in choices


def test_chat_logprobs_whole_and_streamed(server):
    client = server.client()
    kw = dict(model="m", messages=[{"role": "user", "content": "Name three colours."}], max_tokens=16,
              logprobs=True, top_logprobs=2)
    whole = client.chat.completions.create(**kw)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens
    assert "".join(t.token for t in content) == whole.choices[0].message.content
    for t in content:
        assert len(t.top_logprobs) == 2 and t.logprob <= 0 and bytes(t.bytes).decode("utf-8", "replace") == t.token
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob
        assert t.token == t.top_logprobs[0].token   # greedy, no grammar: the chosen token is the most likely
    streamed = [c for c in client.chat.completions.create(**kw, stream=True)]
    tokens = [t for c in streamed if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [t.token for t in tokens] == [t.token for t in content]
    assert all(abs(a.logprob - b.logprob) < 0.2 for a, b in zip(tokens, content))


def test_completion_logprobs(server):
    r = _post(server, "/v1/completions", {"prompt": "1, 2, 3,", "max_tokens": 6, "logprobs": 3})
    body = Completion.model_validate(r.json())
    lp = body.choices[0].logprobs
    assert len(lp.tokens) == body.usage.completion_tokens and "".join(lp.tokens) == body.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert all(len(top) == 3 and tok in top for tok, top in zip(lp.tokens, lp.top_logprobs))


def test_logit_bias_bans_the_greedy_token(server, smollm2_f16):
    import llama_cpp

    vocab = llama_cpp.Llama(str(smollm2_f16), vocab_only=True, verbose=False)
    client = server.client()
    kw = dict(model="m", messages=[{"role": "user", "content": "Say hello."}], max_tokens=4, logprobs=True)
    first = client.chat.completions.create(**kw).choices[0].logprobs.content[0]
    ids = vocab.tokenize(bytes(first.bytes), add_bos=False, special=True)
    assert len(ids) == 1, ids
    banned = client.chat.completions.create(**kw, logit_bias={str(ids[0]): -100}).choices[0].logprobs.content[0]
    assert banned.token != first.token


def test_tool_call_required_whole_and_streamed(server):
    client = server.client()
    kw = dict(model="m", messages=[{"role": "user", "content": "What is the weather in Paris?"}], max_tokens=80,
              tools=TOOLS, tool_choice="required")
    r = client.chat.completions.create(**kw)
    assert r.choices[0].finish_reason == "tool_calls", r
    calls = r.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather" and calls[0].id
    jsonschema.validate(json.loads(calls[0].function.arguments), TOOLS[0]["function"]["parameters"])
    names, args, finish = {}, {}, None
    for c in client.chat.completions.create(**kw, stream=True):
        if not c.choices:
            continue
        for d in c.choices[0].delta.tool_calls or ():
            names[d.index] = names.get(d.index, "") + (d.function.name or "")
            args[d.index] = args.get(d.index, "") + (d.function.arguments or "")
        finish = c.choices[0].finish_reason or finish
    assert finish == "tool_calls" and names[0] == "get_weather"
    assert json.loads(args[0]) == json.loads(calls[0].function.arguments)   # greedy: the same call


@pytest.mark.parametrize("body, param", [
    ({"response_format": {"type": "json_object"}, "grammar": 'root ::= "x"'}, "grammar"),
    ({"grammar": "root ::= nothing-defined"}, "grammar"),            # llama.cpp refuses it
    ({"guided_grammar": 'root ::= "unterminated'}, "guided_grammar"),
    ({"json_schema": {"type": "array", "uniqueItems": True}}, "json_schema"),   # not enforced: refused
    ({"logit_bias": {"999999": -100}}, "logit_bias"),                   # not in the vocabulary
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
])
def test_unusable_constraints_are_400s_naming_the_field(server, body, param):
    r = _post(server, "/v1/chat/completions", {"messages": ASK, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"].startswith(param) and "\n" not in err["message"], err
