"""Tool calls on real GGUFs: tiny models carrying each family's real chat template render tools
and tool messages and generate grammar-constrained calls through the Generator; each format's
grammar compiles on SmolLM2's real vocabulary, its lazy form waits for the call's opening, and
SmolLM2 (whose template takes no tools: the generic form) makes calls whose arguments validate."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from llamaspec.openai.tools import plan_tools
from llamaspec.runtime.grammar import GrammarState
from llamaspec.runtime.llama import Model
from llamaspec.testing.tiny_tool_templates import make_tool_models

TEMPLATES = Path(__file__).parent / "fixtures" / "tools"
FAMILY = {"qwen2.5": "qwen2.5", "hermes3": "qwen2.5", "llama3.1": "llama3", "llama3.2": "llama3",
          "mistral-nemo": "mistral-nemo"}
FORMAT = {"qwen2.5": "hermes", "hermes3": "hermes", "llama3.1": "llama3", "llama3.2": "llama3",
          "mistral-nemo": "mistral"}

# arguments a random model completes in a few tokens (an enum, an integer, a boolean)
SET_ALARM = {"type": "function", "function": {"name": "set_alarm", "description": "Set an alarm", "parameters": {
    "type": "object", "properties": {"day": {"enum": ["mon", "tue", "wed"]}, "hour": {"type": "integer"},
                                     "loud": {"type": "boolean"}}, "required": ["day", "hour", "loud"]}}}
PICK = {"type": "function", "function": {"name": "pick", "parameters": {
    "type": "object", "properties": {"color": {"enum": ["red", "green"]}, "n": {"type": "integer"}},
    "required": ["color", "n"]}}}
GET_WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"]}}}
# as the openai SDK's pydantic_function_tool writes it: $refs into the parameters' own $defs
BOOK = {"type": "function", "function": {"name": "book_trip", "description": "Book a trip", "parameters": {
    "type": "object", "properties": {"to": {"$ref": "#/$defs/Place"}, "nights": {"type": "integer"}},
    "required": ["to", "nights"], "additionalProperties": False,
    "$defs": {"Place": {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
                        "required": ["city", "country"], "additionalProperties": False}}}}}
HISTORY = [{"role": "user", "content": "What is the weather in Paris?"},
           {"role": "assistant", "content": None, "tool_calls": [{"id": "call_xyz", "type": "function", "function": {
               "name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
           {"role": "tool", "tool_call_id": "call_xyz", "content": "22 degrees"}]


@pytest.fixture(scope="module")
def tool_models(test_models_dir) -> dict[str, Path]:
    texts = {name: (FAMILY[name], (TEMPLATES / f"{name}.jinja").read_text()) for name in FAMILY}
    return make_tool_models(test_models_dir / "tiny-tools-v1", texts)


def _params(tool):
    return tool["function"]["parameters"]


@pytest.mark.parametrize("name", sorted(FAMILY))
def test_tiny_models_render_tools_and_tool_messages(tool_models, name):
    m = Model(tool_models[name])
    try:
        assert m.chat_template == (TEMPLATES / f"{name}.jinja").read_text()
        plan = plan_tools([GET_WEATHER, SET_ALARM], "auto", None, m.chat_template)
        assert plan.format == FORMAT[name] and plan.template_tools is not None
        prompt = m.chat_prompt(plan.messages(HISTORY), **plan.template_kwargs)
        assert "Set an alarm" in prompt and "set_alarm" in prompt and '"wed"' in prompt   # the tools
        # the earlier call with its arguments as an object, and the tool's result
        assert '"city": "Paris", "unit": "celsius"}' in prompt and "22 degrees" in prompt
        assert '\\"city\\"' not in prompt   # not a JSON string inside JSON
        if FORMAT[name] == "mistral":   # the template's nine-character ids, mapped from OpenAI's
            assert "call_xyz" not in prompt and prompt.count('"call_id": "') == 1
        ids = m.tokenize_prompt(prompt)
        markers = {"hermes": "<tool_call>", "llama3": "<|start_header_id|>", "mistral": "[TOOL_CALLS]"}[FORMAT[name]]
        marker = m.tokenize(markers, add_special=False, parse_special=True)
        assert len(marker) == 1 and marker[0] in ids   # the family's marker is one token of its own
    finally:
        m.close()


@pytest.mark.parametrize("name", ["qwen2.5", "llama3.1", "mistral-nemo"])
@pytest.mark.parametrize("choice", ["required", "named"])
def test_tiny_models_generate_valid_calls(tool_models, name, choice):
    """Random weights, so only the grammar makes this a call: through the Generator (the wiring
    run, batch and serve use), each family's envelope and the arguments' schema."""
    from llamaspec import Generator

    tool_choice = "required" if choice == "required" else {"type": "function", "function": {"name": "set_alarm"}}
    with Generator(tool_models[name], temperature=0, threads=1, max_tokens=120) as g:
        r = g.generate([{"role": "user", "content": "Wake me up on Monday at 7."}], tools=[PICK, SET_ALARM],
                       tool_choice=tool_choice, parallel_tool_calls=False)
    assert r.finish_reason == "tool_calls", r.text
    assert len(r.tool_calls) == 1 and r.content is None
    call = r.tool_calls[0]["function"]
    if choice == "named":
        assert call["name"] == "set_alarm"
    tool = {"set_alarm": SET_ALARM, "pick": PICK}[call["name"]]
    jsonschema.validate(json.loads(call["arguments"]), _params(tool))


@pytest.mark.real
@pytest.mark.parametrize("name", sorted(FAMILY) + ["generic"])
def test_every_grammar_compiles_on_a_real_vocabulary(f16, name):
    template = (TEMPLATES / f"{name}.jinja").read_text() if name != "generic" else f16.chat_template
    for choice in ("required", "auto", {"type": "function", "function": {"name": "get_weather"}}):
        for parallel in (None, False):
            plan = plan_tools([GET_WEATHER, SET_ALARM, BOOK], choice, parallel, template)
            assert plan.grammar.lazy == (choice == "auto" and plan.format != "generic")
            GrammarState(f16, plan.grammar).close()


def _fed(model, spec, text: str) -> GrammarState:
    state = GrammarState(model, spec)
    assert state.accept_all(model.tokenize(text, add_special=False)) == len(model.tokenize(text, add_special=False))
    return state


def _allows_text(model, state: GrammarState, text: str) -> bool:
    return state.allows(model.tokenize(text, add_special=False)[0])


@pytest.mark.real
@pytest.mark.parametrize("name,opening,good,bad", [
    ("qwen2.5", 'Let me check that for you. <tool_call>\n{"name": "', "get", "hello"),
    ("llama3.1", '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "', "celsius", "kelvin"),
    ("mistral-nemo", 'Sure. [TOOL_CALLS][{"name": "set_alarm", "arguments": {"day": "', "mon", "sun"),
])
def test_lazy_grammar_waits_for_the_call(f16, name, opening, good, bad):
    """auto: text is free until the call opens (the trigger), then the call's grammar holds."""
    plan = plan_tools([GET_WEATHER, SET_ALARM], "auto", None, (TEMPLATES / f"{name}.jinja").read_text())
    assert plan.grammar.lazy
    free = _fed(f16, plan.grammar, "Hello")
    assert _allows_text(f16, free, " anything") and _allows_text(f16, free, "}")
    state = _fed(f16, plan.grammar, opening)
    assert _allows_text(f16, state, good) and not _allows_text(f16, state, bad)


