"""Packing: the encoder computed on the attended tokens only, not on the padding.

A padded batch [B, T] with attention_mask rows of lengths 64-128 of T = 128 spends a
quarter of every matmul, GELU and LayerNorm on padded positions. Nothing a head reads
depends on them: a padded key's attention probability is exactly 0 (exp(-10000) underflows
in float32 and float64), so the attended tokens' outputs are the same without the padded
ones, and a padded token's own output reaches a loss only where a head reads that position.

So the fast layer gathers the attended tokens of every row into one [N, H] array (N = the
number of ones in attention_mask), runs the layers on it, with attention taken row by row
over each row's own tokens, and scatters the result back to [B, T, H] with zeros at the
padded positions (as torch's nested tensors do). The attended positions' outputs and every
parameter gradient equal the padded computation's up to summation order
(tests/test_packing.py), as long as the loss reads no padded position; the models decide
when that holds (BertPreTrainedModel._packing).
"""
import math
from typing import NamedTuple

import numpy

from . import fast, fast_cpu
from .threads import in_row_blocks


class Packing(NamedTuple):
    """Where the attended tokens of a padded batch sit once packed into [N, ...]."""
    index: numpy.ndarray       # [N] int64: flat positions b*T + t of the attended tokens
    starts: numpy.ndarray      # [B] int64: where row b's tokens begin in [N]
    lengths: numpy.ndarray     # [B] int64: how many tokens row b attends to
    shape: tuple               # (B, T)


def packing_of(attention_mask):
    """attention_mask [B, T] (NumPy, 1 attend / 0 padding) -> a Packing, or None when
    packing buys nothing (no padding) or would change the result (a row with no attended
    token: its softmax is uniform over the padding, which packing drops)."""
    mask = numpy.asarray(attention_mask) != 0              # [B, T]
    lengths = mask.sum(axis=1)
    if mask.all() or not lengths.all():
        return None
    return Packing(numpy.flatnonzero(mask), starts_of(lengths), lengths, mask.shape)


def starts_of(sizes):
    """[B] sizes -> [B] where each begins when they are laid end to end."""
    return numpy.concatenate([[0], numpy.cumsum(sizes)[:-1]])


def pack(x, packing):
    """x [B, T, ...] -> its attended positions [N, ...], a new array."""
    B, T = packing.shape
    return x.reshape(B * T, *x.shape[2:])[packing.index]


def unpack(x, packing):
    """x [N, ...] -> [B, T, ...]: each token back in its place, zeros at the padding."""
    B, T = packing.shape
    out = numpy.zeros((B * T, *x.shape[1:]), dtype=x.dtype)
    out[packing.index] = x
    return out.reshape(B, T, *x.shape[1:])


# ---------------------------------------------------------------------- self-attention
# fast.self_attention_* on the packed tokens: each row's tokens attend to that row's tokens
# only, so the scores of row b are [A, L, L] (L = lengths[b]), not [A, T, T], and need no
# mask bias. Rows run one per block over the thread pool; every row's arithmetic is the
# same whatever thread runs it, so the results are bitwise the same for any thread count.
# The row's probabilities live in one flat buffer of A * sum(L^2) elements, row after row,
# keys first ([A, L keys, L queries], the transpose of fast_cpu.py's): the softmax then reduces
# over the middle axis, which NumPy runs as whole-row vector operations, ~1.5x faster than
# its reductions along the last axis; the matmuls take the transposes as they are.
# NumPy float32 / float64 only: the model packs neither CuPy nor float16 activations.
# tests/test_packing_attention.py checks them against the padded fast op on unpack(x).


class PackedAttentionCache(NamedTuple):
    qkv: tuple                 # linear cache of the stacked projection
    q: object                  # [A, N, D], already scaled by 1/sqrt(D)
    k: object                  # [A, N, D], a view of the projection's output
    v: object                  # [A, N, D], a view of the projection's output
    probs: object              # [P] flat: row b's softmax, keys first [A, Lk, Lq], at offsets[b]
    probs_dropped: object      # [P], what multiplied v (probs itself without dropout)
    dropout_mask: object       # [P], the keep mask scaled by 1/(1-p), or None
    offsets: object            # [B] int64: where row b's [A, L, L] begins in the flat buffers
    packing: Packing
    num_heads: int


