"""fast.py (what the model runs) equals ops.py (the reference: what the gradient checks and
the parity tests check), op by op, on hypothesis-drawn shapes and values, float32 and
float64: every forward output, every cache entry the model reads, every backward gradient.

Bitwise (numpy.array_equal) wherever the fast function does the reference's arithmetic in
the same order, only in other memory (in place, out=, a view written by a matmul): every op
but LayerNorm and the losses, and every loss in float64. Within a stated bound (LayerNorm,
float32 losses, the cross-entropy's gradient), because the fast twin orders its roundings
otherwise:
- LayerNorm: the row means are einsum's sums, not NumPy's pairwise ones (LAYERNORM_BOUND).
- cross-entropy dlogits: the fast backward scales exp(x - max) by dloss / (denominator *
  sum) and subtracts dloss / denominator at the label; the reference forms softmax - onehot,
  then scales. Each entry is (dloss / denominator) times an O(1) difference, so the bound is
  2 eps of that scale, elementwise (measured over 20,000 draws: 1.0 eps in float32 and
  float64). Relative to the largest gradient it would be no bound at all: where every
  counted row is saturated the gradients are themselves rounding-sized (0.94 measured).
- matmuls past fast_cpu.POOLED_MATMUL_MNK run as row or column blocks on the thread pool: within
  the rounding of a K-term sum (test_pooled_matmul_is_the_product_within_rounding); the linear
  tests draw smaller shapes, so there the product is one BLAS call, bitwise.
- float32 losses: the fast loss is float(sum) / n in float64 (device_loss: a Python float),
  the reference's sum / n rounded to float32: one float32 rounding, bound 2^-23 relative
  (measured: 5.1e-8 cross-entropy, 5.6e-8 MSE, 5.7e-8 BCE).
Then the whole model: BertForPreTraining with the reference in the place of the fast layer.
"""
import time

import numpy
import pytest
from hypothesis import given, settings, strategies as st

from conftest import record
from nanobert.model import active, fast, fast_cpu, ops, threads
from nanobert.model.special import erf

SETTINGS = settings(max_examples=25, deadline=None)
dims = st.integers(1, 6)
seeds = st.integers(0, 2**31 - 1)
dtypes = st.sampled_from([numpy.float32, numpy.float64])
FLOAT32_LOSS_BOUND = 2.0**-23     # one float32 rounding (see above)


def same(actual, expected, name):
    """Bitwise equal: same dtype, shape and bits (NaNs included)."""
    actual, expected = numpy.asarray(actual), numpy.asarray(expected)
    assert actual.dtype == expected.dtype, f"{name}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    if not numpy.array_equal(actual, expected, equal_nan=True):
        err = numpy.abs(actual.astype(float) - expected).max()
        raise AssertionError(f"{name}: not bitwise equal, max difference {err:.3e}")


def close(actual, expected, bound, name):
    """max |actual - expected| / max |expected| <= bound (recorded: printed after the run)."""
    actual, expected = numpy.asarray(actual), numpy.asarray(expected)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    scale = max(float(numpy.abs(expected).max(initial=0.0)), 1e-30)
    err = record(f"fast vs reference {name}",
                 float(numpy.abs(actual.astype(float) - expected).max(initial=0.0)) / scale)
    assert err <= bound, f"{name}: relative error {err:.3e} > {bound:.0e}"


def normal(seed, shape, dtype, scale=1.0):
    return (scale * numpy.random.default_rng(seed).standard_normal(shape)).astype(dtype)

# ------------------------------------------------------------------------ the contract


def test_ops_with_no_trick_to_add_have_no_twin_and_run_as_the_reference():
    """An op is written once: where the fast layer adds nothing, fast.py has no copy of it and
    the fast mode runs ops.py's (active.py's fallback; every twin: tests/test_twins.py)."""
    for name in ("embedding_forward", "embedding_backward", "tanh_forward", "tanh_backward",
                 "attention_mask_bias", "mse_backward", "bce_with_logits_backward"):
        assert not hasattr(fast, name) and name in active.missing_twins(), name
        assert getattr(active, name) is getattr(ops, name), name
    assert fast_cpu.dropout_backward is ops.dropout_backward   # a twin on CuPy only

# ---------------------------------------------------------------------------------- ops


