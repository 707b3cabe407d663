"""Will the models and their KV cache fit in RAM? Checked before anything is allocated.

llama.cpp allocates the KV cache in one buffer and clears it, so a context size that does not
fit in memory ends in an OOM kill (or swapping the machine to a halt), not an error. Before
loading, `check_fits` adds up what the load will allocate on the host: the weights (the GGUF
tensor data: mmapped pages count against memory once touched), the f16 KV cache at the context
size (per layer from the `<arch>.*` hyperparameters, as runtime/offload.py computes it for the
GPU fit), the compute buffers and logits; the draft model's too, at the same context (its context
mirrors the target's). Against MemAvailable (/proc/meminfo; elsewhere os.sysconf's available
pages), or $LLAMASPEC_ASSUME_MEM_AVAILABLE (bytes, or with a K/M/G/T suffix) for tests and for
users who know better. Layers offloaded to a GPU are not in host memory: the check is made only
when everything stays on the CPU (-ngl 0, the CPU-only builds' auto); the GPU fit is offload.py's.

Nothing here imports llama_cpp.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from llamaspec.errors import ModelLoadError, UsageError

ENV_ASSUME = "LLAMASPEC_ASSUME_MEM_AVAILABLE"
CTX_PAD = 256   # llama.cpp pads the context to a multiple of 256 tokens


@dataclass(frozen=True)
class Needs:
    """Host bytes one load will allocate."""

    weights: int
    kv: int          # KV cache at n_ctx tokens
    other: int       # compute buffers and logits
    kv_per_token: int
    n_ctx: int

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.other


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def parse_size(text: str) -> int:
    """'1073741824', '512M', '1.5GiB', '2g' -> bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*", text, re.IGNORECASE)
    if not m:
        raise UsageError(f"${ENV_ASSUME} must be a size in bytes (or with K/M/G/T), not {text!r}")
    return int(float(m[1]) * 1024 ** " kmgt".index(m[2].lower() or " "))


def available_bytes() -> int | None:
    """Memory a new allocation can get without swapping or the OOM killer; None if unknown."""
    assumed = os.environ.get(ENV_ASSUME, "").strip()
    if assumed:
        return parse_size(assumed)
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _hparams(path: Path) -> tuple[dict, int]:
    """(general.* and <arch>.* scalars and short number arrays, vocabulary size) of a GGUF, read
    through a memory map: the token texts are never decoded (a full parse of a 262k vocabulary
    costs 0.3 s; this, milliseconds)."""
    import array
    import mmap

    from llamaspec.gguf.header import ARRAY_CODES, GGUF_MAGIC, SCALAR_TYPES, T_ARRAY, T_STRING, U32, U64
    from llamaspec.gguf.peek import skip_value, read_str   # the raw walkers of the header's fast path

    u32, u64 = U32.unpack_from, U64.unpack_from
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        if mm[:4] != GGUF_MAGIC:
            raise ValueError("not a GGUF")
        end, pos, arch = len(mm), 24, None
        kv: dict = {}
        n_vocab = 0
        for _ in range(u64(mm, 16)[0]):
            key, pos = read_str(mm, pos)
            vtype = u32(mm, pos)[0]
            pos += 4
            mine = key.startswith("general.") or (arch is not None and key.startswith(arch + "."))
            if key == "tokenizer.ggml.tokens" and vtype == T_ARRAY:
                n_vocab = u64(mm, pos + 4)[0]
                if f"{arch}.block_count" in kv:
                    break   # the <arch>.* keys come first (llama.cpp's writers): all that is needed
            if mine and vtype in SCALAR_TYPES:
                kv[key] = SCALAR_TYPES[vtype].unpack_from(mm, pos)[0]
            elif mine and vtype == T_STRING:
                kv[key] = read_str(mm, pos)[0]
                arch = kv.get("general.architecture", arch)
            elif mine and vtype == T_ARRAY and u32(mm, pos)[0] in ARRAY_CODES and u64(mm, pos + 4)[0] <= 65536:
                etype, count = u32(mm, pos)[0], u64(mm, pos + 4)[0]
                size = SCALAR_TYPES[etype].size
                kv[key] = array.array(ARRAY_CODES[etype], mm[pos + 12:pos + 12 + count * size]).tolist()
            pos = skip_value(mm, vtype, pos, end)
            if pos > end:
                raise ValueError("truncated")
    return {k[len(arch) + 1:]: v for k, v in kv.items() if arch and k.startswith(arch + ".")}, n_vocab


def _file_bytes(path: Path) -> int:
    """Bytes of a GGUF, all parts of a split one (name-00001-of-00003.gguf)."""
    m = re.fullmatch(r"(.*)-\d{5}-of-(\d{5})\.gguf", path.name)
    parts = [path.with_name(f"{m[1]}-{i:05d}-of-{m[2]}.gguf") for i in range(1, int(m[2]) + 1)] if m else [path]
    return sum(p.stat().st_size for p in parts if p.is_file())


def _biggest(v) -> int:
    return int(max(v, default=0) if isinstance(v, list) else (v or 0))


