"""The composite ops of ops.py, chains the fast layer runs fused: linear_gelu (the FFN's
up-projection and its GELU) and dropout_add_layernorm (a post-LN sublayer's Add & Norm).

- The reference: float64 central-difference gradient checks, in tests/test_ops_grad.py with
  every other op's (the learner's quick tier).
- The CPU twins (fast_cpu): bitwise the chain of the fast ops they fuse (the same arithmetic
  in other blocks), for any thread count; against the reference, bitwise in float64, and in
  float32 within the bounds of the ops they chain (GELU's erf_float32, LayerNorm's row sums:
  tests/test_fast.py).
- The GPU twins (fast_gpu) on the CPU stand-in of CuPy: the NumPy path's numbers, and the
  launches they save (the bias's rank-1 product and its gradient's ones product; Add & Norm's
  second kernel each way).
- The new CUDA kernels through the CUDA emulation: bias_gelu_forward, _backward bitwise the
  unfused kernels (gelu_forward, gelu_backward) on product + bias, within float64/float32/
  float16 bounds of the reference, the bias gradient's tile sums bitwise their order of
  additions and within a sum's error of float64; dropout_add_layernorm_forward, _backward
  bitwise the two-kernel chains; no write past an array's end.
"""
import re

import numpy
import pytest
from hypothesis import given, settings, strategies as st

import cuda_emulation
from conftest import assert_close, record
from nanobert import backend
from nanobert.model import counter_rng, fast, fast_cpu, fast_gpu, kernels, ops
from test_cuda_kernels import draw_arguments, draws, guarded, run, run_map, stats
from test_fast import LAYERNORM_BOUND, gelu_within_float32_bound, layernorm_errors, normal, same

SETTINGS = settings(max_examples=25, deadline=None)
dims = st.integers(1, 6)
seeds = st.integers(0, 2**31 - 1)
dtypes = st.sampled_from([numpy.float32, numpy.float64])

# ------------------------------------------------------------------------ the CPU twins


def into_buffers(*params, into=True):
    return tuple(numpy.empty_like(p) if into else None for p in params)


@SETTINGS
@given(n=dims, d_in=dims, d_out=st.one_of(dims, st.just(48)),
       kind=st.sampled_from(ops.GELU_KINDS), dtype=dtypes, scale=st.floats(0.1, 5.0),
       into=st.booleans(), seed=seeds)
def test_fast_linear_gelu_is_the_chain_of_fast_ops_and_the_reference(n, d_in, d_out, kind,
                                                                     dtype, scale, into, seed):
    """Bitwise fast.linear_forward then fast.gelu_forward (the bias added in GELU's blocks
    instead of the product's), and their backwards; bitwise the reference but in float32
    "gelu" (erf_float32: tests/test_fast.py's GELU bound on out, Phi and the linear's
    output gradient, which the same linear_backward then takes)."""
    x, w, b = (normal(seed, (2, n, d_in), dtype, scale), normal(seed + 1, (d_out, d_in), dtype),
               normal(seed + 2, d_out, dtype))
    dout = normal(seed + 3, (2, n, d_out), dtype)
    out, cache = fast.linear_gelu_forward(x, w, b, kind)
    y, linear = fast.linear_forward(x, w, b)
    chain_out, gelu = fast.gelu_forward(y, kind)
    same(out, chain_out, "linear_gelu out vs the fast chain")
    for name, a, e in zip(("x", "Phi"), cache.gelu[:2], gelu[:2]):
        same(a, e, f"linear_gelu cache {name} vs the fast chain")
    grads = fast.linear_gelu_backward(dout, cache, *into_buffers(w, b, into=into))
    chain = fast.linear_backward(fast.gelu_backward(dout, gelu), linear,
                                 *into_buffers(w, b, into=into))
    for name, g, r in zip(("dx", "dweight", "dbias"), grads, chain):
        same(g, r, f"linear_gelu {name} vs the fast chain")
    ref_out, ref_cache = ops.linear_gelu_forward(x, w, b, kind)
    ref_grads = ops.linear_gelu_backward(dout, ref_cache)
    same(cache.gelu[0], ref_cache.gelu[0], "linear_gelu the linear's output vs the reference")
    if kind == "gelu" and dtype is numpy.float32:
        dlinear = fast_cpu.bias_gelu_backward(dout, cache.gelu)[0]
        gelu_within_float32_bound(cache.gelu[0], dout, (out, cache.gelu[1], dlinear),
                                  (ref_out, ref_cache.gelu[1],
                                   ops.gelu_backward(dout, ref_cache.gelu)))
        float32_gradients_within_bound(x, w, dout, grads, ref_grads)
        return
    same(out, ref_out, "linear_gelu out vs the reference")
    for name, g, r in zip(("dx", "dweight", "dbias"), grads, ref_grads):
        same(g, r, f"linear_gelu {name} vs the reference")


