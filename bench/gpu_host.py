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
import os
import pstats
import statistics
import sys
import time

import numpy

import bench.train_step as train_step
from bench.gpu_profile import PRECISIONS, PRESETS, cupy_event_ms, make_config
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
             ("GELU (map kernel)", lambda: fast_gpu.gelu_forward(out), None),
             ("LayerNorm forward (row kernel)",
              lambda: fast_gpu.layernorm_forward(out, bias, bias, 1e-12), None),
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


def gpu_us(fn, reps=20):
    """Median GPU microseconds of fn()'s kernels between two events (bench.gpu_profile's
    cupy_event_ms), after a warm-up."""
    fn()
    return 1e3 * cupy_event_ms(fn, reps)


def show(label, fn, nbytes):
    """An experiment's line: the GPU microseconds of fn() and the bytes it reads and writes
    per second; a failure is printed, not raised (the next experiment still runs)."""
    try:
        us = gpu_us(fn)
        print(f"  {label:<58}{us:9.1f} us {nbytes / us / 1e3:8.0f} GB/s", flush=True)
    except Exception as e:
        print(f"  {label:<58} failed: {type(e).__name__}: {e}"[:300], flush=True)


def indexed_add_kernels(cupy):
    """out [N, H] += bias [H] by a 32-bit row index; scores [B, A, T, T] += mask [B, 1, 1, T]
    likewise (a parameter named T would be CuPy's type placeholder: keys)."""
    add_bias = cupy.ElementwiseKernel(
        "raw T bias, uint32 H", "T out",
        "out = out + bias[(unsigned int)i % H]", "nanobert_experiment_add_bias")
    add_mask = cupy.ElementwiseKernel(
        "raw T mask, uint32 keys, uint32 per_row", "T out",
        "out = out + mask[((unsigned int)i / per_row) * keys + (unsigned int)i % keys]",
        "nanobert_experiment_add_mask")
    return add_bias, add_mask


def vector_add_kernel(cupy, name):
    """c = a + b over 16-byte views (complex128 elements) of float32 or float16 arrays."""
    return cupy.ElementwiseKernel("complex128 a, complex128 b", "complex128 c",
                                  VECTOR_ADD[name], f"nanobert_experiment_add16_{name}",
                                  preamble="#include <cuda_fp16.h>")


def add_kernels(cupy, B=128, T=128, H=768, A=12):
    """GPU time of the step's adds, row means and row kernels at BERT-base B=128 sizes, each
    beside the alternatives (an experiment: the adds took 7.7 ms a step in float32 and in
    float16 alike on an H200, so they look bound by something other than bytes)."""
    from nanobert.model import counter_rng, fast_gpu
    add_bias, add_mask = indexed_add_kernels(cupy)
    print(f"\nGPU us per call, B={B} T={T} (median of 20 between events; GB/s: bytes read + "
          f"written over that time)")

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
                # the row kernels: read x, write xhat (float32) and out; read dout and xhat,
                # write dx and dout * xhat
                gamma, stats = cupy.ones(H, dtype), 4 * out.size
                forward = fast_gpu.layernorm_forward(out, gamma, gamma, 1e-12)
                show(f"{shape} LayerNorm forward (row kernel)", lambda: fast_gpu.layernorm_forward(
                    out, gamma, gamma, 1e-12), 2 * out.nbytes + stats)
                show(f"{shape} LayerNorm backward (row kernel + 2 column sums)",
                     lambda: fast_gpu.layernorm_backward(out, forward[1]),
                     3 * out.nbytes + 3 * stats)
        scores, mask = cupy.ones((B, A, T, T), dtype), cupy.ones((B, 1, 1, T), dtype)
        # reads the scores, writes probs and probs after dropout (the mask drawn in the kernel)
        show(f"{name} mask + softmax + dropout [B, A, T, T] (row kernel)",
             lambda: fast_gpu._softmax(scores, mask, 0.1, counter_rng.default_rng(cupy, 0)),
             3 * scores.nbytes)
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
            gpu = gpu_us(fn) / launches
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
    try:
        cublas_in_a_graph(cupy, stream)
    except Exception as e:                                 # an experiment: report, go on
        print(f"  cuBLAS through ctypes in a graph failed: {type(e).__name__}: {e}"[:400])


