"""finetune.py's grid (the paper's protocol: every combination of --lr, --epochs, --batch-size
fine-tuned, the dev-best kept, test scored once), its defaults by model size, the one-line
report of a collapsed model, the time budget, and the flags a grid refuses."""
import json
import os

import numpy
import pytest

import finetune
from nanobert import BertForSequenceClassification
from nanobert.data.tokenizer import BertTokenizer
from nanobert.training import grid
from nanobert.training.tasks import TASKS, collapse_report
from test_finetune import data, make_tiny_bert, records, run
from test_train import PaceHalves

SST2 = ("--glue-task", "sst-2", "--train", data("sst2_train.tsv"), "--dev", data("sst2_dev.tsv"))


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return make_tiny_bert(tmp_path_factory.mktemp("tiny") / "mybert" / "checkpoint")


def resolved(*argv):
    return finetune.resolve_task(finetune.parse_args([str(a) for a in argv]))

# ------------------------------------------------------------------------ the grid's harness


def fake_fine_tune(scores, calls, fail=(), stop=()):
    """A fine_tune for run_grid: writes <folder>/best/ and results.json with the dev score
    scores[lr]; raises for a rate in `fail`, stops (None) for one in `stop`."""
    def fine_tune(run, folder):
        calls.append(run["lr"])
        if run["lr"] in fail:
            raise SystemExit(f"error: loss is nan at step 3 (lr {run['lr']})")
        if run["lr"] in stop:
            return None
        os.makedirs(os.path.join(folder, "best"), exist_ok=True)
        with open(os.path.join(folder, "best", "which.txt"), "w") as f:
            f.write(str(run["lr"]))
        summary = {"best": {"score": scores[run["lr"]], "epoch": 1.0, "dev": {}},
                   "train_minutes": 0.1}
        with open(os.path.join(folder, "results.json"), "w") as f:
            json.dump(summary, f)
        return summary
    return fine_tune


def test_the_grid_keeps_the_dev_best_run_and_tabulates_every_run(tmp_path, capsys):
    scores = {1e-4: 0.61, 3e-4: 0.74, 1e-3: 0.52}
    runs = grid.grid_runs({"lr": list(scores), "epochs": [3], "batch_size": [32]})
    rows, winner = grid.run_grid(runs, str(tmp_path), fake_fine_tune(scores, []), "accuracy")
    assert winner["lr"] == 3e-4 and [row["dev"] for row in rows] == list(scores.values())
    assert (tmp_path / "best" / "which.txt").read_text() == "0.0003", "the winner's best/"
    table = (tmp_path / "grid.md").read_text()
    assert table in capsys.readouterr().out
    lines = table.splitlines()
    assert len(lines) == 2 + 3 and "**best on dev**" in lines[3] and "0.7400" in lines[3], table
    assert json.loads((tmp_path / "grid.json").read_text())["winner"] == "lr3e-04-epochs3-batch32"
    # a loss picks the lowest; a tie goes to the lower rate
    assert grid.dev_best(rows, lower_is_better=True)["lr"] == 1e-3
    assert grid.dev_best([{"dev": 0.5, "lr": 1e-3}, {"dev": 0.5, "lr": 1e-4}])["lr"] == 1e-4


def test_a_failed_run_is_in_the_table_and_the_others_go_on(tmp_path, capsys):
    scores, calls = {1e-4: 0.61, 3e-4: 0.74, 1e-3: 0.52}, []
    runs = grid.grid_runs({"lr": list(scores), "epochs": [3], "batch_size": [32]})
    rows, winner = grid.run_grid(runs, str(tmp_path), fake_fine_tune(scores, calls, fail={3e-4}),
                                 "accuracy")
    assert calls == list(scores) and winner["lr"] == 1e-4
    failed = [line for line in (tmp_path / "grid.md").read_text().splitlines()
              if line.startswith("| lr3e-04")]
    assert "failed" in failed[0] and "loss is nan at step 3" in failed[0], failed


