"""Which GGUF file(s) of a repository a reference means: quant tags, default quant, shards.

Follows llama.cpp's `-hf` resolution (common/download.cpp, `find_best_model`): with no quant,
try Q4_K_M, then Q8_0, then the first model GGUF; a quant matches a file whose name has the tag
followed by '.' or '-' (case-insensitive); side files (mmproj, imatrix, mtp-/eagle3-/dflash-/
dspark- heads) are never the model; of a split GGUF only part 1 is picked, and every part of
the split is then needed. One deliberate difference: the tag must start at a word boundary, so
F16 does not pick a BF16 file and Q4_NL not an IQ4_NL one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from llamaspec.errors import HubError

DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")
_SIDE_FILES = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
_SPLIT_RE = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.I)
_TAG_RE = re.compile(r"[-.]([A-Z0-9_]+)$", re.I)


@dataclass(frozen=True)
class SplitInfo:
    prefix: str  # path without ".gguf" and the split suffix (tag included)
    tag: str     # upper-cased quant tag from the name ("Q4_K_M"), "" if none
    index: int   # 1-based part number (1 for a single file)
    count: int   # number of parts (1 for a single file)


def split_info(path: str) -> SplitInfo | None:
    """Parse `...-Q4_K_M-00001-of-00003.gguf`; None for non-GGUF files."""
    if not path.lower().endswith(".gguf"):
        return None
    prefix = path[: -len(".gguf")]
    index = count = 1
    m = _SPLIT_RE.match(prefix)
    if m:
        prefix, index, count = m[1], int(m[2]), int(m[3])
    t = _TAG_RE.search(prefix)
    return SplitInfo(prefix, t[1].upper() if t else "", index, count)


def is_model_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name.lower().endswith(".gguf") and not any(k in name for k in _SIDE_FILES)


def _first_parts(files: Iterable[str]) -> list[str]:
    out = []
    for f in files:
        si = split_info(f)
        if si is not None and is_model_file(f) and (si.count <= 1 or si.index == 1):
            out.append(f)
    return out


def find_model(files: Sequence[str], quant: str | None) -> str | None:
    """The model file for `quant` (None: the default order), or None if there is none."""
    candidates = _first_parts(files)
    for tag in [quant] if quant else DEFAULT_QUANTS:
        pattern = re.compile(rf"(?<![A-Za-z0-9]){re.escape(tag)}[.-]", re.I)
        for f in candidates:
            if pattern.search(f.rsplit("/", 1)[-1]):
                return f
    if not quant and candidates:
        return candidates[0]
    return None


def shard_parts(files: Sequence[str], primary: str) -> list[str]:
    """Every part of `primary`'s split (just [primary] for a single file), part 1 first."""
    si = split_info(primary)
    if si is None or si.count <= 1:
        return [primary]
    parts: dict[int, str] = {}
    for f in files:
        fi = split_info(f)
        if fi is not None and fi.count == si.count and fi.prefix == si.prefix:
            parts[fi.index] = f
    missing = [i for i in range(1, si.count + 1) if i not in parts]
    if missing:
        raise HubError(
            f"split GGUF {primary} is incomplete: part(s) {', '.join(map(str, missing))} of {si.count} missing",
            "the repository is missing files; pick another quant",
        )
    return [parts[i] for i in range(1, si.count + 1)]


def available_quants(files: Sequence[str]) -> list[str]:
    """Quant tags of the model files (deduplicated, in listing order); file names if untagged."""
    seen: dict[str, None] = {}
    for f in _first_parts(files):
        si = split_info(f)
        seen.setdefault(si.tag or f, None)  # type: ignore[union-attr]
    return list(seen)


def choose(files: Sequence[str], quant: str | None, path: str | None, where: str) -> list[str]:
    """The files a reference needs (part 1 first), or a HubError naming what is available."""
    if path is not None:
        if path not in files:
            ggufs = [f for f in files if f.lower().endswith(".gguf")]
            raise HubError(
                f"no file {path} in {where}",
                "available GGUF files: " + (", ".join(ggufs) if ggufs else "none"),
            )
        si = split_info(path)
        if si is not None and si.count > 1 and si.index != 1:
            # Named a later part: load from part 1, which is what llama.cpp opens.
            path = next((f for f in files if (s := split_info(f)) and s.prefix == si.prefix and s.index == 1), path)
        return shard_parts(files, path)
    primary = find_model(files, quant)
    if primary is None:
        quants = available_quants(files)
        if not quants:
            raise HubError(f"no GGUF model files in {where}",
                           "this repository has no .gguf files; look for a -GGUF repo")
        raise HubError(f"no {quant} file in {where}", "available quants: " + ", ".join(quants))
    return shard_parts(files, primary)
