"""Checkpoints in Hugging Face's layout: a folder with config.json and model.safetensors.

Parameter names are HF state-dict names, so converting is renaming at most: a legacy
LayerNorm gamma/beta, a `bert.` prefix present or absent, the tied MLM decoder (weight =
word embeddings, bias = cls.predictions.bias) stored or not.
"""
import contextlib
import errno
import json
import os
import shutil

import numpy

from ..backend import array_module, to_host
from ..model.config import BertConfig, num_labels, with_labels
from ..model.params import init_params
from . import safetensors
from .fileio import atomic_folder, atomic_open, read_json, recover_folder

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
TIED_DECODER = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")


def check_state_dict(expected_shapes, tensors, what="model"):
    """Raise one ValueError listing every missing, unexpected and mis-shaped tensor, or
    naming a tensor that is not floating point (an I32 table would be cast silently)."""
    found = {name: tuple(numpy.shape(t)) for name, t in tensors.items()}
    missing = sorted(set(expected_shapes) - set(found))
    unexpected = sorted(set(found) - set(expected_shapes))
    misshaped = sorted(f"{name}: checkpoint {found[name]}, config {tuple(shape)}"
                       for name, shape in expected_shapes.items()
                       if name in found and found[name] != tuple(shape))
    if missing or unexpected or misshaped:
        parts = []
        for label, names in (("missing", missing), ("unexpected", unexpected),
                             ("mis-shaped", misshaped)):
            if names:
                parts.append(f"{label} ({len(names)}): " + ", ".join(names))
        raise ValueError(f"checkpoint does not fit {what}: " + "; ".join(parts))
    for name, t in tensors.items():
        dtype = numpy.dtype(getattr(t, "dtype", numpy.asarray(t).dtype))
        if dtype.kind != "f":
            raise ValueError(f"checkpoint does not fit {what}: {name} is stored as {dtype}, "
                             f"but every parameter is floating point")


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


def _canonical_name(name):
    """Old TF-converted checkpoints call LayerNorm's parameters gamma and beta."""
    if name.endswith("LayerNorm.gamma"):
        return name[:-len("gamma")] + "weight"
    if name.endswith("LayerNorm.beta"):
        return name[:-len("beta")] + "bias"
    return name


def adapt_state_dict(tensors, base_prefix, expected):
    """Map a checkpoint's names onto a model whose encoder names start with base_prefix."""
    tensors = {_canonical_name(k): v for k, v in tensors.items()
               if not k.endswith("position_ids")}                 # a buffer, not a parameter
    if "cls.predictions.bias" not in tensors and "cls.predictions.decoder.bias" in tensors:
        tensors["cls.predictions.bias"] = tensors["cls.predictions.decoder.bias"]
    for name in TIED_DECODER:                                      # tied aliases: not our params
        tensors.pop(name, None)
    has_prefix = any(k.startswith("bert.") for k in tensors)
    if base_prefix == "":
        if has_prefix:   # a model with heads loaded as a bare encoder: keep the encoder
            tensors = {k[len("bert."):]: v for k, v in tensors.items() if k.startswith("bert.")}
    elif not has_prefix:  # a bare encoder checkpoint loaded into a model with heads
        tensors = {(k if k in expected else base_prefix + k): v for k, v in tensors.items()}
    return tensors


