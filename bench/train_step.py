"""Benchmark: one full pretraining step (forward, backward, clipping, AdamW update) of
nanobert and of transformers' BertForPreTraining on torch, same config, batch and thread
count, in one run. Prints median step times and their ratio, the forward+backward time alone
with nanobert's GFLOP/s as a % of NumPy's own large-matmul rate, and each framework's peak
memory (RSS of its own subprocess).

    python -m bench.train_step                      # mini and base, float32, CPU
    python -m bench.train_step --configs mini --steps 10
    python -m bench.train_step --device gpu         # CuPy, TF32 on; --no-tf32, --dtype float16

torch and transformers are needed for the comparison (pip install -e ".[reference]");
without them only nanobert is timed. On the GPU torch runs on CUDA when it has CUDA (same
TF32 setting), else nanobert is timed alone; MFU is against the dense peak of the
precision the matmuls use (nanobert.model.flops.GPU_PEAK_TFLOPS).

`python -m bench.speed` runs the four CPU workloads a user runs (pretraining, MiniLM
fine-tuning and inference) with the step functions defined here.
"""
import argparse
import importlib.util
import os
import resource
import statistics
import subprocess
import sys
import time
import types

import numpy

from nanobert import AdamW, BertConfig, BertForPreTraining
from nanobert import backend
from nanobert.model.flops import gpu_peak_tflops, step_flops
from nanobert.model.optim import LossScaler, clip_and_step
from nanobert.model.ops import IGNORE_INDEX

CONFIGS = {   # name: (layers, hidden, heads, seq_len, batch)
    "mini": (4, 256, 4, 128, 32),
    "base": (12, 768, 12, 128, 8),
    "tiny": (2, 64, 2, 32, 4),      # for smoke tests of the benchmark commands
}
MAX_PREDICTIONS = 20


def make_config(name):
    L, H, A, T, B = CONFIGS[name]
    config = BertConfig(vocab_size=30522, hidden_size=H, num_hidden_layers=L, num_attention_heads=A,
                        intermediate_size=4 * H, max_position_embeddings=512)
    return config, B, T


