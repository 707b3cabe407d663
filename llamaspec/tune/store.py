"""The store of tuned configurations: `tune.json` in the user's config directory.

One entry per (target file, draft file or none, llama.cpp build, device); saving an entry replaces
the one with the same key. Writes are atomic (a temporary file, fsync, os.replace), so an
interrupt never leaves half a store; a store that cannot be read is one warning and counts as
empty (kept aside as tune.json.bad when the next entry is saved). Nothing here prints.

    lookup(target_path, draft_path) -> TunedConfig | None    # what `run`, `batch` and `bench` apply
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from llamaspec.tune.identity import FileIdentity, Fingerprint, build_identity, device_identity, file_identity

log = logging.getLogger("llamaspec.tune")

ENV_CONFIG_DIR = "LLAMASPEC_CONFIG_DIR"
STORE_NAME = "tune.json"
FORMAT = "llamaspec-tune"
VERSION = 1


def config_dir() -> Path:
    """$LLAMASPEC_CONFIG_DIR, else the platform's user config directory + /llamaspec
    ($XDG_CONFIG_HOME or ~/.config on Linux, ~/Library/Application Support on macOS, %APPDATA% on Windows)."""
    if os.environ.get(ENV_CONFIG_DIR):
        return Path(os.environ[ENV_CONFIG_DIR]).expanduser()
    if sys.platform == "win32":
        base = Path(os.environ.get("APPDATA") or Path.home() / "AppData" / "Roaming")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        xdg = os.environ.get("XDG_CONFIG_HOME", "")
        base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".config"
    return base / "llamaspec"


def store_path() -> Path:
    return config_dir() / STORE_NAME


@dataclass
class TunedConfig:
    """The settings `tune` chose for a pair, and what it measured."""

    spec_type: str                       # llama.cpp's names, comma list; "none": plain decoding won
    draft_max: int | None = None         # None: the spec type's default
    draft_p_min: float = 0.0
    ngram: dict[str, int] = field(default_factory=dict)   # NgramParams fields set by the tuning
    created: str = ""                    # ISO 8601, UTC
    ratio: float | None = None           # measured speedup over plain decoding (generation tok/s)
    plain_tok_s: float | None = None
    measured: dict[str, Any] = field(default_factory=dict)   # prompts, n, threads, margin, ...

    @property
    def date(self) -> str:
        return self.created[:10]

    def settings_text(self) -> str:
        """'spec ngram-mod, draft-max 48, mod-n-match 12'"""
        if self.spec_type == "none":
            return "spec none: plain decoding measured fastest"
        parts = [f"spec {self.spec_type}"]
        if self.draft_max is not None:
            parts.append(f"draft-max {self.draft_max}")
        if self.draft_p_min:
            parts.append(f"p-min {self.draft_p_min:g}")
        parts += [f"{k.replace('_', '-')} {v}" for k, v in sorted(self.ngram.items())]
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TunedConfig":
        known = {f.name for f in fields(cls)}
        cfg = cls(**{k: v for k, v in d.items() if k in known})
        if not isinstance(cfg.spec_type, str) or not isinstance(cfg.ngram, dict):
            raise ValueError("bad config")
        return cfg


@dataclass
class Entry:
    target: FileIdentity
    draft: FileIdentity | None
    build: Fingerprint
    device: Fingerprint
    config: TunedConfig

    def same_key(self, other: "Entry") -> bool:
        return (self.target.same_file(other.target) and _same_draft(self.draft, other.draft)
                and self.build.id == other.build.id and self.device.id == other.device.id)

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target.to_dict(), "draft": self.draft.to_dict() if self.draft else None,
                "build": self.build.to_dict(), "device": self.device.to_dict(), "config": self.config.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Entry":
        return cls(FileIdentity.from_dict(d["target"]),
                   FileIdentity.from_dict(d["draft"]) if d.get("draft") else None,
                   Fingerprint.from_dict(d["build"]), Fingerprint.from_dict(d["device"]),
                   TunedConfig.from_dict(d["config"]))


def _same_draft(a: FileIdentity | None, b: FileIdentity | None) -> bool:
    return (a is None and b is None) or (a is not None and a.same_file(b))


# ---- reading and writing ---------------------------------------------------------------------------


def read_entries(path: Path | None = None) -> list[Entry]:
    """Every entry of the store; [] when there is none, or (with one warning) when it is unreadable."""
    path = path or store_path()
    try:
        raw = path.read_bytes()   # decoded below: bytes that are not UTF-8 are a corrupt store too
    except FileNotFoundError:
        return []
    except OSError as e:
        log.warning("cannot read the tuned-config store %s (%s); ignoring it", path, e.strerror or e)
        return []
    try:
        data = json.loads(raw.decode("utf-8"))
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), list):
            raise ValueError("not a llamaspec tune store")
        if data.get("version") != VERSION:
            raise ValueError(f"store version {data.get('version')!r}, this llamaspec reads {VERSION}")
        return [Entry.from_dict(e) for e in data["entries"]]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        log.warning("the tuned-config store %s is unreadable (%s); ignoring it (`llamaspec tune --forget` "
                    "clears it)", path, str(e).splitlines()[0][:120] if str(e) else type(e).__name__)
        return []


def _is_corrupt(path: Path) -> bool:
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))   # UnicodeDecodeError is a ValueError
        return not (isinstance(data, dict) and data.get("format") == FORMAT and data.get("version") == VERSION)
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return True


def write_entries(entries: list[Entry], path: Path | None = None) -> Path:
    """Replace the store atomically with `entries` (an unreadable old store is kept as .bad)."""
    path = path or store_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    if _is_corrupt(path):
        os.replace(path, path.with_name(path.name + ".bad"))
        log.warning("the unreadable tuned-config store was kept as %s", path.with_name(path.name + ".bad"))
    doc = {"format": FORMAT, "version": VERSION, "entries": [e.to_dict() for e in entries]}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    try:  # the rename itself survives a crash once the directory is synced (POSIX)
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
    return path


# ---- what the commands use -------------------------------------------------------------------------


def current_key(target_path: str | os.PathLike[str], draft_path: str | os.PathLike[str] | None,
                n_gpu_layers: int | None = None) -> Entry:
    """An entry without a config (its key parts) for these files on this build and device."""
    return Entry(file_identity(target_path), file_identity(draft_path) if draft_path else None,
                 build_identity(), device_identity(n_gpu_layers), TunedConfig("none"))


def save(target_path: str | os.PathLike[str], draft_path: str | os.PathLike[str] | None, config: TunedConfig,
         n_gpu_layers: int | None = None, path: Path | None = None) -> Entry:
    """Store `config` for this pair, build and device (replacing an older one); returns the entry.
    path: another store file of the same format (draft_costs.py's)."""
    if not config.created:
        config.created = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
    entry = current_key(target_path, draft_path, n_gpu_layers)
    entry.config = config
    entries = [e for e in read_entries(path) if not e.same_key(entry)] + [entry]
    write_entries(entries, path)
    return entry


def lookup(target_path: str | os.PathLike[str], draft_path: str | os.PathLike[str] | None = None,
           n_gpu_layers: int | None = None, path: Path | None = None) -> TunedConfig | None:
    """The stored configuration for this target and draft (None: no draft model) on this llama.cpp
    build and device; None when nothing matches (or a file changed since it was tuned)."""
    path = path or store_path()
    if not path.exists():   # the common case costs one stat
        return None
    entries = read_entries(path)
    try:   # the files first: build and device facts only when an entry is for these files
        target = file_identity(target_path)
        draft = file_identity(draft_path) if draft_path else None
    except OSError:
        return None
    entries = [e for e in entries if e.target.same_file(target) and _same_draft(e.draft, draft)]
    if not entries:
        return None
    build, device = build_identity(), device_identity(n_gpu_layers)
    return next((e.config for e in reversed(entries) if e.build.id == build.id and e.device.id == device.id), None)


def forget(target_path: str | os.PathLike[str] | None = None) -> list[Entry]:
    """Remove every entry (target_path None) or those tuned for that target file (by path, or by
    identity when the file is there); returns the removed entries."""
    path = store_path()
    if target_path is None:
        removed = read_entries(path)
        if path.exists():
            path.unlink()
        return removed
    real = os.path.realpath(target_path)
    try:
        ident: FileIdentity | None = file_identity(target_path)
    except OSError:
        ident = None
    entries = read_entries(path)
    removed = [e for e in entries if e.target.path == real or (ident is not None and e.target.same_file(ident))]
    if removed:
        write_entries([e for e in entries if e not in removed], path)
    return removed


def is_current(entry: Entry) -> bool:
    """Do the entry's files still match (unchanged, still there) on this build? (For `tune --show`.)"""
    try:
        key = current_key(entry.target.path, entry.draft.path if entry.draft else None)
    except OSError:
        return False
    return (entry.target.same_file(key.target) and _same_draft(entry.draft, key.draft)
            and entry.build.id == key.build.id)
