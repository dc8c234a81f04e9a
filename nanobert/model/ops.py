"""The ops of BERT, THE REFERENCE: each a pair of pure functions written as its math.

    x_forward(inputs..., params...) -> out, cache
    x_backward(dout, cache)         -> d_inputs..., d_params...

The cache holds exactly what the backward needs. Plain array code that runs on NumPy and
CuPy alike (the namespace `xp` is taken from the inputs): what to read to learn the
gradients, what the float64 gradient checks and parity tests run, and what the model runs in
reference mode (active.py). In the default (fast) mode the model runs fast.py's twin of an
op where it has one (the same contract, made fast: in-place arithmetic, fused GPU passes,
half-precision activations, tested equal to the op here by tests/test_twins.py), and the op
here where it has none: an op written here alone runs in both modes.

No op writes into what it was given. A forward given cache=False keeps nothing for a
backward (inference; its cache is None), so that the fast twin may take a path that saves
nothing; a backward given arrays for its parameter gradients (dweight=..., views of a
model's flat gradient buffer) writes its result into them and returns them.

Shapes use B (batch), T (sequence length), H (hidden size), A (attention heads),
D = H / A (head size), I (intermediate size), V (vocabulary), N (rows of a 2-D matmul,
usually B*T), C (classes).
"""
import math
from typing import NamedTuple

from ..backend import array_module, scatter_add
from .special import ERF_ONE, ERFCX_K, erf_coefficients


def into(buffer, value):
    """value, written into `buffer` when the caller gave one (the model's gradient view)."""
    if buffer is None:
        return value
    buffer[...] = value
    return buffer

# ----------------------------------------------------------------------------- embedding


def embedding_forward(ids, table):
    """Row lookup. ids [...] int, table [V, H] -> [..., H]."""
    return table[ids], (ids, table.shape)


def embedding_backward(dout, cache, dtable=None):
    """dtable [V, H]: row v sums the gradients of every position whose id is v (the lookup
    is a one-hot matmul, so its gradient is onehot^T @ dout).

    Given dtable, ADDS into it: the tied MLM decoder has already written its gradient there."""
    ids, table_shape = cache
    if dtable is None:
        dtable = array_module(dout).zeros(table_shape, dtype=dout.dtype)
    scatter_add(dtable, ids.reshape(-1), dout.reshape(-1, table_shape[1]))  # [N], [N, H]
    return dtable

# -------------------------------------------------------------------------------- linear


def linear_forward(x, weight, bias):
    """x [..., in], weight [out, in] (PyTorch layout), bias [out] -> [..., out].

    All leading dims folded into N rows: one 2-D matmul."""
    x2 = x.reshape(-1, x.shape[-1])                        # [..., in] -> [N, in]
    out = x2 @ weight.T + bias                             # [N, out]
    return out.reshape(*x.shape[:-1], weight.shape[0]), (x2, weight, x.shape)


def linear_backward(dout, cache, dweight=None, dbias=None):
    """-> dx [..., in], dweight [out, in], dbias [out].

    out = x W^T + b, so dx = dout W, dW = dout^T x, db = dout summed over the rows."""
    x2, weight, x_shape = cache
    dout2 = dout.reshape(-1, weight.shape[0])              # [..., out] -> [N, out]
    dx = (dout2 @ weight).reshape(x_shape)                 # [N, in] -> [..., in]
    return dx, into(dweight, dout2.T @ x2), into(dbias, dout2.sum(axis=0))

# ----------------------------------------------------------------------------- layernorm


def layernorm_forward(x, gamma, beta, eps, cache=True):
    """out = xhat * gamma + beta, xhat = (x - mean) / sqrt(var + eps) over the last axis.
    x [..., H], gamma/beta [H] -> [..., H].

    The cache keeps xhat and rstd = 1/sqrt(var + eps) (as llm.c does), not x itself."""
    xp = array_module(x)
    mean = x.mean(axis=-1, keepdims=True)                  # [..., 1]
    centered = x - mean
    var = (centered * centered).mean(axis=-1, keepdims=True)   # biased, as the original
    rstd = 1.0 / xp.sqrt(var + eps)                        # [..., 1]
    xhat = centered * rstd
    out = xhat * gamma + beta
    return out, (xhat, gamma, rstd) if cache else None