def same_backward(op, names, dout, cache, ref_cache, params, into):
    """fast.<op>_backward and ops.<op>_backward, each from its own forward's cache, give the
    same gradients; into: both write the parameter gradients into given buffers (fresh ones
    shaped like `params`, as the model's flat gradient views are)."""
    def buffers():
        return tuple(numpy.empty_like(p) if into else None for p in params)
    grads = getattr(fast, op + "_backward")(dout, cache, *buffers())
    refs = getattr(ops, op + "_backward")(dout, ref_cache, *buffers())
    for name, g, r in zip(names, grads, refs):
        same(g, r, f"{op} {name}")


@SETTINGS
@given(n=dims, d_in=dims, d_out=dims, dtype=dtypes, into=st.booleans(), seed=seeds)
def test_linear(n, d_in, d_out, dtype, into, seed):
    x, w, b = normal(seed, (2, n, d_in), dtype), normal(seed + 1, (d_out, d_in), dtype), \
        normal(seed + 2, d_out, dtype)
    dout = normal(seed + 3, (2, n, d_out), dtype)
    out, cache = fast.linear_forward(x, w, b)
    ref_out, ref_cache = ops.linear_forward(x, w, b)
    same(out, ref_out, "linear out")
    same_backward("linear", ("dx", "dweight", "dbias"), dout, cache, ref_cache, (w, b), into)


@SETTINGS
@given(n=dims, h=st.one_of(st.integers(1, 9), st.sampled_from([48, 384])), dtype=dtypes,
       scale=st.floats(1e-3, 1e3), into=st.booleans(), seed=seeds)
def test_layernorm(n, h, dtype, scale, into, seed):
    """Within LAYERNORM_BOUND: the fast twin sums each row in einsum's order (row_mean),
    the reference in NumPy's pairwise order; everything else is the same arithmetic."""
    x = normal(seed, (n, 2, h), dtype, scale) + dtype(numpy.random.default_rng(seed).normal())
    gamma, beta = normal(seed + 1, h, dtype), normal(seed + 2, h, dtype)
    dout = normal(seed + 3, x.shape, dtype)
    for name, err in layernorm_errors(x, gamma, beta, dout, into).items():
        record(f"fast vs reference layernorm {name} (H eps (1 + kappa) of its scale)", err)
        assert err <= LAYERNORM_BOUND, f"layernorm {name}: {err:.3e} > {LAYERNORM_BOUND}"


# A sum of H terms is off by at most ~H eps of the sum of their magnitudes, in either order,
# so the fast and reference row means differ by up to 2 H eps mean|x|, and x - mean carries
# that into xhat as 2 H eps kappa, kappa = max over rows of mean|x| / std (the cancellation
# in x - mean: ~1 for centred rows, 1e3 for rows of spread 1e-3 about 1). Every result then
# differs by up to LAYERNORM_BOUND = 2 units of H eps (1 + kappa) times its scale: the size of
# the terms it is made of, not of the result, which may cancel (dx, dgamma). Measured over
# 40,000 draws, H 1 to 384: at most 0.29 (float64 out), 0.16 (float32 rstd).
LAYERNORM_BOUND = 2.0


def layernorm_errors(x, gamma, beta, dout, into=False):
    """{result: max |fast - reference| / (H eps (1 + kappa) scale)} for one LayerNorm
    forward and backward, each side from its own forward's cache. Checks on the way that
    gamma and dbeta (the same arithmetic) are bitwise, and dgamma bitwise sum(dout * xhat)."""
    def buffers():
        return (numpy.empty_like(gamma), numpy.empty_like(gamma)) if into else (None, None)
    H = x.shape[-1]
    out, cache = fast.layernorm_forward(x, gamma, beta, 1e-12)
    ref_out, ref_cache = ops.layernorm_forward(x, gamma, beta, 1e-12)
    xhat, _, rstd = ref_cache
    dx, dgamma, dbeta = fast.layernorm_backward(dout, cache, *buffers())
    ref_dx, ref_dgamma, ref_dbeta = ops.layernorm_backward(dout, ref_cache, *buffers())
    same(cache[1], gamma, "layernorm cache gamma")
    same(dbeta, ref_dbeta, "layernorm dbeta")
    same(dgamma, (dout * cache[0]).reshape(-1, H).sum(axis=0), "layernorm dgamma")
    kappa = float((numpy.abs(x).mean(axis=-1, keepdims=True) * rstd).max())
    unit = H * float(numpy.finfo(x.dtype).eps) * (1 + kappa)
    xhat_size = 1 + float(numpy.abs(xhat).max())
    scales = {"out": float(numpy.abs(gamma).max()) * xhat_size, "xhat": xhat_size,
              "rstd": float(rstd.max()),
              "dx": float((rstd * numpy.abs(dout * gamma).max(axis=-1, keepdims=True)).max())
              * xhat_size ** 2,
              "dgamma": float(numpy.abs(dout).reshape(-1, H).sum(axis=0).max()) * xhat_size}
    pairs = {"out": (out, ref_out), "xhat": (cache[0], xhat), "rstd": (cache[2], rstd),
             "dx": (dx, ref_dx), "dgamma": (dgamma, ref_dgamma)}
    return {name: float(numpy.abs(actual.astype(float) - expected).max())
            / max(unit * scales[name], 1e-300) for name, (actual, expected) in pairs.items()}


