"""Pretrain a BERT from raw text with masked LM + next sentence prediction.

    python train.py                # the shipped Brown corpus, the nano BERT, ~10 minutes on CPU
    python train.py --preset mini --minutes 60 --out runs/mini
    python train.py --data my_corpus/ --vocab my_vocab.txt --steps 100000 --device gpu
    python train.py --out runs/pretrain --resume          # continue exactly where it stopped
    mpiexec -n 2 python train.py --steps 20   # data parallel: each rank a slice of each batch

Reads like a recipe: arguments, vocab, data, model, optimizer, loop (log, evaluate,
checkpoint), final evaluation and a fill-mask example. Input text: one sentence per line,
a blank line between documents (.txt or .txt.gz files, or folders of them).
Writes to --out: checkpoint/ (config.json, model.safetensors, vocab.txt - loadable by
transformers.BertForPreTraining - plus optimizer.safetensors and trainer_state.json),
metrics.jsonl, loss_curve.png (needs matplotlib) and eval.json.

Under mpiexec every rank builds the same global batch and takes its slice; gradients are
summed by MPI allreduce (NCCL on GPUs), so the run is the same for any number of ranks (but
for summation order and dropout masks, which are drawn per rank). Rank 0 alone prepares the
data, prints, and writes checkpoints and metrics.
"""
import math
import os
import time
from typing import NamedTuple

import numpy

from nanobert import BertConfig, BertForPreTraining, average_gradients, flags, learning_rate
from nanobert.data.pretraining_data import sha256_file
from nanobert.data.pretraining_instances import input_files
from nanobert.data.tokenizer import BertTokenizer
from nanobert.distributed import rank_slice
from nanobert.model import active
from nanobert.model.counter_rng import default_rng
from nanobert.model.flat import flat_buffer
from nanobert.model.flops import step_flops
from nanobert.model.ops import IGNORE_INDEX
from nanobert.model.optim import warmup_steps
from nanobert.training.budget import Budget, steps_for_budget
from nanobert.training.guards import batch_fits, check_loss
from nanobert.training.metrics import Window, append_metrics, peak_tflops, percent, time_left
from nanobert.training.pretraining import (CORPORA, MASKED_INPUTS, GPUStep, corpus_files, evaluate,
                                           fill_mask_example, host_sums, means, prepare_corpus,
                                           prepare_datasets, prepare_vocab, step_sums,
                                           total_loss, trim, unigram_baseline, without_nsp)
from nanobert.training.reference_runs import place_pretraining, plot_with_reference
from nanobert.training.resume import (init_from_vocab, init_from_weights, read_trainer_state,
                                      refuse_changed_flags, refuse_changed_model,
                                      resume_training, save_checkpoint)
from nanobert.training.folder import releases_output_folder
from nanobert.training.run import (StopFlag, broadcast_weights, cuda_graph_enabled,
                                   make_optimizer, preparing_data, remove_stale, run_command,
                                   seed_dropout, setup_device, start_ranks, stream_rows,
                                   write_summary)
from nanobert.training.step import update

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")                 # the corpora --corpus names: data/<name>/


class Preset(NamedTuple):
    layers: int
    hidden: int
    heads: int
    dropout: float
    lr: float             # the default peak learning rate