@pytest.fixture(scope="module")
def smol(smollm2_f16):
    from llamaspec import Generator

    with Generator(smollm2_f16, temperature=0, threads=1, max_tokens=80) as g:
        yield g


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("choice", ["required", "named", "auto-one", "refs"])
def test_smollm2_generic_calls_validate(smol, choice):
    """SmolLM2's template takes no tools: the generic fallback. Greedy, under the plan's grammar,
    through the Generator; the call's arguments validate against the function's parameters."""
    tool_choice = {"required": "required", "auto-one": "auto", "refs": {"type": "function", "function": {"name": "book_trip"}},
                   "named": {"type": "function", "function": {"name": "get_weather"}}}[choice]
    ask = "Book me three nights in Paris, France." if choice == "refs" else "What is the weather in Paris, in celsius?"
    r = smol.generate([{"role": "user", "content": ask}], tools=[GET_WEATHER, SET_ALARM, BOOK],
                      tool_choice=tool_choice, parallel_tool_calls=False)
    assert json.loads(r.text)   # the generic form: the whole reply is one JSON object
    assert r.finish_reason == "tool_calls" and len(r.tool_calls) == 1, r.text
    call = r.tool_calls[0]["function"]
    tool = {t["function"]["name"]: t for t in (GET_WEATHER, SET_ALARM, BOOK)}[call["name"]]   # (SmolLM2's choice)
    if choice in ("named", "refs"):
        assert call["name"] == tool_choice["function"]["name"]
    jsonschema.validate(json.loads(call["arguments"]), _params(tool))


