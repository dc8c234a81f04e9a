"""bench.gpu_profile on the CPU: its flags, the classification of real kernel names (those the
H200 profile recorded, ../shared/GPU-MEASURED.md), the summary and table from recorded events,
the refusal without a GPU, and the nanobert part run end to end on the CuPy stand-in. Nothing
here runs on a GPU: the numbers it prints on one are unchecked here."""
import json
import subprocess
import sys
import types

import numpy
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
    assert [str(c) for c in args.cases] == ["base:32x128", "base:128x128", "mini:128x128",
                                            "train.py", "base:32x512"]
    assert (args.precisions, args.steps, args.train_py_steps) == (["tf32", "float16"], 10, 200)
    args = gpu_profile.parse_args(["--batch-sizes", "8", "--precisions", "float32,float16",
                                   "--steps", "3", "--preset", "mini", "--out", "x.json"])
    assert (args.cases, args.precisions, args.steps, args.out) == \
        ([gpu_profile.Case("step", "mini", 8, 128)], ["float32", "float16"], 3, "x.json")
    args = gpu_profile.parse_args(["--seq-len", "512", "--batch-sizes", "32"])   # a worker's
    assert (args.preset, args.batch_sizes, args.seq_len) == ("base", [32], 512)
    args = gpu_profile.parse_args(["--cases", "large:16x128,train.py:mini", "--train-py-args",
                                   "--batch-size 256 --max-seq-length 128"])
    assert args.cases == [gpu_profile.Case("step", "large", 16, 128),
                          gpu_profile.Case("train.py", "mini")]
    assert args.train_py_args == ["--batch-size", "256", "--max-seq-length", "128"]
    for bad in (["--precisions", "bfloat16"], ["--batch-sizes", "a"], ["--steps", "0"],
                ["--preset", "huge"], ["--cases", "base:32"], ["--cases", "huge:1x1"],
                ["--cases", "base:0x128"], ["--cases", "train.py:a b"],
                ["--cases", "base:32x128", "--batch-sizes", "8"], ["--train-py-steps", "0"]):
        with pytest.raises(SystemExit):
            gpu_profile.parse_args(bad)


def test_a_case_reads_back_as_written():
    for text in ("base:32x512", "mini:128x128", "train.py", "train.py:mini"):
        assert str(gpu_profile.parse_case(text)) == text


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


def step_run(framework, case, precision, wall_ms, **fields):
    case = gpu_profile.parse_case(case)
    return {**gpu_profile.describe(framework, case, precision), "wall_ms": wall_ms,
            "tokens_per_s": case.batch_size * case.seq_len / wall_ms * 1e3, **fields}


def test_table_and_json_from_recorded_events():
    """Each run's row: wall and host time, the ratio to torch's run of the same case and
    precision, tokens/s, MFU, peak and held memory; the kernel table below; a failed run and
    a train.py case (no step time: its tokens/s and MFU) in their own words."""
    ours = step_run("nanobert", "base:32x128", "tf32", 40.7, host_ms=32.4, mfu=0.115,
                    peak_gib=5.0, held_gib=5.0, step_mode="graph",
                    **gpu_profile.summarize(recorded_events(), 2))
    theirs = step_run("torch", "base:32x128", "tf32", 50.875, host_ms=30.0, mfu=0.09,
                      peak_gib=4.2, held_gib=4.75, step_mode="eager")
    compiled = step_run("torch.compile", "base:32x128", "tf32", 37.0, host_ms=10.0, mfu=0.127,
                        peak_gib=4.0, held_gib=4.5, step_mode="compiled (default mode)",
                        first_step_s=41.0)
    train_py = {**gpu_profile.describe("nanobert", gpu_profile.parse_case("train.py"), "tf32"),
                "seq_len": 40, "tokens_per_s": 1.23e6, "tokens_per_s_lines": [4e5, 1.23e6],
                "mfu": 0.009, "command": "train.py --device gpu"}
    failed = {**gpu_profile.describe("torch", gpu_profile.parse_case("base:32x512"),
                                     "float16"), "error": "CUDA out of memory"}
    result = {"gpu": "NVIDIA H200", "cupy": "14.2.0", "torch": "2.11", "date": "2026-11-26",
              "cases": ["base:32x128", "train.py", "base:32x512"], "steps": 2,
              "train_py_steps": 200, "runs": [ours, theirs, compiled, train_py, failed],
              "parity": {"config": "L2 H128 B4 T32 float64", "loss_rel": 0.0,
                         "grad_worst_rel": 4.2e-15, "grad_worst_name": "cls.bias"}}
    table = gpu_profile.format_table(result).splitlines()
    rows = [line.split() for line in table if line.startswith(("nanobert", "torch"))]
    assert rows[0] == ["nanobert", "base:32x128", "tf32", "40.7", "32.4", "0.80", "1.10",
                       "0.10", "11.5", "5.00", "5.00", "graph"], table
    assert rows[1] == ["torch", "base:32x128", "tf32", "50.9", "30.0", "-", "-", "0.08", "9.0",
                       "4.20", "4.75", "eager"], table
    assert rows[2] == ["torch.compile", "base:32x128", "tf32", "37.0", "10.0", "-", "-",
                       "0.11", "12.7", "4.00", "4.50", "compiled", "(default", "mode)"], table
    assert rows[3] == ["nanobert", "train.py", "tf32", "-", "-", "-", "-", "1.23", "0.9",
                       "-", "-", "-"], table
    assert rows[4] == ["torch", "base:32x512", "float16", "failed:", "CUDA", "out", "of",
                       "memory"], table
    assert rows[5][:9] == ["nanobert", "base:32x128", "tf32", "0.8", "3", "1", "1", "4",
                           "0.4"], table                 # the kernel table: profiled runs
    assert len(rows) == 6 and any("worst gradient 4.2e-15" in line for line in table), table
    gpu_profile.add_ratios(result)                       # the JSON holds the ratios too
    assert (ours["over_torch"], ours["over_torch_compile"]) == \
        (pytest.approx(0.8), pytest.approx(1.1)), ours
    assert json.loads(json.dumps(result)) == result