def model_needs(path: Path, n_ctx: int, *, load_nextn: bool = False) -> Needs:
    """What loading `path` with a context of n_ctx tokens allocates on the host: the file's tensor
    data (mapped), the f16 KV cache (runtime/offload.py's per-layer formula), one ubatch's compute
    buffer and logits (offload.py's allowance). load_nextn: the NextN/MTP layers are loaded and
    have a KV cache (llama.cpp skips them otherwise; their weights are in the file size either way)."""
    from llamaspec.runtime.offload import N_UBATCH, kv_bytes_per_layer

    hp, n_vocab = _hparams(Path(path))
    n_layers = int(hp.get("block_count") or 0)
    per_layer = kv_bytes_per_layer(lambda k, d=None: hp.get(k, d), n_layers, 1)
    n_nextn = 0 if load_nextn else int(hp.get("nextn_predict_layers") or 0)
    kv_per_token = sum(per_layer[:n_layers - n_nextn])
    n_embd = int(hp.get("embedding_length") or 0)
    n_ff = _biggest(hp.get("feed_forward_length")) or 4 * n_embd
    other = 4 * N_UBATCH * (4 * n_embd + 2 * n_ff) + 4 * N_UBATCH * int(n_vocab or hp.get("vocab_size") or 0)
    return Needs(_file_bytes(Path(path)), kv_per_token * n_ctx, other, kv_per_token, n_ctx)


def context_length(path: Path) -> int:
    """The training context a GGUF declares (0 if none)."""
    return int(_hparams(Path(path))[0].get("context_length") or 0)


def padded(n_ctx: int) -> int:
    return -(-max(1, n_ctx) // CTX_PAD) * CTX_PAD


def check_fits(target: Path, draft: Path | None, *, n_ctx: int, given: int | None, n_seq: int = 1,
               load_mtp: bool = False, available: int | None = None) -> Needs | None:
    """Raise ModelLoadError when the target (and draft) with n_ctx tokens per sequence for n_seq
    sequences will not fit in the memory available. `given`: the -c the user gave (None: the
    default), for the message. Returns the target's needs (None when the header cannot be read:
    the load that follows reports that)."""
    avail = available_bytes() if available is None else available
    n_seq = max(1, n_seq)
    try:
        t = model_needs(target, n_ctx * n_seq, load_nextn=load_mtp)
        d = model_needs(draft, n_ctx * n_seq) if draft is not None else None
    except Exception:  # noqa: BLE001 - a bad header: the load that follows names the problem precisely
        return None
    if avail is None:
        return t
    total = t.total + (d.total if d else 0)
    if total <= avail:
        return t
    from llamaspec.gguf.header import read_file, require_data

    for p in (target, draft):   # absurd sizes from a damaged header: that file's own error, not this one
        if p is not None:
            require_data(read_file(p))
    fixed = t.weights + t.other + (d.weights + d.other if d else 0)
    per_token = t.kv_per_token + (d.kv_per_token if d else 0)
    fit = (avail - fixed) // (per_token * n_seq) if per_token and avail > fixed else 0
    fit = fit // CTX_PAD * CTX_PAD
    what = (f"-c {given}" if given else f"a context of {n_ctx:,} tokens") + (f" x {n_seq} sequences" if n_seq > 1 else "")
    kv = t.kv + (d.kv if d else 0)
    weights = t.weights + (d.weights if d else 0)
    parts = f"KV cache {_human(kv)} + weights {_human(weights)} + buffers {_human(total - kv - weights)}"
    if fit >= CTX_PAD:
        hint = f"use a smaller -c/--ctx-size: about {fit:,} tokens fit"
    else:
        hint = "the weights alone do not fit: free memory, or use a smaller model or quantization"
    raise ModelLoadError(f"not enough memory for {what}: it needs {_human(total)} ({parts}), "
                         f"{_human(avail)} available", hint)


def uses_gpu() -> bool:
    """Would -ngl auto put layers on a GPU here? (Then host memory is not what limits the load.)"""
    from llamaspec.runtime import devices, offload

    p = devices.probe()
    return bool(p.gpu_offload and offload.model_devices(p.devices))


def check_load(target: Path, draft: Path | None, *, n_ctx: int | None, default_ctx: int, n_seq: int = 1,
               load_mtp: bool = False, on_gpu: bool | None = None) -> None:
    """check_fits for a load as speculative/pipeline.py sizes its context from -c (None: default_ctx
    capped at the training context; 0: the training context). Skipped when layers go to a GPU
    (on_gpu None: probe), and when the header cannot be read (the load names the problem)."""
    if on_gpu if on_gpu is not None else uses_gpu():
        return
    from llamaspec.runtime.devices import context_tokens

    try:
        train = context_length(Path(target))
    except Exception:  # noqa: BLE001 - a bad header: the load names the problem precisely
        return
    check_fits(Path(target), Path(draft) if draft else None, n_ctx=padded(context_tokens(train, n_ctx, default_ctx)),
               given=n_ctx, n_seq=n_seq, load_mtp=load_mtp)
