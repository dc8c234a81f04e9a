"""The GPU's dropout generator (nanobert/model/counter_rng.py, Philox4x32-10 in kernels.cu) as a
specification:

- tests/counter_reference.py's NumPy Philox4x32-10 gives the Random123 paper's known answers,
  and the CUDA kernel (run on the CPU by tests/cuda_emulation.py) draws exactly its numbers
  in the documented counter layout, for any seed, step, call and length;
- the masks it makes have the statistics dropout needs: a keep rate within 4 standard errors
  of 1 - p, no correlation between steps, calls or neighbouring elements;
- on the CuPy stand-in, the fast path's kernels (dropout, dropout + residual, softmax with
  dropout, the whole attention) drop exactly what ops.py's reference drops with the same
  generator, and the backwards that regenerate the mask equal the ones that read it stored;
- (seed, step, call) fixes a mask, begin_step changes it without a host read, and
  state_dict / load_state_dict resume it (also through training/run.py's checkpoint state).
"""
import json
import math

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cuda_emulation
import cupy_standin
from conftest import record
from counter_reference import (KNOWN_ANSWERS, counter_uniform, counter_words,
                               philox4x32_10)
from nanobert.distributed import SingleProcess
from nanobert.model import counter_rng, fast, fast_gpu, ops
from nanobert.model.counter_rng import CounterGenerator

needs_gpp = pytest.mark.skipif(not cuda_emulation.available(),
                               reason="g++ is needed to run the CUDA kernels on the CPU")
DTYPES = [numpy.float64, numpy.float32, numpy.float16]


@pytest.fixture
def cupy():
    with cupy_standin.installed() as module:
        module.counts.reset()
        yield module


def stats(dtype):
    return numpy.dtype(numpy.float32 if dtype == numpy.float16 else dtype)


def generator_at(cupy, seed, step, calls=0):
    """A CounterGenerator on the stand-in whose device step and call count are given."""
    rng = counter_rng.default_rng(cupy, seed)
    rng.load_state_dict({"seed": seed, "step": step, "calls": calls})
    return rng

# ------------------------------------------------------------- the generator's numbers


def test_numpy_philox_gives_the_published_known_answers():
    """Random123's kat_vectors for philox4x32 10: counter and key all zeros, all ones, and
    the digits of pi. One bit more in the counter changes every word."""
    for counter, key, expected in KNOWN_ANSWERS:
        words = philox4x32_10([counter], key)[0]
        assert [int(w) for w in words] == list(expected), [hex(w) for w in words]
    flipped = philox4x32_10([(1, 0, 0, 0)], (0, 0))[0]
    assert all(int(a) != b for a, b in zip(flipped, KNOWN_ANSWERS[0][2]))


@needs_gpp
def test_the_kernel_draws_the_known_answer_of_an_all_zero_counter(cupy):
    """seed 0, step 0, call 0: elements 0-3 are the words of counter 0 under key 0, the
    first known answer, their top 24 bits (u = (word >> 8) 2^-24)."""
    for dtype in (numpy.float32, numpy.float64):
        u = counter_rng.default_rng(cupy, 0).random(4, dtype=dtype).get()
        assert [int(v * 2**24) for v in u] == [w >> 8 for w in KNOWN_ANSWERS[0][2]], dtype


@needs_gpp
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**64 - 1), step=st.integers(0, 2**64 - 1),
       call=st.integers(0, 2**32 - 1),
       n=st.one_of(st.integers(1, 40), st.integers(1000, 3000)).filter(lambda n: n % 4),
       dtype=st.sampled_from([numpy.float32, numpy.float64]))
def test_the_kernel_equals_the_numpy_counter_layout_bitwise(seed, step, call, n, dtype):
    """CounterGenerator.random (kernels.cu's uniform kernel, on the stand-in) against
    tests/counter_reference.py for any 64-bit seed and step, any call index, lengths that
    are no multiple of 4 (the last Philox block cut) nor of a thread's span: equal bitwise,
    in [0, 1), and the call index counted."""
    with cupy_standin.installed() as cupy:
        rng = generator_at(cupy, seed, step, calls=call)
        u = rng.random((n,), dtype=dtype)
        assert rng.calls == call + 1
        u = u.get()
    assert u.dtype == dtype and 0.0 <= u.min() and u.max() < 1.0
    assert numpy.array_equal(u, counter_uniform(seed, step, call, n, dtype))


