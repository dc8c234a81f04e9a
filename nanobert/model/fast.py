"""The ops of ops.py, made fast: the layer the model runs.

Each function here has the signature, the cache and the results of its reference twin in
ops.py (read the math there); tests/test_fast.py proves each equal to it, bitwise or within
a stated rounding bound. Only what buys speed or memory lives here:

- NumPy: in-place sequences, so a large elementwise op allocates one array, not three.
- CuPy: fused elementwise kernels (kernels.py) in place of those sequences (each CuPy call
  costs a kernel launch, ~10 us of host time), and losses that stay on the device (a 0-d
  array, read when the caller logs) so the host never waits inside a step.
- Mixed precision (float16 activations), as NVIDIA's BERT recipe: matmuls, residual adds
  and dropout run in float16, while LayerNorm, softmax, GELU and the losses compute in
  float32 (their inputs are cast up and their outputs back down) and parameter gradients
  are written into float32 buffers. On NumPy a float16 matmul runs as a float32 BLAS call
  rounded to float16: what tensor cores do (float16 inputs, float32 accumulation, a
  float16 result), and ~100x faster than NumPy's own float16 loop.
- Dropout masks from the bit generator's raw words, without making floats of them.

Ops with no trick to add are the reference itself, imported below.
"""
import math
from typing import NamedTuple

import numpy

from ..backend import array_module
from . import kernels, ops
from .ops import (GELU_KINDS, IGNORE_INDEX, AttentionCache, attention_mask_bias,  # noqa: F401
                  bce_with_logits_backward, dropout_backward, embedding_backward,
                  embedding_forward, mse_backward, tanh_backward, tanh_forward)
from .special import erf

HALF = numpy.dtype(numpy.float16)


def float32_if_half(x):
    """float16 -> a float32 copy (statistics in float32); any other array as it is."""
    return x.astype(numpy.float32) if x.dtype == HALF else x


def matmul(a, b, out=None):
    """a @ b (into out if given). float16 gives a float16 product, also when `out` is a
    float32 weight gradient (cuBLAS writes its inputs' dtype; the gradient is then cast
    into the float32 buffer, as apex's O2 does): on NumPy, a float32 BLAS call rounded to
    float16, the same numbers. On CuPy, operands and out= cost a copy kernel each unless
    laid out for cuBLAS: 2-D ones C- or F-contiguous, batched ones (and any out=)
    C-contiguous (CuPy's _core.matmul; counted by tests/cupy_standin.py)."""
    if a.dtype != HALF:
        return a @ b if out is None else array_module(a).matmul(a, b, out=out)
    xp = array_module(a)
    if xp is numpy:
        with numpy.errstate(over="ignore"):    # inf: the loss scaler's overflow, skipped
            product = numpy.matmul(a.astype(numpy.float32), b.astype(numpy.float32)).astype(HALF)
        if out is None:
            return product
        out[...] = product
        return out
    if out is None or out.dtype == a.dtype:
        return xp.matmul(a, b, out=out)
    out[...] = xp.matmul(a, b)
    return out

# -------------------------------------------------------------------------------- linear


def linear_forward(x, weight, bias):
    """ops.linear_forward: the bias added in place; float16 through matmul."""
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
    """ops.layernorm_forward: in place on NumPy (xhat made from the centred x, one output
    array), three fused kernels on CuPy; float16 input: statistics and the cache in float32,
    the output in float16."""
    xp = array_module(x)
    dtype = x.dtype
    x, gamma, beta = float32_if_half(x), float32_if_half(gamma), float32_if_half(beta)
    mean = x.mean(axis=-1, keepdims=True)
    if xp is numpy:
        xhat = x - mean
        var = xp.mean(xhat * xhat, axis=-1, keepdims=True)
        rstd = 1.0 / xp.sqrt(var + eps)                     # [..., 1]
        xhat *= rstd
        out = xhat * gamma
        out += beta
    else:
        xhat, squares = kernels.fused(xp, kernels.center_square)(x, mean)
        var = squares.mean(axis=-1, keepdims=True)
        # eps of var's dtype: CuPy 13 makes a Python float a float64 (CuPy 14 does not)
        rstd = kernels.fused(xp, kernels.layernorm_rstd)(var, var.dtype.type(eps))
        out, xhat = kernels.fused(xp, kernels.layernorm_apply)(xhat, rstd, gamma, beta)
    return out.astype(dtype, copy=False), (xhat, gamma, rstd)


