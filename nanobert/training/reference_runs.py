"""Known-good runs to place yours against ("is my loss curve normal?"): README's default
commands measured on a quiet 2-core machine, their curves shipped with the package
(nanobert/data/reference_runs/*.json, a few KB each). train.py draws the one of its preset and
corpus behind its own curves in loss_curve.png and ends with one line placing its held-out MLM
accuracy against it at the same step; finetune.py does the same for its default run (no
arguments) with its dev score. A run with no reference of its kind says so.

Regenerate a reference from a finished run's folder (its metrics.jsonl, and eval.json with
checkpoint/trainer_state.json for train.py, results.json for finetune.py):

    python -m nanobert.training.reference_runs runs/pretrain --machine "quiet 2-core machine"
    python -m nanobert.training.reference_runs runs/finetune-classify-movie-sentiment \\
        --machine "quiet 2-core machine"
"""
import argparse
import json
import os
import sys
import time

import numpy

from nanobert import flags
from nanobert.formats.fileio import atomic_open, read_json

from .metrics import plot, read_metrics

FOLDER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                      "reference_runs")
# How far below the reference a run may be and still be "on track". Pretraining: 0.01 of
# held-out MLM accuracy, about 2.3 standard errors of train.py's held-out estimate on Brown
# (10,853 masked tokens at ~0.27). Fine-tuning: 0.02 of dev accuracy, about 2
# standard errors on movie-sentiment's 1,060 dev sentences.
TOLERANCE = {"pretrain": 0.01, "finetune": 0.02}
# The flags that shape a run's curve besides the preset / model and the data: a difference is
# named when a run is behind ("your run differs in --lr").
RECIPE = {"pretrain": ("max_seq_length", "batch_size", "grad_accum", "lr", "warmup",
                       "dupe_factor", "max_predictions_per_seq", "whole_word_mask", "no_nsp",
                       "dynamic_masking", "cased", "vocab_size", "phase2_max_seq_length",
                       "seed", "dtype", "optimizer", "weight_decay"),
          "finetune": ("lr", "epochs", "batch_size", "grad_accum", "max_train_examples",
                       "max_seq_length", "dropout", "warmup", "layer_decay", "seed", "dtype",
                       "optimizer", "weight_decay", "from_scratch")}
# A reference keeps the train rows of every this many steps: train.py logs every 20 of ~18,000,
# finetune.py every 10 of its default run's 125.
TRAIN_EVERY = {"pretrain": 200, "finetune": 10}
LEFT_OUT = ("mfu", "ranks", "sequences", "masked_tokens", "nsp_majority_accuracy")


def reference_name(kind, args):
    """The reference file's name for a run's args (train.py's or finetune.py's), or None:
    pretrain-<preset>-<corpus> for train.py on a preset and a corpus's own text, finetune-
    default for finetune.py with no data and no model named (its demo)."""
    if kind == "pretrain":
        own_text = os.path.join("data", args["corpus"], "train.txt.gz")   # its default --data
        if args.get("config") or args.get("init_from") or len(args["data"]) != 1 \
                or not args["data"][0].endswith(own_text):
            return None
        return f"pretrain-{args['preset']}-{args['corpus']}"
    return "finetune-default" if args.get("demo") and args["model"] == flags.DEFAULT_MODEL \
        else None


def load(kind, args):
    """-> (the reference of this run's kind and args, or None; what the run is, in words)."""
    name = reference_name(kind, args)
    if kind == "finetune":
        what = f"--model {args['model']} on your data"
    else:
        what = f"--preset {args['preset']} on --corpus {args['corpus']}" if name else \
            "a run with --config, --data or --init-from"
    path = name and os.path.join(FOLDER, name + ".json")
    return (read_json(path, "reference run") if path and os.path.isfile(path) else None), what


def known():
    """The presets and corpora with a pretraining reference, as flags."""
    names = sorted(os.listdir(FOLDER)) if os.path.isdir(FOLDER) else []
    return [f"--preset {preset} on --corpus {corpus[:-len('.json')]}"
            for _, preset, corpus in (n.split("-", 2) for n in names
                                      if n.startswith("pretrain-") and n.endswith(".json"))]


