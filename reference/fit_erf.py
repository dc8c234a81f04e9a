"""Fit the erfcx polynomials that nanobert/special.py uses for 1 <= |x| < ERF_ONE, and print
them as Python source to paste into special.py.

    python reference/fit_erf.py          # ~1 minute; needs mpmath only

For |x| >= 1, erf(x) = 1 - exp(-x^2) * erfcx(x). erfcx (the scaled complementary error
function) is smooth and slowly varying, but as a function of x it grows like exp(y^2) off
the real axis, so a polynomial in x needs ~20 terms. In u = (x - K) / (x + K) (Schonfelder,
"Chebyshev expansions for the error and related functions", Math. Comp. 32, 1978) the
interval [1, ERF_ONE] maps inside (-1, 1) away from x = inf (u = 1) and about 11 terms do.

What matters is the error of erf, i.e. the absolute error of erfc = exp(-x^2) * erfcx, so
the fit is weighted minimax: minimise max |exp(-x^2) * (R(u) - erfcx(x))|, by the Remez
exchange algorithm in 40-digit arithmetic (mpmath). The weight lets R be loose where
exp(-x^2) is tiny, which is what keeps the degree low.

ERF_ONE is where erfc(x) falls below half an ulp of 1 (2^-54 in float64, 2^-25 in float32):
there and beyond, erf rounds to exactly +-1, so special.py clamps |x| to ERF_ONE instead of
having a third branch.
"""
import mpmath as mp

mp.mp.dps = 40

K = 3               # u = (x - K)/(x + K); K = 3 needs the fewest terms of K in 1..6 (checked)
TARGETS = {         # dtype -> (ERF_ONE, max weighted error wanted: well under 1/2 ulp of 1)
    "float64": (6.0, mp.mpf(2) ** -57),     # erfc(6) = 2.2e-17 < 2^-54
    "float32": (4.0, mp.mpf(2) ** -32),     # erfc(4) = 1.5e-8  < 2^-25
}


def erfcx(x):
    return mp.exp(x * x) * mp.erfc(x)


def x_of_u(u):
    return K * (1 + u) / (1 - u)


def remez(f, weight, a, b, degree, grid_size=2000, iterations=40):
    """Minimax polynomial p (coefficients, lowest first) of `degree` for f on [a, b]
    with error weight `weight`: minimises max |weight(u) * (p(u) - f(u))|.
    Returns (coefficients, max weighted error on the grid)."""
    n = degree + 2
    # Chebyshev-distributed grid and initial reference (the extrema of T_{n-1}).
    grid = [(a + b) / 2 - (b - a) / 2 * mp.cos(mp.pi * i / (grid_size - 1))
            for i in range(grid_size)]
    f_grid = [f(u) for u in grid]
    w_grid = [weight(u) for u in grid]
    reference = [grid[round(i * (grid_size - 1) / (n - 1))] for i in range(n)]
    best = None
    for _ in range(iterations):
        # Solve p(u_i) + (-1)^i E / w(u_i) = f(u_i): the error equioscillates on the reference.
        A = mp.matrix(n, n)
        rhs = mp.matrix(n, 1)
        for i, u in enumerate(reference):
            for k in range(degree + 1):
                A[i, k] = u ** k
            A[i, n - 1] = (-1) ** i / weight(u)
            rhs[i] = f(u)
        solution = mp.lu_solve(A, rhs)
        coeffs = [solution[k] for k in range(degree + 1)]
        level = abs(solution[n - 1])
        error = [w * (mp.polyval(coeffs[::-1], u) - fu)
                 for u, fu, w in zip(grid, f_grid, w_grid)]
        max_error = max(abs(e) for e in error)
        if best is None or max_error < best[1]:
            best = (coeffs, max_error)
        if max_error <= level * (1 + mp.mpf("1e-4")):
            break                                   # equioscillation reached
        # Exchange: the largest |error| in each run of one sign becomes the new reference.
        extrema, start = [], 0
        for j in range(1, grid_size + 1):
            if j == grid_size or (error[j] > 0) != (error[start] > 0):
                extrema.append(max(range(start, j), key=lambda i: abs(error[i])))
                start = j
        if len(extrema) < n:
            break
        while len(extrema) > n:                     # drop the smaller end until n remain
            extrema.pop(0 if abs(error[extrema[0]]) < abs(error[extrema[-1]]) else -1)
        reference = [grid[j] for j in extrema]
    return best


def rounded_error(coeffs, to_dtype, a, b, points=4000):
    """Max weighted error after rounding the coefficients to the dtype special.py uses."""
    import numpy
    rounded = [mp.mpf(float(numpy.dtype(to_dtype).type(float(c)))) for c in coeffs]
    worst = 0
    for i in range(points):
        u = a + (b - a) * i / (points - 1)
        x = x_of_u(u)
        worst = max(worst, abs(mp.exp(-x * x) * (mp.polyval(rounded[::-1], u) - erfcx(x))))
    return worst


def main():
    for dtype, (erf_one, target) in TARGETS.items():
        a, b = mp.mpf(1 - K) / (1 + K), (erf_one - K) / (erf_one + K)
        for degree in range(2, 30):
            coeffs, err = remez(lambda u: erfcx(x_of_u(u)),
                                lambda u: mp.exp(-x_of_u(u) ** 2), a, b, degree)
            if err <= target:
                break
        print(f"# {dtype}: erfcx(x) ~ R(u), u = (x - {K})/(x + {K}), 1 <= x <= {erf_one}; "
              f"degree {degree}")
        print(f"# max |exp(-x^2) (R - erfcx)| = {mp.nstr(err, 3)} (Remez), "
              f"{mp.nstr(rounded_error(coeffs, dtype, a, b), 3)} with coefficients "
              f"rounded to {dtype}")
        print(f"_ERFCX_{dtype.upper()} = (   # u^0, u^1, ...")
        for c in coeffs:
            print(f"    {mp.nstr(c, 20, min_fixed=-1, max_fixed=1):>27},")
        print(")\n")


if __name__ == "__main__":
    main()
