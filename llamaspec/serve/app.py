"""The HTTP routes (FastAPI): OpenAI's /v1/chat/completions, /v1/completions and /v1/models,
plus /health and /metrics. Handlers never touch the model: they hand a `Job` to the engine thread
(scheduler.py) and read its events from an asyncio queue (`emit` posts into it thread-safely).
Every error is OpenAI's JSON shape, {"error": {"message", "type", "param", "code"}}, whatever
failed (an exception no route expected is a 500 of that shape, never a plain-text page).

Browsers: POSTs must say `Content-Type: application/json` (a web page can send text/plain
cross-origin without asking, never JSON), no origin may read answers unless `cors_origins` names
it, and a server bound to loopback refuses requests whose Host is another name (DNS rebinding:
a page of evil.example resolved to 127.0.0.1).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import sys
import time
import traceback
from typing import Any, Sequence

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from sse_starlette.sse import EventSourceResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from llamaspec.openai import requests as oa_req, responses as oa_resp
from llamaspec.openai.chunks import Chunks
from llamaspec.api.generator import Request as GenRequest
from llamaspec.serve.scheduler import Job, Scheduler

MAX_BODY = 8 * 1024 * 1024   # bytes of one request body
MAX_DEPTH = 64               # nesting of arrays and objects in a request body
RETRY_AFTER_S = 5            # what a 503 for a full queue asks the client to wait


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type
        self.headers = headers


def _error_response(e: ApiError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else e.headers
    return JSONResponse(oa_resp.error_body(e.message, status=e.status, param=e.param, code=e.code, type=e.type),
                        status_code=e.status, headers=headers)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


async def read_json(request: Request, limit: int) -> Any:
    """The body as JSON, refused past `limit` bytes (413) before more of it is read."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise ApiError(413, f"the request body is {int(length):,} bytes, over the limit of {limit:,}",
                       code="request_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"the request body is over the limit of {limit:,} bytes", code="request_too_large")
        chunks.append(chunk)
    too_deep = ApiError(400, f"the request body nests arrays and objects more than {MAX_DEPTH} deep")
    try:
        body = json.loads(b"".join(chunks), parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None
    except RecursionError:   # (past Python's own limit, about 1000)
        raise too_deep from None
    if _too_deep(body, MAX_DEPTH):
        raise too_deep
    return body


def _too_deep(value: Any, limit: int) -> bool:
    """Nesting beyond `limit` (iterative: the checks after parsing must not recurse that deep)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        items = v.values() if isinstance(v, dict) else v if isinstance(v, list) else None
        if items is None:
            continue
        if depth > limit:
            return True
        stack.extend((x, depth + 1) for x in items)
    return False


LOOPBACK_NAMES = ("localhost", "localhost.")


def is_loopback(host: str) -> bool:
    """An address or name that only reaches this machine (127.0.0.0/8, ::1, localhost).

        >>> [is_loopback(h) for h in ("127.0.0.1", "::1", "localhost", "0.0.0.0", "evil.example")]
        [True, True, True, False, False]
    """
    host = host.strip("[]").lower()
    if host in LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str:
    """The name of a Host header, its port dropped ("[::1]:8080" -> "::1")."""
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


class LoopbackHostOnly:
    """ASGI middleware for a server bound to loopback: a request whose Host header names another
    host (a page whose DNS name was rebound to 127.0.0.1) gets 403 before any route runs."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            if host and not is_loopback(_host_name(host)):
                e = ApiError(403, f"Host {host[:100]!r} is not a loopback name: this server listens on loopback "
                                  "only (use http://127.0.0.1 or http://localhost, or bind --host to serve other "
                                  "names)", code="host_not_allowed")
                return await _error_response(e)(scope, receive, send)
        return await self.app(scope, receive, send)


def _is_json(content_type: str) -> bool:
    kind = content_type.partition(";")[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


def create_app(sched: Scheduler, *, model_name: str, api_key: str | None = None,
               max_body: int = MAX_BODY, cors_origins: Sequence[str] = (), loopback_only: bool = False) -> FastAPI:
    app = FastAPI(title="llamaspec", docs_url=None, redoc_url=None, openapi_url=None)
    created = oa_resp.now()
    from llamaspec.runtime import grammar_worker   # (a warm compile worker before the first request)

    grammar_worker.prewarm(getattr(sched.gen.pipeline.target, "path", None))
    piece = sched.gen.pipeline.target.piece   # a token's bytes, for logprobs (reads the vocabulary only)
    if cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["authorization", "content-type"])
    if loopback_only:   # added last: runs first, before CORS answers a preflight
        app.add_middleware(LoopbackHostOnly)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError) -> JSONResponse:
        return _error_response(e)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        return _error_response(ApiError(e.status_code, str(e.detail), code=None))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, e: RequestValidationError) -> JSONResponse:
        return _error_response(ApiError(400, str(e)))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, e: Exception) -> JSONResponse:
        traceback.print_exception(e, file=sys.stderr)
        return _error_response(ApiError(500, f"internal error: {type(e).__name__} (see the server's log)",
                                        type="server_error"))

    def authorized(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
            raise ApiError(401, "invalid or missing API key: send the header Authorization: Bearer KEY",
                           code="invalid_api_key")

    @app.get("/health")
    async def health() -> JSONResponse:
        counts = {"slots_processing": sched.processing, "requests_deferred": sched.deferred,
                  "requests_in_flight": sched.in_flight}
        if not sched.alive:
            return JSONResponse({"status": "error", "message": f"the engine stopped: {sched.dead}", **counts},
                                status_code=503)
        if sched.draining:
            return JSONResponse({"status": "draining", **counts}, status_code=503)
        return JSONResponse({"status": "ok", **counts})

    api = APIRouter(dependencies=[Depends(authorized)])

    @api.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse(oa_resp.model_list([model_name], created))

    @api.get("/metrics")
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(sched.metrics.render(), media_type="text/plain; version=0.0.4")

    @api.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await _generate(request, oa_req.CHAT)

    @api.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _generate(request, oa_req.COMPLETION)

    async def _generate(request: Request, kind: str) -> Response:
        if not sched.alive or sched.draining:
            raise ApiError(503, "the server is shutting down", type="server_error")
        if not _is_json(request.headers.get("content-type", "")):
            raise ApiError(415, "send the header Content-Type: application/json (got "
                                f"{request.headers.get('content-type', 'none')[:60]!r})", code="unsupported_media_type")
        body = await read_json(request, max_body)
        try:   # (off the event loop: a request's schema is converted while it is parsed)
            parsed = await run_in_threadpool(oa_req.parse_chat if kind == oa_req.CHAT else oa_req.parse_completion,
                                             body)
        except oa_req.RequestError as e:
            raise ApiError(400, e.message, e.param, e.code) from None
        loop, events = asyncio.get_running_loop(), asyncio.Queue()
        rid = oa_resp.new_id(kind)
        job = Job(rid, GenRequest(**parsed.fields), lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev),
                  stream=parsed.stream, field_prompt="messages" if kind == oa_req.CHAT else "prompt")
        if not sched.submit(job):
            if sched.draining or not sched.alive:
                raise ApiError(503, "the server is shutting down", type="server_error")
            raise ApiError(503, "too many requests queued; retry later", type="server_error",
                           headers={"Retry-After": str(RETRY_AFTER_S)})
        ev = await _next_event(request, job, events)   # accepted, or refused (a bad value, too long)
        if ev[0] == "error":
            raise ApiError(*ev[1:])
        ids = dict(id=rid, model=model_name, created=oa_resp.now())
        if parsed.stream:
            return EventSourceResponse(_sse(job, events, parsed, ids), sep="\n", ping=15)
        while ev[0] != "done":
            ev = await _next_event(request, job, events)
            if ev[0] == "error":
                raise ApiError(*ev[1:])
        _, result, cache_n = ev
        build = oa_resp.chat_completion if kind == oa_req.CHAT else oa_resp.text_completion
        response = JSONResponse(build(result, **ids, timings=oa_resp.timings(result, cache_n), piece=piece))
        job.marks["built"] = time.perf_counter()
        sched.profile.job(job.marks)
        return response

    async def _next_event(request: Request, job: Job, events: asyncio.Queue) -> tuple:
        """The job's next event; a client that disconnects meanwhile frees its slot."""
        getter = asyncio.ensure_future(events.get())
        try:
            while True:
                done, _ = await asyncio.wait({getter}, timeout=1.0)
                if done:
                    return getter.result()
                if not sched.alive and events.empty():   # (its error event is normally there first)
                    raise ApiError(500, "internal error: the server's engine stopped", type="server_error")
                if await request.is_disconnected():
                    sched.cancel(job)
                    raise ApiError(499, "the client closed the request")
        except BaseException:
            getter.cancel()
            sched.cancel(job)
            raise

    async def _sse(job: Job, events: asyncio.Queue, parsed: oa_req.Parsed, ids: dict):
        chunks = Chunks(parsed.kind == oa_req.CHAT, ids, parsed.include_usage, job.tools, piece)
        finished = False
        try:
            for c in chunks.first():
                yield {"data": json.dumps(c)}
            while True:
                ev = await events.get()
                if ev[0] == "text":
                    for c in chunks.text(ev[1], ev[2]):
                        yield {"data": json.dumps(c)}
                elif ev[0] == "done":
                    _, result, cache_n = ev
                    for c in chunks.end(result, oa_resp.timings(result, cache_n)):
                        yield {"data": json.dumps(c)}
                    finished = True
                    yield {"data": "[DONE]"}
                    return
                elif ev[0] == "error":
                    finished = True
                    status, message, param, code = ev[1:]
                    yield {"data": json.dumps(oa_resp.error_body(message, status=status, param=param, code=code))}
                    return
        except Exception as e:  # noqa: BLE001 - a broken stream ends with an error event, not a cut
            traceback.print_exception(e, file=sys.stderr)
            if not finished:
                finished = True
                sched.cancel(job)
                yield {"data": json.dumps(oa_resp.error_body(f"internal error: {type(e).__name__} (see the server's log)",
                                                         status=500))}
        finally:
            if not finished:   # the client went away mid-stream: stop its sequence now
                sched.cancel(job)

    app.include_router(api)
    return app
