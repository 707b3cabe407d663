"""The human stats block of `run` (the JSON object is speculative/report.py's)."""

from __future__ import annotations

from typing import Any




def render_stats(info: dict[str, Any], console) -> None:
    """A compact block for stderr, in llama.cpp's words."""
    n_gen, n_prompt = info["n_generated"], info["n_prompt"]
    ps = info["prompt_seconds"]
    console.print(
        f"[bold]spec[/bold] {info['spec_type']}"
        + (f"  [bold]draft[/bold] {info['draft_model']}" if info["draft_model"] else "")
        + f"  [dim]stop: {info['stop_reason']}[/dim]"
    )
    if info.get("tuned"):
        from llamaspec.cli._output import escape
        from llamaspec.tune.apply import tuned_summary

        console.print(f"[dim]{escape(tuned_summary(info['tuned']))}[/dim]")
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
        console.print("[dim]no drafts were made (nothing to draft from)[/dim]")
