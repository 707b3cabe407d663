"""The grammar drafter (drafters/grammar_jump.py): the text a live grammar state forces, proposed
in the target's tokenization, on hand-written GBNF grammars and a JSON schema, with SmolLM2's real
vocabulary; then the drafter as `run` builds it, under a JSON schema, against plain decoding."""

from __future__ import annotations

import pytest

from llamaspec.runtime.grammar import GrammarSpec, GrammarState, grammar_from_schema
from llamaspec.speculative.drafters.base import Drafter
from llamaspec.speculative.drafters.grammar_jump import GrammarJumpDrafter

pytestmark = pytest.mark.real

KEYS = r'root ::= "{\"name\": \"" [a-z]+ "\", \"ok\": " ("true" | "false") "}"'
ENUM = 'root ::= "alpha" | "beta" | "gamma"'
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "tier": {"enum": ["alpha", "beta", "gamma"]}},
          "required": ["name", "age", "tier"]}


@pytest.fixture(scope="module")
def model(smollm2_q4):
    from llamaspec.runtime.llama import Model

    m = Model(smollm2_q4)
    yield m
    m.close()


def _toks(model, text: str) -> list[int]:
    return model.tokenize(text, add_special=False, parse_special=False)


def _drafter(model, gbnf, written: str, **kw) -> tuple[GrammarJumpDrafter, GrammarState, list[int]]:
    """A drafter bound to a fresh state of `gbnf` (GBNF text or a GrammarSpec) that has accepted
    the tokens of `written` (as the engine's state has after those tokens were emitted)."""
    state = GrammarState(model, gbnf if isinstance(gbnf, GrammarSpec) else GrammarSpec(gbnf))
    toks = _toks(model, written)
    assert state.accept_all(toks) == len(toks), written
    d = GrammarJumpDrafter(model, **kw)
    d.bind_grammars({0: state})
    d.begin(0, [1, 2, 3])
    d.accepted(0, 0, toks, is_other=True)
    return d, state, toks


def _draft_text(model, gbnf: str, written: str, n_max: int = 16, **kw) -> tuple[str, list[int]]:
    d, _, toks = _drafter(model, gbnf, written, **kw)
    draft = d.propose(0, [1, 2, 3] + toks, n_max)
    assert not draft or draft.source == "grammar"
    return model.detokenize([t for t in draft.tokens if not model.is_eog(t)]), draft.tokens


def test_keys_and_punctuation_are_forced_free_text_is_not(model):
    text, toks = _draft_text(model, KEYS, "{")
    assert text == '"name": "'
    assert toks == _toks(model, '"name": "')   # the target's own tokenization of the forced text
    assert _draft_text(model, KEYS, "")[0] == '{"name": "'
    assert _draft_text(model, KEYS, '{"name": "bo')[1] == []    # inside [a-z]+: nothing forced


def test_literal_tail_once_its_start_is_unique_and_the_end(model):
    text, toks = _draft_text(model, KEYS, '{"name": "bob", "ok": t')
    assert text == "rue}" and model.is_eog(toks[-1])            # then only the end may follow
    assert _draft_text(model, KEYS, '{"name": "bob", "ok": ')[1] == []   # true or false: open
    _, toks = _draft_text(model, KEYS, '{"name": "bob", "ok": true}')
    assert len(toks) == 1 and model.is_eog(toks[0])


def test_enum_tail(model):
    text, toks = _draft_text(model, ENUM, "g")
    assert text == "amma" and model.is_eog(toks[-1])
    assert _draft_text(model, ENUM, "")[1] == []                # three ways to start


def test_end_allowed_beside_more_text_is_not_forced(model):
    assert _draft_text(model, 'root ::= "ab" "cd"?', "ab")[1] == []


def test_non_ascii_bytes_are_probed(model):
    # one byte token per UTF-8 byte: a forced multi-byte character is drafted, and a choice
    # between an ASCII letter and a non-ASCII one is seen as a choice
    text, _ = _draft_text(model, 'root ::= "na\u00efve"', "n")
    assert text == "a\u00efve"
    assert _draft_text(model, 'root ::= "\u00fcber" | "uber"', "")[1] == []


