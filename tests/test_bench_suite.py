"""`bench` as a sweep: a JSONL prompt suite, several targets and several drafts in one run, the
per-prompt and overall results, and the token check over all of them. Real tiny GGUFs, real
llama-cpp-python; speed is never asserted."""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path

import pytest

from llamaspec.errors import UsageError
from llamaspec.bench.prompts import SuitePrompt, parse_prompts
from llamaspec.bench.suite import best_overall, geometric_mean, make_configs, overall_rows
from llamaspec.bench.results import PLAIN, ModeSummary

FAST = ("--reps", "1", "-n", "12", "-t", "1")


# ---- the JSONL suite ------------------------------------------------------------------------------


def test_parse_prompts():
    text = '{"id": "a", "prompt": "first"}\n\n  \n{"id": 7, "prompt": "second", "note": "ignored"}\n'
    assert parse_prompts(text, "s.jsonl") == [SuitePrompt("a", "first"), SuitePrompt("7", "second")]


@pytest.mark.parametrize("lines, where, words", [
    (['{"id": "a", "prompt": "x"}', '{"id": "b", "prompt": "y"'], "s.jsonl:2:", "not valid JSON"),
    (['["a", "x"]'], "s.jsonl:1:", "JSON object"),
    (['{"id": "a", "prompt": "x"}', '', '{"prompt": "y"}'], "s.jsonl:3:", '"id"'),
    (['{"id": true, "prompt": "y"}'], "s.jsonl:1:", '"id"'),
    (['{"id": "a", "prompt": "  "}'], "s.jsonl:1:", '"prompt"'),
    (['{"id": "a", "prompt": 3}'], "s.jsonl:1:", '"prompt"'),
    (['{"id": "a", "prompt": "x"}', '{"id": "a", "prompt": "y"}'], "s.jsonl:2:", "duplicate id 'a' (first on line 1)"),
    (["", "  "], "s.jsonl:", "no prompts"),
])
def test_bad_lines_name_file_and_line(lines, where, words):
    with pytest.raises(UsageError) as e:
        parse_prompts("\n".join(lines) + "\n", "s.jsonl")
    assert e.value.message.startswith(where) and words in e.value.message
    assert e.value.exit_code == 2


@pytest.mark.parametrize("content, needle", [
    (b'{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": "y",}\n', ":2: not valid JSON"),
    (b'{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": "\xff"}\n', ":2: not UTF-8"),
    (None, "prompts file not found"),
])
def test_bad_prompts_file_is_a_one_line_usage_error(run_cli, tiny_models, tmp_path, content, needle):
    path = tmp_path / "suite.jsonl"
    if content is not None:
        path.write_bytes(content)
    r = run_cli("bench", str(tiny_models["target"]), "--prompts", str(path), *FAST)
    assert r.exit_code == 2, r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1
    if content is not None:
        assert f"{path}:" in r.stderr


