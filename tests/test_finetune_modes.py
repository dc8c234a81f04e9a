"""finetune.py without training (--do eval / predict on a fine-tuned folder) and with
--resume (exact continuation, a checkpoint on Ctrl-C), on the tiny random BERT of
test_finetune.py; and docs/finetuning.md's Python snippet that loads a fine-tuned folder."""
import json
import os
import shutil
import signal

import numpy
import pytest

import finetune
from nanobert.formats import safetensors
from nanobert.training import tasks as training_tasks
from nanobert.training.folder import LOCK_NAME
from test_docs import ROOT, run_blocks
from test_finetune import data, make_tiny_bert, records, run

SST2 = ("--glue-task", "sst-2", "--train", data("sst2_train.tsv"), "--dev", data("sst2_dev.tsv"))


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="module")
def classifier(tiny_bert, tmp_path_factory):
    """A fine-tuning run of the tiny BERT on the SST-2 sample, with its test predictions."""
    out = tmp_path_factory.mktemp("classify")
    run(*SST2, "--test", data("sst2_test.tsv"), "--model", tiny_bert, "--out", out,
        "--epochs", 3, "--batch-size", 10, "--lr", 1e-3)
    return out


def read(path):
    return open(path, encoding="utf-8").read()

# ----------------------------------------------------------------------- eval and predict


def test_eval_scores_the_best_folder_as_training_did(classifier, tmp_path, capsys):
    """--do eval on best/ gives the dev scores (and predictions) that training logged for
    the best epoch; the task and labels come from the folder, printed as training prints."""
    best_step = json.loads(read(classifier / "best" / "best.json"))["step"]
    logged = [r for r in records(classifier, "eval") if r["step"] == best_step][0]
    out = tmp_path / "eval"
    run("--do", "eval", "--model", classifier / "best", "--glue-task", "sst-2",
        "--dev", data("sst2_dev.tsv"), "--out", out)
    result = json.loads(read(out / "eval_results.json"))
    assert result["task"] == "classify"
    for name, value in result["dev"].items():
        assert value == pytest.approx(logged[name], abs=1e-12), name
    assert read(out / "dev_predictions.tsv") == read(classifier / "dev_predictions.tsv")
    printed = capsys.readouterr().out
    assert f"dev: accuracy {logged['accuracy']:.4f}  loss {logged['loss']:.4f}" in printed


def test_predict_writes_the_test_predictions_of_training(classifier, tmp_path):
    out = tmp_path / "predict"
    run("--do", "predict", "--model", classifier / "best", "--glue-task", "sst-2",
        "--test", data("sst2_test.tsv"), "--out", out)
    # the predictions and the lock that kept the folder this run's while it wrote them
    assert sorted(os.listdir(out)) == [LOCK_NAME, "test_predictions.tsv"]
    assert read(out / "test_predictions.tsv") == read(classifier / "test_predictions.tsv")


def test_predict_reads_a_plain_text_file(classifier, tmp_path):
    """One text a line, no header, no label column, no --glue-task: the predictions of the
    same sentences as the training run's test file gives."""
    texts = [line.split("\t")[1] for line in read(data("sst2_test.tsv")).splitlines()[1:]]
    plain = tmp_path / "texts.txt"
    plain.write_text("\n".join(texts) + "\n", encoding="utf-8")
    run("--do", "predict", "--model", classifier / "best", "--test", plain, "--out", tmp_path)
    assert read(tmp_path / "test_predictions.tsv") == read(classifier / "test_predictions.tsv")


def best_evaluation_and_bare_copy(trained, tmp_path):
    """A fine-tuning run's folder -> (the metrics record of its best evaluation, a copy of
    <run>/best without best.json: a folder from elsewhere, which names its task by config.json
    alone)."""
    best_step = json.loads(read(trained / "best" / "best.json"))["step"]
    logged = [r for r in records(trained, "eval") if r["step"] == best_step][0]
    copy = tmp_path / "copy"
    shutil.copytree(trained / "best", copy)
    os.remove(copy / "best.json")
    return logged, copy


def test_the_task_comes_from_the_head_without_best_json(tiny_bert, tmp_path):
    """A ner folder evaluated with no --task: best.json names the task; without best.json
    (a folder from elsewhere) the head class in config.json does."""
    trained = tmp_path / "ner"
    run("--task", "ner", "--train", data("conll_train.txt"), "--dev", data("conll_dev.txt"),
        "--model", tiny_bert, "--out", trained, "--epochs", 2, "--batch-size", 5,
        "--max-seq-length", 64, "--lr", 1e-3)           # one rate: one run, no grid
    logged, copy = best_evaluation_and_bare_copy(trained, tmp_path)
    for folder in (trained / "best", copy):
        args = finetune.resolve_task(finetune.parse_args(
            ["--do", "eval", "--model", str(folder), "--dev", data("conll_dev.txt")]))
        assert args.task == "ner" and args.model_labels[0] == "O"
    out = tmp_path / "eval"
    run("--do", "eval", "--model", copy, "--dev", data("conll_dev.txt"), "--out", out,
        "--max-seq-length", 64)
    assert json.loads(read(out / "eval_results.json"))["dev"]["loss"] == \
        pytest.approx(logged["loss"], abs=1e-12)
    assert read(out / "dev_predictions.txt") == read(trained / "dev_predictions.txt")


