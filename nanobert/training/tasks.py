"""finetune.py's tasks of the paper, one record each in TASKS: how a task reads its files,
picks its label set, turns examples into WordPiece features, which head it trains, how its
dev/test outputs are scored (the official scripts' rules) and written. A new task is a new
record. Also the data of a run (every split read and featurised), prediction in batches, and
finetune.py --do eval / predict: a fine-tuned folder's task and labels, scored or applied."""
import collections
import dataclasses
import functools
import json
import os
from typing import Callable, NamedTuple

import numpy

from nanobert.backend import to_host
from nanobert.data import datasets, metrics, squad, tasks
from nanobert.formats import checkpoint, safetensors
from nanobert.data.tokenizer import BertTokenizer
from nanobert.formats.fileio import atomic_open, output_folder, read_json
from nanobert.formats.hub import resolve_model
from nanobert.model import ops
from nanobert.model.config import BertConfig, num_labels
from nanobert.model.heads import (BertForMultipleChoice, BertForQuestionAnswering,
                                  BertForSequenceClassification, BertForTokenClassification,
                                  problem_type_of)
from nanobert.model.optim import average_gradients

from .folder import lock_folder
from .guards import check_loss
from .run import eval_mode, write_summary
from .step import update

SPLITS = ("train", "dev", "test")
DO_SPLITS = {"train": SPLITS, "eval": ("dev", "test"), "predict": ("test",)}   # finetune --do


class Data(NamedTuple):
    """What load_data read: the splits and what reading them found out."""
    splits: dict            # "train" / "dev" / "test" -> (examples, Features)
    label_list: list        # classify / pair / multilabel / ner: the label set (else None)
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
    named_labels: bool = False  # predicts one of a label set, saved as the head's id2label
    multi_label: bool = False   # predicts a set of labels (a sigmoid each), not one of them

# ------------------------------------------------------------------ readers, per task


def read_texts(args, path, split, train_stats, regression=False, multi_label=False):
    """classify / pair / regress / multilabel: a GLUE TSV, or one laid out by --text-columns
    (multilabel: the label column holds comma-separated names)."""
    labeled = split != "test"
    if args.glue_task:
        return tasks.read_glue(path, args.glue_task, require_labels=labeled), {}
    label = tasks.parse_columns(args.label_column)[0] if args.label_column else None
    return tasks.read_tsv(path, tasks.parse_columns(args.text_columns), label, header=args.header,
                          regression=regression, require_labels=labeled,
                          multi_label=multi_label), {}


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
    """Dev and test are read as the version of the training file (unless --squad-version;
    without a training file, each file's own)."""
    version = None if args.squad_version == "auto" else args.squad_version == "2.0"
    if split != "train" and args.squad_version == "auto" and train_stats:
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


def featurize_texts(args, tokenizer, examples, label_list, split, regression=False,
                    multi_label=False):
    return tasks.featurize_texts(tokenizer, examples, args.max_seq_length, label_list,
                                 regression=regression, multi_label=multi_label)


def featurize_tokens(args, tokenizer, examples, label_list, split):
    return tasks.featurize_tokens(tokenizer, examples, args.max_seq_length, label_list)


def featurize_squad(args, tokenizer, examples, label_list, split):
    return squad.featurize_squad(tokenizer, examples, args.max_seq_length, args.doc_stride,
                                 args.max_query_length, is_training=split == "train")


def featurize_choices(args, tokenizer, examples, label_list, split):
    return tasks.featurize_choices(tokenizer, examples, args.max_seq_length)


# what each sequence-classification task declares its head to be (config.problem_type)
TASK_PROBLEM_TYPES = {"classify": "single_label_classification",
                      "pair": "single_label_classification", "regress": "regression",
                      "multilabel": "multi_label_classification"}


def head_labels(task_name):
    """The head_options of a sequence-classification task: its labels (one output for
    regress) and its problem_type, declared here, where the task is known."""
    def options(label_list):
        labels = {"num_labels": 1} if label_list is None else id2label(label_list)
        return {**labels, "problem_type": TASK_PROBLEM_TYPES[task_name]}
    return options


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


