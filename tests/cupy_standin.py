"""A strict stand-in for CuPy that runs on the CPU: the real cupy package's namespace
(names, function keywords, ufunc methods, ndarray and Generator methods, as CuPy 14.2 gives
them: tests/cupy_namespace.json, so CuPy need not be installed), computing with NumPy,
counting kernel launches and device-to-host syncs.

It proves what a CPU can prove about the CuPy path: that nanobert calls only what CuPy has,
with keywords CuPy accepts, never hands a NumPy array to a device op or a device array to
NumPy (CuPy raises on both), and how many kernels and host waits a step costs. It proves
nothing about CUDA numerics, compilation of the kernels, or speed.

    with cupy_standin.installed() as cupy:    # sys.modules["cupy"] and ["cupyx..."] swapped
        cupy.counts.reset()
        ...                                   # nanobert on device="gpu"
        cupy.counts.launches, cupy.counts.syncs  # kernels + memsets + copies; host reads

Counting rules: what CuPy 14.2's own source launches for each call the project makes (the
rule beside each emulation cites the CuPy file it comes from), in three counters: kernels,
memsets (cudaMemsetAsync) and copies (cudaMemcpyAsync, host <-> device or device <->
device); `launches` is their sum (and `passes_over(n)`: the kernels with an operand of >= n
elements, where the size is recorded: ufuncs, ElementwiseKernels, vdot). An elementwise
ufunc, a cupy.fuse'd function, an ElementwiseKernel, a cast (astype) and a contiguous copy
are one kernel each; zeros / zeros_like are a memset; reductions are CUB's or CuPy's generic
kernel (one or two, and a divide for mean); a Generator draw is one kernel (two for
integers); a batched matmul of float16 casts its operands to float32 and its product back;
fancy indexing with several index arrays prepares a flat index (a memset and a kernel per
index array) first. Views (reshape, transpose, basic slicing, astype to the same dtype
without copy) and empty allocations are nothing; ufunc outputs are C-contiguous, as CuPy
allocates them. What cuBLAS or CUB do inside one call (a split-K GEMM's second kernel) is
not visible in CuPy's source: counted as CuPy calls it, except CUB's DeviceReduce (two
passes above one tile).
A sync is any read of device data by the host: float(), int(), bool(), item(), tolist(),
get(), asnumpy(), repr(), boolean-mask indexing (CuPy must learn the count),
Device.synchronize(), Event.synchronize(), Stream.synchronize(). A host wait (host_waits) is
a copy of a pageable NumPy array to the device (cupy.asarray / array, ndarray.set): CuPy
stages it through a pinned buffer on the host first (cupy/_core/core.pyx, _array_default),
and on the GPU the host was measured waiting there. An async copy from pinned memory is no
wait, but is checked for a source written while it was in flight (see 'pinned memory and
streams').

ElementwiseKernel bodies are CUDA C; the stand-in runs straight-line bodies (declarations,
assignments, arithmetic, sqrt, a top-level ternary) as NumPy, so the kernel's arithmetic is
checked here, its compilation is not (nor CUDA's own rounding: fma contraction, for one).
"""
import collections
import contextlib
import ctypes
import math
import re
import sys
import time
import types
import weakref

import numpy

import cupy_namespace
from cupy_namespace import signature as _signature
from nanobert.model import cublas as nanobert_cublas
from nanobert.model import special as nanobert_special


class Counts:
    """What the GPU is asked to do, as CuPy 14 would ask it: kernels, memsets and copies
    (each with its own counter; launches is their sum), by name in `kernels`; syncs (the
    host reads device data) and host waits (a pageable host-to-device copy)."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.kernel_launches = 0
        self.memsets = 0
        self.copies = 0
        self.syncs = 0
        self.host_waits = 0
        self.host_to_device = 0
        self.pageable_copies = 0                 # host waits too (pinned memory below)
        self.pinned_copies = 0
        self.generators = 0
        self.captures = 0                        # stream captures ended (graphs made)
        self.graph_launches = 0
        self.graph_nodes = 0                     # operations those launches replayed
        self.kernels = collections.Counter()     # name -> kernels, memsets and copies of it
        self.sizes = []      # per kernel: its largest operand's elements (0: not recorded)
        self.sync_sites = collections.Counter()  # what synced -> count
        self.gemms = []                          # a GemmCall for each cuBLAS product

    @property
    def launches(self):
        return self.kernel_launches + self.memsets + self.copies

    def launch(self, name, elements=0):
        """One kernel; elements: the size of its largest operand, where the caller knows it
        (ufuncs, ElementwiseKernels, vdot)."""
        if _state.fusing:
            return
        _check_stream(name)
        self.kernel_launches += 1
        self.kernels[name] += 1
        self.sizes.append(elements)

    def passes_over(self, elements):
        """How many kernels read or wrote an operand of at least `elements` elements: the
        passes over a large buffer (of the kernels whose size is recorded)."""
        return sum(size >= elements for size in self.sizes)

    def memset(self, name):
        _check_stream(name)
        self.memsets += 1
        self.kernels[f"memset: {name}"] += 1

    def copy(self, name):
        """One cudaMemcpyAsync (not a copy kernel: those are kernels, cupy_copy)."""
        _check_stream(name)
        self.copies += 1
        self.kernels[f"memcpy: {name}"] += 1

    def host_wait(self, what):
        _refuse_in_capture(f"{what} (a host wait)")
        self.host_waits += 1
        self.sync_sites[f"host wait: {what}"] += 1

    def sync(self, what):
        _refuse_in_capture(f"{what} (the host reads the device)")
        self.syncs += 1
        self.sync_sites[what] += 1
        _copies_land()                           # the host caught up with the device


class GemmCall(collections.namedtuple(
        "GemmCall", "transa transb m n k lda ldb ldc types addresses")):
    """One cublasGemmStridedBatchedEx as cuBLAS sees it (column-major; types the NumPy dtype
    characters of A, B, C; addresses their first elements' device addresses): what decides
    whether it may run a vectorized kernel (`aligned`)."""

    def contiguous_extents(self):
        """The extents along which each operand's elements are adjacent (C's m; A's m or k,
        B's k or n, by their op), as CUTLASS's can_implement checks them."""
        return {"A": self.m if self.transa == 0 else self.k,
                "B": self.k if self.transb == 0 else self.n, "C": self.m}

    def aligned(self, vector_bytes=16):
        """Whether every operand's address, leading dimension and contiguous extent are
        multiples of a vector_bytes load (float16: 8 elements; float32: 4)."""
        sizes = dict(zip("ABC", (numpy.dtype(t).itemsize for t in self.types)))
        lds = dict(zip("ABC", (self.lda, self.ldb, self.ldc)))
        at = dict(zip("ABC", self.addresses))
        return all(at[x] % vector_bytes == 0 and (lds[x] * sizes[x]) % vector_bytes == 0
                   and (extent * sizes[x]) % vector_bytes == 0
                   for x, extent in self.contiguous_extents().items())


counts = Counts()


class _State:
    fusing = False
    capture = None           # the _Capture of the stream being captured, if any
    allocator = None         # what cupy.cuda.using_allocator set (None: the default pool)


_state = _State()


def _device_op(compute, on_replay=None):
    """Run one operation of the device now: compute() does it with NumPy (reading its inputs'
    memory as it is now) and returns its result array (or None where it wrote in place).
    While a stream is captured the operation is also recorded, so that a graph's replay
    recomputes it from whatever that memory holds then, into the same result memory; host
    values in compute's closure (a Python float, a host draw) are baked in, as a CUDA graph
    bakes a kernel's arguments. on_replay: run before each replay (a copy's bookkeeping)."""
    return _record(compute, compute(), on_replay)


def _record(compute, result, on_replay=None):
    """While a stream is captured: remember an operation already run (see _device_op)."""
    if _state.capture is not None:
        _state.capture.ops.append((compute, result, on_replay))
    return result


def _array(r):
    """A NumPy scalar result as a 0-d array (memory a replay can write into)."""
    return numpy.asarray(r) if isinstance(r, numpy.generic) else r


def _into(target, value):
    """target[...] = value -> target (an operation whose result memory is target)."""
    target[...] = value
    return target


def _refuse_in_capture(what):
    if _state.capture is not None:
        raise StandinError(f"{what} during stream capture: CUDA invalidates the capture "
                           f"(cudaErrorStreamCaptureUnsupported); the captured step must "
                           f"not read the device or copy from pageable memory")


def _refuse_cupy_cublas(what):
    """CuPy 14's cuBLAS wrappers (cupy_backends' cublas, hence matmul, dot, vdot) check
    stream capture and raise this; ctypes calls into libcublas are not checked."""
    if _state.capture is not None:
        raise NotImplementedError(f"{what}: calling cuBLAS API during stream capture is "
                                  f"currently unsupported")


class StandinError(TypeError):
    """What real CuPy would refuse (or what the stand-in refuses to let pass silently)."""


class CUDARuntimeError(RuntimeError):
    """An error CUDA returns (CuPy raises cupy_backends' CUDARuntimeError for it)."""


def _check_stream(what):
    """During a capture, work on the legacy default stream (stream 0): CUDA refuses it
    (cudaErrorStreamCaptureImplicit) and invalidates the capture, when the capturing stream
    is a blocking one (the legacy stream waits for every blocking stream: that would wait on
    work not yet launched). Work on any other stream than the capturing one is not modelled."""
    capture = _state.capture
    if capture is None:
        return
    stream = get_current_stream()
    if stream.ptr == 0:
        _legacy_stream_use(f"{what} on the legacy default stream")
    elif stream is not capture.stream:
        raise StandinError(f"{what} on another stream than the one captured (not modelled)")


def _legacy_stream_use(what):
    """Something used the legacy stream (or synchronised the device) during a capture."""
    capture = _state.capture
    if capture.stream.non_blocking:
        raise StandinError(f"{what} during a capture on a non-blocking stream: legal on a "
                           f"GPU, not modelled here")
    capture.invalid = capture.invalid or what
    raise CUDARuntimeError(f"cudaErrorStreamCaptureImplicit: {what} during stream capture "
                           f"on a blocking stream; the capture is invalidated")


# ------------------------------------------------------------------------- signatures
# The real CuPy's names and parameters (tests/cupy_namespace.py); _signature(parameters) ->
# an inspect.Signature that binds as CuPy's does

NAMESPACE = cupy_namespace.load()


def _check_call(what, signature, args, kwargs):
    if signature is None:
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as e:
        raise StandinError(f"{what}: {e} (real CuPy's signature is {what}{signature})") from None

# ------------------------------------------------------------------ arrays in and out


def _root(a):
    while isinstance(a.base, numpy.ndarray):
        a = a.base
    return a


def _unwrap(x, what):
    """stand-in array -> its NumPy array; a NumPy array is refused (implicit host/device
    mixing); lists and tuples are unwrapped element by element."""
    if isinstance(x, ndarray):
        return x._a
    if isinstance(x, numpy.ndarray):
        raise StandinError(f"{what}: a NumPy array where CuPy needs a device array "
                           f"(implicit host -> device conversion; CuPy raises TypeError)")
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v, what) for v in x)
    return x


