"""The kernels of the fast layer's CuPy path (fast_gpu.py): fused elementwise kernels and
row kernels, so that a step launches ~730 kernels rather than ~3,500 (each CuPy call costs
~10 us of host time, whatever its size). fast_gpu.gemm calls cuBLAS itself; every other
CuPy kernel is here.

Each function here is the arithmetic of a few lines of an op in ops.py (the reference, whose
math it restates; NumPy gains nothing from fusion, fast_cpu.py works in place there instead),
written as a pure elementwise function of arrays and scalars that cupy.fuse compiles into one
kernel. Only ufuncs and operators appear inside, no reductions, no indexing. Kernels that
must write into strided views (attention's head layouts) or branch per element (AdamW) are
ElementwiseKernels with CUDA C bodies. The ops that reduce over a row and then map it
(LayerNorm, the attention's softmax) are CUDA C kernels, one warp a row (ROW_KERNELS). On
NumPy nothing here is used.

Proven on the CPU only: the stand-in (tests/test_cupy_standin.py) runs the fused functions
and the ElementwiseKernel bodies with NumPy, and tests/cuda_emulation.py runs the row
kernels' CUDA source itself on the CPU, 32 lanes a warp; both give the NumPy path's numbers.
nvcc compiles all of them (tests/test_kernels_compile.py). CUDA's own rounding (fma
contraction) and speed are verified only on a lent GPU (tests/test_gpu_numerics.py,
bench.gpu_profile).
"""
import math

INV_SQRT_2 = 1.0 / math.sqrt(2.0)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)

_FUSED = {}


def fused(xp, fn):
    """cupy.fuse(fn), compiled once per namespace (the stand-in of the tests is another)."""
    key = (xp, fn)
    if key not in _FUSED:
        _FUSED[key] = xp.fuse(kernel_name="nanobert_" + fn.__name__)(fn)
    return _FUSED[key]

def _elementwise(name, in_params, out_params, body):
    """-> xp -> the ElementwiseKernel "nanobert_<name>", built once per namespace."""
    def kernel(xp):
        return _kernel(xp, "nanobert_" + name, in_params, out_params, body)
    kernel.__name__ = name
    return kernel

# ------------------------------------------------------------------------------ dropout


def dropout(x, uniform, p, scale):
    """ops.dropout_forward: mask = (uniform >= p) * scale (scale a scalar of x's dtype)."""
    mask = (uniform >= p) * scale
    return x * mask, mask


def dropout_add(x, uniform, residual, p, scale):
    """dropout(x) + residual, the post-LN layer's `y = drop(sublayer(h)); y += h`."""
    mask = (uniform >= p) * scale
    return x * mask + residual, mask

# ---------------------------------------------------------------------------------- gelu


def gelu(x):
    """ops.gelu_forward ("gelu"): -> x * Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2."""
    import cupyx.scipy.special
    cdf = (cupyx.scipy.special.erf(x * INV_SQRT_2) + 1.0) * 0.5
    return x * cdf, cdf


def gelu_backward(dout, x, cdf):
    """ops.gelu_backward ("gelu"): dout * (Phi(x) + x * phi(x))."""
    import cupy
    return (cupy.exp(x * x * -0.5) * x * INV_SQRT_2PI + cdf) * dout

# ----------------------------------------------------------- float16 without cast kernels
# Mixed precision computes LayerNorm, GELU and softmax in float32 on float16 activations.
# Materialising the float32 copies cost 542 cast kernels and 44 ms of a B=128 step on an
# H200 (docs/gpu.md). These kernels instead convert in registers on load (`float v = x;`)
# and on store (a float16 output parameter): the same arithmetic as the cast-then-compute
# sequence, one pass over memory instead of three (LayerNorm's and softmax's: the row kernels
# below, compiled for each dtype). Measured since: copies 46.0 -> 3.7 ms of that step.

