"""The pairing registry: pairings/*.yaml, one file per model family (schema: pairings/SCHEMA.md).

Records (families, their models and pairs), lookups (which families fit a target, which drafts to
suggest) and loading. Loading validates (registry_schema.py): a broken YAML file or a schema error
raises RegistryError naming the file and line, so a bad edit never turns into a wrong
recommendation. A file is matched to a model by its vocabulary (fingerprint, else tokenizer
facts) and architecture, never by file name.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llamaspec.errors import RegistryError
from llamaspec.pairing import registry_schema


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
class RegistryModel:
    """A model entry of a family file (not a loaded model: that is runtime.llama.Model)."""

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
    kind: str = "draft-simple"    # llama.cpp's spec type it drafts as (registry_schema.DRAFT_KINDS)

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
             "source": self.source, "note": self.note,
             "kind": self.kind if self.kind != "draft-simple" else None}
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
    translated: bool = False      # another vocabulary: drafts through text (compat.Verdict.kind)

    def to_dict(self) -> dict:
        d = {"main": self.main, "draft": self.draft, "status": self.status, "recommended": self.recommended,
             "verified": self.verified, "note": self.note, "translated": self.translated or None}
        return {k: v for k, v in d.items() if v is not None}


@dataclass(frozen=True)
class Family:
    name: str
    path: Path
    description: str
    architectures: tuple[str, ...]
    tokenizer: Tokenizer
    models: tuple[RegistryModel, ...]
    pairs: tuple[Pair, ...]
    mtp: bool = False             # natively MTP-capable: needs no separate draft
    mtp_note: str | None = None

    def model(self, model_id: str) -> RegistryModel:
        return next(m for m in self.models if m.id == model_id)

    def drafts(self) -> list[RegistryModel]:
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
    draft: RegistryModel
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
            ranked: list[tuple[tuple, RegistryModel, Pair | None, str]] = []
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


def draft_fits(model: RegistryModel, target_params: int | None) -> bool:
    """Whether a registry draft is clearly smaller than a target of `target_params` (unknown: yes)."""
    if target_params is None or model.params_b is None:
        return True
    return model.params_b * 1e9 < target_params * 0.75


# ---- loading -----------------------------------------------------------------------------------


def validate_family(data: Any, path: Path) -> Family:
    """Check one parsed family file (RegistryError naming file:line) and build its records."""
    f = registry_schema.validate(data, path)
    return Family(**{**f, "tokenizer": Tokenizer(**f["tokenizer"]),
                     "models": tuple(RegistryModel(**m) for m in f["models"]),
                     "pairs": tuple(Pair(**p) for p in f["pairs"])})


def load_family_file(path: str | os.PathLike[str]) -> Family:
    p = Path(path)
    return validate_family(registry_schema.read_yaml(p), p)


_cache: dict[tuple, Registry] = {}


def _check_unique_ids(families: list[Family]) -> None:
    """A model id names one entry in the whole registry (within a file the schema checks it): `pair`
    and `--draft auto` report drafts by id, so two families must not both define one."""
    seen: dict[str, tuple[Path, int]] = {}
    for fam in families:
        for m in fam.models:
            if m.id in seen:
                path, line = seen[m.id]
                raise RegistryError(f"{fam.path}:{m.line}: model id {m.id!r} is already defined in {path}:{line}",
                                    "model ids must be unique across pairings/*.yaml; rename one")
            seen[m.id] = (fam.path, m.line)


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
    _check_unique_ids(reg.families)
    _cache.clear()
    _cache[key] = reg
    return reg
