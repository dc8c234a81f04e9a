"""The contract of the two layers of ops, found rather than listed.

1. Every twin (a public function of fast.py with the name of one of ops.py) is switchable
   (active.py binds it in the fast mode, ops.py's in reference mode) and equal to its ops.py
   op in float64: the forward's output (with and without a cache, in training and eval mode)
   and its backward's every gradient, on hypothesis-drawn values. A twin that exists but is
   not switchable, or that has no backward beside a forward whose ops.py op has one, fails.
2. No op writes into what it was given: every *_forward / *_backward of ops.py, fast.py and
   packing.py (the no-cache paths included) is called on inputs kept as copies, and every
   input, the upstream gradient of its backward too, must be unchanged after the forward and
   after the backward. (A backward may use its own cache, what its forward made, as scratch:
   the cache is not the caller's.)

Inputs are made from the parameters' names (`make`): a new op whose parameter has a new
name fails here until the name gets a recipe, so no op goes unchecked.
"""
import inspect

import numpy
import pytest
from hypothesis import given, settings, strategies as st

from conftest import record
from nanobert.model import active, fast, ops, packing

SETTINGS = settings(max_examples=8, deadline=None)
B, T, H, A, I, C = 2, 5, 8, 2, 12, 3     # batch, length, hidden, heads, intermediate, classes
# float64 bound of fast vs ops, relative to the array's largest entry: the fast twins order
# some sums otherwise (LayerNorm's row means, pooled matmuls); measured 1.6e-15 at most.
TWIN_BOUND = 1e-13


def lengths_mask():
    """attention_mask [B, T]: row 0 padded after 3 tokens, row 1 full."""
    return (numpy.arange(T) < numpy.array([[3], [T]])).astype(numpy.int64)


def make(name, rng, dtype, packed=False):
    """An input for a parameter called `name`, by what the name means in the ops' contract.
    packed: x and residual are the attended tokens [N, H] of lengths_mask (packing.py)."""
    tokens = (int(lengths_mask().sum()),) if packed else (B, T)
    normal = {"x": (*tokens, H), "residual": (*tokens, H), "weight": (I, H), "bias": (I,),
              "gamma": (H,), "beta": (H,), "w_qkv": (3 * H, H), "b_qkv": (3 * H,),
              "logits": (B * T, C), "prediction": (B, C), "target": (B, C),
              "table": (7, H)}
    if name in normal:
        return rng.standard_normal(normal[name]).astype(dtype)
    if name == "targets":
        return rng.random((B * T, C)).astype(dtype)
    if name == "labels":
        labels = rng.integers(0, C, B * T)
        labels[rng.random(B * T) < 0.3] = ops.IGNORE_INDEX
        return labels
    if name == "ids":
        return rng.integers(0, 7, (B, T))
    if name == "mask_bias":
        return ops.attention_mask_bias(lengths_mask(), dtype)
    if name == "packing":
        return packing.packing_of(lengths_mask())
    fixed = {"eps": 1e-12, "kind": "gelu", "p": 0.1, "dropout_p": 0.1, "num_heads": A}
    if name in fixed:
        return fixed[name]
    raise AssertionError(f"no recipe for a parameter called {name!r}: give it one in make()")


def forward_arguments(function, seed, dtype, training, packed=False):
    """The arguments of a forward without a default, from make(), and `training`; rng: a
    generator from seed, fresh at every call (both layers draw the same masks)."""
    rng = numpy.random.default_rng(seed)
    arguments = {}
    for name, parameter in inspect.signature(function).parameters.items():
        if parameter.default is not inspect.Parameter.empty:
            continue
        if name == "rng":
            arguments[name] = numpy.random.default_rng(seed + 1)
        elif name == "training":
            arguments[name] = training
        else:
            arguments[name] = make(name, rng, dtype, packed)
    return arguments


def takes_cache(function):
    return "cache" in inspect.signature(function).parameters


def backward_of(module, name):
    """The backward of forward `name` in the mode whose ops are module's (fast: its twin, else
    ops.py's, as active.py binds them), or None where the op has none."""
    backward = name.replace("_forward", "_backward")
    return getattr(module, backward, getattr(ops, backward, None))


def upstream(out, seed):
    """A gradient shaped like the forward's output: 0.7 for a loss (0-d or a float)."""
    if numpy.ndim(out) == 0:
        return 0.7
    return numpy.random.default_rng(seed + 2).standard_normal(numpy.shape(out)).astype(out.dtype)


def arrays_of(result):
    """The arrays of a backward's result (one array or a tuple)."""
    result = result if isinstance(result, tuple) else (result,)
    return [numpy.asarray(r) for r in result if r is not None]


def run(module, name, seed, training, cache, dtype=numpy.float64, packed=False):
    """Forward `name` of module (and its backward with a cache) -> (out, backward's arrays or
    None, the forward's arguments, dout)."""
    forward = getattr(module, name)
    arguments = forward_arguments(forward, seed, dtype, training, packed)
    if takes_cache(forward):
        arguments["cache"] = cache
    out, kept = forward(**arguments)
    backward = backward_of(module, name)
    if backward is None or not cache:
        return out, None, arguments, None
    dout = upstream(out, seed)
    return out, arrays_of(backward(dout, kept)), arguments, dout

