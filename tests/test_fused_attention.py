"""The fused attention (kernels.cu's attention_forward, attention_backward_queries and
attention_backward_keys: FlashAttention-2's tiles, online softmax and recomputation, the
[B, A, T, T] scores never written) against the reference, on the CPU:

- the kernels run by tests/cuda_emulation.py (every thread of a block a fiber, shared memory
  and __syncthreads emulated; the emulation's own race and divergence checks are tested
  first), each array between guard bytes, on hypothesis-drawn shapes: lengths that are no
  multiple of a tile (32) or of a block's rows (64), head sizes 5 to 64, padded keys,
  batch elements whose keys are all padding, dropout on and off. Against ops.py's math in
  float64 on the same inputs: float64 within 1e-13, float32 within 5e-6 and float16 (float32
  inside, rounded once on store) within 2e-3 of each result's largest element (measured
  maxima: the session's report and the table printed at the end of a run);
- the dropout masks bitwise the unfused softmax kernel's (the same Philox element index);
- fast_gpu's routing on the CPU stand-in of CuPy with NANOBERT_FUSED_ATTENTION's switch on:
  the fused path against the unfused path and ops.py, the cache without a [B, A, T, T]
  array, output_attentions' maps recomputed, a model's gradients against NumPy's, and the
  launches a layer saves.

What this does not show: CUDA's own rounding (fma contraction) and speed; nvcc compiles the
kernels in tests/test_kernels_compile.py.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cuda_emulation
from conftest import record, rel_error
from counter_reference import keep_mask, split64
from nanobert.model import fast_gpu, kernels, ops
from test_cuda_kernels import guarded

pytestmark = pytest.mark.skipif(not cuda_emulation.available(),
                                reason="g++ is needed to run the CUDA kernels on the CPU")

DTYPES = [numpy.float64, numpy.float32, numpy.float16]
BOUND = {numpy.float64: 1e-13, numpy.float32: 5e-6, numpy.float16: 2e-3}
TESTS = Path(__file__).resolve().parent


def stats(dtype):
    return numpy.float32 if dtype == numpy.float16 else dtype

# ------------------------------------------------------------------ the emulation itself


RACES = r"""
typedef float T;
// each block reverses its 64 elements through shared memory; barrier 0 leaves out the
// barrier between the writes and the reads (a thread reads a slot before its writer ran)
extern "C" __global__ void reverse(const float* x, int barrier, float* y) {
    __shared__ float tile[64];
    const int t = threadIdx.x;
    tile[t] = x[blockIdx.x * 64 + t];
    if (barrier) __syncthreads();
    y[blockIdx.x * 64 + t] = tile[63 - t];
}

// the sums of 4 tiles of 64 elements, each reversed through one shared tile; barrier 0
// leaves out the barrier before the next tile's writes (a thread overwrites a slot that
// another has still to read)
extern "C" __global__ void tiles(const float* x, int barrier, float* y) {
    __shared__ float tile[64];
    const int t = threadIdx.x;
    float sum = 0;
    for (int i = 0; i < 4; i++) {
        if (barrier) __syncthreads();
        tile[t] = x[i * 64 + t];
        __syncthreads();
        sum += tile[63 - t];
    }
    y[t] = sum;
}

