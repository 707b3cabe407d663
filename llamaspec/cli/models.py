"""`llamaspec pull REF` and `llamaspec models`: Hub downloads into the HF cache, and the GGUF models
`pair` and `--draft auto` would find (discovery.places: the Hugging Face cache, LM Studio, Ollama,
$LLAMASPEC_MODELS_PATH, --search, and a model's own folder with --near)."""

from __future__ import annotations

import os
import time
from typing import Annotated, Optional

import typer

from llamaspec.cli._options import OfflineOpt, output_flags
from llamaspec.cli._output import Output
from llamaspec.cli.app import app

DraftOpt = Annotated[Optional[str], typer.Option(
    "--draft", metavar="auto|REF",
    help="Also pull a draft: 'auto' = the one `--draft auto` would use (registry recommendation), or a Hub ref.")]
UpdateOpt = Annotated[bool, typer.Option(
    "--update", help="Ask the Hub for a newer commit even if the model is cached.")]


def _size(n: int | None) -> str:
    from llamaspec.hub.download import human_size

    return "?" if n is None else human_size(n)


@app.command("pull")
@output_flags
def pull_cmd(
    ref: Annotated[str, typer.Argument(help="Hub reference: org/repo, org/repo:QUANT, org/repo/file.gguf, @REV.")],
    draft: DraftOpt = None,
    update: UpdateOpt = False,
    offline: OfflineOpt = False,
    *,
    out: Output,
) -> None:
    """Download a GGUF model from the Hugging Face Hub into the HF cache; print its local path."""
    from llamaspec import hub
    from llamaspec.errors import UsageError

    target = hub.classify(ref)
    if not isinstance(target, hub.HubRef):
        raise UsageError(f"{ref} is a local path, not a Hub reference",
                         "pull takes org/repo[:QUANT]; local files need no pull")
    pulled = hub.pull(target, update=update, offline=offline)
    out.info(_pull_line(pulled))
    data = pulled.to_dict()
    lines = [str(pulled.path)]
    if draft is not None:
        d = _pull_draft(draft, pulled, offline=offline, update=update, out=out)
        data["draft"] = d
        if d.get("path"):
            lines.append(d["path"])
    out.data(data, human=lambda c: c.print("\n".join(lines), markup=False, soft_wrap=True),
             quiet="\n".join(lines))


def _pull_line(p) -> str:
    if p.cached:
        return f"{p.ref}: already in the cache ({_size(p.size)})"
    if p.downloaded:
        return f"{p.ref}: downloaded {_size(p.downloaded)} ({p.files[0]}, commit {p.commit[:8]})"
    return f"{p.ref}: up to date ({p.files[0]}, commit {p.commit[:8]})"


def _pull_draft(draft: str, target, *, offline: bool, update: bool, out) -> dict:
    """Pull the draft for `target`: an explicit ref, or what `--draft auto` picks for it."""
    from llamaspec import hub

    if draft.lower() != "auto":
        d = hub.pull(draft, update=update, offline=offline)
        out.info("draft " + _pull_line(d))
        return {"kind": "draft-simple", "source": "explicit", **d.to_dict()}
    from llamaspec.pairing import autodraft

    # Headers only (the target is local now); the registry step downloads its draft via hub.
    # Not gated by cost: pull fetches the draft asked for; its reason says whether it pays here.
    choice = autodraft.choose_draft(str(target.path), offline=offline, gate=False)
    info = choice.to_dict()
    if choice.kind == "draft-simple" and choice.path is not None:
        out.info(f"draft: {choice.label or choice.path.name} ({choice.reason})")
    elif choice.kind == "draft-mtp":
        out.info(f"draft: none needed ({choice.reason})")
    else:
        out.info(f"draft: nothing to pull; {choice.reason}")
    return info


