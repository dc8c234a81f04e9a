"""nanobert.testing catches what it exists to catch: a wrong backward fails with the input's
name and its error, a right one passes, float32 is refused, zero gradients are handled, and
the model form catches a corrupted gradient."""
import math

import numpy
import pytest
from hypothesis import given, settings

from nanobert import BertForPreTraining, BertForSequenceClassification
from nanobert.model import ops
from nanobert.testing import (TASKS, bert_cases, check_gradients, check_model_gradients,
                              make_batch, numerical_grad, rel_error, tiny_bert_config)

rng = numpy.random.default_rng(0)
X = {"x": rng.standard_normal((3, 5))}
LAYERNORM = {"x": rng.standard_normal((3, 5)), "gamma": 1 + 0.3 * rng.standard_normal(5),
             "beta": rng.standard_normal(5)}


def layernorm(x, gamma, beta):
    return ops.layernorm_forward(x, gamma, beta, 1e-12)


def test_a_right_backward_passes_with_errors_per_input():
    errors = check_gradients(layernorm, ops.layernorm_backward, LAYERNORM)
    assert set(errors) == {"x", "gamma", "beta"} and max(errors.values()) < 1e-8, errors


def test_a_gelu_backward_off_by_a_factor_fails_naming_the_input():
    def wrong(dout, cache):
        return 1.01 * ops.gelu_backward(dout, cache)
    with pytest.raises(AssertionError, match=r"gelu: x: relative error [0-9.e-]+ > 1e-07"):
        check_gradients(lambda x: ops.gelu_forward(x, "gelu"), wrong, X, name="gelu")


def test_a_layernorm_backward_missing_a_term_fails_naming_only_that_input():
    def without_projection(dout, cache):            # forgets d rstd: only the mean removed
        xhat, gamma, rstd = cache
        dxhat = dout * gamma
        dx = (dxhat - dxhat.mean(-1, keepdims=True)) * rstd
        return dx, (dout * xhat).sum((0,)), dout.sum(0)
    with pytest.raises(AssertionError) as failure:
        check_gradients(layernorm, without_projection, LAYERNORM, name="layernorm")
    message = str(failure.value)
    assert message.startswith("layernorm: x: relative error"), message
    assert "gamma" not in message and "beta" not in message, message


def test_a_gradient_of_the_wrong_shape_or_count_is_named():
    with pytest.raises(AssertionError, match=r"dgamma: gradient shape \(1, 5\) != input \(5,\)"):
        check_gradients(layernorm, lambda d, c: (lambda g: (g[0], g[1][None], g[2]))(
            ops.layernorm_backward(d, c)), LAYERNORM, name="layernorm")
    with pytest.raises(AssertionError, match="returned 2 gradients for 3 inputs"):
        check_gradients(layernorm, lambda d, c: ops.layernorm_backward(d, c)[:2], LAYERNORM)


def test_float32_and_non_arrays_are_refused():
    with pytest.raises(ValueError, match="input 'x' must be a float64 NumPy array, got ndarray "
                                         "of dtype float32"):
        check_gradients(ops.tanh_forward, ops.tanh_backward, {"x": X["x"].astype("float32")})
    with pytest.raises(ValueError, match="input 'x' must be a float64 NumPy array, got list"):
        check_gradients(ops.tanh_forward, ops.tanh_backward, {"x": [1.0, 2.0]})


def test_the_inputs_are_not_modified():
    x = X["x"].copy()
    check_gradients(ops.tanh_forward, ops.tanh_backward, {"x": x})
    numpy.testing.assert_array_equal(x, X["x"])


def test_an_exactly_zero_gradient_passes_and_a_wrong_one_beside_it_fails():
    """y = x * 0 + b: dx is exactly 0, numerically 0 too; measured against the floor of 1.
    A backward that says dx = 1e-3 is caught (absolute error 1e-3 against a floor of 1)."""
    def forward(x, b):
        return x * 0.0 + b, x.shape

    def backward(dout, shape):
        return numpy.zeros(shape), dout.sum(0)
    inputs = {"x": rng.standard_normal((2, 3)), "b": rng.standard_normal(3)}
    errors = check_gradients(forward, backward, inputs)
    assert errors["x"] == 0.0 and errors["b"] < 1e-9, errors
    with pytest.raises(AssertionError, match="x: relative error 1.000e-03"):
        check_gradients(forward, lambda d, s: (numpy.full(s, 1e-3), d.sum(0)), inputs)


