"""Talking to the Hub: list a repository's files, and read a GGUF header with ranged requests.

A header read fetches growing ranges (128 KiB, 256 KiB, ... up to 16 MiB per request) only
as far as the parser asks, so a multi-GB model is vetted from well under 1% of its bytes, and
a 262k-token vocabulary costs a few requests. After the first request the reader keeps the
URL it was redirected to (the CDN), saving a redirect per range.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from llamaspec.errors import HubError
from llamaspec.gguf.header import GGUFHeader, read_header
from llamaspec.hub.failures import endpoint, hub_errors, network_down, not_cached_offline
from llamaspec.hub.refs import HubRef, bad_path, shown

log = logging.getLogger("llamaspec.hub")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_SHA1 = re.compile(r"^[0-9a-f]{40}$")

FIRST_BLOCK = 128 * 1024
MAX_BLOCK = 16 * 1024 * 1024
CONNECT_TIMEOUT = 5.0  # seconds: a dead network fails fast instead of hanging in retries


def offline_env() -> bool:
    """HF_HUB_OFFLINE at call time (huggingface_hub only reads it at import)."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in {"1", "ON", "YES", "TRUE"}


def timeout(read: float | None = None):
    """An httpx timeout: short connect, the Hub's own read timeouts (HF_HUB_ETAG_TIMEOUT...)."""
    import httpx2
    from huggingface_hub import constants

    return httpx2.Timeout(read or constants.HF_HUB_ETAG_TIMEOUT, connect=CONNECT_TIMEOUT)


def hf_headers() -> dict[str, str]:
    """Auth (HF_TOKEN / login) and user-agent headers, as huggingface_hub sends them."""
    from huggingface_hub.utils import build_hf_headers

    return build_hf_headers(library_name="llamaspec")


@dataclass(frozen=True)
class RepoListing:
    ref: HubRef
    commit: str
    files: list[str]
    sizes: dict[str, int] = field(default_factory=dict)
    sha256: dict[str, str] = field(default_factory=dict)   # LFS files: the sha256 the Hub lists
    git_oid: dict[str, str] = field(default_factory=dict)  # other files: their git blob id (sha1)
    rejected: dict[str, str] = field(default_factory=dict)  # unsafe names in the listing -> why (skipped)

    def size(self, files: list[str]) -> int:
        return sum(self.sizes.get(f, 0) for f in files)

    def url(self, path: str) -> str:
        from huggingface_hub import hf_hub_url

        return hf_hub_url(self.ref.repo_id, path, revision=self.commit, endpoint=endpoint())


def list_repo(ref: HubRef, *, offline: bool = False) -> RepoListing:
    """One API call: the commit `ref`'s revision points to, and every file with its size."""
    if offline or offline_env():
        raise not_cached_offline(ref)
    from huggingface_hub import HfApi

    with hub_errors(ref):
        info = HfApi(endpoint=endpoint(), library_name="llamaspec").model_info(
            ref.repo_id, revision=ref.revision, files_metadata=True, timeout=timeout()
        )
    if not info.sha:
        raise HubError(f"the Hub sent no commit for {ref.repo_id}", "is HF_ENDPOINT a Hugging Face Hub?")
    if not _COMMIT.match(info.sha):  # it names a cache directory: never a path
        raise HubError(f"the Hub sent an invalid commit id for {ref.repo_id}: {shown(info.sha)}",
                       "is HF_ENDPOINT a Hugging Face Hub?")
    files, sizes, sha256, oids, rejected = [], {}, {}, {}, {}
    for s in info.siblings or []:
        name = s.rfilename
        why = bad_path(name)
        if why is not None:
            rejected[name] = why
            log.info("%s: skipping unsafe file name %s in the Hub's listing (%s)", ref.repo_id, shown(name), why)
            continue
        files.append(name)
        if s.size is not None:
            sizes[name] = int(s.size)
        lfs_sha = getattr(s.lfs, "sha256", None) if s.lfs is not None else None
        if isinstance(lfs_sha, str) and _SHA256.match(lfs_sha):
            sha256[name] = lfs_sha
        elif isinstance(s.blob_id, str) and _SHA1.match(s.blob_id):
            oids[name] = s.blob_id
    return RepoListing(ref, info.sha, files, sizes, sha256, oids, rejected)


