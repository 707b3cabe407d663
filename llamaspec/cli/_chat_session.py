"""The parts of `llamaspec chat` that need no terminal and no model: multi-line input, fitting the
conversation into the context, the per-turn footer and the running totals. chat.py wires them to
the terminal and the Generator."""

from __future__ import annotations

import errno
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

QUOTE = '"""'
Message = dict[str, str]


class MultiLine:
    """ollama's multi-line input: a line starting with \"\"\" opens a message that the first line
    ending with \"\"\" closes (\"\"\"one line\"\"\" is complete at once). feed() returns the
    finished message, or None while more lines are needed."""

    def __init__(self) -> None:
        self._parts: list[str] | None = None

    @property
    def active(self) -> bool:
        return self._parts is not None

    def cancel(self) -> None:
        self._parts = None

    def feed(self, line: str) -> str | None:
        if self._parts is None:
            if not line.startswith(QUOTE):
                return line
            line, self._parts = line[len(QUOTE):], []
        closed = line.endswith(QUOTE)
        self._parts.append(line[:-len(QUOTE)] if closed else line)
        if not closed:
            return None
        # The line of the opening quotes and the one of the closing quotes are often empty.
        text, self._parts = "\n".join(self._parts).strip("\n"), None
        return text


def fit_history(messages: list[Message], count: Callable[[list[Message]], int], budget: int
                ) -> tuple[list[Message], int]:
    """Drop the oldest turns (a user message and the replies up to the next one) until
    count(messages) <= budget, keeping a leading system message and the last turn whatever it
    costs (the caller decides whether that still fits). Returns (messages, turns dropped)."""
    head = messages[:1] if messages and messages[0].get("role") == "system" else []
    body = messages[len(head):]
    dropped = 0
    while count(head + body) > budget:
        nxt = next((i for i in range(1, len(body)) if body[i].get("role") == "user"), None)
        if nxt is None:   # only the current turn is left
            break
        body, dropped = body[nxt:], dropped + 1
    return head + body, dropped


def answer_room(n_ctx: int, max_tokens: int) -> int:
    """Tokens kept free for the answer when trimming: up to -n, at most half the context (a tiny
    -c must still hold a question)."""
    return max(1, min(max_tokens, n_ctx // 2))


def evaluated(info: dict[str, Any]) -> int:
    """Prompt tokens this turn evaluated: the rest came from the KV cache of the earlier turns."""
    return info["n_prompt"] - info.get("n_prompt_cached", 0)


def drafters(info: dict[str, Any]) -> str:
    """The drafters that drafted this turn (a chain names each), else the spec type."""
    used = [name for name, c in (info.get("per_drafter") or {}).items() if c.get("drafted")]
    return "+".join(used) if used else str(info.get("spec_type"))


def footer(info: dict[str, Any]) -> str:
    """One line per turn, for stderr: what the prompt cost, speed, speculation."""
    cached = info.get("n_prompt_cached", 0)
    parts = [f"prompt {evaluated(info)} tokens" + (f" ({cached} cached)" if cached else ""),
             f"{info['n_generated']} tokens, {info['tokens_per_second']:.1f} tok/s"]
    if info["drafted"]:
        parts.append(f"{drafters(info)}: accepted {info['accepted']}/{info['drafted']} "
                     f"({100 * info['acceptance']:.0f}%)")
    else:
        parts.append(f"{info['spec_type']}: no drafts" if info["spec_type"] != "none" else "no speculation")
    if info.get("stop_reason") not in ("eos", "stop"):
        parts.append(f"stop: {info.get('stop_reason')}")
    return " | ".join(parts)


@dataclass
class Totals:
    """What /stats shows: the sums over the turns of this chat."""

    turns: int = 0
    prompt_evaluated: int = 0
    prompt_cached: int = 0
    generated: int = 0
    gen_seconds: float = 0.0
    prompt_seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0

    def add(self, info: dict[str, Any]) -> None:
        self.turns += 1
        self.prompt_evaluated += evaluated(info)
        self.prompt_cached += info.get("n_prompt_cached", 0)
        self.generated += info["n_generated"]
        self.gen_seconds += info["gen_seconds"]
        self.prompt_seconds += info["prompt_seconds"]
        self.drafted += info["drafted"]
        self.accepted += info["accepted"]

    def lines(self) -> list[str]:
        tps = self.generated / self.gen_seconds if self.gen_seconds > 0 else 0.0
        rate = f" ({100 * self.accepted / self.drafted:.0f}%)" if self.drafted else ""
        return [f"turns {self.turns}",
                f"prompt {self.prompt_evaluated} tokens evaluated in {self.prompt_seconds:.2f} s, "
                f"{self.prompt_cached} reused from the cache",
                f"generated {self.generated} tokens in {self.gen_seconds:.2f} s: {tps:.1f} tok/s",
                f"drafted {self.drafted}, accepted {self.accepted}{rate}"]


def save_messages(path: Path, messages: list[Message], *, overwrite: bool = False) -> None:
    r"""The conversation as a JSON list of {"role", "content"} (what `batch` and OpenAI read),
    written atomically: a temporary file beside `path`, then a rename, so an interrupted or failed
    write never leaves half a file. An existing `path` is kept (FileExistsError) unless `overwrite`.

        >>> import tempfile; p = Path(tempfile.mkdtemp()) / "c.json"
        >>> save_messages(p, [{"role": "user", "content": "hi"}]); save_messages(p, [])
        Traceback (most recent call last):
        ...
        FileExistsError: [Errno 17] File exists: ...
        >>> save_messages(p, [], overwrite=True); p.read_text(), sorted(x.name for x in p.parent.iterdir())
        ('[]\n', ['c.json'])
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(messages, ensure_ascii=False, indent=2) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            _link_new(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _link_new(tmp: str, path: Path) -> None:
    """tmp's content at `path` only if `path` does not exist, atomically where the file system has
    hard links (link fails on an existing name); elsewhere a check, then the rename."""
    try:
        os.link(tmp, path)
        return
    except FileExistsError:
        raise
    except OSError:   # no hard links here (FAT, some network file systems)
        pass
    if os.path.lexists(path):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path))
    os.replace(tmp, path)


HELP = """Available commands:
  /clear          forget the conversation (the system message stays)
  /stats          totals of this chat: prompt tokens, speed, acceptance
  /save FILE      write the conversation to FILE as a JSON list of messages (all of it, turns
                  dropped to fit the context too); /save! FILE overwrites an existing FILE
  /bye, /exit     leave (also Ctrl + d)
  /?, /help       this help

Use \"\"\" to begin a multi-line message and \"\"\" to end it.
Ctrl + c stops an answer and keeps what was written (before the answer begins, the message is
dropped)."""