def make_batch(config, B, T, seed=0):
    """Random ids; 15% of positions (at most 20 per sequence, never [CLS]) carry an MLM label."""
    rng = numpy.random.default_rng(seed)
    ids = rng.integers(5, config.vocab_size, size=(B, T))
    labels = numpy.full((B, T), IGNORE_INDEX)
    n = min(MAX_PREDICTIONS, max(1, round(T * 0.15)))
    for b in range(B):
        positions = rng.choice(numpy.arange(1, T), size=n, replace=False)
        labels[b, positions] = ids[b, positions]
    types = numpy.zeros((B, T), dtype=numpy.int64)
    types[:, T // 2:] = 1
    return {"input_ids": ids, "token_type_ids": types,
            "attention_mask": numpy.ones((B, T), dtype=numpy.int64),
            "labels": labels, "next_sentence_label": rng.integers(0, 2, size=B)}


def step_times(step, steps, warmup=1, synchronize=lambda: None):
    """Wall time of each of `steps` calls of `step` after `warmup` untimed ones; synchronize()
    waits for the GPU before each clock read (the steps themselves never wait)."""
    for _ in range(warmup):
        step()
    synchronize()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        synchronize()
        times.append(time.perf_counter() - start)
    return times


def time_steps(step, steps, warmup=1, synchronize=lambda: None):
    """Median wall time of `step` (see step_times)."""
    return statistics.median(step_times(step, steps, warmup, synchronize))


def nanobert_phases(model, batch, on_device=False, scaler=None, lr=1e-4):
    """A nanobert training step in its two halves: -> (forward_backward() -> grads,
    update(grads): unscale, clip to norm 1.0, AdamW, as optim.clip_and_step takes them: on
    the GPU folded into the AdamW kernel). float16 runs with the loss scaler `scaler`, as a
    training loop would; on_device keeps the loss on the GPU."""
    optimizer = AdamW(model.params, lr=lr, mode="torch")

    def forward_backward():
        scale = None if scaler is None else scaler.scale
        return model.loss_and_grads(batch, on_device=on_device, loss_scale=scale)[1]

    def update(grads):
        clip_and_step(optimizer, grads, scaler=scaler, max_norm=1.0, mode="torch")
    return forward_backward, update


def nanobert_step_fn(config, batch, seed=0, device="cpu", dtype="float32"):
    """-> (full step, forward + backward only) of a fresh BertForPreTraining. On the GPU the
    full step is train.py's (training/pretraining.py's GPUStep): replayed from a CUDA graph,
    or issued kernel by kernel where $NANOBERT_CUDA_GRAPH is 0."""
    model = BertForPreTraining(config, seed=seed, dtype=numpy.dtype(dtype), device=device).train()
    scaler = LossScaler(model.xp) if dtype == "float16" else None
    forward_backward, update = nanobert_phases(model, batch, device == "gpu", scaler)
    if device == "gpu":
        return gpu_step_fn(model, batch, scaler), forward_backward
    return lambda: update(forward_backward()), forward_backward


def gpu_step_fn(model, batch, scaler, lr=1e-4):
    """The training harness's GPU step on `batch` (torch's AdamW flavour, as torch_phases)."""
    from nanobert.training.pretraining import GPUStep
    from nanobert.training.run import cuda_graph_enabled
    labelled = batch["labels"] != IGNORE_INDEX
    args = types.SimpleNamespace(grad_accum=1, optimizer="torch", no_nsp=False, no_cuda_graph=False,
                                 max_predictions_per_seq=int(labelled.sum(1).max()))
    step = GPUStep(args, types.SimpleNamespace(world_size=1), model,
                   AdamW(model.params, lr=lr, mode="torch"), scaler,
                   cuda_graph=cuda_graph_enabled(args))
    denominators = {"masked_lm": int(labelled.sum()), "next_sentence": len(labelled)}

    def run():
        return step([batch], denominators, lr)
    run.graph = step.step.graph            # its mode: graph, eager or capture failed
    return run


def torch_phases(model, tensors, autocast=None, lr=1e-4):
    """The same two halves for a transformers model in train mode: -> (forward_backward(),
    update(_): clip to norm 1.0, AdamW). `tensors` holds the inputs and the labels."""
    import contextlib
    import torch
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    autocast = autocast or contextlib.nullcontext()

    def forward_backward():
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = model(**tensors).loss
        loss.backward()

    def update(_):
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    return forward_backward, update


def torch_config(config):
    """transformers' BertConfig with the fields of nanobert's."""
    import transformers
    return transformers.BertConfig(**{k: v for k, v in config.to_dict().items() if k != "extra"})


def torch_step_fn(config, batch, device="cpu", dtype="float32", compile=False):
    """-> (full step, forward + backward only) of a fresh transformers BertForPreTraining;
    compile: the model under torch.compile's default mode (as nanoGPT's train.py does; it
    compiles at the first call)."""
    import torch
    import transformers
    target = "cuda" if device == "gpu" else "cpu"
    model = transformers.BertForPreTraining(torch_config(config)).train().to(target)
    if compile:
        model = torch.compile(model)
    tensors = {k: torch.from_numpy(v).to(target) for k, v in batch.items()}
    autocast = torch.autocast("cuda", dtype=torch.float16, enabled=dtype == "float16")
    forward_backward, update = torch_phases(model, tensors, autocast)
    return lambda: update(forward_backward()), forward_backward


def numpy_matmul_gflops(n=2048, repeats=5):
    a = numpy.random.default_rng(0).standard_normal((n, n), dtype=numpy.float32)
    b = a.T.copy()
    seconds = time_steps(lambda: a @ b, repeats)
    return 2 * n ** 3 / seconds / 1e9


def measure(framework, name, steps, device="cpu", dtype="float32"):
    """-> (median step s, median forward + backward s, peak memory MiB: RSS on the CPU,
    the device memory pool on the GPU) of one framework on one config, in this process."""
    config, B, T = make_config(name)
    batch = make_batch(config, B, T)
    synchronize = lambda: None   # noqa: E731
    if framework == "torch":
        import torch
        torch.set_num_threads(os.cpu_count())
        torch.backends.cuda.matmul.allow_tf32 = backend.tf32_enabled()
        step, forward_backward = torch_step_fn(config, batch, device, dtype)
        if device == "gpu":
            synchronize = torch.cuda.synchronize
    else:
        step, forward_backward = nanobert_step_fn(config, batch, device=device, dtype=dtype)
        if device == "gpu":
            import cupy
            synchronize = cupy.cuda.Device().synchronize
    seconds = (time_steps(step, steps, synchronize=synchronize),
               time_steps(forward_backward, steps, synchronize=synchronize))
    if device == "gpu" and framework == "torch":
        import torch
        return (*seconds, torch.cuda.max_memory_allocated() / 2 ** 20)
    if device == "gpu":
        import cupy
        from nanobert.training.graph import memory_pools     # the graphs' pools too
        return (*seconds, sum(p.total_bytes() for p in memory_pools(cupy)) / 2 ** 20)
    return (*seconds, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)   # KiB on Linux


def measure_in_subprocess(framework, name, steps, device="cpu", dtype="float32"):
    """Each measurement in a fresh process: torch's OpenMP pool and OpenBLAS's threads never
    share the cores at once, and neither inherits the other's memory."""
    result = subprocess.run([sys.executable, "-m", "bench.train_step", "--worker", framework, name,
                             "--steps", str(steps), "--device", device, "--dtype", dtype],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{framework} {name} benchmark failed:\n{result.stderr}")
    return [float(x) for x in result.stdout.strip().splitlines()[-1].split()]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="mini,base",
                        help="comma-separated: " + ", ".join(CONFIGS))
    parser.add_argument("--steps", type=int, default=5,
                        help="timed steps per framework (median reported)")
    parser.add_argument("--no-torch", action="store_true", help="time nanobert only")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--dtype", choices=("float32", "float16"), default="float32",
                        help="float16: mixed precision with loss scaling (GPU; torch autocast)")
    parser.add_argument("--no-tf32", action="store_true",
                        help="GPU: plain float32 matmuls (TF32 is on by default)")
    parser.add_argument("--worker", nargs=2, metavar=("FRAMEWORK", "CONFIG"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.no_tf32:
        backend.set_tf32(False)       # the environment carries it to the workers
    if args.worker:
        backend.reuse_freed_memory()   # as train.py does; for torch too, so the ratio is fair
        print(*measure(*args.worker, args.steps, args.device, args.dtype))
        return
    if args.device == "gpu":
        try:
            backend.require_gpu()       # one line before any work where the GPU cannot run
        except ValueError as e:
            sys.exit(f"bench.train_step: {e}")

    have_torch = not args.no_torch and importlib.util.find_spec("torch") is not None \
        and importlib.util.find_spec("transformers") is not None
    if have_torch and args.device == "gpu":
        import torch
        have_torch = torch.cuda.is_available()
        if not have_torch:
            print("torch has no CUDA here: timing nanobert alone on the GPU")
    elif not have_torch and not args.no_torch:
        print("torch/transformers not installed: timing nanobert only")
    if args.device == "gpu":
        xp = backend.get_xp("gpu")    # a clear error without a GPU
        name = xp.cuda.runtime.getDeviceProperties(0)["name"].decode()
        precision = backend.matmul_precision(args.dtype, "gpu")
        peak_tflops = gpu_peak_tflops(name, precision)
        print(f"{name}   cupy {xp.__version__}   matmuls in {precision}   dense peak "
              f"{peak_tflops or 'unknown'} TFLOP/s (the % column is MFU against it)")
        peak = (peak_tflops or float("nan")) * 1e3
    else:
        peak = numpy_matmul_gflops()
        print(f"threads: {os.cpu_count()}   numpy {numpy.__version__}   "
              f"float32 2048^3 matmul: {peak:.1f} GFLOP/s")
    print(f"{'':18}{'full step (s)':^28}{'forward+backward':^33}{'peak RSS (MiB)':^16}")
    print(f"{'config':<8}{'B x T':>10}{'nanobert':>10}{'torch':>9}{'ratio':>9}"
          f"{'nanobert':>10}{'torch':>9}{'% of matmul':>14}{'nanobert':>9}{'torch':>7}")
    nan = (float("nan"),) * 3
    for name in args.configs.split(","):
        config, B, T = make_config(name)
        batch = make_batch(config, B, T)
        flops = step_flops(config, B, T, int((batch["labels"] != IGNORE_INDEX).sum()))
        ours = measure_in_subprocess("nanobert", name, args.steps, args.device, args.dtype)
        theirs = measure_in_subprocess("torch", name, args.steps, args.device,
                                       args.dtype) if have_torch else nan
        matmul_share = 100 * flops / ours[1] / 1e9 / peak   # the step's matmul FLOPs only
        print(f"{name:<8}{f'{B} x {T}':>10}{ours[0]:>10.3f}{theirs[0]:>9.3f}"
              f"{ours[0] / theirs[0]:>9.2f}{ours[1]:>10.3f}{theirs[1]:>9.3f}{matmul_share:>13.0f}%"
              f"{ours[2]:>9.0f}{theirs[2]:>7.0f}", flush=True)
    print(f"median times; full step = forward + backward + clip + AdamW; {args.dtype}, dropout on;")
    print("ratio = nanobert / torch (below 1: nanobert is faster); % of matmul = nanobert's")
    if args.device == "gpu":
        print("forward+backward matmul FLOPs per second over the GPU's dense peak (MFU)")
    else:
        print("forward+backward matmul FLOPs per second over NumPy's 2048^3 matmul rate")


if __name__ == "__main__":
    main()
