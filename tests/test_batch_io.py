"""The pure I/O layer of `llamaspec batch`: input forms, per-line failures, output records in both
forms, kill-safe appends with resume, and the job-settings manifest. No model needed."""

from __future__ import annotations

import doctest
import io
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from llamaspec.batch import (
    LineError,
    OutputFile,
    Request,
    check_or_write_manifest,
    error_record,
    manifest_path,
    parse_requests,
    read_input,
    result_record,
)
from llamaspec.errors import InputError, UsageError


def one(line: str) -> Request | LineError:
    (item,) = parse_requests([line])
    return item


def oa(body: dict, url: str = "/v1/chat/completions", **extra) -> str:
    return json.dumps({"custom_id": "c1", "method": "POST", "url": url, "body": body, **extra})


def test_worked_examples_in_docstrings_hold():
    from llamaspec.batch import guard, manifest, requests, results

    for mod in (requests, results, manifest, guard):
        r = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
        assert r.failed == 0 and r.attempted > 0


# ---- input forms --------------------------------------------------------------------------------


def test_own_prompt_form_with_every_field():
    r = one('{"id": "q1", "prompt": "Hi", "max_tokens": 8, "temperature": 0.7, "seed": 42, '
            '"stop": ["\\n", "END"], "top_p": 0.9, "category": "extra keys are ignored"}')
    assert (r.id, r.line, r.openai) == ("q1", 1, None)
    assert {k: v for k, v in r.fields.items() if v is not None} == dict(
        prompt="Hi", max_tokens=8, temperature=0.7, seed=42, stop=["\n", "END"], top_p=0.9)
    assert "chat" in r.fields and r.fields["chat"] is None   # a text prompt: the job's --chat/--raw
    f = one('{"prompt": "x", "top_k": 5, "min_p": 0, "repeat_penalty": 1.1}').fields
    assert (f["top_k"], f["min_p"], f["repeat_penalty"]) == (5, 0.0, 1.1)


def test_own_messages_form_and_defaults():
    r = one('{"id": 3, "messages": [{"role": "system", "content": "Be brief."}, '
            '{"role": "user", "content": "Hi", "name": "ann"}], "stop": "."}')
    f = r.fields
    assert r.id == "3" and r.openai is None
    assert f["prompt"] == [{"role": "system", "content": "Be brief."},
                           {"role": "user", "content": "Hi"}]
    assert f["stop"] == ["."]
    assert (f["max_tokens"], f["temperature"], f["seed"], f["top_p"]) == (None, None, None, None)
    assert one('{"prompt": "x", "temperature": 0, "stop": null}').fields["temperature"] == 0.0
    assert one('{"prompt": "x", "stop": null}').fields["stop"] is None   # the job's --stop


def test_openai_chat_form_body_fields():
    r = one(oa({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "What is 2+2?"}],
                "max_tokens": 16, "temperature": 0.5, "top_p": 1, "seed": 7, "stop": "\n"}))
    assert (r.id, r.openai) == ("c1", "chat")
    assert {k: v for k, v in r.fields.items() if v is not None} == dict(
        prompt=[{"role": "user", "content": "What is 2+2?"}], max_tokens=16, temperature=0.5, seed=7, stop=["\n"],
        top_p=1.0)


def test_openai_completions_form_and_max_completion_tokens():
    r = one(oa({"model": "x", "prompt": "Once", "max_completion_tokens": 5}, url="/v1/completions"))
    assert (r.fields["prompt"], r.fields["chat"], r.fields["max_tokens"], r.openai) == ("Once", False, 5, "completions")
    r = one(oa({"messages": [{"role": "user", "content": "a"}], "max_tokens": 9,
                "max_completion_tokens": 7}))
    assert r.fields["max_tokens"] == 7   # as the server: max_completion_tokens wins


def test_form_is_told_by_custom_id_or_body_only():
    r = one('{"id": 1, "prompt": "Sum up", "url": "https://example.com/a", "method": "GET"}')
    assert isinstance(r, Request) and r.openai is None  # a dataset's own fields
    r = one(json.dumps({"url": "/v1/completions", "body": {"prompt": "p"}}))
    assert (r.id, r.openai) == ("line-1", "completions")


def test_openai_text_content_parts_are_joined():
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    msgs = [{"role": "user", "content": parts}]
    assert one(oa({"messages": msgs})).fields["prompt"] == [{"role": "user", "content": "a\nb"}]


