"""`llamaspec bench` end to end on the tiny models, plus the summary logic on made-up runs.

Speed is never asserted: only that ratios exist and are positive, and that the token check and
the choice of the best mode are honest.
"""

from __future__ import annotations

import io
import re
import stat
from pathlib import Path

import pytest

from llamaspec.bench import (PLAIN, PROMPT_PRESETS, BenchResult, BenchSettings, RepResult, best_mode,
                             preset_text, summarise)

MODE_KEYS = {"mode", "native", "reps", "tok_s", "ratio_vs_plain", "ratios", "e2e_ratio_vs_plain", "acceptance",
             "mean_accepted_length", "drafted", "accepted", "identical_to_plain", "first_difference",
             "differing_reps", "overhead_ms_per_step", "n_generated", "bound", "of_bound"}
TOP_KEYS = {"model", "model_path", "draft", "draft_path", "prompt", "chat", "prompt_tokens", "n", "threads",
            "ctx", "reps", "greedy", "results", "best", "all_identical", "notes", "bound"}
FAST = ("--reps", "1", "-n", "16", "-t", "1")
NATIVE_LOGS = Path(__file__).parent / "fixtures" / "native"   # real llama-speculative-simple logs (README.md)


def _bench(run_cli, tiny_models, *args):
    return run_cli("bench", str(tiny_models["target"]), "--draft", str(tiny_models["draft"]), *FAST, *args)


def test_json_on_tiny_models(run_cli, tiny_models):
    # --fixed-draft: tiny target and draft cost the same a step, so the adaptive controller may
    # rightly pause the draft (drafted 0 in one CI run); the test is about the JSON's shape
    r = _bench(run_cli, tiny_models, "--spec-type", "draft", "--spec-type", "ngram-simple", "--json", "--fixed-draft")
    assert r.exit_code == 0, r.stderr
    info = r.json()
    assert TOP_KEYS <= set(info)
    modes = {m["mode"]: m for m in info["results"]}
    assert list(modes) == [PLAIN, "draft-simple", "ngram-simple"]
    for m in modes.values():
        assert MODE_KEYS <= set(m)
        assert m["tok_s"] > 0 and m["ratio_vs_plain"] > 0 and m["e2e_ratio_vs_plain"] > 0
        assert all(x > 0 for x in m["ratios"]) and len(m["ratios"]) == 1
        assert m["n_generated"] == 16 and m["native"] is False
    assert modes[PLAIN]["identical_to_plain"] is None and modes[PLAIN]["ratio_vs_plain"] == 1.0
    for name in ("draft-simple", "ngram-simple"):
        assert modes[name]["identical_to_plain"] is True and modes[name]["first_difference"] is None
    assert modes["draft-simple"]["drafted"] > 0
    assert info["all_identical"] is True and info["greedy"] is True
    assert info["best"]["mode"] in modes and info["best"]["ratio_vs_plain"] > 0
    assert info["n"] == 16 and info["reps"] == 1 and info["threads"] == 1 and info["prompt_tokens"] > 0
    assert "rep 1/1" in r.stderr  # progress goes to stderr, the JSON object alone to stdout
    # the theoretical speedup from the mode's own acceptance and costs, and how close it came
    assert modes[PLAIN]["theory"] is None
    t = modes["draft-simple"]["theory"]
    assert t["speedup"] > 0 and t["of_theory"] == pytest.approx(modes["draft-simple"]["ratio_vs_plain"]
                                                               / t["speedup"], rel=1e-6)
    assert t["tokens_per_step"] >= 1 and t["draft_cost"] > 0 and t["best_k"] >= 1
    assert modes["draft-simple"]["per_position_acceptance"] and modes["draft-simple"]["draft"] == "draft.gguf"
    # the machine's copy-drafting bound of plain decoding's output, and the fraction of it each mode reached
    b = info["bound"]
    assert b["speedup"] > 0 and b["tokens"] == 16 and b["depth"] == info["prompt_tokens"] and b["t1_ms"] > 0
    assert list(b["curve"]) == ["1", "2", "4", "8", "16", "32", "64"] and b["curve"]["1"] == 1.0
    assert 1 <= b["steps"] <= 16 and b["copied"] == 16 - b["steps"]
    assert modes[PLAIN]["bound"] == b["speedup"] and modes[PLAIN]["of_bound"] is None
    for name in ("draft-simple", "ngram-simple"):
        assert modes[name]["bound"] == b["speedup"]
        assert modes[name]["of_bound"] == pytest.approx(modes[name]["ratio_vs_plain"] / b["speedup"], rel=1e-6)
    assert info["runs"][0]["bound"] == b
    # the sweep's own keys hold the same run
    assert len(info["runs"]) == 1 and info["runs"][0]["results"] == info["results"]
    assert [row["mode"] for row in info["overall"][0]["results"]] == list(modes)


