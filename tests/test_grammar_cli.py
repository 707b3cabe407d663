"""Structured output as users get it: llama.cpp's --grammar, --grammar-file, -j/--json-schema and
-jf/--json-schema-file on `run`, `chat`, `batch` and `serve`, and the Python API's grammar,
json_schema, logit_bias and logprobs (Request fields and generate() keywords), on real models.
"""

from __future__ import annotations

import json
import math

import jsonschema
import pytest

from llamaspec.api.constraints import check_logit_bias, grammar_of
from llamaspec.openai.requests import check_fields
from llamaspec.errors import UsageError
from llamaspec.runtime.grammar import GrammarError, GrammarSpec

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
ASK = "Give the name and age of a fictional person as JSON."
GREEDY = ("--temp", "0", "-t", "1")


def _run(run_cli, *args):
    r = run_cli("run", *args)
    assert r.exit_code == 0, r.stderr
    return r


def _one_line_error(r, code: int = 2) -> str:
    """The one-line error a user sees: exit code, no traceback; returns the line."""
    assert r.exit_code == code, (r.exit_code, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


# ---- pure checks -------------------------------------------------------------------------------


def test_grammar_of_takes_one_of_gbnf_or_schema():
    assert grammar_of(None, None) is None
    spec = grammar_of('root ::= "a"', None)
    assert spec.gbnf == 'root ::= "a"' and spec.field == "grammar"
    schema = grammar_of(None, PERSON)
    props = json.loads(schema.schema)["properties"]   # (with the engine's bounds: schema_finite.py)
    assert schema.field == "json_schema" and props.keys() == PERSON["properties"].keys()
    assert all(props[k].items() >= v.items() for k, v in PERSON["properties"].items())
    assert grammar_of(None, True) == grammar_of(None, {})   # any JSON value
    given = GrammarSpec('root ::= "b"', field="response_format")
    assert grammar_of(given, None) is given   # a built spec keeps the field it names
    with pytest.raises(UsageError, match="grammar and json_schema both constrain the output"):
        grammar_of('root ::= "a"', {})
    with pytest.raises(UsageError, match="grammar must be a GBNF grammar"):
        grammar_of("  ", None)
    with pytest.raises(GrammarError, match="json_schema: 'uniqueItems'") as e:
        grammar_of(None, {"type": "array", "uniqueItems": True})
    assert e.value.field == "json_schema"


def test_logit_bias_and_logprobs_are_checked_as_openai_does():
    """By the one parser (openai/requests.py, every way in), then the ids against the vocabulary."""
    assert check_fields({"logit_bias": {3: -100, "4": 2.5, 5: -math.inf}})["logit_bias"] == {3: -100.0, 4: 2.5,
                                                                                          5: -math.inf}
    for bad, what in (({"x": 1}, "not a token id"), ({True: 1}, "not a token id"), ({1: 101}, "from -100 to 100"),
                      ({1: math.nan}, "from -100"), ({1: math.inf}, "from -100"), ({1: "1"}, "from -100"),
                      ([1], "must be an object mapping token ids")):
        with pytest.raises(UsageError, match=what):
            check_fields({"logit_bias": bad})
    assert check_logit_bias(None, 10) is None and check_logit_bias({3: -1.0}, 10) == {3: -1.0}
    for bad in ({10: 1.0}, {-1: 1.0}):
        with pytest.raises(UsageError, match="not a token id of this model"):
            check_logit_bias(bad, 10)
    assert check_fields({}).get("logprobs") is None and check_fields({"logprobs": 20})["logprobs"] == 20
    for bad in (21, -1, True, 2.0, "2"):
        with pytest.raises(UsageError, match="logprobs must be an integer from 0 to 20"):
            check_fields({"logprobs": bad})


# ---- the CLI's errors: one line naming the flag, exit 2, before any model loads (but the GBNF one)


def test_flag_errors_are_one_line_naming_the_flag(run_cli, tiny_models, tmp_path):
    model = tiny_models["target"]
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "latin1.gbnf").write_bytes(b'root ::= "\xe9"')
    (tmp_path / "empty.gbnf").write_text("\n")
    cases = [
        (("-jf", tmp_path / "missing.json"), "-jf/--json-schema-file: file not found"),
        (("--grammar-file", tmp_path / "missing.gbnf"), "--grammar-file: file not found"),
        (("--grammar-file", tmp_path), "--grammar-file: " + str(tmp_path) + " is a directory"),
        (("--grammar-file", tmp_path / "latin1.gbnf"), "is not UTF-8 text"),
        (("--grammar-file", tmp_path / "empty.gbnf"), "--grammar-file is empty"),
        (("-j", "{bad"), "-j/--json-schema is not valid JSON"),
        (("-jf", tmp_path / "bad.json"), "-jf/--json-schema-file is not valid JSON"),
        (("-j", '{"type": "array", "uniqueItems": true}'), "-j/--json-schema: 'uniqueItems' (at schema) is not supported"),
        (("-j", "[1]"), "-j/--json-schema must be a JSON schema object"),
        (("--grammar", 'root ::= "a"', "-j", "{}"), "--grammar and -j/--json-schema both constrain the output"),
        (("--json-schema", "{}", "--json-schema-file", tmp_path / "bad.json"), "-j/--json-schema and -jf/"),
    ]
    for args, message in cases:
        line = _one_line_error(run_cli("run", model, "-p", "hi", *args, "-t", "1"))
        assert message in line, (args, line)
    for command, extra in (("chat", ()), ("batch", (tmp_path / "in.jsonl", "-o", tmp_path / "out.jsonl")),
                           ("serve", ())):   # the same flags, the same errors
        line = _one_line_error(run_cli(command, model, *extra, "-j", "{bad", "-t", "1"))
        assert "-j/--json-schema is not valid JSON" in line, (command, line)


