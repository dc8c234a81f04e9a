"""Check a hand-written backward pass against central differences, and draw inputs, small
BERTs and batches to check it on. nanobert's own tests use exactly this; so can an op of yours
(docs/correctness.md, "Check the gradient of your own op", works one through).

    from hypothesis import given
    from nanobert.testing import check_gradients, op_inputs

    def rmsnorm_forward(x, gamma):                  # your op, in the ops' contract:
        rstd = 1 / numpy.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
        return x * rstd * gamma, (x, gamma, rstd)   # forward(**inputs) -> (out, cache)

    def rmsnorm_backward(dout, cache):              # backward(dout, cache) -> one gradient
        ...                                         # per input, in the order of `inputs`

    @given(op_inputs({"x": ("rows", "features"), "gamma": ("features",)}))
    def test_rmsnorm(inputs):
        check_gradients(rmsnorm_forward, rmsnorm_backward, inputs)

What is compared. f(inputs) = sum(forward(**inputs)[0] * W) for a fixed random W shaped like
the output (a random projection: every output element weighs in, none cancels another by
accident). backward(W, cache) is then the analytic gradient of f; the numerical one is a
central difference in float64, (f(x + h) - f(x - h)) / 2h per entry (error O(h^2)), or the
five-point stencil (8[f(x+h) - f(x-h)] - [f(x+2h) - f(x-2h)]) / 12h (error O(h^4)) for
functions curved enough that the first leaves truncation error above the tolerance. An op
check takes its step as h times the input's largest magnitude when that is below 1 (h = 1e-6
would move inputs near 1e-4 by 1%); an input that does not plainly agree there is tried at
h itself and with the five-point stencil too, and the closest counts (_differences says when
each is right). A wrong backward disagrees with every one, and is told at the first.

The scale, one rule for both forms. A central difference is only as precise as the rounding
of f allows: about (f's rounding error) / h in absolute terms, however small the true
gradient is. So the error of an input is measured relative to

    scale = max(largest |analytic gradient| of that input,   # relative where it is large
                floor,                                       # an absolute floor
                relative_floor * largest |gradient| of all inputs)

    error = max |analytic - numerical| / scale    (over the entries checked)

An op check (check_gradients) uses floor="rounding": the gradient at which f's rounding,
over h and times ROUNDING_MARGIN, would reach tol. f's rounding is measured, by running the
forward in float32 too (_rounding), so the floor follows the inputs down: with inputs near
1e-4, a gradient of 1e-8 is still compared relatively, and a backward twice too large fails
(a fixed floor of 1, as this checker had, passed it at 3e-8). Where float32 cannot measure
it (a saturated GELU, a dropout mask float32 draws anew) the floor is 1 as before: inputs
O(1), the error absolute (to 1e-7) where gradients are tiny.

A model check (check_model_gradients) uses relative_floor = 1e-2: the loss's gradients span
decades, and some are exactly zero in exact arithmetic (a key bias: softmax ignores a shift
shared by every key), so both sides hold rounding noise there and are compared against 1% of
the largest gradient instead. When even that scale is rounding noise (every gradient below
`noise`: a flat function, e.g. every label ignored, or two multiple-choice inputs that pool
alike), nothing can be compared: `if_flat="raise"` (default) raises a ValueError,
`if_flat="skip"` returns an empty dict (a hypothesis test then `assume`s it).

Both forms return {input name: error} and raise AssertionError naming each input over the
tolerance with its worst entry: its index, the input's value there, the analytic and numerical
values there, the scale and what set it, and the step. Inputs must be float64: a float32 check
measures float32 rounding (~1e-7 relative, divided by h), not the backward.

The strategies (op_inputs, bert_configs, batches) need hypothesis (`pip install hypothesis`);
the checker itself needs only NumPy.
"""
from typing import NamedTuple

import numpy

