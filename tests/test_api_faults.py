"""The storm of hostile requests, through the Python API: a script a user could write fires each
kind at `Generator.create_chat_completion` / `create_completion` / `__call__` / `generate` on the
bundled model, in a child process (a segfault is then exit -11, not a dead pytest). Each must end
in its clear exception (type, and a message naming the field), the good neighbours must still
work, and the child must exit 0: no crash, no hang, no memory corruption."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from child_process import child_env

HANG_GUARD_S = 600   # a hang guard, not a speed bound: the whole storm on a busy 2-core machine

_STORM = textwrap.dedent(r'''
    import json, sys, threading
    from llamaspec import Generator, Request
    from llamaspec.errors import UsageError

    def report(case, fn):
        try:
            out = fn()
            if hasattr(out, "__next__"):   # a stream: the error may come while iterating it
                out = list(out)
            print(json.dumps({"case": case, "ok": True}), flush=True)
        except BaseException as e:   # (KeyboardInterrupt too: nothing here may raise it)
            print(json.dumps({"case": case, "type": type(e).__name__, "usage": isinstance(e, UsageError),
                              "message": str(e)}), flush=True)

    # The constructor refuses what it cannot sample with, before loading anything.
    report("ctor seed 2^63", lambda: Generator(seed=1 << 63))
    report("ctor temperature inf", lambda: Generator(temperature=float("inf")))

    g = Generator(temperature=0, ctx_size=256, threads=1)   # the bundled SmolLM2, as the README builds it
    M = [{"role": "user", "content": "Count from 1 to 20."}]
    chat = lambda **kw: g.create_chat_completion(M, **{"max_tokens": 4, **kw})
    comp = lambda **kw: g.create_completion("1, 2, 3,", **{"max_tokens": 4, **kw})
    call = lambda **kw: g("1, 2, 3,", **{"max_tokens": 4, **kw})
    gen = lambda **kw: g.generate("1, 2, 3,", chat=False, **{"max_tokens": 4, **kw})
    ways = {"chat": chat, "completion": comp, "call": call, "generate": gen}

    for name, way in ways.items():
        for case, kw in {
            "seed -1": dict(seed=-1), "seed 4294967295": dict(seed=4294967295), "seed -5": dict(seed=-5),
            "seed 2^63": dict(seed=1 << 63), "seed -2^63-1": dict(seed=-(1 << 63) - 1),
            "temperature inf": dict(temperature=float("inf")), "temperature nan": dict(temperature=float("nan")),
            "temperature 1e-310": dict(temperature=1e-310), "temperature -1": dict(temperature=-1),
            "top_p nan": dict(top_p=float("nan")), "min_p inf": dict(min_p=float("inf")),
            "temperature str": dict(temperature="hot"), "max_tokens str": dict(max_tokens="5"),
            "max_tokens float": dict(max_tokens=2.5), "max_tokens -2": dict(max_tokens=-2),
            "seed float": dict(seed=1.5), "stop int": dict(stop=5), "top_k str": dict(top_k="x"),
            "unknown max_token": dict(max_token=5),
            **{f"{f} str": {f: "x"} for f in ("top_p", "min_p", "repeat_penalty", "presence_penalty",
                                              "frequency_penalty", "seed")},
            "stream stream": dict(stream=True),
        }.items():
            if name == "generate" and case == "stream stream":
                continue
            report(f"{name}: {case}", lambda: way(**kw))
        if name != "generate":   # llama-cpp-python's arguments: neutral values pass, the rest are refused
            for case, kw in {"mirostat_mode 2": dict(mirostat_mode=2), "tfs_z 0.5": dict(tfs_z=0.5),
                             "typical_p 0.5": dict(typical_p=0.5), "grammar": dict(grammar=object()),
                             "logits_processor": dict(logits_processor=[lambda ids, scores: scores]),
                             "n 2": dict(n=2), "logit_bias": dict(logit_bias={1: 5.0}),
                             "neutral": dict(mirostat_mode=0, tfs_z=1.0, typical_p=1.0, mirostat_tau=5.0,
                                             mirostat_eta=0.1, logits_processor=None, grammar=None, logit_bias=None),
                             "openai names": dict(max_completion_tokens=3, stream_options={"include_usage": True},
                                                  user="u", stream=True)}.items():
                report(f"{name}: {case}", lambda: way(**kw))
    report("completion: stopping_criteria", lambda: comp(stopping_criteria=[lambda ids, scores: False]))
    report("completion: logprobs 3", lambda: comp(logprobs=3))
    report("chat: logprobs", lambda: chat(logprobs=True))
    report("chat: stopping_criteria (not a chat argument)", lambda: chat(stopping_criteria=[]))
    report("chat: messages str", lambda: g.create_chat_completion("hi"))
    report("chat: messages empty", lambda: g.create_chat_completion([]))
    report("chat: role wizard", lambda: g.create_chat_completion([{"role": "wizard", "content": "x"}]))
    report("completion: prompt int", lambda: g.create_completion(5))
    report("generate: prompt int", lambda: g.generate(5))
    report("generate: chat str", lambda: g.generate("hi", chat="yes"))
    report("generate: id int", lambda: g.generate("hi", id=5))
    for way, fn in (("chat", chat), ("completion", comp)):
        for case, kw in {"stream str": dict(stream="yes"), "stream_options str": dict(stream_options="x"),
                         "model int": dict(model=5), "user int": dict(user=5)}.items():
            report(f"{way}: {case}", lambda: fn(**kw))
    report("generate: Request and keywords", lambda: g.generate(Request("1, 2, 3,", chat=False), max_tokens=2))

    long_text = "one two three four five six seven " * 60   # > 256 tokens
    report("generate: prompt longer than the context", lambda: g.generate(long_text))
    report("chat: prompt longer than the context", lambda: g.create_chat_completion([{"role": "user",
                                                                                      "content": long_text}]))
    report("completion: prompt longer than the context", lambda: g.create_completion(long_text))
    many = list(g.generate_many([long_text, "1, 2,"], parallel=1))
    print(json.dumps({"case": "generate_many: long prompt", "errors": [r.error is not None for r in many],
                      "message": str(next(r.error for r in many if r.error))}), flush=True)

    # Two streams in one thread: the second is refused while the first is open; the first goes on.
    first = g.create_completion("1, 2, 3,", max_tokens=6, stream=True)
    next(first)
    report("two streams in one thread", lambda: g.create_completion("4, 5,", max_tokens=4, stream=True))
    report("first stream goes on", lambda: first)

    # Two threads streaming from one Generator: served in turn, each its own full answer.
    texts, errors = {}, []

    def stream_in_thread(key):
        try:
            texts[key] = "".join(c["choices"][0]["text"]
                                 for c in g.create_completion("1, 2, 3, 4,", max_tokens=12, stream=True))
        except BaseException as e:
            errors.append(repr(e))

    threads = [threading.Thread(target=stream_in_thread, args=(k,)) for k in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    alone = g.create_completion("1, 2, 3, 4,", max_tokens=12)["choices"][0]["text"]
    print(json.dumps({"case": "two threads", "texts": texts, "errors": errors, "alone": alone,
                      "model": str(g.resolved.target_path)}), flush=True)

    # A stream another thread is reading when close() comes: its next step is a UsageError.
    started, closed, seen = threading.Event(), threading.Event(), []

    def reader():
        try:
            for i, _ in enumerate(g.create_completion("1, 2, 3,", max_tokens=200, stream=True)):
                if i == 1:
                    started.set()
                    closed.wait()
            seen.append("finished")
        except BaseException as e:
            seen.append((type(e).__name__, isinstance(e, UsageError), str(e)))

    t = threading.Thread(target=reader)
    t.start()
    started.wait()
    late = g.create_completion("1, 2,", max_tokens=50, stream=True)   # made (prompt tokenized) before close
    g.close()
    closed.set()
    t.join()
    print(json.dumps({"case": "stream in another thread, then close", "seen": seen}), flush=True)
    report("stream made before close, read after", lambda: late)
    report("generate after close", lambda: g.generate("hi"))
    report("chat after close", lambda: g.create_chat_completion(M))
    g.close()   # idempotent
    print("done", flush=True)
''')


@pytest.fixture(scope="module")
def storm(tmp_path_factory):
    script = tmp_path_factory.mktemp("storm") / "storm.py"
    script.write_text(_STORM)
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=child_env(),
                       timeout=HANG_GUARD_S)
    assert p.returncode == 0, (p.returncode, p.stdout[-3000:], p.stderr[-3000:])   # -11: a segfault
    assert p.stdout.endswith("done\n"), p.stdout[-2000:]
    return {d["case"]: d for d in map(json.loads, p.stdout.splitlines()[:-1])}


WAYS = ("chat", "completion", "call", "generate")
REFUSED = {   # case -> (exception type, what the message says)
    "seed 2^63": ("UsageError", "seed must be a 64-bit integer"),
    "seed -2^63-1": ("UsageError", "seed must be a 64-bit integer"),
    "temperature inf": ("UsageError", "temperature must be a finite number"),
    "temperature nan": ("UsageError", "temperature must be"),
    "temperature 1e-310": ("UsageError", "temperature must be a finite number"),
    "temperature -1": ("UsageError", "temperature must be"),
    "top_p nan": ("UsageError", "top_p must be"),
    "min_p inf": ("UsageError", "min_p must be"),
    "temperature str": ("UsageError", "temperature must be a number"),
    "max_tokens str": ("UsageError", "max_tokens must be an integer"),
    "max_tokens float": ("UsageError", "max_tokens must be an integer"),
    "max_tokens -2": ("UsageError", "max_tokens must be"),
    "seed float": ("UsageError", "seed must be an integer"),
    "stop int": ("UsageError", "stop must be a string or an array of strings"),
    "top_k str": ("UsageError", "top_k must be an integer"),
    "unknown max_token": ("TypeError", "unexpected keyword argument 'max_token'"),
    **{f"{f} str": ("UsageError", f"{f} must be") for f in ("top_p", "min_p", "repeat_penalty", "presence_penalty",
                                                            "frequency_penalty")},
    "seed str": ("UsageError", "seed must be an integer"),
}
OPENAI_REFUSED = {
    "mirostat_mode 2": "mirostat_mode is not supported", "tfs_z 0.5": "tfs_z is not supported",
    "typical_p 0.5": "typical_p is not supported",
    # llama-cpp-python's grammar is a LlamaGrammar object; llamaspec takes GBNF text (issue 26)
    "grammar": "grammar must be a string",
    "logits_processor": "logits_processor is not supported", "n 2": "n is not supported",
}


def _refused(d: dict, kind: str, needle: str) -> None:
    assert not d.get("ok"), d
    assert d["type"] == kind or (kind == "UsageError" and d["usage"]), d
    assert needle in d["message"], d


@pytest.mark.parametrize("way", WAYS)
def test_bad_values_are_clear_errors(storm, way):
    for case, (kind, needle) in REFUSED.items():
        _refused(storm[f"{way}: {case}"], kind, needle)
    for case in ("seed -1", "seed 4294967295", "seed -5"):
        assert storm[f"{way}: {case}"].get("ok"), storm[f"{way}: {case}"]
    if way != "generate":
        assert storm[f"{way}: stream stream"].get("ok")


@pytest.mark.parametrize("way", ("chat", "completion", "call"))
def test_llama_cpp_python_arguments(storm, way):
    for case, needle in OPENAI_REFUSED.items():
        _refused(storm[f"{way}: {case}"], "UsageError", needle)
    assert storm[f"{way}: neutral"].get("ok") and storm[f"{way}: openai names"].get("ok")
    assert storm[f"{way}: logit_bias"].get("ok"), storm[f"{way}: logit_bias"]   # supported since issue 26


def test_other_misuse(storm):
    _refused(storm["completion: stopping_criteria"], "UsageError", "stopping_criteria is not supported")
    assert storm["completion: logprobs 3"].get("ok") and storm["chat: logprobs"].get("ok")   # issue 26
    _refused(storm["chat: stopping_criteria (not a chat argument)"], "TypeError", "stopping_criteria")
    _refused(storm["chat: messages str"], "UsageError", "messages must be a non-empty array")
    _refused(storm["chat: messages empty"], "UsageError", "messages must be a non-empty array")
    _refused(storm["chat: role wizard"], "UsageError", "messages[0].role must be one of")
    _refused(storm["completion: prompt int"], "UsageError", "prompt must be a string")
    _refused(storm["generate: prompt int"], "UsageError", "prompt must be text or a list of chat messages")
    assert storm["generate: Request and keywords"].get("ok")
    _refused(storm["generate: chat str"], "UsageError", "chat must be True or False")
    _refused(storm["generate: id int"], "UsageError", "id must be a string")
    for way in ("chat", "completion"):
        _refused(storm[f"{way}: stream str"], "UsageError", "stream must be a boolean")
        _refused(storm[f"{way}: stream_options str"], "UsageError", "stream_options must be an object")
        _refused(storm[f"{way}: model int"], "UsageError", "model must be a string")
        _refused(storm[f"{way}: user int"], "UsageError", "user must be a string")


def test_prompt_longer_than_the_context(storm):
    for way in ("generate", "chat", "completion"):
        d = storm[f"{way}: prompt longer than the context"]
        _refused(d, "PromptTooLong", "longer than the context of 256 tokens")
        assert d["usage"], d
    many = storm["generate_many: long prompt"]
    assert many["errors"] == [True, False] and "longer than the context" in many["message"]


def test_streams_and_threads(storm):
    """Two threads streaming from one Generator are each served their whole answer: the text a
    call alone gives (runs after the first reuse the cached prompt, another batch shape: identical,
    or first different at a near-tie, as tests/test_openai_api.py judges)."""
    from engine_helpers import same_text_or_near_tie
    from llamaspec.runtime.llama import Model

    _refused(storm["two streams in one thread"], "UsageError", "already generating in this thread")
    assert storm["first stream goes on"].get("ok")
    two = storm["two threads"]
    assert two["errors"] == [] and set(two["texts"]) == {"a", "b"} and two["alone"].strip(), two
    target = Model(two["model"])
    try:
        prompt = target.tokenize_prompt("1, 2, 3, 4,")   # create_completion: raw text
        for key in ("a", "b"):
            print(same_text_or_near_tie(target, prompt, two["alone"], two["texts"][key], 1.1, f"thread {key}"))
    finally:
        target.close()


def test_close(storm):
    seen = storm["stream in another thread, then close"]["seen"]
    assert len(seen) == 1 and seen[0][:2] == ["UsageError", True] and "closed" in seen[0][2], seen
    for case in ("stream made before close, read after", "generate after close", "chat after close"):
        _refused(storm[case], "UsageError", "closed")
    _refused(storm["ctor seed 2^63"], "UsageError", "seed must be a 64-bit integer")
    _refused(storm["ctor temperature inf"], "UsageError", "temperature must be a finite number")


def test_context_owner_frees_only_when_unused():
    """The rule under the API (llamaspec/api/ownership.py): close() frees at once when nothing uses
    the models, else when the owner (a generation) and the readers (tokenizing) are done; after
    close() a new owner or reader is refused."""
    import threading

    from llamaspec.api.ownership import ContextOwner
    from llamaspec.errors import UsageError

    freed: list[int] = []
    owner = ContextOwner(lambda: freed.append(1))
    with owner.reading():
        owner.acquire()
        owner.close()
        assert freed == [] and owner.closed
        with pytest.raises(UsageError, match="closed while this generation was open"):
            owner.check()
        owner.release()
        assert freed == []          # a reader is still at work
    assert freed == [1]
    for use in (owner.acquire, lambda: owner.reading().__enter__()):
        with pytest.raises(UsageError, match="this Generator is closed"):
            use()
    owner.close()
    assert freed == [1]             # idempotent

    second = ContextOwner(lambda: None)
    second.acquire()
    with pytest.raises(UsageError, match="already generating in this thread"):
        second.acquire()
    got: list[str] = []
    waiter = threading.Thread(target=lambda: (second.acquire(), got.append("served"), second.release()))
    waiter.start()
    second.release()                # the other thread's turn
    waiter.join(HANG_GUARD_S)
    assert got == ["served"]
