"""What every way into the OpenAI layer shares and that needs no pydantic (the CLI's flags use
it too): the request error, JSON's type names, the `stop` rule and the no-limit max_tokens.

    >>> parse_stop(["", "x"]), parse_stop("")
    (['x'], [])
"""

from __future__ import annotations

import json
from typing import Any

from llamaspec.errors import UsageError, jtype

CHAT, COMPLETION = "chat", "completion"


class RequestError(UsageError):
    """A request body the server refuses (HTTP 400): `param` (its `field`) names the field, `code`
    is OpenAI's error code when there is one (context_length_exceeded)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message, field=param)
        self.code = code

    @property
    def param(self) -> str | None:
        return self.field


def shown(v: Any) -> str:
    """A value as the client sent it, cut short (for error messages)."""
    try:
        return json.dumps(v)[:40]
    except (ValueError, RecursionError):   # (NaN / inf are refused as not JSON before this)
        return jtype(v)


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
