"""The pairings/*.yaml file format: YAML read with line numbers, the schema check, and writing back.

Every problem is a RegistryError naming file and line (`pairings/qwen3.yaml:12: ...`), so a bad
edit never turns into a wrong recommendation. The schema itself is described in pairings/SCHEMA.md;
`validate` checks a parsed file against it and returns its fields, which registry.py turns into
records. `dump_family` writes a family the way the shipped files look (scripts/verify_pairings.py).
"""

from __future__ import annotations

import re
import reprlib
from pathlib import Path
from typing import Any

import yaml

from llamaspec.errors import RegistryError

SCHEMA_VERSION = 1
STATUSES = ("verified", "unverified", "incompatible")
ROLES = ("main", "draft", "both")
# llama.cpp's spec type a draft entry drafts as: an ordinary smaller model, or a draft made for a
# target (EAGLE-3, DFlash, DSpark, a Gemma 4 assistant's MTP heads); gguf/drafts.py tells them apart
DRAFT_KINDS = ("draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark", "draft-mtp")
VOCAB_TYPE_NAMES = ("NONE", "SPM", "BPE", "WPM", "UGM", "RWKV", "PLAMO2", "TEST")
HEADER_COMMENT = (
    "# llamaspec pairing registry, one model family per file. Schema: pairings/SCHEMA.md.\n"
    "# Pair statuses and `verified` records are written by scripts/verify_pairings.py.\n"
)
_HINT = "fix the file; the format is described in pairings/SCHEMA.md"
_FP = re.compile(r"^[0-9a-f]{16}$")
_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_ID = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
class _Brief(reprlib.Repr):
    def repr_LineList(self, x, level):  # noqa: N802 - reprlib dispatches on the type's name
        return self.repr_list(x, level)

    def repr_LineDict(self, x, level):  # noqa: N802
        return self.repr_dict(x, level)


_REPR = _Brief()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxtuple, _REPR.maxset = 2, 4, 4, 4, 4
_REPR.maxstring, _REPR.maxlong, _REPR.maxother = 60, 40, 60


def brief(value: Any) -> str:
    """A value shown in an error: bounded, whatever it is (a YAML alias bomb expands to 10^N items)."""
    return _REPR.repr(value)


# ---- YAML with line numbers --------------------------------------------------------------------


class LineDict(dict):
    line = 0
    key_lines: dict


class LineList(list):
    line = 0
    item_lines: list


_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BaseLoader):  # type: ignore[misc, valid-type]
    pass


def _construct_mapping(loader, node):
    loader.flatten_mapping(node)
    d = LineDict()
    d.line = node.start_mark.line + 1
    d.key_lines = {}
    for k_node, v_node in node.value:
        key = loader.construct_object(k_node, deep=True)
        line = k_node.start_mark.line + 1
        if not isinstance(key, (str, int, float, bool)) and key is not None:
            raise _LineError(line, "mapping keys must be plain scalars")
        if key in d:
            raise _LineError(line, f"duplicate key {brief(key)}")
        d[key] = loader.construct_object(v_node, deep=True)
        d.key_lines[key] = line
    return d


def _construct_sequence(loader, node):
    lst = LineList(loader.construct_object(n, deep=True) for n in node.value)
    lst.line = node.start_mark.line + 1
    lst.item_lines = [n.start_mark.line + 1 for n in node.value]
    return lst


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


class _LineError(Exception):
    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line = line
        self.message = message


def plain(obj: Any) -> Any:
    """LineDict/LineList -> dict/list (for yaml.safe_dump)."""
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [plain(v) for v in obj]
    return obj


