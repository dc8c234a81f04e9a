"""The MLM decoder's vocab on the GPU path (fast_gpu._output_rows, gemm's _split_wide): the
logits' rows padded to a multiple of 64 elements, each of the decoder's three products (the
logits, dx = dlogits W, dW = dlogits^T x) split into a head of whole 16-byte loads and a tail
of the last few vocab entries, so that cuBLAS may run the heads on vectorized kernels.
Proven on the CPU stand-in of CuPy: the same losses and gradients as without padding and as
NumPy; the padding never read (NaN or 1e30 there changes no bit), the logits' never written,
dlogits' written as 0; every large product that the stand-in's cuBLAS sees aligned (address,
leading dimension, adjacent extents) where without padding they are not; the model's outputs
keep the true vocab; a CUDA graph's replays equal the eager steps. Vocabs: BERT's 30,522
(misaligned for float16 and float32, not for float64, whose 16-byte load is 2 elements) and
1,027 (odd: padded in float64 too, so float64 shows the arithmetic to its rounding)."""
import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cupy_standin
from conftest import assert_close, record
from nanobert.model import fast, fast_gpu
from nanobert.model.config import BertConfig
from nanobert.model.pretraining import BertForPreTraining
from test_cupy_standin import TINY, pretraining_batch

HALF = numpy.float16
# relative to each result's largest element: a split product's kernels may sum each element
# in another order (dx's sum is split in two, the tail's terms first)
BOUND = {numpy.float64: 1e-15, numpy.float32: 1e-6, HALF: 1e-3}


@pytest.fixture
def cupy():
    with cupy_standin.installed() as module:
        module.counts.reset()
        yield module


def unpadded(monkeypatch):
    """Turn the padding off: no output is wide enough to pad, no product to split."""
    monkeypatch.setattr(fast_gpu, "WIDE", 1 << 62)


def decoder_step(xp, dtype, V, M=13, H=24, seed=0, poison=None):
    """The MLM decoder as pretraining.py runs it through the fast layer: logits = x W^T + b,
    the cross-entropy at M rows (every fifth ignored), its dlogits back through
    linear_backward into W's and b's gradient buffers (float32 for float16, as the model's)
    -> host {logits, loss, dx, dW, db}. poison: written into the padding of the logits and
    of dlogits before they are read (which must change nothing)."""
    rng = numpy.random.default_rng(seed)
    x, w = rng.standard_normal((M, H)), rng.standard_normal((V, H)) * 0.5
    b = rng.standard_normal(V) * 0.1
    labels = rng.integers(0, V, M)
    labels[::5] = -100
    grad_dtype = numpy.float32 if dtype == HALF else dtype
    dw, db = xp.zeros((V, H), grad_dtype), xp.zeros(V, grad_dtype)
    logits, cache = fast.linear_forward(*(xp.asarray(a.astype(dtype)) for a in (x, w, b)))
    poisoned(logits, poison)
    loss, ce = fast.cross_entropy_forward(logits, xp.asarray(labels),
                                          count=int((labels != -100).sum()))
    dlogits = poisoned(fast.cross_entropy_backward(1.0, ce), poison)
    dx, _, _ = fast.linear_backward(dlogits, cache, dw, db)
    host = numpy.asarray if xp is numpy else (lambda a: a.get())
    return {"logits": host(logits), "loss": float(loss), "dx": host(dx), "dW": host(dw),
            "db": host(db), "row length": fast_gpu._padded_rows(logits) if xp is not numpy
            else 0}


def poisoned(a, value):
    """a, with `value` written into its padding (if it has any and a value is given)."""
    if value is not None and fast_gpu._padded_rows(a):
        a.base[:, a.shape[1]:] = value
    return a


@pytest.mark.parametrize("dtype, V", [(numpy.float64, 1027), (numpy.float32, 1027),
                                      (numpy.float32, 30522), (HALF, 30522), (HALF, 1029)])