// a barrier that the threads of the second warp skip (CUDA hangs or misbehaves)
extern "C" __global__ void skipped(float* y) {
    if (threadIdx.x < 32) __syncthreads();
    y[threadIdx.x] = 1;
}
"""


@pytest.mark.parametrize("kernel, blocks", [("reverse", 2), ("tiles", 1)])
def test_the_emulation_turns_a_missing_barrier_into_a_wrong_result(kernel, blocks):
    """A thread reading shared memory before another wrote it (reverse), or writing it before
    another read it (tiles): with the barrier the emulation gives the right numbers, without
    it others (reads of the 0xFF fill are NaN)."""
    x = numpy.arange(256, dtype=numpy.float32)
    expected = {"reverse": x[:128].reshape(2, 64)[:, ::-1].ravel(),
                "tiles": x.reshape(4, 64)[:, ::-1].sum(axis=0)}[kernel]
    run = cuda_emulation.launch(RACES, kernel)
    results = []
    for barrier in (1, 0):
        y = numpy.zeros(expected.size, numpy.float32)
        run(blocks, 64, (x, numpy.int32(barrier), y))
        results.append(y)
    assert numpy.array_equal(results[0], expected)
    assert not numpy.array_equal(results[1], expected, equal_nan=True), results[1]


def test_the_emulation_stops_at_a_barrier_some_threads_skip():
    """A __syncthreads the second warp never reaches: the process stops, naming the block,
    where CUDA would hang (run in a child process: the emulation aborts)."""
    code = ("import numpy, cuda_emulation, test_fused_attention as t\n"
            "cuda_emulation.launch(t.RACES, 'skipped')(1, 64, (numpy.zeros(64, "
            "numpy.float32),))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=TESTS, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode != 0
    assert "threads of block 0 wait at a __syncthreads that others have left" in done.stderr, \
        done.stderr

# ------------------------------------------------------------- the kernels, emulated

FRAGMENTS = r"""
// each lane's mma operand registers as kernels.cu's loaders make them (a from a 16 x 16
// matrix; b from a tile whose 8 rows are b's columns, and from one whose 16 rows are b's
// rows), then d = a b through nanobert_mma_m16n8k16 stored as the accumulators are
extern "C" __global__ void mma_fragments(const T* a_matrix, const T* b_transposed,
                                         const T* b_matrix, unsigned int* registers,
                                         T* product) {
    __shared__ half16 rows_tile[ATTENTION_TILE * HALF_TILE_ROW];
    __shared__ half16 columns_tile[ATTENTION_TILE * HALF_TILE_ROW];
    load_tile(b_transposed, 16, 0, 8, 16, rows_tile);
    load_tile(b_matrix, 8, 0, 16, 8, columns_tile);
    __syncthreads();
    const MmaLane at(1, 16);
    unsigned int a[4], b[2], b_again[2];
    load_a(a_matrix, 16, 0, 0, 16, 16, at, a);
    load_b_rows(rows_tile, 0, 0, at, b);
    load_b_columns(columns_tile, 0, 0, at, b_again);
    for (int r = 0; r < 4; r++) registers[at.lane * 8 + r] = a[r];
    for (int r = 0; r < 2; r++) {
        registers[at.lane * 8 + 4 + r] = b[r];
        registers[at.lane * 8 + 6 + r] = b_again[r];
    }
    float c[ATTENTION_HEAD_MAX / 8][4] = {};
    nanobert_mma_m16n8k16(c[0], a, b);
    const float one[2] = {1, 1};
    store_accumulators(c, one, 0, 16, 8, 8, at, product);
}
"""


def mma_fragments(a, b):
    """FRAGMENTS's kernel on a [16, 16] and b [16, 8] float16 -> (registers [32 lanes, 8]:
    a's 4, b's 2 from its transpose's rows, b's 2 from its rows; the product [16, 8])."""
    registers, product = numpy.empty((32, 8), numpy.uint32), numpy.empty((16, 8), numpy.float16)
    run = cuda_emulation.launch(kernels.cuda_source("e") + FRAGMENTS, "mma_fragments")
    run(1, 32, (a, numpy.ascontiguousarray(b.T), b, registers, product))
    return registers, product


def test_mma_operands_follow_ptx_s_fragment_layout():
    """The tensor-core kernels' operand registers against PTX ISA's table "Matrix Fragments
    for mma.m16n8k16 with floating point type", restated here (g = lane >> 2, t = lane % 4, a
    register's two float16 elements low half first): a's element i at row g (i in 0, 1, 4,
    5; else g + 8), column 2t + (i & 1) (+ 8 for i >= 4); b's element i at row 2t + (i & 1)
    (+ 8 for i >= 2), column g. Elements numbered by their value. Then the emulated mma
    (tests/cuda_emulation.h, the same table) with the accumulators stored as the kernels
    store them (c's element i at row g (+ 8 for i >= 2), column 2t + (i & 1)) gives a @ b:
    float32 sums of float16 products, rounded to float16 once."""
    a = numpy.arange(256, dtype=numpy.float16).reshape(16, 16)
    b = (1000 + numpy.arange(128)).astype(numpy.float16).reshape(16, 8)
    registers, _ = mma_fragments(a, b)
    halves = numpy.stack([registers & 0xFFFF, registers >> 16], axis=-1).astype(numpy.uint16)
    values = halves.view(numpy.float16).reshape(32, 16).astype(int)     # lane, element
    for lane in range(32):
        g, t = lane >> 2, lane % 4
        for i in range(8):
            row = g if i in (0, 1, 4, 5) else g + 8
            column = 2 * t + (i & 1) + (8 if i >= 4 else 0)
            assert values[lane, i] == row * 16 + column, (lane, "a", i)
        for i in range(4):
            row, column = 2 * t + (i & 1) + (8 if i >= 2 else 0), g
            assert values[lane, 8 + i] == values[lane, 12 + i] == 1000 + row * 8 + column, \
                (lane, "b", i)
    rng = numpy.random.default_rng(0)
    a, b = (rng.standard_normal(shape).astype(numpy.float16) for shape in ((16, 16), (16, 8)))
    _, product = mma_fragments(a, b)
    expected = (a.astype(numpy.float64) @ b.astype(numpy.float64)).astype(numpy.float32)
    assert numpy.array_equal(product, expected.astype(numpy.float16))



def reference(q, k, v, bias, keep, dcontext, q_scale):
    """ops.py's attention from the heads on, in float64: (context [B, T, H], lse [B, A, T],
    dqkv [B, T, 3H]); keep: the dropout mask (scaled) or None."""
    q, k, v, bias, dcontext = (a.astype(numpy.float64) for a in (q, k, v, bias, dcontext))
    B, A, T, D = q.shape
    scores = q @ k.transpose(0, 1, 3, 2) + bias                  # [B, A, T, T]
    probs, _ = ops.softmax_forward(scores)
    dropped = probs if keep is None else probs * keep
    context = (dropped @ v).transpose(0, 2, 1, 3).reshape(B, T, A * D)
    top = scores.max(axis=-1)
    lse = top + numpy.log(numpy.exp(scores - top[..., None]).sum(axis=-1))
    dheads = dcontext.reshape(B, T, A, D).transpose(0, 2, 1, 3)
    dv = dropped.transpose(0, 1, 3, 2) @ dheads
    dprobs = dheads @ v.transpose(0, 1, 3, 2)
    dscores = ops.softmax_backward(dprobs if keep is None else dprobs * keep, probs)
    dq, dk = dscores @ k * q_scale, dscores.transpose(0, 1, 3, 2) @ q
    dqkv = numpy.concatenate([d.transpose(0, 2, 1, 3).reshape(B, T, A * D)
                              for d in (dq, dk, dv)], axis=-1)
    return context, lse, dqkv


def draw_arguments(draw, dtype, p):
    """(step, seed words, call, p, keep scale, dropout) as the fused kernels take them."""
    seed, step, call = draw
    S = stats(dtype)
    scale = S(dtype(1.0 / (1.0 - p))) if p > 0 else S(1)
    return (numpy.array(step, numpy.uint64), *(numpy.uint32(w) for w in split64(seed)),
            numpy.uint32(call), S(p), scale, numpy.int32(p > 0))


def fused(q, k, v, bias, masked, draw, p, dcontext, twin=""):
    """The three kernels in turn, as fast_gpu launches them -> (context, lse, dqkv); twin
    "_mma": their tensor-core twins (tiles of 32 rows), "_mma64": the same compiled with
    tiles of 64."""
    twin, tile = ("_mma", 64) if twin == "_mma64" else (twin, None)
    B, A, T, D = q.shape
    dtype, S = q.dtype.type, stats(q.dtype.type)
    (grid,), (block,) = fast_gpu._attention_grid(B * A, T)
    heads = (q, k, v, bias, numpy.int32(masked), numpy.int32(A), numpy.int32(T),
             numpy.int32(D))
    dropout = draw_arguments(draw, dtype, p)
    context, lse = numpy.empty((B, T, A * D), dtype), numpy.empty((B, A, T), S)
    guarded("attention_forward" + twin, dtype, grid, block, (*heads, *dropout, context, lse),
            tile)
    delta, dqkv = numpy.empty((B, A, T), S), numpy.empty((B, T, 3 * A * D), dtype)
    q_scale = S(dtype(1.0 / numpy.sqrt(D)))
    guarded("attention_backward_queries" + twin, dtype, grid, block,
            (*heads, context, dcontext, lse, *dropout, q_scale, delta, dqkv), tile)
    guarded("attention_backward_keys" + twin, dtype, grid, block,
            (*heads, dcontext, lse, delta, *dropout, dqkv), tile)
    return context, lse, dqkv


def inputs(seed, dtype, B, A, T, D, padding):
    """q (scaled), k, v [B, A, T, D], the mask bias [B, 1, 1, T] and dcontext [B, T, H];
    padding: "none", "some" (key 0 always attended) or "all" (batch element 0's keys all
    padding: its rows all masked)."""
    rng = numpy.random.default_rng(seed)
    q = (rng.standard_normal((B, A, T, D)) / numpy.sqrt(D) * 3).astype(dtype)
    k, v = (rng.standard_normal((B, A, T, D)).astype(dtype) for _ in range(2))
    mask = (rng.random((B, T)) < 0.7).astype(numpy.int64) if padding != "none" \
        else numpy.ones((B, T), numpy.int64)
    mask[:, 0] = 1
    if padding == "all":
        mask[0] = 0
    dcontext = rng.standard_normal((B, T, A * D)).astype(dtype)
    return q, k, v, ops.attention_mask_bias(mask, dtype), mask, dcontext


# a counter-based draw: (seed, step, call)
draws = st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1),
                  st.integers(0, 2**32 - 1))


KINDS = [(dtype, "") for dtype in DTYPES] + [(numpy.float16, "_mma"), (numpy.float16, "_mma64")]


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: numpy.dtype(k[0]).name + k[1])
def test_fused_kernels_at_two_blocks_of_rows_and_three_tiles(kind):
    """Each kind once at a shape that every hypothesis run below may not draw: 70 rows (two
    blocks, the second partly past the end; three key tiles, the last partly), heads of 64,
    padding, dropout."""
    test_fused_kernels_equal_the_reference.hypothesis.inner_test(
        (2, 2, 70, 64), 1, kind, 0.1, "some", (5, 6, 7))


@settings(max_examples=40, deadline=None)
@given(shape=st.tuples(st.integers(1, 2), st.integers(1, 2),
                       st.one_of(st.integers(1, 40), st.integers(60, 70)),
                       st.sampled_from([5, 8, 16, 64])),
       seed=st.integers(0, 2**16), kind=st.sampled_from(KINDS),
       p=st.sampled_from([0.0, 0.1, 0.5]), padding=st.sampled_from(["none", "some", "all"]),
       draw=draws)
def test_fused_kernels_equal_the_reference(shape, seed, kind, p, padding, draw):
    """Forward (context, log-sum-exp) and backward (dq times q's scaling, dk, dv in the
    projection's layout) against ops.py's math in float64 on the same inputs, the keep mask
    the reference's (tests/counter_reference.py) for the same draw: the SIMT kernels in
    each dtype, their tensor-core twins (float16, _mma: the products' operands, P and dS
    included, rounded to float16; the bound is float16's). A batch element whose keys are
    all padding: every score is s - 10000, rounded at 10000's ulp (2^-10 in float32), so its
    rows get a bound of 8 such ulps (the unfused kernels round there too)."""
    B, A, T, D = shape
    dtype, twin = kind
    q, k, v, bias, mask, dcontext = inputs(seed, dtype, B, A, T, D, padding)
    keep = keep_mask(*draw, (B, A, T, T), dtype, p) if p > 0 else None
    q_scale = float(dtype(1.0 / numpy.sqrt(D)))
    actual = fused(q, k, v, bias, padding != "none", draw, p, dcontext, twin)
    expected = reference(q, k, v, bias, keep, dcontext, q_scale)
    name = numpy.dtype(dtype).name + twin
    attended = mask.any(axis=1)                          # batch elements with a key
    ulp = float(numpy.spacing(stats(dtype)(10000.0)))
    for what, a, e in zip(("context", "lse", "dqkv"), actual, expected):
        err = record(f"fused attention {what} {name}", rel_error(a[attended], e[attended]))
        assert err <= BOUND[dtype], f"{what} ({name}): {err:.2e}"
        assert numpy.isfinite(a).all(), what
        if not attended.all():
            err = record(f"fused attention {what} {name}, all keys padding",
                         rel_error(a[~attended], e[~attended]))
            assert err <= 8 * ulp + BOUND[dtype], f"{what} ({name}, all padding): {err:.2e}"


@settings(max_examples=12, deadline=None)
@given(T=st.integers(1, 64), seed=st.integers(0, 2**16),
       kind=st.sampled_from([(numpy.float32, ""), (numpy.float16, ""), (numpy.float16, "_mma"),
                             (numpy.float16, "_mma64")]),
       p=st.sampled_from([0.1, 0.5, 0.9]), draw=draws)
def test_the_fused_forward_drops_what_the_softmax_kernel_drops(T, seed, kind, p, draw):
    """With v the identity (D = T) the context rows are the dropped probabilities: zero
    exactly where the unfused softmax kernel's dropped probabilities are (the same element
    index row * T + key of the same draw: the same masks, bit for bit), and where the
    reference's keep mask is 0."""
    B, A = 1, 2
    dtype, twin = kind
    rng = numpy.random.default_rng(seed)
    q = (rng.standard_normal((B, A, T, T)) * 0.3 / numpy.sqrt(T)).astype(dtype)
    k = rng.standard_normal((B, A, T, T)).astype(dtype)
    v = numpy.broadcast_to(numpy.eye(T, dtype=dtype), (B, A, T, T)).copy()
    bias = numpy.zeros((B, 1, 1, T), dtype)
    context, _, _ = fused(q, k, v, bias, 0, draw, p, numpy.zeros((B, T, A * T), dtype), twin)
    dropped_fused = context.reshape(B, T, A, T).transpose(0, 2, 1, 3)   # [B, A, T, T]
    scores = (q.astype(numpy.float64) @ k.astype(numpy.float64).transpose(0, 1, 3, 2))
    rows = B * A * T
    probs, dropped = numpy.empty((B, A, T, T), dtype), numpy.empty((B, A, T, T), dtype)
    arguments = draw_arguments(draw, dtype, p)
    from test_cuda_kernels import run
    run("softmax_forward", dtype, rows, scores.astype(dtype), bias, numpy.int32(0),
        numpy.int64(A * T), numpy.int64(rows), numpy.int32(T), *arguments, probs, dropped)
    assert (probs > 0).all()                               # a zero is a dropped element
    assert numpy.array_equal(dropped_fused == 0, dropped == 0)
    assert numpy.array_equal(dropped_fused == 0, keep_mask(*draw, (B, A, T, T), dtype, p) == 0)


def test_the_kernels_constants_are_kernels_py_s():
    """fast_gpu launches by kernels.py's ATTENTION_ROWS and routes heads up to
    ATTENTION_HEAD_MAX: kernels.cu's constants of the same names."""
    source = kernels.CUDA_SOURCE.read_text()
    for name in ("ATTENTION_ROWS", "ATTENTION_HEAD_MAX"):
        found = re.search(rf"constexpr int {name} = (\d+);", source)
        assert found and int(found.group(1)) == getattr(kernels, name), name

# -------------------------------------------------------- fast_gpu's routing, on the stand-in


def switch(monkeypatch, value):
    """$NANOBERT_FUSED_ATTENTION=value, read as at fast_gpu's import."""
    monkeypatch.setenv("NANOBERT_FUSED_ATTENTION", value)
    monkeypatch.setattr(fast_gpu, "FUSED_ATTENTION", fast_gpu._read_fused_attention())


@pytest.fixture
def cupy(monkeypatch):
    """The CPU stand-in of CuPy (an sm_90 GPU), fast_gpu's fused attention switched on."""
    import cupy_standin
    switch(monkeypatch, "1")
    with cupy_standin.installed() as module:
        module.counts.reset()
        yield module


def attention_runs(cupy, monkeypatch, dtype, dropout, B=2, T=20, A=2, D=4):
    """fast.self_attention_forward and _backward on the stand-in, fused and unfused, and
    ops.py's on the stand-in, each with a generator of the same seed and step; the last batch
    element padded from position 13 -> {name: (context, cache, (dx, dw, db), kernels launched)}."""
    from counter_reference import dropout_generator
    from nanobert.model import fast
    host = numpy.random.default_rng(3)
    H = A * D
    x, dcontext = (cupy.asarray(host.standard_normal((B, T, H)).astype(dtype))
                   for _ in range(2))
    w = cupy.asarray((host.standard_normal((3 * H, H)) * 0.5).astype(dtype))
    b = cupy.asarray(host.standard_normal(3 * H).astype(dtype))
    mask = numpy.ones((B, T), numpy.int64)
    mask[-1, 13:] = 0
    bias = ops.attention_mask_bias(cupy.asarray(mask), dtype)
    runs = {}
    for name, attention, on in (("fused", fast, True), ("unfused", fast, False),
                                ("ops.py", ops, False), ("float32 ops.py", ops, False)):
        switch(monkeypatch, "1" if on else "0")
        if name == "float32 ops.py":                # the truth of a float16 run's inputs
            x, w, b, dcontext, bias = (a.astype(numpy.float32) for a in (x, w, b, dcontext, bias))
        rng = dropout_generator(cupy, 5)
        counts = getattr(cupy, "counts", None)          # the stand-in's (a GPU: none)
        if counts:
            counts.reset()
        context, cache = attention.self_attention_forward(x, w, b, bias, A, dropout, rng, True)
        grads = attention.self_attention_backward(dcontext, cache)
        runs[name] = (context, cache, grads, dict(counts.kernels) if counts else {})
    return runs


def check_runs(runs, dtype, bound, name):
    """float32: the fused path's context and gradients within `bound` of the unfused path's
    and ops.py's. float16: the unfused path rounds the scores, probabilities and their
    gradients to float16 where the fused one keeps them in float32, so both are compared
    with ops.py in float32 on the same float16 inputs: the fused path within `bound` and no
    farther than 1.25 times the unfused path's error (+ 1e-3)."""
    context, _, grads, _ = runs["fused"]
    results = [("context", context), *(("gradient", g) for g in grads)]
    if dtype == numpy.float32:
        for other in ("unfused", "ops.py"):
            ref_context, _, ref_grads, _ = runs[other]
            for (what, a), e in zip(results, (ref_context, *ref_grads)):
                err = record(f"{name} vs {other} float32 {what}", rel_error(a.get(), e.get()))
                assert err <= bound, (other, what, err)
        return
    truth_context, _, truth_grads, _ = runs["float32 ops.py"]
    unfused_context, _, unfused_grads, _ = runs["unfused"]
    for (what, a), u, e in zip(results, (unfused_context, *unfused_grads),
                               (truth_context, *truth_grads)):
        err = record(f"{name} float16 vs float32 {what}", rel_error(a.get(), e.get()))
        unfused_err = rel_error(u.get(), e.get())
        assert err <= bound and err <= 1.25 * unfused_err + 1e-3, (what, err, unfused_err)


@pytest.mark.parametrize("dropout", [0.0, 0.25])
@pytest.mark.parametrize("dtype, bound, tensor_cores", [(numpy.float32, 1e-5, True),
                                                        (numpy.float16, 5e-2, True),
                                                        (numpy.float16, 5e-2, False)])
def test_the_fused_path_gives_the_unfused_numbers(cupy, monkeypatch, dtype, bound,
                                                  tensor_cores, dropout):
    """fast.self_attention_* with the switch on: the context and gradients (dx, dw_qkv,
    db_qkv) of the unfused path and ops.py on the same draws (check_runs); output_attentions'
    maps recomputed bitwise the unfused path's; a cache of O(B A T D) arrays; 8 kernels
    fewer than the unfused path (forward: the two batched products, softmax and move_heads
    become one kernel; backward: move_heads, four products, the softmax backward and
    attention_grads become two). float16 on an sm_80+
    GPU runs the tensor-core twins, before sm_80 the SIMT kernels."""
    monkeypatch.setattr(fast_gpu, "_tensor_cores", lambda xp: tensor_cores)
    runs = attention_runs(cupy, monkeypatch, dtype, dropout)
    _, cache, _, launched = runs["fused"]
    assert isinstance(cache, fast_gpu.FusedAttentionCache)
    assert (cache.dropout_mask is None) == (dropout == 0.0)
    check_runs(runs, dtype, bound, "fused attention path")
    unfused_probs = runs["unfused"][1].probs
    assert numpy.array_equal(cache.probs.get(), unfused_probs.get())
    B, A, T, D = cache.q.shape
    for field, value in cache._asdict().items():
        if isinstance(value, cupy.ndarray):
            assert value.size <= B * T * 3 * A * D < B * A * T * T, (field, value.shape)
    twin = kernels.ATTENTION_MMA if dtype == numpy.float16 and tensor_cores else ""
    fused_kernels = {k: n for k, n in launched.items() if "attention_" in k}
    assert fused_kernels == {"RawKernel:nanobert_attention_heads": 1,
                             f"RawKernel:nanobert_attention_forward{twin}": 1,
                             f"RawKernel:nanobert_attention_backward_queries{twin}": 1,
                             f"RawKernel:nanobert_attention_backward_keys{twin}": 1}, launched
    def kernels_of(counted):          # not the fills of the ones vectors made once a process
        return sum(n for k, n in counted.items() if k.startswith(("RawKernel", "cublas")))
    saved = kernels_of(runs["unfused"][3]) - kernels_of(launched)
    assert saved == 3 + 5, (saved, launched, runs["unfused"][3])


def test_float64_and_large_heads_keep_the_unfused_kernels(cupy, monkeypatch):
    """The switch routes float32 and float16 heads of up to kernels.ATTENTION_HEAD_MAX: a
    float64 run (the NumPy-parity path) and heads of 65 keep ops' AttentionCache."""
    for dtype, D in ((numpy.float64, 4), (numpy.float32, kernels.ATTENTION_HEAD_MAX + 1)):
        runs = attention_runs(cupy, monkeypatch, dtype, 0.0, B=1, T=14, A=1, D=D)
        assert isinstance(runs["fused"][1], ops.AttentionCache), (dtype, D)
    switch(monkeypatch, "1")
    assert fast_gpu._fused_attention(numpy.dtype(numpy.float16), kernels.ATTENTION_HEAD_MAX)
    switch(monkeypatch, "0")
    assert not fast_gpu._fused_attention(numpy.dtype(numpy.float16), 8)


def test_the_switch_names_the_fused_dtypes(monkeypatch):
    """$NANOBERT_FUSED_ATTENTION: unset or 0 none, float16, 1 float16 and float32; anything
    else a ValueError naming it and what it takes."""
    half, single = numpy.dtype(numpy.float16), numpy.dtype(numpy.float32)
    monkeypatch.delenv("NANOBERT_FUSED_ATTENTION", raising=False)
    assert fast_gpu._read_fused_attention() == frozenset()
    for value, dtypes in (("0", set()), ("float16", {half}), ("1", {half, single})):
        monkeypatch.setenv("NANOBERT_FUSED_ATTENTION", value)
        assert fast_gpu._read_fused_attention() == dtypes, value
    monkeypatch.setenv("NANOBERT_FUSED_ATTENTION", "yes")
    with pytest.raises(ValueError, match="NANOBERT_FUSED_ATTENTION must be one of 0, "
                                         "float16, 1, got 'yes'"):
        fast_gpu._read_fused_attention()


def test_the_tile_switch_picks_the_tensor_core_kernels_tile(monkeypatch):
    """$NANOBERT_ATTENTION_TILE: unset 32, 32 or 64 (the source then defines
    NANOBERT_MMA_TILE, which kernels.cu's MMA_TILE takes); anything else a ValueError."""
    monkeypatch.delenv("NANOBERT_ATTENTION_TILE", raising=False)
    assert kernels._read_attention_tile() == 32
    for value in ("32", "64"):
        monkeypatch.setenv("NANOBERT_ATTENTION_TILE", value)
        assert kernels._read_attention_tile() == int(value)
    monkeypatch.setenv("NANOBERT_ATTENTION_TILE", "48")
    with pytest.raises(ValueError, match="NANOBERT_ATTENTION_TILE must be 32 or 64, got '48'"):
        kernels._read_attention_tile()
    assert "#define NANOBERT_MMA_TILE 64\n" in kernels.cuda_source("e", 64)
    assert f"#define NANOBERT_MMA_TILE {kernels.ATTENTION_TILE}\n" in kernels.cuda_source("e")
    assert "constexpr int MMA_TILE = NANOBERT_MMA_TILE;" in kernels.CUDA_SOURCE.read_text()


def model_gradients(cupy, monkeypatch, device, dtype, fused):
    """A 2-layer BERT's (heads of 8) pretraining loss and gradients on `device` (the
    stand-in for "gpu"), its dropout drawn by the counter generator of seed 7 on either side
    (NumPy: its host twin) -> (loss, {name: host gradient})."""
    from counter_reference import dropout_generator, numpy_draws_like_the_gpu
    from nanobert import backend
    from nanobert.model.config import BertConfig
    from nanobert.model.pretraining import BertForPreTraining
    from test_cupy_standin import TINY, pretraining_batch
    switch(monkeypatch, "1" if fused else "0")
    config = BertConfig(**TINY)
    model = BertForPreTraining(config, seed=3, dtype=dtype, device=device).train()
    model.packs = False                     # the padded batch on both sides
    model.rng = dropout_generator(model.xp, 7)
    cupy.counts.reset()
    with numpy_draws_like_the_gpu():
        loss, grads = model.loss_and_grads(pretraining_batch(config, 3, 12), on_device=True)
    if device == "gpu":
        twin = kernels.ATTENTION_MMA if dtype == numpy.float16 else ""
        assert cupy.counts.kernels.get(f"RawKernel:nanobert_attention_forward{twin}") == \
            (2 if fused else None)
    return float(loss), {k: backend.to_host(g) for k, g in grads.items()}


def gradient_errors(actual, expected):
    """{name: error of actual's gradient}: relative to its largest element, but the key
    biases' (true gradient 0: rounding noise on either side) relative to the model's
    largest gradient."""
    largest = max(float(numpy.abs(g).max()) for g in expected.values())
    return {k: (float(numpy.abs(actual[k] - g).max()) / largest
                if k.endswith("attention.self.key.bias") else rel_error(actual[k], g))
            for k, g in expected.items()}


def test_a_models_float32_gradients_with_fused_attention_are_numpys(cupy, monkeypatch):
    """A pretraining step's loss and gradients on the stand-in with the fused attention
    against the NumPy path (fast_cpu, ops.py's attention) on the same draws: within 1e-5
    (float32 sums in other orders)."""
    loss, grads = model_gradients(cupy, monkeypatch, "cpu", numpy.float32, False)
    fused_loss, fused_grads = model_gradients(cupy, monkeypatch, "gpu", numpy.float32, True)
    assert record("fused model loss float32", abs(fused_loss - loss) / abs(loss)) <= 1e-5
    for key, err in gradient_errors(fused_grads, grads).items():
        assert record("fused model gradients float32", err) <= 1e-5, (key, err)


def test_a_models_float16_gradients_are_as_close_to_float32_fused_as_unfused(cupy,
                                                                            monkeypatch):
    """Mixed precision: the fused attention keeps the scores, probabilities and their
    gradients in float32 where the unfused path rounds them to float16, so the two float16
    runs differ (by up to ~4% on the query and key weights' gradients, small sums that
    cancel). Against the float32 run of the same model and draws (NumPy) the fused one is
    no farther than the unfused one: each gradient's error within 1.25 times the unfused
    one's, plus 1e-3."""
    _, truth = model_gradients(cupy, monkeypatch, "cpu", numpy.float32, False)
    _, unfused = model_gradients(cupy, monkeypatch, "gpu", numpy.float16, False)
    _, fused = model_gradients(cupy, monkeypatch, "gpu", numpy.float16, True)
    unfused_errors = gradient_errors(unfused, truth)
    for key, err in gradient_errors(fused, truth).items():
        record("fused float16 model gradients vs float32", err)
        assert err <= 1.25 * unfused_errors[key] + 1e-3, (key, err, unfused_errors[key])


@pytest.mark.gpu
@pytest.mark.skipif("not __import__('nanobert.backend').backend.gpu_available()",
                    reason="needs a real GPU: CuPy sees no CUDA device here")
@pytest.mark.parametrize("dropout", [0.0, 0.25])
@pytest.mark.parametrize("dtype, bound", [(numpy.float32, 5e-5), (numpy.float16, 5e-2)])
def test_on_a_gpu_the_fused_kernels_give_the_unfused_numbers(monkeypatch, dtype, bound,
                                                             dropout):
    """On the device (float16 on sm_80+: the tensor-core kernels; float32: the SIMT ones, TF32
    off for the unfused products), at 70 positions (two blocks of rows, three key tiles) and
    heads of 64: the context and gradients of the unfused path and ops.py's on the same draws
    (check_runs); output_attentions' maps bitwise. What the
    emulation cannot show: NVRTC's build, the hardware's mma fragments and rounding."""
    import cupy
    from nanobert import backend
    for name in ("NANOBERT_TF32", "CUPY_TF32"):
        monkeypatch.setenv(name, os.environ.get(name, "1"))
    was = backend.tf32_enabled()
    backend.set_tf32(False)
    try:
        runs = attention_runs(cupy, monkeypatch, dtype, dropout, B=2, T=70, A=2, D=64)
    finally:
        backend.set_tf32(was)
    assert isinstance(runs["fused"][1], fast_gpu.FusedAttentionCache)
    check_runs(runs, dtype, bound, "gpu fused attention path")
    cache = runs["fused"][1]
    assert numpy.array_equal(cache.probs.get(), runs["unfused"][1].probs.get())


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float16])
def test_a_training_step_launches_8_kernels_a_layer_fewer(cupy, monkeypatch, dtype):
    """A 12-layer model's pretraining forward and backward on the stand-in: with the switch
    on, 8 launches a layer fewer than the unfused path (test_cupy_standin's BERT-base budgets
    count the unfused path: 581 / 638 there, 96 fewer fused), still no host
    wait. Each count is a second step's (the first makes the ones vectors a process keeps)."""
    from nanobert.model.config import BertConfig
    from nanobert.model.pretraining import BertForPreTraining
    from test_cupy_standin import pretraining_batch
    config = BertConfig(vocab_size=97, hidden_size=64, num_hidden_layers=12,
                        num_attention_heads=1, intermediate_size=128,
                        max_position_embeddings=32)
    counts = {}
    for value in ("0", "1"):
        switch(monkeypatch, value)
        model = BertForPreTraining(config, dtype=dtype, device="gpu").train()
        batch = pretraining_batch(config, 2, 16)
        for _ in range(2):
            cupy.counts.reset()
            model.loss_and_grads(batch, on_device=True)
        counts[value] = (cupy.counts.launches, cupy.counts.syncs)
    assert counts["0"][0] - counts["1"][0] == 8 * config.num_hidden_layers, counts
    assert counts["1"][1] == 0, counts
