"""The CUDA kernels of the GPU path (kernels.cuda_source: the row kernels, LayerNorm and the
attention's mask + softmax + dropout, forward and backward, one warp a row; the map kernels,
GELU, dropout and the attention's head layouts, 16 bytes of each input a thread) run on the
CPU by tests/cuda_emulation.py (the same source, 32 lanes a warp, shuffles included) against
the reference ops of ops.py, for hypothesis-drawn shapes: rows that leave a block's warps
idle, rows shorter than a warp and longer, lengths that are no multiple of 32, arrays that
end inside a thread's elements.
float64 within 1e-13; float32 within a few ulp; float16 activations (statistics in float32)
within one float16 rounding of the float32 reference; every call with its arrays between
guard bytes, which no kernel may write. CUDA's own rounding (fma contraction) and speed are
not shown here; nvcc compiles the source in tests/test_kernels_compile.py.
"""
import re

import numpy
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import cuda_emulation
from conftest import record, rel_error
from counter_reference import keep_mask, split64
from nanobert.model import fast_gpu, kernels, ops

pytestmark = pytest.mark.skipif(not cuda_emulation.available(),
                                reason="g++ is needed to run the CUDA kernels on the CPU")

DTYPES = [numpy.float64, numpy.float32, numpy.float16]
# relative bound on each result against the float64 reference of the same inputs
BOUND = {numpy.float64: 1e-13, numpy.float32: 3e-6, numpy.float16: 2e-3}


def stats(dtype):
    return numpy.float32 if dtype == numpy.float16 else dtype


def run(name, dtype, rows, *args):
    """The row kernel on NumPy arrays, launched as fast_gpu._launch_rows launches it."""
    (grid,), (block,) = fast_gpu._row_grid(rows)
    guarded(name, dtype, grid, block, args)


def run_map(name, dtype, n, *args):
    """The map kernel on NumPy arrays, launched as fast_gpu._launch_map launches it."""
    (grid,), (block,) = fast_gpu._map_grid(n, dtype)
    guarded(name, dtype, grid, block, args)


GUARD = 64                   # elements of a sentinel on either side of each array


def guarded(name, dtype, grid, block, args, tile=None):
    """The kernel called with each C-contiguous array moved into the middle of a buffer
    whose GUARD elements on either side hold a sentinel byte pattern; then each array is
    copied back, and every sentinel must be intact: a kernel that writes past an end of one
    of its arrays (a bounds check off by one, a wrong row length) fails here (or in the
    emulation's own guard pages: OutOfBounds). tile: the tensor-core attention's."""
    run = cuda_emulation.launch(kernels.cuda_source(numpy.dtype(dtype).char, tile),
                                "nanobert_" + name)
    placed, call = [], []
    for i, a in enumerate(args):
        if isinstance(a, numpy.ndarray) and a.flags.c_contiguous:
            buffer = numpy.empty(a.size + 2 * GUARD, a.dtype)
            buffer.view(numpy.uint8)[:] = 0xA5
            view = buffer[GUARD:GUARD + a.size].reshape(a.shape)
            view[...] = a
            placed.append((i, a, buffer, view))
            a = view
        call.append(a)
    run(grid, block, tuple(call))
    for i, a, buffer, view in placed:
        for edge in (buffer[:GUARD], buffer[-GUARD:]):
            assert not (edge.view(numpy.uint8) != 0xA5).any(), \
                f"{name} wrote outside its argument {i} ({a.dtype}, {a.shape})"
        a[...] = view


def check(name, actual, expected, dtype, scale=None):
    """Within BOUND of the result's largest element, or of `scale` where the result can
    cancel down to far below its terms (a gradient through a normalisation)."""
    actual = numpy.asarray(actual, numpy.float64)
    if scale is None:
        err = rel_error(actual, expected)
    else:
        err = numpy.abs(actual - expected).max() / max(scale, 1e-300)
    err = record(f"cuda kernel {name} {numpy.dtype(dtype).name}", err)
    assert err <= BOUND[dtype], f"{name} ({numpy.dtype(dtype).name}): {err:.2e}"


shapes = st.tuples(st.integers(1, 11), st.integers(1, 80))      # rows, row length


