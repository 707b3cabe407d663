"""Translated drafting with SentencePiece tokenizers that add a leading space (add_space_prefix:
Llama 2, Mistral <= v0.3, TinyLlama), on generated models (llamaspec/testing/tiny_spm.py): an
SPM model with the flag on, the same model with it off, and a BPE one, all writing the same text.

Both directions (SPM draft for a BPE target, BPE draft for an SPM target): greedy tokens equal
plain decoding, and acceptance with the space prefix is at least 0.8 of the same pair's without
it (before the fix: 0 for the SPM target). Then what the drafter costs: only a window of the text
is tokenized each step, a chat's next turn evaluates only its new text in the draft, and a
recurrent draft rolls back to a checkpoint instead of evaluating the whole text again.

    .venv/bin/python tests/test_translated_spm.py     # prints the acceptance table
"""

from __future__ import annotations

import pytest

from llamaspec.testing import real_models
from llamaspec.testing.tiny_spm import TEXT, make_translated_set

WORDS = TEXT.split()
PROMPTS = (" ".join(WORDS[:8]), " ".join(WORDS[60:70]), " ".join(WORDS[150:155]), " ".join(WORDS[228:234]))
#: (target, draft, the same pair with the space prefix off)
DIRECTIONS = (("bpe", "spm_space", ("bpe", "spm_nospace")), ("spm_space", "bpe", ("spm_nospace", "bpe")))


@pytest.fixture(scope="module")
def models():
    return make_translated_set(real_models.cache_dir() / "translated-v1")


def _gen(target, draft=None, **kw):
    from llamaspec import Generator

    return Generator(str(target), draft=None if draft is None else str(draft),
                     spec_type="none" if draft is None else "draft-simple", threads=1, ctx_size=1024,
                     temperature=0, chat=False, **kw)


def acceptance(models, target: str, draft: str, max_tokens: int = 48) -> tuple[int, int, bool]:
    """(accepted, drafted, tokens equal plain decoding) over PROMPTS, draft-simple alone, 4 a step."""
    with _gen(models[target], max_tokens=max_tokens) as g:
        plain = [g.generate(p).tokens for p in PROMPTS]
    acc = drafted = 0
    same = True
    with _gen(models[target], models[draft], max_tokens=max_tokens, adaptive=False, draft_max=4) as g:
        for p, want in zip(PROMPTS, plain):
            r = g.generate(p)
            acc, drafted = acc + r.stats["accepted"], drafted + r.stats["drafted"]
            same = same and r.tokens == want
    return acc, drafted, same


def _rate(a: int, d: int) -> float:
    return a / d if d else 0.0


@pytest.mark.parametrize("target,draft,off", DIRECTIONS)
def test_space_prefix_accepts_as_the_pair_without_it(models, target, draft, off):
    a, d, same = acceptance(models, target, draft)
    a0, d0, same0 = acceptance(models, *off)
    assert same and same0
    assert _rate(a0, d0) > 0.5, (a0, d0)          # the pair drafts well without the space prefix
    assert _rate(a, d) >= 0.8 * _rate(a0, d0), ((a, d), (a0, d0))


def test_encoder_finds_the_leading_space(models):
    """The real tokenizer: a window tokenized after a sentinel has no stray space token."""
    from llamaspec.runtime.llama import Model
    from llamaspec.speculative.drafters.translated_text import Encoder

    for name, prefix in (("spm_space", b" "), ("spm_nospace", b""), ("bpe", b"")):
        m = Model(models[name])
        try:
            tok = lambda s: m.tokenize(s, add_special=False, parse_special=True)  # noqa: E731
            enc = Encoder(tok, m.piece)
            assert enc.prefix == prefix, name
            word = WORDS[3]
            toks, ends = enc(word + " " + WORDS[4])
            assert b"".join(m.piece(t) for t in toks) == (word + " " + WORDS[4]).encode(), name
            assert ends[-1] == len(word) + 1 + len(WORDS[4]) and len(word) in ends
            start, _ = enc(word, at_start=True)   # a prompt: as the model tokenizes one
            assert start == tok(word)
        finally:
            m.close()


def _spy(ctx, calls: list):
    """Record the lengths of the draft context's decodes (the real decode still runs)."""
    real = ctx.decode

    def decode(tokens, start_pos, seq_id=0, outputs="last"):
        calls.append(len(tokens))
        return real(tokens, start_pos, seq_id, outputs)

    ctx.decode = decode


@pytest.mark.parametrize("target,draft", (("bpe", "spm_space"), ("spm_space", "bpe")))
def test_only_a_window_is_tokenized_and_turns_reuse_the_draft_kv(models, target, draft):
    from llamaspec.speculative.drafters.translated import TranslatedDrafter

    prompt = " ".join(WORDS[:120])
    with _gen(models[target], models[draft], max_tokens=40, adaptive=False, draft_max=4) as g:
        d = g.pipeline.drafter.members()[-1]   # (behind the grammar drafter)
        assert isinstance(d, TranslatedDrafter)
        seen: list[int] = []
        enc = d._denc
        real = enc.__call__
        d._denc = lambda text, at_start=False: (seen.append(len(text)), real(text, at_start))[1]
        first = g.generate(prompt)
        assert first.stats["accepted"] > 0
        # the first sync tokenizes the prompt (881 characters); every later one the last draft tokens
    # and the new text (before: the whole text, for a draft with a space prefix)
        assert seen[0] >= len(prompt) and max(seen[1:]) < 150, seen
        calls: list[int] = []
        _spy(d.ctx, calls)
        more = " ".join(WORDS[120:124])
        second = g.generate(prompt + first.text + " " + more)
        # the draft evaluates the new text only (a few dozen tokens), not the ~140 words before it
        assert calls and calls[0] < 40, calls
    with _gen(models[target], max_tokens=40) as g:
        assert second.tokens == g.generate(prompt + first.text + " " + more).tokens


def test_recurrent_draft_rolls_back_to_a_checkpoint(models):
    """A Mamba draft (its memory cannot be cut): rejected drafts roll back to the checkpoint at the
    re-tokenized window, never to the start of the text."""
    prompt = " ".join(WORDS[:100])
    with _gen(models["bpe"], max_tokens=32) as g:
        plain = g.generate(prompt).tokens
    with _gen(models["bpe"], models["spm_mamba"], max_tokens=32, adaptive=False, draft_max=4) as g:
        d = g.pipeline.drafter.members()[-1]   # (behind the grammar drafter)
        assert d.draft.needs_checkpoints
        first: list[int] = []
        _spy(d.ctx, first)
        r = g.generate(prompt)
        # the prompt up to the checkpoint, its last tokens; then a few tokens a step (before: ~100)
        assert sum(first[:2]) > 90 and max(first[2:]) < 20, first
        calls: list[int] = []
        _spy(d.ctx, calls)
        # the next turn rolls back to the checkpoint the first one left: its new text only
        g.generate(prompt + r.text + " " + " ".join(WORDS[130:134]))
        assert calls and sum(calls[:2]) < 20, calls
    assert r.tokens == plain
    assert r.stats["drafted"] > r.stats["accepted"]   # random weights: rollbacks happen


if __name__ == "__main__":  # pragma: no cover - the table the closing note quotes
    ms = make_translated_set(real_models.cache_dir() / "translated-v1")
    for target, draft, off in DIRECTIONS:
        for t, d in ((target, draft), off):
            a, n, same = acceptance(ms, t, d)
            print(f"target {t:12s} draft {d:12s} accepted {a:4d}/{n:4d} = {_rate(a, n):.3f}  "
                  f"tokens equal plain: {same}")
