"""Fine-tuning starts compared over seeds, the paper's way (its Tables 5-6 and appendix A.3):
finetune.py runs (jobs, two at a time), one small record per finished run, the learning rate
chosen on dev for each (task, start, seed) and only the chosen run's test score kept, and the
difference of two starts in units of their pooled seed spread. bench/pretraining_ablation.py
(the ablation, many starts) and nanobert/check_pretraining.py (a user's checkpoint against
random init) are both built on it.

Resuming is by records: a run whose record exists is not run again, so a killed comparison
started again goes on where it stopped."""
import concurrent.futures
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import time

from nanobert.formats.fileio import atomic_open

from .grid import dev_best
from .metrics import read_metrics

# the folder of train.py and finetune.py, which the jobs run in
REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def say(line):
    sys.stdout.write(line + "\n")             # one write: parallel jobs' lines do not mix
    sys.stdout.flush()


@dataclasses.dataclass
class Job:
    cmd: list
    out: str             # its output folder; the command's output goes to <out>/log.txt
    needs: str = None    # a pretraining folder that must be finished first
    done: object = None  # called with the job once the command succeeded (writes its record)
    cpu_seconds: float = None    # the command's CPU time (user + system), once it has run


def run_all(jobs, parallel):
    """Run the jobs from the repository root, `parallel` at a time; a job that needs a
    pretraining run waits for it (jobs that need none go first, so random init's runs fill
    the time of the pretraining). With more than one at a time each gets one BLAS thread
    (models this small gain little from a second). A failure stops the script once the
    running jobs end; jobs after a failed pretraining are not started."""
    env = dict(os.environ)
    if parallel > 1:
        env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    outs = {job.out for job in jobs}                 # a pretraining run among them: waited for
    futures = {}                                     # output folder -> its job's future

    def one(job):
        if job.needs in futures and futures[job.needs].result() != 0:
            say(f"  skipped (its pretraining failed): {os.path.relpath(job.out)}")
            return 1
        os.makedirs(job.out, exist_ok=True)
        say("$ " + " ".join(job.cmd[1:] if job.cmd[0] == sys.executable else job.cmd))
        start = time.time()
        with open(os.path.join(job.out, "log.txt"), "a", encoding="utf-8") as log:
            process = subprocess.Popen(job.cmd, cwd=REPOSITORY, env=env, stdout=log,
                                       stderr=subprocess.STDOUT)
            # wait4: this child's own CPU time (the cost, on a machine others share)
            _, status, usage = os.wait4(process.pid, 0)
        code = process.returncode = os.waitstatus_to_exitcode(status)
        job.cpu_seconds = usage.ru_utime + usage.ru_stime
        if code == 0 and job.done:
            job.done(job)
        say(f"  {'done' if code == 0 else f'FAILED (exit {code})'} in "
            f"{(time.time() - start) / 60:.1f} min: {os.path.relpath(job.out)}/log.txt")
        return code

    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        # those that wait go last, so that what they wait for has started before them
        for job in sorted(jobs, key=lambda job: job.needs in outs):
            futures[job.out] = pool.submit(one, job)
        codes = [f.result() for f in futures.values()]
    if any(codes):
        raise SystemExit("some runs failed: see their log.txt")


def write_json(path, value):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with atomic_open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=1)
        f.write("\n")

# ------------------------------------------------------------------------ one run's record


def percent(metric, score):
    return score if metric == "f1" else 100 * score     # conlleval's F1 is a percent already


def finished_run(job, metric):
    """What a finished finetune.py run in job.out scored, from its results.json and
    metrics.jsonl, scores in percent: the best dev score (what chooses), its epoch, the dev
    curve (one score per epoch), the last training loss, the test score of the best dev epoch
    (what a table reports), the minutes of training, the CPU minutes (None for a run recorded
    after the fact) and the command."""
    with open(os.path.join(job.out, "results.json"), encoding="utf-8") as f:
        results = json.load(f)
    curve, loss = [], None
    for row in read_metrics(os.path.join(job.out, "metrics.jsonl")):
        if row["kind"] == "eval" and row["split"] == "dev":
            curve.append(round(percent(metric, row[metric]), 4))
        elif row["kind"] == "train":
            loss = row["loss"]
    best = results["best"]
    return {"metric": metric, "dev": percent(metric, best["score"]), "best_epoch": best["epoch"],
            "dev_curve": curve, "test": percent(metric, results["test"][metric]),
            "last_train_loss": loss, "train_minutes": results["train_minutes"],
            "cpu_minutes": job.cpu_seconds and job.cpu_seconds / 60,
            "command": " ".join(os.path.relpath(c, REPOSITORY) if os.path.isabs(c) else c
                                for c in job.cmd[1:])}

# ------------------------------------------------------------- the choice and the statistics


def read_records(folder, start):
    """{seed: {lr: record}} of every record of `start` in `folder` (<start>-seed<s>-lr<rate>
    .json: any seed, any rate, also those of an earlier --seeds or grid)."""
    prefix, runs = f"{start}-seed", {}
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.startswith(prefix) and name.endswith(".json") and \
                name[len(prefix):].split("-lr")[0].isdigit():
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                record = json.load(f)
            runs.setdefault(record["seed"], {})[record["lr"]] = record
    return runs


def select(runs, grid):
    """The paper's choice for one (task, start, seed): of the runs at the grid's rates, the
    one best on dev (finetune.py's grid's choice, training/grid.dev_best: a tie goes to the
    lower rate); None until every rate has run. Only dev scores are read: the test score
    rides along with the run chosen."""
    if any(lr not in runs for lr in grid):
        return None
    return dev_best([runs[lr] for lr in grid])


def chosen(records, grid):
    """{seed: {lr: record}} -> ({seed: the dev-chosen run}, [seeds whose grid is incomplete])."""
    runs, pending = {}, []
    for seed, by_rate in sorted(records.items()):
        run = select(by_rate, grid)
        if run is None:
            pending.append(seed)
        else:
            runs[seed] = run
    return runs, pending


def mean_std(scores):
    """-> (mean, sample standard deviation; 0 for one seed), or None for no seed."""
    if not scores:
        return None
    return statistics.mean(scores), statistics.stdev(scores) if len(scores) > 1 else 0.0


def difference(scores, base):
    """How far the mean of `scores` is from the mean of `base` (each a list of seeds' scores):
    -> (difference, pooled std, difference in pooled stds); the last two NaN when a side has
    one seed (no spread to measure the gap in) or both spreads are 0."""
    (mean, std), (base_mean, base_std) = mean_std(scores), mean_std(base)
    pooled = math.sqrt((std ** 2 + base_std ** 2) / 2)
    if len(scores) < 2 or len(base) < 2 or pooled == 0:
        return mean - base_mean, math.nan, math.nan
    return mean - base_mean, pooled, (mean - base_mean) / pooled
