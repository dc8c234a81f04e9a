"""The learning-rate schedule, clipping, AdamW's two modes on hand-computed steps, and
gradient accumulation."""
import math

import numpy
import pytest
from hypothesis import given, settings, strategies as st

from nanobert import AdamW, BertConfig, BertForPreTraining, clip_by_global_norm, learning_rate
from nanobert.model.optim import LossScaler, average_gradients, global_norm, layer_decay_scales
from test_checkpoint import CONFIG


@given(peak=st.floats(1e-6, 1.0), warmup=st.integers(0, 50), total=st.integers(51, 500),
       step=st.integers(0, 600))
def test_schedule_is_linear_warmup_then_linear_decay_from_step_zero(peak, warmup, total, step):
    lr = learning_rate(step, peak, warmup, total)
    expected = peak * step / warmup if step < warmup else peak * max(0.0, 1 - step / total)
    assert lr == pytest.approx(expected, rel=1e-12, abs=1e-300)
    assert 0.0 <= lr <= peak


@pytest.mark.parametrize("mode", ["bert", "torch"])
def test_clipping_leaves_small_gradients_and_scales_large_ones_to_max_norm(mode):
    small = {"a": numpy.array([0.3, 0.4])}                 # norm 0.5
    assert clip_by_global_norm(small, 1.0, mode) == pytest.approx(0.5)
    numpy.testing.assert_array_equal(small["a"], [0.3, 0.4])
    large = {"a": numpy.array([3.0, 0.0]), "b": numpy.array([[4.0]])}    # norm 5
    assert clip_by_global_norm(large, 1.0, mode) == pytest.approx(5.0)
    expected = 1.0 if mode == "bert" else 5.0 / (5.0 + 1e-6)   # torch divides by norm + 1e-6
    assert global_norm(large) == pytest.approx(expected, rel=1e-12)


def test_bert_mode_has_no_bias_correction_and_adds_decay_to_the_update():
    params = {"w": numpy.array([1.0, -2.0]), "b.bias": numpy.array([0.5])}
    grads = {"w": numpy.array([0.1, 0.2]), "b.bias": numpy.array([-0.3])}
    AdamW(params, lr=0.1, mode="bert", weight_decay=0.01).step(grads)
    for name, p0, g, wd in (("w", numpy.array([1.0, -2.0]), grads["w"], 0.01),
                            ("b.bias", numpy.array([0.5]), grads["b.bias"], 0.0)):
        m, v = 0.1 * g, 0.001 * g * g                       # no bias correction
        expected = p0 - 0.1 * (m / (numpy.sqrt(v) + 1e-6) + wd * p0)
        numpy.testing.assert_allclose(params[name], expected, rtol=1e-14, err_msg=name)


def test_torch_mode_is_bias_corrected_with_decoupled_decay():
    p0, g = numpy.array([1.0, -2.0]), numpy.array([0.1, 0.2])
    params = {"w": p0.copy()}
    optimizer = AdamW(params, lr=0.1, mode="torch", weight_decay=0.01)
    optimizer.step({"w": g})
    optimizer.step({"w": g})
    p, m, v = p0.copy(), 0 * g, 0 * g
    for t in (1, 2):
        p *= 1 - 0.1 * 0.01
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
        p -= 0.1 / (1 - 0.9 ** t) * m / (numpy.sqrt(v) / math.sqrt(1 - 0.999 ** t) + 1e-8)
    numpy.testing.assert_allclose(params["w"], p, rtol=1e-14)


def test_layernorm_and_bias_are_not_decayed():
    names = ["bert.embeddings.LayerNorm.weight", "x.layer_norm.weight", "dense.bias",
             "dense.weight"]
    optimizer = AdamW({n: numpy.ones(1) for n in names}, weight_decay=0.01)
    assert [optimizer.weight_decay[n] for n in names] == [0.0, 0.0, 0.0, 0.01]


