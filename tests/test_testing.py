"""nanobert.testing catches what it exists to catch: a wrong backward fails with the input's
name, its error and its worst entry told, at any scale of inputs (a doubled gradient near 1e-4
too); a right one passes, where the op saturates too; float32 is refused, zero gradients are
handled, the model form catches a corrupted gradient, and op_inputs draws what a learner's
property test needs."""
import math
import re

import numpy
import pytest
from hypothesis import find, given, settings
from hypothesis.errors import NoSuchExample

from nanobert import BertForPreTraining, BertForSequenceClassification
from nanobert.model import ops
from nanobert.testing import (TASKS, bert_cases, check_gradients, check_model_gradients,
                              make_batch, numerical_grad, op_inputs, rel_error, tiny_bert_config)

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
    with pytest.raises(AssertionError, match=r"gelu: x: error [0-9.e+-]+ > 1e-07 at x\["):
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
    assert message.startswith("layernorm: x: error"), message
    assert "gamma" not in message and "beta" not in message, message


def test_a_gradient_of_the_wrong_shape_or_count_is_named():
    with pytest.raises(AssertionError, match=r"dgamma: gradient shape \(1, 5\) != input \(5,\)"):
        check_gradients(layernorm, lambda d, c: (lambda g: (g[0], g[1][None], g[2]))(
            ops.layernorm_backward(d, c)), LAYERNORM, name="layernorm")
    with pytest.raises(AssertionError, match="returned 2 gradients for 3 inputs"):
        check_gradients(layernorm, lambda d, c: ops.layernorm_backward(d, c)[:2], LAYERNORM)


def rmsnorm_forward(x, gamma):
    rstd = 1 / numpy.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
    return x * rstd * gamma, (x, gamma, rstd)


def rmsnorm_backward(dout, cache):
    x, gamma, rstd = cache
    dxhat = dout * gamma
    dx = rstd * (dxhat - x * rstd**2 * (dxhat * x).mean(-1, keepdims=True))
    return dx, (dout * x * rstd).sum(0)


def doubled(backward):
    """backward with every gradient twice too large."""
    def wrong(dout, cache):
        return tuple(2 * g for g in backward(dout, cache))
    return wrong


def test_the_failure_tells_the_worst_entry_its_two_values_and_the_scale():
    """RMSNorm's dx 50% too large, gamma as small as BERT initialises weights (0.02): the
    message names the entry where the two gradients differ most, both values there (3 : 2),
    and the scale with what set it (the old message read "relative error 1.223e-02")."""
    inputs = {"x": numpy.random.default_rng(0).standard_normal((4, 8)),
              "gamma": 0.02 * numpy.random.default_rng(1).standard_normal(8)}

    def wrong(dout, cache):
        dx, dgamma = rmsnorm_backward(dout, cache)
        return 1.5 * dx, dgamma
    with pytest.raises(AssertionError) as failure:
        check_gradients(rmsnorm_forward, wrong, inputs, name="rmsnorm")
    told = re.fullmatch(r"rmsnorm: x: error (\S+) > 1e-07 at x\[(\d+), (\d+)\] = (\S+): "
                        r"analytic (\S+), numerical (\S+), difference (\S+) over a scale of "
                        r"(\S+) \(the floor\), h 1.0e-06", str(failure.value))
    assert told, failure.value
    error, i, j, value, analytic, numerical, difference, scale = told.groups()
    assert math.isclose(float(value), inputs["x"][int(i), int(j)], rel_tol=1e-6)   # the input
    w = numpy.random.default_rng(0).standard_normal((4, 8))       # the checker's W (seed 0)
    right = rmsnorm_backward(w, rmsnorm_forward(**inputs)[1])[0]
    assert (int(i), int(j)) == numpy.unravel_index(numpy.abs(right).argmax(), right.shape)
    assert math.isclose(float(analytic), 1.5 * right[int(i), int(j)], rel_tol=1e-6)
    assert math.isclose(float(numerical), right[int(i), int(j)], rel_tol=1e-6)
    assert math.isclose(float(error), float(difference) / float(scale), rel_tol=2e-2)

    def off_at_one_entry(dout, cache):                # the worst entry, not the largest
        dx, dgamma = rmsnorm_backward(dout, cache)
        dx[2, 5] += 1e-3
        return dx, dgamma
    with pytest.raises(AssertionError, match=r"rmsnorm: x: error \S+ > 1e-07 at x\[2, 5\]"):
        check_gradients(rmsnorm_forward, off_at_one_entry, inputs, name="rmsnorm")