def float32_gradients_within_bound(x, w, dout, grads, ref_grads):
    """dx, dweight, dbias of float32 "gelu" from the linear's output gradients dy, which
    differ by at most 2^-21 |dout| (the GELU bound); each a K-term sum of |dy| <= 1.13 |dout|
    (Phi + x phi) times an input, rounded in float32: within (2^-21 + 1.2 K 2^-24) of the sum
    of |dout| times |input|, elementwise."""
    x2, dout2 = (numpy.abs(a.reshape(-1, a.shape[-1]).astype(float)) for a in (x, dout))
    scales = {"dx": (dout2 @ numpy.abs(w.astype(float)), dout2.shape[1]),
              "dweight": (dout2.T @ x2, dout2.shape[0]),
              "dbias": (dout2.sum(axis=0), dout2.shape[0])}
    for (name, (scale, K)), g, r in zip(scales.items(), grads, ref_grads):
        bound = 2.0**-21 + 1.2 * K * 2.0**-24
        excess = numpy.abs(g.reshape(scale.shape) - r.reshape(scale.shape)) / (scale + 1e-30)
        record(f"fast vs reference float32 linear_gelu {name} (of its bound)",
               float(excess.max()) / bound)
        assert (excess <= bound).all(), f"float32 linear_gelu {name}: {excess.max():.3e}"


@SETTINGS
@given(n=st.integers(1, 40), h=st.one_of(st.integers(1, 9), st.just(48)), dtype=dtypes,
       p=st.sampled_from([0.0, 0.1, 0.5]), training=st.booleans(), scale=st.floats(1e-2, 1e2),
       into=st.booleans(), seed=seeds)
