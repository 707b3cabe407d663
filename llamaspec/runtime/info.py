"""Facts about the installed llama-cpp-python build: versions, CPU features, backends, devices.

ggml's backend registry has no Python binding in llama-cpp-python, so it is read with ctypes
from the `libggml` shared library that llama-cpp-python installs beside its own. The same
bindings apply the AMX policy (cpu_policy.py) when runtime.Model loads a model:
`apply_buffer_policy` sets `use_extra_bufts` and the CPU_REPACK `tensor_buft_overrides`.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import re
from dataclasses import dataclass, field
from pathlib import Path

from llamaspec.runtime import cpu as cpu_policy

# ggml_backend_dev_type
_DEV_TYPES = {0: "CPU", 1: "GPU", 2: "IGPU", 3: "ACCEL"}

GPU_BUILDS = {
    "CUDA (NVIDIA)": 'CMAKE_ARGS="-DGGML_CUDA=on" pip install --force-reinstall --no-cache-dir llama-cpp-python',
    "Metal (Apple Silicon)": 'CMAKE_ARGS="-DGGML_METAL=on" pip install --force-reinstall --no-cache-dir llama-cpp-python',
    "Vulkan (AMD/Intel/NVIDIA)": 'CMAKE_ARGS="-DGGML_VULKAN=on" pip install --force-reinstall --no-cache-dir llama-cpp-python',
    "ROCm/HIP (AMD)": 'CMAKE_ARGS="-DGGML_HIP=on" pip install --force-reinstall --no-cache-dir llama-cpp-python',
}


def lib_dir() -> Path:
    import llama_cpp

    return Path(llama_cpp.__file__).parent / "lib"


def _backends_from_ggml(lib_dir: Path) -> tuple[list[str], list[dict]]:
    """Registered backends and devices via ggml's registry (empty lists if unavailable)."""
    candidates = sorted(lib_dir.glob("libggml.*")) + sorted(lib_dir.glob("ggml.dll"))
    if not candidates:
        return [], []
    ggml = ctypes.CDLL(str(candidates[0]))
    ggml.ggml_backend_reg_count.restype = ctypes.c_size_t
    ggml.ggml_backend_reg_get.restype = ctypes.c_void_p
    ggml.ggml_backend_reg_get.argtypes = [ctypes.c_size_t]
    ggml.ggml_backend_reg_name.restype = ctypes.c_char_p
    ggml.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_dev_get.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    ggml.ggml_backend_dev_name.restype = ctypes.c_char_p
    ggml.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_dev_description.restype = ctypes.c_char_p
    ggml.ggml_backend_dev_description.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_dev_type.restype = ctypes.c_int
    ggml.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    backends = [ggml.ggml_backend_reg_name(ggml.ggml_backend_reg_get(i)).decode()
                for i in range(ggml.ggml_backend_reg_count())]
    devices = []
    for i in range(ggml.ggml_backend_dev_count()):
        d = ggml.ggml_backend_dev_get(i)
        devices.append({
            "name": ggml.ggml_backend_dev_name(d).decode(),
            "description": (ggml.ggml_backend_dev_description(d) or b"").decode(errors="replace"),
            "type": _DEV_TYPES.get(ggml.ggml_backend_dev_type(d), "?"),
        })
    return backends, devices


# ---- ggml's CPU backend: features, extra buffer types, and the AMX policy's repack overrides ----
# Used by runtime.Model at load time (apply_buffer_policy) and by `doctor`. See cpu_policy.py.

_V = ctypes.c_void_p
_I64 = ctypes.c_int64


class _InitParams(ctypes.Structure):   # struct ggml_init_params
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", _V), ("no_alloc", ctypes.c_bool)]


class _TensorHead(ctypes.Structure):   # the first fields of struct ggml_tensor (checked on use)
    _fields_ = [("type", ctypes.c_int), ("buffer", _V), ("ne", _I64 * 4)]


class _Feature(ctypes.Structure):      # struct ggml_backend_feature
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_char_p)]


