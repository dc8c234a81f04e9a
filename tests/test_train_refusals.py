"""train.py loses nothing and hides nothing: a diverging run stops naming the step and the
tensor and never replaces the last good checkpoint; a full disk is one line; a crash's
leftovers (a torn metrics line, an interrupted swap, a stale build folder) never block a
resume; a resume that could not continue exactly is refused naming the flag."""
import errno
import gzip
import json
import os
import re

import numpy
import pytest

import train
from nanobert import BertForPreTraining
from nanobert.formats import safetensors
from nanobert.model.optim import AdamW
from nanobert.model.pretrained import load_training_checkpoint
from test_train import BROWN, run, train_losses

POISONED = "cls.predictions.bias"


def checkpoint_step(out):
    return load_training_checkpoint(BertForPreTraining, out / "checkpoint")[3]["step"]


def poison_weights_from_step(monkeypatch, first_bad_step):
    """AdamW.step writes a NaN into POISONED from its `first_bad_step`-th call on: a forced
    divergence (the flags refuse an --lr large enough to diverge for real)."""
    step = AdamW.step
    calls = []

    def diverging_step(self, grads, lr=None, **kwargs):
        step(self, grads, lr=lr, **kwargs)
        calls.append(1)
        if len(calls) >= first_bad_step:
            self.params[POISONED][0] = numpy.nan
    monkeypatch.setattr(AdamW, "step", diverging_step)
    return calls


@pytest.fixture
def stopped_at_3(tmp_path):
    """A healthy run of 6 steps, stopped (with a checkpoint) at step 3."""
    out = tmp_path / "run"
    run(tmp_path, out, "--steps", "6", "--stop-at-step", "3", "--checkpoint-every", "1")
    assert checkpoint_step(out) == 3
    return out


# ----------------------------------------------------------------- non-finite training state

def test_diverged_weights_never_replace_the_last_good_checkpoint(tmp_path, stopped_at_3,
                                                                 monkeypatch):
    """Resumed with --checkpoint-every 1, step 4 turns a weight into NaN: the run stops at the
    save of step 4 naming the step and the tensor; checkpoint/ still loads, at step 3, with
    the weights it had."""
    out = stopped_at_3
    before = safetensors.load_file(out / "checkpoint" / "model.safetensors")
    poison_weights_from_step(monkeypatch, 1)
    with pytest.raises(SystemExit) as stopped:
        run(tmp_path, out, "--steps", "6", "--resume", "--checkpoint-every", "1")
    message = str(stopped.value.code)
    assert re.search(rf"not finite after step 4 \(first non-finite weight: {POISONED}\).*"
                     r"still holds step 3", message), message
    assert "\n" not in message, message
    assert checkpoint_step(out) == 3
    after = safetensors.load_file(out / "checkpoint" / "model.safetensors")
    for name, tensor in before.items():
        numpy.testing.assert_array_equal(after[name], tensor, err_msg=name)
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint")) \
        == ["checkpoint"]


def test_a_nan_loss_stops_the_run_naming_the_step_and_the_first_bad_weight(tmp_path,
                                                                           monkeypatch):
    poison_weights_from_step(monkeypatch, 2)          # weights bad after step 2
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as stopped:
        run(tmp_path, out, "--steps", "6")
    message = str(stopped.value.code)
    assert re.search(rf"loss is nan at step 3 \(first non-finite weight: {POISONED}\)",
                     message), message
    assert not (out / "checkpoint").exists(), "nothing may be saved"


def test_the_final_save_refuses_weights_that_turned_non_finite_at_the_last_step(tmp_path,
                                                                               monkeypatch):
    poison_weights_from_step(monkeypatch, 3)          # the last step: no loss sees it
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as stopped:
        run(tmp_path, out, "--steps", "3")
    message = str(stopped.value.code)
    assert re.search(rf"not finite after step 3 \(first non-finite weight: {POISONED}\).*"
                     "no earlier checkpoint", message), message
    assert not (out / "eval.json").exists() and not (out / "checkpoint").exists()