def cublas_in_a_graph(cupy, stream, repeats=20):
    """Whether cuBLAS itself, called through ctypes (not CuPy's wrapper, which refuses under
    capture), can be captured with elementwise kernels and replayed: `repeats` times
    (out = a @ w, then a = out * 0.5) captured, replayed, and compared with the same
    sequence run eagerly; host and GPU microseconds per replay."""
    import ctypes
    from nanobert.model import fast_gpu
    a0 = cupy.random.default_rng(0).standard_normal((64, 48), dtype=numpy.float32)
    w = cupy.random.default_rng(1).standard_normal((48, 48), dtype=numpy.float32) / 7
    out = cupy.empty((64, 48), numpy.float32)
    fast_gpu.gemm(a0, w, out)              # CuPy loads cuBLAS (ctypes then finds it loaded)
    lib = next((ctypes.CDLL(name) for name in ("libcublas.so.13", "libcublas.so.12",
                                               "libcublas.so") if _loads(name)), None)
    if lib is None:
        print("  cuBLAS through ctypes: no libcublas.so.13/.12 to load")
        return
    p, i, ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
    lib.cublasSetStream_v2.argtypes = [p, p]
    gemm = lib.cublasGemmStridedBatchedEx
    gemm.argtypes = [p, i, i, i, i, i, p, p, i, i, ll, p, i, i, ll, p, p, i, i, ll, i, i, i]
    one, zero = numpy.ones((), numpy.float32), numpy.zeros((), numpy.float32)
    handle = cupy.cuda.device.get_cublas_handle()
    a = a0.copy()

    def step():                            # row-major out = a @ w is out^T = w^T a^T
        status = lib.cublasSetStream_v2(handle, stream.ptr) or gemm(
            handle, 0, 0, 48, 64, 48, one.ctypes.data, w.data.ptr, 0, 48, 0, a.data.ptr, 0,
            48, 0, zero.ctypes.data, out.data.ptr, 0, 48, 0, 1, 68, -1)
        if status:
            raise RuntimeError(f"cuBLAS status {status}")
        cupy.multiply(out, 0.5, out=a)

    with stream:
        for _ in range(repeats):
            step()
        expected = a.copy()
        a[...] = a0
        stream.synchronize()
        stream.begin_capture()
        try:
            for _ in range(repeats):
                step()
        finally:
            graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
        same = bool((a == expected).all())
        start = time.perf_counter()
        for _ in range(20):
            graph.launch(stream)
        host = (time.perf_counter() - start) / 20 * 1e6
        stream.synchronize()
        gpu = gpu_us(lambda: graph.launch(stream))
    print(f"  cuBLAS through ctypes, {repeats} x (product + elementwise) in one graph: the "
          f"replay {'equals' if same else 'DIFFERS from'} the eager run; host {host:.1f} us, "
          f"GPU {gpu:.1f} us a replay ({2 * repeats} launches)")


def _loads(name):
    import ctypes
    try:
        ctypes.CDLL(name)
        return True
    except OSError:
        return False


# Adds over 16-byte elements: the arrays viewed as complex128 (CuPy's 16-byte type), each
# element's bytes read as 4 floats or 8 halves. Whether CuPy's elementwise kernels reach the
# memory's bandwidth when each thread moves 16 bytes instead of 2 or 4 (an experiment).
VECTOR_ADD = {
    "float32": """const float4 x = *reinterpret_cast<const float4*>(&a);
                  const float4 y = *reinterpret_cast<const float4*>(&b);
                  *reinterpret_cast<float4*>(&c) = make_float4(x.x + y.x, x.y + y.y,
                                                               x.z + y.z, x.w + y.w);""",
    "float16": """const __half2* x = reinterpret_cast<const __half2*>(&a);
                  const __half2* y = reinterpret_cast<const __half2*>(&b);
                  __half2* z = reinterpret_cast<__half2*>(&c);
                  for (int j = 0; j < 4; ++j) z[j] = __hadd2(x[j], y[j]);"""}


