"""The tool-call formats llama.cpp's server parses for the families llamaspec pairs, read from a
model's reply: which format a chat template speaks, and each format's scanner.

Detection follows llama.cpp's common/chat.cpp (before its generic autoparser): "<tool_call>" in
the template: Hermes 2/3 and Qwen 2.5/3 (`<tool_call>{"name": ..., "arguments": ...}</tool_call>`,
any number, text around them); "<|start_header_id|>ipython<|end_header_id|>": Llama 3.1/3.2/3.3
(one `{"name": ..., "parameters": ...}` at the start of the reply, optionally after
<|python_tag|>, and with builtin tools `<|python_tag|>brave_search.call(query="...")`);
"[TOOL_CALLS]": Mistral Nemo (`[TOOL_CALLS][{"name", "arguments", "id"}, ...]`); anything else:
the generic JSON form (`{"tool_call": {...}}`, `{"tool_calls": [...]}` or `{"response": "..."}`).

A scanner reads a reply (`final`: all of it; else a prefix still growing) into a list of text
pieces and Calls in order. On a prefix it holds back what may still become a call (a partial
"<tool_call>" at the end, the start of a Llama/Mistral call) and reports a call being written with
what is known of it, so a stream can send each piece once; text that cannot become a call
(malformed JSON) is text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from llamaspec.openai.tool_json import Malformed, items, loads, members, skip_ws, string_prefix, value_end

HERMES, LLAMA3, MISTRAL, GENERIC = "hermes", "llama3", "mistral", "generic"
FORMATS = (HERMES, LLAMA3, MISTRAL, GENERIC)

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
MISTRAL_MARK = "[TOOL_CALLS]"
# Llama 3.1's builtin tools (llama-stack), called in its python-tag syntax when the template has it
LLAMA_BUILTINS = {"wolfram_alpha": "query", "web_search": "query", "brave_search": "query",
                  "python": "code", "code_interpreter": "code"}


def detect_format(template: str | None) -> str:
    """The tool-call format a chat template speaks, as llama.cpp tells it from the template text.
    Templates whose markers look alike but whose calls are not these JSON forms (GLM's and Ling's
    <arg_key>, MiniMax's <invoke>, Qwen3-Coder's <function=>, Apriel's <tool_calls> list,
    Functionary 3.1's <function=> on Llama 3, Mistral v11's `[TOOL_CALLS]name[ARGS]{...}`) get the
    generic form: its grammar makes the reply readable whatever the template says."""
    src = template or ""
    if (HERMES_OPEN in src and re.search(r'\{\\?"name\\?"', src)
            and not any(x in src for x in ("<arg_key>", "<invoke", "<function=", "<tool_calls>"))):
        return HERMES
    if "<|start_header_id|>ipython<|end_header_id|>" in src and "<function=" not in src:
        return LLAMA3
    if MISTRAL_MARK in src and "[ARGS]" not in src:
        return MISTRAL
    return GENERIC


def takes_tools(template: str | None) -> bool:
    """Whether a chat template renders a `tools` list (it names the variable)."""
    return bool(template and re.search(r"\btools\b", template))


@dataclass
class Call:
    """A tool call read from a reply: `args` is the arguments' JSON text (a prefix while the call
    is being written); name None until its name is known."""

    name: str | None
    args: str = ""
    done: bool = False
    id: str | None = None
    raw: str = ""      # an unfinished call's text, from its opening to the end of the reply


def _held(tail: str, marker: str) -> int:
    """How many characters at the end of `tail` could start `marker`."""
    for k in range(min(len(marker) - 1, len(tail)), 0, -1):
        if marker.startswith(tail[-k:]):
            return k
    return 0


def call_object(text: str, i: int, final: bool, args_keys=("arguments",)) -> tuple[Call, int | None]:
    """The call whose JSON object opens at text[i]: {"name": ..., "arguments": ...} (or another
    key of args_keys), and the object's end or None. Malformed when it is not such an object."""
    if not text.startswith("{", i):
        raise Malformed("expected '{'")
    found, end = members(text, i, final)
    call = Call(None)
    for key, start, stop in found:
        if key == "name" and stop is not None:
            name = loads(text, start, stop)
            if not isinstance(name, str):
                raise Malformed("a name that is not a string")
            call.name = name
        elif key == "id" and stop is not None:
            call.id = str(loads(text, start, stop))
        elif key in args_keys:
            if stop is None:   # a stringified value is only read whole
                call.args = "" if text.startswith('"', start) else text[start:]
            else:
                value = loads(text, start, stop)
                if isinstance(value, str):   # arguments sent as a JSON string
                    call.args = value
                    value = loads(value, 0, len(value))
                else:
                    call.args = text[start:stop]
                if not isinstance(value, dict):
                    raise Malformed("arguments that are not an object")
    if end is not None:
        keys = {k for k, _, _ in found}
        if call.name is None or not keys & set(args_keys):
            raise Malformed("a call without name or arguments")
        call.done = True
    return call, end


