"""Impossible flag values and combinations, through every command that takes them.

Each is a one-line usage error (exit 2) naming the flag, found while the flags are parsed: the
model argument is a path that does not exist, so an error about the flags (exit 2) rather than the
model (exit 1) shows the check ran before any file was opened. A missing draft file is a one-line
error (exit 1) before the target loads; a draft bigger than its target is a one-line warning and
the run goes on; -n 0 is a valid no-op (no text, exit 0, stats); a context shorter than the prompt
is one error naming both sizes before anything is generated. `CASES` counts them per command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CASES: Counter = Counter()
NO_MODEL = "/nonexistent/model.gguf"   # any check on the flags must come before this is opened


def one_line(r, code: int, *needles: str) -> None:
    assert r.exit_code == code, (r.exit_code, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in r.stderr, (n, r.stderr)


RUN_BATCH_FLAGS = [   # flags of run and batch (the shared generation flags): (args, what the error says)
    (["-n", "-2"], "-n must be >= -1"),   # -1 is llama.cpp's "no limit"
    (["-c", "-5"], "-c/--ctx-size must be >= 0"),
    (["-t", "-1"], "-t/--threads must be >= 0"),
    (["--draft-min", "5", "--draft-max", "3"], "--draft-min 5 exceeds --draft-max 3"),
    (["--draft-min", "-1"], "--draft-min must be in [0, 511], got -1"),   # (the knob table's range)
    (["--draft-min", "600"], "--draft-min must be in [0, 511], got 600"),
    (["--draft-max", "-1"], "--draft-max must be in [0, 511], got -1"),
    (["--draft-max", "600"], "--draft-max must be in [0, 511], got 600"),
    (["--draft-p-min", "1.5"], "--draft-p-min must be in [0, 1]"),
    (["--top-p", "0"], "--top-p must be in (0, 1]"),
    (["--top-p", "1.5"], "--top-p must be in (0, 1]"),
    (["--min-p", "-0.1"], "--min-p must be in [0, 1]"),
    (["--min-p", "2"], "--min-p must be in [0, 1]"),
    (["--temp", "-1"], "--temp must be >= 0"),
    (["--repeat-penalty", "0"], "--repeat-penalty must be > 0"),
    (["--repeat-penalty", "-1"], "--repeat-penalty must be > 0"),
    (["--repeat-last-n", "-2"], "--repeat-last-n must be >= -1"),
    (["-ngl", "-2"], "-ngl must be >= -1"),
    (["-ngld", "many"], "-ngld takes a number of layers"),
    (["--spec-ngram-mod-n-min", "10", "--spec-ngram-mod-n-max", "5"], "--spec-ngram-mod-n-min must not exceed"),
    (["--spec-ngram-simple-size-n", "0"], "--spec-ngram-simple-size-n must be >= 1"),
    (["--spec-ngram-mod-n-max", "600"], "--spec-ngram-mod-n-max must be in [1, 511], got 600"),
    (["--spec-prompt-lookup-n-min", "9", "--spec-prompt-lookup-n-max", "4"], "--spec-prompt-lookup-n-min must not"),
    (["--draft-max", "abc"], "--draft-max"),
]


@pytest.mark.parametrize("args,needle", RUN_BATCH_FLAGS, ids=[" ".join(a) for a, _ in RUN_BATCH_FLAGS])
def test_run_flag_errors(run_cli, args, needle):
    one_line(run_cli("run", NO_MODEL, "-p", "hi", *args), 2, needle)
    CASES["run"] += 1


@pytest.mark.parametrize("args,needle", RUN_BATCH_FLAGS, ids=[" ".join(a) for a, _ in RUN_BATCH_FLAGS])
def test_batch_flag_errors(run_cli, tmp_path, args, needle):
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"id": "a", "prompt": "hi"}\n')
    one_line(run_cli("batch", NO_MODEL, inp, "-o", tmp_path / "out.jsonl", *args), 2, needle)
    assert not (tmp_path / "out.jsonl").exists()
    CASES["batch"] += 1


OTHER_FLAGS = [
    (["run", NO_MODEL, "-p", "hi", "-f", "x.txt"], 2, "give the prompt with -p or -f, not both"),
    (["batch", NO_MODEL, "in.jsonl", "-o", "o.jsonl", "--parallel", "0"], 2, "--parallel must be >= 1"),
    (["batch", NO_MODEL, "in.jsonl", "-o", "o.jsonl", "--parallel", "-3"], 2, "--parallel must be >= 1"),
    (["bench", NO_MODEL, "--reps", "0"], 2, "--reps must be >= 1"),
    (["bench", NO_MODEL, "-n", "0"], 2, "-n must be >= 1"),
    (["bench", NO_MODEL, "-n", "-4"], 2, "-n must be >= 1"),
    (["bench", NO_MODEL, "-t", "0"], 2, "-t/--threads must be >= 1"),
    (["bench", NO_MODEL, "-t", "-2"], 2, "-t/--threads must be >= 0"),
    (["bench", NO_MODEL, "-c", "-1"], 2, "-c/--ctx-size must be >= 0"),
    (["bench", NO_MODEL, "--draft-max", "0"], 2, "--draft-max must be in [1, 511], got 0"),
    (["bench", NO_MODEL, "--draft-max", "600"], 2, "--draft-max must be in [1, 511], got 600"),
    (["bench", NO_MODEL, "--native-draft-max", "0"], 2, "--native-draft-max must be >= 1"),
    (["bench", NO_MODEL, "--draft-p-min", "-0.5"], 2, "--draft-p-min must be in [0, 1]"),
    (["bench", NO_MODEL, "--draft", "auto"], 2, "bench takes a draft path or Hub ref"),
    (["bench", NO_MODEL, "--spec-type", "draft"], 2, "--spec-type draft needs a draft model"),
    (["bench", NO_MODEL, "-p", "hi", "--prompt-preset", "code"], 2, "give one prompt source"),
    (["bench", NO_MODEL, "--prompt-preset", "nope"], 2, "unknown --prompt-preset"),
    (["bench", NO_MODEL, "--spec-ngram-mod-n-min", "0"], 2, "--spec-ngram-mod-n-min must be >= 1"),
    (["tune", NO_MODEL, "--reps", "0"], 2, "--reps must be >= 1"),
    (["tune", NO_MODEL, "-n", "0"], 2, "-n must be >= 1"),
    (["tune", NO_MODEL, "-t", "0"], 2, "-t/--threads must be >= 1"),
    (["tune", NO_MODEL, "-c", "-1"], 2, "-c/--ctx-size must be >= 0"),
    (["tune", NO_MODEL, "--margin", "-1"], 2, "--margin must be in [0, 10]"),
    (["tune", NO_MODEL, "--margin", "11"], 2, "--margin must be in [0, 10]"),
    (["tune", NO_MODEL, "--draft", "auto"], 2, "tune takes a draft path or Hub ref"),
    (["tune", "--show", "--forget"], 2, "give --show or --forget, not both"),
    (["tune"], 2, "no model to tune"),
]


@pytest.mark.parametrize("args,code,needle", OTHER_FLAGS, ids=[" ".join(a[:1] + a[2:]) for a, _, _ in OTHER_FLAGS])
def test_other_flag_errors(run_cli, tmp_path, monkeypatch, args, code, needle):
    monkeypatch.chdir(tmp_path)
    one_line(run_cli(*args), code, needle)
    CASES[args[0]] += 1


@pytest.mark.parametrize("command", ["run", "batch", "bench", "tune"])
def test_a_missing_draft_file_is_named_before_the_target_is_opened(run_cli, tmp_path, command):
    """The target is junk: an error about the draft proves the draft was checked first."""
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all")
    draft = tmp_path / "no-such-draft.gguf"
    args = {"run": ["run", junk, "-p", "hi"], "bench": ["bench", junk], "tune": ["tune", junk],
            "batch": ["batch", junk, tmp_path / "in.jsonl", "-o", tmp_path / "o.jsonl"]}[command]
    (tmp_path / "in.jsonl").write_text('{"id": "a", "prompt": "hi"}\n')
    one_line(run_cli(*args, "--draft", draft), 1, f"draft model file not found: {draft}", "--draft")
    assert not (tmp_path / "o.jsonl").exists()
    CASES[command] += 1


def test_draft_min_beyond_the_default_draft_length_is_a_usage_error(run_cli, tiny_models):
    """No --draft-max: --draft-min is checked against the spec type's default (was a ValueError traceback)."""
    r = run_cli("run", tiny_models["target"], "-p", "hi", "-n", "4", "-t", "1", "--spec-type", "ngram-mod",
                "--draft-min", "100")
    one_line(r, 2, "--draft-min 100 exceeds the draft length 32", "--draft-max")
    r = run_cli("run", tiny_models["target"], "-p", "hi", "-n", "4", "-t", "1", "--draft", tiny_models["draft"],
                "--draft-min", "9")
    one_line(r, 2, "--draft-min 9 exceeds the draft length")
    CASES["run"] += 2


