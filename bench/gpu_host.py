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
With --busy-ms, a spin kernel keeps the GPU busy that long before each step: a host that never
waits issues the step in its usual time, and a call that waits shows that wait as its tottime.
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


def per_call_us(fn, cupy, calls=CALLS):
    """Median host microseconds per fn() call over ROUNDS rounds of `calls` calls."""
    fn()
    cupy.cuda.Device().synchronize()
    rounds = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - start) / calls * 1e6)
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
    square_twice = cupy.ElementwiseKernel("T x", "T y, T z", "y = x * x; z = x + x",
                                          "nanobert_experiment_two_outputs")
    fused = cupy.fuse(kernel_name="nanobert_experiment_fused")(lambda v: (v * v, v + v))
    rows += [("2 outputs: ElementwiseKernel | fuse", lambda: square_twice(out),
              lambda: fused(out)),
             ("bias add out += bias", lambda: out.__iadd__(bias), None),
             ("cupy.empty [64, 48]", lambda: cupy.empty((64, 48), f32), None),
             ("GELU (fused kernel)", lambda: fast_gpu.gelu_forward(out), None),
             ("row mean, keepdims", lambda: out.mean(axis=-1, keepdims=True), None),
             ("reshape view", lambda: out.reshape(-1, 16), None)]
    del kernels
    return rows


# One thread that reads the GPU's nanosecond clock until `ns` have passed: the GPU stays busy
# while the host issues what follows.
SPIN = r"""
extern "C" __global__ void nanobert_spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
}"""


def keep_busy(cupy, ms):
    cupy.RawKernel(SPIN, "nanobert_spin")((1,), (1,), (numpy.uint64(ms * 1e6),))


def issue_ms(step, cupy, busy_ms, steps):
    """Median host milliseconds to issue step(), the GPU idle or (busy_ms) busy before it."""
    times = []
    for _ in range(steps):
        cupy.cuda.Device().synchronize()
        if busy_ms:
            keep_busy(cupy, busy_ms)
        start = time.perf_counter()
        step()
        times.append(1e3 * (time.perf_counter() - start))
    cupy.cuda.Device().synchronize()
    return statistics.median(times)


def gpu_us(fn, cupy, reps=20):
    """Median GPU microseconds of fn()'s kernels between two events, after a warm-up."""
    fn()
    times = []
    for _ in range(reps):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(1e3 * cupy.cuda.get_elapsed_time(start, end))
    return statistics.median(times)


def add_kernels(cupy, B=128, T=128, H=768, A=12):
    """GPU time of the step's adds and row means at BERT-base B=128 sizes, each beside the
    alternatives (an experiment: the adds took 7.7 ms a step in float32 and in float16 alike
    on an H200, so they look bound by something other than bytes)."""
    from nanobert.model import fast_gpu
    add_bias = cupy.ElementwiseKernel(
        "raw T bias, uint32 H", "T out",
        "out = out + bias[(unsigned int)i % H]", "nanobert_experiment_add_bias")
    add_mask = cupy.ElementwiseKernel(       # scores [B, A, T, T] += mask [B, 1, 1, T]
        "raw T mask, uint32 T, uint32 ATT", "T out",
        "out = out + mask[((unsigned int)i / ATT) * T + (unsigned int)i % T]",
        "nanobert_experiment_add_mask")
    print(f"\nGPU us per call, B={B} T={T} (median of 20 between events; GB/s: bytes read + "
          f"written over that time)")

    def show(label, fn, moved):
        try:
            us = gpu_us(fn, cupy)
            print(f"  {label:<58}{us:9.1f} us {moved / us / 1e3:8.0f} GB/s", flush=True)
        except Exception as e:                             # an experiment: report, go on
            print(f"  {label:<58} failed: {type(e).__name__}: {e}"[:300], flush=True)

    for dtype in (numpy.float32, numpy.float16):
        name = numpy.dtype(dtype).name
        for width in (H, 4 * H):
            out = cupy.ones((B * T, width), dtype)
            bias, other = cupy.ones(width, dtype), cupy.ones((B * T, width), dtype)
            ones = fast_gpu._ones(cupy, out.dtype, B * T, column=True)
            shape = f"{name} [{B * T}, {width}]"
            show(f"{shape} out += bias (CuPy)", lambda: out.__iadd__(bias), 2 * out.nbytes)
            show(f"{shape} bias by a 32-bit row index", lambda: add_bias(
                bias, numpy.uint32(width), out.reshape(-1)), 2 * out.nbytes)
            show(f"{shape} bias as a rank-1 product (cuBLAS)", lambda: fast_gpu.gemm(
                ones, bias[None, :], out, exact=True, accumulate=True), 2 * out.nbytes)
            show(f"{shape} out += same shape (CuPy)", lambda: out.__iadd__(other),
                 3 * out.nbytes)
            show(f"{shape} column sum (cuBLAS)", lambda: fast_gpu.column_sum(
                out, dtype=numpy.float32), out.nbytes)
            if width == H:
                show(f"{shape} row mean (CuPy)", lambda: out.mean(
                    axis=-1, keepdims=True, dtype=numpy.float32), out.nbytes)
                show(f"{shape} row mean (cuBLAS)", lambda: fast_gpu.row_mean(
                    out, dtype=numpy.float32), out.nbytes)
        scores, mask = cupy.ones((B, A, T, T), dtype), cupy.ones((B, 1, 1, T), dtype)
        show(f"{name} scores += mask [B, A, T, T] (CuPy)", lambda: scores.__iadd__(mask),
             2 * scores.nbytes)
        show(f"{name} mask by a 32-bit index", lambda: add_mask(
            mask, numpy.uint32(T), numpy.uint32(A * T * T), scores.reshape(-1)),
            2 * scores.nbytes)


