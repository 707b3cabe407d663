"""The AMX crash policy (llamaspec/cpu_policy.py): llama.cpp issue 20824 segfaults quantized models
in its AMX weight buffer, so on AMX CPUs models load without it, keeping CPU_REPACK by overrides.

No AMX hardware needed: the decision is tested on simulated facts, and the load path on this
machine under LLAMASPEC_ASSUME_AMX=1 (the same load an AMX CPU gets).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from llamaspec.runtime import cpu as cpu_policy

from llamaspec.runtime import info as runtime_info
from llamaspec.runtime.cpu import AMX_ISSUE_URL, BufferDecision, CpuFacts, decide

AMX = CpuFacts(frozenset({"avx512f", "amx_int8", "amx_tile", "amx_bf16"}),
               frozenset({"AVX2", "AVX512", "AMX_INT8", "REPACK"}), ("AMX", "CPU_REPACK"))
NO_AMX = CpuFacts(frozenset({"avx2", "avx512f"}), frozenset({"AVX2", "AVX512", "REPACK"}), ("CPU_REPACK",))
REAL_CPU_FACTS = runtime_info.cpu_facts  # before any test patches it
AVOID_LINE = "CPU has AMX: loading without the AMX weight buffer (llama.cpp issue 20824); --amx to use it"


# ---- the decision (pure) -----------------------------------------------------------------------


def test_no_amx_keeps_llama_cpp_defaults():
    d = decide(NO_AMX)
    assert d.use_extra_bufts and d.keep_repack and not d.avoid_amx and not d.amx
    assert not d.repack_overrides and d.extra_bufts == ("CPU_REPACK",) and d.choice == "default"
    assert "no AMX" in d.reason


def test_amx_loads_without_the_amx_buffer_and_keeps_repack():
    d = decide(AMX)
    assert not d.use_extra_bufts and d.avoid_amx and d.amx
    assert d.keep_repack and d.repack_overrides and d.extra_bufts == ("CPU_REPACK",)
    assert d.reason.startswith(AVOID_LINE)
    assert d.to_dict()["issue"] == AMX_ISSUE_URL


def test_amx_without_a_repack_buffer_turns_all_extra_buffers_off():
    d = decide(CpuFacts(AMX.cpu_flags, AMX.ggml_features, ("AMX",)))
    assert not d.use_extra_bufts and not d.keep_repack and not d.repack_overrides and d.extra_bufts == ()


@pytest.mark.parametrize("flag, env, choice", [
    (True, {}, "--amx"),
    (None, {"LLAMASPEC_AMX": "1"}, "LLAMASPEC_AMX=1"),
    (None, {"LLAMASPEC_AMX": "yes"}, "LLAMASPEC_AMX=1"),
    (True, {"LLAMASPEC_AMX": "0"}, "--amx"),           # the flag wins over the environment
])
def test_opt_in_uses_the_amx_buffer(flag, env, choice):
    d = decide(AMX, flag=flag, env=env)
    assert d.use_extra_bufts and not d.avoid_amx and d.amx and d.choice == choice
    assert d.extra_bufts == ("AMX", "CPU_REPACK") and AMX_ISSUE_URL in d.reason


@pytest.mark.parametrize("flag, env, choice", [
    (False, {"LLAMASPEC_AMX": "1"}, "--no-amx"),
    (None, {"LLAMASPEC_AMX": "0"}, "LLAMASPEC_AMX=0"),
    (None, {"LLAMASPEC_AMX": "maybe"}, "default"),
])
def test_opt_out_and_unreadable_env_avoid_amx(flag, env, choice):
    d = decide(AMX, flag=flag, env=env)
    assert not d.use_extra_bufts and d.avoid_amx and d.choice == choice
    assert ("not understood" in d.reason) == (env.get("LLAMASPEC_AMX") == "maybe")


def test_amx_flags_without_the_amx_buffer_change_nothing():
    # A CPU with AMX but a ggml built without it (e.g. a generic wheel): no AMX buffer type exists.
    d = decide(CpuFacts(AMX.cpu_flags, NO_AMX.ggml_features, ("CPU_REPACK",)), flag=True)
    assert d.use_extra_bufts and not d.avoid_amx and "--amx changes nothing" in d.reason


def test_unknown_buffer_types_fall_back_on_the_cpu_and_build_flags():
    unknown = CpuFacts(AMX.cpu_flags, frozenset(), None)
    d = decide(unknown)
    assert not d.use_extra_bufts and d.avoid_amx and not d.keep_repack and "unknown" in d.reason
    assert decide(CpuFacts(frozenset({"avx2"}), frozenset({"AMX_INT8"}), None)).avoid_amx
    assert not decide(CpuFacts(frozenset({"avx2"}), frozenset({"AVX2"}), None)).avoid_amx


def test_assume_amx_simulates_the_amx_decision():
    d = decide(NO_AMX, env={"LLAMASPEC_ASSUME_AMX": "1"})
    assert not d.use_extra_bufts and d.repack_overrides and d.avoid_amx
    assert d.reason.startswith("LLAMASPEC_ASSUME_AMX=1 (assumed): " + AVOID_LINE)
    assert decide(NO_AMX, flag=True, env={"LLAMASPEC_ASSUME_AMX": "1"}).use_extra_bufts


def test_env_flag():
    assert [cpu_policy.env_flag(v) for v in ("1", " TRUE ", "on", "0", "off", "No", "", "2", None)] == \
        [True, True, True, False, False, False, None, None, None]


# ---- which weights are routed to CPU_REPACK (pure) ---------------------------------------------


def test_matmul_weights_by_name():
    yes = ["blk.0.attn_q.weight", "blk.12.ffn_down.weight", "blk.3.attn_output.weight", "output.weight",
           "blk.4.ffn_up_shexp.weight", "blk.5.nextn.eh_proj.weight"]
    no = ["token_embd.weight", "blk.0.attn_norm.weight", "blk.0.ffn_down_exps.weight", "blk.0.attn_q.bias",
          "output_norm.weight", "blk.x.attn_q.weight"]
    assert all(cpu_policy.is_matmul_weight(n) for n in yes)
    assert not any(cpu_policy.is_matmul_weight(n) for n in no)


def test_override_patterns_match_exactly_the_names():
    names = ["blk.1.ffn_down.weight", "blk.2.ffn_down.weight", "blk.1.attn_output.weight", "output.weight",
             "blk.5.nextn.eh_proj.weight"]
    pats = cpu_policy.override_patterns(names)
    assert len(pats) == 4  # one per kind
    others = ["blk.11.ffn_down.weight", "blk.21.ffn_down.weight", "blk.1.ffn_down.bias", "blk.1.ffn_down_exps.weight",
              "xblk.1.ffn_down.weight", "output_norm.weight", "token_embd.weight", "blk.5.nextnXeh_proj.weight"]
    # llama.cpp applies them with std::regex_search (ECMAScript); these patterns mean the same in Python.
    def hit(n):
        return any(re.search(p, n) for p in pats)
    assert all(hit(n) for n in names) and not any(hit(n) for n in others)


# ---- detection and ggml's own repack check (this machine) ---------------------------------------


def test_cpu_flags_from_cpuinfo(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text("processor\t: 0\nflags\t\t: fpu avx2 amx_tile amx_int8\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert runtime_info.cpu_flags(f) == {"fpu", "avx2", "amx_tile", "amx_int8"}
    assert runtime_info.cpu_flags(tmp_path / "missing") == frozenset()


def test_facts_of_this_build_agree_with_llama_cpp():
    import llama_cpp

    facts = runtime_info.cpu_facts()
    assert facts.extra_bufts is not None  # ggml's registry was read
    info = llama_cpp.llama_print_system_info().decode()
    assert ("AMX_INT8 = 1" in info) == facts.build_amx
    assert ("REPACK = 1" in info) == ("CPU_REPACK" in facts.extra_bufts)
    assert not facts.amx_buffer or facts.build_amx


def test_repack_check_asks_ggml():
    facts = runtime_info.cpu_facts()
    if "CPU_REPACK" not in (facts.extra_bufts or ()) or "AVX2" not in facts.ggml_features:
        pytest.skip("needs an x86 build with CPU_REPACK and AVX2")
    q4_k, q4_1, f32 = 12, 3, 0
    assert runtime_info.repack_supported(q4_k, 1024, 640)
    assert not runtime_info.repack_supported(q4_k, 1024, 644)   # rows must come in 8s
    assert not runtime_info.repack_supported(q4_1, 1024, 640)   # no Q4_1 kernels in CPU_REPACK
    assert not runtime_info.repack_supported(f32, 64, 64)
    assert not runtime_info.repack_supported(q4_k, 100, 640)    # not whole blocks: refused before ggml
    assert not runtime_info.repack_supported(999, 256, 8)       # not a ggml type


# ---- Model applies the decision -----------------------------------------------------------------


@pytest.fixture
def capture_load(monkeypatch):
    """Records llama_model_params as llama_model_load_from_file gets them."""
    import llama_cpp

    seen = []
    real = llama_cpp.llama_model_load_from_file

    def load(path, params):
        seen.append({"use_extra_bufts": bool(params.use_extra_bufts),
                     "overrides": bool(params.tensor_buft_overrides)})
        return real(path, params)

    monkeypatch.setattr(llama_cpp, "llama_model_load_from_file", load)
    return seen


@pytest.fixture
def simulated_amx(monkeypatch):
    """This machine as if it had AMX: the ggml facts say so; buffer pointers stay this build's."""
    real = REAL_CPU_FACTS()
    bufts = tuple(real.extra_bufts or ())
    fake = CpuFacts(real.cpu_flags | {"amx_int8", "amx_tile"}, real.ggml_features | {"AMX_INT8"},
                    bufts if "AMX" in bufts else ("AMX",) + bufts)
    monkeypatch.setattr(runtime_info, "cpu_facts", lambda: fake)
    monkeypatch.delenv("LLAMASPEC_AMX", raising=False)
    return fake