def test_optimizer_state_round_trips():
    params = {"w": numpy.ones(3)}
    a = AdamW(params, lr=0.1)
    a.step({"w": numpy.array([1.0, 2.0, 3.0])})
    b = AdamW({"w": numpy.ones(3)}, lr=0.1)
    b.load_state_dict(a.state_dict())
    assert b.step_count == 1
    numpy.testing.assert_array_equal(b.v["w"], a.v["w"])


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 1000))
def test_accumulating_equal_micro_batches_equals_one_big_batch(seed):
    model = BertForPreTraining(BertConfig(**CONFIG), seed=seed, dtype=numpy.float64).eval()
    rng = numpy.random.default_rng(seed)
    B, T = 4, 8
    ids = rng.integers(0, 50, size=(B, T))
    labels = numpy.full((B, T), -100)
    for b in range(B):                                       # 2 predictions per sequence
        where = rng.choice(T, size=2, replace=False)
        labels[b, where] = ids[b, where]
    batch = {"input_ids": ids, "labels": labels, "next_sentence_label": rng.integers(0, 2, size=B),
             "attention_mask": numpy.ones((B, T), dtype=int),
             "token_type_ids": numpy.zeros((B, T), dtype=int)}
    halves = [{k: v[i:i + 2] for k, v in batch.items()} for i in (0, 2)]
    loss, grads = model.loss_and_grads(batch)
    acc_loss, acc_grads, outputs = average_gradients(model.loss_and_grads, halves)
    assert outputs == [None, None]
    assert acc_loss == pytest.approx(loss, rel=1e-12)
    for name, g in grads.items():
        numpy.testing.assert_allclose(acc_grads[name], g, rtol=1e-9, atol=1e-13, err_msg=name)


@pytest.mark.parametrize("mode", ["bert", "torch"])
def test_adamw_follows_nanobert_threads_and_any_count_gives_the_same_bits(monkeypatch, mode):
    """AdamW shares its chunks over $NANOBERT_THREADS threads of threads.py's pool (its own
    pool once ignored the variable); the chunks are disjoint, so 1 and 3 threads update every
    parameter and moment to the same bits."""
    config = BertConfig(vocab_size=4000, hidden_size=64, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=128, max_position_embeddings=64)
    results = []
    for threads in ("1", "3"):
        monkeypatch.setenv("NANOBERT_THREADS", threads)
        model = BertForPreTraining(config, seed=0)
        optimizer = AdamW(model.params, mode=mode)
        assert optimizer.threads == int(threads) and len(optimizer.scratch) == int(threads)
        grads = model.layout.views(model.layout.zeros(numpy, numpy.float32), order=model.params)
        flat = next(iter(grads.values())).base
        assert flat.size > 4 * 65536                       # several chunks per thread
        rng = numpy.random.default_rng(0)
        for _ in range(2):
            flat[...] = rng.standard_normal(flat.size)
            optimizer.step(grads, lr=1e-3)
        results.append((optimizer.buffer.copy(), optimizer.flat_m.copy(), optimizer.flat_v.copy()))
    for one, three, name in zip(*results, ("params", "m", "v")):
        numpy.testing.assert_array_equal(one, three, err_msg=name)


FORKED = {}                     # what a forked child finds in its copy of this module


def step_in_forked_child():
    optimizer, grads = FORKED["optimizer"], FORKED["grads"]
    optimizer.step(grads, lr=1e-3)
    return optimizer.buffer.copy()


