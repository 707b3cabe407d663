"""-ngl/-ngld auto (llamaspec/runtime/offload.py): llama.cpp's fit (common/fit.cpp) re-done in Python.

This machine has no GPU, so the decision is tested as the pure function it is, on hand-made device
lists and layer sizes; the sizes it reads from GGUF headers are checked against llama.cpp on real
files; and `run` / `doctor` are run for real on this CPU-only build, where auto must mean 0.
"""

from __future__ import annotations

import llama_cpp
import pytest

from llamaspec.runtime import devices as runtime_devices
from llamaspec.runtime import offload
from llamaspec.runtime.info import gguf_headers
from llamaspec.runtime.offload import DEFAULT_MARGIN, GIB, MIB, Device, ModelNeeds, decide

CPU = Device("CPU", "CPU", 64 * GIB, 64 * GIB, "host")


def gpu(free_mib: float, name: str = "CUDA0", kind: str = "GPU", backend: str = "CUDA") -> Device:
    return Device(name, kind, int(free_mib * MIB), 24 * GIB, name, backend)


def needs(n_layers: int, layer_mib: int, output_mib: int, compute_mib: int = 0) -> ModelNeeds:
    return ModelNeeds((layer_mib * MIB,) * n_layers, output_mib * MIB, compute_mib * MIB)


# A 32-block target: 100 MiB a layer; output layer 300 MiB; 100 MiB compute. All of it: 3600 MiB.
TARGET = needs(32, 100, 300, 100)
# An 8-block draft: 20 MiB a layer, 60 output, 50 compute. All of it: 270 MiB.
DRAFT = needs(8, 20, 60, 50)
MARGIN_MIB = DEFAULT_MARGIN // MIB


# ---- the decision (pure) -----------------------------------------------------------------------


def test_the_default_margin_is_llama_cpps_1_gib_per_device():
    assert DEFAULT_MARGIN == 1 << 30


def test_everything_fits_offloads_target_and_draft_entirely():
    d = decide([CPU, gpu(8192)], TARGET, DRAFT)
    assert (d.n_gpu_layers, d.n_gpu_layers_draft) == (33, 9) == (TARGET.n_max, DRAFT.n_max)
    assert d.target_auto and d.draft_auto and d.used == ((3600 + 270) * MIB,)
    assert [x.name for x in d.devices] == ["CUDA0"]
    assert d.reason.startswith("-ngl 33/33 (auto), -ngld 9/9 (auto); projected CUDA0 3.8 GiB of 8.0 GiB free")


def test_partial_fit_counts_layers_from_the_output_end():
    # output + compute = 400 MiB, then 100 MiB per block: room for exactly 10 blocks + the output layer
    free = MARGIN_MIB + 400 + 10 * 100 + 50
    d = decide([CPU, gpu(free)], TARGET)
    assert d.n_gpu_layers == 11 and d.used == ((400 + 1000) * MIB,)
    assert d.reason.startswith("-ngl 11/33 (auto)") and "-ngld" not in d.reason
    assert decide([gpu(free + 50)], TARGET).n_gpu_layers == 12
    assert decide([gpu(MARGIN_MIB + 399)], TARGET).n_gpu_layers == 0   # not even the output layer
    # N = 11 means the output layer and the last 10 blocks, as in llama.cpp's load_tensors
    assert offload.layer_devices(32, 11, [1]) == [None] * 22 + [0] * 11


def test_draft_and_target_share_one_device_draft_first_as_fit_cpp():
    free = MARGIN_MIB + 400 + 10 * 100 + 50
    both = decide([gpu(free + 270)], TARGET, DRAFT)
    assert (both.n_gpu_layers, both.n_gpu_layers_draft) == (11, 9)
    # fit.cpp measures the draft at its own setting (all layers) and fits the target beside it
    d = decide([gpu(free)], TARGET, DRAFT)
    assert (d.n_gpu_layers, d.n_gpu_layers_draft) == (8, 9)   # (1400 + 50 - 270 - 400) // 100 + 1
    assert d.used[0] <= (free - MARGIN_MIB) * MIB