def test_model_load_applies_the_decision(tiny_models, capture_load, simulated_amx):
    from llamaspec.runtime.llama import Model

    m = Model(tiny_models["target"])
    try:
        assert m.buffers.decision.avoid_amx and not m.buffers.decision.use_extra_bufts
        assert capture_load[-1] == {"use_extra_bufts": False, "overrides": False}  # F32: nothing to repack
        assert m.amx is None and m.n_vocab > 0
    finally:
        m.close()
    m = Model(tiny_models["target"], amx=True)
    try:
        assert m.buffers.decision.use_extra_bufts and m.buffers.decision.choice == "--amx"
        assert capture_load[-1]["use_extra_bufts"] is True
    finally:
        m.close()


def test_without_amx_loads_are_unchanged(tiny_models, capture_load, monkeypatch):
    from llamaspec.runtime.llama import Model

    monkeypatch.setattr(runtime_info, "cpu_facts", lambda: NO_AMX)
    m = Model(tiny_models["target"])
    try:
        assert capture_load[-1] == {"use_extra_bufts": True, "overrides": False}
        assert m.buffers.decision == decide(NO_AMX)
    finally:
        m.close()


def test_draft_model_follows_the_target_choice(tiny_models, simulated_amx):
    from llamaspec.speculative.options import SpecOptions
    from llamaspec.speculative.pipeline import load_pipeline
    from llamaspec.runtime.llama import Model

    opts = SpecOptions(spec_types=["draft-simple"], draft_path=tiny_models["draft"], n_ctx=256, n_threads=1,
                       amx=False)
    pipe = load_pipeline(tiny_models["target"], opts)
    try:
        assert pipe.target.buffers.decision.choice == pipe.draft_model.buffers.decision.choice == "--no-amx"
    finally:
        pipe.close()
    target = Model(tiny_models["target"], amx=True)   # `llamaspec bench --amx`: the target is loaded first
    pipe = load_pipeline(target.path, SpecOptions(spec_types=["draft-simple"], draft_path=tiny_models["draft"],
                                                  n_ctx=256, n_threads=1), target=target)
    try:
        assert pipe.draft_model.buffers.decision.choice == "--amx"
    finally:
        pipe.close()