def test_counter_words_take_word_i_mod_4_of_block_i_div_4():
    """The layout itself: element i of (seed, step, call) is word i % 4 of Philox at
    counter (i // 4, call, step lo, step hi), key (seed lo, seed hi)."""
    seed, step, call = 0x0123456789ABCDEF, 0xFEDCBA9876543210, 77
    words = counter_words(seed, step, call, 11)
    for i in (0, 3, 4, 10):
        block = philox4x32_10([(i // 4, call, 0x76543210, 0xFEDCBA98)], (0x89ABCDEF, 0x01234567))
        assert words[i] == block[0][i % 4]

# ------------------------------------------------------------------- the masks' statistics


def keep_masks(seed, step, call, n, p):
    return counter_uniform(seed, step, call, n, numpy.float32) >= numpy.float32(p)


def correlation(a, b):
    return float(numpy.corrcoef(a.astype(float), b.astype(float))[0, 1])


@needs_gpp
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_the_keep_rate_is_one_minus_p_within_four_standard_errors(cupy, p):
    """The kernel's masks (fast_gpu.dropout_forward of ones on the stand-in), 2^16 elements
    over 4 steps and calls: the fraction kept within 4 standard errors of 1 - p."""
    n = 2**14
    rng = counter_rng.default_rng(cupy, 12345)
    ones = cupy.ones(n, numpy.float32)
    kept = []
    for _ in range(2):
        rng.begin_step()
        for _ in range(2):
            out, _ = fast.dropout_forward(ones, p, rng, True)
            kept.append(out.get() != 0)
    rate, se = numpy.concatenate(kept).mean(), math.sqrt(p * (1 - p) / (4 * n))
    record(f"counter dropout keep rate p={p}: standard errors from 1 - p",
           abs(rate - (1 - p)) / se)
    assert abs(rate - (1 - p)) <= 4 * se, (rate, 1 - p, se)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_masks_are_uncorrelated_across_steps_calls_and_neighbours(p):
    """2^18 elements (the NumPy layout, which the kernel equals bitwise): the correlation of
    keep decisions between consecutive steps, consecutive calls, neighbouring elements (in
    one Philox block and across blocks), elements 4 apart (the same word of neighbouring
    blocks) and neighbouring seeds (ranks), each within 4 / sqrt(n)."""
    n, seed, step, call = 2**18, 2024, 7, 3
    mask = keep_masks(seed, step, call, n, p)
    pairs = {
        "consecutive steps": (mask, keep_masks(seed, step + 1, call, n, p)),
        "consecutive calls": (mask, keep_masks(seed, step, call + 1, n, p)),
        "neighbouring seeds": (mask, keep_masks(seed + 1, step, call, n, p)),
        "elements i, i + 1": (mask[:-1], mask[1:]),
        "elements i, i + 4": (mask[:-4], mask[4:]),
        "words 0 and 3 of a block": (mask[0::4], mask[3::4]),
    }
    for what, (a, b) in pairs.items():
        r = correlation(a, b)
        record(f"counter dropout correlation x sqrt(n), {what}", abs(r) * math.sqrt(a.size))
        assert abs(r) <= 4 / math.sqrt(a.size), (what, r)

# --------------------------------------- the fast path vs ops.py with the same generator


@needs_gpp
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 37), (2, 5, 9)])
def test_dropout_kernels_drop_what_the_reference_drops(cupy, dtype, shape):
    """fast_gpu's dropout and dropout + residual against ops.py's on the stand-in, each with
    a CounterGenerator of the same seed at the same step: equal bitwise (the same mask, the
    same roundings), the cache a DropoutDraw (no mask stored), and the backward that
    regenerates the mask equal to ops.py's that reads it."""
    host = numpy.random.default_rng(1)
    x, residual, dout = (cupy.asarray(host.standard_normal(shape).astype(dtype))
                         for _ in range(3))
    fast_rng, ref_rng = generator_at(cupy, 9, 4), generator_at(cupy, 9, 4)
    out, draw = fast.dropout_forward(x, 0.3, fast_rng, True)
    ref_out, mask = ops.dropout_forward(x, 0.3, ref_rng, True)
    assert isinstance(draw, fast_gpu.DropoutDraw) and draw.step is fast_rng.step
    assert numpy.array_equal(out.get(), ref_out.get())
    assert numpy.array_equal(fast.dropout_backward(dout, draw).get(),
                             ops.dropout_backward(dout, mask).get())
    out, draw = fast.dropout_add_forward(x, residual, 0.3, fast_rng, True)
    ref_out, mask = ops.dropout_add_forward(x, residual, 0.3, ref_rng, True)
    assert draw.call == 1 and fast_rng.calls == ref_rng.calls == 2
    assert numpy.array_equal(out.get(), ref_out.get())
    assert numpy.array_equal(fast.dropout_backward(dout, draw).get(),
                             ops.dropout_backward(dout, mask).get())