DEFAULT_TOL = 1e-7      # central differences with h = 1e-6 in float64 agree to ~1e-9
NOISE = 1e-12           # gradients below this are rounding noise of a float64 loss
EPSILON = float(numpy.finfo(numpy.float64).eps)
EPSILON32 = float(numpy.finfo(numpy.float32).eps)
ROUNDING_MARGIN = 100   # the difference over rounding / h, where that sets the scale: 8.4 seen
KEPT_BY_FLOAT32 = 1e-4  # float32 keeps an output it gets within this of float64 (relative)
TASKS = ("pretraining", "sequence_classification", "regression", "multi_label",
         "token_classification", "question_answering", "multiple_choice")


def rel_error(actual, expected):
    """max |actual - expected| / max |expected|: one number per tensor, scale-free."""
    actual = numpy.asarray(actual, dtype=numpy.float64)
    expected = numpy.asarray(expected, dtype=numpy.float64)
    assert actual.shape == expected.shape, f"shape {actual.shape} != {expected.shape}"
    if expected.size == 0:
        return 0.0
    scale = max(float(numpy.abs(expected).max()), 1e-30)
    return float(numpy.abs(actual - expected).max()) / scale


def numerical_grad(f, x, index=None, h=1e-6, five_point=False):
    """Central difference of scalar f() w.r.t. x (a contiguous array modified in place and
    restored), at every entry or at the given flat indices -> float64 [len(indices)].
    five_point uses the O(h^4) stencil (8[f(x+h) - f(x-h)] - [f(x+2h) - f(x-2h)]) / 12h."""
    flat = x.reshape(-1)
    if not numpy.shares_memory(flat, x):
        raise ValueError("numerical_grad needs a contiguous array (it perturbs x in place)")
    indices = range(flat.size) if index is None else index

    def at(i, value):
        flat[i] = value
        return float(f())

    grad = numpy.zeros(len(indices))
    for j, i in enumerate(indices):
        old = flat[i]
        d1 = at(i, old + h) - at(i, old - h)
        if five_point:
            d2 = at(i, old + 2 * h) - at(i, old - 2 * h)
            grad[j] = (8 * d1 - d2) / (12 * h)
        else:
            grad[j] = d1 / (2 * h)
        flat[i] = old
    return grad


def _largest(array):
    return float(numpy.abs(array).max()) if array.size else 0.0


class Compared(NamedTuple):
    """One input's side of a check: its whole analytic gradient, the flat indices checked
    (None: all), the analytic and numerical values there, its floor, the step h and the
    stencil, and the input itself (whose value at the worst entry the failure shows: a bug
    that depends on the sign of x is found from it)."""
    whole: numpy.ndarray
    index: numpy.ndarray
    analytic: numpy.ndarray
    numerical: numpy.ndarray
    floor: float
    h: float
    five_point: bool
    value: numpy.ndarray


def _error(name, c, relative_floor, largest):
    """-> (error, scale, what set the scale) of one input: the scale rule of the docstring."""
    scale, why = max((_largest(c.whole), f"the largest |gradient| of {name}"),
                     (c.floor, "the floor"),
                     (relative_floor * largest, f"{relative_floor:g} x the largest |gradient| "
                                                "of all"))
    worst = _largest(c.analytic - c.numerical)
    return (worst / scale if scale else 0.0 if worst == 0 else numpy.inf), scale, why


def _errors(compared, tol, relative_floor, noise, if_flat, what):
    """compared: name -> Compared -> {name: error}; AssertionError naming each over tol."""
    if if_flat not in ("raise", "skip"):
        raise ValueError(f"if_flat must be 'raise' or 'skip', got {if_flat!r}")
    largest = max((_largest(c.whole) for c in compared.values()), default=0.0)
    floor = max((c.floor for c in compared.values()), default=0.0)
    if max(largest, floor) < noise:
        if if_flat == "skip":
            return {}
        raise ValueError(f"{what} is flat here: its largest gradient is {largest:.1e} < "
                         f"{noise:.0e} (rounding noise), nothing to compare; draw other inputs "
                         "or pass if_flat='skip'")
    errors, failed = {}, []
    for name, c in compared.items():
        errors[name], scale, why = _error(name, c, relative_floor, largest)
        if not errors[name] <= tol:                     # NaN fails too
            failed.append(_worst_entry(name, c, errors[name], tol, scale, why))
    if failed:
        raise AssertionError(f"{what}: " + "; ".join(failed))
    return errors