def test_a_non_finite_gradient_norm_stops_the_run_naming_the_gradient(tmp_path, monkeypatch):
    average_gradients = train.average_gradients

    def poisoned(*args, **kwargs):
        loss, grads, outputs = average_gradients(*args, **kwargs)
        grads["bert.pooler.dense.bias"][1] = numpy.nan   # the loss stays finite
        return loss, grads, outputs
    monkeypatch.setattr(train, "average_gradients", poisoned)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as stopped:
        run(tmp_path, out, "--steps", "3")
    message = str(stopped.value.code)
    assert re.search(r"gradient norm is (nan|inf) at step 1 \(first non-finite gradient: "
                     r"bert\.pooler\.dense\.bias\)", message), message
    assert not (out / "checkpoint").exists()


def test_a_full_disk_at_a_save_is_one_line_and_keeps_the_previous_checkpoint(
        tmp_path, stopped_at_3, monkeypatch):
    out = stopped_at_3
    steps = poison_weights_from_step(monkeypatch, 10 ** 9)    # counts steps, never poisons
    fsync = os.fsync

    def full_once_training(fd):
        if steps:                             # the disk fills up during training
            raise OSError(errno.ENOSPC, "No space left on device")
        return fsync(fd)
    monkeypatch.setattr(os, "fsync", full_once_training)
    with pytest.raises(SystemExit) as stopped:
        run(tmp_path, out, "--steps", "6", "--resume", "--checkpoint-every", "2")
    message = str(stopped.value.code)
    assert re.search(r"step 4 was not saved: no space left on the device while saving .*"
                     r"checkpoint.* MB .*still holds step 3", message), message
    assert "\n" not in message and "Traceback" not in message, message
    monkeypatch.undo()
    assert checkpoint_step(out) == 3


# ----------------------------------------------------------------- UTF-8 errors

def corpus_with_a_bad_byte(tmp_path):
    path = tmp_path / "heldout-latin1.txt"
    path.write_bytes(b"caf\xe9 au lait\n\n" + gzip.decompress((BROWN / "heldout.txt.gz")
                                                             .read_bytes()))
    return path


def test_utf8_errors_replace_holds_for_the_fill_mask_example_too(tmp_path):
    """--utf8-errors replace reaches every reader of the held-out text: the run ends with
    eval.json and its fill-mask example."""
    out = tmp_path / "run"
    heldout = corpus_with_a_bad_byte(tmp_path)
    with pytest.warns(UserWarning, match="replaced invalid UTF-8"):
        assert run(tmp_path, out, "--steps", "1", "--heldout", str(heldout), "--eval-batches",
                   "1", "--utf8-errors", "replace") == 0
    summary = json.loads((out / "eval.json").read_text())
    assert summary["fill_mask"] and summary["heldout"]["sequences"] > 0, summary


def test_the_strict_utf8_error_names_the_command_line_flag(tmp_path):
    heldout = corpus_with_a_bad_byte(tmp_path)
    with pytest.raises(ValueError) as refused:
        run(tmp_path, tmp_path / "run", "--steps", "1", "--heldout", str(heldout))
    message = str(refused.value)
    assert "heldout-latin1.txt: line 1" in message and "--utf8-errors replace" in message, \
        message


# ----------------------------------------------------------------- resuming after a crash

def test_a_torn_last_metrics_line_is_dropped_and_said_so(tmp_path, stopped_at_3, capsys):
    out = stopped_at_3
    torn = b'{"kind": "train", "step": 4, "lr": 0.0003, "mlm_lo'
    with open(out / "metrics.jsonl", "ab") as f:
        f.write(torn)
    lines = len((out / "metrics.jsonl").read_bytes().split(b"\n"))
    capsys.readouterr()
    assert run(tmp_path, out, "--steps", "6", "--resume") == 0
    said = capsys.readouterr().out
    assert (f"dropped the torn last line of {out / 'metrics.jsonl'} (line {lines}, "
            f"{len(torn)} bytes)") in said, said
    assert [s for s, _, _ in train_losses(out)] == [1, 2, 3, 4, 5, 6]


