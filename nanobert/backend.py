"""The one place that chooses NumPy (CPU) or CuPy (GPU).

Model and optimizer code never import numpy or cupy directly for array math: they ask
`array_module(x)` for the namespace (`xp`) an array lives in, so the same code runs on both.
Data pipelines stay on the host (NumPy); `to_device` / `to_host` are the only crossings, and
PinnedStaging the one a training batch takes to the GPU (pinned memory, an async copy).
Also here, because they only look at arrays: scatter_add and the flat-buffer test
(flat_buffer, flat_offsets; model/flat.py lays the buffers out).
"""
import ctypes
import os

import numpy

DEVICES = ("cpu", "gpu")


def resolve_device(device=None):
    """`device` argument, else $NANOBERT_DEVICE, else "cpu"."""
    device = device or os.environ.get("NANOBERT_DEVICE") or "cpu"
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r} "
                         f"(from the argument or $NANOBERT_DEVICE)")
    return device


def tf32_enabled():
    """TF32 for float32 matmuls on the GPU: on unless $NANOBERT_TF32 is 0 (train.py's and
    the benchmark's --no-tf32 set it). TF32 keeps float32's range with a 10-bit mantissa,
    as cuBLAS's tensor cores compute; float32 accumulation either way. The variable is read
    when the process starts, at get_xp("gpu") and at set_tf32, not at every product
    (fast_gpu.gemm asks ~1,900 times a BERT-base step)."""
    return _TF32[0]


def _read_tf32():
    _TF32[0] = os.environ.get("NANOBERT_TF32", "1") != "0"
    return _TF32[0]


_TF32 = [True]
_read_tf32()


def set_tf32(enabled):
    """Turn TF32 on or off for the float32 matmuls of this process (before or after
    get_xp("gpu")). CuPy reads $CUPY_TF32 when it first picks a cuBLAS compute type;
    after that, cupy's set_compute_type changes it."""
    os.environ["NANOBERT_TF32"] = "1" if enabled else "0"
    _apply_tf32()


def _apply_tf32():
    enabled = _read_tf32()
    os.environ["CUPY_TF32"] = "1" if enabled else "0"
    try:
        from cupy._core import _routines_linalg as linalg
        linalg.set_compute_type(numpy.dtype(numpy.float32), linalg.COMPUTE_TYPE_TF32 if enabled
                                else linalg.COMPUTE_TYPE_DEFAULT)
    except Exception:       # no GPU, the stand-in, or another CuPy: the variable still holds
        pass


HALF = numpy.dtype(numpy.float16)


def float32_if_half(x):
    """float16 -> a float32 copy (mixed precision's statistics in float32); any other array
    as it is. Both fast layers' (fast_cpu, fast_gpu) and the losses' in fast.py."""
    return x.astype(numpy.float32) if x.dtype == HALF else x


def matmul_precision(dtype, device):
    """The precision a model's matmuls run in, for the peak that MFU is measured against:
    "float16", "tf32", "float32" or "float64" (CPU: the dtype itself)."""
    dtype = numpy.dtype(dtype)
    if device == "gpu" and dtype == numpy.float32 and tf32_enabled():
        return "tf32"
    return dtype.name


def get_xp(device=None):
    """The array namespace for a device: numpy for "cpu", cupy for "gpu" (with TF32 set as
    tf32_enabled() says)."""
    if resolve_device(device) == "cpu":
        return numpy
    try:
        import cupy
    except ImportError as e:
        raise RuntimeError("device='gpu' needs CuPy: pip install 'nanobert[gpu]' "
                           "(or the cupy-cudaXXx wheel matching your CUDA)") from e
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:      # CUDARuntimeError: no driver, a driver older than the wheel
        raise RuntimeError(f"device='gpu' but CuPy cannot reach a GPU ({type(e).__name__}: "
                           f"{e}); is an NVIDIA driver installed and new enough for this "
                           f"cupy wheel? Use device='cpu' otherwise") from e
    if count == 0:
        raise RuntimeError("device='gpu' but CuPy sees no CUDA device")
    _apply_tf32()
    return cupy


def gpu_available():
    """True when CuPy imports and sees at least one GPU (tests use this to skip)."""
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def array_module(x):
    """numpy or cupy, whichever `x` belongs to (without importing cupy needlessly)."""
    if type(x).__module__.startswith("cupy"):
        import cupy
        return cupy
    return numpy


def to_device(x, xp, dtype=None):
    """Host (or device) array -> array of namespace `xp`, optionally cast."""
    if xp is numpy:
        return numpy.asarray(to_host(x), dtype=dtype)
    return xp.asarray(x, dtype=dtype)


