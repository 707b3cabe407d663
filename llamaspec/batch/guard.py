"""What `llamaspec batch` checks about OUTPUT before any model loads: that it can be written at all
(`check_output_path`), and that no other job is writing it (`OutputLock`).

The lock is an OS lock (flock) on OUTPUT + ".lock", a file holding the owner's pid: the kernel
drops it when the process ends, however it ends (SIGKILL, a crash), so a lock file left behind
never blocks the next run; only a live process holds it.

>>> import tempfile, os
>>> d = tempfile.mkdtemp()
>>> with OutputLock(os.path.join(d, "out.jsonl")) as lock:
...     os.path.basename(lock.path), open(lock.path).read() == str(os.getpid())
('out.jsonl.lock', True)
>>> os.path.exists(os.path.join(d, "out.jsonl.lock"))   # removed on a clean exit
False
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from contextlib import suppress

from llamaspec.errors import UsageError

__all__ = ["check_output_path", "OutputLock", "LOCK_SUFFIX", "MIN_FREE_BYTES"]

LOCK_SUFFIX = ".lock"
MIN_FREE_BYTES = 1 << 20   # under this, the first records would already fail: say so up front


def check_output_path(output_path: str | os.PathLike) -> None:
    """Raise UsageError (one line naming the directory) unless OUTPUT's directory exists, is a
    directory, takes a new file (a real probe: os.access says yes to root on a read-only mount)
    and has MIN_FREE_BYTES free; also when OUTPUT itself is a directory or not writable."""
    out = os.fspath(output_path)
    directory = os.path.dirname(os.path.abspath(out))
    if os.path.isdir(out):
        raise UsageError(f"-o {out} is a directory", hint="give a file path")
    if not os.path.exists(directory):
        raise UsageError(f"cannot write -o {out}: directory {directory} does not exist",
                         hint=f"create it (mkdir -p {directory}) or give another -o")
    if not os.path.isdir(directory):
        raise UsageError(f"cannot write -o {out}: {directory} is not a directory", hint="give another -o")
    for target, probe in ((f"directory {directory}", _probe_directory), (out, _probe_file)):
        try:
            probe(directory, out)
        except OSError as e:
            why = {errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
                   errno.EPERM: "permission denied", errno.ENOSPC: "no space left on device",
                   errno.EDQUOT: "disk quota exceeded", errno.ENOENT: "cannot create files there"}.get(
                e.errno, e.strerror or type(e).__name__)
            raise UsageError(f"cannot write -o {out}: {target}: {why}",
                             hint="give an -o in a writable directory") from None
    free = shutil.disk_usage(directory).free
    if free < MIN_FREE_BYTES:
        raise UsageError(f"cannot write -o {out}: directory {directory} has {free} bytes free",
                         hint="free some space or give an -o on another disk")


def _probe_directory(directory: str, out: str) -> None:
    fd, probe = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(out)}.", suffix=".probe")
    os.close(fd)
    os.unlink(probe)


def _probe_file(directory: str, out: str) -> None:
    if os.path.exists(out):
        with open(out, "ab"):
            pass


class OutputLock:
    """flock on OUTPUT + ".lock" for the life of the job; UsageError naming the file and the other
    process's pid when another job holds it. Taken before any model loads; released (and the
    file removed) on exit, and by the kernel when the process dies any other way."""

    def __init__(self, output_path: str | os.PathLike):
        self.output = os.fspath(output_path)
        self.path = self.output + LOCK_SUFFIX
        self._fd = -1

    def acquire(self) -> None:
        import fcntl  # POSIX only; imported here so that the rest of the package loads anywhere

        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                raise UsageError(f"{self.output} is being written by another llamaspec batch "
                                 f"({self._holder()}; lock {self.path})",
                                 hint="wait for it to finish, or give another -o") from None
            # The holder before us may have removed the file between our open and our flock: a
            # lock on that orphan would exclude no one, so lock the file that is there now.
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        os.fsync(fd)
        self._fd = fd

    def _holder(self) -> str:
        with suppress(OSError, ValueError):
            with open(self.path, encoding="ascii") as f:
                return f"pid {int(f.read().strip())}"
        return "pid unknown"

    def release(self) -> None:
        if self._fd >= 0:
            with suppress(OSError):
                os.unlink(self.path)   # while still locked: the next job makes a fresh one
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> OutputLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