def read_yaml(path: Path) -> Any:
    """Parse one registry file, keeping line numbers; YAML errors become RegistryError(file:line)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RegistryError(f"cannot read registry file {path}: {exc.strerror or exc}", _HINT) from None
    except UnicodeDecodeError:
        raise RegistryError(f"{path}: not UTF-8 text", _HINT) from None
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except _LineError as exc:
        raise RegistryError(f"{path}:{exc.line}: {exc.message}", _HINT) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 0
        what = exc.problem or exc.context or "invalid YAML"
        if exc.context and exc.context_mark and exc.problem_mark and exc.context_mark.line != exc.problem_mark.line:
            what += f" ({exc.context} started at line {exc.context_mark.line + 1})"
        raise RegistryError(f"{path}:{line}: invalid YAML: {what}", _HINT) from None
    except yaml.YAMLError as exc:  # the reader's errors (a NUL, bad UTF-8) carry a position, not a mark
        pos = getattr(exc, "position", None)
        where = f":{text.count(chr(10), 0, pos) + 1}" if isinstance(pos, int) else ""
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RegistryError(f"{path}{where}: invalid YAML: {first}", _HINT) from None
    except RecursionError:
        raise RegistryError(f"{path}: invalid YAML: nested too deeply", _HINT) from None


# ---- validation --------------------------------------------------------------------------------


class _V:
    """Validation helpers bound to one file: every error names file and line."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, line: int, message: str):
        raise RegistryError(f"{self.path}:{line}: {message}", _HINT)

    def mapping(self, obj, line: int, what: str) -> LineDict:
        if not isinstance(obj, dict):
            self.fail(getattr(obj, "line", line), f"{what} must be a mapping")
        return obj

    def keys(self, d: LineDict, what: str, required: set[str], optional: set[str]) -> None:
        for k in d:
            if k not in required and k not in optional:
                allowed = ", ".join(sorted(required | optional))
                self.fail(d.key_lines.get(k, d.line), f"unknown key {brief(k)} in {what} (allowed: {allowed})")
        for k in sorted(required):
            if k not in d:
                self.fail(d.line, f"{what} is missing required key {brief(k)}")

    def line(self, d: LineDict, key: str) -> int:
        return d.key_lines.get(key, d.line)

    def string(self, d: LineDict, key: str, *, optional: bool = False, pattern: re.Pattern | None = None,
               what: str = "") -> str | None:
        v = d.get(key)
        if v is None and optional:
            return None
        if not isinstance(v, str) or not v.strip():
            self.fail(self.line(d, key), f"{what}{key} must be a non-empty string")
        if pattern is not None and not pattern.match(v):
            self.fail(self.line(d, key), f"{what}{key} {brief(v)} is not in the expected form ({pattern.pattern})")
        return v

    def choice(self, d: LineDict, key: str, choices, what: str = "") -> str:
        v = d.get(key)
        if v not in choices:
            self.fail(self.line(d, key), f"{what}{key} must be one of {', '.join(choices)} (got {brief(v)})")
        return v

    def boolean(self, d: LineDict, key: str, default: bool = False) -> bool:
        if key not in d:
            return default
        v = d[key]
        if not isinstance(v, bool):
            self.fail(self.line(d, key), f"{key} must be true or false (got {brief(v)})")
        return v

    def str_list(self, d: LineDict, key: str, *, pattern: re.Pattern | None = None, optional: bool = False,
                 nonempty: bool = True) -> tuple[str, ...]:
        v = d.get(key)
        if v is None and optional:
            return ()
        if not isinstance(v, list) or (nonempty and not v):
            self.fail(self.line(d, key), f"{key} must be a {'non-empty ' if nonempty else ''}list")
        for i, item in enumerate(v):
            ln = v.item_lines[i] if isinstance(v, LineList) else self.line(d, key)
            if not isinstance(item, str) or (pattern is not None and not pattern.match(item)):
                self.fail(ln, f"{key}[{i}] must be a string" + (f" of the form {pattern.pattern}" if pattern else ""))
        return tuple(v)


