"""Model references -> local files or headers: local paths, and Hugging Face Hub references.

Public API (other commands use the first two):
    resolve_model(ref, offline=False) -> Path        local GGUF path, downloading Hub refs into the HF cache
    read_model_header(ref, offline=False) -> GGUFHeader   header only: local/cached read, else ranged requests
    pull(ref, update=False, offline=False) -> Pulled       what `llamaspec pull` does
    parse_ref / classify / is_hub_ref, HubRef              the reference grammar (see refs.py)
    list_cached_ggufs() -> [CacheEntry]                    what `llamaspec models` lists

Nothing here prints: details go to the "llamaspec.hub" logger (INFO), download progress to a
callback (download.Progress: the `progress` argument, else the one installed; the CLI draws bars).

Cache first: a reference whose files are all in the cache resolves with no network at all, so
`run`/`check` start instantly and work offline. `pull --update` asks the Hub for a newer commit.
With no quant given, only a cached Q4_K_M (the Hub default's first choice) counts as a hit online.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llamaspec.gguf.header import GGUFHeader, read_file
from llamaspec.hub.cache import CacheEntry, cache_dir, find_cached, list_cached_ggufs
from llamaspec.hub.refs import HubRef, classify, is_hub_ref, parse_ref

if TYPE_CHECKING:
    from llamaspec.hub.download import Progress

log = logging.getLogger(__name__)  # details (INFO): where a ref resolved to, what a header read cost

__all__ = [
    "HubRef", "Pulled", "CacheEntry", "cache_dir", "classify", "is_hub_ref", "list_cached_ggufs",
    "parse_ref", "pull", "read_model_header", "resolve_model",
]


@dataclass
class Pulled:
    ref: HubRef
    commit: str
    files: list[str]            # repo paths, part 1 first
    paths: list[Path]           # local cache paths, same order
    size: int                   # bytes of all parts
    downloaded: int = 0         # bytes fetched by this pull (0: everything was cached)
    cached: bool = False        # resolved from the cache without asking the Hub

    @property
    def path(self) -> Path:
        return self.paths[0]

    def to_dict(self) -> dict:
        return {
            "ref": str(self.ref), "repo": self.ref.repo_id, "revision": self.ref.rev, "commit": self.commit,
            "file": self.files[0], "files": self.files, "path": str(self.path),
            "paths": [str(p) for p in self.paths], "size": self.size, "downloaded": self.downloaded,
            "cached": self.cached,
        }


def _hub_ref(ref: str | HubRef) -> HubRef:
    if isinstance(ref, HubRef):
        return ref
    hub = classify(ref)
    if not isinstance(hub, HubRef):
        from llamaspec.errors import UsageError

        raise UsageError(f"not a Hub reference: {ref}", "use org/repo, org/repo:QUANT or org/repo/path/file.gguf")
    return hub


def _cached(hub: HubRef, offline: bool):
    """The cache hit for `hub`, if it can stand in for asking the Hub.

    With no quant given, a cached Q4_K_M is what the Hub's default would pick too; any other
    cached file (say a Q8_0 pulled earlier) is used only offline, else the Hub decides.
    """
    from llamaspec.hub import select

    hit = find_cached(hub)
    if hit is None or offline or hub.quant or hub.path:
        return hit
    tag = select.split_info(hit.files[0])
    return hit if tag is not None and tag.tag == select.DEFAULT_QUANTS[0] else None


def pull(ref: str | HubRef, *, update: bool = False, offline: bool = False,
         progress: Progress | None = None) -> Pulled:
    """Make the model `ref` means present in the HF cache (cache first unless `update`); a
    download reports to `progress` (else to the one installed, see download.install_progress)."""
    from llamaspec.hub import download, remote
    from llamaspec.hub.failures import not_cached_offline

    hub = _hub_ref(ref)
    offline = offline or remote.offline_env()
    if not update or offline:
        hit = _cached(hub, offline)
        if hit is not None:
            size = sum(p.stat().st_size for p in hit.paths)
            return Pulled(hub, hit.commit, hit.files, hit.paths, size, cached=True)
        if offline:
            raise not_cached_offline(hub)
    listing = remote.list_repo(hub)
    files = remote.choose(listing)
    paths, downloaded = download.fetch(listing, files, progress=progress)
    return Pulled(hub, listing.commit, files, paths, listing.size(files), downloaded)


def resolve_model(ref: str, *, offline: bool = False, progress: Progress | None = None) -> Path:
    """A local GGUF path for `ref`: a local path as is; a Hub ref from the cache, else downloaded."""
    target = classify(ref)
    if isinstance(target, Path):
        return target
    pulled = pull(target, offline=offline, progress=progress)
    log.info("%s -> %s%s", target, pulled.path, " (cached)" if pulled.cached else "")
    return pulled.path


def read_model_header(ref: str, *, offline: bool = False) -> GGUFHeader:
    """The GGUF header of `ref` without loading weights and without downloading a Hub model:
    local files and cached Hub files are read from disk, others with ranged requests."""
    target = classify(ref)
    if isinstance(target, Path):
        return read_file(target)
    from llamaspec.hub import remote
    from llamaspec.hub.failures import not_cached_offline

    offline = offline or remote.offline_env()
    hit = _cached(target, offline)
    if hit is not None:
        header = read_file(hit.primary)
        header.file_size = sum(p.stat().st_size for p in hit.paths)
        return header
    if offline:
        raise not_cached_offline(target)
    listing = remote.list_repo(target)
    files = remote.choose(listing)
    header, reader = remote.read_remote_header(listing, files[0])
    header.file_size = listing.size(files)
    log.info("%s: header read from the Hub with %d ranged request(s), %s of %s bytes",
             header.source, reader.requests, f"{reader.fetched:,}", f"{header.file_size:,}")
    return header