def _worst_entry(name, c, error, tol, scale, why):
    """One input's failure, told by its worst entry: where, both values, the scale and h."""
    diff = numpy.abs(c.analytic - c.numerical)
    worst = int(numpy.argmax(numpy.where(numpy.isnan(diff), numpy.inf, diff)))
    flat = worst if c.index is None else int(c.index[worst])
    where = ", ".join(str(int(i)) for i in numpy.unravel_index(flat, c.whole.shape))
    return (f"{name}: error {error:.2e} > {tol:.0e} at {name}[{where}] = "
            f"{c.value.reshape(-1)[flat]:.6e}: analytic "
            f"{c.analytic[worst]:.6e}, numerical {c.numerical[worst]:.6e}, difference "
            f"{diff[worst]:.2e} over a scale of {scale:.2e} ({why}), h {c.h:.1e}"
            + (" (five-point)" if c.five_point else ""))


def check_gradients(forward, backward, inputs, *, seed=0, tol=DEFAULT_TOL, h=1e-6,
                    five_point=False, floor="rounding", relative_floor=0.0, noise=NOISE,
                    if_flat="raise", name="backward"):
    """Check backward against central differences of forward, at every entry of every input.

    inputs: dict name -> float64 array (copied: yours are not touched).
    forward(**inputs) -> (out, cache); backward(dout, cache) -> the gradient of each input, in
    the order of `inputs` (a tuple, or one array when there is one input).
    seed: of the random projection W; tol, h, five_point, floor ("rounding" or a number),
    relative_floor, noise, if_flat: see the module docstring. name: what the AssertionError
    calls the op.
    -> {input name: worst error}; AssertionError naming every input over tol.
    """
    arrays = _float64_copies(inputs)
    rng = numpy.random.default_rng(seed)
    out, cache = forward(**arrays)
    w = rng.standard_normal(numpy.shape(out))

    def f():
        return float((numpy.asarray(forward(**arrays)[0]) * w).sum())

    wholes = _analytic(backward(w, cache), arrays, name)   # before any perturbation
    rounding = _rounding(forward, arrays, out, w) if floor == "rounding" else None
    largest = max(_largest(g) for g in wholes.values())

    def compare(key, step, stencil):
        numerical = numerical_grad(f, arrays[key], h=step, five_point=stencil)
        return Compared(whole=wholes[key], index=None, analytic=wholes[key].reshape(-1),
                        numerical=numerical, floor=_floor(floor, rounding, step, tol, noise),
                        h=step, five_point=stencil, value=arrays[key].copy())

    def error(key, compared):
        return _error(key, compared, relative_floor, largest)[0]

    compared = {}
    for key, x in arrays.items():
        first, *others = _differences(x, h, five_point)
        compared[key] = compare(key, *first)
        if not error(key, compared[key]) <= tol / 10:   # not plainly right: the closest
            closest = min([compared[key]] + [compare(key, *other) for other in others],
                          key=lambda c: error(key, c))
            if error(key, closest) <= tol:
                compared[key] = closest         # else the failure is told at the first
    return _errors(compared, tol, relative_floor, noise, if_flat, name)


