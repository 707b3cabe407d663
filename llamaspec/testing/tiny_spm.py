"""Tiny models of other vocabularies that write the same text, for translated drafting
(speculative/drafters/translated.py): a SentencePiece model that adds a leading space
(`tokenizer.ggml.add_space_prefix` true, as Llama 2, Mistral <= v0.3 and TinyLlama), the same
model with the flag off, and a byte-level BPE one (SmolLM2-style).

A draft only helps a target of another vocabulary when both predict the same *text*. Random
weights do not: here each model is a bigram model of one training text under its own tokenizer
(the next token's logit is P(next | current token), counted on llama.cpp's own tokenization of
the text). Embeddings are one-hot (n_embd >= vocabulary size) and the one block adds nothing to
the residual stream, so logits are exactly the bigram table. The text is made-up words, most
once (so both models copy it on, whatever their tokens), some twice (two successors: where the
models may part). Greedy continuations agree nearly always: what the tests measure is what the
translation between tokenizers loses (tests/test_translated_spm.py). A random-weight Mamba model
with the SPM vocabulary is a recurrent draft for the checkpoint path.

    python -m llamaspec.testing.tiny_spm [OUTDIR]    # writes the set
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from llamaspec.testing.tiny_models import (
    Vocab, atomic_write, finish_model, bpe_from_text, cached_set, generator_fingerprint, llama_writer, spm_from_text)



def _made_up_text(n_words: int = 240, n_remix: int = 60, seed: int = 7) -> str:
    """Made-up words, each once (a bigram model of it copies it on), then n_remix of them again
    in another order: those have two successors, and the two models do not always pick the same
    one (ties go to the more frequent token, counted in each model's own tokens)."""
    rng = np.random.default_rng(seed)
    syll = ["ka", "lo", "mi", "ren", "to", "sa", "vel", "dor", "ni", "pa", "que", "zu", "bri", "fen", "ost"]
    seen: set[str] = set()
    words: list[str] = []
    while len(words) < n_words:
        w = "".join(syll[int(i)] for i in rng.integers(len(syll), size=int(rng.integers(2, 4))))
        if w not in seen:
            seen.add(w)
            words.append(w)
    remix = [words[int(i)] for i in rng.permutation(n_words)[:n_remix]]
    return " ".join(words) + "\n" + " ".join(remix) + "\n"


#: the training text
TEXT = _made_up_text()
#: merges learned from TEXT: words mostly whole, the rarer ones in pieces
N_MERGES = 350
#: the logit of a certain successor; the others scale with their probability
BIGRAM_SCALE = 20.0

#: spm_mamba: a recurrent draft (random weights) with the SPM vocabulary, for checkpoint rollback
SET_NAMES = ("spm_space", "spm_nospace", "bpe", "spm_mamba")


def _vocabs() -> dict[str, tuple[Vocab, bool | None]]:
    spm = spm_from_text(TEXT, N_MERGES)
    return {"spm_space": (spm, True), "spm_nospace": (spm, False), "bpe": (bpe_from_text(TEXT, N_MERGES), None)}


def _write(path: Path, vocab: Vocab, add_space_prefix: bool | None, head: np.ndarray, name: str) -> Path:
    """A 1-block llama GGUF whose logits for token t are head[:, t] (one-hot embeddings)."""
    import gguf

    n_vocab, n_embd = vocab.size, head.shape[1]
    n_head, n_ff = 4, 64

    def fill(tmp: Path) -> None:
        w = llama_writer(tmp, name, vocab, context_length=4096, n_embd=n_embd, n_layer=1, n_ff=n_ff,
                         n_head=n_head, n_head_kv=n_head, file_type=gguf.LlamaFileType.MOSTLY_F16)
        if add_space_prefix is not None:
            w.add_add_space_prefix(add_space_prefix)
        # rms_norm(embd[t]) == embd[t]: each row has norm sqrt(n_embd), all in one coordinate
        embd = np.zeros((n_vocab, n_embd), np.float32)
        embd[np.arange(n_vocab), np.arange(n_vocab)] = np.sqrt(n_embd)
        w.add_tensor("token_embd.weight", embd.astype(np.float16))
        w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
        w.add_tensor("output.weight", (head / np.sqrt(n_embd)).astype(np.float16))
        zero = lambda *shape: np.zeros(shape, np.float16)   # noqa: E731 - the block adds nothing
        w.add_tensor("blk.0.attn_norm.weight", np.ones(n_embd, np.float32))
        w.add_tensor("blk.0.ffn_norm.weight", np.ones(n_embd, np.float32))
        for k in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(f"blk.0.{k}.weight", zero(n_embd, n_embd))
        w.add_tensor("blk.0.ffn_gate.weight", zero(n_ff, n_embd))
        w.add_tensor("blk.0.ffn_up.weight", zero(n_ff, n_embd))
        w.add_tensor("blk.0.ffn_down.weight", zero(n_embd, n_ff))
        finish_model(w)

    return atomic_write(path, fill)


def bigram_head(tokens: list[int], vocab: Vocab, n_embd: int) -> np.ndarray:
    """[n_vocab, n_embd]: column t holds BIGRAM_SCALE * P(next | t) over `tokens`; a token never
    followed by anything predicts the text's most frequent token. Control tokens never win."""
    counts: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for a, b in zip(tokens, tokens[1:]):
        counts[a][b] += 1
    freq = np.bincount(tokens, minlength=vocab.size).astype(np.float32)
    head = np.zeros((vocab.size, n_embd), np.float32)
    # ties go to the more frequent token, as a trained model would
    prior = 1e-3 * freq / max(1.0, float(freq.max()))
    for t in range(vocab.size):
        nxt = counts.get(t)
        head[:, t] = prior
        if nxt:
            total = sum(nxt.values())
            for b, c in nxt.items():
                head[b, t] += BIGRAM_SCALE * c / total
        else:
            head[int(freq.argmax()), t] += BIGRAM_SCALE
    head[vocab.special_ids(), :] = -BIGRAM_SCALE
    return head


def make_translated_set(outdir: Path, *, force: bool = False) -> dict[str, Path]:
    """Write (or reuse) the set in `outdir`: name -> path, names SET_NAMES."""
    from llamaspec.runtime.llama import Model
    from llamaspec.testing.tiny_recurrent import write_mamba_model

    def write(paths: dict[str, Path]) -> None:
        for name, (vocab, space) in _vocabs().items():
            n_embd = -(-vocab.size // 64) * 64
            zero = np.zeros((vocab.size, n_embd), np.float32)
            _write(paths[name], vocab, space, zero, name)   # first only to tokenize TEXT with llama.cpp
            m = Model(paths[name])
            try:
                tokens = m.tokenize_prompt(TEXT)
            finally:
                m.close()
            if name == "spm_nospace":   # the same weights as spm_space: only the flag differs
                tokens = spm_tokens
            elif name == "spm_space":
                spm_tokens = tokens
            _write(paths[name], vocab, space, bigram_head(tokens, vocab, n_embd), f"tiny-{name}")
        write_mamba_model(paths["spm_mamba"], n_layer=1, vocab=_vocabs()["spm_space"][0], name="tiny-spm-mamba")

    return cached_set(outdir, SET_NAMES, "translated-set.json", generator_fingerprint(__file__, SET_NAMES),
                      write, force=force)


if __name__ == "__main__":  # pragma: no cover - a manual tool
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/llamaspec-translated-set")
    print(make_translated_set(out))