def test_fast_dropout_add_layernorm_is_the_chain_of_fast_ops_and_the_reference(
        n, h, dtype, p, training, scale, into, seed):
    """Bitwise fast.dropout_add_forward then fast.layernorm_forward from the same draw (the
    sum made and normalised block by block) and their backwards; against the reference the
    same mask and sum (bitwise), LayerNorm within tests/test_fast.py's LAYERNORM_BOUND."""
    x, residual = normal(seed, (n, 2, h), dtype, scale), normal(seed + 1, (n, 2, h), dtype)
    gamma, beta = normal(seed + 2, h, dtype), normal(seed + 3, h, dtype)
    dout = normal(seed + 4, x.shape, dtype)
    x_before, residual_before = x.copy(), residual.copy()

    def rng():
        return numpy.random.default_rng(seed)
    out, cache = fast.dropout_add_layernorm_forward(x, residual, gamma, beta, 1e-12, p, rng(),
                                                    training)
    same(x, x_before, "x after the forward")
    same(residual, residual_before, "residual after the forward")
    y, mask = fast.dropout_add_forward(x.copy(), residual, p, rng(), training)
    chain_out, layernorm = fast.layernorm_forward(y, gamma, beta, 1e-12)
    assert (cache.dropout_mask is None) == (mask is None) == (not training or p == 0.0)
    if mask is not None:
        same(cache.dropout_mask, mask, "dropout_add_layernorm mask vs the fast chain")
    same(out, chain_out, "dropout_add_layernorm out vs the fast chain")
    for name, a, e in zip(("xhat", "gamma", "rstd"), cache.layernorm, layernorm):
        same(a, e, f"dropout_add_layernorm cache {name} vs the fast chain")
    grads = fast.dropout_add_layernorm_backward(dout, cache, *into_buffers(gamma, beta,
                                                                            into=into))
    dsum, dgamma, dbeta = fast.layernorm_backward(dout, layernorm, *into_buffers(gamma, beta,
                                                                                  into=into))
    chain = (fast.dropout_backward(dsum, mask), dsum, dgamma, dbeta)
    for name, g, r in zip(("dx", "dresidual", "dgamma", "dbeta"), grads, chain):
        same(g, r, f"dropout_add_layernorm {name} vs the fast chain")
    ref_y, ref_mask = ops.dropout_add_forward(x, residual, p, rng(), training)
    same(y, ref_y, "dropout_add_layernorm the sum vs the reference")
    if ref_mask is not None:
        same(cache.dropout_mask, ref_mask, "dropout_add_layernorm mask vs the reference")
    for name, err in layernorm_errors(ref_y, gamma, beta, dout).items():
        record(f"fast vs reference dropout_add_layernorm {name} (H eps (1 + kappa) of its "
               "scale)", err)
        assert err <= LAYERNORM_BOUND, f"dropout_add_layernorm {name}: {err:.3e}"


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_fused_blocks_on_threads_are_bitwise_the_chain(monkeypatch, dtype):
    """Arrays of several blocks (GELU's 2^17 elements, LayerNorm's 2^18) on 3 threads and on
    1: dropout_add_layernorm the same bits either way and the chain's; linear_gelu the
    chain's at each count (its product is split over the threads: pooled_matmul's bits
    depend on their number)."""
    rows, H, I = 3001, 128, 96
    x, residual = normal(1, (rows, H), dtype), normal(2, (rows, H), dtype)
    gamma, beta, dout = normal(3, H, dtype), normal(4, H, dtype), normal(5, (rows, H), dtype)
    w, b, dinter = normal(6, (I, H), dtype, 0.1), normal(7, I, dtype), normal(8, (rows, I), dtype)
    results = {}
    for count in ("3", "1"):
        monkeypatch.setenv("NANOBERT_THREADS", count)
        out, cache = fast.dropout_add_layernorm_forward(x, residual, gamma, beta, 1e-12, 0.1,
                                                        numpy.random.default_rng(9), True)
        grads = fast.dropout_add_layernorm_backward(dout, cache)
        y, mask = fast.dropout_add_forward(x, residual, 0.1, numpy.random.default_rng(9), True)
        chain_out, layernorm = fast.layernorm_forward(y, gamma, beta, 1e-12)
        dsum = fast.layernorm_backward(dout, layernorm)[0]
        same(out, chain_out, f"add & norm out vs the chain, {count} threads")
        same(grads[0], fast.dropout_backward(dsum, mask), f"add & norm dx, {count} threads")
        results[count] = (out, *grads)
        inter, gelu_cache = fast.linear_gelu_forward(out, w, b)
        chain_inter, chain_gelu = fast.gelu_forward(fast.linear_forward(out, w, b)[0])
        same(inter, chain_inter, f"linear_gelu out vs the chain, {count} threads")
        same(fast_cpu.bias_gelu_backward(dinter, gelu_cache.gelu)[0],
             fast.gelu_backward(dinter, chain_gelu), f"linear_gelu dlinear, {count} threads")
        same(fast.linear_gelu_forward(out, w, b, cache=False)[0], inter,
             f"linear_gelu_forward without a cache vs with, {count} threads")
    for a, e in zip(results["3"], results["1"]):
        same(a, e, "add & norm, 3 threads vs 1")


def test_float16_runs_the_chain_in_float32_statistics():
    """float16 on NumPy: the chains of the fast ops (float16 products, adds and dropout,
    LayerNorm and GELU in float32), bitwise."""
    rng = numpy.random.default_rng(0)
    half = numpy.float16
    x, residual, dout = (rng.standard_normal((5, 8)).astype(half) for _ in range(3))
    gamma, beta = rng.standard_normal(8).astype(half), rng.standard_normal(8).astype(half)
    w, b = rng.standard_normal((6, 8)).astype(half), rng.standard_normal(6).astype(half)
    out, cache = fast.linear_gelu_forward(x, w, b)
    same(out, fast.gelu_forward(fast.linear_forward(x, w, b)[0])[0], "float16 linear_gelu")
    out, cache = fast.dropout_add_layernorm_forward(x, residual, gamma, beta, 1e-12, 0.2,
                                                    numpy.random.default_rng(1), True)
    y, mask = fast.dropout_add_forward(x, residual, 0.2, numpy.random.default_rng(1), True)
    same(out, fast.layernorm_forward(y, gamma, beta, 1e-12)[0], "float16 add & norm")
    dx = fast.dropout_add_layernorm_backward(dout, cache)[0]
    same(dx, fast.dropout_backward(fast.layernorm_backward(dout, cache.layernorm)[0], mask),
         "float16 add & norm dx")