def test_ids_derived_from_line_numbers_and_stringified():
    items = parse_requests(['{"prompt": "a"}', "", "   \r", '{"id": 5, "prompt": "b"}',
                            '{"prompt": "c"}\n', oa({"messages": [{"role": "user", "content": "x"}]},
                                                    custom_id=None),
                            json.dumps({"custom_id": 12, "url": "/v1/completions",
                                        "body": {"prompt": "p"}})])
    assert [(i.id, i.line) for i in items] == [("line-1", 1), ("5", 4), ("line-5", 5),
                                               ("line-6", 6), ("12", 7)]
    assert all(isinstance(i, Request) for i in items)


def test_duplicate_ids_name_both_lines():
    with pytest.raises(InputError) as e:
        parse_requests(['{"id": "a", "prompt": "x"}', '{"prompt": "y"}',
                        '{"id": "a", "prompt": "z"}'])
    assert e.value.message == 'duplicate id "a" on lines 1 and 3'
    with pytest.raises(InputError, match="lines 2 and 3"):  # an int id and its string are one id
        parse_requests(["", '{"id": 1, "prompt": "x"}', '{"id": "1", "prompt": "y"}'])
    with pytest.raises(InputError, match="lines 1 and 2"):  # a given id can hit a derived one
        parse_requests(['{"prompt": "x"}', '{"id": "line-1", "prompt": "y"}'])
    with pytest.raises(InputError, match="lines 1 and 2"):  # malformed lines keep their ids too
        parse_requests(['{"custom_id": "k", "url": "/v1/embeddings"}', oa({}, custom_id="k")])


MALFORMED = [
    ('{"prompt": "x"', "invalid JSON"),
    ('{"prompt": "x", "temperature": NaN}', "NaN is not valid JSON"),
    ('["prompt", "x"]', "must be a JSON object, got array"),
    ("42", "must be a JSON object, got number"),
    ('{"id": "a"}', 'no "prompt" or "messages"'),
    ('{"prompt": "x", "messages": []}', "not both"),
    ('{"prompt": ["x", "y"]}', "prompt: one prompt per request"),
    ('{"prompt": "x", "max_tokens": "8"}', "max_tokens must be an integer, got string"),
    ('{"prompt": "x", "max_tokens": -2}', "max_tokens must be >= -1, got -2"),
    ('{"prompt": "x", "max_tokens": true}', "max_tokens must be an integer, got boolean"),
    ('{"prompt": "x", "temperature": -1}', "temperature must be >= 0, got -1"),
    ('{"prompt": "x", "temperature": "hot"}', "temperature must be a number, got string"),
    ('{"prompt": "x", "seed": 1.5}', "seed must be an integer, got number"),
    ('{"prompt": "x", "stop": 3}', "stop must be"),
    ('{"prompt": "x", "stop": ["a", 1]}', "stop must be"),
    ('{"prompt": "x", "top_p": 0}', "top_p must be in (0, 1]"),
    ('{"prompt": "x", "top_p": 1.5}', "top_p must be in (0, 1]"),
    ('{"id": [1], "prompt": "x"}', "id must be a non-empty string or an integer, got array"),
    ('{"messages": "hi"}', "messages must be a non-empty array"),
    ('{"messages": []}', "messages must be a non-empty array"),
    ('{"messages": ["hi"]}', "messages[0] must be an object, got string"),
    ('{"messages": [{"content": "hi"}]}', "messages[0].role must be one of"),
    ('{"messages": [{"role": "user", "content": 1}]}', "messages[0].content must be a string"),
    ('{"messages": [{"role": "user"}]}', "messages[0].content must be a string or an array of text parts, got null"),
    ('{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}',
     "only text content parts"),
    (oa({"input": "x"}, url="/v1/responses"), 'unsupported url "/v1/responses"'),
    (oa({"prompt": "x"}, url=None), "unsupported url null"),
    (oa({"prompt": "x"}, url=["/v1/completions"]), 'unsupported url ["/v1/completions"]'),
    (oa({"messages": [{"role": "user", "content": "x"}]}, method="GET"),
     'method must be POST, got "GET"'),
    (json.dumps({"custom_id": "c1", "url": "/v1/completions", "body": "x"}),
     "body must be an object"),
    ('{"custom_id": "c1", "url": "/v1/completions"}', "body must be an object, got null"),
    (oa({"prompt": "x"}), "body has no messages (url /v1/chat/completions)"),
    (oa({"messages": [{"role": "user", "content": "x"}]}, url="/v1/completions"),
     "body has no prompt (url /v1/completions)"),
    (oa({"messages": [{"role": "user", "content": "x"}], "temperature": None, "top_p": -0.5}),
     "top_p must be in"),
    ('{"prompt": "x", "top_k": 1.5}', "top_k must be an integer, got number"),
    ('{"prompt": "x", "min_p": 2}', "min_p must be in [0, 1]"),
    ('{"prompt": "x", "repeat_penalty": 0}', "repeat_penalty must be > 0"),
    (oa({"messages": [{"role": "user", "content": "x"}], "temperature": -1}), "temperature must be >= 0, got -1"),
]

