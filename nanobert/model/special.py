"""The error function erf, vectorised, for the exact GELU: x * Phi(x) = x/2 * (1 + erf(x/sqrt 2)).

NumPy has no erf and scipy is not a dependency, so erf is built here from array ops that
NumPy and CuPy share. Two formulas, each where it is accurate:

    |x| < 1:   erf(x) = x + x (P(x^2) - 1)            P: the Maclaurin series of erf(x)/x,
                                                      economised to degree 11 (float64)
    |x| >= 1:  erf(x) = sign(x) (1 - exp(-x^2) R(u))  R: a fitted polynomial for erfcx(|x|)
                                                      in u = (|x| - 3)/(|x| + 3)

The first keeps the relative accuracy near 0 (and the sign of -0.0); the second has no
cancellation, as erfc(x) <= erfc(1) = 0.16 there. Beyond ERF_ONE, erfc is below half an ulp
of 1 and erf rounds to exactly +-1: clamping |x| to ERF_ONE gives that without a third
branch (inf -> +-1; nan stays nan through every op). float32 input is computed in float32
with its own shorter polynomials. On CuPy, erf is cupyx.scipy.special.erf: one kernel.

Measured against math.erf (tests/test_special.py records the numbers): float64 relative
error <= 2.3e-16 for |x| < 1 and absolute error <= 1.2e-16 elsewhere (1 ulp); float32
<= 1.3 ulp. Odd to the bit: erf(-x) = -erf(x).
"""
import math
from fractions import Fraction

import numpy

# Elements per block on NumPy. Each NumPy op makes one pass over its operands; in blocks the
# ~70 ops below pass over cache instead of main memory (2x faster on 3M elements).
# CuPy runs one kernel per op whatever the size, so it takes the whole array at once.
BLOCK = 1 << 16

ERF_ONE = {numpy.dtype(numpy.float64): 6.0,   # erfc(6) = 2.2e-17 < 2^-54: erf rounds to 1
           numpy.dtype(numpy.float32): 4.0}   # erfc(4) = 1.5e-8  < 2^-25

# 2/sqrt(pi) to 40 digits, so that every series coefficient is rounded once, to its dtype.
TWO_OVER_SQRT_PI = Fraction("1.128379167095512573896158903121545171681")

# erfcx(x) = exp(x^2) erfc(x) ~ R(u), u = (x - ERFCX_K)/(x + ERFCX_K), on 1 <= x <= ERF_ONE.
# Weighted minimax fits (error of exp(-x^2) R, i.e. of erfc) by reference/fit_erf.py;
# maximum error 6.9e-18 (float64) and 1.1e-9 (float32) after rounding the coefficients.
ERFCX_K = 3.0
ERFCX_COEFFICIENTS = {   # u^0, u^1, ...
    numpy.dtype(numpy.float64): (
        1.7900115118135377526e-1,
        -3.2623356004590190697e-1,
        2.4560380166430103418e-1,
        -1.5011593634367416857e-1,
        7.1665850130981882253e-2,
        -2.4392327873675592993e-2,
        4.2703538138231017035e-3,
        7.1317531539534758816e-4,
        -5.8109216873875601375e-4,
        7.6394024825647683171e-5,
        1.0295181398585189543e-4,
        1.5203281712393722271e-5,
    ),
    numpy.dtype(numpy.float32): (
        1.7900034857800462754e-1,
        -3.2625504806226289965e-1,
        2.4538261979793224281e-1,
        -1.5127774517927077484e-1,
        6.8271818335007673497e-2,
        -2.9866927941325462435e-2,
    ),
}


def maclaurin_erf_over_x(eps, terms=30):
    """Coefficients (t^0 first) of P(t) ~ erf(x)/x, t = x^2 in [0, 1], with error below
    eps/32 relative, as exact fractions.

    The Maclaurin series is erf(x)/x = 2/sqrt(pi) sum_n (-1)^n t^n / (n! (2n + 1)). Taken
    as it is it needs 18 terms for float64 at t = 1; Chebyshev economisation (Numerical
    Recipes 5.11) trades the top terms for small changes to the lower ones: subtracting
    c_k T*_k(t) / 2^(2k-1), where T*_k(t) = T_k(2t - 1) is the Chebyshev polynomial shifted
    to [0, 1] with leading coefficient 2^(2k-1), removes t^k at a cost of at most
    |c_k| / 2^(2k-1) anywhere on [0, 1]. Exact rational arithmetic, so the only rounding is
    the final one of each coefficient. Leaves 12 terms for float64, 7 for float32.
    """
    c = [Fraction((-1) ** n, math.factorial(n) * (2 * n + 1)) for n in range(terms + 1)]
    shifted_chebyshev = [[1], [-1, 2]]                # coefficients, t^0 first
    for k in range(1, terms):                         # T*_{k+1} = 2 (2t - 1) T*_k - T*_{k-1}
        nxt = [0] * (k + 2)
        for j, v in enumerate(shifted_chebyshev[k]):
            nxt[j] -= 2 * v
            nxt[j + 1] += 4 * v
        for j, v in enumerate(shifted_chebyshev[k - 1]):
            nxt[j] -= v
        shifted_chebyshev.append(nxt)
    # The sum is >= erf(1) sqrt(pi)/2 = 0.75 on [0, 1]: an absolute bound of eps/64 on it
    # is a relative bound below eps/32 (Fraction(eps) is exact: eps is a power of 2).
    budget = Fraction(float(eps)) / 64
    error = Fraction(1, math.factorial(terms + 1) * (2 * terms + 3))    # truncated tail
    degree = terms
    while degree > 0 and error + abs(c[degree]) / 2 ** (2 * degree - 1) <= budget:
        lead = Fraction(c[degree], 2 ** (2 * degree - 1))
        error += abs(lead)
        for j, v in enumerate(shifted_chebyshev[degree]):
            c[j] -= lead * v
        degree -= 1
    return [TWO_OVER_SQRT_PI * cj for cj in c[:degree + 1]]


