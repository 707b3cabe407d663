"""The grammar of a reply that calls tools, per format, as llama.cpp's common/chat.cpp builds it.

Each call is one JSON schema, {"name": {"const": NAME}, "arguments": PARAMETERS} (an anyOf of them
when several functions may be called), converted once by llama.cpp's converter
(runtime/grammar.schema_gbnf); its rules are renamed with a prefix and wrapped in the
format's envelope. So a call's arguments always validate against its function's `parameters`.

"required" or a named function: the whole reply is calls. "auto": the same grammar, lazy: the
reply is free until its text matches a trigger pattern (llama.cpp's grammar_lazy_patterns), and
constrained from the pattern's first group on. llama.cpp replays the text from there to the end
of the triggering token into the grammar unchecked, and text the grammar refuses there aborts the
process (a C++ exception: "Unexpected empty grammar stack"), so a pattern is anchored at the end
($) and matches only the call's opening as the grammar spells it, up to where the text ends: the
grammar starts at the first token boundary inside the opening. A token that runs past it into
anything else triggers nothing: that reply stays free, and is read as text or a call as written.
The generic format is never lazy (llama.cpp's generic handler): its reply is always one JSON
object, {"response": "..."} being the answer without a call.
"""

from __future__ import annotations

import re

from llamaspec.openai.tool_formats import GENERIC, HERMES, HERMES_CLOSE, HERMES_OPEN, LLAMA3, MISTRAL, MISTRAL_MARK, PYTHON_TAG
from llamaspec.runtime.grammar import GrammarSpec, schema_gbnf

_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|\{[^}]*\}|#[^\n]*|([a-zA-Z_][a-zA-Z0-9_-]*)', re.S)


def prefix_rules(gbnf: str, prefix: str) -> str:
    """GBNF text with every rule name (definitions and references) prefixed: literals, character
    classes, repetition counts and comments are left alone."""
    return _TOKEN.sub(lambda m: prefix + m.group(1) if m.group(1) else m.group(0), gbnf)


def _gbnf(schema: dict, field: str, prefix: str, defs: dict | None = None) -> str:
    if defs:
        schema = {**schema, "$defs": defs}
    return prefix_rules(schema_gbnf(schema, field), prefix)


def hoist_refs(functions: list[dict]) -> tuple[list[dict], dict]:
    """The functions with each one's local `$ref`s ("#/$defs/X", "#/definitions/X", "#...")
    pointing into one shared root `$defs` (returned), under names prefixed per function: a
    function's parameters sit inside the call's schema, where "#" is no longer their root."""
    defs: dict = {}
    out = []
    for i, fn in enumerate(functions):
        p, params = f"f{i}-", fn["parameters"]
        local = {**params.get("definitions", {}), **params.get("$defs", {})}
        needs_root = False

        def move(node):
            nonlocal needs_root
            if isinstance(node, list):
                return [move(x) for x in node]
            if not isinstance(node, dict):
                return node
            node = {k: move(v) for k, v in node.items() if k not in ("$defs", "definitions")}
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#"):
                for base in ("#/$defs/", "#/definitions/"):
                    if ref.startswith(base):
                        node["$ref"] = "#/$defs/" + p + ref[len(base):]
                        break
                else:
                    needs_root = True
                    node["$ref"] = "#/$defs/" + p + "root" + ref[1:]
            return node

        moved = move(params)
        for name, sub in local.items():
            defs[p + name] = move(sub)
        if needs_root:
            defs[p + "root"] = moved
        out.append({**fn, "parameters": moved})
    return out, defs


def _one_of(schemas: list[dict]) -> dict:
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def call_schema(fn: dict, args_key: str = "arguments", with_id: bool = False) -> dict:
    props = {"name": {"const": fn["name"]}, args_key: fn["parameters"]}
    required = ["name", args_key]
    if with_id:   # Mistral Nemo's template wants nine alphanumerics
        props["id"] = {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}
        required.append("id")
    return {"type": "object", "properties": props, "required": required}


def _prefixes(atoms: list[str]) -> str:
    """A regex for any prefix (the empty one too) of the sequence of regex atoms."""
    out = ""
    for atom in reversed(atoms):
        out = f"(?:{atom}{out})?"
    return out


def _chars(literal: str) -> list[str]:
    return [re.escape(c) for c in literal]


def _any_prefix(literals: list[str], then: list[str] = ()) -> str:
    """An atom matching any prefix of one of `literals`, and once one is whole, of `then`."""
    return "(?:" + "|".join(_prefixes(_chars(x) + list(then)) for x in literals) + ")"


