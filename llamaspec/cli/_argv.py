"""llama.cpp habits on the command line, rewritten before the parser sees them.

- `-m MODEL` / `--model MODEL` (llama-cli, llama-server) is the model positional of any command
  that takes one (run, chat, serve, bench, batch, pair, check, inspect, tune).
- The root flags `--debug`, `--log-verbose` and `--log-file FILE` work after the subcommand too
  (`llamaspec run M --debug`), as llama.cpp's flags have no position.

The command's own options are read from the parser (click) so that an option's value is never
taken for a flag: `-p -m` is the prompt "-m".
"""

from __future__ import annotations

from typing import Any

from llamaspec.errors import UsageError

ROOT_FLAGS = ("--debug", "--log-verbose")
ROOT_VALUE_FLAGS = ("--log-file",)
MODEL_FLAGS = ("-m", "--model")
# The first positional of these names is the model (bench takes several).
_MODEL_ARGS = ("model", "models", "main")


def _value_options(command: Any) -> set[str]:
    """The option strings of `command` that take a value."""
    out: set[str] = set()
    for p in getattr(command, "params", []):
        if getattr(p, "param_type_name", "") == "option" and not (p.is_flag or p.count):
            out.update(p.opts)
            out.update(p.secondary_opts)
    return out


def _arguments(command: Any) -> list[Any]:
    return [p for p in getattr(command, "params", []) if getattr(p, "param_type_name", "") == "argument"]


def normalize(args: list[str], group: Any) -> list[str]:
    """`args` with root flags moved before the subcommand and -m/--model made the positional.

    group: the click group of the app (its `commands` and their params)."""
    root_value = set(ROOT_VALUE_FLAGS)
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] != "--":   # root options
        i += 2 if args[i] in root_value else 1
    if i >= len(args) or args[i] == "--":
        return args
    name, command = args[i], getattr(group, "commands", {}).get(args[i])
    if command is None:
        return args   # the parser says what is wrong
    head, rest = args[:i], args[i + 1:]
    takes_value = _value_options(command)
    arguments = _arguments(command)
    model_arg = bool(arguments) and arguments[0].name in _MODEL_ARGS
    moved, models, kept, positionals = [], [], [], 0
    j = 0
    while j < len(rest):
        a = rest[j]
        if a == "--":
            positionals += len(rest) - j - 1
            kept += rest[j:]
            break
        flag, eq, value = a.partition("=")
        if a in ROOT_FLAGS:
            moved.append(a)
        elif flag in root_value:
            if not eq:
                if j + 1 >= len(rest):
                    raise UsageError(f"{flag} needs a value", f"{flag} FILE")
                value, j = rest[j + 1], j + 1
            moved += [flag, value]
        elif model_arg and flag in MODEL_FLAGS:
            if not eq:
                if j + 1 >= len(rest):
                    raise UsageError(f"{flag} needs a value", f"{flag} MODEL: a GGUF path or Hub reference")
                value, j = rest[j + 1], j + 1
            models.append(value)
        elif a.startswith("-") and a != "-":
            kept.append(a)
            if not eq and flag in takes_value and j + 1 < len(rest):
                kept.append(rest[j + 1])
                j += 1
        else:
            kept.append(a)
            positionals += 1
        j += 1
    if models:
        many = any(p.nargs == -1 for p in arguments)
        if not many and (len(models) > 1 or positionals >= len(arguments)):
            raise UsageError(f"{name}: the model is given twice (as a positional and with -m/--model)",
                             "give it once: -m MODEL or MODEL")
    return head + moved + [name] + models + kept