def probability_offsets(packing, num_heads):
    """[B] where each row's probabilities [A, L, L] begin in the flat buffer, and its size."""
    sizes = num_heads * packing.lengths * packing.lengths
    return starts_of(sizes), int(sizes.sum())


def _check_packed(x, packing, num_heads, name):
    """One clear error for what the packed attention cannot take."""
    if not isinstance(x, numpy.ndarray) or x.dtype not in (numpy.float32, numpy.float64):
        raise TypeError(f"packing.{name}: packed attention takes a NumPy float32 or float64 "
                        f"array, got {type(x).__name__} of {getattr(x, 'dtype', None)} "
                        f"(CuPy and float16 run the padded fast.{name})")
    N = int(packing.lengths.sum())
    if x.ndim != 2 or x.shape[0] != N or x.shape[1] % num_heads:
        raise ValueError(f"packing.{name}: x must be [N={N}, H] with H divisible by "
                         f"num_heads={num_heads}, got shape {x.shape}")


def self_attention_forward(x, w_qkv, b_qkv, packing, num_heads, dropout_p, rng, training,
                           cache=True):
    """fast.self_attention_forward on the packed tokens: x [N, H] -> (context [N, H],
    PackedAttentionCache; None with cache=False). The dropout keep mask is drawn here, in the
    calling thread, for all rows at once in row order: the draws never depend on the
    threads. cache=False in eval mode: self_attention_inference."""
    if not cache and not (training and dropout_p != 0.0):
        return self_attention_inference(x, w_qkv, b_qkv, packing, num_heads), None
    _check_packed(x, packing, num_heads, "self_attention_forward")
    N, H = x.shape
    A = num_heads
    q, k, v, qkv_cache = fast_cpu.scaled_heads(x, w_qkv, b_qkv, A)      # [A, N, D]
    offsets, size = probability_offsets(packing, A)
    probs = numpy.empty(size, x.dtype)
    dropout = None
    if training and dropout_p != 0.0:
        keep = fast_cpu._keep_mask((size,), dropout_p, rng, x.dtype)
        scale = x.dtype.type(1.0 / (1.0 - dropout_p))
        dropout = (keep, numpy.empty(size, x.dtype), numpy.empty(size, x.dtype), scale)
    context = numpy.empty((N, H), x.dtype)
    in_row_blocks(_attention_rows, (packing.starts, packing.lengths, offsets),
                  q, k, v, heads_of(context, A), probs, dropout, uses_blas=True, rows_per_block=1)
    mask, probs_dropped = (None, probs) if dropout is None else dropout[1:3]
    if not cache:
        return context, None
    return context, PackedAttentionCache(qkv=qkv_cache, q=q, k=k, v=v, probs=probs,
                                         probs_dropped=probs_dropped, dropout_mask=mask,
                                         offsets=offsets, packing=packing, num_heads=A)


