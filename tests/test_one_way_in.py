"""One way in: the same field gets the same verdict and the same message at every entrance.

One row per request field, four cases each (valid, out of range, wrong type, absent; a few rows
add edge values), each case sent through the real entrances:

    http_chat        POST /v1/chat/completions to a running `llamaspec serve`   (400: {"error": {message, param}})
    http_completion  POST /v1/completions to the same server
    batch            a line of llamaspec's batch form   {"id", "prompt": "Hi", "max_tokens": 2, ...}
    openai_batch     a line of OpenAI's batch form      {"custom_id", "url": "/v1/chat/completions", "body": {...}}
    python           Generator.generate("Hi", max_tokens=2, temperature=0, **fields)   (UsageError)
    cli              llamaspec run MODEL -p Hi -n 2 --temp 0 FLAG VALUE        (exit != 0, "error: ..." on stderr)

A case an entrance cannot express is NA in the table (run has no logprobs flag; the command line
cannot send a number where it takes text), shown as such, never skipped silently.

Per row and case: the verdicts (accepted / refused) agree; every refusal's message, with the
entrance's spelling of the field normalised to the field's name (`--temp` -> temperature), the
CLI's "error: " and trailing "(hint)" and an OpenAI batch record's "line N: " removed, is one
string; an HTTP 400's (and an OpenAI batch record's) `param` names the field. Valid values and
absent fields are accepted everywhere, out-of-range and wrong-type values refused everywhere.
Every disagreement of a row is collected, then the row fails with all of them at once.

One server, one Generator, one batch job per form (every row's lines in it) and the `run`
subprocesses, all started by one module fixture and run side by side, on the tiny target model.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from llamaspec import knobs
from llamaspec.openai.fields import MAX_STOPS
from llamaspec.testing import real_models
from test_serve import Server, http

REPO_ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

ENTRANCES = ("http_chat", "http_completion", "batch", "openai_batch", "python", "cli")
CHAT_SHAPED = ("http_chat", "openai_batch")   # their bodies are chat bodies (logprobs: bool + top_logprobs)
NA = None   # an entrance that cannot say this case


# ---- the table ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Send:
    """One case at every entrance. body: the fields added to a llamaspec batch line, a
    /v1/completions body and Generator.generate's keywords; chat: those of a chat body
    (/v1/chat/completions, the OpenAI batch line) where they differ; cli: run's arguments
    (NA: run cannot say it). An empty body and cli: the field left out."""

    body: dict
    cli: list[str] | None
    chat: dict | None = None

    def fragment(self, entrance: str) -> dict | list[str] | None:
        if entrance == "cli":
            return self.cli
        if entrance in CHAT_SHAPED and self.chat is not None:
            return self.chat
        return self.body


ABSENT = Send({}, [])


@dataclass(frozen=True)
class Row:
    """A field: how each entrance spells it (messages normalise these to `field`) and its cases
    (None: the case does not exist for this field, e.g. a boolean has no range)."""

    field: str
    spelled: dict[str, tuple[str, ...]]
    cases: dict[str, Send | None]
    note: str = ""


def _spelled(field: str, cli: tuple[str, ...] | None, chat: tuple[str, ...] | None = None) -> dict:
    out = {e: (field,) for e in ENTRANCES}
    out["cli"] = cli if cli is not None else ("(no run flag)",)
    if chat:
        out["http_chat"] = out["openai_batch"] = chat
    return out


def knob(field: str, flag: str, valid: Any, out_of_range: Any, wrong_type: Any, **extra: Any) -> Row:
    """A knob of knobs.py: the same JSON value at every JSON entrance and as the keyword, its
    text after run's `flag` (messages may spell it by any of the knob's flags)."""
    k = knobs.KNOBS[field]
    assert flag in k.flags, (field, flag, k.flags)

    def send(v: Any) -> Send:
        return Send({field: v}, [flag, str(v)])

    cases = {"valid": send(valid), "out of range": send(out_of_range), "wrong type": send(wrong_type),
             "absent": ABSENT, **{name: send(v) for name, v in extra.items()}}
    return Row(field, _spelled(field, tuple(sorted(set(k.flags) | {"/".join(k.flags)}, key=len, reverse=True))),
               cases)


TOO_MANY_STOPS = [f"s{i}" for i in range(MAX_STOPS + 1)]
SCHEMA, BAD_SCHEMA = {"type": "string"}, {"type": "nonsense"}
GBNF, BAD_GBNF = 'root ::= "a" | "b"', "root ::= undefined_rule"

ROWS: list[Row] = [
    # Every JSON entrance (HTTP bodies, both batch forms) and Generator.generate spell a knob by
    # its name with the same JSON value; run spells it by the flag, its value as text.
    #    field                  run's flag             valid  out of range  wrong type  edge values
    knob("temperature",         "--temp",              0.5,   -1,           "hot"),
    knob("top_p",               "--top-p",             0.5,   1.5,          "hot"),
    knob("top_k",               "--top-k",             10,    2**63,        "hot"),   # (no range but int64's)
    knob("min_p",               "--min-p",             0.1,   1.5,          "hot"),
    knob("seed",                "--seed",              42,    2**63,        "hot"),   # (no range but int64's)
    knob("repeat_penalty",      "--repeat-penalty",    1.1,   0,            "hot"),   # (> 0)
    knob("presence_penalty",    "--presence-penalty",  0.5,   3,            "hot"),
    knob("frequency_penalty",   "--frequency-penalty", 0.5,   -3,           "hot"),
    knob("max_tokens",          "-n",                  2,     -2,           "hot",      zero=0, minus_one=-1),
    Row("stop", _spelled("stop", ("--stop",)), {
        "valid":        Send({"stop": ["."]},          ["--stop", "."]),
        "out of range": Send({"stop": TOO_MANY_STOPS}, [a for s in TOO_MANY_STOPS for a in ("--stop", s)]),
        "wrong type":   Send({"stop": 5},              NA),   # run's flag takes text
        "absent":       ABSENT,
    }, note=f"out of range: {MAX_STOPS + 1} stop strings, one over the limit"),
    Row("json_schema", _spelled("json_schema", ("-j/--json-schema", "--json-schema", "-j")), {
        "valid":        Send({"json_schema": SCHEMA},     ["-j", json.dumps(SCHEMA)]),
        "out of range": Send({"json_schema": BAD_SCHEMA}, ["-j", json.dumps(BAD_SCHEMA)]),
        "wrong type":   Send({"json_schema": 5},          NA),   # -j takes text
        "absent":       ABSENT,
    }, note="out of range: a schema of an unknown type"),
    Row("grammar", _spelled("grammar", ("--grammar",)), {
        "valid":        Send({"grammar": GBNF},     ["--grammar", GBNF]),
        "out of range": Send({"grammar": BAD_GBNF}, ["--grammar", BAD_GBNF]),
        "wrong type":   Send({"grammar": 5},        NA),   # --grammar takes text
        "absent":       ABSENT,
    }, note="out of range: a GBNF grammar naming an undefined rule"),
    Row("logit_bias", _spelled("logit_bias", ("-l/--logit-bias", "--logit-bias", "-l")), {
        "valid":        Send({"logit_bias": {"15": 5}},   ["-l", "15+5"]),   # llama.cpp's TOKEN_ID(+/-)BIAS
        "out of range": Send({"logit_bias": {"15": 500}}, ["-l", "15+500"]),
        "wrong type":   Send({"logit_bias": [15]},        NA),   # -l takes TOKEN_ID(+/-)BIAS text
        "absent":       ABSENT,
    }),
    # logprobs: chat bodies say `logprobs: true` + `top_logprobs: N`; /v1/completions, a llamaspec
    # batch line (a prompt: completion-shaped) and Generator say `logprobs: N`; run has no flag
    Row("logprobs", _spelled("logprobs", None, chat=("top_logprobs", "logprobs")), {
        "valid":        Send({"logprobs": 2},   NA, chat={"logprobs": True, "top_logprobs": 2}),
        "out of range": Send({"logprobs": 21},  NA, chat={"logprobs": True, "top_logprobs": 21}),
        "wrong type":   Send({"logprobs": "2"}, NA, chat={"logprobs": True, "top_logprobs": "2"}),
        "absent":       ABSENT,
        "six":          Send({"logprobs": 6},   NA, chat={"logprobs": True, "top_logprobs": 6}),
    }, note="six: over OpenAI completions' 5, within chat's 20"),
    Row("ignore_eos", _spelled("ignore_eos", ("--ignore-eos",)), {
        "valid":        Send({"ignore_eos": True},  ["--ignore-eos"]),
        "out of range": None,                              # a boolean has no range
        "wrong type":   Send({"ignore_eos": "yes"}, NA),   # --ignore-eos takes no value
        "absent":       ABSENT,
    }),
]

EXPECTED = {"valid": "accepted", "absent": "accepted", "out of range": "refused", "wrong type": "refused"}


# ---- the entrances -----------------------------------------------------------------------------


@dataclass
class Outcome:
    verdict: str                  # "accepted", "refused", or what else happened ("HTTP 500", "raised TypeError")
    message: str | None = None    # the refusal as the entrance says it (verbatim)
    param: str | None = None      # HTTP's / an OpenAI batch record's param
    has_param: bool = False       # (the entrance answers with a param at all)
    sent: Any = None              # what was sent: the fragment of the request


def _base(row: Row, entrance: str) -> dict | list[str]:
    """The request without the row's field: max_tokens 2, temperature 0 (each left out on its own row)."""
    if entrance == "cli":
        args = [] if row.field == "max_tokens" else ["-n", "2"]
        return args + ([] if row.field == "temperature" else ["--temp", "0"])
    return {k: v for k, v in (("max_tokens", 2), ("temperature", 0)) if k != row.field}