def _wrap(r, inputs=()):
    """NumPy result -> stand-in array; a view of an input keeps that input's base."""
    if isinstance(r, tuple):
        return tuple(_wrap(v, inputs) for v in r)
    if isinstance(r, numpy.generic):
        return ndarray(numpy.asarray(r))
    if not isinstance(r, numpy.ndarray):
        return r
    root = _root(r)
    for x in inputs:
        if isinstance(x, ndarray):
            if r is x._a:
                return x
            if _root(x._a) is root:
                return ndarray(r, x._base if x._base is not None else x)
    return ndarray(r)


def _is_view(result, inputs):
    return isinstance(result, ndarray) and any(
        isinstance(x, ndarray) and result._base is not None
        and result._base is (x._base if x._base is not None else x) for x in inputs)


def _no_fusing(what):
    if _state.fusing:
        raise StandinError(f"{what} inside a cupy.fuse'd function: the stand-in allows only "
                           f"elementwise ufuncs and operators there")


# ------------------------------------------------------------------------ reductions
# cupy/_core/_routines_math.pyx (_ndarray_sum), _routines_statistics.pyx (_ndarray_max,
# _ndarray_mean, _ndarray_argmax): with CUPY_ACCELERATORS' default 'cub'
# (cupy/_core/_accelerator.pyx) a reduction first tries cupy/cuda/cub.pyx's cub_reduction:
# a full reduction is CUB's DeviceReduce, one whose reduced axes are the array's innermost
# (last axes of a C-order array, first of an F-order one) its DeviceSegmentedReduce; an
# out= costs a copy kernel after either. Otherwise CuPy's generic reduction kernel
# (cupy/_core/_reduction.pyx), which itself tries CUB's block reduction
# (_cub_reduction.pyx: same axis rule, at least 128 elements per output, two passes for a
# full reduction). Column sums of a C-order matrix (axis=0) take the generic kernel.

# cub.pyx CUB_sum_support_dtype_with_half, CUB_support_dtype_with_half (a GPU with float16)
CUB_SUM_DTYPES = {numpy.dtype(t) for t in (numpy.int64, numpy.uint64, numpy.float32,
                                            numpy.float64, numpy.complex64,
                                            numpy.complex128, numpy.float16)}
CUB_DTYPES = CUB_SUM_DTYPES | {numpy.dtype(t) for t in (numpy.int8, numpy.uint8, numpy.int16,
                                                         numpy.uint16, numpy.int32,
                                                         numpy.uint32)}
CUB_BLOCK_MINIMUM = 128     # _cub_reduction.pyx CUB_REDUCE_SIZE_THRESHOLD
CUB_TILE = 256 * 16         # DeviceReduce: one kernel up to one tile (CUB's reduce policy)
REDUCTIONS = {"sum", "prod", "max", "min", "mean", "argmax", "argmin", "all", "any"}


def _reduced_axes(a, axis):
    if axis is None:
        return tuple(range(a.ndim))
    axes = axis if isinstance(axis, tuple) else (axis,)
    return tuple(sorted(int(x) % a.ndim for x in axes))


def _innermost(a, axes):
    """cub._cub_device_segmented_reduce_axis_compatible: the reduced axes are consecutive
    and innermost in memory (C order is looked at first, as cub_reduction does)."""
    if not axes or list(axes) != list(range(axes[0], axes[-1] + 1)):
        return False
    if a.flags.c_contiguous:
        return axes[-1] == a.ndim - 1
    if a.flags.f_contiguous:
        return axes[0] == 0
    return False


def _cub_routine(a, op, axes, dtype):
    """cub.cub_reduction -> its kernel names, or None where CuPy falls back."""
    if a.size == 0 or not (a.flags.c_contiguous or a.flags.f_contiguous):
        return None
    supported = CUB_SUM_DTYPES if op in ("sum", "prod") and dtype is None else CUB_DTYPES
    if (dtype is not None and numpy.dtype(dtype) != a.dtype) or a.dtype not in supported:
        return None
    if len(axes) == a.ndim:                                  # device_reduce
        return ["cub DeviceReduce"] * (1 if a.size <= CUB_TILE else 2)
    if op in ("argmax", "argmin") or not _innermost(a, axes):
        return None
    return ["cub DeviceSegmentedReduce"]


def _generic_reduction(a, name, axes):
    """_reduction.pyx _AbstractReductionKernel._call: CUB's block reduction or one kernel."""
    per_output = math.prod(a.shape[i] for i in axes)
    if a.size and _innermost(a, axes) and per_output >= CUB_BLOCK_MINIMUM:
        return [f"cupy_{name} (CUB block)"] * (2 if len(axes) == a.ndim else 1)
    return [f"cupy_{name}"]


def _reduction_kernels(name, a, axis=None, dtype=None, out=None):
    """The kernels CuPy 14 launches for a.<name>(axis, dtype, out) on the NumPy-held a."""
    axes = _reduced_axes(a, axis)
    if name == "mean":        # _ndarray_mean: a CUB sum then a divide, or cupy_mean
        dtype_sum = numpy.float32 if dtype is None and a.dtype == numpy.float16 else dtype
        cub = _cub_routine(a, "sum", axes, dtype_sum)
        kernels = cub + ["true_divide"] if cub else _generic_reduction(a, name, axes)
        if dtype is None and a.dtype == numpy.float16 and out is None:
            kernels.append("astype (mean back to float16)")
        return kernels
    if name in ("all", "any"):
        return _generic_reduction(a, name, axes)
    cub = _cub_routine(a, name, axes, dtype)
    if cub is None:
        return _generic_reduction(a, name, axes)
    if name in ("argmax", "argmin"):
        cub.append("astype (CUB's key to int64)")
    return cub + (["copy into out"] if out is not None else [])


def _reduction_call(name, a, args, kwargs):
    """The kernels of a.<name>(*args, **kwargs) (ndarray method or cupy function)."""
    names = ("axis", "dtype", "out") if name not in ("max", "min", "argmax", "argmin") \
        else ("axis", "out", "dtype")
    bound = dict(zip(names, args))
    bound.update({k: v for k, v in kwargs.items() if k in names})
    out = bound.get("out")
    return _reduction_kernels(name, a, bound.get("axis"), bound.get("dtype"),
                              None if out is None else out)


class _Data:
    def __init__(self, a):
        self.ptr = a.__array_interface__["data"][0]


REAL_NDARRAY_NAMES = set(NAMESPACE["ndarray"])
SYNC_METHODS = {"get", "item", "tolist", "tobytes", "__float__", "__int__", "__bool__",
                "__index__", "__complex__", "__repr__", "__str__", "__format__"}


class ndarray:
    """A device array: a NumPy array that refuses to meet NumPy."""
    __array_priority__ = 100

    def __init__(self, a, base=None):
        self._a = a
        self._base = base

    # -- attributes that cost nothing
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    itemsize = property(lambda self: self._a.itemsize)
    nbytes = property(lambda self: self._a.nbytes)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    base = property(lambda self: self._base)
    data = property(lambda self: _Data(self._a))
    T = property(lambda self: _wrap(self._a.T, (self,)))

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    # -- NumPy must not take device arrays
    def __array__(self, *args, **kwargs):
        raise StandinError("implicit device -> host conversion (numpy.asarray of a cupy array; "
                           "CuPy raises TypeError): use .get() / to_host")

    def __array_function__(self, func, types, args, kwargs):
        raise StandinError(f"numpy.{func.__name__} called on a device array: use the cupy "
                           f"namespace (xp)")

    def __array_ufunc__(self, ufunc, method, *args, **kwargs):
        raise StandinError(f"numpy.{ufunc.__name__} called on a device array: use xp")

    # -- reads of device data by the host: syncs
    def _host(self, what):
        _no_fusing(what)
        counts.sync(what)
        return self._a

    def get(self, stream=None, order="C", out=None, blocking=True):
        return self._host("get").copy()

    def item(self, *args):
        return self._host("item").item(*args)

    def tolist(self):
        return self._host("tolist").tolist()

    def __float__(self):
        return float(self._host("float"))

    def __int__(self):
        return int(self._host("int"))

    def __index__(self):
        return self._host("index").__index__()

    def __bool__(self):
        return bool(self._host("bool"))

    def __repr__(self):
        return "stand-in " + repr(self._host("repr"))

    __str__ = __repr__

    # -- indexing
    def __getitem__(self, index):
        _no_fusing("indexing")
        idx = _unwrap(index, "indexing")
        parts = idx if isinstance(idx, tuple) else (idx,)
        if any(isinstance(p, numpy.ndarray) and p.dtype == bool for p in parts):
            counts.sync("boolean-mask indexing")
        taken = self._a[idx]
        r = _wrap(taken, (self,))
        if not _is_view(r, (self,)):
            _flat_index("getitem", parts)
            counts.launch("getitem (take)")
            _record(lambda: self._a[idx], taken)
        return r

    def __setitem__(self, index, value):
        """cupy/_core/_routines_indexing.pyx _scatter_op(op='update')."""
        _no_fusing("item assignment")
        idx = _unwrap(index, "item assignment")
        target = self._a[idx] if not _index_arrays(idx) else None
        parts = idx if isinstance(idx, tuple) else (idx,)
        if target is None:                          # scatter through index arrays
            _scatter_value(value, self.dtype, "setitem")
            _flat_index("setitem", parts)
            counts.launch("setitem (scatter_update)")
        elif not isinstance(value, ndarray):
            _fill(target, value, "setitem")
        elif value.shape == target.shape and value.strides == target.strides \
                and target.flags.c_contiguous and value.dtype == target.dtype:
            if value._a.__array_interface__["data"][0] != \
                    target.__array_interface__["data"][0]:
                counts.copy("setitem (device to device)")
        else:
            counts.launch("setitem (cupy_copy)")
        source = _unwrap(value, "item assignment")
        _device_op(lambda: self._a.__setitem__(idx, source))

    # -- methods: only those of cupy.ndarray, with its keywords
    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in REAL_NDARRAY_NAMES:
            raise AttributeError(f"cupy.ndarray has no attribute {name!r} (NumPy-only)")
        signature = _signature(NAMESPACE["ndarray"][name])
        method = getattr(self._a, name)

        def call(*args, **kwargs):
            _no_fusing(f"ndarray.{name}")
            _check_call(f"cupy.ndarray.{name}", signature, (self, *args), kwargs)
            uargs = _unwrap(args, f"ndarray.{name}")
            ukwargs = {k: _unwrap(v, f"ndarray.{name}") for k, v in kwargs.items()}
            computed = _array(method(*uargs, **ukwargs))
            r = _wrap(computed, (self,))
            if r is None or (r is not self and not _is_view(r, (self,))):
                _record(lambda: _array(method(*uargs, **ukwargs)), computed)  # a copy, in place
            if name in REDUCTIONS:
                for kernel in _reduction_call(name, self._a, args, kwargs):
                    counts.launch(f"ndarray.{name}: {kernel}")
            elif name == "fill":
                _fill(self._a, args[0] if args else kwargs["value"], "ndarray.fill")
            elif r is not self and not _is_view(r, (self,)):
                counts.launch(f"ndarray.{name}")       # astype, copy: cupy_copy, one kernel
            elif r is None:
                counts.launch(f"ndarray.{name}")
            return r
        return call


