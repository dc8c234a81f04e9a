"""The kernels of the fast layer's CuPy path (fast_gpu.py), so that a step launches ~630
kernels rather than ~3,500 (each CuPy call costs ~10 us of host time, whatever its size), and
each reads and writes its arrays once. fast_gpu.gemm calls cuBLAS itself; every other CuPy
kernel is here, each the arithmetic of a few lines of an op in ops.py (the reference, whose
math it restates; NumPy gains nothing from fusion, fast_cpu.py works in place there instead):

- CUDA kernels (kernels.cu, compiled by cupy.RawModule once a dtype): row kernels for the ops
  that reduce over a row and then map it (LayerNorm, Add & Norm, the attention's mask +
  softmax + dropout, the cross-entropy), one warp a row; map kernels for GELU, dropout and the
  attention's head layouts, 16 bytes of each input a thread; GELU's backward with its bias
  gradient in tiles of BIAS_ROWS rows, a thread a column; the fused attention
  (FlashAttention-2's tiles in shared memory: the [B, A, T, T] scores never written; behind
  fast_gpu's NANOBERT_FUSED_ATTENTION switch). Dropout draws its keep mask
  inside the kernels from Philox4x32-10 (counter_rng.CounterGenerator: no cuRAND draw, no
  mask stored; the backward regenerates it), and the uniform kernel is that generator's
  random().
- An ElementwiseKernel with a CUDA C body for AdamW (a whole step over the flat buffers).
On NumPy nothing here is used.

Proven on the CPU only: tests/cuda_emulation.py runs kernels.cu itself on the CPU, 32 lanes a
warp, and the stand-in (tests/test_cupy_standin.py) runs AdamW's body with NumPy; both give
the NumPy path's numbers. nvcc compiles all of them
(tests/test_kernels_compile.py). CUDA's own rounding (fma contraction) and speed are verified
only on a lent GPU (tests/test_gpu_numerics.py, bench.gpu_profile).
"""
import os
from pathlib import Path

# -------------------------------------------------------------------- CUDA kernels
# kernels.cu: dropout's generator (Philox4x32-10), the row kernels (LayerNorm, the attention's
# softmax, the cross-entropy) and the map kernels (GELU, dropout, the attention's layouts),
# with what each costs and why it is shaped so.

CUDA_SOURCE = Path(__file__).with_name("kernels.cu")
CUDA_TYPES = {"e": ("half16", "float"), "f": ("float", "float"), "d": ("double", "double")}
ROW_WARPS = 4                                  # rows (warps) a block of 128 threads
MAP_THREADS = 256                              # threads a block of a map kernel
MAP_BYTES = 16                                 # bytes of each array a map thread loads

ROW_KERNEL_NAMES = ("layernorm_forward", "layernorm_backward", "softmax_forward",
                    "softmax_backward", "cross_entropy_forward", "cross_entropy_backward",
                    "dropout_add_layernorm_forward", "dropout_add_layernorm_backward")
MAP_KERNEL_NAMES = ("gelu_forward", "gelu_backward", "dropout", "dropout_backward", "uniform",
                    "attention_heads", "attention_grads", "move_heads", "bias_gelu_forward")
# column kernels (fast_gpu's _launch_columns), blocks of MAP_THREADS threads: GELU's backward
# with its bias gradient's partial sums over tiles of BIAS_ROWS rows (kernels.cu's constant),
# a thread a column; the partials' sums, a block 32 columns
COLUMN_KERNEL_NAMES = ("bias_gelu_backward", "column_partials")
BIAS_ROWS = 64
# the fused attention (fast_gpu's _launch_attention): ATTENTION_ROWS rows a block, two threads
# a row, heads of at most ATTENTION_HEAD_MAX (kernels.cu's constants of the same names)
ATTENTION_KERNEL_NAMES = ("attention_forward", "attention_backward_queries",
                          "attention_backward_keys")
ATTENTION_MMA = "_mma"       # a name's suffix: its float16 tensor-core twin (sm_80 and later)
ATTENTION_ROWS = 64
ATTENTION_HEAD_MAX = 64
MMA_TILES = (32, 64)         # the tensor-core kernels' rows a tile (kernels.cu's MMA_TILE)