@pytest.mark.parametrize("argv, error, message", [
    (("--do", "eval", "--model", "{bare}", "--glue-task", "sst-2", "--dev", "sst2_dev.tsv"),
     SystemExit, r"is a BertModel without classifier\.weight; --task classify needs a "
                 r"BertForSequenceClassification: give a folder that finetune.py fine-tuned"),
    (("--do", "eval", "--model", "{bare}", "--dev", "sst2_dev.tsv"),
     SystemExit, r"is a BertModel without a task head: give a folder that finetune.py"),
    (("--do", "eval", "--model", "{best}", "--task", "ner", "--dev", "conll_dev.txt"),
     SystemExit, r"is a BertForSequenceClassification; --task ner needs a "
                 r"BertForTokenClassification"),
    (("--do", "eval", "--model", "{best}", "--task", "regress", "--dev", "stsb_dev.tsv"),
     SystemExit, r"with 2 output\(s\) of problem_type single_label_classification; --task "
                 r"regress needs regression"),
    (("--do", "eval", "--model", "{best}", "--glue-task", "sst-2", "--dev", "bad_label.tsv"),
     ValueError, r"bad_label.tsv:3: label 'maybe' is not one of the model's labels "
                 r"\(id2label of .*best: \['0', '1'\]\)"),
    (("--do", "eval", "--model", "{best}", "--glue-task", "sst-2", "--dev", "no_such.tsv"),
     FileNotFoundError, r"no_such.tsv"),
    (("--do", "eval", "--model", "{best}", "--glue-task", "sst-2", "--test", "sst2_test.tsv"),
     SystemExit, r"the test data has no labels to score \(--do predict writes"),
    (("--do", "eval", "--model", "{best}", "--glue-task", "sst-2", "--dev", "sst2_dev.tsv",
      "--epochs", "2"), SystemExit, r"--do eval does not train: --epochs has no use there"),
    (("--do", "predict", "--model", "{best}", "--glue-task", "sst-2", "--dev", "sst2_dev.tsv"),
     SystemExit, r"--do predict does not train: --dev has no use there"),
    (("--do", "predict", "--model", "{best}", "--glue-task", "sst-2"),
     SystemExit, r"--do predict needs data: --test FILE, or --dataset NAME"),
    (("--do", "eval", "--model", "{best}", "--glue-task", "sst-2", "--dev", "sst2_dev.tsv",
      "--labels", "0,1"), SystemExit, r"--labels has no use there \(labels come from the "
                                      r"model's id2label\)"),
    (("--do", "eval", "--model", "{best}", "--glue-task", "sst-2", "--dev", "sst2_dev.tsv",
      "--layer-decay", "0.8"), SystemExit, r"--do eval does not train: --layer-decay has no"),
])
def test_no_training_modes_refuse_bad_input_in_one_line(tiny_bert, classifier, tmp_path, argv,
                                                        error, message):
    folders = {"{bare}": tiny_bert, "{best}": str(classifier / "best")}
    argv = [folders.get(a, data(a) if a.endswith((".tsv", ".txt")) else a) for a in argv]
    with pytest.raises(error, match=message):
        run(*argv, "--out", tmp_path / "out")

# --------------------------------------------------------------------------------- resume


def train_records(out):
    return [(r["step"], r["loss"], r["lr"]) for r in records(out, "train")]


def assert_same_run(a, b):
    """The same losses at every step, the same dev scores, the same best weights."""
    assert train_records(a) == train_records(b)
    assert [{k: v for k, v in r.items() if k != "elapsed"} for r in records(a, "eval")] == \
        [{k: v for k, v in r.items() if k != "elapsed"} for r in records(b, "eval")]
    x = safetensors.load_file(a / "best" / "model.safetensors")
    y = safetensors.load_file(b / "best" / "model.safetensors")
    assert x.keys() == y.keys()
    for name in x:
        numpy.testing.assert_array_equal(x[name], y[name], err_msg=name)


RESUMABLE = (*SST2, "--epochs", 3, "--batch-size", 8, "--lr", 1e-3, "--log-every", 1)