def layernorm_backward(dout, cache, dgamma=None, dbeta=None):
    """ops.layernorm_backward: on NumPy two [..., H] buffers in all (dxhat becomes dx in
    place; one scratch buffer holds both products), on CuPy two fused kernels; dgamma and
    dbeta summed straight into the given buffers; float16 dout computed in float32."""
    xp = array_module(dout)
    xhat, gamma, rstd = cache
    dtype = dout.dtype
    dout = float32_if_half(dout)
    H = xhat.shape[-1]
    if xp is not numpy:
        dxhat, dout_xhat = kernels.fused(xp, kernels.layernorm_products)(dout, gamma, xhat)
        dgamma = xp.sum(dout_xhat.reshape(-1, H), axis=0, out=dgamma)
        dbeta = xp.sum(dout.reshape(-1, H), axis=0, out=dbeta)
        dx = kernels.fused(xp, kernels.layernorm_dx)(
            dxhat, xhat, dxhat.mean(axis=-1, keepdims=True),
            (dxhat * xhat).mean(axis=-1, keepdims=True), rstd)
        return dx.astype(dtype, copy=False), dgamma, dbeta
    product = dout * xhat                                  # one scratch buffer, reused
    dgamma = xp.sum(product.reshape(-1, H), axis=0, out=dgamma)
    dbeta = xp.sum(dout.reshape(-1, H), axis=0, out=dbeta)
    dx = dout * gamma                                      # dxhat, made dx in place
    projection = xp.multiply(dx, xhat, out=product).mean(axis=-1, keepdims=True)
    dx -= dx.mean(axis=-1, keepdims=True)
    dx -= xp.multiply(xhat, projection, out=product)
    dx *= rstd
    return dx.astype(dtype, copy=False), dgamma, dbeta

# ---------------------------------------------------------------------------------- gelu


def gelu_forward(x, kind="gelu"):
    """ops.gelu_forward: "gelu" in place on NumPy (one buffer for Phi), one fused kernel on
    CuPy; float16 computed in float32 (erf has no float16), the output cast back."""
    xp = array_module(x)
    dtype = x.dtype
    x = float32_if_half(x)
    if kind != "gelu":
        out, cache = ops.gelu_forward(x, kind)
        return out.astype(dtype, copy=False), cache
    if xp is not numpy:
        out, cdf = kernels.fused(xp, kernels.gelu)(x)
        return out.astype(dtype, copy=False), (x, cdf, kind)
    cdf = x * (1.0 / math.sqrt(2.0))
    erf(cdf, xp, out=cdf)
    cdf += 1.0
    cdf *= 0.5                                              # Phi(x)
    return (x * cdf).astype(dtype, copy=False), (x, cdf, kind)


def gelu_backward(dout, cache):
    """ops.gelu_backward: "gelu" in place on NumPy (one buffer), one fused kernel on CuPy;
    float16 dout computed in float32."""
    xp = array_module(dout)
    x, saved, kind = cache
    if dout.dtype == HALF:
        return gelu_backward(dout.astype(numpy.float32), cache).astype(HALF)
    if kind != "gelu":
        return ops.gelu_backward(dout, cache)
    if xp is not numpy:
        return kernels.fused(xp, kernels.gelu_backward)(dout, x, saved)
    d = x * x
    d *= -0.5
    xp.exp(d, out=d)
    d *= x
    d *= 1.0 / math.sqrt(2.0 * math.pi)                    # x phi(x)
    d += saved
    d *= dout
    return d

# ------------------------------------------------------------------------------- softmax


