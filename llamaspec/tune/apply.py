"""A stored configuration applied to a generation's settings: what `Generator` (run, batch) calls.

Explicit choices win, per setting: a `--spec-type` other than the tuned one means the stored
configuration is not used at all (its draft length and n-gram settings belong to its type); a
`--draft-max`, `--draft-p-min` or `--spec-ngram-*` value keeps its own setting and the tuned rest
still applies. A setting counts as given when it differs from its default (the CLI passes every
default), so passing exactly the default value cannot override a tuned value.

A draft the user named (not `--draft auto`) is always used: a stored configuration that runs
without a draft model (an n-gram type, or plain decoding) is then not applied, and the `tuned`
object says so (`applied` empty, `overridden` from "spec-type" on, `reason`), so the run is not
silently something else than what was typed.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, fields, replace
from typing import Any, Sequence

from llamaspec.errors import UsageError
from llamaspec.speculative.options import NgramParams, loads_mtp_layers, needs_draft_model, parse_spec_types
from llamaspec.tune.store import TunedConfig, lookup, store_path

log = logging.getLogger("llamaspec.tune")


@dataclass
class Applied:
    spec_types: list[str]
    draft_max: int | None
    draft_p_min: float
    ngram: NgramParams
    uses_draft: bool                  # False: the draft model is not needed (not loaded)
    info: dict[str, Any]              # the `tuned` object of `run --json`


def tuned_summary(info: dict[str, Any] | None) -> str | None:
    """'tuned config from 2026-12-03 (spec ngram-mod, draft-max 48): applied spec-type, draft-max;
    overridden by flags: mod-n-match' for a stats line (or '... not applied: <reason>')."""
    if not info:
        return None
    text = f"tuned config from {str(info.get('created', ''))[:10]} ({info.get('settings', '')})"
    if info.get("reason"):
        return f"{text} not applied: {info['reason']}"
    if info.get("applied") is not None:
        text += f": applied {', '.join(info['applied']) or 'nothing'}"
    if info.get("overridden"):
        text += f"; overridden by flags: {', '.join(info['overridden'])}"
    return text


def _stored_settings(cfg: TunedConfig) -> list[str]:
    """The settings a stored configuration sets, in flag words ('spec-type', 'draft-max', ...)."""
    names = ["spec-type"] + (["draft-max"] if cfg.draft_max is not None else [])
    names += ["draft-p-min"] if cfg.draft_p_min else []
    known = {f.name for f in fields(NgramParams)}
    return names + [k.replace("_", "-") for k in cfg.ngram if k in known]


def apply_tuned(target_path: os.PathLike[str] | str, draft_path: os.PathLike[str] | str | None,
                spec_types: Sequence[str], *, spec_type_given: bool, draft_given: bool, draft_max: int | None,
                draft_p_min: float, ngram: NgramParams | None, n_gpu_layers: int | None = None,
                n_seq: int = 1) -> Applied | None:
    """The settings with the stored configuration for these files applied; None when none applies.

    draft_path: the draft resolution chose (None: no draft model). When the draft was not given
    (chosen by --draft auto) and that pair was never tuned, the target's own tuning (tuned without
    a draft) applies, and the chosen draft is not used."""
    ngram = ngram or NgramParams()
    cfg = _find(target_path, draft_path, n_gpu_layers)
    if cfg is None and draft_path is not None and not draft_given:
        cfg = _find(target_path, None, n_gpu_layers)
    if cfg is None:
        return None
    try:
        types = parse_spec_types(cfg.spec_type)
    except UsageError as e:
        log.warning("stored tuned config not used: %s", e.message)
        return None
    if needs_draft_model(types) and draft_path is None:
        return None
    if spec_type_given and list(types) != list(spec_types):
        return None
    if n_seq > 1 and loads_mtp_layers(types):
        return None
    if draft_given and draft_path is not None and not needs_draft_model(types):
        # the user named this draft: it is used, and the stored draft-free settings are not
        info = {**_info(cfg), "applied": [], "overridden": _stored_settings(cfg),
                "reason": f"--draft given, and the stored {cfg.spec_type} runs without a draft model"}
        return Applied(list(spec_types), draft_max, draft_p_min, ngram, uses_draft=True, info=info)
    overridden: list[str] = []
    new_max = draft_max
    if cfg.draft_max is not None:
        if draft_max is None:
            new_max = cfg.draft_max
        else:
            overridden.append("draft-max")
    new_p_min = draft_p_min
    if cfg.draft_p_min:
        if draft_p_min == 0.0:
            new_p_min = cfg.draft_p_min
        else:
            overridden.append("draft-p-min")
    defaults, known = NgramParams(), {f.name for f in fields(NgramParams)}
    tuned_ngram: dict[str, int] = {}
    for name, value in cfg.ngram.items():
        if name not in known:
            continue
        if getattr(ngram, name) != getattr(defaults, name):
            overridden.append(name.replace("_", "-"))
        else:
            tuned_ngram[name] = int(value)
    applied = [name for name in _stored_settings(cfg) if name not in overridden]
    info = {**_info(cfg), "applied": applied, "overridden": overridden}
    return Applied(types, new_max, new_p_min, replace(ngram, **tuned_ngram),
                   uses_draft=needs_draft_model(types), info=info)


def _info(cfg: TunedConfig) -> dict[str, Any]:
    return {**{k: v for k, v in cfg.to_dict().items() if k != "measured"}, "settings": cfg.settings_text(),
            "store": str(store_path())}


def _find(target_path, draft_path, n_gpu_layers: int | None) -> TunedConfig | None:
    try:
        return lookup(target_path, draft_path, n_gpu_layers)
    except OSError as e:   # never fail a generation over the store
        log.warning("tuned-config store not used: %s", e.strerror or e)
        return None
