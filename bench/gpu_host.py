"""Where the host's time goes when it issues nanobert's GPU step: the host cost of one call of
each GPU building block beside CuPy's own call for the same work, then Python's profile of the
host while it issues BERT-base training steps. A step whose host time exceeds its GPU time
(BERT-base at B=32: docs/gpu.md) is as fast as its calls are cheap.

    python -m bench.gpu_host                   # both parts, BERT-base B=32 T=128 TF32
    python -m bench.gpu_host --no-calls --batch-size 128 --precision float16

Per call: microseconds of host time, the median of 5 rounds of 2,000 calls on tiny arrays (the
GPU finishes each launch before the host issues the next, so the host's cost is what is timed).
The profile: the functions with the most host time of their own (cProfile's tottime) over
--steps steps, after two untimed ones; CuPy's compiled calls appear as the builtins they are.
"""
import argparse
import cProfile
import pstats
import statistics
import sys
import time

import numpy

import bench.train_step as train_step
from bench.gpu_profile import PRECISIONS, PRESETS, make_config
from nanobert import backend

ROUNDS, CALLS = 5, 2000


def per_call_us(fn, cupy):
    """Median host microseconds per fn() call over ROUNDS rounds of CALLS calls."""
    fn()
    cupy.cuda.Device().synchronize()
    rounds = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(CALLS):
            fn()
        rounds.append((time.perf_counter() - start) / CALLS * 1e6)
        cupy.cuda.Device().synchronize()
    return statistics.median(rounds)


def building_blocks(cupy):
    """-> [(what, nanobert's call, CuPy's call for the same work or None)]: the calls a
    training step makes most often."""
    from nanobert.model import fast_gpu, kernels
    f32 = numpy.float32
    x, w = cupy.ones((64, 32), f32), cupy.ones((48, 32), f32)
    out = cupy.empty((64, 48), f32)
    q, s = cupy.ones((2, 3, 16, 8), f32), cupy.empty((2, 3, 16, 16), f32)
    bias, column = cupy.ones(48, f32), cupy.empty(48, f32)
    rows = [("2-D product x @ w.T",
             lambda: fast_gpu.matmul(x, w.T),
             lambda: cupy.matmul(x, w.T))]
    if hasattr(fast_gpu, "gemm"):
        rows += [("2-D product into out (gemm)",
                  lambda: fast_gpu.gemm(x, w, out, transpose_b=True),
                  lambda: cupy.matmul(x, w.T, out=out)),
                 ("batched product q @ k^T (gemm)",
                  lambda: fast_gpu.gemm(q, q, s, transpose_b=True),
                  lambda: cupy.matmul(q, q.transpose(0, 1, 3, 2), out=s))]
    if hasattr(fast_gpu, "column_sum"):
        rows.append(("column sum [N, H] -> [H]",
                     lambda: fast_gpu.column_sum(out, out=column),
                     lambda: out.sum(axis=0, out=column)))
    rows += [("bias add out += bias", lambda: out.__iadd__(bias), None),
             ("cupy.empty [64, 48]", lambda: cupy.empty((64, 48), f32), None),
             ("GELU (fused kernel)", lambda: fast_gpu.gelu_forward(out), None),
             ("row mean, keepdims", lambda: out.mean(axis=-1, keepdims=True), None),
             ("reshape view", lambda: out.reshape(-1, 16), None)]
    del kernels
    return rows


def profile_steps(args):
    """cProfile of the host issuing args.steps nanobert steps -> the printed statistics."""
    dtype, tf32 = PRECISIONS[args.precision]
    backend.set_tf32(tf32)
    config = make_config(args.preset, args.seq_len)
    batch = train_step.make_batch(config, args.batch_size, args.seq_len)
    cupy = backend.get_xp("gpu")
    step, _ = train_step.nanobert_step_fn(config, batch, device="gpu", dtype=dtype)
    for _ in range(2):
        step()
    cupy.cuda.Device().synchronize()
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    for _ in range(args.steps):
        step()
    profiler.disable()
    issued = time.perf_counter() - start
    cupy.cuda.Device().synchronize()
    print(f"\nhost profile: {args.preset} B={args.batch_size} T={args.seq_len} "
          f"{args.precision}, {args.steps} steps, {1e3 * issued / args.steps:.1f} ms a step to "
          f"issue under the profiler (it slows Python calls)")
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.sort_stats("tottime").print_stats(args.top)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=PRESETS, default="base")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--precision", choices=PRECISIONS, default="tf32")
    parser.add_argument("--steps", type=int, default=5, help="profiled steps (default 5)")
    parser.add_argument("--top", type=int, default=45, help="functions listed (default 45)")
    parser.add_argument("--no-calls", action="store_true", help="skip the per-call costs")
    parser.add_argument("--no-profile", action="store_true", help="skip the step's profile")
    args = parser.parse_args(argv)
    if not backend.gpu_available():
        sys.exit("bench.gpu_host: no GPU here (CuPy cannot see a CUDA device)")
    cupy = backend.get_xp("gpu")
    if not args.no_calls:
        print(f"host microseconds per call (median of {ROUNDS} x {CALLS} calls, tiny arrays)")
        print(f"{'call':<34}{'nanobert':>10}{'cupy':>10}")
        for what, ours, theirs in building_blocks(cupy):
            print(f"{what:<34}{per_call_us(ours, cupy):>10.1f}"
                  + (f"{per_call_us(theirs, cupy):>10.1f}" if theirs else f"{'-':>10}"),
                  flush=True)
    if not args.no_profile:
        profile_steps(args)


if __name__ == "__main__":
    main()
