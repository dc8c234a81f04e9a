"""The packed self-attention (packing.py) against the padded fast op it stands in for.

The reference is fast.self_attention_* on the padded batch unpack(x), whose padded keys get
probability exactly 0: so the packed ops, which attend from each row's tokens to that row's
tokens only, must give the same context, dx (at the attended tokens), dw_qkv and db_qkv up
to summation order. Bounds, relative to the largest |expected| (rel_error), in units of
the dtype's eps (2^-52, 2^-23):
- float64 1e-12 (4,500 eps);
- float32 2^-16 (128 eps).
Measured worst over 1,500 random draws of this test's kind (seeded, outside hypothesis):
context 12 eps float32 / 6.5 eps float64; dx, dw_qkv, db_qkv 17-22 eps float32 / 19-24 eps
float64 (2.6e-6 and 5.3e-15 at most): the packed rows sum fewer terms than the padded ones
(no zero-probability keys) in other BLAS blockings, and the softmax backward subtracts
nearly equal terms, which turns a few ulp of the probabilities into ~20 of the largest
gradient.
"""
import threading

import numpy
import pytest
from hypothesis import assume, given, settings, strategies as st

from conftest import record
from nanobert.model import fast, fast_cpu, ops, packing, threads
from nanobert.model.packing import Packing, pack, packing_of, unpack
from nanobert.testing import check_gradients, rel_error

SETTINGS = settings(max_examples=40, deadline=None)
BOUND = {numpy.float64: 1e-12, numpy.float32: 2.0**-16}


def full_packing(B, T):
    """The Packing of a batch with no padding, which packing_of declines to make (None)."""
    return Packing(numpy.arange(B * T), numpy.arange(B) * T, numpy.full(B, T), (B, T))


@st.composite
def packed_cases(draw):
    """(attention_mask [B, T], its Packing, H, A): right padding, holes anywhere, or none."""
    B, T = draw(st.integers(1, 5)), draw(st.integers(1, 40))
    H = draw(st.sampled_from([8, 12, 16]))
    A = draw(st.sampled_from([a for a in (1, 2, 3, 4, 8) if H % a == 0]))
    layout = draw(st.sampled_from(["right", "holes", "full"]))
    rng = numpy.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    if layout == "full":
        return numpy.ones((B, T), numpy.int64), full_packing(B, T), H, A, rng
    if layout == "right":
        lengths = rng.integers(1, T + 1, size=B)
        mask = (numpy.arange(T) < lengths[:, None]).astype(numpy.int64)
    else:                                   # any pattern with at least one token per row
        mask = (rng.random((B, T)) < rng.random()).astype(numpy.int64)
        mask[numpy.arange(B), rng.integers(0, T, size=B)] = 1
    found = packing_of(mask)
    assume(found is not None)               # all ones by chance: the "full" layout's case
    return mask, found, H, A, rng


def layer(rng, H, dtype):
    """w_qkv [3H, H], b_qkv [3H] of a trained layer's scale: scores spread over a few units."""
    return ((rng.standard_normal((3 * H, H)) / numpy.sqrt(H) * 2).astype(dtype),
            (rng.standard_normal(3 * H) * 0.5).astype(dtype))


def within(actual, expected, dtype, name):
    err = record(f"packed attention {name} {numpy.dtype(dtype).name}",
                 rel_error(actual, expected))
    assert err <= BOUND[dtype], f"{name}: relative error {err:.3e} > {BOUND[dtype]:.1e}"


