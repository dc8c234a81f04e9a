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
    for flag in ("--busy-ms", "--adds", "--no-calls", "--no-profile", "--calls", "--top"):
        assert flag in r.stdout, flag


def test_calls_and_profile_run_on_the_standin(tmp_path):
    pytest.importorskip("cupy")
    from test_cupy_standin import run_on_standin
    _, stdout = run_on_standin(tmp_path, [
        "-m", "bench.gpu_host", "--preset", "tiny", "--seq-len", "16", "--batch-size", "2",
        "--steps", "1", "--top", "5", "--calls", "3"])
    assert "2-D product into out (gemm)" in stdout and "column sum" in stdout
    assert "host profile: tiny B=2 T=16 tf32, 1 steps" in stdout
    assert "gemm" in stdout.split("host profile")[1]       # fast_gpu.gemm in the profile


def test_without_a_gpu_it_says_so():
    from nanobert import backend
    if backend.gpu_available():
        pytest.skip("a GPU is here")
    r = subprocess.run([sys.executable, "-m", "bench.gpu_host", "--no-profile"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "no GPU here" in r.stderr
