"""What constrains a reply, from every API's name for it: OpenAI's `response_format`
(json_object, json_schema {name, schema, strict}), llama-server's `grammar` (GBNF) and
`json_schema`, vLLM's `guided_json`, `guided_grammar` and `guided_choice` (one of the strings,
as a GBNF alternation). At most one per request. Each becomes a GrammarSpec whose `field` names
what the client sent, so a grammar llama.cpp refuses later is a 400 naming that field.

vLLM's `guided_regex` stays refused (unsupported.py): no grammar kind takes a bare regular
expression yet (a schema's `pattern` constrains a JSON string, quotes included).

    >>> choice_gbnf(["yes", 'say "no"'])
    'root ::= "yes" | "say \\\\"no\\\\""'
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any, Callable, Optional

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from llamaspec.knobs import bias_ok, bias_refused
from llamaspec.openai.fields import RequestError, jtype
from llamaspec.openai.messages import Refused, strict as only
from llamaspec.runtime.grammar_errors import GrammarError

if TYPE_CHECKING:
    from llamaspec.runtime.grammar import GrammarSpec

FORMATS = ("text", "json_object", "json_schema")
#: the request fields that constrain the output, in the order a conflict names them
CONSTRAINTS = ("response_format", "grammar", "json_schema", "guided_json", "guided_grammar", "guided_choice")


def _format_type(v: Any) -> Any:
    if v not in FORMATS:
        raise Refused(f"must be one of {', '.join(FORMATS)}, got {json.dumps(v)[:40] if v is not None else 'null'}")
    return v


class JsonSchemaFormat(BaseModel):
    """response_format.json_schema: OpenAI's {name, schema, strict, description}. `strict` or not,
    the schema is enforced by the grammar (runtime/grammar.py refuses what it cannot enforce)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    name: Annotated[Optional[str], BeforeValidator(only(str, "a string"))] = None
    schema_: Annotated[Optional[dict], BeforeValidator(only(dict, "an object (a JSON schema)")),
                       Field(alias="schema")] = None
    strict: Annotated[Optional[bool], BeforeValidator(only(bool, "a boolean"))] = None
    description: Annotated[Optional[str], BeforeValidator(only(str, "a string"))] = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Annotated[str, BeforeValidator(_format_type)]
    json_schema: Optional[JsonSchemaFormat] = None

    @model_validator(mode="after")
    def _needs_schema(self) -> "ResponseFormat":
        if self.type == "json_schema" and self.json_schema is None:
            raise Refused('.json_schema is required with type "json_schema" ({"name", "schema", "strict"})')
        return self


def schema_value(v: Any) -> Any:
    """A JSON schema as llama-server's json_schema and vLLM's guided_json take it: an object, its
    JSON text, or true ({} and true: any JSON value)."""
    if v is None or v is True or isinstance(v, (dict, str)):
        return v
    raise Refused(f"must be a JSON schema (an object), got {jtype(v)}")


def choices(v: Any) -> Any:
    if v is None:
        return v
    if not isinstance(v, list) or not v or not all(isinstance(c, str) for c in v):
        raise Refused(f"must be a non-empty array of strings, got {jtype(v)}")
    return v


def count(limit: int) -> Callable[[Any], Any]:
    """A validator of an integer 0..limit (top_logprobs 0-20, completions' logprobs 0-5)."""
    def check(v: Any) -> Any:
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= limit):
            raise Refused(f"must be an integer from 0 to {limit}, got {json.dumps(v)[:40]}")
        return v
    return check


def logit_bias(v: Any) -> Any:
    """{token id (a string of digits, as JSON keys are): bias within knobs.BIAS_LIMIT} -> {int: float}.
    Whether the ids are in the vocabulary is checked against the model (api/constraints.py)."""
    if v is None:
        return v
    if not isinstance(v, dict):
        raise Refused(f'must be an object mapping token ids to biases ({{"15339": -100}}), got {jtype(v)}')
    out = {}
    for key, bias in v.items():
        tok = key if isinstance(key, int) and not isinstance(key, bool) else None
        if isinstance(key, str) and key.isdigit() and key.isascii():
            tok = int(key)
        if tok is None:
            raise Refused(f"logit_bias: {key!r} is not a token id (a string of digits)", whole=True)
        if not bias_ok(bias):
            shown = json.dumps(bias)[:40] if isinstance(bias, (str, int, float)) else jtype(bias)
            raise Refused(bias_refused("logit_bias", key, shown), whole=True)
        out[tok] = float(bias)
    return out


def gbnf_literal(text: str) -> str:
    """`text` as a GBNF string literal (llama.cpp's grammar parser: \\\\, \\", and \\xHH for controls)."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def choice_gbnf(options: list[str]) -> str:
    """vLLM's guided_choice: the reply is exactly one of the strings."""
    return "root ::= " + " | ".join(gbnf_literal(c) for c in options)


def given(body: Any) -> list[str]:
    """The constraint fields a body sets (response_format {"type": "text"} constrains nothing)."""
    out = []
    for name in CONSTRAINTS:
        v = getattr(body, name, None)
        if v is not None and not (name == "response_format" and v.type == "text"):
            out.append(name)
    return out


class ConstraintRefused(RequestError, GrammarError):
    """A constraint the grammar engine refuses, named by the field it came in (a 400 as any
    RequestError), still the GrammarError it was for whoever catches those."""

    def __init__(self, error: GrammarError, field: str):
        RequestError.__init__(self, error.message, field)
        self.hint = error.hint


def one_constraint(names: list[str]) -> None:
    """The one rule of every way in (a body's fields, a batch line, a Request, run's flags, spelled
    as each names them): the output takes at most one constraint."""
    if len(names) > 1:
        raise RequestError(f"{names[0]} and {names[1]} both constrain the output: give one of them", names[1])


def constraint(body: Any) -> "GrammarSpec | None":
    """The GrammarSpec of a body's one constraint (None: none); two given is a RequestError naming
    both, a schema the engine refuses one naming its field."""
    from llamaspec.runtime.grammar import GrammarError, GrammarSpec, grammar_from_schema

    names = given(body)
    one_constraint(names)
    if not names:
        return None
    name, v = names[0], getattr(body, names[0])
    try:
        if name == "response_format":
            schema = {} if v.type == "json_object" else (v.json_schema.schema_ or {})
            return grammar_from_schema(schema, field=name)
        if name in ("json_schema", "guided_json"):
            return grammar_from_schema(v, field=name)
        if name == "guided_choice":
            return GrammarSpec(choice_gbnf(v), field=name)
        return gbnf_spec(v, name)
    except GrammarError as e:
        raise ConstraintRefused(e, name) from None


def gbnf_spec(text: Any, name: str) -> "GrammarSpec":
    """GBNF text given as `name` -> its GrammarSpec: non-empty text within the grammar bounds
    (a RequestError naming `name`, or check_gbnf's GrammarError); compiled later, against the model."""
    from llamaspec.runtime.grammar import GrammarSpec
    from llamaspec.runtime.grammar_bounds import check_gbnf

    if not isinstance(text, str) or not text.strip():
        raise RequestError(f'{name} must be a GBNF grammar (non-empty text), e.g. root ::= "yes" | "no"', name)
    check_gbnf(text, name)
    return GrammarSpec(text, field=name)
