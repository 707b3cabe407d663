"""llamaspec/openai/ (requests.py, responses.py): the OpenAI objects it builds pass the official SDK's own types, and
request bodies parse into Request fields or a 400 naming the field. No model needed."""

from __future__ import annotations

import doctest
import os
import subprocess
import sys
from pathlib import Path

import openai
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from llamaspec.openai import requests as oa_req, responses as oa_resp
from llamaspec.api.generator import Request, Result

IDS = dict(id="chatcmpl-1", model="m.gguf", created=1_700_000_000)


def _result(text="Hello there", finish="stop", n_prompt=7):
    return Result("0", text, [1, 2, 3], finish, "eos", n_prompt,
                  {"drafted": 5, "accepted": 3, "prompt_seconds": 0.01, "gen_seconds": 0.2})


def test_doctests():
    from llamaspec.openai import fields, unsupported
    assert all(doctest.testmod(m).failed == 0 for m in (oa_req, oa_resp, fields, unsupported))


def test_chat_completion_is_an_sdk_chat_completion():
    r = _result()
    obj = ChatCompletion.model_validate(oa_resp.chat_completion(r, **IDS, timings=oa_resp.timings(r, cache_n=2)))
    assert obj.choices[0].message.content == "Hello there"
    assert obj.choices[0].message.role == "assistant"
    assert obj.choices[0].finish_reason == "stop"
    assert (obj.usage.prompt_tokens, obj.usage.completion_tokens, obj.usage.total_tokens) == (7, 3, 10)
    t = obj.model_extra["timings"]
    assert (t["cache_n"], t["prompt_n"], t["predicted_n"], t["draft_n"], t["draft_n_accepted"]) == (2, 5, 3, 5, 3)
    assert t["predicted_ms"] == pytest.approx(200.0) and t["predicted_per_second"] == pytest.approx(15.0)


@pytest.mark.parametrize("engine_reason, openai_reason", [("stop", "stop"), ("length", "length"),
                                                          ("context", "length"), ("interrupted", "stop")])
def test_finish_reasons_are_openai_values(engine_reason, openai_reason):
    # the SDK's type has a closed set of finish reasons: "context" would not validate
    obj = ChatCompletion.model_validate(oa_resp.chat_completion(_result(finish=engine_reason), **IDS))
    assert obj.choices[0].finish_reason == openai_reason
    obj = Completion.model_validate(oa_resp.text_completion(_result(finish=engine_reason), **IDS))
    assert obj.choices[0].finish_reason == openai_reason


def test_chat_chunks_are_sdk_chunks():
    first = ChatCompletionChunk.model_validate(oa_resp.chat_chunk(**IDS, role=True, include_usage=True))
    assert first.choices[0].delta.role == "assistant" and first.choices[0].delta.content == ""
    assert first.usage is None and "usage" in first.model_fields_set
    piece = ChatCompletionChunk.model_validate(oa_resp.chat_chunk(**IDS, content="Hel"))
    assert piece.choices[0].delta.content == "Hel" and piece.choices[0].delta.role is None
    assert "usage" not in piece.model_fields_set   # without include_usage the key is absent
    last = ChatCompletionChunk.model_validate(oa_resp.chat_chunk(**IDS, finish_reason="context",
                                                             timings={"predicted_n": 3}))
    assert last.choices[0].finish_reason == "length" and last.choices[0].delta.content is None
    usage = ChatCompletionChunk.model_validate(oa_resp.chat_chunk(**IDS, usage=oa_resp.usage(4, 2)))
    assert usage.choices == [] and usage.usage.total_tokens == 6


