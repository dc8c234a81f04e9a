"""The fast layer: the ops of ops.py made fast, the functions the model runs.

Each function here has the signature, the cache and the results of its reference twin in
ops.py (read the math there); tests/test_fast.py and tests/test_cupy_standin.py prove each
equal to it, bitwise or within a stated rounding bound. This file only routes: an op on
NumPy arrays runs in fast_cpu.py (in-place passes on a pool of threads), on CuPy arrays in
fast_gpu.py (CUDA kernels from kernels.cu), as llm.c keeps train_gpt2.c beside its .cu.
What is the same code on both, the losses (whose results stay on the device: device_loss),
lives here, but for the cross-entropy's CuPy path (a CUDA row kernel, fast_gpu). An op of
ops.py with no twin here runs as written there in this mode too (active.py falls back to
it: active.missing_twins() lists them).

A forward given cache=False (inference: nothing kept for a backward) takes the layer's
no-cache path in eval mode (the *_inference functions of fast_cpu.py and fast_gpu.py: no
cache, no dropout, computed in temporaries of its own), and returns None as its cache.
"""
from typing import NamedTuple

import numpy

from ..backend import array_module, float32_if_half
from . import fast_cpu, fast_gpu
from .fast_cpu import ERF32_CLAMP, ERF32_ULP, erf_float32  # noqa: F401 (bench/erf_ulp.py)
from .ops import IGNORE_INDEX


def _layer(x):
    """fast_cpu for a NumPy array, fast_gpu for a CuPy one."""
    return fast_cpu if array_module(x) is numpy else fast_gpu


def matmul(a, b, out=None):
    return _layer(a).matmul(a, b, out)


def linear_forward(x, weight, bias):
    return _layer(x).linear_forward(x, weight, bias)


def linear_backward(dout, cache, dweight=None, dbias=None):
    """ops.linear_backward: dweight and dbias computed straight into the given buffers (no
    temporary), by the layer's matmul and column_sum; float16 gradients summed into the
    float32 buffers."""
    layer = _layer(dout)
    weight = cache[1]
    if dout.dtype != weight.dtype:                         # a float32 loss gradient, float16 layer
        dout = layer.cast(dout, weight.dtype)
    dout2 = dout.reshape(-1, weight.shape[0])              # [N, out]
    dx, dweight = _linear_input_and_weight_grads(layer, dout2, cache, dweight)
    # float16 gradients are summed in (and written to) the float32 buffer's dtype
    dtype = dbias.dtype if dbias is not None and dbias.dtype != dout2.dtype else None
    return dx, dweight, layer.column_sum(dout2, out=dbias, dtype=dtype)


def _linear_input_and_weight_grads(layer, dout2, cache, dweight=None):
    """dx = dout W [..., in] and dweight = dout^T x [out, in] (into dweight if given) of
    dout2 [N, out]."""
    x2, weight, x_shape = cache
    dx = layer.matmul(dout2, weight).reshape(x_shape)
    return dx, layer.matmul(dout2.T, x2, out=dweight)


def layernorm_forward(x, gamma, beta, eps, cache=True):
    if not cache:
        return _layer(x).layernorm_inference(x, gamma, beta, eps), None
    return _layer(x).layernorm_forward(x, gamma, beta, eps)


def layernorm_backward(dout, cache, dgamma=None, dbeta=None):
    return _layer(dout).layernorm_backward(dout, cache, dgamma, dbeta)


def gelu_forward(x, kind="gelu"):
    return _layer(x).gelu_forward(x, kind)


def gelu_backward(dout, cache):
    return _layer(dout).gelu_backward(dout, cache)


def softmax_forward(x, overwrite_x=False):
    return _layer(x).softmax_forward(x, overwrite_x)


def softmax_backward(dout, y):
    return _layer(dout).softmax_backward(dout, y)


def dropout_forward(x, p, rng, training):
    return _layer(x).dropout_forward(x, p, rng, training)


def dropout_add_forward(x, residual, p, rng, training):
    return _layer(x).dropout_add_forward(x, residual, p, rng, training)


def dropout_backward(dout, mask):
    """ops.dropout_backward (the reference itself on NumPy: one multiply, nothing to gain)."""
    return _layer(dout).dropout_backward(dout, mask)


def self_attention_forward(x, w_qkv, b_qkv, mask_bias, num_heads, dropout_p, rng, training,
                           cache=True):
    layer = _layer(x)
    if not cache and not (training and dropout_p != 0.0):
        return layer.self_attention_inference(x, w_qkv, b_qkv, mask_bias, num_heads), None
    context, kept = layer.self_attention_forward(x, w_qkv, b_qkv, mask_bias, num_heads,
                                                 dropout_p, rng, training)
    return context, kept if cache else None


def self_attention_backward(dcontext, cache, dw_qkv=None, db_qkv=None):
    dqkv = _layer(dcontext).self_attention_dqkv(dcontext, cache)      # [B, T, 3H]
    return linear_backward(dqkv, cache.qkv, dw_qkv, db_qkv)


def linear_gelu_forward(x, weight, bias, kind="gelu", cache=True):
    if not cache:
        return _layer(x).linear_gelu_inference(x, weight, bias, kind), None
    return _layer(x).linear_gelu_forward(x, weight, bias, kind)


def linear_gelu_backward(dout, cache, dweight=None, dbias=None):
    """ops.linear_gelu_backward: GELU's backward with the bias's gradient (on CuPy one kernel
    that adds the bias to the product again, as the forward kept it without, and sums dbias's
    partials as it writes the linear's output gradient), then linear_backward's dx and
    dweight."""
    layer = _layer(dout)
    dlinear, dbias = layer.bias_gelu_backward(dout, cache.gelu, dbias)     # [..., out], [out]
    dlinear2 = dlinear.reshape(-1, dlinear.shape[-1])                      # [N, out]
    return (*_linear_input_and_weight_grads(layer, dlinear2, cache.linear, dweight), dbias)


def dropout_add_layernorm_forward(x, residual, gamma, beta, eps, p, rng, training, cache=True):
    layer = _layer(x)
    if not cache and not (training and p != 0.0):
        return layer.layernorm_inference(x, gamma, beta, eps, residual), None
    out, kept = layer.dropout_add_layernorm_forward(x, residual, gamma, beta, eps, p, rng,
                                                    training)
    return out, kept if cache else None


def dropout_add_layernorm_backward(dout, cache, dgamma=None, dbeta=None):
    return _layer(dout).dropout_add_layernorm_backward(dout, cache, dgamma, dbeta)

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
    """ops.cross_entropy_forward: on CuPy one row kernel (fast_gpu), with no host wait:
    `count`, the number of labels that are not -100, comes from the caller's host labels
    (else it is read from the device), and the loss stays on the device. On NumPy, one
    [N, C] buffer, which the backward turns into dlogits; float16 logits computed in
    float32."""
    xp = array_module(logits)
    if xp is not numpy:
        return fast_gpu.cross_entropy_forward(logits, labels, denominator, count)
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
    forward. A CuPy forward's cache: fast_gpu's row kernel."""
    if isinstance(cache, fast_gpu.CrossEntropyCache):
        return fast_gpu.cross_entropy_backward(dloss, cache)
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
