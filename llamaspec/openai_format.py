"""OpenAI's wire format, in one place: request bodies in, chat.completion / chat.completion.chunk /
text_completion objects, usage, llama-server's `timings` and error bodies out.

Engine-agnostic: the builders take a `llamaspec.generator.Result` (or anything with its `text`,
`tokens`, `n_prompt`, `finish_reason` and `stats`) or text pieces, with the id, model name and
creation time, and return plain dicts ready for `json.dumps`; the parsers turn a request body into
the keyword arguments of a `llamaspec.generator.Request` (`Request(**parsed.fields)`) plus the
stream options, or raise `RequestError` naming the field (OpenAI's error `param`). This module
imports nothing of the engine or the Generator, so `Generator` may build its OpenAI objects here.
The server (llamaspec/serve/) and anything else that speaks OpenAI build their objects here.

    >>> p = parse_chat({"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8})
    >>> p.fields["prompt"], p.fields["max_tokens"], p.stream
    ([{'role': 'user', 'content': 'Hi'}], 8, False)
    >>> parse_chat({"messages": [{"role": "user", "content": "Hi"}], "n": 2})
    Traceback (most recent call last):
    ...
    llamaspec.openai_format.RequestError: n is not supported (got 2): llamaspec gives one plain-text choice per request
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from llamaspec.errors import INT64_MAX, INT64_MIN, SAMPLING_NUMBER, UsageError, sampling_number_ok
from llamaspec.openai_unsupported import unsupported_field

CHAT, COMPLETION = "chat", "completion"


class RequestError(UsageError):
    """A request body the server refuses (HTTP 400): `param` names the field, `code` is OpenAI's
    error code when there is one (context_length_exceeded)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param, self.code = param, code


@dataclass
class Parsed:
    """A request body, parsed: what to generate and how to send it back."""

    kind: str                  # CHAT or COMPLETION
    fields: dict[str, Any]     # llamaspec.generator.Request's keyword arguments (None: the default)
    stream: bool = False
    include_usage: bool = False
    model: str | None = None   # what the client named (one model is served: any name is accepted)


# ---- requests ----------------------------------------------------------------------------------

def check_unsupported(body: dict) -> None:
    refused = unsupported_field(body)
    if refused is not None:
        key, why = refused
        raise RequestError(f"{key} is not supported (got {_shown(body[key])}): {why}", key)


def _shown(v: Any) -> str:
    """A value as the client sent it, cut short (for error messages)."""
    try:
        return json.dumps(v)[:40]
    except (ValueError, RecursionError):   # (NaN / inf are refused as not JSON before this)
        return jtype(v)


def jtype(v: Any) -> str:
    """JSON's name for a value's type, as the user wrote it."""
    if v is None or isinstance(v, bool):
        return "null" if v is None else "boolean"
    return {str: "string", int: "number", float: "number", list: "array", dict: "object"}.get(type(v), "value")




def _int(body: dict, key: str) -> int | None:
    v = body.get(key)
    if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
        raise RequestError(f"{key} must be an integer, got {jtype(v)}", key)
    if v is not None and not INT64_MIN <= v <= INT64_MAX:
        raise RequestError(f"{key} must be a 64-bit integer (between -2^63 and 2^63-1), got {_shown(v)}", key)
    return v


def _num(body: dict, key: str) -> float | None:
    v = body.get(key)
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
        raise RequestError(f"{key} must be a number, got {jtype(v)}", key)
    if v is not None and not sampling_number_ok(v):
        shown = _shown(v) if isinstance(v, int) else repr(v)
        raise RequestError(f"{key} must be {SAMPLING_NUMBER} (got {shown})", key)
    return None if v is None else float(v)


def _bool(body: dict, key: str) -> bool | None:
    v = body.get(key)
    if v is not None and not isinstance(v, bool):
        raise RequestError(f"{key} must be a boolean, got {jtype(v)}", key)
    return v


#: max_tokens for "until end-of-generation or a full context" (llama-server's n_predict -1):
#: more than any context holds, so the context ends it (finish_reason "length")
NO_LIMIT = (1 << 31) - 1


def _content(v: Any, i: int) -> str:
    """A message's content: a string, or content parts of type text (joined by newlines)."""
    where = f"messages[{i}].content"
    if isinstance(v, str):
        return v
    if v is None:
        return ""
    if isinstance(v, list):
        texts = []
        for j, part in enumerate(v):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else jtype(part)
                raise RequestError(f"{where}[{j}]: only text content parts are supported, got {kind!r}", "messages")
            texts.append(part["text"])
        return "\n".join(texts)   # as vLLM joins text parts
    raise RequestError(f"{where} must be a string or an array of text parts, got {jtype(v)}", "messages")


ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


