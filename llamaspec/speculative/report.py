"""What a generation reports: the JSON object of `run --json`, a batch record's stats, and the
Python API's `Result.stats`."""

from __future__ import annotations

from typing import Any

from llamaspec.speculative.engine import Generation


def generation_dict(gen: Generation, *, spec_type: str, draft_model: str | None, model: str) -> dict[str, Any]:
    s = gen.stats
    d = s.to_dict()
    return {
        "text": gen.text,
        "tokens": gen.tokens,
        "model": model,
        "n_prompt": gen.n_prompt,
        "n_prompt_cached": s.prompt_cached,   # of n_prompt, reused from the KV cache (not evaluated)
        "n_generated": len(gen.tokens),
        "stop_reason": gen.stop_reason,
        "spec_type": spec_type,
        "draft_model": draft_model,
        "drafted": s.drafted,
        "accepted": s.accepted,
        "acceptance": s.acceptance,
        "mean_accepted_length": s.mean_accepted_length,
        "per_position_acceptance": s.per_position_acceptance,
        "steps": s.steps,
        "drafts": s.drafts,
        "prompt_seconds": s.prompt_seconds,
        "gen_seconds": s.gen_seconds,
        "tokens_per_second": s.tokens_per_second,
        "overhead_ms_per_step": 1000 * s.overhead_seconds / s.steps if s.steps else 0.0,
        "per_drafter": d.get("per_drafter", {}),
        "grammar_cut": s.grammar_cut,       # draft tokens cut before verification: the grammar refused them
        "grammar_masks": s.grammar_masks,   # rows where the whole vocabulary was masked (the chosen token refused)
    }
