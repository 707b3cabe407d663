"""Tiny EAGLE-3, DFlash and DSpark draft GGUFs for the tiny llama targets (same BPE vocabulary).

Architectures and names follow llama.cpp (`src/models/eagle3.cpp`, `src/models/dflash.cpp`,
`conversion/llama.py`, `conversion/qwen.py`): `eagle3.target_layers` / `dflash.target_layers`
(indices of the target layers whose *input* the draft reads), `eagle3.target_hidden_size`,
`dflash.block_size`, `dflash.sample_from_anchor`, `dflash.has_confidence_head`,
`tokenizer.ggml.mask_token_id`; tensors `fc`, `enc.output_norm`, `blk.0.attn_norm_2`,
`markov_w1`, `markov_w2`, `conf_proj`.

"Aligned" drafts agree with a near-bigram target (`write_bigram_target`: every layer only nudges
the residual stream, so its greedy next token is about head . norm(embd(current token))):

* EAGLE-3: the decoder at position P sees token t(P+1). Its own token embedding carries a
  constant extra coordinate; Q and K read only that coordinate, so (RoPE being relative) every
  head attends to its own position, and V/wo copy the token's target embedding into the residual
  stream. With `norm_before_residual` the carried state g adds only a small term. Each draft step
  therefore predicts bigram(current token): whole chains are accepted.
* DFlash: Q and K norms are zero (uniform attention); the mask token embeds to zero and the
  injected target features are scaled down, so every block position reads about the anchor
  token's embedding: the first draft token is bigram(anchor), later ones mostly rejected.
* DSpark: the Markov head is rank-64 bigram itself (w1 = norm(embd), w2 = the target head) and
  chains greedily in the graph, so the whole block follows the target.
Random variants exercise the same graphs (features, positions, KV injection) without agreement.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llamaspec.testing.tiny_models import (
    BASE_SEED, Vocab, atomic_write, finish_model, normal_weights, shared_weights, bpe_vocab, cached_set,
    generator_fingerprint, write_llama_model,
)

N_EMBD = 64          # the tiny targets' width
MASK_TOKEN_ID = 4    # <|reserved_special_0|>: a control token the targets never generate
TARGET_LAYERS = 4
BIGRAM_SCALE = 0.05  # attn_output / ffn_down scale of the near-bigram target's layers


def write_bigram_target(path: Path, *, vocab: Vocab | None = None, seed: int = BASE_SEED) -> Path:
    """A 4-layer llama target whose layers barely move the residual stream (same embeddings and
    head as the standard tiny target): its greedy output is nearly a function of the last token."""
    return write_llama_model(path, n_layer=TARGET_LAYERS, vocab=vocab or bpe_vocab(), seed=seed,
                             layer_scales=[BIGRAM_SCALE] * TARGET_LAYERS, name="tiny-bigram-target")


def _common(w, arch: str, vocab: Vocab, n_embd: int, n_head: int, n_ff: int, ctx: int) -> None:
    w.add_name(f"tiny-{arch}")
    w.add_uint32(f"{arch}.context_length", ctx)
    w.add_uint32(f"{arch}.embedding_length", n_embd)
    w.add_uint32(f"{arch}.block_count", 1)
    w.add_uint32(f"{arch}.feed_forward_length", n_ff)
    w.add_uint32(f"{arch}.attention.head_count", n_head)
    w.add_uint32(f"{arch}.attention.head_count_kv", n_head)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_float32(f"{arch}.rope.freq_base", 10000.0)
    w.add_uint32(f"{arch}.vocab_size", vocab.size)
    vocab.write_to(w)


def _self_attention_weights(n_embd_tok: int, n_in: int, n_head: int, hd: int, const_dim: int, qk: float):
    """Q/K reading only input coordinate `const_dim` (the same value in every head dimension: the
    score then peaks at relative distance 0 whatever the pairing of RoPE dimensions), V copying
    input coordinates 0..n_embd_tok-1 into heads (hd per head)."""
    n_q = n_head * hd
    wq = np.zeros((n_q, n_in), np.float32)
    wq[:, const_dim] = qk
    wv = np.zeros((n_q, n_in), np.float32)
    wv[np.arange(n_embd_tok), np.arange(n_embd_tok)] = 1.0
    return wq, wq.copy(), wv


def write_eagle3_model(path: Path, *, aligned: bool = True, vocab: Vocab | None = None, seed: int = BASE_SEED,
                       target_layers=(1, 2, 3), n_embd_target: int = N_EMBD, context_length: int = 2048) -> Path:
    """An `eagle3` draft (1 decoder layer, encoder `fc` over 3 target layers) for the tiny targets.

    aligned: own token embeddings / head built from the target's (see the module docstring).
    Random: width 64, no token embeddings and no head of its own (llama.cpp then uses the target's
    through `ctx_other`, as for Llama 3.1 8B EAGLE-3), every weight random.
    """
    import gguf

    vocab = vocab or bpe_vocab()
    n_tgt_in = len(target_layers) * n_embd_target
    n_embd = n_embd_target + 16 if aligned else n_embd_target
    n_head, n_ff = n_embd // 16, 128
    hd = n_embd // n_head

    def fill(tmp: Path) -> None:
        w = gguf.GGUFWriter(str(tmp), "eagle3")
        _common(w, "eagle3", vocab, n_embd, n_head, n_ff, context_length)
        w.add_array("eagle3.target_layers", [int(i) for i in target_layers])
        w.add_uint32("eagle3.target_hidden_size", n_embd_target)
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        t: dict[str, np.ndarray] = {}
        t["fc.weight"] = normal_weights((seed, 700), (n_embd, n_tgt_in), 1.0 / np.sqrt(n_tgt_in))
        s_in = 1.0 / np.sqrt(2 * n_embd)
        b = "blk.0."
        t[b + "attn_norm.weight"] = np.ones(n_embd, np.float32)
        t[b + "ffn_norm.weight"] = np.ones(n_embd, np.float32)
        t[b + "ffn_gate.weight"] = normal_weights((seed, 704), (n_ff, n_embd), 1.0 / np.sqrt(n_embd))
        t[b + "ffn_up.weight"] = normal_weights((seed, 705), (n_ff, n_embd), 1.0 / np.sqrt(n_embd))
        if aligned:
            embd, _, head = shared_weights(seed, vocab, n_embd_target, 4.0, True)
            const = n_embd_target  # the constant coordinate
            tok = np.zeros((vocab.size, n_embd), np.float32)
            tok[:, :n_embd_target] = embd
            # Large next to |embd| (~8): every token's normalised constant is then the same to
            # 0.3%, so the keys' sizes cannot outweigh RoPE's preference for distance 0.
            tok[:, const] = 64.0
            t["token_embd.weight"] = tok
            out = np.zeros((vocab.size, n_embd), np.float32)
            out[:, :n_embd_target] = head
            t["output.weight"] = out
            norm = np.zeros(n_embd, np.float32)
            norm[:n_embd_target] = 1.0
            t["output_norm.weight"] = norm
            w.add_bool("eagle3.norm_before_residual", True)
            t[b + "attn_norm_2.weight"] = np.full(n_embd, 0.01, np.float32)  # g: a small residual term
            wq, wk, wv = _self_attention_weights(n_embd_target, 2 * n_embd, n_head, hd, const, 2.0)
            t[b + "attn_q.weight"], t[b + "attn_k.weight"], t[b + "attn_v.weight"] = wq, wk, wv
            wo = np.zeros((n_embd, n_head * hd), np.float32)
            wo[np.arange(n_embd_target), np.arange(n_embd_target)] = 1.0
            t[b + "attn_output.weight"] = wo
            t[b + "ffn_down.weight"] = np.zeros((n_embd, n_ff), np.float32)
        else:
            t["output_norm.weight"] = np.ones(n_embd, np.float32)
            t[b + "attn_norm_2.weight"] = np.ones(n_embd, np.float32)
            for i, k in enumerate(("attn_q", "attn_k", "attn_v")):
                t[b + k + ".weight"] = normal_weights((seed, 710 + i), (n_head * hd, 2 * n_embd), s_in)
            t[b + "attn_output.weight"] = normal_weights((seed, 713), (n_embd, n_head * hd), 1.0 / np.sqrt(n_embd))
            t[b + "ffn_down.weight"] = normal_weights((seed, 714), (n_embd, n_ff), 1.0 / np.sqrt(n_ff))
        for name, a in t.items():
            w.add_tensor(name, a)
        finish_model(w)

    return atomic_write(path, fill)


def write_dflash_model(path: Path, *, aligned: bool = True, dspark: bool = False, vocab: Vocab | None = None,
                       seed: int = BASE_SEED, target_layers=(1, 2, 3), block_size: int = 8,
                       confidence_head: bool = True, context_length: int = 2048) -> Path:
    """A `dflash` draft (1 layer, non-causal block attention over injected target features);
    dspark=True adds DSpark's Markov head (markov_w1/markov_w2) and, with confidence_head, its
    confidence head (conf_proj), anchor-first blocks (sample_from_anchor).

    Width = the target's (llama.cpp sizes the feature input from the draft's own width).
    Random: no token embeddings and no head of its own (the target's, through ctx_other).
    """
    import gguf

    vocab = vocab or bpe_vocab()
    n_embd, n_head, n_ff = N_EMBD, 4, 128
    hd = n_embd // n_head
    n_in = len(target_layers) * n_embd

    def fill(tmp: Path) -> None:
        w = gguf.GGUFWriter(str(tmp), "dflash")
        _common(w, "dflash", vocab, n_embd, n_head, n_ff, context_length)
        w.add_array("dflash.target_layers", [int(i) for i in target_layers])
        w.add_uint32("dflash.block_size", block_size)
        w.add_uint32("tokenizer.ggml.mask_token_id", MASK_TOKEN_ID)
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        t: dict[str, np.ndarray] = {}
        t["fc.weight"] = normal_weights((seed, 800), (n_embd, n_in), 1.0 / np.sqrt(n_in))
        t["output_norm.weight"] = np.ones(n_embd, np.float32)
        b = "blk.0."
        t[b + "attn_norm.weight"] = np.ones(n_embd, np.float32)
        t[b + "ffn_norm.weight"] = np.ones(n_embd, np.float32)
        s = 1.0 / np.sqrt(n_embd)
        t[b + "attn_q.weight"] = normal_weights((seed, 801), (n_head * hd, n_embd), s)
        t[b + "attn_k.weight"] = normal_weights((seed, 802), (n_head * hd, n_embd), s)
        t[b + "ffn_gate.weight"] = normal_weights((seed, 804), (n_ff, n_embd), s)
        t[b + "ffn_up.weight"] = normal_weights((seed, 805), (n_ff, n_embd), s)
        embd, _, head = shared_weights(seed, vocab, n_embd, 4.0, True)
        if aligned:
            tok = embd.copy()
            tok[MASK_TOKEN_ID] = 0.0  # mask positions add nothing to the attention average
            t["token_embd.weight"] = tok
            t["output.weight"] = head * np.float32(0.05 if dspark else 1.0)  # DSpark: the Markov head leads
            t["enc.output_norm.weight"] = np.full(n_embd, 1e-3, np.float32)
            t[b + "attn_v.weight"] = np.eye(n_embd, dtype=np.float32)
            t[b + "attn_output.weight"] = np.eye(n_embd, dtype=np.float32)
            t[b + "attn_q_norm.weight"] = np.zeros(hd, np.float32)  # Q = K = 0: uniform attention
            t[b + "attn_k_norm.weight"] = np.zeros(hd, np.float32)
            t[b + "ffn_down.weight"] = np.zeros((n_embd, n_ff), np.float32)
        else:
            t["enc.output_norm.weight"] = np.ones(n_embd, np.float32)
            t[b + "attn_v.weight"] = normal_weights((seed, 803), (n_head * hd, n_embd), s)
            t[b + "attn_output.weight"] = normal_weights((seed, 806), (n_embd, n_head * hd), s)
            t[b + "attn_q_norm.weight"] = np.ones(hd, np.float32)
            t[b + "attn_k_norm.weight"] = np.ones(hd, np.float32)
            t[b + "ffn_down.weight"] = normal_weights((seed, 807), (n_embd, n_ff), 1.0 / np.sqrt(n_ff))
        if dspark:
            w.add_bool("dflash.sample_from_anchor", True)
            w.add_bool("dflash.has_confidence_head", confidence_head)
            if aligned:  # bias(prev) = head . norm(embd(prev)): the bigram target's logits
                w1 = embd / np.sqrt((embd ** 2).mean(axis=1, keepdims=True) + 1e-5)
                w2 = head
            else:
                w1 = normal_weights((seed, 810), (vocab.size, n_embd), 1.0)
                w2 = normal_weights((seed, 811), (vocab.size, n_embd), 1.0 / np.sqrt(n_embd))
            t["markov_w1.weight"] = w1.astype(np.float32)
            t["markov_w2.weight"] = w2.astype(np.float32)
            if confidence_head:
                t["conf_proj.weight"] = normal_weights((seed, 812), (1, 2 * n_embd), 0.01)
                t["conf_proj.bias"] = np.array([5.0], np.float32)  # confident: p ~ 0.99
        for name, a in t.items():
            w.add_tensor(name, a)
        finish_model(w)

    return atomic_write(path, fill)


SPEC_SET_NAMES = ("bigram_target", "eagle3", "eagle3_random", "dflash", "dflash_random", "dspark",
                  "dspark_random")


def make_spec_draft_set(outdir: Path, *, force: bool = False) -> dict[str, Path]:
    """Write (or reuse) the near-bigram target and the EAGLE-3 / DFlash / DSpark drafts in
    `outdir`; returns name -> path (SPEC_SET_NAMES). Aligned drafts pair with `bigram_target`,
    random ones with any tiny target (`make_tiny_set`'s `target` too: same vocabulary, width 64,
    4 layers)."""
    def write(paths: dict[str, Path]) -> None:
        write_bigram_target(paths["bigram_target"])
        write_eagle3_model(paths["eagle3"], aligned=True)
        write_eagle3_model(paths["eagle3_random"], aligned=False)
        write_dflash_model(paths["dflash"], aligned=True)
        write_dflash_model(paths["dflash_random"], aligned=False)
        write_dflash_model(paths["dspark"], aligned=True, dspark=True)
        write_dflash_model(paths["dspark_random"], aligned=False, dspark=True)

    return cached_set(outdir, SPEC_SET_NAMES, "tiny-spec-drafts.json",
                      generator_fingerprint(__file__, SPEC_SET_NAMES), write, force=force)
