"""With this folder and tests/ on PYTHONPATH and NANOBERT_CUPY_STANDIN=1, a Python process
(train.py, bench.train_step) imports the CuPy stand-in as `cupy` and, at exit, writes its
launch and sync counts to $NANOBERT_CUPY_STANDIN_COUNTS (JSON): how tests run unmodified
command lines "on the GPU" without one."""
import atexit
import json
import os
import sys

if os.environ.get("NANOBERT_CUPY_STANDIN") == "1":
    import cupy_standin
    sys.modules.update(cupy_standin.MODULES)

    def _write_counts():
        path = os.environ.get("NANOBERT_CUPY_STANDIN_COUNTS")
        if path:
            c = cupy_standin.counts
            with open(path, "w") as f:
                json.dump({"launches": c.launches, "kernels": c.kernel_launches,
                           "memsets": c.memsets, "copies": c.copies,
                           "host_waits": c.host_waits, "syncs": c.syncs,
                           "generators": c.generators, "sync_sites": dict(c.sync_sites),
                           "pageable_copies": c.pageable_copies,
                           "pinned_copies": c.pinned_copies, "captures": c.captures,
                           "graph_launches": c.graph_launches}, f)
    atexit.register(_write_counts)
