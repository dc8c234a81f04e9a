"""Every CUDA kernel of the GPU path (nanobert/model/kernels.py: its CUDA source, one a dtype,
and its ElementwiseKernels) built for an H100/H200 (sm_90) with nvcc, for each dtype
fast_gpu.py and optim.py call it with, on a machine without a GPU: a kernel that would fail
on the GPU fails here, naming it and the error, not in the first minutes of a lent GPU.

The CUDA kernels (kernels.cuda_source) are compiled as cupy.RawModule compiles them: as
written, without CuPy's headers. The ElementwiseKernels' source is CuPy's own (CuPy 14, read
in its _kernel.pyx and core.pyx): the real kernel objects are built (kernels.py's factories
called with the real cupy module), CuPy decides the parameter types as a launch does
(_kernel._decide_params_type, whose TypeError a launch would raise too: in a parameter list
`float` is NumPy's, float64), and CuPy's generator, which needs no device, writes the kernel
(_kernel._get_elementwise_kernel_code). Prepended are CuPy's headers
(core._cupy_header_list); CuPy's options (core.assemble_cupy_compiler_options, plus the
-ftz=true of compiler._compile_with_cache_cuda); compiled by
cupy.cuda.compiler.compile_using_nvcc. Ours: the argument descriptions a launch derives from
the arrays (_ArgInfo: dtype, ndim, C-contiguity, 32-bit indexing) in two layouts (contiguous,
reduced to 1-2 dimensions; strided 4-D views with 64-bit indices).

What this does not prove: on a GPU CuPy compiles with NVRTC, not nvcc (the same NVVM
compiler behind another driver; CuPy's headers differ only in `#ifndef __CUDACC_RTC__`
includes), with the GPU machine's CUDA headers rather than this machine's toolkit; nothing
runs here, so the kernels' numbers are the business of tests/test_row_kernels.py (the CUDA
kernels, emulated on the CPU) and tests/test_cupy_standin.py (the ElementwiseKernels' NumPy
semantics).
"""
import concurrent.futures
import inspect
import os
import re
import time
from pathlib import Path

import numpy
import pytest

from nanobert.model import kernels

ROOT = Path(__file__).resolve().parent.parent
ARCH = "90"                                    # H100 / H200
CUDA_ARCHS = ("80", "90")                      # the CUDA kernels also for the A100
H, F, D, BOOL = "float16", "float32", "float64", "bool"


# An argument of a call: ("a", dtype) an array shaped like the output, C-contiguous;
# ("v", dtype) an array that is not (a broadcast row statistic or bias, a strided head view,
# a 0-d flag); PY a Python scalar (CuPy gives it the type of its parameter).
def a(dtype):
    return ("a", dtype)


def v(dtype):
    return ("v", dtype)


PY = ("s", None)

# kernel factory in kernels.py -> the calls of fast_gpu.py / optim.py (inputs, then outputs)
ELEMENTWISE = {
    # AdamW: float32 (a float16 model's master weights) or float64; grad_scale is 1 or
    # clip_and_step's 0-d factor on the device, skip False or the loss scaler's 0-d flag
    "adamw_kernel": [(a(t), scale, a(BOOL), skip) + (PY,) * 9 + (a(t),) * 3
                     for t in (F, D) for scale in (PY, v(t)) for skip in (PY, v(BOOL))],
}
LAYOUTS = ("contiguous", "strided")


@pytest.fixture(scope="module")
def cupy():
    """The real cupy with the internals read here, or a skip saying what is missing."""
    try:
        import cupy
        from cupy._core import _kernel, core
        from cupy.cuda import compiler
        for module, name in ((_kernel, "_get_elementwise_kernel_code"),
                             (_kernel, "_decide_params_type"), (_kernel, "_ArgInfo"),
                             (core, "_cupy_header_list"),
                             (core, "assemble_cupy_compiler_options"),
                             (compiler, "compile_using_nvcc")):
            if not hasattr(module, name):
                pytest.skip(f"CuPy {cupy.__version__} has no {module.__name__}.{name}: this "
                            f"test drives CuPy 14's kernel code generator")
    except ImportError as e:
        pytest.skip(f"CuPy's kernel code generator is not importable: {e}")
    return cupy


