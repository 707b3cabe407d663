"""Tool calls: OpenAI's `tools`, `tool_choice` and `parallel_tool_calls` turned into how the
prompt is rendered, the grammar of the reply and how the reply is read back (ToolPlan).

    plan = plan_tools(tools, "auto", None, model.chat_template)
    prompt = model.chat_prompt(plan.messages(messages), **plan.template_kwargs)
    ... generate with plan.grammar ...
    content, tool_calls = plan.parse(text)            # or plan.streamer().push(piece) -> deltas

The format comes from the chat template (tool_formats.detect_format, as llama.cpp decides):
Hermes/Qwen `<tool_call>`, Llama 3.x JSON, Mistral `[TOOL_CALLS]`, else the generic JSON form,
whose system prompt is documented in tool_prompt.py and docs/structured.md. "required" or a named
function: the reply is grammar-constrained calls, whose arguments validate against the function's
`parameters`; "auto": the grammar starts when the model opens a call (llama.cpp's lazy triggers;
the generic form constrains the whole reply to its JSON, as llama.cpp does); "none": no grammar,
the reply is text.
"""

from __future__ import annotations

import random
import re
import string
from dataclasses import dataclass, field
from typing import Any

from llamaspec.openai.fields import RequestError
from llamaspec.openai.tool_formats import (GENERIC, LLAMA3, LLAMA_BUILTINS, MISTRAL, PYTHON_TAG, SCANNERS, Call,
                                           assemble, detect_format, settle, takes_tools)
from llamaspec.openai.tool_grammar import tool_grammar
from llamaspec.openai.tool_prompt import add_system, describe, instruction, mistral_ids
from llamaspec.runtime.chat_template import history_as_text
from llamaspec.runtime.grammar import GrammarError, GrammarSpec, schema_gbnf

__all__ = ["ToolPlan", "plan_tools", "validate_tools", "new_call_id"]

_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_ALNUM = string.ascii_letters + string.digits
_rng = random.SystemRandom()


def new_call_id(fmt: str = GENERIC) -> str:
    """A call id: "call_" and 24 alphanumerics, or nine alphanumerics for Mistral's template."""
    n = 9 if fmt == MISTRAL else 24
    return ("" if fmt == MISTRAL else "call_") + "".join(_rng.choice(_ALNUM) for _ in range(n))


def validate_tools(tools: Any) -> list[dict]:
    """The tools as {"name", "description", "parameters"} functions, or a RequestError naming
    `tools[i]...`."""
    if not isinstance(tools, (list, tuple)):
        raise RequestError("tools must be an array of {\"type\": \"function\", \"function\": {...}} objects", "tools")
    out, seen = [], set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise RequestError(f"{where} must be an object", where)
        if tool.get("type") != "function":
            raise RequestError(f"{where}.type must be \"function\"", f"{where}.type")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise RequestError(f"{where}.function must be an object with a name", f"{where}.function")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise RequestError(f"{where}.function.name must be 1 to 64 letters, digits, '_' or '-'",
                               f"{where}.function.name")
        if name in seen:
            raise RequestError(f"{where}.function.name: {name!r} is given twice", f"{where}.function.name")
        seen.add(name)
        desc = fn.get("description")
        if desc is not None and not isinstance(desc, str):
            raise RequestError(f"{where}.function.description must be a string", f"{where}.function.description")
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        where_p = f"{where}.function.parameters"
        if not isinstance(params, dict) or params.get("type", "object") != "object":
            raise RequestError(f"{where_p} must be a JSON schema of type \"object\"", where_p)
        try:
            schema_gbnf(params, where_p)   # (the converter builds tool-call grammars)
        except GrammarError as e:
            raise RequestError(str(e), where_p) from None
        except AssertionError as e:   # (the converter asserts on a $ref it cannot resolve)
            raise RequestError(f"{where_p}: the JSON schema cannot be converted to a grammar: {e}", where_p) from None
        out.append({"name": name, **({"description": desc} if desc is not None else {}), "parameters": params})
    return out


def _choice(tool_choice: Any, names: list[str]) -> tuple[str, str | None]:
    """("auto" | "none" | "required", the named function or None)."""
    if tool_choice is None:
        return "auto", None
    if tool_choice in ("auto", "none", "required"):
        return tool_choice, None
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        fn = tool_choice.get("function")
        if not isinstance(fn, dict):
            raise RequestError('tool_choice.function must be an object, {"name": ...}', "tool_choice.function")
        name = fn.get("name")
        if not isinstance(name, str) or name not in names:
            raise RequestError(f"tool_choice.function.name {str(name)[:70]!r} is not one of the tools "
                               f"({', '.join(names)[:200]})",
                               "tool_choice.function.name")
        return "required", name
    raise RequestError('tool_choice must be "auto", "none", "required" or '
                       '{"type": "function", "function": {"name": ...}}', "tool_choice")