def read_checkpoint(path):
    """-> (BertConfig, dict of host arrays as stored) from a folder with config.json and
    model.safetensors."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"checkpoint folder not found: {path}")
    config = BertConfig.from_json_file(os.path.join(path, CONFIG_NAME))
    weights = os.path.join(path, WEIGHTS_NAME)
    if not os.path.exists(weights):
        raise FileNotFoundError(f"no {WEIGHTS_NAME} in {path} (nanobert reads safetensors only)")
    return config, safetensors.load_file(weights)


def load_pretrained(cls, path):
    """-> (BertConfig, dict of host arrays) for model class `cls`, checked against it."""
    config, tensors = read_checkpoint(path)
    expected = cls.param_shapes(config)
    tensors = adapt_state_dict(tensors, cls.base_prefix, expected)
    check_state_dict(expected, tensors,
                     what=f"{cls.__name__} with {os.path.join(path, CONFIG_NAME)}")
    return config, tensors

# ------------------------------------------------------------- a task head from any BERT


def load_for_task(cls, path, num_labels=None, id2label=None, reinit_head=False, seed=0):
    """-> (config with the task's labels, params) for a task head class `cls` from any BERT
    checkpoint: the encoder must fit; other heads' tensors and an unused pooler are dropped;
    a missing pooler or head starts fresh (init from `seed`); a head of another shape is an
    error unless reinit_head. What was dropped or started fresh is printed, as transformers
    warns."""
    config, tensors = read_checkpoint(path)
    config = with_labels(config, num_labels=num_labels, id2label=id2label)
    expected, head = cls.param_shapes(config), cls.head_shapes(config)
    tensors = adapt_state_dict(tensors, "bert.", expected)
    unused = _drop_other_heads(tensors, expected)
    encoder, fresh = _encoder_tensors(cls, path, config, tensors, expected, head, seed)
    reasons = _head_mismatches(cls, path, config, tensors, head, reinit_head)
    head_tensors = {k: tensors[k] for k in head if k in tensors and k not in reasons}
    fresh += sorted(k for k in head if k not in tensors)
    head_tensors.update(init_params({k: head[k] for k in head if k not in head_tensors},
                                    config, seed + 1))
    _report(cls.__name__, path, unused, reasons, fresh)
    return config, {**encoder, **head_tensors}


def _drop_other_heads(tensors, expected):
    """Remove (in place) the tensors of heads and a pooler this model does not have."""
    other_heads = ("cls.", "classifier.", "qa_outputs.", "bert.pooler.")
    unused = sorted(k for k in tensors if k not in expected and k.startswith(other_heads))
    for k in unused:
        del tensors[k]
    return unused


def _encoder_tensors(cls, path, config, tensors, expected, head, seed):
    """The encoder's tensors, a missing pooler initialised; -> (tensors, fresh names)."""
    fresh = sorted(k for k in expected if k.startswith("bert.pooler.") and k not in tensors)
    encoder_shapes = {k: s for k, s in expected.items() if k not in head}
    encoder = {k: v for k, v in tensors.items() if k not in head}
    encoder.update(init_params({k: expected[k] for k in fresh}, config, seed))
    check_state_dict(encoder_shapes, encoder,
                     what=f"{cls.__name__} with {os.path.join(path, CONFIG_NAME)}")
    return encoder, fresh


def _head_mismatches(cls, path, config, tensors, head, reinit_head):
    """{head tensor: why it starts fresh}; a mis-shaped head without reinit_head is an error."""
    mismatched = [k for k, shape in head.items()
                  if k in tensors and tuple(tensors[k].shape) != shape]
    if mismatched and not reinit_head:
        k = mismatched[0]
        found, needed = tuple(tensors[k].shape), head[k]
        model_name = cls.__name__
        if not cls.head_ignores_num_labels:
            model_name += f" with num_labels={num_labels(config)}"
        raise ValueError(
            f"{path}: the checkpoint's head {k} has shape {found} ({found[0]} labels) but "
            f"{model_name} needs {needed} ({needed[0]} labels); pass reinit_head=True to start "
            f"a fresh head, or num_labels={found[0]} to keep it")
    reasons = {k: f"found shape {tuple(tensors[k].shape)} in the checkpoint and {head[k]} "
                  f"in the model" for k in mismatched}
    if reinit_head:
        reasons.update({k: "reinit_head=True" for k in head if k in tensors and k not in reasons})
    return reasons


def _report(model_name, path, unused, reasons, fresh):
    """transformers' warnings about unused and newly initialised weights, on stdout."""
    if unused:
        print(f"Some weights of the model checkpoint at {path} were not used when initializing "
              f"{model_name}: {unused}")
    if reasons:
        print(f"Some weights of {model_name} were not initialized from the model checkpoint at "
              f"{path} and are newly initialized:\n"
              + "\n".join(f"- {k}: {why}" for k, why in sorted(reasons.items())))
    if fresh:
        print(f"Some weights of {model_name} were not initialized from the model checkpoint at "
              f"{path} and are newly initialized: {sorted(fresh)}")
    if reasons or fresh:
        print("You should probably TRAIN this model on a down-stream task to be able to use it "
              "for predictions and inference.")


def save_pretrained(model, path):
    """config.json (with architectures and dtype) + model.safetensors, each written atomically."""
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    config = model.config.to_dict()
    config["architectures"] = [type(model).__name__]
    config["torch_dtype"] = str(getattr(model, "master_dtype", model.dtype))   # what is saved
    tensors = {name: numpy.ascontiguousarray(to_host(p)) for name, p in model.params.items()}
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

OPTIMIZER_NAME = "optimizer.safetensors"
TRAINER_STATE_NAME = "trainer_state.json"


def save_training_checkpoint(folder, model, optimizer, state, vocab_file=None):
    """A resumable checkpoint: the HF folder (config.json, model.safetensors, vocab.txt) plus
    optimizer.safetensors (Adam moments) and trainer_state.json (step, data position, ...).

    The whole folder is swapped atomically: written beside it under a hidden name, then the
    old one is moved aside, the new one renamed into place, and only then the old one is
    deleted. A crash at any point leaves a complete checkpoint (`folder` or `folder.old`,
    which load_training_checkpoint falls back to).
    """
    optimizer_state = optimizer.state_dict()
    check_finite(optimizer_state, os.path.join(folder, OPTIMIZER_NAME))
    needed = _nbytes(model.params) + _nbytes(optimizer_state)
    with reporting_full_disk(folder, needed), atomic_folder(folder) as building:
        save_pretrained(model, building)
        if vocab_file is not None:
            shutil.copyfile(vocab_file, os.path.join(building, "vocab.txt"))
        safetensors.save_file(optimizer_state, os.path.join(building, OPTIMIZER_NAME))
        with atomic_open(os.path.join(building, TRAINER_STATE_NAME), "w", encoding="utf-8") as f:
            json.dump(state, f, indent=1, sort_keys=True)


def load_training_checkpoint(cls, folder):
    """-> (config, params, optimizer_state, trainer_state) from save_training_checkpoint's
    folder; a swap a crash interrupted is finished first (fileio.recover_folder)."""
    folder = os.path.abspath(os.fspath(folder))
    recover_folder(folder)
    state_path = os.path.join(folder, TRAINER_STATE_NAME)
    if not os.path.isfile(state_path):
        raise FileNotFoundError(f"no resumable checkpoint at {folder} "
                                f"(missing {TRAINER_STATE_NAME})")
    config, params = load_pretrained(cls, folder)
    optimizer_state = safetensors.load_file(os.path.join(folder, OPTIMIZER_NAME))
    trainer_state = read_json(state_path, TRAINER_STATE_NAME)
    return config, params, optimizer_state, trainer_state