def test_a_flat_function_without_a_floor_is_refused_or_skipped():
    labels = numpy.full(4, ops.IGNORE_INDEX)         # every row ignored: loss 0, flat
    inputs = {"logits": rng.standard_normal((4, 3))}

    def forward(logits):
        return ops.cross_entropy_forward(logits, labels)
    with pytest.raises(ValueError, match=r"is flat here: its largest gradient is 0.0e\+00"):
        check_gradients(forward, ops.cross_entropy_backward, inputs, floor=0.0)
    assert check_gradients(forward, ops.cross_entropy_backward, inputs, floor=0.0,
                           if_flat="skip") == {}
    # with the op default (floor 1), flat is simply "no gradient", and passes
    assert check_gradients(forward, ops.cross_entropy_backward, inputs) == {"logits": 0.0}


def test_numerical_grad_is_exact_on_a_cubic_with_five_points():
    x = numpy.array([0.3, -1.2, 2.0])
    f = lambda: float((x ** 3).sum())  # noqa: E731
    three = numerical_grad(f, x, h=1e-3)
    five = numerical_grad(f, x, h=1e-3, five_point=True)
    assert rel_error(five, 3 * x ** 2) < 1e-9 < rel_error(three, 3 * x ** 2) < 1e-5
    assert math.isclose(numerical_grad(f, x, index=[1])[0], 3 * 1.44, rel_tol=1e-8)
    with pytest.raises(ValueError, match="contiguous"):
        numerical_grad(f, numpy.ones((4, 4))[:, :3])


def model_and_batch(cls, task, seed=3):
    config = tiny_bert_config(heads=2, head_size=2, layers=1, dropout=0.1)
    model = cls(config, seed=seed, dtype=numpy.float64).train()
    for p in model.params.values():
        p += 0.1 * numpy.random.default_rng(seed).standard_normal(p.shape)
    return model, make_batch(numpy.random.default_rng(seed), config, task, 2, 4)


def test_the_model_form_passes_and_catches_a_corrupted_gradient():
    model, batch = model_and_batch(BertForPreTraining, "pretraining")
    errors = check_model_gradients(model, batch)
    assert set(errors) == set(model.params) and max(errors.values()) < 1e-7, errors
    name = "bert.encoder.layer.0.intermediate.dense.weight"
    right = model.loss_and_grads

    def corrupted(batch):
        loss, grads = right(batch)
        grads[name] *= 1.001
        return loss, grads
    model.loss_and_grads = corrupted
    with pytest.raises(AssertionError, match=f"BertForPreTraining loss: {name}: relative error"):
        check_model_gradients(model, batch)


def test_the_model_form_refuses_float32_and_skips_a_flat_loss_only_when_told():
    model, batch = model_and_batch(BertForSequenceClassification, "sequence_classification")
    batch["labels"][:] = ops.IGNORE_INDEX            # nothing counted: a flat loss
    with pytest.raises(ValueError, match="is flat here"):
        check_model_gradients(model, batch)
    assert check_model_gradients(model, batch, if_flat="skip") == {}
    config = tiny_bert_config()
    with pytest.raises(ValueError, match="needs a float64 model"):
        check_model_gradients(BertForSequenceClassification(config), batch)


@settings(max_examples=20, deadline=None)
@given(case=bert_cases("pretraining", dropout=[0.0, 0.1]))
def test_the_strategies_draw_valid_configs_and_batches(case):
    config, batch = case
    assert config.hidden_size >= 3 and config.vocab_size == 7
    B, T = batch["input_ids"].shape
    assert 1 <= B <= 3 and 1 <= T <= 5 and batch["attention_mask"][:, 0].all()
    assert batch["labels"][0, 0] != -100 and batch["labels"][-1, -1] != -100
    BertForPreTraining(config, dtype=numpy.float64).loss(batch)     # a batch the model takes


@pytest.mark.parametrize("task", TASKS)
def test_make_batch_gives_every_head_a_batch_it_takes(task):
    from nanobert.model import heads
    classes = {"pretraining": BertForPreTraining, "multiple_choice": heads.BertForMultipleChoice,
               "question_answering": heads.BertForQuestionAnswering,
               "token_classification": heads.BertForTokenClassification}
    config = tiny_bert_config(num_labels={"regression": 1, "question_answering": 2}.get(task, 3))
    batch = make_batch(numpy.random.default_rng(0), config, task, 3, 4, num_choices=3)
    model = classes.get(task, BertForSequenceClassification)(config, dtype=numpy.float64)
    assert numpy.isfinite(model.loss(batch))