def _opening(names: list[str], args_key: str = "arguments") -> list[str]:
    """The atoms of a call's JSON opening as the converter spells it (optional single spaces, no
    space before a comma): `{"name": "NAME", "arguments": {`."""
    then = [",", " ?", *_chars(f'"{args_key}"'), " ?", ":", " ?", "\\{"]
    return ["\\{", " ?", *_chars('"name"'), " ?", ":", " ?", '"', _any_prefix([n + '"' for n in names], then)]


def _escape(literal: str) -> str:
    return '"' + literal.replace("\\", "\\\\").replace('"', '\\"') + '"'


def tool_grammar(fmt: str, functions: list[dict], *, required: bool, parallel: bool,
                 builtins: tuple[str, ...] = (), field: str = "tools") -> GrammarSpec:
    """The grammar for calling one of `functions` (each {"name", "parameters"}) in format `fmt`."""
    functions, defs = hoist_refs(functions)
    if fmt == GENERIC:
        return _generic(functions, required, parallel, field, defs)
    if fmt == HERMES:
        body = _gbnf(_one_of([call_schema(f) for f in functions]), field, "tc-", defs)
        call = f'{_escape(HERMES_OPEN)} tool-ws tc-root tool-ws {_escape(HERMES_CLOSE)}'
        rules = [f"root ::= tool-call{' ( tool-ws tool-call )*' if parallel else ''}",
                 f"tool-call ::= {call}", 'tool-ws ::= [ \\n]{0,2}']
        opening = _prefixes(["[ \\n]{0,2}", *_opening([f["name"] for f in functions])])
        triggers = [f"({re.escape(HERMES_OPEN)}){opening}$"]
    elif fmt == LLAMA3:
        customs = [f for f in functions if f["name"] not in builtins]
        alts, rules = [], []
        if customs:
            rules.append(_gbnf(_one_of([call_schema(f, "parameters") for f in customs]), field, "tc-", defs))
            alts.append("tc-root")
        for k, f in enumerate(f for f in functions if f["name"] in builtins):
            alts.append(_builtin_rule(f, k, field, rules))
        rules.insert(0, f"root ::= {' | '.join(alts)}")
        body = ""
        tag = re.escape(PYTHON_TAG)
        # only once "name" is written: a reply that is some other JSON object stays free
        opening = _prefixes(_opening([f["name"] for f in customs], "parameters")[8:])
        triggers = [f'^\\s*(?:{tag}\\s*)?(\\{{ ?"name"){opening}$'] if customs else []
        if builtins and len(customs) < len(functions):
            calls = _any_prefix([f["name"] + ".call(" for f in functions if f["name"] in builtins])
            triggers.append(f"({tag}){calls}$")
    elif fmt == MISTRAL:
        array = {"type": "array", "items": _one_of([call_schema(f, with_id=True) for f in functions]), "minItems": 1}
        if not parallel:
            array["maxItems"] = 1
        body = _gbnf(array, field, "tc-", defs)
        rules = [f"root ::= {_escape(MISTRAL_MARK)} tc-root"]
        opening = _prefixes(["\\[", " ?", *_opening([f["name"] for f in functions])])
        triggers = [f"({re.escape(MISTRAL_MARK)}){opening}$"]
    else:
        raise ValueError(f"unknown tool-call format {fmt!r}")
    gbnf = "\n".join(rules) + ("\n" + body if body else "") + "\n"
    return GrammarSpec(gbnf, field=field, trigger_patterns=() if required else tuple(triggers), special_text=True)


def _builtin_rule(fn: dict, k: int, field: str, rules: list[str]) -> str:
    """Llama 3.1's `<|python_tag|>NAME.call(key=VALUE, ...)` for a builtin tool; its rules go into `rules`."""
    kvs = []
    for j, (key, schema) in enumerate(fn["parameters"].get("properties", {}).items()):
        prefix = f"tb{k}-{j}-"
        rules.append(_gbnf(schema, field, prefix))
        kvs.append(f'"{key}=" {prefix}root')
    args = ' ", " '.join(kvs)
    name = f"tool-builtin-{k}"
    rules.append(f'{name} ::= {_escape(PYTHON_TAG + fn["name"] + ".call(")} {args} ")"')
    return name


def _generic(functions: list[dict], required: bool, parallel: bool, field: str, defs: dict) -> GrammarSpec:
    calls = _one_of([call_schema(f) for f in functions])
    if parallel:
        shape = {"type": "object", "properties": {"tool_calls": {"type": "array", "items": calls, "minItems": 1}},
                 "required": ["tool_calls"]}
    else:
        shape = {"type": "object", "properties": {"tool_call": calls}, "required": ["tool_call"]}
    if not required:
        answer = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"]}
        shape = {"anyOf": [shape, answer]}
    return GrammarSpec(schema_gbnf({**shape, "$defs": defs} if defs else shape, field), field=field)
