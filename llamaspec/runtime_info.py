"""Facts about the installed llama-cpp-python build: versions, CPU features, backends, devices.

ggml's backend registry has no Python binding in llama-cpp-python, so it is read with ctypes
from the `libggml` shared library that llama-cpp-python installs beside its own.
"""

from __future__ import annotations

import ctypes
import platform
from pathlib import Path

# ggml_backend_dev_type
_DEV_TYPES = {0: "CPU", 1: "GPU", 2: "IGPU", 3: "ACCEL"}

GPU_BUILDS = {
    "CUDA (NVIDIA)": 'CMAKE_ARGS="-DGGML_CUDA=on" pip install --force-reinstall --no-cache-dir llama-cpp-python',
    "Metal (Apple Silicon)": 'CMAKE_ARGS="-DGGML_METAL=on" pip install --force-reinstall --no-cache-dir llama-cpp-python',
    "Vulkan (AMD/Intel/NVIDIA)": 'CMAKE_ARGS="-DGGML_VULKAN=on" pip install --force-reinstall --no-cache-dir llama-cpp-python',
    "ROCm/HIP (AMD)": 'CMAKE_ARGS="-DGGML_HIP=on" pip install --force-reinstall --no-cache-dir llama-cpp-python',
}


def _lib_dir() -> Path:
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


def collect() -> dict:
    """Everything `doctor` reports, as plain data."""
    import llama_cpp

    import llamaspec

    llama_cpp.llama_backend_init()
    system_info = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    lib_dir = _lib_dir()
    try:
        backends, devices = _backends_from_ggml(lib_dir)
    except (OSError, AttributeError):
        backends, devices = [], []
    libs = sorted(p.name for p in lib_dir.glob("*ggml*")) if lib_dir.exists() else []
    # system_info reads "CPU : SSE3 = 1 | AVX = 1 | ... | REPACK = 1 |"
    features = sorted({chunk.split("=")[0].split(":")[-1].strip()
                       for chunk in system_info.split("|") if chunk.strip().endswith("= 1")})
    gpu = bool(llama_cpp.llama_supports_gpu_offload())
    return {
        "llamaspec": llamaspec.__version__,
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
    }
