"""The learning-rate schedule, clipping, AdamW's two modes on hand-computed steps, and
gradient accumulation."""
import math

import numpy
import pytest
from hypothesis import given, settings, strategies as st

from nanobert import AdamW, BertConfig, BertForPreTraining, clip_by_global_norm, learning_rate
from nanobert.model.optim import average_gradients, global_norm
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
