"""train.py --init-from: a new run from a checkpoint's weights and vocab (continued pretraining,
e.g. task-adaptive pretraining on a task's own text), with a fresh optimizer and schedule; a
model or vocab that does not fit the checkpoint is refused, naming what differs."""
import json

import numpy
import pytest

from nanobert.formats import safetensors
from test_train import VOCAB, run


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory):
    """A finished run of 2 steps (shared: the runs below only read its checkpoint)."""
    tmp_path = tmp_path_factory.mktemp("init")
    run(tmp_path, tmp_path / "first", "--steps", "2", "--seed", "3")
    return tmp_path / "first" / "checkpoint"


def weights(out):
    return safetensors.load_file(out / "checkpoint" / "model.safetensors")


def test_init_from_starts_at_the_checkpoints_weights_with_a_new_schedule(tmp_path, two_steps):
    # a rate so small that one Adam step (each weight moves ~lr) leaves the weights where they
    # start: those of the checkpoint, not the ones a fresh model draws from --seed
    run(tmp_path, tmp_path / "continued", "--steps", "1", "--lr", "1e-9",
        "--init-from", str(two_steps))
    run(tmp_path, tmp_path / "fresh", "--steps", "1", "--lr", "1e-9")
    start = safetensors.load_file(two_steps / "model.safetensors")
    continued, fresh = weights(tmp_path / "continued"), weights(tmp_path / "fresh")
    assert continued.keys() == start.keys()
    moved = max(float(numpy.abs(continued[k] - start[k]).max()) for k in start)
    away = max(float(numpy.abs(fresh[k] - start[k]).max()) for k in start)
    assert moved < 1e-6 < 1e-2 < away, (moved, away)
    state = json.loads((tmp_path / "continued" / "checkpoint" /
                        "trainer_state.json").read_text())
    assert (state["step"], state["total_steps"]) == (1, 1)       # its own schedule, from 0
    assert (tmp_path / "continued" / "checkpoint" / "vocab.txt").read_text(encoding="utf-8") \
        == (two_steps / "vocab.txt").read_text(encoding="utf-8")


def test_init_from_refuses_another_model(tmp_path, two_steps):
    with pytest.raises(SystemExit, match=r"--init-from .*checkpoint with --config .* "
                                         r"\(hidden_size 64\), but the checkpoint's model has "
                                         r"hidden_size 32"):
        run(tmp_path, tmp_path / "run", "--steps", "1", "--init-from", str(two_steps),
            hidden_size=64)


def test_init_from_refuses_another_vocab(tmp_path, two_steps, capsys):
    other = tmp_path / "vocab.txt"
    other.write_text(VOCAB.read_text(encoding="utf-8").replace("\nthe\n", "\nthe2\n"),
                     encoding="utf-8")
    with pytest.raises(SystemExit):
        run(tmp_path, tmp_path / "run", "--steps", "1", "--init-from", str(two_steps),
            "--vocab", str(other))
    said = capsys.readouterr().err
    assert f"--vocab {other} is not the vocab of --init-from {two_steps}" in said, said


def test_init_from_a_folder_without_a_checkpoint_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        run(tmp_path, tmp_path / "run", "--steps", "1", "--init-from", str(tmp_path / "none"))
    said = capsys.readouterr().err
    assert f"--init-from {tmp_path / 'none'}: no vocab.txt there" in said, said


def test_init_from_with_resume_is_refused_before_any_work(tmp_path, capsys):
    """--init-from starts a new schedule, --resume continues an old one: one line naming
    both, exit status 2, before any data is built (no output folder)."""
    with pytest.raises(SystemExit) as stopped:
        run(tmp_path, tmp_path / "run", "--init-from", str(tmp_path / "none"), "--resume")
    assert stopped.value.code == 2
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--init-from" in said and "--resume" in said and "give one" in said, said
    assert not (tmp_path / "run").exists()