def test_an_interrupted_grid_resumes_without_repeating_finished_runs(tmp_path):
    scores, calls = {1e-4: 0.61, 3e-4: 0.74, 1e-3: 0.52}, []
    runs = grid.grid_runs({"lr": list(scores), "epochs": [3], "batch_size": [32]})
    assert grid.run_grid(runs, str(tmp_path), fake_fine_tune(scores, calls, stop={3e-4}),
                         "accuracy") is None, "a run stopped early stops the grid"
    assert calls == [1e-4, 3e-4] and not (tmp_path / "grid.md").exists()
    calls.clear()
    rows, winner = grid.run_grid(runs, str(tmp_path), fake_fine_tune(scores, calls),
                                 "accuracy", resume=True)
    assert calls == [3e-4, 1e-3], "the finished run is read back, not repeated"
    assert winner["lr"] == 3e-4 and rows[0]["dev"] == 0.61

# --------------------------------------------------------------------- the grid, end to end


def test_a_grid_fine_tunes_every_combination_and_scores_test_once(tiny_bert, tmp_path,
                                                                     capsys):
    out = tmp_path / "grid"
    run(*SST2, "--test", data("sst2_dev.tsv"), "--model", tiny_bert, "--out", out,
        "--lr", 1e-3, 1e-6, "--epochs", 2, 4, "--batch-size", 10, "--log-every", 100)
    table = json.loads((out / "grid.json").read_text())["runs"]
    assert [(r["lr"], r["epochs"]) for r in table] == [(1e-3, 2), (1e-3, 4), (1e-6, 2), (1e-6, 4)]
    results = json.loads((out / "results.json").read_text())
    winner = grid.dev_best(table)
    assert results["winner"] == winner["run"] and results["best"]["score"] == winner["dev"]
    for row in table:             # each run a finetune.py folder of its own, no test in it
        folder = out / row["run"]
        assert (folder / "best" / "model.safetensors").exists()
        assert not (folder / "test_predictions.tsv").exists()
        assert json.loads((folder / "results.json").read_text())["args"]["lr"] == row["lr"]
    assert [r["split"] for r in records(out, "eval")] == ["test"], "test: the winner alone"
    assert (out / "best" / "model.safetensors").read_bytes() == \
        (out / winner["run"] / "best" / "model.safetensors").read_bytes()
    table_text = (out / "grid.md").read_text()
    assert table_text in capsys.readouterr().out
    for row in table:               # a collapsed run (at 1e-6 the tiny model learns nothing)
        line = next(line for line in table_text.splitlines() if line.startswith(f"| {row['run']}"))
        assert ("collapsed" in line) == row["collapsed"], line
    assert any(row["collapsed"] for row in table)


def test_a_resumed_grid_reads_back_its_finished_runs(tiny_bert, tmp_path, capsys):
    """--resume after a grid: the runs that finished are not repeated (their metrics are
    untouched); a rate added to the grid runs; a finished run whose flags differ is refused."""
    out = tmp_path / "grid"
    common = [*SST2, "--model", tiny_bert, "--out", out, "--epochs", 2, "--batch-size", 10]
    run(*common, "--lr", 1e-3, 1e-4)
    before = (out / "lr1e-03-epochs2-batch10" / "metrics.jsonl").read_text()
    capsys.readouterr()
    run(*common, "--lr", 1e-3, 1e-4, 3e-4, "--resume")
    printed = capsys.readouterr().out
    assert printed.count("dev after") == 2, "two epochs of the one new run"
    assert (out / "lr1e-03-epochs2-batch10" / "metrics.jsonl").read_text() == before
    assert len(json.loads((out / "grid.json").read_text())["runs"]) == 3
    with pytest.raises(SystemExit, match="--seed"):
        run(*common, "--lr", 1e-3, 1e-4, "--resume", "--seed", 1)


@pytest.mark.parametrize("argv, message", [
    (("--lr", 1e-3, 1e-3), r"--lr 0\.001 0\.001 names a value twice"),
    (("--epochs", 2, 3, "--max-steps", 5), r"--max-steps sets every run's schedule"),
    (("--lr", 1e-3, 1e-4, "--stop-at-step", 2), r"--stop-at-step stops one run, and this grid "
                                                r"has 2"),
    (("--batch-size", 8, 10, "--grad-accum", 4), r"--batch-size 10 is not divisible by "
                                                 r"--grad-accum 4"),
])
def test_a_grid_that_cannot_run_is_refused_in_one_line(tiny_bert, argv, message):
    with pytest.raises(SystemExit, match=message):
        resolved(*SST2, "--model", tiny_bert, *argv)