def test_a_forked_child_steps_on_a_thread_pool_of_its_own(monkeypatch):
    """The chunked sweep runs on threads.py's pool; a fork copies the pool object but not its
    threads, so the child must make its own pool instead of queueing work that nothing runs
    (it hung). The child's step equals the parent's same step."""
    import multiprocessing
    monkeypatch.setenv("NANOBERT_THREADS", "2")
    config = BertConfig(vocab_size=4000, hidden_size=64, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=128, max_position_embeddings=64)
    model = BertForPreTraining(config, seed=0)
    optimizer = AdamW(model.params, mode="torch")
    assert optimizer.threads == 2 and optimizer.buffer.size > 4 * 65536   # several chunks each
    grads = model.layout.views(model.layout.zeros(numpy, numpy.float32), order=model.params)
    flat = next(iter(grads.values())).base
    flat[...] = numpy.random.default_rng(0).standard_normal(flat.size)
    optimizer.step(grads, lr=1e-3)                         # makes the parent's pool
    FORKED.update(optimizer=optimizer, grads=grads)
    with multiprocessing.get_context("fork").Pool(1) as pool:
        child = pool.apply_async(step_in_forked_child).get(timeout=60)
    optimizer.step(grads, lr=1e-3)
    numpy.testing.assert_array_equal(child, optimizer.buffer)

# --------------------------------------- the update folded into the AdamW kernel (GPU path)


def test_the_loss_scale_must_be_a_power_of_two():
    """The fold's exactness rests on it: a scale, a factor or a loaded scale that is not
    2^k is refused, naming it."""
    for kwargs, what in (({"init_scale": 1000.0}, "init_scale"),
                         ({"backoff_factor": 0.3}, "backoff_factor"),
                         ({"growth_factor": 3.0}, "growth_factor")):
        with pytest.raises(ValueError, match=f"LossScaler's {what} must be a power of two"):
            LossScaler(numpy, **kwargs)
    scaler = LossScaler(numpy, init_scale=2.0 ** -3)
    with pytest.raises(ValueError, match=r"the loss scale loaded must be .* got 65535\.0"):
        scaler.load_state_dict({"loss_scale": 65535.0, "clean_steps": 0})
    scaler.load_state_dict({"loss_scale": 2.0 ** 20, "clean_steps": 3})
    assert scaler.state_dict() == {"loss_scale": 2.0 ** 20, "clean_steps": 3}

@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), k=st.integers(0, 39),
       clip=st.floats(2.0 ** -20, 1.0, width=32))
def test_a_power_of_two_unscale_commutes_with_the_clip_and_the_norm_bitwise(seed, k, clip):
    """What clip_and_step's fold rests on, in float32: for the gradients a float16 backward
    writes at the loss scale S = 2^k (float16 values: 0 or at least 2^-24 in magnitude),
    g * ((1/S) * clip) is (g/S) * clip and sqrt(vdot(g, g)) / S is the norm of g/S, bit for
    bit. k <= 39 keeps every unscaled square >= 2^-126 (normal): the claim's bound."""
    rng = numpy.random.default_rng(seed)
    g = (rng.standard_normal(4096) * 10.0 ** rng.uniform(-8, 4, 4096)).astype(numpy.float16)
    g = g.astype(numpy.float32)
    inverse, clip = numpy.float32(2.0 ** -k), numpy.float32(clip)
    numpy.testing.assert_array_equal(g * (inverse * clip), (g * inverse) * clip)
    unscaled = g * inverse
    assert numpy.sqrt(numpy.vdot(g, g)) * inverse == numpy.sqrt(numpy.vdot(unscaled, unscaled))


def test_below_the_normal_range_the_fold_rounds_differently():
    """The claim's caveat is real: where g/S is subnormal, (g/S) * clip rounds twice and
    g * ((1/S) * clip) once (a float16 backward's gradients, 0 or >= 2^-24, get there only
    for S > 2^102; their unscaled squares for S > 2^39)."""
    g = numpy.random.default_rng(0).standard_normal(10000).astype(numpy.float32) * 2.0 ** -100
    inverse, clip = numpy.float32(2.0 ** -30), numpy.float32(0.7)
    assert ((g * (inverse * clip)) != ((g * inverse) * clip)).sum() > 1000


@pytest.fixture
def cupy():
    import cupy_standin
    with cupy_standin.installed() as module:
        module.counts.reset()
        yield module


FOLD_SHAPES = {"encoder.dense.weight": (37, 29), "encoder.dense.bias": (29,),
               "encoder.LayerNorm.weight": (29,), "cls.decoder.weight": (41, 13)}
