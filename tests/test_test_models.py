"""The test models themselves: they load, tokenize real text, and behave as other tests assume."""

from __future__ import annotations

import contextlib
import ctypes
from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from llamaspec.testing import tiny_models as tm

ENGLISH = "The quick brown fox jumps over the lazy dog. It was a beautiful day in the city!"
PYTHON = 'def fibonacci(n):\n    """Return n."""\n    if n < 2:\n        return n\n\treturn {"x": [1, 2]}  # é 日本\n'
PROMPTS = ["The quick brown fox", "def fibonacci(n):", "Hello, world! How are you", "Once upon a time",
           "import sys\n", "class Counter:"]


# ---- a little low-level llama_cpp ----------------------------------------------------------------


@contextlib.contextmanager
def llama_logs():
    """Collect llama.cpp log lines as (level, text); ggml levels: 2 info, 3 warn, 4 error, 5 cont."""
    from llama_cpp import _logger

    lines: list[tuple[int, str]] = []

    @llama_cpp.llama_log_callback
    def cb(level, text, user_data):
        lines.append((level, text.decode("utf-8", "replace")))

    llama_cpp.llama_log_set(cb, ctypes.c_void_p(0))
    try:
        yield lines
    finally:
        llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))


@contextlib.contextmanager
def load(path: Path, **params):
    mp = llama_cpp.llama_model_default_params()
    for k, v in params.items():
        setattr(mp, k, v)
    with llama_logs():
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), mp)
    assert model, f"llama.cpp could not load {path}"
    try:
        yield model
    finally:
        llama_cpp.llama_model_free(model)


@contextlib.contextmanager
def context(model, n_ctx: int = 512, **params):
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = cp.n_batch = cp.n_ubatch = n_ctx
    cp.n_threads = cp.n_threads_batch = 1  # tiny graphs: a second thread only adds contention
    for k, v in params.items():
        setattr(cp, k, v)
    with llama_logs():
        ctx = llama_cpp.llama_init_from_model(model, cp)
    assert ctx
    try:
        yield ctx
    finally:
        llama_cpp.llama_free(ctx)


def vocab_of(model):
    return llama_cpp.llama_model_get_vocab(model)


def tokenize(model, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
    data = text.encode()
    buf = (llama_cpp.llama_token * (len(data) + 8))()
    n = llama_cpp.llama_tokenize(vocab_of(model), data, len(data), buf, len(buf), add_special, parse_special)
    assert n >= 0
    return list(buf[:n])


def detokenize(model, tokens: list[int], remove_special: bool = True) -> str:
    arr = (llama_cpp.llama_token * len(tokens))(*tokens)
    buf = ctypes.create_string_buffer(64 * len(tokens) + 64)
    n = llama_cpp.llama_detokenize(vocab_of(model), arr, len(tokens), buf, len(buf), remove_special, False)
    assert n >= 0
    return buf.raw[:n].decode("utf-8")


def token_texts(model) -> list[bytes]:
    v = vocab_of(model)
    return [llama_cpp.llama_vocab_get_text(v, i) for i in range(llama_cpp.llama_vocab_n_tokens(v))]


def decode(ctx, tokens: list[int], pos0: int = 0, all_logits: bool = False) -> None:
    batch = llama_cpp.llama_batch_init(len(tokens), 0, 1)
    try:
        for i, t in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, pos0 + i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = all_logits or i == len(tokens) - 1
        batch.n_tokens = len(tokens)
        assert llama_cpp.llama_decode(ctx, batch) == 0
    finally:
        llama_cpp.llama_batch_free(batch)


def logits(ctx, model, i: int) -> np.ndarray:
    n = llama_cpp.llama_vocab_n_tokens(vocab_of(model))
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(n,)).copy()


def greedy(model, prompt: list[int], n: int) -> list[int]:
    """Plain greedy decoding, one token per step; returns prompt + n tokens."""
    toks = list(prompt)
    with context(model) as ctx:
        decode(ctx, toks)
        for _ in range(n):
            toks.append(int(logits(ctx, model, -1).argmax()))
            decode(ctx, toks[-1:], len(toks) - 1)
    return toks


