"""The process group (nanobert/distributed.py): one process needs no MPI at all; under
mpiexec -n 2 the collectives sum, broadcast and agree across ranks, and ranks whose weights
drift apart are caught. Skipped where mpi4py or mpiexec is missing (pip install '.[mpi]')."""
import os
import shutil
import subprocess
import sys
import textwrap

import numpy
import pytest

from nanobert import distributed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mpiexec_or_skip():
    pytest.importorskip("mpi4py")
    beside_python = os.path.dirname(sys.executable)        # the mpich wheel's, in a venv
    mpiexec = shutil.which("mpiexec") or shutil.which("mpiexec", path=beside_python)
    if mpiexec is None:
        pytest.skip("no mpiexec on PATH: pip install mpich")
    return mpiexec


def run_ranks(code, n=2, timeout=120):
    """Run `code` on n MPI ranks; -> (exit status, stdout, stderr)."""
    mpiexec = mpiexec_or_skip()
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([mpiexec, "-n", str(n), sys.executable, "-c", textwrap.dedent(code)],
                            capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    return result.returncode, result.stdout, result.stderr


def test_one_process_needs_no_mpi():
    code = ("import sys; from nanobert import distributed; g = distributed.process_group(); "
            "print(type(g).__name__, g.world_size, 'mpi4py' in sys.modules)")
    env = {k: v for k, v in os.environ.items()
           if not any(k in pair for pair in distributed.LAUNCHER_VARIABLES)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**env, "PYTHONPATH": ROOT}, check=True).stdout.split()
    assert out == ["SingleProcess", "1", "False"], out
    group = distributed.SingleProcess()
    buffer = numpy.arange(4.0)
    assert group.allreduce_(buffer) is buffer and group.any(False) is False
    assert list(distributed.rank_slice(numpy.arange(8), group)) == list(range(8))


def test_two_ranks_sum_broadcast_and_agree():
    status, out, err = run_ranks("""
        import numpy
        from nanobert import distributed
        g = distributed.process_group()
        grads = numpy.full(5, g.rank + 1.0)
        g.allreduce_(grads)
        weights = numpy.full(3, float(g.rank))
        g.broadcast_(weights)
        rows = distributed.rank_slice(numpy.arange(8), g)
        line = " ".join(map(str, (g.rank, g.world_size, grads.tolist(), weights.tolist(),
                                  g.sum([g.rank, 1]), g.any(g.rank == 1), rows.tolist(),
                                  g.digest(weights))))
        lines = g.comm.gather(line, root=0)      # one printer: ranks' output would interleave
        if g.is_main:
            print("\\n".join(lines), flush=True)
    """)
    assert status == 0, err
    lines = out.strip().splitlines()
    assert len(lines) == 2, out
    for rank, line in enumerate(lines):
        assert line.startswith(f"{rank} 2 [3.0, 3.0, 3.0, 3.0, 3.0] [0.0, 0.0, 0.0] [1.0, 2.0] "
                               f"True {[0, 1, 2, 3] if rank == 0 else [4, 5, 6, 7]}"), line
    assert lines[0].split()[-1] == lines[1].split()[-1], "same weights, same digest"


def test_ranks_whose_weights_differ_are_caught():
    status, out, err = run_ranks("""
        import numpy
        from nanobert import distributed
        g = distributed.process_group()
        try:
            g.digest(numpy.full(3, float(g.rank)))
            message = "no error"
        except RuntimeError as e:
            message = str(e)
        messages = g.comm.gather(message, root=0)
        if g.is_main:
            print("\\n".join(messages), flush=True)
    """)
    assert status == 0, err
    assert out.count("the weights of rank(s) [1] differ from rank 0's") == 2, out


def test_slices_with_the_global_denominators_sum_to_the_whole_batch():
    """Gradient accumulation and data parallelism sum per-slice losses and gradients: with
    the global batch's counts as denominators the sum is the whole batch's, to rounding
    (float64), however unevenly the masked tokens fall between the slices."""
    from nanobert import BertConfig, BertForPreTraining
    from test_checkpoint import CONFIG, tiny_batch
    model = BertForPreTraining(BertConfig(**CONFIG), seed=1, dtype=numpy.float64).eval()
    batch = tiny_batch(B=4)
    batch["labels"][0, 1:6] = batch["input_ids"][0, 1:6]       # slice 0 holds more masks
    batch["next_sentence_label"] = numpy.array([0, 1, -100, 1])
    whole_loss, whole = model.loss_and_grads(batch)
    denominators = {"masked_lm": int((batch["labels"] != -100).sum()),
                    "next_sentence": int((batch["next_sentence_label"] != -100).sum())}
    total_loss, total = 0.0, {k: numpy.zeros_like(v) for k, v in whole.items()}
    for half in (slice(0, 2), slice(2, 4)):
        part = {k: v[half] for k, v in batch.items()}
        loss, grads = model.loss_and_grads(part, denominators=denominators)
        total_loss += loss
        for k in total:
            total[k] += grads[k]
    assert abs(total_loss - whole_loss) <= 1e-12 * abs(whole_loss)
    largest = max(numpy.abs(g).max() for g in whole.values())
    for k in whole:    # the key bias's true gradient is 0: both sides hold rounding noise
        scale = max(numpy.abs(whole[k]).max(), 1e-6 * largest)
        error = numpy.abs(total[k] - whole[k]).max() / scale
        assert error <= 1e-12, f"{k}: {error:.2e}"


def test_a_task_head_refuses_denominators_before_any_work():
    """Only the pretraining means divide by a global count; a fine-tuning head weighs
    micro-batches by rows, so denominators there are a mistake, refused at the door."""
    from nanobert import BertConfig, BertForSequenceClassification
    from test_checkpoint import CONFIG, tiny_batch
    model = BertForSequenceClassification(BertConfig(**CONFIG), seed=0)
    batch = {k: tiny_batch()[k] for k in ("input_ids", "attention_mask")}
    batch["labels"] = numpy.array([0, 1, 0])
    with pytest.raises(ValueError, match="takes no denominators"):
        model.loss_and_grads(batch, denominators={"masked_lm": 3})