GELU_HALF_IN = "float16 x"
GELU_HALF_OUT = "float32 cdf, float16 y"
# gelu in float32 on a float16 x: Phi(x) kept in float32 for the backward, x Phi(x) rounded
# to float16 (the cache keeps x as it came, float16, not a float32 copy)
GELU_HALF_BODY = """
float v = x;
float c = (erff(v * 0.70710678118654752f) + 1.0f) * 0.5f;
cdf = c;
y = v * c;
"""

GELU_BACKWARD_HALF_IN = "float16 dout, float16 x, float32 cdf"
GELU_BACKWARD_HALF_OUT = "float16 dx"
# gelu_backward in float32: (Phi(x) + x phi(x)) dout, 1/sqrt(2 pi) = 0.3989...
GELU_BACKWARD_HALF_BODY = """
float v = x;
float g = dout;
dx = (expf(v * v * -0.5f) * v * 0.39894228040143268f + cdf) * g;
"""

gelu_half = _elementwise("gelu_half", GELU_HALF_IN, GELU_HALF_OUT, GELU_HALF_BODY)

gelu_backward_half = _elementwise("gelu_backward_half", GELU_BACKWARD_HALF_IN,
                                  GELU_BACKWARD_HALF_OUT, GELU_BACKWARD_HALF_BODY)

# ------------------------------------------------------------------------ self-attention
# CuPy's batched matmul calls cuBLAS without trans flags: an operand that is not C-contiguous
# (a head view of the [B, T, 3, A, D] projection, a transposed k) costs a copy kernel, and
# so does an out= that is not C-contiguous; fast_gpu.gemm (cuBLAS directly) reads any row
# stride but needs equally spaced matrices, which the heads of the [B, T, 3, A, D] projection
# are not. fast_gpu's attention therefore keeps its heads in contiguous buffers
# (q, k, v [B, A, T, D]) and moves data between them and the projection's layout in the
# kernels below, which do the elementwise work due at that point anyway.

ATTENTION_HEADS_IN = "T q_in, T k_in, T v_in, T q_bias, T k_bias, T v_bias, T scale"
ATTENTION_HEADS_OUT = "T q, T k, T v"
# ops.linear_forward's `+ bias` and the 1/sqrt(D) of q, in the reference's order
ATTENTION_HEADS_BODY = """
q = (q_in + q_bias) * scale;
k = k_in + k_bias;
v = v_in + v_bias;
"""

ATTENTION_GRADS_IN = "T dq_in, T dk_in, T dv_in, T scale"
ATTENTION_GRADS_OUT = "T dq, T dk, T dv"
# dq through q's scaling, all three written into their places in [B, T, 3H]
ATTENTION_GRADS_BODY = """
dq = dq_in * scale;
dk = dk_in;
dv = dv_in;
"""


def attention_heads(xp):
    """(q, k, v views of the projection [B, A, T, D], their biases [A, 1, D], 1/sqrt(D),
    q, k, v outputs, contiguous [B, A, T, D]) -> one kernel."""
    return _kernel(xp, "nanobert_attention_heads", ATTENTION_HEADS_IN, ATTENTION_HEADS_OUT,
                   ATTENTION_HEADS_BODY)


def attention_grads(xp):
    """(dq, dk, dv as [B, A, T, D] views, 1/sqrt(D), their places in [B, T, 3H]) -> one
    kernel."""
    return _kernel(xp, "nanobert_attention_grads", ATTENTION_GRADS_IN, ATTENTION_GRADS_OUT,
                   ATTENTION_GRADS_BODY)


