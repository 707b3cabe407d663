"""`llamaspec batch MODEL INPUT -o OUTPUT`: many prompts, models loaded once, resumable.

Every record is appended and fsynced as its request finishes, so a kill loses at most the record
being written; rerunning the same command skips the ids OUTPUT holds (a half-written last line is
cut and redone). A manifest beside OUTPUT refuses a resume with other settings unless --force.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from llamaspec.cli._generation import generation_flags
from llamaspec.cli._options import at_least, draft_size_warning, ngram_flags, output_flags
from llamaspec.cli._output import Output
from llamaspec.cli.app import app
from llamaspec.speculative.options import NgramParams

if TYPE_CHECKING:
    from llamaspec.generation_options import GenerationOptions


@app.command()
@output_flags
@ngram_flags
@generation_flags
def batch(
    model: Annotated[Optional[str], typer.Argument(
        help="Target GGUF: a path or Hub reference (org/repo:QUANT).")],
    input: Annotated[str, typer.Argument(
        help="JSONL requests ('-' for stdin): {\"id\", \"prompt\" | \"messages\", \"max_tokens\", "
             "\"temperature\", \"seed\", \"stop\"} or the OpenAI batch form (custom_id, url, body).")],
    output_path: Annotated[str, typer.Option("-o", "--output", help="JSONL results, appended (resumable).")],
    parallel: Annotated[int, typer.Option(
        "--parallel", help="Sequences decoded together in one context.", callback=at_least("--parallel", 1))] = 1,
    force: Annotated[bool, typer.Option("--force", help="Resume even if the model or settings changed.")] = False,
    retry_failed: Annotated[bool, typer.Option("--retry-failed", help="Redo requests recorded as failed.")] = False,
    *,
    gen: GenerationOptions,
    ngram: NgramParams,
    out: Output,
) -> None:
    """Generate for every request of a JSONL file; resumable, one JSONL record per request."""
    from dataclasses import asdict, replace

    from llamaspec import batch as io
    from llamaspec.generator import Generator, Request
    from llamaspec.runtime.llama import set_llama_log

    items = io.parse_requests(io.read_input(input))  # duplicate ids: an error before any work
    set_llama_log(out.verbose)
    with Generator.from_options(model, replace(gen, ngram=ngram, parallel=parallel)) as g:
        for note in g.notes:
            out.info(note)
        if warning := draft_size_warning(g.resolved.target_path, g.resolved.draft_path):
            out.warn(warning)
        io.check_or_write_manifest(output_path, {**g.describe(), "ngram": asdict(ngram)}, force)
        with io.OutputFile(output_path) as records:
            done = records.done_ids(include_failed=not retry_failed)
            model_name = str(g.resolved.target_ref)
            failed = 0
            for item in items:  # malformed lines: recorded with their line numbers, the job goes on
                if isinstance(item, io.LineError) and item.id not in done:
                    records.append(io.error_record(item, item.message))
                    out.warn(f"line {item.line}: {item.message}")
                    failed += 1
            todo = {r.id: r for r in items if isinstance(r, io.Request) and r.id not in done}
            skipped = sum(1 for r in items if r.id in done)
            if skipped:
                out.info(f"resuming: {skipped} of {len(items)} requests already in {output_path}")
            requests = (Request(r.prompt if r.messages is None else r.messages, id=r.id, max_tokens=r.max_tokens,
                                temperature=r.temperature, top_p=r.top_p, seed=r.seed, stop=r.stop or None,
                                chat=False if r.openai == io.COMPLETIONS else None)
                        for r in todo.values())
            progress = _Progress(out, len(todo))
            try:
                for res in g.generate_many(requests, parallel=parallel):
                    req = todo[res.id]
                    if res.error is not None:
                        code = "context_length_exceeded" if "context" in res.error.message else None
                        records.append(io.error_record(req, res.error.message, code=code))
                        out.warn(f"line {req.line} ({req.id}): {res.error.message}")
                        failed += 1
                    else:
                        records.append(io.result_record(req, res.text, res.finish_reason, res.stats, model_name))
                    progress.update(res)
            except KeyboardInterrupt:   # (and SIGTERM): every finished record is in OUTPUT, fsynced
                from llamaspec.cli._errors import interrupted_exit_code

                progress.finish(failed, interrupted=True)
                raise typer.Exit(interrupted_exit_code())
    summary = progress.finish(failed)
    if out.json:
        out.data(summary)
    if failed:
        raise typer.Exit(1)


class _Progress:
    """done/total, tokens/s, acceptance and ETA on stderr: a Rich bar at a terminal, else a line
    every few seconds (none with -q)."""

    EVERY = 5.0

    def __init__(self, out: Output, total: int):
        self.out, self.total = out, total
        self.done = self.tokens = self.drafted = self.accepted = 0
        self.t0 = self.last = time.perf_counter()
        self.bar = self.task = None
        if out.progress_enabled and total:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("batch"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                                TimeRemainingColumn(), console=out.stderr, transient=True)
            self.task = self.bar.add_task("batch", total=total, rate="")
            self.bar.start()

    def update(self, res) -> None:
        self.done += 1
        self.tokens += len(res.tokens)
        self.drafted += res.stats.get("drafted", 0)
        self.accepted += res.stats.get("accepted", 0)
        now = time.perf_counter()
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done, rate=f"{self.tokens / (now - self.t0):.1f} tok/s, "
                                                                 f"acceptance {self._acceptance():.0%}")
            return
        if now - self.last >= self.EVERY and not self.out.quiet:
            self.last = now
            rate = self.done / (now - self.t0)
            eta = (self.total - self.done) / rate if rate else 0.0
            self.out.info(f"{self.done}/{self.total} done, {self.tokens / (now - self.t0):.1f} tok/s, "
                          f"acceptance {self._acceptance():.1%}, ETA {eta:.0f} s")

    def _acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def finish(self, failed: int, interrupted: bool = False) -> dict:
        if self.bar is not None:
            self.bar.stop()
        secs = time.perf_counter() - self.t0
        summary = {"done": self.done, "total": self.total, "failed": failed, "tokens": self.tokens,
                   "seconds": secs, "tokens_per_second": self.tokens / secs if secs > 0 else 0.0,
                   "drafted": self.drafted, "accepted": self.accepted, "acceptance": self._acceptance(),
                   "interrupted": interrupted}
        if not self.out.quiet:
            sys.stderr.flush()
            self.out.info(f"{'interrupted: ' if interrupted else ''}{self.done}/{self.total} requests, "
                          f"{failed} failed, {self.tokens} tokens in {secs:.1f} s "
                          f"({summary['tokens_per_second']:.1f} tok/s), acceptance {self._acceptance():.1%}")
        return summary