@settings(max_examples=12, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**16), dtype=st.sampled_from(DTYPES))
def test_layernorm_kernels_equal_the_reference(shape, seed, dtype):
    rows, H = shape
    rng = numpy.random.default_rng(seed)
    x = (rng.standard_normal((rows, H)) * 3 + 1).astype(dtype)
    gamma, beta = (rng.standard_normal(H).astype(dtype) for _ in range(2))
    dout = rng.standard_normal((rows, H)).astype(dtype)
    S = stats(dtype)
    xhat, out = numpy.empty((rows, H), S), numpy.empty((rows, H), dtype)
    rstd = numpy.empty((rows, 1), S)
    run("layernorm_forward", dtype, rows, x, gamma, beta, S(1e-12), numpy.int64(rows),
        numpy.int32(H), xhat, out, rstd)
    wide = [a.astype(numpy.float64) for a in (x, gamma, beta, dout)]
    expected, cache = ops.layernorm_forward(*wide[:3], 1e-12)
    check("layernorm out", out, expected, dtype)
    check("layernorm xhat", xhat, cache[0], dtype)
    check("layernorm rstd", rstd, cache[2], dtype)

    dx, dout_xhat = numpy.empty((rows, H), dtype), numpy.empty((rows, H), S)
    run("layernorm_backward", dtype, rows, dout, gamma, xhat, rstd, numpy.int64(rows),
        numpy.int32(H), dx, dout_xhat)
    # the reference from the kernel's own cache, so that only the backward's error counts
    expected_dx = ops.layernorm_backward(wide[3], (xhat.astype(numpy.float64), wide[1],
                                                   rstd.astype(numpy.float64)))[0]
    # dx cancels: with H = 2 it is 0 whatever dout (xhat is +-1); its terms are dxhat rstd
    terms = numpy.abs(wide[3] * wide[1] * rstd.astype(numpy.float64)).max()
    check("layernorm dx", dx, expected_dx, dtype, scale=terms)
    check("layernorm dout*xhat", dout_xhat, wide[3] * xhat, dtype)


def attention_case(seed, dtype, B, A, T):
    rng = numpy.random.default_rng(seed)
    scores = (rng.standard_normal((B, A, T, T)) * 2).astype(dtype)
    attention_mask = (rng.random((B, T)) < 0.7).astype(numpy.int64)
    attention_mask[:, 0] = 1
    bias = ops.attention_mask_bias(attention_mask, dtype)            # [B, 1, 1, T]
    dprobs = rng.standard_normal((B, A, T, T)).astype(dtype)
    return scores, bias, dprobs


# a counter-based draw: (seed, step, call), any 64-bit seed and step, any 32-bit call index
draws = st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1),
                  st.integers(0, 2**32 - 1))


def draw_arguments(draw, dtype, p):
    """A draw as the dropout kernels take it: the step as a 0-d uint64 array (the device
    counter), the seed's two words, the call index, p and the keep scale in S."""
    seed, step, call = draw
    S = stats(dtype)
    return (numpy.array(step, numpy.uint64), *(numpy.uint32(w) for w in split64(seed)),
            numpy.uint32(call), S(p), S(dtype(1.0 / (1.0 - p))))


@settings(max_examples=12, deadline=None)
@given(shape=st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 40)),
       seed=st.integers(0, 2**16), dtype=st.sampled_from(DTYPES),
       p=st.sampled_from([0.0, 0.1, 0.5]), masked=st.booleans(), draw=draws)
def test_softmax_kernels_equal_the_reference(shape, seed, dtype, p, masked, draw):
    """Mask bias (each batch element's own), softmax, dropout with its keep mask drawn in
    the kernel (element index row * T + key: a row of T not a multiple of 4 starts inside a
    Philox block), bitwise the reference's probs * mask; the backward through the mask,
    regenerated, and softmax."""
    B, A, T = shape
    scores, bias, dprobs = attention_case(seed, dtype, B, A, T)
    rows = B * A * T
    probs, dropped = (numpy.empty(scores.shape, dtype) for _ in range(2))
    arguments = draw_arguments(draw, dtype, p if p > 0 else 0.5)
    run("softmax_forward", dtype, rows, scores, bias, numpy.int32(masked),
        numpy.int64(A * T), numpy.int64(rows), numpy.int32(T), *arguments,
        numpy.int32(p > 0), probs, dropped)
    # the reference: the masked scores rounded to the activations' dtype, as the model's
    # `scores += bias` is, then softmax and dropout in float64
    masked_scores = (scores + bias).astype(dtype) if masked else scores
    expected, _ = ops.softmax_forward(masked_scores.astype(numpy.float64))
    check("softmax probs", probs, expected, dtype)
    keep = keep_mask(*draw, scores.shape, dtype, p) if p > 0 else None
    if p > 0:
        assert numpy.array_equal(dropped, probs * keep)            # rounded to dtype

    dscores = numpy.empty(scores.shape, dtype)
    run("softmax_backward", dtype, rows, dprobs, *arguments, numpy.int32(p > 0), probs,
        numpy.int64(rows), numpy.int32(T), dscores)
    g = dprobs.astype(numpy.float64)
    if p > 0:
        g = (dprobs * keep).astype(numpy.float64)          # dropout's product, in dtype
    expected_dscores = ops.softmax_backward(g, probs.astype(numpy.float64))
    check("softmax dscores", dscores, expected_dscores, dtype, scale=numpy.abs(g).max())


