"""The fast layer on CuPy (GPU): fused kernels (kernels.py) in place of NumPy's in-place
sequences. fast.py routes each op here for CuPy arrays (fast_cpu.py holds the NumPy twin);
each function has the signature, the cache and the results of its reference twin in ops.py
(read the math there), proven equal to it on the CPU stand-in of CuPy
(tests/test_cupy_standin.py: arithmetic and launch counts, not CUDA's rounding or speed).

What costs time on a GPU (../shared/GPU-MEASURED.md, an H200): each CuPy call costs ~10 us of
host time whatever its size, so a step should make few of them (fused kernels); the host must
never wait (losses stay on the device as 0-d arrays, read when the caller logs); CuPy's
batched matmul copies any operand or out= that is not C-contiguous, so attention keeps its
heads in buffers laid out for the products.

Mixed precision (float16 activations), as NVIDIA's BERT recipe: matmuls, residual adds and
dropout in float16; LayerNorm, softmax, GELU and the losses compute in float32; parameter
gradients summed into float32 buffers.
"""
import math

import numpy

from ..backend import array_module
from . import kernels, ops
from .ops import AttentionCache

HALF = numpy.dtype(numpy.float16)


def float32_if_half(x):
    """float16 -> a float32 copy (statistics in float32); any other array as it is."""
    return x.astype(numpy.float32) if x.dtype == HALF else x


def matmul(a, b, out=None):
    """a @ b (into out if given). float16 gives a float16 product, also when `out` is a
    float32 weight gradient (cuBLAS writes its inputs' dtype; the gradient is then cast into
    the float32 buffer, as apex's O2 does). Operands and out= cost a copy kernel each unless
    laid out for cuBLAS: 2-D ones C- or F-contiguous, batched ones (and any out=)
    C-contiguous (CuPy's _core.matmul; counted by tests/cupy_standin.py)."""
    xp = array_module(a)
    if a.dtype != HALF or out is None or out.dtype == a.dtype:
        return xp.matmul(a, b, out=out)
    out[...] = xp.matmul(a, b)
    return out

# -------------------------------------------------------------------------------- linear


def linear_forward(x, weight, bias):
    """ops.linear_forward: the bias added in place."""
    x2 = x.reshape(-1, x.shape[-1])                        # [N, in]
    out = matmul(x2, weight.T)                             # [N, out]
    out += bias
    return out.reshape(*x.shape[:-1], weight.shape[0]), (x2, weight, x.shape)


def linear_backward(dout, cache, dweight=None, dbias=None):
    """ops.linear_backward: dweight and dbias computed straight into the given buffers (no
    temporary); float16 gradients summed into the float32 buffers."""
    x2, weight, x_shape = cache
    xp = array_module(dout)
    if dout.dtype != weight.dtype:                         # a float32 loss gradient, float16 layer
        dout = dout.astype(weight.dtype)
    dout2 = dout.reshape(-1, weight.shape[0])              # [N, out]
    dx = matmul(dout2, weight).reshape(x_shape)
    dweight = matmul(dout2.T, x2, out=dweight)
    # float16 gradients are summed in (and written to) the float32 buffer's dtype
    dtype = dbias.dtype if dbias is not None and dbias.dtype != dout2.dtype else None
    dbias = xp.sum(dout2, axis=0, dtype=dtype, out=dbias)
    return dx, dweight, dbias

# ----------------------------------------------------------------------------- layernorm


def layernorm_forward(x, gamma, beta, eps):
    """ops.layernorm_forward in three fused kernels and two means; float16 input:
    statistics and the cache in float32, the output in float16."""
    xp = array_module(x)
    dtype = x.dtype
    x, gamma, beta = float32_if_half(x), float32_if_half(gamma), float32_if_half(beta)
    mean = x.mean(axis=-1, keepdims=True)
    xhat, squares = kernels.fused(xp, kernels.center_square)(x, mean)
    var = squares.mean(axis=-1, keepdims=True)
    # eps of var's dtype: CuPy 13 makes a Python float a float64 (CuPy 14 does not)
    rstd = kernels.fused(xp, kernels.layernorm_rstd)(var, var.dtype.type(eps))
    out, xhat = kernels.fused(xp, kernels.layernorm_apply)(xhat, rstd, gamma, beta)
    return out.astype(dtype, copy=False), (xhat, gamma, rstd)


def layernorm_backward(dout, cache, dgamma=None, dbeta=None):
    """ops.layernorm_backward in two fused kernels; dgamma and dbeta summed straight into
    the given buffers; float16 dout computed in float32."""
    xp = array_module(dout)
    xhat, gamma, rstd = cache
    dtype = dout.dtype
    dout = float32_if_half(dout)
    H = xhat.shape[-1]
    dxhat, dout_xhat = kernels.fused(xp, kernels.layernorm_products)(dout, gamma, xhat)
    dgamma = xp.sum(dout_xhat.reshape(-1, H), axis=0, out=dgamma)
    dbeta = xp.sum(dout.reshape(-1, H), axis=0, out=dbeta)
    dx = kernels.fused(xp, kernels.layernorm_dx)(
        dxhat, xhat, dxhat.mean(axis=-1, keepdims=True),
        (dxhat * xhat).mean(axis=-1, keepdims=True), rstd)
    return dx.astype(dtype, copy=False), dgamma, dbeta

