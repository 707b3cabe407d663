"""How many layers of the target and the draft go to the GPU when -ngl/-ngld are not given. Pure:
plain data in (devices and their free memory, byte sizes from GGUF headers), a decision out.

llama.cpp decides this in common/fit.cpp (`--fit on`, its default), which is not in libllama and
measures memory with no-alloc loads and a C++-only breakdown. This module re-does the decision:
- the GPU devices a model uses are llama.cpp's: every discrete GPU, else the integrated GPUs of one
  backend (llama.cpp's `llama_model_load_from_file_impl`); CPU and ACCEL devices hold no layers;
- n_gpu_layers counts the block_count repeating layers plus one output layer, taken from the output
  end: N puts the output layer and the last N-1 blocks on the GPU; token embeddings stay on the CPU;
- a layer's need is its weights plus its f16 KV cache at the context size (offload_kqv); the device
  holding the output layer also holds the logits; each device with layers gets a compute allowance;
- every device keeps a margin free (fit.cpp: 1 GiB per device), system memory is taken as unlimited;
- the draft is fitted alongside the target the way fit.cpp fits its "extra model": counted at its own
  setting (all layers unless -ngld is given) and the target gets the largest N that fits beside it.
Simplifications, all erring towards fewer layers: only whole layers (no MoE expert overflow to the
CPU, fit.cpp's steps 3-4), no context shrinking (llamaspec's default context is 4096, not the
training one), every attention layer's KV at the full context (SWA windows not subtracted), and
with several GPUs the layers are split by free memory, llama.cpp's default when only n_gpu_layers is
set (fit.cpp also sets tensor_split). One guess errs the other way: the compute allowance assumes
flash attention (llama.cpp's auto turns it on for CUDA, Metal, Vulkan); without it a ubatch's KQ
scores come on top, which the 1 GiB margin absorbs at common sizes. Extension: a draft that does
not fit entirely is cut down instead of left to fail (fit.cpp would keep it whole).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass

GIB = 1 << 30
MIB = 1 << 20
DEFAULT_MARGIN = GIB      # fit.cpp's fit_params_target: memory left free on every device
N_UBATCH = 512            # runtime.context.ContextConfig.n_batch (= n_ubatch)
F16 = 2                   # bytes per KV cache element (llama.cpp's default cache type)
GPU_TYPES = ("GPU", "IGPU")

_BLK = re.compile(r"blk\.(\d+)\.")
_OUTPUT = ("output.", "output_norm.")


@dataclass(frozen=True)
class Device:
    """One ggml backend device. free/total in bytes (0/0: the device reports no memory)."""

    name: str
    type: str                 # CPU, GPU, IGPU, ACCEL
    free: int = 0
    total: int = 0
    description: str = ""
    backend: str = ""         # the backend registry's name (CUDA, Metal, Vulkan, ...)


@dataclass(frozen=True)
class ModelNeeds:
    """Device memory a model needs per llama.cpp layer, from its GGUF header (bytes)."""

    layers: tuple[int, ...]   # per repeating layer (blk.N): weights + KV cache
    output: int               # the output layer: output_norm, output (or a copy of token_embd) + logits
    compute: int = 0          # compute buffer allowance on each device that holds layers
    name: str = ""

    @property
    def n_max(self) -> int:
        """n_gpu_layers that offloads everything (llama.cpp: block_count + 1)."""
        return len(self.layers) + 1


@dataclass(frozen=True)
class OffloadDecision:
    n_gpu_layers: int            # target (what Model gets)
    n_gpu_layers_draft: int      # draft
    reason: str                  # one line for `run -v` and `doctor`
    target_auto: bool = True     # False: -ngl was given and is kept
    draft_auto: bool = True
    devices: tuple[Device, ...] = ()    # the GPU devices the layers go to
    used: tuple[int, ...] = ()          # projected bytes per device (target + draft)
    target_max: int | None = None       # n_gpu_layers that is "all" for the target
    draft_max: int | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["devices"] = [asdict(x) for x in self.devices]
        d["used"] = list(self.used)
        return d


def gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def model_devices(devices: Sequence[Device]) -> tuple[Device, ...]:
    """The devices llama.cpp puts layers on: the GPUs, else the iGPUs of the first iGPU's backend."""
    gpus = tuple(d for d in devices if d.type == "GPU")
    if gpus:
        return gpus
    igpus = [d for d in devices if d.type == "IGPU"]
    return tuple(d for d in igpus if d.backend == igpus[0].backend) if igpus else ()