def _cases():
    for row in ROWS:
        for case, send in row.cases.items():
            if send is not None:
                yield row, case, send


def _rid(row: Row, case: str) -> str:
    return f"{row.field}.{case.replace(' ', '_')}"


MESSAGES = [{"role": "user", "content": "Hi"}]


def _http(server: Server, row: Row, send: Send, entrance: str) -> Outcome:
    frag = send.fragment(entrance)
    if entrance == "http_chat":
        url, body = "/v1/chat/completions", {"model": "tiny", "messages": MESSAGES}
    else:
        url, body = "/v1/completions", {"model": "tiny", "prompt": "Hi"}
    body |= _base(row, entrance) | frag
    r = http("POST", server.url + url, json_body=body, timeout=120)
    if r.status_code == 200:
        return Outcome("accepted", sent=frag, has_param=True)
    if r.status_code == 400:
        err = r.json()["error"]
        return Outcome("refused", err["message"], err.get("param"), True, frag)
    return Outcome(f"HTTP {r.status_code}", r.text[:300], sent=frag)


def _batch_lines(entrance: str) -> list[str]:
    lines = []
    for row, case, send in _cases():
        frag = send.fragment(entrance)
        rid = _rid(row, case)
        if entrance == "batch":
            lines.append(json.dumps({"id": rid, "prompt": "Hi", **_base(row, entrance), **frag}))
        else:
            lines.append(json.dumps({"custom_id": rid, "method": "POST", "url": "/v1/chat/completions",
                                     "body": {"messages": MESSAGES, **_base(row, entrance), **frag}}))
    return lines


