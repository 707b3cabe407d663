"""A model's chat template (Jinja text from its GGUF) rendered sandboxed, with bounded time and size.

The template comes from a downloaded file, so it is untrusted code. It runs in Jinja's
ImmutableSandboxedEnvironment, as llama-cpp-python's Jinja2ChatFormatter and transformers do,
tightened: an unsafe attribute (`__class__`, `__globals__`, `mro`...) is an error at once, not a
silent empty string; operators, calls, filters and `~` that would build a huge string or list (a
memory bomb) are refused before or right after they run; rendering stops after TIME_LIMIT seconds
in any thread (a server renders in worker threads, where SIGALRM cannot reach), and its output is
bounded like any value. The globals are those HF / llama.cpp templates expect: messages,
add_generation_prompt, bos_token, eos_token, raise_exception, strftime_now, tools=None...

Every failure is one ChatTemplateError line naming the model file (exit code 1; `--raw` skips the
template): "its chat template tried an unsafe operation", "has a syntax error at line N",
"refused the messages: <its raise_exception message>", "failed: ...".
"""

from __future__ import annotations

import json
import operator
import time
from datetime import datetime
from typing import Any

from llamaspec.errors import ChatTemplateError

TIME_LIMIT = 10.0            # seconds; real templates render in milliseconds
MAX_INT_ARG = 1_000_000      # widths, counts and repeats passed to calls and filters
MIN_MAX_LEN = 16_000_000     # characters / items any value may reach (more with long messages)
RAW_HINT = "use --raw to send the prompt without the chat template"

_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
        "//": operator.floordiv, "%": operator.mod, "**": operator.pow}


class _Raised(Exception):
    """raise_exception(...) called by the template."""


class _TimedOut(Exception):
    pass


def _env_class():
    from jinja2.compiler import CodeGenerator
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

    class IgnoreGeneration(Extension):
        """HF's `{% generation %}` tag: render its body as is."""

        tags = {"generation"}

        def parse(self, parser):
            parser.stream.skip(1)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    class Codegen(CodeGenerator):
        def visit_Concat(self, node, frame):  # `a ~ b`: through the size check
            self.write("environment.checked_concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class Env(ImmutableSandboxedEnvironment):
        """The time limit is cooperative: `tick` runs at every loop iteration, output piece, call,
        filter, operator and `~`, so no template code runs long without passing one (a signal
        would be no stronger: Python runs its handlers between bytecodes too, never inside one
        C-level call, and those are bounded by the size checks). Unlike SIGALRM it works in any
        thread and a timed-out render ends itself: no thread is left spinning, nothing to kill."""

        code_generator_class = Codegen
        intercepted_binops = frozenset(_OPS)
        max_len = MIN_MAX_LEN
        deadline = float("inf")   # time.monotonic() past which rendering stops

        def tick(self):
            if time.monotonic() > self.deadline:
                raise _TimedOut()

        def _parse(self, source, name, filename):
            # every `for` iterates through `ticking`: nested loops with no output and no call
            # (`{% for i in x %}{% for j in x %}{% endfor %}{% endfor %}`) pass a check per item
            from jinja2 import nodes

            tree = super()._parse(source, name, filename)
            for loop in tree.find_all(nodes.For):
                loop.iter = nodes.Filter(loop.iter, "_ticking", [], [], None, None, lineno=loop.lineno)
            return tree

        def ticking(self, iterable):
            for item in iterable:
                self.tick()
                yield item

        def unsafe_undefined(self, obj, attribute):
            raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__!r} object")

        def sized(self, value):
            if isinstance(value, (str, bytes, list, tuple, dict)) and len(value) > self.max_len:
                raise SecurityError(f"a value of {len(value):,} items (limit {self.max_len:,})")
            if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
                raise SecurityError("an integer of more than 256 bits")
            return value

        def check_args(self, args, kwargs):
            for a in (*args, *kwargs.values()):
                if isinstance(a, int) and not isinstance(a, bool) and abs(a) > MAX_INT_ARG:
                    raise SecurityError(f"a call with the argument {a} (limit {MAX_INT_ARG:,})")

        def call_binop(self, context, op, left, right):
            self.tick()
            if op == "**" and isinstance(right, (int, float)) and abs(right) > 64:
                raise SecurityError(f"a power with exponent {right}")
            if op == "*":
                seq, n = (left, right) if isinstance(right, int) else (right, left)
                if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int) and len(seq) * n > self.max_len:
                    raise SecurityError(f"repeating {len(seq):,} items {n:,} times")
            if op == "%" and isinstance(left, str):
                self.check_format(left)
            return self.sized(_OPS[op](left, right))

        def check_format(self, text: str) -> None:
            import re

            if re.search(r"[0-9]{7,}", text) and ("%" in text or "{" in text):
                raise SecurityError("a format string with a huge width")

        def wrap_str_format(self, value):  # `'...'.format` / `.format_map`, at attribute access
            if isinstance(getattr(value, "__self__", None), str):
                self.check_format(value.__self__)
            return super().wrap_str_format(value)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - Jinja's signature
            __self.tick()
            __self.check_args(args, kwargs)
            return __self.sized(super().call(__context, __obj, *args, **kwargs))

        def checked_concat(self, values):
            self.tick()
            total = sum(len(v) if isinstance(v, str) else 0 for v in values)
            if total > self.max_len:
                raise SecurityError(f"joining {total:,} characters (limit {self.max_len:,})")
            return self.sized("".join(map(str, values)))

    return Env, IgnoreGeneration, SecurityError


