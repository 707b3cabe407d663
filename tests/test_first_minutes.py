"""A llama.cpp user's first commands: -m MODEL, --debug after the command, no prompt on an empty
pipe, -v without llama.cpp's log (--log-verbose / --log-file have it), messages that say what
happened (a paused draft, a tuned configuration), one phrasing for ranges."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llamaspec.cli._report import PAUSED, no_drafts_reason
from llamaspec.errors import EXIT_USAGE, must_be

LLAMA_LOG = "llama_model_loader:"   # a line llama.cpp logs on every load


@pytest.fixture
def lone(tiny_models, tmp_path) -> Path:
    """The tiny target alone in a folder: no draft beside it."""
    path = tmp_path / "alone" / "target.gguf"
    path.parent.mkdir()
    os.symlink(tiny_models["target"], path)
    return path


# ---- -m / --model ----------------------------------------------------------------------------------


def test_dash_m_is_the_model_positional(run_cli, lone):
    common = ("-p", "hi", "-n", "4", "--temp", "0", "--spec-type", "none", "--json")
    positional = run_cli("run", lone, *common)
    for form in (("-m", lone), ("--model", lone), (f"--model={lone}",)):
        r = run_cli("run", *form, *common)
        assert r.exit_code == 0, (form, r.stderr)
        assert r.json()["tokens"] == positional.json()["tokens"]
    # an option's value is never taken for -m: here "-m" is the prompt
    r = run_cli("run", "-p", "-m", "-m", lone, "-n", "2", "--temp", "0", "--spec-type", "none", "--json")
    assert r.exit_code == 0, r.stderr
    assert r.json()["n_prompt"] == run_cli("run", lone, "-p", "-m", "-n", "2", "--temp", "0", "--spec-type", "none",
                                           "--json").json()["n_prompt"]


def test_dash_m_on_other_commands(run_cli, lone, tiny_models):
    assert run_cli("pair", "-m", lone, "--offline", "--json").json()["target"]["architecture"] == "llama"
    assert run_cli("inspect", "-m", lone, "--json").exit_code == 0
    checked = run_cli("check", "-m", lone, tiny_models["draft"], "--json")
    assert checked.exit_code == 0 and checked.json()["compatible"] is True


def test_a_model_given_twice_is_one_usage_error(run_cli, lone):
    r = run_cli("run", lone, "-m", lone, "-p", "hi")
    assert r.exit_code == EXIT_USAGE
    assert r.stderr.strip().splitlines() == [
        "error: run: the model is given twice (as a positional and with -m/--model) (give it once: -m MODEL or MODEL)"]


# ---- --debug after the command -------------------------------------------------------------------


def test_debug_after_the_command_shows_the_traceback(run_cli_subprocess, tmp_path):
    missing = tmp_path / "no.gguf"
    plain = run_cli_subprocess("run", missing, "-p", "hi")
    assert plain.exit_code == 1 and "Traceback" not in plain.stderr and len(plain.stderr.splitlines()) == 1
    for args in (("run", missing, "-p", "hi", "--debug"), ("--debug", "run", missing, "-p", "hi")):
        r = run_cli_subprocess(*args)
        assert r.exit_code != 0 and "Traceback" in r.stderr, args
        assert "No such option" not in r.stderr


# ---- no prompt -------------------------------------------------------------------------------------


def test_an_empty_pipe_is_no_prompt(run_cli, lone):
    for empty in ("", "\n"):   # printf '' | ..., echo | ...
        r = run_cli("run", lone, input=empty)
        assert r.exit_code == EXIT_USAGE and r.stdout == ""
        assert r.stderr.strip() == "error: no prompt: give -p, -f, or text on stdin"
    assert run_cli("run", lone, "-n", "2", "--temp", "0", input="hello").exit_code == 0   # text on stdin still works


# ---- -v is llamaspec's detail; llama.cpp's log is behind --log-verbose / --log-file -----------------


def test_verbose_is_short_and_llama_cpp_log_has_its_own_switches(run_cli_subprocess, lone, tmp_path):
    args = ("run", lone, "-p", "hi", "-n", "4", "--temp", "0")
    v = run_cli_subprocess(*args, "-v")
    assert v.exit_code == 0, v.stderr[-2000:]
    lines = (v.stdout + v.stderr).splitlines()
    assert len(lines) < 60 and not any(LLAMA_LOG in ln for ln in lines)
    assert any(ln.startswith("looked for drafts in the target's folder") for ln in lines)

    loud = run_cli_subprocess(*args, "--log-verbose")
    assert loud.exit_code == 0 and LLAMA_LOG in loud.stderr

    log = tmp_path / "llama.log"
    filed = run_cli_subprocess(*args, "--log-file", log)
    assert filed.exit_code == 0 and LLAMA_LOG not in filed.stderr
    assert LLAMA_LOG in log.read_text()


# ---- what runs, once -----------------------------------------------------------------------------


def test_the_default_line_is_short_and_the_reasons_are_verbose(run_cli, lone):
    r = run_cli("run", lone, "-p", "hi", "-n", "4", "--temp", "0")
    first = r.stderr.splitlines()[0]
    assert first.startswith("speculation: prompt-lookup drafting from the text itself") and len(first) < 140
    assert "no compatible GGUF" not in r.stderr   # the reasons: -v
    v = run_cli("run", lone, "-p", "hi", "-n", "4", "--temp", "0", "-v")
    assert "why: no model draft available (" in v.stderr and "no compatible GGUF on disk" in v.stderr


def test_after_tune_the_first_line_is_the_tuned_config(run_cli, lone):
    from llamaspec.tune import store

    store.save(lone, None, store.TunedConfig("ngram-simple", draft_max=12, ratio=1.4, created="2026-12-03T00:00:00Z"))
    r = run_cli("run", lone, "-p", "hi", "-n", "4", "--temp", "0")
    assert r.exit_code == 0, r.stderr
    said = [ln for ln in r.stderr.splitlines() if ln.startswith("speculation:")]
    assert len(said) == 1 and r.stderr.splitlines()[0] == said[0]
    assert said[0].startswith("speculation: ngram-simple, as `llamaspec tune` chose on 2026-12-03")
    assert "1.40x plain decoding" in said[0] and "prompt-lookup" not in said[0]
    assert "tuned config from" not in r.stderr   # said once, at the start


def test_no_drafts_says_what_happened():
    model_asked_never = {"prompt-lookup": {"calls": 5}}
    assert no_drafts_reason("prompt-lookup,suffix,draft-simple", 8, model_asked_never) == PAUSED
    assert "--fixed-draft forces it" in PAUSED and "paused" in PAUSED
    assert "nothing to draft from" in no_drafts_reason("prompt-lookup,suffix", 8, {"prompt-lookup": {"calls": 7}})
    assert "paused" in no_drafts_reason("ngram-mod", 8, {})
    assert "--draft-max 0" in no_drafts_reason("draft-simple", 8, {}, draft_max=0)
    assert "too short" in no_drafts_reason("draft-simple", 1, {})


def test_bench_names_a_paused_draft_model():
    """bench's note for a mode that drafted nothing: a draft model was paused; an n-gram mode had
    nothing to draft from (bench keeps medians, not per-drafter calls)."""
    from types import SimpleNamespace

    from llamaspec.cli._bench_render import mode_notes

    def mode(name, draft):
        return SimpleNamespace(mode=name, native=False, identical_to_plain=True, drafted=0, accepted=0, draft=draft)

    notes = mode_notes(SimpleNamespace(summaries=[mode("draft-simple", "q4.gguf"), mode("ngram-mod", None)]))
    assert notes[0].startswith(f"draft-simple: {PAUSED}") and "nothing to draft" not in notes[0]
    assert notes[1].startswith("ngram-mod: no drafts (nothing to draft from in this text)")


@pytest.mark.real
def test_a_paused_draft_model_is_named_in_run(run_cli, smollm2_f16, smollm2_q4):
    """A model drafter the controller never asked: the stats line says it was paused (not that
    there was nothing to draft from). Whether this run pauses depends on measured costs, so the
    check is on whatever happened: drafts, or the paused line."""
    r = run_cli("run", smollm2_f16, "--draft", smollm2_q4, "-p", "Tell me a story.", "-n", "6", "--temp", "0")
    assert r.exit_code == 0, r.stderr
    assert "nothing to draft from" not in r.stderr
    assert "drafted " in r.stderr or PAUSED in r.stderr


# ---- ranges --------------------------------------------------------------------------------------


def test_one_phrasing_for_ranges_in_flags_and_batch_fields(run_cli, lone, tmp_path):
    assert must_be("temperature", 0, got=-1) == "temperature must be >= 0, got -1"
    assert "--temp must be >= 0" in run_cli("run", lone, "-p", "hi", "--temp", "-1").stderr
    jobs = tmp_path / "in.jsonl"
    jobs.write_text('{"prompt": "x", "temperature": -1}\n')
    out = tmp_path / "out.jsonl"
    run_cli("batch", lone, jobs, "-o", out, "-n", "2")
    assert "temperature must be >= 0, got -1" in out.read_text()
    assert "must be in >=" not in out.read_text()
