"""`suffix` (suffix decoding across requests): the index and the draft functions on token lists
against hand-worked examples, the drafter's life cycle (requests feed the global index at end),
and lossless generation on real tiny models, where a repeated request drafts from the first."""

from __future__ import annotations

import doctest

import pytest

from llamaspec.speculative.drafters import suffix_tree
from llamaspec.speculative.drafters.factory import build_drafter
from llamaspec.speculative.drafters.suffix import SuffixDrafter
from llamaspec.speculative.drafters.suffix_tree import SEP, SuffixIndex, follow, speculate
from llamaspec.speculative.options import SpecOptions, parse_spec_types


def test_docstring_examples():
    result = doctest.testmod(suffix_tree)
    assert result.failed == 0 and result.attempted > 0


def test_insert_indexes_every_ngram_and_separates_texts():
    ix = SuffixIndex(n=2)
    ix.add([5, 6, 7])
    ix.add([6, 7, 8])
    assert ix.toks == [5, 6, 7, SEP, 6, 7, 8, SEP]
    assert ix.ends[(6, 7)] == [2, 5] and ix.ends[(5, 6)] == [1] and ix.ends[(7, 8)] == [6]
    # a match never runs back across a text boundary: "7 6 7" is not in the index
    assert ix.matches([7, 6, 7], n_max=8) == [(5, 2), (2, 2)]
    assert ix.matches([5, 6, 7], n_max=8) == [(5, 2), (2, 3)]
    # nothing follows a text's end: the separator stops the path
    assert follow(ix, [6], 4, 0.0).tokens == []


def test_extend_grows_the_open_text_and_before_excludes_the_context_itself():
    ix = SuffixIndex(n=2)
    ix.extend([1, 2, 3])
    ix.extend([1, 2])
    assert ix.toks == [1, 2, 3, 1, 2] and ix.ends[(1, 2)] == [1, 4]
    d = speculate(ix, [1, 2, 3, 1, 2], 4, factor=2.0, before=ix.end - 1)   # the last "1 2" is the context
    assert (d.tokens, d.match) == ([3, 1, 2], 2)


def test_eviction_keeps_memory_bounded_and_forgets_the_oldest():
    ix = SuffixIndex(n=2, max_tokens=50)
    for i in range(200):
        ix.add([1000 + i, 1, 2, 3, 2000 + i, 4, 5])   # 8 stored tokens with the separator
        assert len(ix.toks) <= 50
    # only the latest texts are left, in the index as in memory
    assert len(ix.toks) == 48 and ix.live_tokens() == 42 and len(ix.texts) == 6
    assert all(p >= ix.base for lst in ix.ends.values() for p in lst)
    assert (1000, 1) not in ix.ends and (1199, 1) in ix.ends
    assert sum(len(v) for v in ix.ends.values()) == 6 * 6
    # a text longer than the whole budget is not kept at all
    ix.add(list(range(60)))
    assert len(ix.toks) <= 50 and (0, 1) not in ix.ends


def test_a_text_that_repeats_an_earlier_one_replaces_it():
    """A chat's next turn holds the previous turn: it is stored once, not counted twice."""
    ix = SuffixIndex(n=2)
    ix.add([1, 2, 3])
    ix.add([9, 9])
    ix.add([1, 2, 3, 4, 5])
    assert ix.toks == [9, 9, SEP, 1, 2, 3, 4, 5, SEP] and ix.live_tokens() == 7   # dropped from the front
    assert ix.ends[(1, 2)] == [len([1, 2, 3, SEP, 9, 9, SEP]) + 1]
    ix.add([9, 9])   # the same text again is counted again (two requests that went the same way)
    assert len(ix.ends[(9, 9)]) == 2


