"""`llamaspec tune` end to end on the tiny models, and what `run` / `batch` do with a stored config.

Which configuration wins on a machine is timing: the real sweep is checked for its structure only.
Where a test needs a known configuration, it stores one with the store's own `save`.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from llamaspec.tune import store
from llamaspec.tune.store import TunedConfig
from tune_fixtures import config_dir, model_pair  # noqa: F401 - fixtures

FAST = ("-n", "6", "-t", "1")


@pytest.fixture
def pair(model_pair):
    return model_pair


@pytest.fixture
def one_prompt(tmp_path):
    p = tmp_path / "prompts.jsonl"
    p.write_text(json.dumps({"id": "sea", "prompt": "Tell me about the sea. The sea, the sea."}) + "\n")
    return p


def _run(run_cli, *args):
    r = run_cli("run", *args, "-p", "Tell me about the sea.", "--temp", "0", "--json", *FAST)
    assert r.exit_code == 0, r.stderr
    return r.json()


def test_tune_stores_a_config_and_the_next_run_uses_it(run_cli, pair, one_prompt, config_dir):
    t, d = pair
    # tiny models time in microseconds: passes far apart are normal here, and not what this checks
    r = run_cli("tune", t, "--draft", d, "--prompts", one_prompt, "--quick", "--max-spread", "1000", "--json",
                *FAST)
    assert r.exit_code == 0, r.stderr
    info = r.json()
    assert {"config", "sweep", "stored", "store", "prompts", "n", "threads"} <= set(info)
    assert info["stored"] is True and info["prompts"] == ["sea"] and info["n"] == 6
    rounds = info["sweep"]["rounds"]
    assert [x["name"] for x in rounds][0] == "coarse" and rounds[0]["candidates"]
    assert {"draft-simple", "ngram-mod"} <= {c["spec_type"] for c in rounds[0]["candidates"]}
    names = [x["name"] for x in rounds]
    # a confirm round follows unless no candidate could be confirmed: each rejected or accepting
    # nothing (6 tokens of the random tiny target can give no accepted draft at all)
    assert (names[-1] == "confirm"
            or all(c["rejected"] or not c["accepted"] for x in rounds for c in x["candidates"])), rounds
    assert "fine" not in names
    specs = {c["spec_type"] for x in rounds for c in x["candidates"]}
    chains = {s for s in specs if "," in s}   # the best n-gram types (if any drafted) with the draft
    assert all(s.endswith(",draft-simple") for s in chains) and len(chains) <= 1   # quick: the best one
    for x in rounds:   # every measured run was checked against plain decoding
        for c in x["candidates"]:
            assert c["rejected"] is None or c["rejected"].startswith(("cannot run", "greedy tokens differ"))
    assert all(len(c["ratios"]) == 1 for c in rounds[-1]["candidates"]) or info["sweep"]["unstable"] is None
    cfg = info["config"]
    assert cfg["spec_type"] in specs | {"none"} and cfg["created"]
    assert "coarse round" in r.stderr   # progress on stderr, the JSON object alone on stdout
    assert "ETA " in r.stderr

    shown = run_cli("tune", "--show", "--json")
    assert shown.exit_code == 0 and len(shown.json()["entries"]) == 1
    entry = shown.json()["entries"][0]
    assert entry["current"] is True and entry["config"]["spec_type"] == cfg["spec_type"]

    after = _run(run_cli, t, "--draft", d)
    assert after["tuned"] is not None and after["tuned"]["spec_type"] == cfg["spec_type"]
    from llamaspec.speculative.options import needs_draft_model, parse_spec_types

    if needs_draft_model(parse_spec_types(cfg["spec_type"])):
        assert after["spec_type"] == cfg["spec_type"] and after["tuned"]["applied"][0] == "spec-type"
    else:   # the draft typed on the command line is used: the stored draft-free config is not
        assert after["spec_type"] == "draft-simple" and after["tuned"]["applied"] == []
    plain = _run(run_cli, t, "--spec-type", "none")   # an explicit spec type: the store is not used
    assert plain["tuned"] is None and plain["tokens"] == after["tokens"]


def test_run_applies_a_stored_config_and_flags_win(run_cli, pair):
    t, d = pair
    store.save(t, None, TunedConfig("ngram-mod", draft_max=7, ngram={"mod_n_match": 3}))
    info = _run(run_cli, t, "--draft", "none")
    assert info["spec_type"] == "ngram-mod" and info["draft_model"] is None
    tuned = info["tuned"]
    assert (tuned["spec_type"], tuned["draft_max"], tuned["ngram"], tuned["overridden"]) == (
        "ngram-mod", 7, {"mod_n_match": 3}, [])
    assert tuned["applied"] == ["spec-type", "draft-max", "mod-n-match"]
    human = run_cli("run", t, "--draft", "none", "-p", "hi", "--temp", "0", *FAST)
    first = human.stderr.splitlines()[0]   # one line: the configuration that runs, and why
    assert first.startswith("speculation: ngram-mod, as `llamaspec tune` chose on") and "spec ngram-mod, draft-max 7" in first

    kept = _run(run_cli, t, "--draft", "none", "--draft-max", "5", "--spec-ngram-mod-n-match", "4")
    assert kept["tuned"]["overridden"] == ["draft-max", "mod-n-match"] and kept["spec_type"] == "ngram-mod"
    other = _run(run_cli, t, "--draft", "none", "--spec-type", "ngram-simple")
    assert other["tuned"] is None and other["spec_type"] == "ngram-simple"
    paired = _run(run_cli, t, "--draft", d)     # the pair with a draft: another entry, never tuned
    assert paired["tuned"] is None and paired["spec_type"] == "draft-simple"


def test_generator_gets_the_tuned_settings_and_explicit_ones(pair):
    from llamaspec.api.generator import Generator

    t, d = pair
    store.save(t, d, TunedConfig("ngram-mod,draft-simple", draft_max=7, ngram={"mod_n_match": 3}))
    with Generator(t, draft=d, temperature=0, threads=1, max_tokens=4) as g:
        assert (g.options.spec_types, g.options.draft_max, g.options.ngram.mod_n_match) == (
            ["ngram-mod", "draft-simple"], 7, 3)
        assert g.options.draft_path is not None and g.spec_label == "ngram-mod,draft-simple"
    with Generator(t, draft=d, temperature=0, threads=1, max_tokens=4, draft_max=5) as g:
        assert (g.options.draft_max, g.options.ngram.mod_n_match) == (5, 3)
    with Generator(t, draft=d, temperature=0, threads=1, max_tokens=4, tuned=False) as g:
        assert g.tuned is None and g.options.spec_types == ["draft-simple"]


def test_batch_uses_the_stored_config(run_cli, pair, tmp_path):
    t, d = pair
    store.save(t, None, TunedConfig("ngram-simple", draft_max=9))
    inp, outp = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text(json.dumps({"id": "a", "prompt": "hi"}) + "\n")
    r = run_cli("batch", t, inp, "-o", outp, "--draft", "none", "--temp", "0", *FAST)
    assert r.exit_code == 0, r.stderr
    rec = json.loads(outp.read_text().splitlines()[0])
    assert rec["spec_type"] == "ngram-simple" and rec["tuned"]["draft_max"] == 9


def test_a_modified_model_file_is_not_given_its_old_config(run_cli, pair):
    t, d = pair
    store.save(t, d, TunedConfig("ngram-mod", draft_max=7))
    st = t.stat()
    os.utime(t, ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000_000))
    info = _run(run_cli, t, "--draft", d)
    assert info["tuned"] is None and info["spec_type"] == "draft-simple"
    shown = run_cli("tune", "--show", "--json").json()["entries"]
    assert len(shown) == 1 and shown[0]["current"] is False
    assert "stale" in run_cli("tune", "--show").stdout


def test_corrupt_store_warns_once_and_is_empty(run_cli, pair, config_dir):
    t, d = pair
    config_dir.mkdir()
    (config_dir / "tune.json").write_bytes(b"\x00not json")
    r = run_cli("run", t, "--draft", d, "-p", "hi", "--temp", "0", "--json", *FAST)
    assert r.exit_code == 0 and r.json()["tuned"] is None
    lines = [ln for ln in r.stderr.splitlines() if "tune.json" in ln]
    assert len(lines) == 1 and lines[0].startswith("warning:") and "Traceback" not in r.stderr
    s = run_cli("tune", "--show", "--json")
    assert s.exit_code == 0 and s.json()["entries"] == []


def test_show_and_forget(run_cli, pair, tmp_path):
    t, d = pair
    store.save(t, d, TunedConfig("ngram-mod", draft_max=7, ratio=1.8))
    store.save(t, None, TunedConfig("ngram-simple"))
    other = tmp_path / "other.gguf"
    shutil.copy2(t, other)
    os.utime(other, ns=(1, 1))   # another file identity
    store.save(other, None, TunedConfig("none"))
    table = run_cli("tune", "--show")
    assert table.exit_code == 0
    for word in ("target.gguf", "draft.gguf", "other.gguf", "spec ngram-mod, draft-max 7", "1.80x", "current"):
        assert word in table.stdout
    r = run_cli("tune", "--forget", t, "--json")
    assert r.exit_code == 0 and r.json()["removed"] == 2
    assert [e["target"]["path"] for e in run_cli("tune", "--show", "--json").json()["entries"]] == [
        str(other.resolve())]
    r = run_cli("tune", "--forget")
    assert r.exit_code == 0 and "forgot 1 tuned configuration" in r.stdout
    assert "no tuned configurations" in run_cli("tune", "--show").stdout


@pytest.mark.parametrize("args,needle", [
    (("--show", "--forget"), "not both"),
    ((), "no model to tune"),
    (("X", "--draft", "auto"), "draft path or Hub ref"),
    (("X", "--margin", "-1"), "--margin"),
    (("X", "--max-spread", "1"), "--max-spread"),
])
def test_usage_errors(run_cli, args, needle):
    r = run_cli("tune", *args)
    assert r.exit_code == 2 and needle in r.stderr


def test_bench_measures_the_stored_config_beside_its_modes(run_cli, pair):
    """bench with no --spec-type adds what tune stored for the target (alone and with the draft),
    with its own settings, labelled `tuned (...)`; an explicit --spec-type measures only that."""
    t, d = pair
    store.save(t, None, TunedConfig("ngram-simple", draft_max=5, ngram={"simple_size_n": 3}))
    r = run_cli("bench", t, "--draft", d, "-p", "one two three one two three one two", "--reps", "1",
                "--json", *FAST)
    assert r.exit_code == 0, r.stderr
    labels = [m["mode"] for m in r.json()["results"]]
    assert "tuned (ngram-simple)" in labels and "draft-simple" in labels
    r = run_cli("bench", t, "--spec-type", "ngram-mod", "-p", "one two", "--reps", "1", "--json", *FAST)
    assert [m["mode"] for m in r.json()["results"] if m["mode"] != "plain"] == ["ngram-mod"]


def test_passes_that_disagree_store_nothing_and_say_so_in_one_line(run_cli, pair, one_prompt, config_dir):
    """--max-spread just above 1: any two passes of a finalist that reached 1.0x disagree, so tune
    measures again, then stores nothing. (Whether one reaches 1.0x at all is timing: when none does,
    plain decoding is stored as usual.)"""
    t, d = pair
    r = run_cli("tune", t, "--draft", d, "--prompts", one_prompt, "--quick", "--margin", "0",
                "--max-spread", "1.0000001", "--json", *FAST)
    info = r.json()
    if info["unstable"] is None:
        assert r.exit_code == 0 and info["config"]["spec_type"] == "none"
        return
    assert r.exit_code == 1 and info["stored"] is False and not (config_dir / "tune.json").exists()
    again = [ln for ln in r.stderr.splitlines() if "measuring the finalists again" in ln]
    final = [ln for ln in r.stderr.splitlines() if ln.startswith("warning: not stored:")]
    assert len(again) == 2 and len(final) == 1 and "apart" in final[0] and "Traceback" not in r.stderr
    assert len(info["sweep"]["rounds"][-1]["candidates"][0]["ratios"]) == 3   # one pass, measured again twice


def test_a_busy_machine_makes_llama_cpp_threads_wait_passively(monkeypatch):
    """Spinning OpenMP threads on oversubscribed cores made one 32-token run take 74 s instead of
    4 s; tune waits passively when the CPUs have been oversubscribed for a while (CPU pressure),
    only when llama.cpp is not loaded yet and the user did not choose, and records what it set."""
    import sys

    from llamaspec.cli._output import Output
    from llamaspec.cli.tune import _passive_when_busy
    from llamaspec.runtime import wait_policy

    for var in wait_policy.USER_VARS:
        monkeypatch.setenv(var, "x")   # restored after the test
        monkeypatch.delenv(var)
    monkeypatch.delitem(sys.modules, "llama_cpp", raising=False)
    monkeypatch.setattr(wait_policy, "_chosen", None)
    monkeypatch.setattr(wait_policy, "cpu_pressure", lambda: (0.0, 0.0))   # a quiet machine
    quiet = _passive_when_busy(Output(), 1)
    assert "OMP_WAIT_POLICY" not in os.environ and (quiet or {}).get("OMP_WAIT_POLICY") is None
    for var in wait_policy.USER_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(wait_policy, "_chosen", None)
    monkeypatch.setattr(wait_policy, "cpu_pressure", lambda: (95.0, 90.0))   # oversubscribed all along
    busy = _passive_when_busy(Output(), 1)
    if wait_policy.openmp_runtime() == "libgomp":
        assert busy == {"OMP_WAIT_POLICY": "PASSIVE"} and os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setattr(wait_policy, "_chosen", None)
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")   # the user's choice stays
    assert _passive_when_busy(Output(), 1) is None and os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
