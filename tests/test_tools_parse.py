"""Tool calls read back from replies (llamaspec/openai/tools.py): each family's format on fixture
texts, the stream's deltas against the whole-reply parse, format detection from the real chat
templates, the tools' validation and the generic fallback's messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llamaspec.openai.fields import RequestError
from llamaspec.openai.tools import plan_tools
from llamaspec.runtime.chat_template import render

TEMPLATES = Path(__file__).parent / "fixtures" / "tools"
SMOL_LIKE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
             "'<|im_end|>\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
TOOLS = [WEATHER, ADD]

W_ARGS, A_ARGS = '{"city": "Paris"}', '{"a": 1, "b": 2}'
W_CALL, A_CALL = ("get_weather", W_ARGS), ("add", A_ARGS)


def template(fmt: str) -> str:
    return {"hermes": (TEMPLATES / "qwen2.5.jinja").read_text(), "llama3": (TEMPLATES / "llama3.1.jinja").read_text(),
            "mistral": (TEMPLATES / "mistral-nemo.jinja").read_text(), "generic": SMOL_LIKE}[fmt]


# (format, reply text, expected content, expected [(name, arguments)])
CASES = [
    # Hermes / Qwen 2.5: <tool_call> blocks anywhere, text around them
    ("hermes", f'<tool_call>\n{{"name": "get_weather", "arguments": {W_ARGS}}}\n</tool_call>', None, [W_CALL]),
    ("hermes", f'<tool_call>\n{{"name": "get_weather", "arguments": {W_ARGS}}}\n</tool_call>\n'
               f'<tool_call>\n{{"name": "add", "arguments": {A_ARGS}}}\n</tool_call>', None, [W_CALL, A_CALL]),
    ("hermes", f'Let me look.\n\n<tool_call>\n{{"name": "add", "arguments": {A_ARGS}}}\n</tool_call>', "Let me look.",
     [A_CALL]),
    ("hermes", '<tool_call>\n{"name": "add", "arguments": {"a": 1,, "b": 2}}\n</tool_call>',
     '<tool_call>\n{"name": "add", "arguments": {"a": 1,, "b": 2}}\n</tool_call>', []),
    ("hermes", "It is 3 < 4 and <tool_ca", "It is 3 < 4 and <tool_ca", []),
    ("hermes", "Hello! How can I help?\n", "Hello! How can I help?\n", []),
    ("hermes", '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}</tool_call>', None,
     [("add", '{"a": 1, "b": 2}')]),
    # Llama 3.x: one JSON call opening the reply, with or without <|python_tag|>; builtins
    ("llama3", f'{{"name": "get_weather", "parameters": {W_ARGS}}}', None, [W_CALL]),
    ("llama3", f'<|python_tag|>{{"name": "add", "parameters": {A_ARGS}}}', None, [A_CALL]),
    ("llama3", f'{{"type": "function", "name": "add", "parameters": {A_ARGS}}} Done.', "Done.", [A_CALL]),
    ("llama3", f'Sure: {{"name": "add", "parameters": {A_ARGS}}}', f'Sure: {{"name": "add", "parameters": {A_ARGS}}}', []),
    ("llama3", '{"name": "add", "parameters": {"a": 1, "b": }}', '{"name": "add", "parameters": {"a": 1, "b": }}', []),
    ("llama3", "The answer is 3.", "The answer is 3.", []),
    # Mistral Nemo: [TOOL_CALLS] and an array (the marker is a control token: also without it)
    ("mistral", f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {W_ARGS}, "id": "abcDEF123"}}]', None, [W_CALL]),
    ("mistral", f'[{{"name": "get_weather", "arguments": {W_ARGS}, "id": "abcDEF123"}}, '
                f'{{"name": "add", "arguments": {A_ARGS}, "id": "xyz987654"}}]', None, [W_CALL, A_CALL]),
    ("mistral", f'Checking. [TOOL_CALLS][{{"name": "add", "arguments": {A_ARGS}}}]', "Checking.", [A_CALL]),
    ("mistral", '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1 "b": 2}}]',
     '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1 "b": 2}}]', []),
    ("mistral", "[1, 2, 3] are numbers.", "[1, 2, 3] are numbers.", []),
    # generic: the whole reply is one JSON object
    ("generic", f'{{"tool_call": {{"name": "get_weather", "arguments": {W_ARGS}}}}}', None, [W_CALL]),
    ("generic", f'{{ "tool_calls": [{{"name": "get_weather", "arguments": {W_ARGS}}}, '
                f'{{"name": "add", "arguments": {A_ARGS}}}]}}', None, [W_CALL, A_CALL]),
    ("generic", '{"response": "It is \\"sunny\\" \\u00e9\\ud83d\\ude00\\nbye"}', 'It is "sunny" é😀\nbye', []),
    ("generic", '{"tool_call": {"name": "add", "arguments": {"a": 1, "b": 2}', '{"tool_call": {"name": "add", '
                '"arguments": {"a": 1, "b": 2}', []),
    ("generic", "Plain words, no JSON.", "Plain words, no JSON.", []),
]


def _joined(deltas: list[dict]) -> tuple[str, list[tuple[str, str]], list[dict]]:
    content, calls, heads = "", {}, []
    for d in deltas:
        assert set(d) in ({"content"}, {"tool_calls"}), d
        content += d.get("content", "")
        for tc in d.get("tool_calls", []):
            if "id" in tc:   # the first delta of a call: index, id, type, name and arguments ""
                assert tc["type"] == "function" and tc["function"]["arguments"] == "" and tc["index"] == len(calls)
                heads.append(tc)
                calls[tc["index"]] = [tc["function"]["name"], ""]
            else:
                assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}
                calls[tc["index"]][1] += tc["function"]["arguments"]
    return content, [tuple(calls[i]) for i in sorted(calls)], heads


@pytest.mark.parametrize("fmt,text,content,calls", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_parse_and_stream(fmt, text, content, calls):
    plan = plan_tools(TOOLS, "auto", None, template(fmt))
    assert plan.format == fmt
    got_content, got_calls = plan.parse(text)
    assert got_content == content
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in got_calls] == calls
    for c in got_calls:
        assert c["type"] == "function" and json.loads(c["function"]["arguments"]) is not None
        if fmt == "mistral":   # nine alphanumerics, as its template wants (the model's own when it gave one)
            assert len(c["id"]) == 9 and c["id"].isalnum()
        else:
            assert c["id"].startswith("call_") and len(c["id"]) == 29 and c["id"][5:].isalnum()
    if fmt == "mistral" and "abcDEF123" in text:
        assert got_calls[0]["id"] == "abcDEF123"
    for step in (1, 3, 7):   # pieces of several sizes
        streamer = plan.streamer()
        deltas = [d for i in range(0, len(text), step) for d in streamer.push(text[i:i + step])] + streamer.finish()
        s_content, s_calls, heads = _joined(deltas)
        if heads and not calls:   # a call whose name was sent, then broken: its text is not sent again
            assert s_content == "" and content == text
            continue
        assert (s_content or None if calls else s_content) == content
        assert s_calls == calls
        assert len({h["id"] for h in heads}) == len(heads)


def test_stream_holds_back_a_marker_until_known():
    plan = plan_tools(TOOLS, "auto", None, template("hermes"))
    s = plan.streamer()
    assert s.push("Let me see <tool") == [{"content": "Let me see"}]   # the space waits, as may the tag
    assert s.push("_call>\n{\"name\": \"a") == []                       # the name is not finished
    head = s.push('dd", "arguments": {"a"')
    assert head[0]["tool_calls"][0]["function"] == {"name": "add", "arguments": ""}
    assert head[1] == {"tool_calls": [{"index": 0, "function": {"arguments": '{"a"'}}]}
    assert s.push(": 1, \"b\": 2}}\n</tool_call>") == [{"tool_calls": [{"index": 0, "function": {"arguments": ': 1, "b": 2}'}}]}]
    assert s.finish() == []


def test_a_call_is_not_sent_again_as_text_when_it_breaks():
    plan = plan_tools(TOOLS, "auto", None, template("hermes"))
    s = plan.streamer()
    sent = s.push('<tool_call>{"name": "add", "arguments": {"a": 1')
    assert sent and all("tool_calls" in d for d in sent)
    more = s.push(",, oops") + s.finish()   # (arguments stream as written; only the end tells they broke)
    assert not any("content" in d for d in more)
    assert plan.parse('<tool_call>{"name": "add", "arguments": {"a": 1,, oops') == (
        '<tool_call>{"name": "add", "arguments": {"a": 1,, oops', [])


def test_one_call_without_parallel_calls():
    text = f'<tool_call>{{"name": "add", "arguments": {A_ARGS}}}</tool_call><tool_call>{{"name": "add", "arguments": {A_ARGS}}}</tool_call>'
    assert len(plan_tools(TOOLS, "auto", None, template("hermes")).parse(text)[1]) == 2
    assert len(plan_tools(TOOLS, "auto", False, template("hermes")).parse(text)[1]) == 1


def test_tool_choice_none_reads_text_only():
    plan = plan_tools(TOOLS, "none", None, template("hermes"))
    text = f'<tool_call>{{"name": "add", "arguments": {A_ARGS}}}</tool_call>'
    assert plan.grammar is None and plan.parse(text) == (text, [])
    assert plan.template_tools == TOOLS   # the template still shows the tools, as llama.cpp renders them


def test_llama_builtin_python_tag_calls():
    search = {"type": "function", "function": {"name": "brave_search", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
    plan = plan_tools([search, ADD], "auto", None, template("llama3"))
    assert plan.builtins == ("brave_search",) and plan.template_kwargs["builtin_tools"] == ["brave_search"]
    content, calls = plan.parse('<|python_tag|>brave_search.call(query="llama \\"3\\"")')
    assert content is None and calls[0]["function"] == {"name": "brave_search", "arguments": '{"query": "llama \\"3\\""}'}
    assert plan.parse("brave_search.call(query=")[1] == []
    # Llama 3.2's template has no python tag: no builtins there
    assert plan_tools([search], "auto", None, (TEMPLATES / "llama3.2.jinja").read_text()).builtins == ()


@pytest.mark.parametrize("name,fmt", [("qwen2.5", "hermes"), ("hermes3", "hermes"), ("llama3.1", "llama3"),
                                      ("llama3.2", "llama3"), ("mistral-nemo", "mistral")])
def test_format_from_real_templates(name, fmt):
    plan = plan_tools(TOOLS, "auto", None, (TEMPLATES / f"{name}.jinja").read_text())
    assert plan.format == fmt and plan.template_tools == TOOLS and plan.native


def test_generic_fallback_messages():
    plan = plan_tools(TOOLS, "auto", None, SMOL_LIKE)
    assert plan.format == "generic" and plan.template_tools is None and plan.grammar and not plan.grammar.lazy
    history = [{"role": "user", "content": "Weather?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": W_ARGS}},
                   {"id": "call_2", "type": "function", "function": {"name": "add", "arguments": A_ARGS}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "22 C"},
               {"role": "tool", "tool_call_id": "call_2", "content": "3"}]
    out = plan.messages(history)
    assert out[0]["role"] == "system" and "get_weather" in out[0]["content"] and "`tool_calls`" in out[0]["content"]
    assert json.loads(out[2]["content"]) == {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}},
                                                            {"name": "add", "arguments": {"a": 1, "b": 2}}]}
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]   # results merged in one turn
    first, second = (json.loads(line) for line in out[3]["content"].split("\n"))
    assert first == {"tool_response": {"tool": "get_weather", "content": "22 C", "tool_call_id": "call_1"}}
    assert second["tool_response"]["tool"] == "add"
    # a system message of the user's own keeps its text first
    own = plan.messages([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert own[0]["content"].startswith("Be brief.\n\nYou can call any of the following tools") and len(own) == 2
    # "none": history as text, no instruction; no tools: the same for a template without tool support
    assert plan_tools(TOOLS, "none", None, SMOL_LIKE).messages(history)[0]["role"] == "user"
    # a request without tools whose history has calls: the template renders them as text
    prompt = render(SMOL_LIKE, history, source="t")
    assert '<|im_start|>assistant\n{"tool_calls": [{"name": "get_weather"' in prompt
    assert '<|im_start|>user\n{"tool_response": {"tool": "get_weather"' in prompt and "<|im_start|>tool" not in prompt
    assert "<tool_call>\n{\"name\": \"get_weather\"" in render(template("hermes"), history, source="t")


def test_mistral_call_ids_made_nine_characters():
    plan = plan_tools(TOOLS, "auto", None, template("mistral"))
    out = plan.messages([{"role": "user", "content": "x"},
                         {"role": "assistant", "tool_calls": [{"id": "call_abc", "type": "function",
                                                               "function": {"name": "add", "arguments": A_ARGS}}]},
                         {"role": "tool", "tool_call_id": "call_abc", "content": "3"}])
    nine = out[1]["tool_calls"][0]["id"]
    assert len(nine) == 9 and nine.isalnum() and out[2]["tool_call_id"] == nine


@pytest.mark.parametrize("tools,choice,param", [
    ({"type": "function"}, None, "tools"),
    ([{"type": "retrieval"}], None, "tools[0].type"),
    ([WEATHER, {"type": "function", "function": {"name": "bad name"}}], None, "tools[1].function.name"),
    ([{"type": "function", "function": {"name": "x" * 65}}], None, "tools[0].function.name"),
    ([WEATHER, WEATHER], None, "tools[1].function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}], None,
     "tools[0].function.parameters"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "n": {"type": "integer", "minimum": 3}}}}}], None, "tools[0].function.parameters"),
    ([{"type": "function", "function": {"name": "f", "description": 3}}], None, "tools[0].function.description"),
    ([WEATHER, {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "a": {"$ref": "#/$defs/Missing"}}}}}], None, "tools[1].function.parameters"),
    (TOOLS, "sometimes", "tool_choice"),
    (TOOLS, {"type": "function", "function": {"name": "nope"}}, "tool_choice.function.name"),
    (None, "required", "tool_choice"),
])
def test_bad_tools_name_the_field(tools, choice, param):
    with pytest.raises(RequestError) as e:
        plan_tools(tools, choice, None, SMOL_LIKE)
    assert e.value.param == param and param.split("[")[0].split(".")[0] in str(e.value)


def test_no_plan_without_tools():
    assert plan_tools(None, None, None, SMOL_LIKE) is None
    assert plan_tools([], "none", None, SMOL_LIKE) is None
    # parameters may be left out: a function without arguments
    plan = plan_tools([{"type": "function", "function": {"name": "now"}}], "required", None, SMOL_LIKE)
    assert plan.functions[0]["parameters"] == {"type": "object", "properties": {}}


@pytest.mark.parametrize("snippet", [
    "{{- '<tool_call>' + tc.name -}}<arg_key>{{ k }}</arg_key>",                     # GLM 4.x / Ling: XML arguments
    "<tool_call>\n<function={{ name }}>\n<parameter={{ k }}>",                          # Qwen3-Coder / Qwen3.5
    "{%- if tools %}[TOOL_CALLS]{{ tc.name }}[ARGS]{{ tc.arguments }}{% endif %}",     # Mistral v11
    "<|start_header_id|>ipython<|end_header_id|> <function={{ name }}>",              # Functionary 3.1
])
def test_lookalike_templates_get_the_generic_form(snippet):
    plan = plan_tools(TOOLS, "auto", None, snippet)
    assert plan.format == "generic" and not plan.grammar.lazy


@pytest.mark.parametrize("fmt,text", [
    ("hermes", f'<tool_call>\n{{"name": "add", "arguments": {A_ARGS}}}\n</tool_call>\n<tool_call>\n{{"name": "get_weather", "argu'),
    ("mistral", f'[TOOL_CALLS][{{"name": "add", "arguments": {A_ARGS}}}, {{"name": "get_weather", "arguments": {{"ci'),
    ("generic", f'{{"tool_calls": [{{"name": "add", "arguments": {A_ARGS}}}, {{"name": "get_weather", "arguments": {{"ci'),
    ("generic", f'{{"tool_calls": [{{"name": "add", "arguments": {A_ARGS}}}, '),
])
def test_a_reply_cut_inside_a_call_keeps_its_whole_calls(fmt, text):
    """max_tokens may end a reply inside a call (a small model repeating calls): the whole calls
    before it are the reply's calls; the stream sent those and part of the cut one, no text."""
    plan = plan_tools(TOOLS, "auto", None, template(fmt))
    content, calls = plan.parse(text)
    assert content is None and [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [A_CALL]
    streamer = plan.streamer()
    deltas = [d for i in range(0, len(text), 5) for d in streamer.push(text[i:i + 5])] + streamer.finish()
    s_content, s_calls, _ = _joined(deltas)
    assert s_content == "" and s_calls[0] == A_CALL


def test_a_reply_cut_inside_its_only_call_is_text():
    plan = plan_tools(TOOLS, "auto", None, template("hermes"))
    text = 'Sure.\n<tool_call>\n{"name": "get_weather", "argu'
    assert plan.parse(text) == (text, [])


@pytest.mark.parametrize("raw,decoded", [
    ('"ab\\u00', "ab"), ('"ab\\n x\\', "ab\n x"), ('"a\\ud83d', "a"), ('"a\\ud83d\\ude00"', "a😀"),
    ('"a\\\\', "a\\"), ('"a\\\\\\', "a\\"), ('"x\\ud83d\\', "x"), ('"x\\\\u00', "x\\u00"),
])
def test_a_streamed_string_is_decoded_up_to_its_last_whole_character(raw, decoded):
    from llamaspec.openai.tool_json import string_prefix

    assert string_prefix(raw, 0) == decoded
