"""The ops of BERT, each a pair of pure functions written by hand:

    x_forward(inputs..., params...) -> out, cache
    x_backward(dout, cache)         -> d_inputs..., d_params...

The cache holds exactly what the backward needs. A backward given arrays for its parameter
gradients (dweight=..., views of a model's flat gradient buffer) writes into them instead of
allocating: no copy from a temporary. Every function works on NumPy and CuPy
arrays alike: the array namespace `xp` is taken from the inputs. Shapes use B (batch),
T (sequence length), H (hidden size), A (attention heads), D = H / A (head size),
I (intermediate size), V (vocabulary), N (rows of a 2-D matmul, usually B*T).

On CuPy a few ops take another branch: fused elementwise kernels (kernels.py) in place of
NumPy's in-place sequences, and losses that stay on the device (a 0-d array, read when the
caller logs) instead of a float; the NumPy code is the readable twin of each.

Mixed precision (float16 activations): matmuls, residual adds and dropout run in float16,
while LayerNorm, softmax, GELU and the losses compute in float32 (their inputs are cast up
and their outputs back down) and parameter gradients are written into float32 buffers, as
NVIDIA's BERT recipe does. On NumPy a float16 matmul runs as a float32 BLAS call rounded to
float16: what tensor cores do (float16 inputs, float32 accumulation, a float16 result), and
~100x faster than NumPy's own float16 loop.
"""
import math
from typing import NamedTuple

import numpy

from ..backend import array_module, scatter_add
from . import kernels
from .special import erf

HALF = numpy.dtype(numpy.float16)


def float32_if_half(x):
    """float16 -> a float32 copy (statistics in float32); any other array as it is."""
    return x.astype(numpy.float32) if x.dtype == HALF else x


def matmul(a, b, out=None):
    """a @ b (into out if given). float16 gives a float16 product, also when `out` is a
    float32 weight gradient (cuBLAS writes its inputs' dtype; the gradient is then cast
    into the float32 buffer, as apex's O2 does): on NumPy, a float32 BLAS call rounded to
    float16, the same numbers."""
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

# ----------------------------------------------------------------------------- embedding


def embedding_forward(ids, table):
    """Row lookup. ids [...] int, table [V, H] -> [..., H]."""
    return table[ids], (ids, table.shape)


def embedding_backward(dout, cache, dtable=None):
    """dtable [V, H]: each row sums the gradients of every position that looked it up.

    Given dtable, adds into it: a lookup touches few rows, so it adds into the dense
    gradient that the tied MLM decoder already wrote, rather than zero-filling a table of
    its own (V x H) to be added afterwards."""
    ids, table_shape = cache
    xp = array_module(dout)
    if dtable is None:
        dtable = xp.zeros(table_shape, dtype=dout.dtype)
    scatter_add(dtable, ids.reshape(-1), dout.reshape(-1, table_shape[1]))
    return dtable

# -------------------------------------------------------------------------------- linear


def linear_forward(x, weight, bias):
    """x [..., in], weight [out, in] (PyTorch layout), bias [out] -> [..., out].

    One 2-D matmul over all leading dims folded into N rows: a single BLAS call.
    """
    x2 = x.reshape(-1, x.shape[-1])                        # [N, in]
    out = matmul(x2, weight.T)                             # [N, out]
    out += bias
    return out.reshape(*x.shape[:-1], weight.shape[0]), (x2, weight, x.shape)


def linear_backward(dout, cache, dweight=None, dbias=None):
    """-> dx [..., in], dweight [out, in], dbias [out] (written into dweight / dbias if given)."""
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
    """Normalise over the last axis. x [..., H], gamma/beta [H] -> [..., H].

    The cache keeps the normalised input and 1/std (as llm.c does), not x itself.
    float16 input: statistics and the cache in float32, output in float16.
    """
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
        rstd = kernels.fused(xp, kernels.layernorm_rstd)(var, eps)
        out, xhat = kernels.fused(xp, kernels.layernorm_apply)(xhat, rstd, gamma, beta)
    return out.astype(dtype, copy=False), (xhat, gamma, rstd)


def layernorm_backward(dout, cache, dgamma=None, dbeta=None):
    """-> dx [..., H], dgamma [H], dbeta [H] (written into dgamma / dbeta if given)."""
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
    # d/dx of (x - mean) * rstd: remove the mean of dxhat and its projection on xhat.
    projection = xp.multiply(dx, xhat, out=product).mean(axis=-1, keepdims=True)
    dx -= dx.mean(axis=-1, keepdims=True)
    dx -= xp.multiply(xhat, projection, out=product)
    dx *= rstd
    return dx.astype(dtype, copy=False), dgamma, dbeta

# ---------------------------------------------------------------------------------- gelu

GELU_KINDS = ("gelu", "gelu_new", "gelu_pytorch_tanh")