def test_frequency_picks_the_most_common_continuation_not_the_latest():
    # "3 4" went on with 9 twice and 7 once, and 7 is the latest: prompt-lookup would copy 7
    ix = SuffixIndex(n=2)
    for text in ([3, 4, 9, 9], [3, 4, 9, 9], [3, 4, 7, 7]):
        ix.add(text)
    d = speculate(ix, [0, 3, 4], 8)
    assert d.tokens == [9, 9] and d.probs == pytest.approx([2 / 3, 2 / 3]) and d.match == 2
    # a longer match that is rarer but certain wins when it earns more expected tokens
    ix.add([5, 3, 4, 7, 7])
    d = speculate(ix, [5, 3, 4], 8)
    assert (d.tokens, d.match) == ([7, 7], 3)
    # min_prob: no draft where no continuation is likely enough
    ix2 = SuffixIndex(n=2)
    for tail in range(11):
        ix2.add([3, 4, 100 + tail])
    assert speculate(ix2, [3, 4], 8).tokens == []                    # 1/11 each, below 0.1
    assert speculate(ix2, [3, 4], 8, min_prob=0.05).tokens == [110]  # ties: the latest


def test_draft_size_follows_the_match_length():
    ix = SuffixIndex(n=2)
    ix.add(list(range(1, 41)))
    ctx2, ctx6 = [99, 5, 6], [99, 1, 2, 3, 4, 5, 6]
    assert speculate(ix, ctx2, 32).match == 2 and len(speculate(ix, ctx2, 32).tokens) == 2
    assert speculate(ix, ctx6, 32).match == 6 and len(speculate(ix, ctx6, 32).tokens) == 6
    assert len(speculate(ix, ctx6, 32, factor=2.0, offset=3).tokens) == 15
    assert len(speculate(ix, ctx6, 4, factor=2.0).tokens) == 4          # the caller's cap wins
    assert speculate(ix, ctx6, 32, n_max=4).match == 4                   # matches counted up to n_max


def _run(d: SuffixDrafter, seq: int, prompt: list[int], output: list[int], k: int = 8) -> list[list[int]]:
    """Drive d through one request whose output is `output`; returns each step's draft."""
    d.begin(seq, prompt)
    h, drafts = list(prompt), []
    for tok in output:
        drafts.append(d.propose_within(seq, h, lambda dr, match=None: k).tokens)
        d.accepted(seq, 0, [tok])
        h.append(tok)
    d.end(seq)
    return drafts


def test_finished_requests_feed_the_global_index():
    d = SuffixDrafter()
    answer = [50, 51, 52, 53, 54, 55, 56, 57]
    first = _run(d, 0, [1, 2, 3], [4] + answer)
    assert not any(first)                      # nothing to copy from in the first request
    assert d.tree.live_tokens() == 3 + 9       # its prompt and output were stored at end()
    # the second request (another prompt, another sequence id) drafts the first one's answer
    second = _run(d, 1, [7, 2, 3], [4] + answer)
    assert second[1][:2] == [50, 51] and any(len(x) >= 4 for x in second)
    assert not d._seqs                         # per-request state is dropped at end()


def test_the_drafter_asks_the_limit_with_its_match():
    d = SuffixDrafter()
    d.tree.add([1, 2, 3, 4, 5, 6, 7, 8, 9])
    d.begin(0, [0, 3, 4, 5])
    asked = []
    draft = d.propose_within(0, [0, 3, 4, 5], lambda dr, match=None: asked.append(match) or 2)
    assert asked == [3] and draft.tokens == [6, 7] and draft.match == 3 and draft.source == "suffix"
    assert not d.propose_within(0, [0, 3, 4, 5], lambda dr, match=None: 0)   # the controller said no


def test_the_draft_runs_the_whole_frequent_path_and_its_evidence_prices_a_divergence():
    # Two earlier texts agree on 4 5 6 after "2 3", then split 7 / 8: the draft is the whole
    # path (not factor * L = 2 tokens) and p at the split is halved (one occurrence of two goes on)
    d = SuffixDrafter()
    d.tree.add([1, 2, 3, 4, 5, 6, 7, 20])
    d.tree.add([9, 2, 3, 4, 5, 6, 8, 21])
    d.begin(0, [0, 2, 3])
    seen = []
    draft = d.propose_within(0, [0, 2, 3], lambda dr, match=None: seen.append(match) or 32)
    ev = seen[0]
    assert int(ev) == 2 and draft.tokens == [4, 5, 6, 8, 21]    # the tie: the latest text
    by_agreement = d._seqs[0].learner.probs(2, draft.tokens)   # what this text taught, no shares
    assert list(ev.probs[:3]) == by_agreement[:3] and ev.probs[3] == pytest.approx(by_agreement[3] / 2)