# The BERT sizes of the paper and of Turc et al. (2019) with BERT's dropout, and "nano", the
# ten-minute CPU default (12,000-16,000 steps there).
# nano trains without dropout: its masked LM leaves the plateau sooner (held-out MLM accuracy
# 16.9% against 14.7% with dropout after 3,000 steps at T=40) and its held-out loss keeps
# falling (the train loss drops below it: ten minutes see each instance ~4 times); without
# dropout 1.5e-3 beats 1e-3. BERT-Tiny with dropout stalls at 1e-3: the others take 5e-4.
PRESETS = {
    "nano": Preset(2, 64, 2, 0.0, 1.5e-3), "tiny": Preset(2, 128, 2, 0.1, 5e-4),
    "mini": Preset(4, 256, 4, 0.1, 5e-4), "small": Preset(4, 512, 8, 0.1, 5e-4),
    "medium": Preset(8, 512, 8, 0.1, 5e-4), "base": Preset(12, 768, 12, 0.1, 5e-4),
    "large": Preset(24, 1024, 16, 0.1, 5e-4),
}
# Flags whose change breaks exact continuation: they change the data (corpus, casing, pairs,
# masks, sequence lengths), which batch each step reads (seed, batch size, micro-batches), the
# learning-rate schedule (lr, warmup, steps) or the update itself (the loss with or without
# NSP, weight decay, optimizer, dtype). The rest may change on resume: logging, evaluation,
# checkpoint interval, time budget, --stop-at-step, the held-out set, --utf8-errors (a corpus
# that read strictly reads the same with replace; one that needed replace fails strictly) and
# --device.
RESUME_FIXED = ("data", "seed", "cased", "dupe_factor", "max_predictions_per_seq",
                "whole_word_mask", "no_nsp", "dynamic_masking", "max_seq_length",
                "phase2_max_seq_length", "phase2_fraction", "batch_size", "grad_accum", "lr",
                "warmup", "steps", "weight_decay", "optimizer", "dtype")

# ----------------------------------------------------------------------------- arguments


def parse_args(argv=None):
    parser = flags.parser(__doc__, [
        ("data", add_data_arguments), ("model", add_model_arguments),
        ("optimisation", add_optimisation_arguments), ("run", add_run_arguments),
    ])
    args = parser.parse_args(argv)
    if args.lr is None:
        args.lr = 5e-4 if args.config else PRESETS[args.preset].lr
    corpus = corpus_files(args.corpus, DATA)     # --data / --heldout default to its files
    if args.data is None:
        args.data = [corpus["train"]]
    if args.init_from and args.resume:
        parser.error("--init-from starts a new schedule, --resume goes on with one: give one")
    if args.init_from:                            # its vocab, or none
        try:
            args.vocab = init_from_vocab(args.init_from, args.vocab)
        except (OSError, ValueError) as e:
            parser.error(str(e))
    if args.heldout is None:
        args.heldout = [corpus["heldout"]]
    elif args.heldout == ["none"]:
        args.heldout = []
    # A missing path is refused now, not after minutes of building the training data; the
    # corpus's own files may not exist yet (prepare_corpus converts them on first use).
    for flag, paths in (("--data", args.data), ("--heldout", args.heldout)):
        for path in paths:
            if path not in corpus.values():
                try:
                    input_files(path)
                except (OSError, ValueError) as e:
                    parser.error(f"argument {flag}: {e}")
    if args.minutes is None and args.steps is None and not args.resume:
        args.minutes = 10.0                     # the no-argument run: a ten-minute budget
    return args