def vector_adds(cupy, shape=(16384, 3072)):
    """GPU time of a same-shape add c = a + b at B=128's FFN size: CuPy's ufunc (an element
    of 2 or 4 bytes a thread) against an ElementwiseKernel over 16-byte views, and the same
    one-element kernel in blocks of 128 (CuPy's default) to 1,024 threads."""
    print(f"\nGPU us per same-shape add c = a + b, {list(shape)} (median of 20 between "
          f"events; GB/s: bytes read + written)")
    for name in VECTOR_ADD:
        a, b, c = (cupy.ones(shape, name) for _ in range(3))
        wide = [x.reshape(-1).view(cupy.complex128) for x in (a, b, c)]
        kernel = vector_add_kernel(cupy, name)
        show(f"{name} CuPy's add", lambda: cupy.add(a, b, out=c), 3 * a.nbytes)
        show(f"{name} 16 bytes a thread", lambda: kernel(*wide), 3 * a.nbytes)
        if name == "float16":
            equal = bool((c == a + b).all())
            print(f"  float16 16-byte sums equal CuPy's: {equal}")
        plain = plain_add_kernel(cupy)
        for block in (128, 256, 512, 1024):       # CuPy's launch: one element a thread, 128
            show(f"{name} blocks of {block}", lambda: plain(a, b, c, block_size=block),
                 3 * a.nbytes)
    gelu_half(cupy, shape)


def plain_add_kernel(cupy):
    """c = a + b as an ElementwiseKernel, one element a thread (the block size is the call's
    block_size=)."""
    return cupy.ElementwiseKernel("T a, T b", "T c", "c = a + b", "nanobert_experiment_add")


GELU = "0.5f * v * (1.0f + erff(v * 0.7071067811865476f))"


def gelu_kernels(cupy):
    """GELU (erf) on float16: one element a thread (as CuPy's kernels, and the model's GELU
    before kernels.cu) and 8 a thread over 16-byte views."""
    narrow = cupy.ElementwiseKernel("float16 x", "float16 y", f"float v = x; y = {GELU};",
                                    "nanobert_experiment_gelu_half")
    wide = cupy.ElementwiseKernel(
        "complex128 x", "complex128 y",
        f"""const __half* in = reinterpret_cast<const __half*>(&x);
            __half* out = reinterpret_cast<__half*>(&y);
            for (int j = 0; j < 8; ++j) {{
                const float v = __half2float(in[j]);
                out[j] = __float2half({GELU});
            }}""", "nanobert_experiment_gelu_half16", preamble="#include <cuda_fp16.h>")
    return narrow, wide


def gelu_half(cupy, shape):
    """The question of vector_adds for a kernel with arithmetic in it (gelu_kernels)."""
    narrow, wide = gelu_kernels(cupy)
    x = cupy.random.default_rng(0).standard_normal(shape, dtype=numpy.float32).astype(
        numpy.float16)
    y_narrow, y_wide = cupy.empty_like(x), cupy.empty_like(x)
    show("float16 GELU, 1 element a thread", lambda: narrow(x, y_narrow), 2 * x.nbytes)
    show("float16 GELU, 8 elements a thread", lambda: wide(
        x.reshape(-1).view(cupy.complex128), y_wide.reshape(-1).view(cupy.complex128)),
        2 * x.nbytes)
    from nanobert.model import fast_gpu
    show("float16 GELU, the model's map kernel (also writes Phi, float32)",
         lambda: fast_gpu.gelu_forward(x), 4 * x.nbytes)
    try:
        print(f"  the two GELUs equal: {bool((y_narrow == y_wide).all())}")
    except Exception as e:
        print(f"  comparing the GELUs failed: {type(e).__name__}")


