"""fast_gpu's direct cuBLAS calls on the CPU stand-in (tests/cupy_standin.py, which emulates
gemmStridedBatchedEx from its raw arguments: addresses, sizes, leading dimensions, strides,
type codes): gemm and column_sum give NumPy's numbers, pick the compute type the precision
asks for, and refuse layouts cuBLAS cannot read. Nothing here says anything about cuBLAS's
own rounding or speed on a GPU."""
import numpy
import pytest

import cupy_standin
from conftest import assert_close, record
from nanobert import backend
from nanobert.model import fast_gpu


@pytest.fixture
def cupy():
    with cupy_standin.installed() as module:
        module.counts.reset()
        yield module


@pytest.fixture
def compute_types(monkeypatch):
    """The computeType of each cublasGemmStridedBatchedEx call, in order."""
    seen, call = [], cupy_standin.cublas.gemm

    def spy(*args):
        seen.append(args[21])
        return call(*args)
    monkeypatch.setattr(cupy_standin.cublas, "gemm", spy)
    return seen


def product_bound(a, b, dtype):
    """K eps of sum |a||b|: the rounding of a K-term sum in `dtype`, per element."""
    return numpy.abs(a.astype(float)) @ numpy.abs(b.astype(float)) * a.shape[-1] * \
        numpy.finfo(dtype).eps


@pytest.mark.parametrize("dtype", [numpy.float64, numpy.float32, numpy.float16])
@pytest.mark.parametrize("transpose_a, transpose_b", [(False, False), (True, False),
                                                      (False, True), (True, True)])
def test_gemm_is_the_stacked_product_with_transposes_and_row_strides(cupy, dtype, transpose_a,
                                                                     transpose_b):
    """[2, 3] stacks of [5, 4] @ [4, 6] with either operand transposed (an op flag), a read
    from the first columns of wider rows (lda > cols) and a product into a strided out:
    equal to numpy.matmul of the same values (float16: a float32 product rounded once, as
    the NumPy path's)."""
    rng = numpy.random.default_rng(1)
    a = rng.standard_normal((2, 3, 5, 4)).astype(dtype)
    b = rng.standard_normal((2, 3, 4, 6)).astype(dtype)
    a_stored = a.swapaxes(-1, -2) if transpose_a else a
    b_stored = b.swapaxes(-1, -2) if transpose_b else b
    wide_a = numpy.zeros(a_stored.shape[:-1] + (a_stored.shape[-1] + 3,), dtype)
    wide_a[..., :a_stored.shape[-1]] = a_stored
    device_a = cupy.asarray(wide_a)[..., :a_stored.shape[-1]]   # rows 3 elements apart more
    device_b = cupy.asarray(numpy.ascontiguousarray(b_stored))
    out = cupy.zeros((2, 3, 5, 8), dtype)[..., 1:7]                # a strided out
    cupy.counts.reset()
    result = fast_gpu.gemm(device_a, device_b, out, transpose_a, transpose_b)
    assert result is out and cupy.counts.launches == 1, dict(cupy.counts.kernels)
    expected = (a.astype(numpy.float32) @ b.astype(numpy.float32)).astype(dtype) \
        if dtype == numpy.float16 else a @ b
    err = numpy.abs(out.get().astype(float) - expected.astype(float))
    bound = numpy.finfo(dtype).eps * numpy.abs(expected.astype(float)) \
        if dtype == numpy.float16 else product_bound(a, b, dtype)
    assert (err <= bound + numpy.finfo(dtype).tiny).all(), err.max()
    assert float(cupy.zeros(1).sum()) == 0.0 and out._a.base is not None   # columns 0, 7 kept
    assert (out._a.base[..., 0] == 0).all() and (out._a.base[..., 7] == 0).all()


