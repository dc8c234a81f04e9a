"""What a crash leaves beside a folder that fileio.atomic_folder swaps in, and how every reader
recovers it (fileio.recover_folder); files that are not regular files are named as such."""
import io
import os
import socket

import pytest

from nanobert.formats.fileio import (check_regular_file, read_json, recover_folder,
                                     recover_folders_in)
from nanobert.formats.hub import resolve_model


def make(folder, text):
    folder.mkdir()
    (folder / "config.json").write_text(text)


def contents(parent):
    return {p.name: (p / "config.json").read_text() for p in sorted(parent.iterdir())}


def test_only_the_old_folder_left_by_a_crash_between_the_renames_is_put_back(tmp_path):
    make(tmp_path / "ckpt.old", "previous")
    make(tmp_path / "ckpt.tmp", "half built")
    log = io.StringIO()
    message = recover_folder(tmp_path / "ckpt", log)
    assert contents(tmp_path) == {"ckpt": "previous"}
    assert log.getvalue() == message + "\n" and message.count("\n") == 0
    assert f"restored {tmp_path / 'ckpt'} from {tmp_path / 'ckpt.old'}" in message, message
    assert f"removed the unfinished {tmp_path / 'ckpt.tmp'}" in message, message


def test_an_old_folder_beside_a_complete_one_is_stale_and_removed(tmp_path):
    make(tmp_path / "ckpt", "new")
    make(tmp_path / "ckpt.old", "previous")
    message = recover_folder(tmp_path / "ckpt", io.StringIO())
    assert contents(tmp_path) == {"ckpt": "new"}
    assert f"removed the stale {tmp_path / 'ckpt.old'}" in message, message


def test_nothing_to_recover_says_nothing(tmp_path, capsys):
    make(tmp_path / "ckpt", "new")
    assert recover_folder(tmp_path / "ckpt") is None
    assert recover_folder(tmp_path / "nothing") is None
    assert capsys.readouterr().err == ""
    assert contents(tmp_path) == {"ckpt": "new"}


def test_every_leftover_in_a_parent_is_recovered(tmp_path):
    make(tmp_path / "a.tmp", "killed build")
    make(tmp_path / "b.old", "previous b")
    make(tmp_path / "c", "c")
    (tmp_path / "note.tmp").write_text("a file, not a build folder")
    messages = recover_folders_in(tmp_path, io.StringIO())
    assert len(messages) == 2, messages
    assert (tmp_path / "b" / "config.json").read_text() == "previous b"
    assert sorted(os.listdir(tmp_path)) == ["b", "c", "note.tmp"]
    assert recover_folders_in(tmp_path / "missing") == []


def test_finetune_model_path_recovers_a_checkpoint_whose_swap_was_interrupted(tmp_path,
                                                                              capsys):
    """hub.resolve_model (finetune.py --model, BertModel.from_pretrained) on a checkpoint
    whose save a crash cut between the renames: only checkpoint.old exists."""
    make(tmp_path / "checkpoint.old", "{}")
    assert resolve_model(str(tmp_path / "checkpoint")) == str(tmp_path / "checkpoint")
    assert sorted(os.listdir(tmp_path)) == ["checkpoint"]
    assert "restored" in capsys.readouterr().err


def test_resolve_model_cleans_beside_a_training_checkpoint_but_never_a_users_old_folder(
        tmp_path):
    make(tmp_path / "checkpoint", "{}")
    (tmp_path / "checkpoint" / "trainer_state.json").write_text("{}")
    make(tmp_path / "checkpoint.old", "{}")
    make(tmp_path / "mine", "{}")
    make(tmp_path / "mine.old", "my own backup")
    resolve_model(str(tmp_path / "checkpoint"))
    resolve_model(str(tmp_path / "mine"))
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "mine", "mine.old"]


def test_what_is_not_a_regular_file_is_named(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "sock"))
    (tmp_path / "folder").mkdir()
    try:
        for path, kind in (("/dev/zero", "a character device"),
                           (tmp_path / "fifo", r"a FIFO \(named pipe\)"),
                           (tmp_path / "sock", "a socket"), (tmp_path / "folder", "a folder")):
            with pytest.raises(ValueError, match=f"is not a regular file: it is {kind}"):
                check_regular_file(path, "input")
    finally:
        server.close()
    with pytest.raises(FileNotFoundError, match="input not found"):
        check_regular_file(tmp_path / "missing", "input")
    with pytest.raises(ValueError, match="config.json .*is not a regular file: it is a folder"):
        read_json(tmp_path / "folder", "config.json")