def test_a_garbage_trainer_state_is_named_in_one_line(tmp_path, stopped_at_3):
    path = stopped_at_3 / "checkpoint" / "trainer_state.json"
    path.write_text('{"step": 3, "args": {')
    with pytest.raises(ValueError) as refused:
        run(tmp_path, stopped_at_3, "--steps", "6", "--resume")
    message = str(refused.value)
    assert str(path) in message and "not valid JSON" in message and "\n" not in message, \
        message


def test_resume_finishes_an_interrupted_checkpoint_swap(tmp_path, stopped_at_3, capsys):
    """A crash between the two renames of a save leaves only checkpoint.old (and the new
    build, checkpoint.tmp): --resume puts .old back, removes .tmp and says so."""
    out = stopped_at_3
    os.replace(out / "checkpoint", out / "checkpoint.old")
    (out / "checkpoint.tmp").mkdir()
    (out / "checkpoint.tmp" / "model.safetensors").write_bytes(b"half")
    assert run(tmp_path, out, "--steps", "6", "--resume", "--stop-at-step", "4") == 0
    said = capsys.readouterr()
    assert "restored" in said.err and "checkpoint.old" in said.err, said.err
    assert "resumed" in said.out and "at step 3 of 6" in said.out, said.out
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint")) \
        == ["checkpoint"]
    assert checkpoint_step(out) == 4


def test_stale_data_builds_left_by_a_kill_are_removed(tmp_path, capsys):
    out = tmp_path / "run"
    stale = out / "data" / "train-64-0123456789ab.tmp"
    stale.mkdir(parents=True)
    (stale / "tmp").mkdir()
    assert run(tmp_path, out, "--steps", "1", "--checkpoint-every", "1") == 0
    assert not stale.exists()
    assert f"removed the unfinished {stale}" in capsys.readouterr().err


# ----------------------------------------------------------------- what a resume may change

# (flags on the resume, the refusal) - each changes the batches, the schedule or the update
CHANGED = [
    (["--lr", "0.001"], "--lr 0.001, but the checkpoint used 0.0005"),
    (["--grad-accum", "2"], "--grad-accum 2, but the checkpoint used 1"),
    (["--dynamic-masking"], "--dynamic-masking, but the checkpoint used no --dynamic-masking"),
    (["--warmup", "0.2"], "--warmup 0.2, but the checkpoint used 0.05"),
    (["--weight-decay", "0"], "--weight-decay 0.0, but the checkpoint used 0.01"),
    (["--optimizer", "torch"], "--optimizer torch, but the checkpoint used bert"),
    (["--seed", "1"], "--seed 1, but the checkpoint used 0"),
    (["--steps", "8"], "--steps 8, but the checkpoint used 4"),
    (["--max-seq-length", "32"], "--max-seq-length 32, but the checkpoint used 64"),
    (["--phase2-max-seq-length", "128"], "--phase2-max-seq-length 128, but the checkpoint used 0"),
    (["--dupe-factor", "2"], "--dupe-factor 2, but the checkpoint used 1"),
    (["--whole-word-mask"], "--whole-word-mask, but the checkpoint used no --whole-word-mask"),
    (["--max-predictions-per-seq", "10"], "--max-predictions-per-seq 10, but the checkpoint "
                                          "used 20"),
    (["--cased"], "--cased, but the checkpoint used no --cased"),
    (["--dtype", "float64"], "--dtype float64, but the checkpoint used float32"),
    (["--data", str(BROWN / "train.txt.gz")], f"--data {BROWN / 'train.txt.gz'}, but the "
                                              f"checkpoint used {BROWN / 'heldout.txt.gz'}"),
]


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory):
    """A run of 4 steps stopped at 2 (shared: a refused resume changes nothing)."""
    tmp_path = tmp_path_factory.mktemp("resume")
    run(tmp_path, tmp_path / "run", "--steps", "4", "--stop-at-step", "2")
    return tmp_path / "run"