def parse_messages(v: Any) -> list[dict]:
    if not isinstance(v, list) or not v:
        raise RequestError(f"messages must be a non-empty array of {{role, content}}, got {jtype(v)}", "messages")
    out = []
    for i, m in enumerate(v):
        if not isinstance(m, dict):
            raise RequestError(f"messages[{i}] must be an object, got {jtype(m)}", "messages")
        role = m.get("role")
        if role not in ROLES:
            raise RequestError(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}", "messages")
        if m.get("tool_calls"):
            raise RequestError(f"messages[{i}].tool_calls: tool calls are not supported", "messages")
        if m.get("content") is None and role != "assistant":   # only an assistant turn may be empty
            raise RequestError(f"messages[{i}].content must be a string or an array of text parts, got null",
                               "messages")
        out.append({"role": ROLES[role], "content": _content(m.get("content"), i)})
    return out


#: a stop list's bounds (llama-server has none; vLLM none): each step checks the new text against
#: every stop string, so the list's size is the per-step cost
MAX_STOPS, MAX_STOP_BYTES = 16, 1024


def parse_stop(v: Any, name: str = "stop") -> list[str]:
    """Stop strings as every way in takes them (server, batch lines, the Python API, flags): a
    string or an array of strings (None: none). Empty strings are dropped, as OpenAI ignores them,
    so "" asks for no stop string and ["", "x"] for "x"; anything else that is not a string is
    refused naming the field, as is a list over MAX_STOPS strings or a string over MAX_STOP_BYTES.

        >>> parse_stop(["", "x"]), parse_stop("")
        (['x'], [])
    """
    if v is None:
        return []
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, (list, tuple)):   # (a tuple: a Python caller's array)
        raise RequestError(f"{name} must be a string or an array of strings, got {jtype(v)}", name)
    for i, s in enumerate(items):
        if not isinstance(s, str):
            raise RequestError(f"{name} must be a string or an array of strings, got {jtype(s)} at {name}[{i}]",
                               name)
    if len(items) > MAX_STOPS:
        raise RequestError(f"{name} has {len(items)} strings, more than the limit of {MAX_STOPS}", name)
    for i, s in enumerate(items):
        if len(s.encode("utf-8", "surrogatepass")) > MAX_STOP_BYTES:
            raise RequestError(f"{name}[{i}] is longer than the limit of {MAX_STOP_BYTES} bytes", name)
    return [s for s in items if s]


def _prompt(v: Any) -> str:
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], str):
        return v[0]
    if isinstance(v, list) and len(v) > 1:
        raise RequestError("prompt: one prompt per request (an array of prompts is not supported)", "prompt")
    if not isinstance(v, str):
        raise RequestError(f"prompt must be a string, got {jtype(v)}", "prompt")
    return v


def _parse(body: Any, kind: str) -> Parsed:
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {jtype(body)}")
    check_unsupported(body)
    if kind == CHAT:
        if "messages" not in body:
            raise RequestError("messages is required", "messages")
        prompt, chat = parse_messages(body["messages"]), None
    else:
        if "prompt" not in body:
            raise RequestError("prompt is required", "prompt")
        prompt, chat = _prompt(body["prompt"]), False   # /v1/completions: raw text, no chat template
    # max_completion_tokens is the newer name (chat); it wins when both are given, as at OpenAI;
    # llama-server's n_predict (-1: until end-of-generation or a full context) comes last.
    key = next((k for k in ("max_completion_tokens", "max_tokens", "n_predict") if body.get(k) is not None),
               "max_tokens")
    max_tokens = _int(body, key)
    if key == "n_predict" and max_tokens == -1:
        max_tokens = NO_LIMIT
    if max_tokens is not None and max_tokens < 0:
        raise RequestError(f"{key} must be >= 0{' (or -1: no limit)' if key == 'n_predict' else ''}, "
                           f"got {max_tokens}", key)
    for k in ("max_completion_tokens", "max_tokens", "n_predict"):   # the ones that lost: still typed
        _int(body, k)
    stream = _bool(body, "stream")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise RequestError(f"stream_options must be an object, got {jtype(opts)}", "stream_options")
    if opts and opts.get("include_usage") is not None and not isinstance(opts["include_usage"], bool):
        raise RequestError(f"stream_options.include_usage must be a boolean, got {jtype(opts['include_usage'])}",
                           "stream_options")
    for k, kinds, what in (("model", str, "a string"), ("user", str, "a string"), ("metadata", dict, "an object"),
                           ("store", bool, "a boolean")):
        if body.get(k) is not None and not isinstance(body[k], kinds):
            raise RequestError(f"{k} must be {what}, got {jtype(body[k])}", k)
    seed = _int(body, "seed")
    # An empty stop list is no stop of the request's own: the server's --stop default applies, as
    # when the field is absent (clients that always send "stop": [] keep it).
    req = dict(prompt=prompt, max_tokens=max_tokens, temperature=_num(body, "temperature"), top_p=_num(body, "top_p"),
               seed=seed, stop=parse_stop(body.get("stop")) or None, chat=chat,
               top_k=_int(body, "top_k"), min_p=_num(body, "min_p"), repeat_penalty=_num(body, "repeat_penalty"),
               presence_penalty=_num(body, "presence_penalty"), frequency_penalty=_num(body, "frequency_penalty"))
    if _bool(body, "ignore_eos"):   # llama-server's: generate past end-of-generation, to max_tokens or a full context
        req["ignore_eos"] = True
    return Parsed(kind, req, bool(stream), bool(stream and opts and opts.get("include_usage")), body.get("model"))


