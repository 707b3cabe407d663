"""Which CPU weight buffers llamaspec asks llama.cpp for: the AMX crash policy. Pure: no llama_cpp.

On an Intel Xeon with AMX, llama.cpp as vendored in llama-cpp-python 0.3.36 places quantized
weights in its AMX buffer and then segfaults in `ggml_backend_amx_mul_mat` on the first decode of a
batch of 2 or more tokens (Q4_1, Q4_K_M; F16 runs). Upstream issue 20824, closed as stale, unfixed.

llama.cpp puts a CPU weight in the first buffer type of [ACCEL, host, *CPU extra buffer types, CPU]
whose device supports the weight's op (llama-model-loader.cpp `select_weight_buft`). The extra
buffer types come from `ggml_backend_dev_get_extra_bufts`: "AMX" first (when ggml was built with
AMX and the CPU has it), then "CPU_REPACK" (Q4_0/Q4_K/IQ4_NL/MXFP4, and Q2_K with AVX-512,
interleaved for AVX2/AVX-512 kernels). `llama_model_params.use_extra_bufts = False` (`--no-repack`)
drops them all: no crash, but no repacking either. There is no switch for one extra buffer type.
What the API does allow: `tensor_buft_overrides` entries that name a buffer type other than plain
CPU put a tensor there directly, also when `use_extra_bufts` is False. So the AMX policy is:
`use_extra_bufts = False`, plus one override per group of weights that CPU_REPACK accepts, each
weight checked by ggml's own `supports_op` exactly as llama.cpp checks it
(runtime_info.repack_overrides). Checked here (AVX-512, no AMX): the same 27 Gemma 3 Q4_K_M
tensors are repacked as with llama.cpp's default, and the logits are bit-identical.

Only the per-layer matrix weights named in `MATMUL_WEIGHTS` (and `output.weight`) are routed:
llama.cpp uses those in MUL_MAT only, and a weight CPU_REPACK cannot take would crash on load. MoE
expert tensors (3-D, MUL_MAT_ID) stay in plain CPU memory: slower than repacked, never wrong.

`decide` takes the detected facts and the user's choice and returns a `BufferDecision`;
runtime.Model applies it, `doctor` and `run -v` show it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

AMX_ISSUE_URL = "https://github.com/ggml-org/llama.cpp/issues/20824"
ENV_AMX = "LLAMASPEC_AMX"                 # 1: use the AMX weight buffer, 0: never
ENV_ASSUME_AMX = "LLAMASPEC_ASSUME_AMX"   # 1: act as if this CPU and build had AMX (tests, debugging)

AMX_HELP = ("On CPUs with AMX, use llama.cpp's AMX weight buffer (default: off, it crashes on quantized "
            "models, llama.cpp issue 20824; env LLAMASPEC_AMX=1/0).")

AMX_BUFT = "AMX"
REPACK_BUFT = "CPU_REPACK"
CPU_AMX_FLAGS = ("amx_int8", "amx_tile", "amx_bf16")   # /proc/cpuinfo
GGML_AMX_FEATURE = "AMX_INT8"                         # ggml CPU backend feature (and system info)

# Per-layer weights that llama.cpp (llama-arch.cpp LLM_TENSOR_INFOS) uses only as MUL_MAT weights.
MATMUL_WEIGHTS = frozenset({
    "attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output", "attn_gate",
    "attn_q_a", "attn_q_b", "attn_kv_a_mqa", "attn_kv_b", "attn_k_b", "attn_v_b",
    "ffn_up", "ffn_gate", "ffn_down", "ffn_up_shexp", "ffn_gate_shexp", "ffn_down_shexp",
    "ssm_in", "ssm_out", "nextn.eh_proj", "nextn.shared_head_head",
})
_LAYER_WEIGHT = re.compile(r"blk\.(\d+)\.(.+)\.weight")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class CpuFacts:
    """What was detected; every field may be empty/None when detection was impossible."""

    cpu_flags: frozenset[str] = frozenset()        # /proc/cpuinfo flags
    ggml_features: frozenset[str] = frozenset()    # ggml CPU backend features set to 1 (AVX2, AMX_INT8, REPACK, ...)
    extra_bufts: tuple[str, ...] | None = None     # the CPU device's extra buffer types, in llama.cpp's order

    @property
    def cpu_amx(self) -> bool:
        return any(f in self.cpu_flags for f in CPU_AMX_FLAGS)

    @property
    def build_amx(self) -> bool:
        return GGML_AMX_FEATURE in self.ggml_features

    @property
    def amx_buffer(self) -> bool:
        """llama.cpp would put weights in the AMX buffer. ggml registers that buffer type only when
        it was built with AMX and the CPU has it; if the list is unknown, assume the worst."""
        if self.extra_bufts is not None:
            return AMX_BUFT in self.extra_bufts
        return self.cpu_amx or self.build_amx


@dataclass(frozen=True)
class BufferDecision:
    use_extra_bufts: bool              # llama_model_params.use_extra_bufts
    keep_repack: bool                  # CPU_REPACK weights stay in use
    avoid_amx: bool                    # the AMX weight buffer is kept out
    amx: bool                          # this CPU + build has the AMX weight buffer (or it is assumed)
    choice: str                        # what decided: "default", "--amx", "--no-amx", "LLAMASPEC_AMX=1", ...
    reason: str                        # one line for `run -v` and `doctor`
    extra_bufts: tuple[str, ...] = ()  # extra buffer types weights may be placed in under this decision

    @property
    def repack_overrides(self) -> bool:
        """CPU_REPACK is kept through tensor_buft_overrides (use_extra_bufts is off)."""
        return self.keep_repack and not self.use_extra_bufts

    def to_dict(self) -> dict:
        d = asdict(self)
        d["extra_bufts"] = list(self.extra_bufts)
        d["issue"] = AMX_ISSUE_URL
        return d


def env_flag(value: str | None) -> bool | None:
    """"1"/"true"/"yes"/"on" -> True, "0"/"false"/"no"/"off" -> False, unset or anything else -> None."""
    if value is None:
        return None
    v = value.strip().lower()
    return True if v in _TRUE else False if v in _FALSE else None


def decide(facts: CpuFacts, *, flag: bool | None = None, env: Mapping[str, str] | None = None) -> BufferDecision:
    """The weight buffers for every model this process loads.

    flag: --amx (True) / --no-amx (False) / not given (None); it wins over LLAMASPEC_AMX.
    Default: where the AMX weight buffer exists, load without it (use_extra_bufts off, CPU_REPACK
    kept through overrides when the build has it); elsewhere llama.cpp's defaults, unchanged.
    """
    env = env or {}
    notes = []
    raw = env.get(ENV_AMX)
    env_choice = env_flag(raw)
    if raw is not None and raw.strip() and env_choice is None:
        notes.append(f"{ENV_AMX}={raw!r} not understood (1 or 0)")
    if flag is not None:
        want, choice = flag, "--amx" if flag else "--no-amx"
    elif env_choice is not None:
        want, choice = env_choice, f"{ENV_AMX}={int(env_choice)}"
    else:
        want, choice = None, "default"
    assumed = env_flag(env.get(ENV_ASSUME_AMX)) is True
    amx = facts.amx_buffer or assumed
    available = tuple(facts.extra_bufts or ())
    has_repack = REPACK_BUFT in available
    prefix = f"{ENV_ASSUME_AMX}=1 (assumed): " if assumed and not facts.amx_buffer else ""
    tail = "".join(f"; {n}" for n in notes)

    if not amx:
        reason = "no AMX weight buffer on this CPU/build: llama.cpp's default weight buffers"
        if available:
            reason += f" ({', '.join(available)})"
        if want is True:
            reason += f"; {choice} changes nothing"
        return BufferDecision(True, has_repack, False, False, choice, reason + tail, available)
    if want is True:
        reason = (f"{prefix}CPU has AMX: using the AMX weight buffer ({choice}); quantized models crash "
                  f"on llama.cpp builds without a fix for issue 20824 ({AMX_ISSUE_URL})")
        return BufferDecision(True, has_repack, False, True, choice, reason + tail, available)
    why = "llama.cpp issue 20824" + ("" if want is None else f", {choice}")
    reason = f"{prefix}CPU has AMX: loading without the AMX weight buffer ({why}); --amx to use it"
    if facts.extra_bufts is None:
        reason += "; the build's buffer types are unknown, so CPU_REPACK is off too"
    elif has_repack:
        reason += f"; {REPACK_BUFT} kept"
    return BufferDecision(False, has_repack, True, True, choice, reason + tail,
                          (REPACK_BUFT,) if has_repack else ())


def is_matmul_weight(name: str) -> bool:
    """A weight llama.cpp uses only in MUL_MAT, by GGUF tensor name (see MATMUL_WEIGHTS)."""
    if name == "output.weight":
        return True
    m = _LAYER_WEIGHT.fullmatch(name)
    return bool(m) and m.group(2) in MATMUL_WEIGHTS


def override_patterns(names: Iterable[str]) -> list[str]:
    """Anchored regexes (llama.cpp matches them with std::regex_search) that match exactly `names`,
    one per weight kind: '^blk\\.(0|1|5)\\.ffn_down\\.weight$'. Few patterns keep the loader fast:
    it compiles every pattern for every tensor until one matches."""
    layers: dict[str, list[str]] = {}
    single: list[str] = []
    for name in names:
        m = _LAYER_WEIGHT.fullmatch(name)
        if m:
            layers.setdefault(m.group(2), []).append(m.group(1))
        else:
            single.append(name)
    out = [rf"^blk\.({'|'.join(dict.fromkeys(ids))})\.{re.escape(kind)}\.weight$" for kind, ids in layers.items()]
    return out + [f"^{re.escape(n)}$" for n in dict.fromkeys(single)]