# ------------------------------------------------------------------------ the GPU twins



def gpu_linear_gelu(xp, dtype, kind, seed=0, N=6, d_in=5, d_out=40):
    """fast.linear_gelu_forward + _backward on namespace xp -> (out, dx, dweight, dbias) on
    the host; the gradients into float32 buffers for float16 (the model's)."""
    rng = numpy.random.default_rng(seed)
    x = (rng.standard_normal((2, N, d_in)) * 2).astype(dtype)
    w, b = (rng.standard_normal(shape).astype(dtype) for shape in ((d_out, d_in), d_out))
    dout = rng.standard_normal((2, N, d_out)).astype(dtype)
    put = (lambda a: a) if xp is numpy else xp.asarray
    master = numpy.float32 if dtype == numpy.float16 else dtype
    dweight, dbias = xp.zeros(w.shape, master), xp.zeros(b.shape, master)
    out, cache = fast.linear_gelu_forward(put(x), put(w), put(b), kind)
    grads = fast.linear_gelu_backward(put(dout), cache, dweight, dbias)
    return [backend.to_host(a) for a in (out, *grads)]


@pytest.mark.parametrize("kind", ["gelu", "gelu_new"])
@pytest.mark.parametrize("dtype, tol", [(numpy.float64, 1e-13), (numpy.float32, 2e-6),
                                        (numpy.float16, 2e-2)])
def test_gpu_linear_gelu_gives_the_numpy_numbers_in_two_launches(dtype, tol, kind):
    """The CuPy path: the product (one cuBLAS call, no rank-1 product for the bias) and one
    map kernel forward; backward GELU's kernel with dbias's tile sums, the kernel adding
    them, and the 2 cuBLAS calls of dx and dweight. Against
    the NumPy path: float64 within 1e-13, float32 within erf_float32's ulps (2e-6), float16
    within a float16 rounding of results that then enter products (2e-2 of the largest)."""
    cupy_standin = pytest.importorskip("cupy_standin")
    expected = gpu_linear_gelu(numpy, dtype, kind)
    with cupy_standin.installed() as cupy:
        cupy.counts.reset()
        actual = gpu_linear_gelu(cupy, dtype, kind)
        kernels = dict(cupy.counts.kernels)
    name = f"stand-in vs NumPy linear_gelu[{kind}] {numpy.dtype(dtype).name}"
    for what, a, e in zip(("out", "dx", "dweight", "dbias"), actual, expected):
        assert a.dtype == e.dtype, (what, a.dtype, e.dtype)
        assert_close(a, e, tol, f"{name} {what}")
    if kind == "gelu":
        assert kernels.get("RawKernel:nanobert_bias_gelu_forward") == 1, kernels
        assert kernels.get("RawKernel:nanobert_bias_gelu_backward") == 1, kernels
        assert kernels.get("RawKernel:nanobert_column_partials") == 1, kernels
        # the product, then dx and dweight: 3 (dbias from the GELU kernel's tile sums, no
        # ones @ dout); linear_forward + gelu + linear_backward: 5
        assert kernels.get("cublas.gemmStridedBatchedEx") == 3, kernels
        assert "ndarray.astype" not in kernels or dtype == numpy.float16, kernels


