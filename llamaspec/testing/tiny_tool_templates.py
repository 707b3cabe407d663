"""Tiny GGUFs that carry a tool-calling family's real chat template and its special tokens, for
tests of tool calls: neither installable real model's template takes tools.

Each is the tiny 1-layer llama model (tiny_models.py) on the shared byte-level BPE vocabulary
plus the family's tokens, typed as the real GGUFs type them: Llama 3.x's and Mistral's markers are
control tokens (rendered empty in output text, as in the real models), Qwen 2.5's <tool_call>
tags are user-defined tokens (rendered). The template text is given by the caller (the tests keep
the real templates in tests/fixtures/tools/), so this module holds no copy of them.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

from llamaspec.testing.tiny_models import (TT_CONTROL, Vocab, bpe_vocab, cached_set, generator_fingerprint,
                                           write_llama_model)

TT_USER_DEFINED = 4   # gguf.TokenType.USER_DEFINED

# family -> (control tokens, user-defined tokens, BOS text, EOS text); texts already in the base
# vocabulary (ChatML's <|im_start|>, <|im_end|>, <|endoftext|>) are reused
FAMILIES: dict[str, tuple[tuple[str, ...], tuple[str, ...], str, str]] = {
    "qwen2.5": ((), ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"),
                "<|endoftext|>", "<|im_end|>"),
    "llama3": (("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"), (), "<|begin_of_text|>", "<|eot_id|>"),
    "mistral-nemo": (("<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                      "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]"), (), "<s>", "</s>"),
}


def family_vocab(family: str, template: str) -> Vocab:
    """The shared BPE vocabulary with `family`'s tokens appended and `template` as its chat template."""
    control, user, bos, eos = FAMILIES[family]
    base = bpe_vocab()
    tokens, types = list(base.tokens), list(base.types)
    for text, kind in [(t, TT_CONTROL) for t in control] + [(t, TT_USER_DEFINED) for t in user]:
        if text not in tokens:
            tokens.append(text)
            types.append(kind)
    add_bos = family != "qwen2.5"   # (Qwen's GGUFs add no BOS)
    return dataclasses.replace(base, tokens=tuple(tokens), types=tuple(types), bos_id=tokens.index(bos),
                               eos_id=tokens.index(eos), add_bos=add_bos, chat_template=template)


def make_tool_models(outdir: Path, templates: dict[str, tuple[str, str]], *, force: bool = False) -> dict[str, Path]:
    """Write (or reuse) one tiny model per entry of `templates` (name -> (family, template text))
    in `outdir`; returns name -> path."""
    names = tuple(sorted(templates))
    want = generator_fingerprint(__file__, names)
    want["templates"] = {n: [templates[n][0], hashlib.sha256(templates[n][1].encode()).hexdigest()[:16]]
                         for n in names}

    def write(paths: dict[str, Path]) -> None:
        for name in names:
            family, text = templates[name]
            write_llama_model(paths[name], n_layer=1, vocab=family_vocab(family, text), seed=4242,
                              name=f"tiny-tools-{name}")

    return cached_set(outdir, names, "tiny-tool-set.json", want, write, force=force)
