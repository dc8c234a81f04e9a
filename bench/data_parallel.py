"""Benchmark: data-parallel scaling on this machine. The same training step (a BERT config, one
global batch, forward + backward + allreduce + clipping + AdamW) run as N MPI ranks of one
thread each, and as one process with N BLAS threads; prints tokens/s of each and the scaling
efficiency (N ranks / 1 rank x N threads: above 1, the ranks win).

    python -m bench.data_parallel                  # mini, B=32, T=128, N = 2
    python -m bench.data_parallel --config tiny --ranks 2 --steps 10

Needs mpi4py and mpiexec (pip install '.[mpi]'). Run it on an otherwise idle machine.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy

from bench.train_step import CONFIGS, make_batch, make_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker(name, batch_size, steps):
    """One process of the run: its slice of every global batch; rank 0 prints the result."""
    from nanobert import AdamW, BertForPreTraining, clip_by_global_norm
    from nanobert.backend import reuse_freed_memory
    from nanobert.distributed import allreduce_grads, process_group, rank_slice
    reuse_freed_memory()                                # as train.py does, in every rank
    group = process_group()
    config, _, T = make_config(name)
    whole = make_batch(config, batch_size, T)
    denominators = {"masked_lm": int((whole["labels"] != -100).sum()),
                    "next_sentence": batch_size}
    mine = rank_slice(numpy.arange(batch_size), group)
    batch = {k: v[mine] for k, v in whole.items()}
    model = BertForPreTraining(config, seed=0).train()
    optimizer = AdamW(model.params, mode="bert")
    times = []
    for step in range(steps + 1):                       # the first step warms up
        group.barrier()
        start = time.perf_counter()
        _, grads = model.loss_and_grads(batch, denominators=denominators)
        allreduce_grads(group, grads)
        clip_by_global_norm(grads, 1.0)
        optimizer.step(grads, lr=1e-4)
        group.barrier()
        if step:
            times.append(time.perf_counter() - start)
    if group.is_main:
        seconds = statistics.median(times)
        print(json.dumps({"seconds": seconds, "tokens_per_second": batch_size * T / seconds}))


def measure(argv, env):
    result = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
    if result.returncode:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def threads(n):
    return {**os.environ, **{k: str(n) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                 "MKL_NUM_THREADS")}}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", choices=CONFIGS, default="mini")
    p.add_argument("--batch-size", type=int, default=32, help="global batch (default 32)")
    p.add_argument("--ranks", type=int, default=2, help="N (default 2, one per core here)")
    p.add_argument("--steps", type=int, default=5, help="timed steps (median; default 5)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args.config, args.batch_size, args.steps)
    me = [sys.executable, "-m", "bench.data_parallel", "--worker", "--config", args.config,
          "--batch-size", str(args.batch_size), "--steps", str(args.steps)]
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    mpiexec = mpiexec if os.path.exists(mpiexec) else "mpiexec"
    n = args.ranks
    one = measure(me, threads(n))
    many = measure([mpiexec, "-n", str(n), *me], threads(1))
    print(f"{args.config}, global batch {args.batch_size} x {make_config(args.config)[2]}, "
          f"median of {args.steps} steps (forward, backward, allreduce, clip, AdamW):")
    print(f"  1 process x {n} threads: {one['seconds']:.3f} s/step, "
          f"{one['tokens_per_second']:,.0f} tokens/s")
    print(f"  {n} ranks x 1 thread:    {many['seconds']:.3f} s/step, "
          f"{many['tokens_per_second']:,.0f} tokens/s")
    print(f"  scaling efficiency ({n} ranks / 1 process x {n} threads): "
          f"{many['tokens_per_second'] / one['tokens_per_second']:.2f}")


if __name__ == "__main__":
    main()