def argmax_each(model, tokens: list[int]) -> list[int]:
    """The model's greedy next token after every prefix, from one batch."""
    with context(model) as ctx:
        decode(ctx, tokens, all_logits=True)
        return [int(logits(ctx, model, i).argmax()) for i in range(len(tokens))]


# ---- the set ---------------------------------------------------------------------------------------


def test_set_has_every_key(tiny_models):
    expected = {"target", "draft", "other_vocab", "spm", "mtp", "target_wide"} | {f"variant_{k}" for k in tm.VARIANT_KINDS}
    assert set(tiny_models) == expected == set(tm.SET_NAMES)
    assert all(p.is_file() and p.stat().st_size < 2_000_000 for p in tiny_models.values())


def test_set_is_deterministic_and_cached(tmp_path):
    a = tm.make_tiny_set(tmp_path / "a")
    b = tm.make_tiny_set(tmp_path / "b")
    for name in a:
        assert a[name].read_bytes() == b[name].read_bytes(), f"{name} is not reproducible"
    mtimes = {n: p.stat().st_mtime_ns for n, p in a.items()}
    again = tm.make_tiny_set(tmp_path / "a")
    assert {n: p.stat().st_mtime_ns for n, p in again.items()} == mtimes  # reused, not rewritten


def test_every_tiny_model_loads_without_warnings(tiny_models):
    for name, path in tiny_models.items():
        mp = llama_cpp.llama_model_default_params()
        mp.load_mtp = name == "mtp"
        with llama_logs() as lines:
            model = llama_cpp.llama_model_load_from_file(str(path).encode(), mp)
        assert model, f"{name} did not load"
        llama_cpp.llama_model_free(model)
        bad = [text.strip() for level, text in lines if level in (3, 4) and text.strip()]
        assert not bad, f"{name}: {bad}"


@pytest.mark.parametrize("name", ["target", "draft", "other_vocab", "spm", "variant_size_129"])
@pytest.mark.parametrize("text", [ENGLISH, PYTHON], ids=["english", "python"])
def test_tokenize_detokenize_round_trip(tiny_models, name, text):
    with load(tiny_models[name], vocab_only=True) as model:
        # SPM: llama.cpp keeps the space-prefix when BOS is stripped; without specials it is exact.
        add_special = name != "spm"
        toks = tokenize(model, text, add_special=add_special)
        assert len(toks) < len(text.encode()) * 0.8, "merges should compress real text"
        assert detokenize(model, toks) == text


def test_bpe_vocab_specials_and_chat_template(tiny_models):
    with load(tiny_models["target"], vocab_only=True) as model:
        v = vocab_of(model)
        assert llama_cpp.llama_vocab_type(v) == llama_cpp.LLAMA_VOCAB_TYPE_BPE
        assert (llama_cpp.llama_vocab_bos(v), llama_cpp.llama_vocab_eos(v)) == (0, 2)
        assert llama_cpp.llama_vocab_get_add_bos(v) and not llama_cpp.llama_vocab_get_add_eos(v)
        assert llama_cpp.llama_vocab_is_eog(v, 2) and llama_cpp.llama_vocab_is_control(v, 1)
        assert tokenize(model, "<|im_start|>user", add_special=False)[0] == 1
        tmpl = llama_cpp.llama_model_chat_template(model, None)
        assert tmpl and b"<|im_start|>" in tmpl
        msgs = (llama_cpp.llama_chat_message * 1)(llama_cpp.llama_chat_message(role=b"user", content=b"Hi"))
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_chat_apply_template(tmpl, msgs, 1, True, buf, len(buf))
        assert buf.raw[:n] == b"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_high_level_llama_class_runs_the_target(tiny_models):
    llm = llama_cpp.Llama(model_path=str(tiny_models["target"]), n_ctx=256, n_threads=1, verbose=False)
    try:
        out = llm.create_completion("The quick brown fox", max_tokens=16, temperature=0)
        assert out["usage"]["completion_tokens"] == 16 and out["choices"][0]["finish_reason"] == "length"
        chat = llm.create_chat_completion([{"role": "user", "content": "Hello"}], max_tokens=8, temperature=0)
        assert chat["usage"]["completion_tokens"] == 8
    finally:
        llm.close()