def test_a_draft_that_cannot_fit_whole_is_cut_down_and_the_target_stays_on_the_cpu():
    d = decide([gpu(MARGIN_MIB + 200)], TARGET, DRAFT)
    assert (d.n_gpu_layers, d.n_gpu_layers_draft) == (0, 5)   # 60 + 50 + 4 * 20 = 190 <= 200


def test_two_devices_split_by_free_memory_like_llama_cpp():
    a, b = gpu(6144, "CUDA0"), gpu(2048, "CUDA1")
    # llama.cpp splits offloaded layers 3:1 (free memory); CUDA1 gets the last quarter, output
    # included, and has 1024 MiB usable: 300 + 100 + 6 * 100, so 7 layers there, 24 on CUDA0.
    d = decide([CPU, a, b], TARGET)
    assert d.n_gpu_layers == 31
    assert d.used == ((24 * 100 + 100) * MIB, (300 + 100 + 6 * 100) * MIB)
    assert offload.layer_devices(32, 31, [a.free, b.free]).count(1) == 7
    assert "CUDA0 2.4 GiB of 6.0 GiB free, CUDA1 1.0 GiB of 2.0 GiB free" in d.reason
    assert decide([gpu(6144, "CUDA0"), gpu(8192, "CUDA1")], TARGET).n_gpu_layers == 33


def test_no_gpu_means_zero_layers():
    for d in (decide([CPU], TARGET, DRAFT), decide([], None, None, has_draft=True),
              decide([CPU, gpu(8192)], TARGET, DRAFT, gpu_offload=False)):
        assert (d.n_gpu_layers, d.n_gpu_layers_draft) == (0, 0) and d.devices == ()
        assert d.reason.startswith("no GPU device")
    assert decide([CPU], TARGET).reason == "no GPU device among ggml's devices: -ngl 0/33 (auto)"
    assert decide([CPU, gpu(8192)], TARGET, gpu_offload=False).reason.startswith("no GPU device (CPU-only")
    assert decide([CPU, Device("BLAS", "ACCEL", 0, 0)], TARGET).n_gpu_layers == 0   # ACCEL holds no layers
    silent = decide([CPU, Device("Vulkan0", "GPU", 0, 0)], TARGET)   # reports no memory: fit.cpp skips it
    assert silent.n_gpu_layers == 0 and "report no memory" in silent.reason


def test_llama_cpps_device_choice_discrete_gpus_else_one_backends_igpus():
    igpu = gpu(4096, "Vulkan0", "IGPU", "Vulkan")
    assert offload.model_devices([CPU, igpu, gpu(4096)]) == (gpu(4096),)
    other = gpu(4096, "SYCL0", "IGPU", "SYCL")
    assert offload.model_devices([CPU, igpu, other, gpu(2048, "Vulkan1", "IGPU", "Vulkan")]) == (
        igpu, gpu(2048, "Vulkan1", "IGPU", "Vulkan"))
    assert decide([CPU, igpu], TARGET).n_gpu_layers == 27   # (4096 - 1024 - 400) // 100 + 1


def test_user_values_are_never_changed():
    tiny = gpu(MARGIN_MIB + 10)
    d = decide([tiny], TARGET, DRAFT, n_gpu_layers=99, n_gpu_layers_draft=-1)
    assert (d.n_gpu_layers, d.n_gpu_layers_draft) == (99, -1) and not d.target_auto and not d.draft_auto
    assert d.reason == "-ngl 33/33 (given), -ngld 9/9 (given)"   # 99 and -1: every layer
    # -ngl given: the draft is fitted around the target's 20 layers (2300 MiB); 150 MiB left
    d = decide([gpu(MARGIN_MIB + 2300 + 150)], TARGET, DRAFT, n_gpu_layers=20)
    assert (d.n_gpu_layers, d.n_gpu_layers_draft) == (20, 3) and not d.target_auto and d.draft_auto
    assert d.reason.startswith("-ngl 20/33 (given), -ngld 3/9 (auto)")
    # -ngld given: the target fits beside it
    d = decide([gpu(MARGIN_MIB + 1450)], TARGET, DRAFT, n_gpu_layers_draft=0)
    assert (d.n_gpu_layers, d.n_gpu_layers_draft) == (11, 0)
    assert decide([CPU], TARGET, n_gpu_layers=7).n_gpu_layers == 7   # kept on a CPU-only build too


