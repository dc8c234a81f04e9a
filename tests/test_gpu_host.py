"""bench.gpu_host (where the host's time goes when it issues the GPU step) runs end to end on
the CPU stand-in of CuPy: its per-call table and the host profile. That proves the script,
not a number: the stand-in's calls cost what NumPy costs. Its --adds and --busy-ms parts
build CUDA C kernels (a `raw` parameter, inline PTX), which the stand-in does not run; they
ran on an H200 (docs/gpu.md)."""
import subprocess
import sys

import pytest


def test_help_names_every_part():
    r = subprocess.run([sys.executable, "-m", "bench.gpu_host", "--help"], capture_output=True,
                       text=True)
    assert r.returncode == 0
    for flag in ("--busy-ms", "--adds", "--no-calls", "--no-profile", "--calls", "--top",
                 "--vocab"):
        assert flag in r.stdout, flag


def test_calls_and_profile_run_on_the_standin(tmp_path):
    from test_cupy_standin import run_on_standin
    counts, stdout = run_on_standin(tmp_path, [
        "-m", "bench.gpu_host", "--preset", "tiny", "--seq-len", "16", "--batch-size", "2",
        "--steps", "1", "--top", "60", "--calls", "3", "--no-cuda-graph"])
    assert "2-D product into out (gemm)" in stdout and "column sum" in stdout
    assert "host profile: tiny B=2 T=16 tf32, the step: eager, 1 steps" in stdout
    assert "gemm" in stdout.split("host profile")[1]       # fast_gpu.gemm in the profile
    assert counts["graph_launches"] == 0


def test_the_profile_of_a_replayed_step_on_the_standin(tmp_path):
    """As train.py runs it: the profiled step is the input copies and the graph's launch."""
    from test_cupy_standin import run_on_standin
    counts, stdout = run_on_standin(tmp_path, [
        "-m", "bench.gpu_host", "--preset", "tiny", "--seq-len", "16", "--batch-size", "2",
        "--steps", "1", "--top", "40", "--no-calls"])
    profile = stdout.split("host profile")[1]
    assert "the step: graph, 1 steps" in profile and "(launch)" in profile
    assert "gemm" not in profile
    assert counts["captures"] == 1 and counts["graph_launches"] == 2


def test_the_vocab_experiment_runs_on_the_standin(tmp_path):
    """--vocab: the MLM decoder's products at BERT's vocab, padded rows and not, float16 and
    TF32 (on the stand-in the times are the host's: the script runs, no number means
    anything)."""
    from test_cupy_standin import run_on_standin
    _, stdout = run_on_standin(tmp_path, [
        "-m", "bench.gpu_host", "--preset", "tiny", "--seq-len", "16", "--batch-size", "2",
        "--vocab", "--no-calls", "--no-profile"])
    assert "MLM decoder, [4, 64] -> V = 30522" in stdout
    for precision in ("float16", "tf32"):
        for padding in ("padded rows", "unpadded"):
            for what in ("decoder forward + backward", "logits = x W^T", "dx = dlogits W",
                         "dW = dlogits^T x"):
                line = f"{precision} {padding}, {what}"
                assert line in stdout and "failed" not in stdout.split(line)[1][:40], stdout


def test_without_a_gpu_it_says_so():
    from nanobert import backend
    if backend.gpu_available():
        pytest.skip("a GPU is here")
    r = subprocess.run([sys.executable, "-m", "bench.gpu_host", "--no-profile"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "no GPU here" in r.stderr


def test_the_experiment_kernels_compile_for_sm90():
    """The experiments' CUDA (16-byte adds and GELU, indexed adds, the spin kernel) turned into
    source by CuPy 14's generator and compiled by nvcc for sm_90, as
    tests/test_kernels_compile.py does for the model's kernels: the H200 run found one that
    did not compile (a parameter named T, CuPy's type placeholder)."""
    import numpy
    tk = pytest.importorskip("test_kernels_compile")
    try:
        import cupy
        from cupy.cuda import compiler
    except ImportError as e:
        pytest.skip(f"CuPy's generator is not importable: {e}")
    if cupy.cuda.get_nvcc_path() is None:
        pytest.skip("nvcc not found: the experiments' CUDA is not compiled")
    import bench.gpu_host as gpu_host
    wide = ("a", numpy.complex128)
    calls = [(gpu_host.vector_add_kernel(cupy, name), (wide, wide, wide))
             for name in gpu_host.VECTOR_ADD]
    narrow, gelu16 = gpu_host.gelu_kernels(cupy)
    calls += [(narrow, (("a", numpy.float16), ("a", numpy.float16))), (gelu16, (wide, wide))]
    calls += [(gpu_host.plain_add_kernel(cupy), (("a", dtype),) * 3)
              for dtype in (numpy.float32, numpy.float16)]
    add_bias, add_mask = gpu_host.indexed_add_kernels(cupy)
    for dtype in (numpy.float32, numpy.float16):
        calls += [(add_bias, (("v", dtype), ("s", numpy.uint32), ("a", dtype))),
                  (add_mask, (("v", dtype), ("s", numpy.uint32), ("s", numpy.uint32),
                              ("a", dtype)))]
    errors = {f"{kernel.name} {i}": tk._nvcc_errors(
        cupy, tk._elementwise_source(cupy, kernel, args, "contiguous"))
        for i, (kernel, args) in enumerate(calls)}
    try:
        compiler.compile_using_nvcc(gpu_host.SPIN, arch=tk.ARCH, code_type="cubin")
    except compiler.CompileException as e:
        errors["nanobert_spin"] = str(e)[-2000:]
    assert not any(errors.values()), {k: v for k, v in errors.items() if v}
