"""Issue 34's storm: while a greedy stream runs on `serve --parallel 2` (SmolLM2 Q4_1), every
hostile structured-output body gets a 4xx naming its field or a bounded 200 within 10 s, /health
answers within 2 s throughout, a normal request completes, the stream ends with the text it gives
alone, and the server process is still up."""

from __future__ import annotations

import itertools
import json
import threading
import time

import pytest

from test_serve import Server, http

pytestmark = [pytest.mark.real, pytest.mark.slow]

ANSWER_S, HEALTH_S = 10.0, 2.0
LETTERS = [chr(c) for c in range(0xE0, 0x100)]
MSGS = [{"role": "user", "content": "Pick a colour."}]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def _schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": schema}}


def _colliding(n: int) -> dict:
    names = ["a" + "".join(t) for t in itertools.islice(itertools.product(LETTERS, repeat=4), n)]
    return {"type": "object", "properties": {k: {"type": "string"} for k in names}, "required": names}


# name -> (body, the field a 400 names, what a 200's content must be: None = a 400 is required)
HOSTILE = {
    "maxLength 100000": ({"messages": MSGS, "max_tokens": 12,
                          "response_format": _schema_format({"type": "string", "maxLength": 100_000})},
                         "response_format", lambda c: isinstance(c, str) and c.startswith('"')),
    "GBNF 60000 deep": ({"messages": MSGS, "max_tokens": 8,
                         "grammar": "root ::= " + "(" * 60_000 + '"a"' + ")" * 60_000}, "grammar", None),
    "50000 colliding properties": ({"messages": MSGS, "max_tokens": 8,
                                    "response_format": _schema_format(_colliding(50_000))}, "response_format", None),
    "100000-value enum": ({"messages": MSGS, "max_tokens": 8,
                           "json_schema": {"enum": [f"v{i}" for i in range(100_000)]}}, "json_schema", None),
    "type-list enum": ({"messages": MSGS, "max_tokens": 12, "response_format": _schema_format(
        {"type": ["string", "null"], "enum": ["red", "green", None]})},
        "response_format", lambda c: json.loads(c) in ("red", "green", None)),
    "tool_choice.function a string": ({"messages": MSGS, "max_tokens": 8, "tools": [TOOL],
                                       "tool_choice": {"type": "function", "function": "get_weather"}},
                                      "tool_choice", None),
    "a property that is not a schema": ({"messages": MSGS, "max_tokens": 8, "tools": [
        {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": "string"}}}}]}, "tools[0].function.parameters", None),
    "a repetition past the bounds": ({"prompt": "hi", "max_tokens": 8, "grammar": 'root ::= "a"{0,1000000}'},
                                     "grammar", None),
}
STREAM = {"messages": [{"role": "user", "content": "Write the numbers from one to thirty in words, one per line."}],
          "max_tokens": 160, "temperature": 0, "stream": True}


@pytest.fixture(scope="module")
def server(smollm2_q4, tmp_path_factory):
    s = Server(smollm2_q4, "--parallel", "2", tmp=tmp_path_factory.mktemp("serve-storm"))
    yield s
    assert s.stop() == 0, s.log.read_text()


def _stream_text(server) -> str:
    client = server.client(timeout=300)
    body = {k: v for k, v in STREAM.items() if k != "stream"}
    out = []
    for chunk in client.chat.completions.create(model="m", stream=True, **body):
        if chunk.choices and chunk.choices[0].delta.content:
            out.append(chunk.choices[0].delta.content)
    return "".join(out)


class _HealthWatch(threading.Thread):
    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.stop, self.worst, self.failures = url, threading.Event(), 0.0, []

    def run(self) -> None:
        while not self.stop.is_set():
            t = time.monotonic()
            try:
                status = http("GET", self.url + "/health", timeout=HEALTH_S * 3).status_code
                if status != 200:
                    self.failures.append(status)
            except OSError as e:
                self.failures.append(repr(e))
            self.worst = max(self.worst, time.monotonic() - t)
            time.sleep(0.1)


def test_hostile_bodies_during_a_stream(server):
    alone = _stream_text(server)
    assert len(alone) > 40, alone
    streamed: list[str] = []
    runner = threading.Thread(target=lambda: streamed.append(_stream_text(server)), daemon=True)
    watch = _HealthWatch(server.url)
    watch.start()
    runner.start()
    time.sleep(0.5)   # the stream is under way
    answers = {}
    try:
        for name, (body, field, check) in HOSTILE.items():
            path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
            t = time.monotonic()
            r = http("POST", server.url + path, json_body=body, timeout=ANSWER_S * 3)
            took = time.monotonic() - t
            answers[name] = (r.status_code, took)
            assert took < ANSWER_S, (name, took)
            if r.status_code == 200:
                assert check is not None, (name, r.text[:300])
                reply = r.json()["choices"][0]
                content = reply["message"]["content"] if "message" in reply else reply["text"]
                assert check(content), (name, content)
            else:
                assert 400 <= r.status_code < 500, (name, r.status_code, r.text[:300])
                error = r.json()["error"]
                assert error["param"] == field or error["param"].startswith(field), (name, error)
                assert error["message"].startswith(field.split(".")[0]), (name, error)
            assert server.proc.poll() is None, (name, server.log.read_text()[-3000:])
        normal = http("POST", server.url + "/v1/chat/completions", timeout=ANSWER_S * 6,
                      json_body={"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8})
        assert normal.status_code == 200, normal.text
        runner.join(300)
        assert not runner.is_alive()
    finally:
        watch.stop.set()
        watch.join(10)
    print("storm answers (status, seconds):", answers, f"worst /health {watch.worst:.3f}s")
    assert streamed == [alone]
    assert watch.failures == [] and watch.worst < HEALTH_S, (watch.failures, watch.worst, answers)
    assert server.proc.poll() is None
    health = http("GET", server.url + "/health", timeout=HEALTH_S)
    assert health.status_code == 200
