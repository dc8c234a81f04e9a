"""train.py end to end: exact resume, bad input, and (slower) that a tiny BERT learns."""
import json
import os
import pathlib
import re

import numpy
import pytest

import train
from nanobert import BertConfig, BertForPreTraining
from nanobert.formats import safetensors
from nanobert.model.ops import IGNORE_INDEX
from nanobert.training.pretraining import masked_input_hits, unigram_baseline

ROOT = pathlib.Path(__file__).resolve().parent.parent
BROWN = ROOT / "data" / "brown"
VOCAB = BROWN / "vocab-uncased-8192.txt"
SMALL = {"vocab_size": 8192, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
         "intermediate_size": 64, "max_position_embeddings": 128}


def run(tmp_path, out, *extra, **config_changes):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**SMALL, **config_changes}))
    args = ["--data", str(BROWN / "heldout.txt.gz"), "--heldout", "--vocab", str(VOCAB),
            "--config", str(config), "--dupe-factor", "1", "--max-seq-length", "64",
            "--batch-size", "8", "--log-every", "1", "--out", str(out), *extra]
    return train.main(args)


def train_losses(out):
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    return [(r["step"], r["mlm_loss"], r["nsp_loss"]) for r in rows if r["kind"] == "train"]


def test_resume_continues_exactly(tmp_path):
    """N steps straight == k steps, stop, --resume, N - k steps: same losses, same weights."""
    run(tmp_path, tmp_path / "straight", "--steps", "6")
    run(tmp_path, tmp_path / "resumed", "--steps", "6", "--stop-at-step", "3")
    state = json.loads((tmp_path / "resumed" / "checkpoint" / "trainer_state.json").read_text())
    assert state["step"] == 3
    run(tmp_path, tmp_path / "resumed", "--steps", "6", "--resume")
    assert train_losses(tmp_path / "resumed") == train_losses(tmp_path / "straight")
    a = safetensors.load_file(tmp_path / "straight" / "checkpoint" / "model.safetensors")
    b = safetensors.load_file(tmp_path / "resumed" / "checkpoint" / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        numpy.testing.assert_array_equal(a[name], b[name], err_msg=name)
    files = sorted(os.listdir(tmp_path / "resumed" / "checkpoint"))
    assert files == ["config.json", "model.safetensors", "optimizer.safetensors",
                     "trainer_state.json", "vocab.txt"]


def test_the_progress_line_shows_the_time_left(tmp_path, capsys):
    run(tmp_path, tmp_path / "run", "--steps", "2")
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert len(lines) == 2 and all(re.search(r"tok/s  elapsed \d+\.\d min  left ~\d+\.\d min$",
                                             line) for line in lines), lines


def test_time_budget_stops_early_and_resume_finishes(tmp_path, capsys):
    """--steps without --minutes has no time budget (a schedule of 10,000 steps once stopped
    silently at the default ten minutes); --minutes with --steps stops at the budget, says
    so, and --resume alone runs the schedule to its end."""
    assert train.parse_args([]).minutes == 10.0
    assert train.parse_args(["--steps", "5"]).minutes is None
    out = tmp_path / "run"
    run(tmp_path, out, "--steps", "400", "--minutes", "0.002")
    stopped = json.loads((out / "checkpoint" / "trainer_state.json").read_text())["step"]
    assert stopped < 400
    assert f"ends the run at step {stopped} of 400" in capsys.readouterr().out
    run(tmp_path, out, "--resume", "--log-every", "50")
    assert json.loads((out / "checkpoint" / "trainer_state.json").read_text())["step"] == 400


def test_time_budget_fits_the_whole_schedule(tmp_path, capsys):
    """--minutes alone: the step count is re-planned as the run goes from the wall time the
    steps took, held-out evaluations included, so the schedule (and its decay of the lr to 0)
    ends inside the budget. Here evaluations cost several steps each: a plan from the steps'
    own time overshoots and the budget would cut the run short, mid-schedule."""
    out = tmp_path / "run"
    run(tmp_path, out, "--minutes", "0.25", "--heldout", str(BROWN / "heldout.txt.gz"),
        "--eval-every", "2", "--eval-batches", "20", "--log-every", "1000")
    printed = capsys.readouterr().out
    state = json.loads((out / "checkpoint" / "trainer_state.json").read_text())
    assert "re-planned from the measured pace" in printed
    assert "ends the run at step" not in printed, printed
    assert state["step"] == state["total_steps"] > 10, state


class PaceHalves:
    """A fake clock for nanobert.training.budget: every forward+backward pass of `model_class`
    takes one second, two from the `slow_from`-th pass on (the machine got busy mid-run)."""

    def __init__(self, monkeypatch, model_class, slow_from):
        self.time, self.passes, self.slow_from = 0.0, 0, slow_from
        monkeypatch.setattr("nanobert.training.budget.now", lambda: self.time)
        passes = model_class.loss_and_grads

        def timed(model, *args, **kwargs):
            self.passes += 1
            self.time += 1.0 if self.passes < self.slow_from else 2.0
            return passes(model, *args, **kwargs)
        monkeypatch.setattr(model_class, "loss_and_grads", timed)


def last_train_record(out):
    return [json.loads(line) for line in open(out / "metrics.jsonl")
            if json.loads(line)["kind"] == "train"][-1]


def test_time_budget_ends_the_schedule_when_the_pace_halves(tmp_path, monkeypatch, capsys):
    """The probe sees 1 s a step: ~54 steps fit in a minute; from the 25th pass on a step
    takes 2 s, so ~40 fit. The plan follows the pace: the run ends its schedule (the last
    step's lr is the schedule's last, peak / steps) inside the budget, and uses most of it."""
    clock = PaceHalves(monkeypatch, BertForPreTraining, slow_from=25)
    out = tmp_path / "run"
    run(tmp_path, out, "--minutes", "1", "--lr", "1e-3", "--log-every", "1000")
    state = json.loads((out / "checkpoint" / "trainer_state.json").read_text())
    printed = capsys.readouterr().out
    assert "ends the run at step" not in printed, printed
    assert state["step"] == state["total_steps"], state
    assert f"at step {state['step']} of {state['step']}, the schedule's end (lr 0)" in printed
    assert last_train_record(out)["lr"] == pytest.approx(1e-3 / state["total_steps"])
    assert clock.time <= 4 + 60 and state["step"] >= 0.9 * (20 + 40 / 2), (clock.time, state)


def test_gradient_accumulation_takes_the_same_steps(tmp_path):
    """--grad-accum 2 (two micro-batches of 4) ~ one batch of 8, without dropout: the logged
    losses of 3 steps agree to 1e-5 (the first is the mean over both halves before any update;
    the next two follow the accumulated steps). Each micro-batch's loss is divided by the whole
    batch's counts, so the sum is the batch's loss; tests/test_data_parallel.py checks the
    weights too, to rounding."""
    no_dropout = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    run(tmp_path, tmp_path / "one", "--steps", "3", **no_dropout)
    run(tmp_path, tmp_path / "two", "--steps", "3", "--grad-accum", "2", **no_dropout)
    one, two = train_losses(tmp_path / "one"), train_losses(tmp_path / "two")
    assert len(one) == len(two) == 3
    numpy.testing.assert_allclose(two, one, rtol=1e-5)


def test_no_nsp_trains_the_masked_lm_alone(tmp_path):
    """--no-nsp (the paper's "No NSP" ablation): without weight decay the NSP classifier and
    the pooler, which only the NSP loss reaches, keep their initial weights while the MLM
    weights move; with NSP all of them move. The train log has no NSP numbers; the held-out
    evaluation still measures NSP."""
    held = ["--heldout", str(BROWN / "heldout.txt.gz"), "--eval-batches", "2"]
    for name, extra in (("mlm", ["--no-nsp", *held]), ("both", [])):
        run(tmp_path, tmp_path / name, "--steps", "3", "--weight-decay", "0", *extra)
    config = BertConfig.from_json_file(tmp_path / "mlm" / "checkpoint" / "config.json")
    initial = BertForPreTraining(config, seed=0).params
    nsp_only = ("cls.seq_relationship.weight", "cls.seq_relationship.bias",
                "bert.pooler.dense.weight", "bert.pooler.dense.bias")
    for name, moved in (("mlm", False), ("both", True)):
        weights = safetensors.load_file(tmp_path / name / "checkpoint" / "model.safetensors")
        for key in nsp_only:
            assert numpy.array_equal(weights[key], initial[key]) != moved, (name, key)
        assert not numpy.array_equal(weights["cls.predictions.transform.dense.weight"],
                                     initial["cls.predictions.transform.dense.weight"]), name
    rows = [json.loads(line) for line in open(tmp_path / "mlm" / "metrics.jsonl")]
    assert all("nsp_loss" not in r for r in rows if r["kind"] == "train")
    summary = json.loads((tmp_path / "mlm" / "eval.json").read_text())
    assert "nsp_accuracy" in summary["heldout"] and "nsp_standard_errors" in summary
    assert 0.01 < summary["unigram_accuracy"] < 0.2       # always "the": a few percent
    counts = summary["heldout"]["masked_tokens_by_input"]
    assert sum(counts.values()) == summary["heldout"]["masked_tokens"]
    assert counts["mask"] > 5 * counts["random"] > 0        # 80% / 10% / 10%


def test_presets_set_dropout(tmp_path):
    """nano, the ten-minute default, trains without dropout; the BERT sizes keep 0.1; a
    --config keeps its own."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**SMALL, "hidden_dropout_prob": 0.2,
                                "attention_probs_dropout_prob": 0.2}))
    for flags, dropout in ((["--preset", "nano"], 0.0), ([], 0.0), (["--preset", "tiny"], 0.1),
                           (["--preset", "base"], 0.1), (["--config", str(path)], 0.2)):
        config = train.model_config(train.parse_args(flags), 8192)
        assert (config.hidden_dropout_prob, config.attention_probs_dropout_prob) == (dropout,) * 2


def test_masked_accuracy_is_split_by_what_the_input_held():
    """[MASK] (id 4), a random token, or the original kept: each predicted position counts
    in one kind, by its input; hits are argmax == label. Counts and hits differ per kind so
    that a swap of kinds, or counting unpredicted positions, fails."""
    ignore = IGNORE_INDEX
    input_ids = numpy.array([[2, 4, 9, 4, 7, 3],
                             [2, 8, 4, 6, 6, 3]])
    labels = numpy.array([[ignore, 5, 10, 6, 7, ignore],      # mask, random, mask, kept
                          [ignore, 8, 11, ignore, 6, ignore]])  # kept, mask, kept
    # argmax per predicted position, in row-major order: mask hit, random miss, mask miss,
    # kept hit, kept miss, mask hit, kept miss
    guesses = [5, 0, 0, 7, 0, 11, 0]
    logits = numpy.zeros((len(guesses), 16))
    logits[numpy.arange(len(guesses)), guesses] = 1.0
    hits = masked_input_hits({"input_ids": input_ids, "labels": labels}, logits, 4)
    assert hits == {"mask": (2, 3), "random": (0, 1), "kept": (1, 3)}


def test_resume_with_another_config_is_refused(tmp_path):
    run(tmp_path, tmp_path / "run", "--steps", "2")
    with pytest.raises(SystemExit, match="--batch-size 4, but the checkpoint used 8"):
        run(tmp_path, tmp_path / "run", "--steps", "2", "--resume", "--batch-size", "4")


def test_resume_with_another_vocab_is_refused(tmp_path):
    run(tmp_path, tmp_path / "run", "--steps", "1")
    other = tmp_path / "vocab.txt"
    other.write_text(VOCAB.read_text(encoding="utf-8").replace("\nthe\n", "\nthe2\n"),
                     encoding="utf-8")
    config = tmp_path / "config.json"
    with pytest.raises(SystemExit, match="another vocab"):
        train.main(["--data", str(BROWN / "heldout.txt.gz"), "--heldout", "--vocab", str(other),
                    "--config", str(config), "--dupe-factor", "1", "--max-seq-length", "64",
                    "--batch-size", "8", "--out", str(tmp_path / "run"), "--steps", "2",
                    "--resume"])


def test_sequence_longer_than_the_position_table_is_refused(tmp_path):
    with pytest.raises(SystemExit,
                       match="max_seq_length 256 exceeds the model's max_position_embeddings 128"):
        run(tmp_path, tmp_path / "run", "--steps", "1", "--max-seq-length", "256")


@pytest.mark.parametrize("content, pattern", [
    (b"", "empty"), (b"   \n\n  \n", "empty"), (b"good line\n\xff\xfebad\n", "byte offset|offset")])
def test_bad_corpora_are_named(tmp_path, content, pattern):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(content)
    with pytest.raises(ValueError, match=pattern):
        train.main(["--data", str(corpus), "--heldout", "--vocab", str(VOCAB), "--steps", "1",
                    "--out", str(tmp_path / "run")])


def test_vocab_without_special_tokens_is_refused(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("a\nb\n[UNK]\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"\[PAD\]|\[CLS\]|\[MASK\]"):
        run(tmp_path, tmp_path / "run", "--steps", "1", "--vocab", str(vocab))


def test_missing_vocab_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.txt"):
        run(tmp_path, tmp_path / "run", "--steps", "1", "--vocab", str(tmp_path / "nowhere.txt"))


def test_checkpoint_loads_in_transformers(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    run(tmp_path, tmp_path / "run", "--steps", "2")
    folder = tmp_path / "run" / "checkpoint"
    model = transformers.BertForPreTraining.from_pretrained(folder)
    tokenizer = transformers.BertTokenizer.from_pretrained(folder)
    ids = tokenizer("the jury said", return_tensors="pt")
    with torch.no_grad():
        assert model(**ids).prediction_logits.shape[-1] == 8192


def test_a_small_bert_learns_on_the_brown_corpus(tmp_path):
    """A 3,000-step schedule of a 2-layer, H=64 BERT on Brown at T=64, about 3.5 minutes here.
    On ~5,400 held-out pairs: the MLM loss falls well below its start and below the unigram
    baseline (the loss of ignoring context), and NSP accuracy beats always guessing the
    majority class by more than 3 standard errors of a coin-flip accuracy (measured here: MLM
    6.32 vs unigram 6.83; NSP 0.601 vs majority 0.555, margin 0.020). Stopped at step 1,500,
    as it was until the packed encoder, NSP read 0.560-0.594 across runs that differ only in
    summation order and which probabilities a dropout mask meets: too close to the bar."""
    from nanobert.data.pretraining_data import PretrainingDataset
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**SMALL, "hidden_size": 64, "num_hidden_layers": 2,
                                  "intermediate_size": 256}))
    out = tmp_path / "run"
    train.main(["--vocab", str(VOCAB), "--config", str(config), "--max-seq-length", "64",
                "--dupe-factor", "5", "--heldout-dupe-factor", "4", "--lr", "1e-3",
                "--steps", "3000", "--minutes", "60",
                "--batch-size", "32", "--log-every", "10",
                "--eval-every", "3000", "--eval-batches", "1000", "--checkpoint-every", "100000",
                "--out", str(out)])
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    held = [r for r in rows if r["kind"] == "eval"][-1]
    assert held["step"] == 3000
    first = train_losses(out)[0][1]
    datasets = {p.name.split("-")[0]: PretrainingDataset(p) for p in (out / "data").iterdir()}
    unigram, _, _ = unigram_baseline(datasets["train"], datasets["heldout"], 8192, 1000,
                                     32)
    margin = 3 * (0.25 / held["sequences"]) ** 0.5
    print(f"MLM: first logged {first:.3f}, held-out {held['mlm_loss']:.3f}, unigram {unigram:.3f}; "
          f"NSP held-out {held['nsp_accuracy']:.3f} vs majority "
          f"{held['nsp_majority_accuracy']:.3f} + {margin:.3f}")
    assert held["mlm_loss"] < first - 1.0, (held, first)
    assert held["mlm_loss"] < unigram - 0.2, (held, unigram)
    assert held["nsp_accuracy"] > held["nsp_majority_accuracy"] + margin, held
