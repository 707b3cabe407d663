"""The grammar copy drafter (drafters/grammar_copy.py): prompt text copied into the free text of a
grammar's output at the byte level, closed by the text the grammar then forces; on hand-written
GBNF and JSON schemas with SmolLM2's real vocabulary; the chain's hold; then the default chain as
the Python API builds it, against plain decoding under the same schema."""

from __future__ import annotations

import pytest

from llamaspec.runtime.grammar import GrammarSpec, GrammarState, grammar_from_schema
from llamaspec.speculative.drafters.chain import ChainDrafter
from llamaspec.speculative.drafters.grammar_copy import GrammarCopyDrafter, longest_source, value_end
from llamaspec.speculative.drafters.prompt_lookup import PromptLookupDrafter

pytestmark = pytest.mark.real

NAME_OK = r'root ::= "{\"name\": \"" [^"\\]+ "\", \"ok\": " ("true" | "false") "}"'
SIGNATURE = "Extract the name.\n\nBest,\nTom Becker\nHead of Sales, Kessler Tools\n"


@pytest.fixture(scope="module")
def model(smollm2_q4):
    from llamaspec.runtime.llama import Model

    m = Model(smollm2_q4)
    yield m
    m.close()


def _toks(model, text: str) -> list[int]:
    return model.tokenize(text, add_special=False, parse_special=False)


def _at(model, spec: GrammarSpec, prompt: str, written: str, drafter=None):
    """The drafter after a sequence with `prompt` wrote `written` under `spec`, as the engine
    runs it: the live state advanced by the emitted tokens, the drafter told of them."""
    state = GrammarState(model, spec)
    d = drafter or GrammarCopyDrafter(model)
    grammars = {0: state}
    d.bind_grammars(grammars)
    p, w = _toks(model, prompt), _toks(model, written)
    d.begin(0, p)
    assert state.accept_all(w) == len(w), written
    d.accepted(0, 0, w, is_other=True)
    return d, p + w


def _text(model, draft) -> str:
    return model.detokenize([t for t in draft.tokens if not model.is_eog(t)])


def test_a_value_is_copied_from_the_prompt_and_closed_by_the_forced_text(model):
    d, history = _at(model, GrammarSpec(NAME_OK), SIGNATURE, '{"name": "Tom')
    draft = d.propose(0, history, 16)
    # " Becker" from the prompt; the newline after it is refused in the value, so the value ends:
    # its closing quote and the text the grammar forces after it follow
    assert _text(model, draft) == ' Becker", "ok":', _text(model, draft)   # ' true' is one token
    assert draft.source == "grammar-copy" and draft.match == 3   # "Tom": the free text matched
    # in the target's own tokenization of that text
    assert draft.tokens == _toks(model, ' Becker", "ok":')


def test_the_value_ends_at_a_delimiter_of_its_source(model):
    d, history = _at(model, GrammarSpec(NAME_OK), SIGNATURE, '{"name": "Head of')
    assert _text(model, d.propose(0, history, 16)).startswith(' Sales", "ok":')


def test_the_draft_room_caps_it(model):
    d, history = _at(model, GrammarSpec(NAME_OK), SIGNATURE, '{"name": "Tom')
    assert len(d.propose(0, history, 2).tokens) == 2


def test_no_draft_and_a_hold_at_a_values_first_bytes(model):
    # the key `"name": "` is forced: it is no evidence, and "To" is too short to be any
    for written in ('{"name": "', '{"name": "T'):
        d, history = _at(model, GrammarSpec(NAME_OK), SIGNATURE, written)
        draft = d.propose(0, history, 16)
        assert not draft.tokens and draft.hold, written


def test_the_hold_keeps_prompt_lookup_from_copying_a_worked_examples_value(model):
    # the worked example's `{"name": "` matches the output's key: prompt lookup alone copies
    # the example's value; behind the grammar copy drafter it is not asked
    prompt = SIGNATURE + 'Example: {"name": "Ann Smith", "ok": true}\n'
    lookup = lambda: PromptLookupDrafter(size_m=16)  # noqa: E731
    d, history = _at(model, GrammarSpec(NAME_OK), prompt, '{"name": "', ChainDrafter([lookup()]))
    assert _text(model, d.propose(0, history, 16)).startswith("Ann")
    chain = ChainDrafter([GrammarCopyDrafter(model), lookup()])
    d, history = _at(model, GrammarSpec(NAME_OK), prompt, '{"name": "', chain)
    assert not d.propose(0, history, 16).tokens