def test_a_fully_masked_row_gives_uniform_probabilities():
    """A row whose keys are all padding: every score -10000 (ops.attention_mask_bias), a
    uniform softmax, as the reference (no NaN)."""
    scores = numpy.zeros((1, 1, 2, 5))
    bias = numpy.full((1, 1, 1, 5), -10000.0)
    probs = numpy.empty_like(scores)
    run("softmax_forward", numpy.float64, 2, scores, bias, numpy.int32(1), numpy.int64(2),
        numpy.int64(2), numpy.int32(5), *draw_arguments((0, 0, 0), numpy.float64, 0.5),
        numpy.int32(0), probs, numpy.empty(1))
    assert numpy.array_equal(probs, numpy.full_like(scores, 0.2))


@pytest.mark.parametrize("bad, message", [
    (lambda args: args.__setitem__(4, 2), "a numpy.int64 scalar, not a int"),
    (lambda args: args.__setitem__(3, 1e-12), "a numpy.float64 scalar, not a float"),
    (lambda args: args.__setitem__(0, numpy.ones((6, 2)).T), "C-contiguous"),
    (lambda args: args.__setitem__(0, args[0].astype(numpy.float32)), "a float64 array"),
    (lambda args: args.pop(), "8 arguments for 9 parameters"),
])
def test_a_call_that_cuda_would_misread_is_refused(bad, message):
    """What CuPy would pass wrongly and a kernel misread silently: a Python int (8 bytes) or
    float (a double) for a typed scalar, a strided view, another dtype, a missing argument."""
    x = numpy.ones((2, 6))
    args = [x, numpy.ones(6), numpy.zeros(6), numpy.float64(1e-12), numpy.int64(2),
            numpy.int32(6), numpy.empty((2, 6)), numpy.empty((2, 6)), numpy.empty(2)]
    bad(args)
    with pytest.raises(TypeError, match=message):
        run("layernorm_forward", numpy.float64, 2, *args)


# ---------------------------------------------------------------------------- map kernels
# lengths around a block's span (256 threads of 2-8 elements): a partial thread, a partial
# block, several blocks
lengths = st.one_of(st.integers(1, 40), st.integers(500, 5000))


@settings(max_examples=12, deadline=None)
@given(n=lengths, seed=st.integers(0, 2**16), dtype=st.sampled_from(DTYPES))
@example(n=1, seed=22, dtype=numpy.float32)          # x = -4.19: Phi in erf's tail
def test_gelu_kernels_equal_the_reference(n, seed, dtype):
    rng = numpy.random.default_rng(seed)
    x = (rng.standard_normal(n) * 3).astype(dtype)
    dout = rng.standard_normal(n).astype(dtype)
    S = stats(dtype)
    y, cdf = numpy.empty(n, dtype), numpy.empty(n, S)
    run_map("gelu_forward", dtype, n, x, numpy.int64(n), y, cdf)
    expected, (_, expected_cdf, _) = ops.gelu_forward(x.astype(numpy.float64))
    # Phi = (1 + erf) / 2 is right to an ulp of 1, not of a tail's tiny Phi (x = -4.2: Phi
    # 1.4e-5); so y = x Phi to an ulp of |x|, dx to one of |dout|
    check("gelu y", y, expected, dtype, scale=numpy.abs(x.astype(float)).max())
    check("gelu Phi", cdf, expected_cdf, dtype, scale=1.0)
    dx = numpy.empty(n, dtype)
    run_map("gelu_backward", dtype, n, dout, x, cdf, numpy.int64(n), dx)
    # the reference from the kernel's own Phi, so that only the backward's error counts
    expected_dx = ops.gelu_backward(dout.astype(numpy.float64),
                                    (x.astype(numpy.float64), cdf.astype(numpy.float64), "gelu"))
    check("gelu dx", dx, expected_dx, dtype, scale=numpy.abs(dout.astype(float)).max())


@settings(max_examples=12, deadline=None)
@given(n=lengths, seed=st.integers(0, 2**16), dtype=st.sampled_from(DTYPES),
       p=st.sampled_from([0.1, 0.5]), add=st.booleans(), draw=draws)
