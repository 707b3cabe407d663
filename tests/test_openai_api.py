"""The llama-cpp-python-style API on Generator: create_chat_completion / create_completion /
__call__ return what the openai SDK's own types accept, streamed chunks join to the same text, and
unsupported arguments are refused by name."""

from __future__ import annotations

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from llamaspec.errors import UsageError
from llamaspec.generator import Generator

MESSAGES = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def llm(smollm2_q4):
    with Generator(smollm2_q4, temperature=0, max_tokens=16, threads=1) as g:
        yield g


def test_chat_completion_is_an_openai_object_with_the_generate_text(llm):
    out = llm.create_chat_completion(MESSAGES, max_tokens=12)
    ChatCompletion.model_validate(out)
    assert out["choices"][0]["message"]["content"] == llm.generate(MESSAGES).text[: len(out["choices"][0]["message"]["content"])]
    assert out["usage"]["completion_tokens"] == 12 and out["choices"][0]["finish_reason"] == "length"
    assert out["model"] == llm.model_name and "draft_n" in out["timings"]


def test_streamed_chat_chunks_join_to_the_same_text(llm):
    whole = llm.create_chat_completion(MESSAGES)
    chunks = list(llm.create_chat_completion(MESSAGES, stream=True, stream_options={"include_usage": True}))
    for c in chunks:
        ChatCompletionChunk.model_validate(c)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == whole["choices"][0]["message"]["content"]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]


def test_completion_and_call_are_raw_text_completions(llm):
    out = llm.create_completion("The capital of France is", max_tokens=6)
    Completion.model_validate(out)
    called = llm("The capital of France is", max_tokens=6)
    Completion.model_validate(called)
    assert called["choices"][0]["text"] == out["choices"][0]["text"] and called["object"] == "text_completion"
    streamed = "".join(c["choices"][0]["text"] for c in llm.create_completion("The capital of France is", max_tokens=6,
                                                                                stream=True))
    assert streamed == out["choices"][0]["text"]


@pytest.mark.parametrize("kwargs, field", [({"n": 2}, "n"), ({"logprobs": True}, "logprobs"),
                                           ({"tools": [{"type": "function"}]}, "tools"),
                                           ({"temperature": -1}, "temperature"), ({"top_p": 5}, "top_p")])
def test_unsupported_or_bad_arguments_are_refused_by_name(llm, kwargs, field):
    with pytest.raises(UsageError, match=field):
        llm.create_chat_completion(MESSAGES, **kwargs)


def test_per_call_sampling_applies(llm):
    hot = dict(temperature=2.0, seed=7, max_tokens=10)
    # top_k 1 makes any temperature greedy: the text equals the greedy one
    greedy = llm.create_chat_completion(MESSAGES, max_tokens=10)["choices"][0]["message"]["content"]
    assert llm.create_chat_completion(MESSAGES, top_k=1, **hot)["choices"][0]["message"]["content"] == greedy
