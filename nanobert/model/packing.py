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
from typing import NamedTuple

import numpy


class Packing(NamedTuple):
    """Where the attended tokens of a padded batch sit once packed into [N, ...]."""
    index: numpy.ndarray       # [N] int64: flat positions b*T + t of the attended tokens, row by row
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
    starts = numpy.concatenate([[0], numpy.cumsum(lengths)[:-1]])
    return Packing(numpy.flatnonzero(mask), starts, lengths, mask.shape)


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
