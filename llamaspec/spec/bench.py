"""Plain vs speculative decoding, side by side in one process, reported as ratios.

Each repetition runs plain decoding and then every speculative mode on the same loaded target,
so a ratio compares runs made moments apart on the same machine state; summaries are medians
over repetitions (of per-repetition ratios, not ratios of medians). Decoding is greedy, so every
speculative run is checked token for token against plain decoding of the same repetition, and a
difference is reported, never hidden.

Optionally, llama.cpp's own `llama-speculative-simple` (built from the same source; `native`)
runs in the same repetition loop on the same formatted prompt, so its numbers sit beside ours.
Its ratios are over *llamaspec's* plain decoding of the same repetition (the same llama.cpp
kernels through llama-cpp-python), and its tokens are not checked.

Used by `llamaspec bench` (cli/bench.py) and `scripts/bench_engine.py`. Nothing here imports
llama_cpp at module level.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from llamaspec.runtime.llama import Model
    from llamaspec.spec.options import NgramParams

PLAIN = "plain"
NATIVE_PREFIX = "native "
NATIVE_EXE = "llama-speculative-simple"

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


# ---- settings and results -----------------------------------------------------------------------


@dataclass
class BenchSettings:
    """What every run of a benchmark shares. Decoding is always greedy."""

    n: int = 256                        # tokens to generate per run
    threads: int | None = None          # None: all cores
    ctx: int = 4096
    draft_path: Path | None = None      # for modes that need a draft model
    draft_max: int | None = None        # None: the pipeline's default for the mode
    draft_p_min: float = 0.0
    adaptive: bool = True               # False: always draft draft_max tokens
    native_draft_max: int = 4           # llama-speculative-simple's --spec-draft-n-max (draft modes)
    ngram: "NgramParams | None" = None  # None: the pipeline's defaults; native runs get the same values


@dataclass
class RepResult:
    """One repetition of one mode. Ratios are against plain decoding of the same repetition."""

    mode: str
    n: int                              # tokens generated
    tps: float                          # generation tokens/s (prompt excluded)
    e2e_s: float                        # prompt processing (target and draft) + generation, seconds
    acceptance: float = 0.0
    drafted: int = 0
    accepted: int = 0
    drafts: int = 0
    steps: int = 0
    mean_accepted_length: float | None = None
    overhead_ms: float | None = None    # Python time per step outside llama_decode
    tokens: list[int] | None = None     # None for native runs (not checked)
    native: bool = False
    ratio: float | None = None
    e2e_ratio: float | None = None
    identical: bool | None = None       # None: plain itself, or a native run
    first_difference: int | None = None

    @property
    def e2e_tps(self) -> float:
        """Generated tokens per second of wall time, prompt processing included."""
        return self.n / self.e2e_s if self.e2e_s > 0 else 0.0

    def compare_to(self, plain: "RepResult") -> "RepResult":
        """Fill ratios (and the token check, for llamaspec runs) against plain of the same rep."""
        self.ratio = self.tps / plain.tps if plain.tps > 0 else None
        self.e2e_ratio = self.e2e_tps / plain.e2e_tps if plain.e2e_tps > 0 else None
        if self.tokens is not None and plain.tokens is not None:
            self.first_difference = first_difference(plain.tokens, self.tokens)
            self.identical = self.first_difference is None
        return self


@dataclass
class ModeSummary:
    """Medians over repetitions of one mode."""

    mode: str
    native: bool
    reps: int
    tok_s: float
    ratio_vs_plain: float | None
    ratios: list[float | None]
    e2e_ratio_vs_plain: float | None
    acceptance: float
    mean_accepted_length: float | None
    drafted: int                        # median over reps
    accepted: int                       # median over reps
    identical_to_plain: bool | None     # None: plain itself or native (not checked)
    first_difference: int | None        # first differing token index, in the first rep that differed
    differing_reps: int
    overhead_ms_per_step: float | None
    n_generated: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "native": self.native,
            "reps": self.reps,
            "tok_s": self.tok_s,
            "ratio_vs_plain": self.ratio_vs_plain,
            "ratios": self.ratios,
            "e2e_ratio_vs_plain": self.e2e_ratio_vs_plain,
            "acceptance": self.acceptance,
            "mean_accepted_length": self.mean_accepted_length,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "identical_to_plain": self.identical_to_plain,
            "first_difference": self.first_difference,
            "differing_reps": self.differing_reps,
            "overhead_ms_per_step": self.overhead_ms_per_step,
            "n_generated": self.n_generated,
        }


@dataclass
class BenchResult:
    prompt_tokens: int
    reps: int
    settings: BenchSettings
    runs: dict[str, list[RepResult]]    # mode -> one result per repetition (plain first)
    summaries: list[ModeSummary]
    notes: list[str] = field(default_factory=list)

    @property
    def best(self) -> ModeSummary:
        return best_mode(self.summaries)

    @property
    def differing(self) -> list[ModeSummary]:
        return [s for s in self.summaries if s.identical_to_plain is False]


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token (or where the shorter one ends); None if identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# ---- one run ------------------------------------------------------------------------------------


def run_mode(target: "Model", spec: str, prompt: Sequence[int], settings: BenchSettings,
             label: str | None = None) -> RepResult:
    """One greedy generation of `spec` ("none" = plain) on an already loaded target."""
    from llamaspec.spec.options import SpecOptions, parse_spec_types
    from llamaspec.spec.pipeline import load_pipeline
    from llamaspec.spec.verify import SamplingParams

    types = parse_spec_types(spec)
    opts = SpecOptions(spec_types=types, draft_path=settings.draft_path, n_ctx=settings.ctx,
                       n_threads=settings.threads, draft_max=settings.draft_max,
                       adaptive=settings.adaptive, draft_p_min=settings.draft_p_min)
    if settings.ngram is not None:
        opts.ngram = settings.ngram
    sampling = SamplingParams(temperature=0.0)
    pipe = load_pipeline(target.path, opts, sampling, target=target)
    try:
        g = pipe.engine.generate(list(prompt), pipe.config(max_tokens=settings.n, sampling=sampling))
    finally:
        pipe.close(keep_target=True)
    s = g.stats
    return RepResult(
        mode=label or (",".join(types) or PLAIN), n=len(g.tokens), tps=s.tokens_per_second,
        e2e_s=s.prompt_seconds + s.gen_seconds, acceptance=s.acceptance, drafted=s.drafted,
        accepted=s.accepted,
        drafts=s.drafts, steps=s.steps, mean_accepted_length=s.mean_accepted_length,
        overhead_ms=1000 * s.overhead_seconds / s.steps if s.steps else 0.0, tokens=list(g.tokens))


# ---- llama.cpp's own speculative example (optional) -----------------------------------------------

_DEC = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")
_ENC = re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_ACC = re.compile(r"accept\s+=\s+([\d.]+)%")


class NativeRunError(Exception):
    """llama-speculative-simple did not run or printed no timing line."""


def native_exe(bin_dir: Path) -> Path | None:
    for name in (NATIVE_EXE, NATIVE_EXE + ".exe"):
        p = Path(bin_dir) / name
        if p.is_file() and os.access(p, os.X_OK):
            return p
    return None


def native_type(spec: str) -> str:
    from llamaspec.spec.options import parse_spec_types

    return ",".join(parse_spec_types(spec)) or "none"


def native_command(bin_dir: Path, model: Path, spec: str, prompt_file: Path, settings: BenchSettings) -> list[str]:
    from llamaspec.runtime.llama import default_threads
    from llamaspec.spec.options import NgramParams, native_flags

    exe = native_exe(bin_dir) or Path(bin_dir) / NATIVE_EXE
    kind = native_type(spec)
    cmd = [str(exe), "-m", str(model), "-f", str(prompt_file), "-n", str(settings.n), "--temp", "0",
           "-t", str(settings.threads or default_threads()), "-c", str(settings.ctx), "--spec-type", kind]
    # each type's own flags (the table's native_flags), with our run's values: like for like
    values = {**asdict(settings.ngram or NgramParams()), "draft_path": settings.draft_path,
              "native_draft_max": settings.native_draft_max}
    return cmd + native_flags(kind, values)


def run_native(bin_dir: Path, model: Path, spec: str, prompt_file: Path, settings: BenchSettings) -> RepResult:
    """One run of llama.cpp's `llama-speculative-simple`, parsed from its log."""
    cmd = native_command(bin_dir, model, spec, prompt_file, settings)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    except OSError as e:
        raise NativeRunError(f"could not start {cmd[0]}: {e.strerror or e}") from None
    text = proc.stdout + proc.stderr
    m = _DEC.search(text)
    if not m:
        last = next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), "")
        raise NativeRunError(f"{NATIVE_EXE} exited {proc.returncode} without a timing line"
                             + (f" (last line: {last[:160]})" if last else ""))
    a, e = _ACC.search(text), _ENC.search(text)
    return RepResult(mode=NATIVE_PREFIX + spec, n=int(m.group(1)), tps=float(m.group(3)),
                     e2e_s=float(m.group(2)) + (float(e.group(2)) if e else 0.0),
                     acceptance=float(a.group(1)) / 100 if a else 0.0, native=True)


