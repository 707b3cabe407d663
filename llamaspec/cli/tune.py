"""`llamaspec tune`: measure which speculative settings are fastest for a pair here, and store them.

`run`, `batch` and `bench` then use the stored configuration when their flags do not say
otherwise. `tune --show` lists the store, `tune --forget [MODEL]` empties it. The search and the
store live in llamaspec/tune/; this module reads flags and prints.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from llamaspec.cli._options import (
    CTX_SIZE_CHECK, AmxOpt, ChatOpt, ForceDraftOpt, OfflineOpt, ThreadsOpt, at_least, check_draft_exists,
    draft_size_warning, in_range, output_flags,
)
from llamaspec.cli._errors import raise_if_interrupted
from llamaspec.cli._output import Output, escape
from llamaspec.cli.app import app
from llamaspec.errors import UsageError

if TYPE_CHECKING:
    from llamaspec.tune.sweep import SweepResult


@app.command()
@output_flags
def tune(
    model: Annotated[Optional[str], typer.Argument(
        help="Target GGUF: a path or Hub reference (with --forget: forget only this model).")] = None,
    draft: Annotated[Optional[str], typer.Option(
        "--draft", "-md", "--model-draft", help="Draft model of the pair: a GGUF path or Hub ref.")] = None,
    prompts: Annotated[Optional[Path], typer.Option(
        "--prompts", help="Calibration prompts, JSONL with id and prompt (default: the bundled code and story prompts).")] = None,
    n_predict: Annotated[int, typer.Option(
        "-n", "--n-predict", help="Tokens per run.", callback=at_least("-n", 1))] = 128,
    quick: Annotated[bool, typer.Option(
        "--quick", help="Spec types at their defaults only (no fine round), one confirming pass.")] = False,
    reps: Annotated[Optional[int], typer.Option(
        "--reps", help="Confirming passes over the prompts for the finalists (default 2; 1 with --quick).",
        callback=at_least("--reps", 1), show_default=False)] = None,
    margin: Annotated[float, typer.Option(
        "--margin", help="How much faster than plain decoding a configuration must be to be chosen (0.05 = 5%).",
        callback=in_range("--margin", 0, 10))] = 0.05,
    max_spread: Annotated[float, typer.Option(
        "--max-spread", help="How far apart (a factor) a finalist's passes may be: further, they are measured "
        "again, and still apart, nothing is stored.", callback=in_range("--max-spread", 1, 1000, open_low=True))] = 1.5,
    save: Annotated[bool, typer.Option("--save/--no-save", help="Store the result (default) or only show it.")] = True,
    show: Annotated[bool, typer.Option("--show", help="List the stored configurations.")] = False,
    forget: Annotated[bool, typer.Option(
        "--forget", help="Remove stored configurations: all, or MODEL's.")] = False,
    threads: ThreadsOpt = None,
    ctx_size: Annotated[int, typer.Option("-c", "--ctx-size", help="Context size in tokens.",
                                          callback=CTX_SIZE_CHECK)] = 4096,
    chat: ChatOpt = None,
    offline: OfflineOpt = False,
    force_draft: ForceDraftOpt = False,
    amx: AmxOpt = None,
    *,
    out: Output,
) -> None:
    """Find the fastest speculative settings for MODEL (and --draft) on this machine, greedy and
    checked token for token against plain decoding, and store them for run, batch and bench."""
    if show and forget:
        raise UsageError("give --show or --forget, not both")
    if show:
        if model is not None:
            raise UsageError("--show lists every stored configuration; it takes no MODEL")
        return _show(out)
    if forget:
        return _forget(out, model)
    if model is None:
        raise UsageError("no model to tune", "llamaspec tune MODEL [--draft DRAFT]; --show lists the store")
    at_least("-t/--threads", 1)(threads)
    if draft is not None and draft.lower() in ("auto", "none"):
        raise UsageError(f"tune takes a draft path or Hub ref, not --draft {draft}",
                         "leave --draft out to tune the target alone (n-gram types, MTP heads)")
    check_draft_exists(draft)
    _sweep(out, model, draft, prompts=prompts, n=n_predict, quick=quick, reps=reps, margin=margin,
           max_spread=max_spread, save=save,
           threads=threads, ctx=ctx_size, chat=chat, offline=offline, force_draft=force_draft, amx=amx)


# ---- the sweep ------------------------------------------------------------------------------------


def _sweep(out: Output, model: str, draft: str | None, *, prompts: Path | None, n: int, quick: bool,
           reps: int | None, margin: float, max_spread: float, save: bool, threads: int | None, ctx: int,
           chat: bool | None, offline: bool, force_draft: bool, amx: bool | None) -> None:
    from llamaspec import hub

    wait_policy = _passive_when_busy(out, threads)   # before llama.cpp (and its OpenMP) loads
    from llamaspec.runtime.llama import set_llama_log
    from llamaspec.bench.prompts import read_prompts
    from llamaspec.tune import store
    from llamaspec.tune.calibrate import tune_pair
    from llamaspec.tune.sweep import Plan

    if prompts is not None:
        read_prompts(prompts)  # a broken file is a usage error before any model is loaded
    set_llama_log()
    target_path = hub.resolve_model(model, offline=offline)
    draft_path = None
    if draft is not None:
        from llamaspec.pairing.check import check_explicit_draft

        draft_path = hub.resolve_model(draft, offline=offline)
        check_explicit_draft(str(target_path), str(draft_path), force_draft, offline=offline)
        if warning := draft_size_warning(target_path, draft_path):
            out.warn(escape(warning))
    from llamaspec.runtime.memory import check_load

    check_load(Path(target_path), Path(draft_path) if draft_path else None, n_ctx=ctx, default_ctx=4096)
    plan = Plan(quick=quick, reps=reps, margin=margin, spread=max_spread)
    out.info(f"tuning {escape(Path(target_path).name)}" + (f" + draft {escape(Path(draft_path).name)}" if draft_path else "")
             + f": {'quick, ' if quick else ''}{n} tokens per run, greedy, plain decoding interleaved")
    with _Progress(out) as progress:
        result, cal, used = tune_pair(Path(target_path), Path(draft_path) if draft_path else None,
                                      prompts_file=prompts, chat=chat, n=n, threads=threads, ctx=ctx, amx=amx,
                                      plan=plan, on_run=progress.run, on_round=progress.round,
                                      on_unsteady=progress.unsteady, on_noise=progress.noise)
    used["quick"], reps = quick, plan.passes
    if wait_policy:
        used["omp_wait_policy"] = wait_policy
    if result.best is not None:   # what came closest, also when plain decoding was chosen
        used["best"], used["best_ratio"] = result.best.candidate.label, result.best.score
    config = result.config(measured=used)
    entry_path = None
    if result.unstable:   # a decision on numbers that disagree would be a guess: keep the store as it is
        save = False
    if save:
        with _store_write():
            store.save(target_path, draft_path, config)
        entry_path = str(store.store_path())
    info = {"model": model, "model_path": str(target_path), "draft": draft,
            "draft_path": str(draft_path) if draft_path else None, **used, "reps": reps,
            "config": config.to_dict(), "stored": save, "store": entry_path, "unstable": result.unstable,
            "sweep": result.to_dict()}
    out.data(info, human=lambda console: _render(console, result, config, entry_path),
             quiet=config.settings_text())
    if result.unstable:
        out.warn(escape(f"not stored: {result.unstable}, even measured again; the machine is too busy to "
                        f"tell: tune again when it is quieter, or with a larger -n"))
        raise typer.Exit(1)


def _passive_when_busy(out: Output, threads: int | None) -> dict[str, str] | None:
    """How llama.cpp's threads wait (runtime/wait_policy.py), chosen before llama.cpp loads; the
    store records the variables set, as the ratios it measured were taken with them. A passive
    choice (a machine oversubscribed for a while) is said in one line: ratios are noisier then."""
    from llamaspec.runtime import wait_policy

    wait_policy.apply(threads)
    policy = wait_policy.chosen()
    if policy is None or not policy.env:
        return None
    if policy.env.get("OMP_WAIT_POLICY") == "PASSIVE":
        out.info(policy.line + "; ratios are noisier while tuning")
    return dict(policy.env)


@contextmanager
def _store_write():
    """A full disk while the store is written: one line (the store is written atomically, so its
    previous content is intact)."""
    from llamaspec.errors import disk_full
    from llamaspec.tune import store

    try:
        yield
    except OSError as e:
        raise disk_full(store.store_path(), e, "free some space and run tune again; the stored "
                                               "configurations are as they were") or e


class _Progress:
    """A Rich bar at a terminal; else one stderr line per measured candidate run. Both say how
    long the rest should take: the runs left (this round's, and an estimate of the rounds after
    it) at the mean time of the runs so far."""

    def __init__(self, out: Output):
        self.out, self.bar, self.task = out, None, None
        self.done, self.later, self.name, self.started = 0, 0, "", 0.0

    def __enter__(self) -> "_Progress":
        import time

        self.started = time.monotonic()
        if self.out.progress_enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[eta]}"), TextColumn("{task.fields[last]}"),
                                TimeElapsedColumn(), console=self.out.stderr, transient=False)
            self.bar.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()

    def round(self, name: str, total: int, later: int = 0) -> None:
        import time

        if not self.done:   # loading and warming up are not runs: the clock starts with the first round
            self.started = time.monotonic()
        self.name, self.later = name, later
        if self.bar is not None:
            self.task = self.bar.add_task(f"tune: {name}", total=total, last="", eta="")
        else:
            self.out.info(f"{name} round: {total} runs" + (f" (about {later} more after it)" if later else ""))

    def unsteady(self, line: str) -> None:
        self.out.warn(escape(line))

    def noise(self, noise, cached: bool) -> None:
        """The target's batch noise, by which a run whose tokens differ from plain is judged."""
        self.out.info(escape(noise.text + (" (measured before, cached)" if cached else "")))

    def eta(self, left: int) -> str:
        import time

        per_run = (time.monotonic() - self.started) / max(1, self.done)
        return f"ETA {_duration(per_run * (left + self.later))}"

    def run(self, tick) -> None:
        raise_if_interrupted()   # a run cut short by Ctrl-C/SIGTERM: stop, store nothing
        self.done += 1
        cand, r = tick.candidate, tick.result
        if cand is None:
            text = f"plain {r.tps:.1f} tok/s"
        else:
            text = f"{cand.label} {r.ratio:.2f}x" if r.ratio is not None else cand.label
            if tick.flip:
                text += f" (tokens differ from plain: {escape(tick.flip)}: kept)"
            elif r.identical is False:
                text += f" [red]tokens differ from plain at token {r.first_difference}: rejected[/red]"
        eta = self.eta(tick.left)
        if self.bar is not None and self.task is not None:
            self.bar.update(self.task, completed=tick.done, total=tick.done + tick.left, eta=eta,
                            last=escape(text) if cand else "")
        elif cand is not None:
            self.out.info(f"{self.name} {tick.done}/{tick.done + tick.left} "
                          f"{escape(text) if r.identical is not False else text}, {eta}")


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def _wide(console):
    """A pipe or file gets whole lines instead of a table folded to 80 columns (as `bench`)."""
    if console.is_terminal:
        return console
    from rich.console import Console

    return Console(file=console.file, width=1000, highlight=False, color_system=None)