def scan_hermes(text: str, final: bool, **_) -> list:
    out: list = []
    pos = 0
    while True:
        k = text.find(HERMES_OPEN, pos)
        if k < 0:
            tail = text[pos:]
            out.append(tail if final else tail[:len(tail) - _held(tail, HERMES_OPEN)])
            return out
        out.append(text[pos:k])
        j = skip_ws(text, k + len(HERMES_OPEN))
        try:
            if j >= len(text):
                raise Malformed("no call yet")
            call, end = call_object(text, j, final)
        except Malformed:
            if j >= len(text):   # the tag, nothing after it yet
                out.append(Call(None, raw=text[k:]))
                return out
            out.append(HERMES_OPEN)   # not a call: text, and look on after the tag
            pos = k + len(HERMES_OPEN)
            continue
        if end is None:
            call.raw = text[k:]
            out.append(call)
            return out
        out.append(call)
        e = skip_ws(text, end)
        if text.startswith(HERMES_CLOSE, e):
            pos = e + len(HERMES_CLOSE)
        elif not final and HERMES_CLOSE.startswith(text[e:]):
            return out   # the closing tag may be on its way
        else:
            pos = end    # no closing tag: the reply goes on after the object


_BUILTIN_CALL = re.compile(r"(\w+)\s*\.\s*call\(")
_BUILTIN_ARG = re.compile(r"\s*(\w+)\s*=\s*")


def _builtin_call(text: str, j: int, final: bool, builtins: tuple[str, ...]) -> tuple[Call, int | None] | None:
    """`name.call(key="value", ...)` at text[j] for a builtin tool: (call, its end or None while
    it is written), or None when there is none."""
    m = _BUILTIN_CALL.match(text, j)
    if not m or m.group(1) not in builtins:
        return None
    args, k = {}, m.end()
    while True:
        a = _BUILTIN_ARG.match(text, k)
        if not a or a.end() >= len(text):
            break
        end = value_end(text, a.end(), final)
        if end is None:
            return Call(m.group(1)), None
        args[a.group(1)] = loads(text, a.end(), end)
        k = skip_ws(text, end)
        if not text.startswith(",", k):
            break
        k += 1
    k = skip_ws(text, k)
    if text.startswith(")", k):
        return Call(m.group(1), json.dumps(args, ensure_ascii=False), True), k + 1
    if k >= len(text) and not final:
        return Call(m.group(1)), None
    raise Malformed("an unfinished builtin call")


def scan_llama3(text: str, final: bool, builtins: tuple[str, ...] = (), **_) -> list:
    """One call at the very start of the reply (llama.cpp reads no other); the rest is text."""
    j = skip_ws(text, 0)
    if text.startswith(PYTHON_TAG, j):
        j = skip_ws(text, j + len(PYTHON_TAG))
    elif not final and PYTHON_TAG.startswith(text[j:]):
        return []   # nothing yet, or the start of the tag
    rest = text[j:]
    try:
        if rest.startswith("{"):
            found, _ = members(text, j, final)
            if found and found[0][0] not in ("name", "type"):   # some other JSON: text at once
                raise Malformed("not a call")
            call, end = call_object(text, j, final, ("parameters", "arguments"))
            if end is None:
                call.raw = text
                return [call]
            return [call, text[end:]]
        found = _builtin_call(text, j, final, builtins) if builtins else None
        if found:
            call, end = found
            if end is None:
                call.raw = text
                return [call]
            return [call, text[end:]]
        if not final and (not rest or any(f"{b}.call(".startswith(rest) for b in builtins)):
            return []
    except Malformed:
        pass
    return [text]


