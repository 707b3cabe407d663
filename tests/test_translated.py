"""Translated drafting: a draft model of another vocabulary drafts through text.

The text <-> token rules as pure functions (translated_text.py), then the drafter on real models
(greedy output identical to plain decoding, T > 0 verified by sample-and-match), then how `check`
and `pair` name such pairs.
"""

from __future__ import annotations

import os

import pytest

from llamaspec.speculative.drafters.translated_text import (
    Encoder, align_ends, complete_utf8_len, draft_to_target, replace_with_offsets, restart_index, reverse_pairs,
    source_offset, tokenize_tail)

# ---- a toy tokenizer: greedy longest match over a small vocabulary --------------------------------

VOCAB = {"he": 1, "llo": 2, " wor": 3, "ld": 4, " world": 5, "h": 6, "e": 7, "l": 8, "o": 9, " ": 10,
         "w": 11, "r": 12, "d": 13, "<eot>": 14, "hello": 15, "!": 16}
PIECES = {v: k.encode() for k, v in VOCAB.items()}


def toy_tokenize(text: str) -> list[int]:
    out = []
    while text:
        w = max((w for w in VOCAB if text.startswith(w)), key=len)
        out.append(VOCAB[w])
        text = text[len(w):]
    return out


def toy_piece(t: int) -> bytes:
    return PIECES[t]


TOY = Encoder(toy_tokenize, toy_piece, b"")


def test_replace_maps_offsets_outside_replacements_only():
    out, anchors = replace_with_offsets("<s>hi<e>!", [("<s>", "[["), ("<e>", "")])
    assert out == "[[hi!"
    assert source_offset(anchors, 2) == 3          # after "[[" -> after "<s>"
    assert source_offset(anchors, 4) == 8          # after "hi": the empty replacement of "<e>" ends at 8
    assert source_offset(anchors, 1) is None       # inside "[["
    assert replace_with_offsets("abc", [])[0] == "abc"
    # one pass: a replacement is never replaced again; the longest key wins at one place
    assert replace_with_offsets("ab", [("a", "b"), ("b", "c")])[0] == "bc"
    assert replace_with_offsets("<t>", [("<", "x"), ("<t>", "T")])[0] == "T"
    assert reverse_pairs([("A", "B"), ("C", "")]) == [("B", "A")]


def test_complete_utf8_len_holds_back_a_cut_character():
    e = "é€😀".encode()
    assert [complete_utf8_len(e[:n]) for n in range(len(e) + 1)] == [0, 0, 2, 2, 2, 5, 5, 5, 5, 9]


def test_tokenize_tail_retokenizes_only_the_tail():
    # "hello world" made of ["he", "llo", " wor"] + "ld" appended: " wor" + "ld" merge into " world"
    k, new, ends = tokenize_tail("hello world", [2, 5, 9], keep_tail=1, floor=0,
                                 encode=TOY)
    assert (k, new, ends) == (2, [5], [11])
    # the floor is kept (a BOS, or tokens spliced out of the KV)
    k, new, ends = tokenize_tail("hello world", [0, 2, 5, 9], keep_tail=8, floor=1,
                                 encode=TOY)
    assert k == 1 and new == [15, 5] and ends == [5, 11]
    # tokens whose end is unclear (inside a replacement) are never a restart point
    k, _, _ = tokenize_tail("hello world", [2, None, 9], keep_tail=1, floor=0, encode=TOY)
    assert k == 1


def test_tokenize_tail_applies_replacements_and_maps_ends_back():
    # the draft sees "he world"; its tokens' ends are offsets in the target's text "he<T>ld"
    assert tokenize_tail("he<T>ld", [], keep_tail=4, floor=0, encode=TOY,
                         pairs=[("<T>", " wor")]) == (0, [1, 5], [2, 7])
    # a token ending inside a replacement has no clean end
    assert tokenize_tail("he<T>", [], keep_tail=4, floor=0, encode=TOY,
                         pairs=[("<T>", " wld")]) == (0, [1, 10, 11, 4], [2, None, None, 5])


def test_draft_to_target_keeps_tokens_inside_the_drafted_text():
    # context "hello" as the target wrote it: he|llo; draft " world wor" -> " world" (then " wor" dropped:
    # it may grow into " world")
    assert draft_to_target(b"hello", [1, 2], " world wor", TOY) == [5]
    # a drafted end of turn is stable: kept
    assert draft_to_target(b"hello", [1, 2], " world<eot>", TOY,
                           is_stable=lambda t: t == 14) == [5, 14]
    # the drafted text merges into the context's last token ("he" + "llo" -> "hello" when the target
    # wrote h|e): the drafted text alone is tokenized, starting where the target's text ends
    assert draft_to_target(b"he", [6, 7], "llo!", TOY) == [2]
    assert draft_to_target(b"hello", [1, 2], "", TOY) == []