def _decode_rows(model, tokens):
    from llamaspec.runtime.context import Context, ContextConfig

    ctx = Context(model, ContextConfig(n_ctx=256, n_batch=64, n_threads=2))
    try:
        n = ctx.decode(tokens, 0, outputs="all")
        return np.array(ctx.logits(n))
    finally:
        ctx.close()


@pytest.mark.real
def test_overrides_repack_what_llama_cpp_repacks(gemma_q4, capture_load, simulated_amx):
    """Gemma 3 Q4_K_M: the AMX policy's overrides put the same weights in CPU_REPACK as llama.cpp's
    default does on this CPU: a multi-token decode gives bit-identical logits."""
    from llamaspec.runtime.llama import Model

    if runtime_info.repack_weights(gemma_q4) == []:
        pytest.skip("this CPU repacks none of Gemma's weights")
    m = Model(gemma_q4)
    try:
        assert capture_load[-1] == {"use_extra_bufts": False, "overrides": True}
        assert len(m.buffers.repacked) == 27 and len(m.buffers.patterns) == 2  # Q4_K attn_output, ffn_down
        tokens = m.tokenize_prompt("def fibonacci(n):\n    ")
        policy = _decode_rows(m, tokens)
    finally:
        m.close()
    if REAL_CPU_FACTS().amx_buffer:  # pragma: no cover - a real AMX CPU
        pytest.skip("llama.cpp's default load would use the AMX buffer here")
    default = Model(gemma_q4, buffers=decide(NO_AMX))
    try:
        assert capture_load[-1] == {"use_extra_bufts": True, "overrides": False}
        assert len(tokens) >= 2 and np.array_equal(policy, _decode_rows(default, tokens))
    finally:
        default.close()