def plan_tools(tools: Any, tool_choice: Any = None, parallel_tool_calls: bool | None = None,
               template: str | None = None) -> "ToolPlan | None":
    """How a chat request with `tools` is rendered, constrained and read; None without tools."""
    if not tools:
        if tool_choice not in (None, "none", "auto"):
            raise RequestError("tool_choice needs tools", "tool_choice")
        return None
    functions = validate_tools(tools)
    choice, named = _choice(tool_choice, [f["name"] for f in functions])
    fmt = detect_format(template)
    parallel = parallel_tool_calls is not False and fmt != LLAMA3   # (Llama 3.x: one call a turn)
    builtins = ()
    if fmt == LLAMA3 and PYTHON_TAG in (template or ""):
        builtins = tuple(f["name"] for f in functions if _is_builtin(f))
    openai_tools = [{"type": "function", "function": f} for f in functions]
    native = takes_tools(template)
    grammar = None
    if choice != "none":
        wanted = [f for f in functions if named is None or f["name"] == named]
        grammar = tool_grammar(fmt, wanted, required=choice == "required", parallel=parallel, builtins=builtins)
    kwargs: dict[str, Any] = {"tools": openai_tools if native else None}
    if fmt == LLAMA3:   # as llama.cpp renders Llama 3.x: tools in the system message
        kwargs["tools_in_user_message"] = False
        if builtins:
            kwargs["builtin_tools"] = list(builtins)
    return ToolPlan(format=fmt, choice=choice, parallel=parallel, functions=functions, tools=openai_tools,
                    template_kwargs=kwargs, grammar=grammar, native=native, builtins=builtins)


def _is_builtin(fn: dict) -> bool:
    key = LLAMA_BUILTINS.get(fn["name"])
    props = fn["parameters"].get("properties") or {}
    return key is not None and list(props) == [key] and key in (fn["parameters"].get("required") or [])


@dataclass
class ToolPlan:
    """How one request's tools are rendered (template_kwargs, messages), constrained (grammar)
    and read back (parse, streamer); made by plan_tools."""

    format: str                        # "hermes", "llama3", "mistral" or "generic"
    choice: str                        # "auto", "required" (also a named function) or "none"
    parallel: bool
    functions: list[dict]              # validated: {"name", "description"?, "parameters"}
    tools: list[dict]                  # the same in OpenAI's form
    template_kwargs: dict[str, Any]    # Jinja variables for the chat template (tools=..., ...)
    grammar: GrammarSpec | None
    native: bool = True                # the template renders tools itself
    builtins: tuple[str, ...] = field(default_factory=tuple)

    @property
    def template_tools(self) -> list[dict] | None:
        """The `tools` for the chat template; None when it does not take tools."""
        return self.template_kwargs.get("tools")

    def messages(self, messages: list[dict]) -> list[dict]:
        """The messages to render: for a template without tool support, the generic system prompt
        and tool calls and results as text; else as given (Mistral's call ids made nine characters)."""
        if self.format == MISTRAL:
            return mistral_ids(messages)
        if self.native and self.format != GENERIC:
            return messages
        out = messages if self.native else history_as_text(messages, self.parallel)
        if self.choice == "none":
            return out
        text = instruction(required=self.choice == "required", parallel=self.parallel)
        return add_system(out, text if self.native else f"{describe(self.tools)}\n\n{text}")

    def _pieces(self, text: str, final: bool) -> list:
        if self.choice == "none":
            return [text]
        pieces = SCANNERS[self.format](text, final, builtins=self.builtins)
        return settle(pieces) if final else pieces

    def parse(self, text: str) -> tuple[str | None, list[dict]]:
        """(content, tool_calls in OpenAI's form) of a whole reply. Content is the text outside
        the calls, None when there are calls and no other text."""
        content, calls = assemble(self._pieces(text, True), True)
        if not self.parallel:
            calls = calls[:1]
        out = [self._openai(c, c.id if self._keeps_id(c.id) else None) for c in calls]
        return (content or None) if out else content, out

    def _keeps_id(self, cid: str | None) -> bool:
        return self.format == MISTRAL and cid is not None and len(cid) == 9 and cid.isalnum()

    def _openai(self, call: Call, cid: str | None = None) -> dict:
        return {"id": cid or new_call_id(self.format), "type": "function",
                "function": {"name": call.name, "arguments": call.args}}

    def streamer(self) -> "ToolStreamer":
        return ToolStreamer(self)


class ToolStreamer:
    """A reply's chat-chunk deltas as its text arrives: {"content": ...} for text outside calls;
    per call first {"tool_calls": [{"index", "id", "type", "function": {"name", "arguments": ""}}]}
    once its name is known, then {"tool_calls": [{"index", "function": {"arguments": piece}}]}.
    Text that may open a call is held back until it is known; the deltas of a reply, joined,
    give what plan.parse gives (unless a call whose name was sent turns out malformed)."""

    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self.text = ""
        self.sent = ""                       # content sent so far
        self.calls: list[int] = []           # per call sent: length of its arguments sent

    def push(self, text: str) -> list[dict]:
        self.text += text
        return self._deltas(False)

    def finish(self) -> list[dict]:
        return self._deltas(True)

    def _deltas(self, final: bool) -> list[dict]:
        content, calls = assemble(self.plan._pieces(self.text, final), final)
        if not self.plan.parallel:
            calls = calls[:1]
        out: list[dict] = []
        if len(calls) < len(self.calls):
            return out   # a call already sent turned out malformed: its text is not sent again
        if len(content) > len(self.sent) and content.startswith(self.sent):
            out.append({"content": content[len(self.sent):]})
            self.sent = content
        for i, call in enumerate(calls):
            if i == len(self.calls):
                if call.name is None:
                    break
                head = self.plan._openai(call)
                head["function"]["arguments"] = ""
                out.append({"tool_calls": [{"index": i, **head}]})
                self.calls.append(0)
            done = self.calls[i]
            if len(call.args) > done:
                out.append({"tool_calls": [{"index": i, "function": {"arguments": call.args[done:]}}]})
                self.calls[i] = len(call.args)
        return out
