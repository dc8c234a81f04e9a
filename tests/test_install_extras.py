"""pyproject.toml's extras: each GPU extra installs a prebuilt CuPy wheel for one CUDA major
version WITH its [ctk] extra (NVRTC, cuBLAS, cuRAND from PyPI: kernels.cu is compiled by
NVRTC at first use, and the plain wheel finds none without a CUDA toolkit), at a CuPy that
has that extra (14.0.0 on: the 13.x wheels' metadata has no [ctk]); "gpu" is the CUDA 12 one;
and the test extra still brings what the tests and the CuPy stand-in import."""
import ast
import os
import re

import pytest

tomllib = pytest.importorskip("tomllib")             # Python 3.11+
requirements = pytest.importorskip("packaging.requirements")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CTK_FROM = (14, 0, 0)                                 # the first cupy-cudaNNx with a [ctk] extra


def extras():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    return {name: [requirements.Requirement(text) for text in texts]
            for name, texts in project["optional-dependencies"].items()}


def cupy_wheel(requirement):
    """-> the CUDA major version of a cupy-cudaNNx requirement, else None."""
    m = re.fullmatch(r"cupy-cuda(\d+)x", requirement.name)
    return int(m[1]) if m else None


def admits_below(specifier, version):
    """Whether some CuPy release below `version` satisfies the specifier (one probe per
    13.x minor and 12.x: the versions before [ctk])."""
    probes = [f"13.{minor}.{patch}" for minor in range(7) for patch in range(2)] + ["12.3.0"]
    return any(specifier.contains(v, prereleases=True) for v in probes
               if tuple(map(int, v.split("."))) < version)


@pytest.mark.parametrize("extra, cuda", [("gpu", 12), ("gpu-cuda12", 12), ("gpu-cuda13", 13)])
def test_each_gpu_extra_is_one_cupy_wheel_with_its_cuda_components(extra, cuda):
    requirement, = extras()[extra]
    assert cupy_wheel(requirement) == cuda, f"{extra}: {requirement}"
    assert requirement.extras == {"ctk"}, f"{extra}: {requirement} brings no NVRTC"
    assert str(requirement.specifier) and not admits_below(requirement.specifier, CTK_FROM), \
        f"{extra}: {requirement} lets pip take a CuPy without [ctk] (it only warns)"
    assert requirement.marker is None, requirement


def test_plain_gpu_is_the_cuda_12_wheel():
    """It runs on CUDA 12 and CUDA 13 drivers (docs/dependencies.md)."""
    assert extras()["gpu"] == extras()["gpu-cuda12"]


def test_the_install_line_of_the_one_line_refusal_names_extras_that_exist():
    from nanobert import backend
    named = set(re.findall(r'"\.\[([\w-]+)\]"', backend.GPU_INSTALL))
    assert named == {"gpu-cuda12", "gpu-cuda13"} and named <= set(extras())


def imported_top_level(path):
    """The top-level modules a Python file imports."""
    with open(path) as f:
        tree = ast.parse(f.read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_the_test_extra_brings_what_the_standin_and_the_tests_import():
    """tests/cupy_standin.py needs no CuPy (its namespace comes from tests/cupy_namespace.json:
    the test extra installs where CuPy has no wheel, macOS); the tests run on pytest and
    hypothesis."""
    test = {r.name: r for r in extras()["test"]}
    assert not [r for r in test.values() if cupy_wheel(r)], test
    used = imported_top_level(os.path.join(ROOT, "tests", "cupy_standin.py"))
    assert not {"cupy", "cupyx", "cupy_backends"} & used, used   # cupy_namespace's snapshot()
    #                                                  alone imports CuPy, to write the file
    tests = set().union(*(imported_top_level(os.path.join(ROOT, "tests", name))
                          for name in os.listdir(os.path.join(ROOT, "tests"))
                          if name.endswith(".py")))
    assert {"pytest", "hypothesis"} <= tests and {"pytest", "hypothesis"} <= set(test), test
    assert "ruff" in test                                       # CI's line-length check