def test_the_padded_decoder_equals_the_unpadded_one(cupy, monkeypatch, dtype, V):
    """Padded rows and split products: the logits, the loss, dx, dW and db within a rounding
    of the unpadded products' (the same sums, perhaps in another order); float64 also
    against NumPy's path."""
    padded = decoder_step(cupy, dtype, V)
    assert padded["row length"] == -(-V // 64) * 64
    unpadded(monkeypatch)
    plain = decoder_step(cupy, dtype, V)
    assert plain["row length"] == 0
    for name in ("logits", "loss", "dx", "dW", "db"):
        assert_close(padded[name], plain[name], BOUND[dtype],
                     f"padded vocab vs unpadded {numpy.dtype(dtype).name}")
    if dtype == numpy.float64:
        numpy_path = decoder_step(numpy, dtype, V)
        for name in ("logits", "loss", "dx", "dW", "db"):
            assert_close(padded[name], numpy_path[name], 1e-14, "padded vocab vs NumPy")


@pytest.mark.parametrize("dtype", [numpy.float64, numpy.float32, HALF])
@pytest.mark.parametrize("poison", [numpy.nan, 1e30, -numpy.inf])
@pytest.mark.filterwarnings("ignore:overflow encountered in cast")     # 1e30 in float16: inf
def test_the_padding_is_never_read(cupy, dtype, poison):
    """NaN, a huge logit or -inf in every padded column of the logits and of dlogits: no
    result changes by a bit (a padded column read by the cross-entropy would win its row's
    max or poison the sums; read by a product, it would reach dx or dW)."""
    clean = decoder_step(cupy, dtype, 1027)
    dirty = decoder_step(cupy, dtype, 1027, poison=poison)
    assert dirty["row length"] == 1088
    for name in ("logits", "loss", "dx", "dW", "db"):
        assert numpy.array_equal(clean[name], dirty[name]), name


@pytest.mark.parametrize("dtype", [numpy.float64, numpy.float32, HALF])
def test_the_logits_padding_is_never_written_and_dlogits_is_zero(cupy, monkeypatch, dtype):
    """The logits and dlogits made NaN throughout when allocated: after the step the logits'
    padding is still NaN (the products stop at column V), dlogits' is 0 (the cross-entropy's
    backward writes it, so that float16's cast of whole rows converts zeros), and no result
    differs from a step on uninitialised memory."""
    made = []
    empty_rows = fast_gpu._empty_rows

    def nan_rows(xp, shape, dtype, row_length):
        rows = empty_rows(xp, shape, dtype, row_length)
        if row_length != shape[1]:
            rows.base[...] = numpy.nan
            made.append(rows)
        return rows
    clean = decoder_step(cupy, dtype, 1027)
    monkeypatch.setattr(fast_gpu, "_empty_rows", nan_rows)
    dirty = decoder_step(cupy, dtype, 1027)
    logits, dlogits = made
    assert numpy.isnan(logits.base[:, 1027:].get()).all()
    assert (dlogits.base[:, 1027:].get() == 0).all()
    for name in ("logits", "loss", "dx", "dW", "db"):
        assert numpy.array_equal(clean[name], dirty[name]), name


def large_products(gemms):
    """The cuBLAS calls whose every extent is at least 8: not a split's tail (the last 2 of
    30,522), not the bias's rank-1 product (k = 1), not a column sum (n = 1)."""
    return [g for g in gemms if min(g.m, g.n, g.k) >= 8]


@pytest.mark.parametrize("dtype", [numpy.float32, HALF])
def test_the_decoder_products_run_aligned(cupy, monkeypatch, dtype):
    """BERT's vocab, 30,522: each of the decoder's three products has its head in one cuBLAS
    call whose addresses, leading dimensions and adjacent extents are whole 16-byte loads
    (what CUTLASS's can_implement asks of a vectorized kernel); without the padding the
    same three calls are misaligned, so this test can fail."""
    cupy.counts.reset()
    decoder_step(cupy, dtype, 30522)
    large = large_products(cupy.counts.gemms)
    assert len(large) == 3, large
    assert all(g.aligned() for g in large), [g for g in large if not g.aligned()]
    tails = [g for g in cupy.counts.gemms if g not in large and min(g.m, g.n, g.k) == 2]
    assert len(tails) == 3, cupy.counts.gemms          # the vocab's last 2 entries
    unpadded(monkeypatch)
    cupy.counts.reset()
    decoder_step(cupy, dtype, 30522)
    large = large_products(cupy.counts.gemms)
    assert len(large) == 3 and not any(g.aligned() for g in large), large


@pytest.mark.parametrize("dtype, tol", [(numpy.float64, 1e-12), (numpy.float32, 2e-5)])
def test_a_pretraining_model_with_a_padded_vocab_gives_the_numpy_numbers(dtype, tol):
    """BertForPreTraining with an odd vocab (padded in every dtype) on the stand-in against
    the NumPy path: loss and every gradient (the tied word-embedding table's included, which
    the decoder writes and the lookup adds to); inference's prediction_logits [B, T, V]."""
    config = BertConfig(**{**TINY, "vocab_size": 1027})
    batch = pretraining_batch(config, 3, 12)
    cpu = BertForPreTraining(config, seed=2, dtype=dtype).eval()
    expected_loss, expected = cpu.loss_and_grads(batch)
    expected_logits = cpu(batch["input_ids"]).prediction_logits
    with cupy_standin.installed() as cupy:
        gpu = BertForPreTraining(config, seed=2, dtype=dtype, device="gpu").eval()
        cupy.counts.reset()
        loss, grads = gpu.loss_and_grads(batch, on_device=True)
        assert any(1088 in (g.lda, g.ldb, g.ldc) for g in cupy.counts.gemms)     # padded
        assert cupy.counts.syncs == 0, dict(cupy.counts.sync_sites)
        logits = gpu(batch["input_ids"]).prediction_logits
        assert logits.shape == (3, 12, 1027)
        logits = logits.get()
        grads = {name: g.get() for name, g in grads.items()}
    what = f"padded vocab model {numpy.dtype(dtype).name} vs NumPy"
    assert_close(float(loss), expected_loss, tol, f"{what} loss")
    assert_close(logits, expected_logits, tol, f"{what} logits")
    largest = max(numpy.abs(g).max() for g in expected.values())
    for name, g in expected.items():
        err = numpy.abs(grads[name] - g).max() / largest
        record(f"{what} gradients / largest", err)
        assert err <= tol, (name, err)


@settings(max_examples=20, deadline=None)
@given(transpose_a=st.booleans(), transpose_b=st.booleans(), accumulate=st.booleans(),
       alpha=st.sampled_from([1.0, 0.5]), wide=st.sampled_from("MNK"),
       extent=st.integers(1024, 1040), short=st.sampled_from([8, 16, 24]),
       dtype=st.sampled_from([numpy.float64, numpy.float32]), seed=st.integers(0, 2**16))
def test_gemm_splits_a_wide_misaligned_extent_and_sums_the_same(
        transpose_a, transpose_b, accumulate, alpha, wide, extent, short, dtype, seed):
    """gemm on operands whose leading dimensions are whole 16-byte loads (views of rows padded
    to 1,088) and one extent (out's rows M, out's columns N or the sum's K) of 1,024-1,040:
    two cuBLAS calls (a head and a tail) when an operand's elements are adjacent along that
    extent and it is no multiple of a load, else one; they sum what one call sums (alpha,
    and out's old value when accumulating)."""
    sizes = {"M": short, "N": short, "K": short, wide: extent}
    M, N, K = sizes["M"], sizes["N"], sizes["K"]
    rng = numpy.random.default_rng(seed)
    a = rng.standard_normal((K, M) if transpose_a else (M, K)).astype(dtype)
    b = rng.standard_normal((N, K) if transpose_b else (K, N)).astype(dtype)
    before = rng.standard_normal((M, N)).astype(dtype)
    expected = alpha * ((a.T if transpose_a else a) @ (b.T if transpose_b else b))
    if accumulate:
        expected += before
    with cupy_standin.installed() as cupy:
        def padded(host):
            rows = cupy.zeros((host.shape[0], 1088), dtype)[:, :host.shape[1]]
            rows[...] = cupy.asarray(host)
            return rows
        out = padded(before)
        cupy.counts.reset()
        fast_gpu.gemm(padded(a), padded(b), out, transpose_a, transpose_b, alpha=alpha,
                      accumulate=accumulate)
        calls = len(cupy.counts.gemms)
        out = out.get()
    # an extent along which some operand's elements are adjacent: out's N, a's K (M if
    # transposed), b's N (K if transposed)
    adjacent = {"N", "M" if transpose_a else "K"} | ({"K"} if transpose_b else set())
    vector = 16 // numpy.dtype(dtype).itemsize
    assert calls == (2 if wide in adjacent and extent % vector else 1)
    assert_close(out, expected, BOUND[dtype] * 10, f"split gemm {numpy.dtype(dtype).name}")