def _x(v: float | None) -> str:
    return f"{v:.2f}x" if v is not None else "-"


def _render(console, result: "SweepResult", config, stored: str | None) -> None:
    from rich.table import Table

    table = Table(box=None, pad_edge=False, header_style="bold",
                  title="finalists (confirm round: geometric mean over the prompts of tok/s over plain)")
    for col in ("configuration", "speedup", "per pass", "accepted", "note"):
        table.add_column(col)
    last = result.rounds[-1] if result.rounds else None
    for s in (last.scores if last else []):
        note = s.rejected or ("chosen" if result.chosen is s else "" if s.accepted else "no accepted drafts")
        if s.flips and not s.rejected:
            note = "; ".join([note] * bool(note) + s.flips)
        table.add_row(escape(s.candidate.label), _x(s.score), " ".join(_x(p) for p in s.passes),
                      str(s.accepted), escape(note))
    if last is not None and last.scores:
        _wide(console).print(table)
    for s in result.rejected:   # a type that cannot run with this pair: once, not once per chain
        if not (s.rejected.startswith("cannot run: ") and "," in s.candidate.spec):
            console.print(f"rejected: {escape(s.candidate.label)}: {escape(s.rejected)}")
    kept = {s.candidate: s for r in result.rounds for s in r.scores if s.flips and not s.rejected}
    for s in kept.values():   # tokens differed from plain at a near-tie of the target: batch noise
        console.print(f"kept: {escape(s.candidate.label)}: {escape('; '.join(s.flips))}")
    if result.unstable:
        pass   # said below: nothing is chosen from numbers that disagree
    elif result.chosen is None:
        why = (f"the best, {escape(result.best.candidate.label)} at {_x(result.best.score)}, does not beat it "
               f"by the {result.margin:.0%} margin" if result.best else "no configuration had accepted drafts and "
               "tokens identical to plain")
        console.print(f"chosen: [bold]none[/bold] (plain decoding): {why}")
    else:
        console.print(f"chosen: [bold]{escape(config.settings_text())}[/bold], {_x(result.chosen.score)} vs plain "
                      f"({result.plain_tok_s or 0:.1f} tok/s plain)")
    if result.unstable:
        console.print("not stored: the measurements disagree (the warning on stderr says how)")
    else:
        console.print(f"stored in {escape(stored)}; run, batch and bench use it unless flags say otherwise"
                      if stored else "not stored (--no-save)")