@pytest.mark.parametrize("flags, refusal", CHANGED)
def test_resume_refuses_a_flag_that_breaks_exact_continuation(tmp_path, two_steps, flags,
                                                              refusal):
    before = sorted(os.listdir(two_steps))
    with pytest.raises(SystemExit) as refused:
        run(tmp_path, two_steps, "--steps", "4", "--resume", *flags)
    message = str(refused.value.code)
    assert f"error: resuming with {refusal}" in message and "\n" not in message, message
    assert sorted(os.listdir(two_steps)) == before, "a refusal builds and writes nothing"


def test_resume_refuses_another_model_config(tmp_path, two_steps):
    with pytest.raises(SystemExit) as refused:
        run(tmp_path, two_steps, "--steps", "4", "--resume", hidden_size=64)
    message = str(refused.value.code)
    assert "(hidden_size 64), but the checkpoint's model has hidden_size 32" in message, message


def test_resume_accepts_flags_that_do_not_change_the_steps(tmp_path):
    """Logging, evaluation and checkpoint intervals and the time budget may change: the
    weights are those of an uninterrupted run."""
    run(tmp_path, tmp_path / "straight", "--steps", "4")
    run(tmp_path, tmp_path / "resumed", "--steps", "4", "--stop-at-step", "2")
    assert run(tmp_path, tmp_path / "resumed", "--resume", "--log-every", "2", "--eval-every",
               "3", "--checkpoint-every", "3", "--minutes", "5", "--eval-batches", "2") == 0
    a = safetensors.load_file(tmp_path / "straight" / "checkpoint" / "model.safetensors")
    b = safetensors.load_file(tmp_path / "resumed" / "checkpoint" / "model.safetensors")
    for name in a:
        numpy.testing.assert_array_equal(a[name], b[name], err_msg=name)


# ----------------------------------------------------------------- not a regular file

def test_a_device_as_data_is_said_to_be_not_a_regular_file(tmp_path, capsys):
    """Refused by the argument parser (exit 2), before any data is built."""
    with pytest.raises(SystemExit) as refused:
        run(tmp_path, tmp_path / "run", "--steps", "1", "--data", "/dev/zero")
    message = capsys.readouterr().err
    assert refused.value.code == 2 and "argument --data: " in message, message
    assert "'/dev/zero' is not a regular file: it is a character device" in message, message


# ----------------------------------------------------------------- --heldout and --data paths

def test_heldout_none_skips_the_heldout_evaluation_as_the_help_says(capsys):
    assert train.parse_args(["--heldout", "none"]).heldout == []
    assert train.parse_args(["--heldout"]).heldout == []
    with pytest.raises(SystemExit):
        train.parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "'--heldout none' or a bare --heldout: no held-out evaluation" in help_text, help_text


@pytest.mark.parametrize("flag", ["--heldout", "--data"])
def test_a_missing_data_or_heldout_path_is_refused_before_any_work(flag, tmp_path, capsys):
    """Refused by the argument parser (exit 2, the flag and the path named), not after the
    training data has been built."""
    missing = tmp_path / "missing.txt"
    with pytest.raises(SystemExit) as stopped:
        train.parse_args([flag, str(BROWN / "heldout.txt.gz"), str(missing)])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert stopped.value.code == 2 and f"argument {flag}" in error and str(missing) in error \
        and "not found" in error, error
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit):
        train.parse_args([flag, str(empty)])
    assert "holds no .txt or .txt.gz file" in capsys.readouterr().err