def test_gemm_compute_type_follows_the_precision(cupy, compute_types, monkeypatch):
    """float64: 64F; float32: FAST_TF32 when TF32 is on, 32F when off or when exact; float16
    operands: 32F (float32 accumulation), into float16 or float32."""
    cublas = cupy_standin.cublas
    a = {d: cupy.ones((2, 3, 3), d) for d in (numpy.float64, numpy.float32, numpy.float16)}
    monkeypatch.setenv("NANOBERT_TF32", "1")
    backend.set_tf32(True)
    fast_gpu.gemm(a[numpy.float64], a[numpy.float64], cupy.empty((2, 3, 3), numpy.float64))
    fast_gpu.gemm(a[numpy.float32], a[numpy.float32], cupy.empty((2, 3, 3), numpy.float32))
    fast_gpu.gemm(a[numpy.float32], a[numpy.float32], cupy.empty((2, 3, 3), numpy.float32),
                  exact=True)
    fast_gpu.gemm(a[numpy.float16], a[numpy.float16], cupy.empty((2, 3, 3), numpy.float16))
    fast_gpu.gemm(a[numpy.float16], a[numpy.float16], cupy.empty((2, 3, 3), numpy.float32))
    backend.set_tf32(False)
    fast_gpu.gemm(a[numpy.float32], a[numpy.float32], cupy.empty((2, 3, 3), numpy.float32))
    assert compute_types == [cublas.CUBLAS_COMPUTE_64F, cublas.CUBLAS_COMPUTE_32F_FAST_TF32,
                             cublas.CUBLAS_COMPUTE_32F, cublas.CUBLAS_COMPUTE_32F,
                             cublas.CUBLAS_COMPUTE_32F, cublas.CUBLAS_COMPUTE_32F]


def test_gemm_refuses_what_cublas_cannot_read(cupy):
    x = cupy.ones((2, 4, 4), numpy.float32)
    with pytest.raises(ValueError, match="adjacent elements"):
        fast_gpu.gemm(x.transpose(0, 2, 1), x, cupy.empty((2, 4, 4), numpy.float32))
    with pytest.raises(ValueError, match="equally spaced"):
        stack = cupy.ones((2, 3, 5, 4), numpy.float32)[:, :2]     # [2, 2] of a [2, 3] stack
        fast_gpu.gemm(stack, cupy.ones((2, 2, 4, 4), numpy.float32),
                      cupy.empty((2, 2, 5, 4), numpy.float32))
    with pytest.raises(ValueError, match="do not fit"):
        fast_gpu.gemm(x, x, cupy.empty((2, 4, 5), numpy.float32))
    empty = fast_gpu.gemm(cupy.ones((0, 3), numpy.float32), cupy.ones((3, 2), numpy.float32),
                          cupy.empty((0, 2), numpy.float32))
    assert empty.shape == (0, 2)                           # no rows (a batch with no mask)
    assert (fast_gpu.column_sum(cupy.ones((0, 3), numpy.float32)).get() == 0).all()
    with pytest.raises(ValueError, match="a stack of 1"):
        fast_gpu.gemm(x[0], x, cupy.empty((2, 4, 4), numpy.float32))   # no broadcasting


def test_standin_gemm_checks_the_raw_arguments(cupy):
    """The emulation reads memory as cuBLAS would: a leading dimension, a type code or an
    address that does not describe a live array of that dtype is refused, so a wrong
    argument in fast_gpu.gemm cannot pass the tests above unnoticed."""
    cublas = cupy_standin.cublas
    a, c = cupy.ones((4, 4), numpy.float32), cupy.zeros((4, 4), numpy.float32)
    one, zero = numpy.ones((), numpy.float32), numpy.zeros((), numpy.float32)
    f32 = cupy_standin.CUDA_R_32F

    def call(A=a.data.ptr, lda=4, Atype=f32, C=c.data.ptr, k=4, batch=1, stride=0):
        cublas.gemmStridedBatchedEx(cupy.cuda.device.get_cublas_handle(), 0, 0, 4, 4, k,
                                    one.ctypes.data, A, Atype, lda, stride, a.data.ptr, Atype,
                                    4, stride, zero.ctypes.data, C, f32, 4, stride, batch,
                                    cublas.CUBLAS_COMPUTE_32F, cublas.CUBLAS_GEMM_DEFAULT)
    call()
    assert (c.get() == 4).all()
    with pytest.raises(TypeError, match="ld 3 < rows 4"):
        call(lda=3)
    with pytest.raises(TypeError, match="no live device array"):
        call(k=5)                                    # reads past the end of a
    with pytest.raises(TypeError, match="no live device array"):
        call(batch=2, stride=16)
    with pytest.raises(TypeError, match="is float32, the call says float16"):
        call(Atype=cupy_standin.CUDA_R_16F)
    with pytest.raises(TypeError, match="C overlaps"):
        call(C=a.data.ptr)


