"""backend.reuse_freed_memory: glibc keeps freed large blocks, so a step that allocates the
same arrays again faults in far fewer fresh pages (each one the kernel zeroes: a pass over
memory). Measured in fresh processes, since the setting is process-wide."""
import subprocess
import sys

import pytest

PROGRAM = """
import resource, sys, numpy
from nanobert.backend import reuse_freed_memory
if sys.argv[1] == "reuse" and not reuse_freed_memory():
    print("not glibc"); sys.exit(0)
def step():                                   # activations of 8 to 24 MiB, freed in reverse
    held = [numpy.ones(2 ** 21 * k, numpy.float32) for k in (1, 3, 2)]
    while held:
        held.pop()
step()
start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start)
"""


def page_faults(mode):
    out = subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True,
                         check=True).stdout.strip()
    if out == "not glibc":
        pytest.skip("the C library is not glibc: reuse_freed_memory does nothing")
    return int(out)


def test_freed_memory_is_reused():
    default, reused = page_faults("default"), page_faults("reuse")
    print(f"page faults over 10 steps: glibc defaults {default}, reuse_freed_memory {reused}")
    assert reused < default / 4, (default, reused)