def test_the_live_state_is_not_advanced(model):
    d, state, toks = _drafter(model, KEYS, "{")
    quote = _toks(model, '"')[0]
    before = state.allowed_ids(list(range(2000)))
    draft = d.propose(0, toks, 16)
    assert draft.tokens
    assert state.allowed_ids(list(range(2000))) == before
    assert state.allows(quote)
    state.accept(quote)   # the live state goes on from where it was
    assert state.accept_all(_toks(model, 'name": "x", "ok": false}')) == len(_toks(model, 'name": "x", "ok": false}'))


def test_draft_room_caps_the_draft(model):
    _, toks = _draft_text(model, KEYS, "{", n_max=2)
    assert toks == _toks(model, '"name": "')[:2]


def test_optional_whitespace_follows_this_outputs_earlier_choice(model):
    gbnf = grammar_from_schema(SCHEMA)
    # after "," the schema grammar allows " " or '"': a space followed the "," before
    assert _draft_text(model, gbnf, '{"name": "Jo", "age": 30,')[0] == ' "tier": "'
    assert _draft_text(model, gbnf, '{"name":"Jo","age":30,')[0] == '"tier":"'
    # nothing to go by yet (the first key's "{"): no guess, no draft
    assert _draft_text(model, gbnf, "{")[1] == []
    assert _draft_text(model, gbnf, "{", guess_whitespace=False)[1] == []
    # a guess is only made between whitespace and one other byte
    assert _draft_text(model, gbnf, '{"name": "Jo", "age": 3')[1] == []
    text, toks = _draft_text(model, gbnf, '{"name": "Jo", "age": 30, "tier": "g')
    assert text == 'amma"}'


def test_tail_token_that_the_free_text_may_extend(model):
    # "ab" then a free [a-z]+: SmolLM2 has tokens "abc", "abs", ... so the model may well write
    # "ab" merged with the next letters; "check" leaves it out, "keep" drafts it
    grammar = 'root ::= "xy ab" [a-z]+'
    assert _draft_text(model, grammar, "x", tail="keep")[0] == "y ab"
    assert _draft_text(model, grammar, "x", tail="check")[0] == "y"
    assert _draft_text(model, grammar, "x", tail="drop")[0] == "y"
    # `{"` has no longer token: kept by "check", dropped by "drop"
    grammar = r'root ::= "{\"" [a-z]+'
    assert _draft_text(model, grammar, "", tail="check")[0] == '{"'
    assert _draft_text(model, grammar, "", tail="drop")[1] == []


def test_no_grammar_means_no_draft_and_no_call(model):
    d = GrammarJumpDrafter(model)
    d.begin(0, [1])
    asked = []

    def limit(drafter, match=None):
        asked.append(drafter.name)
        return 8

    limit.start = lambda drafter: asked.append("start:" + drafter.name)
    assert d.propose_within(0, [1, 2], limit).tokens == []
    assert asked == []   # not announced: the stats count no call for a sequence without a grammar
    d.bind_grammars({})
    assert d.propose_within(0, [1, 2], limit).tokens == []
    assert asked == []


def test_a_paused_controller_stops_the_draft(model):
    d, _, toks = _drafter(model, KEYS, "{")
    assert d.propose_within(0, toks, lambda drafter, match=None: 0).tokens == []


def test_chain_forwards_bind_grammars(model):
    from llamaspec.speculative.drafters.chain import ChainDrafter
    from llamaspec.speculative.drafters.ngram_simple import NgramSimpleDrafter

    g = GrammarJumpDrafter(model)
    chain = ChainDrafter([g, NgramSimpleDrafter()])
    grammars = {}
    chain.bind_grammars(grammars)
    assert g._grammars is grammars
    Drafter.bind_grammars(NgramSimpleDrafter(), grammars)   # the base keeps nothing, raises nothing