@needs_gpp
@pytest.mark.parametrize("dtype, bound", [(numpy.float64, 1e-15), (numpy.float32, 1e-6),
                                          (numpy.float16, 1e-3)])
def test_softmax_with_dropout_drops_what_the_reference_drops(cupy, dtype, bound):
    """The attention's row kernel (mask bias, softmax, dropout drawn in the kernel, element
    index row * T + key, rows of 7 keys) against ops.softmax_forward then
    ops.dropout_forward on the stand-in with the same generator: the same mask exactly (its
    product with the kernel's own probs bitwise), the probs within `bound` of the
    reference's (summed in another order). The backward regenerating the mask equals,
    bitwise, the kernel fed the stored mask's product."""
    host = numpy.random.default_rng(2)
    scores = cupy.asarray((host.standard_normal((2, 3, 7, 7)) * 2).astype(dtype))
    dprobs = cupy.asarray(host.standard_normal((2, 3, 7, 7)).astype(dtype))
    fast_rng, ref_rng = generator_at(cupy, 31, 2), generator_at(cupy, 31, 2)
    probs, dropped, draw = fast_gpu._softmax(scores, None, 0.25, fast_rng)
    ref_probs, _ = ops.softmax_forward(scores)
    _, mask = ops.dropout_forward(ref_probs, 0.25, ref_rng, True)
    err = float(abs(probs.get().astype(float) - ref_probs.get()).max())
    assert err <= bound, err
    assert numpy.array_equal(dropped.get(), (probs * mask).get())
    regenerated = fast_gpu._softmax_backward(dprobs, draw, probs)
    stored = fast_gpu._softmax_backward(dprobs * mask, None, probs)
    assert numpy.array_equal(regenerated.get(), stored.get())


@needs_gpp
@pytest.mark.parametrize("dtype, bound", [(numpy.float64, 1e-12), (numpy.float32, 1e-5),
                                          (numpy.float16, 1e-2)])
def test_attention_with_dropout_is_the_reference_on_the_same_draws(cupy, dtype, bound):
    """The whole self-attention, forward and backward, with padding and dropout 0.25:
    fast.py's GPU path against ops.py's reference, both on the stand-in with a generator of
    the same seed and step. The same elements dropped (bitwise masks); context, the cache's
    probabilities and the gradients within `bound` (the products and sums are taken in
    another order)."""
    host = numpy.random.default_rng(3)
    B, T, A, D = 2, 6, 2, 3
    x, dcontext = (cupy.asarray(host.standard_normal((B, T, A * D)).astype(dtype))
                   for _ in range(2))
    w = cupy.asarray((host.standard_normal((3 * A * D, A * D)) * 0.5).astype(dtype))
    b = cupy.asarray(host.standard_normal(3 * A * D).astype(dtype))
    mask = numpy.ones((B, T), numpy.int64)
    mask[1, 4:] = 0
    bias = ops.attention_mask_bias(cupy.asarray(mask), dtype)
    runs = []
    for attention in (fast, ops):
        rng = generator_at(cupy, 5, 11)
        context, cache = attention.self_attention_forward(x, w, b, bias, A, 0.25, rng, True)
        grads = attention.self_attention_backward(dcontext, cache)
        runs.append((context, cache, grads))
    (context, cache, grads), (ref_context, ref_cache, ref_grads) = runs
    draw = cache.dropout_mask
    kept = fast_gpu.uniform(draw.step, (draw.seed_lo, draw.seed_hi), draw.call,
                            draw.shape, stats(dtype)) >= stats(dtype).type(0.25)
    assert numpy.array_equal(kept.get(), ref_cache.dropout_mask.get() != 0)
    for what, a, e in [("context", context, ref_context), ("probs", cache.probs,
                                                           ref_cache.probs),
                       *(("gradient", g, r) for g, r in zip(grads, ref_grads))]:
        a, e = a.get().astype(float), e.get().astype(float)
        err = float(abs(a - e).max() / max(abs(e).max(), 1e-300))
        record(f"counter dropout attention vs ops.py {numpy.dtype(dtype).name} {what}", err)
        assert err <= bound, (what, err)

# ------------------------------------------------------ state: seed, step, calls, resume