def test_translated_text_doctests():
    import doctest

    from llamaspec.speculative.drafters import translated_text

    result = doctest.testmod(translated_text)
    assert result.attempted >= 8 and result.failed == 0, result


# ---- a toy SentencePiece tokenizer that adds a leading space, as llama.cpp's does -------------------
# "▁" before the text and after each special token, spaces as "▁", longest match, bytes as fallback

SP = {"<s>": 1, "▁hello": 2, "▁world": 3, "▁": 4, "he": 5, "llo": 6, "h": 7, "e": 8, "l": 9, "o": 10,
      "▁wor": 11, "ld": 12, "\n": 13, "!": 14}
SP_PIECES = {**{v: k.replace("▁", " ").encode() for k, v in SP.items()}, **{100 + b: bytes([b]) for b in range(256)}}


def sp_tokenize(text: str) -> list[int]:
    out: list[int] = []
    for i, frag in enumerate(text.split("<s>")):
        if i:
            out.append(SP["<s>"])
        s = "▁" + frag.replace(" ", "▁")
        while s:
            w = max((w for w in SP if s.startswith(w)), key=len, default=None)
            if w is None:   # byte fallback
                out += [100 + b for b in s[0].encode()]
                s = s[1:]
            else:
                out.append(SP[w])
                s = s[len(w):]
    return out


SPE = Encoder(sp_tokenize, SP_PIECES.__getitem__)


def test_encoder_drops_the_added_space_of_a_window():
    assert SPE.prefix == b" " and TOY.prefix == b""
    assert sp_tokenize("llo world") == [4, 6, 3]                       # the stray "▁" the bug drafted
    assert SPE("llo world") == ([6, 3], [3, 9])                        # after the sentinel: none
    assert SPE("hello world", at_start=True) == ([2, 3], [5, 11])      # a prompt keeps its space
    # after a special token the tokenizer adds a space again: the end before it is no restart point
    assert SPE("he<s>llo") == ([5, 1, 4, 6], [2, None, 5, 8])
    assert align_ends(b"ab", [b"a", b"c"], b" ") is None               # not the text: nothing is sure


def test_draft_to_target_for_a_target_that_adds_a_space():
    # the target wrote "hello" (one token); the draft wrote " world!": " world" is kept, "!" may grow
    assert draft_to_target(b" hello", [2], " world!", SPE) == [3]
    assert draft_to_target(b"he", [5], "llo world", SPE) == [6]         # no stray "▁" before "llo"


def test_windows_start_at_character_boundaries():
    # "é" is two byte tokens: the end between them is no place to start a window
    k, new, ends = tokenize_tail("hé", [], keep_tail=4, floor=0, encode=SPE)
    assert new == [4, 7, 100 + 0xC3, 100 + 0xA9] and ends == [0, 1, None, 2]
    assert restart_index([0, 1, None, 2, 3], keep_tail=2, floor=0) == 2   # back past the cut character


# ---- the drafter on real models --------------------------------------------------------------------


def _run(target, draft, **kw):
    """One generation; returns the result, the resolution notes and the translated drafter (or None)."""
    from llamaspec import Generator
    from llamaspec.speculative.drafters.translated import TranslatedDrafter

    with Generator(str(target), draft=None if draft is None else str(draft),
                   spec_type="none" if draft is None else None, threads=1, ctx_size=512, **kw) as g:
        drafter = g.pipeline.drafter.members()[-1] if g.pipeline.drafter else None   # (the grammar drafter first)
        return g.generate(PROMPT), g.notes, drafter if isinstance(drafter, TranslatedDrafter) else None


PROMPT = "The three primary colors are red, yellow and blue. The three primary colors are"


@pytest.mark.real
@pytest.mark.slow
def test_gemma_target_with_smollm2_draft_greedy_is_plain(gemma_f16, smollm2_q4):
    plain, _, _ = _run(gemma_f16, None, temperature=0, max_tokens=32)
    spec, notes, drafter = _run(gemma_f16, smollm2_q4, temperature=0, max_tokens=32, adaptive=False, draft_max=4)
    assert drafter is not None
    assert spec.tokens == plain.tokens
    assert any("another vocabulary" in n and "translated" in n for n in notes), notes
    assert spec.stats["drafted"] > 0 and spec.stats["accepted"] > 0, spec.stats