@pytest.mark.parametrize("p", [0.0, 0.25])
@pytest.mark.parametrize("dtype", [numpy.float64, numpy.float32, numpy.float16])
def test_gpu_dropout_add_layernorm_is_the_chain_of_its_gpu_ops(dtype, p):
    """The CuPy path: one row kernel forward (kernels.cu's dropout_add_layernorm_forward),
    one backward (+ the two column sums), bitwise the chain dropout_add_forward then
    layernorm_forward (2 launches) and layernorm_backward then dropout_backward (+1 launch
    with dropout) from the same seed; without dropout the NumPy path's numbers (float64
    within 1e-13, float32 1e-5, float16 2e-3)."""
    cupy_standin = pytest.importorskip("cupy_standin")
    rng = numpy.random.default_rng(4)
    x, residual, dout = (rng.standard_normal((3, 5, 40)).astype(dtype) for _ in range(3))
    gamma, beta = (rng.standard_normal(40).astype(dtype) for _ in range(2))
    with cupy_standin.installed() as cupy:
        device = [cupy.asarray(a) for a in (x, residual, gamma, beta, dout)]
        for _ in range(2):             # the first call fills the cached ones vectors: once
            cupy.counts.reset()
            out, cache = fast.dropout_add_layernorm_forward(*device[:4], 1e-12, p,
                                                            counter_rng.default_rng(cupy, 7), True)
            fused_forward = cupy.counts.kernel_launches
            grads = fast.dropout_add_layernorm_backward(device[4], cache)
            fused_backward = cupy.counts.kernel_launches - fused_forward
        cupy.counts.reset()
        y, mask = fast.dropout_add_forward(*device[:2], p, counter_rng.default_rng(cupy, 7), True)
        chain_out, layernorm = fast.layernorm_forward(y, *device[2:4], 1e-12)
        chain_forward = cupy.counts.kernel_launches
        dsum, dgamma, dbeta = fast.layernorm_backward(device[4], layernorm)
        chain = (fast.dropout_backward(dsum, mask), dsum, dgamma, dbeta)
        chain_backward = cupy.counts.kernel_launches - chain_forward
        launches = (fused_forward, fused_backward, chain_forward, chain_backward)
        assert launches == (1, 3, 2, 3 + (p > 0)), launches
        same(out.get(), chain_out.get(), "GPU add & norm out vs its chain")
        for g, r in zip(grads, chain):
            same(g.get(), r.get(), "GPU add & norm gradient vs its chain")
        actual = [a.get() for a in (out, *grads)]
    if p == 0.0:
        out, cache = fast.dropout_add_layernorm_forward(x, residual, gamma, beta, 1e-12, p,
                                                        None, True)
        expected = (out, *fast.dropout_add_layernorm_backward(dout, cache))
        tol = {numpy.float64: 1e-13, numpy.float32: 1e-5, numpy.float16: 2e-3}[dtype]
        for a, e in zip(actual, expected):
            assert_close(a.astype(float), e.astype(float), tol,
                         f"stand-in vs NumPy add & norm {numpy.dtype(dtype).name}")

# ------------------------------------------------------------------ the CUDA kernels


needs_gxx = pytest.mark.skipif(not cuda_emulation.available(),
                               reason="g++ is needed to run the CUDA kernels on the CPU")
DTYPES = [numpy.float64, numpy.float32, numpy.float16]
BOUND = {numpy.float64: 1e-13, numpy.float32: 3e-6, numpy.float16: 2e-3}   # as test_cuda_kernels


def run_columns(name, dtype, grid_and_block, *args):
    """The column kernel on NumPy arrays, launched as fast_gpu._launch_columns launches it."""
    (grid,), (block,) = grid_and_block
    guarded(name, dtype, grid, block, args)


def in_turn(terms, dtype):
    """terms [n, columns] added one row after another in dtype, from 0 -> [columns]."""
    total = numpy.zeros(terms.shape[1:], dtype)
    for term in terms:
        total = total + term
    return total


@needs_gxx
@settings(max_examples=12, deadline=None)
@given(rows=st.one_of(st.integers(1, 11), st.integers(60, 700)),
       columns=st.one_of(st.integers(1, 40), st.integers(250, 700)),
       seed=st.integers(0, 2**16), dtype=st.sampled_from(DTYPES))
