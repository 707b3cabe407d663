"""`llamaspec batch MODEL INPUT -o OUTPUT`: many prompts, models loaded once, resumable.

Every record is appended and fsynced as its request finishes, so a kill loses at most the record
being written; rerunning the same command skips the ids OUTPUT holds (a half-written last line is
cut and redone). A manifest beside OUTPUT refuses a resume with other settings, or with an input
changed under records OUTPUT holds, unless --force. OUTPUT is checked (writable, not being written
by another job: an flock on OUTPUT.lock) before any model loads.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from llamaspec.cli._generation import generation_flags
from llamaspec.cli._options import at_least, draft_size_warning, ngram_flags, output_flags
from llamaspec.cli._output import Output
from llamaspec.cli.app import app
from llamaspec.errors import UsageError
from llamaspec.speculative.options import NgramParams

if TYPE_CHECKING:
    from llamaspec.api.options import GenerationOptions


@app.command()
@output_flags
@ngram_flags
@generation_flags
def batch(
    model: Annotated[Optional[str], typer.Argument(
        help="Target GGUF: a path or Hub reference (org/repo:QUANT).")],
    input: Annotated[str, typer.Argument(
        help="JSONL requests ('-' for stdin): {\"id\", \"prompt\" | \"messages\", \"max_tokens\", "
             "\"temperature\", \"top_p\", \"top_k\", \"min_p\", \"repeat_penalty\", \"presence_penalty\", "
             "\"frequency_penalty\", \"seed\", \"stop\"} "
             "or the OpenAI batch form (custom_id, url, body).")],
    output_path: Annotated[str, typer.Option("-o", "--output", help="JSONL results, appended (resumable).")],
    parallel: Annotated[int, typer.Option(
        "--parallel", help="Sequences decoded together in one context.", callback=at_least("--parallel", 1))] = 1,
    cache_ram: Annotated[int, typer.Option(
        "--cache-ram", "-cram", metavar="MIB",
        help="RAM for the KV of earlier prompts, restored when a request shares a longer prefix with one "
             "(as llama-server's; -1: no limit, 0: off).", callback=at_least("--cache-ram", -1))] = 8192,
    ordered: Annotated[bool, typer.Option(
        "--ordered", help="Write records in input order (default: as they finish, which differs with --parallel).")
    ] = False,
    force: Annotated[bool, typer.Option(
        "--force", help="Resume even if the model, settings or input changed.")] = False,
    retry_failed: Annotated[bool, typer.Option("--retry-failed", help="Redo requests recorded as failed.")] = False,
    ray_address: Annotated[Optional[str], typer.Option(
        "--ray", metavar="ADDRESS|auto",
        help="Run on a Ray cluster (extra 'ray'): auto (RAY_ADDRESS, or the cluster `ray start` made here), "
             "HOST:PORT or ray://HOST:PORT. This machine keeps writing OUTPUT.")] = None,
    ray_workers: Annotated[Optional[int], typer.Option(
        "--ray-workers", help="Ray actors (each loads the models once); default one per node.",
        callback=at_least("--ray-workers", 1))] = None,
    *,
    gen: GenerationOptions,
    ngram: NgramParams,
    out: Output,
) -> None:
    """Generate for every request of a JSONL file; resumable, one JSONL record per request."""
    from dataclasses import replace

    from llamaspec import batch as io
    from llamaspec.api.generator import Request
    from llamaspec.runtime.llama import set_llama_log

    if ray_address is None and ray_workers is not None:
        raise UsageError("--ray-workers needs --ray", "add --ray auto (or --ray HOST:PORT)")
    if ray_address is not None:
        from llamaspec.batch.ray_executor import require_ray

        require_ray()   # the missing extra: one line before anything else
    ray_owned = False
    lines = io.read_input(input)
    items = io.parse_requests(lines)  # duplicate ids: an error before any work
    io.check_output_path(output_path)   # a bad -o, and another job on it: before any model loads
    if ray_address is not None:
        from llamaspec.batch.ray_executor import connect

        ray_owned = connect(ray_address)   # a dead address: one line, before OUTPUT or its lock exist
    with io.OutputLock(output_path):
        set_llama_log()
        if ray_address is None:
            _prewarm_compiles(model, items, io.Request)
        opts = replace(gen, ngram=ngram, parallel=parallel, cache_ram_mib=cache_ram)
        with _engine(model, opts, ray_address, ray_workers, ray_owned) as (g, ident):
            for note in ident["notes"]:
                out.info(note)
            for line in ident["details"]:   # why this draft, and where drafts were looked for (-v, as run)
                out.detail(line)
            if warning := draft_size_warning(ident["target_path"], ident["draft_path"]):
                out.warn(warning)
            io.check_or_write_manifest(
                output_path, _requested(ident, gen, ngram), force, input=io.input_identity(input, lines, items),
                recorded=io.recorded_ids(output_path), effective=_effective(ident),
                lines_of={it.id: it.line for it in items})
            with io.OutputFile(output_path) as records:
                done = records.done_ids(include_failed=not retry_failed)
                todo = [it for it in items if it.id not in done]
                progress = _Progress(out, sum(isinstance(r, io.Request) for r in todo), len(items), len(items) - len(todo))
                if progress.skipped:
                    out.info(f"resuming: {progress.skipped} of {len(items)} requests already in {output_path}")
                append = _counting(records, progress, io.record_failed)
                write = io.InOrder([it.id for it in todo], append).put if ordered else (lambda _, rec: append(rec))
                for item in todo:  # malformed lines: recorded with their line numbers, the job goes on
                    if isinstance(item, io.LineError):
                        write(item.id, io.error_record(item, item.message))
                        out.warn(f"line {item.line}: {item.message}")
                requests = {r.id: r for r in todo if isinstance(r, io.Request)}
                try:
                    for res in g.generate_many((_engine_request(Request, r) for r in requests.values()),
                                               parallel=parallel):
                        req = requests[res.id]
                        if res.error is not None:
                            code = "context_length_exceeded" if "context" in res.error.message else None
                            write(req.id, io.error_record(req, res.error.message, code=code,
                                                          param=getattr(res.error, "field", None)))
                            out.warn(f"line {req.line} ({req.id}): {res.error.message}")
                        else:
                            write(req.id, io.result_record(req, res.text, res.finish_reason, res.stats, ident["target_ref"],
                                                           res, ident.get("piece")))
                        progress.update(res)
                except KeyboardInterrupt:   # (and SIGTERM): every finished record is in OUTPUT, fsynced
                    from llamaspec.cli._errors import interrupted_exit_code

                    summary = progress.finish(interrupted=True)
                    if out.json:
                        out.data(summary)   # what was done so far: a script reads it like a finished job's
                    raise typer.Exit(interrupted_exit_code())
    summary = progress.finish()
    if out.json:
        out.data(summary)
    if progress.failed:
        raise typer.Exit(1)


def _counting(records, progress, failed):
    """records.append, counting what lands in OUTPUT as done or failed: a record an interrupt hit
    after it was written whole is in the file, so it is in the summary too."""
    def append(record: dict) -> None:
        before = records.written
        try:
            records.append(record)
        finally:
            if records.written > before:
                if failed(record):
                    progress.failed += 1
                else:
                    progress.done += 1

    return append


def _prewarm_compiles(model: str | None, items, request_type) -> None:
    """A job with grammars, schemas or tools: start the compile worker (a process that loads
    the model's vocabulary and llguidance's tokenizer, ~0.7 s) beside the model's loading, not
    in front of the first request."""
    from llamaspec.runtime import grammar_worker

    if not grammar_worker.sandboxed() or not any(
            isinstance(it, request_type) and it.fields.keys() & {"grammar", "tools"} for it in items):
        return
    path = Path(model) if model else None
    grammar_worker.prewarm(path if path is not None and path.is_file() else None)


def _engine_request(request_type, r):
    """The engine's Request for a parsed line (its fields checked by the server's parser)."""
    return request_type(**r.fields, id=r.id)


@contextmanager
def _engine(model, opts: GenerationOptions, ray_address: str | None, ray_workers: int | None, ray_owned: bool):
    """(something with generate_many(requests, parallel=), what the job needs to know of what was
    loaded): this process's Generator, or Ray actors each holding one (batch/ray_executor.py)."""
    if ray_address is None:
        from llamaspec.api.generator import Generator

        with Generator.from_options(model, opts) as g:
            r = g.resolved
            yield g, {"target_path": r.target_path, "target_size": r.target_path.stat().st_size,
                      "target_ref": str(r.target_ref), "draft_path": r.draft_path, "describe": g.describe(),
                      "tuned": g.tuned, "notes": g.notes, "details": r.details, "piece": g.pipeline.target.piece}
        return
    import ray

    from llamaspec.batch.ray_executor import RayExecutor

    try:
        with RayExecutor(model, opts, workers=ray_workers) as ex:
            ident = dict(ex.identity)
            # (paths are the workers': the draft size warning reads them here only if they exist here too)
            ident["notes"] = [*ident["notes"], f"ray: {len(ex.actors)} workers, models loaded"]
            ident["piece"] = ex.piece   # (token bytes the workers sent with their logprobs)
            yield ex, ident
    finally:
        if ray_owned:   # (an embedding program's own connection stays)
            ray.shutdown()