def softmax_forward(x, overwrite_x=False):
    """ops.softmax_forward: in place on NumPy, one fused kernel for the exp on CuPy; float16
    computed in float32, the probabilities returned in float16. overwrite_x: x is a
    temporary the caller drops (the attention scores); on NumPy the probabilities are
    computed in its memory, one large allocation fewer."""
    xp = array_module(x)
    dtype = x.dtype
    in_place = xp is numpy and (overwrite_x or dtype == HALF)   # float16: x is our copy
    x = float32_if_half(x)
    if xp is numpy:
        y = xp.subtract(x, x.max(axis=-1, keepdims=True), out=x if in_place else None)
        xp.exp(y, out=y)
    else:
        y = kernels.fused(xp, kernels.exp_shifted)(x, x.max(axis=-1, keepdims=True))
    y /= y.sum(axis=-1, keepdims=True)
    y = y.astype(dtype, copy=False)
    return y, y


def softmax_backward(dout, y):
    """ops.softmax_backward: in place on NumPy, one fused kernel on CuPy; float16 computed
    in float32."""
    xp = array_module(dout)
    dtype = dout.dtype
    dout, y = float32_if_half(dout), float32_if_half(y)
    if xp is not numpy:
        row_sum = (dout * y).sum(axis=-1, keepdims=True)
        return kernels.fused(xp, kernels.softmax_dx)(dout, y, row_sum).astype(dtype, copy=False)
    dx = dout * y
    dx -= y * dx.sum(axis=-1, keepdims=True)
    return dx.astype(dtype, copy=False)

# ------------------------------------------------------------------------------- dropout


def dropout_forward(x, p, rng, training):
    """ops.dropout_forward: on NumPy the keep mask from the bit generator's raw words
    (_keep_mask, twice as fast as making uniforms), on CuPy one fused kernel."""
    if not training or p == 0.0:
        return x, None
    xp = array_module(x)
    scale = x.dtype.type(1.0 / (1.0 - p))
    if xp is not numpy:
        return kernels.fused(xp, kernels.dropout)(x, _uniform(x, rng), p, scale)
    mask = _keep_mask(x.shape, p, rng, _uniform_dtype(x)) * scale
    return x * mask, mask


def dropout_add_forward(x, residual, p, rng, training):
    """ops.dropout_add_forward: the residual added in place into the dropout's output on
    NumPy (x itself in eval mode: x is the sublayer's temporary); dropout and add in one
    fused kernel on CuPy. `residual` is not modified."""
    xp = array_module(x)
    if xp is numpy or not training or p == 0.0:
        out, mask = dropout_forward(x, p, rng, training)
        out += residual
        return out, mask
    scale = x.dtype.type(1.0 / (1.0 - p))
    return kernels.fused(xp, kernels.dropout_add)(x, _uniform(x, rng), residual, p, scale)


def _uniform_dtype(x):
    return numpy.dtype(numpy.float32) if x.dtype == HALF else x.dtype  # Generators draw no float16


def _uniform(x, rng):
    """A uniform draw shaped like x (CuPy: the fused kernels compare it with p)."""
    return rng.random(x.shape, dtype=_uniform_dtype(x))


# A Generator's uniform is a random word shifted right and scaled: float32 (32-bit word >> 8)
# * 2^-24, float64 (64-bit word >> 11) * 2^-53. dtype -> (word, bits kept).
UNIFORM_WORDS = {numpy.dtype(numpy.float32): (numpy.dtype(numpy.uint32), 24),
                 numpy.dtype(numpy.float64): (numpy.dtype(numpy.uint64), 53)}


