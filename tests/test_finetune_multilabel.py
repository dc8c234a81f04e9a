"""finetune.py --task multilabel (a set of labels per sentence, comma-separated in the label
column: a sigmoid and a binary cross-entropy per label) end to end on the tiny random BERT of
test_finetune.py, on files the tests write: train, dev scores (micro-F1, exact match), the
predictions (each label above 0.5), --do eval / predict on the folder, --resume, the collapse
report, the refusals; and every sequence task declaring its problem_type in best/config.json."""
import json
import os
import types

import numpy
import pytest

import finetune
from nanobert.data import tasks as data_tasks
from nanobert.data.tokenizer import BertTokenizer
from nanobert.model.heads import BertForSequenceClassification
from nanobert.training import tasks as training_tasks
from test_finetune import assert_loss_falls, data, make_tiny_bert, records, run
from test_finetune_modes import assert_same_run, best_evaluation_and_bare_copy, read

# a sentence of three words, one slot per topic: the topic's word when the sentence has the
# topic, else a word of no topic (every sentence as long: the words alone tell the labels)
TOPICS = {"royal": (("king", "charles"), ("the", "who")),
          "praise": (("good", "great"), ("film", "story")),
          "place": (("france", "normandy"), ("movie", "what"))}


def label_rows(n, start=0):
    """n (sentence, labels) rows: row i has the topics of the bits of i % 8 (none for 0),
    in TOPICS' order (not sorted: the label set is sorted, the file need not be)."""
    rows = []
    for i in range(start, start + n):
        topics = [t for bit, t in enumerate(TOPICS) if i % 8 >> bit & 1]
        words = [TOPICS[t][t not in topics][i // 8 % 2] for t in TOPICS]
        rows.append((" ".join(words), ",".join(topics)))
    return rows


def write_rows(path, rows):
    path.write_text("".join(f"{text}\t{labels}\n" for text, labels in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("topics")
    return {"train": write_rows(folder / "train.tsv", label_rows(64)),
            "dev": write_rows(folder / "dev.tsv", label_rows(16, start=3))}


def train_args(files, tiny_bert, out, *more):
    return ("--task", "multilabel", "--train", files["train"], "--dev", files["dev"],
            "--model", tiny_bert, "--out", out, "--batch-size", 8, "--lr", 1e-3, *more)


@pytest.fixture(scope="module")
def trained(files, tiny_bert, tmp_path_factory):
    out = tmp_path_factory.mktemp("multilabel")
    run(*train_args(files, tiny_bert, out, "--test", files["dev"], "--epochs", 20,
                    "--log-every", 1))
    return out


def tsv_column(path, column):
    return [line.split("\t")[column] for line in read(path).splitlines()[1:]]


def test_multilabel_trains_scores_and_predicts_the_labels_above_one_half(trained, files):
    assert_loss_falls(trained)
    config = json.loads(read(trained / "best" / "config.json"))
    assert config["problem_type"] == "multi_label_classification"
    assert config["id2label"] == {"0": "place", "1": "praise", "2": "royal"}
    evaluations = [r for r in records(trained, "eval") if r["split"] == "dev"]
    assert len(evaluations) == 20
    assert {"micro_f1", "exact_match", "micro_precision", "micro_recall", "loss"} <= \
        set(evaluations[0])
    results = json.loads(read(trained / "results.json"))
    assert results["best"]["metric"] == "micro_f1" and results["best"]["collapsed"] is None
    assert results["best"]["score"] == max(r["micro_f1"] for r in evaluations)
    assert results["test"]["micro_f1"] == pytest.approx(results["best"]["dev"]["micro_f1"])
    # the gold column is the file's; each prediction is the labels whose sigmoid is > 0.5
    path = trained / "dev_predictions.tsv"
    assert read(path).splitlines()[0] == "index\tprediction\tlabel"
    assert tsv_column(path, 2) == [labels for _, labels in label_rows(16, start=3)]
    model = BertForSequenceClassification.from_pretrained(trained / "best")
    tokenizer = BertTokenizer.from_pretrained(trained / "best")
    names = ["place", "praise", "royal"]
    for (text, _), predicted in zip(label_rows(16, start=3), tsv_column(path, 1)):
        ids = tokenizer.build_inputs_with_special_tokens(tokenizer.encode(
            text, add_special_tokens=False))
        probability = 1 / (1 + numpy.exp(-model(numpy.array([ids])).logits[0]))
        assert predicted == ",".join(n for n, p in zip(names, probability) if p > 0.5), text
    exact = numpy.mean([set(p.split(",")) == set(g.split(","))      # the sets, in any order
                        for p, g in zip(tsv_column(path, 1), tsv_column(path, 2))])
    best = [r for r in evaluations if r["step"] == results["best"]["step"]][0]
    assert best["exact_match"] == pytest.approx(exact)
    # the topics are in the words: learnt beyond every label everywhere (micro-F1 2/3)
    assert results["best"]["score"] > 0.8, results["best"]


def test_eval_and_predict_on_a_multilabel_folder(trained, files, tmp_path):
    """--do eval scores the folder as training did (the task from best.json, or without it from
    config.json's problem_type); --do predict labels a plain text file as the test set was."""
    logged, copy = best_evaluation_and_bare_copy(trained, tmp_path)
    for folder in (trained / "best", copy):
        args = finetune.resolve_task(finetune.parse_args(
            ["--do", "eval", "--model", str(folder), "--dev", str(files["dev"])]))
        assert (args.task, args.model_labels) == ("multilabel", ["place", "praise", "royal"])
    run("--do", "eval", "--model", copy, "--dev", files["dev"], "--out", tmp_path / "eval")
    result = json.loads(read(tmp_path / "eval" / "eval_results.json"))
    assert result["task"] == "multilabel"
    for name, value in result["dev"].items():
        assert value == pytest.approx(logged[name], abs=1e-12), name
    assert read(tmp_path / "eval" / "dev_predictions.tsv") == read(trained / "dev_predictions.tsv")
    plain = tmp_path / "texts.txt"
    plain.write_text("".join(text + "\n" for text, _ in label_rows(16, start=3)), encoding="utf-8")
    run("--do", "predict", "--model", trained / "best", "--test", plain, "--out",
        tmp_path / "predict")
    predictions = tmp_path / "predict" / "test_predictions.tsv"
    assert read(predictions).splitlines()[0] == "index\tprediction"
    assert tsv_column(predictions, 1) == tsv_column(trained / "test_predictions.tsv", 1)


def test_multilabel_resumes_exactly(files, tiny_bert, tmp_path):
    """2 epochs of 8 steps straight == 10 steps, stop, --resume (dropout on)."""
    run(*train_args(files, tiny_bert, tmp_path / "straight", "--epochs", 2, "--log-every", 1))
    resumed = tmp_path / "resumed"
    run(*train_args(files, tiny_bert, resumed, "--epochs", 2, "--log-every", 1,
                    "--stop-at-step", 10))
    assert json.loads(read(resumed / "checkpoint" / "trainer_state.json"))["step"] == 10
    run(*train_args(files, tiny_bert, resumed, "--epochs", 2, "--log-every", 1, "--resume"))
    assert_same_run(tmp_path / "straight", resumed)


def collapse_case(predicted_sets):
    """collapse_report on the dev rows of label_rows(16) for the given predicted sets."""
    task = training_tasks.TASKS["multilabel"]
    names = ["place", "praise", "royal"]
    examples = [data_tasks.TextExample(text, label=tuple(labels.split(",")) if labels else ())
                for text, labels in label_rows(16)]
    features = data_tasks.Features([[2, 3]] * 16, [[0, 0]] * 16,
                                   {"labels": data_tasks.multi_hot_labels(examples, names)})
    data = training_tasks.Data({"dev": (examples, features)}, names, False)
    logits = [training_tasks.constant_logits(task, names, s) for s in predicted_sets]
    args = types.SimpleNamespace(metric="micro_f1")
    scores, predictions = task.evaluate(args, None, data, examples, features, logits)
    assert predictions == predicted_sets
    return training_tasks.collapse_report(args, task, data, scores, predictions)


def test_a_multilabel_model_predicting_one_set_everywhere_is_reported():
    """'praise' for all 16 rows (8 have it, of 24 labels in all): precision 1/2, recall 1/3,
    micro-F1 0.4; dev's commonest set (a tie of the 8 sets, twice each: the first, none)
    scores 0."""
    message = collapse_case([("praise",)] * 16)
    assert message.startswith("warning: the model looks collapsed: it predicts 'praise' for "
                              "100% of dev, dev micro_f1 0.4000 against 0.0000 for always no "
                              "label"), message
    right = [tuple(t for bit, t in enumerate(TOPICS) if i % 8 >> bit & 1) for i in range(16)]
    right = [tuple(n for n in ["place", "praise", "royal"] if n in s) for s in right]
    assert collapse_case(right) is None


def test_multilabel_refuses_bad_labels_in_one_line(files, tiny_bert, trained, tmp_path):
    common = ("--model", tiny_bert, "--out", tmp_path / "bad", "--max-steps", 1)
    unknown = write_rows(tmp_path / "unknown.tsv", [("the king", "royal"), ("a film", "sport")])
    with pytest.raises(ValueError, match=r"unknown.tsv:2: label 'sport' is not in the label set "
                                         r"\['place', 'praise', 'royal'\]"):
        run("--task", "multilabel", "--train", files["train"], "--dev", unknown, *common)
    empty = write_rows(tmp_path / "empty_name.tsv", [("the king", "royal,,place")])
    with pytest.raises(ValueError, match=r"empty_name.tsv:1: empty label name in 'royal,,place'"):
        run("--task", "multilabel", "--train", empty, "--dev", files["dev"], *common)
    twice = write_rows(tmp_path / "twice.tsv", [("the king", "royal,royal")])
    with pytest.raises(ValueError, match=r"twice.tsv:1: label 'royal' given twice"):
        run("--task", "multilabel", "--train", twice, "--dev", files["dev"], *common)
    with pytest.raises(ValueError, match=r"unknown.tsv:2: label 'sport' is not one of the "
                                         r"model's labels"):
        run("--do", "eval", "--model", trained / "best", "--dev", unknown, "--out",
            tmp_path / "eval")
    with pytest.raises(SystemExit, match=r"with 3 output\(s\) of problem_type "
                                         r"multi_label_classification; --task classify needs "
                                         r"single_label_classification"):
        run("--do", "eval", "--model", trained / "best", "--task", "classify",
            "--dev", data("sst2_dev.tsv"), "--out", tmp_path / "eval")


def test_each_sequence_task_declares_its_problem_type(files, tiny_bert, tmp_path):
    """best/config.json says what finetune.py trained: classify single-label, regress
    regression, and a multi-label task of one label multi-label (one output: the guess from
    the labels took it for a regression), which --do eval then reads back as multilabel."""
    kinds = {}
    one_label = write_rows(tmp_path / "one.tsv", [(text, "praise" if "praise" in labels else "")
                                                  for text, labels in label_rows(16)])
    runs = {"classify": ("--glue-task", "sst-2", "--train", data("sst2_train.tsv"),
                         "--dev", data("sst2_dev.tsv")),
            "regress": ("--task", "regress", "--glue-task", "sts-b", "--train",
                        data("stsb_dev.tsv"), "--dev", data("stsb_dev.tsv")),
            "multilabel": ("--task", "multilabel", "--train", one_label, "--dev", one_label)}
    for name, argv in runs.items():
        run(*argv, "--model", tiny_bert, "--out", tmp_path / name, "--max-steps", 2,
            "--lr", 1e-3)
        kinds[name] = json.loads(read(tmp_path / name / "best" / "config.json"))["problem_type"]
    assert kinds == {"classify": "single_label_classification", "regress": "regression",
                     "multilabel": "multi_label_classification"}
    os.remove(tmp_path / "multilabel" / "best" / "best.json")
    args = finetune.resolve_task(finetune.parse_args(
        ["--do", "eval", "--model", str(tmp_path / "multilabel" / "best"), "--dev",
         str(one_label)]))
    assert (args.task, args.model_labels) == ("multilabel", ["praise"])