@pytest.mark.parametrize("stop_at", [2, 4])       # inside the first epoch; inside the second
def test_resume_continues_exactly(tiny_bert, tmp_path, stop_at):
    """N steps straight == k steps, stop, --resume: same losses, dev scores and weights, with
    dropout on (the tiny BERT's 0.1): the dropout stream, the optimizer, the data position
    and the best-so-far all come back. Epochs of 3 steps (20 rows, batch 8)."""
    run(*RESUMABLE, "--model", tiny_bert, "--out", tmp_path / "straight")
    resumed = tmp_path / "resumed"
    run(*RESUMABLE, "--model", tiny_bert, "--out", resumed, "--stop-at-step", stop_at)
    state = json.loads(read(resumed / "checkpoint" / "trainer_state.json"))
    assert (state["step"], state["total_steps"]) == (stop_at, 9)
    assert (state["best"] is None) == (stop_at < 3), "best-so-far after the first epoch"
    run(*RESUMABLE, "--model", tiny_bert, "--out", resumed, "--resume")
    assert_same_run(tmp_path / "straight", resumed)
    assert not os.path.exists(resumed / "checkpoint"), "a complete run leaves none to resume"
    results = json.loads(read(resumed / "results.json"))
    assert results["best"] == json.loads(read(tmp_path / "straight" / "results.json"))["best"]


def test_ctrl_c_saves_a_checkpoint_that_resumes_exactly(tiny_bert, tmp_path, monkeypatch,
                                                        capsys):
    """SIGINT during step 5 (of 9): the step ends, the checkpoint is saved, the run stops
    with exit status 0; --resume then ends as the uninterrupted run."""
    run(*RESUMABLE, "--model", tiny_bert, "--out", tmp_path / "straight")
    update, steps = training_tasks.update, []     # fine_tuning_step's update

    def interrupted_update(group, model, optimizer, scaler, grads, lr, step, *rest, **options):
        steps.append(step)
        if step == 5:
            os.kill(os.getpid(), signal.SIGINT)
        return update(group, model, optimizer, scaler, grads, lr, step, *rest, **options)
    monkeypatch.setattr(training_tasks, "update", interrupted_update)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        run(*RESUMABLE, "--model", tiny_bert, "--out", tmp_path / "resumed")
        restored = {s: signal.getsignal(s) for s in handlers}
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
    assert restored == handlers, "the run must give back the Ctrl-C / SIGTERM handlers it found"
    assert steps == [1, 2, 3, 4, 5]
    printed = capsys.readouterr().out
    assert "SIGINT: saving a checkpoint after this step" in printed
    assert "checkpoint at step 5 of 9; --resume continues the run" in printed
    monkeypatch.setattr(training_tasks, "update", update)
    run(*RESUMABLE, "--model", tiny_bert, "--out", tmp_path / "resumed", "--resume")
    assert_same_run(tmp_path / "straight", tmp_path / "resumed")


def test_resume_refuses_no_state_a_changed_flag_and_a_changed_model(tmp_path):
    model, out = make_tiny_bert(tmp_path / "model"), tmp_path / "run"
    with pytest.raises(FileNotFoundError, match=r"no resumable checkpoint at .*run.checkpoint "
                                                r"\(missing trainer_state.json\)"):
        run(*RESUMABLE, "--model", model, "--out", out, "--resume")
    run(*RESUMABLE, "--model", model, "--out", out, "--stop-at-step", 2)
    changed = [a if a != 1e-3 else 2e-3 for a in RESUMABLE]
    with pytest.raises(SystemExit, match=r"resuming with --lr 0.002, but the checkpoint used "
                                         r"0.001; exact continuation needs the same value"):
        run(*changed, "--model", model, "--out", out, "--resume")
    config = json.loads(read(os.path.join(model, "config.json")))
    config["intermediate_size"] = 48                # the same --model, retrained in place
    with open(os.path.join(model, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    with pytest.raises(SystemExit, match=r"resuming with --model .*model \(intermediate_size "
                                         r"48\), but the checkpoint's model has "
                                         r"intermediate_size 64"):
        run(*RESUMABLE, "--model", model, "--out", out, "--resume")

# ----------------------------------------------------------- docs/finetuning.md's snippet


def test_the_docs_python_snippet_predicts_labels(classifier, tmp_path, monkeypatch, capsys):
    """docs/finetuning.md's snippet (load a fine-tuned folder, tokenize, predict) runs on a
    fine-tuned folder at the path it names, and labels its sentences with its label names."""
    folder = tmp_path / "runs" / "finetune-classify-movie-sentiment" / "best"
    shutil.copytree(classifier / "best", folder)
    monkeypatch.chdir(tmp_path)
    namespace = run_blocks(ROOT / "docs" / "finetuning.md", "Evaluate, predict, resume")
    assert set(namespace["labels"]) <= {"0", "1"} and len(namespace["labels"]) == 2
    assert capsys.readouterr().out.strip()
