"""What tests/cupy_standin.py borrows from the real CuPy, kept in tests/cupy_namespace.json so
that the stand-in runs where CuPy is not installed (no wheel for macOS; ~100 MB elsewhere): the
names of the cupy module and what each is (a ufunc with its type table and methods, a function
with its parameters, a value), cupy.ndarray's and cupy.random.Generator's methods with their
parameters, and the parameters of cupyx.scatter_add and cupy.RawModule.

    python tests/cupy_namespace.py          # with CuPy installed: rewrite the JSON from it

tests/test_cupy_standin.py checks, where CuPy is installed, that the JSON is what it gives."""
import inspect
import json
import re
from pathlib import Path

import numpy

PATH = Path(__file__).with_name("cupy_namespace.json")


def _docstring_signature(fn):
    """The signature in the first line of a Cython docstring: 'name(self, a, b=1) -> x'."""
    doc = (getattr(fn, "__doc__", None) or "").strip().splitlines()
    m = re.match(r"[\w.]+\((.*)\)", doc[0]) if doc else None
    if not m:
        return None
    params = re.sub(r"=<[^>]*>", "=None", m.group(1).replace("\\*", "*"))
    try:
        namespace = {}
        exec(f"def f({params}): pass", {"numpy": numpy}, namespace)
        return inspect.signature(namespace["f"])
    except SyntaxError:
        return None


def parameters(fn):
    """fn's parameters as [name, kind, has a default], or None where neither inspect nor its
    docstring gives a signature."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        signature = _docstring_signature(fn)
    if signature is None:
        return None
    return [[p.name, p.kind.name, p.default is not p.empty]
            for p in signature.parameters.values()]


def signature(params):
    """parameters' list -> an inspect.Signature that binds as the real one does (defaults
    None: only whether a parameter has one matters for binding)."""
    if params is None:
        return None
    return inspect.Signature([inspect.Parameter(name, getattr(inspect.Parameter, kind),
                                                default=None if has_default
                                                else inspect.Parameter.empty)
                              for name, kind, has_default in params])


def _methods(cls):
    return {name: parameters(getattr(cls, name)) if callable(getattr(cls, name, None)) else None
            for name in dir(cls)}


def snapshot():
    """The namespace of the installed CuPy (see the module's doc)."""
    import cupy
    import cupyx
    import cupyx.scipy.special
    names = {}
    for name in dir(cupy):
        value = getattr(cupy, name)
        if isinstance(value, cupy.ufunc):
            names[name] = {"kind": "ufunc", "types": list(value.types),
                           "methods": sorted(m for m in dir(value) if not m.startswith("_"))}
        elif callable(value) and not isinstance(value, type):
            names[name] = {"kind": "function", "parameters": parameters(value)}
        else:
            names[name] = {"kind": "value"}
    erf = cupyx.scipy.special.erf
    return {"version": cupy.__version__, "cupy": names, "ndarray": _methods(cupy.ndarray),
            "Generator": _methods(cupy.random.Generator),
            "erf": {"types": list(erf.types),
                    "methods": sorted(m for m in dir(erf) if not m.startswith("_"))},
            "scatter_add": parameters(cupyx.scatter_add),
            "RawModule": parameters(cupy.RawModule.__init__)}


def load():
    with open(PATH) as f:
        return json.load(f)


if __name__ == "__main__":
    PATH.write_text(json.dumps(snapshot(), indent=0, sort_keys=True) + "\n")
    print(f"wrote {PATH}")