def graph_replay(cupy, launches=100):
    """An experiment for issue 32's 'capture the elementwise runs as a CUDA graph': host and
    GPU microseconds per launch of `launches` in-place elementwise kernels issued one by one
    against the same kernels replayed from a captured graph; then whether a cuBLAS call
    (fast_gpu.gemm) can be captured at all (CuPy's cuBLAS wrappers refuse)."""
    from nanobert.model import fast_gpu
    x = cupy.ones((64, 48), numpy.float32)
    w = cupy.ones((48, 48), numpy.float32)

    def chain():
        for _ in range(launches):
            cupy.multiply(x, 1.0, out=x)

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        chain()
        stream.synchronize()
        stream.begin_capture()
        chain()
        graph = stream.end_capture()
        print(f"\nCUDA graph of {launches} elementwise launches (in place, [64, 48] float32), "
              "per launch:")
        for what, fn in (("issued one by one", chain), ("replayed from the graph",
                                                         lambda: graph.launch(stream))):
            fn()
            stream.synchronize()
            start = time.perf_counter()
            for _ in range(20):
                fn()
            host = (time.perf_counter() - start) / 20 / launches * 1e6
            stream.synchronize()
            gpu = gpu_us(fn, cupy) / launches
            print(f"  {what:<26} host {host:6.2f} us   GPU {gpu:6.2f} us", flush=True)
        stream.begin_capture()
        try:
            fast_gpu.gemm(x, w, cupy.empty((64, 48), numpy.float32))
            print("  a cuBLAS call (fast_gpu.gemm) captured: no error")
        except Exception as e:
            print(f"  a cuBLAS call (fast_gpu.gemm) under capture: {type(e).__name__}: {e}")
        finally:
            try:
                stream.end_capture()
            except Exception as e:                         # the capture was invalidated
                print(f"  ending that capture: {type(e).__name__}")


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
    what = f"{args.preset} B={args.batch_size} T={args.seq_len} {args.precision}"
    if args.busy_ms:
        keep_busy(cupy, 1)
        idle, busy = (issue_ms(step, cupy, ms, args.steps) for ms in (0, args.busy_ms))
        print(f"\nhost ms to issue a step, {what}: {idle:.1f} with the GPU idle, {busy:.1f} "
              f"with it busy for {args.busy_ms} ms first ("
              + ("the host waits inside the step)" if busy > idle + 0.5 * args.busy_ms
                 else "no wait)"))
    profiler = cProfile.Profile()
    issued = 0.0
    for _ in range(args.steps):
        cupy.cuda.Device().synchronize()
        if args.busy_ms:
            keep_busy(cupy, args.busy_ms)
        start = time.perf_counter()
        profiler.enable()
        step()
        profiler.disable()
        issued += time.perf_counter() - start
    cupy.cuda.Device().synchronize()
    print(f"\nhost profile: {what}, {args.steps} steps, {1e3 * issued / args.steps:.1f} ms a "
          f"step to issue under the profiler (it slows Python calls)"
          + (f", the GPU busy for {args.busy_ms} ms before each" if args.busy_ms else ""))
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
    parser.add_argument("--calls", type=int, default=CALLS,
                        help=f"calls per round of the per-call costs (default {CALLS})")
    parser.add_argument("--busy-ms", type=float, default=0,
                        help="keep the GPU busy this long before each step (finds host waits)")
    parser.add_argument("--adds", action="store_true",
                        help="also time the step's adds on the GPU (an experiment)")
    parser.add_argument("--graph", action="store_true",
                        help="also time a CUDA graph's replay against eager launches")
    parser.add_argument("--no-calls", action="store_true", help="skip the per-call costs")
    parser.add_argument("--no-profile", action="store_true", help="skip the step's profile")
    args = parser.parse_args(argv)
    if not backend.gpu_available():
        sys.exit("bench.gpu_host: no GPU here (CuPy cannot see a CUDA device)")
    cupy = backend.get_xp("gpu")
    if not args.no_calls:
        print(f"host microseconds per call (median of {ROUNDS} x {args.calls} calls, tiny "
              f"arrays)")
        print(f"{'call':<34}{'nanobert':>10}{'cupy':>10}")
        for what, ours, theirs in building_blocks(cupy):
            print(f"{what:<34}{per_call_us(ours, cupy, args.calls):>10.1f}"
                  + (f"{per_call_us(theirs, cupy, args.calls):>10.1f}" if theirs
                     else f"{'-':>10}"), flush=True)
    if args.adds:
        add_kernels(cupy)
    if args.graph:
        try:
            graph_replay(cupy)
        except Exception as e:                             # an experiment: report, go on
            print(f"graph experiment failed: {type(e).__name__}: {e}")
    if not args.no_profile:
        profile_steps(args)


if __name__ == "__main__":
    main()