def _effective(ident: dict) -> dict:
    """What ran in effect where it can differ from what was asked (manifest information only)."""
    d = ident["describe"]
    return {"spec_type": d["spec_type"], "draft": d["draft"], "draft_max": d["draft_max"],
            "draft_p_min": d["draft_p_min"], "n_ctx": d["n_ctx"], "tuned": ident["tuned"]}


def _requested(ident: dict, gen: GenerationOptions, ngram: NgramParams) -> dict:
    """What the user asked for: the resume check's settings. Not what ran in effect (a stored
    `tune` configuration's spec type, the draft `auto` found): that goes into the manifest as
    information, so `tune --forget` or a new draft on disk does not make the same command another job.
    The same with or without --ray, so either may resume the other's OUTPUT."""
    from dataclasses import asdict

    s = gen.sampling
    # penalties and a grammar only when set: a job started before they existed resumes as it was
    optional = {k: getattr(s, k) for k in ("presence_penalty", "frequency_penalty") if getattr(s, k)}
    if gen.grammar is not None:
        optional["grammar"] = gen.grammar.schema or gen.grammar.gbnf   # (a JSON schema: its text)
    draft = None if gen.draft is None else str(gen.draft)
    if draft is not None and os.path.exists(draft):
        draft = os.path.abspath(draft)
    return {"model": str(ident["target_path"]), "model_size": ident["target_size"], "draft": draft,
            "spec_type": gen.spec_type,
            "draft_max": gen.draft_max, "draft_min": gen.draft_min, "draft_p_min": gen.draft_p_min,
            "adaptive": gen.adaptive, "ctx_size": gen.ctx_size, "temperature": s.temperature, "top_k": s.top_k,
            "top_p": s.top_p, "min_p": s.min_p, "repeat_penalty": s.repeat_penalty, "repeat_last_n": s.repeat_last_n,
            "seed": s.seed, "max_tokens": gen.max_tokens, "stop": list(gen.stop), "chat": gen.chat,
            "system": gen.system, "ngram": asdict(ngram), **optional}