# ------------------------------------------------------------------ row kernels (CUDA C)
# LayerNorm and softmax reduce over each row, then map it. As CuPy calls that was 5 launches
# and 8 passes over [N, H] for a LayerNorm forward (row mean, center and square, row mean,
# rstd, apply), 6 and 12 for its backward, 5 and 12 over [B, A, T, T] for the attention's
# mask, softmax and dropout. Here each is one kernel, one warp a row: the warp sums (or
# maxes) its row in registers and shuffles, then maps it, reading the row again from the
# cache rather than from memory. Forward: 1 launch and 3 passes (LayerNorm), 1 and 5
# (softmax); backward 1 (+ the two column sums, cuBLAS) and 1.
#
# The source is compiled once per activation dtype T, with S the statistics' dtype (float for
# float16 and float32 activations, double for double). float16 is stored as its 16 bits
# (half16) and converted by the PTX instructions of HALF_CONVERSIONS: no cuda_fp16.h, which
# NVRTC does not always find. tests/cuda_emulation.py runs this same source on the CPU (32
# lanes a warp, shuffles included, HALF_CONVERSIONS replaced by C++'s _Float16, the same
# round-to-nearest-even), so the stand-in and the tests run these kernels, not a twin.

ROW_KERNEL_TYPES = {"e": ("half16", "float"), "f": ("float", "float"), "d": ("double", "double")}
ROW_WARPS = 4                                  # rows (warps) a block of 128 threads

HALF_CONVERSIONS = r"""
__device__ __forceinline__ float widen(half16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ void store(half16* p, float v) {
    half16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    *p = h;
}
"""

ROW_PRELUDE = r"""
__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ double widen(double v) { return v; }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(double* p, double v) { *p = v; }
// v rounded to the activations' dtype, as the reference's T-typed result
__device__ __forceinline__ S round_to_T(S v) { T t; store(&t, v); return widen(t); }
__device__ __forceinline__ float exp_(float v) { return expf(v); }
__device__ __forceinline__ double exp_(double v) { return exp(v); }
__device__ __forceinline__ float sqrt_(float v) { return sqrtf(v); }
__device__ __forceinline__ double sqrt_(double v) { return sqrt(v); }
__device__ __forceinline__ float minus_infinity(float) { return __int_as_float(0xff800000); }
__device__ __forceinline__ double minus_infinity(double) {
    return __longlong_as_double(0xfff0000000000000LL);
}

// the sum (max) of v over the warp's 32 lanes, in every lane: a butterfly of shuffles
__device__ __forceinline__ S warp_sum(S v) {
    for (int lanes = 16; lanes > 0; lanes /= 2) v += __shfl_xor_sync(0xffffffffu, v, lanes);
    return v;
}
__device__ __forceinline__ S warp_max(S v) {
    for (int lanes = 16; lanes > 0; lanes /= 2) {
        S other = __shfl_xor_sync(0xffffffffu, v, lanes);
        v = other > v ? other : v;
    }
    return v;
}

// one warp a row: this thread's row and lane; a warp past the last row leaves whole
#define ROW_AND_LANE(rows)                                                        \
    long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; \
    int lane = threadIdx.x % 32;                                                  \
    if (row >= rows) return;
"""

