"""`llamaspec batch` with structured output on SmolLM2 F16, greedy: OpenAI batch-form lines with
response_format json_schema (every record validates with jsonschema and is an SDK ChatCompletion),
logprobs and tool calls in the record bodies, and plain lines taking the same fields through the
same parser (guided_choice, logprobs in the record)."""

from __future__ import annotations

import json

import jsonschema
import pytest
from openai.types.chat import ChatCompletion

pytestmark = [pytest.mark.real, pytest.mark.slow]

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
          "required": ["city", "country"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                          "required": ["city"]}}}]
TEXTS = ["I flew from Lyon last week.", "Greetings from Osaka!", "The conference is in Porto this year."]


def _openai_line(cid: str, body: dict) -> dict:
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body}


def test_openai_form_lines_with_a_json_schema(run_cli, smollm2_f16, tmp_path):
    fmt = {"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA, "strict": True}}
    rows = [_openai_line(f"x{i}", {"messages": [{"role": "user", "content": f"Extract the city and country: {t}"}],
                                   "max_tokens": 60, "response_format": fmt}) for i, t in enumerate(TEXTS)]
    rows.append(_openai_line("lp", {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 5,
                                    "logprobs": True, "top_logprobs": 2}))
    rows.append(_openai_line("tool", {"messages": [{"role": "user", "content": "Weather in Rome?"}], "max_tokens": 60,
                                      "tools": TOOLS, "tool_choice": "required"}))
    rows.append(_openai_line("both", {"messages": [{"role": "user", "content": "x"}], "response_format": fmt,
                                      "guided_choice": ["a"]}))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = run_cli("batch", smollm2_f16, inp, "-o", out, "--temp", "0", "-t", "1")
    assert r.exit_code == 1, r.stderr   # the "both" line fails, the others run
    recs = {x["custom_id"]: x for x in map(json.loads, out.read_text().splitlines())}
    for i in range(len(TEXTS)):
        body = ChatCompletion.model_validate(recs[f"x{i}"]["response"]["body"])
        jsonschema.validate(json.loads(body.choices[0].message.content), SCHEMA)
    lp = ChatCompletion.model_validate(recs["lp"]["response"]["body"])
    assert len(lp.choices[0].logprobs.content) == lp.usage.completion_tokens
    assert all(len(t.top_logprobs) == 2 for t in lp.choices[0].logprobs.content)
    tool = ChatCompletion.model_validate(recs["tool"]["response"]["body"]).choices[0]
    assert tool.finish_reason == "tool_calls" and tool.message.tool_calls[0].function.name == "get_weather"
    jsonschema.validate(json.loads(tool.message.tool_calls[0].function.arguments), TOOLS[0]["function"]["parameters"])
    err = recs["both"]["response"]
    assert err["status_code"] == 400 and err["body"]["error"]["param"] == "guided_choice"


def test_plain_lines_take_the_same_fields(run_cli, smollm2_f16, tmp_path):
    rows = [{"id": "c", "messages": [{"role": "user", "content": "Pick a colour."}], "max_tokens": 8,
             "guided_choice": ["red", "blue"], "logprobs": True, "top_logprobs": 1},
            {"id": "s", "prompt": "A city as JSON:", "max_tokens": 40, "json_schema": SCHEMA}]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = run_cli("batch", smollm2_f16, inp, "-o", out, "--temp", "0", "-t", "1")
    assert r.exit_code == 0, r.stderr
    recs = {x["id"]: x for x in map(json.loads, out.read_text().splitlines())}
    assert recs["c"]["text"] in ("red", "blue")
    assert len(recs["c"]["logprobs"]) == recs["c"]["n_generated"]
    assert all(len(lp["top"]) == 1 and lp["logprob"] <= 0 for lp in recs["c"]["logprobs"])
    jsonschema.validate(json.loads(recs["s"]["text"]), SCHEMA)