def layernorm_backward(dout, cache, dgamma=None, dbeta=None):
    """-> dx [..., H], dgamma [H], dbeta [H].

    With dxhat = dout * gamma, differentiating xhat = (x - mean) * rstd through the mean and
    the variance gives dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))."""
    xhat, gamma, rstd = cache
    H = xhat.shape[-1]
    dgamma = into(dgamma, (dout * xhat).reshape(-1, H).sum(axis=0))    # [..., H] -> [N, H]
    dbeta = into(dbeta, dout.reshape(-1, H).sum(axis=0))
    dxhat = dout * gamma
    dx = (dxhat - dxhat.mean(axis=-1, keepdims=True)
          - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True)) * rstd
    return dx, dgamma, dbeta

# ---------------------------------------------------------------------------------- gelu


def erf(x):
    """The error function erf(x) = 2/sqrt(pi) * integral of exp(-s^2) from 0 to x, elementwise
    (NumPy has none), float32 or float64, by two formulas, each where it is accurate
    (special.py derives and fits them):
        |x| < 1:   x + x (P(x^2) - 1)             P: a polynomial for erf(x)/x
        |x| >= 1:  sign(x) (1 - exp(-x^2) R(u))   R: one for exp(x^2) erfc(x), u = (|x|-3)/(|x|+3)
    Past ERF_ONE (6 in float64, 4 in float32) erf is +-1 to the last bit: |x| is clamped."""
    xp = array_module(x)
    series, erfcx = erf_coefficients(x.dtype)         # P - 1 and R, highest power first
    inside = xp.abs(x) < 1
    xs = xp.where(inside, x, 0.0)                      # |x| < 1 only: no overflow in P(x^2)
    small = polynomial(series, xs * xs) * xs + xs
    ax = xp.minimum(xp.abs(x), x.dtype.type(ERF_ONE[x.dtype]))
    u = (ax - ERFCX_K) / (ax + ERFCX_K)
    erfc = polynomial(erfcx, u) * xp.exp(-(ax * ax))
    return xp.where(inside, small, xp.copysign(1 - erfc, x))


def polynomial(coefficients, t):
    """c0 t^n + c1 t^(n-1) + ... + cn by Horner's rule: ((c0 t + c1) t + c2) t + ..."""
    out = t * coefficients[0] + coefficients[1]
    for c in coefficients[2:]:
        out = out * t + c
    return out


GELU_KINDS = ("gelu", "gelu_new", "gelu_pytorch_tanh")


def gelu_forward(x, kind="gelu"):
    """x * Phi(x). "gelu": exact, Phi the normal CDF (1 + erf(x / sqrt 2)) / 2 (every
    released BERT checkpoint); "gelu_new" / "gelu_pytorch_tanh": the original TF code's
    tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    xp = array_module(x)
    if kind == "gelu":
        cdf = (erf(x * (1.0 / math.sqrt(2.0))) + 1.0) * 0.5          # Phi(x)
        return x * cdf, (x, cdf, kind)
    if kind in ("gelu_new", "gelu_pytorch_tanh"):
        t = xp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x))
        return 0.5 * x * (1.0 + t), (x, t, kind)
    raise ValueError(f"hidden_act must be one of {GELU_KINDS}, got {kind!r}")


def gelu_backward(dout, cache):
    """"gelu": d/dx x Phi(x) = Phi(x) + x phi(x), phi(x) = exp(-x^2/2) / sqrt(2 pi) the
    normal density. tanh form: the product rule through t = tanh(u), dt/du = 1 - t^2."""
    xp = array_module(dout)
    x, saved, kind = cache
    if kind == "gelu":
        x_pdf = xp.exp(-0.5 * x * x) * x * (1.0 / math.sqrt(2.0 * math.pi))   # x phi(x)
        return (x_pdf + saved) * dout
    t = saved
    dinner = math.sqrt(2.0 / math.pi) * (1.0 + 3 * 0.044715 * x * x)     # du/dx
    return dout * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dinner)

# ---------------------------------------------------------------------------------- tanh


def tanh_forward(x):
    y = array_module(x).tanh(x)
    return y, y


def tanh_backward(dout, y):
    """d tanh(x)/dx = 1 - tanh(x)^2, from the saved output."""
    return dout * (1.0 - y * y)

# ------------------------------------------------------------------------------- softmax


def softmax_forward(x):
    """Softmax over the last axis: y = exp(x - max) / sum(exp(x - max)). Subtracting the row
    max changes nothing mathematically and keeps exp from overflowing."""
    xp = array_module(x)
    e = xp.exp(x - x.max(axis=-1, keepdims=True))
    y = e / e.sum(axis=-1, keepdims=True)
    return y, y


def softmax_backward(dout, y):
    """dy_i/dx_j = y_i (delta_ij - y_j), so dx_j = y_j dout_j - y_j sum_i dout_i y_i: the
    Jacobian applied without forming it."""
    return dout * y - y * (dout * y).sum(axis=-1, keepdims=True)

# ------------------------------------------------------------------------------- dropout


def dropout_forward(x, p, rng, training):
    """Inverted dropout: zero with probability p and scale the rest by 1/(1-p), so eval
    mode is the identity. `rng` is an explicit Generator (numpy or cupy). The cache is the
    scaled mask itself, so backward is one multiply."""
    if not training or p == 0.0:
        return x, None
    xp = array_module(x)
    # Generators draw float32 or float64: the uniforms in x's precision, at least float32.
    uniform = rng.random(x.shape, dtype=xp.promote_types(x.dtype, xp.float32))
    mask = (uniform >= p) * x.dtype.type(1.0 / (1.0 - p))     # kept where uniform >= p
    return x * mask, mask


def dropout_backward(dout, mask):
    return dout if mask is None else dout * mask


def dropout_add_forward(x, residual, p, rng, training):
    """dropout(x) + residual: how each sublayer's output meets its input (post-LN)."""
    out, mask = dropout_forward(x, p, rng, training)
    return out + residual, mask

