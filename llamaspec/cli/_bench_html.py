"""`bench --html FILE`: a self-contained interactive report (plotly, the optional `html` extra).

One HTML file that works offline: plotly.js is embedded inline (no CDN), and so is the benchmark's
data, exactly the object `bench --json` prints, in `<script type="application/json"
id="llamaspec-bench-data">`. Charts: throughput (tokens/s per prompt and configuration),
speedup over plain decoding per prompt (with each prompt's copy-drafting bound on this machine),
measured vs theoretical speedup and bound per configuration (over all prompts), and acceptance per
draft position. Built from the JSON object alone.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from llamaspec.errors import UsageError

INSTALL_HINT = "pip install 'llamaspec[html]'"
DATA_ID = "llamaspec-bench-data"


def require_plotly() -> None:
    """Fail early (before any run) when the optional plotting library is missing."""
    import importlib

    try:
        importlib.import_module("plotly")
    except ImportError:
        raise UsageError(f"--html needs the plotly package: {INSTALL_HINT}") from None


def _json_script(obj: Any) -> str:
    """JSON that is safe inside a <script> element (no `</script>`, no `<!--`)."""
    from llamaspec.cli._output import to_json

    text = to_json(obj)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _label(run: dict[str, Any], several_targets: bool) -> str:
    pid = run["prompt_id"]
    return f"{Path(run['model_path']).name} / {pid}" if several_targets else pid


def _figures(info: dict[str, Any]) -> list[tuple[str, Any]]:
    import plotly.graph_objects as go

    runs = info["runs"]
    several = len(info["targets"]) > 1
    xs = [_label(r, several) for r in runs]
    labels: list[str] = []
    for r in runs:
        for m in r["results"]:
            if m["mode"] not in labels:
                labels.append(m["mode"])

    def series(key: str, label: str) -> list[Any]:
        out = []
        for r in runs:
            m = next((m for m in r["results"] if m["mode"] == label), None)
            out.append(m[key] if m is not None else None)
        return out

    layout = dict(barmode="group", template="plotly_white", legend_title_text="configuration",
                  margin=dict(t=50, l=60, r=20, b=60), height=420)
    tput = go.Figure(layout=dict(layout, title="Throughput (generation tokens/s; medians over repetitions)",
                                 yaxis_title="tokens/s", xaxis_title="prompt"))
    speed = go.Figure(layout=dict(layout, title="Speedup over plain decoding of the same target",
                                  yaxis_title="x plain", xaxis_title="prompt"))
    from plotly.colors import qualitative

    palette = qualitative.Plotly
    color = {label: palette[i % len(palette)] for i, label in enumerate(labels)}
    for label in labels:
        tput.add_bar(name=label, x=xs, y=series("tok_s", label), marker_color=color[label])
        if label == "plain":
            continue
        ident = series("identical_to_plain", label)
        # a configuration whose tokens differed from plain decoding: hatched bars (never a speedup to trust)
        speed.add_bar(name=label, x=xs, y=series("ratio_vs_plain", label),
                      marker=dict(color=color[label], pattern_shape=["x" if i is False else "" for i in ident]),
                      customdata=[["no: tokens differ" if i is False else "yes" if i else "-"] for i in ident],
                      hovertemplate="%{x}: %{y:.2f}x (identical: %{customdata[0]})<extra>" + html.escape(label)
                                    + "</extra>")
    speed.add_hline(y=1.0, line_dash="dash", line_color="grey", annotation_text="plain")
    bounds = [r["bound"]["speedup"] if r.get("bound") else None for r in runs]
    if any(b is not None for b in bounds):
        # the machine's copy-drafting bound of each prompt: a marker over its group of bars
        speed.add_scatter(name="bound (oracle copy-drafter)", x=xs, y=bounds, mode="markers",
                          marker=dict(symbol="line-ew-open", size=40, color="black", line=dict(width=3)),
                          hovertemplate="%{x}: bound %{y:.2f}x<extra></extra>")

    overall = [(o, row) for o in info["overall"] for row in o["results"] if row["mode"] != "plain"]
    names = [f"{Path(o['model_path']).name}: {row['mode']}" if several else row["mode"] for o, row in overall]
    theory = go.Figure(layout=dict(layout, title="Measured vs theoretical speedup and the copy-drafting bound "
                                                 "(geometric means over prompts)",
                                   yaxis_title="x plain", xaxis_title="configuration"))
    theory.add_bar(name="measured", x=names, y=[row["ratio_vs_plain"] for _, row in overall])
    theory.add_bar(name="theoretical", x=names, y=[row["theory"] for _, row in overall])
    if any(row.get("bound") is not None for _, row in overall):
        theory.add_bar(name="bound", x=names, y=[row.get("bound") for _, row in overall])
    theory.add_hline(y=1.0, line_dash="dash", line_color="grey")

    acc = go.Figure(layout=dict(layout, title="Acceptance per draft position (drafts whose token i was "
                                              "accepted / drafts; all prompts)",
                                yaxis_title="acceptance", xaxis_title="draft position", yaxis_range=[0, 1.05]))
    for name, (_, row) in zip(names, overall):
        pos = row["per_position_acceptance"]
        if pos:
            acc.add_scatter(name=name, x=list(range(1, len(pos) + 1)), y=pos, mode="lines+markers")
    return [("throughput", tput), ("speedup", speed), ("theory", theory), ("acceptance", acc)]


def _summary_table(info: dict[str, Any]) -> str:
    head = ("target", "configuration", "tok/s", "speedup", "theory", "of theory", "bound", "of bound", "acceptance",
            "identical")
    rows = []
    for o in info["overall"]:
        for r in o["results"]:
            ident = {True: "yes", False: "NO", None: "-"}[r["identical_to_plain"]]
            cells = (Path(o["model_path"]).name, r["mode"], f"{r['tok_s']:.1f}",
                     f"{r['ratio_vs_plain']:.2f}x" if r["ratio_vs_plain"] is not None else "-",
                     f"{r['theory']:.2f}x" if r["theory"] is not None else "-",
                     f"{100 * r['of_theory']:.0f}%" if r["of_theory"] is not None else "-",
                     f"{r['bound']:.2f}x" if r.get("bound") is not None else "-",
                     f"{100 * r['of_bound']:.0f}%" if r.get("of_bound") is not None else "-",
                     f"{100 * r['acceptance']:.1f}%" if r["drafted"] else "-", ident)
            best = r["mode"] == o["best"]["mode"] and r["mode"] != "plain"
            rows.append("<tr%s>%s</tr>" % (' class="best"' if best else "",
                                           "".join(f"<td>{html.escape(c)}</td>" for c in cells)))
    return ("<table><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def render(info: dict[str, Any]) -> str:
    """The report as one HTML document (plotly.js inline)."""
    import plotly

    parts = []
    for i, (name, fig) in enumerate(_figures(info)):
        parts.append(f'<section class="chart" id="chart-{name}">'
                     + fig.to_html(full_html=False, include_plotlyjs=i == 0, div_id=f"plot-{name}",
                                   config={"displaylogo": False, "responsive": True})
                     + "</section>")
    subtitle = (f"greedy, n={info['n']}, {info['threads']} thread(s), {info['reps']} repetition(s) (medians); "
                f"prompts: {', '.join(html.escape(str(p)) for p in info['prompts'])}")
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in info["notes"])
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="generator" content="llamaspec bench (plotly {html.escape(plotly.__version__)})">
<title>llamaspec bench report</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
td, th {{ padding: 0.25em 0.8em; border-bottom: 1px solid #ddd; text-align: right; }}
td:nth-child(-n+2), th:nth-child(-n+2) {{ text-align: left; }}
tr.best td {{ font-weight: bold; }}
.chart {{ margin: 1.5em 0; }}
</style></head><body>
<h1>llamaspec bench</h1>
<p>{subtitle}</p>
{_summary_table(info)}
<p>Speedup: generation tokens/s over plain decoding of the same target in the same repetition;
over prompts, the geometric mean. Theory: the speedup from each configuration's own acceptance per
position, draft cost and verify cost (in plain decode steps). Bound: the speedup an oracle
copy-drafter would reach on plain decoding's output with this machine's measured verify costs (at
each step the longest copy, after a 2-token match, of at most 63 tokens, never wrong, paying the
measured cost of its batch); of bound: measured / bound. A configuration whose tokens differ
from plain decoding is never marked best.</p>
{''.join(parts)}
{f'<h2>Notes</h2><ul>{notes}</ul>' if notes else ''}
<script type="application/json" id="{DATA_ID}">{_json_script(info)}</script>
</body></html>
"""


def write(info: dict[str, Any], path: Path) -> None:
    try:
        Path(path).write_text(render(info), encoding="utf-8")
    except OSError as e:
        from llamaspec.errors import LlamaspecError

        raise LlamaspecError(f"cannot write {path}: {e.strerror or e}", "check the --html path") from None