def add_data_arguments(g):
    g.add_argument("--corpus", choices=tuple(CORPORA), default="brown",
                   help="the default --data and --heldout: data/<corpus>/, converted on first "
                        "use from the packages it names; "
                        + "; ".join(f"{name}: {about}" for name, about in CORPORA.items()))
    g.add_argument("--data", nargs="+",
                   help="training text: files and/or folders (default: --corpus's training "
                        "documents)")
    g.add_argument("--heldout", nargs="*",
                   help="held-out text for evaluation: files and/or folders (default: "
                        "--corpus's held-out documents; '--heldout none' or a bare --heldout: "
                        "no held-out evaluation)")
    g.add_argument("--heldout-dupe-factor", type=flags.positive_int, default=1,
                   help="passes over the held-out text (more pairs/masks for a tighter estimate)")
    g.add_argument("--vocab", help="vocab.txt to use (default: <first data folder>/"
                                   "vocab-<size>.txt, trained from --data if missing)")
    g.add_argument("--vocab-size", type=flags.positive_int, default=8192,
                   help="size of a vocab trained here (default 8192)")
    g.add_argument("--cased", action="store_true",
                   help="keep case and accents (default: uncased)")
    g.add_argument("--dupe-factor", type=flags.positive_int, default=5,
                   help="passes over the corpus with new masks/pairs (default 5)")
    g.add_argument("--max-predictions-per-seq", type=flags.positive_int, default=20)
    g.add_argument("--whole-word-mask", action="store_true")
    g.add_argument("--no-nsp", action="store_true",
                   help="train with the masked LM alone (the paper's 'No NSP' ablation, Table 5): "
                        "same instances, the NSP loss left out; held-out NSP is still reported")
    g.add_argument("--dynamic-masking", action="store_true",
                   help="draw new masks every time an instance is used")
    g.add_argument("--utf8-errors", choices=("strict", "replace"), default="strict",
                   help="non-UTF-8 bytes: stop naming file and offset (strict), or replace "
                        "and count")


def add_model_arguments(g):
    g.add_argument("--preset", choices=PRESETS, default="nano",
                   help="model size (default nano: L=2, H=64, A=2; tiny is BERT-Tiny, L=2, "
                        "H=128)")
    g.add_argument("--config",
                   help="a config.json instead of --preset (vocab_size is set from the vocab)")
    g.add_argument("--max-seq-length", type=flags.in_range(int, 5), default=40,
                   help="phase-1 sequence length (default 40: in the ten-minute default the "
                        "masked LM learns to use the words around a [MASK] at 40, not at 48 or "
                        "64, and NSP still learns, not at 32; the paper's is 128)")
    g.add_argument("--phase2-max-seq-length", type=flags.non_negative_int, default=0,
                   help="if set (BERT: 512), the last --phase2-fraction of the steps use this "
                        "length")
    g.add_argument("--phase2-fraction", default=0.1,
                   type=flags.in_range(float, 0.0, 1.0, low_open=True, high_open=True))


def add_optimisation_arguments(g):
    g.add_argument("--batch-size", type=flags.positive_int, default=52,
                   help="sequences per optimizer step (default 52: ~2,000 tokens at the "
                        "default length; the paper's 256 x 128 is 16 times that)")
    flags.add(g, "--grad-accum")
    g.add_argument("--lr", type=flags.learning_rate,
                   help="peak learning rate (default: the preset's, 1.5e-3 for nano and 5e-4 "
                        "for the others - BERT-Tiny's learning stalls at 1e-3; 5e-4 with "
                        "--config)")
    flags.add(g, "--warmup", default=0.05)
    g.add_argument("--steps", type=flags.positive_int,
                   help="optimizer steps (default: as many as --minutes allows, re-planned "
                        "from the measured pace as the run goes, so the lr reaches 0 in time)")
    g.add_argument("--minutes", type=flags.in_range(float, 0.0, low_open=True),
                   help="time budget for training: stop there (a checkpoint; --resume goes on) "
                        "even if --steps are left (default: 10 without --steps, none with it "
                        "or with --resume)")
    flags.add(g, "--optimizer", "--weight-decay")


