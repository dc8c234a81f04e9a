"""The GPU path's numerics, op by op: fast_gpu on the device against fast_cpu (or ops.py where
fast_cpu has no twin) on the same values, and the whole BertForPreTraining loss and gradients
on device="gpu" against "cpu". Every test runs twice, on the `xp` fixture's backends:

- "standin": tests/cupy_standin.py installed, NumPy underneath. It proves this file's own
  logic (shapes, layouts, the comparisons, that the bounds can fail), nothing about CUDA.
- "cuda": the real CuPy on a GPU (skipped without one): the run a GPU session makes
  (docs/gpu.md). Small shapes, so it should take about a minute with the kernels' first
  compilation; not timed on a GPU yet.

Only public CuPy behaviour is used (asarray, get, asnumpy, a Generator), so both run the same
code. Bounds, relative to the largest magnitude of the expected result (rel_error):
float64 1e-12 (the issue's "float64 GPU = NumPy within 1e-12"); float32 with TF32 off,
K eps32 with K named per op (the reduction's length, or a few ulp of the math functions);
float16, one float16 rounding of the output's scale per float16 step the op stores (eps16
each: both sides round float32 results that differ in the last bits). The measured errors
are printed in the summary ("worst relative errors seen")."""
import os

import numpy
import pytest

import cupy_standin
from conftest import record
from counter_reference import (dropout_generator, keep_mask,
                               numpy_draws_like_the_gpu)
from nanobert import backend
from nanobert.model import counter_rng, fast, fast_cpu, fast_gpu, ops
from nanobert.model.config import BertConfig
from nanobert.model.pretraining import BertForPreTraining
from nanobert.testing import rel_error

EPS = {numpy.dtype(d): float(numpy.finfo(d).eps)
       for d in (numpy.float16, numpy.float32, numpy.float64)}
DTYPES = [numpy.float64, numpy.float32, numpy.float16]


@pytest.fixture(params=["standin", pytest.param("cuda", marks=[
    pytest.mark.gpu,
    pytest.mark.skipif(not backend.gpu_available(),
                       reason="needs a real GPU: CuPy sees no CUDA device here")])])
def xp(request, monkeypatch):
    """The device's array namespace, with TF32 off for the float32 products (restored after:
    monkeypatch records both variables set_tf32 writes)."""
    for name in ("NANOBERT_TF32", "CUPY_TF32"):
        if name in os.environ:
            monkeypatch.setenv(name, os.environ[name])
        else:
            monkeypatch.delenv(name, raising=False)
    was = backend.tf32_enabled()
    if request.param == "standin":
        with cupy_standin.installed() as cupy:
            backend.set_tf32(False)
            yield cupy
            backend.set_tf32(was)
    else:
        import cupy
        backend.set_tf32(False)
        yield cupy
        backend.set_tf32(was)


def host(x):
    """A device array, a tuple of them, or a 0-d loss -> NumPy (None stays None)."""
    if x is None or isinstance(x, (int, float)):
        return x
    if isinstance(x, tuple):
        return type(x)(*map(host, x)) if hasattr(x, "_fields") else tuple(map(host, x))
    return backend.to_host(x)


def check(name, actual, expected, bound, what):
    """rel_error(actual, expected) <= bound, recorded under `name` for the summary."""
    err = record(name, rel_error(host(actual), host(expected)))
    assert err <= bound, f"{name}: relative error {err:.3e} > bound {bound:.3e} ({what})"


def bound(dtype, K=1, half_steps=1):
    """The bound of the module docstring for a result of `dtype`: 1e-12 for float64, K eps
    for float32, half_steps eps16 for float16."""
    dtype = numpy.dtype(dtype)
    if dtype == numpy.float64:
        return 1e-12, "float64: 1e-12"
    if dtype == numpy.float32:
        return K * EPS[dtype], f"float32, TF32 off: {K} eps32"
    return half_steps * EPS[dtype], f"float16: {half_steps} eps16 of the output's scale"


def device_and_host(xp, run, grad_dtype=None):
    """run(put, zeros) -- put copies a host input to where it runs, zeros(shape) makes a
    gradient buffer there -- on the device and on the host -> [(device's, host's result)]."""
    actual = run(xp.asarray, lambda shape: xp.zeros(shape, grad_dtype))
    expected = run(lambda a: a.copy(), lambda shape: numpy.zeros(shape, grad_dtype))
    return list(zip(actual, expected))