def _fill(a, value, what):
    """core.pyx ndarray.fill: a memset where the value is 0 and a is C-contiguous, else the
    cupy_fill kernel. A device value is compared with 0 on the device and read back (a
    sync) before either."""
    if isinstance(value, ndarray):
        counts.launch(f"{what}: value == 0")
        counts.sync(f"{what} of a device value")
        value = value._a[()]
    if value == 0 and a.flags.c_contiguous:
        counts.memset(what)
    else:
        counts.launch(f"{what} (cupy_fill)")


def _index_arrays(idx):
    parts = idx if isinstance(idx, tuple) else (idx,)
    return [p for p in parts if isinstance(p, numpy.ndarray)]


def _flat_index(what, parts):
    """_prepare_multiple_array_indexing: with several index arrays CuPy zeroes a flat int64
    index (a memset) and adds each array into it (a kernel each) before the take/scatter."""
    arrays = [p for p in parts if isinstance(p, numpy.ndarray)]
    if len(arrays) > 1:
        counts.memset(f"{what}: flat index")
        for _ in arrays:
            counts.launch(f"{what}: cupy_prepare_array_indexing")


def _scatter_value(value, dtype, what):
    """_scatter_op_single: a host scalar becomes a 0-d device array (core.array: a fill), a
    device value of another dtype is cast (astype)."""
    if not isinstance(value, ndarray):
        _fill(numpy.empty(()), value, f"{what}: 0-d value")
    elif value.dtype != dtype:
        counts.launch(f"{what}: astype of the value")


def _operator(ufunc_name, reflected=False, inplace=False):
    def op(self, other):
        u = _ufunc(ufunc_name)
        if inplace:
            return u(self, other, out=self)
        return u(other, self) if reflected else u(self, other)
    return op


for _name, _ufunc_name in (("add", "add"), ("sub", "subtract"), ("mul", "multiply"),
                           ("truediv", "true_divide"), ("floordiv", "floor_divide"),
                           ("pow", "power"), ("mod", "remainder"), ("and", "bitwise_and"),
                           ("or", "bitwise_or"), ("xor", "bitwise_xor")):
    setattr(ndarray, f"__{_name}__", _operator(_ufunc_name))
    setattr(ndarray, f"__r{_name}__", _operator(_ufunc_name, reflected=True))
    setattr(ndarray, f"__i{_name}__", _operator(_ufunc_name, inplace=True))
for _name, _ufunc_name in (("lt", "less"), ("le", "less_equal"), ("gt", "greater"),
                           ("ge", "greater_equal"), ("eq", "equal"), ("ne", "not_equal")):
    setattr(ndarray, f"__{_name}__", _operator(_ufunc_name))
ndarray.__matmul__ = lambda self, other: matmul(self, other)
ndarray.__rmatmul__ = lambda self, other: matmul(other, self)
ndarray.__neg__ = lambda self: _ufunc("negative")(self)
ndarray.__abs__ = lambda self: _ufunc("absolute")(self)
ndarray.__invert__ = lambda self: _ufunc("invert")(self)
ndarray.__hash__ = None
ndarray.__module__ = "cupy"        # what nanobert.backend.array_module looks at

# ---------------------------------------------------------------------------- ufuncs


class Ufunc:
    """A cupy ufunc: keywords out / dtype / casting, and the methods the real one has (real:
    its type table and methods, from cupy_namespace.json)."""

    def __init__(self, name, numpy_ufunc, real, type_table=False):
        self.__name__ = self.name = name
        self._np, self._type_table = numpy_ufunc, type_table
        self._types, self._methods = real["types"], set(real["methods"])

    def __call__(self, *args, out=None, dtype=None, casting=None):
        if len(args) != self._np.nin:
            raise StandinError(f"cupy.{self.name} takes {self._np.nin} arguments, got {len(args)}")
        inputs = _unwrap(args, f"cupy.{self.name}")
        if self._type_table:
            dtype = dtype or self._loop_output(inputs)
        kwargs = {}
        if out is not None:
            kwargs["out"] = _unwrap(out, f"cupy.{self.name} out=")
        if dtype is not None:
            kwargs["dtype"] = dtype
        if casting is not None:
            kwargs["casting"] = casting
        if _state.fusing and out is not None:
            raise StandinError(f"cupy.{self.name}(out=) inside cupy.fuse: not allowed here")
        def compute():
            with numpy.errstate(all="ignore"):      # the GPU never warns
                return _array(_c_order(self._np(*inputs, **kwargs)))
        r = _device_op(compute)
        counts.launch(self.name, max([numpy.size(x) for x in inputs]
                                     + ([numpy.size(kwargs["out"])] if out is not None else [])))
        return out if out is not None else _wrap(r)

    def _loop_output(self, inputs):
        """The output dtype of the real ufunc's first loop that takes the input (cupyx's erf
        turns float16 into float64, for one: its table has no 'e->e')."""
        array_chars = [numpy.asarray(x).dtype.char for x in inputs]
        for loop in self._types:
            ins, outs = loop.split("->")
            if all(numpy.can_cast(c, i, "safe") for c, i in zip(array_chars, ins)):
                return numpy.dtype(outs[0])
        raise StandinError(f"{self.name} has no loop for {array_chars} (types {self._types})")

    def __getattr__(self, method):
        if method.startswith("_") or method not in self._methods:
            raise AttributeError(f"cupy.{self.name} has no method {method!r}")
        np_method = getattr(self._np, method)

        def call(*args, **kwargs):
            _no_fusing(f"{self.name}.{method}")
            uargs = _unwrap(args, f"{self.name}.{method}")
            ukwargs = {k: _unwrap(v, method) for k, v in kwargs.items()}
            r = _device_op(lambda: _array(np_method(*uargs, **ukwargs)))
            counts.launch(f"{self.name}.{method}")
            return _wrap(r)
        return call


def _c_order(r):
    """CuPy allocates a ufunc's output C-contiguous (NumPy keeps its inputs' memory order:
    `q * s` of a transposed view is transposed too); what matmul's copy rules see."""
    if isinstance(r, tuple):
        return tuple(_c_order(v) for v in r)
    return numpy.ascontiguousarray(r) if isinstance(r, numpy.ndarray) else r


_UFUNCS = {}


def _ufunc(name):
    if name not in _UFUNCS:
        _UFUNCS[name] = Ufunc(name, getattr(numpy, name), NAMESPACE["cupy"][name])
    return _UFUNCS[name]


class _ErfUfunc:
    """numpy has no erf: nanobert's own (1.3 ulp) computes it; the type table is cupyx's."""
    nin = 1
    __name__ = "erf"

    def __call__(self, x, out=None, dtype=None, casting=None):
        x = numpy.asarray(x)
        dtype = numpy.dtype(dtype or x.dtype)
        r = nanobert_special.erf(numpy.ascontiguousarray(x, dtype=dtype), numpy)
        if out is None:
            return r
        out[...] = r
        return out


# ---------------------------------------------------------------------------- matmul

def _matmul_launches(a, b, out):
    """The kernels CuPy 14's _core.matmul launches for these NumPy-held operands -> names
    (cupy/_core/_routines_linalg.pyx: matmul, and dot -> tensordot_core for ndim <= 2)."""
    ndim = max(a.ndim, b.ndim)
    result = numpy.promote_types(a.dtype, b.dtype)
    dtype = result
    if ndim > 2 and result == numpy.float16:
        dtype = numpy.dtype(numpy.float32)   # batched: float16 computed in float32, cast back
    a = a.reshape(1, -1) if a.ndim == 1 else a
    b = b.reshape(-1, 1) if b.ndim == 1 else b
    launches, operands = [], []
    for x in (a, b):
        if x.dtype != dtype:                          # astype / ascontiguousarray(x, dtype)
            launches.append("matmul: operand cast")
            x = numpy.ascontiguousarray(x, dtype)
        elif ndim <= 2 and not (x.flags.c_contiguous or x.flags.f_contiguous):
            launches.append("matmul: operand copy")   # _mat_to_cublas_contiguous: a.copy()
            x = numpy.ascontiguousarray(x)
        elif ndim > 2 and not x.flags.c_contiguous:
            launches.append("matmul: operand copy")   # ascontiguousarray (no trans flags)
            x = numpy.ascontiguousarray(x)
        operands.append(x)
    if ndim > 2:
        a_batch = (1,) * (ndim - a.ndim) + a.shape[:-2]
        b_batch = (1,) * (ndim - b.ndim) + b.shape[:-2]
        if a_batch != b_batch:                        # broadcast: gemmBatched's pointer arrays
            launches += ["matmul: _mat_ptrs"] * (3 * (ndim - 2))
    launches.append("matmul")
    direct = out is not None and out.dtype == dtype and out.flags.c_contiguous and not any(
        numpy.may_share_memory(out, x) for x in operands)   # bounds, as may_share_bounds
    if (out is not None and not direct) or (out is None and dtype != result):
        launches.append("matmul: copy into out")      # a temporary, then elementwise_copy
    return launches


