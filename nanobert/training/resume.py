"""Exact resume: the trainer state a checkpoint holds, the model and optimizer it restores,
the refusal of a flag or a model that
would not continue the same run (naming both values), and the checkpoint save that refuses
non-finite weights and turns a full disk into one line. And a new run from a checkpoint's
weights (--init-from): its vocab and weights, refused if the flags describe another model."""
import dataclasses
import errno
import os

import numpy

from nanobert.formats.checkpoint import NonFiniteError, first_non_finite
from nanobert.formats.fileio import read_json, recover_folder
from nanobert.data.pretraining_data import sha256_file
from nanobert.model.limits import is_integer, is_number
from nanobert.model.pretrained import (load_pretrained, load_training_checkpoint,
                                       save_training_checkpoint)

from .guards import ADVICE
from .metrics import keep_metrics_until
from .run import make_optimizer


def read_trainer_state(checkpoint_dir, keys, writer):
    """trainer_state.json of a checkpoint, after finishing a save that a crash cut short;
    FileNotFoundError without one, ValueError naming it if it lacks `keys` or its "args"."""
    recover_folder(checkpoint_dir)
    path = os.path.join(checkpoint_dir, "trainer_state.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"no resumable checkpoint at {checkpoint_dir} (missing "
                                "trainer_state.json)")
    state = read_json(path, "trainer_state.json")
    missing = [k for k in keys if k not in state]
    if missing or not isinstance(state["args"], dict):
        raise ValueError(f"{path}: not a trainer state written by {writer} (missing or bad: "
                         f"{', '.join(missing) or 'args'})")
    check_state_types(state, path)
    return state


# trainer_state.json's keys -> (what each must be, the test); absent keys are not checked
STATE_TYPES = {
    "step": ("an integer >= 0", lambda v: is_integer(v) and v >= 0),
    "total_steps": ("an integer >= 1", lambda v: is_integer(v) and v >= 1),
    "tokens": ("an integer >= 0", lambda v: is_integer(v) and v >= 0),
    "train_seconds": ("a number >= 0", lambda v: is_number(v) and 0 <= v < float("inf")),
    "vocab_sha256": ("a string", lambda v: isinstance(v, str)),
    "best": ("null or an object", lambda v: v is None or isinstance(v, dict)),
    "dropout_rng": ("null or an object", lambda v: v is None or isinstance(v, dict)),
    "loss_scaler": ("an object", lambda v: isinstance(v, dict)),
}


# ...and inside its objects (finetune.py's best checkpoint, float16's loss scaler)
INNER_TYPES = {
    ("best", "score"): ("a number", is_number), ("best", "epoch"): ("a number", is_number),
    ("best", "step"): ("an integer", is_integer),
    ("loss_scaler", "loss_scale"): ("a number", is_number),
    ("loss_scaler", "clean_steps"): ("an integer", is_integer),
}


def check_state_types(state, path):
    """ValueError naming the file and the first key of trainer_state.json of the wrong type
    (a "step": "2" would otherwise fail deep inside the resume)."""
    for key, (kind, test) in STATE_TYPES.items():
        if key in state and not test(state[key]):
            raise ValueError(f"{path}: {key} must be {kind}, got {state[key]!r:.80}")
    for (outer, key), (kind, test) in INNER_TYPES.items():
        value = (state.get(outer) or {}).get(key, 0)
        if not test(value):
            raise ValueError(f"{path}: {outer}.{key} must be {kind}, got {value!r:.80}")


def resume_training(cls, args, checkpoint_dir, metrics_path, check=None):
    """The model (class `cls`), optimizer, loss scaler and trainer state of <out>/checkpoint,
    and metrics.jsonl cut back to its step (what was logged after it will be logged again).
    check(state) may refuse the checkpoint first, before anything is changed.
    -> (model, optimizer, scaler, state)"""
    config, params, optimizer_state, state = load_training_checkpoint(cls, checkpoint_dir)
    if check:
        check(state)
    model = cls(config, dtype=numpy.dtype(args.dtype), device=args.device, params=params)
    optimizer, scaler = make_optimizer(args, model, (optimizer_state, state))
    print(f"resumed {checkpoint_dir} at step {state['step']} of {state['total_steps']}")
    if metrics_path and os.path.exists(metrics_path):
        keep_metrics_until(metrics_path, state["step"])
    return model, optimizer, scaler, state


def refuse_changed_flags(args, saved, fixed, paths=(), skip=()):
    """SystemExit naming the first flag of `fixed` whose value in `args` differs from the
    checkpoint's `saved` arguments. Not compared: a flag the checkpoint did not record, and
    those in `skip`; `paths` (a file or a list of files) are compared as absolute paths."""
    for key in fixed:
        if key not in saved or key in skip:
            continue
        new, old = vars(args)[key], saved[key]
        if key in paths:
            new, old = (absolute(v) for v in (new, old))
        if new == old:
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(new, bool):             # a switch: "--x" against "no --x"
            new, old = (flag if v else f"no {flag}" for v in (new, old))
        else:
            new, old = (" ".join(map(str, v)) if isinstance(v, list) else v for v in (new, old))
            new = f"{flag} {new}"
        raise SystemExit(f"error: resuming with {new}, but the checkpoint used {old}; "
                         "exact continuation needs the same value (or start a new run "
                         "without --resume)")


def absolute(paths):
    """A path or a list of paths as absolute paths (None stays None)."""
    if isinstance(paths, str):
        return os.path.abspath(paths)
    return paths if paths is None else [os.path.abspath(p) for p in paths]


def refuse_changed_model(wanted, config, flag, doing="resuming with"):
    """SystemExit if the config the flags describe (`wanted`, from `flag`) is another model
    than the checkpoint's `config` (the checkpoint's would be used, silently). `doing` names
    what uses the checkpoint: "resuming with", or --init-from's start."""
    for field in dataclasses.fields(config):     # the model's settings, not config.json's extras
        k = field.name                           # nor the task's (problem_type: its head's)
        if k not in ("extra", "problem_type") and getattr(wanted, k) != getattr(config, k):
            raise SystemExit(f"error: {doing} {flag} ({k} {getattr(wanted, k)}), but the "
                             f"checkpoint's model has {k} {getattr(config, k)}")


def init_from_vocab(folder, vocab=None):
    """--init-from: the vocab a run that starts from `folder`'s weights uses, the checkpoint's
    own vocab.txt (FileNotFoundError without one). A --vocab `vocab` of other content is
    refused (ValueError naming both): row i of the embeddings is piece i of that vocab."""
    own = os.path.join(folder, "vocab.txt")
    if not os.path.isfile(own):
        raise FileNotFoundError(f"--init-from {folder}: no vocab.txt there (train.py's "
                                "<out>/checkpoint holds config.json, model.safetensors and "
                                "vocab.txt)")
    if vocab is not None and sha256_file(vocab) != sha256_file(own):
        raise ValueError(f"--vocab {vocab} is not the vocab of --init-from {folder} ({own}): "
                         "the checkpoint's embeddings are rows of its own vocab; leave --vocab "
                         "out to use it")
    return own


def init_from_weights(cls, folder, wanted, flag):
    """--init-from: the weights of `folder` (config.json + model.safetensors, e.g. train.py's
    <out>/checkpoint) for a model of class `cls`, refused (SystemExit naming the setting) if
    the flags describe (`wanted`, from `flag`) another model; a tensor of another shape or a
    missing one is a ValueError naming it. Its optimizer state and step are not read: the
    run starts a new schedule from these weights (continued pretraining)."""
    config, params = load_pretrained(cls, folder)
    refuse_changed_model(wanted, config, flag, doing=f"--init-from {folder} with")
    return params


def save_checkpoint(checkpoint_dir, model, optimizer, state, vocab_file, step, write=True):
    """Swap in a checkpoint of `step` (its trainer `state` already updated), or stop with one
    line naming the step: weights or Adam moments that are not finite (the previous checkpoint
    stays: a diverged run never replaces a good one), or a full disk. write=False (ranks
    other than 0): the check alone."""
    bad = first_non_finite(model.params)
    try:
        if bad is not None:
            raise NonFiniteError(f"first non-finite weight: {bad}")
        if write:
            save_training_checkpoint(checkpoint_dir, model, optimizer, state, vocab_file)
    except NonFiniteError as e:
        raise SystemExit(f"error: the training state is not finite after step {step} ({e}); "
                         f"nothing was saved, {kept_checkpoint(checkpoint_dir)}. "
                         f"{ADVICE}") from None
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise SystemExit(f"error: step {step} was not saved: {e.strerror or e}; "
                         f"{kept_checkpoint(checkpoint_dir)}") from None


def kept_checkpoint(checkpoint_dir):
    """What the checkpoint folder holds, for the error that says a save did not happen."""
    try:
        step = read_json(os.path.join(checkpoint_dir, "trainer_state.json"))["step"]
    except (OSError, ValueError, KeyError):
        return f"and there is no earlier checkpoint in {checkpoint_dir}"
    return f"{checkpoint_dir} still holds step {step}"
