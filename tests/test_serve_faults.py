"""`llamaspec serve` under hostile requests and injected faults, on the real SmolLM2 in a subprocess
(started as tests/test_serve.py starts it).

- A storm of hostile requests fired while two greedy streams run: each gets a JSON 4xx (or a 200
  for the odd-but-valid ones), the streams give the text they give alone, the server ends idle and
  exits 0 on SIGTERM.
- The test-only fault hook (LLAMASPEC_TEST_FAULT_HOOK=1, serve/job.py): a fault at each
  point of one request's life ends that request alone with a JSON 500 (or an SSE error event once
  its stream started), a failed shared step ends the requests of that step, a dead engine thread
  makes /health 503 and the process exit non-zero; the in-flight count is 0 after each.

The time bounds here are hang guards (a server that stops answering fails instead of blocking
the suite), not performance claims.
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from test_serve import Server, _near_tie, http

pytestmark = [pytest.mark.real, pytest.mark.slow]

HANG_GUARD_S = 5          # a hostile request is answered within this, and SIGTERM exits within this
STREAM_HANG_GUARD_S = 180  # a whole greedy stream (2 cores shared with the rest of CI)
DEATH_HANG_GUARD_S = 20   # a server whose engine died has exited by then (serve/server.py: 1 s + shutdown)
LIMIT = 8 * 1024 * 1024   # serve/app.py MAX_BODY
MSG = [{"role": "user", "content": "Hi"}]


def _health(s: Server) -> tuple[int, dict]:
    r = http("GET", s.url + "/health", timeout=HANG_GUARD_S)
    return r.status_code, r.json()


def _stream(s: Server, prompt: str, max_tokens: int, first: threading.Event | None = None, *,
            chat: bool = True) -> dict:
    """A greedy stream read on the wire (chat, or a raw-text completion): its text, finish_reason
    and any error event."""
    body = json.dumps({"messages" if chat else "prompt": [{"role": "user", "content": prompt}] if chat else prompt,
                       "max_tokens": max_tokens, "stream": True}).encode()
    path = b"/v1/chat/completions" if chat else b"/v1/completions"
    out = {"text": "", "finish": None, "error": None}
    with socket.create_connection(("127.0.0.1", s.port), timeout=STREAM_HANG_GUARD_S) as sock:
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (path, len(body), body))
        buf = b""
        while True:
            more = sock.recv(65536)
            if not more:
                break
            buf += more
            while b"\n" in buf:
                line, _, buf = buf.partition(b"\n")
                line = line.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                ev = json.loads(line[6:])
                if "error" in ev:
                    out["error"] = ev["error"]
                    continue
                piece = ev["choices"][0]["delta"].get("content") if chat else ev["choices"][0]["text"]
                if piece:
                    out["text"] += piece
                    if first is not None:
                        first.set()
                out["finish"] = ev["choices"][0]["finish_reason"] or out["finish"]
    return out


def _raw(s: Server, body: bytes, content_type: str = "application/json", path: str = "/v1/chat/completions",
         host: str = "127.0.0.1"):
    return http("POST", s.url + path, content=body, timeout=HANG_GUARD_S,
                headers={"content-type": content_type, "host": host})


def _chat_body(**fields) -> bytes:
    return json.dumps({"messages": MSG, "max_tokens": 4, **fields}).encode()


# Each: (what, request thunk given the server, expected status, the field the error names or None).
WRONG_TYPES = {"messages": "Hi", "max_tokens": "5", "max_completion_tokens": [5], "n_predict": "5",
               "temperature": "hot", "top_p": [], "seed": "1", "stop": 5, "top_k": 1.5, "min_p": {},
               "repeat_penalty": "x", "presence_penalty": True, "frequency_penalty": "x", "stream": "yes",
               "stream_options": 3, "model": 5, "user": 5, "metadata": "x", "store": "x", "ignore_eos": "x",
               "mirostat": "x", "typical_p": "x", "samplers": 7, "n": "x", "logprobs": "x"}


def _storm() -> list[tuple[str, object, int, str | None]]:
    cases: list[tuple[str, object, int, str | None]] = [
        ("seed -1 (random)", lambda s: _raw(s, _chat_body(seed=-1)), 200, None),
        ("seed 4294967295 (random)", lambda s: _raw(s, _chat_body(seed=4294967295)), 200, None),
        ("seed past int64", lambda s: _raw(s, _chat_body(seed=1 << 64)), 400, "seed"),
        ("temperature Infinity", lambda s: _raw(s, b'{"messages": [{"role": "user", "content": "Hi"}], '
                                                   b'"temperature": Infinity}'), 400, None),
        ("temperature NaN", lambda s: _raw(s, b'{"messages": [{"role": "user", "content": "Hi"}], '
                                              b'"temperature": NaN}'), 400, None),
        ("temperature 1e999", lambda s: _raw(s, b'{"messages": [{"role": "user", "content": "Hi"}], '
                                                b'"temperature": 1e999}'), 400, "temperature"),
        ("top_p -1e999", lambda s: _raw(s, b'{"messages": [{"role": "user", "content": "Hi"}], '
                                           b'"top_p": -1e999}'), 400, "top_p"),
        ("temperature 1e-310", lambda s: _raw(s, _chat_body(temperature=1e-310)), 400, "temperature"),
        ("min_p 1e-320", lambda s: _raw(s, _chat_body(min_p=1e-320)), 400, "min_p"),
        ("empty messages", lambda s: _raw(s, json.dumps({"messages": []}).encode()), 400, "messages"),
        ("deep nesting", lambda s: _raw(s, b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"), 400, None),
        ("too many stops", lambda s: _raw(s, _chat_body(stop=[str(i) for i in range(17)])), 400, "stop"),
        ("a stop over 1 KiB", lambda s: _raw(s, _chat_body(stop=["x" * 1025])), 400, "stop"),
        ("mirostat 2", lambda s: _raw(s, _chat_body(mirostat=2)), 400, "mirostat"),
        ("typical_p 0.5", lambda s: _raw(s, _chat_body(typical_p=0.5)), 400, "typical_p"),
        ("dry_multiplier 0.8", lambda s: _raw(s, _chat_body(dry_multiplier=0.8)), 400, "dry_multiplier"),
        ("n_probs 5", lambda s: _raw(s, _chat_body(n_probs=5)), 400, "n_probs"),
        ("xtc_probability 0.5", lambda s: _raw(s, _chat_body(xtc_probability=0.5)), 400, "xtc_probability"),
        ("samplers reordered", lambda s: _raw(s, _chat_body(samplers=["temperature", "top_k"])), 400, "samplers"),
        ("text/plain", lambda s: _raw(s, _chat_body(), content_type="text/plain"), 415, None),
        ("form content type", lambda s: _raw(s, _chat_body(), content_type="application/x-www-form-urlencoded"),
         415, None),
        ("a rebound Host", lambda s: _raw(s, _chat_body(), host="evil.example"), 403, None),
        ("invalid UTF-8", lambda s: _raw(s, b'{"messages": "\xff\xfe"}'), 400, None),
        ("a body over the limit", lambda s: _over_limit(s, LIMIT + 1), 413, None),
        ("a body just under the limit", lambda s: _raw(s, _padded(LIMIT - 1)), 200, None),
        ("llama-server neutral values", lambda s: _raw(s, _chat_body(
            mirostat=0, typical_p=1, n_probs=0, dry_multiplier=0, xtc_probability=0, top_n_sigma=-1,
            samplers=["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"],
            user="u", metadata={"a": "b"}, store=False)), 200, None),
    ]
    for field, value in WRONG_TYPES.items():
        cases.append((f"{field} of a wrong type", lambda s, f=field, v=value: _raw(s, _chat_body(**{f: v})),
                      400, field))
    cases.append(("prompt of a wrong type", lambda s: _raw(s, json.dumps({"prompt": 5}).encode(),
                                                         path="/v1/completions"), 400, "prompt"))
    return cases


class _Reply:
    def __init__(self, status: int, body: bytes):
        self.status_code, self.text = status, body.decode()

    def json(self):
        return json.loads(self.text)


def _over_limit(s: Server, size: int) -> _Reply:
    """A body of `size` bytes announced, only its start sent: the server refuses it from its
    Content-Length (a client sending it all would see its upload cut, not the answer)."""
    with socket.create_connection(("127.0.0.1", s.port), timeout=HANG_GUARD_S) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Connection: close\r\nContent-Length: %d\r\n\r\n{\"messages\": " % size)
        data = b""
        while more := sock.recv(65536):
            data += more
    head, _, body = data.partition(b"\r\n\r\n")
    return _Reply(int(head.split()[1]), body)


def _padded(size: int) -> bytes:
    """A valid chat body of exactly `size` bytes (JSON whitespace as the padding)."""
    core = _chat_body()
    return core[:-1] + b" " * (size - len(core)) + b"}"


def test_a_storm_of_hostile_requests_leaves_two_greedy_streams_alone(smollm2_q4, tmp_path):
    s = Server(smollm2_q4, "--parallel", "4", tmp=tmp_path)
    prompts = ["Write a long story about a lighthouse keeper and the sea.",
               "Explain step by step how a bicycle works, in detail."]
    try:
        alone = [_stream(s, p, 160) for p in prompts]
        assert all(a["error"] is None and a["text"] for a in alone), alone
        firsts = [threading.Event() for _ in prompts]
        together: dict[int, dict] = {}

        def run(i: int) -> None:
            together[i] = _stream(s, prompts[i], 160, firsts[i])

        streams = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
        for t in streams:
            t.start()
        for ev in firsts:   # the storm starts once both streams have sent text
            assert ev.wait(STREAM_HANG_GUARD_S), "a stream sent no first chunk (hang guard)"

        def fire(case):
            what, send, want, param = case
            t0 = time.monotonic()
            r = send(s)
            return what, r, want, param, time.monotonic() - t0

        with ThreadPoolExecutor(max_workers=16) as pool:
            answers = list(pool.map(fire, _storm()))
        for what, r, want, param, seconds in answers:
            assert seconds < HANG_GUARD_S, f"{what}: answered after {seconds:.1f} s (hang guard)"
            assert r.status_code == want, (what, r.status_code, r.text[:300])
            body = r.json()   # every answer is JSON, errors included
            if want >= 400:
                assert set(body["error"]) >= {"message", "type"} and body["error"]["message"], (what, body)
                if param is not None:
                    assert body["error"]["param"] == param and param in body["error"]["message"], (what, body)
            else:
                assert body["choices"][0]["message"]["content"] is not None, (what, body)
        slowest = max(answers, key=lambda a: a[4])
        print(f"{len(answers)} hostile requests answered, the slowest in {slowest[4]:.2f} s ({slowest[0]})")
        for t in streams:
            t.join(STREAM_HANG_GUARD_S)
            assert not t.is_alive(), "a stream did not finish (hang guard)"
        for i, p in enumerate(prompts):
            assert together[i]["error"] is None and together[i]["finish"] in ("stop", "length"), together[i]
            print(_near_tie(smollm2_q4, p, alone[i]["text"], together[i]["text"]))
        status, health = _health(s)
        assert status == 200 and health["requests_in_flight"] == 0 and health["slots_processing"] == 0, health
        assert s.metrics()["llamaspec:requests_in_flight"] == 0
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(HANG_GUARD_S) == 0, s.log.read_text()   # (hang guard)
    finally:
        s.stop()


@pytest.fixture(scope="module")
def hooked(smollm2_q4, tmp_path_factory):
    s = Server(smollm2_q4, "--parallel", "2", env={"LLAMASPEC_TEST_FAULT_HOOK": "1"},
               tmp=tmp_path_factory.mktemp("faults"))
    yield s
    assert s.stop() == 0, s.log.read_text()


def _in_flight_is_zero(s: Server) -> None:
    status, health = _health(s)
    assert status == 200 and health["requests_in_flight"] == 0 and health["requests_deferred"] == 0, health
    assert s.metrics()["llamaspec:requests_in_flight"] == 0


def _with_a_healthy_stream(s: Server, fault):
    """Run `fault()` while a greedy stream is generating (gated on its first chunk); returns the
    stream's outcome and the fault's."""
    first, got = threading.Event(), {}
    # (a counting completion: it runs its whole max_tokens, long after the fault)
    t = threading.Thread(target=lambda: got.update(_stream(s, "1, 2, 3, 4, 5,", 150, first, chat=False)))
    t.start()
    assert first.wait(STREAM_HANG_GUARD_S), "the healthy stream sent no first chunk (hang guard)"
    answer = fault()
    t.join(STREAM_HANG_GUARD_S)
    assert not t.is_alive(), "the healthy stream did not finish (hang guard)"
    return got, answer


@pytest.mark.parametrize("kind", ["prepare", "admit", "finish"])
def test_a_fault_in_one_request_ends_it_alone(hooked, kind):
    body = json.dumps({"messages": [{"role": "user", "content": f"<<fault:{kind}>> Hi"}], "max_tokens": 8}).encode()
    healthy, r = _with_a_healthy_stream(hooked, lambda: _raw(hooked, body))
    assert r.status_code == 500, r.text
    err = r.json()["error"]
    assert err["type"] == "server_error" and "InjectedFault" in err["message"], err
    assert healthy["error"] is None and healthy["finish"] in ("stop", "length") and healthy["text"], healthy
    _in_flight_is_zero(hooked)


@pytest.mark.parametrize("kind", ["text", "finish"])
def test_a_fault_in_a_started_stream_is_an_sse_error_event(hooked, kind):
    healthy, faulty = _with_a_healthy_stream(hooked, lambda: _stream(hooked, f"<<fault:{kind}>> Say hello.", 16))
    assert faulty["error"] is not None and faulty["error"]["type"] == "server_error", faulty
    assert healthy["error"] is None and healthy["finish"] in ("stop", "length") and healthy["text"], healthy
    _in_flight_is_zero(hooked)


def test_a_failed_shared_step_ends_its_requests_and_the_server_goes_on(hooked):
    body = json.dumps({"messages": [{"role": "user", "content": "<<fault:step>> Hi"}], "max_tokens": 8}).encode()
    shared, r = _with_a_healthy_stream(hooked, lambda: _raw(hooked, body))
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error", r.text
    # the stream shared the failed step: it ends with an error event, never a hang
    assert shared["error"] is not None and shared["error"]["type"] == "server_error", shared
    _in_flight_is_zero(hooked)
    after = _raw(hooked, _chat_body())
    assert after.status_code == 200 and after.json()["choices"][0]["message"]["content"] is not None
    _in_flight_is_zero(hooked)


def test_a_dead_engine_thread_answers_503_and_exits_non_zero(smollm2_q4, tmp_path):
    s = Server(smollm2_q4, "--parallel", "2", env={"LLAMASPEC_TEST_FAULT_HOOK": "1"}, tmp=tmp_path)
    try:
        body = json.dumps({"messages": [{"role": "user", "content": "<<fault:engine>> Hi"}],
                           "max_tokens": 8}).encode()
        # /health at once: the answer to the fault came after the engine was marked dead
        stream, (r, (status, health)) = _with_a_healthy_stream(s, lambda: (_raw(s, body), _health(s)))
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error", r.text
        assert stream["error"] is not None, stream   # the running stream is told, not left hanging
        assert status == 503 and health["status"] == "error" and health["requests_in_flight"] == 0, health
        assert s.proc.wait(DEATH_HANG_GUARD_S) != 0, s.log.read_text()   # (hang guard)
        assert "the engine stopped" in s.log.read_text()
    finally:
        s.stop()