# ------------------------------------------------------------------ defaults, output folders


def test_the_default_rate_follows_the_models_size(tiny_bert):
    """No --lr: 3e-5 for MiniLM (H=384), the measured small-model rate for a model train.py
    makes (here H=32); the demo runs such a model over all sentences for 3 epochs."""
    assert resolved().lr == [3e-5]
    small = resolved("--model", tiny_bert)
    assert small.lr == grid.SMALL_RATES and small.lr != [3e-5]
    assert (small.demo, small.max_train_examples, small.epochs) == (True, None, [3])
    assert resolved("--model", tiny_bert, "--lr", 1e-3).lr == [1e-3]


def test_help_says_how_the_default_rate_is_chosen(capsys):
    with pytest.raises(SystemExit):
        finetune.parse_args(["--help"])
    said = " ".join(capsys.readouterr().out.split())
    assert f"Default: by the model's size, {grid.DEFAULT_RATES}" in said, said


def test_output_folders_are_named_after_the_model(tiny_bert):
    assert resolved("--dataset", "trec").out == os.path.join("runs", "finetune-classify-trec")
    assert resolved("--dataset", "trec", "--model", tiny_bert).out == \
        os.path.join("runs", "finetune-classify-trec-mybert")
    assert resolved("--dataset", "trec", "--model", tiny_bert, "--from-scratch").out == \
        os.path.join("runs", "finetune-classify-trec-mybert-from-scratch")


def test_an_evaluation_folder_is_named_after_the_model_scored(tiny_bert, tmp_path):
    out = tmp_path / "runs" / "finetune-classify-mybert"
    run(*SST2, "--model", tiny_bert, "--out", out, "--epochs", 1, "--batch-size", 10)
    for do in ("eval", "predict"):
        assert resolved("--do", do, "--model", out / "best", "--test", data("sst2_dev.tsv"),
                        "--glue-task", "sst-2").out == \
            os.path.join("runs", f"{do}-finetune-classify-mybert")

# ------------------------------------------------------------------------- a collapsed model


COLLAPSE_TASKS = {
    "classify": SST2,
    "pair": ("--task", "pair", "--train", data("mrpc_train.tsv"), "--dev",
             data("mrpc_train.tsv"), "--glue-task", "mrpc"),
    "ner": ("--task", "ner", "--train", data("conll_train.txt"), "--dev", data("conll_dev.txt"),
            "--max-seq-length", 64),
}


def report(args, loaded, predicted):
    """collapse_report of a model whose dev predictions are `predicted` (per row a label, or
    for ner a tag per word), scored by the task's own rules from one-hot outputs."""
    task, (examples, features) = TASKS[args.task], loaded.splits["dev"]
    eye = numpy.eye(len(loaded.label_list))
    if args.task == "ner":
        outputs = []
        for row, tags in enumerate(predicted):
            logits = numpy.zeros((features.length(row), len(loaded.label_list)))
            for word, position in enumerate(features.meta["first_token"][row]):
                if position >= 0:
                    logits[position] = eye[loaded.label_list.index(tags[word])]
            outputs.append(logits)
    else:
        outputs = [eye[loaded.label_list.index(label)] for label in predicted]
    scores, predictions = task.evaluate(args, None, loaded, examples, features, outputs)
    return collapse_report(args, task, loaded, scores, predictions)