@app.command("models")
@output_flags
def models_cmd(
    search: Annotated[Optional[list[str]], typer.Option(
        "--search", "-s", metavar="DIR", help="Also list the GGUFs under this directory (repeatable).")] = None,
    near: Annotated[Optional[str], typer.Option(
        "--near", metavar="MODEL", help="Also list the GGUFs beside this model file (as `pair MODEL` looks).")] = None,
    *,
    out: Output,
) -> None:
    """List the GGUF models `pair` and `--draft auto` would find: the Hugging Face cache, LM Studio,
    Ollama, $LLAMASPEC_MODELS_PATH (colon-separated) and --search; size, architecture, vocabulary."""
    from llamaspec import hub
    from llamaspec.pairing import autodraft, discovery

    root = hub.cache_dir()
    roots = discovery.places(near, search or ())
    cut: list = []
    rows = [_describe(e) for e in hub.list_cached_ggufs(root)]   # the HF cache by repo and revision
    cached = {os.path.realpath(r["path"]) for r in rows}
    others = [r for r in roots if r.kind != "hf-cache"]
    deadline = time.monotonic() + discovery.SCAN_SECONDS
    for found in discovery.iter_models(others, deadline=deadline, cut=cut):
        if os.path.realpath(found.path) not in cached:
            rows.append(_describe_found(found))
    places = autodraft.searched_places(roots, cut)
    data = {"cache_dir": str(root), "places": list(places), "models": rows}
    for place in places:
        out.detail(f"looked in {place}")
    if not rows:
        rest = [p for r, p in zip(roots, places) if r.kind != "hf-cache"]
        also = f" or {'; '.join(rest)}" if rest else ""
        out.info(f"no GGUF models in the Hugging Face cache ({root}){also}; `llamaspec pull org/repo:QUANT` "
                 f"adds one, {discovery.MODELS_PATH_ENV}=DIR:DIR adds folders")
    out.data(data, human=lambda c: _render(rows, c), quiet="\n".join(r["ref"] for r in rows))


def _describe_found(found) -> dict:
    """A row for a GGUF outside the HF cache (LM Studio, Ollama, a folder)."""
    try:
        size = found.path.stat().st_size
    except OSError:
        size = None
    row = {"ref": found.label, "repo": None, "file": found.path.name, "commit": None, "refs": [],
           "path": str(found.path), "size": size, "parts": 1, "where": found.kind}
    return _header_facts(row, found.path)


def _describe(entry) -> dict:
    row = {"ref": entry.ref, "repo": entry.repo_id, "file": entry.file, "commit": entry.commit,
           "refs": list(entry.refs), "path": str(entry.path), "size": entry.size, "parts": entry.parts,
           "where": "hf-cache"}
    return _header_facts(row, entry.path)


def _header_facts(row: dict, path) -> dict:
    from llamaspec.errors import LlamaspecError
    from llamaspec.gguf.header import read_file
    from llamaspec.gguf.vocab import vocab_from_header

    try:
        header = read_file(path)
    except LlamaspecError as exc:
        return {**row, "error": exc.message}
    vocab = vocab_from_header(header)
    return {**row, "architecture": header.architecture, "file_type": header.file_type, "n_params": header.n_params,
            "vocab_type": vocab.vocab_type, "n_vocab": vocab.n_vocab, "vocab_fingerprint": vocab.fingerprint,
            "mtp": header.nextn_predict_layers > 0}


def _render(rows: list[dict], console) -> None:
    if not rows:
        return
    from rich.table import Table

    t = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("model", "where", "size", "arch", "type", "vocab", "fingerprint"):
        t.add_column(col, overflow="fold", justify="right" if col == "size" else "left")
    for r in rows:
        if "error" in r:
            t.add_row(r["ref"], r["where"], _size(r["size"]), "[red]unreadable[/red]", "", r["error"], "")
            continue
        parts = f" ({r['parts']} parts)" if r["parts"] > 1 else ""
        t.add_row(r["ref"], r["where"], _size(r["size"]) + parts, r["architecture"], r["file_type"] or "?",
                  f"{r['vocab_type']} {r['n_vocab']:,}", r["vocab_fingerprint"])
    if not console.is_terminal:
        # A pipe or file gets whole lines (like `ls -l`) instead of a table folded to 80 columns.
        from rich.console import Console

        console = Console(file=console.file, width=1000, highlight=False, color_system=None)
    console.print(t)
