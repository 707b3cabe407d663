"""Drafts found next to the model: the target's own folder, $LLAMASPEC_MODELS_PATH and --search,
one list of places (discovery.places) that `pair`, `run --draft auto` and `models` all use."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from llamaspec.pairing import autodraft, discovery


def _put(src: Path, dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(src, dst)
    return dst


# ---- the places ----------------------------------------------------------------------------------


def test_places_put_search_first_then_the_targets_folder_then_the_models_path(tmp_path, monkeypatch):
    target = tmp_path / "models" / "t.gguf"
    target.parent.mkdir()
    target.write_bytes(b"GGUF")
    extra, missing, search = tmp_path / "extra", tmp_path / "missing", tmp_path / "search"
    extra.mkdir()
    monkeypatch.setenv(discovery.MODELS_PATH_ENV, f"{extra}{os.pathsep}{missing}{os.pathsep}")
    roots = discovery.places(target, [search])
    assert [(r.kind, r.path) for r in roots[:3]] == [("search", search), ("beside", target.parent),
                                                    ("models-path", extra)]   # a missing folder is left out
    assert roots[1].depth == discovery.BESIDE_DEPTH
    assert [r.kind for r in discovery.places(target, [search], default_dirs=False)] == ["search"]
    assert roots[1].describe() == f"the target's folder {target.parent}"


def test_the_targets_folder_is_searched_one_level_deep(tiny_models, tmp_path):
    home = tmp_path / "models"
    target = _put(tiny_models["target"], home / "target.gguf")
    _put(tiny_models["draft"], home / "smollm" / "one-down.gguf")
    _put(tiny_models["draft"], home / "a" / "b" / "two-down.gguf")
    found = [f.path.name for f in discovery.iter_models(discovery.places(target))]
    assert "one-down.gguf" in found and "two-down.gguf" not in found


def test_the_scan_stops_at_its_time_limit_and_says_where(tiny_models, tmp_path):
    target = _put(tiny_models["target"], tmp_path / "m" / "target.gguf")
    _put(tiny_models["draft"], tmp_path / "m" / "draft.gguf")
    from llamaspec.gguf.header import read_file

    roots, cut = discovery.places(target), []
    assert discovery.scan(read_file(target), roots, seconds=0.0, cut=cut) == []
    assert cut and cut[0].kind == "beside"
    assert "stopped" in autodraft.searched_places(roots, cut)[0]
    # with time, the same place yields the draft
    found = discovery.scan(read_file(target), roots, seconds=60.0)
    assert [c.path.name for c in found if c.compatible] == ["draft.gguf"]


def test_a_walk_past_its_deadline_raises_out_of_time(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"GGUF")
    with pytest.raises(discovery.OutOfTime):
        list(discovery._walk(tmp_path, 1, time.monotonic() - 1))


# ---- pair, run, models on a fresh folder ---------------------------------------------------------


@pytest.mark.real
def test_pair_lists_the_quantized_sibling_and_run_says_where_it_looked(run_cli, smollm2_f16, smollm2_q4, tmp_path):
    """The issue's case: ~/models/smollm2-f16.gguf with smollm2-q4_1.gguf beside it."""
    folder = tmp_path / "models"
    target = _put(smollm2_f16, folder / "smollm2-f16.gguf")
    _put(smollm2_q4, folder / "smollm2-q4_1.gguf")
    r = run_cli("pair", target, "--offline", "--json")
    assert r.exit_code == 0, r.stderr
    rep = r.json()
    sib = [c for c in rep["on_disk"] if Path(c["path"]).name == "smollm2-q4_1.gguf"]
    assert sib and sib[0]["compatible"] and sib[0]["location"] == "beside"
    # found, but a same-size quant is not expected to pay on a CPU: named with why, not taken
    assert Path(rep["auto"]["refused"]).name == "smollm2-q4_1.gguf" and rep["auto"]["kind"] == "prompt-lookup"
    assert f"the target's folder {folder}" in rep["scanned"]["places"]

    human = run_cli("pair", target, "--offline")
    assert "smollm2-q4_1.gguf" in human.stdout and f"searched: the target's folder {folder}" in human.stdout
    # the registry's pairs say which target they are for, and why they do not apply here
    assert "not smaller than this target" not in human.stdout
    assert ("recommended for that target; not for this target: the draft's 135M params are not clearly fewer "
            "than this target's 134.5M") in human.stdout
    assert "a quant of a model this size" in human.stdout   # the registry's own F16/Q4_1 pair of this model

    run = run_cli("run", target, "--draft", "auto", "-v", "-p", "hi", "-n", "4", "--temp", "0", "--offline", "--json")
    assert run.exit_code == 0, run.stderr
    assert f"looked for drafts in the target's folder {folder}" in run.stderr
    assert run.json()["draft_model"] is None and "draft-simple" not in run.json()["spec_type"]
    assert "smollm2-q4_1.gguf found but not expected to pay here" in run.stderr


