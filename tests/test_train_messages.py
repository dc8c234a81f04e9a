"""What train.py says where the GPU showed it said too little: the model FLOPs utilisation of
a small model (it printed "MFU 0.0%"), and a batch too large for the memory (a traceback):
one line naming the batch, its shape and the memory it needed."""
import argparse
import re

import numpy
import pytest

import train
from nanobert import BertForPreTraining
from nanobert.training.metrics import Window, percent
from nanobert.training.pretraining import STEP_KEYS
from test_train import run


@pytest.mark.parametrize("fraction, text", [
    (0.138, "13.8%"), (0.036, "3.6%"), (0.0123, "1.2%"), (0.00999, "1.0%"), (0.0042, "0.42%"),
    (0.000421, "0.042%"), (0.0000123, "0.0012%"), (0.000995, "0.10%")])
def test_percent_keeps_two_significant_digits_below_one_percent(fraction, text):
    assert percent(fraction) == text


def test_the_progress_line_gives_a_small_models_mfu_in_digits(tmp_path, capsys):
    """The nano default on an H200 ran at ~0.04% of the TF32 peak: the line says so."""
    peak = 494.7                                           # TFLOP/s
    window = Window(peak)
    sums = dict.fromkeys(STEP_KEYS, 1.0)
    window.add(numpy.array([sums[k] for k in STEP_KEYS]), 2.0, 0.00042 * 2.0 * peak * 1e12)
    args = argparse.Namespace(steps=100, no_nsp=False)
    train.log_train(args, None, str(tmp_path / "metrics.jsonl"), window, 10, 1e-4, 20.0)
    line = capsys.readouterr().out
    assert "MFU 0.042%" in line, line


def out_of_memory_run(tmp_path, monkeypatch, error, *extra):
    """train.py whose first step raises `error` -> the message it stops with (both devices'
    steps go through loss_and_grads_checked)."""
    def runs_out(self, batch, *args, **kwargs):
        raise error
    monkeypatch.setattr(BertForPreTraining, "loss_and_grads_checked", runs_out)
    with pytest.raises(SystemExit) as stopped:
        run(tmp_path, tmp_path / "run", "--steps", "2", "--grad-accum", "2", *extra)
    message = str(stopped.value.code)
    assert "\n" not in message and "Traceback" not in message, message
    return message


def test_a_batch_too_large_for_the_gpu_is_one_line(tmp_path, monkeypatch):
    """--device gpu (the stand-in): CuPy's OutOfMemoryError, which knows the size it failed
    to allocate and what was allocated before -> the batch, the shape of its micro-batches
    and the memory needed."""
    import cupy_standin
    with cupy_standin.installed() as cupy:
        error = cupy.cuda.memory.OutOfMemoryError(3 * 2 ** 30, 76 * 2 ** 30)
        message = out_of_memory_run(tmp_path, monkeypatch, error, "--device", "gpu")
    assert re.fullmatch(r"error: a batch does not fit in the GPU's memory: --batch-size 8 in 2 "
                        r"micro-batches, input_ids \[4, \d+\] per step; it needs more than "
                        r"79\.00 GiB: 3\.00 GiB more failed with 76\.00 GiB in use\. Lower "
                        r"--batch-size or --max-seq-length, or raise --grad-accum", message), \
        message


def test_a_batch_too_large_for_the_host_is_one_line(tmp_path, monkeypatch):
    """NumPy's MemoryError (the size of the array it could not allocate)."""
    try:
        numpy.empty(2 ** 60, dtype=numpy.uint8)
    except MemoryError as e:
        error = e
    else:
        pytest.skip("this machine allocated 1 EiB")
    message = out_of_memory_run(tmp_path, monkeypatch, error)
    assert "input_ids [4, " in message and "allocating 1073741824.00 GiB failed" in message, \
        message
