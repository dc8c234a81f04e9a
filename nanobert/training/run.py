"""A run's start and end, shared by the command lines: the device, the ranks and the output
folder; the optimizer; dropout seeds and the order of the training rows; eval mode around an
evaluation; the run summary; Ctrl-C; and the one wrapper of every command line's __main__."""
import contextlib
import json
import os
import signal
import sys

import numpy

from nanobert.backend import (require_gpu, resolve_device, reuse_freed_memory,
                               set_tf32)
from nanobert.distributed import end_job, process_group
from nanobert.formats.fileio import atomic_open, output_folder
from nanobert.model import active
from nanobert.model.counter_rng import default_rng
from nanobert.model.flat import flat_buffer
from nanobert.model.optim import AdamW, LossScaler, layer_decay_scales
from nanobert.model.params import decays

from .folder import claim_output_folder


def setup_device(args):
    """--device resolved (default $NANOBERT_DEVICE or cpu) and, for the GPU, checked to run
    here (require_gpu: one line before any data work), TF32 as --no-tf32 says, freed
    memory reused (each step's arrays land in already mapped pages), and --reference-ops
    (or $NANOBERT_REFERENCE=1) switched on, refused in one line on a GPU or in float16."""
    reuse_freed_memory()
    args.device = resolve_device(args.device)
    if getattr(args, "reference_ops", False):
        active.use_reference_ops()
    args.reference_ops = active.reference_ops()
    try:
        active.check_reference_mode(args.device, getattr(args, "dtype", "float32"))
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    if args.device == "gpu":
        require_gpu()
    set_tf32(not args.no_tf32)


def cuda_graph_enabled(args):
    """Whether GPU steps replay a CUDA graph (training/graph.py): yes unless --no-cuda-graph
    or $NANOBERT_CUDA_GRAPH=0."""
    return not getattr(args, "no_cuda_graph", False) and \
        os.environ.get("NANOBERT_CUDA_GRAPH", "1") != "0"


def start_ranks(args):
    """The process group (one process, or the ranks of an MPI job: rank 0 alone prints) and
    the output folder --out: rank 0 holds its lock for the run's life and refuses one that
    would lose what this run did not make (folder.claim_output_folder). -> the group."""
    group = process_group(args.device)
    if not group.is_main:
        sys.stdout = open(os.devnull, "w")            # rank 0 alone prints
        output_folder(args.out)
        return group
    sources = (getattr(args, "init_from", None), getattr(args, "model", None))
    claim_output_folder(args.out, sources, resume=args.resume,
                        overwrite=getattr(args, "overwrite", False))
    return group


@contextlib.contextmanager
def preparing_data(what_is_kept):
    """Ctrl-C while the data is prepared (before the run has anything to save) ends in one
    line saying what stays (`what_is_kept`) and how to go on, not a traceback."""
    try:
        yield
    except KeyboardInterrupt:
        raise SystemExit(f"error: interrupted (Ctrl-C) while preparing the data, before any "
                         f"training: {what_is_kept}; the same command starts again from "
                         "there") from None


def remove_stale(path):
    """A fresh run's metrics.jsonl starts empty (path None: not rank 0)."""
    if path and os.path.exists(path):
        os.remove(path)


def broadcast_weights(group, model):
    """Every rank starts from rank 0's weights."""
    if group.world_size > 1:
        group.broadcast_(flat_buffer(model.params))


def seed_dropout(model, seed, rank, step=0):
    """One dropout generator for the run, a stream of its own on each rank (on the GPU the
    counter-based one, counter_rng.default_rng, at `step`: its masks are a function of (seed,
    step), so a run resumed at a step draws those of an uninterrupted one)."""
    model.rng = default_rng(model.xp, seed + 1_000_003 * rank)
    if step and model.xp is not numpy:
        model.rng.load_state_dict({"seed": model.rng.seed, "step": step, "calls": 0})


def dropout_state(model, group):
    """The dropout generator's state (a JSON-able dict) for a checkpoint, so that a resumed
    run draws the masks an uninterrupted one would, in one process: the CPU's bit generator
    state, the GPU's counter (CounterGenerator.state_dict: seed, step, calls; a device read,
    at checkpoint time only). None with several ranks (rank 0 alone writes the checkpoint)."""
    if group.world_size > 1:
        return None
    if model.xp is numpy:
        return model.rng.bit_generator.state
    return model.rng.state_dict()


