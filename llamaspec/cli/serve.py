"""`llamaspec serve MODEL`: an OpenAI-compatible HTTP server (llamaspec/serve/), with run's flags
as the defaults each request may override. Needs the optional extra `llamaspec[server]`."""

from __future__ import annotations

import os
from dataclasses import replace
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from llamaspec.cli._generation import TargetArg, generation_flags
from llamaspec.cli._options import CTX_SIZE_CHECK, at_least, draft_size_warning, in_range, ngram_flags, output_flags
from llamaspec.cli._output import Output
from llamaspec.cli.app import app
from llamaspec.errors import LlamaspecError, UsageError

if TYPE_CHECKING:
    from llamaspec.api.options import GenerationOptions
    from llamaspec.speculative.options import NgramParams

EXTRA_HINT = "pip install 'llamaspec[server]'"


class SuffixScope(str, Enum):
    shared = "shared"
    request = "request"


def require_server_extra() -> None:
    """FastAPI, uvicorn and sse-starlette, or one line naming the extra (before any model loads)."""
    try:
        import fastapi  # noqa: F401
        import sse_starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise LlamaspecError(f"llamaspec serve needs the 'server' extra ({e.name or 'a package'} is not installed)",
                             EXTRA_HINT) from None


# -c means what llama-server's means: the context of the whole KV cache, shared by the slots.
ServeCtxSizeOpt = Annotated[Optional[int], typer.Option(
    "-c", "--ctx-size", help="Context size in tokens shared by the --parallel slots, as llama-server's "
                             "(-np 4 -c 8192: 2048 tokens per slot; default 4096 per slot, capped at the model's "
                             "training context; 0: the training context, shared).", callback=CTX_SIZE_CHECK)]


def _shared_ctx_help(command):
    """serve's -c says it is shared (run's and batch's is per sequence): the same flag, its own help."""
    import inspect

    sig = inspect.signature(command)
    params = [p.replace(annotation=ServeCtxSizeOpt) if p.name == "ctx_size" else p for p in sig.parameters.values()]
    command.__signature__ = sig.replace(parameters=params)
    command.__annotations__["ctx_size"] = ServeCtxSizeOpt
    return command