def vocab_products(cupy, hidden, batch_size, seq_len, V=30522):
    """GPU time of the MLM decoder at BERT's vocab (fast_gpu._output_rows, _split_wide):
    logits = x W^T + b, the cross-entropy forward and backward, and linear_backward into W's
    and b's buffers, at the bench's masked rows (bench.train_step.make_batch: 15% of
    seq_len, at most 20, a sequence), with the logits' rows padded (the default) and not
    (fast_gpu.WIDE raised past V), in float16 and TF32; and each product alone, the split
    head + tail against one misaligned call."""
    from nanobert.model import fast, fast_gpu
    M = batch_size * min(train_step.MAX_PREDICTIONS, max(1, round(seq_len * 0.15)))
    rng = cupy.random.default_rng(0)
    labels = rng.integers(0, V, M)
    print(f"\nGPU us of the MLM decoder, [{M}, {hidden}] -> V = {V} (median of 20 between "
          f"events; TFLOP/s: its products' 2 M V H a product)")
    wide, was_tf32 = fast_gpu.WIDE, backend.tf32_enabled()
    for precision in ("float16", "tf32"):
        name, tf32 = PRECISIONS[precision]
        backend.set_tf32(tf32)
        dtype = numpy.dtype(name)
        x = rng.standard_normal((M, hidden), dtype=numpy.float32).astype(dtype)
        w = (rng.standard_normal((V, hidden), dtype=numpy.float32) * 0.05).astype(dtype)
        b = cupy.zeros(V, dtype)
        grads = cupy.zeros((V, hidden), numpy.float32), cupy.zeros(V, numpy.float32)

        def decoder():
            logits, cache = fast.linear_forward(x, w, b)
            _, ce = fast.cross_entropy_forward(logits, labels, count=M)
            fast.linear_backward(fast.cross_entropy_backward(1.0, ce), cache, *grads)
        for padded in (True, False):
            fast_gpu.WIDE = wide if padded else V + 1
            logits = fast_gpu._output_rows(cupy, M, V, dtype)
            dlogits = fast_gpu._output_rows(cupy, M, V, dtype)
            dlogits.fill(0.01)
            dx = cupy.empty((M, hidden), dtype)
            dw = cupy.empty((V, hidden), dtype)
            label = f"{precision} {'padded rows' if padded else 'unpadded'}"
            for what, fn, flops in (
                    ("decoder forward + backward", decoder, 3),
                    ("logits = x W^T", lambda: fast_gpu.gemm(x, w, logits, transpose_b=True), 1),
                    ("dx = dlogits W", lambda: fast_gpu.gemm(dlogits, w, dx), 1),
                    ("dW = dlogits^T x",
                     lambda: fast_gpu.gemm(dlogits, x, dw, transpose_a=True), 1)):
                try:
                    us = gpu_us(fn)
                    print(f"  {label + ', ' + what:<58}{us:9.1f} us "
                          f"{flops * 2 * M * V * hidden / us / 1e6:8.0f} TFLOP/s", flush=True)
                except Exception as e:                     # an experiment: report, go on
                    print(f"  {label + ', ' + what:<58} failed: {type(e).__name__}: {e}"[:300])
    fast_gpu.WIDE = wide
    backend.set_tf32(was_tf32)


def profile_steps(args):
    """cProfile of the host issuing args.steps nanobert steps -> the printed statistics."""
    dtype, tf32 = PRECISIONS[args.precision]
    backend.set_tf32(tf32)
    config = make_config(args.preset, args.seq_len)
    batch = train_step.make_batch(config, args.batch_size, args.seq_len)
    cupy = backend.get_xp("gpu")
    if args.no_cuda_graph:
        os.environ["NANOBERT_CUDA_GRAPH"] = "0"        # read by the step's constructor
    step, _ = train_step.nanobert_step_fn(config, batch, device="gpu", dtype=dtype)
    for _ in range(2):                                 # the warm-up, then the capture
        step()
    cupy.cuda.Device().synchronize()
    what = f"{args.preset} B={args.batch_size} T={args.seq_len} {args.precision}, " \
        f"the step: {step.graph.mode}"            # graph, eager or capture failed: why
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
    parser.add_argument("--vector", action="store_true",
                        help="also time adds that move 16 bytes a thread (an experiment)")
    parser.add_argument("--graph", action="store_true",
                        help="also time a CUDA graph's replay against eager launches")
    parser.add_argument("--vocab", action="store_true",
                        help="also time the MLM decoder's products with the vocab's rows "
                             "padded and not (an experiment)")
    parser.add_argument("--no-calls", action="store_true", help="skip the per-call costs")
    parser.add_argument("--no-profile", action="store_true", help="skip the step's profile")
    parser.add_argument("--no-cuda-graph", action="store_true",
                        help="profile the step issued kernel by kernel (default: as train.py "
                             "runs it, replayed from a CUDA graph)")
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
    if args.vector:
        vector_adds(cupy)
    if args.vocab:
        vocab_products(cupy, PRESETS[args.preset][1], args.batch_size, args.seq_len)
    if args.graph:
        try:
            graph_replay(cupy)
        except Exception as e:                             # an experiment: report, go on
            print(f"graph experiment failed: {type(e).__name__}: {e}")
    if not args.no_profile:
        profile_steps(args)


if __name__ == "__main__":
    main()