# ---------------------------------------------------------------------------------- gelu


def gelu_forward(x, kind="gelu"):
    """ops.gelu_forward: "gelu" in one fused kernel; float16 computed in float32 (erf has no
    float16), the output cast back."""
    xp = array_module(x)
    dtype = x.dtype
    x = float32_if_half(x)
    if kind != "gelu":
        out, cache = ops.gelu_forward(x, kind)
        return out.astype(dtype, copy=False), cache
    out, cdf = kernels.fused(xp, kernels.gelu)(x)
    return out.astype(dtype, copy=False), (x, cdf, kind)


def gelu_backward(dout, cache):
    """ops.gelu_backward: "gelu" in one fused kernel; float16 dout computed in float32."""
    x, saved, kind = cache
    if dout.dtype == HALF:
        return gelu_backward(dout.astype(numpy.float32), cache).astype(HALF)
    if kind != "gelu":
        return ops.gelu_backward(dout, cache)
    return kernels.fused(array_module(dout), kernels.gelu_backward)(dout, x, saved)

# ------------------------------------------------------------------------------- softmax


def softmax_forward(x, overwrite_x=False):
    """ops.softmax_forward: one fused kernel for the exp; float16 computed in float32, the
    probabilities returned in float16. overwrite_x is NumPy's (fast_cpu), ignored here."""
    xp = array_module(x)
    dtype = x.dtype
    x = float32_if_half(x)
    y = kernels.fused(xp, kernels.exp_shifted)(x, x.max(axis=-1, keepdims=True))
    y /= y.sum(axis=-1, keepdims=True)
    y = y.astype(dtype, copy=False)
    return y, y


def softmax_backward(dout, y):
    """ops.softmax_backward: one fused kernel after the row sum; float16 computed in
    float32."""
    xp = array_module(dout)
    dtype = dout.dtype
    dout, y = float32_if_half(dout), float32_if_half(y)
    row_sum = (dout * y).sum(axis=-1, keepdims=True)
    return kernels.fused(xp, kernels.softmax_dx)(dout, y, row_sum).astype(dtype, copy=False)

# ------------------------------------------------------------------------------- dropout


def dropout_forward(x, p, rng, training):
    """ops.dropout_forward: one fused kernel after the uniform draw."""
    if not training or p == 0.0:
        return x, None
    xp = array_module(x)
    scale, uniform = x.dtype.type(1.0 / (1.0 - p)), _uniform(x, rng)
    # p in the uniforms' dtype: CuPy 13 would compare a Python float in float64
    return kernels.fused(xp, kernels.dropout)(x, uniform, uniform.dtype.type(p), scale)


def dropout_add_forward(x, residual, p, rng, training):
    """ops.dropout_add_forward: dropout and add in one fused kernel. `residual` is not
    modified."""
    if not training or p == 0.0:
        out, mask = dropout_forward(x, p, rng, training)
        out += residual
        return out, mask
    xp = array_module(x)
    scale, uniform = x.dtype.type(1.0 / (1.0 - p)), _uniform(x, rng)
    return kernels.fused(xp, kernels.dropout_add)(x, uniform, residual, uniform.dtype.type(p),
                                                  scale)


def _uniform(x, rng):
    """A uniform draw shaped like x, float32 for float16 x (Generators draw no float16),
    which the fused kernels compare with p."""
    dtype = numpy.float32 if x.dtype == HALF else x.dtype
    return rng.random(x.shape, dtype=dtype)

# ---------------------------------------------------------------------- self-attention


