"""GPU profile of a BERT pretraining step: nanobert's CuPy path and, where torch has CUDA,
transformers' BertForPreTraining on the same work (bench/train_step.py's step functions:
forward, backward, clip to 1.0, AdamW), for each case and precision asked for; and
`python train.py --device gpu` itself, its throughput read from its progress line.

    python -m bench.gpu_profile                  # the default cases (below), tf32 and float16
    python -m bench.gpu_profile --cases base:32x512,mini:128x128 --precisions float16
    python -m bench.gpu_profile --batch-sizes 32 --precisions tf32 --steps 5   # base, T=128
    python -m bench.gpu_profile --cases train.py,train.py:mini --no-parity

A case is PRESET:BxT (a model of PRESETS, batch B, length T) or train.py[:PRESET] (the
command line at its defaults, or with --preset PRESET; it runs --train-py-steps steps, and
--train-py-args adds flags). The default cases are the targets of the GPU issues: BERT-base
T=128 at B=32 and 128, BERT-mini B=128 T=128, the nano default of train.py, BERT-base T=512
B=32 (26 runs with torch and torch.compile; minutes: an estimate, unmeasured). --batch-sizes
/ --preset / --seq-len
instead give one preset and length at several batch sizes. The environment goes to every
run (NANOBERT_TF32=0, ...) and is recorded.

Frameworks: nanobert, torch eager and torch.compile (its default mode; its first step, which
compiles, is timed apart as first_step_s and left out; a model it cannot compile is recorded
as skipped with the reason); the step cases of a framework and a precision in one fresh
process (the imports, CUDA's start and NVRTC's compilation paid once; the model, its graphs
and their memory released between cases). Per step case: how the step
ran (step_mode: nanobert's "graph", "eager" or "capture failed: <reason>", never a graph's
figure for an eager step), wall time per step (median, the host waiting for the GPU after
each step), the host's time to issue it, tokens per second (B x T / wall) and peak GPU
memory (nanobert: what all its pools hold, CuPy's default pool and each CUDA graph's private
pool, sampled after every step, the largest; torch: torch.cuda.max_memory_allocated, and
max_memory_reserved, the figure like CuPy's pools); GPU kernel time per step by CUPTI
(torch.profiler, which sees CuPy's kernels in the same process; without torch, CuPy events
around the step: total only); kernels per step counted apart from memcpy / memset and from
the runtime and driver calls that launched them; the split matmul / elementwise /
reduction / copy; the largest kernels. Per train.py case: the tokens/s and MFU of its last
progress line (the first window includes NVRTC's compilation). Then the float64 parity
line: loss and worst gradient of a small model on the GPU against the NumPy path. Prints a
table, writes JSON (every figure of the table, the ratios to both torch columns included).
"""
import argparse
import datetime
import importlib.util
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

import numpy

import bench.train_step as train_step
from nanobert import backend
from nanobert.model.config import BertConfig
from nanobert.model.flops import gpu_peak_tflops, step_flops
from nanobert.model.ops import IGNORE_INDEX

PRESETS = {"large": (24, 1024, 16), "base": (12, 768, 12), "mini": (4, 256, 4),
           "tiny": (2, 64, 2)}                      # layers, hidden, heads
PRECISIONS = {"tf32": ("float32", True), "float32": ("float32", False),
              "float16": ("float16", True)}       # name -> (dtype, TF32 for float32 matmuls)
KINDS = ("matmul", "elementwise", "reduction", "copy")
SHORT = {"matmul": "matmul", "elementwise": "eltwise", "reduction": "reduce", "copy": "copy"}
TOP = 16                                            # largest kernels kept per run
GIB = 2 ** 30
FRAMEWORKS = ("nanobert", "torch", "torch.compile")


class Case(NamedTuple):
    """One entry of the run list: a training step of `preset` at batch B and length T
    (bench/train_step's step functions), or train.py run as a user runs it (its own batch
    and length: batch_size and seq_len None)."""
    command: str                   # "step" or "train.py"
    preset: str
    batch_size: int = None
    seq_len: int = None

    def __str__(self):
        if self.command == "train.py":
            return "train.py" + ("" if self.preset == "nano" else f":{self.preset}")
        return f"{self.preset}:{self.batch_size}x{self.seq_len}"