@pytest.mark.parametrize("dtype, out_dtype", [(numpy.float64, numpy.float64),
                                              (numpy.float32, numpy.float32),
                                              (numpy.float16, numpy.float32)])
def test_column_sum_is_the_sum_over_rows(cupy, compute_types, dtype, out_dtype):
    """column_sum (ones [1, N] @ x on cuBLAS, never TF32) against numpy.sum(axis=0) in the
    output's dtype: within N eps of sum |x| per column (float64 measured ~1e-16 relative);
    float16 rows summed into a float32 buffer, as the gradients are; one launch once the
    ones-vector exists (grown, not rebuilt, for fewer rows)."""
    rng = numpy.random.default_rng(2)
    x = (rng.standard_normal((300, 7)) * 3).astype(dtype)
    device_x = cupy.asarray(x)
    out = cupy.empty(7, out_dtype)
    fast_gpu.column_sum(device_x, out=out)
    expected = x.astype(numpy.float64).sum(axis=0)
    err = numpy.abs(out.get().astype(float) - expected)
    bound = x.shape[0] * numpy.finfo(out_dtype).eps * numpy.abs(x.astype(float)).sum(axis=0)
    record(f"column_sum vs exact sum {numpy.dtype(dtype).name} (of N eps sum|x|)",
           float((err / bound).max()))
    assert (err <= bound).all(), (err / bound).max()
    assert compute_types[-1] != cupy_standin.cublas.CUBLAS_COMPUTE_32F_FAST_TF32
    cupy.counts.reset()
    again = fast_gpu.column_sum(device_x[:100], dtype=out_dtype)
    assert cupy.counts.launches == 1 and again.dtype == out_dtype
    assert_close(again.get(), x[:100].astype(out_dtype).sum(axis=0), 300 * 1e-7
                 if out_dtype != numpy.float64 else 1e-13, "column_sum of fewer rows")


@pytest.mark.parametrize("dtype", [numpy.float64, numpy.float16])
def test_layernorm_reads_float16_without_casts_and_gives_the_numpy_numbers(cupy, dtype):
    """fast_gpu.layernorm_forward/_backward against fast_cpu's (which casts float16 up
    first): float64 within 1e-12 (measured 0); float16 outputs within one float16 rounding,
    float32 statistics and parameter gradients within 1e-5 (sums in another order); no cast
    kernel: x, gamma, beta and dout are read as float16, the output and dx written as
    float16 by the kernels."""
    from nanobert.model import fast_cpu
    rng = numpy.random.default_rng(4)
    x, dout = (rng.standard_normal((3, 5, 16)).astype(dtype) for _ in range(2))
    gamma, beta = (rng.standard_normal(16).astype(dtype) for _ in range(2))
    master = numpy.float64 if dtype == numpy.float64 else numpy.float32
    grads = [numpy.zeros(16, master) for _ in range(2)]
    out, cache = fast_cpu.layernorm_forward(x, gamma, beta, 1e-12)
    dx, dgamma, dbeta = fast_cpu.layernorm_backward(dout, cache, *grads)
    put = cupy.asarray
    cupy.counts.reset()
    out_d, cache_d = fast_gpu.layernorm_forward(put(x), put(gamma), put(beta), 1e-12)
    dx_d, dgamma_d, dbeta_d = fast_gpu.layernorm_backward(
        put(dout), cache_d, *(cupy.zeros(16, master) for _ in range(2)))
    assert "ndarray.astype" not in cupy.counts.kernels, dict(cupy.counts.kernels)
    loose = 1e-12 if dtype == numpy.float64 else 1e-5
    for what, a, e, tol in (("out", out_d, out, 2 ** -10 if dtype == numpy.float16 else loose),
                            ("dx", dx_d, dx, 2 ** -10 if dtype == numpy.float16 else loose),
                            ("xhat", cache_d[0], cache[0], loose),
                            ("gamma", cache_d[1], gamma, 0.0),
                            ("rstd", cache_d[2], cache[2], loose),
                            ("dgamma", dgamma_d, dgamma, loose), ("dbeta", dbeta_d, dbeta, loose)):
        assert a.dtype == e.dtype, (what, a.dtype, e.dtype)
        assert_close(a.get().astype(float), e.astype(float), tol,
                     f"stand-in vs NumPy layernorm {numpy.dtype(dtype).name} {what}")