def test_run_without_flags_takes_the_sibling_and_says_so_in_one_short_line(run_cli, tiny_models, tmp_path,
                                                                          draft_pays):
    target = _put(tiny_models["target"], tmp_path / "m" / "target.gguf")
    _put(tiny_models["draft"], tmp_path / "m" / "draft.gguf")
    draft_pays(target, tiny_models["draft"])   # measured to pay here (tests/conftest.py)
    r = run_cli("run", target, "-p", "hi", "-n", "4", "--temp", "0", "--json")
    assert r.exit_code == 0, r.stderr
    assert Path(r.json()["draft_model"]).name == "draft.gguf"
    first = r.stderr.splitlines()[0]
    assert first == "speculation: draft-simple with draft.gguf beside the target; --spec-type none turns it off"
    assert "looked for drafts" not in r.stderr   # the places and reasons are -v's


def test_models_path_adds_places_for_pair_run_and_models(run_cli, tiny_models, tmp_path, monkeypatch, draft_pays):
    target = _put(tiny_models["target"], tmp_path / "alone" / "target.gguf")
    draft_pays(target, tiny_models["draft"])
    shelf = tmp_path / "shelf"
    _put(tiny_models["draft"], shelf / "draft.gguf")
    before = run_cli("pair", target, "--offline", "--json").json()
    assert not any(c["compatible"] for c in before["on_disk"])

    monkeypatch.setenv(discovery.MODELS_PATH_ENV, str(shelf))
    after = run_cli("pair", target, "--offline", "--json").json()
    found = [c for c in after["on_disk"] if c["compatible"]]
    assert [(Path(c["path"]).name, c["location"]) for c in found] == [("draft.gguf", "models-path")]

    run = run_cli("run", target, "-p", "hi", "-n", "4", "--temp", "0", "--offline", "--json", "-v")
    assert Path(run.json()["draft_model"]).name == "draft.gguf"
    assert f"looked for drafts in {discovery.MODELS_PATH_ENV} {shelf}" in run.stderr

    models = run_cli("models", "--json")
    assert models.exit_code == 0, models.stderr
    rows = models.json()["models"]
    assert [(Path(m["path"]).name, m["where"]) for m in rows] == [("draft.gguf", "models-path")]
    assert rows[0]["architecture"] == "llama"
    near = run_cli("models", "--near", target, "--json").json()
    assert sorted(Path(m["path"]).name for m in near["models"]) == ["draft.gguf", "target.gguf"]


def test_models_on_nothing_names_the_places(run_cli, tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv(discovery.MODELS_PATH_ENV, str(empty))
    r = run_cli("models")
    assert r.exit_code == 0 and r.stdout == ""
    assert f"{discovery.MODELS_PATH_ENV} {empty}" in r.stderr and "no GGUF models" in r.stderr
    assert json.loads(run_cli("models", "--json").stdout)["places"] == [f"{discovery.MODELS_PATH_ENV} {empty}"]