def _guarded(env, fn):
    """A filter whose width/count arguments are bounded and whose result is size-checked."""
    skip = 2 if hasattr(fn, "jinja_pass_arg") else 1  # the context/environment, then the filtered value

    def wrapper(*args, **kwargs):
        env.tick()
        env.check_args(args[skip:], kwargs)
        return env.sized(fn(*args, **kwargs))

    for attr in ("jinja_pass_arg", "environmentfilter", "contextfilter", "evalcontextfilter"):
        if hasattr(fn, attr):
            setattr(wrapper, attr, getattr(fn, attr))
    return wrapper


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None,
            sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str = "") -> None:
    raise _Raised(str(message))


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def render(template: str, messages: list[dict[str, Any]], *, source: str, bos_token: str = "",
           eos_token: str = "", add_generation_prompt: bool = True, time_limit: float | None = None,
           tools: list[dict] | None = None, **extra: Any) -> str:
    """The prompt `template` makes of `messages`, or a ChatTemplateError naming `source`.
    time_limit: seconds (default TIME_LIMIT), counted from the start of compiling, in any thread.
    tools: OpenAI's tools list for templates that render tools (None: the template's own default).
    Assistant messages with tool_calls get content "" for None, and their arguments (a JSON
    string in OpenAI's form) as an object when the template renders objects (llama.cpp's caps);
    a template that renders no tool calls gets calls and tool results as text (history_as_text,
    as minja's polyfills do)."""
    if any(m.get("tool_calls") or m.get("role") == "tool" for m in messages):
        messages = _tool_call_messages(template, messages) if "tool_calls" in template else history_as_text(messages)
    return _render(template, messages, source=source, bos_token=bos_token, eos_token=eos_token,
                   add_generation_prompt=add_generation_prompt, time_limit=time_limit, tools=tools, **extra)


def _arguments(v: Any) -> Any:
    if isinstance(v, str):
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v


def calls_as_text(message: dict, parallel: bool) -> str:
    """An assistant message's tool_calls as the generic JSON (its content, if any, in front)."""
    calls = [{"name": (c.get("function") or {}).get("name"),
              "arguments": _arguments((c.get("function") or {}).get("arguments"))}
             for c in message.get("tool_calls") or []]
    obj = {"tool_call": calls[0]} if len(calls) == 1 and not parallel else {"tool_calls": calls}
    content = message.get("content")
    return (f"{content}\n" if isinstance(content, str) and content else "") + json.dumps(obj, ensure_ascii=False)


def history_as_text(messages: list[dict], parallel: bool = True) -> list[dict]:
    """Messages a template without tool support renders: calls and tool results as text."""
    names: dict[str, str] = {}
    out: list[dict] = []
    for m in messages:
        role = m.get("role")
        if role == "assistant" and m.get("tool_calls"):
            for c in m["tool_calls"]:
                names[str(c.get("id"))] = (c.get("function") or {}).get("name")
            rest = {k: v for k, v in m.items() if k != "tool_calls"}
            out.append({**rest, "content": calls_as_text(m, parallel)})
        elif role == "tool":
            resp: dict = {}
            name = m.get("name") or names.get(str(m.get("tool_call_id")))
            if name:
                resp["tool"] = name
            resp["content"] = m.get("content")
            if m.get("tool_call_id") is not None:
                resp["tool_call_id"] = m["tool_call_id"]
            text = json.dumps({"tool_response": resp}, ensure_ascii=False)
            if out and out[-1].get("_tool"):
                out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + text}
            else:
                out.append({"role": "user", "content": text, "_tool": True})
        else:
            out.append(m)
    return [{k: v for k, v in m.items() if k != "_tool"} for m in out]