def add_run_arguments(g):
    g.add_argument("--out", default=os.path.join("runs", "pretrain"),
                   help="output folder (default runs/pretrain)")
    g.add_argument("--resume", action="store_true",
                   help="continue from <out>/checkpoint exactly (a flag that would change the "
                        "steps, e.g. --lr or --grad-accum, must keep its value)")
    g.add_argument("--init-from", metavar="CHECKPOINT",
                   help="start from this checkpoint's weights and vocab (<out>/checkpoint of a "
                        "train.py run) with a new optimizer and schedule: continued pretraining, "
                        "e.g. on a task's own text; --config/--preset must describe its model")
    flags.add(g, "--overwrite", "--seed", "--device", "--dtype", "--no-tf32", "--no-cuda-graph",
              "--reference-ops")
    g.add_argument("--log-every", type=flags.positive_int, default=20)
    g.add_argument("--eval-every", type=flags.non_negative_int, default=500,
                   help="held-out evaluation interval in steps (0: only at the end)")
    g.add_argument("--eval-batches", type=flags.positive_int, default=50,
                   help="held-out batches per evaluation (default 50)")
    g.add_argument("--checkpoint-every", type=flags.positive_int, default=500)
    g.add_argument("--check-sync-every", type=flags.non_negative_int, default=100,
                   help="under mpiexec: every N steps compare a hash of every rank's weights "
                        "and stop if they differ (0: never; default 100)")
    g.add_argument("--stop-at-step", type=flags.positive_int,
                   help="checkpoint and stop at this step (the schedule still spans --steps; "
                        "continue with --resume)")

# ------------------------------------------------------------- data, model and optimizer


def prepare(args, checkpoint_dir):
    """The resume checks, the vocab, the tokenizer and the data sets (built when missing)."""
    if args.resume:
        check_resume(args, checkpoint_dir)
    if args.config:
        BertConfig.from_json_file(args.config)     # its types, ranges and size: before the data
    with preparing_data(f"the data sets finished so far stay in {args.out}/data and are "
                        "reused"):
        if set(corpus_files(args.corpus, DATA).values()) & set(args.data + args.heldout):
            prepare_corpus(args.corpus, DATA)          # converts it if it is not yet
        vocab_file = prepare_vocab(args)
        tokenizer = BertTokenizer(vocab_file, do_lower_case=not args.cased)
        return vocab_file, tokenizer, prepare_datasets(args, tokenizer, vocab_file)


def model_config(args, vocab_size):
    if args.config:
        config = BertConfig.from_json_file(args.config)
        config.vocab_size = vocab_size
    else:
        p = PRESETS[args.preset]
        config = BertConfig(vocab_size=vocab_size, hidden_size=p.hidden, num_hidden_layers=p.layers,
                            num_attention_heads=p.heads, intermediate_size=4 * p.hidden,
                            hidden_dropout_prob=p.dropout, attention_probs_dropout_prob=p.dropout)
    longest = max(args.max_seq_length, args.phase2_max_seq_length)
    if longest > config.max_position_embeddings:
        raise SystemExit(f"error: max_seq_length {longest} exceeds the model's "
                         f"max_position_embeddings {config.max_position_embeddings}")
    return BertConfig.from_dict(config.to_dict())   # re-validated


def new_model(args, vocab_size, metrics_path):
    """A new model (drawn from --seed, or --init-from's weights) and a fresh optimizer
    -> (model, optimizer, scaler, state)."""
    config = model_config(args, vocab_size)
    params = args.init_from and init_from_weights(BertForPreTraining, args.init_from, config,
                                                  model_flag(args))
    model = BertForPreTraining(config, seed=args.seed, dtype=numpy.dtype(args.dtype),
                               device=args.device, params=params)
    remove_stale(metrics_path)
    return (model, *make_optimizer(args, model), {"step": 0, "train_seconds": 0.0, "tokens": 0})


def resumed_model(args, checkpoint_dir, vocab_file, metrics_path):
    """Model, optimizer and state from <out>/checkpoint, refused if it was trained with another
    vocab -> (model, optimizer, scaler, state). Sets args.steps to the checkpoint's schedule."""
    resumed = resume_training(BertForPreTraining, args, checkpoint_dir, metrics_path,
                              check=lambda state: refuse_another_vocab(state, checkpoint_dir,
                                                                       vocab_file))
    args.steps = resumed[-1]["total_steps"]
    return resumed