def gelu_forward(x, kind="gelu"):
    """x * Phi(x). "gelu": exact, Phi = normal CDF via erf (every released BERT checkpoint);
    "gelu_new" / "gelu_pytorch_tanh": the tanh approximation of the original TF code.
    float16 input is computed in float32 (erf has no float16), the output cast back."""
    xp = array_module(x)
    dtype = x.dtype
    x = float32_if_half(x)
    if kind == "gelu":
        if xp is not numpy:
            out, cdf = kernels.fused(xp, kernels.gelu)(x)
            return out.astype(dtype, copy=False), (x, cdf, kind)
        cdf = x * (1.0 / math.sqrt(2.0))
        erf(cdf, xp, out=cdf)
        cdf += 1.0
        cdf *= 0.5                                          # Phi(x)
        return (x * cdf).astype(dtype, copy=False), (x, cdf, kind)
    if kind in ("gelu_new", "gelu_pytorch_tanh"):
        t = xp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x))
        return (0.5 * x * (1.0 + t)).astype(dtype, copy=False), (x, t, kind)
    raise ValueError(f"hidden_act must be one of {GELU_KINDS}, got {kind!r}")


def gelu_backward(dout, cache):
    xp = array_module(dout)
    x, saved, kind = cache
    if dout.dtype == HALF:
        return gelu_backward(dout.astype(numpy.float32), cache).astype(HALF)
    if kind == "gelu":
        if xp is not numpy:
            return kernels.fused(xp, kernels.gelu_backward)(dout, x, saved)
        # d/dx x*Phi(x) = Phi(x) + x * phi(x), phi the normal density; in place, one buffer.
        d = x * x
        d *= -0.5
        xp.exp(d, out=d)
        d *= x
        d *= 1.0 / math.sqrt(2.0 * math.pi)
        d += saved
        d *= dout
        return d
    t = saved
    dinner = math.sqrt(2.0 / math.pi) * (1.0 + 3 * 0.044715 * x * x)
    return dout * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dinner)

# ---------------------------------------------------------------------------------- tanh


def tanh_forward(x):
    xp = array_module(x)
    y = xp.tanh(x)
    return y, y


def tanh_backward(dout, y):
    return dout * (1.0 - y * y)

# ------------------------------------------------------------------------------- softmax


def softmax_forward(x, overwrite_x=False):
    """Softmax over the last axis; the max is subtracted so exp never overflows.
    float16 input: computed in float32, the probabilities returned in float16.
    overwrite_x: x is a temporary the caller drops (the attention scores); on NumPy the
    probabilities are computed in its memory, one large allocation fewer."""
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
    """dx = y * (dout - sum(dout * y)): the Jacobian of softmax applied without forming it."""
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
    """Inverted dropout: zero with probability p and scale the rest by 1/(1-p), so eval
    mode is the identity. `rng` is an explicit Generator (numpy or cupy). The cache is the
    scaled mask itself, so backward is one multiply."""
    if not training or p == 0.0:
        return x, None
    xp = array_module(x)
    scale = x.dtype.type(1.0 / (1.0 - p))
    if xp is not numpy:
        return kernels.fused(xp, kernels.dropout)(x, _uniform(x, rng), p, scale)
    mask = _keep_mask(x.shape, p, rng, _uniform_dtype(x)) * scale
    return x * mask, mask


def dropout_add_forward(x, residual, p, rng, training):
    """dropout(x) + residual in one pass where that saves a launch (CuPy): -> out, mask.
    `residual` is not modified; on NumPy it is dropout_forward then an in-place add."""
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


def dropout_backward(dout, mask):
    return dout if mask is None else dout * mask

# ---------------------------------------------------------------------- self-attention


def attention_mask_bias(attention_mask, dtype):
    """attention_mask [B, T] of 1 (attend) / 0 (padding) -> additive bias [B, 1, 1, T].

    -10000.0 as the original BERT: exp(-10000) underflows to exactly 0 in float32 and
    float64, yet a row whose keys are all padding still gets a finite, uniform softmax
    (with -inf it would be NaN).
    """
    bias = (1.0 - attention_mask.astype(dtype)) * -10000.0
    return bias[:, None, None, :]


class AttentionCache(NamedTuple):
    qkv: tuple                 # linear cache of the stacked projection
    q: object                  # [B, A, T, D], already scaled by 1/sqrt(D)
    k: object                  # [B, A, T, D]
    v: object                  # [B, A, T, D]
    probs: object              # [B, A, T, T], softmax before dropout
    probs_dropped: object      # [B, A, T, T], what multiplied v
    dropout_mask: object
    num_heads: int


def self_attention_forward(x, w_qkv, b_qkv, mask_bias, num_heads, dropout_p, rng, training):
    """Multi-head scaled dot-product self-attention, all heads at once.

    x [B, T, H]; w_qkv [3H, H] and b_qkv [3H] are the query, key and value projections
    stacked so one matmul makes all three; mask_bias [B, 1, 1, T].
    Returns the context [B, T, H] (before the output dense layer).
    """
    xp = array_module(x)
    B, T, H = x.shape
    A, D = num_heads, H // num_heads
    qkv, qkv_cache = linear_forward(x, w_qkv, b_qkv)       # [B, T, 3H]
    qkv = qkv.reshape(B, T, 3, A, D).transpose(2, 0, 3, 1, 4)  # [3, B, A, T, D], a view
    q, k, v = qkv[0], qkv[1], qkv[2]
    q = q * (1.0 / math.sqrt(D))                           # scale q: cheaper than scores
    scores = matmul(q, k.transpose(0, 1, 3, 2))            # [B, A, T, T]
    scores += mask_bias
    probs, softmax_cache = softmax_forward(scores, overwrite_x=True)
    probs_dropped, dropout_cache = dropout_forward(probs, dropout_p, rng, training)
    # The matmul writes each head straight into its columns of [B, T, H]: no transposing copy.
    context = xp.empty((B, T, H), dtype=x.dtype)
    matmul(probs_dropped, v, out=context.reshape(B, T, A, D).transpose(0, 2, 1, 3))
    cache = AttentionCache(qkv_cache, q, k, v, softmax_cache, probs_dropped, dropout_cache, A)
    return context, cache