@SETTINGS
@given(n=dims, kind=st.sampled_from(ops.GELU_KINDS), dtype=dtypes, scale=st.floats(0.1, 10.0),
       seed=seeds)
def test_gelu(n, kind, dtype, scale, seed):
    """Bitwise, but float32 "gelu", whose erf is erf_float32 (8 ulp) instead of the
    reference's (1.3 ulp): Phi = (1 + erf) / 2 then differs by at most (8 + 1.3) / 2 ulp of
    erf plus one rounding of the sum: GELU_FLOAT32_BOUND (2^-21) absolute; x Phi by that
    times |x|, and the gradient (Phi + x phi) dout by that times |dout|, plus their own
    roundings (measured on 2M draws: 4.0, 4.7 and 5.9 x 2^-24)."""
    x, dout = normal(seed, (n, 7), dtype, scale), normal(seed + 1, (n, 7), dtype)
    out, cache = fast.gelu_forward(x, kind)
    ref_out, ref_cache = ops.gelu_forward(x, kind)
    dx, ref_dx = fast.gelu_backward(dout, cache), ops.gelu_backward(dout, ref_cache)
    if kind == "gelu" and dtype is numpy.float32:
        gelu_within_float32_bound(x, dout, (out, cache[1], dx), (ref_out, ref_cache[1], ref_dx))
        return
    same(out, ref_out, f"gelu[{kind}] out")
    same(cache[1], ref_cache[1], f"gelu[{kind}] cache")
    same(dx, ref_dx, f"gelu[{kind}] dx")


GELU_FLOAT32_BOUND = 2.0**-21


def gelu_within_float32_bound(x, dout, fast_results, ref_results):
    """out, Phi and dx of float32 "gelu" within GELU_FLOAT32_BOUND of the reference's:
    Phi absolutely, out relative to |x|, dx relative to |dout|, elementwise."""
    scales = (numpy.abs(x.astype(float)), 1.0, numpy.abs(dout.astype(float)))
    for name, a, r, scale in zip(("out", "Phi", "dx"), fast_results, ref_results, scales):
        assert a.dtype == r.dtype == numpy.float32 and a.shape == r.shape, name
        excess = numpy.abs(a.astype(float) - r) - GELU_FLOAT32_BOUND * scale
        assert (excess <= 0).all(), f"float32 gelu {name}: off by {excess.max():.3e} more than " \
            f"the bound (2^-21 x its scale)"
        error = numpy.abs(a.astype(float) - r) / numpy.maximum(scale, 1e-30)
        record(f"fast vs reference float32 gelu {name} (2^-24 of its scale)",
               float(error.max()) / 2.0**-24)


def test_float32_gelu_on_a_large_sample_within_its_bound():
    rng = numpy.random.default_rng(0)
    n = 1 << 20
    x = (rng.standard_normal(n) * rng.choice([0.01, 1.0, 3.0, 10.0], n)).astype(numpy.float32)
    dout = rng.standard_normal(n).astype(numpy.float32)
    out, cache = fast.gelu_forward(x)
    ref_out, ref_cache = ops.gelu_forward(x)
    gelu_within_float32_bound(x, dout, (out, cache[1], fast.gelu_backward(dout, cache)),
                              (ref_out, ref_cache[1], ops.gelu_backward(dout, ref_cache)))