def check_resume(args, checkpoint_dir):
    """Before any data is built: finish a save that a crash cut short, read trainer_state.json
    (a ValueError naming it if it is not what a save writes) and refuse flags and a model that
    differ from the checkpoint's."""
    state = read_trainer_state(checkpoint_dir, ("step", "total_steps", "vocab_sha256", "args"),
                               "train.py")
    if args.vocab and os.path.isfile(args.vocab):     # else checked once the vocab is made
        refuse_another_vocab(state, checkpoint_dir, args.vocab)
    saved = dict(state["args"])
    if "steps" in saved:
        saved["steps"] = state["total_steps"]     # the schedule, also when --minutes set it
    skip = {"steps"} if args.steps is None else set()
    if not (args.phase2_max_seq_length or saved.get("phase2_max_seq_length")):
        skip.add("phase2_fraction")               # unused without a phase 2
    refuse_changed_flags(args, saved, RESUME_FIXED, paths=("data",), skip=skip)
    config = BertConfig.from_json_file(os.path.join(checkpoint_dir, "config.json"))
    refuse_changed_model(model_config(args, config.vocab_size), config, model_flag(args))


def model_flag(args):
    return f"--config {args.config}" if args.config else f"--preset {args.preset}"


def refuse_another_vocab(state, checkpoint_dir, vocab_file):
    if state["vocab_sha256"] != sha256_file(vocab_file):
        raise SystemExit(f"error: {checkpoint_dir} was trained with another vocab than "
                         f"{vocab_file}")

# ------------------------------------------------------------------------------- one step


def global_batch(args, group, model, dataset, phase, step):
    """The global batch at `step` of the phase's stream, the same on every rank, and this
    rank's slice of it in --grad-accum micro-batches. Masks from (seed, step), dropout from
    (seed, step, rank), not from running streams: exact resume, with any number of ranks (on
    the GPU the run keeps one Generator). -> (the whole batch, micro-batches, the whole
    batch's counts that every micro-batch's losses are divided by)"""
    rows = stream_rows(len(dataset), args.batch_size, args.seed + phase, step)
    mask_rng = numpy.random.default_rng([args.seed, step, 1])
    if model.xp is numpy:
        seed = numpy.random.SeedSequence([args.seed, step, group.rank]).generate_state(1)[0]
        model.rng = default_rng(numpy, int(seed))
    whole = dataset.batch(rows, mask_rng, args.dynamic_masking)
    denominators = {"masked_lm": int((whole["labels"] != IGNORE_INDEX).sum()),
                    "next_sentence": int((whole["next_sentence_label"] != IGNORE_INDEX).sum())}
    mine = rank_slice(numpy.arange(args.batch_size), group)
    micro = len(mine) // args.grad_accum
    multiple = 1 if model.xp is numpy else 16     # GPU: few shapes, one CUDA graph each
    batches = [trim({k: v[mine[m * micro:(m + 1) * micro]] for k, v in whole.items()},
                    multiple) for m in range(args.grad_accum)]
    return whole, batches, denominators


def loss_and_grads(args, model, scaler, denominators):
    """model.loss_and_grads of one micro-batch on the CPU (the GPU's step is GPUStep), its
    losses divided by the whole batch's counts (so the sum over micro-batches and ranks is the
    batch's loss); --no-nsp: the model sees no NSP labels, so its loss is the MLM alone (the
    sums still count the random-next pairs)."""
    def micro_batch(batch):
        if args.no_nsp:
            batch = without_nsp(batch)
        with batch_fits(batch["input_ids"].shape, args.batch_size, args.grad_accum, args.device):
            return model.loss_and_grads(batch, return_outputs=True, denominators=denominators,
                                        loss_scale=scaler.scale if scaler else None)
    return micro_batch

# ----------------------------------------------------------------------------- logging