@pytest.mark.real
@pytest.mark.slow
def test_smollm2_target_with_gemma_draft_greedy_is_plain(smollm2_f16, gemma_q4):
    tags = [("<|im_start|>", "<start_of_turn>"), ("<|im_end|>", "<end_of_turn>")]
    plain, _, _ = _run(smollm2_f16, None, temperature=0, max_tokens=32)
    spec, _, drafter = _run(smollm2_f16, gemma_q4, temperature=0, max_tokens=32, adaptive=False, draft_max=4,
                            spec_replace=tags)
    assert drafter is not None and drafter.pairs == tags
    assert spec.tokens == plain.tokens
    assert spec.stats["drafted"] > 0, spec.stats


@pytest.mark.real
@pytest.mark.slow
def test_translated_at_temperature_runs_with_sample_and_match(gemma_f16, smollm2_q4):
    res, _, drafter = _run(gemma_f16, smollm2_q4, temperature=0.8, seed=3, max_tokens=24, adaptive=False,
                           draft_max=4)
    # no probabilities: the engine verifies by sample-and-match (engine.py: rejection needs draft.probs)
    assert drafter is not None and not drafter.samples
    assert len(res.tokens) == 24 and res.stats["drafted"] > 0


@pytest.mark.real
def test_same_vocabulary_on_loaded_models(smollm2_q4, smollm2_f16, gemma_q4):
    from llamaspec.runtime.llama import Model
    from llamaspec.speculative.drafters.translated import same_vocabulary

    a, b, c = Model(smollm2_f16), Model(smollm2_q4), Model(gemma_q4)
    try:
        assert same_vocabulary(a, b) and not same_vocabulary(a, c) and not same_vocabulary(c, b)
    finally:
        for m in (a, b, c):
            m.close()


# ---- check and pair --------------------------------------------------------------------------------


@pytest.mark.real
def test_check_calls_gemma_and_smollm2_translated(run_cli, gemma_f16, smollm2_q4, gemma_q4, smollm2_f16):
    for target, draft in ((gemma_f16, smollm2_q4), (smollm2_f16, gemma_q4)):
        r = run_cli("check", target, draft, "--json")
        assert r.exit_code == 0, r.stderr
        d = r.json()
        assert (d["kind"], d["compatible"], d["failed_rule"]) == ("translated", False, "vocab_type")
        q = run_cli("check", target, draft, "-q")
        assert (q.exit_code, q.stdout) == (0, "translated: vocab_type\n")
    r = run_cli("check", gemma_f16, gemma_q4, "-q")
    assert (r.exit_code, r.stdout) == (0, "token-exact\n")


@pytest.mark.real
def test_pair_lists_a_translated_draft_on_disk(run_cli, gemma_f16, smollm2_q4, tmp_path, isolated_home):
    d = tmp_path / "models"
    d.mkdir()
    os.symlink(smollm2_q4, d / "smollm2-q4.gguf")
    r = run_cli("pair", gemma_f16, "--search", d, "--no-default-dirs", "--json")
    assert r.exit_code == 0, r.stderr
    rep = r.json()
    (cand,) = [c for c in rep["on_disk"] if c["label"].endswith("smollm2-q4.gguf")]
    assert cand["kind"] == "translated" and cand["verdict"]["failed_rule"] == "vocab_type"
    assert rep["scanned"]["translated"] == 1
    # --draft auto does not take it: nothing says it pays (no registry pair, no measurement)
    assert rep["auto"]["kind"] == "prompt-lookup"
    assert any("translated draft" in n for n in rep["auto"]["considered"])
    human = run_cli("pair", gemma_f16, "--search", d, "--no-default-dirs")
    assert "translated" in human.stdout


@pytest.mark.real
@pytest.mark.slow
def test_run_cli_spec_replace_takes_two_values(run_cli, smollm2_f16, gemma_q4):
    """`--spec-replace TARGET DRAFT` as llama.cpp had it, through `run` (chat mode: the tags matter)."""
    common = ("run", smollm2_f16, "-p", "Name three colours.", "-n", "16", "--temp", "0", "-t", "1", "--json")
    plain = run_cli(*common, "--spec-type", "none")
    spec = run_cli(*common, "--draft", gemma_q4, "--fixed-draft", "--draft-max", "4",
                   "--spec-replace", "<|im_start|>", "<start_of_turn>", "--spec-replace", "<|im_end|>", "<end_of_turn>")
    assert plain.exit_code == 0 and spec.exit_code == 0, spec.stderr[-2000:]
    assert spec.json()["tokens"] == plain.json()["tokens"] and spec.json()["drafted"] > 0
    bad = run_cli(*common, "--draft", gemma_q4, "--spec-replace", "<|im_start|>")
    assert bad.exit_code == 2 and "--spec-replace takes two values" in bad.stderr