@pytest.mark.real
def test_run_cli_on_smollm2_q4_under_the_amx_policy(run_cli, smollm2_q4, monkeypatch):
    """`llamaspec run` on the Q4_1 SmolLM2 (a model the AMX bug crashes), loaded as on an AMX CPU:
    the multi-token prompt decodes and greedy output equals the default load's."""
    from llamaspec.runtime.llama import set_llama_log

    common = ("run", smollm2_q4, "-p", "Name three colours.", "-n", "16", "--temp", "0", "-t", "2", "--json")
    monkeypatch.delenv("LLAMASPEC_AMX", raising=False)
    plain = run_cli(*common)
    monkeypatch.setenv("LLAMASPEC_ASSUME_AMX", "1")
    try:
        amx = run_cli(*common, "-v")
    finally:
        set_llama_log()
    assert plain.exit_code == 0 and amx.exit_code == 0, amx.stderr[-2000:]
    # on a real AMX CPU the line states the fact; elsewhere it says the AMX CPU was assumed
    assumed = "" if REAL_CPU_FACTS().amx_buffer else "LLAMASPEC_ASSUME_AMX=1 (assumed): "
    assert assumed + AVOID_LINE in amx.stderr
    assert amx.json()["n_prompt"] >= 2 and len(amx.json()["tokens"]) == 16
    assert amx.json()["tokens"] == plain.json()["tokens"]


@pytest.mark.real
def test_run_cli_draft_model_under_the_amx_policy(run_cli, smollm2_f16, smollm2_q4, monkeypatch):
    """The draft (Q4_1) is loaded under the same policy and verifies like plain decoding."""
    monkeypatch.setenv("LLAMASPEC_ASSUME_AMX", "1")
    common = ("run", smollm2_f16, "-p", "Count from one to ten.", "-n", "24", "--temp", "0", "-t", "2", "--json")
    plain = run_cli(*common)
    spec = run_cli(*common, "--draft", smollm2_q4, "--spec-type", "draft", "--fixed-draft")
    assert plain.exit_code == 0 and spec.exit_code == 0, spec.stderr[-2000:]
    assert spec.json()["tokens"] == plain.json()["tokens"] and spec.json()["drafted"] > 0


def test_run_cli_amx_flags(run_cli, tiny_models, monkeypatch):
    """--amx / --no-amx reach the loaded models and the -v line (F32 tiny model: safe with AMX too)."""
    from llamaspec.runtime.llama import set_llama_log

    monkeypatch.setenv("LLAMASPEC_ASSUME_AMX", "1")
    monkeypatch.setenv("LLAMASPEC_AMX", "0")
    common = ("run", tiny_models["target"], "-p", "hi", "-n", "4", "--temp", "0", "-t", "1", "--json", "-v")
    try:
        on = run_cli(*common, "--amx")
        off = run_cli(*common)
    finally:
        set_llama_log()
    assert on.exit_code == 0 and off.exit_code == 0
    assert "using the AMX weight buffer (--amx)" in on.stderr
    assert "loading without the AMX weight buffer (llama.cpp issue 20824, LLAMASPEC_AMX=0)" in off.stderr


def test_doctor_reports_the_policy(run_cli, monkeypatch):
    monkeypatch.delenv("LLAMASPEC_AMX", raising=False)
    monkeypatch.delenv("LLAMASPEC_ASSUME_AMX", raising=False)
    r = run_cli("doctor", "--json")
    assert r.exit_code == 0
    amx = r.json()["amx"]
    facts = runtime_info.cpu_facts()
    assert amx["cpu_has_amx"] == facts.cpu_amx and amx["build_has_amx"] == facts.build_amx
    assert amx["avoid_amx"] == facts.amx_buffer and amx["issue"] == AMX_ISSUE_URL
    assert amx["extra_buffer_types"] == list(facts.extra_bufts)
    monkeypatch.setenv("LLAMASPEC_ASSUME_AMX", "1")
    r = run_cli("doctor", "--json")
    amx = r.json()["amx"]
    assert amx["avoid_amx"] and not amx["use_extra_bufts"] and AVOID_LINE in amx["reason"]
    assert amx["extra_buffer_types_used"] == (["CPU_REPACK"] if "CPU_REPACK" in facts.extra_bufts else [])
    human = run_cli("doctor")
    assert "AMX policy" in human.stdout and "weight buffers" in human.stdout


def test_a_fixed_decision_can_be_passed(tiny_models, capture_load):
    from llamaspec.runtime.llama import Model

    d = BufferDecision(False, False, True, False, "test", "use_extra_bufts=False")
    m = Model(tiny_models["target"], buffers=d)
    try:
        assert m.buffers.decision is d and capture_load[-1]["use_extra_bufts"] is False
    finally:
        m.close()