# ------------------------------------------------------------------------ composite ops
# Chains of the ops above that the fast layer runs fused (one pass where the chain makes
# several; on the GPU one kernel where it launches several), written here as the chain
# itself: the fused twins are tested equal to these (tests/test_composite_ops.py).


class LinearGeluCache(NamedTuple):
    linear: tuple              # linear_forward's cache
    gelu: tuple                # gelu_forward's cache (of the linear's output)


def linear_gelu_forward(x, weight, bias, kind="gelu", cache=True):
    """gelu(x W^T + b): the feed-forward network's up-projection and its activation.
    x [..., in], weight [out, in], bias [out] -> [..., out]."""
    y, linear = linear_forward(x, weight, bias)
    out, gelu = gelu_forward(y, kind)
    return out, LinearGeluCache(linear=linear, gelu=gelu) if cache else None


def linear_gelu_backward(dout, cache, dweight=None, dbias=None):
    """-> dx [..., in], dweight [out, in], dbias [out]: GELU's backward, then the linear's."""
    return linear_backward(gelu_backward(dout, cache.gelu), cache.linear, dweight, dbias)


class DropoutAddLayerNormCache(NamedTuple):
    dropout_mask: object       # dropout_forward's cache (None: no dropout)
    layernorm: tuple           # layernorm_forward's cache (of the sum)


def dropout_add_layernorm_forward(x, residual, gamma, beta, eps, p, rng, training, cache=True):
    """LayerNorm(dropout(x) + residual): how a post-LN sublayer's output x [..., H] meets
    its input, the residual [..., H] ("Add & Norm"). gamma, beta [H] -> [..., H]."""
    y, dropout_mask = dropout_add_forward(x, residual, p, rng, training)
    out, layernorm = layernorm_forward(y, gamma, beta, eps)
    return out, (DropoutAddLayerNormCache(dropout_mask=dropout_mask, layernorm=layernorm)
                 if cache else None)


def dropout_add_layernorm_backward(dout, cache, dgamma=None, dbeta=None):
    """-> dx, dresidual [..., H], dgamma, dbeta [H]. The sum's gradient flows unchanged into
    the residual and through dropout's mask into x (without dropout dx is dresidual, the
    same array: neither is written afterwards)."""
    dsum, dgamma, dbeta = layernorm_backward(dout, cache.layernorm, dgamma, dbeta)
    return dropout_backward(dsum, cache.dropout_mask), dsum, dgamma, dbeta

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