def log_train(args, model, metrics_path, window, step, lr, elapsed):
    """Print and append the means of the steps since the last log line (the whole job's
    throughput, and per rank under mpiexec). The window's sums are read here, once per log
    line (on the GPU the only read of the loop), and a non-finite loss stops the run."""
    sums = host_sums(window.sums)
    check_loss(total_loss(sums), step, model)
    record = {"kind": "train", "step": step, "lr": lr, **means(sums),
              "tokens_per_second": sums["tokens"] / window.seconds, "elapsed": elapsed}
    if args.no_nsp:                       # nothing was predicted: no zeros that look measured
        del record["nsp_loss"], record["nsp_accuracy"]
    line = (f"step {step:>6}/{args.steps}  "
            f"mlm {record['mlm_loss']:.3f} acc {record['mlm_accuracy']:.3f}  "
            + ("" if args.no_nsp else
               f"nsp {record['nsp_loss']:.3f} acc {record['nsp_accuracy']:.3f}  ")
            + f"lr {lr:.2e}  {record['tokens_per_second']:,.0f} tok/s")
    if window.ranks > 1:
        record["ranks"] = window.ranks
        record["tokens_per_second_per_rank"] = record["tokens_per_second"] / window.ranks
        line += f" ({record['tokens_per_second_per_rank']:,.0f} per rank)"
    if window.peak:
        record["mfu"] = window.mfu()
        line += f"  MFU {percent(record['mfu'])}"
    if metrics_path:
        print(f"{line}  {time_left(elapsed, step, args.steps)}", flush=True)
        append_metrics(metrics_path, record)


def log_evaluation(metrics_path, model, data, step, batch_size, max_batches):
    result = evaluate(model, data.heldout, batch_size, max_batches, data.mask_id)
    print(f"  held-out: mlm {result['mlm_loss']:.3f} acc {result['mlm_accuracy']:.3f}  "
          f"nsp {result['nsp_loss']:.3f} acc {result['nsp_accuracy']:.3f}")
    append_metrics(metrics_path, {"kind": "eval", "step": step, **result})

# ------------------------------------------------------------------------------ the loop


def train(args, group, model, optimizer, scaler, state, data, save, stop):
    """The loop, from state["step"] until args.steps, the time budget, --stop-at-step or
    Ctrl-C: steps, log lines, held-out evaluations and checkpoints. -> (the last step, whether
    Ctrl-C / SIGTERM set `stop`, a StopFlag). Under mpiexec every decision (when to stop, how
    many steps fit) is taken together, and rank 0 alone logs, evaluates and writes."""
    metrics_path = os.path.join(args.out, "metrics.jsonl") if group.is_main else None
    micro = args.batch_size // group.world_size // args.grad_accum
    window = Window(peak_tflops(args.device, args.dtype), group.world_size)
    step = state["step"]
    replan = args.steps is None and not args.resume
    if args.steps is None:       # the schedule needs a step count: fit it to the time budget
        first = data.train_sets[0]
        probe = trim(first.batch(numpy.arange(min(micro, len(first)))))
        with batch_fits(probe["input_ids"].shape, args.batch_size, args.grad_accum, args.device):
            args.steps = group.broadcast_object(
                steps_for_budget(model, probe, args.grad_accum, args.minutes))
    budget = Budget(args.minutes, args.steps, step, replan=replan)
    gpu_step = None if model.xp is numpy else GPUStep(args, group, model, optimizer, scaler,
                                                      cuda_graph=cuda_graph_enabled(args))
    while step < args.steps:
        stopping, over_budget = group.sum([stop.stop, budget.over()])
        stop.stop = stopping > 0                 # Ctrl-C on any rank stops every rank
        if over_budget:
            print(f"the time budget (--minutes {args.minutes:g}) ends the run at step {step} of "
                  f"{args.steps}; --resume continues it")
        if stop.stop or over_budget or step == args.stop_at_step:
            break
        start = time.time()
        phase = 0 if len(data.phases) == 1 or step < data.phases[0][1] * args.steps else 1
        whole, batches, denominators = global_batch(args, group, model, data.train_sets[phase],
                                                    phase, step)
        lr = learning_rate(step, args.lr, warmup_steps(args.warmup, args.steps), args.steps)
        step += 1
        if gpu_step:          # the whole update, replayed from a CUDA graph (training/graph.py)
            with batch_fits(batches[0]["input_ids"].shape, args.batch_size, args.grad_accum,
                            args.device):
                outputs = gpu_step(batches, denominators, lr)
        else:
            _, grads, outputs = average_gradients(loss_and_grads(args, model, scaler,
                                                                 denominators),
                                                  batches, weights=[1.0] * len(batches))
        sums = step_sums(group, model.xp, batches, outputs, denominators)   # over the ranks
        if not gpu_step:      # the update, its loss checked (the GPU's: at a log line)
            keep = (os.path.join(args.out, "nonfinite_batch.npz"), whole) if group.is_main \
                else None
            update(group, model, optimizer, scaler, grads, lr, step, mode=args.optimizer,
                   keep=keep, loss=total_loss(host_sums(sums)))
        seconds = time.time() - start
        window.add(sums, seconds, sum(step_flops(
            model.config, *b["input_ids"].shape, int((b["labels"] != IGNORE_INDEX).sum()),
            model.packed_lengths(b)) for b in batches))
        state["tokens"] += int(whole["attention_mask"].sum())
        state["train_seconds"] += seconds
        args.steps = group.broadcast_object(budget.plan(step))   # the pace, followed
        if group.world_size > 1 and args.check_sync_every and step % args.check_sync_every == 0:
            group.digest(flat_buffer(model.params))      # identical weights, or a loud stop
        if step % args.log_every == 0 or step == args.steps or stop.stop:
            log_train(args, model, metrics_path, window, step, lr, state["train_seconds"])
            window.reset()
        if metrics_path and data.heldout and args.eval_every and step % args.eval_every == 0 \
                and step != args.steps:
            log_evaluation(metrics_path, model, data, step, micro, args.eval_batches)
        if step % args.checkpoint_every == 0:
            save(step)
    return step, stop.stop

