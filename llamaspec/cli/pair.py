"""`llamaspec check MAIN DRAFT` and `llamaspec pair MODEL`: can a draft work, and which drafts exist.

Both read GGUF headers only (never weights), so they answer in well under a second.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from llamaspec.cli._options import OfflineOpt, output_flags
from llamaspec.cli._output import Output, escape
from llamaspec.cli.app import app
from llamaspec.errors import EXIT_FAILURE


def _size(n: int | None) -> str:
    if not n:
        return "?"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _params(n: int | float | None) -> str:
    if not n:
        return "?"
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}".replace(".0", "")
    return str(int(n))


def _side_line(d: dict) -> str:
    kind = f"[bold]{d['draft_info']['label']}[/bold] · " if d.get("draft_info") else ""
    return (f"{escape(d['source'])}  [dim]{kind}{d['architecture']} · {_params(d['n_params'])} params · "
            f"{d['file_type'] or '?'} · {_size(d['file_size'])} · {d['vocab_type']} {d['n_vocab']:,} tokens · "
            f"fingerprint {d['fingerprint']}[/dim]")


# ---- check -------------------------------------------------------------------------------------


def _render_verdict(v: dict, console) -> None:
    from rich.table import Table

    console.print(f"[bold]target[/bold] {_side_line(v['target'])}")
    console.print(f"[bold]draft [/bold] {_side_line(v['draft'])}")
    t = Table(title=None, show_lines=False)
    t.add_column("rule")
    t.add_column("result")
    t.add_column("detail", overflow="fold")
    from llamaspec.pairing.compat import RULE_TITLES

    for r in v["rules"]:
        mark = "[green]pass[/green]" if r["passed"] else "[red]FAIL[/red]"
        t.add_row(RULE_TITLES[r["rule"]], mark, escape(r["detail"]))
    console.print(t)
    f = v["facts"]
    facts = [
        f"same architecture family: {'yes' if f['same_family'] else 'no'} ({f['target_family']} / {f['draft_family']})",
        f"draft/target size: {f['size_ratio']:.2f}" if f["size_ratio"] is not None else "draft/target size: ?",
        f"chat templates: {'equal' if f['chat_template_equal'] else 'differ'}",
    ]
    console.print("[dim]" + " · ".join(facts) + "[/dim]")
    if v["compatible"] and v.get("draft_kind", "draft-simple") != "draft-simple":
        console.print(f"[bold green]compatible[/bold green]: the draft fits this target "
                      f"(--spec-type {v['draft_kind']})")
    elif v["compatible"]:
        console.print("[bold green]token-exact[/bold green]: compatible, llama.cpp would accept this pair (the fast path)")
    elif v["kind"] == "translated":
        console.print(f"[bold yellow]translated[/bold yellow]: another vocabulary ({v['failed_rule']} fails "
                      "llama.cpp's rules); drafts go through text, at the cost of re-tokenizing each step")
    else:
        console.print(f"[bold red]incompatible[/bold red]: {escape(v['reason'])}")


@app.command("check")
@output_flags
def check_cmd(
    main: Annotated[str, typer.Argument(metavar="MAIN", help="Target (main) model: GGUF path or Hub reference org/repo:QUANT.")],
    draft: Annotated[str, typer.Argument(metavar="DRAFT", help="Draft model: GGUF path or Hub reference.")],
    offline: OfflineOpt = False,
    *,
    out: Output,
) -> None:
    """Check whether DRAFT can draft for MAIN: token-exact by llama.cpp's vocabulary rules, or
    translated (another vocabulary, drafts through text); exit 0 for both, 1 when it cannot draft."""
    from llamaspec.pairing.check import check_refs

    verdict = check_refs(main, draft, offline=offline)
    data = verdict.to_dict()
    kind = verdict.kind
    quiet_line = {"token-exact": "token-exact" if verdict.draft_kind == "draft-simple" else "compatible"}.get(
        kind, f"{kind}: {verdict.failed_rule}")
    out.data(data, human=lambda c: _render_verdict(data, c), quiet=quiet_line)
    for w in verdict.warnings:
        out.detail(w)
    if not verdict.can_draft:
        raise typer.Exit(EXIT_FAILURE)


# ---- pair --------------------------------------------------------------------------------------


def pair_report(model: str, *, search: list[str], default_dirs: bool, offline: bool, show_all: bool) -> dict:
    """Everything `pair` prints, as plain data."""
    from llamaspec import hub
    from llamaspec.pairing import autodraft
    from llamaspec.pairing import discovery
    from llamaspec.pairing import registry
    from llamaspec.pairing.compat import describe
    from llamaspec.errors import LlamaspecError
    from llamaspec.gguf.vocab import vocab_from_header

    header = hub.read_model_header(model, offline=offline)
    vocab = vocab_from_header(header)
    roots = discovery.places(header.source, search, default_dirs=default_dirs)
    cut: list[discovery.Root] = []
    candidates = discovery.scan(header, roots, target_vocab=vocab, cut=cut)
    searched = autodraft.searched_places(roots, cut)
    from llamaspec.pairing.translated_pairs import add_translated, kind_of

    translated = add_translated(header, candidates, vocab)   # another vocabulary: drafts through text

    reg_data: dict = {"families": [], "pairs": [], "error": None}
    try:
        reg = registry.load_registry()
        matches = reg.match(header.architecture, vocab)
        reg_data["families"] = [m.to_dict() for m in matches]
        for m in matches:
            fam = m.family
            for p in fam.pairs:
                draft_m, main_m = fam.model(p.draft), fam.model(p.main)
                smaller = registry.draft_fits(draft_m, header.n_params)
                reg_data["pairs"].append({"family": fam.name, "main": main_m.to_dict(), "draft": draft_m.to_dict(),
                                          "status": p.status, "recommended": p.recommended,
                                          "verified": p.verified, "note": p.note,
                                          "draft_smaller_than_target": smaller})
        reg_data["mtp_family"] = any(m.family.mtp for m in matches)
    except LlamaspecError as exc:
        reg_data["error"] = exc.message

    made_for = None
    if describe(header, vocab)["draft_info"]:   # MODEL is a draft made for a target: which targets fit it
        made_for = _targets_for_draft(header, candidates)
    from llamaspec.api.resolve import decodes_on_gpu
    from llamaspec.tune.draft_costs import measured

    auto = autodraft.choose_for_header(header, candidates=candidates, offline=offline, allow_download=not offline,
                                       dry_run=True, searched=searched, gpu=decodes_on_gpu(None),
                                       draft_costs=lambda d: measured(header.source, d) if Path(header.source).is_file()
                                       else None)
    sidecar = autodraft.find_mtp_sidecar(Path(header.source)) if Path(header.source).is_file() else None
    compared = [c for c in candidates if c.verdict is not None]
    shown = candidates if show_all else compared  # compared = passed the cheap type/size prefilter
    return {
        "model": model,
        "target": describe(header, vocab),
        "mtp": {"nextn_predict_layers": header.nextn_predict_layers, "sidecar": str(sidecar) if sidecar else None},
        "made_for": made_for,
        "registry": reg_data,
        "on_disk": [{**c.to_dict(), "kind": kind_of(c)} for c in sorted(
            shown, key=lambda c: (_KIND_ORDER.index(kind_of(c)), c.size))],
        "scanned": {"roots": [{"path": str(r.path), "kind": r.kind, "cut": r in cut} for r in roots],
                    "places": list(searched), "files": len(candidates),
                    "compared": len(compared), "compatible": sum(c.compatible for c in candidates),
                    "translated": len(translated)},
        "auto": auto.to_dict(),
    }


_KIND_ORDER = ("token-exact", "translated", "incompatible")


def _targets_for_draft(draft, candidates) -> list[dict]:
    """For a draft file given as MODEL: the on-disk models it can draft for (same vocabulary, and
    the target shape the draft was made for), best first."""
    from llamaspec.errors import LlamaspecError
    from llamaspec.gguf.header import read_file
    from llamaspec.pairing.compat import check_headers

    out = []
    for c in candidates:
        if not c.compatible or c.draft_kind != "draft-simple":   # same vocabulary, and a model (not a draft)
            continue
        try:
            v = check_headers(read_file(c.path), draft)
        except LlamaspecError as exc:
            out.append({"path": str(c.path), "label": c.label, "fits": False, "reason": exc.message})
            continue
        out.append({"path": str(c.path), "label": c.label, "fits": v.compatible, "reason": v.reason})
    return sorted(out, key=lambda t: not t["fits"])


def _not_here(pair: dict, target: dict) -> str:
    """Why a registry pair's draft is not suggested for this target: the registry compares
    parameter counts, and a quant of the same model has as many (a smaller file on disk is found
    by its size, under `on disk`)."""
    dp = pair["draft"].get("params_b")
    mp, tp = pair["main"].get("params_b"), target.get("n_params")
    if mp and tp and abs(mp * 1e9 - tp) <= 0.25 * tp:   # the pair is for a model of this size
        return ("a quant of a model this size: the registry does not suggest it by parameters; "
                "a smaller quant on disk is judged by file size (below)")
    return (f"not for this target: the draft's {_params(dp * 1e9) if dp else '?'} params are not clearly fewer "
            f"than this target's {_params(tp)}")


def _render_pair(r: dict, console) -> None:
    from rich.table import Table

    console.print(f"[bold]target[/bold] {_side_line(r['target'])}")
    reg = r["registry"]
    if reg.get("error"):
        pass  # warned on stderr
    elif not reg["families"]:
        console.print("[dim]registry: no family matches this architecture and vocabulary[/dim]")
    else:
        fams = ", ".join(f"{f['family']} (by {f['basis']})" for f in reg["families"])
        console.print(f"[bold]family[/bold] {fams}")
    if r["mtp"]["nextn_predict_layers"]:
        console.print(f"[green]MTP heads in the file[/green] ({r['mtp']['nextn_predict_layers']} NextN layers): "
                      "no draft model needed")
    elif r["mtp"]["sidecar"]:
        used = r["auto"]["path"] == r["mtp"]["sidecar"]
        console.print(f"MTP sidecar beside the file: {escape(r['mtp']['sidecar'])} "
                      f"[dim]({'used by --draft auto' if used else 'not used: see -v'})[/dim]")
    if r.get("made_for") is not None:
        info = r["target"]["draft_info"]
        console.print(f"[bold]{info['label']}[/bold]: drafts with --spec-type {info['kind']} for a target it was made for")
        for t in r["made_for"]:
            mark = "[green]fits[/green]" if t["fits"] else f"[red]no[/red]: {escape(t['reason'])}"
            console.print(f"  {escape(t['label'])}: {mark}")
        if not r["made_for"]:
            console.print("  [dim]no model with this vocabulary on disk[/dim]")
    if reg["pairs"]:
        # One line per pair (not a table): Hub refs stay whole and greppable in narrow terminals.
        console.print("[bold]registry pairs[/bold] [dim](draft for main: status)[/dim]")
        for p in reg["pairs"]:
            notes = []
            draft, main = p["draft"].get("ref") or p["draft"]["id"], p["main"].get("ref") or p["main"]["id"]
            if p["recommended"]:
                notes.append("recommended for that target")
            if not p["draft_smaller_than_target"]:
                notes.append(_not_here(p, r["target"]))
            if p["note"]:
                notes.append(p["note"])
            status = {"verified": "[green]verified[/green]", "incompatible": "[red]incompatible[/red]"}.get(
                p["status"], "[yellow]unverified[/yellow]")
            size = f" ({_params(p['draft']['params_b'] * 1e9)})" if p["draft"].get("params_b") else ""
            tail = f"  [dim]{escape('; '.join(notes))}[/dim]" if notes else ""
            console.print(f"  {escape(draft)}{size} for {escape(main)}: {status}{tail}")
    s = r["scanned"]
    console.print(f"[dim]searched: {escape('; '.join(s['places']) or 'nowhere (--no-default-dirs, no --search)')}[/dim]")
    if r["on_disk"]:
        t = Table(title=f"on disk ({s['files']} GGUF files found, {s['compared']} compared, "
                        f"{s['compatible']} token-exact, {s['translated']} translated)", title_justify="left")
        for col in ("file", "where", "size", "verdict"):
            t.add_column(col, overflow="fold")
        for c in r["on_disk"]:
            kind = "" if c["draft_kind"] == "draft-simple" else f" ({c['draft_kind']})"
            if c["compatible"]:
                verdict = f"[green]{'token-exact' if not kind else 'compatible'}[/green]{kind}"
            elif c["kind"] == "translated":
                verdict = (f"[yellow]translated[/yellow]: {c['verdict']['failed_rule']} differs "
                           "(drafts through text)")
            else:
                verdict = f"[red]no[/red]{kind}: {escape(c['reason'] or '')}"
            t.add_row(escape(c["label"]), c["location"], _size(c["size"]), verdict)
        console.print(t)
    else:
        console.print(f"[dim]on disk: {s['files']} GGUF files found, none that can draft[/dim]")
    a = r["auto"]
    target = a["path"] or a["label"] or a["kind"]
    console.print(f"[bold]--draft auto[/bold] → {a['kind']}: {escape(target)}")
    if a.get("refused"):   # the draft on disk that is not expected to pay here, and why
        console.print(f"  not used: {escape(Path(a['refused']).name)}, expected {a['value']['speedup']:.2f}x plain "
                      f"here ({a['value']['costs']['source']}); --draft {escape(a['refused'])} forces it")
    console.print(f"  [dim]{escape(a['reason'])}[/dim]")


@app.command("pair")
@output_flags
def pair_cmd(
    model: Annotated[str, typer.Argument(metavar="MODEL", help="Target model: GGUF path or Hub reference org/repo:QUANT.")],
    search: Annotated[Optional[list[str]], typer.Option(
        "--search", "-s", metavar="DIR", help="Also look for drafts under this directory, first (repeatable).")] = None,
    no_default_dirs: Annotated[bool, typer.Option(
        "--no-default-dirs", help="Look only under --search: not beside MODEL, nor in $LLAMASPEC_MODELS_PATH, "
                                   "the HF cache, LM Studio or Ollama.")] = False,
    show_all: Annotated[bool, typer.Option("--all", help="List every GGUF found, not only plausible ones.")] = False,
    offline: OfflineOpt = False,
    *,
    out: Output,
) -> None:
    """List drafts for MODEL: registry pairs of its family and compatible GGUFs already on disk."""
    report = pair_report(model, search=list(search or []), default_dirs=not no_default_dirs, offline=offline,
                         show_all=show_all)
    if report["registry"]["error"]:
        out.warn(f"registry not used: {report['registry']['error']}")
    for root in report["scanned"]["roots"]:
        out.detail(f"searched {root['kind']}: {root['path']}")
    for note in report["auto"]["considered"]:
        out.detail(f"auto: {note}")
    a = report["auto"]
    out.data(report, human=lambda c: _render_pair(report, c), quiet=a["path"] or a["label"] or a["kind"])
