"""Records of `llamaspec batch`: one JSONL line per request (llamaspec's form or the OpenAI batch
output form), appended and fsynced one at a time so a kill loses at most the line being written;
resume reads back what is done (the manifest beside OUTPUT that refuses to mix jobs in one file is
manifest.py); `InOrder` holds finished records back so that they are written in input order.

>>> from llamaspec.batch.requests import parse_requests
>>> ok, bad = parse_requests(['{"id": 7, "prompt": "Hi"}', '{"prompt": 3}'])
>>> result_record(ok, "Hello", "stop", {"n_prompt": 3, "n_generated": 2}, "m.gguf")
{'id': '7', 'text': 'Hello', 'finish_reason': 'stop', 'n_prompt': 3, 'n_generated': 2}
>>> error_record(bad, bad.message)
{'id': 'line-2', 'error': {'message': 'prompt must be a string, got number', 'line': 2}}
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
import uuid
from contextlib import suppress
from typing import Any, Iterable, Iterator

from llamaspec.batch.requests import CHAT, LineError, Request
from llamaspec.errors import InputError, disk_full
from llamaspec.openai.logprobs import chat_logprobs, completion_logprobs

__all__ = ["result_record", "error_record", "record_failed", "recorded_ids", "OutputFile", "InOrder", "openai_finish_reason"]

# finish_reason values the OpenAI SDK accepts (its models refuse any other)
OPENAI_FINISH_REASONS = ("stop", "length", "tool_calls", "content_filter", "function_call")


def _openai_line(custom_id: str, status: int, body: dict) -> dict:
    return {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": custom_id,
            "response": {"status_code": status, "request_id": uuid.uuid4().hex, "body": body},
            "error": None}


def result_record(req: Request, text: str, finish_reason: str, stats: dict, model: str, result: Any = None,
                  piece: Any = None) -> dict:
    """The OUTPUT line of a finished request. `stats` holds at least `n_prompt` and
    `n_generated`. Own form: {"id", "text", "finish_reason", **stats}. OpenAI form: {"id":
    "batch_req_…", "custom_id", "response": {"status_code": 200, "request_id", "body": {"object":
    "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content":
    text}, "logprobs": null, "finish_reason"}], "usage": {"prompt_tokens", "completion_tokens",
    "total_tokens"}, "id", "created", "model"}}, "error": null}; for /v1/completions the body is
    a "text_completion" with choices[0].text. OpenAI's form has OpenAI's finish reasons only
    (`openai_finish_reason`: "context", the context filled, is "length"); our own keeps ours.
    result (a generator Result): its tool_calls and logprobs go into the record (own form: as
    Result.to_dict writes them; OpenAI's: its shapes, token texts by `piece`, a token's bytes)."""
    if req.openai is None:
        rec = {"id": req.id, "text": text, "finish_reason": finish_reason}
        rec.update((k, v) for k, v in stats.items() if k not in rec)
        if result is not None:
            rec.update((k, v) for k, v in result.to_dict().items() if k in ("tool_calls", "content", "logprobs"))
        return rec
    chat = req.openai == CHAT
    message = {"role": "assistant", "content": text}
    if result is not None and result.tool_calls is not None:   # (content: never the generic envelope)
        message["content"] = result.content
        if result.tool_calls:
            message["tool_calls"] = result.tool_calls
    lps = None if result is None or piece is None else result.logprobs
    choice = {"index": 0, **({"message": message} if chat else {"text": text}),
              "logprobs": None if lps is None else (chat_logprobs if chat else completion_logprobs)(lps, piece),
              "finish_reason": openai_finish_reason(finish_reason)}
    p, c = stats["n_prompt"], stats["n_generated"]
    body = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice],
            "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}}
    return _openai_line(req.id, 200, body)


def openai_finish_reason(reason: str) -> str:
    """One of OPENAI_FINISH_REASONS: the context filling up (or an interrupt) cut the text short,
    which OpenAI calls "length" (the token limit, as llama-server does)."""
    return reason if reason in OPENAI_FINISH_REASONS else "length" if reason in ("context", "interrupted") \
        else "stop"


def error_record(item: Request | LineError, message: str, code: str | None = None,
                 status: int = 400, param: str | None = None) -> dict:
    """The OUTPUT line of a failed request or a malformed line. Own form: {"id", "error":
    {"message", "line"}}. OpenAI form: what OpenAI's batch output holds for a request the API
    rejects, an HTTP error response with a null top-level `error` (that one is documented "for
    requests that failed with a non-HTTP error", e.g. batch_expired): {"id": "batch_req_…",
    "custom_id", "response": {"status_code": 400, "request_id", "body": {"error": {"message":
    "line N: …", "type": "invalid_request_error", "param", "code": code}}}, "error": null}, `param`
    the field at fault (a LineError's own when not given) or null.
    A status >= 500 (our failure, not the request's) gives type "server_error"."""
    if item.openai is None:
        return {"id": item.id, "error": {"message": message, "line": item.line}}
    if param is None and isinstance(item, LineError):
        param = item.param
    err = {"message": f"line {item.line}: {message}",
           "type": "invalid_request_error" if status < 500 else "server_error",
           "param": param, "code": code}
    return _openai_line(item.id, status, {"error": err})


def _finite(v: Any) -> Any:
    """NaN/Infinity as null: json.dumps writes them, but they are not JSON (jq refuses them)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return {k: _finite(x) for k, x in v.items()} if isinstance(v, dict) else v


def _fsync_dir(path: str) -> None:
    """Make a created or renamed file's directory entry durable too (impossible on Windows)."""
    with suppress(OSError):
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_atomic(path: str, chunks: Iterable[bytes]) -> None:
    """Write a temp file beside `path`, fsync it, rename it over `path`: old or new, never half."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)),
                               prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        try:  # mkstemp makes 0600: keep the replaced file's mode, else the usual 0644
            os.chmod(tmp, os.stat(path).st_mode & 0o7777)
        except FileNotFoundError:
            os.chmod(tmp, 0o644)
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path)


def record_failed(rec: dict) -> bool:
    """Whether an OUTPUT record (either form) is a failure."""
    info = _record_info(rec)
    return info is None or info[1]


def _record_info(rec: Any) -> tuple[str, bool] | None:
    """(id, failed) of an OUTPUT record in either form; None if it is not one."""
    if isinstance(rec, dict) and "custom_id" in rec:
        resp = rec.get("response")
        ok = rec.get("error") is None and isinstance(resp, dict) and resp.get("status_code") == 200
        return str(rec["custom_id"]), not ok
    if isinstance(rec, dict) and "id" in rec:
        return str(rec["id"]), rec.get("error") is not None
    return None


def recorded_ids(path: str | os.PathLike) -> set[str]:
    """Ids of the complete records in OUTPUT (failed ones too), read without opening it for
    writing (nothing is created or cut: the manifest check comes first)."""
    ids: set[str] = set()
    with suppress(FileNotFoundError), open(path, "rb") as f:
        for raw in f:
            with suppress(ValueError):
                info = _record_info(json.loads(raw.decode("utf-8"))) if raw.endswith(b"\n") else None
                if info is not None:
                    ids.add(info[0])
    return ids


class OutputFile:
    """OUTPUT, opened for appending one durable record at a time:

        out = OutputFile("out.jsonl")
        done = out.done_ids()       # also cuts an incomplete last line left by a kill
        for req in requests:
            if req.id not in done:
                out.append(result_record(req, ...))

    Failed records count as done: a malformed line would fail the same way again, and so would
    a prompt too long for the context. `done_ids(include_failed=False)` (a `--retry-failed`)
    removes the failed records from the file instead, so that redoing them leaves one record
    per id."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        existed = os.path.exists(self.path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        if not existed:
            _fsync_dir(self.path)
        self._checked = False
        self.written = 0   # records appended by this object

    def _lines(self) -> Iterator[tuple[int, bytes, tuple[str, bool] | None]]:
        """(line number, bytes, (id, failed), or None for a line without newline or not JSON)."""
        with open(self.path, "rb") as f:
            for n, raw in enumerate(f, 1):
                try:
                    rec = json.loads(raw.decode("utf-8")) if raw.endswith(b"\n") else None
                except ValueError:
                    rec = None
                if rec is not None and _record_info(rec) is None:
                    raise InputError(f"{self.path}: line {n} is not a llamaspec batch record",
                                     hint="give a new -o")
                yield n, raw, _record_info(rec)

    def done_ids(self, include_failed: bool = True) -> set[str]:
        """Ids (own `id` or OpenAI `custom_id`) of OUTPUT's complete records. An incomplete last
        line (no newline or not JSON: a kill mid-write, a crash's zero-filled tail) is cut off,
        so it is redone; a broken line before the last is not ours to cut: InputError."""
        done: set[str] = set()
        good_end, bad, n_failed = 0, None, 0
        for n, raw, info in self._lines():
            if bad is not None:
                raise InputError(f"{self.path}: line {bad} is not a complete JSON record",
                                 hint="remove that line (or give a new -o) and run again")
            if info is None:
                bad = n
                continue
            good_end += len(raw)
            if info[1] and not include_failed:
                n_failed += 1
            else:
                done.add(info[0])
        if bad is not None:
            os.ftruncate(self._fd, good_end)
            os.fsync(self._fd)
        if n_failed:
            write_atomic(self.path, (raw for _, raw, info in self._lines() if not info[1]))
            os.close(self._fd)  # ours is the replaced file's descriptor
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        self._checked = True
        return done

    def append(self, record: dict) -> None:
        """Write one JSON line and fsync it before returning: a kill at any instant leaves at
        most one incomplete last line, which the next `done_ids()` cuts. `written` counts the
        records in the file, including one an interrupt hit after it was written whole (append
        raises, but the record stays: the summary must count it)."""
        if not self._checked:
            self.done_ids()  # never glue a record onto a previous run's half line
        data = memoryview((json.dumps(_finite(record), ensure_ascii=False) + "\n").encode())
        end, whole = os.lseek(self._fd, 0, os.SEEK_END), len(data)
        counted = False
        try:
            while data:
                data = data[os.write(self._fd, data):]
            self.written, counted = self.written + 1, True
            os.fsync(self._fd)
        except BaseException as e:  # a full disk (or Ctrl-C) mid-record: cut it, keep the file valid JSONL
            with suppress(OSError):
                if os.fstat(self._fd).st_size != end + whole:   # (a record written whole is kept)
                    os.ftruncate(self._fd, end)
                    self.written -= counted
                elif not counted:
                    self.written += 1
                os.fsync(self._fd)
            raise disk_full(self.path, e, "free some space, then run the same command again: it resumes "
                                          "after the records written") or e

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> OutputFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InOrder:
    """`--ordered`: records written in input order although they finish in any order. `keys` are
    the ids to write, in input order; `put(key, record)` writes the record and then every held one
    whose predecessors are all written. Holds at most the records finished ahead of the oldest
    unfinished one (about --parallel of them, or a few more when a long request lags).

    >>> got = []
    >>> w = InOrder(["a", "b", "c"], got.append)
    >>> w.put("b", 2); got
    []
    >>> w.put("a", 1); got
    [1, 2]
    >>> w.put("c", 3); got, w.held
    ([1, 2, 3], 0)
    """

    def __init__(self, keys: Iterable[str], write):
        self._order = list(keys)
        self._next = 0
        self._held: dict[str, Any] = {}
        self._write = write

    @property
    def held(self) -> int:
        return len(self._held)

    def put(self, key: str, record: Any) -> None:
        self._held[key] = record
        while self._next < len(self._order) and self._order[self._next] in self._held:
            self._write(self._held.pop(self._order[self._next]))
            self._next += 1
