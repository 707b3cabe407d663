"""`llamaspec serve`, the real server in a subprocess on the real SmolLM2, driven with the official
`openai` client: chat, streaming, completions, models, errors, concurrency, routing to a slot's
cached prefix, the API key, /metrics, SIGTERM draining and client disconnects."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

from child_process import default_signals

REPO_ROOT = Path(__file__).resolve().parents[1]
HANG_GUARD_S = 180   # a hang guard, not a speed bound: a server start or an awaited event on a busy machine
pytestmark = [pytest.mark.real, pytest.mark.slow]


class _Reply:
    def __init__(self, status: int, headers, body: bytes):
        self.status_code, self.headers, self.text = status, headers, body.decode()

    def json(self):
        return json.loads(self.text)


def http(method: str, url: str, *, json_body=None, content: bytes | None = None, headers: dict | None = None,
         timeout: float = 60) -> _Reply:
    """A raw request (the stdlib's client): status, headers and body, errors included."""
    data = json.dumps(json_body).encode() if json_body is not None else content
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return _Reply(r.status, r.headers, r.read())
    except urllib.error.HTTPError as e:
        return _Reply(e.code, e.headers, e.read())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model: Path, *args: str, env: dict[str, str] | None = None, tmp: Path):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"serve-{self.port}.log"
        full_env = {**os.environ, **(env or {})}
        full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), full_env.get("PYTHONPATH")]))
        # -c is shared by the slots (llama-server's meaning): 1024 tokens per slot unless args say otherwise
        slots = int(args[args.index("--parallel") + 1]) if "--parallel" in args else 1
        ctx = [] if "--kv-unified-per-slot" in args else ["-c", str(1024 * slots)]
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "llamaspec", "serve", str(model), "--port", str(self.port), "-t", "1",
                 *ctx, "--temp", "0", *args], stdout=log, stderr=subprocess.STDOUT, env=full_env,
                preexec_fn=default_signals)
        deadline = time.monotonic() + HANG_GUARD_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}: {self.log.read_text()}")
            try:
                if http("GET", self.url + "/health", timeout=2).status_code == 200:
                    return
            except OSError:
                pass
            time.sleep(0.3)
        self.stop()
        raise AssertionError(f"server did not come up: {self.log.read_text()}")

    def client(self, key: str = "none", timeout: float = 120) -> "openai.OpenAI":
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=timeout)

    def metrics(self, key: str | None = None) -> dict[str, float]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        text = http("GET", self.url + "/metrics", headers=headers, timeout=10).text
        return {m[1]: float(m[2]) for m in re.finditer(r"^(llamaspec:\S+) (\S+)$", text, re.M)} | {"_text": text}

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="module")
def server(smollm2_q4, tmp_path_factory):
    s = Server(smollm2_q4, "--parallel", "4", tmp=tmp_path_factory.mktemp("serve"))
    yield s
    assert s.stop() == 0, s.log.read_text()


def _chat(client, text: str, max_tokens: int = 32, **kw):
    return client.chat.completions.create(model="whatever", messages=[{"role": "user", "content": text}],
                                          max_tokens=max_tokens, **kw)


def _chat_together(server: Server, prompts: list[str], max_tokens: int) -> dict[int, str]:
    """Each prompt from its own client thread, all sent at once: {index: answer text}."""
    answers: dict[int, str] = {}

    def ask(i: int) -> None:
        answers[i] = _chat(server.client(), prompts[i], max_tokens=max_tokens).choices[0].message.content

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return answers


def test_models_and_chat(server, smollm2_q4):
    client = server.client()
    assert [m.id for m in client.models.list()] == [smollm2_q4.name]
    r = _chat(client, "Name three colours.")
    assert r.object == "chat.completion" and r.model == smollm2_q4.name
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content.strip()
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 5 and 0 < r.usage.completion_tokens <= 32
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    t = r.model_extra["timings"]
    assert t["predicted_n"] == r.usage.completion_tokens and t["prompt_n"] + t["cache_n"] == r.usage.prompt_tokens
    assert {"prompt_ms", "predicted_ms", "predicted_per_second", "draft_n", "draft_n_accepted"} <= set(t)