# The GPU issues' targets, most telling first (a run cut short by its time limit keeps these)
DEFAULT_CASES = "base:32x128,base:128x128,mini:128x128,train.py,base:32x512"


def parse_case(text):
    """"PRESET:BxT" or "train.py[:PRESET]" -> a Case."""
    name, _, rest = text.partition(":")
    if name == "train.py" and (not rest or rest.isidentifier()):
        return Case("train.py", rest or "nano")         # train.py refuses an unknown preset
    shape = re.fullmatch(r"([1-9]\d*)x([1-9]\d*)", rest)
    if name not in PRESETS or not shape:
        raise argparse.ArgumentTypeError(
            f"case {text!r}: expected PRESET:BxT (PRESET one of {', '.join(PRESETS)}; B and T "
            f"positive, e.g. base:32x128) or train.py[:PRESET]")
    return Case("step", name, int(shape[1]), int(shape[2]))


def kernel_kind(name):
    """A GPU kernel's name -> matmul / copy / reduction / elementwise. cuBLAS and CUTLASS
    kernels (gemm, xmma, cutlass, sm80_/sm90_ tiles) are matmuls; CuPy's cupy_copy__* (casts
    and contiguous copies) copies; CuPy's and CUB's sums, means, max and the project's row
    sums reductions; every other kernel elementwise (ufuncs, fused and custom kernels, and
    the row kernels, nanobert_layernorm_* and nanobert_softmax_*: a row's reduction and its
    map in one kernel, counted with the maps)."""
    n = name.lower()
    if any(k in n for k in ("gemm", "xmma", "cutlass", "cublas", "gemv", "sm80_", "sm90_")):
        return "matmul"
    if "copy" in n or "memcpy" in n or "memset" in n:
        return "copy"
    if any(k in n for k in ("reduce", "sum", "mean", "cupy_max", "cupy_min", "argmax",
                            "argmin")):
        return "reduction"
    return "elementwise"


# kineto's activity types (torch.profiler's FunctionEvent.activity_type) -> what they count
ACTIVITIES = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset",
              "cuda_runtime": "runtime", "cuda_driver": "runtime"}


def event_type(name, on_device, activity=None):
    """A profiler event -> kernel / memcpy / memset (on the device), runtime (a CUDA runtime
    or driver call on the host: cudaLaunchKernel, cuLaunchKernel, cudaMemcpyAsync) or None
    (anything else: annotations, syncs, overhead). By kineto's activity type where torch
    gives it, else by the device the event ran on and its name."""
    if activity is not None:
        return ACTIVITIES.get(activity)
    if not on_device:
        return "runtime" if name.startswith("cu") else None
    if name.startswith("Memcpy"):
        return "memcpy"
    if name.startswith("Memset"):
        return "memset"
    return "kernel"


def summarize(events, steps):
    """events: (name, on_device, activity type or None, microseconds) of `steps` profiled
    steps -> per step: GPU time (kernels, memcpys and memsets), kernels, memcpys, memsets,
    runtime calls, time and count by kind, the largest kernels."""
    per = {"kernel": 0, "memcpy": 0, "memset": 0, "runtime": 0}
    kinds = {k: [0.0, 0] for k in KINDS}
    kernels = {}
    gpu_us = 0.0
    for name, on_device, activity, us in events:
        what = event_type(name, on_device, activity)
        if what is None:
            continue
        per[what] += 1
        if what == "runtime":
            continue
        gpu_us += us
        kind = kernel_kind(name) if what == "kernel" else "copy"
        kinds[kind][0] += us
        kinds[kind][1] += 1
        if what == "kernel":
            total, count = kernels.get(name, (0.0, 0))
            kernels[name] = (total + us, count + 1)
    top = sorted(kernels.items(), key=lambda item: -item[1][0])[:TOP]
    return {"gpu_ms": gpu_us / steps / 1e3, "kernels": per["kernel"] / steps,
            "memcpys": per["memcpy"] / steps, "memsets": per["memset"] / steps,
            "runtime_calls": per["runtime"] / steps,
            "by_kind": {k: {"ms": ms / steps / 1e3, "count": n / steps}
                        for k, (ms, n) in kinds.items()},
            "largest": [{"name": name, "ms": ms / steps / 1e3, "calls": n / steps}
                        for name, (ms, n) in top]}


