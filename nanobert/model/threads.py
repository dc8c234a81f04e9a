"""Large NumPy passes split into blocks of rows over a small persistent thread pool.

NumPy's ufuncs, reductions and matmul release the GIL while they run, so Python threads
that each take a block of rows run on separate cores. The elementwise passes (GELU,
softmax, LayerNorm) and the small batched attention matmuls (one BLAS call per head, each
too small for BLAS to thread) would run on one core otherwise. The large matmuls run here
too (fast.pooled_matmul), a block per thread: BLAS would thread them as fast, but
its idle threads then spin for ~0.1 s and take a core from the passes that follow.

Each block is a run of whole rows of the leading axis, handed to one call of the kernel.
A kernel that treats rows independently (elementwise, or reducing over the last axis)
therefore computes every row exactly as one call over all rows would: the results are
bitwise the same for any number of threads (tests/test_fast.py checks that).

Threads: $NANOBERT_THREADS, else what BLAS is told to use ($OMP_NUM_THREADS), else the cores
this process may run on. Small arrays run inline: a handoff to the pool costs ~20 us.

A block is 2^17 elements, not the 2^15 that would stay in a core's L2 cache: each NumPy call
takes and gives back the GIL, and with two threads making calls of a few microseconds the
handoffs cost more than the cache saves (measured on 2 cores, [3132, 1536] float32, GELU:
45.9 ms in 2^15 blocks on 2 threads, slower than 39.0 ms on 1; 20.7 ms in 2^17 blocks).

Kernels that call BLAS (matmuls, dots) run with OpenBLAS held to one thread while the pool
works, and its count is given back after: two threads calling a multithreaded OpenBLAS at once
can spin-wait on its thread server for seconds (measured here: 11.6 s instead of 68 ms for
one layer's attention). The setter, openblas_set_num_threads_local, sets the count for the
whole process in a pthreads OpenBLAS, not for the calling thread as its name says (measured:
a thread that set 1 made another thread's matmul single-threaded, and a worker that set the
count back while the caller still had blocks to go let the caller's next BLAS calls wake
OpenBLAS's threads, which then spun beside ours: 2.5 s of a 10.5 s BERT-base step). So only
the caller sets and restores it, around the whole call. Where that control is missing
(another BLAS, an OpenBLAS before 0.3.27), BLAS kernels run inline.
"""
import ctypes
import functools
import glob
import itertools
import os
from concurrent.futures import ThreadPoolExecutor

import numpy

BLOCK_ELEMENTS = 1 << 17    # per block (see the top: GIL handoffs, not the cache, set it)
MIN_PARALLEL = 1 << 16      # fewer elements than this: inline, no handoff

_pool = None                # ThreadPoolExecutor, made on first use
_pool_size = 0
_pool_pid = None            # the process that made it: a forked child makes its own


def cpu_threads():
    """As many threads as BLAS is told to use (OMP_NUM_THREADS, as under mpiexec with one
    thread per rank), else the cores this process may run on."""
    told = os.environ.get("OMP_NUM_THREADS", "")
    if told.isdigit() and int(told) > 0:
        return int(told)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


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
    global _pool, _pool_size, _pool_pid
    if _pool_pid != os.getpid():                # a fork's child has the pool but no threads
        _pool, _pool_size = None, 0
    if _pool_size < n - 1:
        if _pool is not None:
            _pool.shutdown(wait=False)
        _pool, _pool_size = ThreadPoolExecutor(n - 1, thread_name_prefix="nanobert"), n - 1
        _pool_pid = os.getpid()
    return _pool


def _find_blas_threads_setter():
    """OpenBLAS's openblas_set_num_threads_local(n) -> the previous count, from the OpenBLAS
    that NumPy's wheel bundles (numpy.libs/), or None. It sets the count for the process (see
    the top)."""
    folder = os.path.join(os.path.dirname(numpy.__file__), os.pardir, "numpy.libs")
    for path in glob.glob(os.path.join(folder, "*openblas*")):
        try:
            setter = ctypes.CDLL(path).openblas_set_num_threads_local
        except (OSError, AttributeError):
            continue
        setter.restype, setter.argtypes = ctypes.c_int, [ctypes.c_int]
        return setter
    return None


SET_BLAS_THREADS = _find_blas_threads_setter()


def row_blocks(rows, row_size, block_elements=BLOCK_ELEMENTS):
    """(start, stop) runs of whole rows covering range(rows), each about block_elements."""
    per_block = max(1, block_elements // max(row_size, 1))
    return [(start, min(start + per_block, rows)) for start in range(0, rows, per_block)]


def in_row_blocks(kernel, arrays, *args, block_elements=BLOCK_ELEMENTS, uses_blas=False,
                  rows_per_block=None):
    """kernel(*[a[start:stop] for a in arrays], *args) for blocks of rows covering the
    leading axis of every NumPy array in `arrays` (all of the same leading length; None
    entries are passed as None), on the thread pool: blocks are taken in turn by the caller
    and the pool's workers, so a slow core takes fewer. NumPy's error state (errstate)
    applies in the workers too. uses_blas: the kernel calls BLAS (see the top).
    rows_per_block: blocks of that many rows, on the pool however small the arrays are (for
    arrays that only describe the work, as the packed attention's [B] row starts and
    lengths). A kernel must not call in_row_blocks itself: the workers would wait on their
    own pool."""
    first = next(a for a in arrays if a is not None)
    rows = first.shape[0]
    if rows_per_block is None:
        blocks = row_blocks(rows, first.size // max(rows, 1), block_elements)
    else:
        blocks = row_blocks(rows, 1, rows_per_block)
    threads = min(thread_count(), len(blocks))

    def run(start, stop):
        kernel(*[None if a is None else a[start:stop] for a in arrays], *args)

    if rows_per_block is None and first.size < MIN_PARALLEL:
        threads = 1                             # small: inline, no handoff
    run_tasks([functools.partial(run, start, stop) for start, stop in blocks], threads,
              uses_blas)


def run_tasks(tasks, threads, uses_blas=False):
    """Call each of `tasks` (callables of no arguments) once: taken in turn by the caller and
    threads - 1 of the pool's workers, so a slow core takes fewer. Returns when all are done;
    the first exception raised in any of them is raised here. NumPy's error state (errstate)
    applies in the workers too. uses_blas: the tasks call BLAS, which is held to one thread
    meanwhile (see the top). A task must not call run_tasks itself: the workers would wait
    on their own pool."""
    if threads <= 1 or (uses_blas and SET_BLAS_THREADS is None):
        for task in tasks:
            task()
        return
    taken = itertools.count()                  # next() on a count is atomic under the GIL
    errors = numpy.geterr()

    def worker():
        with numpy.errstate(**errors):
            for i in iter(taken.__next__, None):
                if i >= len(tasks):
                    return
                tasks[i]()

    blas_threads = SET_BLAS_THREADS(1) if uses_blas else None
    try:
        futures = [_workers(threads).submit(worker) for _ in range(threads - 1)]
        worker()
        for future in futures:
            future.result()
    finally:
        if uses_blas:
            SET_BLAS_THREADS(blas_threads)      # back to the count before the call
