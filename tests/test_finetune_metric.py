"""finetune.py keeps the best dev checkpoint by --metric: the highest score, the lowest loss;
a --metric that is not a dev score is refused naming the ones that are. And its --help states
the default run's time as the documentation measured it."""
import glob
import os
import re
import types

import pytest

import finetune
from nanobert.training.tasks import is_better, selectable_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_dev_evaluations(monkeypatch, tmp_path, metric, dev_scores):
    """evaluate_dev once per epoch with the given dev scores (the model is not run) -> the
    epochs whose checkpoint was saved as best, and the final best."""
    queue = list(dev_scores)
    saved = []
    monkeypatch.setattr(finetune, "evaluate", lambda *a, **k: (queue.pop(0), None))
    monkeypatch.setattr(finetune, "save_best", lambda model, tok, folder, info:
                        saved.append(info["epoch"]))
    args = types.SimpleNamespace(metric=metric, out=str(tmp_path), task="classify")
    task = types.SimpleNamespace(write=lambda *a: None, named_labels=False)   # no collapse check
    data = types.SimpleNamespace(splits={"dev": ([], None)})
    best = None
    for epoch in range(1, len(dev_scores) + 1):
        best = finetune.evaluate_dev(args, task, None, None, data, epoch * 10, 10, best)
    return saved, best


def test_metric_loss_keeps_the_lowest_dev_loss(monkeypatch, tmp_path):
    """The issue's run: dev loss 0.0234 -> 0.0014 -> 0.0008 must end with epoch 3 as best
    (the old code kept epoch 1, the highest loss)."""
    scores = [{"accuracy": 0.9, "loss": loss} for loss in (0.0234, 0.0014, 0.0008)]
    saved, best = run_dev_evaluations(monkeypatch, tmp_path, "loss", scores)
    assert saved == [1, 2, 3] and best["score"] == 0.0008, (saved, best)
    scores = [{"accuracy": 0.9, "loss": loss} for loss in (0.5, 0.7, 0.6)]
    saved, best = run_dev_evaluations(monkeypatch, tmp_path, "loss", scores)
    assert saved == [1] and best["score"] == 0.5, (saved, best)


def test_metric_accuracy_keeps_the_highest(monkeypatch, tmp_path):
    scores = [{"accuracy": a, "loss": 0.1} for a in (0.7, 0.9, 0.8)]
    saved, best = run_dev_evaluations(monkeypatch, tmp_path, "accuracy", scores)
    assert saved == [1, 2] and best["score"] == 0.9, (saved, best)


def test_a_metric_that_is_not_a_dev_score_is_refused_naming_the_allowed(monkeypatch, tmp_path):
    scores = {"exact": 50.0, "f1": 60.0, "total": 12, "HasAns_total": 6, "best_f1_thresh": -1.0,
              "per_type": {"PER": 0.5}}
    assert selectable_metrics(scores) == ["exact", "f1"]
    for metric in ("total", "per_type", "bleu"):
        with pytest.raises(SystemExit, match=f"--metric {metric} .* pick one of exact, f1$"):
            is_better(metric, scores, None)
    with pytest.raises(SystemExit, match="pick one of accuracy, loss"):
        run_dev_evaluations(monkeypatch, tmp_path, "f1", [{"accuracy": 0.5, "loss": 1.0}])


def test_help_states_the_default_runs_time_as_the_documentation_measured_it():
    """Every "N min" figure of finetune.py's --help is one the README / docs/ pages state."""
    help_text = finetune.__doc__
    figures = re.findall(r"(\d+(?:\.\d+)?) ?min", help_text)
    assert figures, help_text
    documentation = ""
    for path in [os.path.join(ROOT, "README.md")] + glob.glob(os.path.join(ROOT, "docs", "*.md")):
        with open(path, encoding="utf-8") as f:
            documentation += f.read()
    stated = set(re.findall(r"(\d+(?:\.\d+)?) min", documentation))
    missing = [f for f in figures if f not in stated and f"{f}.0" not in stated]
    assert not missing, f"finetune.py --help gives {missing} min, which no documentation states"