@pytest.fixture(scope="module")
def nvcc(cupy):
    if cupy.cuda.get_nvcc_path() is None:
        pytest.skip("nvcc not found (PATH, CUDA_PATH or NVCC): the kernels' CUDA is not "
                    "compiled")


# ------------------------------------------------------------------- CuPy's source of a call


def _arg_info(cupy, kind, dtype, layout, ndim):
    """CuPy's description of one argument (_kernel._ArgInfo: kind 1 array, 2 indexer,
    3 scalar; dtype, ndim, C-contiguous, 32-bit indices), as a launch derives it."""
    from cupy._core import _carray, _kernel, _scalar
    if kind == "s":
        return _kernel._ArgInfo(3, _scalar.CScalar, numpy.dtype(dtype), 0, True, True)
    if kind == "i":
        return _kernel._ArgInfo(2, _carray.Indexer, None, ndim, True, layout != "strided")
    contiguous = kind == "a" and layout != "strided"
    return _kernel._ArgInfo(1, cupy.ndarray, numpy.dtype(dtype), ndim, contiguous,
                            layout != "strided")


def _elementwise_source(cupy, kernel, args, layout):
    """CuPy's kernel source for kernel(*args): args as in ELEMENTWISE (inputs, then the
    outputs if given; an ElementwiseKernel allocates the missing ones C-contiguous)."""
    from cupy._core import _kernel
    nin = len(kernel.in_params)
    ins, outs = args[:nin], args[nin:]
    out_dtypes = tuple(numpy.dtype(t) for _, t in outs)
    in_types, out_types, type_map = _kernel._decide_params_type(
        kernel.in_params, kernel.out_params,
        tuple(numpy.dtype(t) if k != "s" else None for k, t in ins), out_dtypes)
    if not outs:
        outs = tuple(("a", t) for t in out_types)
    ndim = 4 if layout == "strided" else 2 if any(k == "v" for k, _ in args) else 1
    infos = [_arg_info(cupy, k, t if k != "s" else in_types[i], layout, ndim)
             for i, (k, t) in enumerate(ins)]
    infos += [_arg_info(cupy, k, t, layout, ndim) for k, t in outs]
    infos.append(_arg_info(cupy, "i", None, layout, ndim))
    return _kernel._get_elementwise_kernel_code(
        tuple(infos), type_map, kernel.params, kernel.operation, kernel.name,
        kernel.preamble, **kernel.kwargs)


def _source(cupy, name, args, layout):
    kernel = getattr(kernels, name)(cupy)
    assert isinstance(kernel, cupy.ElementwiseKernel), name
    return _elementwise_source(cupy, kernel, args, layout)


def _label(name, args, layout):
    kinds = {"a": "{}", "v": "{} view", "s": "{} scalar"}
    return (f"{name}({', '.join(kinds[k].format(t or 'python') for k, t in args)}; "
            f"{layout})")


def _variants():
    """(kernel name in kernels.py, label, args, layout) of every compile: each call
    contiguous, the first one also strided (the layout changes only the template arguments
    of CuPy's CArray and CIndexer, not the types the body computes with)."""
    labels = set()
    for name, calls in ELEMENTWISE.items():
        for i, args in enumerate(calls):
            for layout in LAYOUTS[:2 if i == 0 else 1]:
                label = _label(name, args, layout)
                assert label not in labels, label
                labels.add(label)
                yield name, label, args, layout

# ----------------------------------------------------------------------------- nvcc


