"""Tiny recurrent (`mamba`) GGUFs for tests of checkpoint rollback.

llama.cpp cannot remove the tail of a Mamba sequence (`llama_memory_seq_rm` returns False: its
state is one vector per sequence, not one entry per position, and `mamba` is not among the
architectures with per-token snapshots), so the engine must roll back a partially accepted draft
by restoring a sequence checkpoint. These models make that path testable in milliseconds.

Metadata (prefix `mamba.`, read by src/models/mamba.cpp): context_length, embedding_length,
block_count, ssm.conv_kernel, ssm.inner_size (must be 2 x embedding_length), ssm.state_size,
ssm.time_step_rank, attention.layer_norm_rms_epsilon; feed_forward_length and
attention.head_count are written as 0 like convert_hf_to_gguf.py does. Tensors per block
(numpy shapes, the reverse of ggml's): attn_norm (n_embd), ssm_in (2*d_inner, n_embd),
ssm_conv1d.weight (d_inner, d_conv) + .bias (d_inner), ssm_x (dt_rank + 2*d_state, d_inner),
ssm_dt.weight (d_inner, dt_rank) + .bias (d_inner), ssm_a (d_inner, d_state; A = -exp(A_log), no
".weight" suffix), ssm_d (d_inner, no suffix), ssm_out (n_embd, d_inner); plus token_embd,
output_norm, output.

The vocabulary, embeddings, output norm and head are the ones the attention tiny models use
(`tiny_models.bpe_vocab`, `shared_weights`), so tokenize/detokenize work on real text. As in the
attention set, models with the same seed share every block weight and differ only by depth and
`layer_scales`: a 1-layer draft agrees with a 2-layer target most of the time but not always, so
speculation sees full, partial and zero acceptances.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from llamaspec.testing.tiny_models import (
    Vocab, atomic_write, finish_model, normal_weights, shared_weights, bpe_vocab, cached_set, generator_fingerprint,
)

GENERATOR_VERSION = 1


def _mamba_block(seed: int, il: int, n_embd: int, d_inner: int, d_state: int, d_conv: int, dt_rank: int,
                 scale: float) -> dict[str, np.ndarray]:
    """One Mamba block; a function of (seed, il) and `scale` only, so a draft's layer 0 == the target's."""
    s = (seed, 500 + il)
    # Time steps log-uniform in [1e-3, 1e-1] as in Mamba's init; the bias is softplus^-1(dt).
    # Small steps make the state decay slowly: tokens far back still move the logits.
    dt = np.exp(np.random.default_rng(list(s) + [7]).uniform(np.log(1e-3), np.log(1e-1), d_inner))
    dt_bias = np.log(np.expm1(dt)).astype(np.float32)
    a_log = np.log(np.tile(np.arange(1, d_state + 1, dtype=np.float32), (d_inner, 1)))
    return {
        "attn_norm.weight": np.ones(n_embd, np.float32),
        "ssm_in.weight": normal_weights(s + (0,), (2 * d_inner, n_embd), 1.0 / np.sqrt(n_embd)),
        "ssm_conv1d.weight": normal_weights(s + (1,), (d_inner, d_conv), 1.0 / np.sqrt(d_conv)),
        "ssm_conv1d.bias": np.zeros(d_inner, np.float32),
        "ssm_x.weight": normal_weights(s + (2,), (dt_rank + 2 * d_state, d_inner), 1.0 / np.sqrt(d_inner)),
        "ssm_dt.weight": normal_weights(s + (3,), (d_inner, dt_rank), 1.0 / np.sqrt(dt_rank)),
        "ssm_dt.bias": dt_bias,
        "ssm_a": (-np.exp(a_log)).astype(np.float32),
        "ssm_d": np.ones(d_inner, np.float32),
        "ssm_out.weight": normal_weights(s + (4,), (n_embd, d_inner), 1.0 / np.sqrt(d_inner)) * np.float32(scale),
    }


def write_mamba_model(
    path: Path,
    *,
    n_layer: int,
    vocab: Vocab | None = None,
    seed: int = 2468,
    n_embd: int = 64,
    d_state: int = 16,
    d_conv: int = 4,
    dt_rank: int | None = None,
    context_length: int = 2048,
    layer_scales: Sequence[float] | None = None,
    head_scale: float = 4.0,
    name: str = "tiny-mamba",
) -> Path:
    """Write a `mamba`-architecture GGUF (F32) with random weights; d_inner is 2 * n_embd (the only
    expansion factor llama.cpp supports). layer_scales[i] multiplies layer i's ssm_out."""
    import gguf

    vocab = vocab or bpe_vocab()
    d_inner = 2 * n_embd
    dt_rank = dt_rank or -(-n_embd // 16)
    scales = list(layer_scales) if layer_scales is not None else [1.0] * n_layer
    assert len(scales) == n_layer, "one scale per layer"

    def fill(tmp: Path) -> None:
        w = gguf.GGUFWriter(str(tmp), "mamba")
        w.add_name(name)
        w.add_context_length(context_length)
        w.add_embedding_length(n_embd)
        w.add_feed_forward_length(0)  # unused; convert_hf_to_gguf.py writes 0 too
        w.add_head_count(0)
        w.add_block_count(n_layer)
        w.add_ssm_conv_kernel(d_conv)
        w.add_ssm_inner_size(d_inner)
        w.add_ssm_state_size(d_state)
        w.add_ssm_time_step_rank(dt_rank)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_ssm_dt_b_c_rms(False)
        w.add_vocab_size(vocab.size)
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        vocab.write_to(w)
        embd, out_norm, head = shared_weights(seed, vocab, n_embd, head_scale, True)
        w.add_tensor("token_embd.weight", embd)
        w.add_tensor("output_norm.weight", out_norm)
        w.add_tensor("output.weight", head)
        for il in range(n_layer):
            for k, t in _mamba_block(seed, il, n_embd, d_inner, d_state, d_conv, dt_rank, scales[il]).items():
                w.add_tensor(f"blk.{il}.{k}", np.ascontiguousarray(t, dtype=np.float32))
        finish_model(w)

    return atomic_write(path, fill)


# ---- the recurrent set -------------------------------------------------------------------------

BASE_SEED = 2468
TARGET_LAYERS = 2
EXTRA_LAYER_SCALE = 0.5

RECURRENT_SET = {
    # the target: recurrent, so the engine rolls back by checkpoint
    "target": dict(n_layer=TARGET_LAYERS, seed=BASE_SEED, layer_scales=[1.0] + [EXTRA_LAYER_SCALE] * (TARGET_LAYERS - 1),
                   name="tiny-mamba-target"),
    # the same weights: every draft token is accepted
    "same": dict(n_layer=TARGET_LAYERS, seed=BASE_SEED, layer_scales=[1.0] + [EXTRA_LAYER_SCALE] * (TARGET_LAYERS - 1),
                 name="tiny-mamba-same"),
    # the target's first layer alone: usually agrees, sometimes not (partial acceptances)
    "draft": dict(n_layer=1, seed=BASE_SEED, name="tiny-mamba-draft"),
    # other weights entirely: nearly every draft is rejected
    "other": dict(n_layer=1, seed=BASE_SEED + 1, name="tiny-mamba-other"),
}


def make_recurrent_set(outdir: Path, *, force: bool = False) -> dict[str, Path]:
    """Write (or reuse) the tiny mamba models in `outdir`; returns name -> path (keys of RECURRENT_SET)."""
    def write(paths: dict[str, Path]) -> None:
        for name, kw in RECURRENT_SET.items():
            write_mamba_model(paths[name], **kw)

    return cached_set(outdir, list(RECURRENT_SET), "recurrent-set.json",
                      generator_fingerprint(__file__, list(RECURRENT_SET)), write, force=force)
