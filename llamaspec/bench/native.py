"""llama.cpp's own `llama-speculative-simple` as a benchmark row (optional, `bench --native DIR`).

It runs in the same repetition loop as our modes, on exactly our prompt tokens, and its row is
compared with ours like for like:

- The prompt. llama.cpp must decode the tokens we decode. `-f FILE` would drop one trailing newline
  (common/arg.cpp: `if (params.prompt.back() == '\\n') params.prompt.pop_back()`) and a chat prompt
  ends with `<|im_start|>assistant\\n`: another prompt, another text (it once copied the input at
  100 % acceptance). `-p TEXT` keeps the text, but puts it on the command line (ARG_MAX, visible in
  `ps`). So the prompt goes in a file read with `-bf/--binary-file` (its bytes as they are, no trim),
  with `--no-escape`: llama.cpp otherwise turns the two characters `\\n`, `\\t`, `\\\\`... of *any*
  prompt into control characters (arg.cpp: `if (params.escape) string_process_escapes(params.prompt)`,
  whichever flag gave it), and a code prompt with `print("a\\nb")` would change. llama.cpp tokenizes
  with `common_tokenize(ctx, prompt, add_special=true, parse_special=true)`: BOS is added whenever the
  vocabulary asks, even when the text already starts with it, so a template that writes its BOS text
  is passed without it (`native_prompt`); every prompt is checked token for token before a run, and
  the run's own echo of the prompt is checked after it.
- The tokens counted. The tool decodes past `-n` (its last draft is not cut to what is left: 193
  tokens for `-n 128`), and its `decoded N tokens` line counts them all. With `--log-jsonl
  --log-timestamps` every token it prints is one JSON line stamped in microseconds, so the row counts
  the first `-n` tokens and the time until the step that produced the n-th (`NativeLog.first_n`);
  `n_decoded` says how many it decoded in all.
- The text. Its greedy text, token by token, is compared with our plain decoding's of the same
  repetition; a row whose text differs is flagged and never given a ratio (runner.py adds the
  target's top-2 logit gap where it differs, on our side).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from llamaspec.bench.results import NATIVE_PREFIX, BenchSettings, RepResult, first_difference

if TYPE_CHECKING:
    from llamaspec.runtime.llama import Model

NATIVE_EXE = "llama-speculative-simple"

_DEC = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")
_ENC = re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_ACC = re.compile(r"accept\s+=\s+([\d.]+)%")
_READ = re.compile(r"Read (\d+) bytes from binary file")
_SEP = "\n\n"   # what the tool prints before the prompt's pieces and after its output


class NativeRunError(Exception):
    """llama-speculative-simple did not run, printed no timing line, or read another prompt."""


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
    # -bf: the file's bytes, no newline trimmed; --no-escape: "\n" in the text stays two characters;
    # --log-jsonl --log-timestamps: one stamped JSON line per printed token (the module docstring)
    cmd = [str(exe), "-m", str(model), "-bf", str(prompt_file), "--no-escape", "--log-jsonl", "--log-timestamps",
           "-n", str(settings.n), "--temp", "0", "-t", str(settings.threads or default_threads()),
           "-c", str(settings.ctx), "--spec-type", kind]
    # each type's own flags (the table's native_flags), with our run's values: like for like
    values = {**asdict(settings.ngram or NgramParams()), "draft_path": settings.draft_path,
              "native_draft_max": settings.native_draft_max}
    return cmd + native_flags(kind, values)


def native_prompt(model: "Model", formatted: str, tokens: Sequence[int]) -> str:
    """The text whose llama.cpp tokenization (add_special and parse_special, as the tool does it) is
    exactly `tokens`: the formatted prompt, or it without its leading BOS text when llama.cpp adds
    BOS itself. NativeRunError when neither is (the row would decode another prompt)."""
    bos = model.token_text(model.bos) if model.bos >= 0 else ""
    candidates = [formatted] + ([formatted[len(bos):]] if bos and formatted.startswith(bos) else [])
    for text in candidates:
        if model.tokenize(text, add_special=True, parse_special=True) == list(tokens):
            return text
    got = model.tokenize(formatted, add_special=True, parse_special=True)
    raise NativeRunError(f"llama.cpp would tokenize this prompt otherwise ({len(got)} tokens against our "
                         f"{len(tokens)}, first different at token {first_difference(list(tokens), got)}); not run")


def pieces(model: "Model", tokens: Sequence[int]) -> list[str]:
    """Each token as llama-speculative-simple prints it (common_token_to_piece, special tokens as text)."""
    import ctypes

    import llama_cpp

    out = []
    for t in tokens:
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(model.vocab, int(t), buf, 64, 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(model.vocab, int(t), buf, -n, 0, True)
        out.append(buf.raw[:n].decode("utf-8", errors="replace"))
    return out


def _same(piece: str) -> str:
    # llama.cpp's JSON writer replaces each invalid UTF-8 byte of a partial character, Python each sequence
    return re.sub("\ufffd+", "\ufffd", piece)


@dataclass
class NativeLog:
    """What one run printed. `echoed` (JSONL logs only): every piece between the tool's two blank
    lines, the prompt's then the output's, with `times_us` their stamps; None for a plain-text log."""

    n_decoded: int                      # its "decoded N tokens": every token, past -n too
    decode_s: float
    encode_s: float
    acceptance: float | None            # None: no accept line (no drafts: "-nan%"), unknown
    echoed: list[str] | None = None
    times_us: list[int] = field(default_factory=list)
    decoded_at_us: int | None = None    # the stamp of the "decoded" line (the end of decoding)
    prompt_bytes: int | None = None     # "Read N bytes from binary file"

    def first_n(self, n_prompt: int, n: int) -> tuple[int, float, bool]:
        """(tokens counted, their decode seconds, stopped at end of generation) over the first `n`
        tokens after the prompt's `n_prompt` pieces: the time to the stamp of the n-th printed
        token (the end of the step that produced it), or the whole decode when it stopped sooner."""
        if self.echoed is None:
            return self.n_decoded, self.decode_s, False
        printed = len(self.echoed) - n_prompt
        eog = printed < self.n_decoded      # the end-of-generation token is counted, never printed
        k = max(0, min(n, printed))
        if k == 0 or (eog and printed <= n) or self.decoded_at_us is None:
            return k, self.decode_s, eog
        start = self.decoded_at_us - self.decode_s * 1e6
        return k, max(1e-6, (self.times_us[n_prompt + k - 1] - start) / 1e6), eog and printed <= n


def parse_output(stdout: str, stderr: str = "") -> NativeLog:
    """A run's output: JSON lines (--log-jsonl) or llama.cpp's plain-text log (older runs)."""
    entries = []
    for line in stdout.splitlines():
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and obj.get("type") == "log":
                entries.append(obj)
    read = _READ.search(stderr)
    if not entries:
        log = _text_log(stdout + stderr)
        log.prompt_bytes = int(read.group(1)) if read else None
        return log
    info = "".join(str(e.get("msg", "")) for e in entries if e.get("level") != "none")
    dec_at = next((i for i, e in enumerate(entries) if e.get("level") != "none" and _DEC.search(str(e.get("msg")))),
                  None)
    log = _text_log(info)
    log.prompt_bytes = int(read.group(1)) if read else None
    end = dec_at if dec_at is not None else len(entries)
    out = [(str(e.get("msg", "")), int(e.get("time") or 0)) for e in entries[:end] if e.get("level") == "none"]
    first = next((i for i, (m, _) in enumerate(out) if m == _SEP), None)
    last = max((i for i, (m, _) in enumerate(out) if m == _SEP), default=None)
    if first is None or last is None or last <= first:
        raise NativeRunError("printed no prompt and output between its blank lines")
    body = out[first + 1:last]
    log.echoed, log.times_us = [m for m, _ in body], [t for _, t in body]
    log.decoded_at_us = int(entries[dec_at].get("time") or 0) if dec_at is not None else None
    return log


def _text_log(text: str) -> NativeLog:
    m = _DEC.search(text)
    if not m:
        last = next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), "")
        raise NativeRunError("without a timing line" + (f" (last line: {last[:160]})" if last else ""))
    a, e = _ACC.search(text), _ENC.search(text)
    return NativeLog(n_decoded=int(m.group(1)), decode_s=float(m.group(2)),
                     encode_s=float(e.group(2)) if e else 0.0,
                     acceptance=float(a.group(1)) / 100 if a else None)


def parse_log(text: str, mode: str) -> RepResult:
    """The row of one plain-text `llama-speculative-simple` log: every decoded token, tok/s,
    end-to-end seconds (encode + decode) and acceptance (None when the log has no accept line:
    unknown, never 0 %). Its text is not checked (a plain-text log does not delimit tokens)."""
    log = _text_log(text)
    tps = log.n_decoded / log.decode_s if log.decode_s > 0 else 0.0
    m = _DEC.search(text)
    return RepResult(mode=mode, n=log.n_decoded, tps=float(m.group(3)) if m else tps,
                     e2e_s=log.decode_s + log.encode_s, acceptance=log.acceptance, native=True,
                     n_decoded=log.n_decoded)


def native_row(log: NativeLog, mode: str, n: int, prompt: Sequence[str] | None,
               plain: Sequence[str] | None) -> RepResult:
    """The row of one run: the first `n` tokens counted and timed, its text compared with `plain`
    (the pieces of our plain decoding of the same repetition; None: not compared). `prompt` (our
    prompt's pieces) delimits its output; a run that echoed another prompt is a NativeRunError:
    its row would measure another text. Without per-token lines (a plain-text log, or no
    `prompt`), every decoded token is counted and the text is not checked."""
    if log.echoed is None or prompt is None:
        k, secs = log.n_decoded, log.decode_s
        return RepResult(mode=mode, n=k, tps=k / secs if secs > 0 else 0.0, e2e_s=secs + log.encode_s,
                         acceptance=log.acceptance, native=True, n_decoded=log.n_decoded)
    ours = [_same(p) for p in prompt]
    echo = [_same(p) for p in log.echoed[:len(prompt)]]
    if echo != ours:
        raise NativeRunError(f"decoded another prompt than ours (its echo differs at prompt token "
                             f"{first_difference(ours, echo)} of {len(prompt)}); its row would measure another text")
    k, secs, _ = log.first_n(len(prompt), n)
    r = RepResult(mode=mode, n=k, tps=k / secs if secs > 0 else 0.0, e2e_s=secs + log.encode_s,
                  acceptance=log.acceptance, native=True, n_decoded=log.n_decoded)
    if plain is not None:
        got = [_same(p) for p in log.echoed[len(prompt):][:n]]
        r.first_difference = first_difference([_same(p) for p in plain][:n], got)
        r.identical = r.first_difference is None
    return r


def run_native(bin_dir: Path, model: Path, spec: str, prompt_file: Path, settings: BenchSettings,
               prompt: Sequence[str] | None = None, plain: Sequence[str] | None = None) -> RepResult:
    """One run of llama.cpp's `llama-speculative-simple`: its first `settings.n` tokens, and their
    text against `plain` when given (`prompt`: our prompt's pieces, to check what it decoded)."""
    cmd = native_command(bin_dir, model, spec, prompt_file, settings)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    except OSError as e:
        raise NativeRunError(f"could not start {cmd[0]}: {e.strerror or e}") from None
    try:
        log = parse_output(proc.stdout, proc.stderr)
        size = prompt_file.stat().st_size
        if log.prompt_bytes is not None and log.prompt_bytes != size:
            raise NativeRunError(f"read {log.prompt_bytes} bytes of the {size}-byte prompt file")
        return native_row(log, NATIVE_PREFIX + spec, settings.n, prompt, plain)
    except NativeRunError as exc:
        raise NativeRunError(f"{NATIVE_EXE} exited {proc.returncode} {exc}") from None


def top2_gap(target: "Model", prompt: Sequence[int], prefix: Sequence[int], threads: int | None = None) -> float:
    """The target's gap between its two best logits after prompt + prefix: where a native text
    leaves ours, a gap near 0 is a near-tie (batch-shape noise can flip it), a large one is not."""
    import numpy as np

    from llamaspec.runtime.context import Context, ContextConfig

    n_ctx = -(-(len(prompt) + len(prefix) + 1) // 256) * 256
    ctx = Context(target, ContextConfig(n_ctx=n_ctx, n_threads=threads))
    try:
        rows = ctx.decode(list(prompt) + [int(t) for t in prefix], 0, 0, "last")
        row = np.sort(ctx.logits(rows)[0].astype(np.float64))
        return float(row[-1] - row[-2])
    finally:
        ctx.close()