def self_attention_backward(dcontext, cache, dw_qkv=None, db_qkv=None):
    """-> dx [B, T, H], dw_qkv [3H, H], db_qkv [3H] (written into dw_qkv / db_qkv if given)."""
    xp = array_module(dcontext)
    B, T, H = dcontext.shape
    A = cache.num_heads
    D = H // A
    dcontext = dcontext.reshape(B, T, A, D).transpose(0, 2, 1, 3)  # [B, A, T, D], a view
    # dq, dk, dv go straight into their places in [B, T, 3H], the layout of the stacked
    # projection's output: no stack, no transposing copy.
    dqkv = xp.empty((B, T, 3 * H), dtype=dcontext.dtype)
    dq, dk, dv = dqkv.reshape(B, T, 3, A, D).transpose(2, 0, 3, 1, 4)  # [B, A, T, D] views
    matmul(cache.probs_dropped.transpose(0, 1, 3, 2), dcontext, out=dv)
    dprobs = matmul(dcontext, cache.v.transpose(0, 1, 3, 2))       # [B, A, T, T]
    dprobs = dropout_backward(dprobs, cache.dropout_mask)
    dscores = softmax_backward(dprobs, cache.probs)                # mask bias is constant
    matmul(dscores, cache.k, out=dq)                               # w.r.t. the scaled q
    dq *= 1.0 / math.sqrt(D)
    matmul(dscores.transpose(0, 1, 3, 2), cache.q, out=dk)
    return linear_backward(dqkv, cache.qkv, dw_qkv, db_qkv)

# ------------------------------------------------------------------------- cross-entropy

IGNORE_INDEX = -100     # label of a position or example that no loss counts (torch's default)


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
    """Mean softmax cross-entropy over rows whose label is not -100.

    logits [N, C], labels [N] int -> scalar loss. With no counted row the loss is 0
    (and so is its gradient), rather than the 0/0 = NaN of a plain mean. `denominator`
    replaces this batch's count by the count of a larger batch this one is a slice of
    (gradient accumulation, data parallelism): the slices' losses and gradients then sum
    to exactly those of the whole batch. `count`, the number of labels that are not -100,
    saves a device-to-host read on the GPU when the caller has it from the host labels.
    The loss is a float on NumPy, a 0-d device array on CuPy (device_loss); float16 logits
    are computed in float32.
    """
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
    """-> dlogits [N, C] = dloss * (softmax - onehot) / denominator on counted rows.

    Built in the cache's [N, C] buffer (for the MLM head, [M, V] is the largest array of
    the step): one pass, no new array; so call it once per forward."""
    xp = array_module(cache.exp_shifted)
    row_scale = (dloss / cache.denominator) * cache.valid                  # [N]
    dlogits = cache.exp_shifted
    dlogits *= (row_scale / cache.sum_exp).astype(dlogits.dtype)[:, None]  # softmax, scaled
    dlogits[xp.arange(dlogits.shape[0]), cache.safe_labels] -= row_scale.astype(dlogits.dtype)
    return dlogits

# ------------------------------------------------------------------ regression losses


def mse_forward(prediction, target):
    """Mean squared error over every element (torch's MSELoss). Same shapes -> scalar."""
    diff = float32_if_half(prediction) - target
    return device_loss((diff * diff).sum(), diff.size), diff


def mse_backward(dloss, diff):
    return diff * (2.0 * dloss / diff.size)


def bce_with_logits_forward(logits, targets):
    """Mean binary cross-entropy of sigmoid(logits) against targets in [0, 1], over every
    element (torch's BCEWithLogitsLoss). Written as max(x, 0) - x*y + log(1 + exp(-|x|)),
    which never overflows."""
    xp = array_module(logits)
    logits = float32_if_half(logits)
    per_element = xp.maximum(logits, 0.0) - logits * targets + xp.log1p(xp.exp(-xp.abs(logits)))
    return device_loss(per_element.sum(), per_element.size), (logits, targets)


def bce_with_logits_backward(dloss, cache):
    """-> dlogits = dloss * (sigmoid(x) - y) / N; sigmoid from exp(-|x|), so no overflow."""
    logits, targets = cache
    xp = array_module(logits)
    e = xp.exp(-xp.abs(logits))
    sigmoid = xp.where(logits >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    return (sigmoid - targets) * (dloss / logits.size)
