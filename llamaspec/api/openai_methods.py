"""What llama-cpp-python users type, on a `Generator`: `create_chat_completion`,
`create_completion` and `__call__`, returning the OpenAI dicts that `llamaspec serve` sends (the
same builders, llamaspec/openai/responses.py), or with `stream=True` an iterator of chunks.

    with Generator("model.gguf", temperature=0) as llm:
        out = llm.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=32)
        print(out["choices"][0]["message"]["content"])
        for chunk in llm.create_chat_completion(messages, stream=True):
            print(chunk["choices"][0]["delta"].get("content", ""), end="")

Arguments are llama-cpp-python's and OpenAI's (`stream_options`, `max_completion_tokens`); a keyword
neither has is a TypeError (a typo such as `max_token=5` is not silently dropped). Sampling
arguments left out (or None) take the Generator's settings, not llama-cpp-python's own defaults
(max_tokens left out: no limit unless the Generator sets one). Arguments that would change the
output and are not implemented (n > 1, mirostat_mode != 0, tfs_z != 1, typical_p != 1,
logits_processor, stopping_criteria, ...) raise a UsageError naming them, as the server answers
400; their neutral values pass. response_format, grammar (GBNF text or a LlamaGrammar), tools,
logprobs and logit_bias work as in `serve` (llamaspec/openai/requests.py).
"""

from __future__ import annotations

from typing import Any, Iterator

from llamaspec.openai import requests as oa_req, responses as oa_resp
from llamaspec.openai.chunks import Chunks


class OpenAIMethods:
    """Mixed into `Generator`; needs its `generate`, `_request` and `model_name`.

    The signatures are llama-cpp-python's (same names, same positional order), plus OpenAI's
    names after the `*`; a keyword neither knows is a TypeError, as in llama-cpp-python."""

    def create_chat_completion(
            self, messages: list[dict], functions: list | None = None, function_call: Any = None,
            tools: list | None = None, tool_choice: Any = None, temperature: float | None = None,
            top_p: float | None = None, top_k: int | None = None, min_p: float | None = None,
            typical_p: float | None = None, stream: bool = False, stop: str | list[str] | None = None,
            seed: int | None = None, response_format: dict | None = None, max_tokens: int | None = None,
            presence_penalty: float | None = None, frequency_penalty: float | None = None,
            repeat_penalty: float | None = None, tfs_z: float | None = None, mirostat_mode: int | None = None,
            mirostat_tau: float | None = None, mirostat_eta: float | None = None, model: str | None = None,
            logits_processor: Any = None, grammar: Any = None, logit_bias: dict | None = None,
            logprobs: bool | None = None, top_logprobs: int | None = None, *,
            stream_options: dict | None = None, max_completion_tokens: int | None = None, n: int | None = None,
            user: str | None = None, metadata: dict | None = None, store: bool | None = None,
            parallel_tool_calls: bool | None = None, service_tier: str | None = None,
            modalities: list | None = None, audio: Any = None, prediction: Any = None,
            reasoning_effort: str | None = None, web_search_options: Any = None) -> dict | Iterator[dict]:
        """A `chat.completion` dict (or, with stream=True, `chat.completion.chunk` dicts)."""
        args = dict(locals())
        return self._openai(oa_req.parse_chat(_body(args, "messages")))

    def create_completion(
            self, prompt: str, suffix: str | None = None, max_tokens: int | None = None,
            temperature: float | None = None, top_p: float | None = None, min_p: float | None = None,
            typical_p: float | None = None, logprobs: int | None = None, echo: bool | None = None,
            stop: str | list[str] | None = None, frequency_penalty: float | None = None,
            presence_penalty: float | None = None, repeat_penalty: float | None = None, top_k: int | None = None,
            stream: bool = False, seed: int | None = None, tfs_z: float | None = None,
            mirostat_mode: int | None = None, mirostat_tau: float | None = None, mirostat_eta: float | None = None,
            model: str | None = None, stopping_criteria: Any = None, logits_processor: Any = None,
            grammar: Any = None, logit_bias: dict | None = None, *, stream_options: dict | None = None,
            max_completion_tokens: int | None = None, n: int | None = None, best_of: int | None = None,
            user: str | None = None) -> dict | Iterator[dict]:
        """A `text_completion` dict for raw text (no chat template), or its chunks with stream=True.
        max_tokens left out: the Generator's (no limit by default; llama-cpp-python's 16 is not copied)."""
        args = dict(locals())
        return self._openai(oa_req.parse_completion(_body(args, "prompt")))

    # As llama-cpp-python's `Llama.__call__`: `create_completion`, with its signature.
    __call__ = create_completion

    def _openai(self, parsed: "oa_req.Parsed") -> dict | Iterator[dict]:
        req = self._request(parsed.fields)
        rid, created, model = oa_resp.new_id(parsed.kind), oa_resp.now(), self.model_name
        piece = self._pipeline().target.piece
        if not parsed.stream:
            result = self.generate(req)
            build = oa_resp.chat_completion if parsed.kind == oa_req.CHAT else oa_resp.text_completion
            return build(result, id=rid, model=model, created=created, piece=piece,
                         timings=oa_resp.timings(result, result.stats.get("n_prompt_cached", 0)))
        stream = self.generate(req, stream=True)
        return self._chunks(Chunks(parsed.kind == oa_req.CHAT, dict(id=rid, model=model, created=created),
                                   parsed.include_usage, stream.tools, piece), stream)

    @staticmethod
    def _chunks(chunks: Chunks, stream) -> Iterator[dict]:
        yield from chunks.first()
        for text, logprobs in stream.with_logprobs():
            yield from chunks.text(text, logprobs)
        yield from chunks.end(stream.result)


# llama-cpp-python's arguments that would change the output and are not implemented, with the test
# of the values that ask for nothing (its defaults pass: a call written for it keeps working).
LLAMA_CPP_PYTHON_UNSUPPORTED = {
    "tfs_z": lambda v: v == 1, "mirostat_mode": lambda v: v == 0 and not isinstance(v, bool),
    "logits_processor": lambda v: not v, "stopping_criteria": lambda v: not v,
    "reasoning_effort": lambda v: v is None, "web_search_options": lambda v: v is None,   # (OpenAI's)
}
NEUTRAL = {"tfs_z": "1.0", "mirostat_mode": "0"}
# Python objects, not JSON values: checked here, never put in the request body.
OBJECTS = ("logits_processor", "stopping_criteria")


def _body(args: dict[str, Any], first: str) -> dict[str, Any]:
    """The OpenAI request body of a call's arguments (None: left out), after the checks of the
    arguments only llama-cpp-python has (RequestError naming the argument)."""
    args.pop("self")
    for name, neutral in LLAMA_CPP_PYTHON_UNSUPPORTED.items():
        if args.get(name) is not None and not neutral(args[name]):
            shown = type(args[name]).__name__ if name in OBJECTS else repr(args[name])[:40]
            raise oa_req.RequestError(f"{name} is not supported (got {shown}): llamaspec samples with penalties, "
                                  f"top_k, top_p, min_p and temperature only; leave it out"
                                  + (f" or pass {NEUTRAL[name]}" if name in NEUTRAL else ""), name)
    grammar = args.get("grammar")
    if grammar is not None and not isinstance(grammar, str):   # llama-cpp-python's LlamaGrammar: its GBNF text
        args["grammar"] = getattr(grammar, "_grammar", grammar)
    body = {k: v for k, v in args.items() if v is not None and k not in LLAMA_CPP_PYTHON_UNSUPPORTED}
    body.setdefault(first, None)   # (present, so the parser names it when it is None)
    return body
