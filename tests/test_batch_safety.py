"""`llamaspec batch` under misuse, end to end on the tiny models: two jobs on one OUTPUT, a bad -o,
an input changed or a tune forgotten between runs, broken bytes, interrupts with --json, OpenAI
output the openai SDK accepts, unsupported body fields, and --ordered."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from child_process import default_signals

HANG_GUARD_S = 120   # a hang guard, not a speed bound: a child reaching an awaited record
REPO = Path(__file__).resolve().parents[1]
FAST = ("--temp", "0", "-t", "1")


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _prompts(n: int, max_tokens: int | None = None) -> list[dict]:
    extra = {} if max_tokens is None else {"max_tokens": max_tokens}
    return [{"id": f"p{i}", "prompt": f"Write about topic {i}: rivers, stones and {i} birds.", **extra}
            for i in range(n)]


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _ids(path: Path) -> list[str]:
    return [r.get("custom_id") or r.get("id") for r in _records(path)]


def _start(*args, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           **kw.pop("env", {})}
    return subprocess.Popen([sys.executable, "-m", "llamaspec", *map(str, args)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=default_signals, **kw)


def _wait_for_records(p: subprocess.Popen, out: Path, n: int) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while p.poll() is None and time.monotonic() < deadline:
        if out.exists() and out.read_bytes().count(b"\n") >= n:
            return
        time.sleep(0.01)
    raise AssertionError(f"no {n} records in {out} (exit {p.poll()})")


# ---- 1. two jobs on one OUTPUT --------------------------------------------------------------------


def test_a_second_job_on_the_same_output_is_refused_naming_the_first(tiny_models, tmp_path):
    """Both used to exit 0, leaving every id twice. Two real processes: the second one starts
    while the first is writing, and is refused before loading a model."""
    inp, out = _write(tmp_path / "in.jsonl", _prompts(240, 128)), tmp_path / "out.jsonl"   # ~10 s of work
    first = _start("batch", tiny_models["target"], inp, "-o", out, *FAST, "-q")
    try:
        _wait_for_records(first, out, 1)
        second = _start("batch", tiny_models["target"], inp, "-o", out, *FAST)
        _, err = second.communicate(timeout=600)
        first_was_running = first.poll() is None
    finally:
        first_out, first_err = first.communicate(timeout=300)
    assert second.returncode == 2, err
    assert f"{out} is being written by another llamaspec batch (pid {first.pid}; lock {out}.lock)" in err
    assert first_was_running, "the first job must still be running for this test to mean anything"
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 2   # the line and its hint
    assert first.returncode == 0, first_err
    ids = _ids(out)
    assert sorted(ids) == sorted(f"p{i}" for i in range(240))   # each id exactly once
    assert not (tmp_path / "out.jsonl.lock").exists()


def test_a_sigkilled_job_does_not_block_the_next_run(tiny_models, tmp_path):
    inp, out = _write(tmp_path / "in.jsonl", _prompts(40, 128)), tmp_path / "out.jsonl"
    p = _start("batch", tiny_models["target"], inp, "-o", out, *FAST, "-q")
    _wait_for_records(p, out, 1)
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    assert (tmp_path / "out.jsonl.lock").exists()   # left behind, but nobody holds its lock
    r = _start("batch", tiny_models["target"], inp, "-o", out, *FAST)
    _, err = r.communicate(timeout=300)
    assert r.returncode == 0, err
    assert "resuming:" in err and sorted(_ids(out)) == sorted(f"p{i}" for i in range(40))


# ---- 2. the input and the tuned configuration on resume ----------------------------------------------


def test_resume_refuses_an_edited_request_under_a_recorded_id(run_cli, tiny_models, tmp_path):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    rows = _prompts(3, 4)
    _write(inp, rows)
    assert run_cli("batch", tiny_models["target"], inp, "-o", out, *FAST).exit_code == 0
    _write(inp, rows + _prompts(5, 4)[3:])            # requests added: they are simply done
    r = run_cli("batch", tiny_models["target"], inp, "-o", out, *FAST)
    assert r.exit_code == 0, r.stderr
    assert sorted(_ids(out)) == [f"p{i}" for i in range(5)]
    rows[1]["prompt"] = "Something else entirely."    # an answer in OUTPUT to a prompt no longer asked
    _write(inp, rows)
    r = run_cli("batch", tiny_models["target"], inp, "-o", out, *FAST)
    assert r.exit_code == 2 and f'{out} has a record for id "p1", whose request (input line 2) changed' in r.stderr
    other = _write(tmp_path / "other.jsonl", [{"id": "x", "prompt": "hello"}])
    r = run_cli("batch", tiny_models["target"], other, "-o", out, *FAST)
    assert r.exit_code == 2 and f"was started with input {inp}, now {other}" in r.stderr
    r = run_cli("batch", tiny_models["target"], "-", "-o", out, *FAST, "--force", input=inp.read_text())
    assert r.exit_code == 0, r.stderr   # --force (and standard input works as INPUT)


def test_forgetting_a_tune_does_not_make_the_same_command_another_job(tiny_models, tmp_path, monkeypatch):
    """The manifest used to compare the effective settings, tuned spec type included: after
    `tune --forget` the same command was refused as "other settings"."""
    from llamaspec.tune import store
    from llamaspec.tune.store import TunedConfig

    cfg = tmp_path / "cfg"
    monkeypatch.setenv(store.ENV_CONFIG_DIR, str(cfg))
    t, d = tiny_models["target"], tiny_models["draft"]
    store.save(t, d, TunedConfig("ngram-mod", draft_max=7))
    inp, out = _write(tmp_path / "in.jsonl", _prompts(40, 128)), tmp_path / "out.jsonl"
    args = ("batch", t, inp, "-o", out, "--draft", d, *FAST)
    env = {store.ENV_CONFIG_DIR: str(cfg)}
    p = _start(*args, "-q", env=env)          # part of the job, with the tuned configuration
    _wait_for_records(p, out, 2)
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    first = _records(out)
    assert first and first[0]["tuned"]["spec_type"] == "ngram-mod" and len(first) < 40
    forgot = _start("tune", "--forget", env=env)
    assert forgot.wait(timeout=120) == 0 and store.lookup(t, d) is None
    r = _start(*args, env=env)                # the same command, no tuned configuration now
    _, err = r.communicate(timeout=300)
    assert r.returncode == 0, err
    recs = {x["id"]: x for x in _records(out)}
    assert sorted(recs) == sorted(f"p{i}" for i in range(40)) and recs["p39"]["tuned"] is None
    manifest = json.loads((tmp_path / "out.jsonl.llamaspec.json").read_text())
    assert manifest["effective"]["spec_type"] == "draft-simple" and manifest["effective"]["tuned"] is None


# ---- 3. output paths, before any model loads --------------------------------------------------------


@pytest.mark.parametrize("where, message", [
    ("missing/dir/out.jsonl", "cannot write -o {o}: directory {d} does not exist"),
    ("/proc/x.jsonl", "cannot write -o /proc/x.jsonl: directory /proc: cannot create files there"),
])
def test_an_unwritable_output_is_one_line_before_any_model_loads(run_cli, tmp_path, where, message):
    out = tmp_path / where if not where.startswith("/") else Path(where)
    inp = _write(tmp_path / "in.jsonl", _prompts(1))
    # a model that does not exist: the -o error coming first shows that no model was loaded
    r = run_cli("batch", tmp_path / "no-such-model.gguf", inp, "-o", out)
    assert r.exit_code == 2 and "Traceback" not in r.stderr
    assert message.format(o=out, d=out.parent) in r.stderr.splitlines()[0]
    assert not list(tmp_path.glob("**/*.tmp"))


# ---- 4. and 5. broken bytes, counts, and an interrupted --json ----------------------------------------


def test_a_non_utf8_line_fails_alone_and_the_summary_counts_each_kind(run_cli, tiny_models, tmp_path):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    good = [json.dumps(r).encode() for r in _prompts(3, 4)]
    inp.write_bytes(b"\n".join([good[0], b'{"id": "latin", "prompt": "caf\xe9"}', good[1], b"not json",
                                b'{"id": "bad", "prompt": 3}', good[2]]) + b"\n")
    r = run_cli("batch", tiny_models["target"], inp, "-o", out, *FAST, "--json")
    assert r.exit_code == 1 and "Traceback" not in r.stderr
    assert "line 2: not UTF-8: byte 0xe9" in r.stderr
    recs = {x["id"]: x for x in _records(out)}
    assert recs["latin"]["error"]["line"] == 2 and all(recs[f"p{i}"]["text"] for i in range(3))
    s = r.json()
    assert (s["lines"], s["done"], s["failed"], s["skipped"], s["remaining"]) == (6, 3, 3, 0, 0)
    assert "6 lines: 3 done, 3 failed;" in r.stderr   # not "3/3 requests, 3 failed"
    again = run_cli("batch", tiny_models["target"], inp, "-o", out, *FAST, "--json")
    assert again.json()["skipped"] == 6 and again.json()["done"] == 0


def test_an_interrupted_json_job_prints_its_summary(tiny_models, tmp_path):
    inp, out = _write(tmp_path / "in.jsonl", _prompts(60, 128)), tmp_path / "out.jsonl"
    p = _start("batch", tiny_models["target"], inp, "-o", out, *FAST, "--json")
    _wait_for_records(p, out, 1)
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 130, stderr
    s = json.loads(stdout)
    assert s["interrupted"] is True and s["lines"] == 60 and s["done"] >= 1
    assert s["done"] + s["remaining"] == 60 and s["done"] == len(_records(out))


# ---- 6. and 7. OpenAI output the SDK accepts; body fields --------------------------------------------


def test_openai_records_validate_with_the_openai_sdk(run_cli, tiny_models, tmp_path):
    from openai.types import Completion
    from openai.types.chat import ChatCompletion

    long_text = "stones and rivers " * 12
    rows = [{"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6}},
            {"custom_id": "full", "method": "POST", "url": "/v1/completions",   # fills the context
             "body": {"model": "x", "prompt": long_text, "max_tokens": 200}},
            {"custom_id": "cmpl", "method": "POST", "url": "/v1/completions",
             "body": {"model": "x", "prompt": "Once", "max_tokens": 5}}]
    inp, out = _write(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    own = _write(tmp_path / "own.jsonl", [{"id": "full", "prompt": long_text, "max_tokens": 200}])
    r = run_cli("batch", tiny_models["target"], inp, "-o", out, *FAST, "-c", "96", "--raw")
    assert r.exit_code == 0, r.stderr
    recs = {x["custom_id"]: x for x in _records(out)}
    ChatCompletion.model_validate(recs["chat"]["response"]["body"])
    for key in ("full", "cmpl"):
        Completion.model_validate(recs[key]["response"]["body"])
    assert recs["full"]["response"]["body"]["choices"][0]["finish_reason"] == "length"
    r = run_cli("batch", tiny_models["target"], own, "-o", tmp_path / "own-out.jsonl", *FAST, "-c", "96", "--raw")
    assert r.exit_code == 0 and _records(tmp_path / "own-out.jsonl")[0]["finish_reason"] == "context"


def test_body_fields_unsupported_fail_their_line_and_sampling_fields_apply(run_cli, tiny_models, tmp_path):
    def line(cid, **body):
        return {"custom_id": cid, "method": "POST", "url": "/v1/completions",
                "body": {"prompt": "The sea is", "max_tokens": 16, **body}}

    rows = [line("greedy", temperature=0), line("top_k", temperature=2.0, top_k=1, seed=3),
            line("min_p", temperature=2.0, min_p=1.0, seed=3), line("hot", temperature=2.0, seed=3),
            line("n", n=2), line("logprobs", logprobs=21), line("neg", temperature=-1),
            line("rp", repeat_penalty=0)]
    inp, out = _write(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    r = run_cli("batch", tiny_models["target"], inp, "-o", out, "-t", "1", "--raw")
    assert r.exit_code == 1 and "Traceback" not in r.stderr
    recs = {x["custom_id"]: x for x in _records(out)}
    text = {k: v["response"]["body"]["choices"][0]["text"] for k, v in recs.items()
            if v["response"]["status_code"] == 200}
    assert text["hot"] != text["greedy"], "temperature 2 must differ from greedy for this test to mean anything"
    assert text["top_k"] == text["greedy"] and text["min_p"] == text["greedy"]   # they were applied
    for cid, field in (("n", "n"), ("logprobs", "logprobs"), ("neg", "temperature"), ("rp", "repeat_penalty")):
        resp = recs[cid]["response"]
        assert resp["status_code"] == 400, cid
        assert resp["body"]["error"]["param"] == field and field in resp["body"]["error"]["message"]


# ---- 8. --ordered ------------------------------------------------------------------------------------


def test_ordered_writes_records_in_input_order_with_parallel(run_cli, tiny_models, tmp_path):
    rows = [{"id": f"p{i}", "prompt": f"Tell a story about {i} boats.", "max_tokens": 40 if i % 2 == 0 else 2}
            for i in range(8)]
    rows.insert(3, {"id": "broken", "prompt": 7})
    inp = _write(tmp_path / "in.jsonl", rows)
    order = [r["id"] for r in rows]
    got = {}
    for flag in ((), ("--ordered",)):
        out = tmp_path / f"out{len(flag)}.jsonl"
        r = run_cli("batch", tiny_models["target"], inp, "-o", out, *FAST, "--parallel", "2", *flag)
        assert r.exit_code == 1, r.stderr   # the broken line
        got[flag] = _ids(out)
        assert sorted(got[flag]) == sorted(order)
    assert got[()] != order, "completion order must differ from input order for this test to mean anything"
    assert got[("--ordered",)] == order