def test_margins():
    free = MARGIN_MIB + 400 + 10 * 100 + 50
    assert decide([gpu(free)], TARGET).n_gpu_layers == 11
    assert decide([gpu(free)], TARGET, margin=0).n_gpu_layers == 21       # (2474 - 400) // 100 + 1
    assert decide([gpu(free)], TARGET, margin=2 * GIB).n_gpu_layers == 1  # the output layer only
    assert "margin 2.0 GiB per device" in decide([gpu(free)], TARGET, margin=2 * GIB).reason


def test_a_loaded_target_leaves_only_the_draft_to_place():
    d = decide([gpu(4096)], None, DRAFT, target_loaded=True)
    assert d.n_gpu_layers_draft == 9 and d.reason.startswith("target already loaded, -ngld 9/9 (auto)")


def test_layer_devices_follow_llama_cpp():
    assert offload.layer_devices(4, 0, [1]) == [None] * 5
    assert offload.layer_devices(4, -1, [1]) == [0] * 5 == offload.layer_devices(4, 99, [1])
    assert offload.layer_devices(4, 5, [1, 1]) == [0, 0, 0, 1, 1]   # upper_bound of (il - start) / n


def test_auto_summary_for_doctor():
    assert "-ngl 0" in offload.auto_summary([CPU], gpu_offload=False)
    assert "CUDA0 3.0 GiB" in offload.auto_summary([CPU, gpu(4096)], gpu_offload=True)


# ---- sizes from real GGUF headers, checked against llama.cpp ------------------------------------


