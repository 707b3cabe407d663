"""llama.cpp's grammar engine for one sequence, through llama-cpp-python's grammar sampler: what
runs the grammars llguidance does not (lazy tool-call grammars that start at a trigger, and GBNF
that grammar_lark.py cannot read). Checked one token at a time, applied to a whole row only when
needed, cloned for drafts.

Never `accept` a token the grammar refuses: llama.cpp aborts the process on it (an empty grammar
stack, or an end-of-generation token before the grammar is complete). `accept` checks first and
raises instead.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import threading
from typing import Sequence

import numpy as np

from llamaspec.runtime.grammar_errors import GrammarError, parse_error as _parse_error

__all__ = ["LlamaGrammarState", "spec_key", "verified", "mark_verified", "STDERR_LOCK"]


_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])


class LlamaGrammarState:
    """One sequence's live grammar: llama.cpp's grammar sampler, advanced by the emitted tokens.

    `allows(t)` asks about one token; `mask(row)` returns the row with every refused token at
    -inf; `accept(t)` advances; `clone()` copies the state (for a draft's rows: never advance the
    real state by a token that may be rejected). Free with close() (or let it be collected).

        >>> # with a loaded Model `m`:  g = LlamaGrammarState(m, GrammarSpec('root ::= "yes" | "no"'))
        >>> # g.allows(m.tokenize("yes", add_special=False)[0]) -> True; the token of "maybe" -> False
    """

    def __init__(self, model, spec: "GrammarSpec", *, _ptr=None):
        import llama_cpp

        self.model, self.spec = model, spec
        self._ptr = _ptr
        if self._ptr is None:
            self._ptr = _compile(model, spec)
        self._one = (llama_cpp.llama_token_data * 1)()
        self._one_arr = llama_cpp.llama_token_data_array(data=self._one, size=1, selected=-1, sorted=False)
        self._buf: np.ndarray | None = None   # the whole-vocabulary array, made at the first mask

    def allows(self, token: int) -> bool:
        import llama_cpp

        self._one[0].id, self._one[0].logit, self._one[0].p = int(token), 0.0, 0.0
        self._one_arr.size, self._one_arr.selected = 1, -1
        llama_cpp.llama_sampler_apply(self._ptr, ctypes.byref(self._one_arr))
        return self._one[0].logit != -np.inf

    def mask(self, row: np.ndarray) -> np.ndarray:
        """A copy of `row` (one logit per token id) with every token the grammar refuses at -inf."""
        out = np.array(row, dtype=np.float32, copy=True)
        out[~self.allowed_mask(row.shape[0])] = -np.inf
        return out

    def allowed_mask(self, n: int) -> np.ndarray:
        """Booleans over token ids 0..n-1: True where the grammar allows the token now (one apply
        over the whole vocabulary: ~5-10 ms on 49k tokens; ask `allows` first where one will do)."""
        import llama_cpp

        if self._buf is None or self._buf.shape[0] != n:
            self._buf = np.zeros(n, dtype=_TOKEN_DATA)
            self._buf["id"] = np.arange(n, dtype=np.int32)
            self._arr = llama_cpp.llama_token_data_array(
                data=self._buf.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)),
                size=n, selected=-1, sorted=False)
        # the grammar only writes -inf into refused entries: fill zeros, read which ones it hit
        self._buf["logit"] = 0.0
        self._arr.size, self._arr.selected, self._arr.sorted = n, -1, False
        llama_cpp.llama_sampler_apply(self._ptr, ctypes.byref(self._arr))
        return self._buf["logit"] != -np.inf

    def allowed_ids(self, candidates: Sequence[int]) -> list[int]:
        """Which of `candidates` the grammar allows now (one apply over just those tokens)."""
        import llama_cpp

        if not len(candidates):
            return []
        buf = np.zeros(len(candidates), dtype=_TOKEN_DATA)
        buf["id"] = np.asarray(candidates, dtype=np.int32)
        arr = llama_cpp.llama_token_data_array(data=buf.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)),
                                               size=len(candidates), selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(self._ptr, ctypes.byref(arr))
        return [int(t) for t in buf["id"][buf["logit"] != -np.inf]]

    def accept(self, token: int) -> None:
        """Advance by one emitted token. Raises ValueError (instead of llama.cpp's abort) when the
        grammar refuses it."""
        import llama_cpp

        if not self.allows(token):
            raise ValueError(f"the grammar refuses token {token} ({self.model.token_text(token)!r})")
        llama_cpp.llama_sampler_accept(self._ptr, int(token))

    def accept_all(self, tokens: Sequence[int]) -> int:
        """Accept tokens while the grammar allows them; returns how many were accepted."""
        for i, t in enumerate(tokens):
            if not self.allows(t):
                return i
            self.accept(t)
        return len(tokens)

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of `tokens` the grammar allows in a row from here; the state does not move."""
        probe = self.clone()
        try:
            return probe.accept_all(tokens)
        finally:
            probe.close()

    def clone(self) -> "LlamaGrammarState":
        import llama_cpp

        return LlamaGrammarState(self.model, self.spec, _ptr=llama_cpp.llama_sampler_clone(self._ptr))

    def close(self) -> None:
        import llama_cpp

        ptr, self._ptr = self._ptr, None
        if ptr:
            llama_cpp.llama_sampler_free(ptr)

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


def _compile(model, spec: "GrammarSpec"):
    """llama.cpp's grammar sampler for `spec`; GrammarError naming spec.field when it fails."""
    import llama_cpp

    from llamaspec.runtime.llama import LOG_TAIL

    gbnf, root = spec.gbnf.encode("utf-8"), spec.root.encode("utf-8")
    with STDERR_LOCK, _native_stderr(capture=not verified(spec_key(spec, model))) as said:
        LOG_TAIL.clear()
        if spec.lazy:
            pats = [p.encode("utf-8") for p in spec.trigger_patterns]
            pat_arr = (ctypes.c_char_p * max(1, len(pats)))(*pats)
            tok_arr = (llama_cpp.llama_token * max(1, len(spec.trigger_tokens)))(*spec.trigger_tokens)
            ptr = llama_cpp.llama_sampler_init_grammar_lazy_patterns(model.vocab, gbnf, root, pat_arr, len(pats),
                                                                     tok_arr, len(spec.trigger_tokens))
        else:
            ptr = llama_cpp.llama_sampler_init_grammar(model.vocab, gbnf, root)
        log = list(LOG_TAIL)
    why = "" if ptr else _parse_error(said[0], log)
    if said[0] and not why:   # anything but the parser's reason (which the one-line error says) is kept
        os.write(2, said[0].encode("utf-8"))
    if not ptr:
        raise GrammarError(f"{spec.field}: the grammar does not compile: {why or 'llama.cpp could not parse it'}",
                           spec.field)
    return ptr


# File descriptor 2 is the whole process's: one capture at a time (else one request's error
# could quote another's), and none for a grammar the worker compiled already (it cannot fail).
STDERR_LOCK = threading.Lock()
_VERIFIED: dict[bytes, None] = {}   # digests of the grammars that compiled in a worker (oldest first)


def spec_key(spec: "GrammarSpec", model) -> bytes:
    fields = [str(getattr(model, "path", "")), spec.gbnf, spec.root, spec.trigger_patterns, spec.trigger_tokens]
    return hashlib.sha256(json.dumps(fields).encode("utf-8", "surrogatepass")).digest()


def verified(key: bytes) -> bool:
    return key in _VERIFIED


def mark_verified(key: bytes) -> None:
    with STDERR_LOCK:
        _VERIFIED[key] = None
        while len(_VERIFIED) > 256:
            _VERIFIED.pop(next(iter(_VERIFIED)))


class _native_stderr:
    """Captures what native code writes to file descriptor 2 meanwhile (llama.cpp's grammar
    parser prints its reason there, not to the log); `said[0]` is the text, for the caller to
    fold into its error or write back. Hold STDERR_LOCK around it."""

    def __init__(self, capture: bool = True):
        self.capture = capture

    def __enter__(self) -> list[str]:
        import sys
        import tempfile

        self.said = [""]
        self._saved = None
        if not self.capture:
            return self.said
        try:
            sys.stderr.flush()
            self._tmp = tempfile.TemporaryFile()
            self._saved = os.dup(2)
            os.dup2(self._tmp.fileno(), 2)
        except (OSError, ValueError):   # no fd 2 (an embedding without one): nothing captured
            self._saved = None
        return self.said

    def __exit__(self, *exc) -> None:
        if self._saved is None:
            return
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._tmp.seek(0)
        data = self._tmp.read()
        self._tmp.close()
        self.said[0] = data.decode("utf-8", errors="replace")