def layer_devices(n_layers: int, n_gpu_layers: int, weights: Sequence[int]) -> list[int | None]:
    """Device index of each of the n_layers + 1 layers (last: output), None for the CPU.

    llama.cpp's load_tensors: layers from n_layers + 1 - N up are offloaded, split over the devices
    in proportion to `weights` (free memory: its default split)."""
    total = n_layers + 1
    n = total if n_gpu_layers < 0 else min(n_gpu_layers, total)
    if n <= 0 or not weights:
        return [None] * total
    s = float(sum(weights)) or 1.0
    acc, splits = 0.0, []
    for w in weights:
        acc += w
        splits.append(acc / s)
    start = total - n
    out: list[int | None] = [None] * start
    for il in range(start, total):
        frac = (il - start) / n
        out.append(min(next((i for i, x in enumerate(splits) if x > frac), len(weights) - 1), len(weights) - 1))
    return out


def usage(model: ModelNeeds | None, n_gpu_layers: int, weights: Sequence[int]) -> list[int]:
    """Bytes per device for `model` at `n_gpu_layers` (zeros for None)."""
    used = [0] * len(weights)
    if model is None:
        return used
    where = layer_devices(len(model.layers), n_gpu_layers, weights)
    sizes = list(model.layers) + [model.output]
    for dev, size in zip(where, sizes):
        if dev is not None:
            used[dev] += size
    for dev in {d for d in where if d is not None}:
        used[dev] += model.compute
    return used


def _fits(used: Sequence[int], budgets: Sequence[int]) -> bool:
    return all(u <= b for u, b in zip(used, budgets))


def _add(a: Sequence[int], b: Sequence[int]) -> list[int]:
    return [x + y for x, y in zip(a, b)]


def _largest_fit(model: ModelNeeds, beside: Sequence[int], weights: Sequence[int], budgets: Sequence[int]) -> int:
    """The largest n_gpu_layers whose memory, added to `beside`, fits every budget (0 if none)."""
    for n in range(model.n_max, 0, -1):
        if _fits(_add(usage(model, n, weights), beside), budgets):
            return n
    return 0


def _count(n: int, model: ModelNeeds | None) -> str:
    if model is None:
        return "all" if n < 0 else str(n)
    full = model.n_max
    return f"{full}/{full}" if n < 0 or n >= full else f"{n}/{full}"


