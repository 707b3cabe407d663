"""A model's vocabulary as llama.cpp sees it, from the GGUF header alone.

llama.cpp fills in defaults that the file may not state (BOS/EOS ids and whether BOS/EOS are
added depend on the tokenizer model and pre-tokenizer), drops special ids that point outside the
vocabulary, and renames empty token texts (src/llama-vocab.cpp, `llama_vocab::impl::load`).
Comparing raw metadata would call pairs different that llama.cpp treats as equal (or the other
way round), so the same resolution is done here once and every consumer (inspect, compat,
registry, discovery) uses the result.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property

from llamaspec.gguf.header import GGUFHeader

# tokenizer.ggml.model -> llama_vocab_type name
VOCAB_TYPES = {
    "no_vocab": "NONE", "none": "NONE", "llama": "SPM", "gpt2": "BPE", "hybriddna": "BPE",
    "whitespace": "BPE", "bert": "WPM", "t5": "UGM", "rwkv": "RWKV", "plamo2": "PLAMO2",
    "gemma4": "BPE", "test": "TEST",
}

# Default special ids per tokenizer model, before the file's own keys: (bos, eos).
_DEFAULT_IDS: dict[str, tuple[int | None, int | None]] = {
    "llama": (1, 2), "bert": (101, None), "gpt2": (11, 11), "hybriddna": (11, 11),
    "whitespace": (11, 11), "t5": (None, 1), "rwkv": (None, None), "plamo2": (1, 2),
    "gemma4": (None, None), "test": (None, None), "no_vocab": (None, None), "none": (None, None),
}

# add_bos/add_eos defaults by vocab type (llama-vocab.cpp), before the file's own keys.
_DEFAULT_ADD: dict[str, tuple[bool, bool]] = {
    "SPM": (True, False), "WPM": (True, False), "UGM": (False, True), "RWKV": (False, False),
}
# BPE pre-tokenizers for which llama.cpp turns add_bos on by default.
_BPE_PRE_ADD_BOS = {
    "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
    "jina-v5-nano", "tekken", "chameleon",
}
# BPE pre-tokenizers for which llama.cpp drops the default BOS id (ChatGLM/GLM-4/GLM-5).
_BPE_PRE_NO_BOS = {"chatglm-bpe", "glm4", "glm5"}
# Pre-tokenizers that get LLAMA_VOCAB_PRE_TYPE_GEMMA4: BOS always added (llama.cpp PR 21500).
_PRE_FORCE_BOS = {"gemma4", "granite-embed-multi-311m"}

_DNA_KMER_MARKER = "\ue000"  # hybriddna: stripped from k-mer token texts after "<oov>"


@dataclass(frozen=True)
class VocabInfo:
    model: str                 # tokenizer.ggml.model ("gpt2", "llama", ...)
    vocab_type: str            # llama_vocab_type name ("BPE", "SPM", ...)
    pre: str | None            # tokenizer.ggml.pre (as llama.cpp uses it)
    tokens: tuple[str, ...]    # token texts as llama_vocab_get_text returns them
    bos_id: int | None         # None = LLAMA_TOKEN_NULL (-1)
    eos_id: int | None
    add_bos: bool
    add_eos: bool

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    @cached_property
    def fingerprint(self) -> str:
        """Stable short hash of the vocabulary type and every token's text, for comparing at a glance."""
        return vocab_fingerprint(self.vocab_type, self.tokens)

    def token_text(self, token_id: int | None) -> str | None:
        if token_id is None or not 0 <= token_id < len(self.tokens):
            return None
        return self.tokens[token_id]

    def summary(self) -> dict:
        return {
            "model": self.model, "type": self.vocab_type, "pre": self.pre, "size": self.n_vocab,
            "bos_id": self.bos_id, "bos": self.token_text(self.bos_id), "add_bos": self.add_bos,
            "eos_id": self.eos_id, "eos": self.token_text(self.eos_id), "add_eos": self.add_eos,
            "fingerprint": self.fingerprint,
        }


def vocab_fingerprint(vocab_type: str, tokens: tuple[str, ...] | list[str]) -> str:
    """sha256 over type + "\\0" + each token text (joined at C speed: 262k tokens in ~20 ms)."""
    h = hashlib.sha256(vocab_type.encode())
    if tokens:
        h.update(("\x00" + "\x00".join(tokens)).encode("utf-8", errors="surrogateescape"))
    return h.hexdigest()[:16]


def _special_id(meta: dict, key: str, default: int | None, n_tokens: int) -> int | None:
    """llama.cpp: a default id outside the vocab is disabled; a file id outside it is ignored."""
    if default is not None and default >= n_tokens:
        default = None
    value = meta.get(key)
    if value is None:
        return default
    try:
        value = int(value)
    except (TypeError, ValueError):
        return default
    if value < 0:  # read as uint32 by llama.cpp: a negative int32 is a huge id, i.e. out of range
        return default
    return value if value < n_tokens else default


def _token_texts(meta: dict, model: str) -> tuple[str, ...]:
    raw = meta.get("tokenizer.ggml.tokens")
    if model in ("no_vocab", "none"):
        # llama.cpp: no tokens, only `<arch>.vocab_size` dummy (empty) entries.
        arch = meta.get("general.architecture", "")
        n = int(meta.get(f"{arch}.vocab_size", 0) or 0)
        return ("",) * n
    tokens = tuple(raw or ())
    if "" in tokens:  # llama.cpp renames empty texts, and compares the new names
        tokens = tuple(t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens))
    if model == "hybriddna" and "<oov>" in tokens:
        start = tokens.index("<oov>") + 1
        m = _DNA_KMER_MARKER
        tokens = tokens[:start] + tuple(
            t[: -len(m)] if len(t) > len(m) and t.endswith(m) else t for t in tokens[start:]
        )
    return tokens


def vocab_from_header(header: GGUFHeader) -> VocabInfo:
    meta = header.metadata
    model = str(meta.get("tokenizer.ggml.model", "none"))
    vtype = VOCAB_TYPES.get(model, model.upper())
    pre = meta.get("tokenizer.ggml.pre")
    if model == "gemma4":  # llama.cpp overwrites the pre-tokenizer name for this model
        pre = "gemma4"
    tokens = _token_texts(meta, model)
    n = len(tokens)

    bos_default, eos_default = _DEFAULT_IDS.get(model, (None, None))
    add_bos, add_eos = _DEFAULT_ADD.get(vtype, (False, False))
    if vtype == "BPE":
        if pre in _BPE_PRE_ADD_BOS:
            add_bos = True
        if pre in _BPE_PRE_NO_BOS:
            bos_default = None
    if model in ("no_vocab", "none"):
        return VocabInfo(model, vtype, pre, tokens, None, None, False, False)

    bos = _special_id(meta, "tokenizer.ggml.bos_token_id", bos_default, n)
    eos = _special_id(meta, "tokenizer.ggml.eos_token_id", eos_default, n)
    if meta.get("tokenizer.ggml.add_bos_token") is not None:
        add_bos = bool(meta["tokenizer.ggml.add_bos_token"])
    if meta.get("tokenizer.ggml.add_eos_token") is not None:
        add_eos = bool(meta["tokenizer.ggml.add_eos_token"])
    if vtype == "BPE" and pre in _PRE_FORCE_BOS:
        add_bos = True
    return VocabInfo(model, vtype, pre, tokens, bos, eos, add_bos, add_eos)
