"""The llguidance engine (runtime/grammar_llg.py, grammar_lark.py) on real vocabularies: what a
schema or a GBNF grammar allows and refuses, end of generation only where the grammar is
complete, llama.cpp's bounded JSON whitespace, llama.cpp's sample grammars accepted and enforced,
a SentencePiece vocabulary (Gemma 3), the worker's word before any matcher is built here, and
greedy output under a schema the same with speculation as without."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from llamaspec.runtime import grammar_worker
from llamaspec.runtime.grammar import GrammarError, GrammarSpec, GrammarState, engine_of, grammar_from_schema

pytestmark = [pytest.mark.real]

GRAMMARS = Path(__file__).parent / "fixtures" / "grammars"   # llama.cpp's grammars/*.gbnf (llama-cpp-python 0.3.36)


@pytest.fixture(scope="module")
def model(smollm2_q4):
    from llamaspec.runtime.llama import Model

    m = Model(smollm2_q4)
    yield m
    m.close()


def takes(model, spec, text: str, whole: bool = True) -> bool:
    """Whether the grammar takes `text` (its tokens, from the start) and, `whole`, is complete there."""
    state = GrammarState(model, spec)
    try:
        toks = model.tokenize(text, add_special=False, parse_special=False)
        return state.accept_all(toks) == len(toks) and (not whole or state.allows(model.eos))
    finally:
        state.close()


def test_schemas_and_plain_gbnf_run_on_llguidance_lazy_grammars_on_llama_cpp(model):
    assert engine_of(model, grammar_from_schema({"type": "integer"}))[0] == "llguidance"
    assert engine_of(model, GrammarSpec('root ::= "a" [0-9]+'))[0] == "llguidance"
    assert engine_of(model, GrammarSpec('root ::= "a"', trigger_patterns=("x",)))[0] == "llama.cpp"
    # a token reference (llama.cpp's <[id]>) is not llguidance's GBNF: llama.cpp's engine runs it
    odd = GrammarSpec('root ::= "a" <[33]>')
    assert engine_of(model, odd)[0] == "llama.cpp"
    state = GrammarState(model, odd)
    state.accept(model.tokenize("a", add_special=False)[0])
    assert state.allowed_ids(range(100)) == [33]


def test_a_type_list_enum_refuses_blue(model):
    spec = grammar_from_schema({"type": ["string", "null"], "enum": ["red", "green"]})
    assert takes(model, spec, '"red"') and takes(model, spec, '"green"')
    assert not takes(model, spec, '"Blue"', whole=False) and not takes(model, spec, "null", whole=False)


def test_a_pattern_refuses_a_raw_quote_and_keeps_json_schema_search_semantics(model):
    spec = grammar_from_schema({"type": "string", "pattern": "^a.b$"})
    assert takes(model, spec, '"axb"') and not takes(model, spec, '"a"b"', whole=False)
    loose = grammar_from_schema({"type": "string", "pattern": "a+"})   # unanchored: contains an "a"
    assert takes(model, loose, '"xax"') and not takes(model, loose, '"xx"')


def test_keywords_llama_cpp_dropped_are_enforced(model):
    spec = grammar_from_schema({"type": "object", "properties": {"n": {"type": "integer", "minimum": 3,
                                                                       "maximum": 9}}, "required": ["n"]})
    assert takes(model, spec, '{"n": 5}') and not takes(model, spec, '{"n": 2}') and not takes(model, spec, '{"n": 10}')
    fmt = grammar_from_schema({"type": "string", "format": "date"})
    assert takes(model, fmt, '"2025-06-12"') and not takes(model, fmt, '"2025-13-12"')


def test_end_of_generation_only_where_the_grammar_is_complete(model):
    spec = grammar_from_schema({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    state = GrammarState(model, spec)
    eog = [t for t in range(model.n_vocab) if model.is_eog(t)]
    assert len(eog) > 1
    for text, complete in (("", False), ('{"a"', False), ('{"a": 1', False), ('{"a": 1}', True)):
        s = state.clone()
        toks = model.tokenize(text, add_special=False, parse_special=False)
        assert s.accept_all(toks) == len(toks)
        ok = s.allowed_mask(model.n_vocab)
        assert all(s.allows(t) == complete == bool(ok[t]) for t in eog), text   # every EOG token, not just EOS
        if complete:   # nothing may follow the last "}": only the end
            assert ok.sum() == len(eog) and s.allowed_ids(range(model.n_vocab)) == eog
        with pytest.raises(ValueError):
            s.accept(eog[0])


def test_json_whitespace_is_llama_cpps_bounded_space(model):
    spec = grammar_from_schema({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}},
                                "required": ["a"]})
    for ok in ('{"a":[1,2]}', '{ "a" : [ 1 , 2 ] }', '{\n  "a": [\n    1,\n    2\n  ]\n}', '{\n\n\t"a": []}'):
        assert takes(model, spec, ok), ok
    for bad in ('{  "a": []}', '{\n' + " " * 21 + '"a": []}', '{\n\n\n"a": []}', ' {"a": []}'):
        assert not takes(model, spec, bad, whole=False), bad
    # a schema's own x-guidance cannot turn on unbounded whitespace nor drop keywords
    loose = grammar_from_schema({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                                 "x-guidance": {"whitespace_flexible": True, "lenient": True}})
    assert not takes(model, loose, '{' + " " * 30 + '"a": 1}', whole=False)


def test_objects_take_only_their_listed_properties_as_llama_cpp_reads_them(model):
    spec = grammar_from_schema({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    assert takes(model, spec, '{"a": 1}') and not takes(model, spec, '{"a": 1, "b": 2}', whole=False)
    both = grammar_from_schema({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                                          {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]}]})
    assert takes(model, both, '{"a": 1, "b": 2}')


@pytest.mark.parametrize("gbnf, yes, no", [
    ('root ::= x "a"\nx ::= [a-z]+ | "b" y\ny ::= "c"', ["bca", "zza", "aa"], ["a", "bc"]),   # a rule's [a-z]+ gives back
    ('root ::= w w\nw ::= [a-z]+ "!"?', ["ab", "a!b", "abc!"], ["a", "!"]),
    ('root ::= ("ab" | "a") "b"', ["ab", "abb"], ["abbb"]),
    ('root ::= [-a] [^-] . "\\u00e9"', ["-\n\né", "aaaé"], ["--aé"]),
])
def test_gbnf_keeps_llama_cpps_meaning(model, gbnf, yes, no):
    """llguidance's own gbnf_to_lark makes these rules greedy lexemes (it refuses "zza", "ab")."""
    spec = GrammarSpec(gbnf)
    assert engine_of(model, spec)[0] == "llguidance"
    for text in yes:
        assert takes(model, spec, text), text
    for text in no:
        assert not takes(model, spec, text), text