# body fields asking for what the engine cannot give: a 400 record naming the field, never dropped
UNSUPPORTED_BODIES = [("n", 2), ("guided_regex", "[a-z]+"),
                      ("functions", [{"name": "f"}]), ("function_call", "auto"), ("best_of", 2), ("echo", True),
                      ("suffix", "end"), ("stream", True)]


@pytest.mark.parametrize("key, value", UNSUPPORTED_BODIES)
def test_unsupported_body_fields_fail_their_line_naming_the_field(key, value):
    url = "/v1/completions" if key in ("best_of", "echo", "suffix") else "/v1/chat/completions"
    body = {"messages": [{"role": "user", "content": "x"}]} if url.endswith("chat/completions") else {"prompt": "x"}
    err = one(oa({**body, key: value}, url=url))
    assert isinstance(err, LineError) and err.param == key and err.message.startswith(f"{key} is not supported")
    rec = error_record(err, err.message)
    assert rec["response"]["status_code"] == 400
    assert rec["response"]["body"]["error"]["param"] == key and rec["error"] is None


def test_values_that_ask_for_nothing_special_are_accepted():
    body = {"messages": [{"role": "user", "content": "x"}], "n": 1, "logprobs": False, "stream": False,
            "response_format": {"type": "text"}, "tools": [], "presence_penalty": 0, "logit_bias": {},
            "top_k": 20, "min_p": 0.1, "repeat_penalty": 1.2, "user": "u1", "metadata": {"a": "b"}}
    r = one(oa(body))
    assert isinstance(r, Request) and (r.fields["top_k"], r.fields["min_p"], r.fields["repeat_penalty"]) == (20, 0.1, 1.2)
    # llamaspec's own form keeps ignoring unknown keys (a dataset's own "n" or "tools" column)
    assert isinstance(one('{"prompt": "x", "n": 5, "tools": "hammer"}'), Request)


@pytest.mark.parametrize("line, expected", MALFORMED)
def test_each_malformed_kind_is_a_line_error_with_its_line_number(line, expected):
    good = '{"prompt": "ok"}'
    items = parse_requests([good, "", line, good.replace("{", '{"id": "last", ')])
    err = items[1]
    assert isinstance(err, LineError), err
    assert err.line == 3 and expected in err.message and "\n" not in err.message
    assert isinstance(items[0], Request) and isinstance(items[2], Request)  # the job goes on
    rec = error_record(err, err.message)
    if err.openai is None:
        assert rec["error"] == {"message": err.message, "line": 3}
    elif "must" in expected and expected.split()[0] not in ("method", "body"):  # a bad value names its field
        assert rec["response"]["body"]["error"]["param"] == expected.split()[0]
    else:
        assert rec["response"]["body"]["error"]["message"] == f"line 3: {err.message}"


def test_line_error_keeps_a_readable_id_and_the_file_form():
    items = parse_requests([oa({"messages": [{"role": "user", "content": "x"}]}, custom_id="ok"),
                            "not json", oa({"prompt": "x"}, custom_id="bad-body", url="/v1/nope")])
    assert items[1] == LineError("line-2", 2, items[1].message, "chat")  # an OpenAI file's form
    assert (items[2].id, items[2].openai) == ("bad-body", "chat")
    own = parse_requests(['{"prompt": "a"}', "[1"])
    assert own[1].openai is None and own[1].id == "line-2"
    assert one('{"id": {"x": 1}, "prompt": "p"}').id == "line-1"  # unreadable id: derived


# ---- output records ---------------------------------------------------------------------------


STATS = {"n_prompt": 12, "n_generated": 5, "acceptance": 0.8, "spec_type": "draft"}


def test_own_result_and_error_records():
    req = one('{"id": "q", "prompt": "Hi"}')
    assert result_record(req, "Hello", "length", STATS, "m.gguf") == {
        "id": "q", "text": "Hello", "finish_reason": "length", **STATS}
    assert error_record(req, "prompt too long for the context (2100 > 2048 tokens)") == {
        "id": "q", "error": {"message": "prompt too long for the context (2100 > 2048 tokens)",
                             "line": 1}}