def _batch_outcomes(entrance: str, out: Path) -> dict[str, Outcome]:
    got: dict[str, Outcome] = {}
    for line in out.read_text().splitlines():
        rec = json.loads(line)
        if entrance == "batch":
            err = rec.get("error")
            got[rec["id"]] = Outcome("refused", err["message"]) if err else Outcome("accepted")
        else:
            resp = rec["response"]
            if resp["status_code"] == 200:
                got[rec["custom_id"]] = Outcome("accepted", has_param=True)
            else:
                err = resp["body"]["error"]
                verdict = "refused" if resp["status_code"] == 400 else f"status {resp['status_code']}"
                got[rec["custom_id"]] = Outcome(verdict, err["message"], err.get("param"), True)
    return got


def _python(gen, row: Row, send: Send) -> Outcome:
    from llamaspec.errors import UsageError

    frag = send.fragment("python")
    try:
        gen.generate("Hi", **(_base(row, "python") | frag))
    except UsageError as e:
        return Outcome("refused", e.message, sent=frag)
    except Exception as e:   # not the one way to refuse: shown as what it is
        return Outcome(f"raised {type(e).__name__}", str(e), sent=frag)
    return Outcome("accepted", sent=frag)


def _cli(model: Path, row: Row, send: Send) -> Outcome:
    args = [*_base(row, "cli"), *send.cli]
    argv = ["run", str(model), "-p", "Hi", *args, "-t", "1", "-c", "256"]
    p = subprocess.run([sys.executable, "-m", "llamaspec", *argv], capture_output=True, text=True, timeout=300,
                       env=_child_env())
    if p.returncode == 0:
        return Outcome("accepted", sent=send.cli)
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]
    if not errors:
        return Outcome(f"exit {p.returncode}", p.stderr[-400:], sent=send.cli)
    return Outcome("refused", errors[-1], sent=send.cli)


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