def test_table_on_stdout_progress_on_stderr_and_quiet(run_cli, tiny_models):
    r = _bench(run_cli, tiny_models, "--spec-type", "draft", "-p", "Tell me about the sea.")
    assert r.exit_code == 0, r.stderr
    for word in ("mode", "tok/s", "ratio", "e2e", "accept", "MAL", "theory", "of theory", "bound", "of bound",
                 "identical", "per-rep", "plain", "draft-simple", "best:", "speedup over plain decoding"):
        assert word in r.stdout
    # the bound, how the oracle reached it and the verify-cost curve it used
    assert re.search(r"^bound: \d+\.\d\dx: an oracle copy-drafter .* measured: 2:[\d.]+ 4:[\d.]+ .* 64:[\d.]+ "
                     r"\(t\(1\) = [\d.]+ ms\)$", r.stdout, re.M), r.stdout
    bar = next(line for line in r.stdout.splitlines() if "█" in line)   # the chart: one bar for the mode
    assert bar.startswith("draft-simple") and re.search(r"\d\.\d\dx$", bar)
    assert "rep 1/1 plain" in r.stderr and "rep 1/1" not in r.stdout
    q = _bench(run_cli, tiny_models, "--spec-type", "draft", "-p", "Tell me about the sea.", "-q")
    assert q.exit_code == 0 and q.stderr == ""
    assert re.fullmatch(r"(plain|draft-simple) \d+\.\d\dx\n", q.stdout)


def test_presets_and_raw(run_cli, tiny_models):
    assert set(PROMPT_PRESETS) == {"code", "code-raw", "story"}
    assert "```python" in preset_text("code") and "```python" in preset_text("code-raw")
    r = run_cli("bench", str(tiny_models["target"]), *FAST, "--spec-type", "ngram-mod", "--raw", "--json")
    assert r.exit_code == 0, r.stderr
    info = r.json()
    assert info["chat"] is False and info["prompt"] == "preset code-raw"  # the completion form without chat
    r = run_cli("bench", str(tiny_models["target"]), *FAST, "--spec-type", "ngram-mod", "--json",
                "--prompt-preset", "story")
    assert r.exit_code == 0 and r.json()["chat"] is True and r.json()["prompt"] == "preset story"


@pytest.mark.parametrize("args, needle", [
    (["--reps", "0"], "--reps"),
    (["-n", "0"], "-n"),
    (["--spec-type", "nope"], "unknown speculative type"),
    (["--spec-type", "draft"], "needs a draft model"),
    (["--spec-type", "none"], "no speculative mode"),
    (["-p", "x", "--prompt-preset", "code"], "one prompt source"),
    (["--prompt-preset", "poem"], "--prompt-preset"),
    (["--draft", "auto"], "draft path or Hub ref"),
    (["-n", "100000"], "exceeds the context"),
])
def test_bad_flags_are_one_line_usage_errors(run_cli, tiny_models, args, needle):
    r = run_cli("bench", str(tiny_models["target"]), "-t", "1", *args)
    assert r.exit_code == 2, r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stdout == ""


