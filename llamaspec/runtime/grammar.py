"""Grammars for one generation: what the user gave (GrammarSpec: GBNF text or a JSON schema), the
one compile path every caller uses (bounds, then a worker process, then this process), and the
live state of a sequence under one (GrammarState).

Two engines, one interface (allows, allowed_ids, allowed_mask, mask, accept, accept_all,
valid_prefix, clone, close):
- llguidance (grammar_llg.py) for JSON schemas, compiled by llguidance directly, and for plain
  GBNF grammars (grammar_lark.py keeps llama.cpp's meaning): token masks in microseconds, exact
  type lists, enums and patterns.
- llama.cpp's grammar sampler (grammar_llama.py) for lazy grammars (tool calls that start at a
  trigger) and for GBNF that llguidance cannot read or compile: llama.cpp accepts it, so it runs.

Why one-token checks in the sampler (constrained.py): llama.cpp's common/sampling.cpp samples
first and asks the grammar about that one token; only when the grammar refuses it does it mask
the whole vocabulary and sample again. y ~ p kept when allowed, else y ~ p restricted to the
allowed set A, is exactly p(y)/p(A).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass
from typing import Any

from llamaspec.runtime import grammar_bounds, grammar_worker, schema_finite
from llamaspec.runtime.grammar_errors import GrammarError
from llamaspec.runtime.grammar_schema import JSON_CHAR, JSON_SPACE

__all__ = ["GrammarSpec", "GrammarError", "GrammarState", "grammar_from_schema", "schema_gbnf",
           "UNSUPPORTED_SCHEMA_KEYS", "JSON_CHAR", "JSON_SPACE", "check_grammar", "engine_of"]


@dataclass(frozen=True)
class GrammarSpec:
    """A grammar to constrain one generation: GBNF text (llama.cpp's grammar format) and its
    root, or a JSON schema (`schema`: its JSON text; `gbnf` is then empty).

    Lazy (trigger_patterns or trigger_tokens given): nothing is constrained until the generated
    text matches one of the patterns (regexes, llama.cpp's grammar_lazy_patterns: the grammar then
    applies from the pattern's first capture group, or the whole match) or a trigger token is
    generated; that is how a tool call's grammar starts only when the model opens a call.
    `field` names what the user gave (`response_format`, `--json-schema`, ...) for error messages.
    """

    gbnf: str = ""
    root: str = "root"
    field: str = "grammar"
    trigger_patterns: tuple[str, ...] = ()
    trigger_tokens: tuple[int, ...] = ()
    # llama.cpp's engine even when not lazy: its literals may be a special token's text (a tool
    # call's "<tool_call>"), which llama.cpp matches as text and llguidance's tokenizer does not
    special_text: bool = False
    schema: str | None = None

    @property
    def lazy(self) -> bool:
        return bool(self.trigger_patterns or self.trigger_tokens)


# Keywords that constrain a value and that llguidance does not enforce (it reports them as
# "Unimplemented keys"): a schema using one is refused with its name and place, not loosened.
# Annotations (title, description, default, examples, $schema, $id, ...) constrain nothing and pass.
UNSUPPORTED_SCHEMA_KEYS = frozenset({
    "propertyNames", "dependentRequired", "dependentSchemas", "dependencies", "if", "then", "else",
    "not", "contains", "minContains", "maxContains", "uniqueItems", "unevaluatedProperties", "unevaluatedItems",
})
# what llama-cpp-python's converter (schema_gbnf: the tool-call grammars) does not implement besides
_CONVERTER_UNSUPPORTED = UNSUPPORTED_SCHEMA_KEYS | {
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minProperties",
    "maxProperties", "patternProperties"}
# the formats llguidance enforces (others it refuses as "Unknown format", which names no place)
LLG_FORMATS = frozenset({"date", "time", "date-time", "uuid", "email", "uri", "hostname", "ipv4", "ipv6", "duration"})
_CONVERTER_FORMATS = frozenset({"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"})


def _unsupported(schema: Any, path: str, keys=UNSUPPORTED_SCHEMA_KEYS, formats=None) -> tuple[str, str] | None:
    """(where, keyword) of the first constraint the engine would not enforce, else None."""
    if isinstance(schema, list):
        for i, s in enumerate(schema):
            hit = _unsupported(s, f"{path}[{i}]", keys, formats)
            if hit:
                return hit
        return None
    if not isinstance(schema, dict):
        return None
    for key, value in schema.items():
        if key in keys:
            return path or "schema", key
        if formats is not None and key == "format" and isinstance(value, str) and value not in formats:
            return path or "schema", f"format: {value}"
        if key in ("properties", "$defs", "definitions", "patternProperties") and isinstance(value, dict):
            for name, sub in value.items():
                hit = _unsupported(sub, f"{path}.{key}.{name}" if path else f"{key}.{name}", keys, formats)
                if hit:
                    return hit
        elif key in ("items", "prefixItems", "anyOf", "oneOf", "allOf", "additionalProperties", "additionalItems"):
            hit = _unsupported(value, f"{path}.{key}" if path else key, keys, formats)
            if hit:
                return hit
    return None


def _checked(schema: Any, field: str, keys, formats, engine: str) -> dict:
    """The schema as a dict, within the bounds and without a keyword `engine` would not enforce."""
    text_chars = None
    if isinstance(schema, str):
        text_chars = len(schema)
        if text_chars > grammar_bounds.MAX_SCHEMA_CHARS:
            grammar_bounds.check_schema({}, field, text_chars)
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise GrammarError(f"{field} is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})", field) from None
        except RecursionError:
            raise GrammarError(f"{field}: the schema nests too deep", field) from None
    if schema is True:
        schema = {}
    if not isinstance(schema, dict):
        raise GrammarError(f"{field} must be a JSON schema object, not {type(schema).__name__}", field)
    grammar_bounds.check_schema(schema, field, text_chars)
    hit = _unsupported(schema, "", keys, formats)
    if hit:
        where, key = hit
        raise GrammarError(f"{field}: '{key}' (at {where}) is not supported by {engine}; remove it or "
                           "give a GBNF grammar instead", field)
    return schema


_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "dependentSchemas", "patternProperties")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_ONE = ("items", "additionalProperties", "additionalItems", "unevaluatedProperties")


def _closed(schema: Any, shut: bool = True, has_all_of: bool | None = None) -> Any:
    """The schema with llama.cpp's reading of an object that lists `properties` and says nothing
    of others: no other property (its converter writes only the listed ones; JSON Schema would
    allow any). Not under an `allOf` (each branch closed would refuse the others' properties),
    nor in `$defs` when the schema has one. Recursion is bounded by grammar_bounds' depth."""
    if isinstance(schema, list):
        return [_closed(s, shut, has_all_of) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if has_all_of is None:
        has_all_of = '"allOf"' in json.dumps(schema)
    out = dict(schema)
    if shut and isinstance(out.get("properties"), dict) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            inner = shut and not (has_all_of and key in ("$defs", "definitions"))
            out[key] = {k: _closed(v, inner, has_all_of) for k, v in out[key].items()}
    for key in _SUBSCHEMA_LISTS + _SUBSCHEMA_ONE:
        if isinstance(out.get(key), (dict, list)):
            out[key] = _closed(out[key], shut, has_all_of)
    if isinstance(out.get("allOf"), list):
        out["allOf"] = _closed(out["allOf"], False, has_all_of)
    return out


_LOCK = threading.Lock()
_SCHEMAS: dict[bytes, None] = {}   # digests of schemas llguidance validated (a batch job sends one many times)


def _remember(cache: dict, key, value=None, limit: int = 256) -> None:
    with _LOCK:
        cache[key] = value
        while len(cache) > limit:
            cache.pop(next(iter(cache)))


def _digest(*fields) -> bytes:
    return hashlib.sha256(json.dumps(fields).encode("utf-8", "surrogatepass")).digest()


def grammar_from_schema(schema: Any, field: str = "json_schema") -> GrammarSpec:
    """A JSON schema (a dict, or its JSON text) as a GrammarSpec that llguidance compiles,
    validated first (in a worker process unless the sandbox is off).

    `{}` or `true` is any JSON value (llama-server's json_schema {}, OpenAI's json_object).
    Raises GrammarError naming `field` for a schema that is not JSON, is past a bound
    (grammar_bounds.py), uses a keyword llguidance does not enforce, or that it rejects,
    crashes on or takes too long with.
    """
    from llamaspec.runtime import grammar_llg

    schema = _closed(_checked(schema, field, UNSUPPORTED_SCHEMA_KEYS, LLG_FORMATS, "llguidance's JSON schema engine"))
    # (property order kept: it is the output's)
    texts = [json.dumps(s, ensure_ascii=False) for s in (schema_finite.finite(schema), schema)]
    first_why = None
    for text in dict.fromkeys(texts):   # bounded; as written if llguidance cannot intersect the bounds
        key = _digest(text)
        if key in _SCHEMAS:
            return GrammarSpec(field=field, schema=text)
        grammar = grammar_llg.schema_grammar(text)
        if grammar_worker.sandboxed():
            why = grammar_worker.check_llg(None, grammar, field)
        else:
            why = grammar_llg.compile_error(grammar)
        if not why:
            _remember(_SCHEMAS, key)
            return GrammarSpec(field=field, schema=text)
        first_why = first_why or why
    raise GrammarError(f"{field}: the JSON schema cannot be compiled: {first_why}", field)


_CONVERTED: dict[bytes, str] = {}   # recent schemas' GBNF (tool-call grammars)


def schema_gbnf(schema: Any, field: str = "json_schema") -> str:
    """A JSON schema as GBNF, by llama-cpp-python's converter (fixed: grammar_schema.py), in a
    worker unless the sandbox is off: for the lazy tool-call grammars (openai/tool_grammar.py),
    which llama.cpp's engine runs. GrammarError naming `field` as grammar_from_schema."""
    schema = _checked(schema, field, _CONVERTER_UNSUPPORTED, _CONVERTER_FORMATS, "llama.cpp's JSON schema converter")
    key = _digest(schema)
    gbnf = _CONVERTED.get(key)
    if gbnf is not None:
        return gbnf
    if grammar_worker.sandboxed():
        gbnf = grammar_worker.convert(schema, field)
    else:
        from llamaspec.runtime.grammar_schema import schema_to_gbnf

        try:
            gbnf = schema_to_gbnf(schema)
        except (ValueError, KeyError, TypeError, RecursionError, AssertionError) as e:   # (the converter
            # asserts on an unresolvable $ref, an unknown type, an unanchored pattern)
            raise GrammarError(f"{field}: the JSON schema cannot be converted to a grammar: {e}", field) from None
    grammar_bounds.check_gbnf(gbnf, field)
    _remember(_CONVERTED, key, gbnf, 64)
    return gbnf


# ---- which engine, compiled where -------------------------------------------------------------------
_ENGINES: dict[bytes, str | None] = {}   # (model, GBNF) -> llguidance's grammar, or None: llama.cpp's
_LLG_OK: dict[bytes, None] = {}          # (model, llguidance grammar) that compiled in a worker


def _model_path(model) -> str | None:
    path = getattr(model, "path", None)
    return None if path is None else str(path)


def _llg_checked(model, grammar: str, field: str) -> None:
    """Compile `grammar` against the model's vocabulary in a worker first (once per grammar)."""
    path = _model_path(model)
    key = _digest(path, grammar)
    if key in _LLG_OK or not grammar_worker.sandboxed() or path is None:
        return
    why = grammar_worker.check_llg(path, grammar, field)
    if why:
        raise GrammarError(f"{field}: the grammar does not compile: {why}", field)
    _remember(_LLG_OK, key)


def engine_of(model, spec: GrammarSpec) -> tuple[str, str | None]:
    """("llguidance", its grammar) or ("llama.cpp", None): the engine that runs `spec` on
    `model`, its grammar compiled in a worker first (sandbox on, a model loaded from a file).
    A GBNF grammar goes to llguidance when grammar_lark reads it and llguidance compiles it."""
    from llamaspec.runtime import grammar_llg

    if spec.schema is not None:
        grammar = grammar_llg.schema_grammar(spec.schema)
        _llg_checked(model, grammar, spec.field)
        return "llguidance", grammar
    if spec.lazy or spec.special_text:
        return "llama.cpp", None
    path = _model_path(model)
    key = _digest(path, spec.gbnf, spec.root)
    if key not in _ENGINES:
        grammar_bounds.check_gbnf(spec.gbnf, spec.field)
        if _special_literal(model, spec.gbnf):
            grammar = None
        elif grammar_worker.sandboxed() and path is not None:
            grammar = grammar_worker.to_llg(path, spec.gbnf, spec.root, spec.field)
            if grammar is not None:
                _remember(_LLG_OK, _digest(path, grammar))
        else:
            grammar = _gbnf_llg(model, spec)
        _remember(_ENGINES, key, grammar)
    grammar = _ENGINES[key]
    return ("llguidance", grammar) if grammar is not None else ("llama.cpp", None)


_LITERAL = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _special_literal(model, gbnf: str) -> bool:
    """Whether a literal of the grammar holds a special token's text ("<|im_end|>", "<tool_call>"):
    llama.cpp's engine matches it as text, llguidance only as the special token, so a model
    that writes the token would be refused ("the grammar refuses token 661") there."""
    tokenize = getattr(model, "tokenize", None)
    if tokenize is None:
        return False
    for text in dict.fromkeys(m.group(1) for m in _LITERAL.finditer(gbnf)):
        if "<" in text or "[" in text:   # (special tokens' texts are bracketed)
            if tokenize(text, add_special=False, parse_special=True) != tokenize(text, add_special=False,
                                                                               parse_special=False):
                return True
    return False


def _gbnf_llg(model, spec: GrammarSpec) -> str | None:
    """llguidance's grammar for a GBNF grammar, compiled here; None when it cannot be."""
    from llamaspec.runtime import grammar_llg
    from llamaspec.runtime.grammar_lark import GbnfToLarkError, gbnf_to_lark

    try:
        grammar = grammar_llg.lark_grammar(gbnf_to_lark(spec.gbnf, spec.root))
    except (GbnfToLarkError, ValueError, RecursionError):
        return None
    return None if grammar_llg.compile_error(grammar, grammar_llg.tokenizer(model)) else grammar


def GrammarState(model, spec: GrammarSpec):  # noqa: N802 - the constructor name every caller uses
    """One sequence's live grammar for `spec` on `model`: llguidance's (grammar_llg.LLGState) or
    llama.cpp's (grammar_llama.LlamaGrammarState), one interface. GrammarError naming spec.field
    when it does not compile."""
    kind, grammar = engine_of(model, spec)
    if kind == "llguidance":
        from llamaspec.runtime.grammar_llg import LLGState

        try:
            return LLGState(model, spec, grammar)
        except ValueError as e:
            raise GrammarError(f"{spec.field}: the grammar does not compile: {e}", spec.field) from None
    from llamaspec.runtime.grammar_llama import LlamaGrammarState

    return LlamaGrammarState(model, spec)


def check_grammar(model, spec: GrammarSpec) -> None:
    """Compile `spec` once to raise its GrammarError before any generation starts: its bounds
    first, then (sandbox on, a model loaded from a file) in a worker process, only then here."""
    from llamaspec.runtime import grammar_llama

    if spec.schema is None:
        grammar_bounds.check_gbnf(spec.gbnf, spec.field)
    kind, _ = engine_of(model, spec)
    path = _model_path(model)
    key = grammar_llama.spec_key(spec, model)
    if kind == "llama.cpp" and grammar_worker.sandboxed() and path is not None and not grammar_llama.verified(key):
        grammar_worker.check_parses(path, spec.gbnf, spec.root, spec.trigger_patterns, spec.trigger_tokens,
                                    spec.field)
        grammar_llama.mark_verified(key)
    GrammarState(model, spec).close()