def profiler_events(profile):
    """torch.profiler's events -> (name, on_device, activity type, microseconds). Kernels,
    memcpys and memsets are CUDA-device events (CUPTI's activity records, timed on the GPU);
    the runtime and driver calls that issued them are CPU-side events of the same profile."""
    from torch.autograd import DeviceType
    return [(e.name, e.device_type == DeviceType.CUDA, getattr(e, "activity_type", None),
             e.time_range.elapsed_us()) for e in profile.events()]


def has_torch_cuda():
    if importlib.util.find_spec("torch") is None or \
            importlib.util.find_spec("transformers") is None:
        return False
    import torch
    return torch.cuda.is_available()


def make_config(preset, seq_len):
    layers, hidden, heads = PRESETS[preset]
    return BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, intermediate_size=4 * hidden,
                      max_position_embeddings=max(512, seq_len))


def measure(framework, preset, batch_size, seq_len, precision, steps):
    """One run in this process -> its record (see the module docstring). A torch.compile run
    whose model cannot compile here is recorded as skipped, with the reason in one line."""
    dtype, tf32 = PRECISIONS[precision]
    backend.set_tf32(tf32)
    config = make_config(preset, seq_len)
    batch = train_step.make_batch(config, batch_size, seq_len)
    record = {"framework": framework, "case": str(Case("step", preset, batch_size, seq_len)),
              "preset": preset, "batch_size": batch_size, "seq_len": seq_len,
              "precision": precision}
    step, synchronize, memory = step_function(framework, config, batch, dtype, tf32)
    started = time.perf_counter()
    try:
        step()                  # torch.compile compiles here; nanobert compiles its kernels
        synchronize()
    except Exception as error:
        if framework != "torch.compile":
            raise
        return {**record, "skipped": one_line(f"torch.compile cannot compile here: "
                                              f"{type(error).__name__}: {error}")}
    record["first_step_s"] = time.perf_counter() - started      # compile time, not timed
    memory.sample()
    step()                      # nanobert: the capture of its graph
    synchronize()
    memory.sample()
    walls, hosts = [], []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        issued = time.perf_counter()
        synchronize()
        walls.append(time.perf_counter() - start)
        hosts.append(issued - start)
        memory.sample()
    wall = statistics.median(walls)
    record.update({"step_mode": step.mode(), "wall_ms": 1e3 * wall,
                   "host_ms": 1e3 * statistics.median(hosts),
                   "tokens_per_s": batch_size * seq_len / wall,
                   "mfu": model_flop_utilisation(config, batch, wall, dtype), **memory.gib()})
    if has_torch_cuda():
        from torch.profiler import ProfilerActivity, profile
        profiled = min(steps, 3)
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(profiled):
                step()
            synchronize()
        record.update(summarize(profiler_events(p), profiled))
    else:
        record["gpu_ms"] = cupy_event_ms(step, steps)
    return record


def one_line(text, limit=300):
    return " ".join(str(text).split())[:limit]


def step_function(framework, config, batch, dtype, tf32):
    """-> (step(), synchronize(), its memory counter) of a framework: nanobert's harness step
    (its mode: graph, eager or capture failed), torch eager or torch.compile (default mode)."""
    if framework == "nanobert":
        cupy = backend.get_xp("gpu")
        step, _ = train_step.nanobert_step_fn(config, batch, device="gpu", dtype=dtype)
        step.mode = lambda: step.graph.mode
        return step, cupy.cuda.Device().synchronize, PoolMemory(cupy)
    import torch
    torch.backends.cuda.matmul.allow_tf32 = tf32
    compiled = framework == "torch.compile"
    step, _ = train_step.torch_step_fn(config, batch, "gpu", dtype, compile=compiled)
    step.mode = lambda: "compiled (default mode)" if compiled else "eager"
    return step, torch.cuda.synchronize, TorchMemory()


