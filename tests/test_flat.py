"""Flat buffers (nanobert/model/flat.py): parameters and gradients are views of one contiguous
array each, and what sweeps the flat buffers (global norm, clipping, AdamW, accumulation,
the forward-only loss) equals the tensor-by-tensor path on plain dicts to rounding (float64).
"""
import numpy
import pytest

from nanobert import AdamW, BertConfig, BertForPreTraining, clip_by_global_norm
from nanobert.model import ops
from nanobert.model.flat import flat_buffer, flat_offsets
from nanobert.model.optim import average_gradients, global_norm
from test_checkpoint import CONFIG, tiny_batch

TOL = 1e-13


def plain(tensors):
    """The same tensors as separate arrays: what the per-tensor paths see."""
    return {name: numpy.array(t) for name, t in tensors.items()}


def max_error(a, b):
    return max(float(numpy.abs(a[name] - b[name]).max()) for name in a)


@pytest.fixture
def model():
    return BertForPreTraining(BertConfig(**CONFIG), seed=0, dtype=numpy.float64)


def test_params_and_grads_are_views_of_one_contiguous_buffer_laid_out_alike(model):
    params, offsets = flat_offsets(model.params)
    assert params is not None and params.size == model.num_parameters()
    _, grads = model.loss_and_grads(tiny_batch())
    grad_buffer, grad_offsets = flat_offsets(grads)
    assert grad_buffer is not None and grad_offsets == offsets
    assert list(grads) == list(model.params)                 # HF names, the params' order
    for layer in range(CONFIG["num_hidden_layers"]):         # q, k, v adjacent: one matmul
        q, k, v = (offsets[f"bert.encoder.layer.{layer}.attention.self.{p}.weight"]
                   for p in ("query", "key", "value"))
        assert k - q == v - k == CONFIG["hidden_size"] ** 2
    _, again = model.eval().loss_and_grads(tiny_batch())
    _, grads = model.loss_and_grads(tiny_batch())
    grad_buffer = flat_buffer(grads)
    assert not numpy.shares_memory(flat_buffer(again), grad_buffer), "grads stay the caller's"
    numpy.testing.assert_array_equal(flat_buffer(again), grad_buffer)


def test_a_plain_dict_is_not_flat():
    assert flat_buffer({"a": numpy.zeros(3), "b": numpy.zeros(2)}) is None
    buffer = numpy.zeros(5)
    assert flat_buffer({"a": buffer[:3]}) is None                        # a gap at the end
    assert flat_buffer({"b": buffer[3:], "a": buffer[:3].reshape(3, 1)}) is buffer


def test_global_norm_and_clipping_of_the_flat_buffer_equal_the_per_tensor_ones(model):
    _, grads = model.loss_and_grads(tiny_batch())
    separate = plain(grads)
    expected = numpy.sqrt(sum(float((g * g).sum()) for g in separate.values()))
    assert global_norm(grads) == pytest.approx(expected, rel=TOL)
    for mode in ("bert", "torch"):
        norm = clip_by_global_norm(grads, 0.01, mode)
        assert norm == pytest.approx(clip_by_global_norm(separate, 0.01, mode), rel=TOL)
        err = max_error(grads, separate)
        assert err <= TOL, f"{mode}: clipped flat vs per tensor differ by {err:.2e}"


@pytest.mark.parametrize("mode", ["bert", "torch"])
def test_adamw_on_the_flat_buffer_equals_adamw_tensor_by_tensor(model, mode):
    separate = plain(model.params)
    flat_optimizer = AdamW(model.params, lr=1e-2, mode=mode, weight_decay=0.1)
    plain_optimizer = AdamW(separate, lr=1e-2, mode=mode, weight_decay=0.1)
    assert flat_optimizer.buffer is not None and plain_optimizer.buffer is None
    for seed in range(3):
        _, grads = model.loss_and_grads(tiny_batch(seed))
        plain_grads = plain(grads)
        flat_optimizer.step(grads)
        plain_optimizer.step(plain_grads)
    err = max_error(model.params, separate)
    assert err <= TOL, f"{mode}: parameters after 3 steps differ by {err:.2e}"
    state, expected = flat_optimizer.state_dict(), plain_optimizer.state_dict()
    assert set(state) == set(expected)
    assert max(float(numpy.abs(state[k] - expected[k]).max()) for k in state) <= TOL
    # loading a state keeps the moments views of the flat buffers
    flat_optimizer.load_state_dict(expected)
    assert flat_buffer(flat_optimizer.m) is flat_optimizer.flat_m
    numpy.testing.assert_array_equal(flat_optimizer.v[next(iter(separate))],
                                     expected["v/" + next(iter(separate))])


def test_accumulation_of_flat_grads_equals_accumulation_tensor_by_tensor(model):
    batches = [tiny_batch(seed) for seed in range(3)]
    weights = [0.5, 0.3, 0.2]
    model.eval()                                             # the same forward both times
    loss, grads, _ = average_gradients(model.loss_and_grads, batches, weights)
    assert flat_buffer(grads) is not None

    def separate_loss_and_grads(batch):
        loss, grads = model.loss_and_grads(batch)
        return loss, plain(grads)
    plain_loss, plain_grads, _ = average_gradients(separate_loss_and_grads, batches, weights)
    assert loss == pytest.approx(plain_loss, rel=TOL)
    assert max_error(grads, plain_grads) <= TOL


def test_forward_only_loss_returns_the_outputs_of_loss_and_grads(model):
    """loss() in eval mode runs the forward with cache=False, whose attention skips a padded row's
    padded keys: the same numbers up to the reordered roundings (tests/test_inference.py
    bounds them); the integer outputs (correct counts) are exact."""
    model.eval()
    loss, outputs = model.loss(tiny_batch(), return_outputs=True)
    expected_loss, _, expected = model.loss_and_grads(tiny_batch(), return_outputs=True)
    assert loss == pytest.approx(expected_loss, rel=1e-13) and model.loss(tiny_batch()) == loss
    assert set(outputs) == set(expected)
    for key, value in expected.items():
        if key == "hidden_states":
            for a, b in zip(outputs[key], value, strict=True):
                numpy.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
        elif isinstance(value, numpy.ndarray):
            numpy.testing.assert_allclose(outputs[key], value, rtol=1e-13, atol=1e-15,
                                          err_msg=key)
        elif isinstance(value, float):
            assert value == pytest.approx(outputs[key], rel=1e-13), key
        else:
            assert outputs[key] == value, key


def test_backward_writes_parameter_gradients_into_the_arrays_it_is_given():
    rng = numpy.random.default_rng(0)
    x, weight = rng.standard_normal((2, 3, 4)), rng.standard_normal((5, 4))
    _, cache = ops.linear_forward(x, weight, rng.standard_normal(5))
    dout = rng.standard_normal((2, 3, 5))
    dweight, dbias = numpy.empty((5, 4)), numpy.empty(5)
    _, returned_dweight, returned_dbias = ops.linear_backward(dout, cache, dweight, dbias)
    assert returned_dweight is dweight and returned_dbias is dbias
    _, fresh_dweight, fresh_dbias = ops.linear_backward(dout, cache)
    numpy.testing.assert_allclose(dweight, fresh_dweight, rtol=1e-14)
    numpy.testing.assert_allclose(dbias, fresh_dbias, rtol=1e-14)
