"""--device gpu where the GPU path cannot run stops in one line before any work, in every
command (backend.require_gpu, called where the device is resolved): no CuPy, no GPU or no
driver, no cuBLAS, no NVRTC. Before, `python train.py --device gpu` without CuPy tokenized
the corpus and built 170k instances, then printed a 33-line traceback."""
import argparse
import os
import subprocess
import sys
import types

import pytest

from nanobert import backend
from nanobert.training.run import setup_device

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INSTALL = 'pip install -e ".[gpu-cuda12]"'


@pytest.fixture
def without_cupy(tmp_path):
    """An environment whose `import cupy` fails, as on a machine where CuPy is not installed
    (a `cupy` package first on the path that raises ImportError)."""
    fake = tmp_path / "site" / "cupy"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("No module named \'cupy\'")\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("NANOBERT_CUPY_STANDIN")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "site"), ROOT])
    return env


def commands(tmp_path):
    """(argv, what it would have written had it started working) of every command with
    --device gpu."""
    text = tmp_path / "texts.txt"
    text.write_text("a sentence\n")
    return {
        "train.py": (["train.py", "--device", "gpu", "--out", str(tmp_path / "run")],
                     tmp_path / "run"),
        "finetune.py": (["finetune.py", "--dataset", "movie-sentiment", "--device", "gpu",
                         "--out", str(tmp_path / "fine")], tmp_path / "fine"),
        "fill_mask": (["-m", "nanobert.fill_mask", "--device", "gpu", "the [MASK] sat"], None),
        "attention": (["-m", "nanobert.attention", "--device", "gpu", "--out",
                       str(tmp_path / "maps.png"), "a sentence"], tmp_path / "maps.png"),
        "features": (["-m", "nanobert.features", "--device", "gpu", "--input", str(text),
                      "--out", str(tmp_path / "features")], tmp_path / "features"),
        "bench.train_step": (["-m", "bench.train_step", "--device", "gpu", "--configs", "tiny",
                              "--no-torch"], None),
    }


@pytest.mark.parametrize("name", ["train.py", "finetune.py", "fill_mask", "attention",
                                  "features", "bench.train_step"])
def test_device_gpu_without_cupy_stops_in_one_line_before_any_work(tmp_path, without_cupy,
                                                                   name):
    argv, output = commands(tmp_path)[name]
    r = subprocess.run([sys.executable, *argv], cwd=ROOT, env=without_cupy,
                       capture_output=True, text=True, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1, r.stderr
    assert "--device gpu needs CuPy (No module named 'cupy')" in lines[0], lines[0]
    assert INSTALL in lines[0] and '".[gpu-cuda13]"' in lines[0], lines[0]
    assert r.stdout == "", r.stdout                          # nothing read, built or loaded
    assert output is None or not output.exists(), output


def test_nanobert_device_gpu_from_the_environment_is_checked_too(tmp_path, without_cupy):
    r = subprocess.run([sys.executable, "train.py", "--out", str(tmp_path / "run")], cwd=ROOT,
                       env={**without_cupy, "NANOBERT_DEVICE": "gpu"}, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and r.stderr.count("\n") == 1, r.stderr
    assert "needs CuPy" in r.stderr and not (tmp_path / "run").exists()


def refusal(**kwargs):
    with pytest.raises(ValueError) as e:
        backend.require_gpu(**kwargs)
    message = str(e.value)
    assert "\n" not in message and message.startswith("--device gpu"), message
    return message


def test_setup_device_checks_the_gpu_and_only_the_gpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)       # `import cupy` raises ImportError
    with pytest.raises(ValueError, match="needs CuPy"):
        setup_device(argparse.Namespace(device="gpu", no_tf32=False))
    args = argparse.Namespace(device="cpu", no_tf32=False)
    setup_device(args)
    assert args.device == "cpu"


@pytest.fixture
def standin(monkeypatch):
    """The CuPy stand-in as `cupy` (it compiles RawModule code with g++), and a monkeypatch
    context undone before the stand-in leaves sys.modules."""
    import cuda_emulation
    import cupy_standin
    if not cuda_emulation.available():
        pytest.skip("the stand-in compiles kernels with g++")
    with cupy_standin.installed() as cupy, monkeypatch.context() as patch:
        yield cupy, patch


def test_the_standin_passes_the_check(standin):
    """What the many device="gpu" tests run on: a device, cuBLAS, and a RawModule compiled."""
    backend.require_gpu()


def test_no_gpu_or_no_driver_is_named(standin):
    cupy, patch = standin

    def no_driver():
        raise RuntimeError("cudaErrorInsufficientDriver: CUDA driver version is\n"
                           "insufficient for CUDA runtime version")
    patch.setattr(cupy.cuda.runtime, "getDeviceCount", no_driver)
    message = refusal()
    assert "reaches no GPU (cudaErrorInsufficientDriver: CUDA driver version is insufficient"\
        in message and "--device cpu" in message, message
    patch.setattr(cupy.cuda.runtime, "getDeviceCount", lambda: 0)
    assert "sees no CUDA device" in refusal()


def test_missing_cuda_libraries_are_named_with_the_install_that_brings_them(standin):
    """A cupy-cudaNNx wheel without [ctk] and without a CUDA toolkit: CuPy imports and sees
    the GPU, then cannot load cuBLAS or NVRTC (libnvrtc is loaded when a RawModule compiles,
    so a missing one would otherwise surface at the first kernel, after the data work)."""
    cupy, patch = standin

    def no_nvrtc(*args, **kwargs):
        raise RuntimeError('Failure finding "libnvrtc.so.13 or libnvrtc.so.12"')
    patch.setattr(cupy, "RawModule", no_nvrtc)
    message = refusal()
    assert 'NVRTC (Failure finding "libnvrtc.so.13 or libnvrtc.so.12")' in message, message
    assert "cuBLAS" not in message and INSTALL in message and "[ctk]" in message, message
    libs = types.ModuleType("cupy_backends.cuda.libs")
    libs.__path__ = []                       # a package in which `cublas` cannot be imported
    patch.setitem(sys.modules, "cupy_backends.cuda.libs", libs)
    patch.delitem(sys.modules, "cupy_backends.cuda.libs.cublas")
    message = refusal()
    assert "cannot load CUDA's cuBLAS (" in message and " and NVRTC (" in message, message


def test_a_long_error_is_cut_to_one_short_line():
    text = backend._one_line(RuntimeError("x" * 500 + "\n" + "y"))
    assert len(text) == 160 and text.endswith("...") and "\n" not in text
    assert backend._one_line(RuntimeError()) == "RuntimeError"
