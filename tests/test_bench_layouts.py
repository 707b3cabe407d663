"""scripts/bench_layouts.py: the layouts benchmark's bookkeeping, and one tiny run end to end."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import bench_layouts as bl  # noqa: E402


def _e(tok_s, diff_at=None, ratio=None):
    return {"tokens": 10, "to_last_s": 10 / tok_s, "wall_s": 10 / tok_s + 0.1, "tok_s": tok_s, "spec": "x",
            "draft": None, "diff_at": diff_at, "ratio": ratio}


def test_a_chain_whose_text_differs_is_flagged_and_never_best():
    per_mode = {"plain": [_e(10, ratio=1.0), _e(10, ratio=1.0)],
                "default": [_e(12, ratio=1.2), _e(13, ratio=1.3)],
                "ngram-mod": [_e(30, {"p": 4}, 3.0), _e(30, ratio=3.0)],    # fast, but another text in rep 1
                "suffix": [_e(15, ratio=1.5), _e(14, ratio=1.4)]}
    c = bl.summarize_cell(("alone", "run", "p", "code", 32), per_mode, 0.0)
    assert c["modes"]["ngram-mod"]["text_differs"] and c["modes"]["ngram-mod"]["first_diff"] == {"p": 4}
    assert c["best_chain"] == "suffix" and c["best_chain_ratio"] == pytest.approx(1.45)
    assert c["default_ratio"] == pytest.approx(1.25)
    assert c["default_vs_best"] == pytest.approx(statistics.median([12 / 15, 13 / 14]))
    s = bl.overall([c])[0]
    assert s["default_vs_plain"] == pytest.approx(1.25) and s["default_text_differs"] == []


def test_layouts_are_checked(tmp_path):
    m = tmp_path / "m.gguf"
    m.write_bytes(b"GGUF")
    assert bl.parse_layouts([f"alone={m}"]) == [("alone", m)]
    for bad in (["alone"], [f"alone={tmp_path / 'none.gguf'}"], [f"a={m}", f"a={m}"], []):
        with pytest.raises(bl.BenchError):
            bl.parse_layouts(bad)
    assert bl.first_diff("abc", "abd") == 2 and bl.first_diff("ab", "abc") == 2 and bl.first_diff("a", "a") is None


def test_one_tiny_layout_end_to_end(tiny_models, tmp_path):
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, str(SCRIPTS / "bench_layouts.py"), "--layout", f"tiny={tiny_models['target']}",
                        "-n", "4", "--reps", "1", "-t", "1", "--prompt", "story", "--chains", "ngram-simple", "--cells", "run",
                        "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "default/plain" in r.stdout and "tiny" in r.stdout
    info = json.loads(out.read_text())
    (cell,) = info["cells"]
    assert set(cell["modes"]) == {"plain", "default", "ngram-simple"} and cell["n"] == 4
    for m in cell["modes"].values():
        assert m["tok_s"] > 0 and m["to_last_s"] <= m["wall_s"] and m["text_checked"] and not m["text_differs"]
    assert cell["modes"]["plain"]["spec"] == "none" and cell["modes"]["plain"]["ratio"] == 1.0
    # run's own generation speed (prompt and loading excluded) is kept beside the process's
    assert cell["modes"]["plain"]["gen_ratio"] == 1.0 and cell["default_gen_ratio"] > 0