SAMPLES = {   # (an output the grammar takes whole, a text it refuses)
    "arithmetic": ("x+2 = 5\n", "x = = 2\n"), "c": ("int main(){return 0;}", "main {"),
    "chess": ("1. e4 e5\n2. Nf3 Nc6\n", "1. e9"), "english": ("The cat sat.", "the  cat"),
    "japanese": ("こんにちは", "hello"), "json": ('{"a": [1, "x", true, null]}', '{"a" 1}'),
    "json_arr": ('[\n {"a": 1}\n]', '{"a": 1}'), "list": ("- milk\n- eggs\n", "milk"),
}


@pytest.mark.parametrize("name", sorted(p.stem for p in GRAMMARS.glob("*.gbnf")))
def test_llama_cpps_sample_grammars_are_accepted_and_enforced(model, name):
    spec = GrammarSpec((GRAMMARS / f"{name}.gbnf").read_text(), field="--grammar-file")
    assert engine_of(model, spec)[0] == "llguidance", name
    good, bad = SAMPLES[name]
    assert takes(model, spec, good), good
    assert not takes(model, spec, bad, whole=False), bad


def test_a_sentencepiece_vocabulary_works(gemma_q4):
    from llamaspec.runtime.llama import Model

    m = Model(gemma_q4)
    try:
        spec = grammar_from_schema({"type": "object", "properties": {"city": {"enum": ["Oslo", "Cairo"]}},
                                    "required": ["city"]})
        assert takes(m, spec, '{"city": "Oslo"}') and not takes(m, spec, '{"city": "Rome"}', whole=False)
        assert takes(m, GrammarSpec('root ::= "yes " [a-z]+'), "yes please")
        eog = [t for t in range(m.n_vocab) if m.is_eog(t)]
        state = GrammarState(m, spec)
        assert not any(state.allows(t) for t in eog)
    finally:
        m.close()


def test_the_worker_compiles_request_input_before_this_process_does(model, monkeypatch):
    """The parent builds a matcher only for a grammar that compiled in the worker: a worker that
    says no (or dies) is the request's GrammarError, and nothing was compiled here."""
    from llamaspec.runtime import grammar_llg

    monkeypatch.setenv(grammar_worker.SANDBOX_ENV, "1")
    built = []
    monkeypatch.setattr(grammar_llg, "_matcher", lambda *a: built.append(a) or (_ for _ in ()).throw(AssertionError))
    monkeypatch.setattr(grammar_worker, "check_llg", lambda path, grammar, field: "too complex (test)")
    with pytest.raises(GrammarError, match="^response_format: the JSON schema cannot be compiled: too complex"):
        grammar_from_schema({"type": "object", "properties": {"zz-unique-1": {"type": "integer"}}}, "response_format")
    assert built == []