def test_a_contested_match_is_sized_as_the_shortest():
    # "1 2 3" matches 3 tokens before 4, "2 3" 2 tokens before 9: a rival one token shorter with
    # another next token makes the 3-token match no better than a guess between two places
    d = SuffixDrafter()
    d.tree.add([1, 2, 3, 4, 4, 4, 7, 2, 3, 9])
    d.begin(0, [5, 1, 2, 3])
    seen = []
    d.propose_within(0, [5, 1, 2, 3], lambda dr, match=None: seen.append(match) or 0)
    assert seen == [2]


def test_spec_type_parses_and_chains():
    assert parse_spec_types("suffix,prompt-lookup") == ["prompt-lookup", "suffix"]
    assert parse_spec_types("suffix,draft") == ["suffix", "draft-simple"]


def _gen(model, spec, prompts, n=40):
    from llamaspec import Generator

    # fixed draft lengths: what is drafted must not depend on measured time
    with Generator(model, spec_type=spec, temperature=0, threads=1, max_tokens=n, chat=False,
                   tuned=False, ctx_size=512, adaptive=False) as g:
        return list(g.generate(p) for p in prompts)


def test_suffix_is_lossless_and_a_repeated_request_drafts_from_the_first(tiny_models):
    """Greedy tokens equal plain decoding for every request; the second identical request is
    drafted from the first one's output (stored at end), so nearly all of it is accepted — more
    than the first request could, and more than prompt-lookup gets for it."""
    prompt = "one two three four five six seven eight nine ten"
    prompts = [prompt, prompt]
    plain = _gen(tiny_models["target"], "none", prompts)
    suffix = _gen(tiny_models["target"], "suffix", prompts)
    lookup = _gen(tiny_models["target"], "prompt-lookup", prompts)
    assert [r.tokens for r in suffix] == [r.tokens for r in plain] == [r.tokens for r in lookup]
    n = len(suffix[1].tokens)
    assert suffix[1].stats["accepted"] >= n - 4
    assert suffix[1].stats["accepted"] > suffix[0].stats["accepted"]
    assert suffix[1].stats["accepted"] > lookup[1].stats["accepted"]


@pytest.mark.parametrize("spec", ["suffix,prompt-lookup", "suffix,draft"])
def test_chains_are_lossless(tiny_models, spec):
    from llamaspec import Generator

    prompts = ["a b c d e f a b c", "a b c d e f a b c"]
    plain = _gen(tiny_models["target"], "none", prompts, n=24)
    with Generator(tiny_models["target"], spec_type=spec, draft=tiny_models["draft"] if "draft" in spec else None,
                   temperature=0, threads=1, max_tokens=24, chat=False, tuned=False, ctx_size=512) as g:
        got = [g.generate(p) for p in prompts]
        assert "suffix" in g.spec_label
    assert [r.tokens for r in got] == [r.tokens for r in plain]


def test_factory_builds_the_suffix_drafter(tiny_models):
    from llamaspec.runtime.context import Context, ContextConfig
    from llamaspec.runtime.llama import Model
    from llamaspec.speculative.sampling_params import SamplingParams

    target = Model(tiny_models["target"])
    ctx = Context(target, ContextConfig(n_ctx=256, n_threads=1))
    try:
        built = build_drafter(SpecOptions(spec_types=["suffix"]), target, ctx, SamplingParams(temperature=0.0))
        # (behind the grammar drafter, which joins every drafting type: options.chain_joiners)
        assert isinstance(built.drafter.members()[-1], SuffixDrafter) and built.draft_model is None
    finally:
        ctx.close()
        target.close()


def test_the_default_chains_suffix_behind_prompt_lookup(run_cli, tiny_models, isolated_home):
    """No --draft, no --spec-type, no draft on disk: prompt-lookup, then suffix for what earlier
    requests (of a batch job, a server, a chat) can draft."""
    import json

    r = run_cli("run", str(tiny_models["target"]), "-p", "hi", "-n", "4", "--temp", "0", "-t", "1", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["spec_type"] == "prompt-lookup,suffix"
