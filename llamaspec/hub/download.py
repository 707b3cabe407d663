"""Download Hub files into the standard HF cache, resumable across runs, reporting progress.

huggingface_hub 2.4 resumes a cut connection within one call but deletes its partial file when
the call fails (each attempt writes a process-unique temp file), so an interrupted multi-GB pull
would start over. Here the bytes go to a stable `blobs/<etag>.incomplete` file that the next
run continues with a Range request; once complete it becomes `blobs/<etag>`, linked from
`snapshots/<commit>/<path>`, so the cache is exactly what `hf download` writes and reads (the
etag, from huggingface_hub's own HEAD, names the blob as it would). The lock file is huggingface_hub's
own, so a concurrent `hf download` of the same file waits instead of racing.

Progress goes to a callback, never to the terminal: the CLI draws it (cli/_output.py).
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

from llamaspec.errors import HubError
from llamaspec.hub import cache
from llamaspec.hub.failures import endpoint, hub_errors
from llamaspec.hub.remote import RepoListing, hf_headers, timeout

MAX_FAILURES = 3        # consecutive attempts without progress before giving up (about 3 s)

# A download's progress: report(label, bytes done, bytes total), called when a file starts (done > 0:
# resumed there) and as its bytes arrive; label is "org/repo/path/in/repo.gguf".
Report = Callable[[str, int, int], None]
# Opens the report for the files of one fetch, closed when the fetch ends (a bar stays up that long).
Progress = Callable[[], AbstractContextManager[Report]]

_installed: Progress | None = None


def install_progress(progress: Progress | None) -> Progress | None:
    """Make `progress` the report of every download not given one (the CLI installs its bars);
    returns the one installed before."""
    global _installed
    before, _installed = _installed, progress
    return before


@dataclass
class Part:
    path: str           # inside the repo
    size: int
    etag: str
    url: str            # where the bytes are (a CDN URL after the Hub's redirect)
    same_host: bool     # whether the token may be sent there
    blob: Path
    have: int = 0       # bytes already in the .incomplete file

    @property
    def partial(self) -> Path:
        return self.blob.with_name(self.blob.name + ".incomplete")


def free_bytes(path: Path) -> int:
    """Free space on the disk holding `path` (or its nearest existing parent)."""
    for p in [path, *path.parents]:
        try:
            return shutil.disk_usage(p).free
        except OSError:
            continue
    return 1 << 62


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _plan(listing: RepoListing, files: list[str], root: Path) -> list[Part]:
    """HEAD each missing file: its etag names the blob, its location is where to GET it."""
    from huggingface_hub import get_hf_file_metadata

    folder = cache.repo_folder(listing.ref.repo_id, root)
    parts = []
    for f in files:
        if (folder / "snapshots" / listing.commit / f).exists():
            continue
        url = listing.url(f)
        with hub_errors(listing.ref.with_path(f)):
            meta = get_hf_file_metadata(url, timeout=timeout().read, endpoint=endpoint())
        if not meta.etag:
            raise HubError(f"the Hub sent no ETag for {f}", "is HF_ENDPOINT a Hugging Face Hub?")
        size = meta.size if meta.size is not None else listing.sizes.get(f, 0)
        blob = folder / "blobs" / meta.etag
        part = Part(f, size, meta.etag, meta.location, urlsplit(meta.location).netloc == urlsplit(url).netloc, blob)
        if part.partial.exists():
            part.have = part.partial.stat().st_size
            if part.have > size:  # not a prefix of this file: start over
                part.partial.unlink()
                part.have = 0
        parts.append(part)
    return parts


def _check_space(parts: list[Part], root: Path) -> None:
    need = sum(p.size - p.have for p in parts if not p.blob.exists())
    free = free_bytes(root)
    if need > free:
        raise HubError(
            f"not enough disk space: the download needs {human_size(need)}, {human_size(free)} free in {root}",
            "free some space, or point HF_HOME / HF_HUB_CACHE at a bigger disk",
        )


def _get(part: Part, on_bytes) -> None:
    """Stream the rest of `part` into its .incomplete file; retry cut connections from where they stopped."""
    import httpx2
    from huggingface_hub.utils import get_session, hf_raise_for_status

    from huggingface_hub import constants

    headers = hf_headers()
    if not part.same_host:
        headers.pop("authorization", None)
    headers["Accept-Encoding"] = "identity"
    failures = 0
    part.partial.parent.mkdir(parents=True, exist_ok=True)
    while part.have < part.size or part.size == 0:
        h = dict(headers)
        if part.have:
            h["Range"] = f"bytes={part.have}-"
        before = part.have
        try:
            with get_session().stream("GET", part.url, headers=h,
                                      timeout=timeout(constants.HF_HUB_DOWNLOAD_TIMEOUT)) as r:
                if r.status_code >= 400:
                    r.read()
                    hf_raise_for_status(r)
                mode = "ab" if part.have and r.status_code == 206 else "wb"
                if mode == "wb":
                    lost, part.have = part.have, 0
                    on_bytes(-lost)  # the server ignored Range: start over
                with open(part.partial, mode) as f:
                    for chunk in r.iter_bytes():  # as received: a cut loses nothing already here
                        f.write(chunk)
                        part.have += len(chunk)
                        on_bytes(len(chunk))
            if part.size == 0:
                break
            if part.have < part.size:
                raise httpx2.RemoteProtocolError("connection closed early")
        except (httpx2.TransportError, httpx2.RemoteProtocolError) as exc:
            failures = 0 if part.have > before else failures + 1
            if failures >= MAX_FAILURES:
                kept = f"{human_size(part.have)} of {human_size(part.size)} kept"
                raise HubError(f"download of {part.path} interrupted: lost the connection to {endpoint()} ({kept})",
                               "check your network, then run the same command again to resume") from exc
            time.sleep(0.5 * failures)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise HubError(
                    f"disk full while downloading {part.path} "
                    f"({human_size(part.have)} of {human_size(part.size)} kept)",
                    "free some space, then run the same command again to resume",
                ) from exc
            raise
    if part.have != part.size:
        raise HubError(f"{part.path}: got {part.have} bytes, expected {part.size}", "run the same command again")
    os.replace(part.partial, part.blob)


def _link(listing: RepoListing, part: Part, root: Path) -> Path:
    """Create snapshots/<commit>/<path> -> ../../blobs/<etag>, as huggingface_hub does.

    Done here rather than by a second hf_hub_download call: that costs a HEAD per file and, if
    the network dropped right after the download, ~23 s of retries before it gives up.
    """
    pointer = cache.repo_folder(listing.ref.repo_id, root) / "snapshots" / listing.commit / part.path
    if pointer.exists():
        return pointer
    pointer.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.symlink(os.path.relpath(part.blob, pointer.parent), pointer)
    except FileExistsError:
        pass  # another process linked it meanwhile
    except OSError:
        os.replace(part.blob, pointer)  # no symlinks here (Windows): huggingface_hub moves the blob too
    return pointer


def write_ref(repo_id: str, rev: str, commit: str, root: Path) -> None:
    """Record which commit a branch/tag resolved to, so later runs find the files offline."""
    if cache.is_commit(rev):
        return
    ref_file = cache.repo_folder(repo_id, root) / "refs" / rev
    ref_file.parent.mkdir(parents=True, exist_ok=True)
    if not ref_file.exists() or ref_file.read_text().strip() != commit:
        ref_file.write_text(commit)


def fetch(listing: RepoListing, files: list[str], *, root: Path | None = None,
          progress: Progress | None = None) -> tuple[list[Path], int]:
    """Make every file of `files` present in the cache; returns local paths and bytes downloaded.
    Progress goes to `progress`, else to the installed one, else nowhere."""
    from huggingface_hub.utils import WeakFileLock

    root = root or cache.cache_dir()
    folder = cache.repo_folder(listing.ref.repo_id, root)
    progress = progress or _installed
    parts = _plan(listing, files, root)
    _check_space(parts, root)
    downloaded = 0
    with ExitStack() as stack:
        report = stack.enter_context(progress()) if parts and progress is not None else None
        for part in parts:
            if part.blob.exists():
                continue
            label = f"{listing.ref.repo_id}/{part.path}"
            if report is not None:
                report(label, part.have, part.size)

            def on_bytes(n: int, part=part, label=label) -> None:
                nonlocal downloaded
                downloaded += n
                if report is not None:
                    report(label, part.have, part.size)

            lock = root / ".locks" / folder.name / f"{part.etag}.lock"  # huggingface_hub's lock path
            lock.parent.mkdir(parents=True, exist_ok=True)
            with WeakFileLock(str(lock)):
                if not part.blob.exists():  # another process may have finished it meanwhile
                    if part.partial.exists():
                        part.have = min(part.partial.stat().st_size, part.size)
                    _get(part, on_bytes)
    for part in parts:
        _link(listing, part, root)
    paths = [folder / "snapshots" / listing.commit / f for f in files]
    write_ref(listing.ref.repo_id, listing.ref.rev, listing.commit, root)
    return paths, max(downloaded, 0)