@pytest.fixture(scope="module")
def outcomes(tiny_models, test_pairings_dir, tmp_path_factory) -> dict[tuple[str, str, str], Outcome]:
    """(field, case, entrance) -> Outcome, every case through every entrance: the two batch jobs
    and the `run` subprocesses run beside the server and the Generator."""
    model = tiny_models["target"]
    tmp = tmp_path_factory.mktemp("one-way-in")
    home = tmp / "home"
    home.mkdir()
    results: dict[tuple[str, str, str], Outcome] = {}
    with pytest.MonkeyPatch.context() as mp:   # conftest's isolation, for the module (children inherit it)
        mp.setenv(real_models.CACHE_ENV, str(real_models.cache_dir()))
        mp.setenv("HOME", str(home))
        mp.setenv("HF_HOME", str(home / "hf"))
        mp.setenv("LLAMASPEC_CONFIG_DIR", str(tmp / "config"))
        mp.setenv("LLAMASPEC_PAIRINGS", str(test_pairings_dir))
        for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "OLLAMA_MODELS", "XDG_CACHE_HOME",
                    "LLAMASPEC_MODELS_PATH"):
            mp.delenv(var, raising=False)

        jobs: dict[str, tuple[Path, Path, subprocess.Popen]] = {}
        pool = ThreadPoolExecutor(max_workers=2)
        try:
            for entrance in ("batch", "openai_batch"):   # one job per form, every row's lines in it
                inp, out, log = (tmp / f"{entrance}.jsonl", tmp / f"{entrance}.out.jsonl",
                                 tmp / f"{entrance}.log")
                inp.write_text("\n".join(_batch_lines(entrance)) + "\n")
                with open(log, "w") as log_file:
                    jobs[entrance] = (out, log, subprocess.Popen(
                        [sys.executable, "-m", "llamaspec", "batch", str(model), str(inp), "-o", str(out),
                         "-t", "1", "-c", "256", "-n", "8"], stdout=log_file, stderr=subprocess.STDOUT,
                        env=_child_env()))
            cli_runs = {(row.field, case): pool.submit(_cli, model, row, send)
                        for row, case, send in _cases() if send.cli is not None}
            server = Server(model, "-c", "256", "-n", "8", tmp=tmp)
            try:
                for row, case, send in _cases():
                    for entrance in ("http_chat", "http_completion"):
                        results[row.field, case, entrance] = _http(server, row, send, entrance)
            finally:
                server.stop()

            from llamaspec import Generator

            with Generator(model, temperature=0, max_tokens=8, threads=1, ctx_size=256) as gen:
                for row, case, send in _cases():
                    results[row.field, case, "python"] = _python(gen, row, send)

            for (f, case), fut in cli_runs.items():
                results[f, case, "cli"] = fut.result()
            for entrance, (out, log, proc) in jobs.items():
                proc.wait(timeout=600)
                said = f"(exit {proc.returncode}): {log.read_text()[-2000:]}"
                assert out.exists(), f"{entrance} job wrote no output {said}"
                got = _batch_outcomes(entrance, out)
                for row, case, send in _cases():
                    o = got.get(_rid(row, case))
                    assert o is not None, f"{entrance}: no record for {_rid(row, case)} {said}"
                    o.sent = send.fragment(entrance)
                    results[row.field, case, entrance] = o
        finally:   # (a failure above: no job left running)
            pool.shutdown(cancel_futures=True)
            for _, _, proc in jobs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    return results