def evaluate_label_sets(args, tokenizer, data, examples, features, outputs):
    """multilabel: each label whose probability sigmoid(logit) is above 0.5; micro precision,
    recall and F1 over every (example, label) pair (sklearn's average="micro"), exact match
    (the whole set right: sklearn's subset accuracy) and the loss; predictions are label sets
    (tuples of names, in label order)."""
    logits = numpy.stack(outputs).astype(numpy.float64)     # [N, C]
    predicted = (logits > 0).astype(numpy.int64)            # sigmoid(x) > 0.5 exactly when x > 0
    sets = [tuple(data.label_list[j] for j in numpy.flatnonzero(row)) for row in predicted]
    gold = features.targets.get("labels")                   # [N, C] 0/1
    if gold is None:
        return {}, sets
    precision, recall, f1 = metrics.precision_recall_f1(predicted.ravel(), gold.ravel(), 1)
    return {"micro_f1": f1, "exact_match": float((predicted == gold).all(axis=1).mean()),
            "micro_precision": precision, "micro_recall": recall,
            "loss": float(ops.bce_with_logits_forward(logits, gold)[0])}, sets


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


# Dev scores where lower is better: --metric keeps the checkpoint with the lowest of these.
LOWER_IS_BETTER = frozenset({"loss"})


def selectable_metrics(scores):
    """The dev scores --metric may pick: numbers, not counts ("total", "HasAns_total") nor
    thresholds ("best_f1_thresh") nor per-type tables."""
    return sorted(k for k, v in scores.items()
                  if isinstance(v, (int, float)) and not k.endswith(("total", "_thresh")))


def is_better(metric, scores, best_score):
    """Whether scores[metric] beats best_score (None: nothing yet): higher for a score, lower
    for a loss. A metric that is not among `scores` is refused, naming the ones that are."""
    allowed = selectable_metrics(scores)
    if metric not in allowed:
        raise SystemExit(f"error: --metric {metric} is not among the dev scores; pick one of "
                         f"{', '.join(allowed)}")
    if best_score is None:
        return True
    score = scores[metric]
    return score < best_score if metric in LOWER_IS_BETTER else score > best_score


# A model that predicts one class for this share of dev, where dev's commonest class is rarer
COLLAPSED_SHARE = 0.95


def collapse_report(args, task, data, scores, predictions):
    """classify / pair / multilabel / ner: one line when the model has collapsed, else None:
    it predicts one class (ner: one tag; multilabel: one label set) for nearly all of dev
    while dev's own commonest class is rarer, or its dev score is not above the majority
    class's (every row given dev's commonest class, scored by the task's own rules)."""
    examples, features = data.splits["dev"]
    if not task.named_labels or not scores:
        return None
    if task.head is BertForTokenClassification:
        gold = [tag for e in examples for tag in e.tags]
        predicted = [tag for tags in predictions for tag in tags]
    elif task.multi_label:
        gold = [tuple(data.label_list[j] for j in numpy.flatnonzero(row))
                for row in features.targets["labels"]]
        predicted = predictions
    else:
        gold = [data.label_list[i] for i in features.targets["labels"]]
        predicted = predictions
    majority, majority_count = collections.Counter(gold).most_common(1)[0]
    commonest, count = collections.Counter(predicted).most_common(1)[0]
    metric = task.metric if args.metric in LOWER_IS_BETTER else args.metric
    hot = constant_logits(task, data.label_list, majority)
    constant = [numpy.tile(hot, (features.length(r), 1)) if task.head is
                BertForTokenClassification else hot for r in range(len(features))]
    baseline = task.evaluate(args, None, data, examples, features, constant)[0][metric]
    one_class = count / len(predicted) >= COLLAPSED_SHARE > majority_count / len(gold)
    if not one_class and scores[metric] > baseline:
        return None
    return (f"warning: the model looks collapsed: it predicts {shown(commonest)} for "
            f"{count / len(predicted):.0%} of dev, dev {metric} {scores[metric]:.4f} against "
            f"{baseline:.4f} for always {shown(majority)}; try a higher --lr or a grid (--lr 1e-4 "
            "3e-4 1e-3), more --epochs (--epochs 3 5), or a longer pretraining")


