"""The training harness (nanobert/training/) piece by piece; train.py and finetune.py are tested
end to end in test_train*.py, test_finetune.py, test_cli_refusals.py and test_data_parallel.py."""
import argparse
import errno
import json
import math

import numpy
import pytest

from nanobert import AdamW, BertConfig, BertForPreTraining, clip_by_global_norm, flags
from nanobert.distributed import SingleProcess
from nanobert.model.optim import LossScaler
from nanobert.training.metrics import Window, time_left
from nanobert.training.resume import refuse_changed_flags, refuse_changed_model
from nanobert.training.run import (dropout_state, epoch_order, eval_mode, restore_dropout,
                                   run_command, stream_rows)
from nanobert.training.step import update
from test_checkpoint import CONFIG, tiny_batch


def model_and_grads(seed=0):
    model = BertForPreTraining(BertConfig(**CONFIG), seed=seed).train()
    model.rng = numpy.random.default_rng(0)
    _, grads = model.loss_and_grads(tiny_batch())
    return model, grads


def test_update_is_allreduce_unscale_clip_and_adamw():
    """One process: the same weights, bit for bit, as clipping at the norm and an AdamW step
    written out by hand."""
    model, grads = model_and_grads()
    by_hand, hand_grads = model_and_grads()
    optimizer, hand_optimizer = AdamW(model.params, lr=1e-3), AdamW(by_hand.params, lr=1e-3)
    update(SingleProcess(), model, optimizer, None, grads, 1e-3, 1, max_grad_norm=0.5, loss=2.0)
    clip_by_global_norm(hand_grads, 0.5)
    hand_optimizer.step(hand_grads, lr=1e-3)
    for name, p in model.params.items():
        numpy.testing.assert_array_equal(p, by_hand.params[name], err_msg=name)


def test_the_guards_name_the_one_based_step_and_the_first_bad_tensor(tmp_path):
    model, grads = model_and_grads()
    optimizer = AdamW(model.params, lr=1e-3)
    model.params["cls.predictions.bias"][0] = numpy.nan
    keep = (str(tmp_path / "batch.npz"), {"input_ids": numpy.zeros((1, 2))})
    with pytest.raises(SystemExit, match=r"error: loss is nan at step 7 \(first non-finite "
                       r"weight: cls\.predictions\.bias\); the batch is in .*batch\.npz; "
                       r"nothing was saved at this step\. Lower --lr"):
        update(SingleProcess(), model, optimizer, None, grads, 1e-3, 7, loss=math.nan, keep=keep)
    assert (tmp_path / "batch.npz").exists()
    model, grads = model_and_grads()
    before = {k: v.copy() for k, v in model.params.items()}
    grads["bert.pooler.dense.bias"][1] = numpy.inf
    with pytest.raises(SystemExit, match=r"the gradient norm is (nan|inf) at step 2 \(first "
                       r"non-finite gradient: bert\.pooler\.dense\.bias\)"):
        update(SingleProcess(), model, AdamW(model.params), None, grads, 1e-3, 2, loss=1.0)
    for name, p in model.params.items():            # the guard stops the run before the step
        numpy.testing.assert_array_equal(p, before[name], err_msg=name)


def test_an_overflow_under_the_loss_scaler_skips_the_step_and_halves_the_scale():
    model, grads = model_and_grads()
    before = {k: v.copy() for k, v in model.params.items()}
    scaler = LossScaler(numpy)
    grads["bert.pooler.dense.bias"][1] = numpy.inf
    update(SingleProcess(), model, AdamW(model.params, lr=1e-3), scaler, grads, 1e-3, 1)
    assert float(scaler.scale) == 2.0 ** 15
    for name, p in model.params.items():
        numpy.testing.assert_array_equal(p, before[name], err_msg=name)


def test_refuse_changed_flags_names_the_flag_and_both_values(tmp_path):
    args = argparse.Namespace(lr=1e-3, no_nsp=True, data=["a.txt"], steps=None)
    saved = {"lr": 1e-3, "no_nsp": True, "data": [str(tmp_path / "a.txt")], "steps": 8}
    refuse_changed_flags(args, {**saved, "data": ["a.txt"]}, ("lr", "no_nsp", "data", "steps"),
                         paths=("data",), skip=("steps",))
    with pytest.raises(SystemExit, match=r"resuming with --lr 0\.001, but the checkpoint used "
                                         r"0\.002; exact continuation"):
        refuse_changed_flags(args, {**saved, "lr": 2e-3}, ("lr",))
    with pytest.raises(SystemExit, match="resuming with --no-nsp, but the checkpoint used no "
                                         "--no-nsp"):
        refuse_changed_flags(args, {**saved, "no_nsp": False}, ("no_nsp",))
    refuse_changed_flags(args, {}, ("lr",))           # not recorded: not compared