def test_the_same_seed_step_and_call_give_the_same_numbers_and_begin_step_new_ones(cupy):
    """Two generators of one seed draw the same; begin_step adds 1 to the device step in
    place (one launch, no host read: its address unchanged) and restarts the call index,
    so the first draw of the next step is new; a call index fixes the draw within a step."""
    a, b = counter_rng.default_rng(cupy, 3), counter_rng.default_rng(cupy, 3)
    first = a.random((5, 7), dtype=numpy.float32).get()
    assert numpy.array_equal(b.random((5, 7), dtype=numpy.float32).get(), first)
    assert not numpy.array_equal(a.random((5, 7), dtype=numpy.float32).get(), first)
    address = a.step.data.ptr
    cupy.counts.reset()
    a.begin_step()
    assert (cupy.counts.launches, cupy.counts.syncs, a.calls) == (1, 0, 0)
    assert a.step.data.ptr == address and a.step.dtype == numpy.uint64 and a.step.ndim == 0
    next_step = a.random((5, 7), dtype=numpy.float32).get()
    assert not numpy.array_equal(next_step, first)
    b.begin_step()
    assert numpy.array_equal(b.random((5, 7), dtype=numpy.float32).get(), next_step)
    assert counter_rng.default_rng(cupy, 4).random(8).dtype == numpy.float64
    assert isinstance(counter_rng.default_rng(numpy, 4), numpy.random.Generator)   # CPU: as ever


def test_state_dict_resumes_the_draws_in_the_same_device_array(cupy):
    """state_dict gives host ints (JSON-able); load_state_dict into a generator of another
    seed writes the step into its own device array and the next draws are the saved
    generator's."""
    rng = counter_rng.default_rng(cupy, 2**63 + 5)
    for _ in range(3):
        rng.begin_step()
    rng.random(10)
    state = json.loads(json.dumps(rng.state_dict()))
    assert state == {"seed": 2**63 + 5, "step": 3, "calls": 1}
    expected = rng.random((4, 9), dtype=numpy.float32).get()
    other = counter_rng.default_rng(cupy, 1)
    address = other.step.data.ptr
    other.load_state_dict(state)
    assert other.step.data.ptr == address
    assert numpy.array_equal(other.random((4, 9), dtype=numpy.float32).get(), expected)


def test_a_gpu_run_resumed_from_its_checkpoint_state_draws_the_same_masks(cupy, capsys):
    """training/run.py on the GPU path, one process: dropout_state saves the counter (JSON,
    as trainer_state.json), restore_dropout loads it, and the masks after the resume are an
    uninterrupted run's, with no note; a checkpoint of the CPU's kind (a bit generator's
    state) falls back to a new stream and says so."""
    from nanobert.training.run import dropout_state, restore_dropout, seed_dropout

    class Model:
        xp = cupy
    model = Model()
    seed_dropout(model, 17, 0)
    model.rng.begin_step()
    x = cupy.ones((6, 5), numpy.float32)
    fast.dropout_forward(x, 0.5, model.rng, True)
    saved = json.loads(json.dumps(dropout_state(model, SingleProcess())))
    model.rng.begin_step()
    expected = fast.dropout_forward(x, 0.5, model.rng, True)[0].get()
    resumed = Model()
    seed_dropout(resumed, 17, 0)
    restore_dropout(resumed, saved, seed=17, step=1, rank=0)
    resumed.rng.begin_step()
    assert numpy.array_equal(fast.dropout_forward(x, 0.5, resumed.rng, True)[0].get(), expected)
    assert capsys.readouterr().out == ""
    restore_dropout(resumed, numpy.random.default_rng(0).bit_generator.state, seed=17, step=1,
                    rank=0)
    assert "masks after the resume come from a new stream" in capsys.readouterr().out
    assert isinstance(resumed.rng, CounterGenerator)

# ---------------------------------------------------------------------------- refusals


def test_what_the_generator_cannot_take_is_a_clear_value_error(cupy):
    with pytest.raises(ValueError, match="seed -1 is not a 64-bit unsigned int"):
        counter_rng.default_rng(cupy, -1)
    rng = counter_rng.default_rng(cupy, 0)
    with pytest.raises(ValueError, match="float32 or float64"):
        rng.random(4, dtype=numpy.float16)
    with pytest.raises(ValueError, match=r"no \['calls'\]"):
        rng.load_state_dict({"seed": 0, "step": 1})
    with pytest.raises(ValueError, match="step 18446744073709551616"):
        rng.load_state_dict({"seed": 0, "step": 2**64, "calls": 0})
    x = cupy.ones((2, 3), numpy.float32)
    with pytest.raises(ValueError, match="CounterGenerator .* not a Generator"):
        fast.dropout_forward(x, 0.1, cupy.random.default_rng(0), True)
    _, draw = fast.dropout_forward(x, 0.1, rng, True)
    with pytest.raises(ValueError, match=r"DropoutDraw of \(3, 2\)"):
        fast.dropout_backward(x.T.copy(), draw)
