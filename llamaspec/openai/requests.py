"""OpenAI request bodies in, declared as pydantic models (`ChatBody`, `CompletionBody`):
`parse_chat` / `parse_completion` turn a body into the keyword arguments of a
`llamaspec.api.generator.Request` (`Request(**parsed.fields)`) plus the stream options, or raise
`RequestError` naming the field (OpenAI's error `param`: the top-level field; the message gives
the path, `messages[2].content`). The server, batch lines and the Python API all parse here.

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
from typing import Annotated, Any, Optional

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from llamaspec import knobs
from llamaspec.errors import UsageError
from llamaspec.openai import response_format as rf
from llamaspec.openai.fields import (CHAT, COMPLETION, MAX_STOP_BYTES, MAX_STOPS, NO_LIMIT, RequestError, jtype,
                                     parse_stop, shown)
from llamaspec.openai.messages import Message, Refused, checked_int, strict, to_request_error
from llamaspec.openai.unsupported import unsupported_field

__all__ = ["CHAT", "COMPLETION", "MAX_STOPS", "MAX_STOP_BYTES", "NO_LIMIT", "ChatBody", "CompletionBody", "Parsed",
           "RequestError", "jtype", "parse_chat", "parse_completion", "parse_messages", "parse_stop"]

Int64 = Annotated[Optional[int], BeforeValidator(checked_int)]


def _stop(v: Any) -> Any:
    try:
        return parse_stop(v)
    except RequestError as e:
        raise Refused(e.message, whole=True) from None


def _prompt(v: Any) -> Any:
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], str):
        return v[0]
    if isinstance(v, list) and len(v) > 1:
        raise Refused("prompt: one prompt per request (an array of prompts is not supported)", whole=True)
    return strict(str, "a string")(v)


@dataclass
class Parsed:
    """A request body, parsed: what to generate and how to send it back."""

    kind: str                  # CHAT or COMPLETION
    fields: dict[str, Any]     # llamaspec.api.generator.Request's keyword arguments (None: the default)
    stream: bool = False
    include_usage: bool = False
    model: str | None = None   # what the client named (one model is served: any name is accepted)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: Annotated[Optional[bool], BeforeValidator(strict(bool, "a boolean"))] = None


class _Body(BaseModel):
    """The fields both endpoints take. Unknown fields are ignored (clients send many), except
    the ones unsupported.py lists, which would change the output."""

    model_config = ConfigDict(extra="allow")

    model: Annotated[Optional[str], BeforeValidator(strict(str, "a string"))] = None
    user: Annotated[Optional[str], BeforeValidator(strict(str, "a string"))] = None
    metadata: Annotated[Optional[dict], BeforeValidator(strict(dict, "an object"))] = None
    store: Annotated[Optional[bool], BeforeValidator(strict(bool, "a boolean"))] = None
    stream: Annotated[Optional[bool], BeforeValidator(strict(bool, "a boolean"))] = None
    stream_options: Annotated[Optional[StreamOptions], BeforeValidator(strict(dict, "an object"))] = None
    # max_completion_tokens is the newer name (chat) and wins; llama-server's n_predict comes last
    max_completion_tokens: Int64 = None
    max_tokens: Int64 = None
    n_predict: Int64 = None
    # the sampling knobs (knobs.PER_REQUEST): checked by the knob table's one check (_knob below)
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    min_p: Optional[float] = None
    repeat_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    top_k: Optional[int] = None
    seed: Optional[int] = None
    stop: Annotated[Optional[list[str]], BeforeValidator(_stop)] = None
    ignore_eos: Annotated[Optional[bool], BeforeValidator(strict(bool, "a boolean"))] = None
    logit_bias: Annotated[Optional[dict[int, float]], BeforeValidator(rf.logit_bias)] = None
    # the output's constraint (at most one: response_format.py): OpenAI's, llama-server's, vLLM's
    response_format: Optional[rf.ResponseFormat] = None
    grammar: Annotated[Optional[str], BeforeValidator(strict(str, "a string (a GBNF grammar)"))] = None
    json_schema: Annotated[Any, BeforeValidator(rf.schema_value)] = None
    guided_json: Annotated[Any, BeforeValidator(rf.schema_value)] = None
    guided_grammar: Annotated[Optional[str], BeforeValidator(strict(str, "a string (a GBNF grammar)"))] = None
    guided_choice: Annotated[Optional[list[str]], BeforeValidator(rf.choices)] = None

    @field_validator(*knobs.PER_REQUEST, mode="before")
    @classmethod
    def _knob(cls, v: Any, info: ValidationInfo) -> Any:
        """A sampling field, by the knob table's type and range (knobs.check): the refusal names it."""
        if v is None:
            return None
        try:
            v = knobs.check(info.field_name, v)
        except UsageError as e:
            raise Refused(e.message, whole=True, param=e.field) from None
        return v if knobs.KNOBS[info.field_name].kind is int else float(v)

    def common_fields(self) -> dict[str, Any]:
        """Request keyword arguments of the fields both endpoints share."""
        key = next((k for k in ("max_completion_tokens", "max_tokens", "n_predict") if getattr(self, k) is not None),
                   "max_tokens")
        max_tokens = getattr(self, key)
        if key == "n_predict" and max_tokens == -1:   # llama-server's "until the end or a full context"
            max_tokens = NO_LIMIT
        if max_tokens is not None and max_tokens < 0:
            raise RequestError(f"{key} must be >= 0{' (or -1: no limit)' if key == 'n_predict' else ''}, "
                               f"got {max_tokens}", key)
        # An empty stop list is no stop of the request's own: the server's --stop default applies.
        req = dict(max_tokens=max_tokens, stop=self.stop or None, **{k: getattr(self, k) for k in knobs.PER_REQUEST})
        if self.ignore_eos:   # llama-server's: generate past end-of-generation
            req["ignore_eos"] = True
        if self.logit_bias:
            req["logit_bias"] = self.logit_bias
        grammar = rf.constraint(self)
        if grammar is not None:
            req["grammar"] = grammar
        return req

    def _parsed(self, kind: str, req: dict) -> Parsed:
        opts = self.stream_options
        include = bool(self.stream and opts is not None and opts.include_usage)
        return Parsed(kind, req, bool(self.stream), include, self.model)