def choose(listing: RepoListing) -> list[str]:
    """select.choose on a listing; if nothing fits and the Hub listed unsafe names, say so."""
    from llamaspec.hub import select

    ref = listing.ref
    try:
        return select.choose(listing.files, ref.quant, ref.path, f"{ref.repo_id}@{ref.rev}")
    except HubError as exc:
        if not listing.rejected:
            raise
        name = (ref.path if ref.path in listing.rejected else select.find_model(list(listing.rejected), ref.quant)
                or next(iter(listing.rejected)))
        why = listing.rejected[name]
        more = f" (and {len(listing.rejected) - 1} more)" if len(listing.rejected) > 1 else ""
        raise HubError(f"{exc.message}; the Hub also listed an unsafe file name {shown(name)}{more} ({why}), "
                       "which was refused", "the repository is broken or hostile; use another one") from None


class RangedReader:
    """A read-only stream over a remote file that fetches exactly what is read, in growing blocks."""

    def __init__(self, url: str, size: int | None, source: str, ref: object = None):
        self.url, self.size, self.source, self.ref = url, size, source, ref
        self.headers = hf_headers()
        self.pos = 0            # next byte of the file not yet in `buf`
        self.buf = b""
        self.block = FIRST_BLOCK
        self.requests = 0
        self.fetched = 0

    def read(self, n: int = -1) -> bytes:
        if n < 0:
            raise ValueError("RangedReader reads bounded amounts only")
        if len(self.buf) < n:
            want = max(n - len(self.buf), self.block)
            self.buf += self._fetch(self.pos, want)
            self.block = min(self.block * 2, MAX_BLOCK)
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def _fetch(self, start: int, length: int) -> bytes:
        if self.size is not None:
            length = min(length, self.size - start)
        if length <= 0:
            return b""
        from huggingface_hub.utils import get_session, hf_raise_for_status

        headers = {**self.headers, "Range": f"bytes={start}-{start + length - 1}", "Accept-Encoding": "identity"}
        with hub_errors(self.ref):
            with get_session().stream("GET", self.url, headers=headers, timeout=timeout()) as r:
                if r.status_code >= 400:
                    r.read()
                    hf_raise_for_status(r)
                if r.status_code == 206:
                    data = r.read()
                else:  # the server ignored Range: take our slice from the full body, then hang up
                    data = b""
                    for chunk in r.iter_bytes():
                        data += chunk
                        if len(data) >= start + length:
                            break
                    data = data[start:start + length]
                final = str(r.url)
        self._follow(final)
        self.requests += 1
        self.fetched += len(data)
        self.pos = start + len(data)
        return data

    def _follow(self, final: str) -> None:
        """Reuse the redirect target; never send the token to another host (a CDN URL is signed)."""
        if final != self.url:
            if urlsplit(final).netloc != urlsplit(self.url).netloc:
                self.headers.pop("authorization", None)
            self.url = final


def read_remote_header(listing: RepoListing, path: str) -> tuple[GGUFHeader, RangedReader]:
    """Parse the header of `path` from the Hub, fetching only the bytes the parser needs."""
    source = str(listing.ref.with_path(path))
    reader = RangedReader(listing.url(path), listing.sizes.get(path), source, listing.ref)
    try:
        header = read_header(reader, source=source, chunk=FIRST_BLOCK, file_size=listing.sizes.get(path))
    except OSError as exc:  # a socket error outside httpx
        raise network_down(exc) from exc
    return header, reader