def test_erf_float32_within_its_ulp_bound():
    """A fixed sample of 4M float32 (uniform bit patterns over [0, 4.5], so every binade
    down to the subnormals, and uniform values over [0, 4.5]) against the float64 reference
    erf, in ulp of the float32 result: within ERF32_ULP (bench/erf_ulp.py sweeps every
    float32 in [0, 4]: 7.66 ulp at most). Odd to the bit, |erf| <= 1, +-inf -> +-1, nan."""
    rng = numpy.random.default_rng(1)
    top = int(numpy.float32(4.5).view(numpy.uint32))
    bits = rng.integers(0, top, size=1 << 21, dtype=numpy.uint32).view(numpy.float32)
    x = numpy.concatenate([bits, rng.uniform(0, 4.5, 1 << 21).astype(numpy.float32)])
    exact = erf(x.astype(numpy.float64))
    ulp = numpy.spacing(numpy.abs(exact).astype(numpy.float32)).astype(float)
    y = fast.erf_float32(x)
    err = record("fast erf_float32 vs float64 erf (ulp, 4M sample)",
                 float((numpy.abs(y.astype(float) - exact) / ulp).max()))
    assert err <= fast.ERF32_ULP, f"erf_float32: {err:.2f} ulp > {fast.ERF32_ULP}"
    same(fast.erf_float32(-x), -y, "erf_float32(-x) = -erf_float32(x)")
    assert numpy.abs(y).max() <= 1.0
    special = fast.erf_float32(numpy.array([numpy.inf, -numpy.inf, numpy.nan, -0.0], numpy.float32))
    same(special[:2], numpy.array([1.0, -1.0], numpy.float32), "erf_float32(+-inf)")
    assert numpy.isnan(special[2]) and numpy.signbit(special[3]) and special[3] == 0


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_pooled_matmul_is_the_product_within_rounding(monkeypatch, dtype):
    """fast.matmul's 2-D products past POOLED_MATMUL_MNK run as blocks of rows (M >= N) or of
    columns (M < N) on the pool (3 threads, so the blocks are uneven): every entry within
    the rounding of a K-term sum in any order, 2 K eps of sum_k |a_ik| |b_kj| from
    numpy.matmul (each is K eps from the exact sum), operands and out= as the layers pass
    them (a transposed weight, a weight gradient's transposed dout, a strided out); a second
    call gives the same bits. Smaller products are one numpy.matmul call, bitwise."""
    monkeypatch.setenv("NANOBERT_THREADS", "3")
    blocks = []
    in_row_blocks = fast_cpu.in_row_blocks

    def counted(kernel, *args, **kwargs):
        blocks.append(kernel)
        in_row_blocks(kernel, *args, **kwargs)
    monkeypatch.setattr(fast_cpu, "in_row_blocks", counted)
    rng = numpy.random.default_rng(5)
    M, K, N = 301, 67, 45
    x, w = rng.standard_normal((M, K)).astype(dtype), rng.standard_normal((N, K)).astype(dtype)
    dout = rng.standard_normal((M, N)).astype(dtype)
    wide = numpy.zeros((N, 2 * K), dtype)
    eps = numpy.finfo(dtype).eps
    for name, a, b, out in (("x @ w.T", x, w.T, None), ("dout.T @ x", dout.T, x, None),
                            ("dout.T @ x into a strided out", dout.T, x, wide[:, ::2])):
        assert a.shape[0] * a.shape[1] * b.shape[1] > fast_cpu.POOLED_MATMUL_MNK
        product = fast.matmul(a, b, out=out)
        assert out is None or product is out
        magnitude = numpy.abs(a).astype(float) @ numpy.abs(b)       # sum_k |a_ik| |b_kj|
        err = float((numpy.abs(product - numpy.matmul(a, b)) / magnitude).max()) / eps
        record(f"pooled matmul vs one BLAS call {numpy.dtype(dtype).name} (eps of sum |a||b|)",
               err)
        assert err <= 2 * a.shape[1], f"{name}: {err:.1f} eps > 2 K eps"
        same(fast.matmul(a, b), product, f"{name}, called again")
    assert fast_cpu._rows_matmul_block in blocks, "x @ w.T (M > N) did not run in row blocks"
    assert fast_cpu._columns_matmul_block in blocks, \
        "dout.T @ x (M < N) did not run in column blocks"
    blocks.clear()
    small = x[:8, :8] @ w[:8, :8].T
    same(fast.matmul(x[:8, :8], w[:8, :8].T), small, "a small product")
    assert not blocks, "a product under POOLED_MATMUL_MNK went to the pool"


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_threaded_passes_equal_one_thread_and_the_reference(monkeypatch, dtype):
    """Arrays large enough to be split over the thread pool (threads.MIN_PARALLEL, and two
    fast_cpu.LAYERNORM_BLOCKs), with 3 threads, bitwise equal to one thread (rows are never
    cut, so each row's reductions keep their order) and to the reference (but float32 GELU
    and LayerNorm, within their bounds above)."""
    rng = numpy.random.default_rng(2)
    B, A, T, D, H = 3, 4, 37, 16, 48
    x = rng.standard_normal((B, T * 100, H)).astype(dtype)      # LayerNorm, GELU: 3 x 3700 rows
    scores = (4 * rng.standard_normal((B, A, T * 10, T))).astype(dtype)
    q, k = (rng.standard_normal((B, A, T, D)).astype(dtype) for _ in range(2))
    gamma, beta = rng.standard_normal(H).astype(dtype), rng.standard_normal(H).astype(dtype)
    residual = rng.standard_normal(x.shape).astype(dtype)

    def run():
        ln, ln_cache = fast.layernorm_forward(x, gamma, beta, 1e-12)
        g, g_cache = fast.gelu_forward(x)
        y, y_cache = fast.softmax_forward(scores.copy(), overwrite_x=True)
        dropped, mask = fast.dropout_forward(x, 0.1, numpy.random.default_rng(3), True)
        added, _ = fast.dropout_add_forward(x, residual, 0.1, numpy.random.default_rng(3), True)
        return {"dropout": dropped, "dropout mask": mask, "dropout + residual": added,
                "layernorm": ln, "layernorm xhat": ln_cache[0], "layernorm rstd": ln_cache[2],
                "layernorm dx": fast.layernorm_backward(x, ln_cache)[0],
                "gelu": g, "gelu Phi": g_cache[1], "gelu dx": fast.gelu_backward(x, g_cache),
                "softmax": y, "softmax dx": fast.softmax_backward(scores, y_cache),
                "stacked matmul": fast.matmul(q, k.transpose(0, 1, 3, 2))}

    assert x.size >= 2 * fast_cpu.LAYERNORM_BLOCK and scores.size >= 2 * threads.MIN_PARALLEL
    monkeypatch.setenv("NANOBERT_THREADS", "1")
    alone = run()
    monkeypatch.setenv("NANOBERT_THREADS", "3")
    threaded = run()
    for name, value in alone.items():
        same(threaded[name], value, f"{name}, 3 threads vs 1")
    g, g_cache = ops.gelu_forward(x)
    y, y_cache = ops.softmax_forward(scores)
    dropped, mask = ops.dropout_forward(x, 0.1, numpy.random.default_rng(3), True)
    for name, err in layernorm_errors(x, gamma, beta, x).items():     # still 3 threads
        assert err <= LAYERNORM_BOUND, f"layernorm {name}, threaded vs reference: {err:.3e}"
    reference = {"dropout": dropped, "dropout mask": mask, "softmax": y,
                 "dropout + residual": ops.dropout_add_forward(
                     x, residual, 0.1, numpy.random.default_rng(3), True)[0],
                 "softmax dx": ops.softmax_backward(scores, y_cache),
                 "stacked matmul": q @ k.transpose(0, 1, 3, 2)}
    if dtype is numpy.float64:
        reference.update({"gelu": g, "gelu Phi": g_cache[1],
                          "gelu dx": ops.gelu_backward(x, g_cache)})
    else:
        gelu_within_float32_bound(x, x, [threaded[n] for n in ("gelu", "gelu Phi", "gelu dx")],
                                  (g, g_cache[1], ops.gelu_backward(x, g_cache)))
    for name, value in reference.items():
        same(threaded[name], value, f"{name}, threaded vs reference")


