"""The packed self-attention (nanobert.model.packing) against the padded fast op, one layer.

    python -m bench.packed_attention               # MiniLM's layer: H 384, A 12, B 32, T 128
    python -m bench.packed_attention --repeats 30

A float32 layer of the given size, a batch whose row lengths are drawn uniformly from
[--min-length, T], the same weights and tokens for both: forward + backward (training,
attention dropout 0.1) and inference, packed and padded alternating in one process so that
a change in the machine's load hits both. Prints the median ms of each, the spread
(25th-75th percentile), the minimum and the ratio packed / padded. Threads:
$NANOBERT_THREADS (else the cores), as the model runs them.
"""
import argparse
import time

import numpy

from nanobert.backend import reuse_freed_memory
from nanobert.model import fast, ops, packing
from nanobert.model.threads import thread_count


def batch(args, rng):
    """-> (x [B, T, H], attention_mask [B, T], w_qkv, b_qkv, dcontext [B, T, H]), float32."""
    B, T, H = args.batch, args.seq_len, args.hidden
    lengths = rng.integers(args.min_length, T + 1, size=B)
    mask = (numpy.arange(T) < lengths[:, None]).astype(numpy.int64)
    x = rng.standard_normal((B, T, H)).astype(numpy.float32)
    w_qkv = (rng.standard_normal((3 * H, H)) / numpy.sqrt(H)).astype(numpy.float32)
    b_qkv = rng.standard_normal(3 * H).astype(numpy.float32)
    return x, mask, w_qkv, b_qkv, rng.standard_normal((B, T, H)).astype(numpy.float32)


def workloads(args):
    """name -> (packed, padded): callables for one run of each, on the same data."""
    x, mask, w_qkv, b_qkv, dcontext = batch(args, numpy.random.default_rng(0))
    pk = packing.packing_of(mask)
    bias = ops.attention_mask_bias(mask, numpy.float32)
    x_packed, dcontext_packed = packing.pack(x, pk), packing.pack(dcontext, pk)
    A, p = args.heads, 0.1

    def packed_training():
        rng = numpy.random.default_rng(1)
        _, cache = packing.self_attention_forward(x_packed, w_qkv, b_qkv, pk, A, p, rng, True)
        packing.self_attention_backward(dcontext_packed, cache)

    def padded_training():
        rng = numpy.random.default_rng(1)
        _, cache = fast.self_attention_forward(x, w_qkv, b_qkv, bias, A, p, rng, True)
        fast.self_attention_backward(dcontext, cache)

    return {
        "forward+backward": (packed_training, padded_training),
        "inference": (lambda: packing.self_attention_forward(x_packed, w_qkv, b_qkv, pk, A, 0.0,
                                                             None, False, cache=False),
                      lambda: fast.self_attention_forward(x, w_qkv, b_qkv, bias, A, 0.0, None,
                                                          False, cache=False)),
    }, int(mask.sum())


def milliseconds(run):
    start = time.perf_counter()
    run()
    return 1000 * (time.perf_counter() - start)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--min-length", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    reuse_freed_memory()
    runs, tokens = workloads(args)
    print(f"H {args.hidden}, A {args.heads}, B {args.batch}, T {args.seq_len}, lengths "
          f"{args.min_length}-{args.seq_len}: {tokens} of {args.batch * args.seq_len} tokens "
          f"attended; float32, {thread_count()} threads, {args.repeats} repeats")
    for name, (packed, padded) in runs.items():
        packed(), padded()                                  # warm up: pool, allocator
        times = {"packed": [], "padded": []}
        for _ in range(args.repeats):
            times["packed"].append(milliseconds(packed))
            times["padded"].append(milliseconds(padded))
        medians = {}
        for kind, ms in times.items():
            q25, medians[kind], q75 = numpy.percentile(ms, [25, 50, 75])
            print(f"{name:>16s} {kind}: {medians[kind]:7.2f} ms (25-75%: {q25:.2f}-{q75:.2f}, "
                  f"min {min(ms):.2f})")
        print(f"{name:>16s} packed / padded: {medians['packed'] / medians['padded']:.2f}")


if __name__ == "__main__":
    main()
