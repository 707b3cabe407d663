"""Models on llama-cpp-python's low-level C API, and llama.cpp's log. With context.py (contexts and
batches) the only place, besides drafters that own a context, that touches llama_cpp.

Why not the high-level `Llama` class: it keeps an n_ctx x n_vocab logits array when every
position is an output (4 GB for Gemma 3 at 4k context) and re-evaluates history to sync a draft.
Here a verify step marks only the batch positions it needs as outputs and reads their rows from
llama.cpp's own buffer, and each context keeps exactly the KV cache it needs.
"""

from __future__ import annotations

import codecs
import ctypes
import os
from collections import deque
from pathlib import Path

import llama_cpp

from llamaspec.errors import ModelLoadError
from llamaspec.runtime import llama_log

# ---- llama.cpp's log: kept quiet, but remembered so load failures can say why -----------------
# Shown only where llama_log.route sends it (the CLI's --log-verbose / --log-file).
LOG_TAIL: deque[str] = deque(maxlen=30)


@llama_cpp.llama_log_callback
def _log_cb(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:  # pragma: no cover - C callback
    msg = text.decode("utf-8", errors="replace")
    LOG_TAIL.append(msg)
    llama_log.emit(msg)


def set_llama_log() -> None:
    """Install llamaspec's log callback again: llama_cpp's high-level Llama class replaces the
    process-wide one. Where the log goes is llama_log.route's."""
    llama_cpp.llama_log_set(_log_cb, ctypes.c_void_p(0))


llama_cpp.llama_log_set(_log_cb, ctypes.c_void_p(0))
llama_cpp.llama_backend_init()


_GENERIC = ("failed to load model", "failed to read key-value pairs", "failed to read tensor info",
            "failed to read tensor data", "failed to read header", "error loading model:")


def last_log_error() -> str:
    """llama.cpp's reason for the last load failure, from its log: gguf's own complaint (a bad key,
    offset or type) when there is one, else the loader's "error loading model: <reason>"."""
    lines = [line.strip() for line in LOG_TAIL if line.strip()]
    for line in lines:
        if line.startswith("gguf_") and not any(g in line for g in _GENERIC):
            return line.split(": ", 1)[-1]
    for line in reversed(lines):
        if "error loading model: " in line:
            why = line.split("error loading model: ", 1)[1]
            if not why.startswith("llama_model_loader: failed to load model"):
                return why
    for line in reversed(lines):
        low = line.lower()
        if ("error" in low or "failed" in low or "invalid" in low) and not line.endswith("failed to load model"):
            return line
    return ""


def _load_hint(why: str) -> str:
    if "unknown model architecture" in why:
        return ("this llama.cpp does not know the architecture: upgrade llama-cpp-python "
                "(llamaspec doctor shows the version), or use a model of a supported architecture")
    if "tokenizer" in why or "vocab" in why:
        return "the file's tokenizer cannot be built by this llama.cpp; re-convert the model or upgrade llama-cpp-python"
    return ("check that the file is a complete GGUF of an architecture this llama.cpp supports "
            "(llamaspec doctor shows the version); download or convert it again")


class DecodeClock:
    """Seconds spent inside llama.cpp's decode (llama_decode, and llama_get_logits, which waits
    for the batch to finish), over all contexts: the rest of a step is our own overhead."""

    seconds = 0.0


def default_threads() -> int:
    return max(1, os.cpu_count() or 1)


# ---- model ---------------------------------------------------------------------------------------
class Model:
    """Loaded weights and vocabulary. One model can serve several contexts (target + MTP)."""

    def __init__(self, path: str | os.PathLike[str], *, n_gpu_layers: int = 0, load_mtp: bool = False,
                 amx: bool | None = None, buffers=None):
        """amx: --amx (True) / --no-amx (False) / None (LLAMASPEC_AMX, else the default policy).
        buffers: a cpu_policy.BufferDecision to apply instead of deciding (tests, scripts)."""
        from llamaspec.runtime.info import apply_buffer_policy

        self.path = Path(path)
        self.n_gpu_layers = n_gpu_layers
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        if load_mtp:
            params.load_mtp = True
        self.load_mtp = bool(load_mtp)  # NextN/MTP tensors loaded (an MTP context needs them)
        if not self.path.is_file():
            from llamaspec.gguf.header import read_file

            read_file(self.path)  # raises the precise "not found" / "is a directory" error
        # CPUs with AMX: load without llama.cpp's AMX weight buffer (it crashes on quantized
        # models, llama.cpp issue 20824) but keep CPU_REPACK; see cpu_policy.py.
        self.amx = amx
        self.buffers = apply_buffer_policy(params, self.path, amx, decision=buffers)  # keeps overrides alive
        LOG_TAIL.clear()
        self.ptr = llama_cpp.llama_model_load_from_file(str(self.path).encode(), params)
        if not self.ptr:
            from llamaspec.gguf.header import read_file, require_data

            # A missing, truncated or non-GGUF file gets its own message, naming the byte or key.
            require_data(read_file(self.path))
            why = last_log_error()
            raise ModelLoadError(f"llama.cpp could not load {self.path}" + (f": {why}" if why else ""),
                                 _load_hint(why))
        self.vocab = llama_cpp.llama_model_get_vocab(self.ptr)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.n_embd = llama_cpp.llama_model_n_embd(self.ptr)
        self.n_ctx_train = llama_cpp.llama_model_n_ctx_train(self.ptr)
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))
        self.bos = llama_cpp.llama_vocab_bos(self.vocab)
        self.eos = llama_cpp.llama_vocab_eos(self.vocab)
        # Partial KV removal is impossible on recurrent state: the engine rolls back by checkpoint.
        self.needs_checkpoints = bool(llama_cpp.llama_model_is_recurrent(self.ptr)
                                      or llama_cpp.llama_model_is_hybrid(self.ptr))
        self.n_nextn = int(llama_cpp.llama_model_n_layer_nextn(self.ptr)) if hasattr(
            llama_cpp, "llama_model_n_layer_nextn") else 0
        self._piece_cache: dict[int, bytes] = {}
        self._eog_cache: dict[int, bool] = {}

    # tokens <-> text
    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 16
        buf = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = (llama_cpp.llama_token * n_max)()
            n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """Bytes of one token as it appears in output text (special tokens rendered empty)."""
        p = self._piece_cache.get(token)
        if p is None:
            buf = ctypes.create_string_buffer(64)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, 64, 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, -n, 0, False)
            p = buf.raw[:n]
            self._piece_cache[token] = p
        return p

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def token_text(self, token: int) -> str:
        return llama_cpp.llama_vocab_get_text(self.vocab, token).decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        r = self._eog_cache.get(token)
        if r is None:
            r = self._eog_cache[token] = bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))
        return r

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(1 << 16)
        n = llama_cpp.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            llama_cpp.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    @property
    def chat_template(self) -> str | None:
        return self.meta("tokenizer.chat_template")

    def chat_prompt(self, messages: list[dict], tools: list[dict] | None = None, **template_vars) -> str:
        """Render messages with the model's own chat template (Jinja, as in the GGUF), sandboxed:
        a template that fails or tries an unsafe operation is a ChatTemplateError naming the file.
        tools (OpenAI's list) and template_vars reach the template (a ToolPlan's template_kwargs)."""
        from llamaspec.runtime.chat_template import render

        template = self.chat_template
        if not template:
            raise ModelLoadError(f"{self.path.name} has no chat template", "use --raw for plain completion")
        return render(template, messages, source=str(self.path),
                      eos_token=self.token_text(self.eos) if self.eos >= 0 else "",
                      bos_token=self.token_text(self.bos) if self.bos >= 0 else "", add_generation_prompt=True,
                      tools=tools, **template_vars)

    def tokenize_prompt(self, text: str) -> list[int]:
        """Tokenize a full prompt, adding BOS only if the text does not already start with it."""
        bos_text = self.token_text(self.bos) if self.bos >= 0 else ""
        add = self.add_bos and not (bos_text and text.startswith(bos_text))
        toks = self.tokenize(text, add_special=False, parse_special=True)
        return ([self.bos] if add else []) + toks

    def close(self) -> None:
        ptr, self.ptr = getattr(self, "ptr", None), None   # cleared first: never freed twice
        if ptr:
            llama_cpp.llama_model_free(ptr)

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


class Utf8Stream:
    """Turns token bytes into text as it streams, holding back incomplete UTF-8 sequences."""

    def __init__(self) -> None:
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, data: bytes) -> str:
        return self._dec.decode(data)

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)

    @property
    def pending(self) -> int:
        """1 while bytes of a character not finished are held back, else 0."""
        return int(bool(self._dec.getstate()[0]))