def test_spm_vocab(tiny_models):
    with load(tiny_models["spm"], vocab_only=True) as model:
        v = vocab_of(model)
        assert llama_cpp.llama_vocab_type(v) == llama_cpp.LLAMA_VOCAB_TYPE_SPM
        assert (llama_cpp.llama_vocab_bos(v), llama_cpp.llama_vocab_eos(v)) == (1, 2)
        assert token_texts(model)[3 + 0x0A] == b"<0x0A>"
        assert 3 + 0x0A in tokenize(model, "a\nb")  # newline goes through byte fallback


def test_target_and_draft_share_the_vocabulary(tiny_models):
    with load(tiny_models["target"], vocab_only=True) as t, load(tiny_models["draft"], vocab_only=True) as d:
        assert token_texts(t) == token_texts(d)
        for f in (llama_cpp.llama_vocab_bos, llama_cpp.llama_vocab_eos, llama_cpp.llama_vocab_get_add_bos,
                  llama_cpp.llama_vocab_type):
            assert f(vocab_of(t)) == f(vocab_of(d))
    with load(tiny_models["target"]) as t, load(tiny_models["draft"]) as d:
        assert (llama_cpp.llama_model_n_layer(t), llama_cpp.llama_model_n_layer(d)) == (4, 1)
        assert llama_cpp.llama_model_n_embd(t) == llama_cpp.llama_model_n_embd(d) == 64


def test_other_vocab_differs_in_token_texts(tiny_models):
    with load(tiny_models["target"], vocab_only=True) as t, load(tiny_models["other_vocab"], vocab_only=True) as o:
        a, b = token_texts(t), token_texts(o)
        assert llama_cpp.llama_vocab_type(vocab_of(t)) == llama_cpp.llama_vocab_type(vocab_of(o))
        assert abs(len(a) - len(b)) <= 128
        assert a[:261] == b[:261] and a[261:] != b[261:]


def test_greedy_output_is_not_degenerate(tiny_models):
    with load(tiny_models["target"]) as model:
        for prompt in PROMPTS:
            p = tokenize(model, prompt)
            out = greedy(model, p, 40)[len(p):]
            assert len(set(out)) >= 5, (prompt, out)
            assert len(set(out[-10:])) >= 2, (prompt, out)  # not one token forever
            assert not set(out) & {0, 1, 2, 3, 4}, "control tokens are suppressed on random weights"


def draft_target_agreement(tiny_models, n: int = 48) -> float:
    """Fraction of target-greedy positions where the draft's greedy token is the same."""
    agree = total = 0
    with load(tiny_models["target"]) as target, load(tiny_models["draft"]) as draft:
        for prompt in PROMPTS:
            p = tokenize(target, prompt)
            seq = greedy(target, p, n)
            guess = argmax_each(draft, seq)
            agree += sum(guess[i] == seq[i + 1] for i in range(len(p) - 1, len(seq) - 1))
            total += len(seq) - len(p)
    return agree / total


def test_draft_agrees_with_target_most_of_the_time(tiny_models):
    rate = draft_target_agreement(tiny_models)
    assert 0.6 <= rate <= 0.95, f"greedy draft/target agreement {rate:.1%}"


# ---- variants ------------------------------------------------------------------------------------


def _gguf_fields(path: Path) -> dict:
    import gguf

    r = gguf.GGUFReader(str(path))

    def val(key):
        f = r.fields.get(key)
        return None if f is None else f.contents()

    return {
        "model": val("tokenizer.ggml.model"),
        "bos": val("tokenizer.ggml.bos_token_id"),
        "eos": val("tokenizer.ggml.eos_token_id"),
        "add_bos": val("tokenizer.ggml.add_bos_token"),
        "add_eos": val("tokenizer.ggml.add_eos_token"),
        "tokens": val("tokenizer.ggml.tokens"),
    }


