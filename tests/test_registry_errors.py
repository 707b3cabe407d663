"""Broken pairing registries (pairings/*.yaml): every case is one RegistryError line naming file and
line, fast, whatever the file holds (syntax errors, schema errors, wrong types, duplicates, a YAML
alias bomb); and the commands that read the registry (`pair`, `run --draft auto`, `pull --draft
auto`) go on without it, saying why with file:line on one line (exit 0: the registry only advises).
`tune` does not read the registry (its --draft takes no `auto`).
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from hub_server import big_vocab_gguf, hub, hub_home  # noqa: F401 - fixtures
from llamaspec.errors import RegistryError
from llamaspec.pairing import registry, registry_schema

HANG_GUARD_S = 60   # a hang guard, not a speed bound: speed belongs to benchmarks

# the tests' smollm2 family file: the shipped one plus a verified pair, so every field is there to break
PAIRINGS = Path(__file__).resolve().parent / "fixtures" / "pairings"
BASE = (PAIRINGS / "smollm2.yaml").read_text(encoding="utf-8")
CASES: Counter = Counter()
BOMB = "[" + ", ".join(["&l0 [a,a,a,a,a,a,a,a,a,a]"] + [f"&l{i} [" + ",".join([f"*l{i - 1}"] * 10) + "]"
                                                         for i in range(1, 9)]) + "]"  # 10^9 items if expanded


def line_of(text: str) -> int:
    return BASE[: BASE.index(text)].count("\n") + 1


def sub(old: str, new: str, count: int = 1) -> str:
    assert old in BASE, old
    return BASE.replace(old, new, count)


# name -> (file text (str or bytes), expected line, what the message says)
BROKEN = {
    "unclosed-flow": (sub("architectures:\n- llama", "architectures: [llama"), line_of("architectures:") + 1,
                      "invalid YAML: did not find expected ',' or ']' (while parsing a flow sequence started at line 6)"),
    "tab-indent": (sub("  type: BPE", "\ttype: BPE"), line_of("  type: BPE"), "invalid YAML"),
    "bad-indent": (sub("  pre: smollm", "     pre: smollm"), line_of("  pre: smollm"), "invalid YAML"),
    "nul-byte": (sub("  pre: smollm", "  pre: smo\0llm"), line_of("  pre: smollm"), "unacceptable character"),
    "not-utf8": (sub("  pre: smollm", "  pre: smollm").encode() .replace(b"smollm\n", b"smo\xffllm\n", 1), None,
                 "not UTF-8"),
    "python-tag": (sub("  pre: smollm", "  pre: !!python/object/apply:os.system ['id']"), line_of("  pre: smollm"),
                   "could not determine a constructor"),
    "recursive-alias": (sub("  pre: smollm", "  pre: &r [*r]"), line_of("  pre: smollm"), "recursive"),
    "deep-nesting": (sub("  pre: smollm", "  pre: " + "[" * 5000 + "]" * 5000), line_of("  pre: smollm"),
                     "invalid YAML"),
    "duplicate-key": (sub("  pre: smollm", "  pre: smollm\n  pre: llama-bpe"), line_of("  pre: smollm") + 1,
                      "duplicate key 'pre'"),
    "empty-file": ("", 1, "the file must be a mapping"),
    "top-level-list": ("- schema: 1\n", 1, "the file must be a mapping"),
    "unknown-top-key": (sub("schema: 1", "schema: 1\nfamilly: smollm2"), line_of("schema: 1") + 1,
                        "unknown key 'familly' in the file"),
    "unknown-model-key": (sub("  params: 1.7", "  parms: 1.7"), line_of("  params: 1.7"), "unknown key 'parms'"),
    "missing-key": (sub("description: ", "descriptio: "), line_of("description: "), "unknown key 'descriptio'"),
    "missing-required": (sub("  source: measured", "  sorce: measured"), line_of("  source: measured"),
                         "unknown key 'sorce'"),
    "schema-string": (sub("schema: 1", "schema: '1'"), 3, "schema must be 1 (got '1')"),
    "architectures-string": (sub("architectures:\n- llama", "architectures: llama"), line_of("architectures:"),
                             "architectures must be a non-empty list"),
    "sizes-negative": (sub("  - 49152", "  - -5"), line_of("  sizes:"), "tokenizer.sizes must be a list of positive"),
    "fingerprint-short": (sub("  - 11a3a959fb7b5dad", "  - 11a3"), line_of("  - 11a3a959fb7b5dad"),
                          "fingerprints[0]"),
    "params-string": (sub("  params: 1.7", "  params: big"), line_of("  params: 1.7"), "params must be a positive"),
    "role-unknown": (sub("  role: main", "  role: teacher"), line_of("  role: main"), "role must be one of"),
    "kind-unknown": (sub("  role: main", "  role: draft\n  kind: draft-magic"), line_of("  role: main") + 1,
                     "kind must be one of"),
    "recommended-string": (sub("  recommended: true", "  recommended: 'yes'"), line_of("  recommended: true"),
                           "recommended must be true or false"),
    "models-mapping": (sub("models:\n", "models: {}\nxmodels:\n"), line_of("models:") + 1, "unknown key 'xmodels'"),
    "pairs-string": (BASE[: BASE.index("pairs:")] + "pairs: none\n", line_of("pairs:"), "pairs must be a list"),
    "duplicate-model-id": (sub("- id: smollm2-135m-instruct\n", "- id: smollm2-1.7b-instruct\n"),
                           line_of("- id: smollm2-135m-instruct\n"), "duplicate model id 'smollm2-1.7b-instruct'"),
    "unknown-draft": (sub("  draft: smollm2-135m-instruct\n", "  draft: smollm2-9b\n"),
                      line_of("  draft: smollm2-135m-instruct\n"), "'smollm2-9b' is not a model with role draft"),
    "verified-file-list": (sub("    main_file: SmolLM2-135M-Instruct.F16.gguf", "    main_file: [a, b]"),
                           line_of("    main_file: SmolLM2"), "verified.main_file must be a non-empty string"),
    "bomb-in-type": (sub("  type: BPE", "  type: " + BOMB), line_of("  type: BPE"), "tokenizer.type must be one of"),
    "bomb-in-schema": (sub("schema: 1", "schema: " + BOMB), 3, "schema must be 1"),
    "bomb-in-recommended": (sub("  recommended: true", "  recommended: " + BOMB), line_of("  recommended: true"),
                            "recommended must be true or false"),
    "bomb-in-note": (sub("  params: 1.7", "  params: 1.7\n  note: " + BOMB), line_of("  params: 1.7") + 1,
                     "note must be a non-empty string"),
}


def _write(d: Path, text, name: str = "smollm2.yaml") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    p = d / name
    (p.write_bytes if isinstance(text, bytes) else lambda t: p.write_text(t, encoding="utf-8"))(text)
    return p


def _assert_one_line(err: RegistryError, path: Path, line: int | None, says: str) -> None:
    msg = err.message
    assert msg.startswith(f"{path}:{line}: " if line else f"{path}"), msg
    assert says in msg and "\n" not in msg and len(msg) < 400, msg
    assert "SCHEMA.md" in (err.hint or "")


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_file_is_one_line_with_file_and_line(tmp_path, name):
    text, line, says = BROKEN[name]
    path = _write(tmp_path, text)
    start = time.monotonic()
    with pytest.raises(RegistryError) as info:
        registry.load_registry(tmp_path)
    assert time.monotonic() - start < HANG_GUARD_S, name  # an alias bomb is never expanded
    _assert_one_line(info.value, path, line, says)
    CASES["load"] += 1


def test_a_family_copied_under_another_name_is_refused(tmp_path):
    """Two files cannot define one family: its name must be the file name."""
    shutil.copy(PAIRINGS / "smollm2.yaml", tmp_path)
    copy = _write(tmp_path, BASE, "smollm2-copy.yaml")
    with pytest.raises(RegistryError) as info:
        registry.load_registry(tmp_path)
    _assert_one_line(info.value, copy, line_of("family:"), "family 'smollm2' must match the file name")
    CASES["load"] += 1


def test_a_model_id_defined_in_two_families_is_refused(tmp_path):
    shutil.copy(PAIRINGS / "smollm2.yaml", tmp_path)
    other = BASE[: BASE.index("models:")].replace("family: smollm2", "family: smollm3") + (
        "models:\n- id: smollm2-1.7b-instruct\n  role: draft\n  repo: a/b\n  quant: Q8_0\n  source: x\npairs: []\n")
    path = _write(tmp_path, other, "smollm3.yaml")
    with pytest.raises(RegistryError) as info:
        registry.load_registry(tmp_path)
    msg = info.value.message
    assert msg.startswith(f"{path}:") and "model id 'smollm2-1.7b-instruct' is already defined in" in msg
    assert f"{tmp_path / 'smollm2.yaml'}:" in msg
    CASES["load"] += 1


# ---- every field of a real file, every wrong type: a RegistryError with a line, never a crash --------

WRONG = [None, 0, -1, 1.5, True, "", "x", [], [1], {}, {"a": 1}, "x" * 10_000]


def _paths(obj, prefix=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield prefix + (i,)
            yield from _paths(v, prefix + (i,))


def test_every_field_with_every_wrong_type(tmp_path):
    data = registry_schema.plain(registry_schema.read_yaml(PAIRINGS / "smollm2.yaml"))
    tried = failed = 0
    for path in list(_paths(data)):
        for value in WRONG:
            mutated = registry_schema.plain(data)
            node = mutated
            for k in path[:-1]:
                node = node[k]
            node[path[-1]] = value
            p = _write(tmp_path, yaml.safe_dump(mutated, sort_keys=False))
            tried += 1
            try:
                registry.load_family_file(p)
            except RegistryError as exc:
                failed += 1
                assert exc.message.startswith(f"{p}:") and "\n" not in exc.message and len(exc.message) < 400
                int(exc.message[len(str(p)) + 1:].split(":", 1)[0])  # a line number
    assert tried > 500 and failed > tried // 2, (tried, failed)
    CASES["load (fuzz)"] += tried


# ---- through the commands that read the registry -----------------------------------------------------

CLI_BROKEN = ["tab-indent", "nul-byte", "unknown-model-key", "duplicate-model-id", "unknown-draft", "bomb-in-type",
              "recursive-alias", "empty-file"]


@pytest.fixture(autouse=True)
def _fresh_printer(monkeypatch):
    from llamaspec.cli import _output as output

    monkeypatch.setattr(output, "_current", output.Output())


@pytest.mark.parametrize("name", CLI_BROKEN)
def test_commands_go_on_without_a_broken_registry_and_say_where(tmp_path, run_cli, monkeypatch, tiny_models, hub,
                                                                hub_home, name):
    text, line, says = BROKEN[name]
    path = _write(tmp_path / "reg", text)
    monkeypatch.setenv("LLAMASPEC_PAIRINGS", str(tmp_path / "reg"))
    where = f"{path}:{line}:"
    runs = {
        "pair": ["pair", tiny_models["target"], "--no-default-dirs"],
        "run --draft auto": ["run", tiny_models["target"], "-p", "hi", "-n", "2", "--draft", "auto"],
        "pull --draft auto": ["pull", "org/main:Q4_K_M", "--draft", "auto"],
    }
    for label, args in runs.items():
        r = run_cli(*args)
        assert r.exit_code == 0, (label, r.stderr)
        assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
        mentions = [ln for ln in r.stderr.splitlines() if where in ln]
        assert len(mentions) == 1 and says in mentions[0] and len(mentions[0]) < 600, (label, r.stderr)
        CASES[label] += 1
