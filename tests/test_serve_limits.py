"""`llamaspec serve`'s limits and defaults: request fields llama-server clients send, sane numbers,
bounded stop lists, browsers (Content-Type, Host, CORS), --timeout, a full queue, max_tokens left
out, --suffix-scope and the checks of --api-key / --host.

Parsing is tested on llamaspec/openai/requests.py directly; the rest on the real server: in a
subprocess as tests/test_serve.py starts it, or in this process (the app and scheduler the command
builds, served by uvicorn in a thread) where a test must reach a queued job."""

from __future__ import annotations

import json
import re
import socket
import threading
import time

import openai
import pytest

from llamaspec.openai import requests as oa_req
from llamaspec.errors import INT64_MAX, INT64_MIN
from llamaspec.speculative.sequence import StopStrings

MSG = [{"role": "user", "content": "Hi"}]
HANG_GUARD_S = 60


def _chat(**fields):
    return oa_req.parse_chat({"messages": MSG, **fields})


def _refused(param: str, **fields) -> str:
    with pytest.raises(oa_req.RequestError) as e:
        _chat(**fields)
    assert e.value.param == param and param in e.value.message, e.value.message
    return e.value.message


# ---- parsing ------------------------------------------------------------------------------------

def test_n_predict_is_max_tokens_and_minus_one_is_no_limit():
    assert _chat(n_predict=7).fields["max_tokens"] == 7
    assert _chat(n_predict=-1).fields["max_tokens"] == oa_req.NO_LIMIT
    assert _chat(n_predict=7, max_tokens=3).fields["max_tokens"] == 3   # OpenAI's name wins
    assert _chat().fields["max_tokens"] is None                        # left out: the server's default
    _refused("n_predict", n_predict=-2)
    _refused("n_predict", n_predict="7")
    _refused("n_predict", max_tokens=3, n_predict="7")   # a losing field is still typed


def test_ignore_eos_reaches_the_request():
    from llamaspec.api.generator import Request

    assert Request(**_chat(ignore_eos=True).fields).ignore_eos is True
    assert Request(**_chat(ignore_eos=False).fields).ignore_eos is False
    _refused("ignore_eos", ignore_eos="yes")


LLAMA_SERVER_NEUTRAL = dict(
    mirostat=0, mirostat_tau=5.0, mirostat_eta=0.1, typical_p=1.0, top_n_sigma=-1.0, n_probs=0,
    post_sampling_probs=False, min_keep=0, dynatemp_range=0.0, dynatemp_exponent=1.0, dry_multiplier=0.0,
    dry_base=1.75, dry_allowed_length=2, dry_penalty_last_n=-1, dry_sequence_breakers=["\n", ":"],
    xtc_probability=0.0, xtc_threshold=0.1, samplers=["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p",
                                                      "min_p", "xtc", "temperature"],
    lora=[], n_cmpl=1, t_max_predict_ms=0, continue_final_message=False, n_indent=0,
    cache_prompt=True, id_slot=-1, n_keep=0, return_tokens=False, timings_per_token=False, user="u",
    metadata={"k": "v"}, store=False)


def test_llama_server_neutral_values_and_harmless_unknowns_are_accepted():
    p = _chat(**LLAMA_SERVER_NEUTRAL)
    assert p.fields["temperature"] is None and p.fields["max_tokens"] is None
    assert _chat(samplers="edskypmxt").fields is not None   # the same chain as letters
    assert _chat(samplers=["dry", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"]).fields is not None


@pytest.mark.parametrize("field, value", [
    ("mirostat", 2), ("typical_p", 0.9), ("top_n_sigma", 1.0), ("n_probs", 3), ("post_sampling_probs", True),
    ("min_keep", 2), ("dynatemp_range", 0.5), ("dry_multiplier", 0.8), ("xtc_probability", 0.5),
    ("samplers", ["temperature", "top_k", "top_p", "min_p", "penalties"]), ("samplers", "kt"),
    ("samplers", ["mystery"]), ("lora", [{"id": 0, "scale": 1}]), ("n_cmpl", 2), ("t_max_predict_ms", 500),
    ("continue_final_message", True), ("n_indent", 4), ("mirostat_tau", float("inf")), ("mirostat", "x"),
])
def test_llama_server_values_that_ask_for_something_are_refused_naming_the_field(field, value):
    message = _refused(field, **{field: value})
    assert "neutral" in message


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan"), 1e-310, 1e-300, 1e300, 10 ** 400,
                                   -(10 ** 400)])
@pytest.mark.parametrize("field", ["temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty",
                                   "frequency_penalty"])