_HORNER = {}   # dtype -> (series coefficients, erfcx coefficients), highest power first


def erf_coefficients(dtype):
    """(series, erfcx): the two polynomials' coefficients in `dtype`, highest power first."""
    if dtype not in _HORNER:
        scalar = dtype.type
        series = maclaurin_erf_over_x(numpy.finfo(dtype).eps)
        series[0] -= 1      # x + x (P - 1): P's last rounding, at ~1.1, is not in the result
        _HORNER[dtype] = (tuple(scalar(float(c)) for c in reversed(series)),
                          tuple(scalar(c) for c in reversed(ERFCX_COEFFICIENTS[dtype])))
    return _HORNER[dtype]


def _horner(xp, coefficients, t, out):
    """out = polynomial(t), coefficients highest power first; t and out distinct buffers."""
    xp.multiply(t, coefficients[0], out=out)
    xp.add(out, coefficients[1], out=out)
    for c in coefficients[2:]:
        xp.multiply(out, t, out=out)
        xp.add(out, c, out=out)
    return out


def _gather(xp, a, indices, out):
    """out = a[indices]. The indices come from flatnonzero, so always in range: NumPy's
    mode="clip" skips the bounds check and is twice as fast; CuPy's take has no mode."""
    if xp is numpy:
        return numpy.take(a, indices, out=out, mode="clip")
    return xp.take(a, indices, out=out)


def erf(x, xp=None, out=None):
    """The error function, elementwise: float32 or float64 array of any shape -> same dtype
    and shape. The fast layer's: ops.erf is the same two formulas written plainly (each
    evaluated everywhere), bitwise equal to this (tests/test_reference_mode.py). `xp` is the array
    namespace (numpy by default, or cupy). `out`, if given, a
    C-contiguous array of the same shape and dtype, receives the result (it may be `x`)."""
    xp = numpy if xp is None else xp
    x = xp.asarray(x)
    dtype = numpy.dtype(x.dtype)
    if dtype not in ERF_ONE:
        raise ValueError(f"erf takes float32 or float64 arrays, got dtype {dtype}")
    if out is None:
        out = xp.empty(x.shape, dtype)
    elif out.shape != x.shape or out.dtype != dtype or not out.flags.c_contiguous:
        raise ValueError(f"erf out= must be C-contiguous {dtype} of shape {x.shape}, got "
                         f"{out.dtype} of shape {out.shape}")
    if xp is not numpy:                 # one kernel (and no flatnonzero: no host wait)
        import cupyx.scipy.special
        return cupyx.scipy.special.erf(x, out=out)
    series, erfcx = erf_coefficients(dtype)
    erf_one = dtype.type(ERF_ONE[dtype])
    k = dtype.type(ERFCX_K)
    one = dtype.type(1.0)
    flat_x, flat_out = x.reshape(-1), out.reshape(-1)
    n = flat_x.size
    block = min(BLOCK if xp is numpy else n, n)
    if n == 0:
        return out
    # Scratch, reused by every block: a mask and four work arrays.
    mask = xp.empty(block, bool)
    w1, w2, w3, w4 = (xp.empty(block, dtype) for _ in range(4))
    for start in range(0, n, block):
        xb, ob = flat_x[start:start + block], flat_out[start:start + block]
        m = xb.size
        xp.less(xp.abs(xb, out=w1[:m]), one, out=mask[:m])     # nan: False, second branch
        # Each branch runs on its own elements only, gathered and scattered by index: NumPy's
        # where() and masked copies branch per element and, on random signs, cost twice a
        # take + put; evaluating both branches everywhere would cost more still.
        i_small = xp.flatnonzero(mask[:m])
        i_large = xp.flatnonzero(xp.logical_not(mask[:m], out=mask[:m]))

        if i_small.size:                               # erf(x) = x + x (P(x^2) - 1)
            s = i_small.size
            xs = _gather(xp, xb, i_small, out=w1[:s])
            t = xp.multiply(xs, xs, out=w2[:s])
            p = _horner(xp, series, t, out=w3[:s])
            xp.multiply(p, xs, out=p)
            xp.add(p, xs, out=p)
            ob[i_small] = p

        if i_large.size:                               # erf(x) = sign(x) (1 - exp(-x^2) R(u))
            s = i_large.size
            xl = _gather(xp, xb, i_large, out=w4[:s])
            ax = xp.minimum(xp.abs(xl, out=w1[:s]), erf_one, out=w1[:s])
            e = xp.multiply(ax, ax, out=w2[:s])
            xp.exp(xp.negative(e, out=e), out=e)       # exp(-x^2)
            u = xp.add(ax, k, out=w3[:s])
            xp.divide(xp.subtract(ax, k, out=ax), u, out=u)
            r = _horner(xp, erfcx, u, out=ax)
            xp.multiply(r, e, out=r)                   # erfc(|x|)
            xp.subtract(one, r, out=r)
            ob[i_large] = xp.copysign(r, xl, out=r)
    return out
