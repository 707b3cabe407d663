"""The llama-cpp-python-style API on Generator: create_chat_completion / create_completion /
__call__ return what the openai SDK's own types accept, streamed chunks join to the same text, and
unsupported arguments are refused by name.

Calls after the first reuse the cached prompt (another batch shape than a first evaluation), so
texts that should agree are judged as the engine tests judge them: identical, or first different
at a near-tie of this Q4_1 model (engine_helpers.same_text_or_near_tie)."""

from __future__ import annotations

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from engine_helpers import prompt_tokens, same_text_or_near_tie
from llamaspec.errors import UsageError
from llamaspec.api.generator import Generator

MESSAGES = [{"role": "user", "content": "Name three colours."}]
EPS = 1.1   # Q4_1: a logit moves by up to 1.05 between batch shapes (engine_helpers)


def _agree(llm, prompt: list[int], reference: str, got: str, label: str) -> None:
    print(same_text_or_near_tie(llm.pipeline.target, prompt, reference, got, EPS, label))


def _chat_prompt(llm) -> list[int]:
    return prompt_tokens(llm.pipeline.target, MESSAGES[0]["content"])


@pytest.fixture(scope="module")
def llm(smollm2_q4):
    with Generator(smollm2_q4, temperature=0, max_tokens=16, threads=1) as g:
        yield g


def test_chat_completion_is_an_openai_object_with_the_generate_text(llm):
    out = llm.create_chat_completion(MESSAGES, max_tokens=12)
    ChatCompletion.model_validate(out)
    _agree(llm, _chat_prompt(llm), llm.generate(MESSAGES, max_tokens=12).text, out["choices"][0]["message"]["content"],
           "create_chat_completion vs generate")
    assert out["usage"]["completion_tokens"] == 12 and out["choices"][0]["finish_reason"] == "length"
    assert out["model"] == llm.model_name and "draft_n" in out["timings"]


def test_streamed_chat_chunks_join_to_the_same_text(llm):
    whole = llm.create_chat_completion(MESSAGES)
    chunks = list(llm.create_chat_completion(MESSAGES, stream=True, stream_options={"include_usage": True}))
    for c in chunks:
        ChatCompletionChunk.model_validate(c)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    _agree(llm, _chat_prompt(llm), whole["choices"][0]["message"]["content"], text, "streamed vs whole")
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]


def test_completion_and_call_are_raw_text_completions(llm):
    out = llm.create_completion("The capital of France is", max_tokens=6)
    Completion.model_validate(out)
    called = llm("The capital of France is", max_tokens=6)
    Completion.model_validate(called)
    assert called["object"] == "text_completion"
    prompt = llm.pipeline.target.tokenize_prompt("The capital of France is")
    _agree(llm, prompt, out["choices"][0]["text"], called["choices"][0]["text"], "__call__ vs create_completion")
    streamed = "".join(c["choices"][0]["text"] for c in llm.create_completion("The capital of France is", max_tokens=6,
                                                                                stream=True))
    _agree(llm, prompt, out["choices"][0]["text"], streamed, "streamed vs whole")


@pytest.mark.parametrize("kwargs, field", [({"n": 2}, "n"), ({"top_logprobs": 3}, "top_logprobs"),
                                           ({"tools": [{"type": "function"}]}, "tools"),
                                           ({"temperature": -1}, "temperature"), ({"top_p": 5}, "top_p")])
def test_unsupported_or_bad_arguments_are_refused_by_name(llm, kwargs, field):
    with pytest.raises(UsageError, match=field):
        llm.create_chat_completion(MESSAGES, **kwargs)


def test_per_call_sampling_applies(llm):
    hot = dict(temperature=2.0, seed=7, max_tokens=10)
    # top_k 1 makes any temperature greedy: the text equals the greedy one
    greedy = llm.create_chat_completion(MESSAGES, max_tokens=10)["choices"][0]["message"]["content"]
    top1 = llm.create_chat_completion(MESSAGES, top_k=1, **hot)["choices"][0]["message"]["content"]
    _agree(llm, _chat_prompt(llm), greedy, top1, "top_k 1 at temperature 2 vs greedy")


def test_structured_output_logprobs_and_tools_through_the_python_api(llm):
    import json

    from llama_cpp.llama_grammar import LlamaGrammar
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    out = llm.create_chat_completion(MESSAGES, max_tokens=20, logprobs=True, top_logprobs=1,
                                     response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    body = ChatCompletion.model_validate(out)
    assert isinstance(json.loads(body.choices[0].message.content)["n"], int)
    assert len(body.choices[0].logprobs.content) == body.usage.completion_tokens
    chunks = [ChatCompletionChunk.model_validate(c) for c in
              llm.create_chat_completion(MESSAGES, max_tokens=20, logprobs=True, stream=True,
                                         response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})]
    streamed = [t.token for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert "".join(streamed) == body.choices[0].message.content
    # llama-cpp-python's grammar argument: GBNF text or its LlamaGrammar object
    yes_no = 'root ::= "yes" | "no"'
    for grammar in (yes_no, LlamaGrammar.from_string(yes_no, verbose=False)):
        assert llm.create_chat_completion(MESSAGES, grammar=grammar)["choices"][0]["message"]["content"] in ("yes", "no")
    tools = [{"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]
    ask = [{"role": "user", "content": "Add 2 and 3."}]
    one = dict(tools=tools, tool_choice="required", parallel_tool_calls=False, max_tokens=120)   # (Q4 repeats calls)
    call = llm.create_chat_completion(ask, **one)["choices"][0]
    assert call["finish_reason"] == "tool_calls" and call["message"]["tool_calls"][0]["function"]["name"] == "add"
    deltas = [c["choices"][0]["delta"] for c in llm.create_chat_completion(ask, **one, stream=True) if c["choices"]]
    args = "".join(d["tool_calls"][0]["function"].get("arguments", "") for d in deltas if "tool_calls" in d)
    assert set(json.loads(args)) == {"a", "b"}
