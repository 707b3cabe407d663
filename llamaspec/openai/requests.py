"""OpenAI request bodies in: `parse_chat` / `parse_completion` turn a body into the keyword
arguments of a `llamaspec.generator.Request` (`Request(**parsed.fields)`) plus the stream options,
or raise `RequestError` naming the field (OpenAI's error `param`). The server, batch lines and the
Python API (openai_api.py) all parse here.

    >>> p = parse_chat({"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8})
    >>> p.fields["prompt"], p.fields["max_tokens"], p.stream
    ([{'role': 'user', 'content': 'Hi'}], 8, False)
    >>> parse_chat({"messages": [{"role": "user", "content": "Hi"}], "n": 2})
    Traceback (most recent call last):
    ...
    llamaspec.openai.fields.RequestError: n is not supported (got 2): llamaspec gives one plain-text choice per request
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llamaspec.errors import INT64_MAX, INT64_MIN, SAMPLING_NUMBER, sampling_number_ok
from llamaspec.openai.fields import (CHAT, COMPLETION, MAX_STOP_BYTES, MAX_STOPS, NO_LIMIT, RequestError, jtype,
                                     param_of, parse_stop, shown)
from llamaspec.openai.unsupported import unsupported_field

__all__ = ["CHAT", "COMPLETION", "MAX_STOPS", "MAX_STOP_BYTES", "NO_LIMIT", "Parsed", "RequestError", "jtype",
           "param_of", "parse_chat", "parse_completion", "parse_messages", "parse_stop"]


@dataclass
class Parsed:
    """A request body, parsed: what to generate and how to send it back."""

    kind: str                  # CHAT or COMPLETION
    fields: dict[str, Any]     # llamaspec.generator.Request's keyword arguments (None: the default)
    stream: bool = False
    include_usage: bool = False
    model: str | None = None   # what the client named (one model is served: any name is accepted)


def check_unsupported(body: dict) -> None:
    refused = unsupported_field(body)
    if refused is not None:
        key, why = refused
        raise RequestError(f"{key} is not supported (got {shown(body[key])}): {why}", key)


def _int(body: dict, key: str) -> int | None:
    v = body.get(key)
    if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
        raise RequestError(f"{key} must be an integer, got {jtype(v)}", key)
    if v is not None and not INT64_MIN <= v <= INT64_MAX:
        raise RequestError(f"{key} must be a 64-bit integer (between -2^63 and 2^63-1), got {shown(v)}", key)
    return v


def _num(body: dict, key: str) -> float | None:
    v = body.get(key)
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
        raise RequestError(f"{key} must be a number, got {jtype(v)}", key)
    if v is not None and not sampling_number_ok(v):
        got = shown(v) if isinstance(v, int) else repr(v)
        raise RequestError(f"{key} must be {SAMPLING_NUMBER} (got {got})", key)
    return None if v is None else float(v)


def _bool(body: dict, key: str) -> bool | None:
    v = body.get(key)
    if v is not None and not isinstance(v, bool):
        raise RequestError(f"{key} must be a boolean, got {jtype(v)}", key)
    return v


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
