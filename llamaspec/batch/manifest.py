"""The manifest beside OUTPUT (`OUTPUT.llamaspec.json`): one OUTPUT holds one job's records.

A resume is refused (unless --force) when what the user asked for changed (`settings`: the model,
the flags) or when INPUT changed under records OUTPUT already holds (`input`: its path, and a hash
of each line by id). What the job ran with in effect (the spec type a stored `tune` configuration
chose, the draft `auto` found) is recorded under `effective`, for the reader only: forgetting a
tune, or a new draft on disk, does not make the same command another job.

    {"format": "llamaspec-batch/2",
     "settings": {"model": "/m/a.gguf", "model_size": 123, "temperature": 0.0, ...},
     "input": {"path": "/data/in.jsonl", "size": 2048, "sha256": "…", "lines": {"q1": "9f86d081884c7d65", ...}},
     "effective": {"spec_type": "ngram-mod", "tuned": {...}, ...}}

>>> from llamaspec.batch.requests import parse_requests
>>> lines = [b'{"id": "a", "prompt": "x"}', b'', b'{"prompt": "y"}']
>>> ident = input_identity("-", lines, parse_requests(lines))
>>> ident["path"], ident["size"], sorted(ident["lines"])
('-', 43, ['a', 'line-3'])
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Iterable

from llamaspec.batch.requests import LineError, Request
from llamaspec.batch.results import write_atomic
from llamaspec.errors import UsageError, disk_full

__all__ = ["check_or_write_manifest", "manifest_path", "input_identity", "MANIFEST_SUFFIX"]

MANIFEST_SUFFIX = ".llamaspec.json"
FORMAT = "llamaspec-batch/2"   # /1 compared the effective settings (tuned ones included)
_FORCE_HINT = "--force to continue with the new settings, or a new -o"


def manifest_path(output_path: str | os.PathLike) -> str:
    return os.fspath(output_path) + MANIFEST_SUFFIX


def _line_hash(raw: bytes) -> str:
    return hashlib.sha256(raw.strip()).hexdigest()[:16]


def input_identity(path_or_dash: str, lines: list[bytes], items: Iterable[Request | LineError]) -> dict:
    """INPUT's identity: its path ("-" for standard input), size, a hash of the whole and one of
    each line by id (a line's bytes less surrounding white space: CRLF or LF ends are one line)."""
    whole = hashlib.sha256()
    for raw in lines:
        whole.update(raw.rstrip(b"\r") + b"\n")
    return {"path": path_or_dash if path_or_dash == "-" else os.path.abspath(path_or_dash),
            "size": sum(len(raw) + 1 for raw in lines) - 1 if lines else 0,
            "sha256": whole.hexdigest(),
            "lines": {it.id: _line_hash(lines[it.line - 1]) for it in items}}


def _first_difference(old: dict, new: dict, prefix: str = "") -> tuple[str, str, str]:
    """(dotted key, old, new) of the first differing setting, in the new settings' order."""
    absent = object()
    for key in [*new, *(k for k in old if k not in new)]:
        a, b = old.get(key, absent), new.get(key, absent)
        if a != b:
            if isinstance(a, dict) and isinstance(b, dict):
                return _first_difference(a, b, f"{prefix}{key}.")
            a, b = ("(absent)" if v is absent else json.dumps(v) for v in (a, b))
            return f"{prefix}{key}", a, b
    raise AssertionError("no difference")


def _input_problem(out: str, old: Any, new: dict, recorded: set[str] | None,
                   where: dict[str, int]) -> str | None:
    """Why INPUT `new` cannot go on filling OUTPUT started from INPUT `old`, or None. Lines added,
    and lines changed that OUTPUT has no record of, are fine: they are simply (re)done."""
    if not isinstance(old, dict) or old.get("sha256") == new["sha256"]:
        return None   # an older manifest without it, or the same bytes (wherever the file is now)
    if "-" not in (old.get("path"), new["path"]) and old.get("path") != new["path"]:
        return f"{out} was started with input {old.get('path')}, now {new['path']}"
    before, now = old.get("lines") or {}, new["lines"]
    for rid in before:
        if recorded is not None and rid not in recorded or now.get(rid) == before[rid]:
            continue
        if rid not in now:
            return f"{out} has a record for id {json.dumps(rid)}, which is no longer in the input"
        return (f"{out} has a record for id {json.dumps(rid)}, whose request (input line "
                f"{where.get(rid, '?')}) changed since")
    return None


def check_or_write_manifest(output_path: str | os.PathLike, settings: dict, force: bool = False, *,
                            input: dict | None = None, recorded: set[str] | None = None,
                            effective: dict | None = None, lines_of: dict[str, int] | None = None) -> str:
    """Keep one OUTPUT to one job, recorded in OUTPUT + ".llamaspec.json". `settings` is what the
    user asked for (model identity and flags, JSON-able); `input` is `input_identity(...)`;
    `recorded` the ids OUTPUT holds (None: every id of the earlier input counts as recorded);
    `effective` is written for information and never compared; `lines_of` maps ids to their input
    line, to name it. Returns "written" (no OUTPUT yet, or an empty one), "unchanged" (a resume)
    or "overwritten" (force). Raises UsageError naming what changed ("out.jsonl was started with
    other settings: temperature was 0.0, now 0.7", an edited request under a recorded id, another
    input file) or when OUTPUT has no manifest."""
    out, mpath = os.fspath(output_path), manifest_path(output_path)
    if os.path.isdir(out):
        raise UsageError(f"-o {out} is a directory", hint="give a file path")
    new = json.loads(json.dumps(settings))  # as a re-read will see it (tuples become lists)
    status = "written"
    if os.path.exists(out) and os.path.getsize(out) > 0:
        try:
            with open(mpath, encoding="utf-8") as f:
                doc = json.load(f)
            old = doc.get("settings")
            problem = None if isinstance(old, dict) else f"{mpath} holds no settings"
        except FileNotFoundError:
            doc, old, problem = {}, None, f"{out} exists without {os.path.basename(mpath)} " \
                                          "(it was not written by llamaspec batch)"
        except (ValueError, AttributeError) as e:
            doc, old, problem = {}, None, f"{mpath} is unreadable ({type(e).__name__})"
        if problem is None and doc.get("format", FORMAT) != FORMAT:
            problem = f"{out} was started by an older llamaspec (manifest {doc.get('format')})"
        if problem is None and old != new:
            key, a, b = _first_difference(old, new)
            problem = f"{out} was started with other settings: {key} was {a}, now {b}"
        if problem is None and input is not None:
            problem = _input_problem(out, doc.get("input"), input, recorded, lines_of or {})
        if problem is not None and not force:
            raise UsageError(problem, hint=_FORCE_HINT)
        status = "unchanged" if problem is None else "overwritten"
    doc = {"format": FORMAT, "settings": new}
    if input is not None:
        doc["input"] = input
    if effective is not None:
        doc["effective"] = json.loads(json.dumps(effective, default=str))
    try:   # rewritten on a resume too: it describes INPUT as it is now (lines added, --force)
        write_atomic(mpath, [(json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n").encode()])
    except OSError as e:
        raise disk_full(mpath, e, "free some space, then run the same command again") or e
    return status
