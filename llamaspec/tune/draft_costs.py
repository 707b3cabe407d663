"""What a draft model measured to cost beside its target on this machine, stored per pair.

A run that used a draft model leaves its measured costs here (the draft's cost per token over a
target step, the target's verify curve, the acceptance seen); the next run's default asks
pairing/draft_value.py whether the draft pays with these numbers instead of the cold estimate
from file sizes. Same keys and file format as tune's store (store.py: target and draft files,
llama.cpp build, device), in a file of its own, `draft_costs.json`, so a measurement never
becomes a tuned configuration that `run` applies.

    record(target, draft, costs)          # after a run with the draft
    measured(target, draft) -> DraftCosts | None
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from llamaspec.pairing.draft_value import K_MAX, DraftCosts
from llamaspec.tune import store

log = logging.getLogger("llamaspec.tune")

STORE_NAME = "draft_costs.json"
#: drafted steps a run needs before its acceptance is worth storing (fewer: keep the cost figures,
#: whose timings are taken every step, and the earlier acceptance)
MIN_DRAFTS = 8


def store_path() -> Path:
    return store.config_dir() / STORE_NAME


def measured(target: str | os.PathLike[str], draft: str | os.PathLike[str],
             n_gpu_layers: int | None = None) -> DraftCosts | None:
    """The costs last measured for this pair on this build and device, or None."""
    cfg = store.lookup(target, draft, n_gpu_layers, path=store_path())
    d = cfg.measured.get("draft_costs") if cfg is not None else None
    try:
        return DraftCosts(float(d["cost_ratio"]), tuple(float(x) for x in d["verify"]), float(d["acceptance"]),
                          "measured", f"measured here {cfg.date} over {d.get('drafts', '?')} drafts")
    except (TypeError, KeyError, ValueError):
        return None


def record(target: str | os.PathLike[str], draft: str | os.PathLike[str], costs: DraftCosts, *,
           drafts: int, n_gpu_layers: int | None = None) -> None:
    """Store `costs` for the pair (replacing an earlier measurement). Best effort: a store that
    cannot be written costs a warning, never the run's output."""
    try:
        config = store.TunedConfig("draft-simple", measured={"draft_costs": {**costs.to_dict(), "drafts": drafts}})
        store.save(target, draft, config, n_gpu_layers, path=store_path())
    except OSError as e:
        log.warning("could not store the draft's measured costs (%s)", e)


def from_controller(ctl, previous: DraftCosts | None = None) -> tuple[DraftCosts, int] | None:
    """The costs a draft model's controller (speculative/controller.py) learnt in one run, and
    how many drafts they rest on; None when it never timed a draft. The acceptance of a run with
    few drafts (the controller paused the draft at once) keeps the earlier measurement's, or the
    cold prior."""
    cost = ctl.cost
    if cost.decode_seconds is None or cost.draft_ratio <= 0.0:
        return None
    drafts = int(getattr(ctl, "n_drafts", 0) or 0)
    verify = tuple(cost.verify_ratios(K_MAX))          # [t(k+1)/t(1) for k = 0..K_MAX]
    if drafts >= MIN_DRAFTS:
        alpha = float(ctl.run_alpha)
    elif previous is not None:
        alpha = previous.acceptance
    else:
        from llamaspec.pairing.draft_value import COLD_ACCEPTANCE

        alpha = COLD_ACCEPTANCE
    return DraftCosts(float(cost.draft_ratio), verify, alpha, "measured"), drafts


def record_run(gen) -> None:
    """After a run: store what its draft model's controller measured (Generator.close calls it).
    Nothing when no draft-simple model ran, or it never timed a draft."""
    from llamaspec.speculative.options import DRAFT_MODEL_TYPE

    resolved, n_gpu_layers = getattr(gen, "resolved", None), gen.generation_options.n_gpu_layers
    ctl = getattr(gen.pipeline.engine, "last_controllers", {}).get(DRAFT_MODEL_TYPE)
    if ctl is None or resolved is None or resolved.draft_path is None:
        return
    previous = measured(resolved.target_path, resolved.draft_path, n_gpu_layers)
    got = from_controller(ctl, previous)
    if got is not None:
        record(resolved.target_path, resolved.draft_path, got[0], drafts=got[1], n_gpu_layers=n_gpu_layers)