def test_a_grammar_llama_cpp_refuses_is_one_line_naming_the_flag(run_cli, tiny_models, tmp_path):
    (tmp_path / "bad.gbnf").write_text("root ::= foo\n")
    for args, flag in ((("--grammar", "root ::= foo"), "--grammar"), (("--grammar-file", tmp_path / "bad.gbnf"),
                                                                       "--grammar-file")):
        line = _one_line_error(run_cli("run", tiny_models["target"], "-p", "hi", *args, "-t", "1"))
        assert f"error: {flag}: the grammar does not compile: Undefined rule identifier 'foo'" in line
        assert "GBNF syntax" in line   # what to do


def test_short_flags_do_not_clash(run_cli):
    """-j and -jf are new short flags on run, chat, batch and serve: each command's --help lists
    them once, beside the flags it had."""
    for command in ("run", "chat", "batch", "serve"):
        r = run_cli(command, "--help")
        assert r.exit_code == 0
        for flag in ("-j,", "-jf,", "--grammar ", "--grammar-file"):
            assert r.stdout.count(flag) == 1, (command, flag)


def test_batch_grammar_flag_is_part_of_the_resume_check(run_cli, tiny_models, tmp_path):
    (tmp_path / "in.jsonl").write_text('{"id": "a", "prompt": "hi", "max_tokens": 4}\n')
    job = (tiny_models["target"], tmp_path / "in.jsonl", "-o", tmp_path / "out.jsonl", "--raw", "-q", *GREEDY)
    r = run_cli("batch", *job, "--grammar", 'root ::= "x"')
    assert r.exit_code == 0, r.stderr
    assert json.loads((tmp_path / "out.jsonl").read_text())["text"] == "x"
    line = _one_line_error(run_cli("batch", *job, "--grammar", 'root ::= "y"'))
    assert "started with other settings: grammar was" in line
    assert "now (absent)" in _one_line_error(run_cli("batch", *job))
    assert run_cli("batch", *job, "--grammar", 'root ::= "x"').exit_code == 0   # the same job resumes


# ---- real generations ----------------------------------------------------------------------------


@pytest.mark.real
def test_run_json_schema_prints_json_that_validates(run_cli, smollm2_f16, tmp_path):
    schema = json.dumps(PERSON)
    plain = _run(run_cli, smollm2_f16, "-p", ASK, "-n", "96", *GREEDY, "-j", schema, "-q")
    jsonschema.validate(json.loads(plain.stdout), PERSON)
    (tmp_path / "person.json").write_text(schema)
    from_file = _run(run_cli, smollm2_f16, "-p", ASK, "-n", "96", *GREEDY, "-jf", tmp_path / "person.json", "--json")
    info = json.loads(from_file.stdout)
    assert info["text"] == plain.stdout.rstrip("\n") and info["stop_reason"] == "eos"
    jsonschema.validate(json.loads(info["text"]), PERSON)


@pytest.mark.real
@pytest.mark.slow
def test_speculative_output_equals_plain_under_the_same_schema(run_cli, smollm2_f16, smollm2_q4):
    common = (smollm2_f16, "-p", ASK, "-n", "96", *GREEDY, "-j", json.dumps(PERSON), "--json")
    plain = json.loads(_run(run_cli, *common, "--spec-type", "none").stdout)
    spec = json.loads(_run(run_cli, *common).stdout)   # the default: what runs without flags
    drafted = json.loads(_run(run_cli, *common, "--draft", smollm2_q4, "--fixed-draft").stdout)
    jsonschema.validate(json.loads(plain["text"]), PERSON)
    assert spec["tokens"] == plain["tokens"] and drafted["tokens"] == plain["tokens"]
    assert drafted["drafted"] > 0   # the draft model drafted under the grammar


