"""Chat messages as pydantic models (text content, tool calls and tool results), the scalar
checks the request models share (64-bit integers, strict types; the sampling knobs are checked by
the knob table, llamaspec/knobs.py), and the one translation of a pydantic ValidationError into a
RequestError naming the field.

    >>> Message.model_validate({"role": "developer", "content": [{"type": "text", "text": "a"}]}).as_dict()
    {'role': 'system', 'content': 'a'}
"""

from __future__ import annotations

from typing import Annotated, Any, Callable, Optional

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from llamaspec.openai.fields import RequestError, jtype, shown

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


class Refused(ValueError):
    """A value a validator refuses: `message` follows the field's path ("must be ..."), or is the
    whole message when `whole`."""

    def __init__(self, message: str, whole: bool = False, param: str | None = None):
        super().__init__(message)
        self.message, self.whole, self.param = message, whole, param


def strict(kind: type, what: str) -> Callable[[Any], Any]:
    """A validator taking only `kind` (no coercion: "1" is not 1, true is not 1)."""
    def check(v: Any) -> Any:
        if v is not None and (not isinstance(v, kind) or (kind is not bool and isinstance(v, bool))):
            raise Refused(f"must be {what}, got {jtype(v)}")
        return v
    return check


def _content(v: Any) -> Any:
    """A string, or content parts of type text (joined by newlines, as vLLM joins them)."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, list):
        texts = []
        for j, part in enumerate(v):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else jtype(part)
                raise Refused(f"[{j}]: only text content parts are supported, got {kind!r}", param="messages")
            texts.append(part["text"])
        return "\n".join(texts)
    raise Refused(f"must be a string or an array of text parts, got {jtype(v)}")


def _role(v: Any) -> Any:
    if v not in ROLES:
        raise Refused(f"must be one of {', '.join(ROLES)}, got {v!r}")
    return v


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: Annotated[str, BeforeValidator(strict(str, "a string"))]
    arguments: Annotated[str, BeforeValidator(strict(str, "a string (JSON text)"))] = "{}"


class ToolCall(BaseModel):
    """An assistant message's earlier call (OpenAI's form), kept for the chat template."""

    model_config = ConfigDict(extra="allow")
    id: Annotated[Optional[str], BeforeValidator(strict(str, "a string"))] = None
    type: Annotated[str, BeforeValidator(strict(str, "a string"))] = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Annotated[str, BeforeValidator(_role), Field(validate_default=True)] = None   # (absent: named too)
    content: Annotated[Optional[str], BeforeValidator(_content)] = None
    name: Annotated[Optional[str], BeforeValidator(strict(str, "a string"))] = None
    tool_calls: Optional[list[ToolCall]] = None
    tool_call_id: Annotated[Optional[str], BeforeValidator(strict(str, "a string"))] = None

    @model_validator(mode="after")
    def _shape(self) -> "Message":
        # only an assistant turn may be empty (its reply was tool calls, or it is to be continued)
        if self.content is None and self.role != "assistant":
            raise Refused(".content must be a string or an array of text parts, got null", param="messages")
        if self.tool_calls and self.role != "assistant":
            raise Refused(".tool_calls: only assistant messages carry tool calls", param="messages")
        return self

    def as_dict(self) -> dict:
        """{role, content} (+ tool_calls, tool_call_id when given) for the chat template."""
        out: dict[str, Any] = {"role": ROLES[self.role], "content": self.content or ""}
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump(exclude_none=True) for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out   # (a participant's `name` is not passed on: templates do not render it)


# what a pydantic type error says the value must be
_KINDS = {"int_type": "an integer", "float_type": "a number", "bool_type": "a boolean", "string_type": "a string",
          "dict_type": "an object", "model_type": "an object", "model_attributes_type": "an object",
          "list_type": "an array", "int_parsing": "an integer"}


def _path(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def to_request_error(e: ValidationError) -> RequestError:
    """The first error of a pydantic validation as a RequestError: `param` the top-level field,
    the message its path and what it must be."""
    err = e.errors(include_url=False)[0]
    loc = tuple(err["loc"])
    path, param = _path(loc), (str(loc[0]) if loc else None)
    exc = (err.get("ctx") or {}).get("error")
    if isinstance(exc, RequestError):
        return exc
    if isinstance(exc, Refused):
        if exc.whole:
            return RequestError(exc.message, exc.param or param)
        sep = "" if exc.message.startswith(("[", ".")) else " "   # (".x": a model's check of its field x)
        return RequestError(f"{path}{sep}{exc.message}", exc.param or param)
    kind, given = err["type"], err.get("input")
    if kind == "missing":
        return RequestError(f"{path} is required", param)
    if kind in ("too_short", "list_type") and param == "messages" and len(loc) == 1:
        got = "an empty array" if kind == "too_short" else jtype(given)
        return RequestError(f"messages must be a non-empty array of {{role, content}}, got {got}", param)
    if kind in _KINDS:
        return RequestError(f"{path} must be {_KINDS[kind]}, got {jtype(given)}", param)
    return RequestError(f"{path}: {err['msg']} (got {shown(given)})", param)