def _openai_envelope(rec: dict, custom_id: str, status: int) -> dict:
    json.dumps(rec, allow_nan=False)  # plain JSON
    assert set(rec) == {"id", "custom_id", "response", "error"}
    assert rec["id"].startswith("batch_req_") and rec["custom_id"] == custom_id
    assert rec["error"] is None
    resp = rec["response"]
    assert resp["status_code"] == status and isinstance(resp["request_id"], str)
    assert resp["request_id"]
    return resp["body"]


def test_openai_chat_result_record():
    req = one(oa({"model": "gpt-4o", "messages": [{"role": "user", "content": "2+2?"}]},
                 custom_id="r-1"))
    body = _openai_envelope(result_record(req, "4", "stop", STATS, "smollm2.gguf"), "r-1", 200)
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["model"] == "smollm2.gguf" and abs(body["created"] - time.time()) < 60
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "4"},
                                "logprobs": None, "finish_reason": "stop"}]
    assert body["usage"] == {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}


def test_openai_completions_result_record():
    req = one(oa({"prompt": "Once"}, url="/v1/completions", custom_id="r-2"))
    body = _openai_envelope(result_record(req, " upon", "length", STATS, "m"), "r-2", 200)
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"] == [{"index": 0, "text": " upon", "logprobs": None,
                                "finish_reason": "length"}]
    assert body["usage"] == {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}


def test_openai_error_records():
    req = one(oa({"messages": [{"role": "user", "content": "x"}]}, custom_id="r-3"))
    rec = error_record(req, "prompt too long for the context", code="context_length_exceeded")
    assert _openai_envelope(rec, "r-3", 400) == {"error": {
        "message": "line 1: prompt too long for the context", "type": "invalid_request_error",
        "param": None, "code": "context_length_exceeded"}}
    rec = error_record(req, "llama_decode failed", status=500)
    assert _openai_envelope(rec, "r-3", 500)["error"]["type"] == "server_error"
    bad = parse_requests([oa({"messages": [{"role": "user", "content": "x"}]}), "{"])[1]
    assert _openai_envelope(error_record(bad, bad.message), "line-2", 400)["error"]["code"] is None
    ids = {error_record(req, "x")["id"] for _ in range(5)}
    assert len(ids) == 5  # batch_req ids are unique


# ---- reading INPUT ----------------------------------------------------------------------------


def test_read_input_file_and_stdin(tmp_path):
    p = tmp_path / "in.jsonl"
    # a BOM, CRLF ends, a U+2028 inside a string (one line, not two)
    p.write_bytes(b'\xef\xbb\xbf{"prompt": "a\xe2\x80\xa8b"}\r\n\r\n{"id": 2, "prompt": "c"}\r\n')
    lines = read_input(str(p))
    items = parse_requests(lines)
    assert [(i.id, i.line, i.fields["prompt"]) for i in items] == [("line-1", 1, "a\u2028b"), ("2", 3, "c")]
    assert read_input("-", stdin=io.BytesIO(b'{"prompt": "x"}\n')) == [b'{"prompt": "x"}', b""]


def test_read_input_errors(tmp_path):
    with pytest.raises(InputError, match="input file not found: .*nope.jsonl") as e:
        read_input(str(tmp_path / "nope.jsonl"))
    assert e.value.hint
    with pytest.raises(InputError, match="input is a directory"):
        read_input(str(tmp_path))


def test_a_line_that_is_not_utf8_fails_alone(tmp_path):
    """One bad byte used to abort the whole job (the file was decoded at once): now that line is a
    failed record naming its line and byte, and the lines around it run."""
    p = tmp_path / "latin1.jsonl"
    p.write_bytes(b'{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": "caf\xe9"}\n{"id": "c", "prompt": "y"}\n')
    items = parse_requests(read_input(str(p)))
    assert [type(i).__name__ for i in items] == ["Request", "LineError", "Request"]
    assert items[1].line == 2 and items[1].id == "b"   # its id still read, to name its record
    assert items[1].message.startswith("not UTF-8: byte 0xe9 at column 27")
    (bad,) = parse_requests(read_input("-", stdin=io.BytesIO(b"\xff")))
    assert isinstance(bad, LineError) and "byte 0xff" in bad.message and bad.id == "line-1"
    (bad,) = parse_requests([oa({"prompt": "x"}, url="/v1/completions", custom_id="k").encode()[:-3] + b'\xe9"}}'])
    assert (bad.id, bad.openai) == ("k", "completions")


