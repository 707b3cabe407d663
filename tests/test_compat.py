"""Vocabulary compatibility: llama.cpp's rules (common_speculative_are_compatible) from headers alone.

Three layers: the rules on hand-made VocabInfo values; the resolution of a GGUF header into
what llama.cpp sees, cross-checked against llama.cpp itself (vocab_only loads); and the real
and tiny model files.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from llamaspec.pairing import compat
from llamaspec.pairing.compat import check_files, compare_vocabs
from llamaspec.gguf.header import GGUFHeader, read_file
from llamaspec.testing.tiny_models import VARIANT_COMPATIBLE, VARIANT_KINDS, bpe_vocab, spm_vocab
from llamaspec.gguf.vocab import VocabInfo, vocab_fingerprint, vocab_from_header

# ---- the rules on VocabInfo values -------------------------------------------------------------

TOKENS = tuple(f"t{i}" for i in range(300))


def vi(**kw) -> VocabInfo:
    base = dict(model="gpt2", vocab_type="BPE", pre="x", tokens=TOKENS, bos_id=1, eos_id=2, add_bos=True,
                add_eos=False)
    base.update(kw)
    return VocabInfo(**base)


def verdict(t: VocabInfo, d: VocabInfo):
    rules, first = compare_vocabs(t, d)
    return compat.Verdict(rules, first)


def test_identical_vocabularies_pass_every_rule():
    v = verdict(vi(), vi())
    assert v.compatible and v.failed_rule is None and v.first_diff is None
    assert [r.rule for r in v.rules] == list(compat.RULES)
    assert all(r.passed for r in v.rules)


def test_vocab_type_rule():
    v = verdict(vi(), vi(vocab_type="SPM", model="llama"))
    assert not v.compatible and v.failed_rule == "vocab_type"
    assert "BPE" in v.reason and "SPM" in v.reason


def test_bos_rule_compares_flag_and_id_only_when_added():
    assert verdict(vi(), vi(add_bos=False)).failed_rule == "bos"
    v = verdict(vi(), vi(bos_id=3))
    assert v.failed_rule == "bos" and "id differs" in v.rule("bos").detail
    # BOS not added on either side: llama.cpp does not compare the ids.
    assert verdict(vi(add_bos=False, bos_id=1), vi(add_bos=False, bos_id=7)).compatible


def test_eos_rule_compares_flag_and_id_only_when_added():
    assert verdict(vi(), vi(add_eos=True)).failed_rule == "eos"
    assert verdict(vi(), vi(eos_id=9)).compatible  # add_eos false on both: ids not compared
    assert verdict(vi(add_eos=True), vi(add_eos=True, eos_id=9)).failed_rule == "eos"


def test_size_rule_allows_exactly_128():
    assert verdict(vi(), vi(tokens=TOKENS + tuple(f"x{i}" for i in range(128)))).compatible
    v = verdict(vi(), vi(tokens=TOKENS + tuple(f"x{i}" for i in range(129))))
    assert v.failed_rule == "vocab_size" and "129 > 128" in v.rule("vocab_size").detail


def test_token_text_rule_starts_at_id_5_and_names_the_first_difference():
    low = list(TOKENS)
    low[4] = "changed"
    assert verdict(vi(), vi(tokens=tuple(low))).compatible  # ids 0-4 are not compared
    two = list(TOKENS)
    two[5], two[200] = "five", "two hundred"
    v = verdict(vi(), vi(tokens=tuple(two)))
    assert v.failed_rule == "token_text"
    assert v.first_diff == compat.TokenDiff(5, "t5", "five")
    assert "token 5" in v.reason and "'t5'" in v.reason and "'five'" in v.reason


def test_token_text_is_compared_like_strcmp():
    a, b = list(TOKENS), list(TOKENS)
    a[10], b[10] = "same\x00tail-a", "same\x00tail-b"  # strcmp stops at the NUL byte
    assert verdict(vi(tokens=tuple(a)), vi(tokens=tuple(b))).compatible


def test_every_rule_is_evaluated_and_the_first_failure_leads():
    v = verdict(vi(), vi(vocab_type="SPM", add_bos=False, tokens=TOKENS[:100]))
    assert [r.rule for r in v.failed] == ["vocab_type", "bos", "vocab_size"]
    assert v.failed_rule == "vocab_type" and "2 more rules failed" in v.reason
    d = v.to_dict()
    assert d["compatible"] is False and d["failed_rule"] == "vocab_type" and len(d["rules"]) == 5


def test_arch_family():
    assert compat.arch_family("qwen3moe") == compat.arch_family("qwen3") == "qwen3"
    assert compat.arch_family("qwen3vlmoe") == "qwen3"
    assert compat.arch_family("granitehybrid") == "granite"
    assert compat.arch_family("gemma3") != compat.arch_family("gemma2")


# ---- resolving a header as llama.cpp does ------------------------------------------------------


def header(meta: dict) -> GGUFHeader:
    return GGUFHeader(3, {"general.architecture": "llama", **meta}, [], 0, "<test>")


def test_defaults_and_out_of_range_special_ids():
    toks = [f"t{i}" for i in range(20)]
    v = vocab_from_header(header({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": toks}))
    assert (v.vocab_type, v.bos_id, v.eos_id, v.add_bos) == ("BPE", 11, 11, False)
    # A file id beyond the vocabulary is ignored: the default stays.
    v = vocab_from_header(header({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": toks,
                                  "tokenizer.ggml.bos_token_id": 5000}))
    assert v.bos_id == 11
    # A default id beyond the vocabulary is disabled.
    v = vocab_from_header(header({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": toks[:8]}))
    assert v.bos_id is None and v.eos_id is None


def test_pre_tokenizer_defaults():
    toks = [f"t{i}" for i in range(20)]
    base = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": toks}
    assert vocab_from_header(header({**base, "tokenizer.ggml.pre": "llama-bpe"})).add_bos is True
    assert vocab_from_header(header({**base, "tokenizer.ggml.pre": "glm4"})).bos_id is None
    v = vocab_from_header(header({**base, "tokenizer.ggml.model": "gemma4", "tokenizer.ggml.add_bos_token": False}))
    assert v.add_bos is True and v.pre == "gemma4"  # llama.cpp forces BOS on for Gemma 4
    spm = vocab_from_header(header({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": toks}))
    assert (spm.vocab_type, spm.add_bos, spm.bos_id, spm.eos_id) == ("SPM", True, 1, 2)


def test_empty_token_texts_are_renamed():
    toks = ["a", "b", "", "c"]
    v = vocab_from_header(header({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": toks}))
    assert v.tokens == ("a", "b", "[EMPTY_2]", "c")


def test_fingerprint_is_the_documented_hash():
    toks = ("<s>", "hello", "wörld")
    h = hashlib.sha256(b"BPE")
    for t in toks:
        h.update(b"\x00" + t.encode())
    assert vocab_fingerprint("BPE", toks) == h.hexdigest()[:16]
    assert vocab_fingerprint("SPM", toks) != vocab_fingerprint("BPE", toks)


# The same resolution, checked against llama.cpp's own loader on purpose-made GGUFs.

def _write_vocab_gguf(path: Path, model: str, tokens, types, merges=None, scores=None, pre=None, kv=None) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model(model)
    if pre:
        w.add_tokenizer_pre(pre)
    w.add_token_list(list(tokens))
    w.add_token_types(list(types))
    if scores is not None:
        w.add_token_scores(list(scores))
    if merges is not None:
        w.add_token_merges(list(merges))
    for key, (kind, value) in (kv or {}).items():
        getattr(w, "add_" + kind)(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _edge_cases() -> dict[str, dict]:
    b, s = bpe_vocab(), spm_vocab()
    bpe = dict(model="gpt2", tokens=b.tokens, types=b.types, merges=b.merges)
    return {
        "gpt2-no-special-ids": dict(bpe, pre="smollm"),
        "gpt2-bos-out-of-range": dict(bpe, pre="smollm", kv={"tokenizer.ggml.bos_token_id": ("uint32", 99999)}),
        "gpt2-empty-token": dict(bpe, pre="smollm", tokens=b.tokens[:7] + ("",) + b.tokens[8:]),
        "glm4-pre": dict(bpe, pre="glm4"),
        "llama-bpe-pre": dict(bpe, pre="llama-bpe"),
        "spm-defaults": dict(model="llama", tokens=s.tokens, types=s.types, scores=s.scores),
        "spm-flags-from-file": dict(model="llama", tokens=s.tokens, types=s.types, scores=s.scores,
                                    kv={"tokenizer.ggml.add_bos_token": ("bool", False),
                                        "tokenizer.ggml.add_eos_token": ("bool", True)}),
        "gemma4-forces-bos": dict(bpe, model="gemma4", kv={"tokenizer.ggml.add_bos_token": ("bool", False),
                                                           "tokenizer.ggml.bos_token_id": ("uint32", 0)}),
        "default-ids-out-of-range": dict(bpe, pre="smollm", tokens=b.tokens[:10], types=b.types[:10],
                                         merges=b.merges[:1]),
    }


_VOCAB_TYPE_IDS = {"NONE": 0, "SPM": 1, "BPE": 2, "WPM": 3, "UGM": 4, "RWKV": 5, "PLAMO2": 6}


def _llama_cpp_view(path: Path) -> dict:
    """What llama.cpp itself reports for the vocabulary (vocab_only load: no weights)."""
    import llama_cpp as L

    params = L.llama_model_default_params()
    params.vocab_only = True
    model = L.llama_model_load_from_file(str(path).encode(), params)
    assert model, f"llama.cpp could not load {path}"
    try:
        v = L.llama_model_get_vocab(model)
        n = L.llama_vocab_n_tokens(v)
        return {"type": L.llama_vocab_type(v), "add_bos": bool(L.llama_vocab_get_add_bos(v)),
                "bos": L.llama_vocab_bos(v), "add_eos": bool(L.llama_vocab_get_add_eos(v)),
                "eos": L.llama_vocab_eos(v), "n": n,
                "texts": tuple(L.llama_vocab_get_text(v, i).decode("utf-8", "surrogateescape") for i in range(n))}
    finally:
        L.llama_model_free(model)


def _our_view(path: Path) -> dict:
    v = vocab_from_header(read_file(path))
    return {"type": _VOCAB_TYPE_IDS[v.vocab_type], "add_bos": v.add_bos, "bos": -1 if v.bos_id is None else v.bos_id,
            "add_eos": v.add_eos, "eos": -1 if v.eos_id is None else v.eos_id, "n": v.n_vocab, "texts": v.tokens}


@pytest.fixture(scope="module")
def llama_cpp_lib():
    import llama_cpp as L

    L.llama_backend_init()
    return L


@pytest.mark.parametrize("case", list(_edge_cases()))
def test_resolution_matches_llama_cpp_on_edge_cases(case, tmp_path, llama_cpp_lib):
    path = _write_vocab_gguf(tmp_path / f"{case}.gguf", **_edge_cases()[case])
    assert _our_view(path) == _llama_cpp_view(path)


def test_resolution_matches_llama_cpp_on_the_tiny_set(tiny_models, llama_cpp_lib):
    for name, path in tiny_models.items():
        assert _our_view(path) == _llama_cpp_view(path), name


# ---- tiny generated pairs: each rule broken in turn --------------------------------------------

_VARIANT_RULE = {"vocab_type": "vocab_type", "add_bos": "bos", "bos_id": "bos", "add_eos": "eos",
                 "size_129": "vocab_size", "token_text": "token_text"}


@pytest.mark.parametrize("kind", VARIANT_KINDS)
def test_each_variant_is_judged_like_llama_cpp(kind, tiny_models):
    v = check_files(tiny_models["target"], tiny_models[f"variant_{kind}"])
    assert v.compatible is VARIANT_COMPATIBLE[kind], v.reason
    if not v.compatible:
        assert v.failed_rule == _VARIANT_RULE[kind]
        assert [r.rule for r in v.failed] == [_VARIANT_RULE[kind]]  # exactly one rule broken


def test_variant_details(tiny_models):
    from llamaspec.testing.tiny_models import VARIANT_TOKEN_ID

    v = check_files(tiny_models["target"], tiny_models["variant_token_text"])
    assert v.first_diff.id == VARIANT_TOKEN_ID
    assert v.first_diff.draft_text == f"<|changed_{VARIANT_TOKEN_ID}|>"
    assert v.first_diff.target_text == bpe_vocab().tokens[VARIANT_TOKEN_ID]
    assert check_files(tiny_models["target"], tiny_models["variant_size_128"]).rule("vocab_size").passed
    assert check_files(tiny_models["target"], tiny_models["draft"]).compatible
    other = check_files(tiny_models["target"], tiny_models["other_vocab"])
    assert other.failed_rule in ("vocab_size", "token_text") and other.first_diff is not None
    spm = check_files(tiny_models["target"], tiny_models["spm"])
    assert spm.failed_rule == "vocab_type"


def test_soft_facts(tiny_models):
    v = check_files(tiny_models["target"], tiny_models["draft"])
    assert v.facts["same_family"] and v.facts["chat_template_equal"]
    assert 0 < v.facts["size_ratio"] < 1 and 0 < v.facts["params_ratio"] < 1


# ---- real models -------------------------------------------------------------------------------


@pytest.mark.real
def test_smollm2_q4_and_f16_are_compatible(smollm2_q4, smollm2_f16):
    v = check_files(smollm2_f16, smollm2_q4)
    assert v.compatible, v.reason
    assert v.target["fingerprint"] == v.draft["fingerprint"] == "11a3a959fb7b5dad"
    assert v.target["n_vocab"] == 49152 and v.facts["same_architecture"]
    assert v.facts["size_ratio"] < 0.5  # Q4_1 is well under half the F16's bytes


@pytest.mark.real
def test_smollm2_vs_gemma3_is_incompatible_naming_the_rule(smollm2_q4, gemma_q4):
    v = check_files(smollm2_q4, gemma_q4)
    assert not v.compatible
    assert v.failed_rule == "vocab_type"
    assert v.rule("vocab_type").target == "BPE" and v.rule("vocab_type").draft == "SPM"
    assert not v.rule("vocab_size").passed
    assert "vocabulary type differs" in v.reason


@pytest.mark.real
def test_gemma3_q4_and_f16_are_compatible(gemma_q4, gemma_f16):
    # (no time bound here: timed unit tests flake on shared machines; speed belongs to benchmarks)
    v = check_files(gemma_f16, gemma_q4)
    assert v.compatible and v.target["n_vocab"] == 262144
    assert v.draft["fingerprint"] == "7577dba02593a84d"


@pytest.mark.real
def test_real_resolution_matches_llama_cpp(smollm2_q4, gemma_q4, llama_cpp_lib):
    for path in (smollm2_q4, gemma_q4):
        assert _our_view(path) == _llama_cpp_view(path), path