def _keep_mask(shape, p, rng, uniform_dtype):
    """rng.random(shape, uniform_dtype) >= p (bool), decided on the random words without
    making floats of them: twice as fast. The same elements are kept (p is quantised as the
    uniforms are, to 2^-24 in float32), except that a float32 draw of odd size drops the
    unused half of its last 64-bit word instead of keeping it for the next draw."""
    word, bits = UNIFORM_WORDS[uniform_dtype]
    n = math.prod(shape)
    if isinstance(rng.bit_generator, numpy.random.MT19937):   # 32-bit raw output
        words = rng.integers(0, 2 ** (8 * word.itemsize), size=n, dtype=word)
    else:                                                      # 64-bit raw output, cut in words
        per_raw = 8 // word.itemsize
        words = rng.bit_generator.random_raw(-(-n // per_raw)).view(word)[:n]
    # (w >> shift) * 2^-bits >= p  <=>  w >= ceil(p * 2^bits) << shift (a Python int: it may
    # be 2^32 when p rounds to 1.0 in float32, and then nothing is kept, as before)
    shift = 8 * word.itemsize - bits
    threshold = math.ceil(float(uniform_dtype.type(p)) * 2 ** bits) << shift
    return words.reshape(shape) >= threshold

# ---------------------------------------------------------------------- self-attention


def self_attention_forward(x, w_qkv, b_qkv, mask_bias, num_heads, dropout_p, rng, training):
    """ops.self_attention_forward: the scores become the probabilities in their own memory
    (softmax overwrite_x). On NumPy the heads are views of the projection and the context
    matmul writes each head straight into its columns of [B, T, H]: NumPy's matmul reads
    and writes such strided matrices without a copy. CuPy copies them (a kernel each), so
    there _self_attention_forward_device lays the heads out for its matmuls instead."""
    xp = array_module(x)
    if xp is not numpy:
        return _self_attention_forward_device(x, w_qkv, b_qkv, mask_bias, num_heads,
                                              dropout_p, rng, training)
    B, T, H = x.shape
    A, D = num_heads, H // num_heads
    qkv, qkv_cache = linear_forward(x, w_qkv, b_qkv)       # [B, T, 3H]
    qkv = qkv.reshape(B, T, 3, A, D).transpose(2, 0, 3, 1, 4)  # [3, B, A, T, D], a view
    q, k, v = qkv[0], qkv[1], qkv[2]
    q = q * (1.0 / math.sqrt(D))
    scores = matmul(q, k.transpose(0, 1, 3, 2))            # [B, A, T, T]
    scores += mask_bias
    probs, softmax_cache = softmax_forward(scores, overwrite_x=True)
    probs_dropped, dropout_cache = dropout_forward(probs, dropout_p, rng, training)
    context = xp.empty((B, T, H), dtype=x.dtype)
    matmul(probs_dropped, v, out=context.reshape(B, T, A, D).transpose(0, 2, 1, 3))
    cache = AttentionCache(qkv_cache, q, k, v, softmax_cache, probs_dropped, dropout_cache, A)
    return context, cache


def self_attention_backward(dcontext, cache, dw_qkv=None, db_qkv=None):
    """ops.self_attention_backward: dq, dk, dv written by their matmuls straight into their
    places in [B, T, 3H], the stacked projection's layout: no stack, and on NumPy no
    transposing copy (its matmul writes strided matrices). CuPy would copy each strided
    operand and output: _self_attention_backward_device instead."""
    xp = array_module(dcontext)
    if xp is not numpy:
        return _self_attention_backward_device(dcontext, cache, dw_qkv, db_qkv)
    B, T, H = dcontext.shape
    A = cache.num_heads
    D = H // A
    dcontext = dcontext.reshape(B, T, A, D).transpose(0, 2, 1, 3)  # [B, A, T, D], a view
    dqkv = xp.empty((B, T, 3 * H), dtype=dcontext.dtype)
    dq, dk, dv = dqkv.reshape(B, T, 3, A, D).transpose(2, 0, 3, 1, 4)  # [B, A, T, D] views
    matmul(cache.probs_dropped.transpose(0, 1, 3, 2), dcontext, out=dv)
    dprobs = matmul(dcontext, cache.v.transpose(0, 1, 3, 2))       # [B, A, T, T]
    dprobs = dropout_backward(dprobs, cache.dropout_mask)
    dscores = softmax_backward(dprobs, cache.probs)
    matmul(dscores, cache.k, out=dq)
    dq *= 1.0 / math.sqrt(D)
    matmul(dscores.transpose(0, 1, 3, 2), cache.q, out=dk)
    return linear_backward(dqkv, cache.qkv, dw_qkv, db_qkv)


def _self_attention_forward_device(x, w_qkv, b_qkv, mask_bias, num_heads, dropout_p, rng,
                                   training):
    """self_attention_forward on CuPy, whose batched matmuls copy any operand or out= that
    is not C-contiguous: one kernel (kernels.attention_heads) adds the projection's bias,
    scales q and writes q, k^T and v as contiguous heads, so that no matmul copies; the
    context leaves [B, A, T, D] through one transposing copy. Same math as the NumPy path
    in the same order; cache.k is a [B, A, T, D] view of the contiguous k^T."""
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


def _self_attention_backward_device(dcontext, cache, dw_qkv=None, db_qkv=None):
    """self_attention_backward on CuPy with contiguous matmul operands only: each product
    that would need a transposed operand is computed transposed instead (dv^T, dprobs^T,
    dq^T), dscores comes out of its kernel keys-first, and one kernel
    (kernels.attention_grads) scales dq and writes dq, dk, dv into [B, T, 3H]. One copy:
    dcontext^T per head."""
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

# ------------------------------------------------------------------------- cross-entropy


class CrossEntropyCache(NamedTuple):
    exp_shifted: object        # [N, C] exp(logits - row max): the softmax before normalising
    sum_exp: object            # [N] its row sums
    safe_labels: object        # [N] labels with ignored rows set to 0
    valid: object              # [N] bool, rows the loss counts
    count: int                 # how many rows it counts
    denominator: float         # what their summed loss is divided by


def device_loss(total, denominator):
    """total / denominator: a float on NumPy, a 0-d device array on CuPy, so that the host
    does not wait for the GPU; callers read it (float()) when they log."""
    if array_module(total) is numpy:
        return float(total) / denominator
    return total / denominator


def cross_entropy_forward(logits, labels, denominator=None, count=None):
    """ops.cross_entropy_forward, with no host wait on the GPU: `count`, the number of
    labels that are not -100, comes from the caller's host labels (else it is read from the
    device), and the loss stays on the device (device_loss). One [N, C] buffer, which the
    backward turns into dlogits; float16 logits computed in float32."""
    xp = array_module(logits)
    valid = labels != IGNORE_INDEX                         # [N]
    if count is None:
        count = int(valid.sum())                           # a host wait on the GPU
    logits = float32_if_half(logits)
    row_max = logits.max(axis=-1, keepdims=True)
    exp_shifted = logits - row_max                         # the one [N, C] buffer
    xp.exp(exp_shifted, out=exp_shifted)
    sum_exp = exp_shifted.sum(axis=-1)                     # [N]
    safe_labels = xp.where(valid, labels, 0)
    rows = xp.arange(labels.shape[0])
    label_logit = logits[rows, safe_labels] - row_max[:, 0]
    nll = xp.log(sum_exp) - label_logit                    # -log p(label), [N]
    denominator = max(count, 1) if denominator is None else denominator
    loss = device_loss((nll * valid).sum(), denominator)
    return loss, CrossEntropyCache(exp_shifted, sum_exp, safe_labels, valid, count, denominator)


def cross_entropy_backward(dloss, cache):
    """ops.cross_entropy_backward, built in the forward's [N, C] buffer (for the MLM head,
    [M, V] is the largest array of the step): one pass, no new array; so call it once per
    forward."""
    xp = array_module(cache.exp_shifted)
    row_scale = (dloss / cache.denominator) * cache.valid                  # [N]
    dlogits = cache.exp_shifted
    dlogits *= (row_scale / cache.sum_exp).astype(dlogits.dtype)[:, None]  # softmax, scaled
    dlogits[xp.arange(dlogits.shape[0]), cache.safe_labels] -= row_scale.astype(dlogits.dtype)
    return dlogits

# ------------------------------------------------------------------ regression losses


def mse_forward(prediction, target):
    """ops.mse_forward, the loss on the device (device_loss); float16 computed in float32."""
    diff = float32_if_half(prediction) - target
    return device_loss((diff * diff).sum(), diff.size), diff


def bce_with_logits_forward(logits, targets):
    """ops.bce_with_logits_forward, the loss on the device (device_loss); float16 computed
    in float32."""
    xp = array_module(logits)
    logits = float32_if_half(logits)
    per_element = xp.maximum(logits, 0.0) - logits * targets + xp.log1p(xp.exp(-xp.abs(logits)))
    return device_loss(per_element.sum(), per_element.size), (logits, targets)
