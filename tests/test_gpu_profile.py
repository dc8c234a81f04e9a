"""bench.gpu_profile on the CPU: its flags, the classification of real kernel names (those the
H200 profile recorded, ../shared/GPU-MEASURED.md), the summary and table from recorded events,
the refusal without a GPU, and the nanobert part run end to end on the CuPy stand-in. Nothing
here runs on a GPU: the numbers it prints on one are unchecked here."""
import json
import subprocess
import sys

import pytest

from bench import gpu_profile
from nanobert import backend

# Kernel names as the profiler printed them on the H200 (nanobert, CuPy 14.2; torch 2.11).
REAL_KERNELS = {
    "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_aligna4":
        "matmul",
    "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute":
        "matmul",
    "cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>": "matmul",
    "cupy_copy__float16_float32": "copy",
    "cupy_copy__float32_float16": "copy",
    "cupy_sum": "reduction",
    "cupy_sum_with_dtype": "reduction",
    "void cub::CUB_200200_900_NS::DeviceSegmentedReduceKernel<cub::DeviceReducePolicy>":
        "reduction",
    "nanobert_softmax_row_sum": "reduction",
    "cupy_add": "elementwise",
    "cupy_multiply": "elementwise",
    "nanobert_dropout_softmax_dx": "elementwise",
    "nanobert_gelu_backward": "elementwise",
    "nanobert_attention_heads": "elementwise",
    "nanobert_layernorm_dx": "elementwise",
    "nanobert_layernorm_backward": "elementwise",
    "nanobert_softmax_forward": "elementwise",
}


def test_kernel_names_are_classified_as_matmul_elementwise_reduction_or_copy():
    for name, kind in REAL_KERNELS.items():
        assert gpu_profile.kernel_kind(name) == kind, name


def test_flags_and_their_defaults():
    args = gpu_profile.parse_args([])
    assert (args.batch_sizes, args.precisions, args.preset, args.seq_len) == \
        ([32, 128], ["tf32", "float16"], "base", 128)
    args = gpu_profile.parse_args(["--batch-sizes", "8", "--precisions", "float32,float16",
                                   "--steps", "3", "--preset", "mini", "--out", "x.json"])
    assert (args.batch_sizes, args.precisions, args.steps, args.preset, args.out) == \
        ([8], ["float32", "float16"], 3, "mini", "x.json")
    for bad in (["--precisions", "bfloat16"], ["--batch-sizes", "a"], ["--steps", "0"],
                ["--preset", "huge"]):
        with pytest.raises(SystemExit):
            gpu_profile.parse_args(bad)


def recorded_events(activities=True):
    """Two profiled steps: per step 3 kernels, a memcpy, a memset, 4 runtime/driver calls
    and an annotation; with kineto's activity types (torch >= 2.6) or without them."""
    step = [("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n", True, "kernel", 400.0),
            ("cupy_sum", True, "kernel", 300.0), ("cupy_add", True, "kernel", 100.0),
            ("Memcpy HtoD (Pageable -> Device)", True, "gpu_memcpy", 20.0),
            ("Memset (Device)", True, "gpu_memset", 2.0),
            ("cudaLaunchKernel", False, "cuda_runtime", 5.0),
            ("cuLaunchKernel", False, "cuda_driver", 5.0),
            ("cuLaunchKernel", False, "cuda_driver", 5.0),
            ("cudaMemcpyAsync", False, "cuda_runtime", 30.0),
            ("ProfilerStep#1", False, "user_annotation", 900.0)]
    if not activities:
        step = [(name, on_device, None, us) for name, on_device, _, us in step
                if not name.startswith("Profiler")]
    return step * 2


@pytest.mark.parametrize("activities", [True, False])
def test_summary_counts_kernels_apart_from_copies_and_runtime_calls(activities):
    s = gpu_profile.summarize(recorded_events(activities), steps=2)
    assert (s["kernels"], s["memcpys"], s["memsets"], s["runtime_calls"]) == (3, 1, 1, 4)
    assert s["gpu_ms"] == pytest.approx(0.822)            # device events only
    assert s["by_kind"]["matmul"] == {"ms": pytest.approx(0.4), "count": 1}
    assert s["by_kind"]["copy"] == {"ms": pytest.approx(0.022), "count": 2}
    assert [k["name"] for k in s["largest"]][:2] == ["sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n",
                                                       "cupy_sum"]


def test_table_and_json_from_recorded_events():
    run = {"framework": "nanobert", "batch_size": 32, "precision": "tf32", "wall_ms": 40.7,
           "host_ms": 32.4, "mfu": 0.115, **gpu_profile.summarize(recorded_events(), steps=2)}
    result = {"gpu": "NVIDIA H200", "cupy": "14.2.0", "torch": None, "date": "2026-11-26",
              "preset": "base", "seq_len": 128, "steps": 2,
              "runs": [run, {"framework": "torch", "batch_size": 32, "precision": "tf32",
                             "error": "CUDA out of memory"}],
              "parity": {"config": "L2 H128 B4 T32 float64", "loss_rel": 0.0,
                         "grad_worst_rel": 4.2e-15, "grad_worst_name": "cls.bias"}}
    table = gpu_profile.format_table(result)
    row = next(line for line in table.splitlines() if line.startswith("nanobert"))
    assert row.split()[:9] == ["nanobert", "32", "tf32", "40.7", "32.4", "11.5", "0.8", "3",
                               "1"]
    assert "failed: CUDA out of memory" in table and "worst gradient 4.2e-15" in table
    assert json.loads(json.dumps(result)) == result


def test_profiler_events_read_torch_profiler_fields():
    """The fields profiler_events reads exist on this torch's events (CPU ops here, which
    summarize ignores: only kernels, copies and runtime calls count)."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as p:
        torch.ones(3) + 1
    events = gpu_profile.profiler_events(p)
    assert events and all(len(e) == 4 and not e[1] for e in events)
    s = gpu_profile.summarize(events, steps=1)
    assert (s["kernels"], s["runtime_calls"], s["gpu_ms"]) == (0, 0, 0.0)


def test_without_a_gpu_it_refuses_in_one_line():
    if backend.gpu_available():
        pytest.skip("a GPU is present")
    r = subprocess.run([sys.executable, "-m", "bench.gpu_profile", "--steps", "1"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "no GPU" in r.stderr


def test_help():
    r = subprocess.run([sys.executable, "-m", "bench.gpu_profile", "--help"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "--batch-sizes" in r.stdout and "--precisions" in r.stdout


def test_nanobert_part_runs_on_the_standin(tmp_path):
    pytest.importorskip("cupy")
    from test_cupy_standin import run_on_standin
    out = tmp_path / "profile.json"
    counts, stdout = run_on_standin(tmp_path, [
        "-m", "bench.gpu_profile", "--preset", "tiny", "--seq-len", "16", "--batch-sizes",
        "2", "--precisions", "tf32,float16", "--steps", "1", "--no-torch", "--out", str(out)])
    result = json.loads(out.read_text())
    assert [(r["framework"], r["precision"]) for r in result["runs"]] == \
        [("nanobert", "tf32"), ("nanobert", "float16")], result
    assert all(r["wall_ms"] > 0 and "error" not in r for r in result["runs"])
    assert result["parity"]["grad_worst_rel"] <= 1e-12, result["parity"]
    assert "parity, GPU vs NumPy" in stdout