def decide(devices: Sequence[Device], target: ModelNeeds | None, draft: ModelNeeds | None = None, *,
           n_gpu_layers: int | None = None, n_gpu_layers_draft: int | None = None, gpu_offload: bool = True,
           margin: int = DEFAULT_MARGIN, target_loaded: bool = False, has_draft: bool = False) -> OffloadDecision:
    """n_gpu_layers for the target and the draft. None means auto; a given value is never changed.

    devices: every ggml device (CPU ones are ignored). target / draft: their needs; None when the
    model is not placed by this decision (no draft, or target_loaded: a target already in memory,
    whose layers are out of the free memory already). gpu_offload: llama_supports_gpu_offload().
    has_draft: a draft will load though its needs were not read (no GPU: -ngld is shown anyway)."""
    t_auto, d_auto = n_gpu_layers is None, n_gpu_layers_draft is None
    gpus = model_devices(devices) if gpu_offload else ()
    base = dict(target_auto=t_auto, draft_auto=d_auto, devices=gpus,
                target_max=target.n_max if target else None, draft_max=draft.n_max if draft else None)
    labels = functools.partial(_labels, t_auto=t_auto, d_auto=d_auto, target=target, draft=draft,
                               target_loaded=target_loaded, has_draft=has_draft)
    if not t_auto and not d_auto:
        return OffloadDecision(n_gpu_layers, n_gpu_layers_draft, labels(n_gpu_layers, n_gpu_layers_draft), **base)
    if not any(d.free > 0 or d.total > 0 for d in gpus):
        why = ("no GPU device (CPU-only llama.cpp build)" if not gpu_offload
               else "no GPU device among ggml's devices" if not gpus
               else "the GPU devices report no memory (llama.cpp's fit skips them too)")
        t = 0 if t_auto else n_gpu_layers
        d = 0 if d_auto else n_gpu_layers_draft
        return OffloadDecision(t, d, f"{why}: {labels(t, d)}", **base)

    weights = [d.free for d in gpus]
    budgets = [d.free - margin if (d.free or d.total) else -1 for d in gpus]
    # fit.cpp: the extra (draft) model is measured at its own setting, all layers by default, and
    # the target is fitted beside it. When the target was given, the draft fits around it instead.
    t_fixed = usage(target, n_gpu_layers, weights) if not t_auto else [0] * len(gpus)
    if d_auto:
        if draft is None:
            d = 0
        elif _fits(_add(usage(draft, -1, weights), t_fixed), budgets):
            d = draft.n_max
        else:
            d = _largest_fit(draft, t_fixed, weights, budgets)
    else:
        d = n_gpu_layers_draft
    d_used = usage(draft, d, weights)
    if t_auto:
        t = 0 if target is None else _largest_fit(target, d_used, weights, budgets)
    else:
        t = n_gpu_layers
    used = tuple(_add(usage(target, t, weights), d_used))
    where = ", ".join(f"{g.name} {gib(u)} of {gib(g.free)} free" for g, u in zip(gpus, used))
    return OffloadDecision(t, d, f"{labels(t, d)}; projected {where} (margin {gib(margin)} per device)",
                           **base, used=used)


def _labels(t: int, d: int, *, t_auto: bool, d_auto: bool, target: ModelNeeds | None,
            draft: ModelNeeds | None, target_loaded: bool, has_draft: bool) -> str:
    parts = (["target already loaded"] if target_loaded
             else [f"-ngl {_count(t, target)} ({'auto' if t_auto else 'given'})"])
    if draft is not None or has_draft or not d_auto:
        parts.append(f"-ngld {_count(d, draft)} ({'auto' if d_auto else 'given'})")
    return ", ".join(parts)


def auto_summary(devices: Sequence[Device], gpu_offload: bool, margin: int = DEFAULT_MARGIN) -> str:
    """What -ngl/-ngld auto does on this machine, before any model is known (`doctor`)."""
    gpus = [d for d in model_devices(devices) if d.free > 0 or d.total > 0] if gpu_offload else []
    if not gpus:
        return "auto: -ngl 0 -ngld 0 (no GPU device: CPU-only llama.cpp build)"
    room = ", ".join(f"{d.name} {gib(max(0, d.free - margin))}" for d in gpus)
    return (f"auto: the draft, then as many target layers as fit in {room} "
            f"(free memory minus a {gib(margin)} margin); run -v shows the numbers per model")


# ---- needs from a GGUF header ----------------------------------------------------------------