def gate_forward(x, y, z):
    return x * y * z, (x, y, z)


def gate_backward(dout, cache):
    x, y, z = cache
    return dout * y * z, dout * x * z, dout * x * y


def test_a_doubled_gradient_with_inputs_near_1e_4_fails():
    """x * y * z with every input near 1e-4 has gradients near 1e-8, under the fixed floor of
    1 the checker had (it passed this doubled backward at 2.9e-8). The floor follows f's
    rounding now: the right backward passes far under tol, the doubled one fails at 0.5,
    relative to dx itself."""
    rng = numpy.random.default_rng(0)
    inputs = {name: 1e-4 * rng.standard_normal((4, 8)) for name in "xyz"}
    errors = check_gradients(gate_forward, gate_backward, inputs)
    assert max(errors.values()) < 1e-9, errors
    with pytest.raises(AssertionError, match=r"backward: x: error 5.00e-01 > 1e-07 at x\[1, 7\] = "
                                             r"\S+: "
                                             r"analytic -5.748601e-08, numerical -2.874301e-08, "
                                             r".* scale of 5.75e-08 \(the largest \|gradient\| "
                                             r"of x\), h 2.3e-10"):
        check_gradients(gate_forward, doubled(gate_backward), inputs)


def gelu_tanh_layer(x, weight, bias):
    return ops.linear_gelu_forward(x, weight, bias, "gelu_new")


@pytest.mark.parametrize("inputs", [
    # x w + b = -4.8: 1 + tanh(u) cancels to 4e-7, so f is rounded in steps of eps * |x|, far
    # above eps * |out|, and float32 loses the output: the floor falls back to 1
    {"x": [[2.0409191213851825]], "weight": [[-2.5556650313141818]],
     "bias": [0.41809884672577885]},
    # the same layer saturated, with a bias of 0.0018: the step scaled down to it is lost in
    # f's rounding; h itself is exact (f is linear in the bias before the GELU)
    {"x": [[0.18905338179353307], [-0.5227484414807474], [-0.41306354339189344]],
     "weight": [[-24.414673826398555]], "bias": [0.0017997073827209]}])
def test_a_saturated_gelu_layer_passes(inputs):
    inputs = {name: numpy.array(value) for name, value in inputs.items()}
    errors = check_gradients(gelu_tanh_layer, ops.linear_gelu_backward, inputs)
    assert max(errors.values()) < 1e-8, errors


def test_a_curvature_finer_than_the_step_is_resolved_by_five_points():
    """RMSNorm of one feature, x = 0.0026 beside rows near 1 and 2: its curvature scale is
    sqrt(eps) = 1e-3, so the central difference at h = 1e-6 is off by 1e-6 relative; the
    five-point stencil is not."""
    inputs = {"x": numpy.array([[0.09944849721188945], [0.00260956662447086],
                                [1.9967000506758745]]),
              "gamma": numpy.array([-1.0884627499707604])}
    errors = check_gradients(rmsnorm_forward, rmsnorm_backward, inputs)
    assert max(errors.values()) < 1e-9, errors


def test_float32_and_non_arrays_are_refused():
    with pytest.raises(ValueError, match="input 'x' must be a float64 NumPy array, got ndarray "
                                         "of dtype float32"):
        check_gradients(ops.tanh_forward, ops.tanh_backward, {"x": X["x"].astype("float32")})
    with pytest.raises(ValueError, match="input 'x' must be a float64 NumPy array, got list") as e:
        check_gradients(ops.tanh_forward, ops.tanh_backward, {"x": [1.0, 2.0]})
    assert "precision" not in str(e.value) and "numpy.array(" in str(e.value)   # the reason


