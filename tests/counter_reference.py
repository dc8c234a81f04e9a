"""Philox4x32-10 and the GPU dropout's counter layout in NumPy, written from the Random123
paper (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC 2011),
apart from kernels.cu: the tests' reference for the CUDA kernels' draws, checked against the
paper's published known-answer vectors (tests/test_counter_rng.py).

    key     = (seed lo32, seed hi32)
    counter = (element index // 4, call index, step lo32, step hi32)
    element i takes word i % 4 of its block; u = (word >> 8) * 2^-24; kept where u >= p.

HostCounterGenerator draws the same numbers on the host, so that the NumPy path can drop the
elements the GPU path drops (dropout_generator, numpy_draws_like_the_gpu) and the two be
compared, dropout on.
"""
import contextlib
import math

import numpy

MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)        # Philox4x32's round multipliers
WEYL = (0x9E3779B9, 0xBB67AE85)               # the key's increments between rounds
LOW32 = numpy.uint64(0xFFFFFFFF)

# Random123's kat_vectors, "philox4x32 10": counter (4 words), key (2 words) -> 4 words
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),   # pi
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def philox4x32_10(counters, key):
    """counters [n, 4] (any integer type holding 32-bit words), key (k0, k1) -> [n, 4] uint32.
    Each round: (c0, c1, c2, c3) -> (hi(M1 c2) ^ c1 ^ k0, lo(M1 c2), hi(M0 c0) ^ c3 ^ k1,
    lo(M0 c0)), the 64-bit products taken in uint64; then the key plus the Weyl constants."""
    c = numpy.asarray(counters, numpy.uint64).reshape(-1, 4).T.copy()
    k = [numpy.uint64(word) for word in key]
    m0, m1 = (numpy.uint64(m) for m in MULTIPLIERS)
    for _ in range(10):
        product0, product1 = m0 * c[0], m1 * c[2]
        c = numpy.stack([(product1 >> numpy.uint64(32)) ^ c[1] ^ k[0], product1 & LOW32,
                         (product0 >> numpy.uint64(32)) ^ c[3] ^ k[1], product0 & LOW32])
        k = [(k[j] + numpy.uint64(WEYL[j])) & LOW32 for j in range(2)]
    return c.T.astype(numpy.uint32)


def split64(value):
    """A 64-bit int -> (low 32 bits, high 32 bits)."""
    return value & 0xFFFFFFFF, (value >> 32) & 0xFFFFFFFF


def counter_words(seed, step, call, n):
    """The words of elements 0 .. n-1 of one draw -> [n] uint32."""
    groups = numpy.arange(-(-n // 4), dtype=numpy.uint64)
    counters = numpy.empty((groups.size, 4), numpy.uint64)
    counters[:, 0] = groups
    counters[:, 1] = call
    counters[:, 2:] = split64(step)
    return philox4x32_10(counters, split64(seed)).reshape(-1)[:n]


def counter_uniform(seed, step, call, n, dtype):
    """The uniforms in [0, 1) of elements 0 .. n-1 of one draw, in dtype (float32 or
    float64: 24-bit values, exact in both)."""
    dtype = numpy.dtype(dtype)
    return (counter_words(seed, step, call, n) >> 8).astype(dtype) * dtype.type(2.0 ** -24)


def keep_mask(seed, step, call, shape, dtype, p):
    """The dropout mask of one draw over an array of this shape and dtype: (u >= p) times
    1 / (1 - p), in dtype, as ops.dropout_forward makes it from the draw's uniforms (float32
    ones for float16 activations)."""
    dtype = numpy.dtype(dtype)
    stats = numpy.dtype(numpy.float32 if dtype == numpy.float16 else dtype)
    u = counter_uniform(seed, step, call, math.prod(shape), stats).reshape(shape)
    return ((u >= stats.type(p)) * dtype.type(1.0 / (1.0 - p))).astype(dtype)


class HostCounterGenerator:
    """CounterGenerator's draws on the host: the same (seed, step, calls) and random()."""

    def __init__(self, seed):
        self.seed, self.step, self.calls = seed, 0, 0

    def begin_step(self):
        self.step, self.calls = self.step + 1, 0

    def random(self, shape, dtype=numpy.float64):
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        u = counter_uniform(self.seed, self.step, self.calls, math.prod(shape), dtype)
        self.calls += 1
        return u.reshape(shape)


def dropout_generator(xp, seed):
    """The dropout generator of a run on xp that the other side can match: on CuPy
    counter_rng.default_rng's (the CounterGenerator); on NumPy its host twin (draw with it inside
    numpy_draws_like_the_gpu)."""
    from nanobert.model import counter_rng
    return HostCounterGenerator(seed) if xp is numpy else counter_rng.default_rng(xp, seed)


@contextlib.contextmanager
def numpy_draws_like_the_gpu():
    """While active, fast_cpu's dropout takes its keep mask from a HostCounterGenerator's
    random() (the reference's rule, u >= p), so that a NumPy run given one draws the masks a
    GPU run draws from counter_rng.default_rng(cupy, the same seed). fast_cpu otherwise cuts its
    masks from a numpy Generator's raw words."""
    from nanobert.model import fast_cpu
    keep_mask = fast_cpu._keep_mask

    def counter_keep_mask(shape, p, rng, uniform_dtype):
        if isinstance(rng, HostCounterGenerator):
            return rng.random(shape, uniform_dtype) >= uniform_dtype.type(p)
        return keep_mask(shape, p, rng, uniform_dtype)
    fast_cpu._keep_mask = counter_keep_mask
    try:
        yield
    finally:
        fast_cpu._keep_mask = keep_mask