class Matmul:
    """cupy.matmul and the @ operator, launches counted as CuPy 14 launches them:
    - out= is written straight into only when it is C-contiguous, of the result dtype and
      overlaps neither operand; otherwise the product goes to a temporary and a copy
      kernel moves it into out.
    - 2-D products (through cupy.dot) take a C- or F-contiguous operand as it is (a
      transposed matrix is a cuBLAS trans flag); any other is copied first.
    - batched products (ndim > 2) call cuBLAS without trans flags: every operand that is
      not C-contiguous (a transposed view included) is copied first, and broadcast batch
      dims add three pointer-array kernels (_mat_ptrs, ndim - 2 launches each).
    - batched float16 (`if dtype.char == 'e': dtype = numpy.dtype('f')`): both operands are
      cast to float32 (ascontiguousarray(x, float32), a kernel each), the product cast
      back to float16 (elementwise_copy).
    An out= whose dtype differs from an operand's leaves CuPy's fast path for the gufunc
    machinery, which the stand-in does not model: refused. Assumes a GPU of compute
    capability >= 7.0 (2-D float16 GEMMs stay float16); one GEMM is one kernel (whether
    cuBLAS adds a split-K reduction kernel is its own choice); says nothing about cuBLAS
    numerics (NumPy computes)."""
    __name__ = name = "matmul"

    def __call__(self, a, b, out=None, **kwargs):
        _no_fusing("cupy.matmul")
        _refuse_cupy_cublas("cupy.matmul")
        if kwargs:
            raise StandinError(f"cupy.matmul{tuple(kwargs)}: the stand-in models only out=")
        x, y = _unwrap(a, "cupy.matmul"), _unwrap(b, "cupy.matmul")
        o = None if out is None else _unwrap(out, "cupy.matmul out=")
        if not isinstance(x, numpy.ndarray) or not isinstance(y, numpy.ndarray) \
                or x.ndim == 0 or y.ndim == 0:
            raise StandinError("cupy.matmul: operands must be device arrays of 1 or more dims")
        if o is not None and not o.dtype == x.dtype == y.dtype:
            raise StandinError(f"cupy.matmul(out=): out {o.dtype} with operands {x.dtype}, "
                               f"{y.dtype} goes through the gufunc machinery (not modelled)")
        for kernel in _matmul_launches(x, y, o):
            counts.launch(kernel)
        def compute():
            with numpy.errstate(all="ignore"):
                r = numpy.matmul(x, y)
            return _array(r) if o is None else _into(o, r)   # out may be an operand: last
        r = _device_op(compute)
        return ndarray(r) if out is None else out


matmul = Matmul()


# ------------------------------------------------------------------------- functions

# through cuBLAS (vdot is not: two vectors take tensordot_core's multiply + CUB sum path)
CUPY_CUBLAS = {"matmul", "dot", "inner", "tensordot", "einsum"}
NO_LAUNCH = {"empty", "empty_like", "asarray", "asanyarray", "ascontiguousarray", "shape",
             "ndim", "result_type", "can_cast", "dtype", "promote_types", "iinfo", "finfo"}
SYNCING = {"flatnonzero", "nonzero", "argwhere", "unique", "extract"}   # output size from data
HOST_TO_DEVICE = {"asarray", "array", "asanyarray", "ascontiguousarray"}


def _host_to_device(what, host):
    """core.pyx _array_default: a 0-d host value is written by ndarray.fill (a memset for 0,
    else a kernel); an array is one host-to-device copy, staged through a pinned buffer when
    the NumPy array is pageable: a host wait; from pinned memory an async copy (cupyx's
    pinned arrays, the section 'pinned memory and streams')."""
    counts.host_to_device += 1
    if host.ndim == 0:
        _fill(host, host[()], f"{what} of a 0-d value")
    elif host.flags.c_contiguous and is_pinned(host):
        _async_copy(host, None, f"{what} of a pinned {host.shape} array")
    else:
        _pageable_copy(what)


def _memset_rule(name, args, kwargs):
    """cupy/_creation/basic.py zeros, zeros_like: a.data.memset_async(0, a.nbytes)."""
    counts.memset(f"cupy.{name}")


def _fill_rule(name, args, kwargs):
    """cupy/_creation/basic.py ones, full and their _like: ndarray.fill."""
    value = 1 if name.startswith("ones") else (args[1] if len(args) > 1
                                                  else kwargs["fill_value"])
    _fill(numpy.empty(0), value, f"cupy.{name}")


def _where_rule(name, args, kwargs):
    """cupy/_sorting/search.py where: _where_ufunc(condition.astype('?', copy=False), x, y)."""
    if len(args) == 3:
        if numpy.asarray(args[0]).dtype != numpy.bool_:
            counts.launch("where: astype of the condition")
        counts.launch("where")