def parse_chat(body: Any) -> Parsed:
    """A /v1/chat/completions body -> Parsed (RequestError naming the field when it is refused)."""
    return _parse(body, CHAT)


def parse_completion(body: Any) -> Parsed:
    """A /v1/completions body -> Parsed (the prompt is raw text: no chat template)."""
    return _parse(body, COMPLETION)


def param_of(error: UsageError) -> str | None:
    """The request field a validation error of the engine names (its messages start with it:
    "temperature must be a number >= 0 ...")."""
    if isinstance(error, RequestError):
        return error.param
    first = error.message.split(" ", 1)[0]
    return first if first.isidentifier() else None


# ---- responses ---------------------------------------------------------------------------------

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


def chat_completion(result: Any, *, id: str, model: str, created: int, timings: dict | None = None) -> dict:
    """A `chat.completion` object for a finished generation."""
    out = {"id": id, "object": "chat.completion", "created": created, "model": model,
           "choices": [{"index": 0, "message": {"role": "assistant", "content": result.text},
                        "logprobs": None, "finish_reason": openai_finish_reason(result.finish_reason)}],
           "usage": result_usage(result)}
    if timings is not None:
        out["timings"] = timings
    return out


def chat_chunk(*, id: str, model: str, created: int, content: str | None = None, role: bool = False,
               finish_reason: str | None = None, include_usage: bool = False, usage: dict | None = None,
               timings: dict | None = None) -> dict:
    """A `chat.completion.chunk`. The stream is: a first chunk with role (content ""), content
    chunks, a last chunk with an empty delta and finish_reason; with include_usage every chunk has
    `usage: null` and one more chunk with no choices carries the usage (pass usage=...)."""
    out: dict[str, Any] = {"id": id, "object": "chat.completion.chunk", "created": created, "model": model}
    if usage is not None:
        out["choices"] = []
    else:
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if content is not None or role:
            delta["content"] = content or ""
        out["choices"] = [{"index": 0, "delta": delta, "logprobs": None,
                           "finish_reason": openai_finish_reason(finish_reason)}]
    if include_usage or usage is not None:
        out["usage"] = usage
    if timings is not None:
        out["timings"] = timings
    return out


def text_completion(result: Any, *, id: str, model: str, created: int, timings: dict | None = None) -> dict:
    """A `text_completion` object for a finished generation (/v1/completions)."""
    out = {"id": id, "object": "text_completion", "created": created, "model": model,
           "choices": [{"index": 0, "text": result.text, "logprobs": None,
                        "finish_reason": openai_finish_reason(result.finish_reason)}],
           "usage": result_usage(result)}
    if timings is not None:
        out["timings"] = timings
    return out


def completion_chunk(*, id: str, model: str, created: int, text: str = "", finish_reason: str | None = None,
                     include_usage: bool = False, usage: dict | None = None, timings: dict | None = None) -> dict:
    """A streamed `text_completion` piece (OpenAI streams completions as text_completion objects;
    the usage chunk, with include_usage, has no choices)."""
    out: dict[str, Any] = {"id": id, "object": "text_completion", "created": created, "model": model,
                           "choices": [] if usage is not None else
                           [{"index": 0, "text": text, "logprobs": None,
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
