"""What llama-cpp-python users type, on a `Generator`: `create_chat_completion`,
`create_completion` and `__call__`, returning the OpenAI dicts that `llamaspec serve` sends (the
same builders, llamaspec/openai_format.py), or with `stream=True` an iterator of chunks.

    with Generator("model.gguf", temperature=0) as llm:
        out = llm.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=32)
        print(out["choices"][0]["message"]["content"])
        for chunk in llm.create_chat_completion(messages, stream=True):
            print(chunk["choices"][0]["delta"].get("content", ""), end="")

Sampling arguments left out (or None) take the Generator's settings, not llama-cpp-python's own
defaults. Arguments that would change the output and are not implemented (n > 1, logprobs, tools,
response_format other than text, ...) raise a UsageError naming them, as the server answers 400.
"""

from __future__ import annotations

from typing import Any, Iterator

from llamaspec import openai_format as oa


class OpenAIMethods:
    """Mixed into `Generator`; needs its `generate`, `_request` and `model_name`."""

    def create_chat_completion(self, messages: list[dict], *, stream: bool = False,
                               stream_options: dict | None = None, **fields: Any) -> dict | Iterator[dict]:
        """A `chat.completion` dict (or, with stream=True, `chat.completion.chunk` dicts)."""
        body = {**_drop_none(fields), "messages": messages, "stream": stream, "stream_options": stream_options}
        return self._openai(oa.parse_chat(body))

    def create_completion(self, prompt: str, *, stream: bool = False, stream_options: dict | None = None,
                          **fields: Any) -> dict | Iterator[dict]:
        """A `text_completion` dict for raw text (no chat template), or its chunks with stream=True."""
        body = {**_drop_none(fields), "prompt": prompt, "stream": stream, "stream_options": stream_options}
        return self._openai(oa.parse_completion(body))

    def __call__(self, prompt: str, **kwargs: Any) -> dict | Iterator[dict]:
        """As llama-cpp-python's `Llama.__call__`: `create_completion`."""
        return self.create_completion(prompt, **kwargs)

    def _openai(self, parsed: "oa.Parsed") -> dict | Iterator[dict]:
        req = self._request(parsed.fields)
        rid, created, model = oa.new_id(parsed.kind), oa.now(), self.model_name
        if not parsed.stream:
            result = self.generate(req)
            build = oa.chat_completion if parsed.kind == oa.CHAT else oa.text_completion
            return build(result, id=rid, model=model, created=created,
                         timings=oa.timings(result, result.stats.get("n_prompt_cached", 0)))
        return self._chunks(parsed, self.generate(req, stream=True), rid, created, model)

    @staticmethod
    def _chunks(parsed: "oa.Parsed", stream, rid: str, created: int, model: str) -> Iterator[dict]:
        chat = parsed.kind == oa.CHAT
        common = dict(id=rid, model=model, created=created, include_usage=parsed.include_usage)
        if chat:
            yield oa.chat_chunk(role=True, **common)
        for piece in stream:
            yield oa.chat_chunk(content=piece, **common) if chat else oa.completion_chunk(text=piece, **common)
        result = stream.result
        end = oa.chat_chunk if chat else oa.completion_chunk
        yield end(finish_reason=result.finish_reason, **common)
        if parsed.include_usage:
            yield end(id=rid, model=model, created=created, usage=oa.result_usage(result))


def _drop_none(fields: dict) -> dict:
    return {k: v for k, v in fields.items() if v is not None}