# ------------------------------------------------------------------ 1. the twins, found


def test_every_twin_is_switchable_and_every_op_runs_in_both_modes():
    twins, was = active.twins(), active.reference_ops()
    assert "dropout_add_forward" in twins and "linear_forward" in twins, twins
    try:
        for reference in (True, False):
            active.use_reference_ops(reference)
            for name in active.OPS:
                expected = getattr(fast if name in twins and not reference else ops, name)
                assert getattr(active, name) is expected, f"active.{name} in {reference=}"
        # an op ops.py alone defines (no fast twin) runs in the fast mode as written there
        assert active.tanh_forward is ops.tanh_forward
        assert "tanh_forward" in active.missing_twins()
    finally:
        active.use_reference_ops(was)


@pytest.mark.parametrize("name", [n for n in active.twins() if n.endswith("_backward")])
def test_every_backward_twin_has_its_forward(name):
    forward = name.replace("_backward", "_forward")
    assert hasattr(ops, forward), f"fast.{name} is the backward of no ops.py forward"


@pytest.mark.parametrize("name", [n for n in active.twins() if not n.endswith("_backward")])
@SETTINGS
@given(seed=st.integers(0, 2**16), training=st.booleans(), cache=st.booleans())
def test_every_twin_equals_its_ops_op_in_float64(name, seed, training, cache):
    out, grads, _, _ = run(ops, name, seed, training, cache)
    fast_out, fast_grads, _, _ = run(fast, name, seed, training, cache)
    pairs = [("out", fast_out, out)]
    if grads is not None:
        assert len(fast_grads) == len(grads), f"{name}'s backward: {len(fast_grads)} results"
        pairs += [(f"gradient {i}", f, r) for i, (f, r) in enumerate(zip(fast_grads, grads))]
    for what, actual, expected in pairs:
        actual, expected = numpy.asarray(actual), numpy.asarray(expected)
        assert actual.shape == expected.shape, f"{name} {what}: {actual.shape} {expected.shape}"
        scale = max(float(numpy.abs(expected).max(initial=0.0)), 1e-300)
        error = record("fast twin vs ops.py, float64 (relative)",
                       float(numpy.abs(actual - expected).max(initial=0.0)) / scale)
        assert error <= TWIN_BOUND, (f"fast.{name} {what} differs from ops.{name}'s by "
                                     f"{error:.2e} relative ({training=}, {cache=}, {seed=})")


@pytest.mark.parametrize("module", [ops, fast], ids=["ops", "fast"])
def test_cache_false_keeps_nothing(module):
    for name in (n for n in active.OPS if n.endswith("_forward")):
        forward = getattr(module, name, None)
        if forward is not None and takes_cache(forward):
            for training in (False, True):
                out, kept = forward(**forward_arguments(forward, 3, numpy.float64, training),
                                    cache=False)
                assert kept is None, f"{module.__name__}.{name}(cache=False) kept {type(kept)}"

# ------------------------------------------------------ 2. no op writes into its inputs


def ops_of(module):
    return [name for name, f in vars(module).items()
            if inspect.isfunction(f) and name.endswith("_forward") and not name.startswith("_")
            and f.__module__ == module.__name__]


CASES = [(module, name) for module in (ops, fast, packing) for name in ops_of(module)]


def changed(before, after):
    """The names of the arrays of `before` (copies) that `after` no longer equals."""
    return [k for k, v in before.items() if isinstance(v, numpy.ndarray)
            and not numpy.array_equal(v, after[k], equal_nan=True)]


@pytest.mark.parametrize("module, name", CASES,
                         ids=[f"{m.__name__.split('.')[-1]}.{n}" for m, n in CASES])
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_no_op_writes_into_what_it_was_given(module, name, dtype):
    packed = module is packing
    for training in (False, True):
        for cache in (False, True):
            forward = getattr(module, name)
            arguments = forward_arguments(forward, 5, dtype, training, packed)
            if takes_cache(forward):
                arguments["cache"] = cache
            elif not cache:
                continue
            kept = {k: v.copy() if isinstance(v, numpy.ndarray) else v
                    for k, v in arguments.items()}
            out, saved = forward(**arguments)
            where = f"{module.__name__}.{name}({training=}, {cache=}, {numpy.dtype(dtype)})"
            assert not changed(kept, arguments), f"{where} wrote into {changed(kept, arguments)}"
            backward = backward_of(module, name)
            if backward is None or saved is None:
                continue
            dout = upstream(out, 6)
            dout_kept = numpy.copy(dout)
            backward(dout, saved)
            assert not changed(kept, arguments), (f"{where}'s backward wrote into the forward's "
                                                  f"{changed(kept, arguments)}")
            assert numpy.array_equal(dout, dout_kept), f"{where}'s backward wrote into dout"
