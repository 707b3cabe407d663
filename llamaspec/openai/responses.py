"""OpenAI objects out: chat.completion / chat.completion.chunk / text_completion, usage,
llama-server's `timings` and error bodies.

Engine-agnostic: the builders take a `llamaspec.api.generator.Result` (or anything with its `text`,
`tokens`, `n_prompt`, `finish_reason` and `stats`) or text pieces, with the id, model name and
creation time, and return plain dicts ready for `json.dumps`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from llamaspec.openai.fields import CHAT
from llamaspec.openai.logprobs import Piece, chat_logprobs, completion_logprobs


def new_id(kind: str) -> str:
    return f"{'chatcmpl' if kind == CHAT else 'cmpl'}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def openai_finish_reason(reason: str | None) -> str | None:
    """OpenAI's finish_reason: a full context ends like max_tokens ("length"); an interrupted
    generation (the server shutting down) like a stop."""
    return {"context": "length", "interrupted": "stop", "eos": "stop"}.get(reason, reason)


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def result_usage(result: Any) -> dict:
    return usage(result.n_prompt, len(result.tokens))


def timings(result: Any, cache_n: int = 0) -> dict:
    """llama-server's `timings`: prompt_n counts the prompt tokens evaluated (cache_n were reused
    from the KV cache), predicted_n the tokens generated, draft_n / draft_n_accepted the drafted
    and accepted tokens."""
    s = result.stats
    prompt_n, prompt_ms = max(0, result.n_prompt - cache_n), 1000.0 * s.get("prompt_seconds", 0.0)
    predicted_n, predicted_ms = len(result.tokens), 1000.0 * s.get("gen_seconds", 0.0)
    return {"cache_n": cache_n, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": 1000.0 * prompt_n / prompt_ms if prompt_ms > 0 else 0.0,
            "predicted_n": predicted_n, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / predicted_n if predicted_n else 0.0,
            "predicted_per_second": 1000.0 * predicted_n / predicted_ms if predicted_ms > 0 else 0.0,
            "draft_n": s.get("drafted", 0), "draft_n_accepted": s.get("accepted", 0)}


def _no_piece(tok: int) -> bytes:
    raise ValueError("logprobs need the model's piece() to name their tokens")


def chat_completion(result: Any, *, id: str, model: str, created: int, timings: dict | None = None,
                    piece: Piece = _no_piece) -> dict:
    """A `chat.completion` object for a finished generation: its tool calls (Result.tool_calls,
    with the text outside them as content) and logprobs when the request asked for them."""
    message: dict[str, Any] = {"role": "assistant", "content": result.text}
    calls = getattr(result, "tool_calls", None)
    if calls is not None:   # tools were offered: content is the reply read by its format, never the raw
        message["content"] = result.content   # text (the generic form's {"response": ...} envelope)
        if calls:
            message["tool_calls"] = calls
    out = {"id": id, "object": "chat.completion", "created": created, "model": model,
           "choices": [{"index": 0, "message": message,
                        "logprobs": chat_logprobs(getattr(result, "logprobs", None), piece),
                        "finish_reason": openai_finish_reason(result.finish_reason)}],
           "usage": result_usage(result)}
    if timings is not None:
        out["timings"] = timings
    return out


def chat_chunk(*, id: str, model: str, created: int, content: str | None = None, role: bool = False,
               finish_reason: str | None = None, include_usage: bool = False, usage: dict | None = None,
               timings: dict | None = None, delta: dict | None = None, logprobs: dict | None = None) -> dict:
    """A `chat.completion.chunk`. The stream is: a first chunk with role (content ""), content
    chunks (or `delta`s of a tool streamer: tool_calls pieces), a last chunk with an empty delta and
    finish_reason; with include_usage every chunk has `usage: null` and one more chunk with no
    choices carries the usage (pass usage=...). logprobs: the chunk's tokens' (chat_logprobs)."""
    out: dict[str, Any] = {"id": id, "object": "chat.completion.chunk", "created": created, "model": model}
    if usage is not None:
        out["choices"] = []
    else:
        d: dict[str, Any] = dict(delta or {})
        if role:
            d["role"] = "assistant"
        if content is not None or role:
            d["content"] = content or ""
        out["choices"] = [{"index": 0, "delta": d, "logprobs": logprobs,
                           "finish_reason": openai_finish_reason(finish_reason)}]
    if include_usage or usage is not None:
        out["usage"] = usage
    if timings is not None:
        out["timings"] = timings
    return out


def text_completion(result: Any, *, id: str, model: str, created: int, timings: dict | None = None,
                    piece: Piece = _no_piece) -> dict:
    """A `text_completion` object for a finished generation (/v1/completions)."""
    out = {"id": id, "object": "text_completion", "created": created, "model": model,
           "choices": [{"index": 0, "text": result.text,
                        "logprobs": completion_logprobs(getattr(result, "logprobs", None), piece),
                        "finish_reason": openai_finish_reason(result.finish_reason)}],
           "usage": result_usage(result)}
    if timings is not None:
        out["timings"] = timings
    return out


def completion_chunk(*, id: str, model: str, created: int, text: str = "", finish_reason: str | None = None,
                     include_usage: bool = False, usage: dict | None = None, timings: dict | None = None,
                     logprobs: dict | None = None) -> dict:
    """A streamed `text_completion` piece (OpenAI streams completions as text_completion objects;
    the usage chunk, with include_usage, has no choices)."""
    out: dict[str, Any] = {"id": id, "object": "text_completion", "created": created, "model": model,
                           "choices": [] if usage is not None else
                           [{"index": 0, "text": text, "logprobs": logprobs,
                             "finish_reason": openai_finish_reason(finish_reason)}]}
    if include_usage or usage is not None:
        out["usage"] = usage
    if timings is not None:
        out["timings"] = timings
    return out


def model_list(names: list[str], created: int, owned_by: str = "llamaspec") -> dict:
    return {"object": "list", "data": [{"id": n, "object": "model", "created": created, "owned_by": owned_by}
                                       for n in names]}


ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               413: "invalid_request_error", 429: "rate_limit_error", 503: "server_error"}


def error_body(message: str, *, status: int = 400, param: str | None = None, code: str | None = None,
               type: str | None = None) -> dict:
    """OpenAI's error object: {"error": {"message", "type", "param", "code"}}."""
    kind = type or ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