# ---- OUTPUT and resume ------------------------------------------------------------------------


def _ids_in(path) -> list[str]:
    return [json.loads(line)["id"] for line in path.read_text("utf-8").splitlines()]


def test_resume_cuts_a_partial_last_line(tmp_path):
    path = tmp_path / "out.jsonl"
    out = OutputFile(path)
    assert out.done_ids() == set()
    for i in range(3):
        out.append({"id": f"r{i}", "text": f"t{i}", "finish_reason": "stop"})
    out.close()
    complete = path.read_bytes()
    with open(path, "ab") as f:
        f.write(b'{"id": "r3", "text": "half')  # a kill mid-write
    out = OutputFile(path)
    assert out.done_ids() == {"r0", "r1", "r2"}
    assert path.read_bytes() == complete
    out.append({"id": "r3", "text": "t3"})
    assert _ids_in(path) == ["r0", "r1", "r2", "r3"]


@pytest.mark.parametrize("tail", [b'{"id": "r2", "te\n', b"\x00" * 40, b'{"id": "r2"}'])
def test_an_invalid_or_unterminated_last_line_is_cut(tmp_path, tail):
    path = tmp_path / "out.jsonl"
    path.write_bytes(b'{"id": "r0"}\n{"id": "r1"}\n' + tail)
    assert OutputFile(path).done_ids() == {"r0", "r1"}
    assert path.read_bytes() == b'{"id": "r0"}\n{"id": "r1"}\n'


