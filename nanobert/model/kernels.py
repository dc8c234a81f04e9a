"""The kernels of the fast layer's CuPy path (fast_gpu.py): fused elementwise kernels, so that a
step launches ~1,000 kernels rather than ~3,500 (each CuPy call costs ~10 us of host time,
whatever its size). fast_gpu.gemm calls cuBLAS itself; every other CuPy kernel is here.

Each function here is the arithmetic of a few lines of an op in ops.py (the reference, whose
math it restates; NumPy gains nothing from fusion, fast_cpu.py works in place there instead),
written as a pure elementwise function of arrays and scalars that cupy.fuse compiles into one
kernel. Only ufuncs and operators appear inside, no reductions, no indexing: reductions
(row means, sums) stay separate CuPy calls in fast_gpu.py, but for one sum written as a
ReductionKernel (softmax_row_sum). Kernels that must write into strided views (attention's
head layouts) or branch per element (AdamW) are ElementwiseKernels with CUDA C bodies. On
NumPy nothing here is used.

Proven on the CPU only (tests/test_cupy_standin.py): the stand-in runs these functions and
the CUDA C bodies with NumPy and checks that they use nothing but elementwise ops and give
the NumPy path's numbers; that CuPy compiles them on a GPU, and CUDA's own rounding (fma
contraction), are not verified until one is lent.
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

# ---------------------------------------------------------------------------- layernorm


def center_square(x, mean):
    """-> x - mean and its square (the variance's summands), in one pass."""
    centered = x - mean
    return centered, centered * centered


def layernorm_rstd(var, eps):
    """1 / sqrt(var + eps), [..., 1]."""
    import cupy
    return 1.0 / cupy.sqrt(var + eps)

# The rest of LayerNorm as ElementwiseKernels typed so that one kernel serves every dtype
# without a cast kernel: T is the statistics' dtype (float32 in a float16 run, else the
# run's own); G, B, D and O may be float16 (gamma, beta, dout and the output of a float16
# run), read into T in registers (`T g = gamma;`) or rounded once on store.

LAYERNORM_APPLY_IN = "T centered, T rstd, G gamma, B beta"
LAYERNORM_APPLY_OUT = "T xhat, O out"
# out = xhat * gamma + beta, xhat = centered * rstd (what the backward keeps)
LAYERNORM_APPLY_BODY = """
xhat = centered * rstd;
T g = gamma;
T b = beta;
out = xhat * g + b;
"""

LAYERNORM_PRODUCTS_IN = "D dout, G gamma, T xhat"
LAYERNORM_PRODUCTS_OUT = "T dxhat, T dout_xhat, T dxhat_xhat"
# dxhat = dout * gamma, dout * xhat (the gain's gradient summands) and dxhat * xhat (the
# summands of dx's projection) in one pass: a third output costs a write, a separate product
# kernel a launch and a read of two [N, H] arrays
LAYERNORM_PRODUCTS_BODY = """
T d = dout;
T g = gamma;
T dx = d * g;
dxhat = dx;
dout_xhat = d * xhat;
dxhat_xhat = dx * xhat;
"""

LAYERNORM_DX_IN = "T dxhat, T xhat, T mean_dxhat, T mean_dxhat_xhat, T rstd"
LAYERNORM_DX_OUT = "O dx"
# ops.layernorm_backward: (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) * rstd, dx
# rounded once on store into the activations' dtype
LAYERNORM_DX_BODY = """
dx = (dxhat - mean_dxhat - xhat * mean_dxhat_xhat) * rstd;
"""

# (centered, rstd, gamma, beta, xhat, out) -> one kernel.
layernorm_apply = _elementwise("layernorm_apply", LAYERNORM_APPLY_IN,
                               LAYERNORM_APPLY_OUT, LAYERNORM_APPLY_BODY)

# (dout, gamma, xhat, dxhat, dout_xhat, dxhat_xhat) -> one kernel.
layernorm_products = _elementwise("layernorm_products", LAYERNORM_PRODUCTS_IN,
                                  LAYERNORM_PRODUCTS_OUT, LAYERNORM_PRODUCTS_BODY)

# (dxhat, xhat, mean(dxhat), mean(dxhat * xhat), rstd, dx) -> one kernel.
layernorm_dx = _elementwise("layernorm_dx", LAYERNORM_DX_IN, LAYERNORM_DX_OUT, LAYERNORM_DX_BODY)

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

# ------------------------------------------------------------------------------- softmax


def exp_shifted(x, row_max):
    import cupy
    return cupy.exp(x - row_max)


def softmax_dx(dout, y, row_sum):
    """ops.softmax_backward: dout * y - y * sum(dout * y)."""
    return dout * y - y * row_sum

# ----------------------------------------------------------- float16 without cast kernels
# Mixed precision computes LayerNorm, GELU and softmax in float32 on float16 activations.
# Materialising the float32 copies cost 542 cast kernels and 44 ms of a B=128 step on an
# H200 (docs/gpu.md). These kernels instead convert in registers on load (`float v = x;`)
# and on store (a float16 output parameter): the same arithmetic as the cast-then-compute
# sequence, one pass over memory instead of three (LayerNorm's above, typed for any dtype).
# Measured since: copies 46.0 -> 3.7 ms of that step.

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

SOFTMAX_EXP_HALF_IN = "float16 x, float16 row_max"
SOFTMAX_EXP_HALF_OUT = "float32 e"
# exp_shifted in float32 on float16 scores (the row max of float16 values is exact)
SOFTMAX_EXP_HALF_BODY = """
float v = x;
float m = row_max;
e = expf(v - m);
"""

SOFTMAX_NORMALIZE_IN = "float32 e, float32 row_sum"
SOFTMAX_NORMALIZE_OUT = "float16 y"
# the probabilities, divided in float32 and rounded once to float16
SOFTMAX_NORMALIZE_BODY = """
y = e / row_sum;
"""


SOFTMAX_ROW_SUM_HALF_MAP = "float(float16(dout * mask)) * float(y)"
# softmax_row_sum on float16: dropout's product rounded to float16 as the reference's
# (CuPy's float16 has no arithmetic of its own: float16 * float16 is a float, rounded only
# by the float16(...)), then the product with y and the sum in float32


DROPOUT_SOFTMAX_DX_HALF_IN = "float16 dout, float16 mask, float16 y, float32 row_sum"
DROPOUT_SOFTMAX_DX_HALF_OUT = "float16 dx"
# dropout_softmax_dx on float16: g = dout * mask in float16 (the reference's dropout), the
# softmax backward in float32, dx rounded once; no float32 copies of dprobs and y, and no
# separate dropout kernel (4 launches fewer a layer)
DROPOUT_SOFTMAX_DX_HALF_BODY = """
float16 g = dout * mask;
float gf = g;
float yf = y;
dx = gf * yf - yf * row_sum;
"""


def softmax_row_sum_half(xp):
    key = (xp, "nanobert_softmax_row_sum_half")
    if key not in _KERNELS:
        _KERNELS[key] = xp.ReductionKernel("float16 dout, float16 mask, float16 y",
                                           "float32 row_sum", SOFTMAX_ROW_SUM_HALF_MAP,
                                           "a + b", "row_sum = a", "0",
                                           "nanobert_softmax_row_sum_half")
    return _KERNELS[key]

dropout_softmax_dx_half = _elementwise("dropout_softmax_dx_half", DROPOUT_SOFTMAX_DX_HALF_IN,
                                       DROPOUT_SOFTMAX_DX_HALF_OUT, DROPOUT_SOFTMAX_DX_HALF_BODY)


SOFTMAX_DROPOUT_IN = "E e, E row_sum, U uniform, U p, T scale"
SOFTMAX_DROPOUT_OUT = "T y, T dropped, T mask"
# The attention probabilities and their dropout in one pass over [B, A, T, T] (one launch
# and one read and write of the largest activation fewer than softmax's divide then dropout):
# y = e / sum rounded to T (the probabilities' dtype), mask = (uniform >= p) * scale, y * mask
# in T, as the two kernels computed them. Mixed float16 and float arithmetic is kept apart
# (each line one type): CuPy's float16 converts both ways.
SOFTMAX_DROPOUT_BODY = """
T yt = e / row_sum;
U s = scale;
U keep = uniform >= p;
U kept = keep * s;
T m = kept;
y = yt;
mask = m;
dropped = yt * m;
"""

# (exp_shifted, its row sums, uniforms, p, scale, y, dropped, mask) -> one kernel.
softmax_dropout = _elementwise("softmax_dropout", SOFTMAX_DROPOUT_IN,
                               SOFTMAX_DROPOUT_OUT, SOFTMAX_DROPOUT_BODY)

gelu_half = _elementwise("gelu_half", GELU_HALF_IN, GELU_HALF_OUT, GELU_HALF_BODY)

gelu_backward_half = _elementwise("gelu_backward_half", GELU_BACKWARD_HALF_IN,
                                  GELU_BACKWARD_HALF_OUT, GELU_BACKWARD_HALF_BODY)

softmax_exp_half = _elementwise("softmax_exp_half", SOFTMAX_EXP_HALF_IN,
                                SOFTMAX_EXP_HALF_OUT, SOFTMAX_EXP_HALF_BODY)

softmax_normalize_half = _elementwise("softmax_normalize_half", SOFTMAX_NORMALIZE_IN,
                                      SOFTMAX_NORMALIZE_OUT, SOFTMAX_NORMALIZE_BODY)

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


def dropout_softmax_dx(dout, mask, y, row_sum):
    """ops.dropout_backward then ops.softmax_backward: g = dout * mask, g * y - y * row_sum
    (row_sum = sum(g * y), from softmax_row_sum)."""
    g = dout * mask
    return g * y - y * row_sum


def softmax_row_sum(xp):
    """(dout, mask, y) -> sum(dout * mask * y) over the given axis: softmax_backward's
    row sum after dropout's mask, one kernel instead of a product and a sum."""
    key = (xp, "nanobert_softmax_row_sum")
    if key not in _KERNELS:
        _KERNELS[key] = xp.ReductionKernel("T dout, T mask, T y", "T row_sum",
                                           "dout * mask * y", "a + b", "row_sum = a", "0",
                                           "nanobert_softmax_row_sum")
    return _KERNELS[key]

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