def test_streaming_chat_joins_to_the_non_streamed_text(server, smollm2_q4):
    client = server.client()
    plain = _chat(client, "Write one sentence about the sea.", max_tokens=40)
    chunks = list(_chat(client, "Write one sentence about the sea.", max_tokens=40, stream=True,
                        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    # the second request reuses the first's cached prompt (another batch shape): same text or a near-tie
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    print(_near_tie(smollm2_q4, "Write one sentence about the sea.", plain.choices[0].message.content, streamed))
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [plain.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])
    # on the wire: OpenAI's SSE framing, ending with [DONE]
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True}
    raw = http("POST", server.url + "/v1/chat/completions", json_body=body)
    events = [line for line in raw.text.splitlines() if line.startswith("data: ")]
    assert raw.headers["content-type"].startswith("text/event-stream") and events[-1] == "data: [DONE]"
    assert json.loads(events[0][6:])["object"] == "chat.completion.chunk"


def test_completions(server, smollm2_q4):
    client = server.client()
    r = client.completions.create(model="x", prompt="1, 2, 3, 4, 5,", max_tokens=12)
    assert r.object == "text_completion" and r.choices[0].text.startswith(" 6, 7")
    assert r.usage.completion_tokens == 12 and r.choices[0].finish_reason == "length"
    streamed = list(client.completions.create(model="x", prompt="1, 2, 3, 4, 5,", max_tokens=12, stream=True))
    print(_near_tie(smollm2_q4, "1, 2, 3, 4, 5,", r.choices[0].text, "".join(c.choices[0].text for c in streamed),
                    raw=True))


def test_bad_requests_are_400_naming_the_field_and_the_server_goes_on(server):
    client = server.client()
    for kw, param in (({"n": 2}, "n"), ({"temperature": -1}, "temperature"), ({"top_logprobs": 2}, "top_logprobs"),
                      ({"top_p": 0}, "top_p"),
                      ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
                      ({"response_format": {"type": "xml"}}, "response_format")):
        with pytest.raises(openai.BadRequestError) as e:
            _chat(client, "Hi", **kw)
        err = e.value.body
        assert e.value.status_code == 400 and err["param"] == param and err["type"] == "invalid_request_error", err
        assert param in err["message"]
    with pytest.raises(openai.BadRequestError) as e:   # a prompt longer than a slot's context (-c 4096 / 4)
        client.completions.create(model="x", prompt="hello " * 1500, max_tokens=4)
    assert e.value.body["code"] == "context_length_exceeded" and e.value.body["param"] == "prompt"
    # a 9 MiB body: refused from its Content-Length, before the server reads it
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n{\"prompt\": \"" % (9 << 20))
        data = b""
        while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < int(
                re.search(rb"content-length: (\d+)", data.partition(b"\r\n\r\n")[0], re.I)[1]):
            more = sock.recv(65536)
            assert more, data
            data += more
        head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), head
    assert json.loads(body)["error"]["message"].startswith("the request body is 9,437,184 bytes")
    bad = http("POST", server.url + "/v1/completions", content=b"{not json")
    assert bad.status_code == 400 and set(bad.json()["error"]) == {"message", "type", "param", "code"}
    assert _chat(client, "Say hello.", max_tokens=8).choices[0].message.content   # still serving


def test_concurrent_greedy_clients_get_what_each_gets_alone(server, smollm2_q4):
    client = server.client()
    prompts = ["Explain in two sentences what a hash map is.", "List five fruits.",
               "Write a haiku about autumn.", "What is the capital of France? Answer briefly."]
    alone = [_chat(client, p, max_tokens=48).choices[0].message.content for p in prompts]
    together = _chat_together(server, prompts, max_tokens=48)
    notes = [_near_tie(smollm2_q4, p, a, together[i]) for i, (p, a) in enumerate(zip(prompts, alone))]
    print("\n".join(notes))