def self_attention_forward(x, w_qkv, b_qkv, mask_bias, num_heads, dropout_p, rng, training):
    """ops.self_attention_forward on CuPy, whose batched matmuls copy any operand or out=
    that is not C-contiguous: one kernel (kernels.attention_heads) adds the projection's
    bias, scales q and writes q, k^T and v as contiguous heads, so that no matmul copies;
    the context leaves [B, A, T, D] through one transposing copy. Same math as the NumPy
    path in the same order; cache.k is a [B, A, T, D] view of the contiguous k^T."""
    xp = array_module(x)
    B, T, H = x.shape
    A, D = num_heads, H // num_heads
    x2 = x.reshape(-1, H)                                  # [N, H]
    qkv = matmul(x2, w_qkv.T)                              # [N, 3H], no bias yet
    projected = qkv.reshape(B, T, 3, A, D).transpose(2, 0, 3, 1, 4)  # [3, B, A, T, D] views
    bias = b_qkv.reshape(3, A, 1, D)
    q, v = xp.empty((B, A, T, D), dtype=x.dtype), xp.empty((B, A, T, D), dtype=x.dtype)
    k_t = xp.empty((B, A, D, T), dtype=x.dtype)
    k = k_t.transpose(0, 1, 3, 2)                          # [B, A, T, D], a view
    kernels.attention_heads(xp)(*projected, *bias, 1.0 / math.sqrt(D), q, k, v)
    scores = matmul(q, k_t)                                # [B, A, T, T]
    scores += mask_bias
    probs, softmax_cache = softmax_forward(scores, overwrite_x=True)
    probs_dropped, dropout_cache = dropout_forward(probs, dropout_p, rng, training)
    context = matmul(probs_dropped, v)                     # [B, A, T, D]
    context = xp.ascontiguousarray(context.transpose(0, 2, 1, 3)).reshape(B, T, H)
    cache = AttentionCache((x2, w_qkv, x.shape), q, k, v, softmax_cache, probs_dropped,
                           dropout_cache, A)
    return context, cache


def self_attention_backward(dcontext, cache, dw_qkv=None, db_qkv=None):
    """ops.self_attention_backward on CuPy with contiguous matmul operands only: each
    product that would need a transposed operand is computed transposed instead (dv^T,
    dprobs^T, dq^T), dscores comes out of its kernel keys-first, and one kernel
    (kernels.attention_grads) scales dq and writes dq, dk, dv into [B, T, 3H], the stacked
    projection's layout. One copy: dcontext^T per head."""
    xp = array_module(dcontext)
    B, T, H = dcontext.shape
    A = cache.num_heads
    D = H // A
    dcontext_t = xp.ascontiguousarray(dcontext.reshape(B, T, A, D).transpose(0, 2, 3, 1))
    dv_t = matmul(dcontext_t, cache.probs_dropped)         # [B, A, D, T] = dv^T
    dprobs_t = matmul(cache.v, dcontext_t)                 # [B, A, T, T] = dprobs^T
    dscores_t = _dropout_softmax_backward_t(dprobs_t, cache)   # [B, A, T, T] = dscores^T
    dk = matmul(dscores_t, cache.q)                        # [B, A, T, D]
    dq_t = matmul(cache.k.transpose(0, 1, 3, 2), dscores_t)    # [B, A, D, T] = dq^T / scale
    dqkv = xp.empty((B, T, 3 * H), dtype=dcontext.dtype)
    places = dqkv.reshape(B, T, 3, A, D).transpose(2, 0, 3, 1, 4)  # [3, B, A, T, D] views
    kernels.attention_grads(xp)(dq_t.transpose(0, 1, 3, 2), dk, dv_t.transpose(0, 1, 3, 2),
                                1.0 / math.sqrt(D), *places)
    return linear_backward(dqkv, cache.qkv, dw_qkv, db_qkv)


def _dropout_softmax_backward_t(dprobs_t, cache):
    """dropout_backward then softmax_backward of the attention probabilities, given and
    returning them transposed (keys first, [B, A, Tk, Tq]) for the matmuls that follow:
    two kernels, the row sum and the elementwise rest. float16: dropout in float16,
    softmax in float32, as the reference."""
    xp = array_module(dprobs_t)
    dtype = dprobs_t.dtype
    y, mask = cache.probs, cache.dropout_mask              # [B, A, Tq, Tk]
    if dtype == HALF:
        if mask is not None:
            dprobs_t = dprobs_t * mask.transpose(0, 1, 3, 2)
        dprobs_t, y, mask = dprobs_t.astype(numpy.float32), y.astype(numpy.float32), None
    keys_first = (0, 1, 3, 2)
    if mask is None:
        mask = mask_t = y.dtype.type(1)
    else:
        mask_t = mask.transpose(keys_first)
    row_sum = kernels.softmax_row_sum(xp)(dprobs_t.transpose(keys_first), mask, y, axis=3,
                                          keepdims=True)  # [B, A, Tq, 1]
    dscores_t = kernels.fused(xp, kernels.dropout_softmax_dx)(
        dprobs_t, mask_t, y.transpose(keys_first), row_sum.transpose(keys_first))
    return dscores_t.astype(dtype, copy=False)

# ----------------------------------------------------------------------------- inference
# The models' eval-mode forward: the *_forward, its cache dropped (no in-place trick: CuPy
# allocates from its pool, and the kernels are the same).


def layernorm_inference(x, gamma, beta, eps, residual=None):
    return layernorm_forward(x if residual is None else x + residual, gamma, beta, eps)[0]


def gelu_inference(x, kind="gelu"):
    return gelu_forward(x, kind)[0]


def self_attention_inference(x, w_qkv, b_qkv, mask_bias, num_heads, output_attentions=False):
    context, cache = self_attention_forward(x, w_qkv, b_qkv, mask_bias, num_heads, 0.0, None,
                                            False)
    return context, cache.probs if output_attentions else None