def test_bias_gelu_kernels_are_the_gelu_kernels_on_product_plus_bias(rows, columns, seed,
                                                                     dtype):
    """bias_gelu_forward(product, bias) is bitwise gelu_forward(product + bias rounded to the
    dtype), and bias_gelu_backward(dout, product, bias)'s dx bitwise gelu_backward(dout, that
    x, gelu_forward's Phi): Phi recomputed as the forward made it. Against the float64
    reference within BOUND. Rows shorter than a block's width (columns < 256: a thread's
    elements cross several rows) and longer; lengths that end inside a thread's elements;
    one tile of BIAS_ROWS rows and several (the last one partial). The bias gradient: each
    tile's column sums of dx in row order, then the tiles' (column_partials: warp w of 8 adds
    tiles w, w + 8, ..., then the warps' sums in order), bitwise that order of additions in
    the statistics' dtype; against the float64 column sums of dx within a float32 (float64)
    sum's error."""
    rng = numpy.random.default_rng(seed)
    n = rows * columns
    product = (rng.standard_normal((rows, columns)) * 2).astype(dtype)
    bias, dout = rng.standard_normal(columns).astype(dtype), rng.standard_normal(n).astype(dtype)
    y = numpy.empty(n, dtype)
    run_map("bias_gelu_forward", dtype, n, product, bias, numpy.int64(columns), numpy.int64(n), y)
    x = (product + bias).reshape(-1)                       # rounded to dtype, as the reference
    unfused, cdf = numpy.empty(n, dtype), numpy.empty(n, stats(dtype))
    run_map("gelu_forward", dtype, n, x, numpy.int64(n), unfused, cdf)
    same(y, unfused, "bias_gelu_forward vs gelu_forward of product + bias")
    # erf's error is absolute (a few ulp of 1): y's is x times it, dx's dout times it; so
    # each against the largest |x| (|dout|), not the largest |y| (|dx|), which may be tiny
    expected = ops.gelu_forward(x.astype(numpy.float64))[0]
    err = record(f"cuda kernel bias_gelu y {numpy.dtype(dtype).name} (of max |x|)",
                 max_error(y, expected, x))
    assert err <= BOUND[dtype], err
    S = stats(dtype)
    tiles = fast_gpu._column_tiles(rows)
    dx, partials = numpy.empty(n, dtype), numpy.empty((tiles, columns), S)
    run_columns("bias_gelu_backward", dtype, fast_gpu._column_tile_grid(rows, columns), dout,
                product, bias, numpy.int64(rows), numpy.int32(columns), dx, partials)
    unfused_dx = numpy.empty(n, dtype)
    run_map("gelu_backward", dtype, n, dout, x, cdf, numpy.int64(n), unfused_dx)
    same(dx, unfused_dx, "bias_gelu_backward vs gelu_backward")
    expected_dx = ops.gelu_backward(dout.astype(numpy.float64),
                                    (x.astype(numpy.float64), cdf.astype(numpy.float64), "gelu"))
    err = record(f"cuda kernel bias_gelu dx {numpy.dtype(dtype).name} (of max |dout|)",
                 max_error(dx, expected_dx, dout))
    assert err <= BOUND[dtype], err

    dbias = numpy.empty(columns, S)
    run_columns("column_partials", dtype, fast_gpu._partials_grid(columns), partials,
                numpy.int64(tiles), numpy.int64(columns), dbias)
    rows_of_dx = dx.reshape(rows, columns).astype(S)
    tile_sums = numpy.stack([in_turn(rows_of_dx[t:t + kernels.BIAS_ROWS], S)
                             for t in range(0, rows, kernels.BIAS_ROWS)])
    same(partials, tile_sums, "bias_gelu_backward's tile sums vs row-order additions")
    warps = kernels.MAP_THREADS // 32                  # warp w: tiles w, w + warps, ...
    warp_sums = numpy.stack([in_turn(tile_sums[w::warps], S) for w in range(warps)])
    same(dbias, in_turn(warp_sums, S), "column_partials vs its order of additions")
    # a sum of `rows` terms in S: error within rows ulp of S of the sum of |dx|
    exact = rows_of_dx.astype(numpy.float64).sum(axis=0)
    err = record(f"cuda kernel bias_gelu dbias {numpy.dtype(dtype).name} vs float64 sums "
                 f"(of the sums of |dx|)",
                 max_error(dbias, exact, numpy.abs(rows_of_dx.astype(float)).sum(axis=0)))
    assert err <= rows * numpy.finfo(S).eps, err


def test_the_bias_rows_are_kernels_py_s():
    """fast_gpu sizes the partial sums by kernels.py's BIAS_ROWS: kernels.cu's constant."""
    found = re.search(r"constexpr int BIAS_ROWS = (\d+);", kernels.CUDA_SOURCE.read_text())
    assert found and int(found.group(1)) == kernels.BIAS_ROWS