def test_dropout_kernels_equal_the_reference(n, seed, dtype, p, add, draw):
    """The keep mask drawn in the kernel is exactly (u >= p) * 1/(1 - p) of NumPy's Philox
    (tests/counter_reference.py) for the same (seed, step, call): out the reference's
    x * mask (+ residual), each product and sum rounded to the dtype, bitwise; the backward
    dout times the mask it regenerates, bitwise."""
    rng = numpy.random.default_rng(seed)
    x, residual, dout = (rng.standard_normal(n).astype(dtype) for _ in range(3))
    out = numpy.empty(n, dtype)
    arguments = draw_arguments(draw, dtype, p)
    run_map("dropout", dtype, n, x, *arguments, numpy.int32(add), residual if add else x,
            numpy.int64(n), out)
    keep = keep_mask(*draw, (n,), dtype, p)
    expected = x * keep                                # rounded to dtype, as the reference
    if add:
        expected = expected + residual
    assert numpy.array_equal(out, expected), numpy.abs(out - expected).max()
    dx = numpy.empty(n, dtype)
    run_map("dropout_backward", dtype, n, dout, *arguments, numpy.int64(n), dx)
    assert numpy.array_equal(dx, ops.dropout_backward(dout, keep))


@settings(max_examples=12, deadline=None)
@given(shape=st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 9),
                       st.integers(1, 9)),
       seed=st.integers(0, 2**16), dtype=st.sampled_from(DTYPES))
def test_head_kernels_move_every_element_to_its_place(shape, seed, dtype):
    """The attention's layouts, for head sizes that leave a thread's elements spanning heads,
    positions and batch rows: q, k, v [B, A, T, D] from the projection [B, T, 3H] plus its
    bias, q times 1/sqrt(D), each rounded to dtype as the reference's `+` and `*` (bitwise);
    the gradients back into [B, T, 3H]; the context to [B, T, H] and its gradient back."""
    B, A, T, D = shape
    H = A * D
    rng = numpy.random.default_rng(seed)
    qkv = rng.standard_normal((B, T, 3 * H)).astype(dtype)
    bias = rng.standard_normal(3 * H).astype(dtype)
    scale = dtype(1.0 / numpy.sqrt(D))
    heads = (qkv + bias).reshape(B, T, 3, A, D).transpose(2, 0, 3, 1, 4)  # [3, B, A, T, D]
    n, dims = B * A * T * D, (numpy.int32(A), numpy.int32(T), numpy.int32(D))
    q, k, v = (numpy.empty((B, A, T, D), dtype) for _ in range(3))
    run_map("attention_heads", dtype, n, qkv, bias, stats(dtype)(scale), *dims, numpy.int64(n),
            q, k, v)
    for name, actual, expected in (("q", q, heads[0] * scale), ("k", k, heads[1]),
                                   ("v", v, heads[2])):
        assert numpy.array_equal(actual, expected), name

    dq, dk, dv = (rng.standard_normal((B, A, T, D)).astype(dtype) for _ in range(3))
    dqkv = numpy.empty((B, T, 3 * H), dtype)
    run_map("attention_grads", dtype, n, dq, dk, dv, stats(dtype)(scale), *dims,
            numpy.int64(n), dqkv)
    expected = numpy.stack([dq * scale, dk, dv]).transpose(1, 3, 0, 2, 4).reshape(B, T, 3 * H)
    assert numpy.array_equal(dqkv, expected)

    context = numpy.empty((B, T, H), dtype)
    run_map("move_heads", dtype, n, q, numpy.int32(1), *dims, numpy.int64(n), context)
    assert numpy.array_equal(context, q.transpose(0, 2, 1, 3).reshape(B, T, H))
    back = numpy.empty((B, A, T, D), dtype)
    run_map("move_heads", dtype, n, context, numpy.int32(0), *dims, numpy.int64(n), back)
    assert numpy.array_equal(back, q)


@settings(max_examples=12, deadline=None)
@given(shape=st.tuples(st.integers(1, 9), st.one_of(st.integers(2, 40), st.integers(300, 700))),
       seed=st.integers(0, 2**16), dtype=st.sampled_from(DTYPES),
       dloss=st.sampled_from([1.0, 0.25, 1024.0]), padding=st.sampled_from([0, 1, 6, 64]))