def _nvcc_errors(cupy, source, raw=False, arch=ARCH):
    """Compile `source` (the kernel's code, CuPy's headers prepended; raw: as written, as
    cupy.RawModule compiles it) as CuPy would for sm_<arch>, with nvcc -> None, or nvcc's
    errors with the source lines they point at."""
    from cupy._core import core
    from cupy.cuda import compiler
    options = ()
    if not raw:
        source = "".join(f"#include <{h}>\n" for h in core._cupy_header_list) + source
        options = core.assemble_cupy_compiler_options(()) + ("-ftz=true",)
    try:
        compiler.compile_using_nvcc(source, options, arch=arch, code_type="cubin")
    except compiler.CompileException as e:
        lines = source.splitlines()
        report = []
        for line in str(e).splitlines():
            found = re.search(r"kern\.cu\((\d+)\): error", line)
            if found or re.search(r"\berror\b", line):
                report.append(line.split("/")[-1] if found else line)
                if found and 0 < int(found.group(1)) <= len(lines):
                    report.append("    at: " + lines[int(found.group(1)) - 1].strip())
        return "\n".join(report[:40]) or str(e)[-3000:]
    return None


def _compile_all(cupy, variants):
    """{label: None or nvcc's errors} for (label, source) pairs, nvcc runs in parallel."""
    workers = max(1, min(4, os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        futures = {label: pool.submit(_nvcc_errors, cupy, source) for label, source in variants}
        return {label: f.result() for label, f in futures.items()}


@pytest.fixture(scope="module")
def generated(cupy):
    """[(kernel name, variant label, CuPy's source or None, None or CuPy's refusal)]: a call
    CuPy refuses before compiling (its parameter types do not fit the arrays) raises the
    same TypeError at the launch on a GPU."""
    out = []
    for name, label, args, layout in _variants():
        try:
            out.append((name, label, _source(cupy, name, args, layout), None))
        except (TypeError, ValueError) as e:
            out.append((name, label, None, f"CuPy refuses the call before compiling: "
                                           f"{type(e).__name__}: {e}"))
    return out


@pytest.fixture(scope="module")
def compiled(cupy, nvcc, generated):
    """{kernel name: {variant label: None or the error}}, every variant compiled once."""
    start = time.perf_counter()
    results = _compile_all(cupy, [(label, source) for _, label, source, _ in generated
                                  if source is not None])
    by_kernel = {}
    for name, label, _, refusal in generated:
        by_kernel.setdefault(name, {})[label] = refusal or results[label]
    print(f"\n{len(results)} kernel variants compiled with nvcc for sm_{ARCH} in "
          f"{time.perf_counter() - start:.1f} s")
    return by_kernel


def test_cupy_accepts_every_call(generated):
    """CuPy's parameter types fit the arrays of every call (no nvcc needed)."""
    refused = "\n".join(f"{label}: {refusal}" for _, label, _, refusal in generated if refusal)
    assert not refused, refused


def _failures(results):
    return "\n\n".join(f"{label}:\n{errors}" for label, errors in results.items() if errors)


@pytest.mark.parametrize("name", [*ELEMENTWISE])
def test_kernel_compiles_for_sm90(compiled, name):
    failures = _failures(compiled[name])
    assert not failures, f"kernels.{name} cannot be built for sm_{ARCH}:\n{failures}"


@pytest.mark.parametrize("arch", CUDA_ARCHS)
@pytest.mark.parametrize("dtype, tile", [("float16", 32), ("float16", 64), ("float32", 32),
                                         ("float64", 32)])
def test_cuda_kernels_compile_for_sm80_and_sm90(cupy, nvcc, dtype, tile, arch):
    """kernels.cuda_source for each activation dtype (float16 with each tile of the
    tensor-core attention), as cupy.RawModule compiles it, for the H100/H200 and the A100;
    the emulated runs (tests/test_cuda_kernels.py, tests/test_fused_attention.py) do not show
    that nvcc accepts the PTX conversions, CUDA's shuffles, shared memory and barriers."""
    errors = _nvcc_errors(cupy, kernels.cuda_source(numpy.dtype(dtype).char, tile), raw=True,
                          arch=arch)
    assert errors is None, f"the CUDA kernels cannot be built for sm_{arch} ({dtype}):\n{errors}"


def test_every_kernel_of_the_gpu_path_is_compiled():
    """The tables above name every kernel there is: kernels.py's factories (functions of
    `xp`), the CUDA source's kernels (each launched by fast_gpu.py), and no CuPy kernel
    defined elsewhere."""
    factories = {name for name, f in vars(kernels).items()
                 if inspect.isfunction(f) and list(inspect.signature(f).parameters) == ["xp"]
                 and name != "nvrtc_probe"}                    # compiles, never launches
    assert factories == set(ELEMENTWISE)
    sources = {p: p.read_text() for p in (ROOT / "nanobert").rglob("*.py")}
    for path, text in sources.items():
        if path.name != "kernels.py":
            found = re.findall(r"ElementwiseKernel\(|ReductionKernel\(|RawKernel|RawModule|"
                               r"\.fuse\(", text)
            assert not found, f"{path}: {found} defines a CuPy kernel outside kernels.py"
    # every CUDA kernel fast_gpu.py launches is in the source, and every one there is launched
    fast_gpu = sources[ROOT / "nanobert" / "model" / "fast_gpu.py"]
    rows = set(re.findall(r'_launch_rows\("(\w+)"', fast_gpu))
    maps = set(re.findall(r'_launch_map\("(\w+)"', fast_gpu))
    fused = set(re.findall(r'_launch_attention\("(\w+)"', fast_gpu))
    columns = set(re.findall(r'_launch_columns\("(\w+)"', fast_gpu))
    defined = set(re.findall(r'extern "C" __global__ void nanobert_(\w+)\(',
                             kernels.cuda_source("f")))
    assert rows == set(kernels.ROW_KERNEL_NAMES) and maps == set(kernels.MAP_KERNEL_NAMES)
    assert fused == set(kernels.ATTENTION_KERNEL_NAMES)
    assert columns == set(kernels.COLUMN_KERNEL_NAMES)
    twins = {name + kernels.ATTENTION_MMA for name in fused}   # float16's, by _launch_attention
    assert rows | maps | fused | twins | columns == defined, (rows, maps, fused, twins,
                                                              columns, defined)


def test_planted_errors_are_reported(cupy, nvcc):
    """The checker itself: a body with a syntax error and one with a float16 type error
    (a conditional between float16 and float: each converts to the other, so C++ finds it
    ambiguous) fail, named, with nvcc's message; the body as written compiles."""
    body = "float v = x;\ny = v * c;\n"         # a float16 read into float32 arithmetic
    planted = {
        "as_written": body,
        "planted_syntax": body.replace("float v = x;", "float v = x"),
        "planted_half_type": body.replace("float v = x;", "float v = c > 0 ? x : c;"),
    }
    assert len(set(planted.values())) == 3
    args = (a(H), a(F), a(H))
    sources = [(label, _elementwise_source(
        cupy, cupy.ElementwiseKernel("float16 x, float32 c", "float16 y", text,
                                     "nanobert_" + label),
        args, "contiguous")) for label, text in planted.items()]
    results = _compile_all(cupy, sources)
    assert results["as_written"] is None
    assert "error" in results["planted_syntax"] and "expected a \";\"" in \
        results["planted_syntax"], results["planted_syntax"]
    assert 'error: ambiguous "?" operation: second operand of type "const float16"' in \
        results["planted_half_type"] and "at: float v = c > 0" in \
        results["planted_half_type"], results["planted_half_type"]
    failures = _failures(results)                   # what test_kernel_compiles shows
    assert "as_written" not in failures
    assert "planted_syntax:" in failures and "planted_half_type:" in failures
