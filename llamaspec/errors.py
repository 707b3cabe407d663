"""Errors users can cause, and the exit codes.

Every user-facing failure is a `LlamaspecError`: one line naming the problem, one hint saying
what to do, an exit code. The CLI turns these (and the other exceptions it knows) into what the
user sees (llamaspec/cli/_errors.py); tracebacks are for bugs only.
"""

from __future__ import annotations

import errno
import os

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130   # SIGINT (Ctrl-C)
EXIT_TERMINATED = 143    # SIGTERM (128 + 15, what a shell reports for a process killed by it)


class LlamaspecError(Exception):
    """A failure the user can act on. `hint` says what to do about it."""

    exit_code = EXIT_FAILURE

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(LlamaspecError):
    """Wrong flags or flag values. `field`: the setting it is about (a knob's name, a request
    field: `temperature`, `logit_bias`), which the server answers as OpenAI's error `param`."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, hint: str | None = None, field: str | None = None):
        super().__init__(message, hint)
        self.field = field


class ModelFileError(LlamaspecError):
    """A GGUF file that is missing, unreadable, truncated or not a GGUF at all."""


class ChatTemplateError(ModelFileError):
    """A model's chat template that cannot be rendered: a syntax error, raise_exception, or an unsafe
    operation refused by the sandbox (runtime/chat_template.py). Exit code 1; `--raw` skips it."""


class ModelLoadError(LlamaspecError):
    """llama.cpp refused to load a model or create a context."""


class IncompatiblePairError(LlamaspecError):
    """A draft whose vocabulary does not match the target's by llama.cpp's rules."""


class RegistryError(LlamaspecError):
    """A broken pairings/*.yaml file (names file and line)."""


class HubError(LlamaspecError):
    """The Hugging Face Hub could not give us a file (not found, gated, offline, network down)."""


class InputError(LlamaspecError):
    """Bad input data: an unreadable prompt file, a broken JSONL line."""


class DiskFullError(LlamaspecError):
    """No space left (or a file-size limit, or a quota) while writing a file. Exit code 1; what was
    written before is kept (the writers cut a partial record, or write atomically)."""


DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


def disk_full(path: str | os.PathLike, exc: BaseException, hint: str) -> DiskFullError | None:
    """The DiskFullError for `exc` raised writing `path`, or None when it is another error:
    `raise disk_full(path, e, "...") or e`."""
    if not isinstance(exc, OSError) or exc.errno not in DISK_FULL_ERRNOS:
        return None
    why = {errno.ENOSPC: "no space left on device",
           errno.EFBIG: "file too large (the disk's or the process's file-size limit)",
           errno.EDQUOT: "disk quota exceeded"}[exc.errno]
    return DiskFullError(f"disk full writing {os.fspath(path)}: {why}", hint)


class ContextFullError(LlamaspecError):
    """Generation reached the context size."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises KeyboardInterrupt (the CLI's handler, cli/_errors.py),
    so that the same code keeps partial results and cleans up; the exit code is EXIT_TERMINATED."""


class GenerationInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM in the CLI) during `Generator.generate` / `generate_many`: a
    KeyboardInterrupt, so a script's loop stops as Ctrl-C should, carrying what was made. `result`:
    the partial `Result` of `generate` (finish_reason "interrupted"); None from `generate_many`,
    which has already yielded every finished result. `__cause__` is the original KeyboardInterrupt."""

    def __init__(self, result=None):
        super().__init__("generation interrupted")
        self.result = result


# ---- how a range is said, once for every message (CLI flags, batch fields) ----------------------


def bounds(low: float | None = None, high: float | None = None, *, open_low: bool = False) -> str:
    """'>= low', '> low' (open_low), '<= high', or 'in [low, high]' / 'in (low, high]'."""
    if high is None:
        return f"{'>' if open_low else '>='} {low:g}"
    if low is None:
        return f"<= {high:g}"
    return f"in {'(' if open_low else '['}{low:g}, {high:g}]"


def jtype(v: object) -> str:
    """JSON's name for a value's type, as the user wrote it ("got string").

        >>> jtype("x"), jtype(1.5), jtype(None), jtype(True)
        ('string', 'number', 'null', 'boolean')
    """
    if v is None or isinstance(v, bool):
        return "null" if v is None else "boolean"
    return {str: "string", int: "number", float: "number", list: "array", dict: "object"}.get(type(v), "value")


def must_be(name: str, low: float | None = None, high: float | None = None, *, open_low: bool = False,
            got: object = None, note: str = "") -> str:
    """'NAME must be <bounds>[ (note)][, got VALUE]'."""
    text = f"{name} must be {bounds(low, high, open_low=open_low)}" + (f" ({note})" if note else "")
    return text if got is None else f"{text}, got {got}"


#: the widest integer any field takes (OpenAI and vLLM take int64 seeds)
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

#: besides 0, the sizes a sampling number may have: float32's normal range, as llama.cpp's samplers
#: compute in float32 (a repeat_penalty of 1e-300 or 1e300 would turn logits into inf and NaN)
FLOAT32_TINY, FLOAT32_MAX = 1.1754944e-38, 3.4028235e38
SAMPLING_NUMBER = f"a finite number, 0 or between {FLOAT32_TINY:.3g} and {FLOAT32_MAX:.3g} in size"


def sampling_number_ok(v: int | float) -> bool:
    """A number a sampler can use: finite, 0 or of a size float32 holds (no denormal such as 1e-310).
    The one rule for every way in: SamplingParams, and request bodies (which name the field).

        >>> sampling_number_ok(0.8), sampling_number_ok(0), sampling_number_ok(1e-310), sampling_number_ok(1e300)
        (True, True, False, False)
    """
    try:
        f = abs(float(v))
    except OverflowError:   # an integer past float's range
        return False
    return f == 0 or FLOAT32_TINY <= f <= FLOAT32_MAX