def test_native_dir_without_the_binary(run_cli, tiny_models, tmp_path):
    r = run_cli("bench", str(tiny_models["target"]), "--native", str(tmp_path))
    assert r.exit_code == 2 and "llama-speculative-simple" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def _replaying_native(d, stderr_log: str, stdout_log: str | None = None, code: int = 0):
    """A `llama-speculative-simple` in `d` that replays a real log of the tool (tests/fixtures/native)."""
    exe = d / "llama-speculative-simple"
    out = f'cat "{NATIVE_LOGS / stdout_log}"\n' if stdout_log else ""
    exe.write_text(f'#!/bin/sh\n{out}cat "{NATIVE_LOGS / stderr_log}" >&2\nexit {code}\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return d


def test_the_native_log_parser_reads_a_real_log():
    from llamaspec.bench.native import parse_log

    log = (NATIVE_LOGS / "draft-simple.stdout.log").read_text() + (NATIVE_LOGS / "draft-simple.stderr.log").read_text()
    r = parse_log(log, "native draft-simple")
    # the log's own lines: "encoded 21 tokens in 0.199 seconds", "decoded 69 tokens in 12.135 seconds,
    # speed: 5.686 t/s", "accept = 100.000%"
    assert (r.n, r.tps, r.acceptance, r.native) == (69, 5.686, 1.0, True)
    assert r.e2e_s == pytest.approx(0.199 + 12.135)


def test_a_native_log_without_a_measured_acceptance_says_unknown():
    """No drafts: llama.cpp prints `accept = -nan%`. That is unknown, never 0 %."""
    from llamaspec.bench.native import parse_log

    r = parse_log((NATIVE_LOGS / "ngram-simple-no-drafts.stderr.log").read_text(), "native ngram-simple")
    assert r.n == 33 and r.acceptance is None


def test_native_rows_sit_beside_ours(run_cli, tiny_models, tmp_path):
    _replaying_native(tmp_path, "draft-simple.stderr.log", "draft-simple.stdout.log")
    r = _bench(run_cli, tiny_models, "--spec-type", "ngram-simple", "--native", str(tmp_path), "--json")
    assert r.exit_code == 0, r.stderr
    modes = {m["mode"]: m for m in r.json()["results"]}
    nat = modes["native ngram-simple"]
    assert nat["native"] is True and nat["identical_to_plain"] is None  # not checked, never claimed
    assert nat["tok_s"] == pytest.approx(5.686, rel=1e-3) and nat["acceptance"] == 1.0 and nat["ratio_vs_plain"] > 0
    _replaying_native(tmp_path, "ngram-simple-no-drafts.stderr.log")
    r = _bench(run_cli, tiny_models, "--spec-type", "ngram-simple", "--native", str(tmp_path))
    assert r.exit_code == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if "native ngram-simple" in line)
    assert "unknown" in row and "0.0%" not in row, row


def test_native_failure_is_a_note_not_a_crash(run_cli, tiny_models, tmp_path):
    _replaying_native(tmp_path, "spec-none-fails.stderr.log", code=1)
    r = _bench(run_cli, tiny_models, "--spec-type", "ngram-simple", "--native", str(tmp_path), "--json")
    assert r.exit_code == 0, r.stderr
    info = r.json()
    assert not any(m["native"] for m in info["results"])
    assert any("failed to initialize speculative decoding" in n for n in info["notes"]), info["notes"]
    assert "warning" in r.stderr


# ---- the summary on made-up runs (no model) -------------------------------------------------------


def _rep(mode, tps, tokens, drafted=0, accepted=0):
    return RepResult(mode=mode, n=len(tokens), tps=tps, e2e_s=len(tokens) / tps * 1.1, drafted=drafted,
                     accepted=accepted, drafts=1 if drafted else 0, steps=len(tokens), tokens=tokens,
                     mean_accepted_length=1 + accepted if drafted else 1.0, overhead_ms=0.01)