@pytest.mark.parametrize("rows", [301, 23, 3])
def test_linear_forward_adds_the_bias_in_each_block_to_the_same_bits(monkeypatch, rows):
    """NumPy's linear_forward adds the bias inside the pooled product's blocks (row blocks
    for 301 rows, column blocks for 23, one small call for 3; 3 threads): bitwise the
    pooled product plus the bias added after it, as the layer did before."""
    monkeypatch.setenv("NANOBERT_THREADS", "3")
    rng = numpy.random.default_rng(6)
    x = rng.standard_normal((rows, 67)).astype(numpy.float32)
    weight = rng.standard_normal((45 if rows > 45 else 1000, 67)).astype(numpy.float32)
    bias = rng.standard_normal(weight.shape[0]).astype(numpy.float32)
    expected = fast_cpu.pooled_matmul(x, weight.T)
    expected += bias
    out, cache = fast.linear_forward(x, weight, bias)
    same(out, expected, f"linear_forward on {rows} rows")
    assert (rows * 67 * weight.shape[0] > fast_cpu.POOLED_MATMUL_MNK) == (rows > 3)


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_add_and_norm_at_inference_is_layernorm_of_the_sum(monkeypatch, dtype):
    """dropout_add_layernorm_forward(y, x, ..., cache=False) in eval mode (fast_cpu's
    layernorm_inference) adds x block by block (3 threads, uneven blocks of LAYERNORM_BLOCK)
    into a new array: bitwise layernorm_forward(y + x), neither y nor x touched."""
    monkeypatch.setenv("NANOBERT_THREADS", "3")
    rng = numpy.random.default_rng(9)
    y, x = (rng.standard_normal((2, 2500, 384)).astype(dtype) for _ in range(2))
    gamma, beta = rng.standard_normal(384).astype(dtype), rng.standard_normal(384).astype(dtype)
    assert y.size > 3 * fast_cpu.LAYERNORM_BLOCK
    expected = fast.layernorm_forward(y + x, gamma, beta, 1e-12)[0]
    x_before, y_before = x.copy(), y.copy()
    out, cache = fast.dropout_add_layernorm_forward(y, x, gamma, beta, 1e-12, 0.1, None, False,
                                                    cache=False)
    assert cache is None and out is not y
    same(out, expected, "LN(y + x) at inference")
    same(x, x_before, "the residual")
    same(y, y_before, "the sublayer's output")