_REPLAY = """
import sys
from llamaspec.openai.tools import plan_tools
from llamaspec.runtime.grammar import GrammarState
from llamaspec.runtime.llama import Model
m = Model(sys.argv[1])
plan = plan_tools([{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}], "auto", None,
                  open(sys.argv[2]).read())
state = GrammarState(m, plan.grammar)
print([m.piece(t).decode() for t in m.tokenize(sys.argv[3], add_special=False)], file=sys.stderr)
for t in m.tokenize(sys.argv[3], add_special=False):
    state.accept(t)   # (a ValueError when the grammar, once triggered, refuses a later token)
print("free" if state.allows(m.tokenize(" x", add_special=False)[0]) else "constrained")
"""


@pytest.mark.real
@pytest.mark.parametrize("name,text", [("qwen2.5", "Hi <tool_call>."),
                                       ("mistral-nemo", "[TOOL_CALLS]]"), ("llama3.1", '{"name"}')])
def test_a_trigger_token_running_past_the_opening_leaves_the_reply_free(smollm2_f16, name, text):
    """llama.cpp replays the triggering token into the grammar unchecked and aborts the process on
    text the grammar refuses ('>.' is one SmolLM2 token): the triggers stop where the text ends."""
    import subprocess
    import sys

    from child_process import child_env

    out = subprocess.run([sys.executable, "-c", _REPLAY, str(smollm2_f16), str(TEMPLATES / f"{name}.jinja"), text],
                         capture_output=True, text=True, env=child_env(), timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "free", out.stderr[-500:]


@pytest.mark.parametrize("name", ["qwen2.5", "mistral-nemo"])
def test_streamed_calls_join_to_the_whole_reply(tool_models, name):
    """create_chat_completion(stream=True), the chunks serve sends: the tool_calls deltas, joined,
    are the non-streamed reply's calls."""
    from llamaspec import Generator

    msgs = [{"role": "user", "content": "Wake me up on Monday at 7."}]
    with Generator(tool_models[name], temperature=0, threads=1, max_tokens=120) as g:
        whole = g.create_chat_completion(msgs, tools=[PICK, SET_ALARM], tool_choice="required",
                                         parallel_tool_calls=False)["choices"][0]
        chunks = list(g.create_chat_completion(msgs, tools=[PICK, SET_ALARM], tool_choice="required",
                                               parallel_tool_calls=False, stream=True))
    assert whole["finish_reason"] == "tool_calls" and whole["message"]["content"] is None
    calls: dict[int, list] = {}
    for c in chunks:
        for choice in c.get("choices", []):
            assert not choice["delta"].get("content")
            for tc in choice["delta"].get("tool_calls", []):
                entry = calls.setdefault(tc["index"], ["", ""])
                entry[0] += tc["function"].get("name", "")
                entry[1] += tc["function"]["arguments"]
    want = [[c["function"]["name"], c["function"]["arguments"]] for c in whole["message"]["tool_calls"]]
    assert [calls[i] for i in sorted(calls)] == want
    assert [ch["finish_reason"] for c in chunks for ch in c.get("choices", []) if ch["finish_reason"]] == ["tool_calls"]