def _made_up() -> BenchResult:
    runs: dict[str, list[RepResult]] = {PLAIN: [], "fast-but-wrong": [], "honest": [], "no-drafts": []}
    for rep in range(3):
        plain = _rep(PLAIN, 100.0, [1, 2, 3, 4])
        plain.ratio = plain.e2e_ratio = 1.0
        runs[PLAIN].append(plain)
        wrong = [1, 2, 9, 4] if rep == 1 else [1, 2, 3, 4]
        runs["fast-but-wrong"].append(_rep("fast-but-wrong", 300.0, wrong, 4, 3).compare_to(plain))
        runs["honest"].append(_rep("honest", 150.0 + rep, [1, 2, 3, 4], 4, 2).compare_to(plain))
        runs["no-drafts"].append(_rep("no-drafts", 200.0, [1, 2, 3, 4]).compare_to(plain))
    return BenchResult(prompt_tokens=10, reps=3, settings=BenchSettings(n=4, threads=1), runs=runs,
                       summaries=summarise(runs))


def test_a_mode_that_changed_tokens_is_flagged_and_never_best():
    res = _made_up()
    by = {s.mode: s for s in res.summaries}
    wrong = by["fast-but-wrong"]
    assert wrong.identical_to_plain is False and wrong.differing_reps == 1 and wrong.first_difference == 2
    assert wrong.ratio_vs_plain == pytest.approx(3.0)  # measured, reported, but not recommended
    assert by["honest"].identical_to_plain is True and by["honest"].ratio_vs_plain == pytest.approx(1.51)
    assert by["honest"].ratios == [1.5, 1.51, 1.52]
    # no drafts: its 2x is noise, and it is not the best either
    assert best_mode(res.summaries).mode == "honest"
    assert res.differing == [wrong]


def _suite_of(res: BenchResult):
    from llamaspec.bench.suite import PromptRun, SuiteResult, Target

    target = Target("m.gguf", Path("m.gguf"), [])
    return SuiteResult([target], [PromptRun(target, "prompt", "prompt", False, res)], res.settings, res.reps)


def test_render_says_no_for_differing_tokens():
    from rich.console import Console

    from llamaspec.cli._bench_render import render, to_dict

    res = _made_up()
    suite = _suite_of(res)
    info = to_dict(suite, drafts=[])
    assert info["all_identical"] is False
    assert any("fast-but-wrong" in n and "differ" in n for n in info["notes"])
    assert any("no-drafts" in n and "noise" in n for n in info["notes"])
    buf = io.StringIO()
    render(Console(file=buf, width=200, color_system=None), suite)
    text = buf.getvalue()
    row = next(line for line in text.splitlines() if line.startswith("fast-but-wrong"))
    assert "NO" in row and "1/3" in row
    assert "best: honest" in text
    # the chart flags it too: its bar is there, marked, and it is not called best
    bar = next(line for line in text.splitlines() if line.startswith("fast-but-wrong") and "█" in line)
    assert "3.00x" in bar and "tokens differ" in bar


def test_plain_is_best_when_nothing_beats_it():
    runs = {PLAIN: [_rep(PLAIN, 100.0, [1, 2])], "slow": [_rep("slow", 50.0, [1, 2], 2, 1)]}
    runs[PLAIN][0].ratio = 1.0
    runs["slow"][0].compare_to(runs[PLAIN][0])
    assert best_mode(summarise(runs)).mode == PLAIN


def test_native_runs_get_the_same_ngram_settings(tmp_path):
    """A side-by-side comparison is like for like: native llama.cpp gets our n-gram settings."""
    from llamaspec.bench import BenchSettings, native_command
    from llamaspec.speculative.options import NgramParams

    settings = BenchSettings(threads=1, ngram=NgramParams(simple_size_n=9, mod_n_match=7))
    cmd = native_command(tmp_path, tmp_path / "m.gguf", "ngram-simple,ngram-mod", tmp_path / "p.txt", settings)
    assert cmd[cmd.index("--spec-ngram-simple-size-n") + 1] == "9"
    assert cmd[cmd.index("--spec-ngram-mod-n-match") + 1] == "7"
    plain = native_command(tmp_path, tmp_path / "m.gguf", "draft-simple", tmp_path / "p.txt",
                           BenchSettings(threads=1, draft_path=tmp_path / "d.gguf"))
    assert "--spec-ngram-simple-size-n" not in plain
