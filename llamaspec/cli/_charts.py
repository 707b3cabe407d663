"""Bar charts in the terminal (Rich text): speedups over plain decoding, one bar per configuration.

A bar's length is its value on a common scale (0 to the largest value of the chart); the part up to
1.0x is drawn dim and the part beyond it green, so where plain decoding's 1.0x lies is visible in
every bar; a bar below 1.0x is red and a `│` marks 1.0x after it. A configuration whose tokens
differed from plain decoding gets `!` and the words "tokens differ": its bar is not a speedup to
trust. Pure functions of their input; the caller prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from rich.text import Text

EIGHTHS = " ▏▎▍▌▋▊▉█"   # index: eighths of a cell
MARK = "│"


@dataclass(frozen=True)
class Bar:
    label: str
    value: float | None          # a speedup (x plain); None: not measured
    identical: bool | None = None   # False: tokens differed from plain decoding


def _cells(length_eighths: int) -> str:
    """A bar `length_eighths` eighths of a cell long: full blocks then one partial block."""
    full, part = divmod(max(0, length_eighths), 8)
    return "█" * full + (EIGHTHS[part] if part else "")


def bar_text(value: float, scale_max: float, width: int) -> Text:
    """One bar of `width` cells for `value` on a 0..scale_max scale (1.0x marked)."""
    eighths = round(value / scale_max * width * 8) if scale_max > 0 else 0
    one = round(1.0 / scale_max * width * 8) if scale_max > 0 else 0   # where 1.0x is, in eighths
    text = Text()
    if value >= 1.0:
        # the dim part ends at a cell boundary at or before 1.0x, so the two styles never share a cell
        dim_cells = one // 8
        text.append("█" * dim_cells, style="grey50")
        text.append(_cells(eighths - 8 * dim_cells), style="green")
    else:
        bar = _cells(eighths)
        text.append(bar, style="red")
        one_cell = max(one // 8, len(bar))
        if one_cell <= width:   # (at `width`: just past the scale's end, where 1.0x is when nothing beat it)
            text.append(" " * (one_cell - len(bar)) + MARK, style="grey50")
    return text


def speedup_chart(groups: Sequence[tuple[str | None, Sequence[Bar]]], width: int = 40) -> Text:
    """Grouped bars: each group (a title or None, its bars) in turn, on one common scale so bars of
    different groups compare. Labels are padded to the longest; values printed after the bars."""
    values = [b.value for _, bars in groups for b in bars if b.value is not None]
    scale_max = max([1.0, *values])
    label_w = max([len(b.label) for _, bars in groups for b in bars] or [0])
    out = Text()
    for g, (title, bars) in enumerate(groups):
        if title is not None:
            if g:
                out.append("\n")
            out.append(title + "\n", style="bold")
        for b in bars:
            out.append(("  " if title is not None else "") + b.label.ljust(label_w) + " ")
            if b.value is None:
                out.append("-\n", style="dim")
                continue
            bar = bar_text(b.value, scale_max, width)
            out.append_text(bar)
            out.append(" " * (width + 2 - len(bar.plain)))
            out.append(f"{b.value:.2f}x", style="bold" if b.value >= 1.0 else None)
            if b.identical is False:
                out.append(" ! tokens differ", style="bold red")
            out.append("\n")
    return out
