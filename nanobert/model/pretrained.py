"""A model from a checkpoint folder and back. formats/checkpoint.py reads and writes the files
(a config dict, named tensors); here is what they mean to a model: the config as a BertConfig,
the tensors a model class expects (check_state_dict), how a checkpoint's names map onto them
(adapt_state_dict: legacy LayerNorm gamma/beta, a `bert.` prefix present or absent, the tied
MLM decoder (weight = word embeddings, bias = cls.predictions.bias) stored or not), and for a
task head from any BERT what is kept, dropped or started fresh (load_for_task).
"""
import os

import numpy

from ..backend import to_host
from ..formats import checkpoint, safetensors
from ..formats.checkpoint import CONFIG_NAME
from .config import BertConfig, num_labels, with_labels
from .params import init_params

TIED_DECODER = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
NAMES_SHOWN = 5          # an error names a few tensors and the count, not 1.6 million
# A header entry is ~150 bytes ("encoder.layer.11.attention.output.LayerNorm.weight" with its
# dtype, shape and offsets); a checkpoint's header may hold 4 KB per tensor the config implies
# (other heads, metadata) and 1 MB more, never the 100 MB the format allows.
HEADER_BYTES_PER_TENSOR, HEADER_SLACK = 4096, 2**20


def check_state_dict(expected_shapes, tensors, what="model"):
    """Raise one ValueError listing the missing, unexpected and mis-shaped tensors (a few of
    each and their counts), or naming a tensor that is not floating point (an I32 table would
    be cast silently). `tensors` may be arrays or safetensors Entries (a header: .shape and
    .dtype), so that a checkpoint is checked before any of it is read."""
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
                more = f" and {len(names) - NAMES_SHOWN} more" * (len(names) > NAMES_SHOWN)
                parts.append(f"{label} ({len(names)}): " + ", ".join(names[:NAMES_SHOWN]) + more)
        raise ValueError(f"checkpoint does not fit {what}: " + "; ".join(parts))
    for name, t in tensors.items():
        dtype = numpy.dtype(t.dtype if hasattr(t, "dtype") else numpy.asarray(t).dtype)
        if dtype.kind != "f":
            raise ValueError(f"checkpoint does not fit {what}: {name} is stored as {dtype}, "
                             f"but every parameter is floating point")


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


def header_bound(config):
    """The most header bytes a checkpoint of `config` may need (HEADER_BYTES_PER_TENSOR)."""
    tensors = 16 * config.num_hidden_layers + 64
    return min(safetensors.MAX_HEADER_BYTES, HEADER_SLACK + HEADER_BYTES_PER_TENSOR * tensors)


def read_checkpoint(path):
    """-> (BertConfig, {name: safetensors.Entry}) from a folder with config.json and
    model.safetensors: the config checked (types, ranges, memory: model/limits.py), the
    header read (at most header_bound bytes) and no tensor data. Check the entries against
    what the model expects, then read_weights reads those."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"checkpoint folder not found: {path}")
    config = BertConfig.from_json_file(os.path.join(path, CONFIG_NAME))
    return config, checkpoint.read_weight_entries(path, header_bound(config))


def read_weights(path, config, tensors):
    """`tensors` (read_checkpoint's entries, renamed and checked; arrays may be among them)
    with every entry read from the folder's model.safetensors into a host array."""
    return checkpoint.read_chosen_weights(path, tensors, header_bound(config))


def load_pretrained(cls, path):
    """-> (BertConfig, dict of host arrays) for model class `cls`, checked against it before
    any tensor is read."""
    config, tensors = read_checkpoint(path)
    expected = cls.param_shapes(config)
    tensors = adapt_state_dict(tensors, cls.base_prefix, expected)
    check_state_dict(expected, tensors,
                     what=f"{cls.__name__} with {os.path.join(path, CONFIG_NAME)}")
    return config, read_weights(path, config, tensors)

# ------------------------------------------------------------- a task head from any BERT


def load_for_task(cls, path, num_labels=None, id2label=None, reinit_head=False, seed=0,
                  problem_type=None):
    """-> (config with the task's labels, params) for a task head class `cls` from any BERT
    checkpoint: the encoder must fit; other heads' tensors and an unused pooler are dropped;
    a missing pooler or head starts fresh (init from `seed`); a head of another shape is an
    error unless reinit_head. What was dropped or started fresh is printed, as transformers
    warns. problem_type, when given, replaces the checkpoint's."""
    config, tensors = read_checkpoint(path)
    config = with_labels(config, num_labels=num_labels, id2label=id2label,
                         problem_type=problem_type)
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
    return config, read_weights(path, config, {**encoder, **head_tensors})


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


def saved_form(model):
    """-> (config dict with architectures and the saved dtype, {name: contiguous host array})."""
    config = model.config.to_dict()
    config["architectures"] = [type(model).__name__]
    config["torch_dtype"] = str(getattr(model, "master_dtype", model.dtype))   # what is saved
    tensors = {name: numpy.ascontiguousarray(to_host(p)) for name, p in model.params.items()}
    return config, tensors


def save_pretrained(model, path):
    """config.json (with architectures and dtype) + model.safetensors, each written atomically."""
    checkpoint.write_checkpoint(path, *saved_form(model))

# ------------------------------------------------------------------- training checkpoints


def save_training_checkpoint(folder, model, optimizer, state, vocab_file=None):
    """A resumable checkpoint: the HF folder (config.json, model.safetensors, vocab.txt) plus
    optimizer.safetensors (Adam moments) and trainer_state.json (step, data position, ...),
    swapped in atomically (formats.checkpoint.write_training_checkpoint)."""
    optimizer_state = optimizer.state_dict()
    config, tensors = saved_form(model)
    checkpoint.write_training_checkpoint(folder, config, tensors, optimizer_state, state,
                                         vocab_file)


def load_training_checkpoint(cls, folder):
    """-> (config, params, optimizer_state, trainer_state) from save_training_checkpoint's
    folder; a swap a crash interrupted is finished first (fileio.recover_folder)."""
    folder = checkpoint.training_checkpoint_folder(folder)
    config, params = load_pretrained(cls, folder)
    moments = {f"{kind}/{name}": shape for name, shape in cls.param_shapes(config).items()
               for kind in ("m", "v")}

    def check(entries):             # Adam's moments, the parameters' shapes, and a step count
        entries = dict(entries)
        step = entries.pop("step", None)
        if step is None or step.shape != () or step.dtype.kind not in "iu":
            raise ValueError(f"{os.path.join(folder, checkpoint.OPTIMIZER_NAME)}: no integer "
                             f"scalar 'step' (found {step})")
        check_state_dict(moments, entries,
                         what=f"the optimizer state of {cls.__name__} in {folder}")
    optimizer_state, trainer_state = checkpoint.read_training_state(
        folder, check, max_header_bytes=2 * header_bound(config))
    return config, params, optimizer_state, trainer_state