class PoolMemory:
    """nanobert's GPU memory: the bytes every pool it uses holds (CuPy's default pool and
    each CUDA graph's private pool: training/graph.memory_pools) and uses, sampled after each
    step; the largest samples. CuPy keeps no peak of its own: a pool holds what its arrays
    needed at most since its last free_all_blocks, so the samples' largest held is an upper
    bound of the peak in use (a capture frees the default pool's cached blocks first: the
    warm-up's sample keeps their figure)."""

    def __init__(self, xp):
        from nanobert.training.graph import memory_pools
        self.pools = lambda: memory_pools(xp)
        self.held = self.used = 0

    def sample(self):
        pools = self.pools()
        self.held = max(self.held, sum(p.total_bytes() for p in pools))
        self.used = max(self.used, sum(p.used_bytes() for p in pools))

    def gib(self):
        """peak_gib: the most held (like torch's allocated peak, an upper bound of it);
        held_gib: the same (CuPy's pools give nothing back between steps); used_gib: the
        most in use at a sample (between steps)."""
        return {"peak_gib": self.held / GIB, "held_gib": self.held / GIB,
                "used_gib": self.used / GIB}


class TorchMemory:
    """torch's allocator's own peaks: max_memory_allocated (peak_gib) and
    max_memory_reserved (held_gib, the figure like CuPy's pools)."""

    def sample(self):
        pass

    def gib(self):
        import torch
        return {"peak_gib": torch.cuda.max_memory_allocated() / GIB,
                "held_gib": torch.cuda.max_memory_reserved() / GIB}


def model_flop_utilisation(config, batch, seconds, dtype):
    """The step's matmul FLOPs (nanobert's count: the MLM head at masked positions only, the
    same for torch) per second over the GPU's dense peak for the precision; None where the
    peak is unknown."""
    import cupy
    B, T = batch["input_ids"].shape
    flops = step_flops(config, B, T, int((batch["labels"] != IGNORE_INDEX).sum()))
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    peak = gpu_peak_tflops(name, backend.matmul_precision(dtype, "gpu"))
    return flops / seconds / 1e12 / peak if peak else None


def cupy_event_ms(step, steps):
    """Median GPU time of a step between two CuPy events (kernels and gaps alike); on the
    CPU stand-in, whose kernels run at once, the host's time."""
    import cupy
    if not hasattr(cupy.cuda, "Event"):
        return None
    times = []
    for _ in range(steps):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return statistics.median(times)


def parity(config=None, B=4, T=32):
    """float64, GPU vs NumPy, one forward + backward of a small BertForPreTraining in eval
    mode (no dropout) -> loss and the worst gradient, relative to the NumPy path's."""
    from nanobert.model.pretraining import BertForPreTraining
    config = config or BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=512)
    batch = train_step.make_batch(config, B, T)
    results = []
    for device in ("cpu", "gpu"):
        model = BertForPreTraining(config, seed=0, dtype=numpy.float64, device=device).eval()
        loss, grads = model.loss_and_grads(batch)
        results.append((float(loss), {k: backend.to_host(g) for k, g in grads.items()}))
    (loss_cpu, grads_cpu), (loss_gpu, grads_gpu) = results
    worst, worst_name = 0.0, None
    for name, expected in grads_cpu.items():
        if name.endswith("attention.self.key.bias"):      # true gradient 0: noise on both sides
            continue
        scale = numpy.abs(expected).max() or 1.0
        error = float(numpy.abs(grads_gpu[name] - expected).max() / scale)
        if error > worst:
            worst, worst_name = error, name
    return {"config": f"L{config.num_hidden_layers} H{config.hidden_size} B{B} T{T} float64",
            "loss_rel": abs(loss_gpu - loss_cpu) / abs(loss_cpu),
            "grad_worst_rel": worst, "grad_worst_name": worst_name}


