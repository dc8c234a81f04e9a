"""backend.reuse_freed_memory: glibc keeps freed blocks, so a step that allocates the same
arrays again faults in far fewer fresh pages (each one the kernel zeroes: a pass over
memory). Measured in fresh processes, since the setting is process-wide."""
import subprocess
import sys

import pytest

PROGRAM = """
import resource, sys, numpy
from nanobert.backend import reuse_freed_memory
if sys.argv[1] == "reuse" and not reuse_freed_memory():
    print("not glibc"); sys.exit(0)
sizes_mib, steps = [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3])
def step():                                   # the activations, freed in reverse
    held = [numpy.ones(2 ** 18 * mib, numpy.float32) for mib in sizes_mib]
    while held:
        held.pop()
step()
start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(steps):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start)
"""

STEPS = {   # name: (array sizes in MiB, steps)
    "activations of 8 to 24 MiB": ("8,24,16", 10),
    "an array above glibc's largest mmap threshold (32 MiB)": ("48", 10),
    "more than 1 GiB freed at once (the old trim threshold)": (",".join(["24"] * 46), 2),
}


def page_faults(mode, sizes, steps):
    out = subprocess.run([sys.executable, "-c", PROGRAM, mode, sizes, str(steps)],
                         capture_output=True, text=True, check=True).stdout.strip()
    if out == "not glibc":
        pytest.skip("the C library is not glibc: reuse_freed_memory does nothing")
    return int(out)


@pytest.mark.parametrize("name", list(STEPS))
def test_freed_memory_is_reused(name):
    default, reused = (page_faults(mode, *STEPS[name]) for mode in ("default", "reuse"))
    print(f"{name}: page faults, glibc defaults {default}, reuse_freed_memory {reused}")
    assert reused < default / 4, (default, reused)
