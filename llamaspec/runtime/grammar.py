"""llama.cpp's grammar engine for one sequence: GBNF grammars and JSON schemas compiled by
llama.cpp (through llama-cpp-python's grammar sampler and its JSON schema converter), checked
one token at a time, applied to a whole row only when needed, cloned for drafts.

Why one-token checks: llama.cpp's common/sampling.cpp samples (or takes the argmax) first and
asks the grammar about that one token; only when the grammar refuses it does it mask the whole
vocabulary and sample again. Sampling y ~ p, keeping it when allowed, else y ~ p restricted to the
allowed set A, gives exactly p(y)/p(A): the constrained distribution, at a fraction of the cost.

Never `accept` a token the grammar refuses: llama.cpp aborts the process on it (an empty grammar
stack, or an end-of-generation token before the grammar is complete). `GrammarState.accept`
checks first and raises instead.
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from llamaspec.runtime import grammar_bounds, grammar_worker
from llamaspec.runtime.grammar_errors import GrammarError, parse_error as _parse_error
from llamaspec.runtime.grammar_schema import JSON_CHAR, JSON_SPACE, as_llama_cpp as _as_llama_cpp

__all__ = ["GrammarSpec", "GrammarError", "GrammarState", "grammar_from_schema", "UNSUPPORTED_SCHEMA_KEYS",
           "JSON_CHAR", "JSON_SPACE", "check_grammar"]


@dataclass(frozen=True)
class GrammarSpec:
    """A grammar to constrain one generation: GBNF text (llama.cpp's grammar format) and its root.

    Lazy (trigger_patterns or trigger_tokens given): nothing is constrained until the generated
    text matches one of the patterns (regexes, llama.cpp's grammar_lazy_patterns: the grammar then
    applies from the pattern's first capture group, or the whole match) or a trigger token is
    generated; that is how a tool call's grammar starts only when the model opens a call.
    `field` names what the user gave (`response_format`, `--json-schema`, ...) for error messages.
    """

    gbnf: str
    root: str = "root"
    field: str = "grammar"
    trigger_patterns: tuple[str, ...] = ()
    trigger_tokens: tuple[int, ...] = ()

    @property
    def lazy(self) -> bool:
        return bool(self.trigger_patterns or self.trigger_tokens)


# Keywords that constrain a value and that llama-cpp-python's converter (a port of llama.cpp's
# json_schema_to_grammar.py) does not implement: a schema using one is refused with its name,
# not silently loosened. Annotations (title, description, default, examples, $schema, $id, ...)
# constrain nothing and pass.
UNSUPPORTED_SCHEMA_KEYS = frozenset({
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
    "minProperties", "maxProperties", "patternProperties", "propertyNames", "dependentRequired",
    "dependentSchemas", "dependencies", "if", "then", "else", "not", "contains", "minContains",
    "maxContains", "uniqueItems", "unevaluatedProperties", "unevaluatedItems",
})
_SUPPORTED_FORMATS = frozenset({"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"})


def _unsupported(schema: Any, path: str) -> tuple[str, str] | None:
    """(where, keyword) of the first constraint the converter would drop, else None."""
    if isinstance(schema, list):
        for i, s in enumerate(schema):
            hit = _unsupported(s, f"{path}[{i}]")
            if hit:
                return hit
        return None
    if not isinstance(schema, dict):
        return None
    for key, value in schema.items():
        if key in UNSUPPORTED_SCHEMA_KEYS:
            return path or "schema", key
        if key == "format" and isinstance(value, str) and value not in _SUPPORTED_FORMATS:
            return path or "schema", f"format: {value}"
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            for name, sub in value.items():
                hit = _unsupported(sub, f"{path}.{key}.{name}" if path else f"{key}.{name}")
                if hit:
                    return hit
        elif key in ("items", "prefixItems", "anyOf", "oneOf", "allOf", "additionalProperties"):
            hit = _unsupported(value, f"{path}.{key}" if path else key)
            if hit:
                return hit
    return None


def grammar_from_schema(schema: Any, field: str = "json_schema") -> GrammarSpec:
    """A JSON schema (a dict, or its JSON text) as a GBNF grammar, by llama-cpp-python's converter
    (fixed: grammar_schema.py), in a worker process (grammar_worker.py) unless the sandbox is off.

    `{}` or `true` is any JSON value (llama-server's json_schema {}, OpenAI's json_object).
    Raises GrammarError naming `field` for a schema that is not JSON, is past a bound
    (grammar_bounds.py), uses a constraint the converter does not implement, or that the
    converter rejects, crashes on or takes too long with.
    """
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
    hit = _unsupported(schema, "")
    if hit:
        where, key = hit
        raise GrammarError(f"{field}: '{key}' (at {where}) is not supported by llama.cpp's JSON schema "
                           "converter; remove it or give a GBNF grammar instead", field)
    key = _schema_key(schema)
    gbnf = _CONVERTED.get(key)
    if gbnf is not None:
        return GrammarSpec(gbnf, field=field)
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
    with _STDERR_LOCK:
        _CONVERTED[key] = gbnf
        while len(_CONVERTED) > 64:
            _CONVERTED.pop(next(iter(_CONVERTED)))
    return GrammarSpec(gbnf, field=field)


_CONVERTED: dict[bytes, str] = {}   # recent schemas' grammars (a batch job sends one schema many times)


def _schema_key(schema: dict) -> bytes:
    import hashlib

    return hashlib.sha256(json.dumps(schema).encode("utf-8", "surrogatepass")).digest()   # (property order counts)


_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])


class GrammarState:
    """One sequence's live grammar: llama.cpp's grammar sampler, advanced by the emitted tokens.

    `allows(t)` asks about one token; `mask(row)` returns the row with every refused token at
    -inf; `accept(t)` advances; `clone()` copies the state (for a draft's rows: never advance the
    real state by a token that may be rejected). Free with close() (or let it be collected).

        >>> # with a loaded Model `m`:  g = GrammarState(m, GrammarSpec('root ::= "yes" | "no"'))
        >>> # g.allows(m.tokenize("yes", add_special=False)[0]) -> True; the token of "maybe" -> False
    """

    def __init__(self, model, spec: GrammarSpec, *, _ptr=None):
        import llama_cpp

        self.model, self.spec = model, spec
        self._ptr = _ptr
        if self._ptr is None:
            self._ptr = _compile(model, spec)
        self._one = (llama_cpp.llama_token_data * 1)()
        self._one_arr = llama_cpp.llama_token_data_array(data=self._one, size=1, selected=-1, sorted=False)
        self._buf: np.ndarray | None = None   # the whole-vocabulary array, made at the first mask

    def allows(self, token: int) -> bool:
        import llama_cpp

        self._one[0].id, self._one[0].logit, self._one[0].p = int(token), 0.0, 0.0
        self._one_arr.size, self._one_arr.selected = 1, -1
        llama_cpp.llama_sampler_apply(self._ptr, ctypes.byref(self._one_arr))
        return self._one[0].logit != -np.inf

    def mask(self, row: np.ndarray) -> np.ndarray:
        """A copy of `row` (one logit per token id) with every token the grammar refuses at -inf."""
        out = np.array(row, dtype=np.float32, copy=True)
        out[~self.allowed_mask(row.shape[0])] = -np.inf
        return out

    def allowed_mask(self, n: int) -> np.ndarray:
        """Booleans over token ids 0..n-1: True where the grammar allows the token now (one apply
        over the whole vocabulary: ~5-10 ms on 49k tokens; ask `allows` first where one will do)."""
        import llama_cpp

        if self._buf is None or self._buf.shape[0] != n:
            self._buf = np.zeros(n, dtype=_TOKEN_DATA)
            self._buf["id"] = np.arange(n, dtype=np.int32)
            self._arr = llama_cpp.llama_token_data_array(
                data=self._buf.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)),
                size=n, selected=-1, sorted=False)
        # the grammar only writes -inf into refused entries: fill zeros, read which ones it hit
        self._buf["logit"] = 0.0
        self._arr.size, self._arr.selected, self._arr.sorted = n, -1, False
        llama_cpp.llama_sampler_apply(self._ptr, ctypes.byref(self._arr))
        return self._buf["logit"] != -np.inf

    def allowed_ids(self, candidates: Sequence[int]) -> list[int]:
        """Which of `candidates` the grammar allows now (one apply over just those tokens)."""
        import llama_cpp

        if not len(candidates):
            return []
        buf = np.zeros(len(candidates), dtype=_TOKEN_DATA)
        buf["id"] = np.asarray(candidates, dtype=np.int32)
        arr = llama_cpp.llama_token_data_array(data=buf.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)),
                                               size=len(candidates), selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(self._ptr, ctypes.byref(arr))
        return [int(t) for t in buf["id"][buf["logit"] != -np.inf]]

    def accept(self, token: int) -> None:
        """Advance by one emitted token. Raises ValueError (instead of llama.cpp's abort) when the
        grammar refuses it."""
        import llama_cpp

        if not self.allows(token):
            raise ValueError(f"the grammar refuses token {token} ({self.model.token_text(token)!r})")
        llama_cpp.llama_sampler_accept(self._ptr, int(token))

    def accept_all(self, tokens: Sequence[int]) -> int:
        """Accept tokens while the grammar allows them; returns how many were accepted."""
        for i, t in enumerate(tokens):
            if not self.allows(t):
                return i
            self.accept(t)
        return len(tokens)

    def clone(self) -> "GrammarState":
        import llama_cpp

        return GrammarState(self.model, self.spec, _ptr=llama_cpp.llama_sampler_clone(self._ptr))

    def close(self) -> None:
        import llama_cpp

        ptr, self._ptr = self._ptr, None
        if ptr:
            llama_cpp.llama_sampler_free(ptr)

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


def _compile(model, spec: GrammarSpec):
    """llama.cpp's grammar sampler for `spec`; GrammarError naming spec.field when it fails."""
    import llama_cpp

    from llamaspec.runtime.llama import _LOG_TAIL

    gbnf, root = spec.gbnf.encode("utf-8"), spec.root.encode("utf-8")
    with _STDERR_LOCK, _native_stderr(capture=not _verified(spec, model)) as said:
        _LOG_TAIL.clear()
        if spec.lazy:
            pats = [p.encode("utf-8") for p in spec.trigger_patterns]
            pat_arr = (ctypes.c_char_p * max(1, len(pats)))(*pats)
            tok_arr = (llama_cpp.llama_token * max(1, len(spec.trigger_tokens)))(*spec.trigger_tokens)
            ptr = llama_cpp.llama_sampler_init_grammar_lazy_patterns(model.vocab, gbnf, root, pat_arr, len(pats),
                                                                     tok_arr, len(spec.trigger_tokens))
        else:
            ptr = llama_cpp.llama_sampler_init_grammar(model.vocab, gbnf, root)
        log = list(_LOG_TAIL)
    why = "" if ptr else _parse_error(said[0], log)
    if said[0] and not why:   # anything but the parser's reason (which the one-line error says) is kept
        os.write(2, said[0].encode("utf-8"))
    if not ptr:
        raise GrammarError(f"{spec.field}: the grammar does not compile: {why or 'llama.cpp could not parse it'}",
                           spec.field)
    return ptr


# File descriptor 2 is the whole process's: one capture at a time (else one request's error
# could quote another's), and none for a grammar the worker compiled already (it cannot fail).
_STDERR_LOCK = threading.Lock()
_VERIFIED: dict[bytes, None] = {}   # digests of the grammars that compiled in a worker (oldest first)


def _key(spec: GrammarSpec, model) -> bytes:
    import hashlib

    fields = [str(getattr(model, "path", "")), spec.gbnf, spec.root, spec.trigger_patterns, spec.trigger_tokens]
    return hashlib.sha256(json.dumps(fields).encode("utf-8", "surrogatepass")).digest()


def _verified(spec: GrammarSpec, model) -> bool:
    return _key(spec, model) in _VERIFIED


class _native_stderr:
    """Captures what native code writes to file descriptor 2 meanwhile (llama.cpp's grammar
    parser prints its reason there, not to the log); `said[0]` is the text, for the caller to
    fold into its error or write back. Hold _STDERR_LOCK around it."""

    def __init__(self, capture: bool = True):
        self.capture = capture

    def __enter__(self) -> list[str]:
        import sys
        import tempfile

        self.said = [""]
        self._saved = None
        if not self.capture:
            return self.said
        try:
            sys.stderr.flush()
            self._tmp = tempfile.TemporaryFile()
            self._saved = os.dup(2)
            os.dup2(self._tmp.fileno(), 2)
        except (OSError, ValueError):   # no fd 2 (an embedding without one): nothing captured
            self._saved = None
        return self.said

    def __exit__(self, *exc) -> None:
        if self._saved is None:
            return
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._tmp.seek(0)
        data = self._tmp.read()
        self._tmp.close()
        self.said[0] = data.decode("utf-8", errors="replace")


def check_grammar(model, spec: GrammarSpec) -> None:
    """Compile `spec` once to raise its GrammarError before any generation starts: its bounds
    first, then (sandbox on, a model loaded from a file) in a worker process, only then here."""
    grammar_bounds.check_gbnf(spec.gbnf, spec.field)
    path = getattr(model, "path", None)
    key = _key(spec, model)
    if grammar_worker.sandboxed() and path is not None and key not in _VERIFIED:
        grammar_worker.check_parses(path, spec.gbnf, spec.root, spec.trigger_patterns, spec.trigger_tokens,
                                    spec.field)
        with _STDERR_LOCK:
            _VERIFIED[key] = None
            while len(_VERIFIED) > 256:
                _VERIFIED.pop(next(iter(_VERIFIED)))
    GrammarState(model, spec).close()
