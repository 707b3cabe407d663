"""A pair of model references checked: the compat verdict for two paths or Hub refs (headers only),
and a user-given `--draft` refused when it cannot draft for the target, unless forced."""

from __future__ import annotations

from pathlib import Path

from llamaspec.errors import IncompatiblePairError
from llamaspec.gguf.peek import light_header, target_tokens
from llamaspec.pairing import compat
from llamaspec.pairing.compat import Verdict


def check_refs(target_ref: str, draft_ref: str, *, offline: bool = False) -> Verdict:
    """The verdict for two model references (paths or Hub refs), reading only their headers.

    A local draft whose token bytes equal the target's reuses the target's decoded texts
    (gguf.peek.light_header): the same result as a full parse, at a fraction of the time.
    """
    from llamaspec import hub

    target = hub.read_model_header(target_ref, offline=offline)
    draft = None
    local = hub.classify(draft_ref)
    if not isinstance(local, hub.HubRef) and Path(target.source).is_file():
        raw = target_tokens(target)
        draft = light_header(Path(local), raw) if raw else None
    if draft is None:
        draft = hub.read_model_header(draft_ref, offline=offline)
    return compat.check_headers(target, draft)


def check_explicit_draft(target: str, draft: str, force: bool = False, *, offline: bool = False) -> Verdict:
    """Check a user-given draft against the target; raise IncompatiblePairError unless `force`.

    A translated pair (another vocabulary, an ordinary model) is returned as it is: it drafts
    through text. With force, an incompatible pair only warns: output stays the target's own (it verifies every
    token), but acceptance will be poor, and draft token ids beyond the target's vocabulary must be
    treated as rejections by the engine.
    """
    verdict = check_refs(target, draft, offline=offline)
    if verdict.can_draft:
        return verdict
    if not force:
        raise IncompatiblePairError(
            f"draft {draft} cannot draft for {target}: {verdict.reason}",
            "use a draft with the same tokenizer (`llamaspec pair TARGET` lists them), "
            "or --force-draft to try anyway",
        )
    import logging

    logging.getLogger(__name__).warning(f"forced an incompatible draft ({verdict.reason}); llama.cpp would refuse "
                                        "this pair. Output stays the target's own, but expect few accepted tokens")
    return verdict