def test_prompts_and_another_prompt_source_conflict(run_cli, tiny_models, tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text('{"id": "a", "prompt": "x"}\n')
    r = run_cli("bench", str(tiny_models["target"]), "--prompts", str(path), "-p", "hi", *FAST)
    assert r.exit_code == 2 and "one prompt source" in r.stderr


# ---- configurations and the overall fold (made-up summaries) ----------------------------------------


def test_configs_cross_draft_modes_with_drafts(tmp_path):
    d1, d2, d3 = tmp_path / "a" / "q4.gguf", tmp_path / "b" / "q4.gguf", tmp_path / "q8.gguf"
    one = make_configs(["draft-simple", "ngram-mod"], [d1])
    assert [(c.label, c.spec, c.draft_path) for c in one] == [("draft-simple", "draft-simple", d1),
                                                             ("ngram-mod", "ngram-mod", None)]
    many = make_configs(["draft-simple,ngram-simple", "ngram-mod"], [d1, d2, d3])
    assert [c.label for c in many] == [f"draft-simple,ngram-simple @ {d1}", f"draft-simple,ngram-simple @ {d2}",
                                       "draft-simple,ngram-simple @ q8.gguf", "ngram-mod"]
    assert make_configs(["draft-simple"], []) == []


def _summary(mode, ratio, identical, accepted=10, theory=None):
    from llamaspec.bench.theory import Theory

    t = None if theory is None else Theory(speedup=theory, tokens_per_step=2, mean_draft_length=2, draft_cost=0.1,
                                           verify_slope=0.1, step_cost=1.2, of_theory=ratio / theory)
    return ModeSummary(mode=mode, native=False, reps=1, tok_s=100 * ratio, ratio_vs_plain=ratio, ratios=[ratio],
                       e2e_ratio_vs_plain=ratio, acceptance=0.5, mean_accepted_length=2.0,
                       drafted=0 if mode == PLAIN else 20, accepted=0 if mode == PLAIN else accepted,
                       identical_to_plain=identical, first_difference=None if identical is not False else 3,
                       differing_reps=int(identical is False), overhead_ms_per_step=0.1, n_generated=16,
                       theory=t, drafts=0 if mode == PLAIN else 10, drafted_per_position=[] if mode == PLAIN else [10, 10],
                       accepted_per_position=[] if mode == PLAIN else [6, 4])


def test_overall_is_the_geometric_mean_and_a_difference_anywhere_disqualifies():
    per_prompt = [
        ("code", [_summary(PLAIN, 1.0, None), _summary("fast", 4.0, True, theory=5.0),
                  _summary("honest", 2.0, True, theory=2.5)]),
        ("story", [_summary(PLAIN, 1.0, None), _summary("fast", 1.0, False, theory=1.25),
                   _summary("honest", 0.5, True, theory=0.5)]),
    ]
    rows = {r.mode: r for r in overall_rows("t.gguf", per_prompt)}
    assert list(rows) == [PLAIN, "fast", "honest"]
    assert rows["fast"].ratio_vs_plain == pytest.approx(2.0)      # sqrt(4 * 1)
    assert rows["honest"].ratio_vs_plain == pytest.approx(1.0)    # sqrt(2 * 0.5)
    assert rows["fast"].theory == pytest.approx(2.5)              # sqrt(5 * 1.25)
    assert rows["fast"].of_theory == pytest.approx(0.8)
    assert rows["fast"].identical_to_plain is False and rows["fast"].differing_prompts == ["story"]
    assert rows["honest"].identical_to_plain is True and rows[PLAIN].identical_to_plain is None
    assert rows["honest"].ratios == [2.0, 0.5]
    # acceptance over all drafted tokens; per position over all drafts of all prompts
    assert rows["honest"].acceptance == pytest.approx(20 / 40)
    assert rows["honest"].mean_accepted_length == pytest.approx(1 + 20 / 20)
    assert rows["honest"].per_position_acceptance == pytest.approx([0.6, 0.4])
    # the fastest configuration changed tokens on one prompt: never best; honest ties plain: plain
    assert best_overall(list(rows.values())).mode == PLAIN
    rows["honest"].ratio_vs_plain = 1.2
    assert best_overall(list(rows.values())).mode == "honest"
    assert geometric_mean([None, 0.0, 8.0, 2.0]) == pytest.approx(4.0)
    assert rows["fast"].bound is None and rows["fast"].to_dict()["of_bound"] is None   # no bound measured


def test_the_bound_is_per_prompt_and_its_fraction_a_geometric_mean_over_prompts():
    from llamaspec.bench.bound import copy_bound
    from llamaspec.bench.results import BenchResult, BenchSettings

    results = []
    for pid, ratio, context, out in (("code", 2.0, [1, 2, 3, 4, 5, 6, 7, 1, 2], [3, 4, 5, 6, 7, 8, 9]),
                                     ("story", 0.5, [10, 11, 12], list(range(13, 20)))):
        res = BenchResult(prompt_tokens=3, reps=1, settings=BenchSettings(), runs={},
                          summaries=[_summary(PLAIN, 1.0, None), _summary("m", ratio, True)])
        b = copy_bound(context, out, {1: 1.0, 64: 1.0})           # free batches: tokens / steps
        res.set_bound(b)
        results.append((pid, res))
    code, story = results[0][1], results[1][1]
    assert code.bound.speedup == pytest.approx(3.5)              # 3 4 5 6 7 copied + 8, then 9: 7 tokens, 2 steps
    assert story.bound.speedup == pytest.approx(1.0)             # nothing repeats: one-token steps
    plain, m = code.summaries
    assert plain.bound == m.bound == pytest.approx(3.5) and plain.of_bound is None
    assert m.of_bound == pytest.approx(2.0 / 3.5) and m.to_dict()["of_bound"] == m.of_bound
    rows = {r.mode: r for r in overall_rows("t.gguf", [(pid, r.summaries) for pid, r in results])}
    assert rows["m"].bound == pytest.approx(math.sqrt(3.5))     # sqrt(3.5 * 1)
    assert rows["m"].of_bound == pytest.approx(math.sqrt(2.0 / 3.5 * 0.5))
    assert rows[PLAIN].bound == pytest.approx(math.sqrt(3.5)) and rows[PLAIN].of_bound is None
    assert geometric_mean([]) is None and math.isfinite(geometric_mean([1e-9]))


# ---- the sweep on real tiny models --------------------------------------------------------------


@pytest.fixture
def suite_file(tmp_path) -> Path:
    path = tmp_path / "suite.jsonl"
    path.write_text('{"id": "fox", "prompt": "The quick brown fox jumps over the lazy dog."}\n'
                    '{"id": "code", "prompt": "def fibonacci(n):\\n    if n < 2:\\n        return n"}\n')
    return path


@pytest.fixture
def second_draft(tiny_models, tmp_path) -> Path:
    """The tiny draft under another name: a second draft with its own label."""
    path = tmp_path / "draft2.gguf"
    shutil.copyfile(tiny_models["draft"], path)
    return path


@pytest.mark.slow
def test_targets_x_drafts_x_modes_x_prompts_in_one_run(run_cli, tiny_models, suite_file, second_draft):
    targets = [tiny_models["target"], tiny_models["target_wide"]]
    # --fixed-draft: adaptive drafting on tiny models follows noise-level timings (it may never draft)
    r = run_cli("bench", *map(str, targets), "--draft", str(tiny_models["draft"]), "--draft", str(second_draft),
                "--draft", str(tiny_models["other_vocab"]), "--spec-type", "draft", "--spec-type", "ngram-simple",
                "--prompts", str(suite_file), *FAST, "--fixed-draft", "--json")
    assert r.exit_code == 0, r.stderr
    info = r.json()
    # other_vocab has another vocabulary: it drafts translated (through text), measured like the rest
    labels = ["draft-simple @ draft.gguf", "draft-simple @ draft2.gguf", "draft-simple @ other_vocab.gguf",
              "ngram-simple"]
    assert [t["configs"] for t in info["targets"]] == [labels, labels]
    assert [d["draft_path"] for d in info["drafts"]] == [str(tiny_models["draft"]), str(second_draft),
                                                        str(tiny_models["other_vocab"])]
    assert "skipping this pair" not in r.stderr
    assert info["prompts"] == ["fox", "code"]
    runs = [(Path(x["model_path"]).name, x["prompt_id"]) for x in info["runs"]]
    assert runs == [("target.gguf", "fox"), ("target.gguf", "code"), ("target_wide.gguf", "fox"),
                    ("target_wide.gguf", "code")]
    for run in info["runs"]:
        modes = {m["mode"]: m for m in run["results"]}
        assert list(modes) == [PLAIN, *labels]
        for label in labels:
            m = modes[label]
            assert m["identical_to_plain"] is True and m["ratio_vs_plain"] > 0
            assert m["theory"]["speedup"] > 0 and m["theory"]["of_theory"] > 0
            assert m["bound"] == run["bound"]["speedup"] > 0
            assert m["of_bound"] == pytest.approx(m["ratio_vs_plain"] / m["bound"])
        assert run["bound"]["depth"] == run["prompt_tokens"] and run["bound"]["tokens"] == 12
        assert modes[labels[0]]["draft"] == "draft.gguf" and modes[labels[1]]["draft"] == "draft2.gguf"
        assert modes[labels[0]]["spec_type"] == "draft-simple" and modes["ngram-simple"]["draft"] is None
        assert modes[labels[0]]["drafted"] > 0 and len(modes[labels[0]]["per_position_acceptance"]) > 0
    assert len(info["overall"]) == 2
    for o in info["overall"]:
        rows = {x["mode"]: x for x in o["results"]}
        assert list(rows) == [PLAIN, *labels] and all(x["prompts"] == 2 for x in rows.values())
        assert rows[labels[0]]["identical_to_plain"] is True and len(rows[labels[0]]["ratios"]) == 2
        bounds = [x["bound"]["speedup"] for x in info["runs"] if x["model_path"] == o["model_path"]]
        assert rows["ngram-simple"]["bound"] == pytest.approx(geometric_mean(bounds))
        assert rows["ngram-simple"]["of_bound"] > 0
        assert o["best"]["mode"] in rows
    assert info["all_identical"] is True
    assert "model" not in info and "results" not in info   # the single-run keys are for single runs
    assert "[target.gguf / fox] rep 1/1 plain" in r.stderr


@pytest.mark.slow
def test_sweep_tables_chart_and_quiet(run_cli, tiny_models, suite_file, second_draft):
    args = ("bench", str(tiny_models["target"]), "--draft", str(tiny_models["draft"]), "--draft", str(second_draft),
            "--spec-type", "draft", "--prompts", str(suite_file), *FAST)
    r = run_cli(*args)
    assert r.exit_code == 0, r.stderr
    out = r.stdout
    assert "per prompt" in out and "overall: 2 prompt(s)" in out and "of theory" in out and "of bound" in out
    assert re.search(r"^bound \[fox\]: \d+\.\d\dx", out, re.M) and re.search(r"^bound \[code\]: ", out, re.M)
    assert "speedup over plain decoding" in out
    # a bar per configuration for each prompt and overall: 3 groups x 2 drafts
    bars = [line for line in out.splitlines() if "█" in line]
    assert len(bars) == 6 and all(re.search(r"\d\.\d\dx", b) for b in bars)
    assert out.count("draft-simple @ draft2.gguf") >= 5
    assert re.search(r"best: (plain decoding|\S+ .*geometric mean over prompts)", out)
    q = run_cli(*args, "-q")
    assert q.exit_code == 0 and q.stderr == ""
    assert re.fullmatch(r"(plain|draft-simple @ draft2?\.gguf) \d+\.\d\dx\n", q.stdout)


def test_one_target_with_an_incompatible_draft_is_still_an_error(run_cli, tiny_models, tmp_path):
    from tests.test_detect_drafts import eagle3

    bad = eagle3(tmp_path / "e.gguf", layers=(0, 2, 9))   # made for another target: cannot draft at all
    r = run_cli("bench", str(tiny_models["target"]), "--draft", str(bad), "--spec-type", "draft", *FAST)
    assert r.exit_code != 0 and "cannot draft for" in r.stderr and "Traceback" not in r.stderr
