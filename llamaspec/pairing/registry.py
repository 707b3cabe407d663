"""The pairing registry: pairings/*.yaml, one file per model family (schema: pairings/SCHEMA.md).

Loading validates: a broken YAML file or a schema error raises RegistryError naming the file and
line, so a bad edit never turns into a wrong recommendation. A file is matched to a model by its
vocabulary (fingerprint, else tokenizer facts) and architecture, never by file name.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from llamaspec.errors import RegistryError

SCHEMA_VERSION = 1
STATUSES = ("verified", "unverified", "incompatible")
ROLES = ("main", "draft", "both")
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


def default_pairings_dir() -> Path:
    """$LLAMASPEC_PAIRINGS, else pairings/ beside the package (source checkout / editable install),
    else the copy a wheel installs as llamaspec/pairings (pyproject maps it there)."""
    env = os.environ.get("LLAMASPEC_PAIRINGS")
    if env:
        return Path(env).expanduser()
    package = Path(__file__).resolve().parents[1]  # llamaspec/
    checkout = package.parent / "pairings"
    return checkout if checkout.is_dir() else package / "pairings"


# ---- records -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tokenizer:
    type: str
    pre: str | None
    sizes: tuple[int, ...]
    fingerprints: tuple[str, ...]
    source: str

    def to_dict(self) -> dict:
        return {"type": self.type, "pre": self.pre, "sizes": list(self.sizes),
                "fingerprints": list(self.fingerprints), "source": self.source}


@dataclass(frozen=True)
class Model:
    id: str
    role: str                     # main | draft | both
    params_b: float | None        # billions of parameters
    source: str                   # where the entry comes from
    repo: str | None = None       # Hub repo ...
    quant: str | None = None      # ... and quant tag, resolved by listing the repo (org/repo:QUANT)
    package: str | None = None    # or a PyPI package carrying the GGUF ...
    file: str | None = None       # ... at this path inside site-packages
    derived_from: str | None = None  # or a local requantization of another entry (quant = target type)
    note: str | None = None
    line: int = 0

    @property
    def ref(self) -> str | None:
        """The Hub reference `org/repo:QUANT` hub.resolve_model understands, if this is a Hub entry."""
        if self.repo is None:
            return None
        return f"{self.repo}:{self.quant}" if self.quant else self.repo

    @property
    def label(self) -> str:
        if self.repo:
            return self.ref or self.repo
        if self.package:
            return f"pypi:{self.package} {self.file}"
        return f"{self.derived_from} requantized to {self.quant}"

    @property
    def is_draft(self) -> bool:
        return self.role in ("draft", "both")

    @property
    def is_main(self) -> bool:
        return self.role in ("main", "both")

    def to_dict(self) -> dict:
        d = {"id": self.id, "role": self.role, "params_b": self.params_b, "ref": self.ref, "repo": self.repo,
             "quant": self.quant, "package": self.package, "file": self.file, "derived_from": self.derived_from,
             "source": self.source, "note": self.note}
        return {k: v for k, v in d.items() if v is not None}


@dataclass(frozen=True)
class Pair:
    main: str
    draft: str
    status: str                   # verified | unverified | incompatible
    recommended: bool = False
    verified: dict | None = None  # date, how, main_file, draft_file, fingerprints (for verified/incompatible)
    note: str | None = None
    line: int = 0

    def to_dict(self) -> dict:
        d = {"main": self.main, "draft": self.draft, "status": self.status, "recommended": self.recommended,
             "verified": self.verified, "note": self.note}
        return {k: v for k, v in d.items() if v is not None}


@dataclass(frozen=True)
class Family:
    name: str
    path: Path
    description: str
    architectures: tuple[str, ...]
    tokenizer: Tokenizer
    models: tuple[Model, ...]
    pairs: tuple[Pair, ...]
    mtp: bool = False             # natively MTP-capable: needs no separate draft
    mtp_note: str | None = None

    def model(self, model_id: str) -> Model:
        return next(m for m in self.models if m.id == model_id)

    def drafts(self) -> list[Model]:
        return [m for m in self.models if m.is_draft]

    def to_dict(self) -> dict:
        return {"name": self.name, "file": str(self.path), "description": self.description,
                "architectures": list(self.architectures), "tokenizer": self.tokenizer.to_dict(),
                "mtp": self.mtp, "mtp_note": self.mtp_note,
                "models": [m.to_dict() for m in self.models], "pairs": [p.to_dict() for p in self.pairs]}


@dataclass(frozen=True)
class FamilyMatch:
    family: Family
    basis: str   # "fingerprint" (exact vocabulary recorded here) or "tokenizer" (arch + type/size/pre)

    def to_dict(self) -> dict:
        return {"family": self.family.name, "basis": self.basis, "file": str(self.family.path)}


@dataclass(frozen=True)
class Suggestion:
    """A registry draft for a target: the pair it comes from and why it was picked."""

    family: Family
    draft: Model
    pair: Pair | None
    reason: str

    def to_dict(self) -> dict:
        return {"family": self.family.name, "draft": self.draft.to_dict(),
                "status": self.pair.status if self.pair else "unverified",
                "recommended": bool(self.pair and self.pair.recommended),
                "for_main": self.pair.main if self.pair else None, "reason": self.reason}


@dataclass
class Registry:
    families: list[Family] = field(default_factory=list)
    directory: Path | None = None

    def family(self, name: str) -> Family:
        return next(f for f in self.families if f.name == name)

    def match(self, architecture: str, vocab) -> list[FamilyMatch]:
        """Families whose architecture list holds `architecture` and whose tokenizer fits `vocab`."""
        out: list[FamilyMatch] = []
        for fam in self.families:
            if architecture not in fam.architectures:
                continue
            tok = fam.tokenizer
            if vocab.fingerprint in tok.fingerprints:
                out.append(FamilyMatch(fam, "fingerprint"))
                continue
            if tok.type != vocab.vocab_type:
                continue
            if tok.pre is not None and tok.pre != vocab.pre:
                continue
            if tok.sizes and not any(abs(s - vocab.n_vocab) <= 128 for s in tok.sizes):
                continue
            out.append(FamilyMatch(fam, "tokenizer"))
        out.sort(key=lambda m: m.basis != "fingerprint")  # exact matches first
        return out

    def suggestions(self, matches: list[FamilyMatch], target_params: int | None) -> list[Suggestion]:
        """Registry drafts smaller than the target, best first.

        The target file is not identified by name, so its registry "main" is the main entry whose
        parameter count is nearest to the target's; its recommended pair ranks first, then the
        family's other drafts, smallest first.
        """
        out: list[Suggestion] = []
        seen: set[tuple[str, str]] = set()
        for m in matches:
            fam = m.family
            drafts = [d for d in fam.drafts() if draft_fits(d, target_params)]
            if not drafts:
                continue
            mains = [x for x in fam.models if x.is_main and x.params_b]
            nearest = None
            if mains and target_params:
                nearest = min(mains, key=lambda x: abs(math.log(x.params_b * 1e9 / target_params)))
            ranked: list[tuple[tuple, Model, Pair | None, str]] = []
            for d in drafts:
                pairs = [p for p in fam.pairs if p.draft == d.id and p.status != "incompatible"]
                best = next((p for p in pairs if nearest and p.main == nearest.id and p.recommended), None) \
                    or next((p for p in pairs if nearest and p.main == nearest.id), None) \
                    or next((p for p in pairs if p.recommended), None) \
                    or (pairs[0] if pairs else None)
                if any(p.draft == d.id and p.status == "incompatible" for p in fam.pairs) and best is None:
                    continue
                for_nearest = bool(best and nearest and best.main == nearest.id)
                why = (f"recommended in {fam.path.name} for {best.main}" if best and best.recommended
                       else f"listed in {fam.path.name}" + (f" with {best.main}" if best else ""))
                if nearest is not None and for_nearest:
                    why += f" (nearest main by size to the target: {nearest.id})"
                key = (not for_nearest, not (best and best.recommended), d.repo is None, d.params_b or 0)
                ranked.append((key, d, best, why))
            for _, d, p, why in sorted(ranked, key=lambda r: r[0]):
                if (fam.name, d.id) not in seen:
                    seen.add((fam.name, d.id))
                    out.append(Suggestion(fam, d, p, why))
        return out

    def to_dict(self) -> dict:
        return {"directory": str(self.directory) if self.directory else None,
                "families": [f.to_dict() for f in self.families]}


def draft_fits(model: Model, target_params: int | None) -> bool:
    """Whether a registry draft is clearly smaller than a target of `target_params` (unknown: yes)."""
    if target_params is None or model.params_b is None:
        return True
    return model.params_b * 1e9 < target_params * 0.75


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
            raise _LineError(line, f"duplicate key {key!r}")
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
    except yaml.YAMLError as exc:
        raise RegistryError(f"{path}: invalid YAML: {exc}", _HINT) from None


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
                self.fail(d.key_lines.get(k, d.line), f"unknown key {k!r} in {what} (allowed: {allowed})")
        for k in sorted(required):
            if k not in d:
                self.fail(d.line, f"{what} is missing required key {k!r}")

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
            self.fail(self.line(d, key), f"{what}{key} {v!r} is not in the expected form ({pattern.pattern})")
        return v

    def choice(self, d: LineDict, key: str, choices, what: str = "") -> str:
        v = d.get(key)
        if v not in choices:
            self.fail(self.line(d, key), f"{what}{key} must be one of {', '.join(choices)} (got {v!r})")
        return v

    def boolean(self, d: LineDict, key: str, default: bool = False) -> bool:
        if key not in d:
            return default
        v = d[key]
        if not isinstance(v, bool):
            self.fail(self.line(d, key), f"{key} must be true or false (got {v!r})")
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


def validate_family(data: Any, path: Path) -> Family:
    v = _V(path)
    top = v.mapping(data, 1, "the file")
    v.keys(top, "the file", {"schema", "family", "description", "architectures", "tokenizer", "models", "pairs"},
           {"mtp", "mtp_note"})
    if top["schema"] != SCHEMA_VERSION:
        v.fail(v.line(top, "schema"), f"schema must be {SCHEMA_VERSION} (got {top['schema']!r})")
    name = v.string(top, "family", pattern=_ID)
    if name != path.stem:
        v.fail(v.line(top, "family"), f"family {name!r} must match the file name {path.stem!r}")
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
    tokenizer = Tokenizer(ttype, pre, tuple(sizes), fps, v.string(tk, "source", what="tokenizer."))

    models_raw = top["models"]
    if not isinstance(models_raw, list):
        v.fail(v.line(top, "models"), "models must be a list")
    models: list[Model] = []
    for i, raw in enumerate(models_raw):
        ln = models_raw.item_lines[i] if isinstance(models_raw, LineList) else v.line(top, "models")
        m = v.mapping(raw, ln, f"models[{i}]")
        v.keys(m, f"models[{i}]", {"id", "role", "source"},
               {"repo", "quant", "package", "file", "derived_from", "params", "note"})
        mid = v.string(m, "id", pattern=_ID)
        if any(x.id == mid for x in models):
            v.fail(v.line(m, "id"), f"duplicate model id {mid!r}")
        kinds = [k for k in ("repo", "package", "derived_from") if k in m]
        if len(kinds) != 1:
            v.fail(m.line, f"model {mid!r} needs exactly one of repo, package, derived_from (has {kinds or 'none'})")
        params = m.get("params")
        if params is not None and (isinstance(params, bool) or not isinstance(params, (int, float)) or params <= 0):
            v.fail(v.line(m, "params"), "params must be a positive number (billions of parameters)")
        repo = v.string(m, "repo", optional=True, pattern=_REPO)
        quant = v.string(m, "quant", optional=True)
        package = v.string(m, "package", optional=True)
        file = v.string(m, "file", optional=True)
        derived = v.string(m, "derived_from", optional=True)
        if (repo or derived) and not quant:
            v.fail(m.line, f"model {mid!r} needs a quant (the tag matched against the repo's file listing)")
        if package and not file:
            v.fail(m.line, f"model {mid!r} from a package needs `file` (its path inside site-packages)")
        if derived and not any(x.id == derived for x in models):
            v.fail(v.line(m, "derived_from"), f"derived_from {derived!r} must name a model listed before it")
        models.append(Model(mid, v.choice(m, "role", ROLES), None if params is None else float(params),
                            v.string(m, "source"), repo, quant, package, file, derived,
                            v.string(m, "note", optional=True), m.line))

    pairs_raw = top["pairs"]
    if not isinstance(pairs_raw, list):
        v.fail(v.line(top, "pairs"), "pairs must be a list")
    by_id = {m.id: m for m in models}
    pairs: list[Pair] = []
    for i, raw in enumerate(pairs_raw):
        ln = pairs_raw.item_lines[i] if isinstance(pairs_raw, LineList) else v.line(top, "pairs")
        p = v.mapping(raw, ln, f"pairs[{i}]")
        v.keys(p, f"pairs[{i}]", {"main", "draft", "status"}, {"recommended", "verified", "note"})
        main, draft = v.string(p, "main"), v.string(p, "draft")
        if main not in by_id or not by_id[main].is_main:
            v.fail(v.line(p, "main"), f"pairs[{i}].main {main!r} is not a model with role main/both in this file")
        if draft not in by_id or not by_id[draft].is_draft:
            v.fail(v.line(p, "draft"), f"pairs[{i}].draft {draft!r} is not a model with role draft/both in this file")
        if any(x.main == main and x.draft == draft for x in pairs):
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
            record = plain(rec)
        pairs.append(Pair(main, draft, status, v.boolean(p, "recommended"), record,
                          v.string(p, "note", optional=True), p.line))
    if not mtp and not any(m.is_draft for m in models) and models:
        v.fail(v.line(top, "models"), "a family that is not mtp needs at least one draft model")
    return Family(name, path, description, archs, tokenizer, tuple(models), tuple(pairs), mtp, mtp_note)


def load_family_file(path: str | os.PathLike[str]) -> Family:
    p = Path(path)
    return validate_family(read_yaml(p), p)


_cache: dict[tuple, Registry] = {}


def load_registry(directory: str | os.PathLike[str] | None = None) -> Registry:
    """Load and validate every pairings/*.yaml; cached per process by (file, mtime, size)."""
    d = Path(directory) if directory is not None else default_pairings_dir()
    if not d.is_dir():
        raise RegistryError(f"pairing registry not found: {d}", "set LLAMASPEC_PAIRINGS to the pairings/ directory")
    files = sorted(p for p in d.glob("*.yaml") if p.is_file())
    key = (str(d.resolve()),) + tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in files)
    if key in _cache:
        return _cache[key]
    reg = Registry([load_family_file(p) for p in files], d)
    _cache.clear()
    _cache[key] = reg
    return reg


def dump_family(data: dict) -> str:
    """Serialize a (plain) family dict the way the shipped files look: header comment + block YAML."""
    return HEADER_COMMENT + yaml.safe_dump(plain(data), sort_keys=False, allow_unicode=True, width=110,
                                           default_flow_style=False)