# ---- the loop and its summary ---------------------------------------------------------------------


def _median(values: Sequence[float | None]) -> float | None:
    vs = [v for v in values if v is not None]
    return statistics.median(vs) if vs else None


def summarise(runs: dict[str, list[RepResult]]) -> list[ModeSummary]:
    """Per mode: medians of per-repetition values; the token check over all repetitions."""
    out = []
    for mode, rs in runs.items():
        if not rs:
            continue
        is_native = rs[0].native
        checked = [r for r in rs if r.identical is not None]
        differing = [r for r in checked if not r.identical]
        ours_spec = mode != PLAIN and not is_native
        out.append(ModeSummary(
            mode=mode,
            native=is_native,
            reps=len(rs),
            tok_s=statistics.median(r.tps for r in rs),
            ratio_vs_plain=_median([r.ratio for r in rs]),
            ratios=[round(r.ratio, 3) if r.ratio is not None else None for r in rs],
            e2e_ratio_vs_plain=_median([r.e2e_ratio for r in rs]),
            acceptance=statistics.median(r.acceptance for r in rs),
            mean_accepted_length=_median([r.mean_accepted_length for r in rs]),
            drafted=int(statistics.median(r.drafted for r in rs)),
            accepted=int(statistics.median(r.accepted for r in rs)),
            identical_to_plain=(not differing) if ours_spec and checked else None,
            first_difference=differing[0].first_difference if differing else None,
            differing_reps=len(differing),
            overhead_ms_per_step=_median([r.overhead_ms for r in rs]),
            n_generated=rs[0].n,
        ))
    return out


