"""nanobert's CUDA kernels (nanobert/model/kernels.cu, as kernels.cuda_source gives it)
compiled for the CPU with g++ and run there: the same source a GPU compiles, with
tests/cuda_emulation.h for threadIdx, blockIdx, the warps' shuffles and __syncwarp, a block's
__syncthreads and __shared__ memory (every thread of a block a fiber; a divergent barrier or
shuffle stops the process, a missing barrier gives a wrong result: its header says how) and
for the two float16 conversions (PTX on the GPU; C++'s _Float16 here, which rounds to nearest
even as cvt.rn does). So the tests run the kernels' own indexing, loops, shuffles, barriers
and arithmetic, not a NumPy twin. What this does not show: CUDA's own rounding
(nvcc contracts a * b + c into an fma; g++ here does not) and its math library's
expf/erff/sqrtf, speed, or that NVRTC compiles the source (tests/test_kernels_compile.py
compiles it with nvcc).

launch(source, name) -> a callable (grid, block, args) taking NumPy arrays for the pointer
parameters and NumPy scalars of the parameter's exact type for the others, as a CuPy
RawKernel call takes them; it refuses anything else with a message naming the kernel and
the argument.
"""
import ctypes
import hashlib
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy


HEADER = Path(__file__).with_name("cuda_emulation.h")
C_TYPES = {"half16": numpy.float16, "float": numpy.float32, "double": numpy.float64,
           "int": numpy.int32, "long long": numpy.int64, "unsigned int": numpy.uint32,
           "unsigned long long": numpy.uint64}
SIGNATURE = re.compile(r'extern "C" __global__ void (\w+)\(([^)]*)\)')
CACHE = Path(tempfile.gettempdir()) / "nanobert-cuda-emulation"
_LIBRARIES = {}


def available():
    return shutil.which("g++") is not None


class Parameter:
    def __init__(self, text, typedefs):
        m = re.fullmatch(r"\s*(const\s+)?([\w ]+?)\s*(\*?)\s*(\w+)\s*", text)
        ctype = typedefs.get(m.group(2), m.group(2))
        self.name, self.pointer = m.group(4), bool(m.group(3))
        self.dtype = numpy.dtype(C_TYPES[ctype])


def signatures(source):
    """{kernel name: [Parameter]} of the source's extern "C" kernels."""
    typedefs = dict((alias, ctype) for ctype, alias in
                    re.findall(r"typedef ([\w ]+?) (\w+);", source))
    for alias, ctype in list(typedefs.items()):
        while ctype not in C_TYPES and ctype in typedefs:
            ctype = typedefs[ctype]
        typedefs[alias] = ctype
    return {name: [Parameter(p, typedefs) for p in params.split(",")]
            for name, params in SIGNATURE.findall(source)}


def _cpu_source(source):
    wrappers = []
    for name, params in signatures(source).items():
        args = ", ".join(f"{'void*' if p.pointer else _c_name(p.dtype)} {p.name}"
                         for p in params)
        call = ", ".join(f"({_c_name(p.dtype)}*){p.name}" if p.pointer else p.name
                         for p in params)
        wrappers.append(f'extern "C" void launch_{name}(unsigned grid, unsigned block, {args}) '
                        f'{{ emulate_launch(grid, block, [=] {{ {name}({call}); }}); }}')
    return f'#include "{HEADER}"\n{source}\n' + "\n".join(wrappers) + "\n"


def _c_name(dtype):
    return {numpy.dtype(v): k for k, v in C_TYPES.items()}[numpy.dtype(dtype)]


def _library(source):
    """The source compiled for the CPU (once per source and process; cached on disk)."""
    if source not in _LIBRARIES:
        text = _cpu_source(source)
        digest = hashlib.sha256((text + HEADER.read_text()).encode()).hexdigest()[:16]
        path = CACHE / f"{digest}.so"
        if not path.exists():
            CACHE.mkdir(parents=True, exist_ok=True)
            cpp = CACHE / f"{digest}.cpp"
            cpp.write_text(text)
            tmp = CACHE / f"{digest}.{id(text)}.so"
            result = subprocess.run(["g++", "-std=c++20", "-O1", "-shared", "-fPIC",
                                     "-fno-fast-math", "-ffp-contract=off", "-o", str(tmp),
                                     str(cpp)], capture_output=True, text=True)
            if result.returncode:
                raise RuntimeError(f"g++ cannot compile the emulated kernels:\n"
                                   f"{result.stderr[-3000:]}")
            tmp.replace(path)
        _LIBRARIES[source] = ctypes.CDLL(str(path))
    return _LIBRARIES[source]


def launch(source, name):
    """-> run(grid, block, args): the kernel `name` of `source` on NumPy arrays."""
    params = signatures(source)[name]
    function = getattr(_library(source), f"launch_{name}")
    function.restype = None

    def run(grid, block, args):
        if len(args) != len(params):
            raise TypeError(f"kernel {name}: {len(args)} arguments for {len(params)} "
                            f"parameters")
        converted = []
        for i, (p, value) in enumerate(zip(params, args)):
            where = f"kernel {name}, argument {i} ({p.name})"
            if p.pointer:
                if not isinstance(value, numpy.ndarray) or value.dtype != p.dtype:
                    raise TypeError(f"{where}: a {p.dtype} array, not {_describe(value)}")
                if not value.flags.c_contiguous and not _padded_rows(value):
                    raise TypeError(f"{where}: a C-contiguous array (the kernel indexes it "
                                    f"as one) or a matrix of padded rows, not a view of "
                                    f"strides {value.strides}")
                converted.append(ctypes.c_void_p(value.ctypes.data))
            else:
                if not isinstance(value, numpy.generic) or value.dtype != p.dtype:
                    raise TypeError(f"{where}: a numpy.{p.dtype} scalar, not "
                                    f"{_describe(value)} (CuPy passes a Python int as 8 "
                                    f"bytes and a float as a double)")
                converted.append(numpy.ctypeslib.as_ctypes_type(p.dtype)(value.item()))
        function(ctypes.c_uint(grid), ctypes.c_uint(block), *converted)

    return run


def _padded_rows(a):
    """Whether a is a matrix of adjacent elements whose rows lie at least a row apart (a view
    of wider rows, fast_gpu._output_rows: CuPy passes its first element's address, and a
    kernel told the row length indexes it)."""
    return (a.ndim == 2 and a.strides[1] == a.itemsize and a.strides[0] % a.itemsize == 0
            and a.strides[0] >= a.shape[1] * a.itemsize)


def _describe(value):
    if isinstance(value, (numpy.ndarray, numpy.generic)):
        return f"a {value.dtype} {type(value).__name__}"
    return f"a {type(value).__name__}"