def _differences(x, h, five_point):
    """The (step, five-point?) differences to try on input x: a step of h on inputs near
    1e-4 would move them by 1%, so first h scaled down with them; then h itself (f may be
    linear in a small input, a bias near 0.01 beside weights near 1, where h is exact and
    the smaller step only adds rounding); then, unless five_point was asked for outright,
    both again with the five-point stencil (a curvature on a finer scale than the input's:
    RMSNorm of one feature near sqrt(eps)). Unless the first agrees to tol / 10, the closest
    of them all counts; a wrong backward disagrees with every one, and is told at the first."""
    steps = list(dict.fromkeys([h * min(1.0, _largest(x)) or h, h]))
    stencils = [True] if five_point else [False, True]
    return [(step, stencil) for stencil in stencils for step in steps]


def _analytic(grads, arrays, name):
    """backward's gradients -> {name: a float64 copy} (a backward may hand back a buffer it
    reuses, and its cache may view the inputs the numerical side perturbs)."""
    grads = grads if isinstance(grads, (tuple, list)) else (grads,)
    if len(grads) != len(arrays):
        raise AssertionError(f"{name}: backward returned {len(grads)} gradients for "
                             f"{len(arrays)} inputs ({', '.join(arrays)})")
    wholes = {}
    for (key, x), g in zip(arrays.items(), grads):
        g = numpy.array(g, dtype=numpy.float64)
        if g.shape != x.shape:
            raise AssertionError(f"{name} d{key}: gradient shape {g.shape} != input {x.shape}")
        wholes[key] = g
    return wholes


def _float64_copies(inputs):
    """{name: a contiguous float64 copy}; a ValueError for anything not a float64 array."""
    if not inputs:
        raise ValueError("inputs is empty: nothing to differentiate")
    arrays = {}
    for key, x in inputs.items():
        dtype = getattr(x, "dtype", None)
        if not isinstance(x, numpy.ndarray):
            raise ValueError(f"input {key!r} must be a float64 NumPy array, got "
                             f"{type(x).__name__}: the check perturbs the array in place, "
                             f"entry by entry; pass numpy.array(..., dtype=numpy.float64)")
        if dtype != numpy.float64:
            raise ValueError(f"input {key!r} must be a float64 NumPy array, got "
                             f"{type(x).__name__} of dtype {dtype}: a gradient check in lower "
                             "precision measures rounding, not the backward")
        arrays[key] = numpy.array(x, dtype=numpy.float64, order="C", copy=True)
    return arrays


def _rounding(forward, arrays, out, w):
    """How far the float64 f = sum(out * W) may be from exact, measured rather than assumed
    as eps * |out| (which misses cancellation: a linear layer's x W with terms of 1e-3 that
    sum to 1e-5 is rounded in steps of eps * 1e-3). The forward runs in float32 and in float64
    on the same float32-rounded inputs: float32's error is eps32 / eps64 times float64's, so
    each output's rounding is its float32 error scaled down so, at least eps * |out|;
    -> sum |W| * that. None where float32 cannot tell: the forward fails in float32, or
    float32 loses an output (off by more than KEPT_BY_FLOAT32 of it: GELU's 1 + tanh(u)
    cancelling to 1e-7, or a dropout mask that float32 draws anew)."""
    singles = {k: x.astype(numpy.float32) for k, x in arrays.items()}
    try:
        with numpy.errstate(all="ignore"):
            out32 = numpy.asarray(forward(**singles)[0], dtype=numpy.float64)
            out64 = numpy.asarray(forward(**{k: x.astype(numpy.float64)
                                             for k, x in singles.items()})[0])
    except Exception:           # a forward of yours that takes float64 only
        return None
    moved = numpy.abs(out32 - out64)
    if moved.shape != numpy.shape(out) or not (moved <= KEPT_BY_FLOAT32 * numpy.abs(out64)).all():
        return None
    each = numpy.maximum(moved * (EPSILON / EPSILON32), EPSILON * numpy.abs(out64))
    return float((numpy.abs(w) * each).sum())


def _floor(floor, rounding, h, tol, noise):
    """floor="rounding": the gradient at which ROUNDING_MARGIN times the rounding error of
    a central difference of f at step h (rounding / h) would reach tol; 1 where the rounding
    is not known (the fixed floor this checker had); at least noise (an op check is never
    flat: where its output is exactly zero, so are both gradients)."""
    if floor != "rounding":
        return float(floor)
    if rounding is None:
        return 1.0
    return max(ROUNDING_MARGIN * rounding / h / tol, noise)