def test_refuse_changed_model_names_the_setting():
    config = BertConfig(**CONFIG)
    wanted = BertConfig(**{**CONFIG, "hidden_size": 32})
    with pytest.raises(SystemExit, match=r"resuming with --preset x \(hidden_size 32\), but the "
                                         r"checkpoint's model has hidden_size 16"):
        refuse_changed_model(wanted, config, "--preset x")
    refuse_changed_model(BertConfig(**CONFIG), config, "--preset x")


def test_stream_rows_cross_epochs_in_their_seeded_orders():
    """Batches of 4 over 6 rows: the second batch ends epoch 0 and starts epoch 1."""
    first, second = epoch_order(3, 0, 6), epoch_order(3, 1, 6)
    assert sorted(first) == list(range(6)) and not numpy.array_equal(first, second)
    numpy.testing.assert_array_equal(stream_rows(6, 4, 3, 0), first[:4])
    numpy.testing.assert_array_equal(stream_rows(6, 4, 3, 1), [*first[4:], *second[:2]])


def test_the_window_sums_steps_and_measures_mfu():
    window = Window(peak=1e-12, ranks=2)                 # 1 FLOP/s
    window.add(numpy.array([1.0, 2.0]), 2.0, flops=3)
    window.add(numpy.array([0.5, 1.0]), 1.0, flops=3)
    numpy.testing.assert_array_equal(window.sums, [1.5, 3.0])
    assert (window.steps, window.seconds, window.mfu()) == (2, 3.0, 2.0)
    window.reset()
    assert (window.sums, window.steps, window.flops, window.ranks) == (None, 0, 0, 2)
    assert Window().mfu() is None


def test_eval_mode_restores_the_mode_also_after_an_error():
    model = BertForPreTraining(BertConfig(**CONFIG), seed=0).train()
    with pytest.raises(RuntimeError):
        with eval_mode(model):
            assert not model.training
            raise RuntimeError
    assert model.training


@pytest.mark.parametrize("error, line", [
    (ValueError("x.tsv: line 3 has 1 column"), "error: x.tsv: line 3 has 1 column"),
    (FileNotFoundError("no vocab.txt"), "error: no vocab.txt"),
    (OSError(errno.ENOSPC, "No space left on device"), "error: [Errno 28] No space left on device"),
    (SystemExit("error: refused"), "error: refused"),
])
def test_run_command_turns_bad_input_and_os_errors_into_one_line(error, line):
    def main():
        raise error
    with pytest.raises(SystemExit) as ended:
        run_command(main)
    assert ended.value.code == line


def test_shared_flags_keep_one_definition():
    p = argparse.ArgumentParser()
    flags.add(p, "--warmup", default=0.1)
    flags.add(p, "--grad-accum", metavar="N")
    assert p.parse_args([]).warmup == 0.1 and p.parse_args([]).grad_accum == 1
    with pytest.raises(SystemExit):
        p.parse_args(["--grad-accum", "0"])


def test_time_left_is_the_rest_at_the_mean_pace():
    """The progress lines of train.py and finetune.py: 10 steps in 2 minutes, 30 to go."""
    assert time_left(120.0, 10, 40) == "elapsed 2.0 min  left ~6.0 min"
    assert time_left(30.0, 5, 5) == "elapsed 0.5 min  left ~0.0 min"


def test_dropout_state_continues_the_stream_or_says_it_cannot(capsys):
    """One CPU process: the saved state gives the masks an uninterrupted run draws next.
    Several ranks: nothing saved, and a resume draws from a new (seed, step, rank) stream and
    says so."""
    model, _ = model_and_grads()
    model.rng.random(5)                                # a run that drew some masks
    saved = json.loads(json.dumps(dropout_state(model, SingleProcess())))  # trainer_state.json
    expected = model.rng.random(8)
    restore_dropout(model, saved, seed=0, step=3, rank=0)
    numpy.testing.assert_array_equal(model.rng.random(8), expected)
    assert capsys.readouterr().out == ""

    class TwoRanks(SingleProcess):
        world_size = 2
    assert dropout_state(model, TwoRanks()) is None
    restore_dropout(model, None, seed=0, step=3, rank=1)
    first = model.rng.random(4)
    restore_dropout(model, None, seed=0, step=3, rank=1)
    numpy.testing.assert_array_equal(model.rng.random(4), first)
    assert "masks after the resume come from a new stream" in capsys.readouterr().out