# (unscaled gradient norm before clipping, an inf in the gradients): clipping active,
# an overflow, inactive, active
FOLD_STEPS = [(3.0, False), (3.0, True), (0.25, False), (40.0, False)]


def unscale_clip_step(optimizer, grads, lr, scaler, max_norm, mode):
    """The sequence the fold replaces, as written before it (four passes on the GPU)."""
    if scaler:
        scaler.unscale(grads)
    norm = clip_by_global_norm(grads, max_norm, mode=mode)
    optimizer.step(grads, lr=lr, skip=scaler.update(norm) if scaler else None)
    return norm


def folded_run(xp, update, mode, loss_scaled, device_lr, seed=0):
    """FOLD_STEPS steps of `update` on a flat parameter buffer of FOLD_SHAPES (decayed and
    not) -> per step (norm, params, m, v, loss scale, clean steps, the gradient buffer
    before and after the update), host arrays. loss_scaled: the gradients are what a
    float16 backward at the scaler's scale writes (float16 values, stored as float32), and
    the scaler grows every 2 clean steps; else float32 gradients, no scaler."""
    from nanobert.model.flat import FlatLayout
    layout = FlatLayout(FOLD_SHAPES)
    rng = numpy.random.default_rng(seed)
    params = layout.views(xp.asarray(rng.standard_normal(layout.size).astype(numpy.float32)))
    optimizer = AdamW(params, mode=mode, weight_decay=0.01)
    scaler = LossScaler(xp, init_scale=2.0 ** 12, growth_interval=2) if loss_scaled else None
    results = []
    for step, (norm, overflow) in enumerate(FOLD_STEPS):
        g = rng.standard_normal(layout.size)
        g *= norm / numpy.sqrt(numpy.vdot(g, g))
        if scaler:
            g = (g * float(scaler.scale)).astype(numpy.float16).astype(numpy.float32)
        g = g.astype(numpy.float32)
        if overflow:
            g[layout.offsets["encoder.dense.bias"] + 3] = numpy.inf
        grads = layout.views(xp.asarray(g))
        lr = 1e-2 * (step + 1)
        lr = xp.asarray(numpy.float64(lr)) if device_lr else lr
        norm = update(optimizer, grads, lr, scaler, 1.0, mode)
        state = [float(norm), optimizer.buffer.get(), optimizer.flat_m.get(),
                 optimizer.flat_v.get()]
        state += [float(scaler.scale), int(scaler.clean_steps)] if scaler else [None, None]
        results.append(state + [g, next(iter(grads.values())).base.get()])
    return results


@pytest.mark.parametrize("mode", ["bert", "torch"])
@pytest.mark.parametrize("loss_scaled", [False, True], ids=["float32", "float16-loss-scaled"])
def test_folded_update_equals_unscale_clip_then_adamw_bitwise(cupy, mode, loss_scaled):
    """clip_and_step on the GPU path (the stand-in) folds the unscale and the clip into the
    AdamW kernel: the norm, weights, both moments, the loss scale and its clean-step count
    equal those of unscale -> clip -> loss scaler -> AdamW bit for bit, over a step that
    clips, one that overflows (float16: skipped, the scale halved; float32: the weights go
    NaN in both), one that does not clip, and one that clips hard; the gradient buffer is
    left as the backward wrote it."""
    from nanobert.model.optim import clip_and_step
    for device_lr in (False, True):
        old = folded_run(cupy, unscale_clip_step, mode, loss_scaled, device_lr)
        new = folded_run(cupy, clip_and_step, mode, loss_scaled, device_lr)
        names = ("norm", "params", "m", "v", "loss scale", "clean steps")
        for step, (o, n) in enumerate(zip(old, new)):
            for name, a, b in zip(names, o, n):
                numpy.testing.assert_array_equal(
                    a, b, err_msg=f"{name} at step {step} ({mode}, lr on device: {device_lr})")
            # the fold leaves the gradients as given; the sequence rewrote them (unscaled
            # or clipped; float32's unclipped step multiplied them by 1)
            numpy.testing.assert_array_equal(n[7], n[6], err_msg=f"gradients at step {step}")
            assert (o[7] != o[6]).any() or (step == 2 and not loss_scaled), step
        norms = [o[0] for o in old]
        assert norms[0] > 1.0 and norms[2] < 1.0 and norms[3] > 1.0   # clip on, off, on
        assert not numpy.isfinite(norms[1])                           # the overflow
        if loss_scaled:
            assert [o[4] for o in old] == [2.0 ** 12, 2.0 ** 11, 2.0 ** 11, 2.0 ** 12]   # grew
            assert [o[5] for o in old] == [1, 0, 1, 0]
            numpy.testing.assert_array_equal(old[1][1], old[0][1])    # skipped: unchanged
            assert numpy.isfinite(old[3][1]).all()
        else:
            assert numpy.isnan(old[3][1]).any()              # no scaler: the overflow spreads


