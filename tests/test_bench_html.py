"""`bench --html`: a self-contained report. Validated as HTML (the embedded data is the `--json`
object, plotly.js is inline, nothing is fetched), and rendered in a real headless Chromium when
one is installed (Debian: apt-get install chromium)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import plotly  # noqa: F401 - the html extra (in the test extra): a broken install fails here
import pytest

FAST = ("--reps", "1", "-n", "12", "-t", "1")
CHARTS = ("throughput", "speedup", "theory", "acceptance")


class _Report(HTMLParser):
    """Scripts (attributes + text), external references, and element ids of a document."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self.external: list[str] = []
        self.ids: set[str] = set()
        self._in_script: dict[str, str | None] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        for key in ("src", "href"):
            if a.get(key):
                self.external.append(f"<{tag} {key}={a[key]}>")
        if tag == "script":
            self._in_script, self._text = a, []

    def handle_data(self, data):
        if self._in_script is not None:
            self._text.append(data)

    def handle_endtag(self, tag):
        if tag == "script" and self._in_script is not None:
            self.scripts.append((self._in_script, "".join(self._text)))
            self._in_script = None


@pytest.fixture(scope="module")
def report(tiny_models, tmp_path_factory):
    """One sweep (2 prompts, 2 drafts) with --json and --html: (JSON printed, report path). Run as a
    process (the run_cli fixture is per test; this report is shared by the module's tests)."""
    tmp = tmp_path_factory.mktemp("html")
    suite = tmp / "suite.jsonl"
    suite.write_text('{"id": "fox", "prompt": "The quick brown fox jumps over the lazy dog."}\n'
                     '{"id": "code", "prompt": "def fibonacci(n):\\n    if n < 2:\\n        return n"}\n')
    draft2 = tmp / "draft2.gguf"
    shutil.copyfile(tiny_models["draft"], draft2)
    out = tmp / "report.html"
    r = subprocess.run([sys.executable, "-m", "llamaspec", "bench", str(tiny_models["target"]),
                        "--draft", str(tiny_models["draft"]), "--draft", str(draft2), "--spec-type", "draft",
                        "--spec-type", "ngram-simple", "--prompts", str(suite), *FAST, "--json", "--html", str(out)],
                       capture_output=True, text=True, timeout=300,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr
    assert f"wrote {out}" in r.stderr
    return json.loads(r.stdout), out


@pytest.mark.slow
def test_report_embeds_the_bench_result_and_needs_nothing_external(report):
    info, path = report
    doc = _Report()
    doc.feed(path.read_text(encoding="utf-8"))
    data = [text for attrs, text in doc.scripts if attrs.get("type") == "application/json"]
    assert len(data) == 1 and "llamaspec-bench-data" in doc.ids
    assert json.loads(data[0]) == info                      # exactly what --json printed
    assert doc.external == []                               # no <script src>, <link href>, <a href>
    assert all("src" not in attrs for attrs, _ in doc.scripts)
    inline_js = max((text for attrs, text in doc.scripts if attrs.get("type") != "application/json"), key=len)
    assert len(inline_js) > 1_000_000 and "plotly.js" in inline_js   # the library itself, inline
    for name in CHARTS:
        assert f"plot-{name}" in doc.ids
    calls = [text for _, text in doc.scripts if "Plotly.newPlot" in text]
    assert len(calls) == len(CHARTS)
    # every configuration of the run is a trace of the throughput chart
    tput = next(t for t in calls if '"plot-throughput"' in t)
    for label in ("plain", "draft-simple @ draft.gguf", "draft-simple @ draft2.gguf", "ngram-simple"):
        assert json.dumps(label) in tput
    # the machine's copy-drafting bound: a marker per prompt over the speedups, a bar per configuration
    speed = next(t for t in calls if '"plot-speedup"' in t)
    assert '"bound (oracle copy-drafter)"' in speed
    assert [b for b in _trace(speed, "bound (oracle copy-drafter)")["y"]] == [r["bound"]["speedup"] for r in info["runs"]]
    theory = next(t for t in calls if '"plot-theory"' in t)
    assert _trace(theory, "bound")["y"] == [row["bound"] for row in info["overall"][0]["results"]
                                            if row["mode"] != "plain"]
    assert "<th>bound</th><th>of bound</th>" in path.read_text(encoding="utf-8")


def _trace(call: str, name: str) -> dict:
    """The trace called `name` among the data of a `Plotly.newPlot(id, data, layout, config)` call."""
    data, _ = json.JSONDecoder().raw_decode(call[call.index("[", call.index("Plotly.newPlot")):])
    return next(t for t in data if t.get("name") == name)


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome", "chromium-headless-shell"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.mark.slow
def test_report_renders_in_a_headless_browser(report, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("no Chromium on this machine (Debian: apt-get install chromium)")
    _, path = report
    r = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                        f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=15000",
                        "--dump-dom", path.resolve().as_uri()],
                       capture_output=True, text=True, timeout=180, env=dict(os.environ, HOME=str(tmp_path)))
    assert r.returncode == 0, r.stderr[-2000:]
    dom = r.stdout
    # plotly drew every chart: a plot container with its SVG layers, and bars / lines inside
    assert dom.count('class="plot-container plotly"') == len(CHARTS), dom[:500]
    assert dom.count('class="main-svg"') >= len(CHARTS)
    assert dom.count('class="point"') > 0          # bars of the bar charts
    assert 'class="scatterlayer' in dom


def test_html_without_plotly_is_a_one_line_error_before_any_run(run_cli, tiny_models, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "plotly", None)       # `import plotly` raises ImportError
    r = run_cli("bench", str(tiny_models["target"]), "--spec-type", "ngram-simple", *FAST,
                "--html", str(tmp_path / "r.html"))
    assert r.exit_code == 2, r.stderr
    assert "pip install 'llamaspec[html]'" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stdout == "" and "rep 1/1" not in r.stderr
    assert not (tmp_path / "r.html").exists()


def test_html_into_a_missing_directory(run_cli, tiny_models, tmp_path):
    r = run_cli("bench", str(tiny_models["target"]), "--spec-type", "ngram-simple", *FAST,
                "--html", str(tmp_path / "no" / "r.html"))
    assert r.exit_code == 2 and "--html" in r.stderr and len(r.stderr.strip().splitlines()) == 1