def constant_logits(task, label_list, prediction):
    """One row of logits that predicts `prediction`: a class (its one-hot row: the argmax), or
    for multilabel a label set (+1 on its labels, -1 elsewhere: sigmoid above 0.5 on them)."""
    if task.multi_label:
        return numpy.array([1.0 if name in prediction else -1.0 for name in label_list])
    return numpy.eye(len(label_list))[label_list.index(prediction)]


def shown(prediction):
    """A class, tag or label set as the collapse report names it."""
    if isinstance(prediction, tuple):
        return repr(",".join(prediction)) if prediction else "no label"
    return repr(prediction)


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
    """index, prediction (and label, when every example has one): GLUE's submission format;
    a label set as its comma-separated names, as the files give them (empty: no label)."""
    path = os.path.join(folder, f"{split}_predictions.tsv")
    labeled = all(getattr(e, "label", None) is not None for e in examples)
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.write("index\tprediction" + ("\tlabel" if labeled else "") + "\n")
        for i, (e, p) in enumerate(zip(examples, predictions)):
            f.write(f"{i}\t{tsv_cell(p)}" + (f"\t{tsv_cell(e.label)}" if labeled else "") + "\n")
    return path


def tsv_cell(value):
    if isinstance(value, float):
        return f"{value:.6g}"
    return ",".join(value) if isinstance(value, tuple) else str(value)

# ---------------------------------------------------------------------------- the tasks


TASKS = {
    "classify": Task(BertForSequenceClassification, read=read_texts, labels=class_labels,
                     featurize=featurize_texts, head_options=head_labels("classify"),
                     evaluate=evaluate_classes, write=write_tsv, metric="accuracy",
                     text_columns=1, named_labels=True),
    "pair": Task(BertForSequenceClassification, read=read_texts, labels=class_labels,
                 featurize=featurize_texts, head_options=head_labels("pair"),
                 evaluate=evaluate_classes, write=write_tsv, metric="accuracy",
                 text_columns=2, named_labels=True),
    "regress": Task(BertForSequenceClassification,
                    read=functools.partial(read_texts, regression=True), labels=no_labels,
                    featurize=functools.partial(featurize_texts, regression=True),
                    head_options=head_labels("regress"),
                    evaluate=evaluate_regression, write=write_tsv, metric="spearman",
                    text_columns=1),
    "multilabel": Task(BertForSequenceClassification,
                       read=functools.partial(read_texts, multi_label=True), labels=class_labels,
                       featurize=functools.partial(featurize_texts, multi_label=True),
                       head_options=head_labels("multilabel"), evaluate=evaluate_label_sets,
                       write=write_tsv, metric="micro_f1", text_columns=1, named_labels=True,
                       multi_label=True),
    "ner": Task(BertForTokenClassification, read=read_conll, labels=tag_labels,
                featurize=featurize_tokens, head_options=id2label,
                evaluate=evaluate_tags, write=write_conll, metric="f1", named_labels=True),
    "squad": Task(BertForQuestionAnswering, read=read_squad, labels=no_labels,
                  featurize=featurize_squad, head_options=lambda _: {"num_labels": 2},
                  evaluate=evaluate_squad, write=write_squad, metric="f1",
                  max_seq_length=384, dev_targets=False),
    "choice": Task(BertForMultipleChoice, read=read_swag, labels=no_labels,
                   featurize=featurize_choices, head_options=lambda _: {},
                   evaluate=evaluate_choices, write=write_tsv, metric="accuracy"),
}

# what a fine-tuned folder's head class (config.json's architectures) was trained for
HEAD_TASKS = {"BertForSequenceClassification": "classify", "BertForTokenClassification": "ner",
              "BertForQuestionAnswering": "squad", "BertForMultipleChoice": "choice"}

# ---------------------------------------------------------------------------------- data