def test_in_row_blocks_covers_every_row_once_in_uneven_blocks(monkeypatch):
    monkeypatch.setenv("NANOBERT_THREADS", "4")
    rows = numpy.zeros((1001, 70))
    seen = numpy.zeros(1001, int)

    def kernel(block, counts, value):
        block += value
        counts += 1
    threads.in_row_blocks(kernel, (rows, seen), 1.0, block_elements=700)
    assert (rows == 1.0).all() and (seen == 1).all()
    monkeypatch.setenv("NANOBERT_THREADS", "zero")
    with pytest.raises(ValueError, match="NANOBERT_THREADS must be a positive integer"):
        threads.in_row_blocks(kernel, (rows, seen), 1.0)


@pytest.mark.skipif(threads.SET_BLAS_THREADS is None, reason="needs NumPy's bundled OpenBLAS")
def test_blas_kernels_see_one_blas_thread_in_every_block_and_the_count_comes_back(monkeypatch):
    """OpenBLAS's thread count is one per process: a worker that gave it back while the caller
    still had blocks left would let the caller's BLAS calls wake OpenBLAS's own threads. Every
    block, the last ones included, must run with the count at 1; after the call it is what it
    was (here 3, a count no default would give)."""
    monkeypatch.setenv("NANOBERT_THREADS", "3")
    before = threads.SET_BLAS_THREADS(3)
    try:
        counts = numpy.zeros(64, int)

        def kernel(rows, counts):
            time.sleep(0.001 * rows[0])             # uneven blocks: the workers finish first
            counts[:] = threads.SET_BLAS_THREADS(1)   # -> the count in force (1 sets 1 again)
        threads.in_row_blocks(kernel, (numpy.arange(64), counts), uses_blas=True,
                              rows_per_block=1)
        assert (counts == 1).all()
        assert threads.SET_BLAS_THREADS(3) == 3
    finally:
        threads.SET_BLAS_THREADS(before)


def test_gelu_refuses_an_unknown_kind_in_both_layers():
    for layer in (fast, ops):
        with pytest.raises(ValueError, match="hidden_act must be one of"):
            layer.gelu_forward(numpy.zeros(3), "relu")


@SETTINGS
@given(n=dims, c=dims, dtype=dtypes, scale=st.floats(0.1, 30.0), overwrite=st.booleans(),
       seed=seeds)
def test_softmax(n, c, dtype, scale, overwrite, seed):
    x, dout = normal(seed, (2, n, c), dtype, scale), normal(seed + 1, (2, n, c), dtype)
    y, y_cache = fast.softmax_forward(x.copy(), overwrite_x=overwrite)
    ref_y, ref_cache = ops.softmax_forward(x)
    same(y, ref_y, "softmax out")
    same(fast.softmax_backward(dout, y_cache), ops.softmax_backward(dout, ref_cache), "softmax dx")


@SETTINGS
@given(n=st.integers(1, 40), dtype=dtypes, p=st.sampled_from([0.0, 0.1, 0.5, 0.9]),
       training=st.booleans(), seed=seeds)
def test_dropout(n, dtype, p, training, seed):
    x, residual = normal(seed, (3, n), dtype), normal(seed + 1, (3, n), dtype)
    dout = normal(seed + 2, x.shape, dtype)
    out, mask = fast.dropout_forward(x, p, numpy.random.default_rng(seed), training)
    ref_out, ref_mask = ops.dropout_forward(x, p, numpy.random.default_rng(seed), training)
    assert (mask is None) == (ref_mask is None) == (not training or p == 0.0)
    same(out, ref_out, "dropout out")
    if mask is not None:
        same(mask, ref_mask, "dropout mask")
    same(fast.dropout_backward(dout, mask), ops.dropout_backward(dout, ref_mask), "dropout dx")
    out, mask = fast.dropout_add_forward(x.copy(), residual, p, numpy.random.default_rng(seed),
                                         training)
    ref_out, _ = ops.dropout_add_forward(x, residual, p, numpy.random.default_rng(seed), training)
    same(out, ref_out, "dropout_add out")


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 300), dtype=dtypes, p=st.floats(1e-6, 0.999),
       bit_generator=st.sampled_from(["PCG64", "MT19937"]), seed=seeds)
