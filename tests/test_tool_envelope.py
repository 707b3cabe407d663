"""A reply to a request with tools that makes no call, on a template without a native tool format
(SmolLM2's: the generic JSON form, whose grammar makes every reply one JSON object): the model
writes {"response": "..."} and the client gets the inner text as `content`, never the envelope,
whole and streamed, through the Python API (the server builds the same objects) and a batch
line's OpenAI record. On the real SmolLM2 Q4_1, greedy."""

from __future__ import annotations

import json

import pytest
from openai.types.chat import ChatCompletion

from llamaspec.batch.requests import parse_requests
from llamaspec.batch.results import result_record
from llamaspec.api.generator import Generator
from llamaspec.openai.tool_formats import GENERIC, detect_format

pytestmark = pytest.mark.real

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
# greedy, answered without a call (checked below: the test is about such a reply)
ASK = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


def test_a_reply_without_a_call_is_its_inner_text_not_the_envelope(smollm2_q4):
    kw = dict(tools=TOOLS, tool_choice="auto", max_tokens=40)
    # plain decoding, the prompt evaluated afresh each time: the three calls give the same reply
    with Generator(smollm2_q4, temperature=0, threads=1, spec_type="none") as g:
        assert detect_format(g.pipeline.target.chat_template) == GENERIC
        fresh = g.pipeline.engine.cached.clear
        raw = g.generate(ASK, **kw)
        fresh()
        whole = g.create_chat_completion(ASK, **kw)
        fresh()
        chunks = list(g.create_chat_completion(ASK, **kw, stream=True))
    # the model wrote the generic envelope, and made no call
    assert raw.tool_calls == [] and raw.finish_reason == "stop", raw
    inner = json.loads(raw.text)["response"]
    assert inner and raw.content == inner
    message = ChatCompletion.model_validate(whole).choices[0].message
    assert message.content == inner and not message.tool_calls, whole
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == inner
    # a batch line's OpenAI record is built from the same Result
    req = parse_requests([json.dumps({"custom_id": "a", "url": "/v1/chat/completions",
                                      "body": {"messages": ASK, **kw}})])[0]
    record = result_record(req, raw.text, raw.finish_reason, {"n_prompt": raw.n_prompt, "n_generated": 3},
                           "m", result=raw)
    body = ChatCompletion.model_validate(record["response"]["body"])
    assert body.choices[0].message.content == inner and not body.choices[0].message.tool_calls
