"""The generic fallback for chat templates that do not render tools (docs/structured.md, "Tool
calls"): a system prompt describing the tools and the JSON reply, and tool messages turned into
text, as llama.cpp's generic handler and minja's polyfills do.

The system prompt (appended to the first system message, or a new first system message):

    You can call any of the following tools to satisfy the user's requests: [TOOLS AS JSON]

    Respond in JSON format, either with `tool_call` (a request to call tools) or with `response`
    reply to the user's request, e.g. {"tool_call": {"name": "NAME", "arguments": {...}}} or
    {"response": "..."}

(`tool_calls` with a list when parallel calls are allowed; only the call when one is required.)
History (runtime/chat_template.history_as_text): an assistant message's calls become its content,
the JSON the model itself would write; a `tool` message becomes a user message
{"tool_response": {"tool", "content", "tool_call_id"}} (consecutive ones merged, as templates
that want alternating roles need).
"""

from __future__ import annotations

import json
import random
import string
from typing import Any

_ALNUM = string.ascii_letters + string.digits


def instruction(*, required: bool, parallel: bool) -> str:
    """The reply format the generic grammar enforces, in words."""
    call = '{"name": "NAME", "arguments": {...}}'
    shape = f'{{"tool_calls": [{call}, ...]}}' if parallel else f'{{"tool_call": {call}}}'
    key = "tool_calls" if parallel else "tool_call"
    if required:
        return f"Respond in JSON format with `{key}` (a request to call tools), e.g. {shape}"
    return (f"Respond in JSON format, either with `{key}` (a request to call tools) or with `response` "
            f'reply to the user\'s request, e.g. {shape} or {{"response": "..."}}')


def describe(tools: list[dict]) -> str:
    return "You can call any of the following tools to satisfy the user's requests: " + json.dumps(tools, indent=2)


def add_system(messages: list[dict], text: str) -> list[dict]:
    """`text` appended to the first system message, or a new system message in front."""
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0])
        first["content"] = f"{first.get('content') or ''}\n\n{text}"
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def mistral_ids(messages: list[dict]) -> list[dict]:
    """Mistral Nemo's template refuses call ids that are not nine alphanumerics: other ids (an
    OpenAI client's "call_...") are mapped to such ids, the same in the calls and their results."""
    mapping: dict[str, str] = {}

    def nine(i: Any) -> str:
        s = str(i)
        if len(s) == 9 and s.isalnum():
            return s
        if s not in mapping:
            rng = random.Random(s)   # the same id for the call and its result, in every render
            mapping[s] = "".join(rng.choice(_ALNUM) for _ in range(9))
        return mapping[s]

    out = []
    for m in messages:
        if m.get("tool_calls"):
            m = {**m, "tool_calls": [{**c, "id": nine(c.get("id"))} for c in m["tool_calls"]]}
        elif m.get("role") == "tool" and "tool_call_id" in m:
            m = {**m, "tool_call_id": nine(m["tool_call_id"])}
        out.append(m)
    return out
