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
from llamaspec.openai.messages import Message, Refused, strict, to_request_error
from llamaspec.openai.unsupported import unsupported_field

__all__ = ["CHAT", "COMPLETION", "MAX_TOKENS", "MAX_STOPS", "MAX_STOP_BYTES", "NO_LIMIT", "ChatBody", "CompletionBody", "Parsed",
           "RequestError", "RequestFields", "check_fields", "jtype", "parse_body", "parse_chat", "parse_completion", "parse_messages", "parse_stop"]

#: a token limit's names, first wins: OpenAI's newer (chat), its older, llama-server's
MAX_TOKENS = ("max_completion_tokens", "max_tokens", "n_predict")
#: alternatives per token: OpenAI's top_logprobs limit
MAX_LOGPROBS = 20


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


class Fields(BaseModel):
    """What to generate and how, as every way in gives it: HTTP bodies (below), batch lines of both
    forms (batch/requests.py) and the Python API's Request (api/preparation.py) are checked here,
    by these validators: one verdict and one message per field. Bounds only: a grammar is compiled
    against the model later (api/constraints.py, in serve's preparing threads). Unknown fields are
    left to the entrance (a body ignores them, but unsupported.py's; a Request has none)."""

    model_config = ConfigDict(extra="allow")

    # max_completion_tokens is the newer name (chat) and wins; llama-server's n_predict comes last.
    # All three: the knob table's max_tokens (-1: no limit), one rule everywhere.
    max_completion_tokens: Optional[int] = None
    max_tokens: Optional[int] = None
    n_predict: Optional[int] = None
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

    @field_validator(*knobs.PER_REQUEST, *MAX_TOKENS, mode="before")
    @classmethod
    def _knob(cls, v: Any, info: ValidationInfo) -> Any:
        """A knob's field, by the knob table's type and range (knobs.check): the refusal names it."""
        if v is None:
            return None
        name = "max_tokens" if info.field_name in MAX_TOKENS else info.field_name
        try:
            v = knobs.check(name, v, info.field_name)
        except UsageError as e:
            raise Refused(e.message, whole=True, param=info.field_name) from None
        return v if knobs.KNOBS[name].kind is int else float(v)

    def common_fields(self) -> dict[str, Any]:
        """Request keyword arguments of the fields every way in shares."""
        max_tokens = next((getattr(self, k) for k in MAX_TOKENS if getattr(self, k) is not None), None)
        if max_tokens == -1:   # llama.cpp's -n -1: until the end or a full context
            max_tokens = NO_LIMIT
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


class _Body(Fields):
    """The fields both endpoints take. Unknown fields are ignored (clients send many), except
    the ones unsupported.py lists, which would change the output."""

    model: Annotated[Optional[str], BeforeValidator(strict(str, "a string"))] = None
    user: Annotated[Optional[str], BeforeValidator(strict(str, "a string"))] = None
    metadata: Annotated[Optional[dict], BeforeValidator(strict(dict, "an object"))] = None
    store: Annotated[Optional[bool], BeforeValidator(strict(bool, "a boolean"))] = None
    stream: Annotated[Optional[bool], BeforeValidator(strict(bool, "a boolean"))] = None
    stream_options: Annotated[Optional[StreamOptions], BeforeValidator(strict(dict, "an object"))] = None

    def _parsed(self, kind: str, req: dict) -> Parsed:
        opts = self.stream_options
        include = bool(self.stream and opts is not None and opts.include_usage)
        return Parsed(kind, req, bool(self.stream), include, self.model)


class ChatBody(_Body):
    """/v1/chat/completions."""

    messages: Annotated[list[Message], Field(min_length=1)]
    logprobs: Annotated[Optional[bool], BeforeValidator(strict(bool, "a boolean"))] = None
    top_logprobs: Annotated[Optional[int], BeforeValidator(rf.count(MAX_LOGPROBS))] = None
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
            # planned (checked) once, against the chat template, where every way in prepares (api/constraints.py)
            req.update(tools=self.tools, tool_choice=self.tool_choice, parallel_tool_calls=self.parallel_tool_calls)
        return req


class CompletionBody(_Body):
    """/v1/completions: a raw-text prompt (no chat template)."""

    prompt: Annotated[str, BeforeValidator(_prompt)]
    # OpenAI's limit is 5; llamaspec's one limit is chat's 20 (top_logprobs), for every way in
    logprobs: Annotated[Optional[int], BeforeValidator(rf.count(MAX_LOGPROBS))] = None

    def fields(self) -> dict[str, Any]:
        req = dict(prompt=self.prompt, chat=False, **self.common_fields())
        if self.logprobs is not None:
            req["logprobs"] = self.logprobs
        return req


class RequestFields(Fields):
    """The Python API's Request (api/request.py): the shared fields, logprobs a count 0-20."""

    logprobs: Annotated[Optional[int], BeforeValidator(rf.count(MAX_LOGPROBS))] = None


def check_fields(values: dict[str, Any]) -> dict[str, Any]:
    """A Python Request's given fields, checked as a body's are (RequestError naming the field)
    -> Request keyword arguments: max_tokens, the knobs, stop (None: none of its own), and when
    set ignore_eos, logit_bias, grammar (a GrammarSpec of grammar or json_schema) and logprobs."""
    try:
        parsed = RequestFields.model_validate(values)
    except ValidationError as e:
        raise to_request_error(e) from None
    out = parsed.common_fields()
    if parsed.logprobs is not None:
        out["logprobs"] = parsed.logprobs
    return out


def parse_body(body: Any, kind: str, unsupported: bool = True) -> Parsed:
    """A body of endpoint `kind` (CHAT or COMPLETION) -> Parsed, or a RequestError naming the
    field. unsupported: refuse unsupported.py's fields (False: a llamaspec batch line, whose
    unknown keys are a dataset's own)."""
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {jtype(body)}")
    if unsupported:
        check_unsupported(body)
    try:
        parsed = (ChatBody if kind == CHAT else CompletionBody).model_validate(body)
    except ValidationError as e:
        raise to_request_error(e) from None
    return parsed._parsed(kind, parsed.fields())


def parse_chat(body: Any) -> Parsed:
    """A /v1/chat/completions body -> Parsed (RequestError naming the field when it is refused)."""
    return parse_body(body, CHAT)


def parse_completion(body: Any) -> Parsed:
    """A /v1/completions body -> Parsed (the prompt is raw text: no chat template)."""
    return parse_body(body, COMPLETION)


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