def _near_tie(model_path: Path, prompt: str, alone: str, together: str, eps: float = 1.1, raw: bool = False) -> str:
    """Identical text, or a flip where the target's top-2 logit gap is below eps (Q4_1's batch
    noise, tests/engine_helpers.py); the first differing token and its gap are named. raw: the
    prompt is a completion's text, not a chat message."""
    if alone == together:
        return f"{prompt[:20]!r}: identical"
    from engine_helpers import first_divergence, top2_gap
    from llamaspec.runtime.llama import Model

    m = Model(model_path)
    try:
        ids = m.tokenize_prompt(prompt if raw else m.chat_prompt([{"role": "user", "content": prompt}]))
        a, b = (m.tokenize(t, add_special=False, parse_special=False) for t in (alone, together))
        i = first_divergence(a, b)
        gap = top2_gap(m, ids, a[:i])
    finally:
        m.close()
    assert gap < eps, f"{prompt[:20]!r}: differs at token {i} where the top-2 logit gap is {gap:.3f}: {alone!r} vs {together!r}"
    return f"{prompt[:20]!r}: near-tie flip at token {i} (top-2 logit gap {gap:.3f})"


def test_a_returning_conversation_goes_to_the_slot_that_holds_its_prefix(server):
    client = server.client()
    convs = {"a": "Tell me about owls.", "b": "Give me a recipe for pancakes with blueberries and syrup."}
    first = {k: client.chat.completions.create(model="x", messages=[{"role": "user", "content": q}], max_tokens=24)
             for k, q in convs.items()}
    for k, q in convs.items():   # a, then b: with b evaluated last, a's prefix is only in a's slot
        messages = [{"role": "user", "content": q},
                    {"role": "assistant", "content": first[k].choices[0].message.content},
                    {"role": "user", "content": "Shorter, please."}]
        again = client.chat.completions.create(model="x", messages=messages, max_tokens=8)
        assert again.model_extra["timings"]["cache_n"] >= first[k].usage.prompt_tokens, (k, again.model_extra)


def test_metrics(server):
    _chat(server.client(), "Count from 1 to 20.", max_tokens=40)
    m = server.metrics()
    for name in ("prompt_tokens_total", "tokens_predicted_total", "prompt_seconds_total",
                 "tokens_predicted_seconds_total", "requests_processing", "requests_deferred",
                 "draft_tokens_total", "draft_tokens_accepted_total"):
        assert f"llamaspec:{name}" in m, name
    assert m["llamaspec:tokens_predicted_total"] >= 40 and m["llamaspec:prompt_seconds_total"] > 0
    assert m["llamaspec:requests_processing"] == 0 and m["llamaspec:requests_deferred"] == 0
    assert "# TYPE llamaspec:tokens_predicted_total counter" in m["_text"]
    per = re.findall(r'^llamaspec:drafter_draft_tokens_total\{drafter="([^"]+)"\} (\d+)', m["_text"], re.M)
    assert sum(int(n) for _, n in per) == m["llamaspec:draft_tokens_total"] > 0   # prompt-lookup drafted


def test_api_key(smollm2_q4, tmp_path):
    s = Server(smollm2_q4, env={"LLAMASPEC_API_KEY": "sesame"}, tmp=tmp_path)
    try:
        with pytest.raises(openai.AuthenticationError) as e:
            s.client("wrong").models.list()
        assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
        assert http("GET", s.url + "/metrics").status_code == 401
        assert http("POST", s.url + "/v1/completions", json_body={"prompt": "x"}).status_code == 401
        assert http("GET", s.url + "/health").status_code == 200
        assert [m.id for m in s.client("sesame").models.list()] == [smollm2_q4.name]
        assert "llamaspec:requests_processing" in s.metrics("sesame")
    finally:
        assert s.stop() == 0


def _wait_for(cond, what: str) -> None:
    """Poll until `cond` holds (an event the server shows); the hang guard fails a test that waits forever."""
    deadline = time.monotonic() + HANG_GUARD_S
    while not cond():
        assert time.monotonic() < deadline, f"no {what} within the hang guard ({HANG_GUARD_S} s)"
        time.sleep(0.1)


def test_sigterm_drains_in_flight_requests_and_exits_0(smollm2_q4, tmp_path):
    s = Server(smollm2_q4, tmp=tmp_path)
    got = {}

    def long_request() -> None:
        got["r"] = s.client().completions.create(model="x", prompt="1, 2, 3, 4, 5,", max_tokens=120)

    t = threading.Thread(target=long_request)
    t.start()
    _wait_for(lambda: s.metrics()["llamaspec:requests_processing"] == 1, "the request to start")
    s.proc.send_signal(signal.SIGTERM)
    _wait_for(lambda: http("GET", s.url + "/health").status_code == 503, "draining")
    refused = http("POST", s.url + "/v1/completions", json_body={"prompt": "x", "max_tokens": 2})
    assert refused.status_code == 503 and refused.json()["error"]["type"] == "server_error"
    t.join(120)
    assert s.proc.wait(60) == 0, s.log.read_text()
    r = got["r"]   # the in-flight request was answered in full
    assert r.usage.completion_tokens == 120 and r.choices[0].finish_reason == "length"


