"""The cost side of the adaptive draft length: one-token steps timed apart from batches, a plain
step taken to time t(1) when drafting runs every step, a measured draft cost before the first
draft, a pause that takes the whole cap when drafting cannot pay, and the draft model's bounded
catch-up after a pause (lossless on real tiny models)."""

from __future__ import annotations

import numpy as np
import pytest

from llamaspec.runtime.context import Context, ContextConfig
from llamaspec.runtime.llama import Model
from llamaspec.speculative.controller import DraftLengthController
from llamaspec.speculative.costs import RECALIBRATE_STEPS, CostModel
from llamaspec.speculative.drafters.model import SYNC_WINDOW, ModelDrafter
from tests.engine_helpers import generate, prompt_tokens


def test_a_plain_step_is_timed_when_every_step_drafts():
    ctl = DraftLengthController(n_max=8)
    assert ctl.choose() > 0                      # nothing timed yet: draft from the prior
    ctl.observe(4, 4, verify_seconds=0.02)       # a batch was timed, t(1) never was
    assert ctl.choose() == 0                     # so one plain step, to time it
    ctl.observe(0, 0, verify_seconds=0.01)
    assert ctl.choose() > 0 and not ctl.cost.needs_decode_timing
    for _ in range(RECALIBRATE_STEPS):
        ctl.cost.observe_verify(5, 0.02)
    assert ctl.cost.needs_decode_timing          # and again after a long stretch of batches
    # fixed costs (seeded runs) never ask for it
    assert not CostModel(verify_ratio_fn=lambda k: 1.0).needs_decode_timing


def test_a_measured_draft_cost_stops_drafting_before_the_first_draft():
    """A draft token timed at load at 1.2 target steps cannot pay whatever its acceptance: the
    first choice is already a pause, and it lasts the whole cap (no short probes first)."""
    ctl = DraftLengthController(n_max=8, cost=CostModel(draft_ratio_prior=1.2))
    assert ctl.choose() == 0 and ctl.paused
    assert ctl._pause_left + 1 == ctl.pause_cap() >= ctl.max_pause
    free = DraftLengthController(n_max=8, cost=CostModel(draft_ratio_prior=0.0))
    assert free.choose() > 0


def test_cost_driven_pause_is_priced_by_the_probe_budget():
    expensive = DraftLengthController(n_max=8, cost=CostModel(draft_ratio_value=2.0), probe_budget=0.03)
    # a failed probe of 4 tokens costs about 4 * 2.0 + verify - 1 > 7 steps: >= 7 / 0.03 steps apart
    assert expensive.pause_cap() >= 7 / 0.03
    assert expensive.pause_cap() <= 8 * expensive.max_pause


def test_draft_catch_up_after_a_pause_is_bounded_and_positions_stay_consistent(tiny_models):
    """After a long stretch without drafting, the draft evaluates at most SYNC_WINDOW tokens (spliced
    after what its KV holds), and drafting, rejection rollback and the next catch-up keep working."""
    target = Model(tiny_models["target"])
    draft = Model(tiny_models["draft"])
    dctx = Context(draft, ContextConfig(n_ctx=512, n_threads=1))
    seen: list[int] = []
    dctx.add_decode_listener(lambda ctx, toks, pos, seq: seen.append(len(toks)))
    d = ModelDrafter(dctx)
    prompt = prompt_tokens(target, "The sea is wide and the sky is blue.")
    d.begin(0, prompt)
    history = prompt + [int(t) for t in np.random.default_rng(0).integers(5, target.n_vocab, 100)]
    seen.clear()
    first = d.propose(0, history, 4)
    assert seen[0] == SYNC_WINDOW and len(first) == 4
    d.accepted(0, 1, first.tokens[:1] + [7])
    history += first.tokens[:1] + [7]           # 3 draft tokens rejected: rolled back next time
    seen.clear()
    second = d.propose(0, history, 3)
    assert seen[0] <= 3 and len(second) == 3
    history += [11] * 40
    assert len(d.propose(0, history, 2)) == 2   # a second splice
    d.end(0)
    d.close()
    target.close()
    draft.close()


@pytest.mark.parametrize("fixed", [True, False])
def test_draft_model_stays_lossless_with_pauses_and_catch_ups(tiny_models, fixed):
    target = Model(tiny_models["target"])
    prompt = prompt_tokens(target, "Once upon a time there was a lighthouse keeper who")
    plain = generate(target, "none", prompt, n=80)
    spec = generate(target, "draft", prompt, draft=tiny_models["draft"], n=80, adaptive=not fixed)
    assert spec.tokens == plain.tokens
    target.close()