def best_mode(summaries: Sequence[ModeSummary]) -> ModeSummary:
    """The fastest of plain and llamaspec's modes whose tokens matched plain in every repetition
    and that had draft tokens accepted (without any, a mode does plain decoding's work plus its own,
    so a ratio above 1 is timing noise). Native rows are a comparison, not a choice. Plain wins
    ties and when nothing measured faster."""
    plain = next(s for s in summaries if s.mode == PLAIN)
    best = plain
    for s in summaries:
        if (s.native or s.mode == PLAIN or s.identical_to_plain is not True or s.ratio_vs_plain is None
                or s.accepted <= 0):
            continue
        if s.ratio_vs_plain > (best.ratio_vs_plain or 1.0):
            best = s
    return best


def run_bench(target: "Model", prompt: Sequence[int], modes: Sequence[str], settings: BenchSettings,
              reps: int = 3, *, native: Path | None = None, formatted_prompt: str | None = None,
              on_run: Callable[[int, RepResult], None] | None = None, warmup: bool = True) -> BenchResult:
    """`reps` repetitions of plain decoding then every mode (then every native mode); `on_run(rep,
    result)` after each run (rep counts from 1), with its ratios to this repetition's plain run.

    `warmup` first runs plain and every mode once, untimed, on a few tokens: the first decode in a
    process pays for paging in mmap'd weights and first-use allocations (measured on the tiny test
    model: 0.38 s against 0.01 s), which would otherwise land on the first plain run and inflate
    every ratio of repetition 1.
    """
    if reps < 1:
        raise ValueError("reps must be >= 1")
    if warmup:
        short = replace(settings, n=min(settings.n, 8))
        for mode in ("none", *modes):
            run_mode(target, mode, prompt, short)
    runs: dict[str, list[RepResult]] = {PLAIN: []}
    notes: list[str] = []
    prompt_file: Path | None = None
    if native is not None:
        if formatted_prompt is None:
            raise ValueError("native runs need formatted_prompt (the text llama.cpp tokenizes)")
        fd, name = tempfile.mkstemp(prefix="llamaspec-bench-", suffix=".txt")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(formatted_prompt)
        prompt_file = Path(name)
    try:
        for rep in range(1, reps + 1):
            plain = run_mode(target, "none", prompt, settings, label=PLAIN)
            plain.ratio = plain.e2e_ratio = 1.0
            runs[PLAIN].append(plain)
            if on_run:
                on_run(rep, plain)
            for mode in modes:
                r = run_mode(target, mode, prompt, settings, label=mode).compare_to(plain)
                runs.setdefault(mode, []).append(r)
                if on_run:
                    on_run(rep, r)
            if native is not None and prompt_file is not None:
                for mode in modes:
                    try:
                        nr = run_native(native, target.path, mode, prompt_file, settings).compare_to(plain)
                    except NativeRunError as e:
                        msg = f"{NATIVE_PREFIX}{mode}: {e}"
                        if msg not in notes:
                            notes.append(msg)
                        continue
                    runs.setdefault(nr.mode, []).append(nr)
                    if on_run:
                        on_run(rep, nr)
    finally:
        if prompt_file is not None:
            prompt_file.unlink(missing_ok=True)
    return BenchResult(prompt_tokens=len(prompt), reps=reps, settings=settings, runs=runs,
                       summaries=summarise(runs), notes=notes)
