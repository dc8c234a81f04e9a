"""The CuPy path, proven as far as a CPU allows: through tests/cupy_standin.py (the real cupy
package's namespace, NumPy underneath, strict about host/device mixing), a training step
runs, gives the NumPy path's numbers, and stays within its budgets of kernel launches and
device-to-host syncs. Nothing here says anything about CUDA numerics or speed; the tests
that need a real GPU (test_inputs, test_special) skip without one."""
import os

import numpy
import pytest

import cupy_standin
from conftest import assert_close, record, vanishes
from counter_reference import dropout_generator, numpy_draws_like_the_gpu
from nanobert import backend
from nanobert.model import counter_rng, fast, ops
from nanobert.model.config import BertConfig, with_labels
from nanobert.model.heads import TASK_HEADS, BertForMultipleChoice
from nanobert.model.optim import (AdamW, LossScaler, clip_and_step,
                                  clip_by_global_norm)
from nanobert.model.pretraining import BertForPreTraining


def test_the_namespace_file_is_the_installed_cupys():
    """The stand-in's copy of CuPy's namespace (tests/cupy_namespace.json: names, parameters,
    type tables), which lets it run without CuPy, is what the installed CuPy of that version
    gives (rewrite it with `python tests/cupy_namespace.py` for another version)."""
    import cupy_namespace
    try:
        snapshot = cupy_namespace.snapshot()
    except ImportError as e:
        pytest.skip(f"CuPy is not installed ({e}): nothing to compare the file with")
    saved = cupy_namespace.load()
    if snapshot["version"] != saved["version"]:
        pytest.skip(f"CuPy {snapshot['version']} is installed, the file is {saved['version']}'s")
    assert snapshot == saved, "tests/cupy_namespace.json differs from the installed CuPy's"


BERT_BASE = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072)
TINY = dict(vocab_size=97, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=24, max_position_embeddings=16)


@pytest.fixture
def cupy():
    with cupy_standin.installed() as module:
        module.counts.reset()
        yield module