def restore_dropout(model, saved, seed, step, rank):
    """The dropout stream where the checkpoint left it (`saved`: dropout_state's, of the same
    device kind), else a new stream from (seed, step, rank), said so: the run then goes on
    closely, not bit for bit."""
    if saved is not None and (model.xp is numpy) == ("bit_generator" in saved):
        try:
            if model.xp is numpy:
                model.rng.bit_generator.state = saved
            else:
                model.rng.load_state_dict(saved)
        except (TypeError, ValueError, KeyError) as e:   # a trainer_state.json edited by hand
            raise ValueError(f"trainer_state.json: dropout_rng is not a generator state this run "
                             f"can restore ({type(e).__name__}: {e})") from None
        return
    model.rng = default_rng(model.xp, int(numpy.random.SeedSequence([seed, step, rank])
                                          .generate_state(1)[0]))
    print("note: the checkpoint holds no dropout state for this device / number of ranks; "
          "the masks after the resume come from a new stream (close to, not bit-equal with, "
          "an uninterrupted run)")


def make_optimizer(args, model, state=None):
    """AdamW (--optimizer, --lr, --weight-decay, finetune.py's --layer-decay) and, for
    float16, the loss scaler; both loaded from a checkpoint's optimizer state and trainer
    state when given.
    -> (optimizer, scaler or None)"""
    decay = getattr(args, "layer_decay", None)            # finetune.py's --layer-decay
    scales = (layer_decay_scales(model.params, model.config.num_hidden_layers, decay)
              if decay is not None else None)
    optimizer = AdamW(model.params, lr=args.lr, mode=args.optimizer,
                      weight_decay=args.weight_decay, lr_scale=scales,
                      decay=decays(model.param_shapes(model.config)))
    scaler = LossScaler(model.xp) if args.dtype == "float16" else None
    if state is not None:
        optimizer_state, trainer_state = state
        optimizer.load_state_dict(optimizer_state)
        if scaler and "loss_scaler" in trainer_state:
            scaler.load_state_dict(trainer_state["loss_scaler"])
    return optimizer, scaler


def epoch_order(seed, epoch, size):
    """The rows of one epoch: a permutation drawn from (seed, epoch) alone, so that any batch
    can be found again from its position (exact resume, any number of ranks)."""
    return numpy.random.default_rng([seed, epoch]).permutation(size)


def stream_rows(size, batch_size, seed, position):
    """Rows of the batch at `position` of an endless stream of epochs (a batch may span two)."""
    epoch, start = divmod(position * batch_size, size)
    rows = []
    while len(rows) < batch_size:
        order = epoch_order(seed, epoch, size)
        rows.extend(order[start:start + batch_size - len(rows)])
        epoch, start = epoch + 1, 0
    return numpy.array(rows)


@contextlib.contextmanager
def eval_mode(model):
    """Dropout off inside, the model's mode as it was after."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def write_summary(path, summary):
    """The run's summary (eval.json, results.json), swapped in atomically."""
    with atomic_open(path, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1, default=str)


class StopFlag:
    """Ctrl-C / SIGTERM ask the loop to save a checkpoint and stop after the current step.
    A context manager around the loop: the handlers before it come back when it ends, so a
    program that runs a command's main() and goes on keeps its own Ctrl-C, and a process it
    forks later (a multiprocessing pool) still ends on SIGTERM."""

    def __enter__(self):
        self.stop = False
        self.previous = {sig: signal.signal(sig, self.handle)
                         for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exception):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def handle(self, signum, frame):
        if self.stop:                  # a second Ctrl-C: stop now (the checkpoint swap is atomic)
            raise KeyboardInterrupt
        print(f"\n{signal.Signals(signum).name}: saving a checkpoint after this step, "
              "then stopping", flush=True)
        self.stop = True


def run_command(main):
    """A command line's __main__: bad input (ValueError, FileNotFoundError), every other
    OSError (a full disk, a folder that cannot be written), a MemoryError (a model or batch
    too large) and Ctrl-C outside the training loop (which saves and stops: StopFlag) end with
    one line on stderr and a non-zero exit status, never a traceback; under mpiexec a failing
    rank ends every rank."""
    try:
        code = main()
    except (ValueError, OSError) as e:
        code = f"error: {e}"
    except MemoryError as e:
        code = (f"error: out of memory{f' ({e})' if str(e) else ''}: the model, batch or "
                "sequence length needs more memory than this machine has; a smaller "
                "--batch-size (or --grad-accum), --max-seq-length or model needs less")
    except KeyboardInterrupt:
        code = "error: interrupted (Ctrl-C)"
    except SystemExit as e:
        code = e.code
    end_job(code)
