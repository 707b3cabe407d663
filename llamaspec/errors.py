"""Errors users can cause, and the exit codes.

Every user-facing failure is a `LlamaspecError`: one line naming the problem, one hint saying
what to do, an exit code. The CLI turns these (and the other exceptions it knows) into what the
user sees (llamaspec/cli/_errors.py); tracebacks are for bugs only.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class LlamaspecError(Exception):
    """A failure the user can act on. `hint` says what to do about it."""

    exit_code = EXIT_FAILURE

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(LlamaspecError):
    """Wrong flags or flag values."""

    exit_code = EXIT_USAGE


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


class ContextFullError(LlamaspecError):
    """Generation reached the context size."""