def tensor_bytes(header) -> dict[str, int]:
    """Bytes of each tensor of one GGUF file: the distance to the next tensor's data (alignment
    padding included, a few bytes), the last one to the end of the file."""
    align = int(header.metadata.get("general.alignment", 32) or 32)
    data_start = -(-header.bytes_read // align) * align
    ts = sorted(header.tensors, key=lambda t: t.offset)
    out: dict[str, int] = {}
    for i, t in enumerate(ts):
        if i + 1 < len(ts):
            out[t.name] = ts[i + 1].offset - t.offset
        elif header.file_size:
            out[t.name] = max(0, header.file_size - data_start - t.offset)
        else:  # no file size (a stream): assume 16-bit weights
            out[t.name] = 2 * t.n_elements
    return out


def _per_layer(value, il: int, default):
    if isinstance(value, (list, tuple)) or hasattr(value, "tolist"):
        seq = list(value)
        return seq[il] if il < len(seq) else default
    return default if value is None else value


def kv_bytes_per_layer(arch_get, n_layers: int, n_ctx: int) -> list[int]:
    """f16 K+V cache bytes of each layer at n_ctx tokens, from `<arch>.*` hyperparameters.

    arch_get: GGUFHeader.arch_get. MLA models (attention.kv_lora_rank) cache the compressed latent
    and the rope part; per-layer head counts of 0 (recurrent layers) cache nothing here."""
    n_embd = int(arch_get("embedding_length", 0) or 0)
    heads, heads_kv = arch_get("attention.head_count", 0), arch_get("attention.head_count_kv")
    kv_lora = arch_get("attention.kv_lora_rank")
    out = []
    for il in range(n_layers):
        if kv_lora:
            per_tok = int(kv_lora) + int(arch_get("rope.dimension_count", 0) or 0)
        else:
            h = int(_per_layer(heads, il, 0) or 0)
            hkv = int(_per_layer(heads_kv, il, h) if heads_kv is not None else h)
            k = int(arch_get("attention.key_length", 0) or (n_embd // h if h else 0))
            v = int(arch_get("attention.value_length", 0) or k)
            per_tok = hkv * (k + v)
        out.append(F16 * n_ctx * per_tok)
    return out


def needs_from_headers(headers: Sequence, *, n_ctx: int, load_nextn: bool = False,
                       n_ubatch: int = N_UBATCH) -> ModelNeeds:
    """ModelNeeds of a model (its GGUF header, and those of its other split parts) at n_ctx tokens.

    load_nextn: the NextN/MTP blocks are loaded (their weights and KV count); without it llama.cpp
    skips them, so they cost nothing though they keep their layer index."""
    first = headers[0]
    n_layers = int(first.block_count or 0)
    n_nextn = first.nextn_predict_layers
    sizes: dict[str, int] = {}
    for h in headers:
        sizes.update(tensor_bytes(h))
    layers = [0] * n_layers
    output = 0
    for name, size in sizes.items():
        m = _BLK.match(name)
        if m and int(m.group(1)) < n_layers:
            layers[int(m.group(1))] += size
        elif name.startswith(_OUTPUT):
            output += size
    if not any(n.startswith("output.") for n in sizes):  # tied embeddings: llama.cpp duplicates them
        output += sum(s for n, s in sizes.items() if n.startswith("token_embd."))
    kv = kv_bytes_per_layer(first.arch_get, n_layers, n_ctx)
    for il in range(n_layers):
        if il >= n_layers - n_nextn and not load_nextn:
            layers[il] = 0
        else:
            layers[il] += kv[il]
    n_embd = int(first.arch_get("embedding_length", 0) or 0)
    n_ff = _per_layer(first.arch_get("feed_forward_length", 0), 0, 0) or 4 * n_embd
    n_vocab = len(first.get("tokenizer.ggml.tokens", []) or []) or int(first.arch_get("vocab_size", 0) or 0)
    # f32 activations of one ubatch (the few live at once: residual, norms, q/k/v, ffn up/gate),
    # and the logits on the output layer's device. Checked on SmolLM2-135M F16 at 4096 tokens (CPU):
    # llama.cpp reports weights 256.6 MiB, KV 90.0 MiB, compute 98.3 MiB; this gives 256.6, 90.0
    # and 106.5 MiB (10.5 + 96 for the logits).
    compute = 4 * n_ubatch * (4 * n_embd + 2 * int(n_ff))
    output += 4 * n_ubatch * n_vocab
    return ModelNeeds(tuple(layers), output, compute, name=str(first.source))