WORKER_TIMEOUT_S = 480     # a worker that hangs is stopped and recorded (--worker-timeout)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_process(argv, cwd=None, timeout=WORKER_TIMEOUT_S):
    """A command in a fresh process -> (its stdout, None), or (what it printed, the error's
    last line and the last lines of its stderr, for whoever reads a failed run's cause in
    the JSON)."""
    def text(out):
        return out.decode(errors="replace") if isinstance(out, bytes) else (out or "")
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                                cwd=cwd)
    except subprocess.TimeoutExpired as e:
        return text(e.stdout), {"error": f"no result within {timeout} s",
                                "stderr_tail": text(e.stderr).splitlines()[-30:]}
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines() or ["failed"]
        return result.stdout, {"error": lines[-1], "stderr_tail": lines[-30:]}
    return result.stdout, None


def describe(framework, case, precision):
    """The fields that name a run (also a failed one's record)."""
    return {"framework": framework, "case": str(case), "preset": case.preset,
            "batch_size": case.batch_size, "seq_len": case.seq_len, "precision": precision}


def run_worker(framework, cases, precision, steps, timeout=WORKER_TIMEOUT_S):
    """Step cases of one framework and precision in one fresh process (measure each, their
    memory released between: the imports, CUDA's start and NVRTC's compilation paid once)
    -> a record a case; the cases after one that failed or ran out of time carry its error."""
    argv = [sys.executable, "-m", "bench.gpu_profile", "--worker", framework, "--cases",
            ",".join(map(str, cases)), "--precisions", precision, "--steps", str(steps)]
    stdout, error = run_process(argv, timeout=timeout)
    records = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return records + [{**describe(framework, case, precision), **error}
                      for case in cases[len(records):]]


def worker(framework, cases, precision, steps):
    """--worker: each case measured in this process, its record printed as one JSON line."""
    import gc
    for case in cases:
        started = time.perf_counter()
        record = measure(framework, case.preset, case.batch_size, case.seq_len, precision,
                         steps)
        print(json.dumps({**record, "run_s": time.perf_counter() - started}), flush=True)
        gc.collect()                             # the model, its graphs and their pools
        if framework == "nanobert":
            backend.get_xp("gpu").get_default_memory_pool().free_all_blocks()
        else:
            import torch
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()


# train.py's progress line (train.log_train) and the line that gives its sequence length
PROGRESS = re.compile(r"^step\s+\d+/\d+\s.*?\s([\d,]+) tok/s(?:.*?\sMFU ([\d.]+)%)?", re.M)
LENGTH = re.compile(r"^data: [\d,]+ instances of length (\d+)", re.M)