def differences(kind, args, reference):
    """The recipe flags whose values differ from the reference's, as --flags."""
    def as_list(value):                 # finetune.py's grid flags: one value or several
        return value if isinstance(value, list) else [value]

    def same(a, b):                     # through JSON, as the reference was written
        return json.loads(json.dumps(as_list(a))) == as_list(b)
    return ["--" + k.replace("_", "-") for k in RECIPE[kind]
            if k in reference["args"] and not same(args.get(k), reference["args"][k])]

# ------------------------------------------------------------------------ placing a run


def at_step(reference, key, step, kind="eval"):
    """The reference's held-out (or dev) `key` at `step` (kind "train": its train rows', as
    the rate), linear between its rows; None before its first."""
    points = [(r["step"], r[key]) for r in reference["curve"]
              if r["kind"] == kind and r.get("split", "dev") == "dev" and key in r]
    if not points or step < points[0][0]:
        return None
    return float(numpy.interp(step, *zip(*points)))


def standing(value, expected, kind):
    if value > expected + TOLERANCE[kind]:
        return "ahead of it"
    return "on track" if value >= expected - TOLERANCE[kind] else "behind"


def hint(kind, args, reference, verdict):
    """Why a run might be behind: the flags it changed, else the usual suspects."""
    if verdict != "behind":
        return ""
    changed = differences(kind, args, reference)
    return (f" (your run differs in {', '.join(changed)})" if changed else
            " (a different corpus? a changed model or data?)")


def place_pretraining(args, summary):
    """One line: the run's held-out MLM accuracy at its last step against the reference run's
    at the same step, and against its end; or why there is nothing to place it against."""
    reference, what = load("pretrain", args)
    if reference is None:
        return (f"no reference run for {what} (there is one for {', '.join(known())}): "
                "loss_curve.png shows your run alone")
    if "heldout" not in summary:
        return "no held-out evaluation (--heldout none): nothing to place against the reference run"
    step, accuracy = summary["step"], summary["heldout"]["mlm_accuracy"]
    end = reference["heldout"]["mlm_accuracy"]
    about = f"the reference run ({reference['command']}, {reference['machine']})"
    expected = at_step(reference, "mlm_accuracy", step)
    line = f"held-out MLM accuracy {accuracy:.3f} at step {step:,}; {about} had "
    if expected is None:
        first = min(r["step"] for r in reference["curve"] if r["kind"] == "eval")
        return line + f"its first held-out point at step {first:,}: too early to place"
    if step >= reference["steps"]:
        verdict = standing(accuracy, end, "pretrain")
        return line + f"{end:.3f} at its end (step {reference['steps']:,}): {verdict}" + \
            hint("pretrain", args, reference, verdict)
    verdict = standing(accuracy, expected, "pretrain")
    shorter = args.get("steps") and args["steps"] < reference["steps"]
    why = hint("pretrain", args, reference, verdict)
    if verdict == "behind" and shorter and not differences("pretrain", args, reference):
        why = (f" (a shorter schedule: your rate fell to 0 by step {args['steps']:,}, the "
               f"reference's was {at_step(reference, 'lr', step, 'train'):.1e} at this step)")
    busy = (f": fewer steps in the same {args['minutes']:g} minutes here (a busier or slower "
            "machine)" if shorter and args.get("minutes") else "")
    return line + f"{expected:.3f} at this step: {verdict}{why}; it went on to step " \
        f"{reference['steps']:,} ({end:.3f}){busy}"


def place_finetuning(args, summary):
    """One line: the run's best dev score against the reference run's (finetune.py's default
    run), or that only the default run has one."""
    reference, what = load("finetune", args)
    if reference is None:
        return (f"no reference run for {what} (only for `python finetune.py` with no "
                "arguments)")
    best, metric = summary["best"], reference["best"]["metric"]
    if best["metric"] != metric:
        return f"no reference run for --metric {best['metric']} (the reference's: {metric})"
    expected = reference["best"]["score"]
    verdict = standing(best["score"], expected, "finetune")
    return (f"dev {metric} {best['score']:.3f} after {epochs(best['epoch'])}; the reference run "
            f"({reference['command']}, {reference['machine']}) had {expected:.3f} after "
            f"{epochs(reference['best']['epoch'])}: {verdict}"
            + hint("finetune", args, reference, verdict))