@pytest.mark.parametrize("name", COLLAPSE_TASKS)
def test_a_collapsed_model_is_reported_in_one_line(tiny_bert, name):
    """One class for all of dev, or varied predictions that score no better than the majority
    class alone: one line with what to try. The gold labels themselves: no report."""
    args = resolved(*COLLAPSE_TASKS[name], "--model", tiny_bert)
    loaded = finetune.load_data(args, BertTokenizer.from_pretrained(tiny_bert))
    examples, features = loaded.splits["dev"]
    if name == "ner":
        gold = [e.tags for e in examples]
        majority = ["O" for tags in gold for _ in tags]
        one_class = [["O"] * len(tags) for tags in gold]
        # every entity given another type: varied tags, F1 0, as the majority class scores
        other = {t: t[:2] + ("PER" if t[2:] != "PER" else "LOC") for tags in gold for t in tags
                 if t != "O"}
        wrong = [[other.get(t, t) if other.get(t, t) in loaded.label_list else "O" for t in tags]
                 for tags in gold]
        assert any(t != "O" for tags in wrong for t in tags) and majority
    else:
        gold = [loaded.label_list[i] for i in features.targets["labels"]]
        one_class = [max(set(gold), key=gold.count)] * len(gold)
        wrong = [loaded.label_list[1 - loaded.label_list.index(g)] for g in gold]  # varied
    assert report(args, loaded, gold) is None
    for predicted in (one_class, wrong):
        line = report(args, loaded, predicted)
        assert line and "\n" not in line and "collapsed" in line and "--lr" in line, line

# --------------------------------------------------------------------------- the time budget


def test_time_budget_ends_the_schedule_when_the_pace_halves(tiny_bert, tmp_path, capsys,
                                                            monkeypatch):
    """--minutes 0.5 over a 200-step schedule, one second a step, two from the 10th on: ~20
    fit. The plan follows the pace, so the run ends its schedule (the last step's lr is the
    schedule's last) inside the budget, and is complete (results.json, no checkpoint)."""
    clock = PaceHalves(monkeypatch, BertForSequenceClassification, slow_from=10)
    out = tmp_path / "budget"
    run(*SST2, "--model", tiny_bert, "--out", out, "--epochs", 100, "--batch-size", 10,
        "--lr", 1e-3, "--minutes", 0.5, "--log-every", 1)
    last = records(out, "train")[-1]
    assert (out / "results.json").exists() and not (out / "checkpoint").exists()
    assert last["lr"] == pytest.approx(1e-3 / last["step"]), last
    assert clock.time <= 30 and last["step"] >= 0.9 * (9 + 21 / 2), (clock.time, last)


def test_one_class_for_nearly_all_of_dev_is_reported_above_the_majority_too(tiny_bert,
                                                                            tmp_path):
    """39 of 40 dev sentences called "1", the one "0" right: accuracy 0.525 beats the
    majority class's 0.5, yet the model has collapsed onto one class."""
    dev = tmp_path / "dev.tsv"
    dev.write_text("sentence\tlabel\n" + "".join(f"good film {i}\t{i % 2}\n" for i in range(40)))
    args = resolved("--glue-task", "sst-2", "--train", data("sst2_train.tsv"), "--dev", dev,
                    "--model", tiny_bert)
    loaded = finetune.load_data(args, BertTokenizer.from_pretrained(tiny_bert))
    gold = [loaded.label_list[i] for i in loaded.splits["dev"][1].targets["labels"]]
    first_zero = gold.index("0")
    predicted = ["0" if row == first_zero else "1" for row in range(40)]
    line = report(args, loaded, predicted)
    assert line and "predicts '1' for 98% of dev" in line, line
    spread = ["0" if row % 4 == 0 else "1" for row in range(40)]        # 75% "1", accuracy 0.75
    assert report(args, loaded, spread) is None


def test_the_papers_grid_is_eighteen_runs_with_distinct_folders():
    """The paper's A.3 grid in one command: --lr 5e-5 3e-5 2e-5 --epochs 2 3 4 --batch-size
    16 32, every combination once, each in a folder of its own."""
    args = finetune.parse_args(["--lr", "5e-5", "3e-5", "2e-5", "--epochs", "2", "3", "4",
                                "--batch-size", "16", "32"])
    runs = grid.grid_runs({flag: getattr(args, flag) for flag in grid.GRID_FLAGS})
    assert len(runs) == 18 and len({grid.run_name(run) for run in runs}) == 18
    assert runs[0] == {"lr": 5e-5, "epochs": 2.0, "batch_size": 16}
    assert grid.run_name(runs[-1]) == "lr2e-05-epochs4-batch32"