class ChatBody(_Body):
    """/v1/chat/completions."""

    messages: Annotated[list[Message], Field(min_length=1)]
    logprobs: Annotated[Optional[bool], BeforeValidator(strict(bool, "a boolean"))] = None
    top_logprobs: Annotated[Optional[int], BeforeValidator(rf.count(20))] = None
    tools: Optional[list[dict]] = None
    tool_choice: Any = None   # "none" | "auto" | "required" | {"type": "function", ...}: tools.plan_tools checks it
    parallel_tool_calls: Annotated[Optional[bool], BeforeValidator(strict(bool, "a boolean"))] = None

    def fields(self) -> dict[str, Any]:
        req = dict(prompt=[m.as_dict() for m in self.messages], chat=None, **self.common_fields())
        if self.top_logprobs is not None and not self.logprobs:
            raise RequestError("top_logprobs needs logprobs: true", "top_logprobs")
        if self.logprobs:
            req["logprobs"] = self.top_logprobs or 0
        if self.tools is not None or self.tool_choice is not None or self.parallel_tool_calls is not None:
            from llamaspec.openai.tools import plan_tools   # (its checks now: a 400 before any work)

            plan_tools(self.tools, self.tool_choice, self.parallel_tool_calls, None)
            req.update(tools=self.tools, tool_choice=self.tool_choice, parallel_tool_calls=self.parallel_tool_calls)
            if self.tools and self.tool_choice != "none" and "grammar" in req:
                given = rf.given(self)[0]
                raise RequestError(f"{given} cannot constrain a reply that may call tools: drop it, or set "
                                   'tool_choice "none"', given)
        return req


class CompletionBody(_Body):
    """/v1/completions: a raw-text prompt (no chat template)."""

    prompt: Annotated[str, BeforeValidator(_prompt)]
    logprobs: Annotated[Optional[int], BeforeValidator(rf.count(5))] = None   # OpenAI's 0..5

    def fields(self) -> dict[str, Any]:
        req = dict(prompt=self.prompt, chat=False, **self.common_fields())
        if self.logprobs is not None:
            req["logprobs"] = self.logprobs
        return req


def _parse(body: Any, model: type[ChatBody] | type[CompletionBody], kind: str) -> Parsed:
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {jtype(body)}")
    refused = unsupported_field(body)
    if refused is not None:
        key, why = refused
        raise RequestError(f"{key} is not supported (got {shown(body[key])}): {why}", key)
    try:
        parsed = model.model_validate(body)
    except ValidationError as e:
        raise to_request_error(e) from None
    return parsed._parsed(kind, parsed.fields())


def parse_chat(body: Any) -> Parsed:
    """A /v1/chat/completions body -> Parsed (RequestError naming the field when it is refused)."""
    return _parse(body, ChatBody, CHAT)


def parse_completion(body: Any) -> Parsed:
    """A /v1/completions body -> Parsed (the prompt is raw text: no chat template)."""
    return _parse(body, CompletionBody, COMPLETION)


def check_unsupported(body: dict) -> None:
    refused = unsupported_field(body)
    if refused is not None:
        key, why = refused
        raise RequestError(f"{key} is not supported (got {shown(body[key])}): {why}", key)


def parse_messages(v: Any) -> list[dict]:
    """Chat messages as the chat template takes them (the one message parser: server, batch lines,
    the Python API's message prompts), or a RequestError naming `messages`."""
    try:
        return [m.as_dict() for m in ChatBody.model_validate({"messages": v}).messages]
    except ValidationError as e:
        raise to_request_error(e) from None


#: Request fields of a body's constraint, logprobs, bias and tools (what batch lines add to theirs)
STRUCTURED = ("grammar", "logit_bias", "logprobs", "tools", "tool_choice", "parallel_tool_calls")
_STRUCTURED_KEYS = (*STRUCTURED, "top_logprobs", "response_format", "json_schema", "guided_json", "guided_grammar",
                    "guided_choice")


def structured_fields(body: dict, chat: bool) -> dict[str, Any]:
    """The STRUCTURED Request fields of a body, parsed as /v1/chat/completions (chat) or
    /v1/completions parse them (batch lines of either form: the same fields, the same errors)."""
    probe = {k: body[k] for k in _STRUCTURED_KEYS if k in body}
    if not probe:
        return {}
    fields = (parse_chat({**probe, "messages": [{"role": "user", "content": ""}]}) if chat
              else parse_completion({**probe, "prompt": ""})).fields
    return {k: fields[k] for k in STRUCTURED if fields.get(k) is not None}