def epochs(count):
    return f"{count:.2g} epoch" + ("" if count == 1 else "s")


def plot_with_reference(kind, args, metrics_path, png_path, keys, alone=True):
    """loss_curve.png: the run's curves of `keys`, the reference run's (if any) behind them;
    alone=False: no picture for a run without a reference."""
    reference, _ = load(kind, args)
    if reference or alone:
        plot(metrics_path, png_path, keys, behind=reference and reference["curve"])


# --------------------------------------------------------------------- writing a reference


def curve(metrics_path, every):
    """The rows of metrics.jsonl a reference keeps: the train rows of every `every` steps
    (and the last), every evaluation; their losses and scores, the step, rate and time, rounded
    to 4 significant digits (the pace and counts left out)."""
    rows = read_metrics(metrics_path)
    last = max(r["step"] for r in rows if r["kind"] == "train")
    kept = [r for r in rows if r["kind"] == "eval" or r["step"] % every == 0
            or r["step"] == last]
    return [{k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in r.items()
             if isinstance(v, (int, float, str)) and k not in LEFT_OUT
             and not k.endswith("per_second")} for r in kept]


def dump(reference):
    """The reference as JSON text: its facts indented, its curve a row a line (small, and a
    diff of two references reads row by row)."""
    rows = ",\n".join("  " + json.dumps(row) for row in reference["curve"])
    head = json.dumps({**reference, "curve": "ROWS"}, indent=1)
    return head.replace('"ROWS"', "[\n" + rows + "\n ]") + "\n"


def write_reference(folder, machine, command=None):
    """The reference of the finished run in `folder`, written to FOLDER/<its name>.json ->
    the path."""
    pretraining = os.path.isfile(os.path.join(folder, "eval.json"))
    kind = "pretrain" if pretraining else "finetune"
    if pretraining:
        summary = read_json(os.path.join(folder, "eval.json"), "eval.json")
        args = read_json(os.path.join(folder, "checkpoint", "trainer_state.json"),
                         "trainer_state.json")["args"]
        facts = {"steps": summary["step"], "train_minutes": summary["train_minutes"],
                 "heldout": {k: summary["heldout"][k] for k in
                             ("mlm_accuracy", "mlm_loss", "nsp_accuracy", "nsp_loss")}}
    else:
        summary = read_json(os.path.join(folder, "results.json"), "results.json")
        args = summary["args"]
        facts = {"best": {k: summary["best"][k] for k in ("score", "metric", "epoch")},
                 "test": summary.get("test"), "train_minutes": summary["train_minutes"]}
    name = reference_name(kind, args)
    if name is None:
        raise SystemExit(f"error: {folder} is not a run that has a reference: train.py on a "
                         "--preset and a --corpus's own text, or finetune.py with no arguments")
    path = os.path.join(FOLDER, name + ".json")
    os.makedirs(FOLDER, exist_ok=True)
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.write(dump({
        "command": command or ("`python train.py`" if pretraining else "`python finetune.py`"),
        "machine": machine, "date": time.strftime("%Y-%m-%d"),
        "args": {k: args.get(k) for k in ("preset", "corpus", "model", *RECIPE[kind])
                 if k in args},
        **facts, "curve": curve(os.path.join(folder, "metrics.jsonl"), TRAIN_EVERY[kind])}))
    return path


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m nanobert.training.reference_runs",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("folder", help="a finished run's --out folder")
    p.add_argument("--machine", required=True,
                   help="where it ran, as the placing line says it: e.g. 'quiet 2-core machine'")
    p.add_argument("--command", help="the command, as the line says it (default: `python "
                                     "train.py` / `python finetune.py`)")
    args = p.parse_args(argv)
    print(f"wrote {write_reference(args.folder, args.machine, args.command)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