def _changed(base: dict, other: dict) -> set[str]:
    changed = {k for k in ("model", "bos", "eos", "add_bos", "add_eos") if base[k] != other[k]}
    n = min(len(base["tokens"]), len(other["tokens"]))
    if len(base["tokens"]) != len(other["tokens"]):
        changed.add(f"size{len(other['tokens']) - len(base['tokens']):+d}")
    changed |= {f"text@{i}" for i in range(n) if base["tokens"][i] != other["tokens"][i]}
    return changed


EXPECTED_CHANGE = {
    "vocab_type": {"model"},
    "add_bos": {"add_bos"},
    "bos_id": {"bos"},
    "eos_id": {"eos"},
    "add_eos": {"add_eos"},
    "size_129": {"size+129"},
    "size_128": {"size+128"},
    "token_text": {f"text@{tm.VARIANT_TOKEN_ID}"},
    "low_token_text": {f"text@{tm.VARIANT_LOW_TOKEN_ID}"},
}


@pytest.mark.parametrize("kind", tm.VARIANT_KINDS)
def test_variant_changes_exactly_one_thing(tiny_models, kind):
    base = _gguf_fields(tiny_models["draft"])
    assert _changed(base, _gguf_fields(tiny_models[f"variant_{kind}"])) == EXPECTED_CHANGE[kind]


def llama_cpp_compatible(target, draft) -> bool:
    """common_speculative_are_compatible, re-done with the vocab API."""
    vt, vd = vocab_of(target), vocab_of(draft)
    L = llama_cpp
    if L.llama_vocab_type(vt) != L.llama_vocab_type(vd):
        return False
    for add, tok in ((L.llama_vocab_get_add_bos, L.llama_vocab_bos), (L.llama_vocab_get_add_eos, L.llama_vocab_eos)):
        if add(vt) != add(vd) or (add(vt) and tok(vt) != tok(vd)):
            return False
    nt, nd = L.llama_vocab_n_tokens(vt), L.llama_vocab_n_tokens(vd)
    if abs(nt - nd) > 128:
        return False
    return all(L.llama_vocab_get_text(vt, i) == L.llama_vocab_get_text(vd, i) for i in range(5, min(nt, nd)))


@pytest.mark.parametrize("kind", tm.VARIANT_KINDS)
def test_variant_compatibility_as_llama_cpp_sees_it(tiny_models, kind):
    with load(tiny_models["target"], vocab_only=True) as t, \
            load(tiny_models[f"variant_{kind}"], vocab_only=True) as d:
        assert llama_cpp_compatible(t, d) is tm.VARIANT_COMPATIBLE[kind]


def test_draft_other_vocab_and_spm_compatibility(tiny_models):
    with load(tiny_models["target"], vocab_only=True) as t:
        for name, ok in (("draft", True), ("other_vocab", False), ("spm", False), ("mtp", True)):
            with load(tiny_models[name], vocab_only=True) as d:
                assert llama_cpp_compatible(t, d) is ok, name


def test_variant_vocab_type_tokenizes_without_crashing(tiny_models):
    with load(tiny_models["variant_vocab_type"], vocab_only=True) as model:
        assert llama_cpp.llama_vocab_type(vocab_of(model)) == llama_cpp.LLAMA_VOCAB_TYPE_WPM
        assert tokenize(model, ENGLISH)


def test_write_llama_model_custom(tmp_path):
    path = tm.write_llama_model(tmp_path / "x.gguf", n_layer=2, vocab=tm.bpe_vocab(), seed=7, n_embd=32,
                                n_head=2, n_head_kv=1, n_ff=48, dtype="f16", suppress_control=False)
    with load(path) as model:
        assert llama_cpp.llama_model_n_layer(model) == 2
        assert llama_cpp.llama_model_n_embd(model) == 32
        prompt = tokenize(model, "Hi")
        assert len(greedy(model, prompt, 3)) == len(prompt) + 3


# ---- MTP -----------------------------------------------------------------------------------------