def test_lr_scales_are_refused_on_the_gpu(cupy):
    """The fused kernel updates every element at one rate: scales other than 1 are refused
    in one line when the optimizer is made, not silently ignored; all-1 scales are fine."""
    params = {n: cupy.asarray(numpy.ones(s, numpy.float32)) for n, s in FOLD_SHAPES.items()}
    with pytest.raises(ValueError, match=r"lr_scale \(layer-wise rate decay\) runs on the CPU"):
        AdamW(params, lr_scale={"encoder.dense.weight": 0.5})
    assert AdamW(params, lr_scale={"encoder.dense.weight": 1.0}).lr_scale["cls.decoder.weight"] == 1


def test_folded_update_halves_the_passes_over_the_gradients(cupy):
    """The stand-in's kernels of one update, unscale -> clip -> AdamW against clip_and_step.
    Kernels with an operand the size of the flat gradient buffer: float16 (loss scaler)
    5 -> 3 (the unscale's multiply, vdot's multiply and CUB sum, the clip's multiply, AdamW
    -> vdot's two, AdamW), float32 4 -> 3. All launches: float32 9 -> 8, float16 25 -> 25
    (two 0-d multiplies come in: the norm times 1/S, 1/S times the clip factor)."""
    from nanobert.model.flat import FlatLayout
    from nanobert.model.optim import clip_and_step
    size = FlatLayout(FOLD_SHAPES).size
    counted = {}
    for update in (unscale_clip_step, clip_and_step):
        for loss_scaled in (False, True):
            def counting(*args, update=update, key=(update.__name__, loss_scaled)):
                cupy.counts.reset()
                norm = update(*args)
                counted.setdefault(key, []).append(
                    (cupy.counts.passes_over(size), cupy.counts.launches, cupy.counts.syncs))
                return norm
            folded_run(cupy, counting, "bert", loss_scaled, device_lr=True)
    print("(passes over the gradients, launches, syncs) of one update:",
          {key: value[0] for key, value in counted.items()})
    for loss_scaled, passes, launches in ((False, (4, 3), (9, 8)), (True, (5, 3), (25, 25))):
        old, new = counted["unscale_clip_step", loss_scaled], counted["clip_and_step", loss_scaled]
        assert {(o[0], n[0]) for o, n in zip(old, new)} == {passes}, (old, new)
        assert {(o[1], n[1]) for o, n in zip(old, new)} == {launches}, (old, new)
        assert {o[2] for o in old + new} == {0}             # nothing read back


# ------------------------------------------------------------------- layer-wise rate decay