@example(shape=(5, 37), seed=1, dtype=numpy.float16, dloss=1.0, padding=27)
def test_cross_entropy_kernels_equal_the_reference(shape, seed, dtype, dloss, padding):
    """Rows of classes shorter and longer than a warp, some labels -100: the per-row loss
    (0 where ignored), and dlogits = (softmax - onehot) dloss / denominator (0 rows where
    ignored), against ops.py in float64 on the same logits. With padding, the logits and
    dlogits are views of rows `padding` elements longer (the vocab's, fast_gpu._output_rows)
    whose padding holds NaN: the logits' never read (the results stay finite), dlogits'
    written as 0."""
    N, C = shape
    padding = padding if N > 1 else 0        # one row is contiguous (fast_gpu._padded_rows)
    rng = numpy.random.default_rng(seed)
    logits = padded_rows((rng.standard_normal((N, C)) * 4).astype(dtype), padding)
    labels = rng.integers(0, C, N)
    labels[rng.random(N) < 0.3] = ops.IGNORE_INDEX
    S = stats(dtype)
    row_length = numpy.int64(C + padding)
    row_max, sum_exp, nll = (numpy.empty(N, S) for _ in range(3))
    run("cross_entropy_forward", dtype, N, logits, labels, numpy.int64(N), numpy.int32(C),
        row_length, row_max, sum_exp, nll)
    denominator = max(int((labels != ops.IGNORE_INDEX).sum()), 1)
    expected, cache = ops.cross_entropy_forward(logits.astype(numpy.float64), labels)
    check("cross-entropy loss", nll.astype(numpy.float64).sum() / denominator, expected, dtype,
          scale=max(abs(float(expected)), 1.0))
    assert not nll[labels == ops.IGNORE_INDEX].any()
    dlogits = padded_rows(numpy.empty((N, C), S), padding)
    run("cross_entropy_backward", dtype, N, logits, labels, row_max, sum_exp,
        numpy.full(1, dloss, S), S(denominator), numpy.int64(N), numpy.int32(C), row_length,
        dlogits)
    check("cross-entropy dlogits", dlogits, ops.cross_entropy_backward(dloss, cache), dtype,
          scale=dloss / denominator)
    if padding:
        assert (dlogits.base[:, C:] == 0).all(), "dlogits' padding is not 0"


def padded_rows(a, padding):
    """a [N, C] as a view of [N, C + padding] whose last `padding` columns hold NaN (a itself
    without padding)."""
    if not padding:
        return a
    rows = numpy.full((a.shape[0], a.shape[1] + padding), numpy.nan, a.dtype)
    rows[:, :a.shape[1]] = a
    return rows[:, :a.shape[1]]


def test_a_label_out_of_range_gives_a_nan_loss_not_a_read_past_the_row():
    logits = numpy.zeros((2, 5))
    labels = numpy.array([1, 5])
    row_max, sum_exp, nll = (numpy.empty(2) for _ in range(3))
    run("cross_entropy_forward", numpy.float64, 2, logits, labels, numpy.int64(2),
        numpy.int32(5), numpy.int64(5), row_max, sum_exp, nll)
    assert nll[0] == numpy.log(5) and numpy.isnan(nll[1])


OUT_OF_BOUNDS = """typedef float T;
extern "C" __global__ void nanobert_past_the_end(const T* x, int n, int reach, T* y) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n + reach) y[i] = x[i < n ? i : 0] * 2;
}
"""


def test_an_access_out_of_bounds_fails_the_test_naming_kernel_thread_and_index():
    """A kernel that writes past its output's end (by one element: into the bytes before the
    guard pages, caught by their sentinel; by 2,048: into the guard pages, caught as it
    happens, with its block and thread) raises OutOfBounds naming the kernel, the argument
    and the element, and the process goes on; the arrays keep what the kernel wrote inside."""
    run = cuda_emulation.launch(OUT_OF_BOUNDS, "nanobert_past_the_end")
    x, y = numpy.arange(100, dtype=numpy.float32), numpy.zeros(100, numpy.float32)
    where = "of argument 3 (y, float32 (100,), 100 elements)"
    with pytest.raises(cuda_emulation.OutOfBounds, match=re.escape(
            f"kernel nanobert_past_the_end: a write (its thread unknown: within 256 bytes of "
            f"an end) at element 100 {where}")):
        run(1, 128, (x, numpy.int32(100), numpy.int32(1), y))
    with pytest.raises(cuda_emulation.OutOfBounds) as caught:
        run(5, 512, (x, numpy.int32(100), numpy.int32(2048), y))
    found = re.fullmatch(rf"kernel nanobert_past_the_end: block (\d+), thread (\d+): an access "
                         rf"at element (\d+) {re.escape(where)}", str(caught.value))
    assert found, caught.value
    block, thread, element = map(int, found.groups())
    assert block * 512 + thread == element > 100, caught.value     # thread i writes y[i]
    assert (y == 2 * x).all()
    run(1, 128, (x, numpy.int32(100), numpy.int32(0), y))       # in bounds: no complaint