def test_greedy_under_a_schema_is_the_same_with_speculation(model, smollm2_q4):
    """The default speculation (grammar drafters, n-gram, a draft model) against --spec-type none,
    greedy, under a schema: the same tokens (Q4 rows give the same logits in any batch here)."""
    import jsonschema

    from engine_helpers import prompt_tokens
    from llamaspec.speculative.options import SpecOptions, parse_spec_types
    from llamaspec.speculative.pipeline import load_pipeline
    from llamaspec.speculative.sampling_params import SamplingParams

    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                               "tier": {"enum": ["gold", "silver"]}}, "required": ["name", "age", "tier"]}
    spec = grammar_from_schema(schema)
    prompt = prompt_tokens(model, "Anna Berg is 34 and has a gold card. Write her record as JSON.")
    sampling = SamplingParams(temperature=0.0)
    out = {}
    for spec_type in ("none", "grammar,ngram-simple"):
        opts = SpecOptions(spec_types=parse_spec_types(spec_type), n_ctx=1024, n_threads=2)
        pipe = load_pipeline(model.path, opts, sampling, target=model)
        try:
            out[spec_type] = pipe.engine.generate(prompt, pipe.config(sampling=sampling, max_tokens=64, grammar=spec))
        finally:
            pipe.close(keep_target=True)
    ref, spec_run = out["none"], out["grammar,ngram-simple"]
    assert spec_run.tokens == ref.tokens and ref.stop_reason == "eos"
    jsonschema.validate(json.loads(ref.text), schema)
    assert spec_run.stats.accepted > 0
    assert np.isfinite(spec_run.stats.accepted)


@pytest.mark.parametrize("schema, named", [
    ({"type": "object", "patternProperties": {"^x": {"not": {"type": "string"}}}}, "'not' (at patternProperties.^x)"),
    ({"type": "object", "properties": {"id": {"type": "string", "format": "uuid4"}}},
     "'format: uuid4' (at properties.id)"),
    ({"type": "array", "prefixItems": [{"type": "string"}], "additionalItems": {"uniqueItems": True}},
     "'uniqueItems' (at additionalItems)"),
])
def test_a_refused_keyword_is_named_with_its_place(schema, named):
    """llguidance's own refusals ("Unimplemented keys", "Unknown format") name no place: the
    walk before it finds them first, inside patternProperties and additionalItems too."""
    with pytest.raises(GrammarError) as e:
        grammar_from_schema(schema, "response_format")
    assert named in str(e.value) and e.value.field == "response_format"


def test_numbers_times_and_emails_end_within_llama_cpps_bounds(model):
    """A value the schema leaves endless has an end (runtime/schema_finite.py): SmolLM2 wrote
    digits until max_tokens under {"type": "integer"}, "number" and format time before."""
    integer = grammar_from_schema({"type": "integer"})
    assert takes(model, integer, "9007199254740991") and takes(model, integer, "-9007199254740991")
    assert not takes(model, integer, "1" + "0" * 16, whole=False)          # 17 digits
    number = grammar_from_schema({"type": ["number", "null"]})
    assert takes(model, number, "3.1415926535") and takes(model, number, "null") and takes(model, number, "-0.5")
    assert not takes(model, number, "3.14159265358", whole=False)          # 11 fraction digits
    # the schema's own bounds stand: a wider one is kept, a finer multipleOf too
    wide = grammar_from_schema({"type": "integer", "maximum": 10**18})
    assert takes(model, wide, "1" + "0" * 17) and not takes(model, wide, "-" + "1" * 17, whole=False)
    fine = grammar_from_schema({"type": "number", "multipleOf": 0.5})
    assert takes(model, fine, "2.5") and not takes(model, fine, "2.25", whole=False)
    time = grammar_from_schema({"type": "string", "format": "time"})
    assert takes(model, time, '"20:00:00.123456789+05:30"') and takes(model, time, '"20:00:00Z"')
    assert not takes(model, time, '"20:00:00.1234567890123456Z"', whole=False)
    email = grammar_from_schema({"type": "string", "format": "email"})
    assert takes(model, email, '"ada@example.com"')
    assert not takes(model, email, '"' + "a" * 65 + '@x.org"', whole=False)
    own = grammar_from_schema({"type": "string", "format": "email", "pattern": "^.+@.+$"})   # theirs kept
    assert takes(model, own, '"' + "a" * 65 + '@x.org"')


def test_a_gbnf_literal_holding_a_special_tokens_text_runs_on_llama_cpp(model):
    """A model writes "<|im_start|>" as its one special token, which llguidance's tokenizer does
    not take for the literal's text; llama.cpp's engine matches the token's text."""
    spec = GrammarSpec('root ::= "a" "<|im_start|>" "b"')
    assert engine_of(model, spec)[0] == "llama.cpp"
    special = model.tokenize("<|im_start|>", add_special=False, parse_special=True)
    assert len(special) == 1
    state = GrammarState(model, spec)
    try:
        state.accept_all(model.tokenize("a", add_special=False))
        assert state.allows(special[0])
    finally:
        state.close()
    # a literal with brackets that are only text stays on llguidance
    assert engine_of(model, GrammarSpec('root ::= "<b>" [a-z]+ "</b>"'))[0] == "llguidance"