def half_close(actual, expected, what, absolute=0.0):
    """float16 results of the same float32 math: within one float16 rounding of each other
    where the float32 values straddle a rounding boundary (2^-10 of the magnitude, or of
    float16's smallest normal near zero), plus `absolute` (per element) for what the float32
    math itself may differ by."""
    a, e = actual.astype(float), expected.astype(float)
    bound = 2.0 ** -10 * numpy.maximum(numpy.abs(e), 2.0 ** -14) + absolute
    record(f"stand-in vs NumPy {what} float16 (of its bound)", float((abs(a - e) / bound).max()))
    assert (abs(a - e) <= bound).all(), f"{what}: {(abs(a - e) / bound).max():.3g} x the bound"


def test_gelu_and_softmax_read_and_write_float16_without_casts(cupy):
    """fast_gpu's float16 GELU (forward, backward) and softmax against fast_cpu's, which
    casts to float32, computes and casts back: the same numbers within one float16 rounding
    (GELU's erf differs by a few float32 ulp: fast_cpu's erf_float32 vs the stand-in's
    erff), Phi(x) in float32 within 1e-6, and no cast kernel on the device."""
    from nanobert.model import fast_cpu
    rng = numpy.random.default_rng(6)
    x, dout = ((rng.standard_normal((4, 6, 24)) * 2).astype(numpy.float16) for _ in range(2))
    scores = (rng.standard_normal((2, 3, 7, 7)) * 4).astype(numpy.float16)
    out, cache = fast_cpu.gelu_forward(x)
    dx = fast_cpu.gelu_backward(dout, cache)
    probs, _ = fast_cpu.softmax_forward(scores.copy())
    cupy.counts.reset()
    out_d, cache_d = fast_gpu.gelu_forward(cupy.asarray(x))
    dx_d = fast_gpu.gelu_backward(cupy.asarray(dout), cache_d)
    probs_d, _ = fast_gpu.softmax_forward(cupy.asarray(scores))
    assert "ndarray.astype" not in cupy.counts.kernels, dict(cupy.counts.kernels)
    # erf near -1 (Phi(x) small): a few float32 ulp of erf are 1e-6 of x Phi(x)'s scale
    erf_gap = 1e-6 * numpy.abs(x.astype(float)) * (1.0 + numpy.abs(dout.astype(float)))
    for what, a, e, absolute in (("gelu", out_d, out, erf_gap),
                                 ("gelu backward", dx_d, dx, erf_gap),
                                 ("softmax", probs_d, probs, 0.0)):
        assert a.dtype == numpy.float16, (what, a.dtype)
        half_close(a.get(), e, what, absolute)
    assert cache_d[0].dtype == numpy.float16 and cache_d[1].dtype == numpy.float32
    assert_close(cache_d[1].get(), cache[1], 1e-6, "stand-in vs NumPy gelu Phi(x) float16 run")


@pytest.mark.parametrize("dropout", [0.0, 0.25])
def test_float16_attention_makes_no_cast_kernel(dropout):
    """Self-attention in float16 on the stand-in, forward and backward (dropout on and
    off): no materialised cast (the softmax, its backward and dropout's read float16 and
    compute in float32 in their kernels; the products are cuBLAS calls on float16), and the
    NumPy path's numbers (test_cupy_standin's attention test bounds them)."""
    from test_cupy_standin import attention_on
    expected = attention_on(numpy, numpy.float16, dropout)
    with cupy_standin.installed() as cupy:
        cupy.counts.reset()
        actual = attention_on(cupy, numpy.float16, dropout)
        kernels = dict(cupy.counts.kernels)
    # one astype: attention_mask_bias's, made once per batch by the model, not attention's
    assert kernels.get("ndarray.astype") == 1, kernels
    assert not [k for k in kernels if k.startswith("matmul")], kernels
    for a, e in zip(actual[2], expected[2]):
        assert_close(a, e, 1e-2, "stand-in vs NumPy float16 attention gradients")