_ARRAY_OPENING = re.compile(r'\[\s*(?:\{\s*(?:"(?:n(?:a(?:m(?:e(?:")?)?)?)?)?)?)?$')


def scan_mistral(text: str, final: bool, **_) -> list:
    """`[TOOL_CALLS]` then a JSON array of calls. [TOOL_CALLS] is a control token that the reply's
    text may not show, so an array of {"name": ...} objects opening the reply is read as calls too."""
    k = text.find(MISTRAL_MARK)
    if k >= 0:
        before, j = text[:k], skip_ws(text, k + len(MISTRAL_MARK))
    else:
        j = skip_ws(text, 0)
        rest = text[j:]
        if not re.match(r'\[\s*\{\s*"name"', rest):
            if not final and (not rest or _ARRAY_OPENING.match(rest)):
                return []
            return [text if final else text[:len(text) - _held(text, MISTRAL_MARK)]]
        before, k = "", j
    try:
        if j >= len(text):
            return [before, Call(None, raw=text[k:])]
        if not text.startswith("[", j):
            raise Malformed("expected '['")
        found, end = items(text, j, final)
        calls = []
        for start, stop in found:
            call, cend = call_object(text, start, final)
            calls.append(call)
            if cend is None:
                break
        if end is None:
            if not calls or calls[-1].done:
                calls.append(Call(None))
            calls[-1].raw = text[k:]
            return [before, *calls]
        if not calls:
            raise Malformed("no calls")
        return [before, *calls, text[end:]]
    except Malformed:
        return [text]


def scan_generic(text: str, final: bool, **_) -> list:
    """The whole reply is one JSON object: {"tool_call": call}, {"tool_calls": [calls]} or
    {"response": "text"}; any other reply is text."""
    j = skip_ws(text, 0)
    if j >= len(text):
        return [] if not final else [text]
    if text[j] != "{":
        return [text]
    try:
        found, end = members(text, j, final)
        if not found:
            if end is None and not final:
                return []
            raise Malformed("no member")
        key, start, stop = found[0]
        if key == "response":
            if text.startswith('"', start):
                return [string_prefix(text, start)]
            if stop is None:
                if final:
                    raise Malformed("an unfinished response")
                return []
            return [text[start:stop]]
        if key == "tool_call":
            if start >= len(text):
                return [Call(None, raw=text)]
            call, cend = call_object(text, start, final)
            if cend is None:
                call.raw = text
            return [call]
        if key == "tool_calls":
            if start >= len(text):
                return [Call(None, raw=text)]
            if not text.startswith("[", start):
                raise Malformed("tool_calls is not an array")
            arr, aend = items(text, start, final)
            calls = []
            for s, _e in arr:
                call, cend = call_object(text, s, final)
                calls.append(call)
                if cend is None:
                    break
            if not calls or (aend is None and calls[-1].done):
                calls.append(Call(None))
            if not calls[-1].done:
                calls[-1].raw = text
            return calls
        raise Malformed("another key")
    except Malformed:
        return [text]


SCANNERS = {HERMES: scan_hermes, LLAMA3: scan_llama3, MISTRAL: scan_mistral, GENERIC: scan_generic}


def settle(pieces: list) -> list:
    """A whole reply's pieces: an unfinished call (the reply was cut: max_tokens, a stop string)
    is dropped when the reply made whole calls, else its text is the reply's text."""
    if any(isinstance(p, Call) and p.done for p in pieces):
        return [p for p in pieces if not isinstance(p, Call) or p.done]
    return [p.raw if isinstance(p, Call) else p for p in pieces]


def assemble(pieces: list, final: bool) -> tuple[str, list[Call]]:
    """The reply's text and its calls from a scanner's pieces. Whitespace between text and a call
    is dropped (as a stream must hold it back until it knows what follows); on a prefix, the
    trailing whitespace too."""
    text, calls = [], []
    n = len(pieces)
    for i, p in enumerate(pieces):
        if isinstance(p, Call):
            calls.append(p)
            continue
        if i > 0 and isinstance(pieces[i - 1], Call):
            p = p.lstrip()
        if (i + 1 < n and isinstance(pieces[i + 1], Call)) or (not final and i == n - 1):
            p = p.rstrip()
        text.append(p)
    return "".join(text), calls