def test_completion_objects_are_sdk_completions():
    obj = Completion.model_validate(oa_resp.text_completion(_result(" 4, 5"), **IDS))
    assert obj.object == "text_completion" and obj.choices[0].text == " 4, 5"
    # a piece mid-stream has finish_reason null, as OpenAI streams it; the SDK's Completion type
    # (which the SDK also uses for stream pieces, unvalidated) only allows the final values
    raw = oa_resp.completion_chunk(**IDS, text=" 4", include_usage=True)
    assert raw["choices"][0]["finish_reason"] is None
    chunk = Completion.model_validate({**raw, "choices": [{**raw["choices"][0], "finish_reason": "stop"}]})
    assert chunk.choices[0].text == " 4" and chunk.usage is None and "usage" in chunk.model_fields_set
    last = Completion.model_validate(oa_resp.completion_chunk(**IDS, finish_reason="length"))
    assert last.choices[0].finish_reason == "length" and last.choices[0].text == ""
    usage = Completion.model_validate(oa_resp.completion_chunk(**IDS, usage=oa_resp.usage(4, 2)))
    assert usage.choices == [] and usage.usage.completion_tokens == 2


def test_error_body_shape():
    assert oa_resp.error_body("n is not supported", param="n") == {
        "error": {"message": "n is not supported", "type": "invalid_request_error", "param": "n", "code": None}}
    assert oa_resp.error_body("busy", status=503)["error"]["type"] == "server_error"
    assert oa_resp.error_body("no key", status=401, code="invalid_api_key")["error"]["type"] == "authentication_error"


def test_model_list():
    from openai.types import Model as SdkModel

    body = oa_resp.model_list(["a.gguf"], 5)
    assert body["object"] == "list" and SdkModel.model_validate(body["data"][0]).id == "a.gguf"


# ---- parsing -------------------------------------------------------------------------------------

def test_chat_body_to_request_fields():
    p = oa_req.parse_chat({
        "model": "anything", "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}],
        "temperature": 0, "top_p": 0.5, "top_k": 3, "min_p": 0.1, "repeat_penalty": 1.1, "seed": 4,
        "stop": "\n", "max_tokens": 9, "max_completion_tokens": 12,
        "stream": True, "stream_options": {"include_usage": True}, "n": 1, "logprobs": False})
    req = Request(**p.fields)
    assert req.prompt == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi \nthere"}]   # text parts joined by newlines, as vLLM
    assert (req.temperature, req.top_p, req.top_k, req.min_p, req.repeat_penalty, req.seed) == (0, 0.5, 3, 0.1, 1.1, 4)
    assert req.stop == ["\n"] and req.max_tokens == 12   # max_completion_tokens wins
    assert req.chat is None and p.stream and p.include_usage and p.model == "anything"


def test_completion_body_is_raw_text():
    p = oa_req.parse_completion({"prompt": ["1, 2, 3,"], "max_tokens": 4})
    assert p.fields["prompt"] == "1, 2, 3," and p.fields["chat"] is False and not p.stream
    assert not oa_req.parse_completion({"prompt": "x", "stream_options": {"include_usage": True}}).include_usage


@pytest.mark.parametrize("field, value", [
    ("n", 2), ("best_of", 3), ("echo", True), ("suffix", "x"), ("guided_regex", "a+"),
    ("functions", [{"name": "f"}]), ("function_call", "auto"),
])
def test_unsupported_fields_are_named(field, value):
    with pytest.raises(oa_req.RequestError) as e:
        oa_req.parse_chat({"messages": [{"role": "user", "content": "Hi"}], field: value})
    assert e.value.param == field and field in e.value.message


@pytest.mark.parametrize("body, param", [
    ([1, 2], None),
    ({}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -2}, "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "seed": True}, "seed"),
    ({"messages": [{"role": "user", "content": "x"}], "stop": [1]}, "stop"),
    ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
])
def test_bad_chat_bodies_name_the_field(body, param):
    with pytest.raises(oa_req.RequestError) as e:
        oa_req.parse_chat(body)
    assert e.value.param == param


