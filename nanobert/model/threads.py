"""Large NumPy passes split into blocks of rows over a small persistent thread pool.

NumPy's ufuncs, reductions and matmul release the GIL while they run, so Python threads
that each take a block of rows run on separate cores. BLAS uses every core for the large
matmuls, but the elementwise passes between them (GELU, softmax, LayerNorm) and the small
batched attention matmuls (one BLAS call per head, each too small for BLAS to thread) run
on one core unless they are split like this.

Each block is a run of whole rows of the leading axis, handed to one call of the kernel.
A kernel that treats rows independently (elementwise, or reducing over the last axis)
therefore computes every row exactly as one call over all rows would: the results are
bitwise the same for any number of threads (tests/test_fast.py checks that).

Threads: $NANOBERT_THREADS, else what BLAS is told to use ($OMP_NUM_THREADS), else the cores
this process may run on. Small arrays run inline: a handoff to the pool costs ~20 us.
"""
import itertools
import os
from concurrent.futures import ThreadPoolExecutor

import numpy

from .optim import cpu_threads

BLOCK_ELEMENTS = 1 << 15    # per block: a kernel's few passes over it stay in the L2 cache
MIN_PARALLEL = 1 << 16      # fewer elements than this: inline, no handoff

_pool = None                # ThreadPoolExecutor, made on first use
_pool_size = 0


def thread_count():
    """$NANOBERT_THREADS, else cpu_threads() (OMP_NUM_THREADS, else the usable cores)."""
    told = os.environ.get("NANOBERT_THREADS", "")
    if told:
        if not told.isdigit() or int(told) < 1:
            raise ValueError(f"NANOBERT_THREADS must be a positive integer, got {told!r}")
        return int(told)
    return cpu_threads()


def _workers(n):
    """The persistent pool, with at least n - 1 workers (the caller is the n-th)."""
    global _pool, _pool_size
    if _pool_size < n - 1:
        if _pool is not None:
            _pool.shutdown(wait=False)
        _pool, _pool_size = ThreadPoolExecutor(n - 1, thread_name_prefix="nanobert"), n - 1
    return _pool


def row_blocks(rows, row_size, block_elements=BLOCK_ELEMENTS):
    """(start, stop) runs of whole rows covering range(rows), each about block_elements."""
    per_block = max(1, block_elements // max(row_size, 1))
    return [(start, min(start + per_block, rows)) for start in range(0, rows, per_block)]


def in_row_blocks(kernel, arrays, *args, block_elements=BLOCK_ELEMENTS):
    """kernel(*[a[start:stop] for a in arrays], *args) for blocks of rows covering the
    leading axis of every NumPy array in `arrays` (all of the same leading length; None
    entries are passed as None), on the thread pool: blocks are taken in turn by the caller
    and the pool's workers, so a slow core takes fewer. NumPy's error state (errstate)
    applies in the workers too."""
    first = next(a for a in arrays if a is not None)
    rows = first.shape[0]
    blocks = row_blocks(rows, first.size // max(rows, 1), block_elements)
    threads = min(thread_count(), len(blocks))

    def run(start, stop):
        kernel(*[None if a is None else a[start:stop] for a in arrays], *args)

    if threads <= 1 or first.size < MIN_PARALLEL:
        for start, stop in blocks:
            run(start, stop)
        return
    taken = itertools.count()                  # next() on a count is atomic under the GIL
    errors = numpy.geterr()

    def worker():
        with numpy.errstate(**errors):
            for i in iter(taken.__next__, None):
                if i >= len(blocks):
                    return
                run(*blocks[i])

    futures = [_workers(threads).submit(worker) for _ in range(threads - 1)]
    worker()
    for future in futures:
        future.result()