def test_dropout_keeps_the_elements_of_a_uniform_draw_at_least_p(n, dtype, p, bit_generator,
                                                                  seed):
    """The fast mask, made from the bit generator's raw words (64-bit for PCG64, 32-bit for
    MT19937), keeps what rng.random(shape, dtype) >= p keeps, from the same seed."""
    def rng():
        return numpy.random.Generator(getattr(numpy.random, bit_generator)(seed))
    x = numpy.ones((2, n), dtype=dtype)
    _, mask = fast.dropout_forward(x, p, rng(), True)
    uniform = rng().random(x.shape, dtype=dtype)
    kept = uniform >= uniform.dtype.type(p)
    assert numpy.array_equal(mask != 0, kept), (
        f"{bit_generator} {numpy.dtype(dtype)}: {numpy.sum((mask != 0) != kept)} of {kept.size} "
        f"elements differ at p = {p}")


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_a_large_keep_mask_drawn_in_shares_on_threads_is_the_sequential_draw(monkeypatch,
                                                                            dtype):
    """A mask of 3 x fast_cpu.KEEP_MASK_WORDS raw words and more: each of 3 threads draws its
    share from a copy of the generator advanced to the share's start: the mask equals one thread's
    sequential draw, and the generator ends in the same state, the half word that a float32
    draw before it left buffered included, so the draws after it are the same too. From a
    fresh generator it is rng.random(shape, dtype) >= p (an odd float32 size: the last half
    word unused)."""
    shape = (3, 2 * fast_cpu.KEEP_MASK_WORDS + 1)              # 3 shares of raw words, odd
    results = []
    for count in ("3", "1"):
        monkeypatch.setenv("NANOBERT_THREADS", count)
        rng = numpy.random.default_rng(7)
        rng.random(1, dtype=numpy.float32)                 # buffers the other half word
        keep = fast_cpu._keep_mask(shape, 0.1, rng, numpy.dtype(dtype))
        results.append((keep, rng.bit_generator.state, rng.random(3, dtype=numpy.float32)))
    (threaded, state, after), (alone, state_alone, after_alone) = results
    assert state["has_uint32"] == 1 and state == state_alone
    same(after, after_alone, "the draws after the mask")
    same(threaded, alone, "keep mask, 3 threads vs 1")
    monkeypatch.setenv("NANOBERT_THREADS", "3")
    threaded = fast_cpu._keep_mask(shape, 0.1, numpy.random.default_rng(8), numpy.dtype(dtype))
    uniform = numpy.random.default_rng(8).random(shape, dtype=dtype)
    same(threaded, uniform >= uniform.dtype.type(0.1), "keep mask vs rng.random >= p")


@settings(max_examples=30, deadline=None)
@given(b=st.integers(1, 3), t=st.integers(1, 6), heads=st.integers(1, 3), d=st.integers(1, 4),
       dropout=st.sampled_from([0.0, 0.2]), dtype=dtypes, seed=seeds)
def test_self_attention_with_padding(b, t, heads, d, dropout, dtype, seed):
    rng = numpy.random.default_rng(seed)
    H = heads * d
    mask = (rng.random((b, t)) < 0.7).astype(numpy.int64)
    mask[:, 0] = 1                                  # [CLS] is never padding
    mask[0, 1:] = 0                                 # row 0: all padding but [CLS]
    bias = ops.attention_mask_bias(mask, dtype)
    x, w, bq = normal(seed, (b, t, H), dtype), normal(seed + 1, (3 * H, H), dtype, 0.5), \
        normal(seed + 2, 3 * H, dtype)
    dcontext = normal(seed + 3, (b, t, H), dtype)
    context, cache = fast.self_attention_forward(x, w, bq, bias, heads, dropout,
                                                 numpy.random.default_rng(seed), True)
    ref_context, ref_cache = ops.self_attention_forward(x, w, bq, bias, heads, dropout,
                                                        numpy.random.default_rng(seed), True)
    same(context, ref_context, "attention context")
    for name in ("q", "k", "v", "probs", "probs_dropped"):
        same(getattr(cache, name), getattr(ref_cache, name), f"attention cache.{name}")
    dw, db = numpy.empty_like(w), numpy.empty_like(bq)
    grads = fast.self_attention_backward(dcontext, cache, dw, db)
    for name, g, r in zip(("dx", "dw_qkv", "db_qkv"), grads,
                          ops.self_attention_backward(dcontext, ref_cache)):
        same(g, r, f"attention {name}")

