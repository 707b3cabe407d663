"""One rule for `stop` (openai.fields.parse_stop), wherever a stop comes in: a request body (the
server and create_chat_completion / create_completion), a batch line (both forms), the Python API
(Request, GenerationOptions) and `--stop`. A string or a list of strings; empty strings dropped, as
OpenAI does; anything else refused naming the field, in the caller's own error type."""

from __future__ import annotations

import json

import pytest

from llamaspec.openai import requests as oa_req
from llamaspec.batch import LineError, parse_requests
from llamaspec.batch import Request as LineRequest
from llamaspec.errors import UsageError
from llamaspec.api.options import GenerationOptions, check_stop

MSG = [{"role": "user", "content": "x"}]


def _line(stop, form: str) -> LineRequest | LineError:
    if form == "plain":
        text = json.dumps({"prompt": "x", "stop": stop})
    else:
        text = json.dumps({"custom_id": "c", "url": "/v1/chat/completions", "body": {"messages": MSG, "stop": stop}})
    (item,) = parse_requests([text])
    return item


def _every_way(stop) -> dict[str, object]:
    """The stop strings each way in makes of `stop` (None in a request: no stop of its own)."""
    return {"parse_stop": oa_req.parse_stop(stop),
            "chat body": oa_req.parse_chat({"messages": MSG, "stop": stop}).fields["stop"] or [],
            "completion body": oa_req.parse_completion({"prompt": "x", "stop": stop}).fields["stop"] or [],
            "batch line": _line(stop, "plain").fields["stop"] or [],
            "batch OpenAI body": _line(stop, "openai").fields["stop"] or [],
            "check_stop": list(check_stop(stop)),
            "GenerationOptions": list(GenerationOptions(stop=stop).stop)}


@pytest.mark.parametrize("stop, expected", [("", []), (["", "x"], ["x"]), ([""], []), ("x", ["x"]),
                                            (["x", "y"], ["x", "y"])])
def test_empty_stop_strings_are_dropped_everywhere_alike(stop, expected):
    assert _every_way(stop) == {k: expected for k in _every_way(stop)}


def test_empty_and_list_with_empty_mean_what_the_empty_strings_leave():
    assert _every_way("") == _every_way([]) == _every_way(None)
    assert _every_way(["", "x"]) == _every_way("x")


@pytest.mark.parametrize("stop", [[1], 7, ["a", None], {"a": 1}])
def test_non_strings_are_refused_everywhere_naming_stop(stop):
    with pytest.raises(oa_req.RequestError) as e:
        oa_req.parse_stop(stop)
    assert e.value.param == "stop" and e.value.message.startswith("stop must be a string or an array of strings")
    for parse in (oa_req.parse_chat, oa_req.parse_completion):
        body = {"messages": MSG} if parse is oa_req.parse_chat else {"prompt": "x"}
        with pytest.raises(oa_req.RequestError) as e:
            parse({**body, "stop": stop})
        assert e.value.param == "stop"
    for form in ("plain", "openai"):
        err = _line(stop, form)
        assert isinstance(err, LineError) and err.param == "stop" and err.message.startswith("stop must be")
    for call in (check_stop, lambda s: GenerationOptions(stop=s)):
        with pytest.raises(UsageError, match="^stop must be"):
            call(stop)


def test_run_stop_flag_takes_an_empty_string(run_cli, tiny_models):
    """`--stop ""` is no stop string (it used to be refused): the same tokens as no --stop."""
    common = ["run", tiny_models["target"], "--raw", "-p", "hi", "-n", "6", "--temp", "0", "--spec-type", "none",
              "-t", "1", "--json"]
    plain = run_cli(*common)
    empty = run_cli(*common, "--stop", "")
    assert plain.exit_code == 0 and empty.exit_code == 0, empty.stderr
    assert json.loads(empty.stdout)["tokens"] == json.loads(plain.stdout)["tokens"]
    assert json.loads(empty.stdout)["n_generated"] == 6


def test_generator_requests_follow_the_same_rule(tiny_models):
    """Request(stop=["", X]) stops where Request(stop=[X]) does; [1] is a UsageError naming stop."""
    from llamaspec.api.generator import Generator, Request

    with Generator(tiny_models["target"], spec_type="none", temperature=0, max_tokens=12, threads=1,
                   chat=False) as g:
        full = g.generate(Request("hi"))
        cut = full.text[len(full.text) // 2:][:2]   # a stop string the greedy text holds
        assert cut.strip(), f"the tiny model's text {full.text!r} has no piece to stop at"
        with_empty, alone = g.generate(Request("hi", stop=["", cut])), g.generate(Request("hi", stop=[cut]))
        assert with_empty.text == alone.text and alone.finish_reason == "stop" and len(alone.text) < len(full.text)
        assert g.generate(Request("hi", stop="")).text == full.text
        out = g.create_completion("hi", stop=["", cut])
        assert out["choices"][0]["text"] == alone.text
        with pytest.raises(UsageError, match="^stop must be"):
            g.generate(Request("hi", stop=[1]))
        with pytest.raises(UsageError, match="^stop must be"):
            g.create_completion("hi", stop=[1])