def test_gemm_plans_once_per_layout_and_follows_tf32(cupy, compute_types, monkeypatch):
    """A layout's checks and arguments are worked out once (_plan) and reused; the TF32
    setting and the scalars are part of the layout, so a change of either is a new plan."""
    planned = []
    real_plan = fast_gpu._plan
    monkeypatch.setattr(fast_gpu, "_plan", lambda *a: planned.append(a) or real_plan(*a))
    monkeypatch.setattr(fast_gpu, "_PLANS", {})
    x, out = cupy.ones((3, 4), numpy.float32), cupy.empty((3, 3), numpy.float32)
    monkeypatch.setenv("NANOBERT_TF32", "1")
    backend.set_tf32(True)
    for _ in range(3):
        fast_gpu.gemm(x, x, out, transpose_b=True)
    assert len(planned) == 1 and (out.get() == 4).all()
    backend.set_tf32(False)
    fast_gpu.gemm(x, x, out, transpose_b=True)
    fast_gpu.gemm(x, x, out, transpose_b=True, alpha=0.5)
    assert len(planned) == 3 and (out.get() == 2).all()
    cublas = cupy_standin.cublas
    assert compute_types == [cublas.CUBLAS_COMPUTE_32F_FAST_TF32] * 3 + \
        [cublas.CUBLAS_COMPUTE_32F] * 2
    with pytest.raises(ValueError, match="do not fit"):          # checked, also when cached
        fast_gpu.gemm(x, x, out)


@pytest.mark.parametrize("dtype", [numpy.float64, numpy.float32, numpy.float16])
def test_linear_bias_is_a_rank_one_product_summed_in(cupy, dtype):
    """fast_gpu.linear_forward adds the bias by cuBLAS (ones [N, 1] @ bias [1, out], beta 1):
    the same numbers as NumPy's x @ w.T + b, each element rounded once after the product
    (float16: the float32 product rounded to float16, then the sum rounded); two launches."""
    rng = numpy.random.default_rng(2)
    x, w = rng.standard_normal((2, 5, 7)).astype(dtype), rng.standard_normal((3, 7)).astype(dtype)
    b = rng.standard_normal(3).astype(dtype)
    cupy.counts.reset()
    out, cache = fast_gpu.linear_forward(cupy.asarray(x), cupy.asarray(w), cupy.asarray(b))
    kernels = {k: n for k, n in cupy.counts.kernels.items() if not k.startswith(("memcpy",
                                                                                 "cupy.ones"))}
    assert kernels == {"cublas.gemmStridedBatchedEx": 2}, kernels     # no add kernel
    product = (x.astype(numpy.float32) @ w.T.astype(numpy.float32)).astype(dtype) \
        if dtype == numpy.float16 else x @ w.T
    assert out.shape == (2, 5, 3) and out.dtype == dtype
    numpy.testing.assert_array_equal(out.get(), product + b)
    zero_rows = fast_gpu.linear_forward(cupy.ones((0, 7), dtype), cupy.asarray(w),
                                        cupy.asarray(b))[0]
    assert zero_rows.shape == (0, 3)


def test_plan_and_ones_caches_stay_bounded(cupy, monkeypatch):
    """Inference with many batch shapes makes many layouts and many row counts: the plans and
    the ones vectors' views are dropped once there are _MAX_PLANS of them, and the products
    after that are still right."""
    monkeypatch.setattr(fast_gpu, "_MAX_PLANS", 2)
    monkeypatch.setattr(fast_gpu, "_PLANS", {})
    monkeypatch.setattr(fast_gpu, "_ONES_VIEWS", {})
    w = cupy.ones((3, 4), numpy.float32)
    for rows in range(1, 6):
        x = cupy.asarray(numpy.arange(4 * rows, dtype=numpy.float32).reshape(rows, 4))
        assert (fast_gpu.column_sum(x).get() == x.get().sum(axis=0)).all()
        out = fast_gpu.linear_forward(x, w, cupy.zeros(3, numpy.float32))[0]
        assert (out.get() == x.get() @ w.get().T).all()
        assert len(fast_gpu._PLANS) <= 2 and len(fast_gpu._ONES_VIEWS) <= 2
