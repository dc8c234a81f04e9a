"""The command lines refuse what cannot work, at once and in one line: every numeric flag is
range-checked by argparse (exit status 2), and a run whose loss, gradients or weights turn
non-finite stops with a non-zero exit naming the step, before anything is saved."""
import os

import numpy
import pytest

import finetune
from nanobert.model.optim import AdamW
from test_finetune import data, make_tiny_bert

FINETUNE_BAD_FLAGS = [
    ("--batch-size", "0"), ("--batch-size", "-3"), ("--grad-accum", "0"), ("--lr", "nan"),
    ("--lr", "-1e-5"), ("--lr", "1e39"), ("--lr", "0"), ("--epochs", "0"), ("--epochs", "inf"),
    ("--max-steps", "0"), ("--warmup", "-1"), ("--weight-decay", "-0.1"),
    ("--max-grad-norm", "0"), ("--seed", "-1"), ("--eval-batch-size", "0"),
    ("--log-every", "0"), ("--max-seq-length", "2"), ("--doc-stride", "0"),
    ("--max-train-examples", "-5"), ("--max-eval-examples", "x"),
    ("--null-score-diff-threshold", "nan"), ("--n-best-size", "0"),
    ("--layer-decay", "0"), ("--layer-decay", "1.5"),
]


@pytest.mark.parametrize("flag, value", FINETUNE_BAD_FLAGS)
def test_finetune_refuses_a_bad_numeric_flag_at_parse_time(flag, value, capsys):
    with pytest.raises(SystemExit) as stopped:
        finetune.parse_args([flag, value])
    assert stopped.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"argument {flag}" in error, error


def test_layer_decay_on_the_gpu_is_refused_before_any_work(monkeypatch):
    """The GPU's AdamW kernel takes one rate: --layer-decay there (given, or from
    $NANOBERT_DEVICE) stops with the arguments' checks, naming the flag and the way out."""
    message = r"--layer-decay runs on the CPU: .* \(use --device cpu\)"
    with pytest.raises(SystemExit, match=message):
        resolved("--dataset", "trec", "--device", "gpu", "--layer-decay", "0.8")
    monkeypatch.setenv("NANOBERT_DEVICE", "gpu")
    with pytest.raises(SystemExit, match=message):
        resolved("--dataset", "trec", "--layer-decay", "0.8")
    on_cpu = resolved("--dataset", "trec", "--device", "cpu", "--layer-decay", "0.8")
    assert on_cpu.layer_decay == 0.8


def resolved(*argv):
    """finetune.py's arguments as main sees them before any work."""
    return finetune.resolve_task(finetune.parse_args(list(argv)))


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.mark.parametrize("steps, message", [
    (None, r"loss is nan at step \d+ \(first non-finite weight: classifier\.bias\)"),
    (1, r"weights are not finite after step 1 \(first: classifier\.bias\); nothing was saved"),
])
def test_finetune_stops_when_the_weights_turn_non_finite(tiny_bert, tmp_path, monkeypatch, steps,
                                                         message):
    """A diverging update (forced here: each step writes a NaN) stops the run at the next step
    or, after the last step, before the dev evaluation, naming the bad tensor: no best/
    checkpoint of NaN weights is ever written."""
    step = AdamW.step

    def diverging_step(self, grads, lr=None, **kwargs):
        step(self, grads, lr, **kwargs)
        self.params["classifier.bias"][0] = numpy.nan
    monkeypatch.setattr(AdamW, "step", diverging_step)
    out = tmp_path / "run"
    argv = ["--glue-task", "sst-2", "--train", data("sst2_train.tsv"), "--dev",
            data("sst2_dev.tsv"), "--model", tiny_bert, "--out", str(out), "--epochs", "1",
            "--batch-size", "8"] + (["--max-steps", str(steps)] if steps else [])
    with pytest.raises(SystemExit, match=message):
        finetune.main(argv)
    assert not os.path.exists(out / "best")


@pytest.mark.parametrize("main, argv", [
    ("train", ["--steps", "1"]),
    ("finetune", ["--task", "features", "--input", "{texts}"]),
])
def test_an_output_path_that_is_a_file_is_named(tmp_path, main, argv, tiny_bert):
    target = tmp_path / "taken"
    target.write_text("not a folder")
    (tmp_path / "texts.txt").write_text("a good film\n")
    argv = [a.format(texts=tmp_path / "texts.txt") for a in argv]
    if main == "finetune":
        argv += ["--model", tiny_bert]
    module = __import__(main)
    with pytest.raises(ValueError, match=f"--out {target} exists and is not a folder"):
        module.main(argv + ["--out", str(target)])


# Runs a command line's __main__ (argv after the script) with a disk that is full: every
# fsync, the last call of each atomic write, fails with ENOSPC.
FULL_DISK = """
import errno, os, runpy, sys
def full(fd):
    raise OSError(errno.ENOSPC, "No space left on device")
os.fsync = full
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("main", ["train", "finetune"])
def test_a_full_disk_is_one_line_and_a_non_zero_exit(tmp_path, main, tiny_bert):
    """Both command lines end an OSError that reaches their __main__ (here a full disk: train.py
    while it builds its data, finetune.py while it saves best/) with one error line on stderr
    and exit status 1, never a traceback."""
    import subprocess
    import sys
    from test_train import BROWN, ROOT, VOCAB
    if main == "train":
        argv = ["--data", str(BROWN / "heldout.txt.gz"), "--heldout", "--vocab", str(VOCAB),
                "--steps", "1"]
    else:
        argv = ["--glue-task", "sst-2", "--train", data("sst2_train.tsv"), "--dev",
                data("sst2_dev.tsv"), "--model", tiny_bert, "--max-steps", "1"]
    result = subprocess.run([sys.executable, "-c", FULL_DISK, os.path.join(ROOT, f"{main}.py"),
                             *argv, "--out", str(tmp_path / "out")], capture_output=True,
                            text=True, cwd=ROOT, timeout=300)
    lines = result.stderr.strip().splitlines()      # train.py's data progress comes first
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr and lines[-1].startswith("error: ") \
        and "no space left" in lines[-1].lower(), result.stderr
    assert [line for line in lines if "error" in line.lower()] == lines[-1:], result.stderr