def check_all(name, pairs, limit, what):
    """check() each (device's, host's) pair, whose dtypes must agree."""
    for i, (a, e) in enumerate(pairs):
        assert a.dtype == e.dtype, f"{name}: result {i} is {a.dtype}, the host's {e.dtype}"
        check(name, a, e, limit, f"{what}; result {i}")


def draw(shape, dtype, seed=0, scale=1.0):
    return (numpy.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)

# ------------------------------------------------------------------------- cuBLAS directly


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("transpose_a, transpose_b", [(False, False), (True, False),
                                                      (False, True), (True, True)])
def test_gemm_equals_the_host_product(xp, dtype, transpose_a, transpose_b):
    """fast_gpu.gemm on stacks [2, 3] of [5, 24] @ [24, 6] (K = 24), either operand stored
    transposed (an op flag), `a` read from the first columns of wider rows and the product
    written into a strided out, against fast_cpu.matmul of the same values. Per element:
    |err| <= K eps32 sum|a||b| (the sums' order; float64: eps64) + eps16 |expected| (float16:
    one rounding of the float32 sum), and relative to the largest product 1e-12 for float64.
    The out's columns beside the product are left alone."""
    K = 24
    a, b = draw((2, 3, 5, K), dtype, 1), draw((2, 3, K, 6), dtype, 2)
    a_stored = a.swapaxes(-1, -2) if transpose_a else a
    b_stored = b.swapaxes(-1, -2) if transpose_b else b
    wide = numpy.zeros(a_stored.shape[:-1] + (a_stored.shape[-1] + 3,), dtype)
    wide[..., :a_stored.shape[-1]] = a_stored
    device_a = xp.asarray(wide)[..., :a_stored.shape[-1]]          # rows 3 elements longer
    device_b = xp.asarray(numpy.ascontiguousarray(b_stored))
    out_wide = xp.zeros((2, 3, 5, 8), dtype)
    result = fast_gpu.gemm(device_a, device_b, out_wide[..., 1:7], transpose_a, transpose_b)
    actual = xp.asnumpy(out_wide)
    expected = fast_cpu.matmul(a, b)
    sums = numpy.abs(a.astype(float)) @ numpy.abs(b.astype(float))
    accumulate = EPS[numpy.dtype(numpy.float64 if dtype == numpy.float64 else numpy.float32)]
    allowed = K * accumulate * sums
    if dtype == numpy.float16:
        allowed += EPS[numpy.dtype(dtype)] * numpy.abs(expected.astype(float))
    err = numpy.abs(actual[..., 1:7].astype(float) - expected.astype(float))
    name = f"gpu gemm {numpy.dtype(dtype).name}"
    record(name, rel_error(actual[..., 1:7], expected))
    assert result.shape == (2, 3, 5, 6)
    within = bool((err <= allowed).all())        # a bool: no array dump in the failure
    assert within, (f"{name} T{transpose_a:d}{transpose_b:d}: worst element "
                                    f"error / its bound {(err / allowed).max():.3f} > 1 (bound: "
                                    f"{K} eps of sum|a||b| + float16: eps16 |expected|)")
    if dtype == numpy.float64:
        check(name, actual[..., 1:7], expected, *bound(dtype))
    assert not actual[..., 0].any() and not actual[..., 7].any(), "gemm wrote beside its out"


@pytest.mark.parametrize("dtype, out_dtype", [(numpy.float64, None), (numpy.float32, None),
                                              (numpy.float16, numpy.float32)])
def test_column_sum_equals_numpy(xp, dtype, out_dtype):
    """fast_gpu.column_sum of [N=37, H=48] (a ones-vector product in cuBLAS, never TF32)
    against fast_cpu.column_sum (NumPy's axis-0 sum); float16 rows summed into a float32 out
    (no float16 rounding: the float32 bound, K = N)."""
    x = draw((37, 48), dtype, 3, scale=4.0)
    out = None if out_dtype is None else xp.zeros(48, out_dtype)
    actual = fast_gpu.column_sum(xp.asarray(x), out=out, dtype=out_dtype)
    expected = fast_cpu.column_sum(x, dtype=out_dtype)
    assert actual.dtype == expected.dtype and (out is None or actual is out)
    check(f"gpu column_sum {numpy.dtype(dtype).name}", actual, expected,
          *bound(out_dtype or dtype, K=37))