# GPU fine-tuning pads each batch to a multiple of this many positions: each length is a CUDA
# graph of its own (training/graph.py), so a handful (4 up to the default 128), not one per
# longest row
GRAPH_LENGTH_MULTIPLE = 32


def fine_tuning_step(args, group, model, optimizer, scaler, gpu_step, features, parts, rows,
                     lr, step):
    """One update from the training rows in `parts` (this rank's micro-batches), each weighed
    by its share of the global batch's `rows`: on the CPU average_gradients then step.update;
    on the GPU gpu_step (graph.GPUTrainStep: the same, replayed from a CUDA graph).
    -> the batch's loss, summed over the ranks (read every step: fine-tuning steps are few);
    a non-finite one stops the run."""
    weights = [len(p) / rows for p in parts]
    if gpu_step:
        loss, _ = gpu_step(graph_batches(model, features, parts, args.max_seq_length), lr,
                           weights)
        loss = group.sum([float(loss)])[0]
        check_loss(loss, step, model)
        return loss
    loss, grads, _ = average_gradients(
        lambda batch: model.loss_and_grads(batch, loss_scale=scaler.scale if scaler else None),
        [features.batch(p) for p in parts], weights=weights)
    loss = group.sum([loss])[0]
    update(group, model, optimizer, scaler, grads, lr, step, args.max_grad_norm, args.optimizer,
           loss=loss)
    return loss


def graph_batches(model, features, parts, max_length):
    """A GPU step's micro-batches (rows of `features` in `parts`) as check_batch dicts, each
    padded to a multiple of GRAPH_LENGTH_MULTIPLE positions (at most max_length), with the
    counts its losses divide by as inputs (model.graph_counts)."""
    hosts = []
    for rows in parts:
        host = model.check_batch(features.batch(rows, GRAPH_LENGTH_MULTIPLE, max_length))
        host.update(model.graph_counts(host))
        hosts.append(host)
    return hosts


def load_data(args, tokenizer, label_list=None):
    """-> Data: each split's examples and Features, the label list, the SQuAD version.
    Prints what was read and what was cut. label_list: a fine-tuned model's (--do eval /
    predict: no training split); None: from the flags or the training data."""
    task = TASKS[args.task]
    raw, dataset_labels = read_splits(args, task)
    raw = limit_examples(args, raw)
    if "train" in raw:
        label_list = task.labels(args, raw["train"][0], dataset_labels)
    elif label_list:
        for examples, _ in raw.values():
            refuse_unknown_labels(examples, label_list, args.model)
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
    first_stats = next(iter(raw.values()))[1]        # the training file's, when there is one
    return Data(splits, label_list, squad_v2=first_stats.get("version") == "2.0")


def read_splits(args, task):
    """-> ({split: (examples, reader stats)}, the data set's label list or None)."""
    if args.dataset and args.dataset != "conll2003":
        examples, dataset_labels, about = datasets.load(args.dataset, args.task)
        print(f"data: {about}")
        return {split: (e, {}) for split, e in zip(SPLITS, examples)
                if split in DO_SPLITS[args.do]}, dataset_labels
    raw = {}
    for split, path in zip(SPLITS, (args.train, args.dev, args.test)):
        if path:
            raw[split] = task.read(args, path, split, raw["train"][1] if "train" in raw else None)
    return raw, None


def limit_examples(args, raw):
    """--max-train-examples (a seeded subset) and --max-eval-examples (the first N)."""
    examples, stats = raw.get("train", ((), None))
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
    order = sorted(range(len(features)), key=features.length)
    results = [None] * len(features)
    with eval_mode(model):
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



# ------------------------------------------------------------- a fine-tuned model folder


def check_length(args, model):
    """--max-seq-length fits the model's position table, or one line saying it does not."""
    if args.max_seq_length > model.config.max_position_embeddings:
        raise SystemExit(f"error: --max-seq-length {args.max_seq_length} exceeds the model's "
                         f"max_position_embeddings {model.config.max_position_embeddings}")