def test_text_not_in_the_prompt_gives_no_draft_but_no_hold(model):
    d, history = _at(model, GrammarSpec(NAME_OK), SIGNATURE, '{"name": "Zyx')
    draft = d.propose(0, history, 16)
    assert not draft.tokens and not draft.hold


def test_without_a_grammar_it_is_silent(model):
    d = GrammarCopyDrafter(model)
    d.bind_grammars({})
    p = _toks(model, SIGNATURE)
    d.begin(0, p)
    d.accepted(0, 0, _toks(model, "Tom"), is_other=True)
    draft = d.propose(0, p + _toks(model, "Tom"), 16)
    assert not draft.tokens and not draft.hold


def test_silent_until_the_grammar_forces_a_byte(model):
    # a grammar that constrains nothing here (a lazy tool-call grammar before its trigger is so):
    # no draft and no hold, so prompt lookup copies as without a grammar
    free = GrammarSpec(r'root ::= [^\x00]+')
    chain = ChainDrafter([GrammarCopyDrafter(model), PromptLookupDrafter(size_m=16)])
    d, history = _at(model, free, SIGNATURE, "Tom", chain)
    assert _text(model, d.propose(0, history, 16)).startswith(" Becker")
    assert d.propose(0, history, 16).source == "prompt-lookup"


def test_the_live_state_is_not_advanced(model):
    d, history = _at(model, GrammarSpec(NAME_OK), SIGNATURE, '{"name": "Tom')
    state = d._grammars[0]
    before = [state.allows(t) for t in _toks(model, '",')]
    assert d.propose(0, history, 16).tokens
    assert [state.allows(t) for t in _toks(model, '",')] == before
    assert state.allows(_toks(model, " Becker")[0])


def test_a_schema_value_with_an_email_and_the_next_key(model):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "email": {"type": "string"}},
              "required": ["name", "email"], "additionalProperties": False}
    prompt = "Contact:\nMaria Lopez\nmaria.lopez@brightwater.com\n"
    d, history = _at(model, grammar_from_schema(schema), prompt, '{"name": "Maria Lopez", "email": "maria.')
    assert _text(model, d.propose(0, history, 32)) == 'lopez@brightwater.com"}'


def test_json_strings_refuse_raw_control_characters(model):
    # llama-cpp-python's converter allows them; JSON (and llama.cpp's converter) does not
    state = GrammarState(model, grammar_from_schema({"type": "object", "properties": {"a": {"type": "string"}}}))
    assert state.accept_all(_toks(model, '{"a": "x')) == len(_toks(model, '{"a": "x'))
    assert not state.allows(_toks(model, "\n")[0]) and not state.allows(_toks(model, "\t")[0])
    assert state.allows(_toks(model, "\\")[0]) and state.allows(_toks(model, "y")[0])


def test_pure_helpers():
    assert longest_source(b"Tom Becker\nTim Becker", 21, b'"Tim B') == (16, 5)
    assert longest_source(b"Tom Becker", 10, b"Tom") == (3, 3)
    assert longest_source(b"Tom Becker", 10, b"To") == (-1, 0)    # below the minimum
    assert value_end(b" Becker\nHead") == 7 and value_end(b"3.2.0 and") == 9
    assert value_end(b" Ali Hassan. Then") == 11


# End to end, as the Python API builds it (the default chain against plain decoding under a
# schema, grammar-copy credited and fewer steps): test_grammar_drafter.py's test of the default
# chain, on the same generations.


def test_schema_whitespace_is_llama_cpps(model):
    # a blank, or line breaks and indentation, as llama.cpp's converter (llama-server) allows
    spec = grammar_from_schema({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]})
    for text in ('{"a": "x"}', '{\n  "a": "x"\n}', '{"a":"x"}'):
        state = GrammarState(model, spec)
        assert state.accept_all(_toks(model, text)) == len(_toks(model, text)), text
