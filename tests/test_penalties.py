"""presence_penalty / frequency_penalty (llama.cpp's penalties sampler) from every way in: the
flags, Generator(...), per-request fields, OpenAI bodies and batch lines; validated in OpenAI's
[-2, 2]; and lossless under speculation (a penalty depends on the tokens before each position,
accepted draft tokens included), on a real model."""

from __future__ import annotations

import json

import pytest

from llamaspec.openai import requests as oa_req
from llamaspec.batch import LineError, parse_requests
from llamaspec.errors import UsageError
from llamaspec.api.generator import Generator, Request
from llamaspec.speculative.sampling_params import SamplingParams

FIELDS = ("presence_penalty", "frequency_penalty")
# SmolLM2 F16, raw, greedy, 40 tokens: prompt-lookup drafts from the code and accepts some of it
# under either penalty of 0.5, and each changes the text ("numbers `a`" -> "numbers a").
CODE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n"
N = 40


# ---- validation ----------------------------------------------------------------------------------

@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("value", [2.5, -2.01, "0.5", True, float("nan"), None])
def test_sampling_params_refuse_values_outside_openai_range_naming_the_field(field, value):
    with pytest.raises(UsageError, match=f"^{field} must be "):   # (in [-2, 2], a number, finite)
        SamplingParams(**{field: value})


@pytest.mark.parametrize("field", FIELDS)
def test_sampling_params_take_the_whole_range(field):
    for value in (-2, -0.5, 0, 1.5, 2):
        assert getattr(SamplingParams(**{field: value}), field) == value
    assert SamplingParams(**{field: 0.5}).penalties_on and not SamplingParams().penalties_on


@pytest.mark.parametrize("flag, value", [("--presence-penalty", "2.5"), ("--frequency-penalty", "-3")])
def test_flags_out_of_range_are_usage_errors(run_cli, tiny_models, flag, value):
    r = run_cli("run", tiny_models["target"], "-p", "hi", "-n", "2", flag, value)
    assert r.exit_code == 2 and f"{flag} must be in [-2, 2]" in r.stderr and "Traceback" not in r.stderr


def test_flags_reach_the_generator(run_cli, tiny_models, generator_options):
    seen = generator_options
    r = run_cli("run", tiny_models["target"], "--raw", "-p", "hi", "-n", "2", "--temp", "0", "--spec-type", "none",
                "-t", "1", "--presence-penalty", "0.25", "--frequency-penalty", "-0.5", "--json")
    assert r.exit_code == 0, r.stderr
    assert (seen[0].sampling.presence_penalty, seen[0].sampling.frequency_penalty) == (0.25, -0.5)


@pytest.mark.parametrize("field", FIELDS)
def test_openai_bodies_parse_penalties(field):
    for parse, body in ((oa_req.parse_chat, {"messages": [{"role": "user", "content": "x"}]}),
                        (oa_req.parse_completion, {"prompt": "x"})):
        assert Request(**parse({**body, field: 0.5}).fields).__dict__[field] == 0.5
        assert parse(body).fields[field] is None   # absent: the Generator's own
        with pytest.raises(oa_req.RequestError) as e:
            parse({**body, field: "high"})
        assert e.value.param == field and e.value.message == f"{field} must be a number, got string"


@pytest.mark.parametrize("field", FIELDS)
def test_batch_lines_take_penalties_in_both_forms(field):
    plain = json.dumps({"prompt": "x", field: -1.5})
    body = json.dumps({"custom_id": "c", "url": "/v1/completions", "body": {"prompt": "x", field: 0.5}})
    a, b = parse_requests([plain, body])
    assert a.fields[field] == -1.5 and b.fields[field] == 0.5
    for bad, message in ((3, f"{field} must be in [-2, 2], got 3"), ("x", f"{field} must be a number, got string")):
        for line in (json.dumps({"prompt": "x", field: bad}),
                     json.dumps({"custom_id": "c", "url": "/v1/completions", "body": {"prompt": "x", field: bad}})):
            (err,) = parse_requests([line])
            assert isinstance(err, LineError) and err.param == field and err.message == message


# ---- on a real model -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def plain(smollm2_f16):
    with Generator(smollm2_f16, spec_type="none", temperature=0, max_tokens=N, threads=2, chat=False) as g:
        yield g


# DAYS with repeat_last_n 8: the day names prompt-lookup drafts were last seen further back than the
# window, so a verify step's accepted draft tokens are what puts them in it. Verification that
# penalized with the tokens before the step only (not history + the draft tokens accepted so far)
# gives other tokens here, for either penalty (checked by patching it so). SmolLM2 F16, raw, greedy,
# a fixed draft length; the penalized top-2 logit gap along the text is >= 0.10, above the batch vs
# one-token noise of F16 logits (README), so plain and speculative decoding cannot flip on a near-tie.
DAYS = "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday, Monday, Tuesday,"


