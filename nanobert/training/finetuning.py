"""finetune.py's helpers that are not its recipe: its data flags checked against each other
(--do eval / predict, --dataset, TSV columns), the output folder's name, the model under
another dropout, the best checkpoint saved, and the test set scored with it."""
import dataclasses
import os

import numpy

from nanobert.data import datasets, tasks
from nanobert.formats.fileio import atomic_folder
from nanobert.formats.hub import resolve_model
from nanobert.model.config import BertConfig

from .metrics import append_metrics
from .run import write_summary
from .grid import default_rates, small_model
from .tasks import evaluate, format_scores


# ------------------------------------------------------ finetune.py's flags, checked


def check_no_training(args):
    """--do eval / predict: data to score or label, and no flag that only training reads."""
    if args.task == "features":
        raise SystemExit(f"error: --task features takes no --do {args.do} (it writes features)")
    training = ("train", "epochs", "max_steps", "resume", "stop_at_step", "from_scratch",
                "reinit_head", "max_train_examples", "labels", "layer_decay") + \
        (("dev",) if args.do == "predict" else ())
    given = [k for k in training if getattr(args, k) not in (None, False)]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise SystemExit(f"error: --do {args.do} does not train: {flag} has no use there"
                         + (" (labels come from the model's id2label)" if flag == "--labels"
                            else ""))
    if not (args.dataset or args.test or args.dev):
        files = "--test FILE" if args.do == "predict" else "--dev and/or --test FILE(s)"
        raise SystemExit(f"error: --do {args.do} needs data: {files}, or --dataset NAME")


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
    and their defaults filled in (text column 0, or 0,1 for pair; the label after them, but
    for --do predict, which reads the texts alone)."""
    args.text_columns = args.text_columns or ",".join(str(i) for i in range(count))
    columns = tasks.parse_columns(args.text_columns)
    if len(columns) != count:
        raise SystemExit(f"error: --task {args.task} takes {count} text column(s), "
                         f"got {args.text_columns!r}")
    if not args.label_column and args.do != "predict":  # predict: texts alone, unless given
        if not isinstance(columns[-1], int):
            raise SystemExit("error: give --label-column when the text columns are named")
        args.label_column = str(columns[-1] + 1)
    labels = tasks.parse_columns(args.label_column) if args.label_column else []
    args.header = args.header or any(isinstance(c, str) for c in (*columns, *labels))


# ------------------------------------------------------- finetune.py's model and its outputs


def size_defaults(args, demo_sizes):
    """The defaults that depend on the model's size: no --lr, its rate(s) (grid.default_rates);
    the demo's sizes (`demo_sizes`: 4,000 sentences for 1 epoch) suit MiniLM's pace, and a
    model train.py makes runs the paper's 3 epochs over all of them in less time."""
    config = BertConfig.from_json_file(os.path.join(resolve_model(args.model), "config.json"))
    args.lr = args.lr or default_rates(config)
    demo = demo_sizes if args.demo and not small_model(config) else {}
    if args.max_train_examples is None:
        args.max_train_examples = demo.get("max_train_examples")
    args.max_train_examples = args.max_train_examples or None
    args.epochs = args.epochs or [demo.get("epochs", 3)]


def model_name(args):
    """-<name> of the output folder: the model's folder (its parent's for a best/ or
    checkpoint/), so that runs of two models on one task land apart."""
    parts = [p for p in os.path.normpath(args.model).split(os.sep)
             if p not in ("", ".", "..", "runs", "best", "checkpoint")]
    return f"-{parts[-1] if parts else 'model'}" + ("-from-scratch" if args.from_scratch else "")


def with_dropout(model, task, p, device):
    """The same weights under a config whose dropout probabilities are all p (a pretraining
    run without dropout still fine-tunes with the paper's 0.1); best/config.json keeps p."""
    extra = {k: v for k, v in model.config.extra.items() if k != "classifier_dropout"}
    config = dataclasses.replace(model.config, hidden_dropout_prob=p,
                                 attention_probs_dropout_prob=p, extra=extra)
    return task.head(config, dtype=model.dtype, device=device, params=model.params)


def save_best(model, tokenizer, folder, info):
    """The HF folder + vocab + tokenizer_config.json + best.json, swapped in atomically: built
    beside `folder`, then renamed over it (a crash leaves the old one or the new one)."""
    with atomic_folder(folder) as building:
        model.save_pretrained(building)
        tokenizer.save_pretrained(building)
        write_summary(os.path.join(building, "best.json"), info)


def evaluate_test(args, task, tokenizer, data, best):
    """The test split with the best checkpoint: predictions written, scores (when labeled)
    logged and printed. -> the scores."""
    model = task.head.from_pretrained(os.path.join(args.out, "best"),
                                      dtype=numpy.dtype(args.dtype), device=args.device)
    scores, predictions = evaluate(args, task, model, tokenizer, data, "test")
    path = task.write(args.out, "test", data.splits["test"][0], predictions, data)
    if scores:
        append_metrics(os.path.join(args.out, "metrics.jsonl"),
                       {"kind": "eval", "split": "test", "step": best["step"], **scores})
        print(f"test (best checkpoint): {format_scores(scores)}")
    print(f"wrote {path}")
    return scores
