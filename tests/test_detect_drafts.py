"""Drafts made for one target (EAGLE-3, DFlash, DSpark, Gemma 4 assistant), told apart by their
GGUF headers in `inspect`, `check`, `pair` and `--draft auto`, checked against the target's shape.

The draft files here are header-only in spirit (tiny tensors, llama.cpp's keys and tensor names,
the tiny target's vocabulary): detection never loads weights. The tiny target has 4 layers of
hidden size 64 (tests/conftest.py's tiny set)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from llamaspec.errors import RegistryError
from llamaspec.gguf.drafts import draft_info
from llamaspec.gguf.header import read_file
from llamaspec.pairing import autodraft, registry, registry_schema
from llamaspec.pairing.compat import check_files
from llamaspec.testing.tiny_models import bpe_vocab


def write_draft(path: Path, arch: str, meta: dict, tensors: tuple[str, ...] = ()) -> Path:
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in meta.items():
        key = f"{arch}.{key}"
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, list):
            w.add_array(key, value)
        else:
            w.add_uint32(key, value)
    bpe_vocab().write_to(w)   # a made-for-target draft carries its target's tokenizer
    for name in ("token_embd.weight", "fc.weight", *tensors):
        w.add_tensor(name, np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def eagle3(path, layers=(0, 2, 4), hidden=64):
    return write_draft(path, "eagle3", {"block_count": 1, "embedding_length": 32, "target_layers": list(layers),
                                        "target_hidden_size": hidden})


def dflash(path, layers=(1, 3), n_embd=64, dspark=False):
    return write_draft(path, "dflash", {"block_count": 2, "embedding_length": n_embd, "target_layers": list(layers),
                                        "block_size": 16}, ("markov_w1.weight",) if dspark else ())


def assistant(path, hidden=64):
    return write_draft(path, "gemma4-assistant", {"block_count": 1, "embedding_length": 32,
                                                  "embedding_length_out": hidden, "nextn_predict_layers": 1})


def _link(src: Path, dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(src, dst)
    return dst


# ---- header facts ------------------------------------------------------------------------------


def test_kinds_and_target_facts_from_headers(tmp_path):
    e = draft_info(read_file(eagle3(tmp_path / "e.gguf")))
    assert (e.kind, e.target_layers, e.target_hidden_size) == ("draft-eagle3", (0, 2, 4), 64)
    d = draft_info(read_file(dflash(tmp_path / "d.gguf")))
    assert (d.kind, d.target_layers, d.target_hidden_size, d.block_size) == ("draft-dflash", (1, 3), 64, 16)
    s = draft_info(read_file(dflash(tmp_path / "s.gguf", dspark=True)))
    assert s.kind == "draft-dspark" and s.label.startswith("DSpark")   # the Markov head tells them apart
    a = draft_info(read_file(assistant(tmp_path / "a.gguf")))
    assert (a.kind, a.target_architecture, a.target_hidden_size) == ("draft-mtp", "gemma4", 64)


def test_inspect_shows_the_kind_and_what_target_it_needs(run_cli, tmp_path):
    path = eagle3(tmp_path / "qwen-eagle3.gguf")
    info = run_cli("inspect", path, "--json").json()
    assert info["draft"]["kind"] == "draft-eagle3" and info["draft"]["target_layers"] == [0, 2, 4]
    r = run_cli("inspect", path)
    assert r.exit_code == 0 and "EAGLE-3 draft" in r.stdout and "--spec-type draft-eagle3" in r.stdout
    assert "layers 0, 2, 4" in r.stdout and "hidden size 64" in r.stdout
    r = run_cli("inspect", dflash(tmp_path / "s.gguf", dspark=True))
    assert "DSpark draft" in r.stdout and "16 tokens per draft pass" in r.stdout
    assert run_cli("inspect", tmp_path / "s.gguf", "--json").json()["draft"]["kind"] == "draft-dspark"


# ---- check: does it fit the target ------------------------------------------------------------


def test_check_accepts_a_draft_made_for_the_target(run_cli, tiny_models, tmp_path):
    r = run_cli("check", tiny_models["target"], eagle3(tmp_path / "e.gguf"), "--json")
    assert r.exit_code == 0, r.stdout
    v = r.json()
    assert v["compatible"] and v["draft_kind"] == "draft-eagle3"
    rules = {x["rule"]: x for x in v["rules"]}
    assert rules["target_layers"]["passed"] and rules["hidden_size"]["passed"]
    assert not v["facts"]["warnings"] or "families" not in " ".join(v["facts"]["warnings"])
    human = run_cli("check", tiny_models["target"], tmp_path / "e.gguf")
    assert "fits this target (--spec-type draft-eagle3)" in human.stdout and "target layers" in human.stdout


@pytest.mark.parametrize("make, rule, needle", [
    (lambda p: eagle3(p, layers=(0, 2, 9)), "target_layers", "reads layer(s) [9], the target has 4 layers"),
    (lambda p: eagle3(p, layers=(0, 2)), "target_layers", "exactly 3 target layers"),
    (lambda p: eagle3(p, hidden=128), "hidden_size", "64 (target) vs 128 (trained for)"),
    (lambda p: dflash(p, n_embd=32), "hidden_size", "64 (target) vs 32"),
    (lambda p: dflash(p, layers=(1, 5)), "target_layers", "[5]"),
    (lambda p: assistant(p), "target_arch", "needs a gemma4 target"),
])
def test_check_names_the_shape_rule_that_fails(run_cli, tiny_models, tmp_path, make, rule, needle):
    r = run_cli("check", tiny_models["target"], make(tmp_path / "x.gguf"), "--json")
    assert r.exit_code == 1
    v = r.json()
    assert v["failed_rule"] == rule and needle in v["reason"], v["reason"]
    q = run_cli("check", tiny_models["target"], tmp_path / "x.gguf", "-q")
    assert q.stdout.strip() == f"incompatible: {rule}"


def test_a_made_for_target_draft_of_another_vocabulary_fails_the_vocab_rules(tiny_models, tmp_path):
    v = check_files(tiny_models["spm"], eagle3(tmp_path / "e.gguf"))
    assert not v.compatible and v.failed_rule == "vocab_type" and v.draft_kind == "draft-eagle3"


# ---- pair and --draft auto ---------------------------------------------------------------------


def test_auto_takes_a_draft_made_for_the_target_beside_it(tiny_models, tmp_path, isolated_home):
    repo = tmp_path / "repo"
    target = _link(tiny_models["target"], repo / "model-F32.gguf")
    eagle3(repo / "eagle3-model.gguf")
    c = autodraft.choose_draft(str(target), offline=True, default_dirs=False)
    assert (c.kind, c.path.name) == ("draft-eagle3", "eagle3-model.gguf")
    assert "EAGLE-3 draft made for this target" in c.reason and "[0, 2, 4]" in c.reason
    # llama.cpp's preference: DSpark over DFlash over EAGLE-3
    dflash(repo / "dflash-model.gguf")
    assert autodraft.choose_draft(str(target), offline=True, default_dirs=False).kind == "draft-dflash"
    dflash(repo / "dspark-model.gguf", dspark=True)
    assert autodraft.choose_draft(str(target), offline=True, default_dirs=False).kind == "draft-dspark"


def test_auto_skips_a_draft_that_does_not_fit_and_says_why(tiny_models, tmp_path, isolated_home):
    repo = tmp_path / "repo"
    target = _link(tiny_models["target"], repo / "model-F32.gguf")
    eagle3(repo / "eagle3-model.gguf", layers=(0, 2, 9))
    c = autodraft.choose_draft(str(target), offline=True, default_dirs=False)
    assert c.kind == autodraft.TEXT_FALLBACK
    assert any("draft-eagle3 draft" in n and "reads layer(s) [9]" in n for n in c.considered)


def test_an_eagle3_file_on_disk_is_never_a_plain_draft(tiny_models, tmp_path, isolated_home):
    # Same vocabulary as the target, so the vocabulary rules pass: only the header tells it apart.
    d = tmp_path / "store"
    eagle3(d / "Tiny-Eagle3.gguf")
    c = autodraft.choose_draft(str(tiny_models["target"]), search_dirs=[d], offline=True, default_dirs=False)
    assert (c.kind, c.path.name) == ("draft-eagle3", "Tiny-Eagle3.gguf")
    eagle3(d / "Tiny-Eagle3.gguf", hidden=128)   # no longer fits: not a draft-simple fallback either
    c = autodraft.choose_draft(str(tiny_models["target"]), search_dirs=[d], offline=True, default_dirs=False)
    assert c.kind == autodraft.TEXT_FALLBACK


def test_auto_for_a_target_with_a_non_fitting_assistant_beside_it(tiny_models, tmp_path, isolated_home):
    repo = tmp_path / "repo"
    target = _link(tiny_models["target"], repo / "model-F32.gguf")
    assistant(repo / "mtp-model.gguf")
    c = autodraft.choose_draft(str(target), offline=True, default_dirs=False)
    assert c.kind == autodraft.TEXT_FALLBACK
    assert any("assistant mtp-model.gguf beside the target does not fit it" in n and "gemma4" in n
               for n in c.considered)


def test_pair_lists_kinds_and_the_auto_choice(run_cli, tiny_models, tmp_path, isolated_home):
    repo = tmp_path / "repo"
    target = _link(tiny_models["target"], repo / "model-F32.gguf")
    eagle3(repo / "eagle3-model.gguf")
    d = tmp_path / "store"
    dflash(d / "dflash-wrong.gguf", layers=(7,))
    r = run_cli("pair", target, "--search", d, "--no-default-dirs", "--offline", "--json")
    assert r.exit_code == 0, r.stderr
    rep = r.json()
    assert rep["auto"]["kind"] == "draft-eagle3" and rep["auto"]["path"].endswith("eagle3-model.gguf")
    disk = {Path(c["path"]).name: c for c in rep["on_disk"]}
    assert disk["dflash-wrong.gguf"]["draft_kind"] == "draft-dflash" and not disk["dflash-wrong.gguf"]["compatible"]
    human = run_cli("pair", target, "--search", d, "--no-default-dirs", "--offline")
    assert "--draft auto → draft-eagle3" in human.stdout and "no (draft-dflash)" in human.stdout


def test_pair_on_a_draft_file_names_the_targets_it_fits(run_cli, tiny_models, tmp_path, isolated_home):
    d = tmp_path / "store"
    _link(tiny_models["target"], d / "target.gguf")          # 4 layers: fits
    _link(tiny_models["draft"], d / "small.gguf")            # 1 layer: the draft reads layers up to 4
    path = eagle3(tmp_path / "eagle3-x.gguf")
    r = run_cli("pair", path, "--search", d, "--no-default-dirs", "--offline", "--json")
    fits = {Path(t["path"]).name: t for t in r.json()["made_for"]}
    assert fits["target.gguf"]["fits"] and not fits["small.gguf"]["fits"]
    assert "the target has 1 layers" in fits["small.gguf"]["reason"]
    human = run_cli("pair", path, "--search", d, "--no-default-dirs", "--offline")
    assert "EAGLE-3 draft" in human.stdout and "target.gguf: fits" in human.stdout


# ---- registry schema ---------------------------------------------------------------------------


def _family(tmp_path, draft_entry: dict) -> Path:
    data = {"schema": 1, "family": "tiny", "description": "d", "architectures": ["llama"],
            "tokenizer": {"type": "BPE", "source": "test"},
            "models": [{"id": "t", "role": "main", "repo": "o/t-GGUF", "quant": "F32", "source": "test"},
                       {"id": "d", "repo": "o/d-GGUF", "quant": "F32", "source": "test", **draft_entry}],
            "pairs": [{"main": "t", "draft": "d", "status": "unverified"}]}
    path = tmp_path / "tiny.yaml"
    path.write_text(registry_schema.dump_family(data), encoding="utf-8")
    return path


def test_registry_models_carry_a_draft_kind(tmp_path):
    fam = registry.load_family_file(_family(tmp_path, {"role": "draft", "kind": "draft-eagle3"}))
    assert fam.model("d").kind == "draft-eagle3" and fam.model("d").to_dict()["kind"] == "draft-eagle3"
    assert fam.model("t").kind == "draft-simple" and "kind" not in fam.model("t").to_dict()
    with pytest.raises(RegistryError, match=r"tiny\.yaml:\d+: model 'd' kind must be one of draft-simple"):
        registry.load_family_file(_family(tmp_path, {"role": "draft", "kind": "eagle"}))
    with pytest.raises(RegistryError, match=r"tiny\.yaml:\d+: model 'd' of kind draft-dflash must have role draft"):
        registry.load_family_file(_family(tmp_path, {"role": "both", "kind": "draft-dflash"}))


# ---- with real tiny drafts (the drafters of speculative/drafters/eagle3.py, dflash.py) ---------------


def test_run_draft_auto_takes_the_made_for_target_draft_and_stays_lossless(run_cli, test_models_dir, tmp_path,
                                                                          isolated_home):
    from llamaspec.testing import tiny_spec_drafts as spec

    m = spec.make_spec_draft_set(test_models_dir / "tiny-spec-drafts")
    repo = tmp_path / "repo"
    target = _link(m["bigram_target"], repo / "model.gguf")
    _link(m["eagle3"], repo / "eagle3-model.gguf")
    _link(m["dspark"], repo / "dspark-model.gguf")
    common = (str(target), "-p", "the cat sat on", "-n", "24", "--temp", "0", "--raw", "--json", "-t", "1")
    plain = run_cli("run", *common, "--spec-type", "none").json()
    got = run_cli("run", *common, "--draft", "auto")
    assert got.exit_code == 0, got.stderr
    got = got.json()
    assert got["spec_type"] == "draft-dspark" and got["draft_model"].endswith("dspark-model.gguf")  # DSpark first
    assert got["tokens"] == plain["tokens"] and got["accepted"] > 0
