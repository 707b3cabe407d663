"""What every way into the OpenAI layer shares and that needs no pydantic (the CLI's flags use
it too): the request error, JSON's type names, the `stop` rule and the no-limit max_tokens.

    >>> parse_stop(["", "x"]), parse_stop("")
    (['x'], [])
"""

from __future__ import annotations

import json
import re
from typing import Any

from llamaspec.errors import UsageError

CHAT, COMPLETION = "chat", "completion"


class RequestError(UsageError):
    """A request body the server refuses (HTTP 400): `param` names the field, `code` is OpenAI's
    error code when there is one (context_length_exceeded)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param, self.code = param, code


def shown(v: Any) -> str:
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


#: max_tokens for "until end-of-generation or a full context" (llama-server's n_predict -1):
#: more than any context holds, so the context ends it (finish_reason "length")
NO_LIMIT = (1 << 31) - 1


#: a stop list's bounds (llama-server has none; vLLM none): each step checks the new text against
#: every stop string, so the list's size is the per-step cost
MAX_STOPS, MAX_STOP_BYTES = 16, 1024


def parse_stop(v: Any, name: str = "stop") -> list[str]:
    """Stop strings as every way in takes them (server, batch lines, the Python API, flags): a
    string or an array of strings (None: none). Empty strings are dropped, as OpenAI ignores them,
    so "" asks for no stop string and ["", "x"] for "x"; anything else that is not a string is
    refused naming the field, as is a list over MAX_STOPS strings or a string over MAX_STOP_BYTES."""
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


def param_of(error: UsageError) -> str | None:
    """The request field a validation error of the engine names (its messages start with it:
    "temperature must be a number >= 0 ...", "logit_bias: 7 is not ...").

        >>> param_of(UsageError("logit_bias: '99' is not a token id of this model"))
        'logit_bias'
    """
    if isinstance(error, RequestError):
        return error.param
    if getattr(error, "field", None):   # a grammar llama.cpp refused (runtime.grammar.GrammarError)
        return error.field
    m = re.match(r"([A-Za-z_]\w*)(?=[ :.\[]|$)", error.message)   # "logit_bias: ...", "stop[2] ..."
    return m.group(1) if m else None