def test_torch_memory_reads_its_allocators_peaks(monkeypatch):
    """torch: its max allocated and max reserved, GiB."""
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
        max_memory_allocated=lambda: 3 * 2 ** 29, max_memory_reserved=lambda: 2 ** 31))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    assert gpu_profile.TorchMemory().gib() == {"peak_gib": 1.5, "held_gib": 2.0}


@pytest.fixture
def standin():
    cupy_standin = pytest.importorskip("cupy_standin")
    with cupy_standin.installed() as module:
        yield module


def test_nanobert_memory_counts_its_graphs_pools(standin):
    """After steps replayed from a CUDA graph, what nanobert's pools hold (the default pool and
    the graph's private one, training/graph.py) is at least every device array alive: the
    parameters, AdamW's state and the graph's activations. Reading CuPy's default pool alone
    (the fault) leaves the activations out: the capture emptied it and allocated under the
    graph's pool."""
    import cupy_standin
    record = gpu_profile.measure("nanobert", "tiny", 2, 16, "tf32", steps=2)
    assert record["step_mode"] == "graph", record
    alive = sum(root.nbytes for root in list(cupy_standin._LIVE.values()))
    graphs = sum(p.total_bytes() for p in graph_memory_pools(standin)[1:])
    assert graphs > 0 and record["held_gib"] * gpu_profile.GIB >= alive, (record, alive)
    assert record["peak_gib"] == record["held_gib"] >= record["used_gib"] > 0, record


def graph_memory_pools(xp):
    from nanobert.training.graph import memory_pools
    return memory_pools(xp)


def test_a_graph_that_failed_to_capture_is_reported_as_such(standin, monkeypatch):
    """cuBLAS bound to the legacy stream makes the capture fail: the record says "capture
    failed" with CUDA's reason, and the table shows it, never "graph"."""
    import cupy_standin
    library = cupy_standin.nanobert_cublas.library(standin)
    bind = library.cublasSetStream_v2
    monkeypatch.setattr(library, "cublasSetStream_v2", lambda handle, stream: bind(handle, 0))
    record = gpu_profile.measure("nanobert", "tiny", 2, 16, "tf32", steps=1)
    assert record["step_mode"].startswith("capture failed: RuntimeError: cuBLAS returned "
                                          "status 13"), record["step_mode"]
    table = gpu_profile.format_table({"gpu": "-", "cupy": "-", "torch": None, "date": "-",
                                      "runs": [record]})
    assert "capture failed" in table, table


def test_torch_compile_that_cannot_compile_is_skipped_with_its_reason(monkeypatch):
    """torch.compile raising at its first call (no compiler, an unsupported op) gives a
    record that says skipped and why, in one line, and no figure."""
    pytest.importorskip("torch")

    def step():
        raise RuntimeError("Compiler: cc is not found.\n  (a second line)")
    monkeypatch.setattr(gpu_profile.train_step, "torch_step_fn",
                        lambda *args, **kwargs: (step, None))
    record = gpu_profile.measure("torch.compile", "tiny", 2, 16, "tf32", steps=1)
    assert record["skipped"] == ("torch.compile cannot compile here: RuntimeError: Compiler: "
                                 "cc is not found. (a second line)"), record
    assert "wall_ms" not in record
    table = gpu_profile.format_table({"gpu": "-", "cupy": "-", "torch": "2", "date": "-",
                                      "runs": [record]})
    assert "torch.compile tiny:2x16       tf32      skipped: torch.compile cannot" in table, \
        table


def progress_lines(capsys, ranks=1, peak=None):
    """train.py's own progress lines (train.log_train), for two windows."""
    import train
    from nanobert.training.metrics import Window
    from nanobert.training.pretraining import STEP_KEYS
    window = Window(peak, ranks)
    args = types.SimpleNamespace(steps=200, no_nsp=False)
    for step, tokens in ((40, 8e5), (80, 2.5e6)):
        sums = dict.fromkeys(STEP_KEYS, 1.0)
        sums["tokens"] = tokens
        window.add(numpy.array([sums[k] for k in STEP_KEYS]), 2.0, 0.002 * 2.0 * 494.7e12)
        train.log_train(args, None, "/dev/null", window, step, 1e-3, 1.0)
        window.reset()
    return capsys.readouterr().out


