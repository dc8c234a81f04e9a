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

Out of bounds: each launch copies its arrays' memory into pages of its own, 1 MiB of guard
pages (no access allowed) on either side, the data ending within 255 bytes of the guard
after it (as aligned modulo 256 as it was); arrays that share memory share a placement. An
access into a guard (cuda_emulation.h catches the fault) or a write into the bytes between
data and guard (a sentinel pattern, checked after) raises OutOfBounds, a test failure that
names the kernel, the argument and the element index (and for a guard, the block and the
thread), instead of a crash of the test process or a silent write into other memory. A read
of those few bytes past the end, or of the bytes before the start within the first page,
is not caught.
"""
import ctypes
import hashlib
import mmap
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
GUARD_BYTES = 1 << 20                     # guard pages on either side of each placement
ALIGN = 256                               # CuPy's allocations' alignment
SENTINEL = 0xA5


class OutOfBounds(AssertionError):
    """A kernel read or wrote outside the arrays it was given."""


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
    library = _library(source)
    function = getattr(library, f"launch_{name}")
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
                converted.append(value)
            else:
                if not isinstance(value, numpy.generic) or value.dtype != p.dtype:
                    raise TypeError(f"{where}: a numpy.{p.dtype} scalar, not "
                                    f"{_describe(value)} (CuPy passes a Python int as 8 "
                                    f"bytes and a float as a double)")
                converted.append(numpy.ctypeslib.as_ctypes_type(p.dtype)(value.item()))
        with _Placement(library, name, params, converted) as placed:
            function(ctypes.c_uint(grid), ctypes.c_uint(block), *placed)

    return run


def _span(a):
    """The bytes [start, end) a kernel may touch of array a: C-contiguous, its own; padded
    rows, every row's padding too (a kernel told the row length may write it: the padded
    vocab's zeros), as far as the array it is a view of goes."""
    start = a.__array_interface__["data"][0]
    if a.flags.c_contiguous:
        return start, start + a.nbytes
    root = a
    while isinstance(root.base, numpy.ndarray):
        root = root.base
    return start, min(start + a.shape[0] * a.strides[0],
                      root.__array_interface__["data"][0] + root.nbytes)


_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mmap.restype, _LIBC.mmap.argtypes = ctypes.c_void_p, [
    ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_LIBC.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


class _Placement:
    """The launch's arrays copied between guard pages (see the module's doc), the arguments
    pointing there; on leaving, the memory copied back and the guards' record read:
    OutOfBounds if an access or a write went outside."""

    def __init__(self, library, kernel, params, args):
        self.library, self.kernel, self.params, self.args = library, kernel, params, args

    def __enter__(self):
        spans = sorted((_span(a) + (i,) for i, a in enumerate(self.args)
                        if isinstance(a, numpy.ndarray)))
        self.regions = []                      # [start, end, [argument indices]]
        for start, end, i in spans:            # arrays whose memory overlaps: one region
            if self.regions and start < self.regions[-1][1]:
                self.regions[-1][1] = max(self.regions[-1][1], end)
                self.regions[-1][2].append(i)
            else:
                self.regions.append([start, end, [i]])
        self.placed = list(self.args)
        self.maps = [self._place(*region) for region in self.regions]
        return [ctypes.c_void_p(a) if isinstance(a, int) else a for a in self.placed]

    def _place(self, start, end, members):
        """One region's copy: [guard][pages: sentinel, data][guard] -> its mapping."""
        page = mmap.PAGESIZE
        pages = -(-(end - start + 2 * ALIGN) // page) * page
        total = 2 * GUARD_BYTES + pages
        base = _LIBC.mmap(None, total, mmap.PROT_READ | mmap.PROT_WRITE,
                          mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if base in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap for the emulation's guard pages")
        body = base + GUARD_BYTES
        data = body + pages - (end - start)
        data -= (data - start) % ALIGN                 # start's alignment modulo 256 kept
        memory = numpy.ctypeslib.as_array((ctypes.c_ubyte * pages).from_address(body))
        memory[:] = SENTINEL
        source = numpy.ctypeslib.as_array((ctypes.c_ubyte * (end - start)).from_address(start))
        memory[data - body:data - body + end - start] = source
        for guard in (base, body + pages):
            _LIBC.mprotect(guard, GUARD_BYTES, 0)           # PROT_NONE
            self.library.emulation_guard(ctypes.c_void_p(guard), ctypes.c_size_t(GUARD_BYTES))
        for i in members:
            self.placed[i] = data + (self.args[i].__array_interface__["data"][0] - start)
        return base, total, body, pages, data, source, memory

    def __exit__(self, *exc):
        address, block, thread = ctypes.c_ulonglong(), ctypes.c_uint(), ctypes.c_int()
        faults = self.library.emulation_fault(ctypes.byref(address), ctypes.byref(block),
                                              ctypes.byref(thread))
        problem = None
        for (start, end, members), (base, total, body, pages, data, source, memory) in zip(
                self.regions, self.maps):
            inside = memory[data - body:data - body + end - start]
            source[:] = inside                                 # the kernel's writes
            if faults and base <= address.value < base + total:
                problem = problem or (f"block {block.value}, thread {thread.value}: an access "
                                      + self._where(address.value, data, start, members))
            outside = numpy.flatnonzero(numpy.concatenate(
                [memory[:data - body], memory[data - body + end - start:]]) != SENTINEL)
            if problem is None and outside.size:
                at = body + outside[0] + (end - start if outside[0] >= data - body else 0)
                problem = "a write (its thread unknown: within 256 bytes of an end) " + \
                    self._where(at, data, start, members)
        self.maps = [_LIBC.munmap(base, total) for base, total, *_ in self.maps]
        if problem and exc[0] is None:
            raise OutOfBounds(f"kernel {self.kernel}: {problem}")
        return False

    def _where(self, at, data, start, members):
        """'at element I of argument N (name), of E elements' for the region's nearest array."""
        def distance(i):
            a_start, a_end = (data + _span(self.args[i])[k] - start for k in (0, 1))
            return max(a_start - at, at - a_end + 1, 0)
        i = min(members, key=distance)
        a = self.args[i]
        first = data + a.__array_interface__["data"][0] - start
        return (f"at element {(at - first) // a.itemsize} of argument {i} "
                f"({self.params[i].name}, {a.dtype} {a.shape}, {a.size} elements)")


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
