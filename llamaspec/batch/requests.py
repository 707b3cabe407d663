"""Requests of `llamaspec batch MODEL INPUT -o OUTPUT` (and the I/O around them, results.py): JSONL requests in, one JSONL record per
request out, written so that a kill at any instant loses at most the record being written.

Plain Python (no llama_cpp, no CLI libraries), so all of it is tested without a model. The runner
reads INPUT (`read_input`), parses it (`parse_requests`), checks that OUTPUT belongs to a job with
the same settings (`check_or_write_manifest`), skips what OUTPUT holds (`OutputFile.done_ids`)
and appends one record per request (`result_record` / `error_record`). INPUT lines are
llamaspec's form or, when they have "custom_id" or "body", the OpenAI batch form (vLLM's
`run-batch`, OpenAI's Batch API). Both forms are parsed by the server's parser
(openai/requests.py): the same fields, verdicts and messages as an HTTP body. Unknown keys are
ignored, except in an OpenAI body the fields that ask for what the engine cannot do (`n` > 1,
...: `openai.unsupported.UNSUPPORTED`, the server's list), which make the line a failed record
naming the field rather than be dropped silently (a llamaspec line's keys may be a dataset's own
columns: all ignored). A llamaspec line with messages is a chat body; with a prompt, a completion
body whose text takes the job's --chat/--raw:

    {"id": "q1", "prompt": "Hi", "max_tokens": 8, "temperature": 0, "seed": 1, "stop": "\\n",
     "top_p": 0.9, "top_k": 40, "min_p": 0.05, "repeat_penalty": 1.1, "presence_penalty": 0.5,
     "frequency_penalty": 0.2}
    {"id": 2, "messages": [{"role": "user", "content": "Hi"}]}
    {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "ignored", "messages": [...], "max_completion_tokens": 8, "top_p": 0.9}}

Worked example:

>>> items = parse_requests(['{"id": 7, "prompt": "Hi", "stop": "."}', '', '{"prompt": 3}'])
>>> items[0].id, items[0].fields["prompt"], items[0].fields["stop"], items[0].fields["chat"]
('7', 'Hi', ['.'], None)
>>> items[1]  # doctest: +NORMALIZE_WHITESPACE
LineError(id='line-3', line=3, message='prompt must be a string, got number', openai=None,
          param='prompt')
"""

from __future__ import annotations

import codecs
import json
import os
import sys
from dataclasses import dataclass, replace
from typing import IO, Any, Iterable

from llamaspec.openai import requests as oa_req
from llamaspec.errors import InputError
from llamaspec.openai.fields import jtype

__all__ = ["Request", "LineError", "parse_requests", "read_input", "CHAT", "COMPLETIONS"]

CHAT, COMPLETIONS = "chat", "completions"
_URLS = {"/v1/chat/completions": CHAT, "/v1/completions": COMPLETIONS}
_UNKNOWN = "?"  # the form of a line too broken to tell; parse_requests gives it the file's form


@dataclass
class Request:
    """One request to run. `openai` is None (llamaspec's form) or "chat" / "completions" (the
    OpenAI url it came with): it decides the shape of its OUTPUT record. `fields` are the engine
    Request's keyword arguments (prompt, chat, max_tokens, temperature, ..., grammar), as the
    server's parser gives them (openai/requests.py); a field left out is the job's default."""

    id: str
    line: int
    fields: dict
    openai: str | None = None


@dataclass
class LineError:
    """A malformed INPUT line: the job goes on and OUTPUT gets an error record for it. `id` is the
    line's own id when readable, else "line-N"; `message` is one line, without the line number;
    `param` the field at fault when there is one (OpenAI's error `param`)."""

    id: str
    line: int
    message: str
    openai: str | None = None
    param: str | None = None


