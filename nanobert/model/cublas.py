"""cuBLAS called through ctypes, for fast_gpu.gemm: the one cuBLAS entry point the GPU path
uses (cublasGemmStridedBatchedEx), on the handle CuPy made, bound to the current stream, with
a workspace of our own.

Why not CuPy's wrapper (cupy_backends.cuda.libs.cublas): it refuses every call while a
stream is being captured into a CUDA graph ("calling cuBLAS API during stream capture is
currently unsupported"), and a training step replayed as one graph is the point
(training/graph.py). cuBLAS itself supports capture: measured on an H100, 20 products and
20 elementwise kernels captured through ctypes replay equal to the eager run
(bench.gpu_host --graph). Two conditions, both met here: the handle's stream is the
capturing stream (set before every call: CuPy sets it before its own calls on the same
handle), and cuBLAS allocates nothing during capture: a workspace of our own, from CuPy's pool,
set again after every cublasSetStream, which (cuBLAS's documentation) resets the handle to
cuBLAS's default workspace, one that cuBLAS 12.2+ allocates itself, outside CuPy's pool, even
under capture. PyTorch sets its workspace after every SetStream for the same reason.

The library must be the very one CuPy loaded (its handle means nothing to another copy): CuPy
loads it first (asked for its handle), then ctypes opens it by its soname, which the dynamic
loader resolves to the library already loaded, wherever it came from (a pip wheel's, the
toolkit's); failing that, the path cuda-pathfinder gives (as CuPy 14 finds it). The CPU
stand-in of CuPy (tests/cupy_standin.py) hands in its emulation for its own namespace."""
import ctypes

# cublas_api.h's constants (as cupy_backends' cublas.pxd declares them)
OP_N, OP_T = 0, 1
COMPUTE_32F, COMPUTE_64F, COMPUTE_32F_FAST_TF32 = 68, 70, 77
GEMM_DEFAULT = -1

_LIBRARY_NAMES = ("libcublas.so.13", "libcublas.so.12", "libcublas.so", "cublas64_13.dll",
                  "cublas64_12.dll")
WORKSPACE_BYTES = 32 << 20       # cuBLAS asks for >= 32 MiB on Hopper, 4 MiB before
_p, _i, _ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
_GEMM_ARGS = [_p, _i, _i, _i, _i, _i, _p, _p, _i, _i, _ll, _p, _i, _i, _ll, _p, _p, _i, _i, _ll,
              _i, _i, _i]

_LIBRARIES = {}          # array namespace -> its libcublas (ctypes) or the stand-in's emulation
_BOUND = {}              # array namespace -> (handle, workspace): made once per process


def library(xp):
    """libcublas for the namespace xp (cupy), its functions declared."""
    lib = _LIBRARIES.get(xp)
    if lib is None:
        xp.cuda.device.get_cublas_handle()          # CuPy loads its libcublas first
        lib = _LIBRARIES[xp] = _declare(_open())
    return lib


def _open():
    for name in _LIBRARY_NAMES:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib    # CuPy 14's own finder
        return ctypes.CDLL(load_nvidia_dynamic_lib("cublas").abs_path)
    except Exception:       # no pathfinder, or it found none
        pass
    raise RuntimeError("the GPU path needs cuBLAS (libcublas.so.12 or .13): "
                       "pip install -e \".[gpu]\" brings it with CuPy's [ctk] extra")


def _declare(lib):
    lib.cublasGemmStridedBatchedEx.argtypes = _GEMM_ARGS
    lib.cublasSetStream_v2.argtypes = [_p, _p]
    lib.cublasSetWorkspace_v2.argtypes = [_p, _p, ctypes.c_size_t]
    return lib


def gemm_strided_batched(xp, *args):
    """cublasGemmStridedBatchedEx(handle, *args) on the current stream: args are cuBLAS's
    after the handle (ops, sizes, the scalars' host addresses, each operand's address, type,
    leading dimension and stride, count, compute type, algorithm). A status other than
    CUBLAS_STATUS_SUCCESS raises."""
    lib = library(xp)
    handle, workspace = _bound(xp)
    status = (lib.cublasSetStream_v2(handle, xp.cuda.get_current_stream().ptr)
              # SetStream reset the workspace to cuBLAS's own: ours again
              or lib.cublasSetWorkspace_v2(handle, workspace.data.ptr, WORKSPACE_BYTES)
              or lib.cublasGemmStridedBatchedEx(handle, *args))
    if status:
        raise RuntimeError(f"cuBLAS returned status {status} (stream, workspace or "
                           f"cublasGemmStridedBatchedEx)")


def _bound(xp):
    """CuPy's cuBLAS handle for this device and our workspace for it, made the first time
    from CuPy's default pool (not a graph's: it outlives every graph) and kept as long as the
    handle (the process)."""
    bound = _BOUND.get(xp)
    if bound is None:
        with xp.cuda.using_allocator(xp.get_default_memory_pool().malloc):
            workspace = xp.empty(WORKSPACE_BYTES, dtype=xp.uint8)
        bound = _BOUND[xp] = (xp.cuda.device.get_cublas_handle(), workspace)
    return bound