def self_attention_forward(x, w_qkv, b_qkv, mask_bias, num_heads, dropout_p, rng, training,
                           cache=True):
    """Multi-head scaled dot-product self-attention, all heads at once:
    softmax(q k^T / sqrt(D) + mask_bias) v for each head.

    x [B, T, H]; w_qkv [3H, H] and b_qkv [3H] are the query, key and value projections
    stacked so one matmul makes all three; mask_bias [B, 1, 1, T].
    Returns the context [B, T, H] (before the output dense layer).
    """
    B, T, H = x.shape
    A, D = num_heads, H // num_heads
    qkv, qkv_cache = linear_forward(x, w_qkv, b_qkv)                    # [B, T, 3H]
    qkv = qkv.reshape(B, T, 3, A, D).transpose(2, 0, 3, 1, 4)           # [3, B, A, T, D]
    q, k, v = qkv[0], qkv[1], qkv[2]
    q = q * (1.0 / math.sqrt(D))                  # scale q: T*D products, not the T*T scores
    scores = q @ k.transpose(0, 1, 3, 2) + mask_bias                    # [B, A, T, T]
    probs, _ = softmax_forward(scores)
    probs_dropped, dropout_mask = dropout_forward(probs, dropout_p, rng, training)
    context = probs_dropped @ v                                         # [B, A, T, D]
    context = context.transpose(0, 2, 1, 3).reshape(B, T, H)            # [B, T, A, D] -> [B, T, H]
    kept = AttentionCache(qkv=qkv_cache, q=q, k=k, v=v, probs=probs, probs_dropped=probs_dropped,
                          dropout_mask=dropout_mask, num_heads=A)
    return context, kept if cache else None


def self_attention_backward(dcontext, cache, dw_qkv=None, db_qkv=None):
    """-> dx [B, T, H], dw_qkv [3H, H], db_qkv [3H].

    The forward backwards: context = P v gives dv = P^T dcontext and dP = dcontext v^T;
    through dropout and softmax to dscores; scores = q k^T gives dq = dscores k and
    dk = dscores^T q (the mask bias is a constant); then the stacked projection."""
    xp = array_module(dcontext)
    B, T, H = dcontext.shape
    A = cache.num_heads
    D = H // A
    dcontext = dcontext.reshape(B, T, A, D).transpose(0, 2, 1, 3)       # [B, A, T, D]
    dv = cache.probs_dropped.transpose(0, 1, 3, 2) @ dcontext           # [B, A, T, D]
    dprobs = dcontext @ cache.v.transpose(0, 1, 3, 2)                   # [B, A, T, T]
    dprobs = dropout_backward(dprobs, cache.dropout_mask)
    dscores = softmax_backward(dprobs, cache.probs)
    dq = (dscores @ cache.k) * (1.0 / math.sqrt(D))                     # through q's scaling
    dk = dscores.transpose(0, 1, 3, 2) @ cache.q                        # q is the scaled q
    # each [B, A, T, D] -> [B, T, A, D] -> [B, T, H], side by side as the projection made them
    dqkv = xp.concatenate([d.transpose(0, 2, 1, 3).reshape(B, T, H) for d in (dq, dk, dv)],
                          axis=-1)                                      # [B, T, 3H]
    return linear_backward(dqkv, cache.qkv, dw_qkv, db_qkv)

# ------------------------------------------------------------------------- cross-entropy

IGNORE_INDEX = -100     # label of a position or example that no loss counts (torch's default)


class CrossEntropyCache(NamedTuple):
    probs: object              # [N, C] softmax of the logits
    labels: object             # [N] labels, ignored rows set to class 0
    valid: object              # [N] bool, rows the loss counts
    count: int                 # how many rows it counts
    denominator: float         # what their summed loss is divided by


def cross_entropy_forward(logits, labels, denominator=None, count=None):
    """Mean softmax cross-entropy -log softmax(logits)[label] over the rows whose label is
    not -100. logits [N, C], labels [N] int -> a 0-d loss.

    With no counted row the loss is 0 (and so is its gradient), rather than the 0/0 = NaN
    of a plain mean. `denominator` replaces the count by that of a larger batch this one
    is a slice of (gradient accumulation, data parallelism): the slices' losses and
    gradients then sum to exactly those of the whole batch. `count`, the number of labels
    that are not -100, where the caller knows it already (else counted here)."""
    xp = array_module(logits)
    valid = labels != IGNORE_INDEX                                      # [N]
    count = int(valid.sum()) if count is None else count
    labels = xp.where(valid, labels, 0)          # any class: the row is multiplied by 0 below
    shifted = logits - logits.max(axis=-1, keepdims=True)    # [N, C], so exp cannot overflow
    exp_shifted = xp.exp(shifted)
    sum_exp = exp_shifted.sum(axis=-1)                                  # [N]
    nll = xp.log(sum_exp) - shifted[xp.arange(len(labels)), labels]     # -log p(label), [N]
    denominator = max(count, 1) if denominator is None else denominator
    loss = (nll * valid).sum() / denominator
    probs = exp_shifted / sum_exp[:, None]
    return loss, CrossEntropyCache(probs, labels, valid, count, denominator)