class _Bad(Exception):
    """A malformed line; always turned into a LineError inside this module."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")  # Python's json takes NaN/Infinity; JSON does not


def _request(d: dict, rid: str, line: int, openai: str | None) -> Request:
    """A line (`d`: the line, or the OpenAI body) by the server's parser: an OpenAI body as the
    server parses its url's body (unknown keys ignored, unsupported.py's refused); a llamaspec
    line as a chat body when it has messages, else as a completion body whose prompt takes the
    job's chat setting (unknown keys ignored: a dataset's own columns ride along)."""
    prompt, messages = d.get("prompt"), d.get("messages")
    if openai == CHAT and messages is None:
        raise _Bad("body has no messages (url /v1/chat/completions)")
    if openai == COMPLETIONS and prompt is None:
        raise _Bad("body has no prompt (url /v1/completions)")
    if openai is None and (prompt is None) == (messages is None):
        raise _Bad('give "prompt" or "messages", not both' if prompt is not None
                   else 'no "prompt" or "messages"')
    if openai is not None and d.get("stream"):   # a batch record is one response, not a stream
        raise _Bad("stream is not supported in a batch job (got true)", "stream")
    chat = openai == CHAT if openai is not None else messages is not None
    try:
        fields = oa_req.parse_body(d, oa_req.CHAT if chat else oa_req.COMPLETION, unsupported=openai is not None).fields
    except oa_req.RequestError as e:
        raise _Bad(e.message, e.param) from None
    if openai is None and not chat:
        fields["chat"] = None   # a llamaspec line's text prompt: the job's --chat / --raw decides
    return Request(rid, line, fields, openai)


def _parse_line(text: str | bytes, line: int) -> Request | LineError:
    rid, form = f"line-{line}", _UNKNOWN
    try:
        if isinstance(text, bytes):  # decoded here, per line: one bad byte fails its line only
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError as e:
                rid, form = _id_and_form(text.decode("utf-8", "replace"), rid)  # to name it in OUTPUT
                raise _Bad(f"not UTF-8: byte 0x{text[e.start]:02x} at column {e.start + 1} "
                           "(convert the file to UTF-8, e.g. iconv -t UTF-8)") from None
        try:
            obj = json.loads(text, parse_constant=_no_constant)
        except ValueError as e:
            where = f" at column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
            raise _Bad(f"invalid JSON: {getattr(e, 'msg', e)}{where}") from None
        if not isinstance(obj, dict):
            raise _Bad(f"a line must be a JSON object, got {jtype(obj)}")
        is_openai = "custom_id" in obj or "body" in obj  # "url" alone may be a dataset's field
        key = "custom_id" if is_openai else "id"
        v = obj.get(key)
        if v is not None:
            if not (isinstance(v, str) and v or isinstance(v, int) and not isinstance(v, bool)):
                raise _Bad(f"{key} must be a non-empty string or an integer, got {jtype(v)}")
            rid = str(v)
        if not is_openai:
            form = None
            return _request(obj, rid, line, None)
        url = obj.get("url")
        kind = _URLS.get(url) if isinstance(url, str) else None
        form = kind or CHAT  # any OpenAI form gives a bad url's error record the right shape
        if obj.get("method", "POST") != "POST":
            raise _Bad(f"method must be POST, got {json.dumps(obj['method'])}")
        if kind is None:
            raise _Bad(f"unsupported url {json.dumps(url)}: "
                       "use /v1/chat/completions or /v1/completions")
        if not isinstance(obj.get("body"), dict):
            raise _Bad(f"body must be an object, got {jtype(obj.get('body'))}")
        return _request(obj["body"], rid, line, kind)
    except _Bad as e:
        return LineError(rid, line, str(e), form, e.param)


def _id_and_form(text: str, rid: str) -> tuple[str, str | None]:
    """The id and form of a line that fails anyway, when its JSON can be read (else as given)."""
    try:
        obj = json.loads(text)
    except ValueError:
        return rid, _UNKNOWN
    if not isinstance(obj, dict):
        return rid, _UNKNOWN
    is_openai = "custom_id" in obj or "body" in obj
    v = obj.get("custom_id" if is_openai else "id")
    ok = isinstance(v, str) and v or isinstance(v, int) and not isinstance(v, bool)
    form = (_URLS.get(obj.get("url")) if isinstance(obj.get("url"), str) else None) or CHAT if is_openai else None
    return (str(v) if ok else rid), form


def parse_requests(lines: Iterable[str | bytes]) -> list[Request | LineError]:
    """Parse INPUT lines (numbered from 1; blank ones skipped). A malformed line becomes a
    LineError in its place; one too broken to show its form takes the file's form (that of its
    first readable line), so an OpenAI batch file gets only OpenAI-shaped records. Raises
    InputError on a duplicate id (derived "line-N" ids included) before any work starts."""
    items = [_parse_line(t, n) for n, t in enumerate(lines, 1) if t.strip()]  # (str or bytes)
    default = next((it.openai for it in items if it.openai != _UNKNOWN), None)
    items = [replace(it, openai=default) if it.openai == _UNKNOWN else it for it in items]
    seen: dict[str, int] = {}
    for it in items:
        if it.id in seen:
            raise InputError(f"duplicate id {json.dumps(it.id)} on lines {seen[it.id]} and "
                             f"{it.line}", hint="give each line its own id (or none: line-N)")
        seen[it.id] = it.line
    return items


def read_input(path_or_dash: str, stdin: IO[bytes] | None = None) -> list[bytes]:
    """INPUT's lines as bytes, from a file or "-" (standard input); `parse_requests` decodes each
    line on its own, so one line that is not UTF-8 is that line's failure, not the job's. Split on
    "\\n" only: JSON strings may hold U+2028 and friends, which str.splitlines would split on."""
    try:
        if path_or_dash == "-":
            stream = stdin if stdin is not None else getattr(sys.stdin, "buffer", sys.stdin)
            data = stream.read()
            if isinstance(data, str):   # a text stream without bytes under it (an embedding program's)
                data = data.encode("utf-8", "surrogateescape")
        elif os.path.isdir(path_or_dash):
            raise InputError(f"input is a directory: {path_or_dash}", hint="give a JSONL file")
        else:
            with open(path_or_dash, "rb") as f:
                data = f.read()
    except FileNotFoundError:
        raise InputError(f"input file not found: {path_or_dash}",
                         hint="check the path, or give - to read standard input") from None
    except PermissionError:
        raise InputError(f"cannot read {path_or_dash}: permission denied",
                         hint="check file permissions") from None
    return data.removeprefix(codecs.BOM_UTF8).split(b"\n")  # a BOM would break the first line's JSON