def pretraining_batch(config, B, T, seed=0):
    rng = numpy.random.default_rng(seed)
    ids = rng.integers(5, config.vocab_size, size=(B, T))
    labels = numpy.full((B, T), -100)
    for b in range(B):
        positions = rng.choice(numpy.arange(1, T), size=max(1, T // 7), replace=False)
        labels[b, positions] = ids[b, positions]
    mask = numpy.ones((B, T), dtype=numpy.int64)
    mask[0, T - 2:] = 0
    return {"input_ids": ids, "token_type_ids": (numpy.arange(T) >= T // 2) * numpy.ones((B, 1),
                                                                                      int),
            "attention_mask": mask, "labels": labels,
            "next_sentence_label": rng.integers(0, 2, size=B)}

# -------------------------------------------------------------------- the stand-in itself


def test_standin_refuses_what_cupy_refuses(cupy):
    a = cupy.zeros(3, dtype=numpy.float32)
    with pytest.raises(TypeError, match="NumPy array where CuPy needs a device array"):
        a + numpy.ones(3, dtype=numpy.float32)                  # implicit host -> device
    with pytest.raises(TypeError, match="implicit device -> host"):
        numpy.asarray(a)
    with pytest.raises(TypeError, match="called on a device array"):
        numpy.sum(a)
    with pytest.raises(AttributeError, match="NumPy-only"):
        cupy.float128                                             # noqa: B018
    with pytest.raises(TypeError, match="cupy.sum"):
        cupy.sum(a, initial=0.0)                                  # a keyword CuPy lacks
    with pytest.raises(AttributeError, match="cupy.ndarray has no attribute"):
        a.resize(4)
    with pytest.raises(AttributeError, match="Generator has no method"):
        cupy.random.default_rng(0).bytes(4)


def test_standin_counts_launches_and_syncs(cupy):
    a = cupy.arange(6, dtype=numpy.float32)                      # 1 launch
    b = a.reshape(2, 3).T                                        # views: none
    c = b * 2.0 + 1.0                                            # 2
    cupy.counts.reset()
    total = c.sum()                                              # 1, a 0-d device array
    assert (cupy.counts.launches, cupy.counts.syncs) == (1, 0)
    assert float(total) == 36.0                                  # the host reads: a sync
    assert cupy.counts.syncs == 1
    fused = cupy.fuse(lambda x, y: x * y + 1.0)
    cupy.counts.reset()
    fused(c, c)
    assert cupy.counts.launches == 1
    with pytest.raises(TypeError, match="inside a cupy.fuse"):
        cupy.fuse(lambda x: x.sum())(c)


def launches_of(cupy, fn):
    cupy.counts.reset()
    result = fn()
    return cupy.counts.launches, result


def test_standin_matmul_copies_what_cupy_copies(cupy):
    """CuPy 14's matmul (cupy/_core/_routines_linalg.pyx): 2-D operands that are C- or
    F-contiguous go to cuBLAS as they are (a transpose is a trans flag), batched operands
    must be C-contiguous, out= must be C-contiguous; anything else costs a copy kernel."""
    host = numpy.random.default_rng(0).standard_normal((4, 6, 6)).astype(numpy.float32)
    a, b = cupy.asarray(host[0]), cupy.asarray(host[1])           # [6, 6] each
    batch, other = cupy.asarray(host[:2]), cupy.asarray(host[2:])  # [2, 6, 6] each
    out = cupy.empty((6, 6), dtype=numpy.float32)
    half_host = host.astype(numpy.float16)
    half = cupy.asarray(half_host)
    cases = {
        "2-D": (lambda: a @ b, 1, host[0] @ host[1]),
        "2-D transposed operands": (lambda: cupy.matmul(b.T, a.T), 1, host[1].T @ host[0].T),
        "2-D strided operands": (lambda: a[:, ::2] @ b[::2], 3, host[0][:, ::2] @ host[1][::2]),
        "2-D into C out": (lambda: cupy.matmul(a, b, out=out), 1, host[0] @ host[1]),
        "2-D into transposed out": (lambda: cupy.matmul(a, b, out=out.T), 2,
                                    host[0] @ host[1]),
        "batched": (lambda: batch @ other, 1, host[:2] @ host[2:]),
        "batched transposed operand": (lambda: batch @ other.transpose(0, 2, 1), 2,
                                       host[:2] @ host[2:].transpose(0, 2, 1)),
        "batched broadcast": (lambda: batch @ a, 1 + 3, host[:2] @ host[0]),
        "batched into its own operand": (lambda: cupy.matmul(batch, other, out=batch), 2,
                                         host[:2] @ host[2:]),
        "batched float16 (operands cast up, product down)": (
            lambda: half[:2] @ half[2:], 4, half_host[:2] @ half_host[2:]),
        "2-D float16 (cuBLAS reads float16)": (lambda: half[0] @ half[1], 1,
                                               half_host[0] @ half_host[1]),
    }
    for what, (fn, expected, value) in cases.items():
        count, result = launches_of(cupy, fn)
        assert count == expected, f"{what}: {count} launches, CuPy launches {expected}"
        assert_close(result.get(), value, 1e-3 if result.dtype == numpy.float16 else 1e-6,
                     "stand-in matmul")
    with pytest.raises(TypeError, match="gufunc machinery"):
        cupy.matmul(a, b, out=cupy.empty((6, 6), dtype=numpy.float64))


def operations_of(cupy, fn):
    """fn() -> (kernels, memsets, copies, host waits) it cost on the stand-in."""
    cupy.counts.reset()
    fn()
    c = cupy.counts
    return c.kernel_launches, c.memsets, c.copies, c.host_waits


def test_standin_counts_what_cupy14_launches(cupy):
    """Each rule as CuPy 14.2's source has it (cupy_standin.py cites the file): kernels,
    memsets and copies apart, a pageable host-to-device copy a host wait."""
    host = numpy.random.default_rng(0).standard_normal((64, 256)).astype(numpy.float32)
    x = cupy.asarray(host)                                          # [64, 256]
    half = x.astype(numpy.float16)
    rng = cupy.random.default_rng(0)
    rows, cols = cupy.arange(4), cupy.arange(4)
    row_sums = cupy.empty(64, dtype=numpy.float32)
    total = cupy.ReductionKernel("T x", "T s", "x", "a + b", "s = a", "0", "total")
    cases = {
        "asarray of a pageable NumPy array": (lambda: cupy.asarray(host), (0, 0, 1, 1)),
        "asarray of a 0-d zero": (lambda: cupy.asarray(numpy.float32(0)), (0, 1, 0, 0)),
        "asarray of a 0-d one": (lambda: cupy.asarray(numpy.float32(1)), (1, 0, 0, 0)),
        "zeros": (lambda: cupy.zeros((4, 4), dtype=numpy.float32), (0, 1, 0, 0)),
        "zeros_like": (lambda: cupy.zeros_like(x), (0, 1, 0, 0)),
        "ones": (lambda: cupy.ones(4, dtype=numpy.float32), (1, 0, 0, 0)),
        "astype": (lambda: x.astype(numpy.float16), (1, 0, 0, 0)),
        "astype to its own dtype, copy=False": (lambda: x.astype(x.dtype, copy=False),
                                                (0, 0, 0, 0)),
        "row means, float32 (CUB sum + divide)": (lambda: x.mean(axis=-1), (2, 0, 0, 0)),
        "row means, float16 (float32 mean + cast)": (lambda: half.mean(axis=-1),
                                                     (2, 0, 0, 0)),
        "column sums (generic kernel)": (lambda: x.sum(axis=0), (1, 0, 0, 0)),
        "column sums into out=": (lambda: cupy.sum(x, axis=0, out=x[0]), (1, 0, 0, 0)),
        "row sums into out= (CUB, then a copy)": (lambda: x.sum(axis=1, out=row_sums),
                                                  (2, 0, 0, 0)),
        "full sum beyond one CUB tile": (lambda: x.sum(), (2, 0, 0, 0)),
        "full sum within one tile": (lambda: x[:4].sum(), (1, 0, 0, 0)),
        "row max": (lambda: x.max(axis=-1, keepdims=True), (1, 0, 0, 0)),
        "vdot (multiply, DeviceReduce, copy)": (lambda: cupy.vdot(x, x), (4, 0, 0, 0)),
        "ReductionKernel of one input, full (CUB block, 2 passes)": (lambda: total(x),
                                                                     (2, 0, 0, 0)),
        "ReductionKernel of one input, 4 per row (generic)": (lambda: total(x[:, :4], axis=1),
                                                              (1, 0, 0, 0)),
        "Generator.random": (lambda: rng.random((4, 4), dtype=numpy.float32), (1, 0, 0, 0)),
        "Generator.random(out=)": (lambda: rng.random((64, 256), dtype=numpy.float32,
                                                      out=x), (2, 0, 0, 0)),
        "Generator.integers": (lambda: rng.integers(0, 2 ** 32, size=8, dtype=numpy.uint32),
                               (2, 0, 0, 0)),
        "take with one index array": (lambda: x[rows], (1, 0, 0, 0)),
        "take with two index arrays": (lambda: x[rows, cols], (3, 1, 0, 0)),
        "scatter with two index arrays": (lambda: x.__setitem__((rows, cols), 0.0),
                                          (3, 2, 0, 0)),
        "scatter of another dtype's values": (lambda: x.__setitem__(rows, half[:4]),
                                              (2, 0, 0, 0)),
        "slice = same-layout array (memcpy)": (lambda: x.__setitem__(slice(0, 4), x[4:8]),
                                               (0, 0, 1, 0)),
        "slice = 0": (lambda: x.__setitem__(slice(0, 4), 0), (0, 1, 0, 0)),
        "column slice = 1 (fill kernel)": (lambda: x.__setitem__((slice(None), 0), 1),
                                           (1, 0, 0, 0)),
        "concatenate of 3": (lambda: cupy.concatenate([x, x, x]), (3, 0, 0, 0)),
        "where on bool": (lambda: cupy.where(x > 0, x, 0), (2, 0, 0, 0)),
    }
    for what, (fn, expected) in cases.items():
        assert operations_of(cupy, fn) == expected, (
            f"{what}: (kernels, memsets, copies, host waits) "
            f"{operations_of(cupy, fn)}, CuPy 14: {expected}")


def test_standin_refuses_a_python_float_that_cupy13_promotes(cupy):
    """A Python float argument of a fused kernel is float64 to CuPy 13 (float32 arithmetic
    becomes float64; CuPy 14 keeps float32): refused beside any float32/float16 array, also
    where the result is bool (a float32 uniform >= 0.7 in float64 keeps other elements than
    in float32: 0.7 is not a float32); float64 arrays may take one. The fast layer's dropout
    passes p in the uniform's dtype."""
    x = cupy.ones(4, dtype=numpy.float32)
    shift = cupy.fuse(lambda x, e: x + e)
    with pytest.raises(TypeError, match="CuPy 13 compute in"):
        shift(x, 1e-5)
    assert shift(x, numpy.float32(1e-5)).dtype == numpy.float32
    keep = cupy.fuse(lambda x, p: x >= p)
    with pytest.raises(TypeError, match="CuPy 13 compute in float64 beside float32"):
        keep(x, 0.7)
    assert keep(x, numpy.float32(0.7)).dtype == numpy.bool_
    assert keep(x.astype(numpy.float64), 0.7).dtype == numpy.bool_
    fast.dropout_forward(x.reshape(2, 2), 0.7, counter_rng.default_rng(cupy, 0), True)
    gamma, beta = cupy.ones(4, dtype=numpy.float32), cupy.zeros(4, dtype=numpy.float32)
    out, (_, _, rstd) = fast.layernorm_forward(x.reshape(2, 2), gamma[:2], beta[:2], 1e-12)
    assert rstd.dtype == numpy.float32


def test_standin_reduction_kernel_is_one_launch_of_a_sum(cupy):
    dot = cupy.ReductionKernel("T x, T y", "T total", "x * y", "a + b", "total = a", "0", "dot")
    x = cupy.arange(6, dtype=numpy.float64).reshape(2, 3)
    count, total = launches_of(cupy, lambda: dot(x, x.T.T, axis=1, keepdims=True))
    assert count == 1 and total.shape == (2, 1) and total.get().ravel().tolist() == [5.0, 50.0]
    with pytest.raises(TypeError, match="plain sums only"):
        cupy.ReductionKernel("T x", "T m", "x", "max(a, b)", "m = a", "0", "largest")


def test_get_xp_gpu_without_a_driver_is_a_clear_runtime_error():
    if backend.gpu_available():
        pytest.skip("a GPU is present")
    try:
        import cupy  # noqa: F401
    except ImportError:
        pytest.skip("needs the real CuPy, not installed (without it get_xp says so: "
                    "test_gpu_refusals)")
    with pytest.raises(RuntimeError, match="CuPy cannot reach a GPU") as e:
        backend.get_xp("gpu")
    assert type(e.value) is RuntimeError       # not cupy's CUDARuntimeError


def test_tf32_on_by_default_and_a_flag_turns_it_off(cupy, monkeypatch):
    monkeypatch.setenv("NANOBERT_TF32", "")      # recorded, so that teardown restores both
    monkeypatch.setenv("CUPY_TF32", "")
    monkeypatch.delenv("NANOBERT_TF32")
    backend.get_xp("gpu")
    assert os.environ["CUPY_TF32"] == "1"
    assert backend.matmul_precision(numpy.float32, "gpu") == "tf32"
    backend.set_tf32(False)
    assert os.environ["CUPY_TF32"] == "0"
    assert backend.matmul_precision(numpy.float32, "gpu") == "float32"
    assert backend.matmul_precision(numpy.float16, "gpu") == "float16"

# ------------------------------------------------------------------------------ budgets


@pytest.mark.parametrize("dtype, budget", [(numpy.float32, 587),
                                           (numpy.float16, 643)])
def test_bert_base_step_launch_and_sync_budgets(cupy, dtype, budget):
    """BERT-base, a training step that does not log: 0 device-to-host syncs, forward +
    backward within its budget of GPU operations (kernels + memsets + copies, as CuPy 14
    launches them; float16 adds the float16 weight gradients' casts into their float32
    buffers and a few casts around the losses; LayerNorm, GELU and softmax read and write
    float16 in their kernels; the products and column sums are one cuBLAS call each).
    History: counted as Python-level calls, 990 (float32) and 1,328 (float16); counted as
    CuPy 14 launches, 1,118 and 1,672 before fast_gpu's cuBLAS calls and fused kernels,
    1,080 and 1,112 after, 974 and 1,032 once LayerNorm's row means (CUB's sum and a divide)
    became one cuBLAS call each, 733 and 791 once LayerNorm (5 launches forward, 6 backward)
    and the attention's mask + softmax + dropout (5 forward, 2 backward) became one row
    kernel each (kernels.cu's row kernels; the backward LayerNorm's two column sums stay cuBLAS
    calls), 680 and 736 once each cross-entropy was one kernel forward and one backward, 667
    and 723 once each feed-forward up-projection and the MLM transform added their bias in
    their GELU's kernel instead of a rank-1 product (ops.linear_gelu), 630 and 686 once
    dropout drew its masks inside the kernels (counter_rng.py: the 37 cuRAND draws gone), 581
    and 638 once each Add & Norm was one row kernel forward and one backward (kernels.cu's
    dropout_add_layernorm_*: 4 launches a layer fewer), 585 and 641 once the MLM decoder's
    three products each split into an aligned head and a 2-column tail of the vocab
    (fast_gpu._split_wide: 30,522 = 30,520 + 2); the budgets, 587 and 643, leave room for
    the fills of the ones vectors the column sums multiply by, made once per process.
    CUPTI saw 1,000 kernels for a whole B=32 TF32 step on an H200 where the stand-in counted
    968 (cuBLAS splits some products in two).
    The update (optim.clip_and_step: clipping folded into AdamW) 8 launches, vdot alone 4,
    3 of them over the flat gradient buffer (vdot's 2, AdamW; 9 and 4 with the clip's own
    multiply before). The 6 host-to-device copies of the batch are
    async copies from pinned memory (backend.PinnedStaging): 0 host waits (6 when they were
    pageable). Counts depend on the layer count, hardly on B and T (only where a reduction
    crosses CUB's thresholds): a small batch keeps the CPU time down. Nothing here measures
    GPU time."""
    config = BertConfig(**BERT_BASE)
    batch = pretraining_batch(config, 2, 16)
    model = BertForPreTraining(config, dtype=dtype, device="gpu").train()
    optimizer = AdamW(model.params, mode="bert")
    counts = cupy.counts
    counts.reset()
    loss, grads = model.loss_and_grads(batch, on_device=True)
    forward_backward = (counts.launches, counts.syncs, dict(counts.sync_sites),
                        counts.kernel_launches, counts.memsets, counts.copies,
                        counts.host_waits)
    counts.reset()
    clip_and_step(optimizer, grads, 1e-4, max_norm=1.0)
    update = (counts.launches, counts.syncs, counts.passes_over(model.buffer.size))
    print(f"BERT-base {numpy.dtype(dtype).name} step on the stand-in: forward+backward "
          f"{forward_backward[0]} GPU operations ({forward_backward[3]} kernels, "
          f"{forward_backward[4]} memsets, {forward_backward[5]} copies), "
          f"{forward_backward[1]} syncs, {forward_backward[6]} host waits; clipping + AdamW "
          f"{update[0]} kernels, {update[1]} syncs")
    assert forward_backward[1] == 0, f"syncs in forward+backward: {forward_backward[2]}"
    assert forward_backward[0] <= budget, forward_backward
    assert forward_backward[6] == 0, forward_backward[2]
    assert update == (8, 0, 3), update
    assert isinstance(loss, cupy.ndarray) and loss.ndim == 0
    assert numpy.isfinite(float(loss))                           # read once, when logging


def attention_on(xp, dtype, dropout, seed=5, B=2, T=5, A=2, D=3):
    """fast.self_attention_forward + _backward on namespace xp, padding in the second row,
    dropout drawn by the counter-based generator on either side (NumPy: its host twin)
    -> (context, cache, (dx, dw, db)) on the host."""
    rng = numpy.random.default_rng(seed)
    H = A * D
    x, dcontext = (rng.standard_normal((B, T, H)).astype(dtype) for _ in range(2))
    w = (rng.standard_normal((3 * H, H)) * 0.5).astype(dtype)
    b = rng.standard_normal(3 * H).astype(dtype)
    mask = numpy.ones((B, T), dtype=numpy.int64)
    mask[1, 3:] = 0
    put = (lambda a: a) if xp is numpy else xp.asarray
    bias = ops.attention_mask_bias(put(mask), dtype)
    with numpy_draws_like_the_gpu():
        context, cache = fast.self_attention_forward(put(x), put(w), put(b), bias, A, dropout,
                                                     dropout_generator(xp, seed), True)
    grads = fast.self_attention_backward(put(dcontext), cache)
    return backend.to_host(context), cache._replace(qkv=None), [backend.to_host(g)
                                                                for g in grads]


@pytest.mark.parametrize("dropout", [0.0, 0.25])
@pytest.mark.parametrize("dtype, tol", [(numpy.float64, 1e-12), (numpy.float32, 1e-5),
                                        (numpy.float16, 1e-2)])
def test_device_attention_gives_the_numpy_numbers_without_a_copy(dtype, tol, dropout):
    """The CuPy path of self-attention (contiguous heads, its 6 batched products, the 3 of
    the projection and the bias gradient's ones-vector product as direct cuBLAS calls with
    transposes as op flags, emulated by the stand-in from the call's raw arguments) against
    the NumPy path: same context, cache and gradients, and no cupy.matmul or copy kernel
    around them. float16: the stand-in's float16 products are float32 sums rounded once,
    the NumPy path's too, in another order: the looser bound."""
    expected = attention_on(numpy, dtype, dropout)
    with cupy_standin.installed() as cupy:
        cupy.counts.reset()
        actual = attention_on(cupy, dtype, dropout)
        kernels = dict(cupy.counts.kernels)
    name = f"stand-in vs NumPy attention {numpy.dtype(dtype).name}"
    assert_close(actual[0], expected[0], tol, name + " context")
    for field in ("q", "k", "v", "probs", "probs_dropped"):
        assert_close(backend.to_host(getattr(actual[1], field)), getattr(expected[1], field),
                     tol, name + " cache")
    for a, e in zip(actual[2], expected[2]):
        assert_close(a, e, tol, name + " gradients")
    assert kernels.get("cublas.gemmStridedBatchedEx") == 6 + 3 + 1, kernels
    # float16 weight gradient: its float16 product cast into the float32 buffer (a setitem)
    assert not [k for k in kernels if k.startswith("matmul")], kernels


def float16_steps(device, steps=3, counts=None):
    """`steps` mixed-precision steps; counts (the stand-in's) reset once the model is built:
    its weights' copies to the device come before any step."""
    config = BertConfig(**TINY)
    model = BertForPreTraining(config, dtype=numpy.float16, device=device).train()
    optimizer, scaler = AdamW(model.params, mode="torch"), LossScaler(model.xp)
    if counts is not None:
        counts.reset()
    for step in range(steps):
        model.rng = dropout_generator(model.xp, step)   # the same masks on both sides
        with numpy_draws_like_the_gpu():
            _, grads = model.loss_and_grads(pretraining_batch(config, 2, 12, seed=step),
                                            on_device=True, loss_scale=scaler.scale)
        scaler.unscale(grads)
        found_inf = scaler.update(clip_by_global_norm(grads, 1.0, mode="torch"))
        optimizer.step(grads, lr=1e-3, skip=found_inf)
    return model, scaler


def test_float16_step_with_loss_scaler_never_syncs():
    """Mixed precision on the stand-in: no host wait in three steps (one of which overflows
    at the starting scale of 2^16 and is skipped on the device), and the same scale and
    weights as the NumPy run."""
    cpu_model, cpu_scaler = float16_steps("cpu")
    with cupy_standin.installed() as cupy:
        model, scaler = float16_steps("gpu", counts=cupy.counts)
        assert cupy.counts.syncs == 0, dict(cupy.counts.sync_sites)
        assert scaler.state_dict() == cpu_scaler.state_dict()
        for name, p in model.params.items():
            assert p.dtype == numpy.float32
            if name.endswith("attention.self.key.bias"):
                # its gradient is 0 in exact arithmetic (a key bias adds the same q.b to all
                # of a query's scores, which softmax ignores): rounding noise, summed in the
                # row kernel's order on the GPU path. Within 1% of one step of lr 1e-3
                assert abs(p.get() - cpu_model.params[name]).max() <= 1e-5, name
                continue
            # float16 roundings of float32 results summed in another order (the row kernels'
            # warp order, NumPy's pairwise one) differ by an ulp: within half of float16's
            # ulp, 2^-12 (measured 1.1e-4)
            assert_close(p.get(), cpu_model.params[name], 2.0 ** -12,
                         "stand-in vs NumPy float16 weights")

# ------------------------------------------------------- same numbers as the NumPy path


def run_steps(device, mode, steps=2, dtype=numpy.float64):
    config = BertConfig(**TINY)
    model = BertForPreTraining(config, seed=3, dtype=dtype, device=device).train()
    model.packs = False         # CuPy runs the padded batch: NumPy the same draws and math
    optimizer = AdamW(model.params, mode=mode)
    losses, norms = [], []
    for step in range(steps):
        model.rng = dropout_generator(model.xp, step)   # the same masks on both sides
        with numpy_draws_like_the_gpu():
            loss, grads = model.loss_and_grads(pretraining_batch(config, 3, 12, seed=step),
                                               on_device=True)
        norms.append(float(clip_by_global_norm(grads, 0.05, mode=mode)))
        optimizer.step(grads, lr=1e-2)
        losses.append(float(loss))
    grads = {k: backend.to_host(g) for k, g in grads.items()}
    return losses, norms, {k: backend.to_host(p) for k, p in model.params.items()}, grads


@pytest.mark.parametrize("mode", ["bert", "torch"])
def test_cupy_branches_give_the_numpy_numbers(mode):
    """The fused kernels, device-side clipping and the AdamW kernel body (run from its CUDA
    C source by the stand-in) against the NumPy path, float64, dropout on: same losses,
    norms, gradients and weights after two clipped steps."""
    expected = run_steps("cpu", mode)
    with cupy_standin.installed():
        actual = run_steps("gpu", mode)
    for what, a, e in zip(("losses", "norms"), actual[:2], expected[:2]):
        assert_close(a, e, 1e-12, f"stand-in vs NumPy {what}")
    for name in expected[2]:
        if name.endswith("attention.self.key.bias"):
            # Its true gradient is 0 (softmax ignores a shift shared by all keys): both sides
            # hold rounding noise (~1e-21), compared absolutely.
            assert numpy.abs(actual[2][name] - expected[2][name]).max() <= 1e-15
            continue
        assert_close(actual[2][name], expected[2][name], 1e-12, "stand-in vs NumPy weights")
        assert_close(actual[3][name], expected[3][name], 1e-10, "stand-in vs NumPy gradients")


def task_batch(model_class, config, B=2, T=10, seed=0):
    rng = numpy.random.default_rng(seed)
    shape = (B, 3, T) if model_class is BertForMultipleChoice else (B, T)
    batch = {"input_ids": rng.integers(5, config.vocab_size, size=shape),
             "attention_mask": numpy.ones(shape, dtype=numpy.int64)}
    name = model_class.__name__
    if name == "BertForSequenceClassification":
        batch["labels"] = rng.integers(0, 2, size=B)
    elif name == "BertForTokenClassification":
        batch["labels"] = numpy.where(rng.random((B, T)) < 0.3, -100, rng.integers(0, 2, (B, T)))
    elif name == "BertForQuestionAnswering":
        batch["start_positions"], batch["end_positions"] = [2, 3], [4, T + 3]
    else:
        batch["labels"] = rng.integers(0, 3, size=B)
    return batch


@pytest.mark.parametrize("model_class", TASK_HEADS, ids=lambda c: c.__name__)
def test_each_finetuning_head_runs_on_the_standin_without_syncs(model_class):
    config = with_labels(BertConfig(**TINY), 2)
    batch = task_batch(model_class, config)
    cpu = model_class(config, seed=1, dtype=numpy.float64).eval()
    expected_loss, expected = cpu.loss_and_grads(batch)
    with cupy_standin.installed() as cupy:
        gpu = model_class(config, seed=1, dtype=numpy.float64, device="gpu").eval()
        optimizer = AdamW(gpu.params)
        cupy.counts.reset()
        loss, grads = gpu.loss_and_grads(batch, on_device=True)
        assert cupy.counts.syncs == 0, dict(cupy.counts.sync_sites)
        assert_close(float(loss), expected_loss, 1e-12, "stand-in vs NumPy head losses")
        task = {"BertForQuestionAnswering": "qa",
                "BertForMultipleChoice": "choice"}.get(model_class.__name__, "")
        largest = max(numpy.abs(g).max() for g in expected.values())
        for name, g in expected.items():
            if vanishes(task, name, config):    # rounding noise on both sides (conftest)
                err = record("stand-in vs NumPy head vanishing gradients / largest",
                             float(numpy.abs(grads[name].get() - g).max() / largest))
                assert err <= 1e-12, name
                continue
            assert_close(grads[name].get(), g, 1e-12, "stand-in vs NumPy head gradients")
        cupy.counts.reset()
        clip_by_global_norm(grads, 1.0)
        optimizer.step(grads)
        assert cupy.counts.syncs == 0, dict(cupy.counts.sync_sites)


def test_regression_and_multilabel_losses_stay_on_the_device(cupy):
    from nanobert.model.heads import BertForSequenceClassification
    for num_labels, kind, labels in (
            (1, "regression", numpy.array([0.5, -1.0])),
            (3, "multi_label_classification", numpy.array([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]]))):
        config = with_labels(BertConfig(**TINY), num_labels, problem_type=kind)
        model = BertForSequenceClassification(config, device="gpu")
        cupy.counts.reset()
        loss, _ = model.loss_and_grads({"input_ids": numpy.full((2, 6), 7), "labels": labels},
                                       on_device=True)
        assert cupy.counts.syncs == 0 and loss.ndim == 0

# ------------------------------------------- unmodified command lines, on the stand-in

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_on_standin(tmp_path, argv):
    """Run a command line in a fresh Python whose `import cupy` is the stand-in (via
    tests/standin_site/sitecustomize.py) -> its launch and sync counts."""
    import json
    import subprocess
    import sys
    counts = tmp_path / "counts.json"
    env = {**os.environ, "NANOBERT_CUPY_STANDIN": "1", "NANOBERT_CUPY_STANDIN_COUNTS": str(counts),
           "PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "tests", "standin_site"),
                                          os.path.join(ROOT, "tests"), ROOT])}
    result = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(counts.read_text()), result.stdout