# ---- the comparison ----------------------------------------------------------------------------


def _without_hint(line: str) -> str:
    """A CLI line without its trailing " (hint)" (the balanced parenthesis at its end)."""
    if not line.endswith(")"):
        return line
    depth = 0
    for i in range(len(line) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(line[i], 0)
        if depth == 0:
            return line[:i].rstrip() if i > 0 and line[i - 1] == " " else line
    return line


def _respell(message: str, spellings: tuple[str, ...], field: str) -> str:
    for s in sorted(spellings, key=len, reverse=True):
        if s != field:
            message = re.sub(rf"(?<![\w-]){re.escape(s)}(?![\w-])", field, message)
    return message


def _normalised(row: Row, entrance: str, message: str, others: set[str]) -> str:
    if entrance == "openai_batch":
        message = re.sub(r"^line \d+: ", "", message)
    if entrance != "cli":
        return _respell(message, row.spelled[entrance], row.field)
    message = message.removeprefix("error: ")
    full = _respell(message, row.spelled["cli"], row.field)
    short = _respell(_without_hint(message), row.spelled["cli"], row.field)
    return full if full in others and short not in others else short


def _disagreements(row: Row, outcomes: dict) -> list[str]:
    found = []
    for case, send in row.cases.items():
        if send is None:
            continue
        at = {e: outcomes[row.field, case, e] for e in ENTRANCES if send.fragment(e) is not None}
        problems = []
        verdicts = {o.verdict for o in at.values()}
        if len(verdicts) > 1:
            problems.append("verdicts differ")
        want = EXPECTED.get(case)
        if want and verdicts != {want}:
            problems.append(f"expected {want} everywhere")
        others = {_normalised(row, e, o.message, set()) for e, o in at.items() if o.message and e != "cli"}
        norm = {e: _normalised(row, e, o.message, others) for e, o in at.items() if o.verdict == "refused"}
        if len(set(norm.values())) > 1:
            problems.append("messages differ")
        for e, o in at.items():
            allowed = {row.field, *row.spelled[e]}
            if o.has_param and o.verdict == "refused" and o.param not in allowed:
                problems.append(f"{e}'s param is {o.param!r}, not the field")
        if problems:
            lines = [f"{row.field} / {case}: {'; '.join(problems)}"]
            for e in ENTRANCES:
                if e not in at:
                    lines.append(f"    {e:16} NA (no way to say it)")
                    continue
                o = at[e]
                sent = " ".join(map(str, o.sent)) if e == "cli" else json.dumps(o.sent)
                said = f" {o.message!r}" if o.message else ""
                param = f" param={o.param!r}" if o.has_param and o.verdict != "accepted" else ""
                lines.append(f"    {e:16} {sent:40} -> {o.verdict}{said}{param}")
            found.append("\n".join(lines))
    return found


@pytest.mark.parametrize("row", ROWS, ids=[r.field for r in ROWS])
def test_one_field_one_verdict_one_message_at_every_entrance(row: Row, outcomes):
    found = _disagreements(row, outcomes)
    if found:   # (every disagreement of the row at once, without the traceback's reprs)
        note = f" ({row.note})" if row.note else ""
        pytest.fail(f"{len(found)} disagreement(s) for {row.field}{note}:\n" + "\n".join(found), pytrace=False)


def test_the_table_has_a_row_per_request_field():
    """Every field of the brief's list has its row, every row its four cases (None: no such case)."""
    fields = ["temperature", "top_p", "top_k", "min_p", "seed", "repeat_penalty", "presence_penalty",
              "frequency_penalty", "max_tokens", "stop", "json_schema", "grammar", "logit_bias", "logprobs",
              "ignore_eos"]
    assert [r.field for r in ROWS] == fields
    for r in ROWS:
        assert {"valid", "out of range", "wrong type", "absent"} <= set(r.cases), r.field
        assert set(r.spelled) == set(ENTRANCES), r.field
