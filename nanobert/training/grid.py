"""The paper's fine-tuning protocol (its appendix A.3): every combination of a few learning
rates, epoch counts and batch sizes fine-tuned, each scored on dev, and the run best on dev
kept; no test score chooses anything. finetune.py runs its grid with run_grid; the choice
(dev_best) and the rates' names are bench.pretraining_ablation's too.

Each run has a folder of its own, <out>/<run name>/ (a finetune.py output folder); its
results.json says it finished, so a grid resumed after an interruption repeats no finished run
(and an unfinished one continues from its checkpoint). A run that fails goes in the table with
its error and the others go on."""
import argparse
import itertools
import os
import shutil
import time

import numpy

from nanobert.formats.fileio import atomic_folder, atomic_open, read_json

from .run import write_summary

GRID_FLAGS = ("lr", "epochs", "batch_size")         # the flags that take several values


def rate_name(lr):
    """3e-05, 1e-04, 1.5e-04, 1.0001e-04: a rate as folders and tables write it, with the
    fewest digits that tell it from every other float, so that two rates never share a run
    folder."""
    return numpy.format_float_scientific(lr, unique=True, trim="-", exp_digits=2)


# No --lr: the rate by the model's size (docs/finetuning.md, "the default rate"). The paper's
# 3e-5 (it searched 2e-5..5e-5 for BERT-base) suits MiniLM (H=384: dev 0.830). The smaller
# models train.py makes stay near the majority class at 3e-5 and want 3e-4 or more, but no
# one rate suits them all: dev picked 3e-4 for most BERT-Tiny starts (docs/ablation.md, where
# 1e-3 left the sentiment ones near the majority class), 1e-3 for README's nano checkpoint on
# sentiment and TREC, and at 1e-3 the nano shape from scratch collapsed on sentiment. So they
# get a small grid of both, and dev chooses.
LARGE_HIDDEN = 384
LARGE_RATES, SMALL_RATES = [3e-5], [3e-4, 1e-3]
DEFAULT_RATES = (f"{' '.join(map(rate_name, LARGE_RATES))} for a hidden size of "
                 f"{LARGE_HIDDEN} or more (MiniLM, BERT-base); below it (the models train.py "
                 f"makes) {'the grid ' * (len(SMALL_RATES) > 1)}"
                 f"{' '.join(map(rate_name, SMALL_RATES))}")


def small_model(config):
    return config.hidden_size < LARGE_HIDDEN


def default_rates(config):
    """The learning rate(s) of a run without --lr, by the model's size."""
    return list(SMALL_RATES if small_model(config) else LARGE_RATES)


def check_grid(args):
    """Refuse, in one line naming the flags, a grid that cannot run as asked: a value given
    twice, several --epochs beside --max-steps (which sets the schedule instead), --stop-at-step
    in a grid of several runs (which run would it stop?), a batch size that --grad-accum does
    not divide."""
    for flag in GRID_FLAGS:
        values = getattr(args, flag) or []
        if len(set(values)) < len(values):
            raise SystemExit(f"error: --{flag.replace('_', '-')} {' '.join(map(str, values))} "
                             "names a value twice")
    if args.max_steps and len(args.epochs or []) > 1:
        raise SystemExit("error: --max-steps sets every run's schedule: give one --epochs "
                         "value with it, or leave --max-steps out for a grid over epochs")
    runs = len(grid_runs({flag: getattr(args, flag) or [None] for flag in GRID_FLAGS}))
    if args.stop_at_step and runs > 1:
        raise SystemExit(f"error: --stop-at-step stops one run, and this grid has {runs}: "
                         "give one value each of --lr, --epochs and --batch-size with it")
    for batch_size in args.batch_size:
        if batch_size % args.grad_accum:
            raise SystemExit(f"error: --batch-size {batch_size} is not divisible by "
                             f"--grad-accum {args.grad_accum}")


def run_args(args, run, out):
    """The arguments of one run of the grid: its lr, epochs and batch size, its folder."""
    return argparse.Namespace(**{**vars(args), **run, "out": out})


def grid_runs(values):
    """{flag: [values]} -> one {flag: value} per combination, the first flag slowest."""
    return [dict(zip(values, combination)) for combination in itertools.product(*values.values())]


