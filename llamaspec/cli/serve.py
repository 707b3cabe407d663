"""`llamaspec serve MODEL`: an OpenAI-compatible HTTP server (llamaspec/serve/), with run's flags
as the defaults each request may override. Needs the optional extra `llamaspec[server]`."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from llamaspec.cli._generation import TargetArg, generation_flags
from llamaspec.cli._options import at_least, draft_size_warning, in_range, ngram_flags, output_flags
from llamaspec.cli._output import Output
from llamaspec.cli.app import app
from llamaspec.errors import LlamaspecError

if TYPE_CHECKING:
    from llamaspec.generation_options import GenerationOptions
    from llamaspec.speculative.options import NgramParams

EXTRA_HINT = "pip install 'llamaspec[server]'"


def require_server_extra() -> None:
    """FastAPI, uvicorn and sse-starlette, or one line naming the extra (before any model loads)."""
    try:
        import fastapi  # noqa: F401
        import sse_starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise LlamaspecError(f"llamaspec serve needs the 'server' extra ({e.name or 'a package'} is not installed)",
                             EXTRA_HINT) from None


@app.command()
@output_flags
@ngram_flags
@generation_flags
def serve(
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
    *,
    gen: GenerationOptions,
    ngram: NgramParams,
    out: Output,
) -> None:
    """Serve the model over HTTP with OpenAI's API: /v1/chat/completions, /v1/completions, /v1/models."""
    require_server_extra()
    from pathlib import Path

    from llamaspec.generator import Generator
    from llamaspec.runtime.llama import set_llama_log
    from llamaspec.serve import server
    from llamaspec.serve.app import create_app
    from llamaspec.serve.scheduler import Scheduler

    key = api_key if api_key is not None else (os.environ.get("LLAMASPEC_API_KEY") or None)
    sock = server.bind(host, port)   # a port in use fails before the model loads
    set_llama_log(out.verbose)
    try:
        with Generator.from_options(model, replace(gen, ngram=ngram, parallel=parallel)) as g:
            for note in g.notes:
                out.info(note)
            if warning := draft_size_warning(g.resolved.target_path, g.resolved.draft_path):
                out.warn(warning)
            name = Path(g.resolved.target_path).name
            sched = Scheduler(g, parallel, cache_ram_mib=cache_ram)
            web = create_app(sched, model_name=name, api_key=key)
            sched.start()
            bound = sock.getsockname()
            out.info(f"serving {name} on http://{_url_host(bound[0])}:{bound[1]}/v1 ({parallel} slot"
                     f"{'s' if parallel > 1 else ''}, {g.n_ctx} tokens each, spec {g.spec_label}"
                     f"{', API key required' if key else ''})")
            try:
                signalled = server.run(web, sched, sock, verbose=out.verbose)
            finally:
                sched.stop()
    finally:
        sock.close()
    if signalled is not None:
        out.info("stopped")


def _url_host(addr: str) -> str:
    return f"[{addr}]" if ":" in addr else addr
