"""nanobert/check_pretraining.py on a stand-in finetune.py (the real runs take tens of minutes):
its verdict follows the test scores of the rates dev chose, never the rates test would choose,
and a killed check goes on without repeating a finished run."""
import json
import os
import sys
import textwrap

import pytest

from nanobert import check_pretraining as check

# A stand-in for finetune.py whose dev and test disagree. For every task and start dev prefers
# one rate (pretrained 3e-4, from scratch 1e-3) and test the other; the test score of dev's
# choice is TEST[task][start][0] + seed / 100, of the other rate TEST[task][start][1]. On dev's
# choices pretraining pays on trec (+10 points, +10 stds), is level on movie-sentiment and
# hurts on conll2003; on test's choices it would be the other way round.
# It writes what finetune.py writes (results.json, metrics.jsonl) and one line per call to
# $FAKE_CALLS; the run named by $FAKE_KILL ("task start seed lr") dies (SIGKILL) after its
# first epoch's checkpoint, the one named by $FAKE_KILL_EARLY before it.
FAKE_FINETUNE = textwrap.dedent("""
    import json, os, signal, sys
    argv = sys.argv[1:]
    value = lambda flag: argv[argv.index(flag) + 1]
    lr, seed, out, task = float(value("--lr")), int(value("--seed")), value("--out"), \\
        value("--dataset")
    start = "from-scratch" if "--from-scratch" in argv else "pretrained"
    with open(os.environ["FAKE_CALLS"], "a") as f:
        f.write(" ".join(argv) + "\\n")
    os.makedirs(out, exist_ok=True)
    if os.environ.get("FAKE_KILL") == f"{task} {start} {seed} {lr:g}":   # after an epoch
        os.makedirs(os.path.join(out, "checkpoint"))
        open(os.path.join(out, "checkpoint", "trainer_state.json"), "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get("FAKE_KILL_EARLY") == f"{task} {start} {seed} {lr:g}":  # before one
        open(os.path.join(out, "metrics.jsonl"), "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    TEST = {"trec": {"pretrained": (0.80, 0.60), "from-scratch": (0.70, 0.90)},
            "movie-sentiment": {"pretrained": (0.75, 0.60), "from-scratch": (0.75, 0.90)},
            "conll2003": {"pretrained": (0.50, 0.90), "from-scratch": (0.60, 0.40)}}
    dev_choice = lr == {"pretrained": 3e-4, "from-scratch": 1e-3}[start]
    dev = 0.80 if dev_choice else 0.70
    test = TEST[task][start][0] + seed / 100 if dev_choice else TEST[task][start][1]
    metric, scale = ("f1", 100) if task == "conll2003" else ("accuracy", 1)
    with open(os.path.join(out, "metrics.jsonl"), "w") as f:
        for epoch, score in enumerate((dev - 0.1, dev, dev - 0.05), 1):
            f.write(json.dumps({"kind": "train", "loss": 1.0 / epoch}) + "\\n")
            f.write(json.dumps({"kind": "eval", "split": "dev", metric: scale * score}) + "\\n")
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"best": {"score": scale * dev, "epoch": 2.0},
                   "test": {metric: scale * test}, "train_minutes": 0.01}, f)
""")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    script = tmp_path / "fake_finetune.py"
    script.write_text(FAKE_FINETUNE)
    monkeypatch.setattr(check, "FINETUNE", [sys.executable, str(script)])
    monkeypatch.setenv("FAKE_CALLS", str(tmp_path / "calls.txt"))
    model = tmp_path / "pretrain" / "checkpoint"          # a nano model's config: the rates
    model.mkdir(parents=True)                             # 3e-4 and 1e-3, dev chooses
    (model / "config.json").write_text(json.dumps(
        {"vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 2, "intermediate_size": 256}))
    return tmp_path


def check_main(tmp_path, *flags):
    return check.main([str(tmp_path / "pretrain" / "checkpoint"), "--out",
                       str(tmp_path / "check"), *flags])


def calls(tmp_path):
    path = tmp_path / "calls.txt"
    return path.read_text().splitlines() if path.exists() else []


def test_the_verdict_reads_the_test_scores_of_the_rates_dev_chose(fake, capsys):
    tmp_path = fake
    assert check_main(tmp_path) == 0
    assert len(calls(tmp_path)) == 3 * 2 * 3 * 2          # tasks x starts x seeds x rates
    out = capsys.readouterr().out
    assert "36 fine-tuning runs; 0 done, 36 to go: about" in out, out
    table = (tmp_path / "check" / "table.md").read_text()
    assert "| TREC (accuracy %) | 80.0 +- 0.0 | 81.0 +- 1.0 | 80.0 +- 0.0 | 71.0 +- 1.0 " \
        "| +10.0 | +10.0 | 3 / 3 |" in table, table
    assert "| CoNLL-2003 NER (F1) | 80.0 +- 0.0 | 51.0 +- 1.0 | 80.0 +- 0.0 | 61.0 +- 1.0 " \
        "| -10.0 | -10.0 | 3 / 3 |" in table, table               # F1: a percent already
    verdict = ("Verdict: pretraining pays on trec (+10.0 std); not on movie-sentiment "
               "(+0.0 std); hurts on conll2003 (-10.0 std).")
    assert verdict in table and verdict in out
    assert "Movie sentiment is data-bound at this size" in table
    numbers = json.loads((tmp_path / "check" / "results.json").read_text())
    assert numbers["tasks"]["trec"]["pooled_std"] == pytest.approx(1.0)
    assert numbers["rates"] == [3e-4, 1e-3]
    # what finetune.py was asked: README's pair, the task's data, one rate and seed each
    trec = [c.split() for c in calls(tmp_path) if "--dataset trec" in c]
    assert sum("--from-scratch" in c for c in trec) == len(trec) / 2
    assert all(c[c.index("--model") + 1] == str(tmp_path / "pretrain" / "checkpoint")
               and c[c.index("--lr") + 1] in ("0.0003", "0.001") for c in trec)
    # a second call finds every record: nothing runs or is recorded again, the same table
    assert check_main(tmp_path) == 0 and len(calls(tmp_path)) == 36
    assert (tmp_path / "check" / "table.md").read_text() == table
    record = tmp_path / "check" / "records" / "trec" / "pretrained-seed0-lr3e-04.json"
    assert 0 < json.loads(record.read_text())["cpu_minutes"] < 1     # the run's own, kept


def test_a_killed_check_goes_on_without_repeating_a_finished_run(fake, monkeypatch):
    tmp_path = fake
    monkeypatch.setenv("FAKE_KILL", "trec from-scratch 1 0.001")
    monkeypatch.setenv("FAKE_KILL_EARLY", "trec pretrained 1 0.001")
    with pytest.raises(SystemExit, match="some runs failed"):
        check_main(tmp_path, "--tasks", "trec", "--seeds", "0", "1")
    assert len(calls(tmp_path)) == 2 * 2 * 2
    records = tmp_path / "check" / "records" / "trec"
    assert len(os.listdir(records)) == 6                  # all but the two killed runs
    # a run that finished but whose record was never written (killed between the two)
    os.remove(records / "pretrained-seed0-lr3e-04.json")
    assert check_main(tmp_path, "--tasks", "trec", "--table") == 0     # runs nothing
    assert len(calls(tmp_path)) == 8
    text = (tmp_path / "check" / "table.md").read_text()
    assert "| 0 / 1 (more pending) |" in text, text       # no seed of one side, 1 of the other
    monkeypatch.delenv("FAKE_KILL")
    monkeypatch.delenv("FAKE_KILL_EARLY")
    assert check_main(tmp_path, "--tasks", "trec", "--seeds", "0", "1") == 0
    again = sorted(calls(tmp_path)[8:], key=lambda c: "--from-scratch" in c)
    assert len(again) == 2, again                         # the killed runs alone
    assert "--from-scratch" not in again[0] and "--overwrite" in again[0].split()  # afresh
    assert "--from-scratch" in again[1] and "--resume" in again[1].split()    # from its epoch
    assert all("--seed 1" in c and "--lr 0.001" in c for c in again)
    assert len(os.listdir(records)) == 8
    table = (tmp_path / "check" / "table.md").read_text()
    assert "| +10.0 | +14.1 | 2 / 2 |" in table, table      # two seeds: std 0.71


def test_the_verdict_in_words():
    def row(in_stds):
        return {"in_stds": in_stds}
    nan = float("nan")
    assert check.verdict({"trec": row(3.4), "conll2003": row(12.0),
                          "movie-sentiment": row(-0.2)}) == \
        "pretraining pays on trec (+3.4 std) and conll2003 (+12.0 std); not on " \
        "movie-sentiment (-0.2 std)"
    assert check.verdict({"trec": row(2.9), "conll2003": row(-3.1)}) == \
        "pretraining does not pay on trec (+2.9 std); hurts on conll2003 (-3.1 std)"
    assert check.verdict({"trec": row(nan)}) == \
        "pretraining no spread yet (one seed a side) on trec"
    assert check.verdict({}) == "nothing measured yet"
