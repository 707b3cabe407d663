"""`llamaspec check`, `llamaspec pair`, disk discovery and the `--draft auto` resolution."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from llamaspec.errors import IncompatiblePairError
from llamaspec.gguf.header import read_file
from llamaspec.gguf.peek import light_header, peek, target_tokens
from llamaspec.pairing import autodraft, discovery, registry_schema
from llamaspec.pairing import check as pair_check

from hub_server import big_vocab_gguf, hub, hub_home  # noqa: F401 - fixtures: a local test Hub


def _link(src: Path, dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(src, dst)
    return dst



@pytest.fixture(autouse=True)
def _fresh_printer(monkeypatch):
    """A printer bound to this test's streams (an earlier test's captured stream may be closed)."""
    from llamaspec.cli import _output as output

    monkeypatch.setattr(output, "_current", output.Output())

# ---- check -------------------------------------------------------------------------------------


def test_check_compatible_pair(run_cli, tiny_models):
    r = run_cli("check", tiny_models["target"], tiny_models["draft"])
    assert r.exit_code == 0, r.stderr
    for title in ("vocabulary type", "BOS token", "EOS token", "vocabulary size", "token texts"):
        assert title in r.stdout
    assert "compatible" in r.stdout and "FAIL" not in r.stdout
    assert r.stderr == ""


def test_check_translated_pair_names_rule_and_token(run_cli, tiny_models):
    """A vocabulary that fails llama.cpp's rules is a translated pair (it drafts through text): exit 0,
    with the rule that failed."""
    from llamaspec.testing.tiny_models import VARIANT_TOKEN_ID

    r = run_cli("check", tiny_models["target"], tiny_models["variant_token_text"], "--json")
    assert r.exit_code == 0
    d = r.json()
    assert d["compatible"] is False and d["failed_rule"] == "token_text" and d["kind"] == "translated"
    assert d["first_diff"]["id"] == VARIANT_TOKEN_ID
    assert d["first_diff"]["draft_text"] == f"<|changed_{VARIANT_TOKEN_ID}|>"
    assert [x["passed"] for x in d["rules"]] == [True, True, True, True, False]

    r = run_cli("check", tiny_models["target"], tiny_models["variant_add_bos"])
    assert r.exit_code == 0 and "FAIL" in r.stdout and "add_bos" in r.stdout and "translated" in r.stdout
    r = run_cli("check", tiny_models["target"], tiny_models["variant_size_129"], "-q")
    assert (r.exit_code, r.stdout) == (0, "translated: vocab_size\n")
    r = run_cli("check", tiny_models["target"], tiny_models["variant_size_128"], "-q")
    assert (r.exit_code, r.stdout) == (0, "token-exact\n")


def test_check_missing_file_is_a_one_line_error(run_cli, tiny_models, tmp_path):
    r = run_cli("check", tiny_models["target"], tmp_path / "nope.gguf")
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr.startswith("error:") and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all")
    r = run_cli("check", junk, tiny_models["target"])
    assert r.exit_code == 1 and "not a GGUF file" in r.stderr


@pytest.mark.real
def test_check_real_pairs(run_cli, smollm2_q4, smollm2_f16, gemma_q4, gemma_f16):
    r = run_cli("check", smollm2_f16, smollm2_q4, "--json")
    assert r.exit_code == 0 and r.json()["compatible"] is True
    r = run_cli("check", smollm2_q4, gemma_q4)
    assert r.exit_code == 0
    assert "translated" in r.stdout and "vocab_type" in r.stdout and "incompatible" not in r.stdout
    r = run_cli("check", gemma_f16, gemma_q4, "--json")
    assert r.exit_code == 0 and r.json()["target"]["n_vocab"] == 262144


# ---- discovery ---------------------------------------------------------------------------------


def test_peek_reads_only_what_it_needs(tiny_models, tmp_path):
    pk = peek(tiny_models["target"])
    h = read_file(tiny_models["target"])
    assert (pk.architecture, pk.tokenizer_model, pk.n_vocab) == ("llama", "gpt2", len(h.metadata["tokenizer.ggml.tokens"]))
    assert peek(tiny_models["mtp"]).nextn_predict_layers == 1
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 8)  # magic, then garbage
    assert peek(junk) is None


def _same_as_full_parse(target_path: Path, cand_path: Path) -> bool | None:
    """None when light_header declines (then scan falls back to the full parser)."""
    from llamaspec.pairing.compat import check_headers
    from llamaspec.gguf.vocab import vocab_from_header

    target = read_file(target_path)
    light = light_header(cand_path, target_tokens(target))
    if light is None:
        return None
    full = read_file(cand_path)
    return (vocab_from_header(light) == vocab_from_header(full)
            and check_headers(target, light).to_dict() == check_headers(target, full).to_dict()
            and (light.n_params, light.file_type, light.bytes_read) == (full.n_params, full.file_type, full.bytes_read))


def test_light_header_gives_exactly_the_full_parse(tiny_models):
    results = {name: _same_as_full_parse(tiny_models["target"], p) for name, p in tiny_models.items()}
    # Different token texts from id 5 on: declined, the full parser reports where they differ.
    assert {n for n, r in results.items() if r is None} == {"other_vocab", "spm", "variant_token_text"}
    assert all(r for r in results.values() if r is not None)


@pytest.mark.real
def test_light_header_on_real_files(smollm2_f16, smollm2_q4, gemma_f16, gemma_q4):
    assert _same_as_full_parse(smollm2_f16, smollm2_q4) is True
    assert _same_as_full_parse(gemma_f16, gemma_q4) is True


def test_discovery_finds_models_in_every_store(tiny_models, isolated_home):
    draft = tiny_models["draft"]
    # Hugging Face cache: snapshot symlinks into blobs.
    snap = isolated_home / "hf" / "hub" / "models--test-org--tiny-GGUF" / "snapshots" / "abc123"
    _link(draft, snap / "tiny-draft-F32.gguf")
    # LM Studio.
    _link(tiny_models["variant_size_128"], isolated_home / ".lmstudio" / "models" / "pub" / "tiny" / "tiny-128.gguf")
    # Ollama: an extension-less GGUF blob named by its manifest, and a non-GGUF blob.
    ollama = isolated_home / ".ollama" / "models"
    blob = ollama / "blobs" / ("sha256-" + "ab" * 32)
    blob.parent.mkdir(parents=True)
    shutil.copy(tiny_models["variant_low_token_text"], blob)
    (ollama / "blobs" / ("sha256-" + "cd" * 32)).write_text('{"template": "not a model"}')
    manifest = ollama / "manifests" / "registry.ollama.ai" / "library" / "tinyllm" / "latest"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"layers": [
        {"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:" + "ab" * 32}]}))

    roots = [r for r in discovery.default_roots() if isolated_home in r.path.parents]  # not a system-wide store
    assert [r.kind for r in roots] == ["hf-cache", "lmstudio", "ollama"]
    found = {f.kind: f for f in discovery.iter_models(roots)}
    assert found["hf-cache"].label == "test-org/tiny-GGUF/tiny-draft-F32.gguf"
    assert found["lmstudio"].path.name == "tiny-128.gguf"
    assert found["ollama"].label == "tinyllm:latest"
    assert len(list(discovery.iter_models(roots))) == 3


def test_scan_skips_what_cannot_match_and_dedupes(tiny_models, tmp_path):
    d = tmp_path / "models"
    _link(tiny_models["draft"], d / "a" / "draft.gguf")
    _link(tiny_models["draft"], d / "b" / "same-file.gguf")        # same real file: listed once
    _link(tiny_models["target"], d / "target-again.gguf")           # the target itself
    _link(tiny_models["spm"], d / "spm.gguf")                       # other vocab type: prefiltered
    _link(tiny_models["variant_size_129"], d / "size129.gguf")      # same type, size within... no: 129
    _link(tiny_models["variant_token_text"], d / "changed.gguf")    # compared, incompatible
    _link(tiny_models["mtp"], d / "mtp-model-F32.gguf")             # MTP heads of its own model: not a draft
    _link(tiny_models["draft"], d / "split-00002-of-00003.gguf")    # later split part: skipped by name
    (d / "notes.txt").write_text("hello")
    target = read_file(tiny_models["target"])
    cands = discovery.scan(target, discovery.search_roots([d]))
    by_name = {c.path.name: c for c in cands}
    rest = {"target-again.gguf", "spm.gguf", "size129.gguf", "changed.gguf", "mtp-model-F32.gguf"}
    assert set(by_name) == {"draft.gguf"} | rest or set(by_name) == {"same-file.gguf"} | rest
    # sidecar names are read (an assistant or EAGLE-3 file may carry one), but this one is no draft
    assert by_name["mtp-model-F32.gguf"].verdict is None and "MTP heads" in by_name["mtp-model-F32.gguf"].skipped
    draft = by_name.get("draft.gguf") or by_name["same-file.gguf"]
    assert draft.compatible
    assert by_name["target-again.gguf"].skipped == "the target itself"
    assert by_name["spm.gguf"].verdict is None and "vocabulary type" in by_name["spm.gguf"].skipped
    assert by_name["size129.gguf"].verdict is None  # 129 tokens more: ruled out before decoding texts
    assert by_name["changed.gguf"].verdict.failed_rule == "token_text"


# ---- pair --------------------------------------------------------------------------------------


def test_pair_lists_disk_drafts_and_the_auto_choice(run_cli, tiny_models, tmp_path, isolated_home, draft_pays):
    d = tmp_path / "models"
    _link(tiny_models["draft"], d / "tiny-draft.gguf")
    _link(tiny_models["variant_token_text"], d / "changed.gguf")
    r = run_cli("pair", tiny_models["target"], "--search", d, "--json")
    # on a CPU the tiny draft costs about a tiny target's step: found, not taken, and said so
    assert r.json()["auto"]["kind"] == "prompt-lookup" and Path(r.json()["auto"]["refused"]).name == "tiny-draft.gguf"
    assert "not used: tiny-draft.gguf" in run_cli("pair", tiny_models["target"], "--search", d).stdout
    draft_pays(tiny_models["target"], tiny_models["draft"])   # a run measured it paying here
    r = run_cli("pair", tiny_models["target"], "--search", d, "--json")
    assert r.exit_code == 0, r.stderr
    rep = r.json()
    ondisk = {Path(c["path"]).name: c for c in rep["on_disk"]}
    assert ondisk["tiny-draft.gguf"]["compatible"] is True
    assert ondisk["changed.gguf"]["compatible"] is False and "token" in ondisk["changed.gguf"]["reason"]
    assert rep["auto"]["kind"] == "draft-simple" and rep["auto"]["source"] == "disk"
    assert Path(rep["auto"]["path"]).name == "tiny-draft.gguf"
    assert rep["scanned"]["compatible"] == 1

    r = run_cli("pair", tiny_models["target"], "--search", d)
    assert r.exit_code == 0
    assert "tiny-draft.gguf" in r.stdout and "--draft auto" in r.stdout and "smallest compatible" in r.stdout
    r = run_cli("pair", tiny_models["target"], "--search", d, "-q")
    assert Path(r.stdout.strip()).name == "tiny-draft.gguf"


def test_pair_on_an_mtp_model(run_cli, tiny_models, isolated_home):
    r = run_cli("pair", tiny_models["mtp"], "--json")
    assert r.exit_code == 0
    assert r.json()["auto"]["kind"] == "draft-mtp" and r.json()["mtp"]["nextn_predict_layers"] == 1


@pytest.mark.real
def test_pair_on_smollm2_finds_its_sibling_and_the_registry(run_cli, smollm2_f16, smollm2_q4, gemma_q4, tmp_path,
                                                           isolated_home):
    d = tmp_path / "models"
    _link(smollm2_q4, d / "SmolLM2-135M-Instruct.Q4_1.gguf")
    _link(gemma_q4, d / "gemma.gguf")
    r = run_cli("pair", smollm2_f16, "--search", d, "--json")
    assert r.exit_code == 0, r.stderr
    rep = r.json()
    assert [c["label"] for c in rep["on_disk"]] == [str(d / "SmolLM2-135M-Instruct.Q4_1.gguf")]
    assert rep["on_disk"][0]["compatible"] is True
    # gemma prefiltered; the third file is the target itself, found in its own folder
    assert rep["scanned"] == {**rep["scanned"], "files": 3, "compared": 1, "compatible": 1}
    assert rep["registry"]["families"] == [{"family": "smollm2", "basis": "fingerprint",
                                            "file": rep["registry"]["families"][0]["file"]}]
    statuses = {(p["main"]["id"], p["draft"]["id"]): p["status"] for p in rep["registry"]["pairs"]}
    assert statuses[("smollm2-135m-instruct-f16-local", "smollm2-135m-instruct-pypi-q4_1")] == "verified"
    assert statuses[("smollm2-1.7b-instruct", "smollm2-135m-instruct")] == "unverified"
    # a same-size quant cannot pay on a CPU: named, not taken (a GPU build would say otherwise)
    assert rep["auto"]["kind"] == "prompt-lookup" and rep["auto"]["value"]["pays"] is False
    assert Path(rep["auto"]["refused"]).name == "SmolLM2-135M-Instruct.Q4_1.gguf"

    r = run_cli("pair", smollm2_f16, "--search", d)
    assert "registry pairs" in r.stdout and "unsloth/SmolLM2-135M-Instruct-GGUF:Q8_0" in r.stdout
    assert "verified" in r.stdout


# ---- --draft auto ------------------------------------------------------------------------------


def test_auto_prefers_built_in_mtp_heads(tiny_models, isolated_home):
    c = autodraft.choose_draft(str(tiny_models["mtp"]), offline=True)
    assert (c.kind, c.path, c.source) == ("draft-mtp", None, "target")


def test_auto_finds_an_mtp_sidecar(tiny_models, tmp_path, isolated_home):
    target = _link(tiny_models["target"], tmp_path / "repo" / "model-F32.gguf")
    side = _link(tiny_models["mtp"], tmp_path / "repo" / "mtp-model-F32.gguf")
    # Off by default: the MTP drafter only drives heads inside the target, so it is only noted.
    c = autodraft.choose_draft(str(target), offline=True, default_dirs=False)
    assert c.kind == "prompt-lookup" and any("MTP sidecar mtp-model-F32.gguf" in n for n in c.considered)
    c = autodraft.choose_draft(str(target), offline=True, mtp_sidecars=True)
    assert (c.kind, c.path, c.source) == ("draft-mtp", side, "sidecar")


def test_auto_picks_the_smallest_reasonable_disk_draft(tiny_models, tmp_path, isolated_home):
    d = tmp_path / "models"
    _link(tiny_models["variant_size_128"], d / "bigger-vocab.gguf")   # compatible, larger file
    _link(tiny_models["draft"], d / "draft.gguf")                     # compatible, smallest
    _link(tiny_models["variant_token_text"], d / "changed.gguf")      # incompatible
    c = autodraft.choose_draft(str(tiny_models["target"]), search_dirs=[d], offline=True, gate=False)
    assert (c.kind, c.source, c.path.name) == ("draft-simple", "disk", "draft.gguf")
    assert c.verdict.compatible and "1 other compatible file passed over" in c.reason


def test_auto_skips_drafts_too_big_to_pay_off(tiny_models, tmp_path, isolated_home):
    d = tmp_path / "models"
    _link(tiny_models["draft"], d / "draft.gguf")
    # The draft as target: the 4-layer "target" is compatible but bigger, so it is no draft for it.
    c = autodraft.choose_draft(str(tiny_models["draft"]), search_dirs=[tiny_models["target"].parent], offline=True)
    assert c.kind == "prompt-lookup" and "small enough" in c.reason


def _tiny_registry(directory: Path, draft_entry: dict) -> None:
    data = {
        "schema": 1, "family": "tiny", "description": "tiny", "architectures": ["llama"],
        "tokenizer": {"type": "BPE", "pre": "smollm", "source": "test"},
        "models": [{"id": "tiny-target", "role": "main", "repo": "test-org/tiny-target-GGUF", "quant": "F32",
                    "params": 0.001, "source": "test"},
                   {"id": "tiny-draft", "role": "draft", "params": 0.00001, "source": "test", **draft_entry}],
        "pairs": [{"main": "tiny-target", "draft": "tiny-draft", "status": "unverified", "recommended": True}],
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tiny.yaml").write_text(registry_schema.dump_family(data))


def test_auto_falls_back_to_ngram_offline(tiny_models, tmp_path, isolated_home, monkeypatch):
    monkeypatch.setenv("LLAMASPEC_PAIRINGS", str(tmp_path / "pairings"))
    _tiny_registry(tmp_path / "pairings", {"repo": "test-org/tiny-draft-GGUF", "quant": "F32"})
    c = autodraft.choose_draft(str(tiny_models["target"]), offline=True)
    assert c.kind == "prompt-lookup" and c.path is None
    assert "test-org/tiny-draft-GGUF:F32" in c.reason and "offline" in c.reason
    dry = autodraft.choose_draft(str(tiny_models["target"]), dry_run=True)
    assert dry.would_download and dry.label == "test-org/tiny-draft-GGUF:F32" and dry.path is None


def test_auto_uses_a_registry_draft_from_an_installed_package(tiny_models, tmp_path, isolated_home, monkeypatch):
    site = tmp_path / "site"
    _link(tiny_models["draft"], site / "tinypkg" / "tiny-draft.gguf")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("LLAMASPEC_PAIRINGS", str(tmp_path / "pairings"))
    _tiny_registry(tmp_path / "pairings", {"package": "tinypkg==1.0", "file": "tinypkg/tiny-draft.gguf"})
    c = autodraft.choose_draft(str(tiny_models["target"]), offline=True)
    assert (c.kind, c.source, c.path.name) == ("draft-simple", "registry", "tiny-draft.gguf")


def test_check_explicit_draft(tiny_models, capsys, monkeypatch, tmp_path):
    from llamaspec.cli import _output as output

    monkeypatch.setattr(output, "_current", output.Output())  # bound to capsys's streams, set up by now
    assert pair_check.check_explicit_draft(str(tiny_models["target"]), str(tiny_models["draft"])).compatible
    # another vocabulary: a translated pair, accepted as it is (it drafts through text)
    v = pair_check.check_explicit_draft(str(tiny_models["target"]), str(tiny_models["spm"]))
    assert (v.compatible, v.kind) == (False, "translated")
    # a draft made for another target cannot draft at all
    from tests.test_detect_drafts import eagle3

    bad = eagle3(tmp_path / "e.gguf", layers=(0, 2, 9))
    with pytest.raises(IncompatiblePairError) as info:
        pair_check.check_explicit_draft(str(tiny_models["target"]), str(bad))
    assert "target layers differs" in info.value.message and "--force-draft" in info.value.hint
    capsys.readouterr()
    v = pair_check.check_explicit_draft(str(tiny_models["target"]), str(bad), force=True)
    assert not v.can_draft
    assert "forced an incompatible draft" in capsys.readouterr().err


@pytest.mark.real
def test_auto_on_real_smollm2(smollm2_f16, smollm2_q4, tmp_path, isolated_home):
    d = tmp_path / "models"
    _link(smollm2_q4, d / "q4.gguf")
    c = autodraft.choose_draft(str(smollm2_f16), search_dirs=[d], offline=True, gate=False)
    assert (c.kind, c.source, c.path.name) == ("draft-simple", "disk", "q4.gguf")
    assert not c.value.pays and "does not pay" in c.reason   # pull's view: taken, and said so
    c = autodraft.choose_draft(str(smollm2_f16), search_dirs=[d], offline=True)
    assert (c.kind, c.refused.name) == ("prompt-lookup", "q4.gguf")   # run's: not expected to pay on a CPU
    # Nothing on disk and offline: SmolLM2 135M is the family's smallest, so drafting from the text.
    c = autodraft.choose_draft(str(smollm2_q4), offline=True)
    assert c.kind == "prompt-lookup"


# ---- the registry step against the local test Hub (tests/hub_server.py) -----------------------


def test_auto_downloads_the_registry_draft_from_the_hub(tiny_models, tmp_path, hub, hub_home, monkeypatch):
    monkeypatch.setenv("LLAMASPEC_PAIRINGS", str(tmp_path / "pairings"))
    _tiny_registry(tmp_path / "pairings", {"repo": "org/draft", "quant": "Q4_K_M"})
    c = autodraft.choose_draft(str(tiny_models["target"]), default_dirs=False)
    assert (c.kind, c.source, c.label) == ("draft-simple", "registry", "org/draft:Q4_K_M")
    assert c.path.name == "draft-Q4_K_M.gguf" and Path(hub_home["HF_HUB_CACHE"]) in c.path.parents
    assert c.verdict.compatible
    # The draft is now in the HF cache: the next resolution finds it on disk, without the Hub.
    hub.stop()
    again = autodraft.choose_draft(str(tiny_models["target"]), offline=True, gate=False)
    assert (again.kind, again.source) == ("draft-simple", "disk") and again.path.resolve() == c.path.resolve()


def test_a_registry_draft_whose_header_does_not_match_is_never_downloaded(tiny_models, tmp_path, hub, hub_home,
                                                                          monkeypatch):
    """The real resolver against the local Hub: the draft's header is read (ranged), found not to
    fit the target, and the file is never fetched."""
    monkeypatch.setenv("LLAMASPEC_PAIRINGS", str(tmp_path / "pairings"))
    hub.add_repo("org/mismatch", {"mismatch-Q4_K_M.gguf": Path(tiny_models["variant_token_text"]).read_bytes()})
    _tiny_registry(tmp_path / "pairings", {"repo": "org/mismatch", "quant": "Q4_K_M"})
    c = autodraft.choose_draft(str(tiny_models["target"]), default_dirs=False)
    assert c.kind == "prompt-lookup" and "does not match" in c.reason, c.reason
    reads = [g for g in hub.matching("GET") if "/resolve/" in g.path and "mismatch-Q4_K_M.gguf" in g.path]
    assert reads and all(g.range for g in reads), [(g.path, g.range) for g in reads]   # the header only
    assert not list(Path(hub_home["HF_HUB_CACHE"]).rglob("*.gguf"))


def test_auto_survives_an_unreachable_hub(tiny_models, tmp_path, hub_home, hub, monkeypatch):
    monkeypatch.setenv("LLAMASPEC_PAIRINGS", str(tmp_path / "pairings"))
    _tiny_registry(tmp_path / "pairings", {"repo": "org/draft", "quant": "Q4_K_M"})
    hub.stop()
    c = autodraft.choose_draft(str(tiny_models["target"]), default_dirs=False)
    assert c.kind == "prompt-lookup" and "org/draft:Q4_K_M" in c.reason


def test_check_and_pair_never_import_llama_cpp(tiny_models, tmp_path):
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from llamaspec.cli import main\n"
        "for argv in (['check', sys.argv[1], sys.argv[2], '-q'], ['pair', sys.argv[1], '--no-default-dirs', '-q']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print('llama_cpp' in sys.modules)\n"
    )
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", code, str(tiny_models["target"]), str(tiny_models["draft"])],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "False"


def test_auto_passes_over_a_draft_whose_weights_are_cut(run_cli, tiny_models, tmp_path, isolated_home):
    """A draft on disk with a complete header but cut tensor data is compatible by its header, yet
    cannot draft: --draft auto must not pick it (run would only fail later on the truncation)."""
    d = tmp_path / "drafts"
    d.mkdir()
    data = tiny_models["draft"].read_bytes()
    (d / "cut-draft.gguf").write_bytes(data[: len(data) - 4096])
    r = run_cli("pair", str(tiny_models["target"]), "--search", str(d), "--offline", "--json")
    assert r.exit_code == 0, r.stderr
    info = r.json()
    assert info["auto"]["kind"] == "prompt-lookup"
    cand = next(c for c in info["on_disk"] if c["path"].endswith("cut-draft.gguf"))
    assert cand["compatible"] is False and "truncated GGUF" in cand["reason"]
