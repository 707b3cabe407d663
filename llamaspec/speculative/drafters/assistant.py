"""`draft-mtp` from a separate Gemma 4 "assistant" GGUF (architecture gemma4-assistant).

The assistant holds MTP layers only. llama.cpp drives it exactly like heads inside the target
(common/speculative.cpp, `draft-mtp`; the draft context is created with ctx_type MTP and
ctx_other = the target's context): the assistant's context attends on the target's KV cache
(`llama_get_ctx_other(assistant) == target` is what llama.cpp tests for "shared memory"), reads the
target's token embeddings and post-norm hidden state, and every draft step reuses the position of
the last token. So the drafter is mtp.MtpDrafter's shared-memory path on another model; this file
loads the assistant, checks it fits the target from both headers (gguf/drafts.py, the rules
`check` reports) and refuses, with the reason, anything llama.cpp would abort on.
"""

from __future__ import annotations

from pathlib import Path

from llamaspec.errors import ModelFileError, UsageError
from llamaspec.gguf.drafts import draft_info, fit_checks
from llamaspec.gguf.header import read_file
from llamaspec.runtime.context import Context
from llamaspec.runtime.llama import Model
from llamaspec.speculative.drafters.mtp import MtpDrafter

__all__ = ["is_mtp_draft_file", "check_assistant", "load_assistant_drafter"]


def is_mtp_draft_file(path: Path | None) -> bool:
    """Is `path` a Gemma 4 assistant (MTP heads for a target), as its header says?"""
    if path is None:
        return False
    try:
        info = draft_info(read_file(path))
    except ModelFileError:
        return False
    return info is not None and info.kind == "draft-mtp"


def check_assistant(target_path: Path, assistant_path: Path) -> None:
    """UsageError naming the first rule the assistant fails against the target (headers only)."""
    draft = read_file(assistant_path)
    info = draft_info(draft)
    if info is None or info.kind != "draft-mtp":
        raise UsageError(f"{assistant_path.name} is not a Gemma 4 assistant (architecture {draft.architecture})",
                         "--spec-type draft-mtp takes the target's own MTP heads, or a gemma4-assistant GGUF "
                         "with --draft")
    for rule, ok, _t, _d, detail in fit_checks(read_file(target_path), draft, info):
        if not ok:
            raise UsageError(f"assistant {assistant_path.name} does not fit {target_path.name}: {rule}: {detail}",
                             "use the assistant published with this target (`llamaspec check TARGET DRAFT`)")


def load_assistant_drafter(target: Model, ctx: Context, assistant_path: Path, *, p_min: float = 0.0,
                           n_threads: int | None = None, n_gpu_layers: int = 0,
                           amx: bool | None = None) -> tuple[MtpDrafter, Model]:
    """(drafter, assistant model): the caller closes the drafter, then the model."""
    check_assistant(target.path, assistant_path)
    model = Model(assistant_path, n_gpu_layers=n_gpu_layers, load_mtp=True,
                  amx=amx if amx is not None else getattr(target, "amx", None))
    try:
        drafter = MtpDrafter(target, ctx, p_min=p_min, n_threads=n_threads, heads=model)
        if not drafter.mem_shared:
            drafter.close()
            # Not a silent fallback: without the link the assistant has no KV to attend on.
            raise UsageError("llama.cpp did not link the assistant's context to the target's "
                             "(llama_get_ctx_other returned another context)",
                             "this llama-cpp-python build cannot run Gemma 4 assistants; use --spec-type ngram-mod")
    except BaseException:
        model.close()
        raise
    # Decoding reads every weight once: sizes estimate the assistant's cost per drafted token.
    drafter.cost_hint = assistant_path.stat().st_size / max(1, target.path.stat().st_size)
    return drafter, model