def test_append_repairs_before_writing_even_without_done_ids(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_bytes(b'{"id": "r0"}\n{"id": "r1", "te')
    with OutputFile(path) as out:
        out.append({"id": "r1", "x": float("nan"), "y": [float("inf")]})
    assert path.read_bytes() == b'{"id": "r0"}\n{"id": "r1", "x": null, "y": [null]}\n'


def test_a_broken_line_before_the_last_is_refused(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_bytes(b'{"id": "r0"}\n{"id": "r1", oops\n{"id": "r2"}\n')
    with pytest.raises(InputError, match="line 2 is not a complete JSON record"):
        OutputFile(path).done_ids()
    path.write_bytes(b'{"id": "r0"}\n{"name": "not ours"}\n')
    with pytest.raises(InputError, match="line 2 is not a llamaspec batch record"):
        OutputFile(path).done_ids()


def test_failed_records_are_done_unless_retrying(tmp_path):
    path = tmp_path / "out.jsonl"
    ok = one(oa({"messages": [{"role": "user", "content": "x"}]}, custom_id="ok"))
    bad = one(oa({"messages": [{"role": "user", "content": "x"}]}, custom_id="bad"))
    own_bad = one('{"id": "own-bad", "prompt": "x"}')
    with OutputFile(path) as out:
        out.append(result_record(ok, "fine", "stop", STATS, "m"))
        out.append(error_record(bad, "prompt too long for the context"))
        out.append(error_record(own_bad, "prompt too long for the context"))
        out.append({"id": "own-ok", "text": "t", "finish_reason": "stop"})
    assert OutputFile(path).done_ids() == {"ok", "bad", "own-bad", "own-ok"}
    assert len(path.read_text().splitlines()) == 4
    os.chmod(path, 0o640)
    out = OutputFile(path)
    assert out.done_ids(include_failed=False) == {"ok", "own-ok"}
    assert os.stat(path).st_mode & 0o777 == 0o640  # the rewrite keeps the file's mode
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [r.get("custom_id", r.get("id")) for r in lines] == ["ok", "own-ok"]
    out.append(result_record(bad, "now fits", "stop", STATS, "m"))  # the handle follows the rewrite
    out.close()
    assert OutputFile(path).done_ids(include_failed=False) == {"ok", "own-ok", "bad"}


CHILD = r"""
import os, sys, time
from llamaspec.batch import OutputFile
path, n, chunk = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if chunk:  # a slow device: short writes, so that a kill often lands inside a record
    real_write = os.write
    def short_write(fd, data):
        time.sleep(0.002)
        return real_write(fd, data[:chunk])
    os.write = short_write
out = OutputFile(path)
done = out.done_ids()
print(len(done), flush=True)
for i in range(n):
    if f"r{i}" not in done:
        text = "x" * (20000 + i * 7919 % 80000)
        out.append({"id": f"r{i}", "text": text, "finish_reason": "stop"})
print("finished", flush=True)
"""


def test_sigkill_at_random_moments_leaves_a_clean_prefix(tmp_path):
    """Kill a writer at random moments again and again, resuming each time: OUTPUT is always a
    prefix r0..rk of whole records, no id twice, every line parses. Every other writer makes short
    writes (a slow device), which also exercises append's short-write loop and makes kills inside
    a record likely; the others write at full speed."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    path = tmp_path / "out.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    previous, mid_record = 0, {0: 0, 4096: 0}
    for cycle in range(12):
        chunk = 4096 if cycle % 2 else 0
        where = f"seed {seed}, cycle {cycle}"
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(10**9), str(chunk)],
                                 stdout=subprocess.PIPE, text=True, env=env)
        assert int(child.stdout.readline()) == previous, where  # resumed after the last record
        time.sleep(rng.uniform(0, 0.06))
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        body, _, tail = path.read_bytes().rpartition(b"\n")
        mid_record[chunk] += bool(tail)
        ids = [json.loads(line)["id"] for line in body.split(b"\n") if line] if body else []
        done = OutputFile(path).done_ids()
        assert path.read_bytes() == (body + b"\n" if body else b""), where  # the tail is cut
        assert ids == [f"r{i}" for i in range(len(ids))] and len(ids) >= previous, where
        assert done == set(ids), where
        previous = len(ids)
    assert mid_record[4096] >= 1, f"seed {seed}: no kill landed inside a record"
    # and a run left alone finishes the job without redoing anything
    n = previous + 3
    res = subprocess.run([sys.executable, "-c", CHILD, str(path), str(n), "0"],
                         capture_output=True, text=True, env=env, check=True)
    assert res.stdout.split() == [str(previous), "finished"]
    assert _ids_in(path) == [f"r{i}" for i in range(n)]
    print(f"seed {seed}: {previous} records over 12 kills, inside a record: {mid_record}")


# ---- the job-settings manifest ----------------------------------------------------------------


SETTINGS = {"model": {"path": "m.gguf", "sha256": "ab12"}, "draft": None, "spec_types": ["draft"],
            "temperature": 0.0, "max_tokens": 256}


def test_manifest_written_then_unchanged(tmp_path):
    out = tmp_path / "out.jsonl"
    assert check_or_write_manifest(out, SETTINGS) == "written"
    doc = json.loads(open(manifest_path(out)).read())
    assert doc["settings"] == SETTINGS and manifest_path(out) == str(out) + ".llamaspec.json"
    assert os.stat(manifest_path(out)).st_mode & 0o777 == 0o644
    out.write_text('{"id": "r0"}\n')
    assert check_or_write_manifest(out, dict(SETTINGS, spec_types=("draft",))) == "unchanged"
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]  # no temp file left


def test_manifest_different_settings_refused_naming_the_key(tmp_path):
    out = tmp_path / "out.jsonl"
    check_or_write_manifest(out, SETTINGS)
    out.write_text('{"id": "r0"}\n')
    with pytest.raises(UsageError) as e:
        check_or_write_manifest(out, dict(SETTINGS, temperature=0.7, max_tokens=8))
    assert e.value.message == f"{out} was started with other settings: temperature was 0.0, now 0.7"
    assert e.value.hint == "--force to continue with the new settings, or a new -o"
    with pytest.raises(UsageError, match='model.sha256 was "ab12", now "cd34"'):
        check_or_write_manifest(out, dict(SETTINGS, model={"path": "m.gguf", "sha256": "cd34"}))
    with pytest.raises(UsageError, match=r"seed was \(absent\), now 1"):
        check_or_write_manifest(out, dict(SETTINGS, seed=1))
    assert json.loads(open(manifest_path(out)).read())["settings"] == SETTINGS  # untouched


def test_manifest_force_overwrites(tmp_path):
    out = tmp_path / "out.jsonl"
    check_or_write_manifest(out, SETTINGS)
    out.write_text('{"id": "r0"}\n')
    new = dict(SETTINGS, temperature=0.7)
    assert check_or_write_manifest(out, new, force=True) == "overwritten"
    assert json.loads(open(manifest_path(out)).read())["settings"] == new
    assert check_or_write_manifest(out, new) == "unchanged"


def test_output_without_manifest(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": "r0"}\n')
    with pytest.raises(UsageError, match="exists without out.jsonl.llamaspec.json") as e:
        check_or_write_manifest(out, SETTINGS)
    assert "--force" in e.value.hint
    assert check_or_write_manifest(out, SETTINGS, force=True) == "overwritten"
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert check_or_write_manifest(empty, SETTINGS) == "written"  # nothing in it to mix with


def test_manifest_stale_corrupt_and_directory(tmp_path):
    out = tmp_path / "out.jsonl"
    with open(manifest_path(out), "w") as f:
        f.write('{"settings": {"temperature": 1.0}}')
    assert check_or_write_manifest(out, SETTINGS) == "written"  # OUTPUT gone: nothing to protect
    out.write_text('{"id": "r0"}\n')
    with open(manifest_path(out), "w") as f:
        f.write("{not json")
    with pytest.raises(UsageError, match="is unreadable"):
        check_or_write_manifest(out, SETTINGS)
    assert check_or_write_manifest(out, SETTINGS, force=True) == "overwritten"
    with pytest.raises(UsageError, match="is a directory"):
        check_or_write_manifest(tmp_path, SETTINGS)


# ---- INPUT's identity in the manifest ---------------------------------------------------------


def _ident(path, text: bytes) -> dict:
    from llamaspec.batch import input_identity

    lines = text.split(b"\n")
    return input_identity(str(path), lines, parse_requests(lines))


def test_manifest_refuses_another_input_file_unless_forced(tmp_path):
    out = tmp_path / "out.jsonl"
    a = _ident(tmp_path / "a.jsonl", b'{"id": "q1", "prompt": "x"}\n')
    check_or_write_manifest(out, SETTINGS, input=a)
    out.write_text('{"id": "q1", "text": "t"}\n')
    b = _ident(tmp_path / "b.jsonl", b'{"id": "z", "prompt": "other"}\n')
    with pytest.raises(UsageError) as e:
        check_or_write_manifest(out, SETTINGS, input=b, recorded={"q1"})
    assert e.value.message == f"{out} was started with input {tmp_path / 'a.jsonl'}, now {tmp_path / 'b.jsonl'}"
    assert "--force" in e.value.hint
    moved = _ident(tmp_path / "moved.jsonl", b'{"id": "q1", "prompt": "x"}\n')   # same bytes elsewhere: fine
    assert check_or_write_manifest(out, SETTINGS, input=moved, recorded={"q1"}) == "unchanged"
    assert check_or_write_manifest(out, SETTINGS, input=b, recorded={"q1"}, force=True) == "overwritten"
    assert json.loads(open(manifest_path(out)).read())["input"]["lines"] == {"z": b["lines"]["z"]}


def test_manifest_edited_request_under_a_recorded_id_is_refused(tmp_path):
    out, src = tmp_path / "out.jsonl", tmp_path / "in.jsonl"
    first = b'{"id": "q1", "prompt": "x"}\n{"id": "q2", "prompt": "y"}\n'
    check_or_write_manifest(out, SETTINGS, input=_ident(src, first))
    out.write_text('{"id": "q1", "text": "t"}\n')
    # q2 (not yet in OUTPUT) edited and q3 added: nothing recorded is affected, the job goes on
    grown = b'{"id": "q1", "prompt": "x"}\n{"id": "q2", "prompt": "Y!"}\n{"id": "q3", "prompt": "z"}\n'
    assert check_or_write_manifest(out, SETTINGS, input=_ident(src, grown), recorded={"q1"}) == "unchanged"
    edited = b'{"id": "q3", "prompt": "z"}\n{"id": "q1", "prompt": "x, edited"}\n'
    with pytest.raises(UsageError) as e:
        check_or_write_manifest(out, SETTINGS, input=_ident(src, edited), recorded={"q1"},
                                lines_of={"q3": 1, "q1": 2})
    assert e.value.message == f'{out} has a record for id "q1", whose request (input line 2) changed since'
    gone = b'{"id": "q2", "prompt": "Y!"}\n'
    with pytest.raises(UsageError, match='id "q1", which is no longer in the input'):
        check_or_write_manifest(out, SETTINGS, input=_ident("-", gone), recorded={"q1"})
    assert check_or_write_manifest(out, SETTINGS, input=_ident(src, edited), recorded={"q1"},
                                   force=True) == "overwritten"
    # the manifest now describes the edited input: the same command resumes without --force
    assert check_or_write_manifest(out, SETTINGS, input=_ident(src, edited), recorded={"q1"}) == "unchanged"


def test_manifest_effective_settings_are_information_only(tmp_path):
    out = tmp_path / "out.jsonl"
    check_or_write_manifest(out, SETTINGS, effective={"spec_type": "ngram-mod", "tuned": {"draft_max": 7}})
    out.write_text('{"id": "r0"}\n')
    assert check_or_write_manifest(out, SETTINGS, effective={"spec_type": "draft-simple", "tuned": None}) == "unchanged"
    assert json.loads(open(manifest_path(out)).read())["effective"]["spec_type"] == "draft-simple"
    doc = json.loads(open(manifest_path(out)).read())
    with open(manifest_path(out), "w") as f:   # a job started by an older llamaspec (format /1)
        json.dump({**doc, "format": "llamaspec-batch/1"}, f)
    with pytest.raises(UsageError, match="started by an older llamaspec"):
        check_or_write_manifest(out, SETTINGS)


# ---- openai finish reasons and --ordered ------------------------------------------------------


def test_context_finish_is_length_in_openai_form_only():
    chat = one(oa({"messages": [{"role": "user", "content": "x"}]}))
    body = result_record(chat, "t", "context", STATS, "m")["response"]["body"]
    assert body["choices"][0]["finish_reason"] == "length"
    own = one('{"id": "q", "prompt": "x"}')
    assert result_record(own, "t", "context", STATS, "m")["finish_reason"] == "context"


def test_in_order_writer_holds_results_until_their_predecessors_are_written():
    from llamaspec.batch import InOrder

    got = []
    w = InOrder(["a", "b", "c", "d"], got.append)
    w.put("c", "C")
    w.put("b", "B")
    assert got == [] and w.held == 2
    w.put("a", "A")
    assert got == ["A", "B", "C"] and w.held == 0
    w.put("d", "D")
    assert got == ["A", "B", "C", "D"]


# ---- OUTPUT checked before any model loads ----------------------------------------------------


def test_output_path_problems_name_the_directory(tmp_path, monkeypatch):
    from llamaspec.batch import check_output_path

    with pytest.raises(UsageError) as e:
        check_output_path(tmp_path / "no" / "such" / "out.jsonl")
    assert e.value.message == (f"cannot write -o {tmp_path / 'no/such/out.jsonl'}: directory "
                               f"{tmp_path / 'no/such'} does not exist")
    with pytest.raises(UsageError, match="cannot write -o /proc/x.jsonl: directory /proc: "):
        check_output_path("/proc/x.jsonl")   # root may write anywhere, but not there
    (tmp_path / "f").write_text("")
    with pytest.raises(UsageError, match=f"{tmp_path / 'f'} is not a directory"):
        check_output_path(tmp_path / "f" / "out.jsonl")
    with pytest.raises(UsageError, match="is a directory"):
        check_output_path(tmp_path)
    check_output_path(tmp_path / "out.jsonl")
    assert os.listdir(tmp_path) == ["f"]   # the probe leaves nothing behind
    import shutil

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=1000))
    with pytest.raises(UsageError, match=f"directory {tmp_path} has 1000 bytes free"):
        check_output_path(tmp_path / "out.jsonl")


def test_output_on_a_read_only_mount(tmp_path):
    """A real read-only file system (EROFS), where os.access would still say yes to root."""
    from llamaspec.batch import check_output_path

    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a read-only tmpfs here (not root, or no mount rights)")
    try:
        with pytest.raises(UsageError) as e:
            check_output_path(ro / "out.jsonl")
        assert e.value.message == f"cannot write -o {ro / 'out.jsonl'}: directory {ro}: read-only file system"
    finally:
        subprocess.run(["umount", str(ro)], check=True)


def test_lock_refuses_a_second_holder_naming_the_pid(tmp_path):
    from llamaspec.batch import OutputLock

    out = tmp_path / "out.jsonl"
    with OutputLock(out):
        with pytest.raises(UsageError) as e:
            OutputLock(out).acquire()   # another open file description: flock excludes it too
        assert e.value.message == (f"{out} is being written by another llamaspec batch "
                                   f"(pid {os.getpid()}; lock {out}.lock)")
    with OutputLock(out):   # released: free again
        pass


LOCKER = r"""
import sys, time
from llamaspec.batch import OutputLock
OutputLock(sys.argv[1]).acquire()
print("locked", flush=True)
time.sleep(600)
"""


def test_a_sigkilled_holder_leaves_no_lock_behind(tmp_path):
    """The kernel drops an flock with its process: the lock file stays, with a dead pid in it,
    and the next job takes it."""
    from llamaspec.batch import OutputLock

    out = tmp_path / "out.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen([sys.executable, "-c", LOCKER, str(out)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout.readline().strip() == "locked"
        with pytest.raises(UsageError, match=f"pid {child.pid}"):
            OutputLock(out).acquire()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    assert (tmp_path / "out.jsonl.lock").read_text() == str(child.pid)   # stale file, no lock
    with OutputLock(out) as lock:
        assert open(lock.path).read() == str(os.getpid())