def test_bad_completion_prompts():
    for body in ({"prompt": 3}, {"prompt": ["a", "b"]}, {}):
        with pytest.raises(oa_req.RequestError) as e:
            oa_req.parse_completion(body)
        assert e.value.param == "prompt"


def test_engine_validation_errors_carry_their_field():
    from llamaspec.errors import UsageError
    from llamaspec.speculative.sampling_params import SamplingParams

    with pytest.raises(UsageError) as e:
        SamplingParams(temperature=-1.0)
    assert e.value.field == "temperature"   # (what the server answers as `param`; no parsing of the message)


def test_without_the_server_extra_one_line_names_it(tmp_path):
    fake = tmp_path / "no-extra" / "fastapi"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named fastapi', name='fastapi')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake.parent), str(Path(__file__).resolve().parents[1])])}
    p = subprocess.run([sys.executable, "-m", "llamaspec", "serve", "no-such-model.gguf"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert p.returncode == 1 and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) <= 2 and "server" in lines[0] and "pip install 'llamaspec[server]'" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def test_a_port_in_use_is_one_line_before_any_model_loads(run_cli):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        r = run_cli("serve", "no-such-model.gguf", "--port", str(port))
    assert r.exit_code == 1 and f"cannot listen on 127.0.0.1:{port}" in r.stderr and "--port" in r.stderr
    assert "no-such-model" not in r.stderr   # the socket is checked first


def test_prompt_cache_doctests_and_lru():
    """The RAM prompt cache (speculative/prompt_cache.py): longest shared prefix wins, least recently
    used entries go first past the byte limit, a state over the limit is not kept."""
    import doctest

    from llamaspec.speculative import prompt_cache

    assert doctest.testmod(prompt_cache).failed == 0
    c = prompt_cache.PromptCache(limit_bytes=8)
    c.put([1, 2], bytearray(4))
    c.put([3, 4], bytearray(4))
    c.get((1, 2))                      # used: now [3, 4] is the oldest
    c.put([5, 6], bytearray(4))
    assert sorted(c.keys()) == [(1, 2), (5, 6)] and c.size == 8
    c.put([9], bytearray(9))           # bigger than the whole cache: not kept, nothing evicted
    assert sorted(c.keys()) == [(1, 2), (5, 6)]
    assert c.best([5, 6, 7]) == ((5, 6), 2) and c.best([8]) == (None, 0)


def test_tool_calls_and_logprobs_are_sdk_shapes():
    from openai.types import Completion as SdkCompletion
    from openai.types.chat import ChatCompletion as SdkChat

    from llamaspec.speculative.logprobs import TokenLogprob

    pieces = {1: b"Hel", 2: b"lo", 3: "é".encode()}.__getitem__
    lps = [TokenLogprob(1, -0.25, ((1, -0.25), (3, -2.0))), TokenLogprob(2, -0.5, ((2, -0.5), (1, -1.5)))]
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    r = Result("0", "Hello", [1, 2], "tool_calls", "eos", 3, {}, logprobs=lps, tool_calls=[call], content=None)
    chat = SdkChat.model_validate(oa_resp.chat_completion(r, **IDS, piece=pieces)).choices[0]
    assert chat.finish_reason == "tool_calls" and chat.message.content is None
    assert chat.message.tool_calls[0].function.arguments == '{"x": 1}'
    assert [t.token for t in chat.logprobs.content] == ["Hel", "lo"]
    assert chat.logprobs.content[0].top_logprobs[1].bytes == list("é".encode())
    plain = Result("0", "Hello", [1, 2], "stop", "eos", 3, {}, logprobs=lps)
    text = SdkCompletion.model_validate(oa_resp.text_completion(plain, **IDS, piece=pieces)).choices[0].logprobs
    assert (text.tokens, text.token_logprobs, text.text_offset) == (["Hel", "lo"], [-0.25, -0.5], [0, 3])
    assert text.top_logprobs[1] == {"lo": -0.5, "Hel": -1.5}
