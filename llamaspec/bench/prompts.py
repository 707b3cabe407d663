"""What a benchmark decodes: the bundled prompt presets, and a suite of prompts from a JSONL file.

A suite file has one JSON object per line with an `id` (string or integer, unique in the file)
and a `prompt` (non-empty text); other keys are ignored, blank lines skipped. A broken line is a
usage error naming file:line. Nothing here imports llama_cpp.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from llamaspec.errors import UsageError

if TYPE_CHECKING:
    from llamaspec.runtime.llama import Model

# name -> bundled file (llamaspec/prompts/, package data) or literal text
PROMPT_PRESETS: dict[str, str] = {
    "code": "code_rewrite.txt",          # a chat request to rewrite a module: the output copies it
    "code-raw": "code_rewrite_raw.txt",  # the same as a completion, for models without a chat template
    "story": "Write a story about a lighthouse keeper who finds a message in a bottle.",
}


def preset_text(name: str) -> str:
    """The text of a bundled prompt preset (KeyError for an unknown name)."""
    value = PROMPT_PRESETS[name]
    if value.endswith(".txt"):
        return resources.files("llamaspec").joinpath("prompts", value).read_text(encoding="utf-8")
    return value


def load_prompt(name: str) -> str:
    """A preset name, else a file path, else the literal text (scripts/bench_engine.py's --prompt)."""
    if name in PROMPT_PRESETS:
        return preset_text(name)
    path = Path(name)
    return path.read_text(encoding="utf-8") if path.is_file() else name


def format_prompt(target: "Model", text: str, chat: bool | None = None) -> tuple[str, list[int], bool]:
    """(formatted text, tokens, chat used): the model's chat template unless `chat` is False
    (None: use it when the model has one)."""
    use_chat = chat if chat is not None else target.chat_template is not None
    formatted = target.chat_prompt([{"role": "user", "content": text}]) if use_chat else text
    return formatted, target.tokenize_prompt(formatted), use_chat


@dataclass(frozen=True)
class SuitePrompt:
    """One prompt of a benchmark. `text` None: the default preset, chosen per target (its chat
    form when the target has a chat template, else the completion form)."""

    id: str
    text: str | None


def parse_prompts(text: str, source: str) -> list[SuitePrompt]:
    """The prompts of a JSONL suite (`source` names the file in errors: `source:line: ...`)."""
    prompts: list[SuitePrompt] = []
    seen: dict[str, int] = {}
    hint = 'each line: {"id": "name", "prompt": "text"}'
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{source}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UsageError(f"{where}: not valid JSON ({e.msg} at column {e.colno})", hint) from None
        if not isinstance(obj, dict):
            raise UsageError(f"{where}: expected a JSON object, got {type(obj).__name__}", hint)
        pid, prompt = obj.get("id"), obj.get("prompt")
        if pid is None or isinstance(pid, bool) or not isinstance(pid, (str, int)) or str(pid) == "":
            raise UsageError(f"{where}: missing or invalid \"id\" (a non-empty string or an integer)", hint)
        if not isinstance(prompt, str) or not prompt.strip():
            raise UsageError(f"{where}: missing or empty \"prompt\" (non-empty text)", hint)
        pid = str(pid)
        if pid in seen:
            raise UsageError(f"{where}: duplicate id {pid!r} (first on line {seen[pid]})", "give every prompt its own id")
        seen[pid] = lineno
        prompts.append(SuitePrompt(pid, prompt))
    if not prompts:
        raise UsageError(f"{source}: no prompts in the file", hint)
    return prompts


def read_prompts(path: Path) -> list[SuitePrompt]:
    """parse_prompts of a file, with one-line errors for an unreadable one."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise UsageError(f"prompts file not found: {path}", "give --prompts a JSONL file") from None
    except IsADirectoryError:
        raise UsageError(f"prompts file is a directory: {path}", "give --prompts a JSONL file") from None
    except OSError as e:
        raise UsageError(f"cannot read prompts file {path}: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise UsageError(f"{path}:{line}: not UTF-8 text", "save the file as UTF-8") from None
    return parse_prompts(text, str(path))
