"""The float32 erf of the fast layer (nanobert.model.fast.erf_float32): its fit and its error.

    python -m bench.erf_ulp            # error over EVERY float32 in [0, 4] (~1.08e9 values)
    python -m bench.erf_ulp --fit      # refit the (5, 5) rational; prints the coefficients

The sweep compares with the reference erf in float64 (nanobert.model.special.erf, ~1 ulp of
float64), in ulp of the float32 result (numpy.spacing of the correctly rounded value). Only
x >= 0 is swept: x P(x^2) / Q(x^2) is odd to the bit (checked on a sample), and past 4 the
clamp makes it exactly +-1, which is erf rounded to float32 there. Prints the maximum ulp
error, where it occurs, the mean, and the maximum per range of x.

The fit: erf(x)/x ~ P(t)/Q(t), t = x^2, on 0 <= x <= 4, minimising the largest relative
error. Lawson's iteration: weighted least squares on the linearised error P - f Q (divided
by f times the last Q), each point's weight multiplied by its error, so the weights gather
where the error peaks and the solution tends to the minimax one.
"""
import argparse
import math

import numpy

from nanobert.model.fast import ERF32_CLAMP, erf_float32
from nanobert.model.special import erf

CHUNK = 1 << 24
RANGES = ((0.0, 0.5), (0.5, 1.0), (1.0, 2.0), (2.0, 3.0), (3.0, 4.0))


def fit(num_degree=5, den_degree=5, iterations=60, points=4000):
    """-> (max relative error in float64, P coefficients, Q coefficients), t^0 first, Q(0) = 1
    (so that x P(0) for tiny x does not underflow before the division)."""
    k = numpy.arange(points)
    x = ERF32_CLAMP * (1 - numpy.cos(numpy.pi * (k + 0.5) / points)) / 2   # dense at both ends
    x = numpy.append(x, ERF32_CLAMP)
    s = (x / ERF32_CLAMP) ** 2                      # t scaled to [0, 1]: a well-conditioned fit
    f = numpy.where(x > 0, erf(x) / numpy.where(x > 0, x, 1.0), 2.0 / math.sqrt(math.pi))
    weights, last_q, best = numpy.ones_like(x), numpy.ones_like(x), None
    for _ in range(iterations):
        columns = [s ** j for j in range(num_degree + 1)]
        columns += [-f * s ** j for j in range(1, den_degree + 1)]
        a = numpy.stack(columns, axis=1) / (f * last_q)[:, None]
        root = numpy.sqrt(weights)
        c = numpy.linalg.lstsq(a * root[:, None], root / last_q, rcond=None)[0]
        p, q = c[:num_degree + 1], numpy.concatenate([[1.0], c[num_degree + 1:]])
        last_q = numpy.polyval(q[::-1], s)
        error = (numpy.polyval(p[::-1], s) / last_q - f) / f
        worst = numpy.abs(error).max()
        if best is None or worst < best[0]:
            best = (worst, p, q)
        weights = numpy.maximum(weights * numpy.abs(error) / (weights * numpy.abs(error)).sum(),
                                1e-12)
    worst, p, q = best
    scale = ERF32_CLAMP ** -2.0                     # back from s to t = x^2
    return worst, p * scale ** numpy.arange(len(p)), q * scale ** numpy.arange(len(q))


def ulp_errors(x):
    """float32 x -> |erf_float32(x) - erf(x)| in ulp of the float32 nearest erf(x)."""
    exact = erf(x.astype(numpy.float64))
    ulp = numpy.spacing(numpy.abs(exact).astype(numpy.float32)).astype(numpy.float64)
    return numpy.abs(erf_float32(x).astype(numpy.float64) - exact) / ulp


def sweep():
    """Every float32 from +0 to 4 (bit patterns 0 .. bits(4)), in chunks."""
    last = int(numpy.float32(ERF32_CLAMP).view(numpy.uint32))
    worst, worst_x, total, count = 0.0, 0.0, 0.0, 0
    per_range = dict.fromkeys(RANGES, 0.0)
    for start in range(0, last + 1, CHUNK):
        x = numpy.arange(start, min(start + CHUNK, last + 1), dtype=numpy.uint32)
        x = x.view(numpy.float32)
        e = ulp_errors(x)
        i = int(e.argmax())
        if e[i] > worst:
            worst, worst_x = float(e[i]), float(x[i])
        total, count = total + float(e.sum()), count + e.size
        for lo, hi in RANGES:
            inside = (x >= lo) & (x < hi)
            if inside.any():
                per_range[(lo, hi)] = max(per_range[(lo, hi)], float(e[inside].max()))
    return worst, worst_x, total / count, count, per_range


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="refit and print the coefficients")
    args = parser.parse_args()
    if args.fit:
        worst, p, q = fit()
        print(f"max relative error {worst:.3e} (float64 evaluation)")
        print("ERF32_P =", tuple(float(numpy.float32(c)) for c in p))
        print("ERF32_Q =", tuple(float(numpy.float32(c)) for c in q))
        return
    sample = numpy.random.default_rng(0).uniform(-5, 5, 1 << 20).astype(numpy.float32)
    odd = numpy.array_equal(erf_float32(-sample), -erf_float32(sample))
    worst, worst_x, mean, count, per_range = sweep()
    print(f"{count:,} float32 values in [0, {ERF32_CLAMP}]: max error {worst:.3f} ulp at "
          f"x = {worst_x!r}, mean {mean:.3f} ulp; odd to the bit on a sample: {odd}")
    for (lo, hi), e in per_range.items():
        print(f"  [{lo}, {hi}): max {e:.3f} ulp")


if __name__ == "__main__":
    main()
