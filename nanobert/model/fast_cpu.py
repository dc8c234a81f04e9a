"""The fast layer on NumPy (CPU): in-place passes on a pool of threads. fast.py routes each op
here for NumPy arrays (fast_gpu.py holds the CuPy twin); each function has the signature, the
cache and the results of its reference twin in ops.py (read the math there), and
tests/test_fast.py proves each equal to it, bitwise or within a stated rounding bound.

- In-place sequences, so a large elementwise op allocates one array, not three.
- Mixed precision (float16 activations), as NVIDIA's BERT recipe: matmuls, residual adds
  and dropout run in float16, while LayerNorm, softmax, GELU and the losses compute in
  float32 (their inputs are cast up and their outputs back down) and parameter gradients
  are written into float32 buffers. A float16 matmul runs as a float32 BLAS call rounded to
  float16: what tensor cores do (float16 inputs, float32 accumulation, a float16 result),
  and ~100x faster than NumPy's own float16 loop.
- Dropout masks from the bit generator's raw words, without making floats of them; a large
  mask drawn in shares on the thread pool, the same words as one draw.
- Large elementwise and row-wise passes, and the small batched matmuls of attention, split
  into blocks of rows over a few threads (threads.py): NumPy releases the GIL, so they use
  every core, with bitwise the same results. The large matmuls too, one block of rows or
  columns per thread (pooled_matmul), so that BLAS's own threads never spin idle beside
  them. A pass that follows another is made in the same block while it is in cache: a
  linear layer's bias in its matmul's blocks, a residual in the dropout's blocks (or, at
  inference, in the LayerNorm's: Add & Norm).
- LayerNorm's row means (row_mean) as einsum's SIMD sums, ~3x faster than mean's pairwise
  sum, and the sum of squares with no array of squares: a few ulp off the reference.
- float32: GELU's erf as one rational function (erf_float32), 7.7 ulp, instead of the
  reference's two-branch erf (special.py, ~1 ulp), which partitions every array.
- No-cache paths (the *_inference functions at the end), what x_forward(..., cache=False)
  runs in eval mode: no caches, no dropout draws, results computed in their own temporaries.
"""
import functools
import math

import numpy

from ..backend import HALF, float32_if_half
from . import ops
from .ops import AttentionCache, dropout_backward
from .special import erf
from .threads import in_row_blocks, run_tasks, thread_count


def matmul(a, b, out=None):
    """a @ b (into out if given). float16 gives a float16 product, also when `out` is a
    float32 weight gradient (cuBLAS writes its inputs' dtype; the gradient is then cast
    into the float32 buffer, as apex's O2 does): a float32 BLAS call rounded to float16, the
    same numbers. The products run on the thread pool (pooled_matmul, stacked_matmul)."""
    if a.dtype == HALF:
        with numpy.errstate(over="ignore"):        # inf: the loss scaler's overflow, skipped
            product = matmul(a.astype(numpy.float32), b.astype(numpy.float32)).astype(HALF)
        if out is None:
            return product
        out[...] = product
        return out
    if a.ndim == b.ndim == 2:
        return pooled_matmul(a, b, out)
    if a.ndim == b.ndim > 2 and a.shape[:-2] == b.shape[:-2]:
        return stacked_matmul(a, b, out)
    return numpy.matmul(a, b, out=out)


# Products of at most this many multiply-adds (m n k) run as one call: OpenBLAS runs them on
# one thread anyway (it threads GEMM only past 4 x 65536), so they keep BLAS's bits.
POOLED_MATMUL_MNK = 1 << 18