# ------------------------------------------------------------------------------- losses


@settings(max_examples=40, deadline=None)
@given(n=dims, c=dims, dtype=dtypes, ignored=st.floats(0.0, 1.0), scale=st.floats(0.1, 20.0),
       denominator=st.sampled_from([None, 7]), pass_count=st.booleans(),
       dloss=st.floats(0.1, 4.0), seed=seeds)
def test_cross_entropy_with_ignored_rows_and_denominators(n, c, dtype, ignored, scale,
                                                          denominator, pass_count, dloss, seed):
    rng = numpy.random.default_rng(seed)
    labels = rng.integers(0, c, size=n)
    labels[rng.random(n) < ignored] = ops.IGNORE_INDEX
    logits = normal(seed, (n, c), dtype, scale)
    count = int((labels != ops.IGNORE_INDEX).sum())
    loss, cache = fast.cross_entropy_forward(logits, labels, denominator,
                                             count=count if pass_count else None)
    ref_loss, ref_cache = ops.cross_entropy_forward(logits, labels, denominator)
    assert cache.count == ref_cache.count == count
    assert cache.denominator == ref_cache.denominator
    if dtype is numpy.float64:
        same(loss, float(ref_loss), "cross-entropy loss")     # the same float64 division
    else:
        close(loss, ref_loss, FLOAT32_LOSS_BOUND, "cross-entropy loss float32")
    dlogits = fast.cross_entropy_backward(dloss, cache)
    ref_dlogits = ops.cross_entropy_backward(dloss, ref_cache)
    assert dlogits.dtype == ref_dlogits.dtype == dtype
    assert not dlogits[labels == ops.IGNORE_INDEX].any()
    assert not ref_dlogits[labels == ops.IGNORE_INDEX].any()
    # elementwise, in eps of dloss / denominator: the scale of each entry (see the top)
    eps = numpy.finfo(dtype).eps * dloss / ref_cache.denominator
    err = record(f"fast vs reference cross-entropy dlogits {numpy.dtype(dtype)} (eps of the "
                 "scale)", float(numpy.abs(dlogits.astype(float) - ref_dlogits).max()) / eps)
    assert err <= 2.0, f"cross-entropy dlogits: {err:.2f} eps of dloss / denominator > 2"


@SETTINGS
@given(n=dims, c=dims, dtype=dtypes, seed=seeds)
def test_regression_and_multilabel_losses(n, c, dtype, seed):
    prediction, target = normal(seed, (n, c), dtype), normal(seed + 1, (n, c), dtype)
    targets01 = (numpy.random.default_rng(seed).random((n, c)) < 0.5).astype(dtype)
    for name, layer_pair, args in (("mse", "mse", (prediction, target)),
                                   ("bce", "bce_with_logits", (prediction, targets01))):
        loss, cache = getattr(fast, layer_pair + "_forward")(*args)
        ref_loss, ref_cache = getattr(ops, layer_pair + "_forward")(*args)
        if dtype is numpy.float64:
            same(loss, float(ref_loss), f"{name} loss")
        else:
            close(loss, ref_loss, FLOAT32_LOSS_BOUND, f"{name} loss float32")
        name = layer_pair + "_backward"
        backward = getattr(fast, name, getattr(ops, name))     # ops.py's where it has no twin
        same(backward(0.5, cache), backward(0.5, ref_cache), f"{name} dprediction")

# -------------------------------------------------------------------------- whole model


def test_a_forked_child_runs_threaded_passes_on_a_pool_of_its_own(monkeypatch):
    """A fork copies the pool object but not its threads: the child must make its own
    instead of queueing work that nothing runs (it would hang)."""
    import multiprocessing
    monkeypatch.setenv("NANOBERT_THREADS", "2")
    x = numpy.random.default_rng(4).standard_normal((64, 2048)).astype(numpy.float32)
    expected = fast.gelu_forward(x)[0]                 # makes the parent's pool
    with multiprocessing.get_context("fork").Pool(1) as pool:
        result = pool.apply_async(fast.gelu_forward, (x,)).get(timeout=60)[0]
    same(result, expected, "gelu in a forked child")