class _Progress:
    """done/total, tokens/s, acceptance and ETA on stderr: a Rich bar at a terminal, else a line
    every few seconds (none with -q)."""

    EVERY = 5.0

    def __init__(self, out: Output, total: int, lines: int, skipped: int):
        self.out, self.total, self.lines, self.skipped = out, total, lines, skipped
        self.done = self.failed = 0   # records written this run: succeeded, failed (malformed lines too)
        self.generated = self.tokens = self.drafted = self.accepted = 0
        self.t0 = self.last = time.perf_counter()
        self.bar = self.task = None
        if out.progress_enabled and total:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("batch"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                                TimeRemainingColumn(), console=out.stderr, transient=True)
            self.task = self.bar.add_task("batch", total=total, rate="")
            self.bar.start()

    def update(self, res) -> None:
        self.generated += 1
        self.tokens += len(res.tokens)
        self.drafted += res.stats.get("drafted", 0)
        self.accepted += res.stats.get("accepted", 0)
        now = time.perf_counter()
        if self.bar is not None:
            self.bar.update(self.task, completed=self.generated, rate=f"{self.tokens / (now - self.t0):.1f} tok/s, "
                                                                 f"acceptance {self._acceptance():.0%}")
            return
        if now - self.last >= self.EVERY and not self.out.quiet:
            self.last = now
            rate = self.generated / (now - self.t0)
            eta = (self.total - self.generated) / rate if rate else 0.0
            self.out.info(f"{self.generated}/{self.total} done, {self.tokens / (now - self.t0):.1f} tok/s, "
                          f"acceptance {self._acceptance():.1%}, ETA {eta:.0f} s")

    def _acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def finish(self, interrupted: bool = False) -> dict:
        """The summary: INPUT's `lines` (requests, malformed ones included) are `skipped` (already
        in OUTPUT) + `done` + `failed` (this run) + what an interrupt left undone."""
        if self.bar is not None:
            self.bar.stop()
        secs = time.perf_counter() - self.t0
        summary = {"lines": self.lines, "skipped": self.skipped, "done": self.done, "failed": self.failed,
                   "remaining": self.lines - self.skipped - self.done - self.failed, "tokens": self.tokens,
                   "seconds": secs, "tokens_per_second": self.tokens / secs if secs > 0 else 0.0,
                   "drafted": self.drafted, "accepted": self.accepted, "acceptance": self._acceptance(),
                   "interrupted": interrupted}
        if not self.out.quiet:
            sys.stderr.flush()
            skipped = f", {self.skipped} already in OUTPUT" if self.skipped else ""
            left = f", {summary['remaining']} not done" if summary["remaining"] else ""
            self.out.info(f"{'interrupted: ' if interrupted else ''}{self.lines} lines: {self.done} done, "
                          f"{self.failed} failed{skipped}{left}; {self.tokens} tokens in {secs:.1f} s "
                          f"({summary['tokens_per_second']:.1f} tok/s), acceptance {self._acceptance():.1%}")
        return summary