def train_on_standin(tmp_path, steps, *extra):
    config = tmp_path / "config.json"
    config.write_text('{"vocab_size": 8192, "hidden_size": 32, "num_hidden_layers": 1, '
                      '"num_attention_heads": 2, "intermediate_size": 64, '
                      '"max_position_embeddings": 128}')
    data = os.path.join(ROOT, "data", "brown")
    out = tmp_path / f"run-{steps}-{len(extra)}"
    counts, _ = run_on_standin(tmp_path, [
        "train.py", "--device", "gpu", "--data", os.path.join(data, "heldout.txt.gz"),
        "--heldout", "--vocab", os.path.join(data, "vocab-uncased-8192.txt"), "--config",
        str(config), "--dupe-factor", "1", "--max-seq-length", "64", "--batch-size", "8",
        "--steps", str(steps), "--out", str(out), *extra])
    assert (out / "checkpoint" / "model.safetensors").exists()
    return counts


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_train_py_steps_that_do_not_log_never_sync(tmp_path, dtype):
    """train.py --device gpu, unmodified, on the stand-in (B=2, one layer of H=32): a run of
    6 steps and one of 3, each logging and saving once at its end, differ by 3 steps that do
    not log, and those issue no host wait at all: no device-to-host sync, no pageable
    host-to-device copy; each hands its inputs over as 10 async copies from pinned memory
    (input_ids, token_type_ids, attention_mask, the masked positions, their labels, the NSP
    labels, the learning rate, the micro-batch's weight, the two denominators) and replays
    the step's CUDA graph,
    captured once; the run keeps one dropout generator."""
    quiet = ("--log-every", "1000", "--checkpoint-every", "1000", "--eval-every", "0",
             "--dtype", dtype, "--batch-size", "2")
    short, long = train_on_standin(tmp_path, 3, *quiet), train_on_standin(tmp_path, 6, *quiet)
    print(f"train.py --device gpu {dtype} on the stand-in: 3 steps {short}, 6 steps {long}")
    assert long["syncs"] == short["syncs"], (short["sync_sites"], long["sync_sites"])
    assert long["pageable_copies"] == short["pageable_copies"]
    assert long["pinned_copies"] - short["pinned_copies"] == 3 * 10
    assert long["generators"] == short["generators"]
    assert long["captures"] == short["captures"] == 1
    assert long["graph_launches"] - short["graph_launches"] == 3