ROW_KERNELS = r"""
// Each lane walks its row 32 elements apart; `#pragma unroll 4` keeps four of its loads in
// flight at once: one 2- or 4-byte load a thread at a time is too few bytes in flight to
// reach the memory's bandwidth (docs/gpu.md, "Where the time still goes").

// ops.layernorm_forward of x [rows, H]: mean, biased variance, rstd = 1/sqrt(var + eps),
// xhat = (x - mean) rstd, out = xhat gamma + beta. Statistics and xhat in S.
extern "C" __global__ void nanobert_layernorm_forward(
        const T* x, const T* gamma, const T* beta, S eps, long long rows, int H,
        S* xhat, T* out, S* rstd) {
    ROW_AND_LANE(rows)
    const long long start = row * H;
    S sum = 0;
    #pragma unroll 4
    for (int i = lane; i < H; i += 32) sum += widen(x[start + i]);
    const S mean = warp_sum(sum) / H;
    S squares = 0;
    #pragma unroll 4
    for (int i = lane; i < H; i += 32) {
        S centered = widen(x[start + i]) - mean;
        squares += centered * centered;
    }
    const S r = 1 / sqrt_(warp_sum(squares) / H + eps);
    #pragma unroll 4
    for (int i = lane; i < H; i += 32) {
        S normalized = (widen(x[start + i]) - mean) * r;
        xhat[start + i] = normalized;
        store(&out[start + i], normalized * widen(gamma[i]) + widen(beta[i]));
    }
    if (lane == 0) rstd[row] = r;
}

// ops.layernorm_backward's dx of a row, dxhat = dout gamma:
// dx = (dxhat - mean(dxhat) - xhat mean(dxhat xhat)) rstd; and dout xhat, whose column sums
// (cuBLAS) are dgamma.
extern "C" __global__ void nanobert_layernorm_backward(
        const T* dout, const T* gamma, const S* xhat, const S* rstd, long long rows, int H,
        T* dx, S* dout_xhat) {
    ROW_AND_LANE(rows)
    const long long start = row * H;
    S sum = 0, projection = 0;
    #pragma unroll 4
    for (int i = lane; i < H; i += 32) {
        S dxhat = widen(dout[start + i]) * widen(gamma[i]);
        sum += dxhat;
        projection += dxhat * xhat[start + i];
    }
    const S mean = warp_sum(sum) / H;
    const S mean_projection = warp_sum(projection) / H;
    const S r = rstd[row];
    #pragma unroll 4
    for (int i = lane; i < H; i += 32) {
        S d = widen(dout[start + i]);
        S normalized = xhat[start + i];
        store(&dx[start + i], (d * widen(gamma[i]) - mean - normalized * mean_projection) * r);
        dout_xhat[start + i] = d * normalized;
    }
}

// a score plus its key's mask bias (masked), rounded to T as the reference's `scores += bias`
__device__ __forceinline__ S score(const T* scores, const T* bias, long long at, int key,
                                   int masked) {
    S s = widen(scores[at]);
    return masked ? round_to_T(s + widen(bias[key])) : s;
}

// ops.softmax_forward of rows of `keys` scores, each plus the mask bias of its batch element
// (rows_per_bias rows share one; masked = 0: none), then, if dropout, ops.dropout_forward:
// keep_mask = (uniform >= p) scale, dropped = probs keep_mask, both rounded to T.
extern "C" __global__ void nanobert_softmax_forward(
        const T* scores, const T* bias, int masked, long long rows_per_bias, long long rows,
        int keys, const S* uniform, S p, S scale, int dropout,
        T* probs, T* dropped, T* keep_mask) {
    ROW_AND_LANE(rows)
    const long long start = row * keys;
    const T* row_bias = bias + (masked ? row / rows_per_bias * keys : 0);
    S row_max = minus_infinity(S(0));
    #pragma unroll 4
    for (int j = lane; j < keys; j += 32) {
        S s = score(scores, row_bias, start + j, j, masked);
        row_max = s > row_max ? s : row_max;
    }
    row_max = warp_max(row_max);
    S sum = 0;
    #pragma unroll 4
    for (int j = lane; j < keys; j += 32)
        sum += exp_(score(scores, row_bias, start + j, j, masked) - row_max);
    sum = warp_sum(sum);
    #pragma unroll 4
    for (int j = lane; j < keys; j += 32) {
        T y;
        store(&y, exp_(score(scores, row_bias, start + j, j, masked) - row_max) / sum);
        probs[start + j] = y;
        if (dropout) {
            T keep;
            store(&keep, uniform[start + j] >= p ? scale : 0);
            keep_mask[start + j] = keep;
            store(&dropped[start + j], widen(y) * widen(keep));
        }
    }
}

// ops.dropout_backward (if dropout: g = dprobs keep_mask, rounded to T) then
// ops.softmax_backward: dscores = g y - y sum(g y).
extern "C" __global__ void nanobert_softmax_backward(
        const T* dprobs, const T* keep_mask, int dropout, const T* probs, long long rows,
        int keys, T* dscores) {
    ROW_AND_LANE(rows)
    const long long start = row * keys;
    S sum = 0;
    #pragma unroll 4
    for (int j = lane; j < keys; j += 32) {
        S g = widen(dprobs[start + j]);
        if (dropout) g = round_to_T(g * widen(keep_mask[start + j]));
        sum += g * widen(probs[start + j]);
    }
    sum = warp_sum(sum);
    #pragma unroll 4
    for (int j = lane; j < keys; j += 32) {
        S g = widen(dprobs[start + j]);
        if (dropout) g = round_to_T(g * widen(keep_mask[start + j]));
        S y = widen(probs[start + j]);
        store(&dscores[start + j], g * y - y * sum);
    }
}
"""