def test_n_zero_is_a_valid_no_op(run_cli, tiny_models, tmp_path):
    """-n 0: no text, exit 0, the stats (prompt evaluated, 0 tokens generated)."""
    r = run_cli("run", tiny_models["target"], "-p", "hi", "-n", "0", "-t", "1", "--spec-type", "none")
    assert r.exit_code == 0 and r.stdout.strip() == "" and "generated 0 tokens" in r.stderr, r.stderr
    r = run_cli("run", tiny_models["target"], "-p", "hi", "-n", "0", "-t", "1", "--json")
    assert r.exit_code == 0 and r.json()["text"] == "" and r.json()["n_generated"] == 0
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text('{"id": "a", "prompt": "hi"}\n{"id": "b", "prompt": "there"}\n')
    r = run_cli("batch", tiny_models["target"], inp, "-o", out, "-n", "0", "-t", "1", "-q")
    assert r.exit_code == 0, r.stderr
    recs = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert [(x["id"], x["text"], x["n_generated"]) for x in recs] == [("a", "", 0), ("b", "", 0)]
    CASES["run"] += 2
    CASES["batch"] += 1


def test_n_minus_one_means_no_limit(run_cli, tiny_models, tmp_path):
    """-n -1 (llama.cpp's "no limit"): run, batch and chat generate until end-of-generation or a
    full context, never stopping at a token count ("length"); -c 300 is past run's default -n 256."""
    r = run_cli("run", tiny_models["target"], "-p", "hi", "-n", "-1", "-c", "300", "-t", "1", "--temp", "0",
                "--spec-type", "none", "--json")
    assert r.exit_code == 0, r.stderr
    assert r.json()["stop_reason"] in ("eos", "context"), r.json()["stop_reason"]
    if r.json()["stop_reason"] == "context":
        assert r.json()["n_prompt"] + r.json()["n_generated"] >= 299
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text('{"id": "a", "prompt": "hi"}\n')
    r = run_cli("batch", tiny_models["target"], inp, "-o", out, "-n", "-1", "-c", "300", "-t", "1", "--temp", "0",
                "-q")
    assert r.exit_code == 0, r.stderr
    assert json.loads(out.read_text())["finish_reason"] in ("stop", "context"), out.read_text()[-300:]
    CASES["run"] += 1
    CASES["batch"] += 1


