"""train.py under mpiexec: 2 ranks take the same steps as 1 process (the global batch and its
order do not depend on the number of ranks), a run resumes with another number of ranks, and
a rank that dies ends the job with a clear message and an intact checkpoint. Dropout is off
(each rank draws its own masks). Skipped without mpi4py / mpiexec (pip install '.[mpi]')."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy
import pytest

from nanobert.formats import safetensors
from nanobert.model.pretrained import load_training_checkpoint
from nanobert import BertForPreTraining
from conftest import record
from test_distributed import ROOT, mpiexec_or_skip
from test_train import BROWN, SMALL, VOCAB, train_losses

NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def command(tmp_path, out, *extra, dtype="float64"):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**SMALL, **NO_DROPOUT}))
    return [sys.executable, os.path.join(ROOT, "train.py"), "--data",
            str(BROWN / "heldout.txt.gz"), "--heldout", "--vocab", str(VOCAB), "--config",
            str(config), "--dupe-factor", "1", "--max-seq-length", "64", "--batch-size", "8",
            "--log-every", "1", "--dtype", dtype, "--out", str(out), *map(str, extra)]


def run(argv, ranks=1, timeout=300):
    """train.py on `ranks` MPI ranks (plain python for 1); -> the finished process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    launcher = [mpiexec_or_skip(), "-n", str(ranks)] if ranks > 1 else []
    result = subprocess.run(launcher + argv, capture_output=True, text=True, timeout=timeout,
                            env=env, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


def weights(out):
    return safetensors.load_file(out / "checkpoint" / "model.safetensors")


def assert_same_run(a, b, tol, what):
    """Same logged losses (to `tol`) and the same final weights: |w_a - w_b| / |w_a| over all
    parameters as one vector at most `tol` (Adam turns rounding-level gradient differences on
    rarely used rows into larger steps, so a per-entry bound would measure Adam, not us)."""
    numpy.testing.assert_allclose(numpy.array(train_losses(b)), numpy.array(train_losses(a)),
                                  rtol=tol, atol=0)
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    difference = numpy.sqrt(sum(float(((wa[k] - wb[k]).astype(numpy.float64) ** 2).sum())
                                for k in wa))
    size = numpy.sqrt(sum(float((wa[k].astype(numpy.float64) ** 2).sum()) for k in wa))
    record(f"data parallel: {what}, weights", difference / size)
    assert difference / size <= tol, \
        f"weights differ by {difference / size:.2e} (relative, all parameters), bound {tol:.0e}"
    return difference / size


@pytest.mark.parametrize("dtype, tol", [("float64", 1e-12), ("float32", 1e-6)])
def test_two_ranks_take_the_steps_of_one_process(tmp_path, dtype, tol):
    mpiexec_or_skip()
    run(command(tmp_path, tmp_path / "one", "--steps", 5, dtype=dtype))
    run(command(tmp_path, tmp_path / "accum", "--steps", 5, "--grad-accum", 2, dtype=dtype))
    run(command(tmp_path, tmp_path / "two", "--steps", 5, dtype=dtype), ranks=2)
    assert len(train_losses(tmp_path / "two")) == 5
    assert_same_run(tmp_path / "one", tmp_path / "accum", tol, f"grad-accum 2 vs 1, {dtype}")
    assert_same_run(tmp_path / "one", tmp_path / "two", tol, f"2 ranks vs 1, {dtype}")


def test_resume_with_another_number_of_ranks(tmp_path):
    mpiexec_or_skip()
    run(command(tmp_path, tmp_path / "straight", "--steps", 5))
    run(command(tmp_path, tmp_path / "resumed", "--steps", 5, "--stop-at-step", 3), ranks=2)
    run(command(tmp_path, tmp_path / "resumed", "--steps", 5, "--resume"))
    assert_same_run(tmp_path / "straight", tmp_path / "resumed", 1e-12,
                    "2 ranks then resumed on 1 vs 1, float64")


def rank_pid(out, rank):
    """The pid of the train.py process of `rank` writing to `out` (read from /proc)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
            environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if "train.py" in cmdline and str(out) in cmdline and f"PMI_RANK={rank}".encode() in environ:
            return int(pid)
    return None


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the rank's process in /proc")
def test_a_killed_rank_ends_the_job_and_the_last_checkpoint_stays(tmp_path):
    mpiexec = mpiexec_or_skip()
    out = tmp_path / "run"
    argv = command(tmp_path, out, "--steps", 100000, "--checkpoint-every", 2)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    job = subprocess.Popen([mpiexec, "-n", "2", *argv], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        deadline = time.time() + 120
        while not (out / "checkpoint" / "trainer_state.json").exists():
            assert job.poll() is None and time.time() < deadline, "no checkpoint was written"
            time.sleep(0.2)
        pid = rank_pid(out, 1)
        assert pid is not None, "rank 1 not found"
        os.kill(pid, signal.SIGKILL)
        stdout, stderr = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode != 0
    assert "signal 9" in (stdout + stderr).lower() or "killed" in (stdout + stderr).lower(), \
        stderr[-2000:]
    _, params, _, state = load_training_checkpoint(BertForPreTraining, out / "checkpoint")
    assert state["step"] >= 2 and state["step"] % 2 == 0
    assert all(numpy.isfinite(p).all() for p in params.values())


def test_finetune_on_two_ranks_takes_the_steps_of_one_process(tmp_path):
    """finetune.py weighs micro-batches by their rows: 2 ranks == 1 process with
    --grad-accum 2 (float64, dropout off), the short last batch of the epoch included."""
    from test_finetune import data, make_tiny_bert
    mpiexec_or_skip()
    model = make_tiny_bert(tmp_path / "tiny", dropout=0.0)
    common = [sys.executable, os.path.join(ROOT, "finetune.py"), "--glue-task", "sst-2",
              "--train", data("sst2_train.tsv"), "--dev", data("sst2_dev.tsv"), "--model", model,
              "--epochs", "1", "--batch-size", "6", "--dtype", "float64",
              "--lr", "3e-5"]                      # one rate: a grid runs in one process
    run(common + ["--grad-accum", "2", "--out", str(tmp_path / "one")])
    run(common + ["--out", str(tmp_path / "two")], ranks=2)
    one = safetensors.load_file(tmp_path / "one" / "best" / "model.safetensors")
    two = safetensors.load_file(tmp_path / "two" / "best" / "model.safetensors")
    difference = numpy.sqrt(sum(((one[k] - two[k]) ** 2).sum() for k in one))
    size = numpy.sqrt(sum((one[k] ** 2).sum() for k in one))
    record("data parallel: finetune 2 ranks vs grad-accum 2, float64, weights", difference / size)
    assert difference / size <= 1e-12, f"{difference / size:.2e}"
