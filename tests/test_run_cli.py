"""`llamaspec run` end to end: JSON keys, --draft auto choices, streaming, errors, Ctrl-C."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from child_process import Child
KEYS = {"text", "tokens", "n_prompt", "n_generated", "spec_type", "draft_model", "drafted", "accepted",
        "acceptance", "mean_accepted_length", "per_position_acceptance", "prompt_seconds", "gen_seconds",
        "tokens_per_second"}


def _run_json(run_cli, *args):
    r = run_cli("run", *args, "--json", "-t", "1")
    assert r.exit_code == 0, r.stderr
    return r.json(), r


def test_json_has_every_key_and_spec_matches_plain(run_cli, tiny_models):
    common = (str(tiny_models["target"]), "-p", "Tell me about the sea.", "-n", "32", "--temp", "0")
    plain, _ = _run_json(run_cli, *common, "--spec-type", "none")
    # --fixed-draft: the adaptive length may (rightly) stop drafting with a draft as costly as
    # the tiny target; this test is about the keys and counts of a run that drafts
    spec, _ = _run_json(run_cli, *common, "--draft", str(tiny_models["draft"]), "--fixed-draft")
    assert KEYS <= set(plain) and KEYS <= set(spec)
    assert plain["spec_type"] == "none" and plain["draft_model"] is None
    assert spec["spec_type"] == "draft-simple" and spec["draft_model"] == str(tiny_models["draft"])
    assert spec["tokens"] == plain["tokens"] and len(plain["tokens"]) == plain["n_generated"] == 32
    assert spec["drafted"] > 0 and 0 < spec["acceptance"] <= 1
    assert spec["mean_accepted_length"] == pytest.approx(1 + spec["accepted"] / spec["drafts"])
    per = spec["per_drafter"]["draft-simple"]  # counted once, by the engine: calls and time included
    assert per["drafted"] == spec["drafted"] and per["calls"] >= per["drafts"] > 0 and per["draft_seconds"] > 0


def test_draft_auto_takes_a_compatible_draft_on_disk(run_cli, tiny_models, tmp_path, isolated_home, draft_pays):
    d = tmp_path / "drafts"
    d.mkdir()
    draft_pays(tiny_models["target"], tiny_models["draft"])   # measured to pay here (conftest)
    os.symlink(tiny_models["draft"], d / "tiny-draft.gguf")
    os.symlink(tiny_models["other_vocab"], d / "other.gguf")  # incompatible: must not be taken
    info, r = _run_json(run_cli, str(tiny_models["target"]), "-p", "hi", "-n", "8", "--temp", "0",
                        "--draft", "auto", "--search", str(d), "--offline")
    # the draft model chained behind the text drafter (copied text drafts better from the text)
    assert info["spec_type"] == "prompt-lookup,suffix,draft-simple"
    assert Path(info["draft_model"]).name == "tiny-draft.gguf"
    assert "--draft auto:" in r.stderr  # the one-line explanation on stderr


def test_draft_auto_falls_back_to_prompt_lookup(run_cli, tiny_models, isolated_home):
    info, r = _run_json(run_cli, str(tiny_models["target"]), "-p", "hi", "-n", "8", "--temp", "0",
                        "--draft", "auto", "--offline")
    assert info["spec_type"] == "prompt-lookup,suffix" and info["draft_model"] is None
    assert "prompt-lookup drafting from the text itself" in r.stderr


def test_draft_auto_prefers_mtp_heads(run_cli, tiny_models, isolated_home):
    info, _ = _run_json(run_cli, str(tiny_models["mtp"]), "--raw", "-p", "hello", "-n", "8", "--temp", "0",
                        "--draft", "auto", "--offline")
    assert info["spec_type"] == "draft-mtp"


def test_text_streams_to_stdout_and_stats_to_stderr(run_cli, tiny_models):
    r = run_cli("run", str(tiny_models["target"]), "-p", "hi", "-n", "16", "--temp", "0", "-t", "1",
                "--spec-type", "draft", "--draft", str(tiny_models["draft"]), "--fixed-draft")
    assert r.exit_code == 0
    assert r.stdout.strip() and "tok/s" not in r.stdout
    assert "tok/s" in r.stderr and "accepted" in r.stderr


def test_prompt_from_stdin_and_file(run_cli, tiny_models, tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("Tell me about the sea.")
    a, _ = _run_json(run_cli, str(tiny_models["target"]), "-f", str(f), "-n", "8", "--temp", "0")
    r = run_cli("run", str(tiny_models["target"]), "-n", "8", "--temp", "0", "--json", "-t", "1",
                input="Tell me about the sea.")
    assert r.exit_code == 0 and r.json()["tokens"] == a["tokens"]


def test_old_draft_n_flag_means_draft_max(run_cli, tiny_models):
    _, r = _run_json(run_cli, str(tiny_models["target"]), "-p", "hi", "-n", "4", "--temp", "0", "--draft", "8")
    assert "--draft-max 8" in r.stderr


@pytest.mark.parametrize("args, code, needle", [
    (["--temp", "-1"], 2, "--temp"),
    (["--spec-type", "nope"], 2, "unknown speculative type"),
    (["--spec-type", "draft"], 2, "needs a draft model"),
    (["--draft-min", "5", "--draft-max", "2"], 2, "--draft-min"),
    (["--spec-type", "mtp"], 2, "no MTP heads"),
])
def test_bad_flags_are_usage_errors(run_cli, tiny_models, args, code, needle):
    r = run_cli("run", str(tiny_models["target"]), "-p", "hi", "-n", "4", *args)
    assert r.exit_code == code
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_another_vocabulary_drafts_translated_and_a_misfit_is_refused(run_cli, tiny_models, tmp_path):
    common = ("run", str(tiny_models["target"]), "-p", "hi", "-n", "8", "--temp", "0", "-t", "1", "--json")
    plain = run_cli(*common, "--spec-type", "none")
    other = run_cli(*common, "--draft", str(tiny_models["spm"]))   # SPM draft for a BPE target
    assert other.exit_code == 0 and "translated" in other.stderr, other.stderr
    assert other.json()["tokens"] == plain.json()["tokens"]
    from tests.test_detect_drafts import eagle3

    bad = eagle3(tmp_path / "e.gguf", layers=(0, 2, 9))   # made for another target: cannot draft at all
    r = run_cli("run", str(tiny_models["target"]), "-p", "hi", "-n", "4", "--draft", str(bad))
    assert r.exit_code == 1 and "--force-draft" in r.stderr and "Traceback" not in r.stderr


def test_broken_model_files_are_one_line_errors(run_cli, tiny_models, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(Path(tiny_models["target"]).read_bytes()[:5000])
    junk = tmp_path / "junk.gguf"
    junk.write_text("not a model")
    for path, needle in ((cut, "truncated"), (junk, "not a GGUF"), (tmp_path / "missing.gguf", "not found")):
        r = run_cli("run", str(path), "-p", "hi")
        assert r.exit_code == 1 and needle in r.stderr and "Traceback" not in r.stderr


def test_ctrl_c_keeps_the_text_and_prints_stats(tiny_models):
    c = Child("run", tiny_models["target"], "-p", "hi", "-n", "2000", "-c", "2048", "--temp", "0", "-t", "1",
              "--spec-type", "draft", "--draft", tiny_models["draft"])
    # text flowing is the event; the one-page pipes keep the child from finishing 2000 tokens unread
    c.wait_for(lambda: c.stdout, "text on stdout")
    code = c.stop(signal.SIGINT)
    assert code == 130, c.stderr[-2000:]
    assert "stop: interrupted" in c.stderr and "tok/s" in c.stderr
    assert "Traceback" not in c.stderr


def test_ngram_flags_reach_the_drafters(run_cli, tiny_models):
    """llama.cpp's --spec-ngram-* flags end up in the drafters the factory builds."""
    from llamaspec.cli._options import ngram_params
    from llamaspec.speculative.options import SpecOptions, parse_spec_types
    from llamaspec.speculative.pipeline import load_pipeline

    ngram = ngram_params(9, 30, 7, 5, 40)
    opts = SpecOptions(spec_types=parse_spec_types("ngram-simple,ngram-mod"), n_ctx=256, n_threads=1, ngram=ngram)
    pipe = load_pipeline(tiny_models["target"], opts)
    try:
        simple, mod = pipe.drafter.members()[-2:]   # (the grammar drafter joins in front)
        assert (simple.size_n, simple.size_m) == (9, 30)
        assert (mod.n_match, mod.n_min, mod.n_max) == (7, 5, 40)
    finally:
        pipe.close()
    r = run_cli("run", str(tiny_models["target"]), "-p", "hi", "--spec-ngram-simple-size-n", "0")
    assert r.exit_code == 2 and "--spec-ngram-simple-size-n" in r.stderr
    r = run_cli("run", str(tiny_models["target"]), "-p", "hi", "--spec-ngram-mod-n-min", "9",
                "--spec-ngram-mod-n-max", "4")
    assert r.exit_code == 2 and "n-min" in r.stderr


@pytest.mark.parametrize("args, needle", [
    (["run", "--bogus"], "No such option: --bogus"),
    (["run", "-n", "abc", "-p", "x"], "-n must be an integer, got string"),
    (["inspect"], "Missing argument"),
    (["no-such-command"], "No such command"),
])
def test_parser_errors_are_one_line_usage_errors(run_cli, args, needle):
    r = run_cli(*args)
    assert r.exit_code == 2
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "╭" not in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("spec", ["ngram-map-k", "ngram-map-k4v", "ngram-cache"])
def test_every_implemented_ngram_type_runs_and_matches_plain(run_cli, tiny_models, spec):
    common = (str(tiny_models["target"]), "-p", "the cat sat on the mat; the cat sat on the mat; the cat",
              "-n", "32", "--temp", "0", "--raw")
    plain, _ = _run_json(run_cli, *common, "--spec-type", "none")
    sizes = [f"--spec-ngram-{spec[6:]}-size-n", "3"] if spec.startswith("ngram-map") else []
    got, _ = _run_json(run_cli, *common, "--spec-type", spec, *sizes)
    assert got["spec_type"] == spec and got["tokens"] == plain["tokens"]