@SETTINGS
@given(case=packed_cases(), dtype=st.sampled_from([numpy.float32, numpy.float64]))
def test_packed_attention_equals_the_padded_fast_op(case, dtype):
    mask, pk, H, A, rng = case
    x = rng.standard_normal((int(pk.lengths.sum()), H)).astype(dtype)     # [N, H]
    w_qkv, b_qkv = layer(rng, H, dtype)
    dcontext = rng.standard_normal(x.shape).astype(dtype)
    bias = ops.attention_mask_bias(mask, dtype)
    context, cache = packing.self_attention_forward(x, w_qkv, b_qkv, pk, A, 0.1, None, False)
    padded, padded_cache = fast.self_attention_forward(unpack(x, pk), w_qkv, b_qkv, bias, A,
                                                       0.1, None, False)
    within(context, pack(padded, pk), dtype, "context")
    dx, dw_qkv, db_qkv = packing.self_attention_backward(dcontext, cache)
    padded_dx, padded_dw, padded_db = fast.self_attention_backward(unpack(dcontext, pk),
                                                                   padded_cache)
    within(dx, pack(padded_dx, pk), dtype, "dx")
    within(dw_qkv, padded_dw, dtype, "dw_qkv")
    within(db_qkv, padded_db, dtype, "db_qkv")
    inference = packing.self_attention_inference(x, w_qkv, b_qkv, pk, A)
    assert numpy.array_equal(inference, context), "inference differs from forward's context"


def test_backward_writes_into_given_gradient_buffers(rng):
    """dw_qkv and db_qkv given: the gradients land in them, as fast.linear_backward does."""
    mask = numpy.array([[1, 1, 1, 0, 0], [1, 0, 1, 1, 1]])
    pk = packing_of(mask)
    x = rng.standard_normal((int(pk.lengths.sum()), 8))
    w_qkv, b_qkv = layer(rng, 8, numpy.float64)
    _, cache = packing.self_attention_forward(x, w_qkv, b_qkv, pk, 2, 0.0, None, True)
    dcontext = rng.standard_normal(x.shape)
    dw, db = numpy.empty_like(w_qkv), numpy.empty_like(b_qkv)
    _, dw_out, db_out = packing.self_attention_backward(dcontext, cache, dw, db)
    expected = packing.self_attention_backward(dcontext, cache)
    assert dw_out is dw and db_out is db
    assert numpy.array_equal(dw, expected[1]) and numpy.array_equal(db, expected[2])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_packed_attention_backward_with_dropout_matches_central_differences(seed):
    """float64, attention dropout 0.3 in training, the mask held fixed: every evaluation
    draws it from a generator reseeded to the same seed."""
    rng = numpy.random.default_rng(seed)
    mask = numpy.array([[1, 1, 1, 1, 0, 0], [1, 0, 1, 1, 0, 1], [1, 1, 1, 1, 1, 1]])
    pk = packing_of(mask)
    H, A = 8, 2
    w_qkv, b_qkv = layer(rng, H, numpy.float64)
    inputs = {"x": rng.standard_normal((int(pk.lengths.sum()), H)), "w_qkv": w_qkv,
              "b_qkv": b_qkv}

    def forward(x, w_qkv, b_qkv):
        drop_rng = numpy.random.default_rng(100 + seed)
        return packing.self_attention_forward(x, w_qkv, b_qkv, pk, A, 0.3, drop_rng, True)

    _, cache = forward(**inputs)
    assert 0 < (cache.dropout_mask == 0).sum() < cache.dropout_mask.size   # some dropped
    errors = check_gradients(forward, packing.self_attention_backward, inputs,
                             seed=seed, five_point=True, name="packed self-attention")
    record("packed attention dropout gradient check", max(errors.values()))