def run_name(run):
    """lr3e-04-epochs3-batch32: a run's folder and row, one per distinct combination."""
    epochs = numpy.format_float_positional(run["epochs"], unique=True, trim="-")
    return f"lr{rate_name(run['lr'])}-epochs{epochs}-batch{run['batch_size']}"


def dev_best(runs, lower_is_better=False):
    """The run with the best dev score (runs: dicts with "dev" and "lr"; a tie goes to the
    lower rate, the gentler change to the pretrained weights); None if none has a score."""
    scored = [run for run in runs if run.get("dev") is not None]
    if not scored:
        return None
    sign = -1 if lower_is_better else 1
    return max(scored, key=lambda run: (sign * run["dev"], -run["lr"]))


def run_grid(runs, out, fine_tune, metric, lower_is_better=False, resume=False,
             check=None):
    """Fine-tune every run of `runs` (grid_runs's) in <out>/<run_name>/ with
    fine_tune(run, folder) -> the run's summary (results.json's: "best" holds the dev score),
    or None when it stopped early (Ctrl-C, --minutes: the grid stops too, --resume goes on).
    resume: a run whose results.json exists is read back, not repeated, once check(run,
    summary) has not refused it (a flag that changed since). A run that raises is a row with
    its error. The dev-best run's best/ is copied to <out>/best, and the table printed and
    written to <out>/grid.md. -> (rows, the winning row or None), or None if a run stopped
    early."""
    rows = []
    for number, run in enumerate(runs, 1):
        folder = os.path.join(out, run_name(run))
        row = {**run, "run": run_name(run), "folder": folder, "dev": None}
        print(f"\n=== grid run {number}/{len(runs)}: {row['run']} ===", flush=True)
        done = os.path.join(folder, "results.json")
        start = time.time()
        summary = read_json(done, "results.json") if resume and os.path.isfile(done) else None
        if summary and check:
            check(run, summary)
        try:
            summary = summary or fine_tune(run, folder)
        except (Exception, SystemExit) as e:        # the others go on; the error is in the table
            row["error"] = str(e.code if isinstance(e, SystemExit) else e).removeprefix("error: ")
            print(f"grid run {row['run']} failed: {row['error']}")
            rows.append(row)
            continue
        if summary is None:
            return None
        best = summary["best"]
        row.update(dev=best["score"], best_epoch=best["epoch"], dev_scores=best["dev"],
                   collapsed=bool(best.get("collapsed")),
                   train_minutes=summary["train_minutes"],
                   wall_minutes=(time.time() - start) / 60)
        rows.append(row)
    winner = dev_best(rows, lower_is_better)
    if winner:
        with atomic_folder(os.path.join(out, "best")) as building:
            shutil.copytree(os.path.join(winner["folder"], "best"), building)
    write_table(out, rows, winner, metric)
    return rows, winner


def grid_table(rows, winner, metric):
    """The markdown table of a grid: each run's rate, epochs, batch size and dev score (or its
    error), the winner marked."""
    lines = [f"| run | lr | epochs | batch | dev {metric} | best epoch | training minutes | |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        cells = [row["run"], f"{row['lr']:g}", f"{row['epochs']:g}", str(row["batch_size"])]
        if row.get("error"):
            cells += ["failed", "", "", row["error"].replace("|", "/")]
        else:
            marks = ["**best on dev**"] * (row is winner) + ["collapsed"] * row["collapsed"]
            cells += [f"{row['dev']:.4f}", f"{row['best_epoch']:.2f}",
                      f"{row['train_minutes']:.1f}", ", ".join(marks)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_table(out, rows, winner, metric):
    """Print the table and write it to <out>/grid.md (and the rows to <out>/grid.json)."""
    table = grid_table(rows, winner, metric)
    print(f"\ngrid: {len(rows)} runs, dev {metric}" + (
        f"; best on dev: {winner['run']} ({winner['dev']:.4f})" if winner else
        "; every run failed") + "\n" + table)
    with atomic_open(os.path.join(out, "grid.md"), "w", encoding="utf-8") as f:
        f.write(table + "\n")
    write_summary(os.path.join(out, "grid.json"),
                  {"metric": metric, "winner": winner and winner["run"], "runs": rows})
