"""Which kind of speculative draft a GGUF is, and what target it was made for, from its header.

llama.cpp's draft architectures (src/llama-arch.cpp, convert_hf_to_gguf.py / conversion/*.py):

  eagle3            EAGLE-3 head: reads 3 hidden states of the target (`eagle3.target_layers`, the
                    "extract layers") of width `eagle3.target_hidden_size`; tokenizer copied from
                    the target; an optional `d2t` tensor maps a reduced draft vocabulary.
  dflash            DFlash block-diffusion draft: proposes `dflash.block_size` tokens in one pass
                    from the target's `dflash.target_layers` hidden states (its n_embd is the
                    target's); with the Markov head tensor `markov_w1.weight` it is a DSpark draft
                    (llama.cpp's common_speculative_types_from_gguf makes the same distinction).
  gemma4-assistant  Gemma 4 "assistant": MTP layers in a file of their own that attend on the
                    target's KV cache (its last full and sliding-window layers) and read the
                    target's token embeddings; `gemma4-assistant.embedding_length_out` is the
                    target's hidden size.

`fit_checks` compares a draft's recorded target facts with a target header (pairing/compat.py
turns them into verdict rules; the drafters check the same before loading anything).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llamaspec.gguf.header import GGUFHeader

__all__ = ["DraftInfo", "DRAFT_ARCHS", "SPEC_DRAFT_KINDS", "draft_info", "kind_of_arch", "n_layer", "fit_checks"]

#: architecture -> llama.cpp spec type of a draft file (dflash becomes draft-dspark with a Markov head)
DRAFT_ARCHS = {"eagle3": "draft-eagle3", "dflash": "draft-dflash", "gemma4-assistant": "draft-mtp"}
#: the spec types a separate draft file can be, besides draft-simple
SPEC_DRAFT_KINDS = ("draft-eagle3", "draft-dflash", "draft-dspark", "draft-mtp")
DSPARK_TENSOR = "markov_w1.weight"
_LABELS = {"draft-eagle3": "EAGLE-3 draft", "draft-dflash": "DFlash draft",
           "draft-dspark": "DSpark draft (DFlash + Markov head)", "draft-mtp": "Gemma 4 assistant (MTP heads)"}


def kind_of_arch(architecture: str | None) -> str | None:
    """The spec type of a draft architecture as far as the name tells (dflash: DFlash or DSpark)."""
    return DRAFT_ARCHS.get(architecture or "")


def n_layer(header: GGUFHeader) -> int | None:
    """llama_model_n_layer: block_count minus the NextN (MTP) layers."""
    blocks = header.block_count
    return None if blocks is None else int(blocks) - header.nextn_predict_layers


@dataclass(frozen=True)
class DraftInfo:
    """What a draft file's header says about itself and about the target it was made for."""

    kind: str                                # llama.cpp spec type (draft-eagle3, draft-dflash, ...)
    architecture: str
    target_layers: tuple[int, ...] = ()      # target layers whose hidden states it reads
    target_hidden_size: int | None = None    # the target's n_embd it was trained on
    target_architecture: str | None = None   # assistant: the target must be gemma4
    block_size: int | None = None            # DFlash/DSpark: tokens proposed per pass
    draft_vocab: int | None = None           # rows of a reduced draft vocabulary (d2t), if any
    base_models: tuple[str, ...] = ()        # general.base_model.N.(repo_url|name), when recorded
    extra: tuple[tuple[str, Any], ...] = ()  # other facts for inspect (key, value)

    @property
    def label(self) -> str:
        return _LABELS.get(self.kind, self.kind)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "label": self.label, "architecture": self.architecture,
                "target_layers": list(self.target_layers), "target_hidden_size": self.target_hidden_size,
                "target_architecture": self.target_architecture, "block_size": self.block_size,
                "draft_vocab": self.draft_vocab, "base_models": list(self.base_models), **dict(self.extra)}


