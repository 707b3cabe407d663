"""Tests of ChainDrafter (first non-empty draft wins, per-member limits, feedback) and the priority order."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

from llamaspec.errors import UsageError
from llamaspec.speculative import options
from llamaspec.speculative.drafters import ChainDrafter, Draft, Drafter, NgramModDrafter, NgramSimpleDrafter
from llamaspec.speculative.options import PRIORITY, SPEC_TYPES, canonical_name, order_by_priority, parse_spec_types


class Fake(Drafter):
    def __init__(self, name, tokens, probs=None):
        self.name = name
        self.tokens = tokens
        self.probs = probs
        self.log = []

    def begin(self, seq_id, prompt_tokens, rng=None):
        self.log.append(("begin", seq_id, list(prompt_tokens)))

    def propose(self, seq_id, history, n_max):
        self.log.append(("propose", seq_id, n_max))
        return Draft(list(self.tokens), self.probs)

    def accepted(self, seq_id, n_accepted, new_tokens, is_other=False):
        self.log.append(("accepted", seq_id, n_accepted, list(new_tokens), is_other))

    def end(self, seq_id):
        self.log.append(("end", seq_id))

    def close(self):
        self.log.append(("close",))


def test_docstring_examples():
    result = doctest.testmod(options)
    assert result.failed == 0 and result.attempted > 0


def test_priority_is_llama_cpp_order():
    native = tuple(n for n in PRIORITY if SPEC_TYPES[n].in_llama_cpp)
    assert native[:5] == ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
    assert native[5:] == ("draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark")
    # llamaspec's own type drafts from the text like the n-gram types: after them, before the models
    assert PRIORITY.index("prompt-lookup") == 7
    # the grammar drafters first: where a grammar forces text it is near certain, then the prompt's
    # text copied into its free text; elsewhere both are silent
    assert PRIORITY[:2] == ("grammar", "grammar-copy")
    assert not SPEC_TYPES["grammar"].in_llama_cpp and not SPEC_TYPES["grammar-copy"].in_llama_cpp
    assert list(SPEC_TYPES) == ["none", *PRIORITY]  # the table is written in that order
    # every implemented type that drafts has a builder in the factory, and nothing else does
    from llamaspec.speculative.drafters.factory import _BUILDERS
    assert set(_BUILDERS) == {t.name for t in SPEC_TYPES.values() if t.implemented and t.name != "none"}


def test_order_by_priority_and_aliases():
    assert order_by_priority(["draft-mtp", "ngram-mod"]) == ["ngram-mod", "draft-mtp"]
    assert order_by_priority(["draft", "mtp", "ngram-simple"]) == ["ngram-simple", "draft-simple", "draft-mtp"]
    assert order_by_priority(["none"]) == []
    assert canonical_name("Draft") == "draft-simple"
    with pytest.raises(ValueError, match="unknown speculative type 'ngram'"):
        canonical_name("ngram")
    # usage errors: an unknown type lists the known ones; a known one llamaspec lacks says so
    with pytest.raises(UsageError, match="unknown speculative type 'nope'; known: none, grammar, grammar-copy, ngram-simple"):
        parse_spec_types("ngram-mod,nope")
    # every type of llama.cpp's --spec-type list (common/speculative.cpp) is accepted
    llama_cpp_list = ("none draft-simple draft-eagle3 draft-dflash draft-dspark draft-mtp ngram-cache "
                      "ngram-simple ngram-map-k ngram-map-k4v ngram-mod").split()
    for name in llama_cpp_list:
        assert parse_spec_types(name) == ([] if name == "none" else [name])
    assert {t.name for t in SPEC_TYPES.values() if t.in_llama_cpp} == set(llama_cpp_list)


def test_first_non_empty_draft_wins_and_names_its_source():
    a, b, c = Fake("a", []), Fake("b", [5, 6, 7]), Fake("c", [9])
    ch = ChainDrafter([a, b, c])
    d = ch.propose(0, [1, 2, 3], 8)
    assert d.tokens == [5, 6, 7] and d.source == "b"
    assert [x[0] for x in a.log] == ["propose"] and [x[0] for x in b.log] == ["propose"]
    assert c.log == []  # never asked


def test_draft_is_cut_to_n_max_with_its_probs():
    probs = [np.full(4, 0.25)] * 5
    ch = ChainDrafter([Fake("a", [1, 2, 3, 4, 5], probs)])
    d = ch.propose(0, [0], 2)
    assert d.tokens == [1, 2] and len(d.probs) == 2
    assert ch.propose(0, [0], 0).tokens == []


def test_feedback_goes_to_all_with_is_other():
    a, b, c = Fake("a", []), Fake("b", [5, 6, 7]), Fake("c", [9])
    ch = ChainDrafter([a, b, c])
    ch.propose(3, [1], 8)
    ch.accepted(3, 2, [5, 6, 0])
    assert a.log[-1] == ("accepted", 3, 2, [5, 6, 0], True)
    assert b.log[-1] == ("accepted", 3, 2, [5, 6, 0], False)
    assert c.log[-1] == ("accepted", 3, 2, [5, 6, 0], True)
    # a step without a draft: everybody hears about it as "other"
    ch2 = ChainDrafter([Fake("x", []), Fake("y", [])])
    assert not ch2.propose(0, [1], 4)
    ch2.accepted(0, 0, [4])
    assert all(d.log[-1] == ("accepted", 0, 0, [4], True) for d in ch2.drafters)


def test_winner_is_per_sequence_and_consumed():
    a = Fake("a", [1])
    ch = ChainDrafter([a])
    ch.propose(0, [0], 4)
    ch.propose(1, [0], 4)
    ch.accepted(1, 1, [1, 2])
    ch.accepted(0, 0, [3])
    ch.accepted(0, 0, [3])  # no pending draft any more: is_other
    assert [x[-1] for x in a.log if x[0] == "accepted"] == [False, False, True]


def test_lifecycle_is_forwarded():
    a, b = Fake("a", []), Fake("b", [])
    ch = ChainDrafter([a, b])
    ch.begin(2, [1, 2])
    ch.end(2)
    ch.close()
    for d in (a, b):
        assert d.log == [("begin", 2, [1, 2]), ("end", 2), ("close",)]


def test_chain_rejects_duplicates_and_empty():
    with pytest.raises(ValueError):
        ChainDrafter([])
    with pytest.raises(ValueError):
        ChainDrafter([Fake("a", []), Fake("a", [])])


def test_chain_of_real_ngram_drafters():
    # ngram-simple needs > size_n + size_m + 1 tokens; ngram-mod drafts from its pool
    simple = NgramSimpleDrafter(size_n=2, size_m=3)
    mod = NgramModDrafter(n_match=2, n_min=0, n_max=8, pool_size=1 << 12, index_chunk=0)
    ch = ChainDrafter([simple, mod])
    prompt = [1, 2, 3, 4, 5]
    ch.begin(0, prompt)
    d = ch.propose(0, prompt + [1, 2], 8)   # too short for ngram-simple -> ngram-mod
    assert d.source == "ngram-mod" and d.tokens == [3, 4, 5, 1]
    ch.accepted(0, 3, [3, 4, 5, 9])  # the target accepted 3, then said 9
    h = prompt + [1, 2, 3, 4, 5, 9, 1, 2]
    d = ch.propose(0, h, 8)
    assert d.source == "ngram-simple" and d.tokens == [3, 4, 5]


def test_members_get_their_own_limits():
    a, b = Fake("a", [1, 2, 3]), Fake("b", [4, 5, 6, 7])
    ch = ChainDrafter([a, b])
    assert ch.members() == [a, b]
    d = ch.propose_within(0, [0], lambda m: 0 if m is a else 2)  # a paused: b drafts, cut to 2
    assert d.tokens == [4, 5] and d.source == "b" and a.log == []


def test_a_refused_chain_frees_every_model_it_loaded(tiny_models, monkeypatch):
    """`draft-simple,draft-eagle3` with a plain draft file: draft-simple loads the draft, then
    EAGLE-3 refuses the file. The target and that draft are freed at once (a script that tries
    configurations in a loop kept every one in memory until the garbage collector ran), and a
    working chain's pipeline closes all of its drafters' models."""
    from llamaspec.api.generator import Generator
    from llamaspec.runtime import llama

    loaded = []
    real_init = llama.Model.__init__

    def recording(self, *a, **kw):
        real_init(self, *a, **kw)
        loaded.append(self)

    monkeypatch.setattr(llama.Model, "__init__", recording)
    with pytest.raises(UsageError, match="EAGLE-3") as refused:
        Generator(tiny_models["target"], draft=tiny_models["draft"], spec_type="draft-simple,draft-eagle3",
                  threads=1, tuned=False)
    assert len(loaded) == 3 and all(m.ptr is None for m in loaded), refused   # target, draft, EAGLE-3 try

    loaded.clear()
    g = Generator(tiny_models["target"], draft=tiny_models["draft"], spec_type="draft-simple,ngram-simple",
                  threads=1, tuned=False, temperature=0, max_tokens=4)
    g.generate("hello")
    g.close()
    assert len(loaded) == 2 and all(m.ptr is None for m in loaded)