@pytest.mark.real
@pytest.mark.parametrize("field", FIELDS)
def test_penalty_under_speculation_is_plain_decoding_with_the_penalty(smollm2_f16, field):
    common = dict(temperature=0, max_tokens=N, threads=2, chat=False, repeat_last_n=8)
    with Generator(smollm2_f16, spec_type="none", **common) as g:
        ref = g.generate(Request(DAYS, **{field: 0.5}))
    with Generator(smollm2_f16, spec_type="prompt-lookup", adaptive=False, **common) as g:
        spec = g.generate(Request(DAYS, **{field: 0.5}))
    assert spec.stats["accepted"] > 0, "no draft token was accepted: the test checks nothing"
    assert spec.tokens == ref.tokens


@pytest.mark.real
def test_run_with_a_penalty_gives_plain_decoding_s_tokens(run_cli, smollm2_f16, plain):
    """The flags end to end: `run --spec-type prompt-lookup --frequency-penalty` prints the tokens
    of `--spec-type none` with the same penalty, and they are not the tokens without it."""
    common = ["run", smollm2_f16, "--raw", "-p", CODE, "-n", str(N), "--temp", "0", "-t", "2", "--json",
              "--frequency-penalty", "0.5"]
    runs = {spec: run_cli(*common, "--spec-type", spec, "--fixed-draft") for spec in ("none", "prompt-lookup")}
    assert all(r.exit_code == 0 for r in runs.values()), runs["prompt-lookup"].stderr
    plain_out, spec_out = (json.loads(runs[k].stdout) for k in ("none", "prompt-lookup"))
    assert spec_out["accepted"] > 0 and spec_out["tokens"] == plain_out["tokens"]
    assert plain_out["tokens"] != plain.generate(CODE).tokens


@pytest.mark.real
@pytest.mark.parametrize("field", FIELDS)
def test_each_penalty_changes_the_text(plain, field):
    assert plain.generate(Request(CODE, **{field: 0.5})).tokens != plain.generate(CODE).tokens


@pytest.mark.real
def test_generator_default_penalty_applies_and_a_request_overrides_it(smollm2_f16, plain):
    with Generator(smollm2_f16, spec_type="prompt-lookup", temperature=0, max_tokens=N, threads=2, chat=False,
                   adaptive=False, presence_penalty=0.5) as g:
        assert g.describe()["presence_penalty"] == 0.5 and g.describe()["frequency_penalty"] == 0.0
        assert g.generate(CODE).tokens == plain.generate(Request(CODE, presence_penalty=0.5)).tokens
        assert g.generate(Request(CODE, presence_penalty=0.0)).tokens == plain.generate(CODE).tokens


@pytest.mark.real
def test_openai_methods_apply_penalties_and_name_a_bad_one(plain):
    want = plain.generate(Request(CODE, frequency_penalty=0.5)).text
    assert plain.create_completion(CODE, frequency_penalty=0.5)["choices"][0]["text"] == want
    assert plain.create_completion(CODE)["choices"][0]["text"] != want
    for field in FIELDS:
        with pytest.raises(UsageError, match=f"^{field} must be in \\[-2, 2\\], got 2.5"):
            plain.create_completion(CODE, **{field: 2.5})
        with pytest.raises(UsageError, match=f"^{field}"):
            plain.generate(Request(CODE, **{field: -3}))


@pytest.mark.real
def test_batch_applies_penalties_per_line_and_resumes_only_with_the_same(run_cli, smollm2_f16, plain, tmp_path):
    """A line's penalty, a body's penalty and --frequency-penalty all apply; a job started without
    the flag has no penalty in its manifest (jobs of older versions resume) and refuses it later."""
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text(json.dumps({"id": "fp", "prompt": CODE, "frequency_penalty": 0.5}) + "\n"
                   + json.dumps({"id": "none", "prompt": CODE}) + "\n"
                   + json.dumps({"custom_id": "pp", "url": "/v1/completions",
                                 "body": {"prompt": CODE, "presence_penalty": 0.5}}) + "\n")
    common = ["batch", smollm2_f16, inp, "-o", out, "--raw", "--temp", "0", "-n", str(N), "-t", "2",
              "--spec-type", "prompt-lookup", "--fixed-draft"]
    r = run_cli(*common)
    assert r.exit_code == 0, r.stderr
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    text = {x.get("custom_id") or x["id"]: x["response"]["body"]["choices"][0]["text"] if "response" in x
            else x["text"] for x in recs}
    assert text["fp"] == plain.generate(Request(CODE, frequency_penalty=0.5)).text
    assert text["pp"] == plain.generate(Request(CODE, presence_penalty=0.5)).text
    assert text["none"] == plain.generate(CODE).text != text["fp"]
    settings = json.loads((tmp_path / "out.jsonl.llamaspec.json").read_text())["settings"]
    assert not set(FIELDS) & set(settings)
    r = run_cli(*common, "--frequency-penalty", "0.5")
    assert r.exit_code == 2 and "frequency_penalty was (absent), now 0.5" in r.stderr
