"""CuPy's half of the fast layer (fast.py): fused elementwise kernels, so that a step launches
~1,000 kernels rather than ~3,500 (each CuPy call costs ~10 us of host time, whatever its size).

Each function here is the arithmetic of a few lines of an op in ops.py (the reference, whose
math it restates; NumPy gains nothing from fusion, fast.py works in place there instead),
written as a pure elementwise function of arrays and scalars that cupy.fuse compiles into one
kernel. Only ufuncs and operators appear inside, no reductions, no indexing: reductions
(row means, sums) stay separate CuPy calls in fast.py. On NumPy nothing here is used.

Proven on the CPU only (tests/test_cupy_standin.py): the stand-in runs these functions with
NumPy and checks that they use nothing but elementwise ops and give the NumPy path's
numbers; that cupy.fuse compiles them on a GPU is not verified until one is lent.
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


def layernorm_products(dout, gamma, xhat):
    """-> dxhat = dout * gamma, and dout * xhat (the gain's gradient summands), in one pass."""
    return dout * gamma, dout * xhat


def layernorm_rstd(var, eps):
    """1 / sqrt(var + eps), [..., 1]."""
    import cupy
    return 1.0 / cupy.sqrt(var + eps)


def layernorm_apply(centered, rstd, gamma, beta):
    """-> out = xhat * gamma + beta, xhat = centered * rstd (what the backward keeps)."""
    xhat = centered * rstd
    return xhat * gamma + beta, xhat


def layernorm_dx(dxhat, xhat, mean_dxhat, mean_dxhat_xhat, rstd):
    """ops.layernorm_backward: (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) * rstd."""
    return (dxhat - mean_dxhat - xhat * mean_dxhat_xhat) * rstd

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


def adamw_kernel(xp):
    if xp not in _KERNELS:
        _KERNELS[xp] = xp.ElementwiseKernel(ADAMW_IN, ADAMW_OUT, ADAMW_BODY, "nanobert_adamw")
    return _KERNELS[xp]
