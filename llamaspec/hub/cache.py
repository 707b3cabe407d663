"""The standard Hugging Face cache (shared with `hf download`), read without any network.

Layout (huggingface_hub's): <cache>/models--org--repo/{refs/<rev>, snapshots/<commit>/<path>,
blobs/<etag>}. Paths are computed from the environment at call time, not from
huggingface_hub's import-time constants, so a changed HF_HOME is honoured and importing
huggingface_hub is not needed for a cache hit.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from llamaspec.hub import select
from llamaspec.hub.refs import HubRef

_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


def cache_dir() -> Path:
    """HF_HUB_CACHE, else HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub (default ~/.cache/huggingface/hub)."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(os.path.expandvars(os.path.expanduser(explicit)))
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface"
    )
    return Path(os.path.expandvars(os.path.expanduser(home))) / "hub"


def repo_folder(repo_id: str, root: Path | None = None) -> Path:
    return (root or cache_dir()) / ("models--" + repo_id.replace("/", "--"))


def is_commit(rev: str) -> bool:
    return bool(_COMMIT_RE.match(rev))


def cached_commit(repo_id: str, rev: str, root: Path | None = None) -> str | None:
    """The commit a branch/tag pointed to when last fetched (or `rev` itself if it is a commit)."""
    if is_commit(rev):
        return rev
    ref_file = repo_folder(repo_id, root) / "refs" / rev
    try:
        commit = ref_file.read_text().strip()
    except OSError:
        return None
    return commit or None


def snapshot_files(snapshot: Path) -> list[str]:
    """Repo-relative paths of the complete files in a snapshot (dangling links skipped), sorted."""
    out = []
    if not snapshot.is_dir():
        return out
    folder = snapshot.parent.parent
    for dirpath, _dirs, names in os.walk(snapshot):
        for name in names:
            full = Path(dirpath) / name
            if present(full, folder):  # follows the symlink to the blob (blobs/ may link to another disk)
                out.append(full.relative_to(snapshot).as_posix())
    return sorted(out)


def present(pointer: Path, folder: Path) -> bool:
    """Whether snapshot file `pointer` of repo folder `folder` is there and stays inside the cache."""
    return pointer.exists() and _within(pointer.resolve(), (folder.resolve(), (folder / "blobs").resolve()))


def _within(path: Path, roots: tuple[Path, ...]) -> bool:
    """A link planted in the cache that points outside it is not a cached file: never read it."""
    return any(path == r or r in path.parents for r in roots)


@dataclass(frozen=True)
class CachedModel:
    ref: HubRef
    commit: str
    files: list[str]        # repo paths, part 1 first
    paths: list[Path]       # local paths, same order

    @property
    def primary(self) -> Path:
        return self.paths[0]


def find_cached(ref: HubRef, root: Path | None = None) -> CachedModel | None:
    """The files `ref` means if all of them are in the cache, choosing among cached files only."""
    commit = cached_commit(ref.repo_id, ref.rev, root)
    if commit is None:
        return None
    snapshot = repo_folder(ref.repo_id, root) / "snapshots" / commit
    files = snapshot_files(snapshot)
    if not files:
        return None
    try:
        chosen = select.choose(files, ref.quant, ref.path, "the cache")
    except Exception:  # noqa: BLE001 - not (completely) cached: the caller asks the Hub
        return None
    return CachedModel(ref, commit, chosen, [snapshot / f for f in chosen])


@dataclass(frozen=True)
class CacheEntry:
    """One GGUF model in the cache (a split counts once, with the size of all its parts)."""

    repo_id: str
    commit: str
    refs: tuple[str, ...]   # branch/tag names pointing at this commit
    file: str               # repo path of part 1
    path: Path
    size: int
    parts: int

    @property
    def ref(self) -> str:
        """A reference that resolves to exactly this file."""
        rev = "" if "main" in self.refs else f"@{self.refs[0] if self.refs else self.commit}"
        return f"{self.repo_id}{rev}/{self.file}"


def list_cached_ggufs(root: Path | None = None) -> list[CacheEntry]:
    """Every complete model GGUF in the cache, by repo then revision then file."""
    root = root or cache_dir()
    entries: list[CacheEntry] = []
    if not root.is_dir():
        return entries
    for folder in sorted(root.glob("models--*")):
        repo_id = folder.name[len("models--"):].replace("--", "/", 1)
        refs: dict[str, list[str]] = {}
        refs_dir = folder / "refs"
        if refs_dir.is_dir():
            for f in refs_dir.rglob("*"):
                if f.is_file():
                    try:
                        refs.setdefault(f.read_text().strip(), []).append(f.relative_to(refs_dir).as_posix())
                    except OSError:
                        pass
        snapshots = folder / "snapshots"
        for snap in sorted(snapshots.iterdir()) if snapshots.is_dir() else []:
            files = snapshot_files(snap)
            for f in files:
                si = select.split_info(f)
                if si is None or not select.is_model_file(f) or si.index != 1:
                    continue
                try:
                    parts = select.shard_parts(files, f)
                except Exception:  # noqa: BLE001 - a split with parts missing is not usable
                    continue
                size = sum((snap / p).stat().st_size for p in parts)
                entries.append(CacheEntry(repo_id, snap.name, tuple(sorted(refs.get(snap.name, []))),
                                          f, snap / f, size, len(parts)))
    return entries