def test_the_factory_puts_the_grammar_drafter_in_every_drafting_chain(tiny_models):
    from llamaspec.runtime.context import Context, ContextConfig
    from llamaspec.runtime.llama import Model
    from llamaspec.speculative.drafters.chain import ChainDrafter
    from llamaspec.speculative.drafters.factory import build_drafter
    from llamaspec.speculative.options import SpecOptions, default_bench_modes
    from llamaspec.speculative.sampling_params import SamplingParams

    target = Model(tiny_models["target"])
    ctx = Context(target, ContextConfig(n_ctx=256, n_threads=1))
    greedy = SamplingParams(temperature=0.0)
    try:
        def names(types):
            built = build_drafter(SpecOptions(spec_types=types), target, ctx, greedy)
            try:
                return None if built.drafter is None else [m.name for m in built.drafter.members()]
            finally:
                built.close()

        assert names(["ngram-mod"]) == ["grammar", "grammar-copy", "ngram-mod"]
        assert names(["suffix", "prompt-lookup"]) == ["grammar", "grammar-copy", "prompt-lookup", "suffix"]
        assert names(["grammar"]) == ["grammar"]        # --spec-type grammar: alone, for testing
        assert names(["grammar-copy"]) == ["grammar-copy"]
        assert names(["grammar-copy", "grammar"]) == ["grammar", "grammar-copy"]
        assert names([]) is None and names(["none"]) is None   # plain decoding stays plain
        built = build_drafter(SpecOptions(spec_types=["ngram-mod"]), target, ctx, greedy)
        assert isinstance(built.drafter, ChainDrafter)
        built.close()
    finally:
        ctx.close()
        target.close()
    # not a type bench or tune measures alone: it drafts nothing without a grammar
    assert "grammar" not in default_bench_modes(True) and "grammar-copy" not in default_bench_modes(True)


# ---- end to end, as `run` / the Python API build it -------------------------------------------------

CONTACT = {"type": "object", "properties": {k: {"type": "string"} for k in ("name", "email", "phone", "company")},
           "required": ["name", "email", "phone", "company"], "additionalProperties": False}
ASKS = ["Extract the contact details (name, email, phone, company) as JSON.\n\nBest regards,\nMaria Lopez\n"
        "Brightwater Logistics\nmaria.lopez@brightwater.com\n+1 415 555 0142",
        "Extract the contact details (name, email, phone, company) as JSON.\n\nCheers,\nTom Becker\n"
        "Kessler Tools GmbH\nt.becker@kessler-tools.de\n+49 30 1234 5678"]


@pytest.mark.slow
def test_greedy_output_under_a_schema_equals_plain_and_the_grammar_drafters_are_credited(smollm2_f16):
    from llamaspec import Generator

    kw = dict(temperature=0, threads=1, max_tokens=96)
    with Generator(smollm2_f16, spec_type="none", **kw) as g:
        plain = [g.generate(a, json_schema=CONTACT) for a in ASKS]
    with Generator(smollm2_f16, **kw) as g:   # the default chain, as run builds it: the grammar drafters join it
        assert [m.name for m in g.pipeline.drafter.members()][:2] == ["grammar", "grammar-copy"]
        spec = [g.generate(a, json_schema=CONTACT) for a in ASKS]
        free = g.generate(ASKS[0])            # no grammar: the grammar drafter is never asked
    for p, s in zip(plain, spec):
        assert s.tokens == p.tokens, (s.text, p.text)
    credit = [s.stats["per_drafter"].get("grammar", {}) for s in spec]
    assert all(c.get("accepted", 0) > 0 for c in credit), [s.stats["per_drafter"] for s in spec]
    # forced text is near certain: the target takes nearly all of it (the misses: a tail token the
    # model merged with the free text after it)
    assert sum(c["accepted"] for c in credit) >= 0.8 * sum(c["drafted"] for c in credit), credit
    assert "grammar" not in free.stats["per_drafter"] and "grammar-copy" not in free.stats["per_drafter"]
    # grammar-copy copies the values from the prompt (drafters/grammar_copy.py, test_grammar_copy.py)
    copied = [s.stats["per_drafter"].get("grammar-copy", {}) for s in spec]
    assert all(c.get("accepted", 0) >= 4 for c in copied), [s.stats["per_drafter"] for s in spec]
    # fewer target steps than plain decoding's one per token
    assert all(s.stats["steps"] < 0.7 * len(s.tokens) for s in spec), [s.stats["steps"] for s in spec]
    with Generator(smollm2_f16, spec_type="grammar", **kw) as g:   # alone, for testing
        alone = g.generate(ASKS[0], json_schema=CONTACT)
    assert alone.tokens == plain[0].tokens and alone.stats["per_drafter"]["grammar"]["accepted"] > 0


