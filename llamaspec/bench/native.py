"""llama.cpp's own `llama-speculative-simple` as a benchmark row (optional, `bench --native DIR`).

It runs in the same repetition loop on the same formatted prompt; its ratios are over llamaspec's
plain decoding of the same repetition, and its tokens are not checked.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import asdict
from pathlib import Path

from llamaspec.bench.results import NATIVE_PREFIX, BenchSettings, RepResult

NATIVE_EXE = "llama-speculative-simple"

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
    from llamaspec.speculative.options import parse_spec_types

    return ",".join(parse_spec_types(spec)) or "none"


def native_command(bin_dir: Path, model: Path, spec: str, prompt_file: Path, settings: BenchSettings) -> list[str]:
    from llamaspec.runtime.llama import default_threads
    from llamaspec.speculative.options import NgramParams, native_flags

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
    try:
        return parse_log(proc.stdout + proc.stderr, NATIVE_PREFIX + spec)
    except NativeRunError as exc:
        raise NativeRunError(f"{NATIVE_EXE} exited {proc.returncode} {exc}") from None


def parse_log(text: str, mode: str) -> RepResult:
    """The row of one `llama-speculative-simple` log: tokens, tok/s, end-to-end seconds (encode +
    decode) and acceptance (None when the log has no accept line: unknown, never 0 %)."""
    m = _DEC.search(text)
    if not m:
        last = next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), "")
        raise NativeRunError("without a timing line" + (f" (last line: {last[:160]})" if last else ""))
    a, e = _ACC.search(text), _ENC.search(text)
    return RepResult(mode=mode, n=int(m.group(1)), tps=float(m.group(3)),
                     e2e_s=float(m.group(2)) + (float(e.group(2)) if e else 0.0),
                     acceptance=float(a.group(1)) / 100 if a else None, native=True)
