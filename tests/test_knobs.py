"""The knob table (llamaspec/knobs.py): every sampling and drafting setting declared once, and
everything that shows or checks one reads it: `run --help`, `Generator`'s signature, SamplingParams
and GenerationOptions, the request models (HTTP bodies, batch lines in both forms) and describe().
A value out of range gets the same verdict and the same message everywhere, its field carried by
the UsageError (`field`), not recovered from the message."""

from __future__ import annotations

import dataclasses
import doctest
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from llamaspec import knobs
from llamaspec.batch.requests import LineError, parse_requests
from llamaspec.errors import UsageError
from llamaspec.api.options import GenerationOptions
from llamaspec.api.generator import Generator, Request
from llamaspec.openai import requests as oa_req
from llamaspec.speculative.sampling_params import SamplingParams

REPO = Path(__file__).resolve().parents[1]
MESSAGES = [{"role": "user", "content": "x"}]


def _bad(k: knobs.Knob):
    """A value just out of the knob's range (a wrong type for one without a range)."""
    if k.kind is int and k.low is None:
        return 1 << 64 if k.name == "seed" else "many"   # (seed: past int64; top_k: not an integer)
    if k.low is not None:
        return k.low if k.open_low else k.low - 1
    return k.high + 1


def test_doctests():
    from llamaspec import errors
    from llamaspec.speculative import sampling_params

    for mod in (knobs, errors, sampling_params):
        r = doctest.testmod(mod)
        assert r.failed == 0 and r.attempted > 0, mod.__name__


def test_the_defaults_are_llama_cpps():
    d = knobs.DEFAULT
    assert (d.temperature, d.top_k, d.top_p, d.min_p, d.repeat_penalty, d.repeat_last_n) == (0.8, 40, 0.95, 0.05, 1.0, 64)
    assert (d.presence_penalty, d.frequency_penalty, d.seed, d.max_tokens) == (0.0, 0.0, None, None)
    assert (d.draft_max, d.draft_min, d.draft_p_min) == (None, 0, 0.0)


def test_every_knob_is_declared_once_with_its_flags_help_and_a_valid_default():
    flags = [f for k in knobs.KNOBS.values() for f in k.flags]
    assert len(flags) == len(set(flags))
    for name, k in knobs.KNOBS.items():
        assert k.name == name and k.help and k.flags and all(f.startswith("-") for f in k.flags)
        assert knobs.check(name, k.default) == k.default and knobs.check(name, k.cli) == k.cli
    assert set(knobs.SAMPLING) | set(knobs.DRAFTING) | {"max_tokens"} == set(knobs.KNOBS)


def test_run_help_shows_each_knobs_table_default():
    r = subprocess.run([sys.executable, "-m", "llamaspec", "run", "--help"], capture_output=True, text=True,
                       env={**os.environ, "COLUMNS": "200", "TERM": "dumb", "PYTHONPATH": str(REPO)}, timeout=120)
    assert r.returncode == 0, r.stderr
    blocks = re.split(r"\n(?=\s{2}-)", r.stdout)   # one option per block (its help wraps under it)
    for k in knobs.KNOBS.values():
        (block,) = [b for b in blocks if b.strip().startswith(", ".join(k.flags) + " ")]
        text = "".join(block.split())   # (without whitespace: the help wraps, at hyphens too)
        assert "".join(k.help.split()) in text, (k.name, block)
        if k.cli is None:
            assert "[default:" not in text, (k.name, block)
        else:
            assert f"[default:{k.cli}]" in text, (k.name, block)


def test_generator_signature_and_the_options_types_default_to_the_table():
    params = inspect.signature(Generator).parameters
    for name, k in knobs.KNOBS.items():
        assert params[name].default == k.default, name
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
    sampling = {f.name: f.default for f in dataclasses.fields(SamplingParams)}
    options = {f.name: f.default for f in dataclasses.fields(GenerationOptions)}
    for name in knobs.SAMPLING:
        assert sampling[name] == knobs.KNOBS[name].default, name
    for name in (*knobs.DRAFTING, "max_tokens"):
        assert options[name] == knobs.KNOBS[name].default, name


def test_the_per_request_knobs_are_fields_of_every_request_type():
    request = {f.name for f in dataclasses.fields(Request)}
    for name in knobs.PER_REQUEST:
        assert name in request and name in oa_req.ChatBody.model_fields and knobs.KNOBS[name].wire == name


