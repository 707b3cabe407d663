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
import hashlib
import os
import re
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
from llamaspec.hub.refs import bad_path, shown
from llamaspec.hub.remote import RepoListing, hf_headers, timeout

MAX_FAILURES = 3        # consecutive attempts without progress before giving up (about 3 s)
_ETAG = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$")  # it names a blob file: never a path
DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)       # no space, file too big (RLIMIT_FSIZE), quota

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
    sha256: str | None = None   # the LFS sha256 the Hub lists: checked before the blob is moved into place
    git_oid: str | None = None  # else the git blob id (sha1 of "blob N\0" + data)
    again: str = "run the same command again"

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
        if bad_path(f) is not None or not cache.is_commit(listing.commit):  # list_repo refused these already
            raise HubError(f"refusing unsafe file name {shown(f)} in {listing.ref.repo_id}: {bad_path(f)}",
                           "the repository is broken or hostile; use another one")
        if cache.present(folder / "snapshots" / listing.commit / f, folder):
            continue
        url = listing.url(f)
        with hub_errors(listing.ref.with_path(f)):
            meta = get_hf_file_metadata(url, timeout=timeout().read, endpoint=endpoint())
        if not meta.etag:
            raise HubError(f"the Hub sent no ETag for {f}", "is HF_ENDPOINT a Hugging Face Hub?")
        if not _ETAG.match(meta.etag):
            raise HubError(f"the Hub sent an invalid ETag for {f}: {shown(meta.etag)}",
                           "is HF_ENDPOINT a Hugging Face Hub?")
        listed = listing.sizes.get(f)
        if meta.size is not None and listed is not None and meta.size != listed:
            raise HubError(f"the Hub lists {f} as {listed:,} bytes but serves {meta.size:,} bytes; nothing downloaded",
                           "the repository may be changing right now: retry later")
        size = meta.size if meta.size is not None else listed or 0
        blob = folder / "blobs" / meta.etag
        part = Part(f, size, meta.etag, meta.location, urlsplit(meta.location).netloc == urlsplit(url).netloc, blob,
                    sha256=listing.sha256.get(f), git_oid=listing.git_oid.get(f),
                    again=f"run `llamaspec pull {listing.ref}` (or the same command) again")
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


def _corrupt(part: Part, what: str) -> HubError:
    """Drop a partial file that cannot become the blob, and say so."""
    part.partial.unlink(missing_ok=True)
    part.have = 0
    return HubError(f"download of {part.path} is corrupt: {what}; the partial file was removed, "
                    "nothing was put in the cache", f"{part.again} to download it afresh")


def _verify(part: Part) -> None:
    """The finished .incomplete file against the sha256 (or git blob id) the Hub lists."""
    if part.sha256:
        h, want, kind = hashlib.sha256(), part.sha256, "sha256"
    elif part.git_oid:
        h, want, kind = hashlib.sha1(f"blob {part.have}\0".encode()), part.git_oid, "git blob id"
    else:
        return
    with open(part.partial, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    if h.hexdigest() != want:
        raise _corrupt(part, f"its {kind} is {h.hexdigest()[:16]}..., the Hub lists {want[:16]}...")


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
                if r.status_code == 416 and part.have:
                    r.read()  # nothing after our partial file: the server's file is shorter than announced
                    raise _corrupt(part, f"the server has only {part.have:,} of the {part.size:,} bytes it announced")
                if r.status_code >= 400:
                    r.read()
                    hf_raise_for_status(r)
                mode = "ab" if part.have and r.status_code == 206 else "wb"
                if mode == "wb":
                    lost, part.have = part.have, 0
                    on_bytes(-lost)  # the server ignored Range: start over
                with open(part.partial, mode) as f:
                    for chunk in r.iter_bytes():  # as received: a cut loses nothing already here
                        if part.size and part.have + len(chunk) > part.size:
                            f.close()
                            raise _corrupt(part, f"the server sent more than the {part.size:,} bytes it announced")
                        f.write(chunk)
                        part.have += len(chunk)
                        on_bytes(len(chunk))
            if part.size == 0:
                break
            if part.have < part.size and (r.status_code != 206 or part.have == before):
                # A complete response (httpx checked its Content-Length) that ends short of the size
                # announced: not a cut connection but a wrong file.
                raise _corrupt(part, f"the server sent {part.have:,} of the {part.size:,} bytes it announced")
        except (httpx2.TransportError, httpx2.RemoteProtocolError) as exc:
            failures = 0 if part.have > before else failures + 1
            if failures >= MAX_FAILURES:
                kept = f"{human_size(part.have)} of {human_size(part.size)} kept"
                raise HubError(f"download of {part.path} interrupted: lost the connection to {endpoint()} ({kept})",
                               "check your network, then run the same command again to resume") from exc
            time.sleep(0.5 * failures)
        except OSError as exc:
            if exc.errno in DISK_FULL:
                big = exc.errno == errno.EFBIG
                why = "file too large for this disk (or the process's file-size limit)" if big else "disk full"
                raise HubError(
                    f"{why} while downloading {part.path} "
                    f"({human_size(part.have)} of {human_size(part.size)} kept in {part.partial.name})",
                    ("point HF_HUB_CACHE at another disk or raise the limit" if big else "free some space")
                    + f", then {part.again} to resume",
                ) from None
            raise
    if part.size and part.have != part.size:
        raise _corrupt(part, f"got {part.have:,} bytes, expected {part.size:,}")
    _verify(part)
    os.replace(part.partial, part.blob)


def _link(listing: RepoListing, part: Part, root: Path) -> Path:
    """Create snapshots/<commit>/<path> -> ../../blobs/<etag>, as huggingface_hub does.

    Done here rather than by a second hf_hub_download call: that costs a HEAD per file and, if
    the network dropped right after the download, ~23 s of retries before it gives up.
    """
    folder = cache.repo_folder(listing.ref.repo_id, root)
    pointer = folder / "snapshots" / listing.commit / part.path
    if cache.present(pointer, folder):
        return pointer
    pointer.parent.mkdir(parents=True, exist_ok=True)
    if pointer.is_symlink():  # dangling (its blob was deleted) or leading out of the cache: replace it
        pointer.unlink(missing_ok=True)
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
        tmp = ref_file.with_name(f".{ref_file.name}.{os.getpid()}.tmp")
        tmp.write_text(commit)
        os.replace(tmp, ref_file)  # never a half-written ref


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