def test_train_py_replays_what_it_would_run_eagerly(tmp_path):
    """train.py --device gpu on the stand-in, 5 steps replayed from its CUDA graph and 5 with
    --no-cuda-graph (dropout on, the lr warming up): the same checkpoint, byte for byte."""
    quiet = ("--log-every", "1000", "--checkpoint-every", "1000", "--eval-every", "0",
             "--batch-size", "2", "--warmup", "3")
    graphed = train_on_standin(tmp_path, 5, *quiet)
    eager = train_on_standin(tmp_path, 5, *quiet, "--no-cuda-graph")
    assert graphed["graph_launches"] == 4 and eager["graph_launches"] == 0   # 1: eager
    weights = [(tmp_path / f"run-5-{n}" / "checkpoint" / "model.safetensors").read_bytes()
               for n in (len(quiet), len(quiet) + 1)]
    assert weights[0] == weights[1]


def test_bench_device_gpu_runs_on_the_standin(tmp_path):
    """bench.train_step's GPU branch, on its smoke-test config: the stand-in runs the CUDA
    kernels lane by lane (tests/cuda_emulation.py), and BERT-mini's B=32, T=128 step took
    three minutes that way."""
    counts, stdout = run_on_standin(tmp_path, ["-m", "bench.train_step", "--device", "gpu",
                                               "--configs", "tiny", "--steps", "1",
                                               "--no-torch"])
    assert "matmuls in tf32" in stdout and "tiny" in stdout, stdout
