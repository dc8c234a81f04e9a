"""nanobert.model.special.erf against Python's math.erf: float64 to rounding level (relative error
for |x| < 1, absolute beyond), float32 to ~1 ulp, the symmetries and special values of erf,
and the contract of the function (dtype, shape, out=)."""
import math

import numpy
import pytest
from hypothesis import given, settings, strategies as st

from nanobert.model import special
from nanobert.backend import gpu_available
from nanobert.model.special import erf
from conftest import record

TOL64 = 4e-16          # float64: relative for |x| < 1, absolute elsewhere
TINY64 = numpy.finfo(numpy.float64).tiny

math_erf = numpy.frompyfunc(math.erf, 1, 1)


def reference(x):
    """math.erf elementwise, in float64 whatever x's dtype."""
    return math_erf(numpy.asarray(x, dtype=numpy.float64)).astype(numpy.float64)


def float64_errors(x):
    """(max relative error over |x| < 1, max absolute error over |x| >= 1) vs math.erf.
    Where erf(x) is subnormal a relative error means nothing: there the error is measured
    against the smallest normal number instead, i.e. it must be within a subnormal ulp."""
    got, want = erf(x), reference(x)
    diff = numpy.abs(got - want)
    small = numpy.abs(x) < 1
    rel = diff[small] / numpy.maximum(numpy.abs(want[small]), TINY64)
    return (float(rel.max()) if rel.size else 0.0,
            float(diff[~small].max()) if (~small).any() else 0.0)


def ulp_errors32(x):
    """|erf(x) - math.erf(x)| in float32 ulps of math.erf(x), for float32 x."""
    want = reference(x)
    ulp = numpy.spacing(numpy.abs(want).astype(numpy.float32)).astype(numpy.float64)
    return numpy.abs(erf(x).astype(numpy.float64) - want) / ulp


finite64 = st.floats(allow_nan=False, allow_infinity=False)
moderate64 = st.floats(min_value=-7.0, max_value=7.0)            # where erf is not +-1
batches64 = st.lists(st.one_of(finite64, moderate64), min_size=1, max_size=64)


@settings(max_examples=200, deadline=None)
@given(batches64)
def test_float64_matches_math_erf_to_rounding(values):
    x = numpy.array(values, dtype=numpy.float64)
    rel, abs_ = float64_errors(x)
    record("erf float64 relative error |x|<1 (hypothesis)", rel)
    record("erf float64 absolute error |x|>=1 (hypothesis)", abs_)
    assert rel <= TOL64, f"max relative error {rel:.3e} > {TOL64:.0e} for |x| < 1 in {values}"
    assert abs_ <= TOL64, f"max absolute error {abs_:.3e} > {TOL64:.0e} for |x| >= 1 in {values}"


def test_float64_sweep_error_is_at_rounding_level():
    rng = numpy.random.default_rng(0)
    x = numpy.concatenate([
        numpy.linspace(-8.0, 8.0, 2_000_001),                      # every branch and joint
        rng.uniform(-1.0, 1.0, 200_000) * 10.0 ** rng.uniform(-300, 0, 200_000),  # near 0
        1.0 + numpy.arange(-2000, 2000) * 2.0 ** -53,                  # the branch switch
        [5e-324, -5e-324, 1e-310, TINY64, 6.0, numpy.nextafter(6.0, 0.0)],
    ])
    rel, abs_ = float64_errors(x)
    record("erf float64 relative error |x|<1 (sweep)", rel)
    record("erf float64 absolute error |x|>=1 (sweep)", abs_)
    assert rel <= TOL64 and abs_ <= TOL64, (
        f"float64 sweep of {x.size} points: max relative error {rel:.3e} (|x| < 1), "
        f"max absolute error {abs_:.3e} (|x| >= 1); bound {TOL64:.0e}")


def test_float32_sweep_error_is_about_one_ulp():
    rng = numpy.random.default_rng(0)
    x = numpy.concatenate([numpy.linspace(-6.0, 6.0, 1_000_001, dtype=numpy.float32),
                           rng.uniform(-1.0, 1.0, 200_000).astype(numpy.float32)])
    err = ulp_errors32(x)
    worst = float(err.max())
    record("erf float32 error in ulps (sweep)", worst)
    # Computed in float32 arithmetic, so ~1 ulp at worst (measured: 1.26-1.30 ulp).
    assert worst <= 1.5, (f"float32 max error {worst:.3f} ulp at x = {x[err.argmax()]!r} "
                          f"(mean {err.mean():.3f} ulp)")


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False),
                min_size=1, max_size=64))
