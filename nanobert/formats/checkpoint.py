"""Checkpoint folders in Hugging Face's layout: config.json (a dict) and model.safetensors
(named tensors), and the resumable training checkpoint around them (optimizer.safetensors,
trainer_state.json). Files only: which tensors a model expects, how a checkpoint's names map
onto them and which weights start fresh is the model's business (model/pretrained.py).
"""
import contextlib
import errno
import json
import os
import shutil

import numpy

from ..backend import array_module, to_host
from . import safetensors
from .fileio import atomic_folder, atomic_open, read_json, recover_folder

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
OPTIMIZER_NAME = "optimizer.safetensors"
TRAINER_STATE_NAME = "trainer_state.json"


def read_config(path):
    """The config.json of a checkpoint folder, as a dict."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"checkpoint folder not found: {path}")
    return read_json(os.path.join(path, CONFIG_NAME), CONFIG_NAME)


def read_weights(path):
    """The model.safetensors of a checkpoint folder: {name: host array}, as stored."""
    return safetensors.load_file(weights_file(path))


def weights_file(path):
    """The path of a checkpoint folder's model.safetensors; FileNotFoundError without one."""
    weights = os.path.join(os.fspath(path), WEIGHTS_NAME)
    if not os.path.exists(weights):
        raise FileNotFoundError(f"no {WEIGHTS_NAME} in {path} (nanobert reads safetensors only)")
    return weights


def read_weight_entries(path, max_header_bytes):
    """{name: safetensors.Entry} of a checkpoint folder's model.safetensors: its header alone,
    at most `max_header_bytes` of it, checked; no tensor data read."""
    return safetensors.read_entries(weights_file(path), max_header_bytes)


def read_chosen_weights(path, tensors, max_header_bytes):
    """`tensors` with each safetensors.Entry replaced by its array read from the folder's
    model.safetensors (what is not an Entry, e.g. a freshly initialised head, passes)."""
    entries = {k: v for k, v in tensors.items() if isinstance(v, safetensors.Entry)}
    arrays = safetensors.read_tensors(weights_file(path), entries,
                                      max_header_bytes=max_header_bytes)
    return {k: arrays.get(k, v) for k, v in tensors.items()}


def first_non_finite(tensors):
    """The name of the first floating-point tensor (in the dict's order) holding a NaN or an
    infinity, or None."""
    for name, t in tensors.items():
        if t.dtype.kind == "f" and not bool(array_module(t).isfinite(t).all()):
            return name
    return None


def check_finite(tensors, what):
    """Refuse to save a NaN or an infinity: a diverged run must never replace a good
    checkpoint. Names the first bad tensor and how much of it is bad."""
    name = first_non_finite(tensors)
    if name is not None:
        t = numpy.asarray(to_host(tensors[name]))
        bad = int(t.size - numpy.isfinite(t).sum())
        raise NonFiniteError(f"refusing to save {what}: {name} holds {bad} non-finite "
                             f"value(s) (nan/inf) of {t.size}")


class NonFiniteError(ValueError):
    """A tensor about to be saved holds NaN or inf; nothing was written."""


def write_checkpoint(path, config, tensors):
    """config.json (the dict) + model.safetensors ({name: host array}), each written
    atomically; a NaN or an infinity is refused before anything is written."""
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    check_finite(tensors, os.path.join(path, WEIGHTS_NAME))
    with reporting_full_disk(path, _nbytes(tensors)):
        safetensors.save_file(tensors, os.path.join(path, WEIGHTS_NAME), metadata={"format": "pt"})
        with atomic_open(os.path.join(path, CONFIG_NAME), "w", encoding="utf-8") as f:
            f.write(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _nbytes(tensors):
    return sum(t.nbytes for t in tensors.values())


@contextlib.contextmanager
def reporting_full_disk(path, needed_bytes):
    """A full disk mid-save becomes one line that says where and how much space was needed
    (the atomic writes have already left the previous file or folder as it was)."""
    try:
        yield
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        parent = os.path.dirname(os.path.abspath(path))
        free = shutil.disk_usage(parent).free if os.path.isdir(parent) else 0
        raise OSError(error.errno, f"no space left on the device while saving {path}: it needs "
                                   f"about {needed_bytes / 1e6:.1f} MB and {free / 1e6:.1f} MB "
                                   f"are free; the previous save there is intact") from None

# ------------------------------------------------------------------- training checkpoints


def write_training_checkpoint(folder, config, tensors, optimizer_state, trainer_state,
                              vocab_file=None):
    """A resumable checkpoint: the HF folder (config.json, model.safetensors, vocab.txt) plus
    optimizer.safetensors (named tensors) and trainer_state.json (a dict).

    The whole folder is swapped atomically: written beside it under a hidden name, then the
    old one is moved aside, the new one renamed into place, and only then the old one is
    deleted. A crash at any point leaves a complete checkpoint (`folder` or `folder.old`,
    which training_checkpoint_folder falls back to).
    """
    check_finite(optimizer_state, os.path.join(folder, OPTIMIZER_NAME))
    needed = _nbytes(tensors) + _nbytes(optimizer_state)
    with reporting_full_disk(folder, needed), atomic_folder(folder) as building:
        write_checkpoint(building, config, tensors)
        if vocab_file is not None:
            shutil.copyfile(vocab_file, os.path.join(building, "vocab.txt"))
        safetensors.save_file(optimizer_state, os.path.join(building, OPTIMIZER_NAME))
        with atomic_open(os.path.join(building, TRAINER_STATE_NAME), "w", encoding="utf-8") as f:
            json.dump(trainer_state, f, indent=1, sort_keys=True)


def training_checkpoint_folder(folder):
    """The absolute path of a resumable checkpoint, a swap a crash interrupted finished first
    (fileio.recover_folder); FileNotFoundError where there is no trainer_state.json."""
    folder = os.path.abspath(os.fspath(folder))
    recover_folder(folder)
    state_path = os.path.join(folder, TRAINER_STATE_NAME)
    if not os.path.isfile(state_path):
        raise FileNotFoundError(f"no resumable checkpoint at {folder} "
                                f"(missing {TRAINER_STATE_NAME})")
    return folder


def read_training_state(folder, check=None, max_header_bytes=safetensors.MAX_HEADER_BYTES):
    """-> (optimizer state {name: host array}, trainer state dict) of a resumable checkpoint;
    check({name: safetensors.Entry}) may refuse the optimizer state's header before any of
    its data is read."""
    path = os.path.join(folder, OPTIMIZER_NAME)
    entries = safetensors.read_entries(path, max_header_bytes)
    if check:
        check(entries)
    optimizer_state = safetensors.read_tensors(path, entries, max_header_bytes=max_header_bytes)
    trainer_state = read_json(os.path.join(folder, TRAINER_STATE_NAME), TRAINER_STATE_NAME)
    return optimizer_state, trainer_state