def test_draft_max_zero_with_a_drafting_type_runs_without_drafts(run_cli, tiny_models):
    """run --draft-max 0 is allowed (documented: drafting off, the pair still loads); bench refuses it."""
    r = run_cli("run", tiny_models["target"], "-p", "hi", "-n", "4", "-t", "1", "--temp", "0",
                "--spec-type", "ngram-mod", "--draft-max", "0", "--json")
    assert r.exit_code == 0, r.stderr
    assert r.json()["drafted"] == 0 and r.json()["n_generated"] == 4
    CASES["run"] += 1


def test_a_draft_bigger_than_the_target_is_a_warning(run_cli, tiny_models):
    small, big = tiny_models["draft"], tiny_models["target"]
    r = run_cli("run", small, "-p", "hi", "-n", "4", "-t", "1", "--temp", "0", "--draft", big, "--json")
    assert r.exit_code == 0, r.stderr
    warnings = [ln for ln in r.stderr.splitlines() if "warning:" in ln]
    assert len(warnings) == 1 and "is bigger than the target" in warnings[0], r.stderr
    assert r.json()["n_generated"] == 4
    ok = run_cli("run", big, "-p", "hi", "-n", "4", "-t", "1", "--temp", "0", "--draft", small, "--json")
    assert ok.exit_code == 0 and "bigger than the target" not in ok.stderr
    r = run_cli("bench", small, "--draft", big, "--spec-type", "draft", "-p", "hi", "-n", "4", "--reps", "1",
                "-t", "1", "-q")
    assert r.exit_code == 0 and r.stderr.count("is bigger than the target") == 1, r.stderr
    CASES["run"] += 2
    CASES["bench"] += 1


def test_a_prompt_longer_than_the_context_is_one_error_before_generating(run_cli, tiny_models, tmp_path):
    prompt = tmp_path / "long.txt"
    prompt.write_text("the quick brown fox jumps over the lazy dog. " * 60)
    r = run_cli("run", tiny_models["target"], "-f", prompt, "-c", "100", "-n", "4", "-t", "1", "--spec-type", "none")
    one_line(r, 1, "the prompt is", "tokens, longer than the context of 256 tokens (-c 100",
             "raise -c/--ctx-size to at least")
    assert r.stdout == ""
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text(json.dumps({"id": "long", "prompt": prompt.read_text()}) + "\n" + '{"id": "ok", "prompt": "hi"}\n')
    r = run_cli("batch", tiny_models["target"], inp, "-o", out, "-c", "256", "-n", "3", "-t", "1", "-q",
                "--spec-type", "none")
    assert r.exit_code == 1 and "Traceback" not in r.stderr
    recs = {x["id"]: x for x in map(json.loads, out.read_text().splitlines())}
    assert "context" in recs["long"]["error"]["message"] and recs["ok"]["n_generated"] == 3
    CASES["run"] += 1
    CASES["batch"] += 1


def test_a_context_smaller_than_llama_cpp_pads_it_to_does_not_abort(tiny_models):
    """-c 8 with a longer prompt: llama.cpp pads the context to 256 but capped n_batch at 8, and
    the prompt's batch hit GGML_ASSERT (abort, exit 134). In a child: an abort would kill pytest."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-m", "llamaspec", "run", str(tiny_models["target"]), "-p",
                        "hello world, this is a prompt of a few more tokens than eight", "-c", "8", "-n", "3",
                        "-t", "1", "--spec-type", "none", "--temp", "0"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "GGML_ASSERT" not in p.stderr and "Traceback" not in p.stderr
    CASES["run"] += 1