def self_attention_backward(dcontext, cache, dw_qkv=None, db_qkv=None):
    """fast.self_attention_backward on the packed tokens: dcontext [N, H] -> (dx [N, H],
    dw_qkv, db_qkv). dq, dk and dv are written by their matmuls, row by row, straight into
    their places in one [N, 3H] array, the stacked projection's layout."""
    _check_packed(dcontext, cache.packing, cache.num_heads, "self_attention_backward")
    N, H = dcontext.shape
    A = cache.num_heads
    dqkv = numpy.empty((N, 3 * H), dcontext.dtype)
    dq, dk, dv = dqkv.reshape(N, 3, A, H // A).transpose(1, 2, 0, 3)  # [A, N, D] views
    packing = cache.packing
    in_row_blocks(_attention_backward_rows, (packing.starts, packing.lengths, cache.offsets),
                  cache, heads_of(dcontext, A), dq, dk, dv, uses_blas=True, rows_per_block=1)
    return fast.linear_backward(dqkv, cache.qkv, dw_qkv, db_qkv)


def self_attention_inference(x, w_qkv, b_qkv, packing, num_heads):
    """fast.self_attention_forward's context in eval mode, without a cache: x [N, H] ->
    context [N, H]. Each row's probabilities in a scratch [A, L, L] of its own."""
    _check_packed(x, packing, num_heads, "self_attention_inference")
    q, k, v, _ = fast_cpu.scaled_heads(x, w_qkv, b_qkv, num_heads)     # [A, N, D]
    context = numpy.empty(x.shape, x.dtype)
    offsets = numpy.zeros_like(packing.starts)              # unused: no flat buffer
    in_row_blocks(_attention_rows, (packing.starts, packing.lengths, offsets),
                  q, k, v, heads_of(context, num_heads), None, None, uses_blas=True,
                  rows_per_block=1)
    return context


def heads_of(x, num_heads):
    """x [N, H] -> [A, N, D], a view: head a of token n is x[n, a*D:(a+1)*D]."""
    N, H = x.shape
    return x.reshape(N, num_heads, H // num_heads).transpose(1, 0, 2)


def _attention_rows(starts, lengths, offsets, q, k, v, context, probs, dropout):
    """Attention for a block of batch rows, row b over its own tokens starts[b] + [0, L):
    q, k, v, context [A, N, D] (context a view of [N, H], written row by row); probs the
    flat buffer (row b's [A, L, L], keys first, at offsets[b]) or None (a scratch per row,
    inference); dropout None or (keep [P] bool, mask [P], probs_dropped [P], scale)."""
    A = q.shape[0]
    for start, L, offset in zip(starts, lengths, offsets):
        tokens, flat = slice(start, start + L), slice(offset, offset + A * L * L)
        k_q = (k[:, tokens], q[:, tokens].transpose(0, 2, 1))
        if probs is None:
            scores_t = numpy.matmul(*k_q)                   # [A, Lk, Lq] = (Q K^T)^T
        else:
            scores_t = numpy.matmul(*k_q, out=probs[flat].reshape(A, L, L))
        _softmax_over_keys(scores_t)                        # the probabilities^T, in place
        if dropout is not None:
            keep, mask, probs_dropped, scale = dropout
            numpy.multiply(keep[flat], scale, out=mask[flat])
            scores_t = numpy.multiply(probs[flat], mask[flat], out=probs_dropped[flat])
            scores_t = scores_t.reshape(A, L, L)
        numpy.matmul(scores_t.transpose(0, 2, 1), v[:, tokens], out=context[:, tokens])


def _softmax_over_keys(scores_t):
    """softmax over the keys of scores^T [A, Lk, Lq] (axis 1), in place: fast.softmax's
    arithmetic, its sums in another order."""
    scores_t -= scores_t.max(axis=1, keepdims=True)
    numpy.exp(scores_t, out=scores_t)
    scores_t /= scores_t.sum(axis=1, keepdims=True)


def _attention_backward_rows(starts, lengths, offsets, cache, dcontext, dq, dk, dv):
    """The backward for a block of batch rows, into dq, dk, dv [A, N, D] (views of dqkv);
    dcontext [A, N, D], a view of [N, H]. Every [A, L, L] is keys first, as the cache's."""
    A, _, D = dq.shape
    for start, L, offset in zip(starts, lengths, offsets):
        tokens, flat = slice(start, start + L), slice(offset, offset + A * L * L)
        probs_t = cache.probs[flat].reshape(A, L, L)
        numpy.matmul(cache.probs_dropped[flat].reshape(A, L, L), dcontext[:, tokens],
                     out=dv[:, tokens])                     # dV = P^T dC
        dscores_t = numpy.matmul(cache.v[:, tokens], dcontext[:, tokens].transpose(0, 2, 1))
        if cache.dropout_mask is not None:                  # dP^T through the dropout
            dscores_t *= cache.dropout_mask[flat].reshape(A, L, L)
        _softmax_backward_over_keys(dscores_t, probs_t)     # in place: dP^T -> dS^T
        numpy.matmul(dscores_t.transpose(0, 2, 1), cache.k[:, tokens], out=dq[:, tokens])
        dq[:, tokens] *= 1.0 / math.sqrt(D)                 # dQ = dS K / sqrt(D)
        numpy.matmul(dscores_t, cache.q[:, tokens], out=dk[:, tokens])   # dK = dS^T Q


def _softmax_backward_over_keys(dprobs_t, probs_t):
    """dP^T [A, Lk, Lq] -> dS^T in place: P (dP - sum over keys of dP P), transposed."""
    dprobs_t *= probs_t
    dprobs_t -= probs_t * dprobs_t.sum(axis=1, keepdims=True)