def test_packed_dropout_drops_about_p_of_the_probabilities():
    """Training with p = 0.2 drops a fraction of the [A, L, L] probabilities within 5
    binomial standard deviations of p, scales the kept ones by 1/(1-p); eval mode and p = 0
    draw nothing from the generator."""
    rng = numpy.random.default_rng(5)
    mask = (numpy.arange(64) < rng.integers(20, 65, size=6)[:, None]).astype(numpy.int64)
    pk = packing_of(mask)
    x = rng.standard_normal((int(pk.lengths.sum()), 16))
    w_qkv, b_qkv = layer(rng, 16, numpy.float64)
    p = 0.2
    _, cache = packing.self_attention_forward(x, w_qkv, b_qkv, pk, 4, p,
                                              numpy.random.default_rng(6), True)
    n = cache.dropout_mask.size
    dropped = float((cache.dropout_mask == 0).mean())
    record("packed attention dropped fraction - p", abs(dropped - p))
    assert abs(dropped - p) <= 5 * numpy.sqrt(p * (1 - p) / n), f"dropped {dropped} of {n}"
    assert set(numpy.unique(cache.dropout_mask)) == {0.0, 1.0 / (1.0 - p)}
    assert numpy.array_equal(cache.probs_dropped, cache.probs * cache.dropout_mask)
    for p, training in ((p, False), (0.0, True)):
        untouched = numpy.random.default_rng(7)
        _, cache = packing.self_attention_forward(x, w_qkv, b_qkv, pk, 4, p, untouched, training)
        assert cache.dropout_mask is None and cache.probs_dropped is cache.probs
        assert untouched.random() == numpy.random.default_rng(7).random(), "a draw was made"


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_packed_attention_bitwise_the_same_for_1_and_2_threads(monkeypatch, dtype):
    """Forward (dropout drawn), backward and inference: 24 rows, enough that both threads
    take rows (a mutation that draws the dropout in the workers failed here 6 runs of 6).
    The Q, K, V projection runs as one BLAS call: a pooled matmul's bits depend on the
    thread count (fast_cpu.pooled_matmul; test_fast bounds it)."""
    monkeypatch.setattr(fast_cpu, "POOLED_MATMUL_MNK", float("inf"))
    rng = numpy.random.default_rng(8)
    B, T, H, A = 24, 96, 64, 4
    mask = (numpy.arange(T) < rng.integers(30, T + 1, size=B)[:, None]).astype(numpy.int64)
    mask[3, 5:9] = 0                                        # a hole
    pk = packing_of(mask)
    x = rng.standard_normal((int(pk.lengths.sum()), H)).astype(dtype)
    w_qkv, b_qkv = layer(rng, H, dtype)
    dcontext = rng.standard_normal(x.shape).astype(dtype)

    def run():
        context, cache = packing.self_attention_forward(x, w_qkv, b_qkv, pk, A, 0.1,
                                                        numpy.random.default_rng(9), True)
        return (context, cache.probs, cache.probs_dropped,
                *packing.self_attention_backward(dcontext, cache),
                packing.self_attention_inference(x, w_qkv, b_qkv, pk, A))

    monkeypatch.setenv("NANOBERT_THREADS", "1")
    alone = run()
    monkeypatch.setenv("NANOBERT_THREADS", "2")
    threaded = run()
    names = ("context", "probs", "probs_dropped", "dx", "dw_qkv", "db_qkv", "inference")
    for name, a, b in zip(names, alone, threaded):
        assert a.dtype == b.dtype and numpy.array_equal(a, b), f"{name}: 2 threads differ"


def test_rows_per_block_runs_small_arrays_on_the_pool(monkeypatch):
    """in_row_blocks(rows_per_block=1) over a [2] array, far below MIN_PARALLEL, still runs
    its two rows at once: row 0 waits for row 1, which only another thread can run."""
    monkeypatch.setenv("NANOBERT_THREADS", "2")
    row_1_ran = threading.Event()
    waited = []

    def kernel(rows):
        if rows[0] == 1:
            row_1_ran.set()
        else:
            waited.append(row_1_ran.wait(timeout=10))

    threads.in_row_blocks(kernel, (numpy.arange(2),), rows_per_block=1)
    assert waited == [True], "row 0 waited in vain: the rows ran one after the other"


def test_packed_attention_refuses_what_it_cannot_take(rng):
    pk = packing_of(numpy.array([[1, 1, 0]]))
    w_qkv, b_qkv = layer(rng, 8, numpy.float32)
    half = rng.standard_normal((2, 8)).astype(numpy.float16)
    with pytest.raises(TypeError, match="NumPy float32 or float64 array, got ndarray of float16"):
        packing.self_attention_forward(half, w_qkv, b_qkv, pk, 2, 0.0, None, False)
    with pytest.raises(ValueError, match=r"x must be \[N=2, H\] .* got shape \(3, 8\)"):
        packing.self_attention_inference(rng.standard_normal((3, 8)), w_qkv, b_qkv, pk, 2)
    with pytest.raises(ValueError, match="divisible by num_heads=3"):
        packing.self_attention_inference(rng.standard_normal((2, 8)), w_qkv, b_qkv, pk, 3)