@pytest.mark.slow
def test_the_opening_forced_text_is_verified_in_the_prompts_batch(smollm2_f16):
    # `{"name": "` before the model chose anything: drafted with the prompt, so the first tokens
    # come out of the prompt's own batch, and the output is still plain decoding's
    from llamaspec import Generator
    from llamaspec.speculative.sequence import SequenceRun

    kw = dict(temperature=0, threads=1, max_tokens=48)
    with Generator(smollm2_f16, spec_type="none", **kw) as g:
        plain = g.generate(ASKS[1], json_schema=CONTACT)
    with Generator(smollm2_f16, spec_type="grammar", **kw) as g:
        g.generate(ASKS[0], json_schema=CONTACT)   # the layout after `{` is learnt from an output
        engine, target = g.pipeline.engine, g.pipeline.target
        from llamaspec.bench.prompts import format_prompt
        from llamaspec.runtime.grammar import grammar_from_schema

        _, prompt, _ = format_prompt(target, ASKS[1])
        seq = SequenceRun(engine, 0, prompt, g.pipeline.config(max_tokens=48, grammar=grammar_from_schema(CONTACT)), None)
        seq.start()
        opened = list(seq.out.tokens)
        while not seq.done:
            engine.step([seq])
        out = seq.finish()
    assert len(opened) > 2 and out.tokens == plain.tokens, (target.detokenize(opened), out.text, plain.text)
    opened_text = target.detokenize(opened)   # `{"name": "`, laid out as the model does (on lines here)
    assert opened_text.startswith("{") and '"name": "' in opened_text, opened_text


def test_forced_text_is_priced_as_near_certain_on_a_steep_curve(model):
    """SmolLM2 on 1 core: t(2) = 2.4 t(1). A draft of unknown acceptance (the 0.6 prior) is not worth
    a step there, but forced text is near certain: a stretch of several forced tokens is drafted
    whole, a single forced token (2 tokens for 2.4 steps) is not."""
    from llamaspec.speculative.controller import DraftLengthController
    from llamaspec.speculative.costs import CostModel
    from llamaspec.speculative.match_controller import MatchController, RiskBudget

    steep = ((2, 2.4), (4, 2.9), (8, 3.6), (16, 5.0))
    assert GrammarJumpDrafter.sizes_by_match and not GrammarJumpDrafter.bounded_risk

    def ctl():   # as the engine builds it for this drafter (controllers_for): no loss budget
        return MatchController(lambda c, a: DraftLengthController(n_min=1, n_max=16, cost=c, prior_alpha=a),
                               CostModel(prior=steep), risk=RiskBudget.unbounded())

    assert ctl().fallback.choose() == 0                       # what an acceptance prior drafts here
    c = ctl()
    d, _, toks = _drafter(model, KEYS, "{")
    draft = d.propose_within(0, [1, 2, 3] + toks, lambda dr, match=None: c.choose(match))
    assert model.detokenize(draft.tokens) == '"name": "' and len(draft.tokens) >= 3
    from llamaspec.speculative.drafters.grammar_jump import FORCED_P
    from llamaspec.speculative.match_controller import CopyEvidence

    assert ctl().choose(CopyEvidence(1, [FORCED_P])) == 0      # one forced token: 2 tokens for 2.4 steps
