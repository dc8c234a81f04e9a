"""Checkpoints in Hugging Face's layout: a folder with config.json and model.safetensors.

Parameter names are HF state-dict names, so converting is renaming at most: a legacy
LayerNorm gamma/beta, a `bert.` prefix present or absent, the tied MLM decoder (weight =
word embeddings, bias = cls.predictions.bias) stored or not.
"""
import json
import os
import shutil

import numpy

from ..backend import to_host
from ..model.config import BertConfig
from .fileio import atomic_folder, atomic_open
from . import safetensors

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
TIED_DECODER = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")


def check_state_dict(expected_shapes, tensors, what="model"):
    """Raise one ValueError listing every missing, unexpected and mis-shaped tensor."""
    found = {name: tuple(numpy.shape(t)) for name, t in tensors.items()}
    missing = sorted(set(expected_shapes) - set(found))
    unexpected = sorted(set(found) - set(expected_shapes))
    misshaped = sorted(f"{name}: checkpoint {found[name]}, config {tuple(shape)}"
                       for name, shape in expected_shapes.items()
                       if name in found and found[name] != tuple(shape))
    if missing or unexpected or misshaped:
        parts = []
        for label, names in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped)):
            if names:
                parts.append(f"{label} ({len(names)}): " + ", ".join(names))
        raise ValueError(f"checkpoint does not fit {what}: " + "; ".join(parts))


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


def load_pretrained(cls, path):
    """-> (BertConfig, dict of host arrays) for model class `cls`, checked against it."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"checkpoint folder not found: {path}")
    config = BertConfig.from_json_file(os.path.join(path, CONFIG_NAME))
    weights = os.path.join(path, WEIGHTS_NAME)
    if not os.path.exists(weights):
        raise FileNotFoundError(f"no {WEIGHTS_NAME} in {path} (nanobert reads safetensors only)")
    expected = cls.param_shapes(config)
    tensors = adapt_state_dict(safetensors.load_file(weights), cls.base_prefix, expected)
    check_state_dict(expected, tensors, what=f"{cls.__name__} with {os.path.join(path, CONFIG_NAME)}")
    return config, tensors


def save_pretrained(model, path):
    """config.json (with architectures and dtype) + model.safetensors, each written atomically."""
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    config = model.config.to_dict()
    config["architectures"] = [type(model).__name__]
    config["torch_dtype"] = str(model.dtype)
    tensors = {name: numpy.ascontiguousarray(to_host(p)) for name, p in model.params.items()}
    safetensors.save_file(tensors, os.path.join(path, WEIGHTS_NAME), metadata={"format": "pt"})
    with atomic_open(os.path.join(path, CONFIG_NAME), "w", encoding="utf-8") as f:
        f.write(json.dumps(config, indent=2, sort_keys=True) + "\n")

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
    with atomic_folder(folder) as building:
        save_pretrained(model, building)
        if vocab_file is not None:
            shutil.copyfile(vocab_file, os.path.join(building, "vocab.txt"))
        safetensors.save_file(optimizer.state_dict(), os.path.join(building, OPTIMIZER_NAME))
        with atomic_open(os.path.join(building, TRAINER_STATE_NAME), "w", encoding="utf-8") as f:
            json.dump(state, f, indent=1, sort_keys=True)


def load_training_checkpoint(cls, folder):
    """-> (config, params, optimizer_state, trainer_state) from save_training_checkpoint's
    folder, or from its `.old` twin if a crash interrupted the swap."""
    folder = os.path.abspath(os.fspath(folder))
    if not os.path.isdir(folder) and os.path.isdir(folder + ".old"):
        folder += ".old"
    state_path = os.path.join(folder, TRAINER_STATE_NAME)
    if not os.path.isfile(state_path):
        raise FileNotFoundError(f"no resumable checkpoint at {folder} (missing {TRAINER_STATE_NAME})")
    config, params = load_pretrained(cls, folder)
    optimizer_state = safetensors.load_file(os.path.join(folder, OPTIMIZER_NAME))
    with open(state_path, encoding="utf-8") as f:
        trainer_state = json.load(f)
    return config, params, optimizer_state, trainer_state