def cross_entropy_backward(dloss, cache):
    """-> dlogits [N, C]. d(-log softmax(z)[y])/dz = softmax(z) - onehot(y), scaled by
    dloss / denominator on the counted rows and 0 on the others."""
    xp = array_module(cache.probs)
    onehot = cache.labels[:, None] == xp.arange(cache.probs.shape[1])   # [N, C]
    row_scale = (cache.valid * (dloss / cache.denominator)).astype(cache.probs.dtype)   # [N]
    return (cache.probs - onehot) * row_scale[:, None]

# ------------------------------------------------------------------ regression losses


def mse_forward(prediction, target):
    """Mean squared error over every element (torch's MSELoss). Same shapes -> 0-d."""
    diff = prediction - target
    return (diff * diff).mean(), diff


def mse_backward(dloss, diff):
    """d mean(diff^2) / d prediction = 2 diff / n."""
    return diff * (2.0 * dloss / diff.size)


def bce_with_logits_forward(logits, targets):
    """Mean binary cross-entropy of sigmoid(logits) against targets in [0, 1], over every
    element (torch's BCEWithLogitsLoss). Written as max(x, 0) - x*y + log(1 + exp(-|x|)),
    which never overflows."""
    xp = array_module(logits)
    per_element = xp.maximum(logits, 0.0) - logits * targets + xp.log1p(xp.exp(-xp.abs(logits)))
    return per_element.mean(), (logits, targets)


def bce_with_logits_backward(dloss, cache):
    """-> dlogits = dloss * (sigmoid(x) - y) / n; sigmoid from exp(-|x|), so no overflow."""
    logits, targets = cache
    xp = array_module(logits)
    e = xp.exp(-xp.abs(logits))
    sigmoid = xp.where(logits >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    return (sigmoid - targets) * (dloss / logits.size)

# ----------------------------------------------------------------------------- the update
# What a training step does with the gradients, written as the math, one parameter at a time
# (reference mode runs these; the fast layer sweeps one flat buffer: optim.py).


def clip_by_global_norm(grads, max_norm=1.0, mode="bert"):
    """Scale every gradient (a dict of arrays) in place so that their global norm, the square
    root of the sum of every squared entry, is at most max_norm. -> the norm before clipping.

    bert: g *= max_norm / max(norm, max_norm), as tf.clip_by_global_norm;
    torch: g *= min(1, max_norm / (norm + 1e-6)), as torch.nn.utils.clip_grad_norm_."""
    norm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
    if mode == "bert":
        scale = max_norm / max(norm, max_norm)
    else:
        scale = min(1.0, max_norm / (norm + 1e-6))
    if scale < 1.0:
        for g in grads.values():
            g *= scale
    return norm


def adamw_update(p, g, m, v, lr, t, weight_decay, beta1, beta2, eps, mode="bert"):
    """One AdamW step of the parameter p from its gradient g, at step t (1, 2, ...): p and its
    moments m (a running mean of g) and v (of g^2) are updated in place.

    bert (the original AdamWeightDecay): no bias correction (warmup keeps the first steps
    small anyway) and the decay is part of the update: p -= lr (m / (sqrt(v) + eps) + wd p).
    torch (torch.optim.AdamW): m and v bias-corrected (both start at 0, so their first values
    are too small by 1 - beta^t), the decay applied first and apart: p *= 1 - lr wd."""
    m[...] = beta1 * m + (1.0 - beta1) * g
    v[...] = beta2 * v + (1.0 - beta2) * (g * g)
    xp = array_module(p)
    if mode == "bert":
        p -= (m / (xp.sqrt(v) + eps) + weight_decay * p) * lr
        return
    p *= 1.0 - lr * weight_decay
    m_hat = m / (1.0 - beta1 ** t)
    v_hat = v / (1.0 - beta2 ** t)
    p -= lr * m_hat / (xp.sqrt(v_hat) + eps)