@pytest.mark.parametrize("ranks, peak", [(1, 494.7), (1, None), (2, 494.7)])
def test_read_progress_takes_train_pys_last_progress_line(capsys, ranks, peak):
    out = "data: 168,836 instances of length 40\n" + progress_lines(capsys, ranks, peak)
    record = gpu_profile.read_progress(out)
    assert record["tokens_per_s_lines"] == [4e5, 1.25e6], out
    assert record["tokens_per_s"] == 1.25e6 and record["seq_len"] == 40
    assert record["mfu"] == (None if peak is None else pytest.approx(0.002, rel=0.01)), out
    assert record["step_mode"] == "graph"
    assert gpu_profile.read_progress(out, eager=True)["step_mode"] == "eager"
    failed = ("note: the CUDA graph capture of the training step failed (CUDARuntimeError: "
              "cudaErrorStreamCaptureImplicit); every step runs eagerly from here\n")
    assert gpu_profile.read_progress(failed + out)["step_mode"] == \
        "capture failed: CUDARuntimeError: cudaErrorStreamCaptureImplicit"
    with pytest.raises(ValueError, match="no progress line"):
        gpu_profile.read_progress("data: 10 instances of length 40\n")


@pytest.mark.parametrize("precision, preset", [("tf32", "nano"), ("float32", "mini"),
                                               ("float16", "nano")])
def test_train_py_case_is_a_command_line_train_py_accepts(precision, preset):
    import train
    case = gpu_profile.Case("train.py", preset)
    argv = gpu_profile.train_py_argv(case, precision, 60, "/tmp/x", ["--batch-size", "256"])
    assert argv[1].endswith("train.py")
    args = train.parse_args(argv[2:])
    assert (args.device, args.steps, args.log_every, args.preset, args.batch_size) == \
        ("gpu", 60, 12, preset, 256)
    assert (args.dtype, args.no_tf32) == {"tf32": ("float32", False), "float32": (
        "float32", True), "float16": ("float16", False)}[precision]


def test_a_train_py_case_that_fails_is_recorded_with_its_line():
    """Without a GPU, train.py --device gpu stops in one line; the case records it."""
    if backend.gpu_available():
        pytest.skip("a GPU is present")
    record = gpu_profile.run_train_py(gpu_profile.Case("train.py", "nano"), "tf32", 2)
    assert record["error"].startswith("error: --device gpu") and "tokens_per_s" not in record
    assert (record["framework"], record["case"]) == ("nanobert", "train.py")
    table = gpu_profile.format_table({"gpu": "-", "cupy": "-", "torch": None, "date": "-",
                                      "runs": [record]})
    assert "nanobert      train.py        tf32      failed: error: --device gpu" in table, table


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
    """Two step cases (one worker process a precision) and a train.py case (on a small
    corpus, 4 steps, each logged), end to end: records, their memory fields, how each step
    ran, train.py's tokens/s and length read from its output."""
    from test_cupy_standin import run_on_standin
    out = tmp_path / "profile.json"
    counts, stdout = run_on_standin(tmp_path, [
        "-m", "bench.gpu_profile", "--cases", "tiny:2x16,tiny:1x8,train.py", "--precisions",
        "tf32,float16", "--steps", "1", "--no-torch", "--out", str(out), "--train-py-steps",
        "4", "--train-py-args", "--data data/brown/heldout.txt.gz --vocab "
        "data/brown/vocab-uncased-8192.txt --batch-size 4 --max-seq-length 24"])
    result = json.loads(out.read_text())
    assert [(r["framework"], r["case"], r["precision"]) for r in result["runs"]] == \
        [("nanobert", case, precision) for precision in ("tf32", "float16")
         for case in ("tiny:2x16", "tiny:1x8", "train.py")], result
    assert all("error" not in r and r["tokens_per_s"] > 0 and r["run_s"] > 0
               for r in result["runs"]), result
    assert result["environment"]["NANOBERT_CUPY_STANDIN"] == "1", result["environment"]
    steps = [r for r in result["runs"] if r["case"] != "train.py"]
    train_py = [r for r in result["runs"] if r["case"] == "train.py"]
    assert all(r["wall_ms"] > 0 and r["peak_gib"] == r["held_gib"] > 0 for r in steps)
    assert all(r["seq_len"] == 24 and len(r["tokens_per_s_lines"]) == 4 for r in train_py)
    assert [r["step_mode"] for r in result["runs"]] == ["graph"] * 6, result["runs"]
    assert "--dtype float16" in train_py[1]["command"], train_py
    assert result["parity"]["grad_worst_rel"] <= 1e-12, result["parity"]
    assert "parity, GPU vs NumPy" in stdout