class BuftOverride(ctypes.Structure):  # struct llama_model_tensor_buft_override
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", _V)]


_SIGNATURES = {
    "ggml_backend_dev_by_type": (_V, [ctypes.c_int]),
    "ggml_backend_dev_backend_reg": (_V, [_V]),
    "ggml_backend_reg_get_proc_address": (_V, [_V, ctypes.c_char_p]),
    "ggml_backend_buft_name": (ctypes.c_char_p, [_V]),
    "ggml_backend_buft_alloc_buffer": (_V, [_V, ctypes.c_size_t]),
    "ggml_backend_buffer_free": (None, [_V]),
    "ggml_backend_dev_supports_op": (ctypes.c_bool, [_V, _V]),
    "ggml_tensor_overhead": (ctypes.c_size_t, []),
    "ggml_blck_size": (_I64, [ctypes.c_int]),
    "ggml_init": (_V, [_InitParams]),
    "ggml_free": (None, [_V]),
    "ggml_new_tensor_4d": (ctypes.POINTER(_TensorHead), [_V, ctypes.c_int, _I64, _I64, _I64, _I64]),
    "ggml_mul_mat": (_V, [_V, _V, _V]),
}


class _Ggml:
    """The libggml / libggml-base that llama-cpp-python loaded (same files, same process state)."""

    def __init__(self, lib_dir: Path):
        libs = []
        for stem in ("ggml", "ggml-base"):
            found = (sorted(lib_dir.glob(f"lib{stem}.so*")) + sorted(lib_dir.glob(f"lib{stem}.dylib"))
                     + sorted(lib_dir.glob(f"{stem}.dll")))
            if found:
                libs.append(ctypes.CDLL(str(found[0])))
        if not libs:
            raise OSError(f"no libggml in {lib_dir}")
        for name, (res, args) in _SIGNATURES.items():
            for lib in libs:
                f = getattr(lib, name, None)
                if f is not None:
                    f.restype, f.argtypes = res, args
                    setattr(self, name, f)
                    break
            else:
                raise OSError(f"{name} not found in {lib_dir}")
        self.cpu_dev = self.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
        if not self.cpu_dev:
            raise OSError("ggml has no CPU device")
        self.cpu_reg = self.ggml_backend_dev_backend_reg(self.cpu_dev)

    def proc(self, name: str, restype, *argtypes):
        p = self.ggml_backend_reg_get_proc_address(self.cpu_reg, name.encode())
        return ctypes.CFUNCTYPE(restype, *argtypes)(p) if p else None


@functools.lru_cache(maxsize=1)
def _ggml() -> _Ggml:
    import llama_cpp

    llama_cpp.llama_backend_init()
    return _Ggml(lib_dir())


def cpu_extra_bufts() -> list[tuple[str, int]]:
    """The CPU device's extra buffer types (name, pointer) in llama.cpp's order, e.g. AMX, CPU_REPACK."""
    g = _ggml()
    fn = g.proc("ggml_backend_dev_get_extra_bufts", ctypes.POINTER(_V), _V)
    arr = fn(g.cpu_dev) if fn else None
    out: list[tuple[str, int]] = []
    while arr and arr[len(out)]:
        buft = arr[len(out)]
        out.append((g.ggml_backend_buft_name(buft).decode(errors="replace"), buft))
    return out


def cpu_backend_features() -> dict[str, str]:
    """ggml's CPU backend features (name -> value), e.g. AVX2=1, AMX_INT8=1, REPACK=1."""
    g = _ggml()
    fn = g.proc("ggml_backend_get_features", ctypes.POINTER(_Feature), _V)
    arr = fn(g.cpu_reg) if fn else None
    out: dict[str, str] = {}
    i = 0
    while arr and arr[i].name:
        out[arr[i].name.decode()] = (arr[i].value or b"").decode()
        i += 1
    return out


