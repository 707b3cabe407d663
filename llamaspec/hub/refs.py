"""Model references: tell a local path from a Hugging Face Hub reference, and parse the latter.

Grammar (case-insensitive quant, llama.cpp's `-hf` syntax plus a file path and a revision):

    org/repo                      default quant (Q4_K_M, then Q8_0, then the first GGUF)
    org/repo:Q4_K_M               a quant
    org/repo/path/to/file.gguf    one file (a shard's other parts come along)
    org/repo@REV[:QUANT | /path]  a branch, tag, commit or refs/pr/N; `org/repo:QUANT@REV` too

An optional `hf://`, `hf.co/` or `https://huggingface.co/` prefix is accepted, and a pasted
`https://huggingface.co/org/repo/blob/REV/file.gguf` URL. A local path that exists always wins.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from llamaspec.errors import UsageError

# Hub repo names: letters, digits, '-', '_', '.', not starting with a dot or dash (huggingface_hub
# validates the same way); revisions: anything but separators, or refs/pr/N style refs.
_NAME = r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,95}"
_REV = r"refs/(?:pr|convert)/[A-Za-z0-9_.\-]+|[^/:@\s]+"
_REF_RE = re.compile(
    rf"^(?P<org>{_NAME})/(?P<repo>{_NAME})"
    rf"(?:@(?P<rev>{_REV}))?"
    rf"(?::(?P<quant>[A-Za-z0-9_\-]+)(?:@(?P<rev2>{_REV}))?|/(?P<path>[^:@\s]+))?$"
)
_URL_PREFIXES = ("hf://", "hf.co/", "https://hf.co/", "https://huggingface.co/", "http://huggingface.co/")
_URL_FILE_RE = re.compile(rf"^(?P<repo_id>{_NAME}/{_NAME})/(?:blob|resolve)/(?P<rev>[^/]+)/(?P<path>.+)$")


@dataclass(frozen=True)
class HubRef:
    repo_id: str               # "org/repo"
    revision: str | None = None  # None means "main"
    quant: str | None = None     # upper-cased; None with no path means the default quant
    path: str | None = None      # a file inside the repo

    @property
    def rev(self) -> str:
        return self.revision or "main"

    def __str__(self) -> str:
        s = self.repo_id + (f"@{self.revision}" if self.revision else "")
        if self.path:
            return f"{s}/{self.path}"
        return f"{s}:{self.quant}" if self.quant else s

    def with_path(self, path: str) -> "HubRef":
        return HubRef(self.repo_id, self.revision, None, path)


def _strip_prefix(ref: str) -> tuple[str, bool]:
    for prefix in _URL_PREFIXES:
        if ref.lower().startswith(prefix):
            return ref[len(prefix):], True
    return ref, False


def _looks_local(ref: str) -> bool:
    """Shapes no Hub reference has: absolute/relative/home paths, Windows paths, `dir/x.gguf`."""
    if not ref or ref.startswith(("/", "./", "../", "~", ".\\")) or "\\" in ref or re.match(r"^[A-Za-z]:", ref):
        return True
    parts = ref.split("/")
    # `models/foo.gguf` is a local file, not repo "foo.gguf" of user "models".
    return len(parts) == 2 and parts[1].lower().endswith(".gguf")


def parse_ref(ref: str) -> HubRef | None:
    """The Hub reference `ref` spells, or None if it is not one (then it is a local path).

    Raises UsageError for strings that are clearly meant for the Hub but malformed.
    """
    text, prefixed = _strip_prefix(ref.strip())
    if not prefixed and _looks_local(text):
        return None
    m = _URL_FILE_RE.match(text) if prefixed else None
    if m:
        return _checked(HubRef(m["repo_id"], unquote(m["rev"]), None, unquote(m["path"])), ref)
    m = _REF_RE.match(text)
    if m is None:
        if prefixed:
            raise UsageError(f"not a Hub reference: {ref!r}", "use org/repo, org/repo:QUANT or org/repo/file.gguf")
        return None
    if m["path"] and not prefixed and not m["path"].lower().endswith(".gguf"):
        return None  # `dir/sub/file`: a local path that does not exist, not a Hub file
    if m["rev"] and m["rev2"]:
        raise UsageError(f"two revisions in {ref!r}", "give one @REVISION")
    quant = m["quant"].upper() if m["quant"] else None
    return _checked(HubRef(f"{m['org']}/{m['repo']}", m["rev"] or m["rev2"], quant, m["path"]), ref)


MAX_PATH_BYTES = 1000      # a repo path, UTF-8 (the cache path adds ~130 bytes; PATH_MAX is 4096)
MAX_PART_BYTES = 255       # one path component: NAME_MAX of common filesystems
_SLASHES = "\u2044\u2215\u29f8\u29f5\u29f9\ufe68\uff0f\uff3c"  # fraction/division slash, fullwidth...
_LOOKALIKE = ("/", "\\", "..")  # what NFKC-normalized confusables (U+FF0F, U+2215, U+FF0E...) must not become


def bad_path(path: str) -> str | None:
    """Why a repo file path (from a reference or the Hub's listing) may not become a cache path, or
    None if it is safe: relative, '/'-separated, no '.', '..' or empty parts, no control/format
    characters (NUL, newlines, bidi overrides, zero-width), no backslash, no look-alike of a
    separator or '..', and short enough for the filesystem."""
    if not isinstance(path, str) or not path:
        return "empty file name"
    if path.startswith("/") or re.match(r"^[A-Za-z]:", path):
        return "absolute path"
    if "\\" in path:
        return "backslash in file name"
    for ch in path:
        if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            return f"control or invisible character U+{ord(ch):04X} in file name"
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "'.', '..' or empty path component"
    for part in parts:
        folded = unicodedata.normalize("NFKC", part)
        if any(ch in _SLASHES for ch in part) or (
                folded != part and (any(x in folded for x in _LOOKALIKE) or folded in (".", ".."))):
            return "look-alike of a path separator or '..' in file name"
        if len(part.encode("utf-8", "surrogatepass")) > MAX_PART_BYTES:
            return f"path component longer than {MAX_PART_BYTES} bytes"
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        return f"file path longer than {MAX_PATH_BYTES} bytes"
    return None


def shown(name: str, limit: int = 80) -> str:
    """A hostile name made printable on one line: repr-escaped, long ones shortened."""
    text = ascii(name)
    return text if len(text) <= limit else text[:limit - 5] + "...'" + f" ({len(name)} chars)"


def _checked(h: HubRef, ref: str) -> HubRef:
    if ".." in h.repo_id or "--" in h.repo_id or h.repo_id.endswith((".", "-")):
        raise UsageError(f"invalid Hub repository name in {ref!r}", "repository names cannot contain '--' or '..'")
    if h.revision is not None and bad_path(h.revision) is not None:
        raise UsageError(f"invalid revision {shown(h.revision)} in {shown(ref)}: {bad_path(h.revision)}",
                         "give a branch, tag, commit or refs/pr/N after '@'")
    if h.path is not None:
        if not h.path.lower().endswith(".gguf"):
            raise UsageError(f"{shown(ref)} names a file that is not a .gguf",
                             "give org/repo/path/file.gguf or org/repo:QUANT")
        why = bad_path(h.path)
        if why is not None:
            raise UsageError(f"invalid file path {shown(h.path)} in {shown(ref)}: {why}",
                             "give the file's path inside the repository")
    return h


def classify(ref: str | Path) -> Path | HubRef:
    """A local Path if `ref` exists on disk or has no Hub shape, else the parsed HubRef."""
    path = Path(ref).expanduser()
    if isinstance(ref, Path) or path.exists():
        return path
    hub = parse_ref(str(ref))
    return path if hub is None else hub


def is_hub_ref(ref: str | Path) -> bool:
    return isinstance(classify(ref), HubRef)
