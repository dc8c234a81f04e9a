"""The learner's install works off Linux: every package that `pip install -e ".[test,plot]"`
brings (README: the learner's tier, and the first command's [plot]) has a wheel for macOS on
Apple silicon and for Windows x86-64, asked of the package registry as pip would resolve it
there (`pip install --dry-run --only-binary=:all: --platform ...`: it resolves the whole
dependency tree, no compiler, no sdist). Skipped, with the reason, when the registry does not
answer."""
import os
import subprocess
import sys

import pytest

tomllib = pytest.importorskip("tomllib")             # Python 3.11+

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLATFORMS = {"macOS arm64": "macosx_14_0_arm64", "Windows x86-64": "win_amd64"}
LEARNER_EXTRAS = ("test", "plot")


def learner_requirements():
    """The runtime dependencies and the learner's extras, as pyproject.toml lists them."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    extras = project["optional-dependencies"]
    return project["dependencies"] + [r for name in LEARNER_EXTRAS for r in extras[name]]


def test_the_learner_extras_hold_no_gpu_package():
    """The stand-in of CuPy runs without CuPy: no CUDA wheel in the learner's install."""
    assert not [r for r in learner_requirements() if r.lower().startswith("cupy")]


@pytest.mark.parametrize("platform", list(PLATFORMS))
def test_every_learner_package_has_a_wheel_for(platform, tmp_path):
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
               "--only-binary=:all:", "--platform", PLATFORMS[platform], "--python-version",
               "3.11", "--target", str(tmp_path / "target"), "--disable-pip-version-check",
               *learner_requirements()]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.skip("the package registry did not answer within 300 s")
    output = done.stdout + done.stderr
    if done.returncode and any(s in output for s in ("NewConnectionError", "Network is unreachable",
                                                      "Temporary failure in name resolution",
                                                      "ConnectTimeout", "ProxyError")):
        pytest.skip(f"the package registry did not answer: {output.strip().splitlines()[-1]}")
    assert done.returncode == 0, f"no wheel for {platform}:\n{output[-2000:]}"
    assert "Would install" in output