def max_error(actual, expected, scale):
    """max |actual - expected| / max |scale|."""
    return float(numpy.abs(actual.astype(float) - expected).max()
                 / max(numpy.abs(scale.astype(float)).max(), 1e-300))


@needs_gxx
@settings(max_examples=16, deadline=None)
@given(rows=st.integers(1, 11), H=st.one_of(st.integers(1, 80), st.integers(200, 300)),
       seed=st.integers(0, 2**16), dtype=st.sampled_from(DTYPES),
       p=st.sampled_from([0.0, 0.1, 0.5]), draw=draws, padded=st.booleans())
def test_add_and_norm_kernels_are_bitwise_the_chain_of_kernels(rows, H, seed, dtype, p, draw,
                                                               padded):
    """dropout_add_layernorm_forward (one row kernel) is bitwise dropout (its add_residual
    form; without dropout x + residual rounded to the dtype) then layernorm_forward, out,
    xhat and rstd; dropout_add_layernorm_backward bitwise layernorm_backward then
    dropout_backward, dx, dresidual and dout * xhat. Rows that leave a block's warps idle,
    lengths that are no multiple of 32 or 4 (a row starting inside a Philox block), padded
    rows (x and residual the same value across the row: variance 0, rstd 1/sqrt(eps))."""
    rng = numpy.random.default_rng(seed)
    x, residual, dout = ((rng.standard_normal((rows, H)) * 2).astype(dtype) for _ in range(3))
    if padded:
        x[-1], residual[-1] = 0, residual[-1, 0]
    gamma, beta = (rng.standard_normal(H).astype(dtype) for _ in range(2))
    S, dropout = stats(dtype), p > 0
    arguments = draw_arguments(draw, dtype, p if dropout else 0.5)
    shaped = [lambda: numpy.empty((rows, H), S), lambda: numpy.empty((rows, H), dtype),
              lambda: numpy.empty((rows, 1), S)]
    fused, chain = [make() for make in shaped], [make() for make in shaped]
    run("dropout_add_layernorm_forward", dtype, rows, x, residual, *arguments,
        numpy.int32(dropout), gamma, beta, S(1e-12), numpy.int64(rows), numpy.int32(H), *fused)
    y = x + residual                                   # rounded to dtype, as CuPy's add
    if dropout:
        run_map("dropout", dtype, x.size, x, *arguments, numpy.int32(1), residual,
                numpy.int64(x.size), y)
    run("layernorm_forward", dtype, rows, y, gamma, beta, S(1e-12), numpy.int64(rows),
        numpy.int32(H), *chain)
    for name, a, e in zip(("xhat", "out", "rstd"), fused, chain):
        same(a, e, f"add & norm kernel {name} vs dropout then layernorm_forward")
    xhat, _, rstd = fused

    dx, dresidual = numpy.full((rows, H), numpy.nan, dtype), numpy.empty((rows, H), dtype)
    dout_xhat = numpy.empty((rows, H), S)
    run("dropout_add_layernorm_backward", dtype, rows, dout, gamma, xhat, rstd,
        numpy.int64(rows), numpy.int32(H), *arguments, numpy.int32(dropout), dx, dresidual,
        dout_xhat)
    chain_dsum, chain_dout_xhat = numpy.empty((rows, H), dtype), numpy.empty((rows, H), S)
    run("layernorm_backward", dtype, rows, dout, gamma, xhat, rstd, numpy.int64(rows),
        numpy.int32(H), chain_dsum, chain_dout_xhat)
    same(dresidual, chain_dsum, "add & norm kernel dresidual vs layernorm_backward's dx")
    same(dout_xhat, chain_dout_xhat, "add & norm kernel dout * xhat vs layernorm_backward's")
    if dropout:
        chain_dx = numpy.empty((rows, H), dtype)
        run_map("dropout_backward", dtype, x.size, chain_dsum, *arguments[:6],
                numpy.int64(x.size), chain_dx)
        same(dx, chain_dx, "add & norm kernel dx vs dropout_backward of layernorm_backward's")
    else:
        assert numpy.isnan(dx).all(), "without dropout dx is dresidual: the kernel leaves it"
