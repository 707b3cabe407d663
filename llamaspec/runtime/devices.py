"""ggml's devices and their free memory, and the -ngl/-ngld auto decision for models about to load.

llama-cpp-python binds none of ggml's device API (llama_cpp._ggml only opens the library), so the
few calls are bound here with ctypes on the libggml it installed, as info.py does. The decision
itself is offload.py (pure); this module gathers its inputs: devices, and GGUF header sizes, read
only when there is a GPU to put layers on.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass, replace
from pathlib import Path

from llamaspec.runtime import offload

_DEV_TYPES = {0: "CPU", 1: "GPU", 2: "IGPU", 3: "ACCEL"}   # enum ggml_backend_dev_type
_V, _SZ = ctypes.c_void_p, ctypes.c_size_t
_SIGNATURES = {
    "ggml_backend_dev_count": (_SZ, []),
    "ggml_backend_dev_get": (_V, [_SZ]),
    "ggml_backend_dev_name": (ctypes.c_char_p, [_V]),
    "ggml_backend_dev_description": (ctypes.c_char_p, [_V]),
    "ggml_backend_dev_type": (ctypes.c_int, [_V]),
    "ggml_backend_dev_memory": (None, [_V, ctypes.POINTER(_SZ), ctypes.POINTER(_SZ)]),
    "ggml_backend_dev_backend_reg": (_V, [_V]),
    "ggml_backend_reg_name": (ctypes.c_char_p, [_V]),
}


@functools.lru_cache(maxsize=1)
def _lib():
    import llama_cpp

    from llamaspec.runtime.info import lib_dir

    llama_cpp.llama_backend_init()   # registers the backends (and loads dynamic ones)
    d = lib_dir()
    found = sorted(d.glob("libggml.so*")) + sorted(d.glob("libggml.dylib")) + sorted(d.glob("ggml.dll"))
    if not found:
        raise OSError(f"no libggml in {d}")
    lib = ctypes.CDLL(str(found[0]))   # its dependencies (libggml-base) resolve the symbols too
    for name, (res, args) in _SIGNATURES.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    return lib


def gpu_offload_supported() -> bool:
    import llama_cpp

    return bool(llama_cpp.llama_supports_gpu_offload())


def probe_devices() -> tuple[offload.Device, ...]:
    """Every ggml device with its free/total memory now (not cached: free memory changes)."""
    g = _lib()
    out = []
    for i in range(g.ggml_backend_dev_count()):
        dev = g.ggml_backend_dev_get(i)
        free, total = _SZ(0), _SZ(0)
        g.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        reg = g.ggml_backend_dev_backend_reg(dev)
        out.append(offload.Device(
            name=(g.ggml_backend_dev_name(dev) or b"?").decode(errors="replace"),
            type=_DEV_TYPES.get(g.ggml_backend_dev_type(dev), "?"),
            free=int(free.value), total=int(total.value),
            description=(g.ggml_backend_dev_description(dev) or b"").decode(errors="replace"),
            backend=(g.ggml_backend_reg_name(reg) or b"").decode(errors="replace") if reg else ""))
    return tuple(out)


@dataclass(frozen=True)
class Probe:
    gpu_offload: bool
    devices: tuple[offload.Device, ...]
    error: str = ""


def probe() -> Probe:
    """Devices for the decision; on any failure no devices (auto then means the CPU, as before)."""
    try:
        return Probe(gpu_offload_supported(), probe_devices())
    except (OSError, AttributeError, ValueError) as e:
        return Probe(False, (), f"{type(e).__name__}: {e}")


def context_tokens(train: int, n_ctx: int | None, default_ctx: int, n_seq: int = 1) -> int:
    """The KV cache size pipeline.load_pipeline asks for (it reads the training context from the
    loaded model; the header has the same): None -> default capped at training, 0 -> training."""
    if n_ctx is None:
        n_ctx = min(default_ctx, train) if train > 0 else default_ctx
    elif n_ctx == 0:
        n_ctx = train or default_ctx
    return n_ctx * max(1, n_seq)


def plan_offload(target_path: Path, draft_path: Path | None, *, n_gpu_layers: int | None,
                 n_gpu_layers_draft: int | None, n_ctx: int | None, default_ctx: int, n_seq: int = 1,
                 load_mtp: bool = False, target_loaded: bool = False) -> offload.OffloadDecision:
    """-ngl/-ngld for loading `target_path` (and `draft_path`, the draft the drafter will load;
    None if none). n_ctx / default_ctx / n_seq: the context as load_pipeline sizes it.
    target_loaded: the target is in memory already (its layers are out of the devices' free
    memory), only the draft is placed."""
    from llamaspec.runtime.info import gguf_headers

    given = dict(n_gpu_layers=n_gpu_layers, n_gpu_layers_draft=n_gpu_layers_draft, target_loaded=target_loaded,
                 has_draft=draft_path is not None)
    if n_gpu_layers is not None and n_gpu_layers_draft is not None:
        return offload.decide((), None, **given)
    p = probe()
    target = draft = None
    if p.gpu_offload and offload.model_devices(p.devices):   # sizes matter only with a GPU to fill
        try:
            th = gguf_headers(Path(target_path))
            tokens = context_tokens(int(th[0].context_length or 0), n_ctx, default_ctx, n_seq)
            if not target_loaded:
                target = offload.needs_from_headers(th, n_ctx=tokens, load_nextn=load_mtp)
            if draft_path is not None:
                draft = offload.needs_from_headers(gguf_headers(Path(draft_path)), n_ctx=tokens)
        except Exception as e:  # noqa: BLE001 - the load that follows reports a bad file precisely
            d = offload.decide((), None, gpu_offload=False, **given)
            return replace(d, reason=f"GGUF sizes unreadable ({type(e).__name__}): nothing offloaded")
    d = offload.decide(p.devices, target, draft, gpu_offload=p.gpu_offload, **given)
    if p.error:
        d = replace(d, reason=f"{d.reason} (ggml devices unreadable: {p.error})")
    return d


def offload_report() -> dict:
    """`doctor`: the devices llama.cpp sees, their memory, and what -ngl/-ngld auto does here."""
    p = probe()
    return {
        "gpu_offload": p.gpu_offload,
        "devices": [{"name": d.name, "type": d.type, "description": d.description, "backend": d.backend,
                     "free": d.free, "total": d.total} for d in p.devices],
        "gpu_devices": [d.name for d in (offload.model_devices(p.devices) if p.gpu_offload else ())],
        "margin": offload.DEFAULT_MARGIN,
        "auto": offload.auto_summary(p.devices, p.gpu_offload),
        "error": p.error,
    }