def check_model_gradients(model, batch, *, seed=0, entries=6, tol=DEFAULT_TOL, h=3e-5,
                          five_point=True, floor=0.0, relative_floor=1e-2, noise=NOISE,
                          if_flat="raise", dropout_seed=99):
    """Check model.loss_and_grads(batch) against central differences of model.loss(batch)
    w.r.t. `entries` random entries of every parameter tensor (all when it has fewer).

    model: a float64 nanobert model (BertForPreTraining or a task head); in train mode the
    dropout masks are replayed: model.rng is reset from dropout_seed before every
    evaluation. The [PAD] row of the word embeddings is not checked: as transformers'
    nn.Embedding(padding_idx) its lookup gradient is dropped by definition, so its gradient
    is not d loss / d row. seed picks the entries. The rest: as check_gradients, with the
    model's defaults (five-point stencil, h = 3e-5, errors relative to max(the tensor's
    largest gradient, 1% of the largest gradient of all)).
    -> {parameter name: worst error}; AssertionError naming every parameter over tol.
    """
    from .model.counter_rng import default_rng    # a model lives on model.xp (NumPy here)

    bad = sorted(k for k, p in model.params.items() if p.dtype != numpy.float64)
    if bad:
        raise ValueError(f"check_model_gradients needs a float64 model; {bad[0]} is "
                         f"{model.params[bad[0]].dtype} (make it with dtype=numpy.float64)")

    def loss():
        model.rng = default_rng(model.xp, dropout_seed)    # the same dropout masks every call
        return model.loss(batch)

    model.rng = default_rng(model.xp, dropout_seed)
    value, grads = model.loss_and_grads(batch)
    again = loss()
    if value != again:
        raise AssertionError(f"model.loss gives {again!r} but loss_and_grads {value!r}: the "
                             "two forwards differ, so the gradient is not of this loss")
    if set(grads) != set(model.params):
        raise AssertionError(f"grads keys differ from params: {set(grads) ^ set(model.params)}")
    pick = numpy.random.default_rng(seed)
    pad_table = model.base_prefix + "embeddings.word_embeddings.weight"
    pad = model.config.pad_token_id
    compared = {}
    for key, p in model.params.items():
        candidates = numpy.arange(p.size)
        if key == pad_table:
            candidates = candidates[candidates // p.shape[1] != pad]
        index = (candidates if candidates.size <= entries
                 else pick.choice(candidates, entries, replace=False))
        numeric = numerical_grad(loss, p, index, h=h, five_point=five_point)
        compared[key] = Compared(whole=grads[key], index=index,
                                 analytic=grads[key].reshape(-1)[index], numerical=numeric,
                                 floor=float(floor), h=h, five_point=five_point, value=p.copy())
    return _errors(compared, tol, relative_floor, noise, if_flat, f"{type(model).__name__} loss")


# ------------------------------------------------------------------- hypothesis strategies


def _hypothesis():
    try:
        from hypothesis import strategies
    except ImportError as e:
        raise ImportError("nanobert.testing's strategies need hypothesis: "
                          "pip install hypothesis") from e
    return strategies


def _as_strategy(st, value):
    """A strategy as it is; a list (or tuple): one of its values; anything else: just it."""
    if isinstance(value, st.SearchStrategy):
        return value
    if isinstance(value, (tuple, list)):
        return st.sampled_from(list(value))
    return st.just(value)


def op_inputs(shapes, *, sizes=(1, 5), scale=(1e-4, 10.0)):
    """A hypothesis strategy of inputs for check_gradients: {name: float64 array}.

    shapes: {name: shape}, each dimension a size or a name; a named dimension is drawn once,
    between sizes (low, high), and shared: {"x": ("rows", "features"), "gamma":
    ("features",)} gives gamma as many entries as x has features. Values: standard normal
    times a scale drawn for each input, log-uniform between scale (low, high), so one draw
    holds inputs near 1e-4 and another near 10. Tiny inputs make tiny gradients, and the
    checker's floor follows f's rounding rather than a fixed 1, so a wrong backward cannot
    hide there. scale: a (low, high) pair, one number, or {name: either} per input (an input
    not named there draws from the default range).
    """
    st = _hypothesis()
    named = sorted({d for shape in shapes.values() for d in shape if isinstance(d, str)})

    def scale_of(name):
        chosen = scale.get(name, (1e-4, 10.0)) if isinstance(scale, dict) else scale
        if isinstance(chosen, tuple):
            low, high = numpy.log10(chosen)
            return st.floats(low, high).map(lambda e: float(10.0 ** e))
        return st.just(float(chosen))

    @st.composite
    def draw(draw):
        size = {d: draw(st.integers(*sizes)) for d in named}
        scales = {name: draw(scale_of(name)) for name in shapes}
        rng = numpy.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        return {name: scales[name] * rng.standard_normal(tuple(size.get(d, d) for d in shape))
                for name, shape in shapes.items()}
    return draw()


def tiny_bert_config(*, vocab_size=7, layers=1, heads=1, head_size=3, hidden_act="gelu",
                     dropout=0.0, classifier_dropout=None, intermediate_size=5,
                     max_position_embeddings=8, num_labels=2, problem_type=None):
    """A tiny float64-checkable BertConfig: hidden_size = heads * head_size; dropout sets both
    the hidden and the attention probability; classifier_dropout (the heads' own) is stored
    only when not None; num_labels / problem_type go into config.json's labels (with_labels)."""
    from .model.config import BertConfig, with_labels

    extra = {} if classifier_dropout is None else {"classifier_dropout": classifier_dropout}
    config = BertConfig(vocab_size=vocab_size, hidden_size=heads * head_size,
                        num_hidden_layers=layers, num_attention_heads=heads,
                        intermediate_size=intermediate_size,
                        max_position_embeddings=max_position_embeddings, hidden_act=hidden_act,
                        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
                        extra=extra)
    return with_labels(config, num_labels=num_labels, problem_type=problem_type)


def bert_configs(*, vocab_size=7, layers=(1, 2), heads=(1, 2), head_size=(2, 3),
                 hidden_act=("gelu", "gelu_new"), dropout=(0.0, 0.1), classifier_dropout=None,
                 num_labels=2, problem_type=None, min_hidden_size=3, **fixed):
    """A hypothesis strategy of tiny_bert_configs for gradient checks.

    Each argument is a value, a list to draw from, a (low, high) pair of integers to draw
    between, or a strategy. hidden_size = heads * head_size is at least min_hidden_size
    (LayerNorm of 2 features is constant, +-1: its gradients are zero). `fixed`: passed on.
    """
    st = _hypothesis()

    def drawn(value):
        if isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, int)
                                                                for v in value):
            return st.integers(*value)
        return _as_strategy(st, value)

    @st.composite
    def draw(draw):
        n_heads = draw(drawn(heads))
        size = draw(drawn(head_size).filter(lambda d: n_heads * d >= min_hidden_size))
        values = {k: draw(drawn(v)) for k, v in dict(
            vocab_size=vocab_size, layers=layers, hidden_act=hidden_act, dropout=dropout,
            classifier_dropout=classifier_dropout, num_labels=num_labels,
            problem_type=problem_type).items()}
        return tiny_bert_config(heads=n_heads, head_size=size, **values, **fixed)
    return draw()