def _vdot_rule(name, args, kwargs):
    """cupy/linalg/_product.py vdot -> _routines_linalg.pyx tensordot_core with n = m = 1:
    with CUB on, (a.ravel() * b.ravel()).sum(out=c): a multiply (and its temporary of the
    inputs' size), CUB's DeviceReduce, a copy into c."""
    product = numpy.empty(args[0].size, args[0].dtype)
    counts.launch("vdot: multiply", product.size)
    for i, kernel in enumerate(_reduction_kernels("sum", product, None, None, out=True)):
        # the first reads the product; a second CUB pass its tiles' partial sums
        counts.launch(f"vdot: {kernel}", product.size if i == 0 else -(-product.size // CUB_TILE))


def _concatenate_rule(name, args, kwargs):
    """_routines_manipulation.pyx _concatenate: up to 8 arrays one cupy_copy each; more (of
    one dtype, small) one kernel reading a pointer array copied from the host (and, unless
    all are contiguous and alike, two more host arrays). stack = concatenate."""
    arrays = list(args[0])
    if len(arrays) > 8 and len({a.dtype for a in arrays}) == 1:
        alike = all(a.flags.c_contiguous and a.shape == arrays[0].shape for a in arrays)
        for _ in range(1 if alike else 3):
            _host_to_device(f"cupy.{name} pointers", numpy.empty(len(arrays)))
        counts.launch(f"{name} (one kernel)")
    else:
        for _ in arrays:
            counts.launch(f"{name} (cupy_copy)")


FUNCTION_RULES = {"zeros": _memset_rule, "zeros_like": _memset_rule, "ones": _fill_rule,
                  "ones_like": _fill_rule, "full": _fill_rule, "full_like": _fill_rule,
                  "where": _where_rule, "vdot": _vdot_rule,
                  "concatenate": _concatenate_rule, "stack": _concatenate_rule}


def _function(name):
    signature = _signature(NAMESPACE["cupy"][name]["parameters"])
    np_fn = getattr(numpy, name, None)

    def call(*args, **kwargs):
        _no_fusing(f"cupy.{name}")
        _check_call(f"cupy.{name}", signature, args, kwargs)
        if np_fn is None:
            raise NotImplementedError(f"the stand-in does not emulate cupy.{name}")
        if name in CUPY_CUBLAS:
            _refuse_cupy_cublas(f"cupy.{name}")
        if name in HOST_TO_DEVICE and args and not isinstance(args[0], ndarray):
            source = args[0]
            host = numpy.array(source, dtype=kwargs.get("dtype"), copy=True)
            pinned = isinstance(source, numpy.ndarray) and source.dtype == host.dtype
            _host_to_device(f"cupy.{name}", source if pinned else host)
            return ndarray(_device_op(lambda: _into(host, source)))
        uargs = _unwrap(args, f"cupy.{name}")
        if name in SYNCING:
            counts.sync(f"cupy.{name}")
        ukwargs = {k: _unwrap(v, f"cupy.{name}") for k, v in kwargs.items()}
        def compute():
            if name == "vdot":                       # CuPy returns a 0-d array, not a scalar
                return numpy.asarray(numpy.vdot(*uargs))
            with numpy.errstate(all="ignore"):
                r = np_fn(*uargs, **ukwargs)
            return _array(r)
        r = compute()
        flat_inputs = [a for a in args if isinstance(a, ndarray)] + [
            v for a in args if isinstance(a, (list, tuple)) for v in a if isinstance(v, ndarray)]
        if name not in NO_LAUNCH and not _is_view(_wrap(r, flat_inputs), flat_inputs):
            _record(compute, r)                      # views cost nothing: not recorded
        out = kwargs.get("out")
        result = out if out is not None else _wrap(r, flat_inputs)
        if name in FUNCTION_RULES:
            FUNCTION_RULES[name](name, uargs, ukwargs)
        elif name in REDUCTIONS:
            for kernel in _reduction_call(name, uargs[0], uargs[1:], ukwargs):
                counts.launch(f"{name}: {kernel}")
        elif name not in NO_LAUNCH and not _is_view(result, flat_inputs) \
                and not any(result is a for a in flat_inputs if out is None):
            counts.launch(name)
        elif name in ("asarray", "ascontiguousarray") and not _is_view(result, flat_inputs) \
                and not any(result is a for a in flat_inputs):
            counts.launch(name)                      # a cast or a contiguous copy
        return result
    call.__name__ = name
    return call

# ----------------------------------------------------------------------- random


GENERATOR_METHODS = NAMESPACE["Generator"]          # name -> parameters


# cupy/random/_generator_api.pyx: each distribution is one kernel (_launch_dist ->
# cupy_distributions.cu execute_dist<<<...>>>); random(out=) draws into a temporary and copies
# (elementwise_copy); integers adds `low` afterwards (cupy.add); uniform moves the draw to
# [low, high) with three more kernels (low + (high - low) * y) after two 0-d fills.
DRAW_KERNELS = {"integers": ("draw", "add low"),
                "uniform": ("fill low", "fill high", "draw", "subtract", "multiply", "add")}


class Generator:
    def __init__(self, seed):
        self._g = numpy.random.default_rng(seed)
        counts.generators += 1
        counts.launch("Generator init")

    def __getattr__(self, name):
        if name.startswith("_") or name not in GENERATOR_METHODS:
            raise AttributeError(f"cupy.random.Generator has no method {name!r}")
        signature = _signature(GENERATOR_METHODS[name])
        method = getattr(self._g, name)

        def call(*args, **kwargs):
            _no_fusing(f"Generator.{name}")
            _check_call(f"cupy.random.Generator.{name}", signature, (self, *args), kwargs)
            out = kwargs.pop("out", None)
            r = method(*args, **kwargs)     # cuRAND's host API: a replay draws these again
            for kernel in DRAW_KERNELS.get(name, ("draw",)):
                counts.launch(f"Generator.{name}: {kernel}")
            if out is not None and name == "random":
                counts.launch("Generator.random: copy into out")
            target = out._a if out is not None else numpy.empty_like(r)
            _device_op(lambda: _into(target, r))
            return out if out is not None else ndarray(target)
        return call


random = types.ModuleType("cupy.random")
random.default_rng = lambda seed=None: Generator(seed)
random.Generator = Generator

# -------------------------------------------------------------------------- fuse


def _run_fused(fn, fargs):
    _state.fusing = True
    try:
        return fn(*fargs)
    finally:
        _state.fusing = False


def _check_python_floats(name, fargs):
    """CuPy 13 turns a Python float argument of a fused function into a float64 scalar
    (_python_scalar_to_numpy_scalar), which under NumPy 2's promotion rules makes float32
    or float16 arithmetic float64; CuPy 14 keeps the array's dtype (as NumPy 2 does with a
    Python float, what the stand-in computes with). Refused wherever an array argument is not
    float64: even where the result's dtype is the same (a comparison's bool), the arithmetic
    before it is not, e.g. a float32 uniform against p = 0.7 in float64 keeps other elements."""
    if not any(type(a) is float for a in fargs):
        return
    narrow = sorted({str(a.dtype) for a in fargs
                     if hasattr(a, "dtype") and a.dtype.kind == "f" and a.dtype != numpy.float64})
    if narrow:
        raise StandinError(f"cupy.fuse {name}: a Python float argument makes CuPy 13 compute "
                           f"in float64 beside {', '.join(narrow)} arrays (CuPy 14 in the "
                           f"array's dtype): pass a scalar of the array's dtype")


def fuse(*args, **kwargs):
    """cupy.fuse: the function runs with NumPy, only elementwise ufuncs and operators
    allowed inside, and counts one launch. A Python float argument that CuPy 13 would
    promote to float64 is refused (_check_python_floats)."""
    def decorate(fn):
        def fused(*fargs):
            if any(isinstance(a, numpy.ndarray) for a in fargs):
                raise StandinError(f"cupy.fuse {fn.__name__}: a NumPy argument")
            name = kwargs.get("kernel_name", fn.__name__)
            r = _run_fused(fn, fargs)
            _check_python_floats(name, fargs)
            counts.launch(f"fuse:{name}")
            return r
        fused.__name__ = fn.__name__
        return fused
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return decorate(args[0])
    return decorate

# ------------------------------------------------------------- ElementwiseKernel

# A declaration in a body is C's (`float` is float32); a parameter's type NumPy's name
# (_kernel.pyx ParameterInfo: get_dtype(name), so `float` there is float64, `int` int64)
C_TYPES = {"float": numpy.float32, "double": numpy.float64, "bool": numpy.bool_,
           "int": numpy.int32, "float16": numpy.float16}


def _param_dtype(ctype):
    """A parameter's type name -> its dtype, as CuPy reads it; None for a type variable
    (one letter, bound by the arrays)."""
    return None if len(ctype) == 1 else numpy.dtype(ctype).type

STATEMENT = re.compile(r"^(?:(?:const\s+)?(\w+)\s+)?(\w+)\s*(=|\+=|-=|\*=|/=)\s*(.+)$", re.S)


def _parse_params(params):
    out = []
    for p in params.split(","):
        words = p.split()
        if len(words) != 2:
            raise StandinError(f"ElementwiseKernel parameter {p!r}: expected 'type name'")
        out.append(tuple(words))
    return out


def _python_expression(expr):
    if re.search(r"[{}]|\bif\b|\bfor\b|\bwhile\b|&&|\|\||\(\s*\w+\s*\)\s*[\w(]", expr):
        raise StandinError(f"ElementwiseKernel: the stand-in runs straight-line code only, "
                           f"got {expr!r}")
    expr = re.sub(r"(\d+\.\d*|\.\d+|\d+)[fF]\b", r"\1", expr)
    m = re.match(r"^(.+?)\?(.+):(.+)$", expr, re.S)
    if m:
        return f"_where({m.group(1)}, {m.group(2)}, {m.group(3)})"
    return expr


KERNEL_FUNCTIONS = {"_where": numpy.where, "sqrt": numpy.sqrt, "sqrtf": numpy.sqrt,
                    "exp": numpy.exp, "isfinite": numpy.isfinite, "fabs": numpy.abs}


def _bind(kernel, params, args):
    """Kernel arguments -> (type name -> dtype, parameter name -> NumPy value): arrays
    fix their parameter's type (one dtype per type name), scalars are cast to it."""
    bound, namespace = {}, {}
    for (ctype, pname), value in zip(params, args):
        if isinstance(value, numpy.ndarray):
            raise StandinError(f"{kernel}: NumPy array for {pname}")
        if isinstance(value, ndarray):
            declared = _param_dtype(ctype)
            if declared is not None and value.dtype != declared:
                raise StandinError(f"{kernel}: {pname} is {value.dtype}, declared {ctype}")
            if declared is None and bound.setdefault(ctype, value.dtype) != value.dtype:
                raise StandinError(f"{kernel}: type {ctype} bound to {bound[ctype]}, "
                                   f"{pname} is {value.dtype}")
            namespace[pname] = value._a
    for (ctype, pname), value in zip(params, args):
        if not isinstance(value, ndarray):
            dtype = _param_dtype(ctype) or bound.get(ctype)
            if dtype is None:
                raise StandinError(f"{kernel}: scalar {pname} of unbound type {ctype}")
            namespace[pname] = numpy.dtype(dtype).type(value)
    return bound, namespace


class ElementwiseKernel:
    """Its CUDA C body run as NumPy statement by statement (straight-line code only)."""

    def __init__(self, in_params, out_params, operation, name="kernel", reduce_dims=True,
                 preamble="", no_return=False, return_tuple=False, **kwargs):
        self.in_params, self.out_params = _parse_params(in_params), _parse_params(out_params)
        self.name = name
        self.statements = []
        body = re.sub(r"//[^\n]*", "", operation)
        for statement in filter(None, (s.strip() for s in body.split(";"))):
            m = STATEMENT.match(statement)
            if not m:
                raise StandinError(f"ElementwiseKernel {name}: cannot run {statement!r}")
            ctype, target, op, expr = m.groups()
            self.statements.append((ctype, target, op, _python_expression(expr)))

    def __call__(self, *args, **kwargs):
        _no_fusing(f"ElementwiseKernel {self.name}")
        params = self.in_params + self.out_params
        if len(args) not in (len(self.in_params), len(params)):
            raise StandinError(f"ElementwiseKernel {self.name}: {len(args)} arguments for "
                               f"{len(params)} parameters")
        bound, namespace = _bind(self.name, params, args)
        outs = [value for (_, pname), value in zip(self.out_params, args[len(self.in_params):])]
        env = KERNEL_FUNCTIONS

        def compute():
            names = dict(namespace)
            with numpy.errstate(all="ignore"):
                for ctype, target, op, expr in self.statements:
                    value = eval(expr, env, names)
                    if op != "=":
                        value = eval(f"_x {op[0]} _y", env, {"_x": names[target], "_y": value})
                    if ctype is not None:
                        dtype = C_TYPES.get(ctype) or bound[ctype]
                        value = numpy.asarray(value).astype(dtype)
                    names[target] = value
                for (ctype, pname), out in zip(self.out_params, outs):
                    out._a[...] = names[pname]
        _device_op(compute)
        counts.launch(f"ElementwiseKernel:{self.name}",
                      max(numpy.size(value._a if isinstance(value, ndarray) else value)
                          for value in args))
        return outs[0] if len(outs) == 1 else tuple(outs)


class ReductionKernel:
    """A sum: map_expr (a straight-line expression) run as NumPy over the broadcast
    inputs, summed over `axis` in the output's type; reduce_expr must be 'a + b', identity
    '0' and post_map_expr 'out = a' (what the stand-in can run). One launch, two for a full
    reduction of a single input through CUB's block reduction."""

    def __init__(self, in_params, out_params, map_expr, reduce_expr, post_map_expr, identity,
                 name="reduce_kernel", reduce_type=None, reduce_dims=True, preamble="",
                 options=()):
        self.in_params, self.out_params = _parse_params(in_params), _parse_params(out_params)
        self.name = name
        out_name = self.out_params[0][1]
        if len(self.out_params) != 1 or reduce_expr.replace(" ", "") != "a+b" \
                or identity.strip() != "0" or not re.fullmatch(
                    rf"\s*{out_name}\s*=\s*a\s*;?\s*", post_map_expr) or reduce_type:
            raise StandinError(f"ReductionKernel {name}: the stand-in runs plain sums only")
        self.map_expr = _python_expression(map_expr)

    def __call__(self, *args, axis=None, keepdims=False, out=None, stream=None):
        _no_fusing(f"ReductionKernel {self.name}")
        if len(args) != len(self.in_params) or out is not None:
            raise StandinError(f"ReductionKernel {self.name}: pass the {len(self.in_params)} "
                               f"inputs only")
        bound, namespace = _bind(self.name, self.in_params, args)
        ctype = self.out_params[0][0]
        dtype = _param_dtype(ctype) or bound[ctype]
        shape = numpy.broadcast_shapes(*(a.shape for a in args if isinstance(a, ndarray)))
        def compute():
            with numpy.errstate(all="ignore"):
                mapped = numpy.broadcast_to(eval(self.map_expr, KERNEL_FUNCTIONS, namespace),
                                            shape)
                return numpy.ascontiguousarray(mapped.sum(axis=axis, keepdims=keepdims,
                                                          dtype=dtype))
        r = _device_op(compute)
        mapped = numpy.broadcast_to(numpy.empty(()), shape)        # the shape, no memory
        # _reduction.pyx: CUB's block reduction takes one input only (two passes for a full
        # reduction); with more, CuPy's generic kernel, one launch
        single = len(args) == 1 and isinstance(args[0], ndarray)
        launches = _generic_reduction(args[0]._a, self.name, _reduced_axes(mapped, axis)) \
            if single else [self.name]
        for _ in launches:
            counts.launch(f"ReductionKernel:{self.name}")
        return ndarray(r)

# ---------------------------------------------------------------------------- cuda


class _Device:
    compute_capability = "90"            # as CuPy gives it: an H100's

    def __init__(self, device=None):
        pass

    def synchronize(self):
        counts.sync("Device.synchronize")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


cuda = types.ModuleType("cupy.cuda")
cuda.runtime = types.SimpleNamespace(getDeviceCount=lambda: 1,
                                     getDeviceProperties=lambda i: {"name": b"CuPy stand-in"})
cuda.Device = _Device

# ------------------------------------------------------------------------- modules

OWN = {"ndarray": ndarray, "random": random, "cuda": cuda, "fuse": fuse, "matmul": matmul,
       "ElementwiseKernel": ElementwiseKernel, "ReductionKernel": ReductionKernel,
       "get_default_memory_pool": lambda: _DEFAULT_POOL}


class _CupyModule(types.ModuleType):
    counts = counts

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name not in NAMESPACE["cupy"]:
            raise AttributeError(f"module 'cupy' has no attribute {name!r} (a NumPy-only name)")
        if name in OWN:
            return OWN[name]
        kind = NAMESPACE["cupy"][name]["kind"]
        if kind == "ufunc":
            return _ufunc(name)
        if kind == "function":
            return _function(name)
        value = getattr(numpy, name, None)          # dtypes, constants: NumPy's own in CuPy
        if value is not None and isinstance(value, (type, numpy.dtype, float, int)):
            return value
        if name == "newaxis":
            return None
        raise NotImplementedError(f"the stand-in does not emulate cupy.{name}")

    def asnumpy(self, a, stream=None, order="C", out=None, blocking=True):
        return a.get() if isinstance(a, ndarray) else numpy.asarray(a)


cupy = _CupyModule("cupy")
cupy.__file__ = __file__
cupy.__version__ = f"stand-in of {NAMESPACE['version']}"

cupyx = types.ModuleType("cupyx")
cupyx_scipy = types.ModuleType("cupyx.scipy")
cupyx_special = types.ModuleType("cupyx.scipy.special")
cupyx.scipy, cupyx_scipy.special = cupyx_scipy, cupyx_special
cupyx_special.erf = Ufunc("erf", _ErfUfunc(), NAMESPACE["erf"], type_table=True)


def scatter_add(a, slices, value):
    _check_call("cupyx.scatter_add", _signature(NAMESPACE["scatter_add"]), (a, slices, value),
                {})
    idx = _unwrap(slices, "scatter_add")
    parts = idx if isinstance(idx, tuple) else (idx,)
    if _index_arrays(idx):                      # _scatter_op(op='add'), as setitem
        _scatter_value(value, a.dtype, "cupyx.scatter_add")
        _flat_index("cupyx.scatter_add", parts)
        counts.launch("cupyx.scatter_add (scatter_add)")
    else:
        counts.launch("cupyx.scatter_add (add)")
    target, source = _unwrap(a, "scatter_add"), _unwrap(value, "scatter_add")
    _device_op(lambda: numpy.add.at(target, idx, source))


cupyx.scatter_add = scatter_add

MODULES = {"cupy": cupy, "cupyx": cupyx, "cupyx.scipy": cupyx_scipy,
           "cupyx.scipy.special": cupyx_special}


# ---------------------------------------------------------- pinned memory and streams
# cupyx.empty_pinned / zeros_pinned (cupyx/_pinned_array.py) are NumPy arrays in page-locked
# memory, and ndarray.set(pinned, stream=) (core.pyx: copy_from_host_async) copies one to
# the device without the host waiting. A host-to-device copy from pageable memory counts as
# a host wait (counts.pageable_copies, and a sync): CUDA may synchronize the stream to stage
# it, and cupy.asarray's staging buffers come from CuPy's pinned pool, which allocates
# page-locked memory (an implicit device synchronization) whenever every free block of the
# size is still in flight. A 0-d value is a fill kernel's argument (_array_default), no copy.
#
# The stand-in's device keeps up, no further: an async copy lands at once (the kernels that
# follow read its data), yet it stays in flight until the host learns that it is done
# (Event.done or .synchronize on an event recorded behind it, Stream.done / .synchronize,
# any read of device data). A pinned source written by the host while its copy is in flight
# could have been read half-new by a real GPU: StandinError, at the next pinned copy or when
# the copy is found done. Event.synchronize and Stream.synchronize count as syncs (they may
# wait on a GPU); a query (done) does not: here the device is always done when asked.

_PINNED = []          # (first address, end address, weakref to the block) of each pinned block
_IN_FLIGHT = []       # async copies from pinned memory the host has not seen done
_CURRENT_STREAMS = []


def _pinned_block(array):
    start = array.__array_interface__["data"][0]
    _PINNED.append((start, start + array.nbytes, weakref.ref(array)))
    return array


def is_pinned(a):
    """Whether NumPy array `a` lies in a block from cupyx.empty_pinned and kin (CuPy's
    is_memory_pinned asks CUDA about the address)."""
    start = a.__array_interface__["data"][0]
    _PINNED[:] = [block for block in _PINNED if block[2]() is not None]
    return a.nbytes > 0 and any(first <= start and start + a.nbytes <= end
                                for first, end, _ in _PINNED)


def _empty_pinned(shape, dtype=float, order="C"):
    return _pinned_block(numpy.empty(shape, dtype, order))


def _zeros_pinned(shape, dtype=float, order="C"):
    return _pinned_block(numpy.zeros(shape, dtype, order))


def _empty_like_pinned(a, dtype=None, order="K", subok=None, shape=None):
    return _pinned_block(numpy.empty_like(a, dtype, order, shape=shape))


def _zeros_like_pinned(a, dtype=None, order="K", subok=None, shape=None):
    return _pinned_block(numpy.zeros_like(a, dtype, order, shape=shape))


class _Copy:
    """An async copy in flight: its pinned source and what the source held when issued."""

    def __init__(self, stream, source, what):
        self.stream, self.source, self.held, self.what = stream, source, source.copy(), what

    def check(self):
        if not numpy.array_equal(self.source, self.held, equal_nan=self.held.dtype.kind in "fc"):
            raise StandinError(f"{self.what}: its pinned source was written while the copy "
                               f"was in flight (refill a pinned buffer only after an event "
                               f"recorded behind its copy is done)")


def _check_in_flight():
    for copy in _IN_FLIGHT:
        copy.check()


def _copies_land(copies=None):
    """The host has seen these copies (default: all) done: check those still in flight,
    then forget them."""
    copies = [c for c in _IN_FLIGHT if copies is None or any(c is d for d in copies)]
    for copy in copies:
        copy.check()
    _IN_FLIGHT[:] = [c for c in _IN_FLIGHT if all(c is not done for done in copies)]


def _pageable_copy(what):
    counts.pageable_copies += 1
    counts.copy(f"{what} (host to device)")
    counts.host_wait(f"{what} from pageable memory")


def _async_copy(source, stream, what):
    _check_in_flight()
    counts.pinned_copies += 1
    counts.copy(f"{what} (host to device, async)")
    _IN_FLIGHT.append(_Copy(stream or get_current_stream(), source, what))


def _set(self, arr, stream=None):
    """cupy.ndarray.set: the checks of CuPy 14's, then an async copy from pinned memory or a
    pageable copy (a host wait)."""
    _no_fusing("ndarray.set")
    if not isinstance(arr, numpy.ndarray):
        raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
    if self.dtype != arr.dtype:
        raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
    if self.shape != arr.shape:
        raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
    if not (self.flags.c_contiguous or self.flags.f_contiguous):
        raise RuntimeError("Cannot set to non-contiguous array")
    if stream is not None and not isinstance(stream, Stream):
        raise StandinError(f"ndarray.set(stream=): a cupy.cuda.Stream, got {type(stream)}")
    counts.host_to_device += 1
    # CuPy copies a source that is not laid out as the target: that copy is pageable
    laid_out = arr.flags.c_contiguous if self.flags.c_contiguous else arr.flags.f_contiguous
    if laid_out and is_pinned(arr):
        _async_copy(arr, stream, f"ndarray.set of a pinned {arr.shape} {arr.dtype} array")
    else:
        _pageable_copy("ndarray.set")
    _device_op(lambda: _into(self._a, arr),
               on_replay=lambda: _async_copy(arr, stream, "a replayed copy from pinned memory"))


ndarray.set = _set


class Event:
    """cupy.cuda.Event: record() remembers the copies in flight on its stream, done and
    synchronize() land them (synchronize also counts as a sync). Its time is the host's
    clock when recorded: kernels run at once here, so get_elapsed_time is host time."""

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self._copies = []
        self._time = None

    def record(self, stream=None):
        stream = stream or get_current_stream()
        self._copies = [c for c in _IN_FLIGHT if c.stream is stream]
        self._time = time.perf_counter()

    @property
    def done(self):
        _copies_land(self._copies)
        return True

    def synchronize(self):
        counts.sync("Event.synchronize")


class Stream:
    """cupy.cuda.Stream: `with stream:` makes it current; kernels run at once regardless.
    begin_capture / end_capture: see 'CUDA graphs' below."""
    null = None
    _next_ptr = 0x5000

    def __init__(self, null=False, non_blocking=False, ptds=False, priority=None):
        self.ptr = 0 if null else Stream._next_ptr
        self.non_blocking = non_blocking
        Stream._next_ptr += 0x10

    def begin_capture(self, mode=None):
        if self.ptr == 0:
            raise StandinError("begin_capture on the null stream: CUDA cannot capture the "
                               "legacy default stream; capture on a Stream of your own")
        if _state.capture is not None:
            raise StandinError("begin_capture while a capture is under way")
        if _state.allocator is None:
            raise StandinError("a capture that allocates from CuPy's default pool: memory "
                               "the step frees after capture goes back to the pool and to "
                               "other arrays while the graph still writes it; capture under "
                               "cupy.cuda.using_allocator(a MemoryPool of the graph's own)")
        _state.capture = _Capture(self)

    def end_capture(self):
        capture = _state.capture
        if capture is None or capture.stream is not self:
            raise StandinError("end_capture without a capture begun on this stream")
        _state.capture = None
        if capture.invalid:
            raise CUDARuntimeError(f"cudaErrorStreamCaptureInvalidated: the capture was "
                                   f"invalidated by {capture.invalid}")
        return capture.end()

    def is_capturing(self):
        return _state.capture is not None and _state.capture.stream is self

    def __enter__(self):
        _CURRENT_STREAMS.append(self)
        return self

    def __exit__(self, *exc):
        _CURRENT_STREAMS.pop()
        return False

    def use(self):
        _CURRENT_STREAMS[:] = [self]
        return self

    def record(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def wait_event(self, event):
        """The device waits, the host does not."""

    @property
    def done(self):
        _copies_land([c for c in _IN_FLIGHT if c.stream is self])
        return True

    def synchronize(self):
        counts.sync("Stream.synchronize")


Stream.null = Stream(null=True)


def get_elapsed_time(start_event, end_event):
    """cupy.cuda.get_elapsed_time: ms between two recorded events."""
    if start_event._time is None or end_event._time is None:
        raise StandinError("get_elapsed_time of an event never recorded (CUDA refuses it)")
    return 1000.0 * (end_event._time - start_event._time)


def get_current_stream(device_id=-1):
    return _CURRENT_STREAMS[-1] if _CURRENT_STREAMS else Stream.null


cuda.Stream, cuda.Event, cuda.get_current_stream = Stream, Event, get_current_stream
cuda.get_elapsed_time = get_elapsed_time
class OutOfMemoryError(MemoryError):
    """cupy.cuda.memory.OutOfMemoryError: its fields and message, as CuPy 14 writes them."""

    def __init__(self, size, total, limit=0):
        self._size, self._total, self._limit = size, total, limit
        held = f"allocated so far: {total:,} bytes" + (
            f", limit set to: {limit:,} bytes" if limit else "")
        super().__init__(f"Out of memory allocating {size:,} bytes ({held}).")


cuda.memory = types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError)
cupyx.empty_pinned, cupyx.zeros_pinned = _empty_pinned, _zeros_pinned
cupyx.empty_like_pinned, cupyx.zeros_like_pinned = _empty_like_pinned, _zeros_like_pinned


# -------------------------------------------------------------------------- CUDA graphs
# Stream capture records each device operation instead of running it, and a Graph replays
# the record. The stand-in runs every operation at capture too (Python needs the shapes and
# results to go on), then puts every array that existed before the capture back as it was:
# to the program, a capture computes nothing. Replaying recomputes each recorded operation
# from its inputs' memory as it is then, into its result's memory, with the host values
# (Python scalars, host draws, counts) that the capture saw: so a captured step that read a
# host value which has changed since diverges from the eager step, as it would on a GPU.
# Refused during capture, as CUDA or CuPy refuse them: any read of device data by the host
# and any copy from pageable memory, CuPy's cuBLAS wrappers, compiling a RawModule, a
# capture from the default memory pool (cupy.cuda.using_allocator must name the graph's own
# pool), cuBLAS without a workspace. Arrays made during the capture stay alive with the
# graph (its pool), so raw addresses a replay reads stay valid.


class _Capture:
    def __init__(self, stream):
        self.stream = stream
        self.ops = []                             # (compute, result, on_replay)
        self.invalid = None                       # what invalidated it (CUDA's error)
        self.before = {key: (root, root.copy()) for key, root in list(_LIVE.items())}

    def end(self):
        for root, saved in self.before.values():
            root[...] = saved                     # the capture ran nothing
        kept = [root for key, root in list(_LIVE.items()) if key not in self.before]
        counts.captures += 1
        return Graph(self.ops, kept)


class Graph:
    """cupy.cuda.graph.Graph: launch() replays the captured operations in order; one launch
    for the host (counts.graph_launches), however many nodes (counts.graph_nodes)."""

    def __init__(self, ops, kept):
        self._ops, self._kept = ops, kept

    def launch(self, stream=None):
        _refuse_in_capture("Graph.launch inside another capture (not modelled)")
        for compute, result, on_replay in self._ops:
            if on_replay is not None:
                on_replay()
            value = compute()
            if isinstance(result, numpy.ndarray) and value is not result:
                result[...] = value
        counts.graph_launches += 1
        counts.graph_nodes += len(self._ops)


class _MemoryPool:
    """cupy.cuda.MemoryPool / get_default_memory_pool(): memory is NumPy's here; a pool
    counts the bytes of the device arrays allocated under it (using_allocator(pool.malloc),
    else the default pool) as CuPy's counts them: used_bytes while an array lives,
    total_bytes what it holds (freed arrays stay cached, reused by later ones, until
    free_all_blocks; CuPy's rounding to 512-byte blocks and its size bins are not modelled).
    free_all_blocks during a capture synchronises the device (cudaFree): CUDA invalidates the
    capture."""

    def __init__(self):
        self.used = self.held = 0

    def malloc(self, nbytes):
        raise StandinError("MemoryPool.malloc is called by CuPy, not by nanobert")

    def allocate(self, root):
        """A new device array's memory `root` (NumPy) from this pool, given back when it dies."""
        self.used += root.nbytes
        self.held = max(self.held, self.used)
        weakref.finalize(root, self._give_back, root.nbytes)

    def _give_back(self, nbytes):
        self.used -= nbytes

    def total_bytes(self):
        return self.held

    def used_bytes(self):
        return self.used

    def free_all_blocks(self, stream=None):
        if _state.capture is not None:
            _legacy_stream_use("MemoryPool.free_all_blocks (cudaFree synchronises the device)")
        self.held = self.used


def _current_pool():
    """The pool device arrays come from now: using_allocator's, else the default pool."""
    return _DEFAULT_POOL if _state.allocator is None else _state.allocator.__self__


_DEFAULT_POOL = _MemoryPool()


@contextlib.contextmanager
def _using_allocator(allocator=None):
    """cupy.cuda.using_allocator: allocations inside come from `allocator` (a pool's malloc)."""
    was = _state.allocator
    _state.allocator = allocator
    try:
        yield
    finally:
        _state.allocator = was


cuda.MemoryPool, cuda.using_allocator, cuda.Graph = _MemoryPool, _using_allocator, Graph


@contextlib.contextmanager
def installed():
    """sys.modules' cupy and cupyx are the stand-in inside the block."""
    saved = {name: sys.modules.get(name) for name in MODULES}
    sys.modules.update(MODULES)
    try:
        yield cupy
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module

# ============================================================================================
# cuBLAS called directly (nanobert/model/fast_gpu.py's gemm): cupy_backends' low-level
# gemmStridedBatchedEx and the handle it needs, emulated. The call gets raw addresses, sizes,
# leading dimensions, strides and type codes, as cuBLAS does; the stand-in resolves each
# address to the live stand-in array that holds it, checks that the column-major matrices
# the arguments describe lie inside it with its dtype, reads them there (NumPy strided
# views of the same memory) and writes C in place. So a test proves the arguments describe
# the arrays meant, not cuBLAS's numerics: the product is NumPy's (float16 operands:
# a float32 product rounded once, as tensor cores round; TF32's 10-bit operand rounding is
# NOT emulated). One launch per call.
# ============================================================================================

_LIVE = weakref.WeakValueDictionary()          # id of a root NumPy array -> the array
_ndarray_init = ndarray.__init__


def _tracked_init(self, a, base=None):
    _ndarray_init(self, a, base)
    root = _root(a)
    if _LIVE.get(id(root)) is not root:            # new device memory: from the pool in use
        _LIVE[id(root)] = root
        _current_pool().allocate(root)


ndarray.__init__ = _tracked_init

# library_types.h's cudaDataType (CUDA_R_16F, CUDA_R_32F, CUDA_R_64F)
CUDA_R_16F, CUDA_R_32F, CUDA_R_64F = 2, 0, 1
CUDA_DTYPES = {CUDA_R_16F: numpy.dtype(numpy.float16), CUDA_R_32F: numpy.dtype(numpy.float32),
               CUDA_R_64F: numpy.dtype(numpy.float64)}


class _Cublas(types.ModuleType):
    """cupy_backends.cuda.libs.cublas: the constants of cuBLAS's headers (as cublas.pxd
    declares them) and gemmStridedBatchedEx."""
    CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
    CUBLAS_GEMM_DEFAULT, CUBLAS_GEMM_DEFAULT_TENSOR_OP = -1, 99
    CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_PEDANTIC = 68, 69
    CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_COMPUTE_64F = 77, 70
    HANDLE = 0x5eed

    def gemmStridedBatchedEx(self, handle, *args):
        """CuPy's wrapper: refused during stream capture, as CuPy 14 refuses it."""
        _refuse_cupy_cublas("cupy_backends.cuda.libs.cublas.gemmStridedBatchedEx")
        self.gemm(handle, *args)

    def gemm(self, handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype,
             ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType, algo):
        """cublasGemmStridedBatchedEx itself (whichever way it is called)."""
        _no_fusing("cublas.gemmStridedBatchedEx")
        if handle != self.HANDLE:
            raise StandinError(f"gemmStridedBatchedEx: handle {handle!r} is not "
                               f"cupy.cuda.device.get_cublas_handle()'s")
        if algo not in (self.CUBLAS_GEMM_DEFAULT, self.CUBLAS_GEMM_DEFAULT_TENSOR_OP):
            raise StandinError(f"gemmStridedBatchedEx: algo {algo}")
        types_ = [CUDA_DTYPES.get(t) for t in (Atype, Btype, Ctype)]
        if any(t is None for t in types_) or types_[0] != types_[1]:
            raise StandinError(f"gemmStridedBatchedEx: types {Atype}, {Btype}, {Ctype}")
        scalar = {self.CUBLAS_COMPUTE_64F: numpy.float64, self.CUBLAS_COMPUTE_32F: numpy.float32,
                  self.CUBLAS_COMPUTE_32F_PEDANTIC: numpy.float32,
                  self.CUBLAS_COMPUTE_32F_FAST_TF32: numpy.float32}.get(computeType)
        # cuBLAS's table: 64F takes float64 only; 32F float32 or float16 operands (C float16
        # or float32 for float16 operands); FAST_TF32 float32 only
        allowed = {self.CUBLAS_COMPUTE_64F: {("d", "d")},
                   self.CUBLAS_COMPUTE_32F: {("f", "f"), ("e", "e"), ("e", "f")},
                   self.CUBLAS_COMPUTE_32F_PEDANTIC: {("f", "f"), ("e", "e"), ("e", "f")},
                   self.CUBLAS_COMPUTE_32F_FAST_TF32: {("f", "f")}}.get(computeType, set())
        if (types_[0].char, types_[2].char) not in allowed:
            raise StandinError(f"gemmStridedBatchedEx: compute type {computeType} with "
                               f"operands {types_[0]} into {types_[2]}")
        rows_a, cols_a = (m, k) if transa == self.CUBLAS_OP_N else (k, m)
        rows_b, cols_b = (k, n) if transb == self.CUBLAS_OP_N else (n, k)
        if transa not in (0, 1) or transb not in (0, 1):
            raise StandinError(f"gemmStridedBatchedEx: op {transa}, {transb}")
        a = _column_major(A, types_[0], rows_a, cols_a, lda, strideA, batchCount, "A")
        b = _column_major(B, types_[1], rows_b, cols_b, ldb, strideB, batchCount, "B")
        c = _column_major(C, types_[2], m, n, ldc, strideC, batchCount, "C")
        if numpy.shares_memory(c, a) or numpy.shares_memory(c, b):
            raise StandinError("gemmStridedBatchedEx: C overlaps an operand")
        alpha_, beta_ = (ctypes.cast(p, ctypes.POINTER(numpy.ctypeslib.as_ctypes_type(scalar)))[0]
                         for p in (alpha, beta))
        op_a = a if transa == self.CUBLAS_OP_N else a.transpose(0, 2, 1)
        op_b = b if transb == self.CUBLAS_OP_N else b.transpose(0, 2, 1)

        def compute():
            with numpy.errstate(all="ignore"):
                product = numpy.matmul(op_a.astype(scalar), op_b.astype(scalar))
                result = scalar(alpha_) * product
                if beta_ != 0:
                    result += scalar(beta_) * c.astype(scalar)
                c[...] = result
        _device_op(compute)
        counts.launch("cublas.gemmStridedBatchedEx")
        counts.gemms.append(GemmCall(transa, transb, m, n, k, lda, ldb, ldc,
                                     tuple(t.char for t in types_), (A, B, C)))


class _CublasLibrary:
    """libcublas as nanobert/model/cublas.py calls it through ctypes (not refused during
    capture): the same emulation of cublasGemmStridedBatchedEx behind the names and status
    codes of the C API, the handle's stream and its workspace checked. As cuBLAS documents,
    cublasSetStream resets the handle's workspace to cuBLAS's default (None here), which
    cuBLAS would allocate itself, outside CuPy's pools, during a capture: refused. A product
    on a handle bound to the legacy stream (0) during a capture invalidates it, as any work
    on that stream does (_check_stream)."""

    def __init__(self):
        self.workspace = None
        self.stream = 0                           # a new handle's: the legacy stream
        self.workspaces = []                      # the workspace of each product

    def cublasSetStream_v2(self, handle, stream):
        if not isinstance(stream, int) or handle != _Cublas.HANDLE:
            raise StandinError(f"cublasSetStream_v2({handle!r}, {stream!r})")
        self.stream = stream
        self.workspace = None                     # cuBLAS's default workspace again
        return 0

    def cublasSetWorkspace_v2(self, handle, address, size):
        if handle != _Cublas.HANDLE or size <= 0:
            raise StandinError(f"cublasSetWorkspace_v2({handle!r}, {address!r}, {size!r})")
        self.workspace = (address, size)
        return 0

    def cublasGemmStridedBatchedEx(self, handle, *args):
        self.workspaces.append(self.workspace)
        capture = _state.capture
        if capture is not None:
            if self.stream == 0:
                try:
                    _legacy_stream_use("a cuBLAS product on the legacy stream (its handle's)")
                except CUDARuntimeError:
                    return 13                     # CUBLAS_STATUS_EXECUTION_FAILED
            if self.stream != capture.stream.ptr:
                raise StandinError("a cuBLAS product on another stream than the one captured "
                                   "(not modelled)")
            if self.workspace is None:
                raise StandinError("cuBLAS captured on its default workspace (no "
                                   "cublasSetWorkspace since the last cublasSetStream, which "
                                   "resets it): cuBLAS would allocate one during the capture, "
                                   "outside the graph's pool")
        cublas.gemm(handle, *args)
        return 0


def _column_major(address, dtype, rows, cols, ld, stride, count, what):
    """The `count` column-major [rows, cols] matrices (leading dimension ld, `stride` elements
    apart) at `address`, as a strided NumPy view of the live stand-in array holding them."""
    if ld < max(1, rows) or (count > 1 and stride < 0):
        raise StandinError(f"gemmStridedBatchedEx {what}: ld {ld} < rows {rows}")
    size = dtype.itemsize
    last = (count - 1) * stride + (cols - 1) * ld + rows            # elements spanned
    for root in list(_LIVE.values()):
        start = root.__array_interface__["data"][0]
        if start <= address and address + last * size <= start + root.nbytes:
            if root.dtype != dtype or (address - start) % size:
                raise StandinError(f"gemmStridedBatchedEx {what}: the array at this address "
                                   f"is {root.dtype}, the call says {dtype}")
            flat = root.ravel(order="K")                          # a view: roots are dense
            offset = (address - start) // size
            return numpy.lib.stride_tricks.as_strided(
                flat[offset:], shape=(count, rows, cols),
                strides=(stride * size, size, ld * size))
    raise StandinError(f"gemmStridedBatchedEx {what}: no live device array holds {count} "
                       f"[{rows}, {cols}] matrices (ld {ld}, stride {stride}) at {address:#x}")


cublas = _Cublas("cupy_backends.cuda.libs.cublas")
nanobert_cublas._LIBRARIES[cupy] = _CublasLibrary()      # what ctypes would load, emulated
cuda.device = types.SimpleNamespace(get_cublas_handle=lambda: _Cublas.HANDLE)
cupy_backends = types.ModuleType("cupy_backends")
cupy_backends.cuda = types.ModuleType("cupy_backends.cuda")
cupy_backends.cuda.libs = types.ModuleType("cupy_backends.cuda.libs")
cupy_backends.cuda.libs.cublas = cublas
MODULES.update({"cupy_backends": cupy_backends, "cupy_backends.cuda": cupy_backends.cuda,
                "cupy_backends.cuda.libs": cupy_backends.cuda.libs,
                "cupy_backends.cuda.libs.cublas": cublas})


def _erff(v):
    """CUDA's erff on float32: nanobert's own erf (1.3 ulp) in float32, as cupyx's erf
    stands in above (CUDA's own rounding is not checked)."""
    return nanobert_special.erf(numpy.ascontiguousarray(v, numpy.float32), numpy)


# float32 math functions of kernel bodies (fast_gpu's float16 kernels)
KERNEL_FUNCTIONS.update(erff=_erff, expf=lambda v: numpy.exp(numpy.asarray(v, numpy.float32)))
# C++'s functional cast float(v) (a float16 read as float32 in a map expression)
KERNEL_FUNCTIONS.update(float=lambda v: numpy.asarray(v).astype(numpy.float32),
                        float16=lambda v: numpy.asarray(v).astype(numpy.float16))

# ============================================================================================
# Raw CUDA kernels (kernels.py's row and map kernels): cupy.RawModule's source compiled for
# the CPU and run there by tests/cuda_emulation.py, on the stand-in arrays' own memory. A
# call passes what CuPy passes: device arrays (here: C-contiguous, of the parameter's dtype,
# as the kernels index them) and NumPy scalars of the parameter's exact type (CuPy would pass
# a Python int as 8 bytes, a float as a double, misreading the parameters after it). One
# launch a call; a 1-D grid of whole warps.
# ============================================================================================

import cuda_emulation  # noqa: E402


class RawModule:
    def __init__(self, code=None, path=None, options=(), backend="nvrtc",
                 translate_cucomplex=False, enable_cooperative_groups=False,
                 name_expressions=None, log_stream=None, jitify=False):
        _check_call("RawModule", _signature(NAMESPACE["RawModule"]),
                    (None, code), dict(options=options, backend=backend))
        if code is None or path is not None or name_expressions:
            raise StandinError("RawModule: the stand-in compiles code= only")
        _refuse_in_capture("RawModule compilation (compile before capture: an eager step)")
        self.code = code
        self.kernels = cuda_emulation.signatures(code)

    def get_function(self, name):
        if name not in self.kernels:
            raise StandinError(f"RawModule.get_function: no extern \"C\" kernel {name!r} in "
                               f"the code (it has {sorted(self.kernels)})")
        return _RawFunction(self.code, name)


class _RawFunction:
    def __init__(self, code, name):
        self.name = name
        self.run = cuda_emulation.launch(code, name)

    def __call__(self, grid, block, args, *, shared_mem=0, enable_cooperative_groups=False):
        _no_fusing(f"RawKernel {self.name}")
        if not (isinstance(grid, tuple) and isinstance(block, tuple) and len(grid) == 1
                and len(block) == 1 and isinstance(args, tuple)):
            raise StandinError(f"RawKernel {self.name}: the stand-in runs (grid,), (block,), "
                               f"args as tuples, 1-D")
        if grid[0] < 1:
            raise StandinError(f"RawKernel {self.name}: an empty grid (CUDA refuses the "
                               f"launch)")
        arrays = []
        for i, value in enumerate(args):
            if isinstance(value, numpy.ndarray):
                raise StandinError(f"RawKernel {self.name}: argument {i} is a NumPy array "
                                   f"(CuPy passes device arrays only)")
            arrays.append(value._a if isinstance(value, ndarray) else value)
        try:
            _device_op(lambda: self.run(int(grid[0]), int(block[0]), tuple(arrays)))
        except TypeError as e:
            raise StandinError(f"RawKernel {e}") from None
        counts.launch(f"RawKernel:{self.name}")


OWN["RawModule"] = RawModule