def test_float32_matches_math_erf_within_about_one_ulp(values):
    x = numpy.array(values, dtype=numpy.float32)
    worst = float(ulp_errors32(x).max())
    assert worst <= 1.5, f"float32 error {worst:.3f} ulp in {values}"


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_erf_is_exactly_odd(dtype, data):
    width = numpy.finfo(dtype).bits
    x = numpy.array(data.draw(st.lists(st.floats(width=width, allow_nan=False),
                                       min_size=1, max_size=64)), dtype=dtype)
    positive, negative = erf(x), erf(-x)
    assert numpy.array_equal(negative, -positive), (
        f"erf(-x) != -erf(x) at x = {x[negative != -positive]}")
    assert numpy.array_equal(numpy.signbit(positive), numpy.signbit(x))


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_erf_is_nondecreasing_on_sorted_sweeps(dtype):
    # Steps of 8 eps: the results carry up to ~1 ulp of rounding error, so at steps of a
    # single ulp near |x| = 1 (where erf' * ulp(x) < ulp(erf)) two neighbours can come out
    # 1 ulp out of order (measured: 1 in 60 such steps just below 1); what must hold is
    # that nothing jumps, within a branch or where the branches meet.
    one = dtype(1.0)
    step = 8 * numpy.finfo(dtype).eps
    sweeps = [numpy.linspace(-8.0, 8.0, 2_000_001, dtype=dtype),
              one + step * numpy.arange(-20_000, 20_000, dtype=dtype),      # branch switch
              dtype(special.ERF_ONE[numpy.dtype(dtype)]) + 512 * numpy.finfo(dtype).eps
              * numpy.arange(-20_000, 20_000, dtype=dtype)]                # clamp point
    for x in sweeps:
        x = numpy.sort(x)
        y = erf(x)
        drops = numpy.flatnonzero(numpy.diff(y) < 0)
        assert drops.size == 0, (f"{dtype.__name__}: erf decreases at {drops.size} of "
                                 f"{x.size} steps, first at x = {x[drops[0]]!r}: "
                                 f"{y[drops[0]]!r} -> {y[drops[0] + 1]!r}")


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_special_values(dtype):
    x = numpy.array([0.0, -0.0, numpy.inf, -numpy.inf, numpy.nan, 1e30, -1e30,
                     numpy.finfo(dtype).max, -numpy.finfo(dtype).max], dtype=dtype)
    y = erf(x)
    assert y.dtype == dtype
    assert y[0] == 0 and not numpy.signbit(y[0]), f"erf(0.0) = {y[0]!r}"
    assert y[1] == 0 and numpy.signbit(y[1]), f"erf(-0.0) = {y[1]!r}, sign lost"
    assert y[2] == 1 and y[3] == -1, f"erf(+-inf) = {y[2]!r}, {y[3]!r}"
    assert numpy.isnan(y[4]), f"erf(nan) = {y[4]!r}"
    assert list(y[5:]) == [1, -1, 1, -1], f"erf of huge values: {y[5:]}"


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_subnormals_keep_their_value(dtype):
    # erf(x) = 2x/sqrt(pi) for tiny x: within one subnormal ulp of the float64 reference.
    tiny = numpy.finfo(dtype).smallest_subnormal
    x = numpy.array([tiny, -tiny, 3 * tiny, 1000 * tiny, numpy.finfo(dtype).tiny], dtype=dtype)
    want = reference(x).astype(dtype)
    got = erf(x)
    assert numpy.all(numpy.abs(got.astype(float) - want.astype(float)) <= float(tiny)), (
        f"erf({x}) = {got}, math.erf gives {want}")


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
@pytest.mark.parametrize("shape", [(), (0,), (3, 0), (5,), (2, 3, 4)])
def test_dtype_and_shape_are_preserved(dtype, shape):
    x = numpy.random.default_rng(0).normal(0, 2, shape).astype(dtype)
    y = erf(x)
    assert type(y) is numpy.ndarray and y.dtype == dtype and y.shape == shape
    assert numpy.array_equal(y.reshape(-1), erf(x.reshape(-1)))


def test_python_scalars_and_lists_are_float64():
    assert erf(0.5).dtype == numpy.float64 and erf(0.5).shape == ()
    assert float(erf(0.5)) == pytest.approx(math.erf(0.5), rel=TOL64, abs=0)
    assert erf([0.0, 1.0]).dtype == numpy.float64


def test_non_float_dtypes_are_refused():
    for bad in (numpy.array([1, 2]), numpy.array([0.5], dtype=numpy.float16),
                numpy.array([1j])):
        with pytest.raises(ValueError, match=str(bad.dtype)):
            erf(bad)


def test_non_contiguous_input_and_out():
    x = numpy.random.default_rng(0).normal(0, 2, (40, 30))
    expected = erf(numpy.ascontiguousarray(x.T))
    assert numpy.array_equal(erf(x.T), expected)
    out = numpy.empty((30, 40))
    assert erf(x.T, out=out) is out and numpy.array_equal(out, expected)
    with pytest.raises(ValueError, match="out="):
        erf(x.T, out=numpy.empty((40, 30)).T)                    # right shape, not C order
    with pytest.raises(ValueError, match="out="):
        erf(x, out=numpy.empty((40, 30), dtype=numpy.float32))


def test_in_place_gives_the_same_result():
    x = numpy.random.default_rng(0).normal(0, 3, 10_000)
    expected = erf(x)
    assert erf(x, out=x) is x and numpy.array_equal(x, expected)


def test_blocks_do_not_change_the_result(monkeypatch):
    # Block edges must not matter: every block size gives the same bits, partial blocks too.
    x = numpy.random.default_rng(0).normal(0, 3, 1001)
    expected = erf(x)
    for block in (1, 7, 64, 1000):
        monkeypatch.setattr(special, "BLOCK", block)
        assert numpy.array_equal(erf(x), expected), f"BLOCK = {block} changes erf"


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a GPU")
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_cupy_matches_numpy(dtype):
    import cupy
    x = numpy.concatenate([numpy.linspace(-8, 8, 100_001), [0.0, -0.0, numpy.inf,
                           -numpy.inf, numpy.nan]]).astype(dtype)
    got = cupy.asnumpy(erf(cupy.asarray(x), cupy))
    want = erf(x)
    assert got.dtype == dtype
    # CuPy's exp is not NumPy's (CUDA's expf: 2 ulp): allow 2 ulp, special values exactly.
    ulps = numpy.abs(got - want) / numpy.spacing(numpy.abs(want))
    finite = numpy.isfinite(x)
    assert float(numpy.nanmax(ulps)) <= 2.0, f"CuPy vs NumPy: {numpy.nanmax(ulps)} ulp"
    assert numpy.array_equal(got[~finite], want[~finite], equal_nan=True)
    assert numpy.signbit(got[-4])