ROW_KERNEL_NAMES = ("layernorm_forward", "layernorm_backward", "softmax_forward",
                    "softmax_backward")


def row_source(dtype_char):
    """The CUDA source of the row kernels for activations of this NumPy dtype character."""
    T, S = ROW_KERNEL_TYPES[dtype_char]
    return (f"typedef unsigned short half16;\ntypedef {T} T;\ntypedef {S} S;\n"
            + HALF_CONVERSIONS + ROW_PRELUDE + ROW_KERNELS)


_ROW_MODULES = {}            # (namespace, dtype char) -> the compiled module
_ROW_FUNCTIONS = {}          # (namespace, name, dtype char) -> its kernel


def row_kernel(xp, name, dtype):
    """The RawKernel nanobert_<name> for activations of dtype, its module compiled once per
    namespace and dtype."""
    key = (xp, name, dtype.char)
    if key not in _ROW_FUNCTIONS:
        if key[::2] not in _ROW_MODULES:
            _ROW_MODULES[key[::2]] = xp.RawModule(code=row_source(dtype.char))
        _ROW_FUNCTIONS[key] = _ROW_MODULES[key[::2]].get_function("nanobert_" + name)
    return _ROW_FUNCTIONS[key]

# --------------------------------------------------------------------------------- AdamW

# One kernel for a whole AdamW step over the flat buffers, both modes, with the weight-decay
# mask and the loss scaler's skip flag; optim.AdamW's NumPy loop is its readable twin and
# the scalars below make the one body compute either flavour:
#   "bert":  step_size = lr, v_divisor = 1, decay_factor = 1, coupled_decay = weight_decay
#   "torch": step_size = lr / (1 - beta1^t), v_divisor = sqrt(1 - beta2^t),
#            decay_factor = 1 - lr * weight_decay, coupled_decay = 0
ADAMW_IN = ("T grad, bool decay, bool skip, T beta1, T one_minus_beta1, T beta2, "
            "T one_minus_beta2, T eps, T step_size, T v_divisor, T decay_factor, T coupled_decay")
ADAMW_OUT = "T param, T m, T v"
ADAMW_BODY = """
T m_new = m * beta1 + grad * one_minus_beta1;
T v_new = v * beta2 + grad * grad * one_minus_beta2;
T wd = decay ? coupled_decay : 0;
T keep = decay ? decay_factor : 1;
T update = m_new / (sqrt(v_new) / v_divisor + eps) + wd * param;
T p_new = param * keep - step_size * update;
m = skip ? m : m_new;
v = skip ? v : v_new;
param = skip ? param : p_new;
"""

_KERNELS = {}


def _kernel(xp, name, in_params, out_params, body):
    """xp.ElementwiseKernel, built once per namespace (the stand-in of the tests is another)."""
    key = (xp, name)
    if key not in _KERNELS:
        _KERNELS[key] = xp.ElementwiseKernel(in_params, out_params, body, name)
    return _KERNELS[key]


def adamw_kernel(xp):
    return _kernel(xp, "nanobert_adamw", ADAMW_IN, ADAMW_OUT, ADAMW_BODY)
