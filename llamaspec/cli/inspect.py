"""`llamaspec inspect MODEL`: what a GGUF is, read from its header alone (weights never loaded)."""

from __future__ import annotations

from typing import Annotated

import typer

from llamaspec.cli._options import output_flags
from llamaspec.cli._output import Output
from llamaspec.cli.app import app


def describe(ref: str) -> dict:
    """The facts `inspect` prints, as plain data (also used by `models` and `pair`)."""
    from llamaspec.hub import read_model_header
    from llamaspec.gguf.drafts import draft_info
    from llamaspec.gguf.vocab import vocab_from_header

    header = read_model_header(ref)
    vocab = vocab_from_header(header)
    info = draft_info(header)
    return {
        "draft": info.to_dict() if info else None,  # a draft made for a target (EAGLE-3, DFlash, ...)
        "model": ref,
        "source": header.source,
        "name": header.name,
        "architecture": header.architecture,
        "n_params": header.n_params,
        "file_type": header.file_type,
        "tensor_types": header.tensor_type_counts(),
        "file_size": header.file_size,
        "context_length": header.context_length,
        "n_layer": header.block_count,
        "vocab": vocab.summary(),
        "chat_template": header.chat_template is not None,
        "nextn_predict_layers": header.nextn_predict_layers,
        "mtp": header.nextn_predict_layers > 0,
        "gguf_version": header.version,
        "header_bytes": header.bytes_read,
    }


def _params(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def render(info: dict, console) -> None:
    from rich.table import Table

    v = info["vocab"]
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column(overflow="fold")
    rows = [
        ("file", info["source"]),
        ("name", info["name"] or "-"),
        ("architecture", info["architecture"]),
        ("parameters", f"{_params(info['n_params'])} ({info['n_params']:,})"),
        ("file type", f"{info['file_type']}  [dim]{_size(info['file_size'])}[/dim]"),
        ("layers", str(info["n_layer"])),
        ("context length", str(info["context_length"])),
        ("vocab", f"{v['type']} ({v['model']}{', pre ' + v['pre'] if v['pre'] else ''}), {v['size']:,} tokens"),
        ("BOS", f"{v['bos_id']} {v['bos']!r}" + (" (added)" if v["add_bos"] else "")),
        ("EOS", f"{v['eos_id']} {v['eos']!r}" + (" (added)" if v["add_eos"] else "")),
        ("vocab fingerprint", v["fingerprint"]),
        ("chat template", "yes" if info["chat_template"] else "no"),
        ("MTP heads", f"yes ({info['nextn_predict_layers']} nextn layers)" if info["mtp"] else "no"),
    ]
    if info["draft"]:
        rows += _draft_rows(info["draft"])
    for k, val in rows:
        t.add_row(k, val)
    console.print(t)


def _draft_rows(d: dict) -> list[tuple[str, str]]:
    """What a draft made for a target needs from that target (checked by `check` and `pair`)."""
    needs = [f"{d['target_architecture']} architecture"] if d["target_architecture"] else []
    if d["target_hidden_size"]:
        needs.append(f"hidden size {d['target_hidden_size']}")
    if d["target_layers"]:
        needs.append(f"layers {', '.join(map(str, d['target_layers']))} (reads their hidden states)")
    needs.append("this file's vocabulary")
    rows = [("draft kind", f"{d['label']}: --spec-type {d['kind']}"), ("made for a target with", "; ".join(needs))]
    if d["block_size"]:
        rows.append(("block size", f"{d['block_size']} tokens per draft pass"))
    if d["draft_vocab"]:
        rows.append(("draft vocabulary", f"{d['draft_vocab']:,} tokens (mapped to the target's by d2t)"))
    if d["base_models"]:
        rows.append(("base model", ", ".join(d["base_models"])))
    return rows


@app.command("inspect")
@output_flags
def inspect_cmd(
    model: Annotated[str, typer.Argument(help="GGUF path or Hub reference (org/repo:QUANT).")],
    *,
    out: Output,
) -> None:
    """Show a GGUF's architecture, size, quantization, vocabulary, MTP support and, for an EAGLE-3 /
    DFlash / DSpark / Gemma 4 assistant draft, the target it was made for (header only)."""
    info = describe(model)
    out.data(info, human=lambda c: render(info, c), quiet=info["vocab"]["fingerprint"])