@pytest.mark.real
def test_grammar_file_with_a_hand_written_gbnf(run_cli, smollm2_f16, tmp_path):
    (tmp_path / "yn.gbnf").write_text('root ::= ("yes" | "no")\n')
    r = _run(run_cli, smollm2_f16, "-p", "Is the sea salty? Answer yes or no.", "-n", "8", *GREEDY,
             "--grammar-file", tmp_path / "yn.gbnf", "--json")
    info = json.loads(r.stdout)
    assert info["text"] in ("yes", "no") and info["stop_reason"] == "eos"
    r = _run(run_cli, smollm2_f16, "-p", "Is the sea salty?", "-n", "8", *GREEDY, "--grammar", 'root ::= "maybe"',
             "--json")
    assert json.loads(r.stdout)["text"] == "maybe"


@pytest.mark.real
def test_chat_applies_the_grammar_to_each_reply(run_cli, smollm2_f16):
    r = run_cli("chat", smollm2_f16, *GREEDY, "-n", "96", "-j", json.dumps(PERSON), "--json",
                input=f"{ASK}\nAnother one, please.\n")
    assert r.exit_code == 0, r.stderr
    turns = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(turns) == 2
    for turn in turns:
        jsonschema.validate(json.loads(turn["text"]), PERSON)


@pytest.mark.real
def test_batch_flag_is_the_default_and_a_lines_own_schema_wins(run_cli, smollm2_f16, tmp_path):
    enum = {"type": "string", "enum": ["red", "green", "blue"]}
    lines = [{"id": "flag", "prompt": ASK, "max_tokens": 96},
             {"id": "own", "prompt": "Name a colour.", "max_tokens": 16, "json_schema": enum},
             {"custom_id": "openai", "method": "POST", "url": "/v1/chat/completions",
              "body": {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 16,
                       "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": enum}}}}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = run_cli("batch", smollm2_f16, tmp_path / "in.jsonl", "-o", tmp_path / "out.jsonl", *GREEDY,
                "-j", json.dumps(PERSON), "-q")
    assert r.exit_code == 0, r.stderr
    records = {}
    for line in (tmp_path / "out.jsonl").read_text().splitlines():
        rec = json.loads(line)
        records[rec.get("custom_id") or rec["id"]] = rec   # (an OpenAI-form record has an id of its own)
    jsonschema.validate(json.loads(records["flag"]["text"]), PERSON)
    jsonschema.validate(json.loads(records["own"]["text"]), enum)
    content = records["openai"]["response"]["body"]["choices"][0]["message"]["content"]
    jsonschema.validate(json.loads(content), enum)


# ---- the Python API ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gen(smollm2_f16):
    from llamaspec import Generator

    with Generator(smollm2_f16, temperature=0, threads=1, max_tokens=96) as g:
        yield g


@pytest.mark.real
def test_generate_with_a_json_schema_validates(gen):
    r = gen.generate(ASK, json_schema=PERSON)
    jsonschema.validate(json.loads(r.text), PERSON)
    assert r.content == r.text and r.tool_calls is None and r.logprobs is None
    many = list(gen.generate_many([ASK, gen._request({"prompt": ASK, "json_schema": json.dumps(PERSON), "id": "s"})]))
    by_id = {m.id: m for m in many}
    assert by_id["s"].text == r.text   # the schema as JSON text: the same grammar
    stream = gen.generate(ASK, json_schema=PERSON, stream=True)
    assert "".join(stream) == r.text and stream.result.tokens == r.tokens


@pytest.mark.real
def test_request_errors_name_the_field_before_generating(gen):
    for kw, what in (({"grammar": 'root ::= "a"', "json_schema": {}}, "grammar and json_schema both constrain"),
                     ({"grammar": "root ::= foo"}, "grammar: the grammar does not compile"),
                     ({"json_schema": {"type": "array", "uniqueItems": True}}, "json_schema: 'uniqueItems'"),
                     ({"logit_bias": {49152: -100}}, "logit_bias: 49152 is not a token id"),
                     ({"logprobs": 21}, "logprobs must be an integer from 0 to 20")):
        with pytest.raises(UsageError, match=what):
            gen.generate("hi", **kw)
    bad = next(iter(gen.generate_many([gen._request({"prompt": "hi", "logprobs": -1})])))
    assert bad.error is not None and "logprobs" in bad.error.message


@pytest.mark.real
def test_logprobs_and_logit_bias_reach_the_result(gen):
    r = gen.generate("The capital of France is", chat=False, max_tokens=8, logprobs=2)
    assert r.logprobs is not None and [lp.token for lp in r.logprobs] == r.tokens
    for lp in r.logprobs:
        assert len(lp.top) == 2 and lp.logprob <= 0 and lp.top[0][1] >= lp.top[1][1]
        assert lp.top[0][0] == lp.token   # greedy: the chosen token is the most likely one
    first = r.tokens[0]
    banned = gen.generate("The capital of France is", chat=False, max_tokens=8, logit_bias={first: -100})
    assert banned.tokens[0] != first


