"""`llamaspec chat`: an interactive chat on the model's template, history and KV prefix kept across
turns. The CLI is driven through a pseudo-terminal (pexpect) on the real SmolLM2; the pure helpers
(history trimming, multi-line input) are tested alone."""

from __future__ import annotations

import pytest

from llamaspec.generator import Generator


@pytest.mark.real
def test_next_turn_reuses_the_cached_prefix(smollm2_q4):
    """The engine reports how many prompt tokens came from the KV cache: a second turn evaluates only
    what the first did not leave there (n_prompt_cached), a first turn nothing cached."""
    with Generator(smollm2_q4, spec_type="none", temperature=0, max_tokens=8, threads=1, ctx_size=512) as g:
        turn1 = [{"role": "user", "content": "Name a colour."}]
        r1 = g.generate(turn1)
        assert r1.stats["n_prompt_cached"] == 0
        turn2 = turn1 + [{"role": "assistant", "content": r1.text}, {"role": "user", "content": "Another one."}]
        r2 = g.generate(turn2)
        assert r2.n_prompt == len(g.tokenize(turn2))
        # everything of turn 1 that went into the KV cache (its prompt at least) is reused
        assert r1.n_prompt <= r2.stats["n_prompt_cached"] < r2.n_prompt