class PinnedStaging:
    """Host arrays -> CuPy arrays through page-locked ("pinned") host memory, each copy
    issued asynchronously on the current stream, so that handing a batch to the GPU never
    makes the host wait. cupy.asarray of ordinary (pageable) memory may: CuPy 14 stages it
    through its pinned pool, which allocates new page-locked memory, a synchronization of
    the whole device, whenever the blocks it has are still being copied from, as they are
    when the host runs ahead of the GPU.

    The arrays of one batch (one `batch` object, e.g. the model's checked host dict) fill one
    slot's pinned buffer; the next batch takes the next slot. A buffer is refilled only once
    the event recorded behind its batch (when the next batch began) has passed, so a copy in
    flight never reads half-new data: checked by a query, a wait only when the GPU is still
    `slots` batches behind. Device arrays are fresh each time: CuPy's pool hands memory out
    again in stream order, and a caller may keep them."""

    ALIGN = 256                      # bytes: each array starts on a boundary, as cudaMalloc's

    def __init__(self, xp, slots=2):
        self.xp = xp
        self.buffers = [None] * slots     # each slot's pinned uint8 buffer
        self.retired = [[] for _ in range(slots)]   # outgrown buffers their copies may read
        self.events = [None] * slots      # recorded behind each slot's last batch
        self.slot, self.batch, self.used = 0, None, 0
        self.stream = None

    def put(self, a, batch, dtype=None, out=None):
        """Host array `a` (cast to `dtype`) of `batch` -> a device array, its copy issued;
        into `out` (a C-contiguous device array of a's shape and dtype) if given: the fixed
        buffers a CUDA graph reads (training/graph.py)."""
        if array_module(a) is not numpy:
            return self.xp.asarray(a, dtype=dtype)        # already on the device
        a = numpy.asarray(a)
        dtype = numpy.dtype(dtype or a.dtype)
        if (a.ndim == 0 or a.size == 0) and out is None:
            return self.xp.asarray(a, dtype=dtype)        # a fill kernel's argument: no copy
        if batch is not self.batch:
            self._next_slot(batch)
        start = -(-self.used // self.ALIGN) * self.ALIGN
        end = start + a.size * dtype.itemsize
        buffer = self.buffers[self.slot]
        if buffer is None or end > buffer.size:
            buffer, start, end = self._grow(end - start, end)
        pinned = buffer[start:end].view(dtype).reshape(a.shape)
        pinned[...] = a
        self.used = end
        if out is None:
            out = self.xp.empty(a.shape, dtype=dtype)
        out.set(pinned, stream=self.stream)
        return out

    def _next_slot(self, batch):
        """Leave the slot just filled (an event behind its copies), take the next one once
        the copies that last read it are done."""
        if self.batch is not None:
            if self.events[self.slot] is None:
                self.events[self.slot] = self.xp.cuda.Event(disable_timing=True)
            self.events[self.slot].record(self.stream)
        self.slot = (self.slot + 1) % len(self.buffers)
        event = self.events[self.slot]
        if event is not None and not event.done:
            event.synchronize()                 # the GPU is len(slots) batches behind
        self.retired[self.slot].clear()
        self.batch, self.used = batch, 0
        self.stream = self.xp.cuda.get_current_stream()

    def _grow(self, nbytes, needed):
        """A larger pinned buffer for this slot (the old one kept until its copies are
        done): page-locking memory synchronizes the device, so it is done rarely and
        generously. -> (buffer, start, end) of the next array in it."""
        import cupyx
        old = self.buffers[self.slot]
        if old is not None:
            self.retired[self.slot].append(old)
        self.buffers[self.slot] = cupyx.empty_pinned(2 * needed, dtype=numpy.uint8)
        return self.buffers[self.slot], 0, nbytes


def reuse_freed_memory():
    """Ask glibc's malloc to keep every freed block for reuse instead of handing memory back
    to the system. A training step allocates the same activations every time; with glibc's
    defaults many arrive as fresh pages that the kernel must fault in and zero, one more pass
    over memory per array (BERT-base on 2 cores: ~0.5 of a 4 s step). Two settings, both
    needed: no block gets a mapping of its own, which free() would unmap (M_MMAP_MAX 0; by
    default glibc maps blocks above 128 KiB, a threshold that rises to at most 32 MiB), and
    the heap is never trimmed (M_TRIM_THRESHOLD -1: a MiniLM fine-tuning step frees 1.03 GiB
    at once, so a 1 GiB threshold gave it all back each step, and where NumPy asks for
    transparent huge pages the kernel compacted memory to fault them in again: up to 1.4 s
    of kernel time on a 1.4 s step). Peak memory stays the same (the same arrays, reused);
    the process holds its peak until it ends. Process-wide, so the command lines call it,
    not the library. -> whether it applied (False where the C library is not glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4                           # glibc's malloc.h
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, -1))


def to_host(x):
    """Any array (NumPy or CuPy) or scalar -> NumPy array."""
    if hasattr(x, "get"):          # cupy.ndarray
        return x.get()
    return numpy.asarray(x)


def scatter_add(table, ids, values):
    """table[ids[i]] += values[i] with repeated ids accumulating (embedding backward).

    ids [N] int, values [N, H]. On NumPy: sort the ids, sum each run of equal ids with one
    reduceat, then add once per distinct id (numpy.add.at is ~20x slower on rows).
    """
    xp = array_module(table)
    if xp is numpy:
        order = numpy.argsort(ids, kind="stable")
        sorted_ids = ids[order]
        starts = numpy.flatnonzero(numpy.concatenate(([True], sorted_ids[1:] != sorted_ids[:-1])))
        table[sorted_ids[starts]] += numpy.add.reduceat(values[order], starts, axis=0)
    else:
        import cupyx
        cupyx.scatter_add(table, ids, values)

# ---------------------------------------------------------------- flat buffers (model/flat.py)


def data_pointer(a):
    """Address of an array's first element (NumPy or CuPy)."""
    if array_module(a).__name__ == "numpy":
        return a.__array_interface__["data"][0]
    return a.data.ptr


def flat_offsets(tensors):
    """-> (buffer, {name: offset}) when the tensors of this dict tile one 1-D array exactly
    (each a C-contiguous view of it, no gap, no overlap, in any order); else (None, None),
    and callers loop over the tensors one by one."""
    arrays = list(tensors.values())
    buffer = arrays[0].base if arrays else None
    if buffer is None or buffer.ndim != 1 or not buffer.flags.c_contiguous:
        return None, None
    if any(a.base is not buffer or not a.flags.c_contiguous for a in arrays):
        return None, None
    start = data_pointer(buffer)
    offsets = {name: (data_pointer(a) - start) // buffer.itemsize for name, a in tensors.items()}
    end = 0
    for offset, name in sorted((offset, name) for name, offset in offsets.items()):
        if offset != end:
            return None, None
        end += tensors[name].size
    return (buffer, offsets) if end == buffer.size else (None, None)


def flat_buffer(tensors):
    """The 1-D array the tensors of this dict tile exactly, or None (see flat_offsets)."""
    return flat_offsets(tensors)[0]

# ------------------------------------------------------- can the GPU path run here at all?

GPU_INSTALL = ('pip install -e ".[gpu-cuda12]" (runs on CUDA 12 and 13 drivers) or '
               '".[gpu-cuda13]" (CUDA 13 drivers)')


def require_gpu():
    """Stop before any work where --device gpu cannot run, with one line that names what is
    missing: CuPy, a GPU and its driver, or the CUDA libraries the GPU path loads (cuBLAS for
    the products; NVRTC, which compiles model/kernels.cu at first use; a cupy-cudaNNx wheel
    without its [ctk] extra and without a CUDA toolkit has neither). Raises ValueError, which
    the command lines print as one line; otherwise the first missing piece would show as a
    traceback after the data work (train.py: tokenized corpus, 170k instances built)."""
    try:
        import cupy
    except ImportError as e:
        raise ValueError(f"--device gpu needs CuPy ({_one_line(e)}): {GPU_INSTALL}; "
                         f"or use --device cpu") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:      # CUDARuntimeError: no driver, or one older than the wheel's CUDA
        raise ValueError(f"--device gpu: CuPy {cupy.__version__} reaches no GPU "
                         f"({_one_line(e)}): an NVIDIA GPU and a driver for this wheel's CUDA "
                         f"are needed (a CUDA 12 driver runs \".[gpu-cuda12]\" only); or use "
                         f"--device cpu") from None
    if count == 0:
        raise ValueError("--device gpu: CuPy sees no CUDA device; or use --device cpu")
    missing = []
    try:
        from cupy_backends.cuda.libs import cublas  # noqa: F401  (loads libcublas)
    except Exception as e:
        missing.append(f"cuBLAS ({_one_line(e)})")
    try:
        from .model.kernels import nvrtc_probe    # the kernels' module: CuPy kernels live there
        nvrtc_probe(cupy)
    except Exception as e:
        missing.append(f"NVRTC ({_one_line(e)})")
    if missing:
        raise ValueError(f"--device gpu: CuPy {cupy.__version__} cannot load CUDA's "
                         f"{' and '.join(missing)}: {GPU_INSTALL} brings them from PyPI "
                         f"(CuPy's [ctk] extra); or use --device cpu") from None


def _one_line(error, limit=160):
    """An exception's message on one line, cut to `limit` characters."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."