def evaluate_fine_tuned(args):
    """--do eval / predict: the fine-tuned --model on the dev / test data, no training; each
    split's predictions file written and its scores printed (eval: labels required) and, for
    eval, saved in eval_results.json."""
    folder, task = resolve_model(args.model), TASKS[args.task]
    lock_folder(output_folder(args.out))   # one run per folder: not into a run still writing it
    tokenizer = BertTokenizer.from_pretrained(folder)
    print(f"task {args.task}: {args.do} with {args.model} ({folder})")
    data = load_data(args, tokenizer, label_list=args.model_labels)
    model = task.head.from_pretrained(folder, dtype=numpy.dtype(args.dtype), device=args.device)
    check_length(args, model)
    results = {}
    for split, (examples, _) in data.splits.items():
        scores, predictions = evaluate(args, task, model, tokenizer, data, split)
        if args.do == "eval" and not scores:
            raise SystemExit(f"error: the {split} data has no labels to score "
                             "(--do predict writes its predictions)")
        path = task.write(args.out, split, examples, predictions, data)
        if scores:
            print(f"{split}: {format_scores(scores)}")
        print(f"wrote {path}")
        results[split] = scores
    if args.do == "eval":
        write_summary(os.path.join(args.out, "eval_results.json"), {
            "task": args.task, "model": args.model, **results,
            "data": {split: f.stats for split, (_, f) in data.splits.items()}, "args": vars(args)})
    return 0


def fine_tuned_task(folder, wanted=None):
    """The task a fine-tuned folder (finetune.py's best/) predicts, and its label names:
    `wanted` (--task), else what best.json says, else its head class (config.json's
    architectures; a sequence classifier's problem_type tells classify, regress or
    multilabel). SystemExit, one line, if the folder lacks the head the task needs.
    -> (task name, label list or None)"""
    config = checkpoint.read_config(folder)
    architecture = (config.get("architectures") or ["no architectures"])[0]
    best = os.path.join(folder, "best.json")
    saved = read_json(best, "best.json").get("task") if os.path.isfile(best) else None
    name = wanted or saved or HEAD_TASKS.get(architecture)
    labels = num_labels(BertConfig.from_dict(config))
    kind = problem_type_of(BertConfig.from_dict(config)) if name in TASK_PROBLEM_TYPES else None
    if name == "classify" and not wanted:          # the head's problem_type says which
        name = {"regression": "regress", "multi_label_classification": "multilabel"}.get(kind,
                                                                                        name)
    task = TASKS.get(name)
    tensors = safetensors.read_header(os.path.join(folder, "model.safetensors"))
    missing = [k for k in task.head.head_shapes(BertConfig.from_dict(config))
               if k not in tensors] if task else ["a task head"]
    found = f"a {architecture}" + (f" without {missing[0]}" if missing else "")
    needs = None
    if task is None or missing or architecture != task.head.__name__:
        needs = f"; --task {name} needs a {task.head.__name__}" if task else ""
    elif kind != TASK_PROBLEM_TYPES.get(name, kind):
        found += f" with {labels} output(s) of problem_type {kind}"
        needs = f"; --task {name} needs {TASK_PROBLEM_TYPES[name]}"
    if needs is not None:
        raise SystemExit(f"error: {folder} is {found}{needs}: give a folder that finetune.py "
                         "fine-tuned (its best/)")
    id2label = config.get("id2label") or {}
    return name, [id2label[str(i)] for i in range(labels)] if task.named_labels else None


def refuse_unknown_labels(examples, label_list, model):
    """Every label (ner: tag) of the examples is one the model predicts, or one line naming
    the first that is not, where it is, and the model's labels."""
    known = set(label_list)
    for e in examples:
        label = getattr(e, "label", None)
        tags = e.tags if hasattr(e, "tags") else label if isinstance(label, tuple) else [label]
        for k, label in enumerate(tags or ()):
            if label is not None and label not in known:
                where = f"{e.path}:{e.lines[k]}" if hasattr(e, "lines") else e.where
                raise ValueError(f"{where}: label {label!r} is not one of the model's labels "
                                 f"(id2label of {model}: {label_list})")