def _tool_call_messages(template: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    objects = _wants_object_arguments(template)
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [_object_arguments(call) if objects else call for call in m["tool_calls"]]
            m = {**m, "content": "" if m.get("content") is None else m["content"], "tool_calls": calls}
        out.append(m)
    return out


def _object_arguments(call: dict[str, Any]) -> dict[str, Any]:
    fn = call.get("function")
    if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
        try:
            return {**call, "function": {**fn, "arguments": json.loads(fn["arguments"])}}
        except ValueError:
            pass
    return call


_NEEDLE = {"argument_needle": "print('Hello, World!')"}
_OBJECT_ARGS_CACHE: dict[str, bool] = {}


def _wants_object_arguments(template: str) -> bool:
    """Whether the template renders a call's arguments as JSON only when given an object (it
    applies tojson or items to them), as minja's capability probe tells (llama.cpp then passes
    objects): a render with the arguments as a string must not show the needle as a JSON key."""
    if template not in _OBJECT_ARGS_CACHE:
        def shows(args) -> bool:
            call = {"id": "call00001", "type": "function", "function": {"name": "ipython", "arguments": args}}
            msgs = [{"role": "user", "content": "Hey"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
            try:
                out = _render(template, msgs, source="probe", add_generation_prompt=False, time_limit=1.0)
            except ChatTemplateError:
                return False
            return '"argument_needle":' in out or "'argument_needle':" in out

        _OBJECT_ARGS_CACHE[template] = not shows(json.dumps(_NEEDLE)) and shows(dict(_NEEDLE))
        if len(_OBJECT_ARGS_CACHE) > 64:
            _OBJECT_ARGS_CACHE.pop(next(iter(_OBJECT_ARGS_CACHE)))
    return _OBJECT_ARGS_CACHE[template]


def _render(template: str, messages: list[dict[str, Any]], *, source: str, bos_token: str = "",
            eos_token: str = "", add_generation_prompt: bool = True, time_limit: float | None = None,
            **extra: Any) -> str:
    import jinja2
    from jinja2.ext import loopcontrols

    time_limit = TIME_LIMIT if time_limit is None else time_limit
    Env, IgnoreGeneration, SecurityError = _env_class()
    env = Env(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True,
              extensions=[IgnoreGeneration, loopcontrols])
    env.max_len = max(MIN_MAX_LEN, 8 * sum(len(str(m.get("content") or "")) for m in messages))
    env.filters["tojson"] = _tojson
    for name, fn in list(env.filters.items()):
        env.filters[name] = _guarded(env, fn)
    env.filters["_ticking"] = env.ticking
    env.deadline = time.monotonic() + time_limit
    where = f"{source}: its chat template"
    try:
        compiled = env.from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"{where} has a syntax error at line {exc.lineno}: {_line(exc)}", RAW_HINT) from None
    except SecurityError as exc:
        raise ChatTemplateError(f"{where} tried an unsafe operation ({_line(exc)})", RAW_HINT) from None
    except (RecursionError, MemoryError, Exception) as exc:  # noqa: BLE001 - untrusted code: any failure
        raise ChatTemplateError(f"{where} cannot be compiled: {type(exc).__name__}: {_line(exc)}", RAW_HINT) from None
    context = dict(messages=messages, bos_token=bos_token, eos_token=eos_token,
                   add_generation_prompt=add_generation_prompt, raise_exception=_raise_exception,
                   strftime_now=_strftime_now, tools=None, functions=None, tool_choice=None, documents=None)
    context.update({k: v for k, v in extra.items() if not (k == "tools" and v is None)})
    try:
        pieces, size = [], 0
        for piece in compiled.generate(**context):
            env.tick()
            size += len(piece)
            if size > env.max_len:
                raise SecurityError(f"an output of over {env.max_len:,} characters")
            pieces.append(piece)
        return "".join(pieces)
    except SecurityError as exc:
        raise ChatTemplateError(f"{where} tried an unsafe operation ({_line(exc)})", RAW_HINT) from None
    except _Raised as exc:
        raise ChatTemplateError(f"{where} refused the messages: {_line(exc)}", RAW_HINT) from None
    except _TimedOut:
        raise ChatTemplateError(f"{where} did not finish within {time_limit:g} s (an endless loop?)",
                                RAW_HINT) from None
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"{where} has a syntax error at line {exc.lineno}: {_line(exc)}", RAW_HINT) from None
    except (RecursionError, MemoryError, Exception) as exc:  # noqa: BLE001 - untrusted code: any failure
        raise ChatTemplateError(f"{where} failed: {type(exc).__name__}: {_line(exc)}", RAW_HINT) from None


def _line(exc: BaseException) -> str:
    text = " ".join(str(getattr(exc, "message", None) or exc).split())
    return text[:200] + ("..." if len(text) > 200 else "")