def test_sampling_numbers_must_be_finite_and_fit_float32(field, value):
    _refused(field, **{field: value})


def test_sampling_numbers_in_range_pass():
    p = _chat(temperature=0, top_p=1e-30, min_p=0.0, repeat_penalty=3e38, presence_penalty=-2, frequency_penalty=2.0)
    assert p.fields["top_p"] == 1e-30 and p.fields["repeat_penalty"] == 3e38


@pytest.mark.parametrize("field", ["seed", "top_k", "max_tokens"])
def test_integers_are_int64(field):
    lo, hi = INT64_MIN, INT64_MAX
    _refused(field, **{field: hi + 1})
    _refused(field, **{field: lo - 1})
    if field == "seed":
        assert _chat(seed=lo).fields["seed"] == lo and _chat(seed=-1).fields["seed"] == -1


def test_stop_lists_are_bounded():
    assert _chat(stop=[str(i) for i in range(oa_req.MAX_STOPS)]).fields["stop"] == [str(i) for i in range(16)]
    assert _refused("stop", stop=[str(i) for i in range(oa_req.MAX_STOPS + 1)]).startswith("stop has 17 strings")
    assert _chat(stop=["é" * (oa_req.MAX_STOP_BYTES // 2)]).fields["stop"]   # 1024 bytes in UTF-8
    _refused("stop", stop=["é" * (oa_req.MAX_STOP_BYTES // 2) + "x"])


def test_stop_strings_hold_only_the_tail():
    """However long the text, what a push searches is the held-back tail plus the new piece."""
    stops = ["x" * 1024, "THE END"]
    s = StopStrings(stops)
    emitted = []
    for i in range(20_000):
        out, hit = s.push(f"word{i} ")
        assert not hit and len(s.text) <= 1023 + len(f"word{i} "), len(s.text)
        emitted.append(out)
    out, hit = s.push("and THE END here")
    assert hit and "".join(emitted) + out == "".join(f"word{i} " for i in range(20_000)) + "and "


def test_wrong_types_name_their_field():
    for field, value in (("stream", 1), ("stream_options", []), ("model", 3), ("user", 3), ("metadata", []),
                         ("store", "no"), ("top_k", 2.5), ("seed", 1.0), ("max_completion_tokens", "9")):
        _refused(field, **{field: value})
    with pytest.raises(oa_req.RequestError) as e:
        _chat(stream=True, stream_options={"include_usage": "yes"})
    assert e.value.param == "stream_options"


def test_loopback_and_host_helpers():
    from llamaspec.serve.app import _host_name, _is_json, _too_deep, is_loopback

    assert [_host_name(h) for h in ("127.0.0.1:8080", "[::1]:80", "localhost", "evil.example:1")] == [
        "127.0.0.1", "::1", "localhost", "evil.example"]
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.9.9.9", "::1", "[::1]", "localhost", "LOCALHOST",
                                        "app.localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.1", "evil.example", "localhost.evil.example",
                                            ""))
    assert _is_json("application/json") and _is_json("application/json; charset=utf-8")
    assert not _is_json("text/plain") and not _is_json("") and not _is_json("multipart/form-data")
    nested: list = []
    inner = nested
    for _ in range(64):
        inner.append([])
        inner = inner[0]
    assert not _too_deep({"a": [1, 2]}, 64) and _too_deep({"a": nested}, 64) and not _too_deep(nested, 65)


# ---- the server, in a subprocess ------------------------------------------------------------------

def _options(s, path: str, origin: str):
    from test_serve import http

    return http("OPTIONS", s.url + path, headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                                                  "Access-Control-Request-Headers": "content-type"})


@pytest.mark.real
@pytest.mark.slow
def test_browser_guards(smollm2_q4, tmp_path):
    from test_serve import Server, http

    s = Server(smollm2_q4, "--cors-origins", "http://ok.example, http://also.example", tmp=tmp_path)
    try:
        body = json.dumps({"messages": MSG, "max_tokens": 2}).encode()
        r = http("POST", s.url + "/v1/chat/completions", content=body, headers={"content-type": "text/plain"})
        assert r.status_code == 415 and "Content-Type: application/json" in r.json()["error"]["message"]
        r = http("POST", s.url + "/v1/chat/completions", content=body, headers={"host": "evil.example"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed"
        assert http("GET", s.url + "/health", headers={"host": "localhost:1"}).status_code == 200
        ok = _options(s, "/v1/chat/completions", "http://also.example")
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://also.example"
        other = _options(s, "/v1/chat/completions", "http://evil.example")
        assert "access-control-allow-origin" not in {k.lower() for k in other.headers}
        r = http("POST", s.url + "/v1/chat/completions", content=body, headers={"Origin": "http://ok.example"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://ok.example"
    finally:
        assert s.stop() == 0, s.log.read_text()


@pytest.mark.real
@pytest.mark.slow
def test_timeout_ends_a_generation_with_what_it_has(smollm2_q4, tmp_path):
    """--timeout 1: a 900-token request (many seconds of work here) ends at its deadline with the
    tokens it has and finish_reason length, streamed or not."""
    from test_serve import Server

    s = Server(smollm2_q4, "--timeout", "1", tmp=tmp_path)
    try:
        client = s.client()
        r = client.completions.create(model="x", prompt="1, 2, 3, 4, 5,", max_tokens=900)
        assert r.choices[0].finish_reason == "length" and 0 < r.usage.completion_tokens < 900, r.usage
        chunks = list(client.completions.create(model="x", prompt="1, 2, 3,", max_tokens=900, stream=True))
        assert chunks[-1].choices[0].finish_reason == "length"
        assert r.choices[0].text.startswith(" 6, 7")
    finally:
        assert s.stop() == 0, s.log.read_text()


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("n_flag", [None, "7"])
def test_max_tokens_left_out_is_serves_n_or_no_limit(smollm2_q4, tmp_path, n_flag):
    from test_serve import Server

    s = Server(smollm2_q4, "-c", "384", *(["-n", n_flag] if n_flag else []), tmp=tmp_path)
    try:
        r = s.client().completions.create(model="x", prompt="1, 2, 3, 4, 5,")
    finally:
        assert s.stop() == 0, s.log.read_text()
    if n_flag:
        assert r.usage.completion_tokens == 7 and r.choices[0].finish_reason == "length"
    else:   # counting runs until the context is full (-c 384: llama.cpp rounds it up to 512; the
        # last token sampled needs no room), past the old default of 256
        assert 256 < r.usage.completion_tokens and r.usage.total_tokens <= 512 + 1, r.usage
        assert r.choices[0].finish_reason == "length"


def test_an_empty_api_key_is_a_usage_error(run_cli):
    r = run_cli("serve", "no-such-model.gguf", "--api-key", "")
    assert r.exit_code == 2 and "--api-key" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2, r.stderr


def test_a_non_loopback_bind_without_a_key_warns_in_one_line(run_cli):
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))
        port = probe.getsockname()[1]
    r = run_cli("serve", "no-such-model.gguf", "--host", "0.0.0.0", "--port", str(port))
    warning = [line for line in r.stderr.splitlines() if "--api-key" in line]
    assert len(warning) == 1 and "0.0.0.0" in warning[0], r.stderr
    assert r.exit_code != 0   # (then the model is not found)


# ---- the server, in this process -----------------------------------------------------------------

class _InProcess:
    """The app and scheduler `llamaspec serve` builds, on a real Generator, served by uvicorn in a
    thread (jobs reachable from the test)."""

    def __init__(self, model, **sched_kw):
        import uvicorn

        from llamaspec.api.generator import Generator
        from llamaspec.serve import server
        from llamaspec.serve.app import create_app
        from llamaspec.serve.scheduler import Scheduler

        self.g = Generator(model, temperature=0, threads=1, ctx_size=1024, max_tokens=900)
        self.sched = Scheduler(self.g, 1, **sched_kw)
        self.jobs = []
        submit = self.sched.submit
        self.sched.submit = lambda job: (self.jobs.append(job), submit(job))[1]
        self.sched.start()
        self.sock = server.bind("127.0.0.1", 0)
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        app = create_app(self.sched, model_name="m", loopback_only=True)
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + HANG_GUARD_S
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start (hang guard)"
            time.sleep(0.05)

    def post(self, body: dict, timeout: float = HANG_GUARD_S):
        from test_serve import http

        return http("POST", self.url + "/v1/completions", json_body=body, timeout=timeout)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(HANG_GUARD_S)
        self.sched.stop()
        self.sock.close()
        self.g.close()


def _wait(cond, what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what} (hang guard)"
        time.sleep(0.02)


def _background(srv: _InProcess, body: dict) -> tuple[threading.Thread, dict]:
    got: dict = {}
    t = threading.Thread(target=lambda: got.update(r=srv.post(body)))
    t.start()
    return t, got


@pytest.mark.real
@pytest.mark.slow
def test_a_full_queue_is_503_with_retry_after_and_a_request_queued_past_its_deadline_is_503(smollm2_q4):
    srv = _InProcess(smollm2_q4, max_pending=1)
    try:
        long_one, got_long = _background(srv, {"prompt": "1, 2, 3, 4, 5,"})   # the one slot, 900 tokens
        _wait(lambda: srv.sched.processing == 1, "the long request to take the slot")
        queued, got_queued = _background(srv, {"prompt": "1, 2,", "max_tokens": 2})
        _wait(lambda: srv.sched.deferred == 1, "the second request to queue")
        full = srv.post({"prompt": "x", "max_tokens": 2})   # 1 generating + 1 queued: the limit
        assert full.status_code == 503 and full.headers["Retry-After"].isdigit(), full.text
        assert full.json()["error"]["type"] == "server_error"
        srv.jobs[1].deadline = 0.0   # (its --timeout has passed while it waited)
        queued.join(HANG_GUARD_S)
        r = got_queued["r"]
        assert r.status_code == 503 and r.json()["error"]["code"] == "timeout", r.text
        srv.jobs[0].deadline = 0.0   # the generating one ends with what it has
        long_one.join(HANG_GUARD_S)
        done = got_long["r"].json()
        assert done["choices"][0]["finish_reason"] == "length" and done["usage"]["completion_tokens"] < 900, done
        assert srv.sched.in_flight == 0
    finally:
        srv.close()


@pytest.mark.real
@pytest.mark.parametrize("shared", [True, False])
def test_suffix_scope_request_keeps_finished_requests_out_of_the_index(tiny_models, shared):
    from llamaspec.api.generator import Generator, Request
    from llamaspec.serve.scheduler import Job, Scheduler
    from llamaspec.speculative.drafters.suffix import SuffixDrafter

    with Generator(tiny_models["target"], spec_type="suffix", temperature=0, threads=1, max_tokens=8) as g:
        sched = Scheduler(g, 1, shared_drafts=shared)
        (suffix,) = [d for d in g.pipeline.engine.drafter.members() if isinstance(d, SuffixDrafter)]
        events: list[tuple] = []
        done = threading.Event()

        def emit(ev: tuple) -> None:
            events.append(ev)
            if ev[0] in ("done", "error"):
                done.set()

        sched.start()
        try:
            assert sched.submit(Job("a", Request("one two three four five six", chat=False), emit))
            assert done.wait(HANG_GUARD_S), "no answer (hang guard)"
        finally:
            sched.stop()
        assert events[-1][0] == "done", events
        assert (len(suffix.tree.toks) > 0) is shared


def test_slot_context_follows_llama_server():
    import doctest

    from llamaspec.serve import context_size

    assert doctest.testmod(context_size).failed == 0
    # -c 4096 -np 4 leaves 1024 a slot: a cap of 2048 cannot bind, and says so
    s = context_size.slot_context(4096, 2048, 4)
    assert s.per_slot == 1024 and "no effect" in s.warning and "--kv-unified-per-slot 2048" in s.warning


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("flags", [("-c", "2048"), ("--kv-unified-per-slot", "512")])
def test_ctx_size_is_shared_by_the_slots_as_llama_servers(smollm2_q4, tmp_path, flags):
    """`--parallel 4 -c 2048` gives each slot 512 tokens (llama-server's n_ctx / n_parallel), as
    does `--kv-unified-per-slot 512`; the start-up line says so. A prompt must leave a slot room for
    one token, as llama-server's: 511 tokens run, 512 are a 400 'exceeds the available context
    size', and so are 600 (less than the 2048 shared, more than a slot's)."""
    from test_serve import Server

    s = Server(smollm2_q4, "--parallel", "4", *flags, tmp=tmp_path)
    try:
        client = s.client()
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="x", prompt="hello " * 600, max_tokens=1)
        err = e.value.body
        assert err["code"] == "context_length_exceeded" and err["param"] == "prompt", err
        assert "exceeds the available context size (512 tokens per slot)" in err["message"], err
        n = int(re.search(r"\((\d+) tokens\)", err["message"])[1])
        extra = n - 600   # the tokens around the words (one per "hello ")
        r = client.completions.create(model="x", prompt="hello " * (511 - extra), max_tokens=4)
        # runs to the full slot (llama-server stops one token earlier: it keeps room for the last one's KV)
        assert r.usage.prompt_tokens == 511 and r.choices[0].finish_reason == "length", r.usage
        assert 1 <= r.usage.completion_tokens <= 2, r.usage
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="x", prompt="hello " * (512 - extra), max_tokens=1)
        assert "request (512 tokens) exceeds the available context size" in e.value.body["message"]
    finally:
        assert s.stop() == 0, s.log.read_text()
    assert "context 2048 tokens shared by 4 slots: 512 per slot" in s.log.read_text()