def _system_info_features(system_info: str) -> list[str]:
    # system_info reads "CPU : SSE3 = 1 | AVX = 1 | ... | REPACK = 1 |"
    return sorted({chunk.split("=")[0].split(":")[-1].strip()
                   for chunk in system_info.split("|") if chunk.strip().endswith("= 1")})


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (Linux; empty elsewhere)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@functools.lru_cache(maxsize=1)
def cpu_facts() -> cpu_policy.CpuFacts:
    """What the AMX policy needs to know about this CPU and this ggml build (cached)."""
    flags = cpu_flags()
    try:
        features = frozenset(k for k, v in cpu_backend_features().items() if v == "1")
        bufts: tuple[str, ...] | None = tuple(n for n, _ in cpu_extra_bufts())
    except (OSError, AttributeError, ValueError):
        import llama_cpp

        info = llama_cpp.llama_print_system_info().decode(errors="replace")
        features, bufts = frozenset(_system_info_features(info)), None
    return cpu_policy.CpuFacts(flags, features, bufts)


def buffer_decision(flag: bool | None = None) -> cpu_policy.BufferDecision:
    """The AMX policy for this process: detected facts, LLAMASPEC_AMX and --amx/--no-amx (`flag`)."""
    return cpu_policy.decide(cpu_facts(), flag=flag, env=os.environ)


@functools.lru_cache(maxsize=None)
def repack_supported(ggml_type: int, ne0: int, ne1: int) -> bool:
    """Whether llama.cpp would put a [ne0, ne1] MUL_MAT weight of `ggml_type` in CPU_REPACK.

    The same question llama-model-loader.cpp's weight_buft_supported asks: a mul_mat of the weight
    with a [ne0, 512] F32 batch, the weight in an empty CPU_REPACK buffer, put to the CPU device.
    """
    from llamaspec.gguf.header import GGML_TYPES

    buft = dict(cpu_extra_bufts()).get(cpu_policy.REPACK_BUFT)
    if not buft or ggml_type not in GGML_TYPES or ne0 <= 0 or ne1 <= 0:
        return False
    g = _ggml()
    block = g.ggml_blck_size(ggml_type)
    if block <= 0 or ne0 % block:  # ggml would abort on such a tensor; llama.cpp rejects the file
        return False
    if ne0 * ne1 > 1 << 40:  # ggml_new_tensor aborts on a size that overflows (a corrupt header)
        return False
    ctx = g.ggml_init(_InitParams(g.ggml_tensor_overhead() * 8, None, True))
    if not ctx:
        return False
    try:
        w = g.ggml_new_tensor_4d(ctx, ggml_type, ne0, ne1, 1, 1).contents
        if w.type != ggml_type or list(w.ne) != [ne0, ne1, 1, 1] or w.buffer:
            raise OSError("struct ggml_tensor does not start as this code expects")
        op = g.ggml_mul_mat(ctx, ctypes.addressof(w), g.ggml_new_tensor_4d(ctx, 0, ne0, 512, 1, 1))
        buf = g.ggml_backend_buft_alloc_buffer(buft, 0)
        w.buffer = buf
        try:
            return bool(g.ggml_backend_dev_supports_op(g.cpu_dev, op))
        finally:
            w.buffer = None
            g.ggml_backend_buffer_free(buf)
    finally:
        g.ggml_free(ctx)