# ------------------------------------------------------------------------------ the ops


# linear: [2, 7, 32] -> [2, 7, 24] (K = 32, the longest sum: 14 rows for dweight; float16: 2
# eps16, the product's rounding, then the bias added to it and rounded again); linear_gelu:
# [2, 40, 32] -> [2, 40, 24] (80 rows: two tiles of the device's bias-gradient sums, the second
# partial; K = 80, dbias's and dweight's; float16: 3 eps16, the product, the bias's add and
# GELU each rounded). name -> (forward, backward, rows per sequence, K, half_steps)
LINEARS = {"linear": (fast.linear_forward, fast.linear_backward, 7, 32, 2),
           "linear_gelu": (fast.linear_gelu_forward, fast.linear_gelu_backward, 40, 80, 3)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", LINEARS)
def test_linear_forward_backward(xp, dtype, name):
    """fast.linear(_gelu)_forward/backward: out, dx, dweight, dbias; float16 weight and bias
    gradients into float32 buffers, as the model's."""
    forward, backward, T, K, half_steps = LINEARS[name]
    seed = 4 if name == "linear" else 27
    x, w = draw((2, T, 32), dtype, seed), draw((24, 32), dtype, seed + 1, 0.3)
    b, dout = draw(24, dtype, seed + 2), draw((2, T, 24), dtype, seed + 3)
    grad_dtype = numpy.float32 if dtype == numpy.float16 else dtype

    def run(put, zeros):
        out, cache = forward(put(x), put(w), put(b))
        return (out,) + backward(put(dout), cache, zeros(w.shape), zeros(24))
    check_all(f"gpu {name} {numpy.dtype(dtype).name}", device_and_host(xp, run, grad_dtype),
              *bound(dtype, K=K, half_steps=half_steps))


@pytest.mark.parametrize("dtype", DTYPES)
def test_layernorm_forward_backward(xp, dtype):
    """fast.layernorm_forward/backward over H = 48 (rows offset and scaled, as residual
    streams are): out, dx, dgamma, dbeta (float16: statistics in float32, gradients of
    gamma and beta into float32 buffers; one warp a row, kernels.cu). K = 4 H:
    mean, variance and the two row means of the backward each sum H terms; float16 outputs:
    2 eps16 (xhat's float32 rounding amplified by gamma, then the float16 rounding)."""
    x = draw((3, 5, 48), dtype, 8, 3.0) + dtype(1.5)
    gamma, beta = draw(48, dtype, 9) + dtype(1), draw(48, dtype, 10)
    dout = draw((3, 5, 48), dtype, 11)
    grad_dtype = numpy.float32 if dtype == numpy.float16 else dtype

    def run(put, zeros):
        out, cache = fast.layernorm_forward(put(x), put(gamma), put(beta), 1e-12)
        return (out,) + fast.layernorm_backward(put(dout), cache, zeros(48), zeros(48))
    check_all(f"gpu layernorm {numpy.dtype(dtype).name}", device_and_host(xp, run, grad_dtype),
              *bound(dtype, K=4 * 48, half_steps=2))


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_and_norm_forward_backward(xp, dtype):
    """fast.dropout_add_layernorm_forward/backward, p = 0.25 on [3, 5, 48] (the device's one
    row kernel each way, the host's blocks of rows) with the same keep masks (the host twin
    of the counter-based generator): out, dx, dresidual, dgamma, dbeta within LayerNorm's
    bounds (K = 4 H; float16 3 eps16: the sum's rounding before LayerNorm's two)."""
    x = draw((3, 5, 48), dtype, 22, 3.0) + dtype(1.5)
    residual, dout = draw((3, 5, 48), dtype, 23), draw((3, 5, 48), dtype, 24)
    gamma, beta = draw(48, dtype, 25) + dtype(1), draw(48, dtype, 26)
    grad_dtype = numpy.float32 if dtype == numpy.float16 else dtype

    def run(put, zeros):
        rng = dropout_generator(backend.array_module(put(x)), 3)
        with numpy_draws_like_the_gpu():
            out, cache = fast.dropout_add_layernorm_forward(put(x), put(residual), put(gamma),
                                                            put(beta), 1e-12, 0.25, rng, True)
        return (out,) + fast.dropout_add_layernorm_backward(put(dout), cache, zeros(48),
                                                            zeros(48))
    check_all(f"gpu add & norm {numpy.dtype(dtype).name}", device_and_host(xp, run, grad_dtype),
              *bound(dtype, K=4 * 48, half_steps=3))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_forward_backward(xp, dtype):
    """fast.gelu_forward/backward ("gelu", erf) on [4, 33] spanning +-6: CUDA's erf/erff
    against NumPy's (float32: fast_cpu's 7.7-ulp rational erf, CUDA's erff 2 ulp; K = 16);
    float16 computed in float32, one rounding each side."""
    x = numpy.linspace(-6, 6, 4 * 33).reshape(4, 33).astype(dtype)
    dout = draw((4, 33), dtype, 12)

    def run(put, zeros):
        out, cache = fast.gelu_forward(put(x))
        return out, fast.gelu_backward(put(dout), cache)
    check_all(f"gpu gelu {numpy.dtype(dtype).name}", device_and_host(xp, run),
              *bound(dtype, K=16))


@pytest.mark.parametrize("dtype", DTYPES)
def test_dropout_add_and_dropout_backward(xp, dtype):
    """fast.dropout_add_forward (p = 0.25 on [3, 7, 33], plus a residual) and
    fast.dropout_backward on the device (the mask drawn in the kernels, then regenerated),
    against the host's arithmetic on the mask tests/counter_reference.py's NumPy Philox
    draws for the same (seed, step, call): about 3/4 kept; dx = dout * mask bitwise (one
    rounding either side: on CUDA this also shows the kernel's Philox is the reference's);
    out = x * mask + residual within one rounding (CUDA may fuse the product and the sum
    into an fma)."""
    x, residual, dout = (draw((3, 7, 33), dtype, seed) for seed in (19, 20, 21))
    out, dropout = fast.dropout_add_forward(xp.asarray(x), xp.asarray(residual), 0.25,
                                            counter_rng.default_rng(xp, 3), True)
    dx = fast.dropout_backward(xp.asarray(dout), dropout)
    mask = keep_mask(3, 0, 0, x.shape, dtype, 0.25)
    assert 0.6 < (mask != 0).mean() < 0.9, (mask != 0).mean()
    numpy.testing.assert_array_equal(host(dx), dout * mask)
    check(f"gpu dropout + residual {numpy.dtype(dtype).name}", out, x * mask + residual,
          *bound(dtype, K=2))


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_forward_backward(xp, dtype):
    """fast.softmax_forward/backward over rows of T = 16 scores with a -10000 masked tail
    (the attention mask's bias): probabilities and dx (K = T = 16: the row sums;
    float16 in float32 arithmetic, one rounding)."""
    scores = draw((2, 3, 16), dtype, 13, 3.0)
    scores[1, :, 12:] = -10000
    dout = draw((2, 3, 16), dtype, 14)

    def run(put, zeros):
        y, cache = fast.softmax_forward(put(scores))
        return y, fast.softmax_backward(put(dout), cache)
    check_all(f"gpu softmax {numpy.dtype(dtype).name}", device_and_host(xp, run),
              *bound(dtype, K=16))


B, T, H, A = 2, 16, 32, 2


def attention_inputs(dtype):
    x, w = draw((B, T, H), dtype, 15), draw((3 * H, H), dtype, 16, 0.3)
    b, dcontext = draw(3 * H, dtype, 17), draw((B, T, H), dtype, 18)
    mask = numpy.ones((B, T), dtype=numpy.int64)
    mask[1, 11:] = 0                                       # a padded row
    return x, w, b, dcontext, mask


def attention_run(put, dtype, dropout_p, rng):
    """fast.self_attention_forward then backward -> (context, cache, (dx, dw_qkv, db_qkv))."""
    x, w, b, dcontext, mask = attention_inputs(dtype)
    bias = ops.attention_mask_bias(put(mask), dtype)
    context, cache = fast.self_attention_forward(put(x), put(w), put(b), bias, A, dropout_p,
                                                 rng, True)
    return context, cache, fast.self_attention_backward(put(dcontext), cache)


# K = 3 H = 96, the projection's gradient sums; float16: q, k, v, scores, probs and the
# context are each stored in float16 (4 eps16: the differences compound through softmax)
ATTENTION_K, ATTENTION_HALF_STEPS = 3 * H, 4


@pytest.mark.parametrize("dtype", DTYPES)
def test_self_attention_without_dropout(xp, dtype):
    """fast.self_attention_forward/backward (B=2, T=16, H=32, A=2, a padded row), dropout 0:
    context, the cache's q, k, v and probabilities, dx, dw_qkv, db_qkv."""
    actual = attention_run(xp.asarray, dtype, 0.0, None)
    expected = attention_run(lambda a: a.copy(), dtype, 0.0, None)
    pairs = [(actual[0], expected[0])] + \
        [(getattr(actual[1], f), getattr(expected[1], f)) for f in ("q", "k", "v", "probs")] + \
        list(zip(actual[2], expected[2]))
    check_all(f"gpu attention {numpy.dtype(dtype).name}", pairs,
              *bound(dtype, K=ATTENTION_K, half_steps=ATTENTION_HALF_STEPS))


@pytest.mark.parametrize("dtype", DTYPES)
def test_self_attention_backward_with_the_forwards_dropout_mask(xp, dtype):
    """Dropout 0.25 drawn in the device's kernels (a counter-based draw, not NumPy's
    Generator): the device's forward is checked against the host's math on the mask that
    draw makes (tests/counter_reference.py: probs as the dropout-0 forward's, probs_dropped =
    probs * mask, context = probs_dropped v), and the backward, which regenerates the mask,
    against fast_cpu's backward given the same cache with that mask on the host."""
    context, cache, grads = attention_run(xp.asarray, dtype, 0.25, counter_rng.default_rng(xp, 5))
    mask = keep_mask(5, 0, 0, cache.probs.shape, dtype, 0.25)
    cache = host(cache._replace(dropout_mask=None))._replace(dropout_mask=mask)
    assert 0 < (cache.dropout_mask == 0).mean() < 0.5
    probs = attention_run(lambda a: a.copy(), dtype, 0.0, None)[1].probs
    dropped = ops.dropout_backward(probs, cache.dropout_mask)
    expected_context = fast_cpu.matmul(cache.probs_dropped, cache.v)       # [B, A, T, D]
    expected_context = expected_context.transpose(0, 2, 1, 3).reshape(B, T, H)
    expected_grads = fast.self_attention_backward(host(attention_inputs(dtype)[3]), cache)
    limits = bound(dtype, K=ATTENTION_K, half_steps=ATTENTION_HALF_STEPS)
    name = f"gpu attention dropout {numpy.dtype(dtype).name}"
    check_all(name, [(cache.probs, probs), (cache.probs_dropped, dropped),
                     (context, expected_context)] + list(zip(grads, expected_grads)), *limits)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_forward_backward(xp, dtype):
    """fast.cross_entropy_forward/backward of [N=20, C=101] logits, 5 labels ignored (-100):
    the loss (a 0-d device array) and dlogits (K = C = 101, the row sums; float16 logits
    are computed in float32, so float32's bound)."""
    logits = draw((20, 101), dtype, 19, 4.0)
    labels = numpy.random.default_rng(20).integers(0, 101, size=20)
    labels[[1, 4, 9, 10, 17]] = -100
    count = int((labels != -100).sum())

    def run(put):
        loss, cache = fast.cross_entropy_forward(put(logits), put(labels), count=count)
        return loss, fast.cross_entropy_backward(1.0, cache)
    (loss, dlogits), (loss_cpu, dlogits_cpu) = run(xp.asarray), run(lambda a: a.copy())
    compute = numpy.float32 if dtype == numpy.float16 else dtype
    for a, e in ((numpy.float64(host(loss)), numpy.float64(loss_cpu)), (dlogits, dlogits_cpu)):
        check(f"gpu cross-entropy {numpy.dtype(dtype).name}", a, e, *bound(compute, K=101))

@pytest.mark.parametrize("dtype, V", [(numpy.float64, 1027), (numpy.float32, 30522),
                                      (numpy.float16, 30522)])
def test_the_mlm_decoder_with_its_padded_vocab(xp, dtype, V):
    """The MLM decoder as pretraining.py runs it, [11, 48] -> V logits, the cross-entropy
    and back into the weight's and bias's buffers, on the device (the logits' rows padded to
    a multiple of 64, each product split into an aligned head and a tail: fast_gpu's
    _output_rows, _split_wide) against the host's unpadded path: logits, loss, dx, dW, db.
    K = V, dx's sum (float16: 3 eps16, the logits', dlogits' and dx's roundings)."""
    x, w, b = draw((11, 48), dtype, 30), draw((V, 48), dtype, 31, 0.3), draw(V, dtype, 32)
    labels = numpy.random.default_rng(33).integers(0, V, size=11)
    labels[[2, 7]] = -100
    grad_dtype = numpy.float32 if dtype == numpy.float16 else dtype

    def run(put, zeros):
        logits, cache = fast.linear_forward(put(x), put(w), put(b))
        loss, ce = fast.cross_entropy_forward(logits, put(labels), count=9)
        dx, dw, db = fast.linear_backward(fast.cross_entropy_backward(1.0, ce), cache,
                                          zeros(w.shape), zeros(V))
        return logits, numpy.float64(host(loss)), dx, dw, db
    pairs = device_and_host(xp, run, grad_dtype)
    assert fast_gpu._padded_rows(pairs[0][0]) == -(-V // 64) * 64      # the device's logits
    check_all(f"gpu MLM decoder, padded vocab {numpy.dtype(dtype).name}", pairs,
              *bound(dtype, K=V, half_steps=3))


# ------------------------------------------------------------------------ the whole model


CONFIG = dict(vocab_size=101, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
              intermediate_size=128, max_position_embeddings=32)


def pretraining_batch(config, B=3, T=16, seed=0):
    """B rows of T tokens, ~T/7 masked per row, the first row padded after 11 tokens."""
    rng = numpy.random.default_rng(seed)
    ids = rng.integers(5, config.vocab_size, size=(B, T))
    labels = numpy.full((B, T), -100)
    for row in range(B):
        positions = rng.choice(numpy.arange(1, 11), size=T // 7, replace=False)
        labels[row, positions] = ids[row, positions]
    mask = numpy.ones((B, T), dtype=numpy.int64)
    mask[0, 11:] = 0
    return {"input_ids": ids, "token_type_ids": (numpy.arange(T) >= T // 2) * numpy.ones(
                (B, 1), int),
            "attention_mask": mask, "labels": labels,
            "next_sentence_label": rng.integers(0, 2, size=B)}


def test_pretraining_loss_and_gradients_gpu_equal_cpu(xp):
    """BertForPreTraining (L2 H64 A2, B=3, T=16, a padded row), float64, eval mode (no
    dropout): loss and every gradient on device="gpu" against device="cpu", within 1e-12 of
    each gradient's largest magnitude; the gradients whose true value is 0 (the key biases,
    conftest.vanishes) hold rounding noise on both sides, so they are compared against the
    model's largest gradient. The CPU model runs the padded batch too (packs off), the
    same math as the GPU's."""
    from conftest import vanishes
    config = BertConfig(**CONFIG)
    batch = pretraining_batch(config)
    results = {}
    for device in ("cpu", "gpu"):
        model = BertForPreTraining(config, seed=3, dtype=numpy.float64, device=device).eval()
        assert model.xp is (numpy if device == "cpu" else xp)
        model.packs = False
        loss, grads = model.loss_and_grads(batch)
        results[device] = float(loss), {k: host(g) for k, g in grads.items()}
    (loss_cpu, expected), (loss_gpu, actual) = results["cpu"], results["gpu"]
    limit, what = bound(numpy.float64)
    check("gpu model float64 loss", numpy.float64(loss_gpu), numpy.float64(loss_cpu), limit,
          what)
    largest = max(float(numpy.abs(g).max()) for g in expected.values())
    for name, e in expected.items():
        if vanishes("pretraining", name, config):
            err = record("gpu model float64 vanishing grads (of the largest)",
                         float(numpy.abs(actual[name] - e).max()) / largest)
            assert err <= limit, f"{name}: {err:.3e} of the largest gradient > {limit:.0e}"
            continue
        check("gpu model float64 grads", actual[name], e, limit, f"{what}; {name}")