# ---------------------------------------------------------------------------- evaluation


def final_evaluation(args, model, tokenizer, data, metrics_path, summary):
    """Held-out MLM/NSP against the unigram baseline and the majority class, and a fill-mask
    example: printed, logged and added to `summary`."""
    micro = args.batch_size // args.grad_accum
    result = evaluate(model, data.heldout, micro, args.eval_batches, data.mask_id)
    baseline, baseline_accuracy, commonest = unigram_baseline(
        data.train_sets[0], data.heldout, model.config.vocab_size, args.eval_batches, micro)
    append_metrics(metrics_path, {"kind": "eval", "step": summary["step"], **result})
    # how far NSP is above always guessing the majority class, in standard errors of a
    # coin-flip accuracy on this many pairs
    margin = (result["nsp_accuracy"] - result["nsp_majority_accuracy"]) / math.sqrt(
        0.25 / result["sequences"])
    print(f"held-out ({result['sequences']} sequences, {result['masked_tokens']} masked tokens):\n"
          f"  MLM loss {result['mlm_loss']:.3f} (unigram baseline {baseline:.3f}), "
          f"MLM accuracy {result['mlm_accuracy']:.3f} (always "
          f"\"{tokenizer.convert_ids_to_tokens([commonest])[0]}\": {baseline_accuracy:.3f});"
          " by input: " + ", ".join(f"{MASKED_INPUTS[k]} {a:.3f}" for k, a in
                                    result["mlm_accuracy_by_input"].items()) + "\n"
          f"  NSP accuracy {result['nsp_accuracy']:.3f} (majority class "
          f"{result['nsp_majority_accuracy']:.3f}: {margin:+.1f} standard errors)")
    example = fill_mask_example(model, tokenizer, args.heldout, args.utf8_errors)
    if example:
        print(f"fill-mask: {example['sentence']}\n"
              f"  answer: {example['answer']}   model: {example['top5']}")
    summary.update(heldout=result, unigram_baseline=baseline,
                   unigram_accuracy=baseline_accuracy, nsp_standard_errors=margin,
                   fill_mask=example)