def _read_attention_tile():
    """$NANOBERT_ATTENTION_TILE: the rows a tile of the tensor-core attention kernels, 32 (the
    default, until a GPU measures 64) or 64; read at import, as fast_gpu's switches."""
    told = os.environ.get("NANOBERT_ATTENTION_TILE", "32")
    if told not in map(str, MMA_TILES):
        raise ValueError(f"NANOBERT_ATTENTION_TILE must be 32 or 64, got {told!r}")
    return int(told)


ATTENTION_TILE = _read_attention_tile()


def cuda_source(dtype_char, tile=None):
    """kernels.cu for activations of this NumPy dtype character: its types, the tensor-core
    attention's tile (default ATTENTION_TILE; a compile-time constant), then the file."""
    T, S = CUDA_TYPES[dtype_char]
    return (f"typedef unsigned short half16;\ntypedef {T} T;\ntypedef {S} S;\n"
            f"#define NANOBERT_MMA_TILE {tile or ATTENTION_TILE}\n" + CUDA_SOURCE.read_text())


_MODULES = {}                # (namespace, dtype char) -> the compiled module
_FUNCTIONS = {}              # (namespace, name, dtype char) -> its kernel


def cuda_kernel(xp, name, dtype):
    """The RawKernel nanobert_<name> for activations of dtype, its module compiled once per
    namespace and dtype."""
    key = (xp, name, dtype.char)
    if key not in _FUNCTIONS:
        if key[::2] not in _MODULES:
            _MODULES[key[::2]] = xp.RawModule(code=cuda_source(dtype.char))
        _FUNCTIONS[key] = _MODULES[key[::2]].get_function("nanobert_" + name)
    return _FUNCTIONS[key]

# --------------------------------------------------------------------------------- AdamW

# One kernel for a whole AdamW step over the flat buffers, both modes, with the weight-decay
# mask and the loss scaler's skip flag; optim.AdamW's NumPy loop is its readable twin and
# the scalars below make the one body compute either flavour:
#   "bert":  step_size = lr, v_divisor = 1, decay_factor = 1, coupled_decay = weight_decay
#   "torch": step_size = lr / (1 - beta1^t), v_divisor = sqrt(1 - beta2^t),
#            decay_factor = 1 - lr * weight_decay, coupled_decay = 0
# grad_scale multiplies each gradient as it is read (1, or optim.clip_and_step's 1/loss scale
# times the clip factor): the unscale and the clip cost no pass over the gradients of their own.
ADAMW_IN = ("T grad, T grad_scale, bool decay, bool skip, T beta1, T one_minus_beta1, T beta2, "
            "T one_minus_beta2, T eps, T step_size, T v_divisor, T decay_factor, T coupled_decay")
ADAMW_OUT = "T param, T m, T v"
ADAMW_BODY = """
T g = grad * grad_scale;
T m_new = m * beta1 + g * one_minus_beta1;
T v_new = v * beta2 + g * g * one_minus_beta2;
T wd = decay ? coupled_decay : 0;
T keep = decay ? decay_factor : 1;
T update = m_new / (sqrt(v_new) / v_divisor + eps) + wd * param;
T p_new = param * keep - step_size * update;
m = skip ? m : m_new;
v = skip ? v : v_new;
param = skip ? param : p_new;
"""

# Compiled and loaded, never launched (backend.require_gpu, before any work): NVRTC works and
# the driver takes what it makes.
NVRTC_PROBE = 'extern "C" __global__ void nanobert_probe(float* x) { x[0] = 1.0f; }'


def nvrtc_probe(xp):
    xp.RawModule(code=NVRTC_PROBE).get_function("nanobert_probe")


_ADAMW = {}                  # namespace -> the kernel (the stand-in of the tests is another)


def adamw_kernel(xp):
    """The AdamW ElementwiseKernel, built once per namespace."""
    if xp not in _ADAMW:
        _ADAMW[xp] = xp.ElementwiseKernel(ADAMW_IN, ADAMW_OUT, ADAMW_BODY, "nanobert_adamw")
    return _ADAMW[xp]