@app.command()
@_shared_ctx_help
@output_flags
@ngram_flags
@generation_flags
def serve(
    ctx: typer.Context,
    model: TargetArg = None,
    parallel: Annotated[int, typer.Option(
        "--parallel", "-np", help="Slots decoded together in one context (requests beyond them wait).",
        callback=at_least("--parallel", 1))] = 1,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port.", callback=in_range("--port", 0, 65535))] = 8080,
    api_key: Annotated[Optional[str], typer.Option(
        "--api-key", help="Require 'Authorization: Bearer KEY' on every route but /health "
                          "(default: $LLAMASPEC_API_KEY).")] = None,
    cache_ram: Annotated[int, typer.Option(
        "--cache-ram", "-cram", metavar="MIB",
        help="RAM for the KV of prompts that left their slot, restored when a request shares their "
             "prefix (as llama-server's; -1: no limit, 0: off).",
        callback=at_least("--cache-ram", -1))] = 8192,
    timeout: Annotated[int, typer.Option(
        "--timeout", "-to", metavar="SECONDS",
        help="A request still queued after this long gets 503; one generating ends with what it has "
             "(finish_reason length), as llama-server's --timeout.", callback=at_least("--timeout", 1))] = 600,
    cors_origins: Annotated[Optional[str], typer.Option(
        "--cors-origins", metavar="ORIGINS",
        help="Comma-separated origins whose web pages may call the API (e.g. http://localhost:3000; "
             "default: none).")] = None,
    kv_unified_per_slot: Annotated[Optional[int], typer.Option(
        "--kv-unified-per-slot", metavar="N",
        help="Context per slot, as llama-server's: caps each slot at N tokens; without -c the KV cache "
             "is sized to --parallel x N.", callback=at_least("--kv-unified-per-slot", 1))] = None,
    suffix_scope: Annotated[SuffixScope, typer.Option(
        "--suffix-scope", case_sensitive=False,
        help="What the suffix drafter learns from: 'shared', every finished request (faster on repeated "
             "text; timings can tell a client whether a text was seen before), or 'request', each "
             "request's own text only (a server shared between people).")] = SuffixScope.shared,
    *,
    gen: GenerationOptions,
    ngram: NgramParams,
    out: Output,
) -> None:
    """Serve the model over HTTP with OpenAI's API: /v1/chat/completions, /v1/completions, /v1/models."""
    require_server_extra()
    from pathlib import Path

    from llamaspec.api.generator import Generator
    from llamaspec.runtime.llama import set_llama_log
    from llamaspec.serve import server
    from llamaspec.serve.app import create_app, is_loopback
    from llamaspec.serve.context_size import describe, slot_context
    from llamaspec.serve.scheduler import Scheduler

    if api_key is not None and not api_key.strip():
        raise UsageError("--api-key is empty", "give a key, or leave --api-key out to serve without one")
    key = api_key if api_key is not None else (os.environ.get("LLAMASPEC_API_KEY") or None)
    origins = [o.strip() for o in (cors_origins or "").split(",") if o.strip()]
    if getattr(ctx.get_parameter_source("max_tokens"), "name", "DEFAULT") == "DEFAULT":   # -n not given
        from llamaspec.openai.fields import NO_LIMIT   # max_tokens omitted: until end-of-generation or a full context

        gen = replace(gen, max_tokens=NO_LIMIT)
    sizes = slot_context(gen.ctx_size, kv_unified_per_slot, parallel,
                         _train_context(model, gen.offline) if gen.ctx_size == 0 else None)
    gen = replace(gen, ctx_size=sizes.per_slot)
    sock = server.bind(host, port)   # a port in use fails before the model loads
    loopback = is_loopback(host)
    if not loopback and key is None:
        out.warn(f"--host {host} is reachable from other machines and no --api-key is set: anyone who can reach "
                 f"port {port} can use the model")
    set_llama_log()
    try:
        with Generator.from_options(model, replace(gen, ngram=ngram, parallel=parallel)) as g:
            for note in g.notes:
                out.info(note)
            for line in g.resolved.details:   # why this draft, and where drafts were looked for (-v, as run)
                out.detail(line)
            if sizes.warning:
                out.warn(sizes.warning)
            if warning := draft_size_warning(g.resolved.target_path, g.resolved.draft_path):
                out.warn(warning)
            name = Path(g.resolved.target_path).name
            sched = Scheduler(g, parallel, cache_ram_mib=cache_ram, timeout=timeout,
                              shared_drafts=suffix_scope is SuffixScope.shared)
            web = create_app(sched, model_name=name, api_key=key, cors_origins=origins, loopback_only=loopback)
            sched.start()
            bound = sock.getsockname()
            out.info(f"serving {name} on http://{_url_host(bound[0])}:{bound[1]}/v1 ({describe(g.n_ctx, parallel)}, "
                     f"spec {g.spec_label}"
                     f"{', API key required' if key else ''})")
            try:
                signalled = server.run(web, sched, sock, verbose=out.verbose)
            finally:
                sched.stop()
            if not sched.alive:
                raise LlamaspecError(f"the engine stopped: {sched.dead}", "see the log above; restart the server")
    finally:
        sock.close()
    if signalled is not None:
        out.info("stopped")


def _train_context(model: str | None, offline: bool) -> int | None:
    """The model's training context (-c 0 shares it between the slots, as llama-server does)."""
    from llamaspec import hub
    from llamaspec.api.resolve import default_target
    from llamaspec.runtime.memory import context_length

    try:
        return context_length(hub.resolve_model(model or default_target(), offline=offline)) or None
    except (OSError, ValueError):   # the load that follows reports a bad file precisely
        return None


def _url_host(addr: str) -> str:
    return f"[{addr}]" if ":" in addr else addr