@pytest.mark.real
def test_the_generators_grammar_is_the_default_a_requests_own_wins(smollm2_f16):
    """`serve`'s and `batch`'s flag: the Generator's grammar for requests that set none."""
    from llamaspec import Generator

    with Generator(smollm2_f16, temperature=0, threads=1, max_tokens=16, grammar='root ::= "ok"') as g:
        assert g.generate("Say something.").text == "ok"
        assert g.generate("Say something.", grammar='root ::= "fine"').text == "fine"
        assert isinstance(json.loads(g.generate("Say a number.", json_schema={"type": "integer"}).text), int)
        assert isinstance(g.chat_template, str)
    with pytest.raises(GrammarError, match="grammar: the grammar does not compile"):
        Generator(smollm2_f16, threads=1, grammar="root ::= foo")
    with pytest.raises(UsageError, match="both constrain the output"):
        Generator(smollm2_f16, threads=1, grammar='root ::= "a"', json_schema={})


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                   "required": ["city"], "additionalProperties": False}}}


@pytest.mark.real
def test_tools_render_constrain_and_parse_through_generate(gen):
    """SmolLM2's template takes no tools: the generic form (a system prompt, JSON calls)."""
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    one = {"tools": [WEATHER], "parallel_tool_calls": False}   # (SmolLM2 repeats parallel calls to the limit)
    r = gen.generate(ask, tool_choice="required", **one)
    assert r.finish_reason == "tool_calls" and r.stop_reason == "eos" and len(r.tool_calls) == 1
    for call in r.tool_calls:
        assert call["type"] == "function" and call["id"].startswith("call_")
        assert call["function"]["name"] == "get_weather"
        jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER["function"]["parameters"])
    assert gen.tokenize(ask) != gen.prepare(gen._request({"prompt": ask, "tools": [WEATHER]})).tokens
    streamed = gen.generate(ask, tool_choice="required", stream=True, **one)
    assert "".join(streamed) == r.text
    assert [c["function"] for c in streamed.result.tool_calls] == [c["function"] for c in r.tool_calls]
    named = {"type": "function", "function": {"name": "get_weather"}}
    (m,) = gen.generate_many([gen._request({"prompt": ask, "tool_choice": named, "id": "t", **one})])
    assert m.finish_reason == "tool_calls" and [c["function"] for c in m.tool_calls] == [c["function"] for c in r.tool_calls]
    # "none": the tools are described, the reply is text (and may take a schema)
    city = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False}
    r = gen.generate(ask, tools=[WEATHER], tool_choice="none", json_schema=city, max_tokens=32)
    assert r.tool_calls is None and r.content == r.text and isinstance(json.loads(r.text), dict)
    for kw, what in (({"json_schema": {}}, "json_schema cannot constrain a reply that may call tools"),
                     ({"grammar": 'root ::= "a"', "tool_choice": "auto"}, "grammar cannot constrain"),
                     ({"chat": False}, "tools need chat mode")):
        with pytest.raises(UsageError, match=what):
            gen.generate(ask if kw.get("chat") is not False else "hi", tools=[WEATHER], **kw)
    with pytest.raises(UsageError, match=r"tools\[0\].function must be an object"):
        gen.generate(ask, tools=[{"type": "function"}])


@pytest.mark.real
@pytest.mark.slow
def test_serve_flag_is_the_default_of_requests_that_set_none(smollm2_f16, tmp_path):
    from test_serve import Server   # the real server in a subprocess, as test_serve.py runs it

    s = Server(smollm2_f16, "-j", json.dumps(PERSON), "-n", "96", tmp=tmp_path)
    try:
        client = s.client()
        ask = [{"role": "user", "content": ASK}]
        reply = client.chat.completions.create(model="m", messages=ask)
        jsonschema.validate(json.loads(reply.choices[0].message.content), PERSON)
        enum = {"type": "string", "enum": ["red", "green", "blue"]}
        own = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Name a colour."}],
                                             response_format={"type": "json_schema",
                                                              "json_schema": {"name": "c", "schema": enum}})
        assert json.loads(own.choices[0].message.content) in enum["enum"]
    finally:
        assert s.stop() == 0, s.log.read_text()


def test_a_grammar_that_does_not_compile_is_one_line_on_the_real_stderr(run_cli_subprocess, tiny_models):
    """llama.cpp's parser writes its reason to file descriptor 2 itself; the reason goes into the
    one-line error and is not printed a second time above it."""
    r = run_cli_subprocess("run", tiny_models["target"], "-p", "hi", "-n", "4", "-t", "1",
                           "--grammar", "root ::= foo")
    assert r.exit_code == 2
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "Undefined rule identifier 'foo'" in lines[0], r.stderr