def test_mtp_model_drafts_what_the_target_decodes(tiny_models):
    """Load with load_mtp, run the target with nextn embeddings, then one MTP batch: the MTP head
    fed (token at p, target nextn embedding at p-1) should predict token p+1 of greedy decoding."""
    from llama_cpp import llama_cpp_ext as ext

    assert "load_mtp" in dict(llama_cpp.llama_model_params._fields_)
    with load(tiny_models["mtp"], load_mtp=True) as model:
        assert llama_cpp.llama_model_n_layer(model) == 2
        assert llama_cpp.llama_model_n_layer_nextn(model) == 1
        n_embd = llama_cpp.llama_model_n_embd(model)
        prompt = tokenize(model, "The quick brown fox")
        seq, hidden = list(prompt), []
        with context(model) as tgt:
            ext.llama_set_embeddings_nextn(tgt, True, False)
            decode(tgt, seq)
            hidden += list(np.ctypeslib.as_array(ext.llama_get_embeddings_nextn(tgt), shape=(len(seq), n_embd)))
            for _ in range(30):
                seq.append(int(logits(tgt, model, -1).argmax()))
                decode(tgt, seq[-1:], len(seq) - 1)
                hidden.append(np.ctypeslib.as_array(ext.llama_get_embeddings_nextn(tgt), shape=(1, n_embd))[0].copy())
            with context(model, ctx_type=llama_cpp.LLAMA_CONTEXT_TYPE_MTP, ctx_other=tgt) as mtp:
                ext.llama_set_embeddings_nextn(mtp, True, True)
                n = len(seq)
                batch = llama_cpp.llama_batch_init(n, n_embd, 1)
                ids = (llama_cpp.llama_token * n)(*seq)
                batch.token = ids  # llama_batch_init with embd leaves token NULL
                try:
                    emb = np.ctypeslib.as_array(batch.embd, shape=(n, n_embd))
                    for p in range(n):
                        batch.pos[p], batch.n_seq_id[p], batch.logits[p] = p, 1, 1
                        batch.seq_id[p][0] = 0
                        emb[p] = hidden[p - 1] if p else 0.0
                    batch.n_tokens = n
                    assert llama_cpp.llama_decode(mtp, batch) == 0
                    hits = [int(logits(mtp, model, p).argmax()) == seq[p + 1] for p in range(len(prompt) - 1, n - 1)]
                finally:
                    batch.token = ctypes.POINTER(llama_cpp.llama_token)()
                    llama_cpp.llama_batch_free(batch)
    assert sum(hits) / len(hits) >= 0.7, hits  # measured 28/30


# ---- real models ---------------------------------------------------------------------------------


@pytest.mark.real
@pytest.mark.parametrize("fixture,n_vocab,vocab_type", [
    ("smollm2_q4", 49152, "BPE"), ("smollm2_f16", 49152, "BPE"),
    ("gemma_q4", 262144, "SPM"), ("gemma_f16", 262144, "SPM"),
])
def test_real_model_fixture_loads(request, fixture, n_vocab, vocab_type):
    path = request.getfixturevalue(fixture)
    with load(path) as model:
        v = vocab_of(model)
        assert llama_cpp.llama_vocab_n_tokens(v) == n_vocab
        assert llama_cpp.llama_vocab_type(v) == getattr(llama_cpp, f"LLAMA_VOCAB_TYPE_{vocab_type}")
        desc = ctypes.create_string_buffer(128)
        llama_cpp.llama_model_desc(model, desc, len(desc))
        assert (b"F16" in desc.value) == fixture.endswith("f16"), desc.value


@pytest.mark.real
def test_real_f16_copies_keep_the_vocabulary(smollm2_q4, smollm2_f16):
    with load(smollm2_q4, vocab_only=True) as q, load(smollm2_f16, vocab_only=True) as f:
        assert token_texts(q) == token_texts(f)
        assert llama_cpp_compatible(f, q)


def test_run_cli_fixture(run_cli):
    result = run_cli("--version")
    assert result.exit_code == 0 and "llamaspec" in result.stdout