def gguf_headers(path: Path) -> list:
    """GGUF headers of a model and, when it is split, of its other parts (name-00001-of-00003.gguf)."""
    from llamaspec.gguf.header import read_file

    first = read_file(path)
    n = int(first.get("split.count", 0) or 0)
    m = re.fullmatch(r"(.*)-(\d{5})-of-(\d{5})\.gguf", path.name)
    if n <= 1 or not m:
        return [first]
    parts = [path.with_name(f"{m.group(1)}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1)]
    return [first] + [read_file(p) for p in parts if p != path and p.is_file()]


def repack_weights(path: Path) -> list[str]:
    """The weights of `path` that llama.cpp would repack here (CPU_REPACK), by tensor name."""
    names = []
    for header in gguf_headers(path):
        for t in header.tensors:
            if (len(t.shape) == 2 and cpu_policy.is_matmul_weight(t.name)
                    and repack_supported(t.ggml_type, t.shape[0], t.shape[1])):
                names.append(t.name)
    return names


@dataclass
class WeightBuffers:
    """How a model's weights were placed: the AMX policy's decision and what it took to apply it."""

    decision: cpu_policy.BufferDecision
    repacked: tuple[str, ...] = ()    # weights routed to CPU_REPACK by tensor_buft_overrides
    patterns: tuple[str, ...] = ()    # the override regexes
    note: str = ""                    # why CPU_REPACK could not be kept, when it could not
    _keep: object = field(default=None, repr=False)  # the ctypes override array, alive while the model is

    def to_dict(self) -> dict:
        return {**self.decision.to_dict(), "repacked_weights": len(self.repacked), "note": self.note}


def apply_buffer_policy(params, path: Path, flag: bool | None = None,
                        decision: cpu_policy.BufferDecision | None = None) -> WeightBuffers:
    """Set `params` (llama_model_params) for the AMX policy; the result must live as long as the model."""
    d = decision if decision is not None else buffer_decision(flag)
    params.use_extra_bufts = d.use_extra_bufts
    wb = WeightBuffers(d)
    if not d.repack_overrides:
        return wb
    try:
        buft = dict(cpu_extra_bufts()).get(cpu_policy.REPACK_BUFT)
        names = repack_weights(path) if buft else []
    except Exception as e:  # noqa: BLE001 - never fail a load over an optimisation: plain CPU buffers
        wb.note = f"CPU_REPACK not kept ({type(e).__name__}: {e})"
        return wb
    if not names:
        return wb
    patterns = cpu_policy.override_patterns(names)
    arr = (BuftOverride * (len(patterns) + 1))(*[BuftOverride(p.encode(), buft) for p in patterns],
                                                BuftOverride(None, None))
    params.tensor_buft_overrides = ctypes.addressof(arr)
    wb.repacked, wb.patterns, wb._keep = tuple(names), tuple(patterns), arr
    return wb


def collect() -> dict:
    """Everything `doctor` reports, as plain data."""
    import llama_cpp

    from llamaspec._version import __version__

    llama_cpp.llama_backend_init()
    system_info = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    libdir = lib_dir()
    try:
        backends, devices = _backends_from_ggml(libdir)
    except (OSError, AttributeError):
        backends, devices = [], []
    libs = sorted(p.name for p in libdir.glob("*ggml*")) if libdir.exists() else []
    features = _system_info_features(system_info)
    gpu = bool(llama_cpp.llama_supports_gpu_offload())
    return {
        "llamaspec": __version__,
        "llama_cpp_python": llama_cpp.__version__,
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "system_info": system_info,
        "cpu_features": features,
        "backends": backends,
        "devices": devices,
        "libraries": libs,
        "gpu_offload": gpu,
        "mmap": bool(llama_cpp.llama_supports_mmap()),
        "max_devices": int(llama_cpp.llama_max_devices()),
        "gpu_build_commands": {} if gpu else GPU_BUILDS,
        "amx": amx_report(),
    }


def amx_report(flag: bool | None = None) -> dict:
    """The AMX facts (from /proc/cpuinfo and from the ggml build) and what llamaspec does about them."""
    facts = cpu_facts()
    d = buffer_decision(flag)
    return {
        "cpu_amx_flags": sorted(f for f in facts.cpu_flags if f.startswith("amx")),
        "cpu_has_amx": facts.cpu_amx,
        "build_has_amx": facts.build_amx,
        "amx_weight_buffer": facts.amx_buffer,
        "cpu_backend_features": sorted(facts.ggml_features),
        "extra_buffer_types": None if facts.extra_bufts is None else list(facts.extra_bufts),
        "extra_buffer_types_used": list(d.extra_bufts),
        "avoid_amx": d.avoid_amx,
        "use_extra_bufts": d.use_extra_bufts,
        "keep_repack": d.keep_repack,
        "choice": d.choice,
        "reason": d.reason,
        "issue": cpu_policy.AMX_ISSUE_URL,
    }
