"""`llamaspec pull REF` and `llamaspec models`: Hub downloads into the HF cache, and what is in it."""

from __future__ import annotations

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
    choice = autodraft.choose_draft(str(target.path), offline=offline)
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
def models_cmd(*, out: Output) -> None:
    """List the GGUF models in the Hugging Face cache: size, architecture, vocabulary fingerprint."""
    from llamaspec import hub

    root = hub.cache_dir()
    rows = [_describe(e) for e in hub.list_cached_ggufs(root)]
    data = {"cache_dir": str(root), "models": rows}
    if not rows:
        out.info(f"no GGUF models in the Hugging Face cache ({root}); `llamaspec pull org/repo:QUANT` adds one")
    out.data(data, human=lambda c: _render(rows, c), quiet="\n".join(r["ref"] for r in rows))


def _describe(entry) -> dict:
    from llamaspec.errors import LlamaspecError
    from llamaspec.gguf.header import read_file
    from llamaspec.gguf.vocab import vocab_from_header

    row = {"ref": entry.ref, "repo": entry.repo_id, "file": entry.file, "commit": entry.commit,
           "refs": list(entry.refs), "path": str(entry.path), "size": entry.size, "parts": entry.parts}
    try:
        header = read_file(entry.path)
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
    for col in ("model", "size", "arch", "type", "vocab", "fingerprint"):
        t.add_column(col, overflow="fold", justify="right" if col == "size" else "left")
    for r in rows:
        if "error" in r:
            t.add_row(r["ref"], _size(r["size"]), "[red]unreadable[/red]", "", r["error"], "")
            continue
        parts = f" ({r['parts']} parts)" if r["parts"] > 1 else ""
        t.add_row(r["ref"], _size(r["size"]) + parts, r["architecture"], r["file_type"] or "?",
                  f"{r['vocab_type']} {r['n_vocab']:,}", r["vocab_fingerprint"])
    if not console.is_terminal:
        # A pipe or file gets whole lines (like `ls -l`) instead of a table folded to 80 columns.
        from rich.console import Console

        console = Console(file=console.file, width=1000, highlight=False, color_system=None)
    console.print(t)
