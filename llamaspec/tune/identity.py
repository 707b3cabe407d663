"""What a tuned configuration is valid for: the target and draft files, the llama.cpp build, the device.

A file is known by its size, its modification time and a hash of its first and last MiB: fast
(two reads, whatever the size) and changed by any rewrite, requantization or copy without `-p`.
The GGUF header is inside the first MiB for the models people tune. The build is llama-cpp-python's
version, llama.cpp's version string and the size and time of the shared libraries it loads (a
rebuild of the same version changes them). The device is the CPU (model name and the features
the ggml build uses) or, when layers are offloaded, the GPU devices ggml registers.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

EDGE = 1 << 20   # bytes hashed at each end of a file


@dataclass(frozen=True)
class FileIdentity:
    path: str          # where it was (shown, and matched by `tune --forget MODEL`); not part of equality
    size: int
    mtime_ns: int
    edges: str         # sha256 of the first and last EDGE bytes

    def same_file(self, other: "FileIdentity | None") -> bool:
        return other is not None and (self.size, self.mtime_ns, self.edges) == (other.size, other.mtime_ns,
                                                                                 other.edges)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "FileIdentity":
        return cls(str(d["path"]), int(d["size"]), int(d["mtime_ns"]), str(d["edges"]))


def file_identity(path: str | os.PathLike[str]) -> FileIdentity:
    """Size, mtime and edge hash of a file (symlinks followed; OSError if it cannot be read)."""
    real = Path(os.path.realpath(path))
    st = real.stat()
    h = hashlib.sha256()
    with open(real, "rb") as f:
        h.update(f.read(EDGE))
        if st.st_size > EDGE:
            f.seek(max(EDGE, st.st_size - EDGE))
            h.update(f.read(EDGE))
    return FileIdentity(str(real), st.st_size, st.st_mtime_ns, h.hexdigest()[:32])


@dataclass(frozen=True)
class Fingerprint:
    """One of the build or the device: an id (a short hash of the facts) and a line for people."""

    id: str
    summary: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Fingerprint":
        return cls(str(d["id"]), str(d.get("summary", "")))


def _digest(facts: Any) -> str:
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def build_identity() -> Fingerprint:
    """llama-cpp-python and llama.cpp versions plus the shared libraries' sizes and times."""
    import llama_cpp

    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    libs = {}
    for p in sorted(lib_dir.glob("*")) if lib_dir.is_dir() else []:
        if p.is_file() and not p.is_symlink() and any(s in p.name for s in ("llama", "ggml")):
            st = p.stat()
            libs[p.name] = [st.st_size, st.st_mtime_ns]
    try:
        core = llama_cpp.llama_version().decode(errors="replace")
    except Exception:  # noqa: BLE001 - older bindings: the Python package version still counts
        core = "?"
    facts = {"llama_cpp_python": llama_cpp.__version__, "llama_cpp": core, "libs": libs}
    return Fingerprint(_digest(facts), f"llama-cpp-python {llama_cpp.__version__} (llama.cpp {core})")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("model name", "Hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=4)
def device_identity(n_gpu_layers: int | None = None) -> Fingerprint:
    """The CPU (and the features the ggml build uses) when nothing is offloaded (-ngl 0, or a build
    without GPUs), else the GPUs too; None is -ngl auto, which offloads on a GPU build."""
    from llamaspec.runtime import info

    facts_all = info.collect()
    cpu = _cpu_model()
    facts: dict[str, Any] = {"machine": platform.machine(), "cpu": cpu,
                             "features": sorted(facts_all.get("cpu_features", []))}
    summary = f"CPU {cpu}"
    if n_gpu_layers != 0 and facts_all.get("gpu_offload"):
        gpus = [f"{d['name']} {d['description']}" for d in facts_all.get("devices", []) if d.get("type") != "CPU"]
        facts["gpus"] = gpus
        summary = f"GPU {', '.join(gpus) or '?'} + {summary}"
    return Fingerprint(_digest(facts), summary)
