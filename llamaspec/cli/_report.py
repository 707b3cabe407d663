"""The human stats block of `run` (the JSON object is speculative/report.py's)."""

from __future__ import annotations

from typing import Any

PAUSED = "the draft model was paused: it would have cost more than it saved here; --fixed-draft forces it"


def no_drafts_reason(spec_type: str, steps: int, per_drafter: dict[str, dict] | None = None,
                     draft_max: int | None = None) -> str:
    """Why a speculative run drafted nothing, truthfully. A drafter never asked for a draft was held
    back by the adaptive controller (per_drafter has no calls for it; None: not known, as in bench's
    medians); a draft model always has a draft when asked, an n-gram drafter only where the text
    repeats. Model drafters are the spec types named draft-* (llama.cpp's names)."""
    if draft_max == 0:
        return "no drafts were made (--draft-max 0)"
    if steps <= 1:
        return "no drafts were made (the output was too short to draft: the first token comes from the prompt)"
    kinds = spec_type.split(",")
    calls = {k: int(d.get("calls", 0)) for k, d in (per_drafter or {}).items()}
    models = [k for k in kinds if k.startswith("draft-")]
    if models and not any(calls.get(k) for k in models):
        return PAUSED
    if per_drafter is not None and not any(calls.values()):
        return "drafting was paused: it would have cost more than it saved here; --fixed-draft forces it"
    if models:
        return "no drafts were made (the draft model was never sure enough: --draft-p-min)"
    return "no drafts were made (nothing to draft from: the text had no repeat to copy)"


def render_stats(info: dict[str, Any], console, draft_max: int | None = None) -> None:
    """A compact block for stderr, in llama.cpp's words."""
    n_gen, n_prompt = info["n_generated"], info["n_prompt"]
    ps = info["prompt_seconds"]
    console.print(
        f"[bold]spec[/bold] {info['spec_type']}"
        + (f"  [bold]draft[/bold] {info['draft_model']}" if info["draft_model"] else "")
        + f"  [dim]stop: {info['stop_reason']}[/dim]"
    )
    console.print(
        f"prompt {n_prompt} tokens in {ps:.2f} s"
        + (f" ({n_prompt / ps:.0f} tok/s)" if ps > 0 else "")
        + f" | generated {n_gen} tokens in {info['gen_seconds']:.2f} s: "
        + f"[bold]{info['tokens_per_second']:.1f} tok/s[/bold]"
    )
    if info["drafted"]:
        per_pos = " ".join(f"{100 * a:.0f}" for a in info["per_position_acceptance"][:16])
        console.print(
            f"drafted {info['drafted']}, accepted {info['accepted']} "
            f"([bold]{100 * info['acceptance']:.1f}%[/bold]), mean accepted length "
            f"{info['mean_accepted_length']:.2f} over {info['drafts']} drafts ({info['steps']} steps)"
        )
        console.print(f"[dim]per-position acceptance %: {per_pos}[/dim]")
    elif info["spec_type"] != "none":
        console.print(f"[dim]{no_drafts_reason(info['spec_type'], info['steps'], info.get('per_drafter'), draft_max)}[/dim]")

