"""The compile worker's process (`python -m llamaspec.runtime.grammar_child`): converts JSON
schemas and parses GBNF grammars with llama.cpp for the process that started it, so a grammar
that crashes a compiler (a C stack overflow, an abort) or runs away kills this process, not the
server. grammar_worker.py starts it, sends one request at a time and waits with a time limit.

Protocol on stdin/stdout: each message is 4 bytes of big-endian length, then JSON.
  {"op": "schema", "schema": {...}}                   -> {"gbnf": "..."} | {"error": "..."}
  {"op": "gbnf", "model": PATH, "gbnf", "root", "patterns", "tokens"}
                                                      -> {"ok": true} | {"error": "..."}
  {"op": "llg", "model": PATH | null, "grammar": G}   -> {"ok": true} | {"error": "..."}
  {"op": "lark", "model": PATH, "gbnf", "root"}       -> {"grammar": G} | {"fallback": "why"}
A "gbnf" request builds llama.cpp's grammar sampler against the model's vocabulary (loaded once
per path, vocab_only) and applies it once to the whole vocabulary, as the first token will. An
"llg" request builds llguidance's matcher for grammar G (its JSON) with the parser limits the
server uses, against the vocabulary's tokenizer, and computes its first mask (no model: the
grammar is validated alone). A "lark" request converts GBNF for llguidance and compiles it so.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import struct
import sys
import tempfile

MEMORY_LIMIT = 4 << 30   # bytes of address space (RLIMIT_AS): a grammar that would take more fails here


def _read(stream) -> dict | None:
    head = stream.read(4)
    if len(head) < 4:
        return None
    (n,) = struct.unpack(">I", head)
    return json.loads(stream.read(n))


def _write(stream, msg: dict) -> None:
    data = json.dumps(msg).encode("utf-8")
    stream.write(struct.pack(">I", len(data)) + data)
    stream.flush()


_VOCABS: dict[str, object] = {}
_LOG: list[str] = []   # llama.cpp's log lines during one parse (its reason for a refusal may be there)


def _log(level, text, data) -> None:
    if len(_LOG) < 200:
        _LOG.append(text.decode("utf-8", errors="replace") if text else "")
_QUIET = None   # the log callback (kept alive)


def _vocab(path: str):
    import llama_cpp

    if path not in _VOCABS:
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        params.use_mmap = False   # (no tensors are read; a mapping of the whole file would count against RLIMIT_AS)
        model = llama_cpp.llama_model_load_from_file(path.encode(), params)
        if not model:
            raise RuntimeError(f"could not load the vocabulary of {path}")
        _VOCABS[path] = (model, llama_cpp.llama_model_get_vocab(model))
    return _VOCABS[path][1]


def _parse(msg: dict) -> dict:
    import llama_cpp
    import numpy as np

    from llamaspec.runtime.grammar_errors import parse_error

    vocab = _vocab(msg["model"])
    gbnf, root = msg["gbnf"].encode("utf-8"), msg.get("root", "root").encode("utf-8")
    pats = [p.encode("utf-8") for p in msg.get("patterns", ())]
    toks = list(msg.get("tokens", ()))
    _LOG.clear()
    with tempfile.TemporaryFile() as tmp:
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            if pats or toks:
                pat_arr = (ctypes.c_char_p * max(1, len(pats)))(*pats)
                tok_arr = (llama_cpp.llama_token * max(1, len(toks)))(*toks)
                ptr = llama_cpp.llama_sampler_init_grammar_lazy_patterns(vocab, gbnf, root, pat_arr, len(pats),
                                                                         tok_arr, len(toks))
            else:
                ptr = llama_cpp.llama_sampler_init_grammar(vocab, gbnf, root)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        said = tmp.read().decode("utf-8", errors="replace")
    if not ptr:
        return {"error": parse_error(said, _LOG) or "llama.cpp could not parse it"}
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    buf = np.zeros(n, dtype=np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")]))
    buf["id"] = np.arange(n, dtype=np.int32)
    arr = llama_cpp.llama_token_data_array(data=buf.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)),
                                           size=n, selected=-1, sorted=False)
    llama_cpp.llama_sampler_apply(ptr, ctypes.byref(arr))
    llama_cpp.llama_sampler_free(ptr)
    return {"ok": True}


_TOKENIZERS: dict[str, object] = {}


def _tokenizer(path: str):
    import llama_cpp

    from llamaspec.runtime.grammar_llg import tokenizer_of_vocab

    if path not in _TOKENIZERS:
        vocab = _vocab(path)
        _TOKENIZERS[path] = tokenizer_of_vocab(vocab, llama_cpp.llama_vocab_n_tokens(vocab))
    return _TOKENIZERS[path]


def _llg(msg: dict) -> dict:
    from llamaspec.runtime.grammar_llg import compile_error

    model = msg.get("model")
    why = compile_error(msg["grammar"], _tokenizer(model) if model else None)
    return {"error": why} if why else {"ok": True}


def _lark(msg: dict) -> dict:
    from llamaspec.runtime.grammar_lark import GbnfToLarkError, gbnf_to_lark
    from llamaspec.runtime.grammar_llg import compile_error, lark_grammar

    try:
        grammar = lark_grammar(gbnf_to_lark(msg["gbnf"], msg.get("root", "root")))
    except (GbnfToLarkError, ValueError, RecursionError) as e:
        return {"fallback": f"{type(e).__name__}: {e}"[:300]}
    why = compile_error(grammar, _tokenizer(msg["model"]))
    return {"fallback": why} if why else {"grammar": grammar}


_OPS = {"schema": lambda msg: _schema(msg), "llg": _llg, "lark": _lark}


def _schema(msg: dict) -> dict:
    from llamaspec.runtime.grammar_schema import schema_to_gbnf

    try:
        return {"gbnf": schema_to_gbnf(msg["schema"])}
    except (ValueError, KeyError, TypeError, RecursionError, AssertionError) as e:
        return {"error": f"the JSON schema cannot be converted to a grammar: {e}"}


def main() -> None:
    try:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ValueError, OSError):
        pass
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)   # what native code prints never mixes into the replies
    stdin = sys.stdin.buffer
    import llama_cpp

    global _QUIET
    _QUIET = llama_cpp.llama_log_callback(_log)
    llama_cpp.llama_log_set(_QUIET, ctypes.c_void_p(0))
    _write(out, {"ready": True})
    while True:
        msg = _read(stdin)
        if msg is None:
            return
        try:
            reply = _OPS.get(msg.get("op"), _parse)(msg)
        except MemoryError:
            reply = {"error": f"the grammar needs more than {MEMORY_LIMIT >> 30} GiB to compile"}
        except Exception as e:  # noqa: BLE001 - the request's error, reported back
            reply = {"error": f"{type(e).__name__}: {e}"}
        _write(out, reply)


if __name__ == "__main__":
    main()