def _ints(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    try:
        return tuple(int(v) for v in value)
    except (TypeError, ValueError):
        return ()


def _int(value: Any) -> int | None:
    try:
        return None if value is None or isinstance(value, (list, str)) else int(value)
    except (TypeError, ValueError):
        return None


def _base_models(header: GGUFHeader) -> tuple[str, ...]:
    count = _int(header.get("general.base_model.count")) or 0
    out = []
    for i in range(min(count, 8)):
        ref = header.get(f"general.base_model.{i}.repo_url") or header.get(f"general.base_model.{i}.name")
        if ref:
            out.append(str(ref))
    return tuple(out)


def draft_info(header: GGUFHeader) -> DraftInfo | None:
    """DraftInfo for an EAGLE-3 / DFlash / DSpark / Gemma 4 assistant file; None for other GGUFs."""
    arch = header.architecture
    kind = kind_of_arch(arch)
    if kind is None:
        return None
    names = {t.name for t in header.tensors}
    d2t = next((t for t in header.tensors if t.name == "d2t"), None)
    common = dict(architecture=arch, base_models=_base_models(header),
                  draft_vocab=int(d2t.shape[0]) if d2t is not None and d2t.shape else None)
    if kind == "draft-eagle3":
        return DraftInfo(kind, target_layers=_ints(header.arch_get("target_layers")),
                         target_hidden_size=_int(header.arch_get("target_hidden_size")),
                         extra=(("norm_before_residual", bool(header.arch_get("norm_before_residual", False))),),
                         **common)
    if kind == "draft-dflash":
        if DSPARK_TENSOR in names:
            kind = "draft-dspark"
        extra = tuple((k, header.arch_get(k)) for k in ("sample_from_anchor", "has_confidence_head")
                      if header.arch_get(k) is not None)
        return DraftInfo(kind, target_layers=_ints(header.arch_get("target_layers")),
                         target_hidden_size=_int(header.arch_get("embedding_length")),
                         block_size=_int(header.arch_get("block_size")), extra=extra, **common)
    # gemma4-assistant: MTP layers over the target's KV; embedding_length_out = the target's n_embd
    return DraftInfo(kind, target_hidden_size=_int(header.arch_get("embedding_length_out")),
                     target_architecture="gemma4",
                     extra=(("nextn_layers", _int(header.arch_get("block_count"))),), **common)


# ---- does a draft fit a target -------------------------------------------------------------------

Check = tuple  # (rule, passed, target value, draft value, one-line detail): compat.RuleResult's fields


def n_embd_out(h: GGUFHeader) -> int | None:
    """llama_model_n_embd_out: embedding_length_out when the file has one, else embedding_length."""
    v = h.arch_get("embedding_length_out") or h.arch_get("embedding_length")
    return None if v is None else int(v)


def _swa_pattern(h: GGUFHeader) -> list[bool] | None:
    pat = h.arch_get("attention.sliding_window_pattern")
    if pat is None or isinstance(pat, (str, bool, int)):
        return None
    return [bool(x) for x in pat]


def _kv_layout(target: GGUFHeader, draft: GGUFHeader) -> Check:
    """The assistant's full / SWA layers read the target's layers n_layer-1 / n_layer-2."""
    n = n_layer(target) or 0
    pat = _swa_pattern(target)
    if pat is None or n < 2 or len(pat) < n:
        return ("kv_layout", False, None, None,
                "the target has no sliding-window pattern for its layers (not a Gemma 4 layout)")
    if pat[n - 1] or not pat[n - 2]:
        return ("kv_layout", False, [pat[n - 2], pat[n - 1]], [True, False],
                f"the target's last two layers must be sliding-window then full attention "
                f"(layers {n - 2}, {n - 1} are {'SWA' if pat[n - 2] else 'full'}, {'SWA' if pat[n - 1] else 'full'})")
    for key, what in (("attention.key_length", "full-attention"), ("attention.key_length_swa", "SWA")):
        t, d = target.arch_get(key), draft.arch_get(key)
        if t is not None and d is not None and int(t) != int(d):
            return "kv_layout", False, int(t), int(d), f"{what} head size differs: target {t}, draft {d}"
    return "kv_layout", True, n - 1, n - 1, f"attends on the target's layers {n - 2} (SWA) and {n - 1} (full)"


def fit_checks(target: GGUFHeader, draft: GGUFHeader, info: DraftInfo) -> list[Check]:
    """target_arch (the assistant: gemma4 only), hidden_size (the target's width is the one the
    draft was trained on), target_layers (the target has every layer the draft reads: llama.cpp
    aborts on a layer id past n_layer; EAGLE-3 reads exactly 3) and kv_layout (the assistant's)."""
    out: list[Check] = []
    if info.target_architecture is not None:
        ok = target.architecture == info.target_architecture
        out.append(("target_arch", ok, target.architecture, info.target_architecture,
                    f"target is {target.architecture}" + ("" if ok else
                    f"; a {info.architecture} draft needs a {info.target_architecture} target")))
    # llama.cpp compares the assistant with llama_model_n_embd_out(target), and feeds EAGLE-3 /
    # DFlash llama_model_n_embd(target)-wide hidden states
    have = n_embd_out(target) if info.kind == "draft-mtp" else _int(target.arch_get("embedding_length"))
    want = info.target_hidden_size
    out.append(("hidden_size", want is not None and want == have, have, want,
                f"{have} (target) vs {want} (trained for)" if want is not None
                else f"the draft does not record the target's hidden size (target {have})"))
    if info.kind in ("draft-eagle3", "draft-dflash", "draft-dspark"):
        n = n_layer(target)
        layers = list(info.target_layers)
        bad = [i for i in layers if n is None or not 0 <= i <= n]
        if not layers:
            ok, detail = False, "the draft names no target layers (target_layers missing)"
        elif info.kind == "draft-eagle3" and len(layers) != 3:
            ok, detail = False, f"EAGLE-3 reads exactly 3 target layers, the file names {len(layers)}: {layers}"
        elif bad:
            ok, detail = False, f"reads layer(s) {bad}, the target has {n} layers (ids up to {n})"
        else:
            ok, detail = True, f"reads layers {layers} of the target's {n}"
        out.append(("target_layers", ok, n, layers, detail))
    if info.kind == "draft-mtp":
        out.append(_kv_layout(target, draft))
    return out