# ---- the store ------------------------------------------------------------------------------------


def _entry_dict(e, current: bool) -> dict[str, Any]:
    return {"target": e.target.to_dict(), "draft": e.draft.to_dict() if e.draft else None,
            "build": e.build.to_dict(), "device": e.device.to_dict(), "config": e.config.to_dict(),
            "settings": e.config.settings_text(), "current": current}


def _show(out: Output) -> None:
    from llamaspec.tune import store

    entries = store.read_entries()
    rows = [_entry_dict(e, store.is_current(e)) for e in entries]
    info = {"store": str(store.store_path()), "entries": rows}

    def human(console) -> None:
        if not rows:
            console.print(f"no tuned configurations in {escape(info['store'])}")
            return
        from rich.table import Table

        table = Table(box=None, pad_edge=False, header_style="bold", title=escape(info["store"]))
        for col in ("target", "draft", "configuration", "speedup", "tuned", "device", "state"):
            table.add_column(col)
        for r in rows:
            c = r["config"]
            table.add_row(escape(Path(r["target"]["path"]).name),
                          escape(Path(r["draft"]["path"]).name) if r["draft"] else "-",
                          escape(r["settings"]), _x(c.get("ratio")), str(c.get("created", ""))[:10],
                          escape(r["device"]["summary"]), "current" if r["current"] else "stale (file or build changed)")
        _wide(console).print(table)

    out.data(info, human=human, quiet="\n".join(f"{r['target']['path']}\t{r['settings']}" for r in rows))


def _forget(out: Output, model: str | None) -> None:
    from llamaspec.tune import store

    target = None
    if model is not None:
        target = Path(model)
        if not target.exists():
            from llamaspec import hub

            try:
                target = hub.resolve_model(model, offline=True)
            except Exception:  # noqa: BLE001 - a file gone or never cached: match the stored path
                target = Path(model)
    with _store_write():
        removed = store.forget(target)
    info = {"store": str(store.store_path()), "removed": len(removed),
            "entries": [_entry_dict(e, False) for e in removed]}
    what = f" for {escape(model)}" if model else ""
    out.data(info, human=lambda console: console.print(f"forgot {len(removed)} tuned configuration"
                                                       f"{'' if len(removed) == 1 else 's'}{what}"),
             quiet=str(len(removed)))