# ---------------------------------------------------------------------------------- main


@releases_output_folder             # --out's lock, taken by start_ranks
def main(argv=None):
    args = parse_args(argv)
    setup_device(args)
    group = start_ranks(args)
    checkpoint_dir = os.path.join(args.out, "checkpoint")
    metrics_path = os.path.join(args.out, "metrics.jsonl") if group.is_main else None
    if args.batch_size % (group.world_size * args.grad_accum):
        ranks = f"{group.world_size} ranks x " if group.world_size > 1 else ""
        raise SystemExit(f"error: --batch-size {args.batch_size} is not divisible by "
                         f"{ranks}--grad-accum {args.grad_accum}")

    # vocab, tokenizer and data: rank 0 writes them, then the others read them
    if group.is_main:
        vocab_file, tokenizer, data = prepare(args, checkpoint_dir)
    group.barrier()
    if not group.is_main:
        vocab_file, tokenizer, data = prepare(args, checkpoint_dir)

    # model and optimizer, fresh or resumed; every rank starts from rank 0's weights
    if args.resume:
        model, optimizer, scaler, state = resumed_model(args, checkpoint_dir, vocab_file,
                                                        metrics_path)
    else:
        model, optimizer, scaler, state = new_model(args, tokenizer.vocab_size, metrics_path)
    broadcast_weights(group, model)
    if model.xp is not numpy:     # the counter-based generator, at the step the run is at:
        seed_dropout(model, args.seed, group.rank, state["step"])  # masks from (seed, step)
    config = model.config
    for dataset in data.train_sets + ([data.heldout] if data.heldout else []):
        dataset.check_compatible(config, tokenizer)
    model.train()
    print(f"model: {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
          f"{config.num_attention_heads} heads, vocab {config.vocab_size}: "
          f"{model.num_parameters() / 1e6:.2f}M parameters, {args.dtype} on {args.device}, "
          f"{group.describe()}; {active.describe()}")
    sizes = (f"{len(d):,} instances of length {d.max_seq_length}" for d in data.train_sets)
    print(f"data: {', '.join(sizes)}"
          + (f"; held-out {len(data.heldout):,}" if data.heldout else ""))

    # the loop, then a last checkpoint (written by rank 0; every rank checks it is finite)
    def save(step):
        if scaler:
            state["loss_scaler"] = scaler.state_dict()
        if group.is_main:
            state.update(step=step, total_steps=args.steps,
                         vocab_sha256=sha256_file(vocab_file), args=vars(args))
        save_checkpoint(checkpoint_dir, model, optimizer, state, vocab_file, step,
                        write=group.is_main)

    with StopFlag() as stop:
        step, stopped = train(args, group, model, optimizer, scaler, state, data, save, stop)
    save(step)
    end = ", the schedule's end (lr 0)" if step == args.steps else ""
    print(f"saved {checkpoint_dir} at step {step} of {args.steps}{end} "
          f"({state['train_seconds'] / 60:.1f} min of training)")
    if stopped or step == args.stop_at_step or not group.is_main:
        return 0

    # final evaluation, eval.json, the loss curve beside README's run, and where this run stands
    summary = {"step": step, "train_minutes": state["train_seconds"] / 60}
    if data.heldout:
        final_evaluation(args, model, tokenizer, data, metrics_path, summary)
    write_summary(os.path.join(args.out, "eval.json"), summary)
    plot_with_reference("pretrain", vars(args), metrics_path,
                        os.path.join(args.out, "loss_curve.png"), ("mlm_loss", "nsp_loss"))
    print(place_pretraining(vars(args), summary))
    return 0


if __name__ == "__main__":
    run_command(main)
