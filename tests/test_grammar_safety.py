"""Issue 34 on a real vocabulary (SmolLM2 F16): the schemas llama-cpp-python's converter used to
loosen now refuse what they forbid; a grammar that crashes llama.cpp's parser or runs away is that
grammar's GrammarError from the compile worker, and this process carries on; concurrent compile
errors each quote their own reason."""

from __future__ import annotations

import threading

import pytest

from llamaspec.runtime import grammar_bounds, grammar_worker
from llamaspec.runtime.grammar import GrammarError, GrammarSpec, GrammarState, check_grammar, grammar_from_schema

pytestmark = [pytest.mark.real]


def allows(model, spec: GrammarSpec, text: str) -> bool:
    """Whether the grammar takes every token of `text` (from the start)."""
    state = GrammarState(model, spec)
    try:
        tokens = model.tokenize(text, add_special=False)
        return state.accept_all(tokens) == len(tokens)
    finally:
        state.close()


def test_a_type_list_enum_allows_only_its_values(f16):
    spec = grammar_from_schema({"type": ["string", "null"], "enum": ["red", "green", None]}, "response_format")
    check_grammar(f16, spec)
    assert allows(f16, spec, '"red"') and allows(f16, spec, "null")
    assert not allows(f16, spec, '"Blue"') and not allows(f16, spec, '"blue"')


def test_a_nullable_object_enforces_its_properties(f16):
    spec = grammar_from_schema({"type": ["object", "null"], "properties": {"a": {"type": "integer"}},
                                "required": ["a"], "additionalProperties": False})
    assert allows(f16, spec, '{"a": 1}') and allows(f16, spec, "null")
    assert not allows(f16, spec, '{"b": 1}') and not allows(f16, spec, '{"a": "x"}')


def test_a_pattern_never_writes_a_raw_quote(f16):
    spec = grammar_from_schema({"type": "string", "pattern": "^a.b$"})
    assert allows(f16, spec, '"axb"')
    assert not allows(f16, spec, '"a"b"') and not allows(f16, spec, '"a\\b"')
    neg = grammar_from_schema({"type": "string", "pattern": "^[^x]+$"})
    assert allows(f16, neg, '"abc"') and not allows(f16, neg, '"a"b"')


def test_same_named_defs_keep_their_own_schemas(f16):
    spec = grammar_from_schema({
        "type": "object", "properties": {"a": {"$ref": "#/$defs/X"}, "b": {"$ref": "#/$defs/inner/$defs/X"}},
        "required": ["a", "b"], "additionalProperties": False,
        "$defs": {"X": {"type": "integer"}, "inner": {"$defs": {"X": {"type": "string"}}}}})
    assert allows(f16, spec, '{"a": 1, "b": "s"}')
    assert not allows(f16, spec, '{"a": 1, "b": 2')


DEEP = "root ::= " + "(" * 60_000 + '"a"' + ")" * 60_000


def test_a_grammar_that_crashes_the_parser_is_its_own_error(f16, monkeypatch):
    monkeypatch.setattr(grammar_bounds, "MAX_GBNF_DEPTH", 10**6)   # past the bounds: the worker's turn
    with pytest.raises(GrammarError, match="crashed the compiler") as e:
        check_grammar(f16, GrammarSpec(DEEP, field="grammar"))
    assert e.value.field == "grammar"
    check_grammar(f16, GrammarSpec('root ::= "yes" | "no"'))   # a new worker, this process alive


def test_a_grammar_that_runs_away_is_stopped(f16, monkeypatch):
    monkeypatch.setattr(grammar_worker, "TIME_LIMIT", 0.3)
    slow = "root ::= " + " | ".join(f'"w{i}x"' for i in range(30_000))
    with pytest.raises(GrammarError, match="took longer than 0.3 s"):
        check_grammar(f16, GrammarSpec(slow, field="json_schema"))
    check_grammar(f16, GrammarSpec('root ::= "ok"'))


def test_the_bounds_refuse_the_deep_grammar_before_any_worker(f16, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("the worker was asked")

    monkeypatch.setattr(grammar_worker, "check_parses", boom)
    with pytest.raises(GrammarError, match="nests"):
        check_grammar(f16, GrammarSpec(DEEP, field="grammar"))


@pytest.mark.parametrize("sandbox", ["0", "1"])
def test_concurrent_compile_errors_quote_their_own_reason(f16, monkeypatch, sandbox):
    monkeypatch.setenv(grammar_worker.SANDBOX_ENV, sandbox)
    wrong: list[str] = []

    def compile_bad(k: int) -> None:
        for j in range(15):
            name = f"missing{k}x{j}"
            try:
                check_grammar(f16, GrammarSpec(f"root ::= {name}", field=f"f{k}"))
            except GrammarError as e:
                if name not in e.message or not e.message.startswith(f"f{k}: "):
                    wrong.append(e.message)
            else:
                wrong.append(f"{name} compiled")

    threads = [threading.Thread(target=compile_bad, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