def pooled_matmul(a, b, out=None, bias=None):
    """NumPy a [M, K] @ b [K, N] (+ bias [N] on every row, if given) split across threads,
    each block a BLAS call on one core, the bias added to the block while it is in cache.
    OpenBLAS splits a product over the same cores at the same rate (measured here,
    [3132, 384] @ [384, 1536] float32 on 2 cores: 53 ms either way), but its idle threads
    then spin for ~0.1 s (2^28 cycles) and take a core from the GELU, softmax and LayerNorm
    passes that follow on the pool (MiniLM inference: 1.56 s -> 1.33 s with no spinning).
    The longer of M and N is split: every block reads (and BLAS packs) all of the other
    operand, so that one should be the smaller (the MLM decoder's [160, 768] @ [768, 30522]
    split by rows would pack the 94 MB vocabulary matrix once per thread).
    Each block is summed in BLAS's order for its shape, so the bits differ from one whole
    call's by rounding (as BLAS's own differ between 1 and 2 threads) and depend on the
    number of threads, never on timing."""
    (M, K), N = a.shape, b.shape[1]
    if out is None:
        out = numpy.empty((M, N), numpy.result_type(a, b))
    if M * K * N <= POOLED_MATMUL_MNK:
        _rows_matmul_block(a, out, b, bias)
    elif M >= N:                                # row blocks: out[rows] = a[rows] @ b
        in_row_blocks(_rows_matmul_block, (a, out), b, bias, uses_blas=True,
                      rows_per_block=-(-M // thread_count()))
    else:                                       # column blocks, as row blocks of the transposes
        in_row_blocks(_columns_matmul_block, (b.T, out.T, bias), a, uses_blas=True,
                      rows_per_block=-(-N // thread_count()))
    return out


def _rows_matmul_block(a, out, b, bias):
    numpy.matmul(a, b, out=out)
    if bias is not None:
        out += bias


def _columns_matmul_block(b_t, out_t, bias, a):
    out = numpy.matmul(a, b_t.T, out=out_t.T)   # out[:, cols] = a @ b[:, cols]
    if bias is not None:
        out += bias                             # bias[cols]


def stacked_matmul(a, b, out=None):
    """NumPy a @ b for stacks of matrices [S..., m, k] @ [S..., k, n] (attention's per-head
    products): the stack split across threads by its first axis. Each small product is one
    BLAS call that BLAS runs on one core; the same calls, so the same bits."""
    if out is None:
        out = numpy.empty(a.shape[:-1] + b.shape[-1:], numpy.result_type(a, b))
    in_row_blocks(_matmul_block, (a, b, out), uses_blas=True)
    return out


def _matmul_block(a, b, out):
    numpy.matmul(a, b, out=out)

# -------------------------------------------------------------------------------- linear


def linear_forward(x, weight, bias):
    """ops.linear_forward: the bias added in place (by each block of the pooled product);
    float16 through matmul."""
    x2 = x.reshape(-1, x.shape[-1])                        # [N, in]
    if x2.dtype != HALF:
        out = pooled_matmul(x2, weight.T, bias=bias)       # [N, out]
    else:
        out = matmul(x2, weight.T)
        out += bias
    return out.reshape(*x.shape[:-1], weight.shape[0]), (x2, weight, x.shape)


def cast(x, dtype):
    """x.astype(dtype) (fast_gpu's keeps padded rows padded)."""
    return x.astype(dtype)


def column_sum(x, out=None, dtype=None):
    """x [N, H] summed over its rows -> [H] (into out if given, in dtype if given): NumPy's
    axis-0 sum, already fast (0.14-0.72 ms on the model's shapes; blocks of columns on the
    pool were 5-19x slower)."""
    return numpy.sum(x, axis=0, dtype=dtype, out=out)

# ----------------------------------------------------------------------------- layernorm
# Blocks of rows 2x threads.BLOCK_ELEMENTS: a LayerNorm block makes ~10 NumPy calls, each a
# few us of overhead and, with threads, a GIL handoff; these cost more than the L2 cache
# saves (measured, [3132, 384] float32, forward + backward: 5.9 ms at 2^15, 3.4 ms at 2^18
# on 2 threads, 6.3 and 4.8 ms on 1; 600 rows, one 2^18 block, 0.77 ms against 1.4 ms).
LAYERNORM_BLOCK = 1 << 18


def layernorm_forward(x, gamma, beta, eps):
    """ops.layernorm_forward in place (xhat made from the centred x, one output array, the
    row means by row_mean); float16 input: statistics and the cache in float32, the output
    in float16."""
    dtype = x.dtype
    x, gamma, beta = float32_if_half(x), float32_if_half(gamma), float32_if_half(beta)
    H = x.shape[-1]
    xhat, out = numpy.empty(x.shape, x.dtype), numpy.empty(x.shape, x.dtype)
    rstd = numpy.empty(x.shape[:-1] + (1,), x.dtype)
    in_row_blocks(_layernorm_block, (x.reshape(-1, H), xhat.reshape(-1, H),
                                     rstd.reshape(-1, 1), out.reshape(-1, H)),
                  gamma, beta, eps, block_elements=LAYERNORM_BLOCK)
    return out.astype(dtype, copy=False), (xhat, gamma, rstd)


def _layernorm_block(x, xhat, rstd, out, gamma, beta, eps):
    """layernorm_forward on a block of rows [n, H], the reference's arithmetic but for the
    order of the row sums (row_mean): into xhat [n, H], rstd [n, 1] and out [n, H]; at
    inference out is None (the result goes into xhat, or into x, the op's own temporary,
    where xhat is None too) and rstd is None (not kept)."""
    xhat = numpy.subtract(x, row_mean(x), out=x if xhat is None else xhat)
    var = row_mean(xhat, xhat)                             # [n, 1]
    rstd = numpy.divide(1.0, numpy.sqrt(var + eps), out=rstd)
    xhat *= rstd
    out = numpy.multiply(xhat, gamma, out=xhat if out is None else out)
    out += beta


def row_mean(x, y=None):
    """The mean of each row of x [n, H] (of x * y, y [n, H], when given) -> [n, 1]: einsum's
    contiguous SIMD loop sums a row (and a row of products, with no [n, H] product made)
    ~3x faster than mean's pairwise sum; the sum divided by H, as mean does. Only the order
    of the additions differs from x.mean(axis=-1): a few ulp, and each row's sum is the
    same whichever block of rows it is computed in."""
    total = numpy.einsum("ij->i", x) if y is None else numpy.einsum("ij,ij->i", x, y)
    return numpy.divide(total, x.shape[-1], out=total)[:, None]


def layernorm_backward(dout, cache, dgamma=None, dbeta=None):
    """ops.layernorm_backward: two [..., H] buffers in all (dxhat becomes dx in place; a
    scratch buffer for xhat * mean(dxhat * xhat)) and dgamma as einsum's sum of products,
    bitwise sum(dout * xhat, axis=0) (row after row) with no product array; dgamma and
    dbeta summed straight into the given buffers; float16 dout computed in float32."""
    dx, _, dgamma, dbeta = _layernorm_backward(dout, cache, dgamma, dbeta)
    return dx, dgamma, dbeta


def _layernorm_backward(dout, cache, dgamma, dbeta, mask=None):
    """layernorm_backward -> (dx, dx * mask, dgamma, dbeta): given dropout's mask (of the
    same dtype as dout, not float16), its multiply is made in the same blocks of rows, into
    the scratch buffer (else None)."""
    xhat, gamma, rstd = cache
    dtype = dout.dtype
    dout = float32_if_half(dout)
    H = xhat.shape[-1]
    N = xhat.size // H
    dout2, xhat2 = dout.reshape(N, H), xhat.reshape(N, H)
    dgamma = numpy.einsum("ij,ij->j", dout2, xhat2, out=dgamma)
    dbeta = numpy.sum(dout2, axis=0, out=dbeta)
    scratch, dx = numpy.empty((N, H), dout.dtype), numpy.empty((N, H), dout.dtype)
    in_row_blocks(_layernorm_dx_block, (dout2, xhat2, rstd.reshape(N, 1), scratch, dx,
                                        None if mask is None else mask.reshape(N, H)), gamma,
                  block_elements=LAYERNORM_BLOCK)
    dropped = None if mask is None else scratch.reshape(xhat.shape)
    return dx.reshape(xhat.shape).astype(dtype, copy=False), dropped, dgamma, dbeta


def _layernorm_dx_block(dout, xhat, rstd, scratch, dx, mask, gamma):
    """layernorm_backward's dx on a block of rows [n, H]: dxhat made dx in place; then, given
    dropout's mask, dx times it into scratch."""
    numpy.multiply(dout, gamma, out=dx)                    # dxhat
    projection = row_mean(dx, xhat)                        # mean(dxhat * xhat) [n, 1]
    dx -= row_mean(dx)
    dx -= numpy.multiply(xhat, projection, out=scratch)
    dx *= rstd
    if mask is not None:
        numpy.multiply(dx, mask, out=scratch)

# ------------------------------------------------------------------------- float32 erf

# erf(x) ~ x P(x^2) / Q(x^2) on |x| <= ERF32_CLAMP, a (5, 5) rational in t = x^2 fitted by
# bench/erf_ulp.py (Lawson-weighted least squares to a minimax relative error of 2.5e-8 in
# float64); past 4, erfc(x) < 1.6e-8 and erf rounds to +-1 in float32, which the clamp gives.
# Over every float32 below 4 (bench/erf_ulp.py) the float32 evaluation is within ERF32_ULP.
ERF32_CLAMP = 4.0
ERF32_P = (1.1283791065216064, 0.1935323029756546, 0.053099751472473145,      # t^0 first
           0.003882711287587881, 0.0002845380222424865, 1.9867059108946705e-06)
ERF32_Q = (1.0, 0.5048460960388184, 0.11534444987773895, 0.015205996111035347,
           0.0011853920295834541, 3.74179107893724e-05)
ERF32_ULP = 8.0           # bench/erf_ulp.py, every float32 in [0, 4]: 7.66 at most, 0.66 mean


def erf_float32(x, out=None):
    """erf of a float32 NumPy array in 25 passes and no partition (special.erf partitions
    each block into |x| < 1 and the rest, ~3x the time): clamp, then one rational function.
    x P(t) / Q(t) is odd to the bit; nan stays nan, +-inf gives +-1."""
    f32 = numpy.float32
    out = numpy.clip(x, f32(-ERF32_CLAMP), f32(ERF32_CLAMP), out=out)
    t = numpy.multiply(out, out)
    p = _polynomial(ERF32_P, t)
    q = _polynomial(ERF32_Q, t)
    out *= p
    out /= q
    return numpy.clip(out, f32(-1.0), f32(1.0), out=out)   # rounding can reach 1 + 2 ulp


def _polynomial(coefficients, t):
    """sum c_k t^k (coefficients t^0 first) by Horner's rule in float32: 2 passes a degree."""
    y = numpy.multiply(t, numpy.float32(coefficients[-1]))
    y += numpy.float32(coefficients[-2])
    for c in reversed(coefficients[:-2]):
        y *= t
        y += numpy.float32(c)
    return y

# ---------------------------------------------------------------------------------- gelu


def gelu_forward(x, kind="gelu"):
    """ops.gelu_forward: "gelu" in place (one buffer for Phi); float16 computed in float32
    (erf has no float16), the output cast back."""
    dtype = x.dtype
    x = float32_if_half(x)
    if kind != "gelu":
        out, cache = ops.gelu_forward(x, kind)
        return out.astype(dtype, copy=False), cache
    cdf, out = numpy.empty(x.shape, x.dtype), numpy.empty(x.shape, x.dtype)
    in_row_blocks(_gelu_block, (x.reshape(-1), cdf.reshape(-1), out.reshape(-1)))
    return out.astype(dtype, copy=False), (x, cdf, kind)


def _gelu_block(x, cdf, out):
    """gelu_forward ("gelu") on a block of elements: Phi(x) into cdf, x Phi(x) into out; at
    inference cdf is None (a scratch block) and out is None (the result goes into x).
    float32 takes erf_float32, float64 the reference's erf."""
    cdf = numpy.multiply(x, 1.0 / math.sqrt(2.0), out=cdf)
    if cdf.dtype == numpy.float32:
        erf_float32(cdf, out=cdf)
    else:
        erf(cdf, numpy, out=cdf)
    cdf += 1.0
    cdf *= 0.5                                              # Phi(x)
    numpy.multiply(x, cdf, out=x if out is None else out)


def gelu_backward(dout, cache):
    """ops.gelu_backward: "gelu" in place (one buffer); float16 dout computed in float32."""
    x, saved, kind = cache
    if dout.dtype == HALF:
        return gelu_backward(dout.astype(numpy.float32), cache).astype(HALF)
    if kind != "gelu":
        return ops.gelu_backward(dout, cache)
    d = numpy.empty(x.shape, x.dtype)
    in_row_blocks(_gelu_backward_block, (x.reshape(-1), saved.reshape(-1), dout.reshape(-1),
                                         d.reshape(-1)))
    return d


def _gelu_backward_block(x, cdf, dout, d):
    """gelu_backward ("gelu") on a block of elements, into d: (Phi(x) + x phi(x)) dout."""
    numpy.multiply(x, x, out=d)
    d *= -0.5
    numpy.exp(d, out=d)
    d *= x
    d *= 1.0 / math.sqrt(2.0 * math.pi)                    # x phi(x)
    d += cdf
    d *= dout

# ------------------------------------------------------------------------------- softmax


def softmax_forward(x, overwrite_x=False):
    """ops.softmax_forward in place; float16 computed in float32, the probabilities
    returned in float16. overwrite_x: x is a temporary the caller drops (the attention
    scores); the probabilities are computed in its memory, one large allocation fewer."""
    dtype = x.dtype
    in_place = overwrite_x or dtype == HALF                # float16: x is our copy
    x = float32_if_half(x)
    T = x.shape[-1]
    y = x if in_place and x.flags.c_contiguous else numpy.empty(x.shape, x.dtype)
    in_row_blocks(_softmax_block, (x.reshape(-1, T), y.reshape(-1, T)))
    y = y.astype(dtype, copy=False)
    return y, y


def softmax_backward(dout, y):
    """ops.softmax_backward in place; float16 computed in float32."""
    dtype = dout.dtype
    dout, y = float32_if_half(dout), float32_if_half(y)
    T = y.shape[-1]
    dx = numpy.empty(y.shape, y.dtype)
    in_row_blocks(_softmax_backward_block, (dout.reshape(-1, T), y.reshape(-1, T),
                                            dx.reshape(-1, T)))
    return dx.astype(dtype, copy=False)


def _softmax_block(x, y, bias=None):
    """softmax_forward on a block of rows [n, ..., T], into y (which may be x); bias
    [n, 1, T] or None: added to x first, in place (the attention mask, at inference)."""
    if bias is not None:
        x += bias
    numpy.subtract(x, x.max(axis=-1, keepdims=True), out=y)
    numpy.exp(y, out=y)
    y /= y.sum(axis=-1, keepdims=True)


def _softmax_backward_block(dout, y, dx):
    """softmax_backward on a block of rows [n, T], into dx."""
    numpy.multiply(dout, y, out=dx)
    dx -= y * dx.sum(axis=-1, keepdims=True)

# ------------------------------------------------------------------------------- dropout


def dropout_forward(x, p, rng, training):
    """ops.dropout_forward: the keep mask from the bit generator's raw words (_keep_mask,
    twice as fast as making uniforms)."""
    if not training or p == 0.0:
        return x, None
    return _numpy_dropout(x, p, rng)


def _numpy_dropout(x, p, rng, residual=None):
    """NumPy dropout in training -> (out, mask), in blocks on the pool; residual (x's
    shape, or None): added to out in the same blocks."""
    scale = x.dtype.type(1.0 / (1.0 - p))
    keep = _keep_mask(x.shape, p, rng, _uniform_dtype(x))
    mask, out = numpy.empty(x.shape, x.dtype), numpy.empty(x.shape, x.dtype)
    in_row_blocks(_dropout_block, (x.reshape(-1), keep.reshape(-1), mask.reshape(-1),
                                   out.reshape(-1),
                                   None if residual is None else residual.reshape(-1)), scale)
    return out, mask


def _dropout_block(x, keep, mask, out, residual, scale):
    """dropout_forward on a block of elements: the scaled mask, x times it (+ residual)."""
    numpy.multiply(keep, scale, out=mask)
    numpy.multiply(x, mask, out=out)
    if residual is not None:
        out += residual


def dropout_add_forward(x, residual, p, rng, training):
    """ops.dropout_add_forward: the residual added in the dropout's blocks. Neither x nor
    `residual` is modified."""
    if training and p != 0.0 and residual.shape == x.shape:
        return _numpy_dropout(x, p, rng, residual)
    out, mask = dropout_forward(x, p, rng, training)
    return out + residual, mask


def _uniform_dtype(x):
    return numpy.dtype(numpy.float32) if x.dtype == HALF else x.dtype  # Generators draw no float16


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
    # (w >> shift) * 2^-bits >= p  <=>  w >= ceil(p * 2^bits) << shift (a Python int: it may
    # be 2^32 when p rounds to 1.0 in float32, and then nothing is kept, as before)
    shift = 8 * word.itemsize - bits
    threshold = math.ceil(float(uniform_dtype.type(p)) * 2 ** bits) << shift
    n = math.prod(shape)
    bit_generator = rng.bit_generator
    if isinstance(bit_generator, numpy.random.MT19937):       # 32-bit raw output
        words = rng.integers(0, 2 ** (8 * word.itemsize), size=n, dtype=word)
        return words.reshape(shape) >= threshold
    keep = numpy.empty(n, bool)
    per_raw = 8 // word.itemsize                               # words cut from a 64-bit one
    raw = -(-n // per_raw)
    threads = min(thread_count(), -(-raw // KEEP_MASK_WORDS))
    if threads <= 1 or not hasattr(bit_generator, "advance"):
        _draw_and_compare(bit_generator, raw, keep, word, threshold)
        return keep.reshape(shape)
    # Each thread draws its share of the raw words from its own copy of the generator,
    # advanced to where that share starts: the words of one sequential draw, drawn side by
    # side (random_raw releases the GIL).
    state, tasks = bit_generator.state, []
    starts = [raw * i // threads for i in range(threads + 1)]
    for start, stop in zip(starts, starts[1:]):
        copy = type(bit_generator)()
        copy.state = state
        copy.advance(start)
        tasks.append(functools.partial(_draw_and_compare, copy, stop - start,
                                       keep[start * per_raw:stop * per_raw], word, threshold))
    run_tasks(tasks, threads)
    # Then the generator moves on as the sequential draw would have moved it. advance()
    # also drops the half word buffered for next_uint32, which random_raw never touches.
    bit_generator.advance(raw)
    advanced = bit_generator.state
    advanced["has_uint32"], advanced["uinteger"] = state["has_uint32"], state["uinteger"]
    bit_generator.state = advanced
    return keep.reshape(shape)


KEEP_MASK_WORDS = 1 << 18      # a thread per started 2^18 raw words (at most 2^18: one draw)


def _draw_and_compare(bit_generator, count, keep, word, threshold):
    """keep = the next `count` raw 64-bit words of bit_generator, cut into `word`s, >=
    threshold; keep may be one word shorter (the unused half of an odd float32 draw)."""
    words = bit_generator.random_raw(count).view(word)[:keep.size]
    numpy.greater_equal(words, threshold, out=keep)

# ---------------------------------------------------------------------- self-attention


def self_attention_forward(x, w_qkv, b_qkv, mask_bias, num_heads, dropout_p, rng, training):
    """ops.self_attention_forward: the scores become the probabilities in their own memory
    (softmax overwrite_x). The heads are views of the projection and the context matmul
    writes each head straight into its columns of [B, T, H]: NumPy's matmul reads and
    writes such strided matrices without a copy (CuPy's copies them: fast_gpu lays the
    heads out for its matmuls instead)."""
    B, T, H = x.shape
    A, D = num_heads, H // num_heads
    q, k, v, qkv_cache = scaled_heads(x, w_qkv, b_qkv, A)  # [B, A, T, D]
    scores = matmul(q, k.transpose(0, 1, 3, 2))            # [B, A, T, T]
    scores += mask_bias
    probs, softmax_cache = softmax_forward(scores, overwrite_x=True)
    probs_dropped, dropout_cache = dropout_forward(probs, dropout_p, rng, training)
    context = numpy.empty((B, T, H), dtype=x.dtype)
    matmul(probs_dropped, v, out=context.reshape(B, T, A, D).transpose(0, 2, 1, 3))
    cache = AttentionCache(qkv=qkv_cache, q=q, k=k, v=v, probs=softmax_cache,
                           probs_dropped=probs_dropped, dropout_mask=dropout_cache, num_heads=A)
    return context, cache


def self_attention_dqkv(dcontext, cache):
    """ops.self_attention_backward up to the projection's gradient dqkv [B, T, 3H] (fast.py
    then runs linear_backward): dq, dk, dv written by their matmuls straight into their
    places in the stacked projection's layout: no stack, and on NumPy no transposing copy
    (its matmul writes strided matrices)."""
    B, T, H = dcontext.shape
    A = cache.num_heads
    D = H // A
    dcontext = dcontext.reshape(B, T, A, D).transpose(0, 2, 1, 3)  # [B, A, T, D], a view
    dqkv = numpy.empty((B, T, 3 * H), dtype=dcontext.dtype)
    dq, dk, dv = dqkv.reshape(B, T, 3, A, D).transpose(2, 0, 3, 1, 4)  # [B, A, T, D] views
    matmul(cache.probs_dropped.transpose(0, 1, 3, 2), dcontext, out=dv)
    dprobs = matmul(dcontext, cache.v.transpose(0, 1, 3, 2))       # [B, A, T, T]
    dprobs = dropout_backward(dprobs, cache.dropout_mask)
    dscores = softmax_backward(dprobs, cache.probs)
    matmul(dscores, cache.k, out=dq)
    dq *= 1.0 / math.sqrt(D)
    matmul(dscores.transpose(0, 1, 3, 2), cache.q, out=dk)
    return dqkv

# ------------------------------------------------------------------------ composite ops
# Each one pass of blocks where its chain of ops makes two: the second op runs on a block
# while the first has just left it in cache, and the array between them is never whole.
# float16 and the tanh GELUs run the chain's fast ops in turn.


def linear_gelu_forward(x, weight, bias, kind="gelu"):
    """ops.linear_gelu_forward: the product without its bias (pooled_matmul), then blocks
    that add the bias and apply GELU (linear_forward adds the bias in the product's blocks,
    too large to stay in cache: a memory pass of its own). The same arithmetic: bitwise
    linear_forward then gelu_forward."""
    x2 = x.reshape(-1, x.shape[-1])                        # [N, in]
    if x2.dtype == HALF or kind != "gelu":
        y, linear = linear_forward(x, weight, bias)
        out, gelu = gelu_forward(y, kind)
        return out, ops.LinearGeluCache(linear=linear, gelu=gelu)
    y = pooled_matmul(x2, weight.T)                        # [N, out], no bias yet
    cdf, out = numpy.empty(y.shape, y.dtype), numpy.empty(y.shape, y.dtype)
    in_row_blocks(_bias_gelu_block, (y, cdf, out), bias)
    shape = (*x.shape[:-1], weight.shape[0])
    y, cdf, out = y.reshape(shape), cdf.reshape(shape), out.reshape(shape)
    return out, ops.LinearGeluCache(linear=(x2, weight, x.shape), gelu=(y, cdf, kind))


def _bias_gelu_block(y, cdf, out, bias):
    """A block of rows [n, out] of the product: y += bias, then _gelu_block (cdf and out
    None at inference: the result goes into y)."""
    y += bias
    _gelu_block(y, cdf, out)


def bias_gelu_backward(dout, cache, dbias=None):
    """GELU's backward of linear_gelu_forward's output and the linear's bias gradient ->
    (dx [..., out], dbias [out], into dbias if given): gelu_backward (the forward above keeps
    the biased product, as the reference's GELU cache; fast_gpu's twin keeps the product
    without its bias and adds it again), then column_sum."""
    dx = gelu_backward(dout, cache)
    return dx, column_sum(dx.reshape(-1, dx.shape[-1]), out=dbias)


def dropout_add_layernorm_forward(x, residual, gamma, beta, eps, p, rng, training):
    """ops.dropout_add_layernorm_forward in blocks of rows: each block's dropout and the
    residual's add written into its rows of xhat, then normalised there (_layernorm_block)
    while in cache; the sum is never a whole array. The same arithmetic: bitwise
    dropout_add_forward then layernorm_forward (the same keep mask from the same draw).
    `x` and `residual` are not modified."""
    if x.dtype == HALF or residual.shape != x.shape:
        y, mask = dropout_add_forward(x, residual, p, rng, training)
        out, layernorm = layernorm_forward(y, gamma, beta, eps)
        return out, ops.DropoutAddLayerNormCache(dropout_mask=mask, layernorm=layernorm)
    H = x.shape[-1]
    dropout = training and p != 0.0
    keep = _keep_mask(x.shape, p, rng, _uniform_dtype(x)) if dropout else None
    mask = numpy.empty(x.shape, x.dtype) if dropout else None
    xhat, out = numpy.empty(x.shape, x.dtype), numpy.empty(x.shape, x.dtype)
    rstd = numpy.empty(x.shape[:-1] + (1,), x.dtype)
    x2, residual2, keep2, mask2, xhat2, out2 = (None if a is None else a.reshape(-1, H)
                                                for a in (x, residual, keep, mask, xhat, out))
    in_row_blocks(_dropout_add_layernorm_block, (x2, residual2, keep2, mask2, xhat2,
                                                 rstd.reshape(-1, 1), out2),
                  x.dtype.type(1.0 / (1.0 - p)) if dropout else None, gamma, beta, eps,
                  block_elements=LAYERNORM_BLOCK)
    return out, ops.DropoutAddLayerNormCache(dropout_mask=mask, layernorm=(xhat, gamma, rstd))


def _dropout_add_layernorm_block(x, residual, keep, mask, xhat, rstd, out, scale, gamma, beta,
                                 eps):
    """A block of rows [n, H]: xhat = x mask + residual (x + residual without dropout), as
    _dropout_block makes it, then LayerNorm of it in its own memory."""
    if keep is None:
        numpy.add(x, residual, out=xhat)
    else:
        numpy.multiply(keep, scale, out=mask)
        numpy.multiply(x, mask, out=xhat)
        xhat += residual
    _layernorm_block(xhat, xhat, rstd, out, gamma, beta, eps)


def dropout_add_layernorm_backward(dout, cache, dgamma=None, dbeta=None):
    """ops.dropout_add_layernorm_backward: LayerNorm's backward, dropout's multiply made in
    the same blocks of rows (into the buffer LayerNorm's blocks use as scratch). Bitwise
    layernorm_backward then dropout_backward (float16: those two, dropout in float16)."""
    mask, layernorm = cache.dropout_mask, cache.layernorm
    if dout.dtype == HALF or mask is None:
        dsum, dgamma, dbeta = layernorm_backward(dout, layernorm, dgamma, dbeta)
        return dropout_backward(dsum, mask), dsum, dgamma, dbeta
    dsum, dx, dgamma, dbeta = _layernorm_backward(dout, layernorm, dgamma, dbeta, mask)
    return dx, dsum, dgamma, dbeta


# ----------------------------------------------------------------------------- inference
# The no-cache paths of the forwards (fast.py routes x_forward(..., cache=False) in eval mode
# here): each returns what its *_forward returns first, bitwise, keeping nothing for a
# backward and drawing no dropout, computed in the memory of a temporary it makes itself,
# never in its inputs. float16 and strided inputs take the *_forward and drop the cache.


def _in_place_ok(x):
    return x.dtype != HALF and x.flags.c_contiguous


def layernorm_inference(x, gamma, beta, eps, residual=None):
    """layernorm_forward's output of x, or of x + residual (the Transformer's "Add & Norm":
    a sublayer's output x and its input), into one new array: the sum made there block by
    block and normalised in place (no xhat, no rstd kept). x and residual are not modified."""
    if not _in_place_ok(x) or (residual is not None and residual.shape != x.shape):
        return layernorm_forward(x if residual is None else x + residual, gamma, beta, eps)[0]
    H = x.shape[-1]
    out = numpy.empty(x.shape, x.dtype)
    in_row_blocks(_add_layernorm_block, (x.reshape(-1, H), out.reshape(-1, H),
                                         None if residual is None else residual.reshape(-1, H)),
                  gamma, beta, eps, block_elements=LAYERNORM_BLOCK)
    return out


def _add_layernorm_block(x, out, residual, gamma, beta, eps):
    """layernorm_inference on a block of rows [n, H]: LayerNorm of x (+ residual) into out."""
    if residual is None:
        _layernorm_block(x, out, None, None, gamma, beta, eps)     # x - mean made in out
        return
    numpy.add(x, residual, out=out)
    _layernorm_block(out, None, None, None, gamma, beta, eps)


def linear_gelu_inference(x, weight, bias, kind="gelu"):
    """linear_gelu_forward's output, on NumPy ("gelu") the bias and GELU applied in the
    product's own memory, block by block (Phi in a scratch block per thread, never a whole
    [B, T, I] array)."""
    x2 = x.reshape(-1, x.shape[-1])                        # [N, in]
    if kind != "gelu" or x2.dtype == HALF:
        return linear_gelu_forward(x, weight, bias, kind)[0]
    y = pooled_matmul(x2, weight.T)                        # [N, out], no bias yet
    in_row_blocks(_bias_gelu_block, (y, None, None), bias)
    return y.reshape(*x.shape[:-1], weight.shape[0])


def scaled_heads(x, w_qkv, b_qkv, num_heads):
    """The stacked projection split into heads (NumPy): x [..., T, H] -> q / sqrt(D) (a new
    array), k, v [..., A, T, D] (views of the projection's output), and the projection's
    linear cache. [B, T, H] for the padded batch, the packed [N, H] gives [A, N, D]."""
    D = x.shape[-1] // num_heads
    qkv, qkv_cache = linear_forward(x, w_qkv, b_qkv)       # [..., T, 3H]
    qkv = qkv.reshape(*x.shape[:-1], 3, num_heads, D)      # [..., T, 3, A, D]
    q, k, v = numpy.moveaxis(qkv, -3, 0).swapaxes(-3, -2)  # [..., A, T, D] views
    return q * (1.0 / math.sqrt(D)), k, v, qkv_cache


def self_attention_inference(x, w_qkv, b_qkv, mask_bias, num_heads):
    """self_attention_forward's context [B, T, H] in eval mode, without its cache.

    On NumPy, one batch row at a time from scores to context (_attention_rows: its scores
    [A, T, T] stay in cache), rows spread over the threads; and only over the keys up to
    the row's last attended one (key_lengths): a padded key's probability is exactly 0
    (exp(-10000) underflows), so dropping it changes only the order of the softmax's sum
    and the context's dot products: a few ulp (tests/test_inference.py), bitwise the same
    on rows without trailing padding."""
    if not _in_place_ok(x):
        return self_attention_forward(x, w_qkv, b_qkv, mask_bias, num_heads, 0.0, None,
                                      False)[0]
    B, T, H = x.shape
    A, D = num_heads, H // num_heads
    q, k, v, _ = scaled_heads(x, w_qkv, b_qkv, A)
    context = numpy.empty((B, T, H), dtype=x.dtype)
    in_row_blocks(_attention_rows, (q, k, v, mask_bias, key_lengths(mask_bias),
                                    context.reshape(B, T, A, D).transpose(0, 2, 1, 3)),
                  uses_blas=True)
    return context


def key_lengths(mask_bias):
    """mask_bias [B, 1, 1, T] -> [B]: 1 + the last attended key (bias 0) of each row; T for
    a row with none (its softmax is uniform over every key, as in the reference)."""
    attended = mask_bias[:, 0, 0, :] == 0                  # [B, T]
    T = attended.shape[1]
    last = T - numpy.argmax(attended[:, ::-1], axis=1)     # 1 + the last True
    return numpy.where(attended.any(axis=1), last, T)


def _attention_rows(q, k, v, mask_bias, lengths, context):
    """Attention for a block of batch rows, each over its first lengths[i] keys:
    q, k, v and context [n, A, T, D] (context a view of [n, T, H])."""
    for i, L in enumerate(lengths):
        scores = numpy.matmul(q[i], k[i, :, :L].transpose(0, 2, 1))   # [A, T, L]
        _softmax_block(scores, scores, mask_bias[i, :, :, :L])
        numpy.matmul(scores, v[i, :, :L], out=context[i])