def test_client_disconnect_mid_stream_frees_the_slot(smollm2_q4, tmp_path):
    s = Server(smollm2_q4, "--parallel", "1", tmp=tmp_path)
    try:
        client = s.client()
        stream = client.completions.create(model="x", prompt="1, 2, 3, 4, 5,", max_tokens=900, stream=True)
        pieces = []
        for chunk in stream:
            pieces.append(chunk.choices[0].text)
            assert chunk.choices[0].finish_reason is None
            if len(pieces) == 5:
                break
        stream.close()   # the client goes away with ~900 tokens to go
        # the one slot is free at once: this is answered without waiting for the 900 tokens
        r = s.client(timeout=60).completions.create(model="x", prompt="1, 2,", max_tokens=4)
        assert r.usage.completion_tokens == 4
        m = s.metrics()
        assert m["llamaspec:requests_cancelled_total"] == 1
        assert m["llamaspec:tokens_predicted_total"] < 300, m   # the first stopped far from 900
        # the same for a request that does not stream: a client that gives up (once its request is
        # being answered: the event, not a client timeout that a fast machine would outrun) frees the slot
        body = json.dumps({"prompt": "1, 2, 3, 4, 5,", "max_tokens": 900}).encode()
        with socket.create_connection(("127.0.0.1", s.port), timeout=30) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            _wait_for(lambda: s.metrics()["llamaspec:requests_processing"] == 1, "the request to start")
        r = s.client(timeout=60).completions.create(model="x", prompt="1, 2,", max_tokens=4)
        assert r.usage.completion_tokens == 4
        m = s.metrics()
        assert m["llamaspec:requests_cancelled_total"] == 2
        assert m["llamaspec:tokens_predicted_total"] < 600, m
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize("cache_ram", ["8192", "0"])
def test_a_prompt_that_left_its_slot_is_restored_from_the_ram_cache(smollm2_q4, tmp_path, cache_ram):
    """One slot, prompt A, then B (A's KV is cut), then A again: with the RAM prompt cache A's
    state comes back and only its last token is evaluated, as when A follows itself on its slot
    (and with the same text: evaluating the last token alone can flip a near-tie of this Q4 model
    against a whole-prompt evaluation, so the reference is a reused A); with --cache-ram 0 the
    whole of A is evaluated again and gives the first text."""
    a = "Here is a long story about a lighthouse keeper. " * 12
    b = "A completely different text about mountains and rivers. " * 12
    s = Server(smollm2_q4, "--parallel", "1", "--cache-ram", cache_ram, tmp=tmp_path)
    try:
        client = s.client()
        first = client.completions.create(model="x", prompt=a, max_tokens=8)
        reused = client.completions.create(model="x", prompt=a, max_tokens=8)
        client.completions.create(model="x", prompt=b, max_tokens=8)
        again = client.completions.create(model="x", prompt=a, max_tokens=8)
    finally:
        assert s.stop() == 0, s.log.read_text()
    t = again.model_extra["timings"]
    assert t["prompt_n"] + t["cache_n"] == again.usage.prompt_tokens
    assert reused.model_extra["timings"]["prompt_n"] == 1
    if cache_ram == "0":
        assert t["prompt_n"] > again.usage.prompt_tokens // 2, t   # only a short prefix shared with B
        # evaluated after B's shared prefix, not whole as the first time: same text or a near-tie
        print(_near_tie(smollm2_q4, a, first.choices[0].text, again.choices[0].text, raw=True))
    else:
        assert t["prompt_n"] == 1, t
        assert again.choices[0].text == reused.choices[0].text


def test_cache_ram_flag_is_checked(run_cli, tiny_models):
    r = run_cli("serve", tiny_models["target"], "--cache-ram", "-2")
    assert r.exit_code == 2 and "--cache-ram" in r.stderr and "Traceback" not in r.stderr