def _check_against_llama_cpp(path, n_ctx: int = 256, load_mtp: bool = False):
    from llamaspec.runtime.llama import Model

    headers = gguf_headers(path)
    sizes = offload.tensor_bytes(headers[0])
    weights = offload.needs_from_headers(headers, n_ctx=0, load_nextn=load_mtp)
    full = offload.needs_from_headers(headers, n_ctx=n_ctx, load_nextn=load_mtp)
    n_vocab = len(headers[0].get("tokenizer.ggml.tokens"))
    model = Model(path, load_mtp=load_mtp)
    try:
        # every tensor's bytes: what llama.cpp counts as the model's size (tied embeddings: the
        # output layer holds a copy of token_embd, which itself stays on the CPU)
        on_cpu = sizes["token_embd.weight"] if "output.weight" in sizes else 0
        assert sum(weights.layers) + weights.output - 4 * 512 * n_vocab + on_cpu == llama_cpp.llama_model_size(model.ptr)
        assert len(full.layers) == headers[0].block_count and full.n_max == headers[0].block_count + 1
        n_embd, n_head = llama_cpp.llama_model_n_embd(model.ptr), llama_cpp.llama_model_n_head(model.ptr)
        kv = 2 * n_ctx * 2 * llama_cpp.llama_model_n_head_kv(model.ptr) * (n_embd // n_head)  # f16 K + V
        assert [f - w for f, w in zip(full.layers, weights.layers)] == [kv] * len(full.layers)
    finally:
        model.close()
    return weights


def test_needs_from_a_real_tiny_header(tiny_models):
    w = _check_against_llama_cpp(tiny_models["target"])
    assert len(set(w.layers)) == 1 and w.layers[0] > 0
    _check_against_llama_cpp(tiny_models["mtp"], load_mtp=True)
    # without load_mtp llama.cpp skips the NextN block (TENSOR_SKIP): it keeps its index, costs nothing
    skipped = offload.needs_from_headers(gguf_headers(tiny_models["mtp"]), n_ctx=256)
    assert skipped.layers[-1] == 0 and skipped.layers[0] > 0


def test_needs_from_smollm2(smollm2_f16):
    # llama.cpp's own log for this file at 4096 tokens: KV buffer 90.00 MiB, weights 256.63 MiB
    _check_against_llama_cpp(smollm2_f16, n_ctx=4096)
    n = offload.needs_from_headers(gguf_headers(smollm2_f16), n_ctx=4096)
    w = offload.needs_from_headers(gguf_headers(smollm2_f16), n_ctx=0)
    assert sum(n.layers) - sum(w.layers) == 90 * MIB


# ---- this CPU-only machine: auto is 0, and it runs --------------------------------------------


def test_plan_on_a_cpu_only_build_is_zero_without_reading_headers(tmp_path):
    missing = tmp_path / "not-read.gguf"   # on a CPU-only build no header is needed
    d = runtime_devices.plan_offload(missing, missing, n_gpu_layers=None, n_gpu_layers_draft=None,
                                     n_ctx=None, default_ctx=4096)
    assert not llama_cpp.llama_supports_gpu_offload()
    assert (d.n_gpu_layers, d.n_gpu_layers_draft) == (0, 0)
    assert d.reason == "no GPU device (CPU-only llama.cpp build): -ngl 0 (auto), -ngld 0 (auto)"


def test_devices_are_probed_with_their_memory():
    devs = runtime_devices.probe_devices()
    cpu = [d for d in devs if d.type == "CPU"]
    assert cpu and cpu[0].total > 0 and 0 < cpu[0].free <= cpu[0].total


def test_run_chooses_zero_layers_here_and_works(run_cli, tiny_models):
    from llamaspec.api.generator import Generator

    args = ("run", tiny_models["target"], "-p", "Tell me about the sea.", "-n", "12", "--temp", "0", "-t", "1")
    r = run_cli(*args, "--draft", tiny_models["draft"], "-v")
    assert r.exit_code == 0, r.stderr
    assert "GPU offload: no GPU device (CPU-only llama.cpp build): -ngl 0 (auto), -ngld 0 (auto)" in r.stderr
    given = run_cli(*args, "--spec-type", "none", "-v", "-ngl", "all", "-ngld", "3", "--json")
    assert given.exit_code == 0, given.stderr
    assert "GPU offload: -ngl all (given), -ngld 3 (given)" in given.stderr
    with Generator(tiny_models["target"], spec_type="none", temperature=0, max_tokens=12, threads=1) as g:
        assert (g.pipeline.offload.n_gpu_layers, g.pipeline.offload.target_auto) == (0, True)
        assert g.options.n_gpu_layers is None   # the caller's options keep "auto"
        assert g.generate("Tell me about the sea.").tokens == given.json()["tokens"]


@pytest.mark.parametrize("value, needle", [("-2", "-ngl must be >= -1"), ("many", "'auto' or 'all'")])
def test_bad_gpu_layer_values_are_usage_errors(run_cli, tiny_models, value, needle):
    r = run_cli("run", tiny_models["target"], "-p", "x", "-ngl", value)
    assert r.exit_code == 2 and needle in r.stderr


def test_doctor_json_has_the_offload_key(run_cli):
    r = run_cli("doctor", "--json")
    assert r.exit_code == 0, r.stderr
    off = r.json()["offload"]
    assert off["gpu_offload"] is False and off["gpu_devices"] == [] and off["margin"] == 1 << 30
    assert off["auto"] == "auto: -ngl 0 -ngld 0 (no GPU device: CPU-only llama.cpp build)"
    assert any(d["type"] == "CPU" and d["total"] > 0 for d in off["devices"])
    human = run_cli("doctor")
    assert "-ngl/-ngld" in human.stdout and "auto: -ngl 0 -ngld 0" in human.stdout