def make_batch(rng, config, task, batch_size, seq_len, num_choices=2):
    """One batch for `task` (one of TASKS) drawn with the NumPy Generator rng: random ids (a
    small vocabulary repeats them), A/B segments, padded rows with [CLS] always attended and
    row 0 padding everywhere but [CLS]; and the labels of the task's head:

    pretraining              labels [B, T]: the token at masked positions (the first and the
                             last index always, ~30% more), -100 elsewhere;
                             next_sentence_label [B]
    sequence_classification  labels [B] in [0, num_labels), the last -100 when B > 1
    regression               labels [B] (num_labels 1) or [B, num_labels], floats (the
                             second for a config of problem_type "regression")
    multi_label              labels [B, num_labels] in {0, 0.3, 1} (for a config of
                             problem_type "multi_label_classification")
    token_classification     labels [B, T], -100 at padding and ~30% more; [0, 0] counted
    question_answering       start/end_positions [B] in [-2, T + 2) (clamped or ignored by
                             the loss), example 0 from 0 to T - 1
    multiple_choice          inputs [B, num_choices, T], labels [B]
    """
    from .model.config import num_labels as labels_of

    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    B, T = batch_size, seq_len
    shape = (B, num_choices, T) if task == "multiple_choice" else (B, T)
    mask = (rng.random(shape) < 0.7).astype(numpy.int64)
    mask[..., 0] = 1
    mask[0] = numpy.arange(T) == 0
    ids = rng.integers(0, config.vocab_size, size=shape)
    batch = {"input_ids": ids, "token_type_ids": rng.integers(0, 2, size=shape),
             "attention_mask": mask}
    L = labels_of(config)
    if task == "pretraining":
        labels = numpy.full((B, T), -100)
        labels[0, 0] = ids[0, 0]
        labels[-1, -1] = ids[-1, -1]
        extra = rng.random((B, T)) < 0.3
        labels[extra] = rng.integers(0, config.vocab_size, size=int(extra.sum()))
        batch.update(labels=labels, next_sentence_label=rng.integers(0, 2, size=B))
    elif task == "sequence_classification":
        batch["labels"] = rng.integers(0, L, size=B)
        if B > 1:
            batch["labels"][-1] = -100
    elif task == "regression":
        batch["labels"] = rng.normal(size=(B,) if L == 1 else (B, L))
    elif task == "multi_label":
        batch["labels"] = rng.choice([0.0, 1.0, 0.3], size=(B, L))
    elif task == "token_classification":
        tags = rng.integers(0, L, size=(B, T))
        tags[(mask == 0) | (rng.random(tags.shape) < 0.3)] = -100
        tags[0, 0] = 1
        batch["labels"] = tags
    elif task == "question_answering":
        batch["start_positions"] = rng.integers(-2, T + 2, size=B)
        batch["end_positions"] = rng.integers(-2, T + 2, size=B)
        batch["start_positions"][0], batch["end_positions"][0] = 0, T - 1
    else:
        batch["labels"] = rng.integers(0, num_choices, size=B)
    return batch


def batches(config, task="pretraining", *, batch_size=(1, 3), seq_len=(1, 5),
            num_choices=(2, 3)):
    """A hypothesis strategy of batches for `config` and `task` (see make_batch): the sizes
    are drawn from the (low, high) ranges, the arrays from a drawn seed."""
    st = _hypothesis()
    sizes = [st.integers(*r) if isinstance(r, tuple) else _as_strategy(st, r)
             for r in (batch_size, seq_len, num_choices)]
    return st.builds(lambda seed, B, T, C: make_batch(numpy.random.default_rng(seed), config,
                                                      task, B, T, C),
                     st.integers(0, 2**32 - 1), *sizes)


def bert_cases(task="pretraining", *, batch_size=(1, 3), seq_len=(1, 5), num_choices=(2, 3),
               **config_options):
    """A hypothesis strategy of (config, batch) pairs: a config from
    bert_configs(**config_options), then a batch for it and `task` from batches()."""
    st = _hypothesis()
    return bert_configs(**config_options).flatmap(lambda config: st.tuples(
        st.just(config), batches(config, task, batch_size=batch_size, seq_len=seq_len,
                                 num_choices=num_choices)))