def test_layer_decay_scales_the_rate_by_depth_from_the_top():
    """The head and pooler at the full rate, the top layer at D, each layer below at D times
    the one above, the embeddings at D^(L+1); with or without the `bert.` prefix."""
    names = ["bert.embeddings.word_embeddings.weight", "embeddings.LayerNorm.bias",
             "bert.encoder.layer.0.attention.self.query.weight",
             "encoder.layer.1.output.dense.bias", "bert.encoder.layer.2.output.LayerNorm.weight",
             "bert.pooler.dense.weight", "classifier.weight", "cls.predictions.bias"]
    scales = layer_decay_scales(names, num_layers=3, decay=0.5)
    assert [scales[n] for n in names] == [0.0625, 0.0625, 0.125, 0.25, 0.5, 1.0, 1.0, 1.0]
    assert set(layer_decay_scales(names, 3, 1.0).values()) == {1.0}


def scaled_and_plain_steps(mode, flat, scale, steps=3):
    """Two copies of a model's params, one stepped with lr_scale (the embeddings at `scale`),
    one with a second optimizer at lr * scale: -> (params scaled, params of the full-rate
    optimizer, params of the lr * scale optimizer). flat: the model's flat buffer, else a
    dict of separate arrays (AdamW's tensor-by-tensor path)."""
    config = BertConfig(vocab_size=300, hidden_size=16, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=32, max_position_embeddings=16)
    runs = []
    for embeddings_scale, lr in ((scale, 1e-2), (None, 1e-2), (None, 1e-2 * scale)):
        model = BertForPreTraining(config, seed=0, dtype=numpy.float64)
        params = model.params if flat else {n: p.copy() for n, p in model.params.items()}
        lr_scale = embeddings_scale and {n: scale for n in params if "embeddings" in n}
        optimizer = AdamW(params, lr=lr, mode=mode, weight_decay=0.01, lr_scale=lr_scale)
        rng = numpy.random.default_rng(1)
        for _ in range(steps):
            grads = (model.layout.views(model.layout.zeros(numpy, numpy.float64),
                                        order=model.params) if flat       # the flat sweep
                     else {n: numpy.empty(p.shape) for n, p in params.items()})
            for g in grads.values():
                g[...] = rng.standard_normal(g.shape)
            optimizer.step(grads)
        runs.append(params)
    return runs


@pytest.mark.parametrize("mode", ["bert", "torch"])
@pytest.mark.parametrize("flat", [True, False])
@given(scale=st.sampled_from([0.8, 0.512, 0.1, 1e-3]))
@settings(max_examples=4, deadline=None)
def test_a_scaled_parameter_steps_as_a_run_at_the_scaled_rate_bitwise(mode, flat, scale):
    """lr_scale is exactly a rate: the embeddings of the scaled run equal (bitwise, float64,
    three steps with weight decay) those of a run at lr * scale, every other parameter those
    of the run at lr."""
    scaled, full, low = scaled_and_plain_steps(mode, flat, scale)
    for name in scaled:
        expected = low if "embeddings" in name else full
        numpy.testing.assert_array_equal(scaled[name], expected[name], err_msg=name)
    assert any(not numpy.array_equal(full[n], low[n]) for n in scaled if "embeddings" in n)


def test_make_optimizer_gives_finetunes_layer_decay_to_adamw():
    """finetune.py's --layer-decay reaches AdamW as layer_decay_scales of the model's names;
    absent (train.py) or not given, every scale is 1."""
    from argparse import Namespace
    from nanobert.training.run import make_optimizer
    config = BertConfig(vocab_size=300, hidden_size=16, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=32, max_position_embeddings=16)
    model = BertForPreTraining(config, seed=0)
    args = dict(lr=1e-3, optimizer="bert", weight_decay=0.01, dtype="float32")
    decayed, _ = make_optimizer(Namespace(**args, layer_decay=0.8), model)
    assert decayed.lr_scale == pytest.approx(layer_decay_scales(model.params, 2, 0.8))
    assert decayed.lr_scale["bert.embeddings.word_embeddings.weight"] == pytest.approx(0.512)
    for namespace in (Namespace(**args), Namespace(**args, layer_decay=None)):
        plain, _ = make_optimizer(namespace, model)
        assert set(plain.lr_scale.values()) == {1.0}
