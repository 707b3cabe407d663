"""A tiny Gemma 4 target and a matching tiny Gemma 4 "assistant" (MTP heads in a file of their own).

llama.cpp (src/models/gemma4.cpp, gemma4-assistant.cpp) runs the assistant in a context of type MTP
linked to the target's (`ctx_other`): it has no K/V projections and attends on the target's KV
cache (its sliding-window layers on the target's layer n_layer-2, its full layers on n_layer-1),
embeds tokens with the *target's* token_embd (x sqrt(n_embd_target)), concatenates the target's
post-norm hidden state h, and projects [embd ; h] (2 x n_embd_target) to its own width with
`nextn.pre_projection`; its logits come from its own token_embd, and `nextn.post_projection` maps
its last hidden state back to the target's width (the h of the next draft step). Its metadata:
`gemma4-assistant.embedding_length_out` = the target's width (must differ from its own),
`nextn_predict_layers` = block_count, a sliding-window pattern with at least one SWA layer, and the
target's head sizes (key_length / key_length_swa).

`aligned=True` makes drafts agree with the target: the target's token embeddings live in the first
`n_embd_asst` dimensions, its blocks only nudge the residual stream (post-norm weights 0.05), so its
next token is ~ a function of the current token; the assistant projects exactly those dimensions
(pre_projection = [I | 0] over the embedding half) and scores with the target's head restricted to
them. Random weights (aligned=False) still give lossless output, with few accepted tokens.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llamaspec.testing.tiny_models import (
    Vocab, atomic_write, finish_model, normal_weights, shared_weights, bpe_vocab, cached_set, generator_fingerprint,
)

__all__ = ["write_gemma4_target", "write_gemma4_assistant", "make_assistant_set", "ASSISTANT_SET"]

N_EMBD, N_EMBD_ASST, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF = 64, 32, 4, 2, 16, 128
SWA_WINDOW = 1 << 14        # larger than any test context: SWA layers see everything
NUDGE = 0.01                # post-norm weight of the target's blocks in the aligned variant


def _common(w, arch: str, *, n_embd: int, n_layer: int, swa: list[bool], vocab: Vocab, name: str) -> None:
    import gguf

    w.add_name(name)
    w.add_context_length(4096)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_layer_norm_rms_eps(1e-6)
    for key in ("attention.key_length", "attention.value_length", "attention.key_length_swa",
                "attention.value_length_swa"):
        w.add_uint32(f"{arch}.{key}", HEAD_DIM)
    w.add_uint32(f"{arch}.attention.sliding_window", SWA_WINDOW)
    w.add_array(f"{arch}.attention.sliding_window_pattern", swa)
    w.add_rope_freq_base(10000.0)
    w.add_float32(f"{arch}.rope.freq_base_swa", 10000.0)
    w.add_vocab_size(vocab.size)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    vocab.write_to(w)


def _ones(n: int, value: float = 1.0) -> np.ndarray:
    return np.full(n, value, np.float32)


def write_gemma4_target(path: Path, *, vocab: Vocab | None = None, seed: int = 77, n_layer: int = 4,
                        aligned: bool = True, name: str = "tiny-gemma4") -> Path:
    """A `gemma4` target: layers alternate SWA / full, the last one full (the assistant reads
    layers n_layer-2 (SWA) and n_layer-1 (full)); no per-layer embeddings, no shared-KV layers."""
    import gguf

    vocab = vocab or bpe_vocab()
    swa = [i % 2 == n_layer % 2 for i in range(n_layer)]   # ..., SWA, full
    nudge = NUDGE if aligned else 1.0

    def fill(tmp: Path) -> None:
        w = gguf.GGUFWriter(str(tmp), "gemma4")
        _common(w, "gemma4", n_embd=N_EMBD, n_layer=n_layer, swa=swa, vocab=vocab, name=name)
        w.add_uint32("gemma4.embedding_length_per_layer_input", 0)
        embd, out_norm, head = shared_weights(seed, vocab, N_EMBD, 4.0, True)
        if aligned:  # the token identity lives in the first N_EMBD_ASST dimensions only
            embd[:, N_EMBD_ASST:] = 0.0
            head[:, N_EMBD_ASST:] = 0.0
        w.add_tensor("token_embd.weight", embd)
        w.add_tensor("output_norm.weight", out_norm)
        w.add_tensor("output.weight", head)
        w.add_tensor("rope_freqs.weight", _ones(HEAD_DIM // 2))
        s_in, s_ff = 1.0 / np.sqrt(N_EMBD), 1.0 / np.sqrt(N_FF)
        for il in range(n_layer):
            r = (seed, 100 + il)
            t = {"attn_norm": _ones(N_EMBD), "attn_q": normal_weights(r + (0,), (N_HEAD * HEAD_DIM, N_EMBD), s_in),
                 "attn_k": normal_weights(r + (1,), (N_HEAD_KV * HEAD_DIM, N_EMBD), s_in),
                 "attn_v": normal_weights(r + (2,), (N_HEAD_KV * HEAD_DIM, N_EMBD), s_in),
                 "attn_output": normal_weights(r + (3,), (N_EMBD, N_HEAD * HEAD_DIM), s_in),
                 "attn_q_norm": _ones(HEAD_DIM), "attn_k_norm": _ones(HEAD_DIM),
                 "post_attention_norm": _ones(N_EMBD, nudge), "ffn_norm": _ones(N_EMBD),
                 "ffn_gate": normal_weights(r + (4,), (N_FF, N_EMBD), s_in), "ffn_up": normal_weights(r + (5,), (N_FF, N_EMBD), s_in),
                 "ffn_down": normal_weights(r + (6,), (N_EMBD, N_FF), s_ff), "post_ffw_norm": _ones(N_EMBD, nudge)}
            for k, v in t.items():
                w.add_tensor(f"blk.{il}.{k}.weight", v)
        finish_model(w)

    return atomic_write(path, fill)


def write_gemma4_assistant(path: Path, *, vocab: Vocab | None = None, target_seed: int = 77, seed: int = 78,
                           n_layer: int = 2, aligned: bool = True, n_embd_out: int = N_EMBD,
                           name: str = "tiny-gemma4-assistant") -> Path:
    """A `gemma4-assistant` for write_gemma4_target(seed=target_seed): n_layer MTP layers (SWA
    first, the last full), width N_EMBD_ASST, embedding_length_out = the target's width."""
    import gguf

    vocab = vocab or bpe_vocab()
    swa = [i < n_layer - 1 for i in range(n_layer)]
    nudge = NUDGE if aligned else 1.0

    def fill(tmp: Path) -> None:
        w = gguf.GGUFWriter(str(tmp), "gemma4-assistant")
        _common(w, "gemma4-assistant", n_embd=N_EMBD_ASST, n_layer=n_layer, swa=swa, vocab=vocab, name=name)
        w.add_uint32("gemma4-assistant.embedding_length_out", n_embd_out)
        w.add_uint32("gemma4-assistant.nextn_predict_layers", n_layer)
        _, _, head = shared_weights(target_seed, vocab, N_EMBD, 4.0, True)
        if aligned:
            tok = head[:, :N_EMBD_ASST].copy()            # the target's head over the shared dimensions
            pre = np.zeros((N_EMBD_ASST, 2 * n_embd_out), np.float32)
            pre[:, :N_EMBD_ASST] = np.eye(N_EMBD_ASST, dtype=np.float32)   # [I | 0 ; 0]: the token's embedding
        else:
            tok = normal_weights((seed, 0), (vocab.size, N_EMBD_ASST), 1.0)
            pre = normal_weights((seed, 1), (N_EMBD_ASST, 2 * n_embd_out), 1.0 / np.sqrt(2 * n_embd_out))
        w.add_tensor("token_embd.weight", tok)
        w.add_tensor("output_norm.weight", _ones(N_EMBD_ASST))
        w.add_tensor("nextn.pre_projection.weight", pre)
        w.add_tensor("nextn.post_projection.weight",
                     normal_weights((seed, 2), (n_embd_out, N_EMBD_ASST), 1.0 / np.sqrt(N_EMBD_ASST)))
        w.add_tensor("rope_freqs.weight", _ones(HEAD_DIM // 2))
        s_in, s_ff = 1.0 / np.sqrt(N_EMBD_ASST), 1.0 / np.sqrt(N_FF)
        for il in range(n_layer):
            r = (seed, 100 + il)
            t = {"attn_norm": _ones(N_EMBD_ASST), "attn_q": normal_weights(r + (0,), (N_HEAD * HEAD_DIM, N_EMBD_ASST), s_in),
                 "attn_output": normal_weights(r + (3,), (N_EMBD_ASST, N_HEAD * HEAD_DIM), 1.0 / np.sqrt(N_HEAD * HEAD_DIM)),
                 "attn_q_norm": _ones(HEAD_DIM), "post_attention_norm": _ones(N_EMBD_ASST, nudge),
                 "layer_output_scale": _ones(1), "ffn_norm": _ones(N_EMBD_ASST),
                 "ffn_gate": normal_weights(r + (4,), (N_FF, N_EMBD_ASST), s_in),
                 "ffn_up": normal_weights(r + (5,), (N_FF, N_EMBD_ASST), s_in),
                 "ffn_down": normal_weights(r + (6,), (N_EMBD_ASST, N_FF), s_ff), "post_ffw_norm": _ones(N_EMBD_ASST, nudge)}
            for k, v in t.items():
                w.add_tensor(f"blk.{il}.{k}.weight", v)
        finish_model(w)

    return atomic_write(path, fill)


#: the set's files: the target, its aligned and random assistants, and an assistant for a
#: target of another width (fails the hidden-size rule)
ASSISTANT_SET = ("gemma4_target", "gemma4_assistant", "gemma4_assistant_random", "gemma4_assistant_wide")


def make_assistant_set(outdir: Path, *, force: bool = False) -> dict[str, Path]:
    """Write (or reuse) ASSISTANT_SET in `outdir`; returns name -> path."""
    def write(paths: dict[str, Path]) -> None:
        write_gemma4_target(paths["gemma4_target"])
        write_gemma4_assistant(paths["gemma4_assistant"])
        write_gemma4_assistant(paths["gemma4_assistant_random"], aligned=False)
        write_gemma4_assistant(paths["gemma4_assistant_wide"], n_embd_out=2 * N_EMBD)

    return cached_set(outdir, ASSISTANT_SET, "assistant-set.json",
                      generator_fingerprint(__file__, ASSISTANT_SET), write, force=force)