@pytest.mark.parametrize("name", knobs.PER_REQUEST)
def test_request_models_take_the_default_and_refuse_out_of_range_naming_the_field(name):
    k = knobs.KNOBS[name]
    ok = k.default if k.default is not None else 7
    assert oa_req.parse_chat({"messages": MESSAGES, name: ok}).fields[name] == ok
    (line,) = parse_requests([json.dumps({"prompt": "x", name: ok})])
    assert line.fields[name] == ok
    bad = _bad(k)
    with pytest.raises(UsageError) as python:
        knobs.check(name, bad)
    want = python.value.message
    assert python.value.field == name and want.startswith(f"{name} must be ")
    for parse, body in ((oa_req.parse_chat, {"messages": MESSAGES}), (oa_req.parse_completion, {"prompt": "x"})):
        with pytest.raises(oa_req.RequestError) as e:
            parse({**body, name: bad})
        assert (e.value.param, e.value.field, e.value.message) == (name, name, want)
    for form in ({"prompt": "x", name: bad},
                 {"custom_id": "c", "url": "/v1/chat/completions", "body": {"messages": MESSAGES, name: bad}}):
        (err,) = parse_requests([json.dumps(form)])
        assert isinstance(err, LineError) and (err.param, err.message) == (name, want)
    with pytest.raises(UsageError) as e:   # the Python API's keywords: SamplingParams, as Generator(...) builds it
        SamplingParams(**{name: bad})
    assert (e.value.field, e.value.message) == (name, want)


@pytest.mark.parametrize("name", [n for n, k in knobs.KNOBS.items() if k.low is not None or k.high is not None])
def test_the_cli_refuses_out_of_range_with_the_tables_words_and_its_flag(run_cli, tmp_path, name):
    k = knobs.KNOBS[name]
    bad = _bad(k)
    r = run_cli("run", tmp_path / "missing.gguf", "-p", "hi", k.flags[0], str(bad))   # (before any model is opened)
    with pytest.raises(UsageError) as e:
        knobs.check(name, bad, k.spelled)   # (the text read as a JSON number would be)
    assert r.exit_code == 2 and e.value.message in r.stderr, (r.stderr, e.value.message)


def test_draft_min_over_draft_max_is_one_rule():
    with pytest.raises(UsageError, match="^draft_min 5 exceeds draft_max 2$") as e:
        GenerationOptions(draft_min=5, draft_max=2)
    assert e.value.field == "draft_min"
    with pytest.raises(UsageError, match="^--draft-min 5 exceeds --draft-max 2$"):
        knobs.check_draft_min(5, 2, flags=True)
    with pytest.raises(UsageError, match=r"^--draft-min 9 exceeds the draft length 8 \(draft-simple's default\)$"):
        knobs.check_draft_min(9, 8, flags=True, resolved=" (draft-simple's default)")


def test_logit_bias_has_one_limit():
    from llamaspec.api.constraints import check_logit_bias
    from llamaspec.api.preparation import checked
    from llamaspec.api.request import Request

    assert knobs.bias_ok(-knobs.BIAS_LIMIT) and knobs.bias_ok(float("-inf")) and not knobs.bias_ok(knobs.BIAS_LIMIT + 1)
    with pytest.raises(oa_req.RequestError) as http:
        oa_req.parse_chat({"messages": MESSAGES, "logit_bias": {"3": 101}})
    with pytest.raises(UsageError) as python:   # the Python API's Request: the same parser (check_fields)
        checked(Request("x", logit_bias={3: 101}))
    assert http.value.message == python.value.message == "logit_bias[3] must be a number from -100 to 100, got 101"
    assert http.value.field == python.value.field == "logit_bias"
    assert check_logit_bias({3: 1.0}, 10) == {3: 1.0}   # (then only the ids, against the vocabulary)


def test_describe_reports_the_table_defaults(tiny_models):
    with Generator(tiny_models["target"], spec_type="none", threads=1, ctx_size=256, tuned=False) as g:
        d = g.describe()
    for name in knobs.SAMPLING:
        assert d[name] == knobs.KNOBS[name].default, name
    assert (d["draft_min"], d["draft_p_min"]) == (knobs.DEFAULT.draft_min, knobs.DEFAULT.draft_p_min)
    assert "draft_max" in d