def validate(data: Any, path: Path) -> dict:
    """Check one parsed family file against the schema; RegistryError(file:line) on the first problem.

    Returns the family's fields, normalized: the keyword arguments of registry.Family, with the
    tokenizer, models and pairs as keyword dicts of their records (registry.validate_family builds them).
    """
    v = _V(path)
    top = v.mapping(data, 1, "the file")
    v.keys(top, "the file", {"schema", "family", "description", "architectures", "tokenizer", "models", "pairs"},
           {"mtp", "mtp_note"})
    if top["schema"] != SCHEMA_VERSION:
        v.fail(v.line(top, "schema"), f"schema must be {SCHEMA_VERSION} (got {brief(top['schema'])})")
    name = v.string(top, "family", pattern=_ID)
    if name != path.stem:
        v.fail(v.line(top, "family"), f"family {brief(name)} must match the file name {path.stem!r}")
    description = v.string(top, "description")
    archs = v.str_list(top, "architectures")
    mtp = v.boolean(top, "mtp")
    mtp_note = v.string(top, "mtp_note", optional=True)

    tk = v.mapping(top["tokenizer"], v.line(top, "tokenizer"), "tokenizer")
    v.keys(tk, "tokenizer", {"type", "source"}, {"pre", "sizes", "fingerprints"})
    ttype = v.choice(tk, "type", VOCAB_TYPE_NAMES, "tokenizer.")
    pre = v.string(tk, "pre", optional=True, what="tokenizer.")
    sizes = tk.get("sizes") or []
    if not isinstance(sizes, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes):
        v.fail(v.line(tk, "sizes"), "tokenizer.sizes must be a list of positive integers")
    fps = v.str_list(tk, "fingerprints", pattern=_FP, optional=True, nonempty=False)
    tokenizer = dict(type=ttype, pre=pre, sizes=tuple(sizes), fingerprints=fps,
                     source=v.string(tk, "source", what="tokenizer."))

    models_raw = top["models"]
    if not isinstance(models_raw, list):
        v.fail(v.line(top, "models"), "models must be a list")
    models: list[dict] = []
    for i, raw in enumerate(models_raw):
        ln = models_raw.item_lines[i] if isinstance(models_raw, LineList) else v.line(top, "models")
        m = v.mapping(raw, ln, f"models[{i}]")
        v.keys(m, f"models[{i}]", {"id", "role", "source"},
               {"repo", "quant", "package", "file", "derived_from", "params", "note", "kind"})
        mid = v.string(m, "id", pattern=_ID)
        if any(x["id"] == mid for x in models):
            v.fail(v.line(m, "id"), f"duplicate model id {brief(mid)}")
        kinds = [k for k in ("repo", "package", "derived_from") if k in m]
        if len(kinds) != 1:
            v.fail(m.line, f"model {brief(mid)} needs exactly one of repo, package, derived_from (has {kinds or 'none'})")
        params = m.get("params")
        if params is not None and (isinstance(params, bool) or not isinstance(params, (int, float)) or params <= 0):
            v.fail(v.line(m, "params"), "params must be a positive number (billions of parameters)")
        repo = v.string(m, "repo", optional=True, pattern=_REPO)
        quant = v.string(m, "quant", optional=True)
        package = v.string(m, "package", optional=True)
        file = v.string(m, "file", optional=True)
        derived = v.string(m, "derived_from", optional=True)
        if (repo or derived) and not quant:
            v.fail(m.line, f"model {brief(mid)} needs a quant (the tag matched against the repo's file listing)")
        if package and not file:
            v.fail(m.line, f"model {brief(mid)} from a package needs `file` (its path inside site-packages)")
        if derived and not any(x["id"] == derived for x in models):
            v.fail(v.line(m, "derived_from"), f"derived_from {brief(derived)} must name a model listed before it")
        kind = v.choice(m, "kind", DRAFT_KINDS, f"model {brief(mid)} ") if "kind" in m else "draft-simple"
        if kind != "draft-simple" and m.get("role") != "draft":
            v.fail(v.line(m, "kind"), f"model {brief(mid)} of kind {kind} must have role draft (it only drafts)")
        models.append(dict(id=mid, role=v.choice(m, "role", ROLES), kind=kind,
                           params_b=None if params is None else float(params), source=v.string(m, "source"),
                           repo=repo, quant=quant, package=package, file=file, derived_from=derived,
                           note=v.string(m, "note", optional=True), line=m.line))

    pairs_raw = top["pairs"]
    if not isinstance(pairs_raw, list):
        v.fail(v.line(top, "pairs"), "pairs must be a list")
    roles = {m["id"]: m["role"] for m in models}
    pairs: list[dict] = []
    for i, raw in enumerate(pairs_raw):
        ln = pairs_raw.item_lines[i] if isinstance(pairs_raw, LineList) else v.line(top, "pairs")
        p = v.mapping(raw, ln, f"pairs[{i}]")
        v.keys(p, f"pairs[{i}]", {"main", "draft", "status"}, {"recommended", "verified", "note", "translated"})
        main, draft = v.string(p, "main"), v.string(p, "draft")
        if roles.get(main) not in ("main", "both"):
            v.fail(v.line(p, "main"), f"pairs[{i}].main {brief(main)} is not a model with role main/both in this file")
        if roles.get(draft) not in ("draft", "both"):
            v.fail(v.line(p, "draft"), f"pairs[{i}].draft {brief(draft)} is not a model with role draft/both in this file")
        if any(x["main"] == main and x["draft"] == draft for x in pairs):
            v.fail(p.line, f"duplicate pair {main} <- {draft}")
        status = v.choice(p, "status", STATUSES, f"pairs[{i}].")
        record = p.get("verified")
        if status == "unverified" and record is not None:
            v.fail(v.line(p, "verified"), "an unverified pair must not carry a `verified` record")
        if status != "unverified":
            if record is None:
                v.fail(v.line(p, "status"), f"status {status} needs a `verified` record (date, how, fingerprints)")
            rec = v.mapping(record, v.line(p, "verified"), "verified")
            v.keys(rec, "verified", {"date", "how", "main_fingerprint", "draft_fingerprint"},
                   {"main_file", "draft_file", "reason"})
            date = rec["date"]
            if not isinstance(date, str) or not _DATE.match(date):
                v.fail(v.line(rec, "date"), "verified.date must be a quoted 'YYYY-MM-DD' string")
            v.string(rec, "how", what="verified.")
            v.string(rec, "main_fingerprint", pattern=_FP, what="verified.")
            v.string(rec, "draft_fingerprint", pattern=_FP, what="verified.")
            for key in ("main_file", "draft_file", "reason"):
                v.string(rec, key, optional=True, what="verified.")
            record = plain(rec)
        # translated: the draft has another vocabulary and drafts through text (compat.Verdict.kind);
        # listing it says it pays for that main, so --draft auto may take it
        pairs.append(dict(main=main, draft=draft, status=status, recommended=v.boolean(p, "recommended"),
                          verified=record, note=v.string(p, "note", optional=True), line=p.line,
                          translated=v.boolean(p, "translated")))
    if not mtp and not any(m["role"] in ("draft", "both") for m in models) and models:
        v.fail(v.line(top, "models"), "a family that is not mtp needs at least one draft model")
    return dict(name=name, path=path, description=description, architectures=archs, tokenizer=tokenizer,
                models=models, pairs=pairs, mtp=mtp, mtp_note=mtp_note)


def dump_family(data: dict) -> str:
    """Serialize a (plain) family dict the way the shipped files look: header comment + block YAML."""
    return HEADER_COMMENT + yaml.safe_dump(plain(data), sort_keys=False, allow_unicode=True, width=110,
                                           default_flow_style=False)