def train_py_argv(case, precision, steps, out, extra=()):
    """The command line of a train.py case: on the GPU, `steps` steps logged five times, in
    the precision's dtype, no held-out set (its data and evaluation are not training), the
    rest train.py's defaults (--preset nano: the command a user runs first)."""
    dtype, tf32 = PRECISIONS[precision]
    argv = [sys.executable, os.path.join(ROOT, "train.py"), "--device", "gpu", "--steps",
            str(steps), "--log-every", str(max(1, steps // 5)), "--heldout", "none",
            "--dtype", dtype, "--out", out]
    argv += [] if tf32 else ["--no-tf32"]
    argv += [] if case.preset == "nano" else ["--preset", case.preset]
    return argv + list(extra)


# graph.StepGraph's line when a capture fails (the step then runs eagerly)
CAPTURE_FAILED = re.compile(r"^note: the CUDA graph capture of the training step failed \((.*)\);",
                            re.M)


def read_progress(stdout, eager=False):
    """train.py's output -> the tokens/s and MFU of its last progress line (the first window
    includes NVRTC compiling the kernels), every line's tokens/s, the sequence length, and
    how its step ran (eager: the graph was turned off)."""
    lines = PROGRESS.findall(stdout)
    if not lines:
        raise ValueError("train.py printed no progress line")
    rates = [float(rate.replace(",", "")) for rate, _ in lines]
    mfu, length = lines[-1][1], LENGTH.search(stdout)
    failed = CAPTURE_FAILED.search(stdout)
    return {"tokens_per_s": rates[-1], "tokens_per_s_lines": rates,
            "mfu": float(mfu) / 100 if mfu else None,
            "seq_len": int(length[1]) if length else None,
            "step_mode": f"capture failed: {failed[1]}" if failed else
                         "eager" if eager else "graph"}


def run_train_py(case, precision, steps, extra=(), timeout=WORKER_TIMEOUT_S):
    """A train.py case (its output folder a temporary one) -> its record."""
    out = tempfile.mkdtemp(prefix="gpu-profile-train-")
    argv = train_py_argv(case, precision, steps, out, extra)
    try:
        stdout, error = run_process(argv, cwd=ROOT, timeout=timeout)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    record = {**describe("nanobert", case, precision),
              "command": shlex.join(["train.py", *argv[2:]])}
    if error:
        return {**record, **error}
    eager = os.environ.get("NANOBERT_CUDA_GRAPH", "1") == "0" or "--no-cuda-graph" in argv
    try:
        return {**record, **read_progress(stdout, eager)}
    except ValueError as e:
        return {**record, "error": str(e), "stderr_tail": stdout.splitlines()[-30:]}


def _number(value, digits=1, scale=1.0):
    return "-" if value is None else f"{value * scale:,.{digits}f}"


def torch_ratio(run, runs, peer="torch"):
    """A nanobert run's wall time over its peer's (torch eager, or torch.compile) on the same
    case and precision, else None."""
    if run["framework"] != "nanobert" or run.get("wall_ms") is None:
        return None
    for other in runs:
        if other["framework"] == peer and other.get("wall_ms") and \
                (other["case"], other["precision"]) == (run["case"], run["precision"]):
            return run["wall_ms"] / other["wall_ms"]
    return None


def add_ratios(result):
    """Each nanobert run's ratios to torch eager and torch.compile, into its record (the
    JSON holds every figure the table prints)."""
    for run in result["runs"]:
        if run["framework"] == "nanobert" and run.get("wall_ms") is not None:
            run["over_torch"] = torch_ratio(run, result["runs"])
            run["over_torch_compile"] = torch_ratio(run, result["runs"], "torch.compile")


def format_table(result):
    """The JSON record -> the printed report."""
    runs = result["runs"]
    head = f"{'framework':<14}{'case':<16}{'precision':<10}"
    lines = [f"{result['gpu']}   cupy {result['cupy']}   torch {result['torch'] or '-'}   "
             f"{result['date']}",
             head + f"{'wall ms':>9}{'host ms':>9}{'/torch':>8}{'/compile':>9}{'Mtok/s':>8}"
             f"{'MFU %':>7}{'peak GiB':>10}{'held GiB':>10}  step"]
    for r in runs:
        name = f"{r['framework']:<14}{r['case']:<16}{r['precision']:<10}"
        if "error" in r or "skipped" in r:
            lines.append(f"{name}failed: {r['error']}" if "error" in r else
                         f"{name}skipped: {r['skipped']}")
            continue
        lines.append(
            name + f"{_number(r.get('wall_ms')):>9}{_number(r.get('host_ms')):>9}"
            f"{_number(torch_ratio(r, runs), 2):>8}"
            f"{_number(torch_ratio(r, runs, 'torch.compile'), 2):>9}"
            f"{_number(r['tokens_per_s'], 2, 1e-6):>8}"
            f"{_number(r.get('mfu'), 1, 100):>7}{_number(r.get('peak_gib'), 2):>10}"
            f"{_number(r.get('held_gib'), 2):>10}  {r.get('step_mode', '-')}")
    profiled = [r for r in runs if "by_kind" in r or r.get("gpu_ms") is not None]
    if profiled:
        lines.append(head + f"{'GPU ms':>8}{'kernels':>9}{'memcpy':>8}{'memset':>8}"
                     f"{'runtime':>9}" + "".join(f"{SHORT[k] + ' ms':>12}" for k in KINDS))
    for r in profiled:
        kinds = r.get("by_kind") or {}
        lines.append(
            f"{r['framework']:<14}{r['case']:<16}{r['precision']:<10}"
            f"{_number(r.get('gpu_ms')):>8}{_number(r.get('kernels'), 0):>9}"
            f"{_number(r.get('memcpys'), 0):>8}{_number(r.get('memsets'), 0):>8}"
            f"{_number(r.get('runtime_calls'), 0):>9}"
            + "".join(f"{_number(kinds.get(k, {}).get('ms')):>12}" for k in KINDS))
    for r in runs:
        if r.get("largest"):
            lines.append(f"largest kernels, {r['framework']} {r['case']} {r['precision']} "
                         f"(ms per step, calls per step):")
            lines += [f"  {k['ms']:8.2f} {k['calls']:7.1f}  {k['name'][:96]}"
                      for k in r["largest"]]
    p = result.get("parity")
    if p:
        lines.append(f"parity, GPU vs NumPy, {p['config']}: loss {p['loss_rel']:.1e}, "
                     f"worst gradient {p['grad_worst_rel']:.1e} ({p['grad_worst_name']})")
    lines.append(
        "cases: PRESET:BxT, a step (forward, backward, clip, AdamW), medians; train.py: its "
        "last progress line.\nhost ms: the host's time to issue a step; /torch, /compile: "
        "nanobert's wall over torch eager's, torch.compile's (its compile time excluded: "
        "first_step_s in the JSON); Mtok/s: B x T / wall.\npeak GiB: nanobert's pools (the "
        "default and its graphs', their high-water), torch max allocated; held GiB: the same "
        "pools, torch max reserved.\nstep: how the step ran (graph, eager, capture failed: "
        "why; torch eager or compiled).\nGPU "
        "ms: kernels, memcpys and memsets by CUPTI (or CuPy events around the step without "
        "torch);\nkernels counted apart from memcpy/memset and from the runtime/driver calls "
        "that issued them; '-': not measured")
    return "\n".join(lines)


def csv_list(kind, allowed=None):
    def parse(text):
        items = [kind(t) for t in text.split(",") if t]
        bad = [t for t in items if allowed is not None and t not in allowed]
        if not items or bad:
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected a comma-separated list"
                + (f" of {', '.join(allowed)}" if allowed else ""))
        return items
    return parse


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=csv_list(parse_case), default=None,
                        help=f"comma-separated PRESET:BxT or train.py[:PRESET] (default "
                             f"{DEFAULT_CASES})")
    parser.add_argument("--batch-sizes", type=csv_list(int), default=None,
                        help="instead of --cases: these batch sizes (default 32,128) of "
                             "--preset at --seq-len")
    parser.add_argument("--preset", choices=PRESETS, default=None,
                        help="with --batch-sizes: model size (default base: L12 H768)")
    parser.add_argument("--seq-len", type=int, default=None,
                        help="with --batch-sizes: sequence length (default 128)")
    parser.add_argument("--precisions", type=csv_list(str, PRECISIONS),
                        default=["tf32", "float16"],
                        help="comma-separated of tf32, float32, float16 (default tf32,float16)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per run (median)")
    parser.add_argument("--train-py-steps", type=int, default=200,
                        help="steps of each train.py case (default 200, logged five times)")
    parser.add_argument("--train-py-args", type=shlex.split, default=[],
                        help="more flags for each train.py case, e.g. \"--batch-size 256\" "
                             "(a flag alone: --train-py-args=--no-tf32)")
    parser.add_argument("--no-torch", action="store_true", help="profile nanobert only")
    parser.add_argument("--no-compile", action="store_true",
                        help="torch eager only, not torch.compile beside it")
    parser.add_argument("--frameworks", type=csv_list(str, FRAMEWORKS), default=None,
                        help="instead: only these of nanobert, torch, torch.compile")
    parser.add_argument("--worker-timeout", type=int, default=WORKER_TIMEOUT_S,
                        help=f"seconds a worker process (a framework and precision, all its "
                             f"cases) or a train.py case may take before it is stopped, what "
                             f"it did not finish recorded as failed (default "
                             f"{WORKER_TIMEOUT_S})")
    parser.add_argument("--no-parity", action="store_true", help="skip the float64 parity line")
    parser.add_argument("--out", default=None,
                        help="JSON path (default runs/gpu_profile-<date>.json)")
    parser.add_argument("--worker", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    one_preset = (args.batch_sizes, args.preset, args.seq_len) != (None, None, None)
    if args.cases and one_preset:
        parser.error("give --cases, or --batch-sizes / --preset / --seq-len, not both")
    if min(args.steps, args.train_py_steps, args.seq_len or 1, args.worker_timeout,
           *(args.batch_sizes or [1])) < 1:
        parser.error("--steps, --train-py-steps, --seq-len, --batch-sizes and "
                     "--worker-timeout must be positive")
    args.preset, args.seq_len = args.preset or "base", args.seq_len or 128
    args.batch_sizes = args.batch_sizes or [32, 128]
    if not args.cases:
        args.cases = ([Case("step", args.preset, b, args.seq_len) for b in args.batch_sizes]
                      if one_preset else [parse_case(c) for c in DEFAULT_CASES.split(",")])
    return args


def main(argv=None):
    args = parse_args(argv)
    if not backend.gpu_available():
        sys.exit("bench.gpu_profile: no GPU here (CuPy cannot see a CUDA device); run it "
                 "where `python -c \"import cupy; cupy.cuda.runtime.getDeviceCount()\"` works")
    if args.worker:
        worker(args.worker, args.cases, args.precisions[0], args.steps)
        return
    cupy = backend.get_xp("gpu")
    frameworks = select_frameworks(args)
    torch_version = None
    if any(f.startswith("torch") for f in frameworks):
        import torch
        torch_version = torch.__version__
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    result = {"gpu": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
              "cupy": cupy.__version__, "torch": torch_version, "date": date,
              "cases": [str(c) for c in args.cases], "steps": args.steps,
              "train_py_steps": args.train_py_steps,
              "environment": {k: v for k, v in sorted(os.environ.items())    # e.g. TF32 off
                              if k.startswith(("NANOBERT_", "CUPY_"))}, "runs": []}
    out = args.out or os.path.join("runs", f"gpu_profile-{date[:10]}.json")
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    steps = [case for case in args.cases if case.command == "step"]
    for precision in args.precisions:
        for framework in frameworks if steps else ():
            started = time.perf_counter()
            records = run_worker(framework, steps, precision, args.steps, args.worker_timeout)
            report(records, time.perf_counter() - started, result, out)
        for case in args.cases if "nanobert" in frameworks else ():
            if case.command == "train.py":
                started = time.perf_counter()
                record = run_train_py(case, precision, args.train_py_steps, args.train_py_args,
                                      args.worker_timeout)
                record["run_s"] = time.perf_counter() - started
                report([record], record["run_s"], result, out)
    if not args.no_parity:
        result["parity"] = parity()
    add_ratios(result)
    print(format_table(result))
    write_json(result, out)
    print(f"wrote {out}")


def report(records, seconds, result, out):
    """A worker's records into the result, a line each printed, the JSON written (a later
    run that hangs loses nothing)."""
    for r in records:
        result["runs"].append(r)
        done = (r["error"] if "error" in r else f"skipped: {r['skipped']}"
                if "skipped" in r else f"{r['wall_ms']:.1f} ms a step ({r['step_mode']})"
                if "wall_ms" in r else f"{r['tokens_per_s']:,.0f} tokens/s")
        print(f"{r['framework']} {r['case']} {r['precision']}: {done}", flush=True)
        for line in r.get("stderr_tail", []):
            print("    " + line, flush=True)
    print(f"  ({seconds:.0f} s in all, the process's start included)", flush=True)
    write_json(result, out)


def select_frameworks(args):
    """The frameworks asked for (--frameworks, else all but --no-torch's and --no-compile's)
    that can run here: torch's need torch with CUDA and transformers (said once)."""
    asked = args.frameworks or ["nanobert"] + ([] if args.no_torch else ["torch"]) + (
        [] if args.no_torch or args.no_compile else ["torch.compile"])
    torch_ok = has_torch_cuda()
    if not torch_ok and any(f.startswith("torch") for f in asked):
        print("torch with CUDA or transformers is missing: torch's runs left out")
    return [f for f in asked if torch_ok or not f.startswith("torch")]


def write_json(result, path):
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