def test_the_inputs_are_not_modified():
    x = X["x"].copy()
    check_gradients(ops.tanh_forward, ops.tanh_backward, {"x": x})
    numpy.testing.assert_array_equal(x, X["x"])


def test_an_exactly_zero_gradient_passes_and_a_wrong_one_beside_it_fails():
    """y = x * 0 + b: dx is exactly 0, numerically 0 too; measured against the floor (f's
    rounding over h, 0.77 here). A backward that says dx = 1e-3 is caught there."""
    def forward(x, b):
        return x * 0.0 + b, x.shape

    def backward(dout, shape):
        return numpy.zeros(shape), dout.sum(0)
    inputs = {"x": rng.standard_normal((2, 3)), "b": rng.standard_normal(3)}
    errors = check_gradients(forward, backward, inputs)
    assert errors["x"] == 0.0 and errors["b"] < 1e-9, errors
    with pytest.raises(AssertionError, match=r"x: error 1.31e-03 > 1e-07 at x\[0, 0\] = \S+: "
                                             r"analytic 1.000000e-03, numerical 0.000000e\+00, .* "
                                             r"a scale of 7.66e-01 \(the floor\)"):
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
    # with the op default (a floor from f's rounding, never below noise), flat is simply
    # "no gradient", and passes
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
    with pytest.raises(AssertionError, match=f"BertForPreTraining loss: {name}: error "
                                             r"[0-9.e+-]+ > 1e-07 at .*weight\[\d+, \d+\]"):
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
    config = tiny_bert_config(num_labels={"regression": 1, "question_answering": 2}.get(task, 3),
                              problem_type={"multi_label": "multi_label_classification"}.get(task))
    batch = make_batch(numpy.random.default_rng(0), config, task, 3, 4, num_choices=3)
    model = classes.get(task, BertForSequenceClassification)(config, dtype=numpy.float64)
    assert numpy.isfinite(model.loss(batch))


RMSNORM_SHAPES = {"x": ("rows", "features"), "gamma": ("features",)}
GATE_SHAPES = dict.fromkeys("xyz", ("rows", "features"))


def test_op_inputs_share_named_dimensions_and_draw_every_scale():
    strategy = op_inputs({**RMSNORM_SHAPES, "b": (2,)}, sizes=(1, 4))
    fixed = settings(database=None, max_examples=500)
    inputs = find(strategy, lambda d: d["x"].shape == (2, 3), settings=fixed)
    assert {k: v.dtype for k, v in inputs.items()} == dict.fromkeys(inputs, numpy.float64)
    assert inputs["gamma"].shape == (3,) and inputs["b"].shape == (2,)
    with pytest.raises(NoSuchExample):                 # sizes stay in (1, 4)
        find(strategy, lambda d: max(d["x"].shape) > 4, settings=fixed)
    tiny = find(strategy, lambda d: numpy.abs(d["x"]).max() < 1e-3, settings=fixed)
    large = find(strategy, lambda d: numpy.abs(d["x"]).max() > 3, settings=fixed)
    assert numpy.abs(tiny["x"]).max() < 1e-3 < 3 < numpy.abs(large["x"]).max()
    given_scale = find(op_inputs(RMSNORM_SHAPES, scale={"gamma": 1.0}),
                       lambda d: d["gamma"].size == 4, settings=fixed)["gamma"]
    assert 0.1 < numpy.abs(given_scale).max() < 5    # standard normal: the scale given, as is


@settings(max_examples=20, deadline=None)
@given(rmsnorm=op_inputs(RMSNORM_SHAPES), gate=op_inputs(GATE_SHAPES, scale=(1e-4, 1e-3)))
def test_a_right_op_passes_and_a_doubled_one_fails_at_every_scale(rmsnorm, gate):
    """RMSNorm drawn from 1e-4 to 10; x * y * z from 1e-4 to 1e-3, its gradients 1e-8 to
    1e-6, where a fixed floor of 1 passes a doubled backward."""
    for forward, backward, inputs in [(rmsnorm_forward, rmsnorm_backward, rmsnorm),
                                      (gate_forward, gate_backward, gate)]:
        check_gradients(forward, backward, inputs)
        with pytest.raises(AssertionError):
            check_gradients(forward, doubled(backward), inputs)
