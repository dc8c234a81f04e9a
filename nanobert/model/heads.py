"""The fine-tuning heads of BERT (section 4 of the paper), built as transformers builds them,
so that a fine-tuned nanobert checkpoint is a transformers checkpoint and back:

    BertForSequenceClassification   pooled [CLS] -> dropout -> classifier   [B, num_labels]
                                    (single sentences and A [SEP] B pairs; regression when
                                    num_labels == 1; multi-label with float labels)
    BertForTokenClassification      every position -> dropout -> classifier [B, T, num_labels]
                                    (no pooler, as HF: BertModel(add_pooling_layer=False))
    BertForQuestionAnswering        every position -> qa_outputs -> start/end logits [B, T]
                                    (no pooler, no dropout on the head)
    BertForMultipleChoice           [B, C, T] run as B*C sequences; pooled -> dropout ->
                                    classifier (one score) -> [B, C], softmax over choices

Parameters are the encoder's (`bert.` prefix) plus the head's, HF state-dict names. Each
model has `__call__` (inference: an output object with the logits), `loss(batch)` (forward
only) and `loss_and_grads(batch)`; the loss rules are transformers' own (see each class).
The head dropout is `classifier_dropout` from config.json when set, else hidden_dropout_prob.
As in transformers (nn.Embedding(padding_idx=pad_token_id)) the [PAD] row of the word
embeddings never gets a gradient.

num_labels(config) reads the label count the way config.json stores it (id2label);
with_labels(config, num_labels=, id2label=, problem_type=) returns a config carrying them.
`from_pretrained` loads the encoder of any BERT checkpoint and starts a missing head fresh.
"""
import dataclasses
import os

import numpy

from . import ops
from ..formats import safetensors
from ..backend import array_module, to_device, to_host
from ..formats.checkpoint import CONFIG_NAME, WEIGHTS_NAME, adapt_state_dict, check_state_dict
from .config import BertConfig
from ..formats.hub import resolve_model
from .bert import (BertPreTrainedModel, _as_int_array, _check_range, bert_backward, bert_forward,
                    bert_param_shapes, check_inputs, init_params, linear_backward_into)

PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")
INPUT_KEYS = ("input_ids", "token_type_ids", "attention_mask")
WORD_EMBEDDINGS = "bert.embeddings.word_embeddings.weight"

# ------------------------------------------------------------------------ loss op pairs


def mse_forward(prediction, target):
    """Mean squared error over every element (torch's MSELoss). Same shapes -> scalar."""
    diff = prediction - target
    return float((diff * diff).mean()), diff


def mse_backward(dloss, diff):
    return diff * (2.0 * dloss / diff.size)


def bce_with_logits_forward(logits, targets):
    """Mean binary cross-entropy of sigmoid(logits) against targets in [0, 1], over every
    element (torch's BCEWithLogitsLoss). Written as max(x, 0) - x*y + log(1 + exp(-|x|)),
    which never overflows."""
    xp = array_module(logits)
    per_element = xp.maximum(logits, 0.0) - logits * targets + xp.log1p(xp.exp(-xp.abs(logits)))
    return float(per_element.mean()), (logits, targets)


def bce_with_logits_backward(dloss, cache):
    """-> dlogits = dloss * (sigmoid(x) - y) / N; sigmoid from exp(-|x|), so no overflow."""
    logits, targets = cache
    xp = array_module(logits)
    e = xp.exp(-xp.abs(logits))
    sigmoid = xp.where(logits >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    return (sigmoid - targets) * (dloss / logits.size)

# ----------------------------------------------------------------------- labels in config


def _parse_id2label(id2label):
    """{index: name} (int or string keys, as config.json has them) or a list of names ->
    {int: name}, checked to be indexed 0..n-1."""
    if isinstance(id2label, (list, tuple)):
        id2label = dict(enumerate(id2label))
    if not isinstance(id2label, dict) or not id2label:
        raise ValueError(f"id2label must be a non-empty dict {{index: name}}, got {id2label!r}")
    try:
        by_index = {int(k): v for k, v in id2label.items()}
    except (TypeError, ValueError):
        raise ValueError(f"id2label keys must be integers 0..n-1, got {sorted(map(str, id2label))}") from None
    if sorted(by_index) != list(range(len(by_index))):
        raise ValueError(f"id2label keys must be exactly 0..{len(by_index) - 1}, got {sorted(by_index)}")
    return by_index


def _check_count(n, what="num_labels"):
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"{what} must be a positive integer, got {n!r}")
    return n


def num_labels(config):
    """Number of labels as transformers counts them: len(id2label) (config.json stores
    num_labels only that way), else a bare "num_labels" key, else 2 (HF's default)."""
    stated = config.extra.get("num_labels")
    if stated is not None:
        _check_count(stated)
    if config.extra.get("id2label") is None:
        return 2 if stated is None else stated
    count = len(_parse_id2label(config.extra["id2label"]))
    if stated is not None and stated != count:
        raise ValueError(f"config says num_labels={stated} but its id2label has {count} labels")
    return count


_num_labels = num_labels     # for the functions whose num_labels argument shadows it


def with_labels(config, num_labels=None, id2label=None, problem_type=None):
    """A copy of `config` whose extra holds id2label / label2id as config.json stores them
    (string keys "0".."n-1"; label2id the inverse) and no separate "num_labels" key.

    id2label (a dict {index: name} or a list of names) sets the labels; num_labels alone
    keeps the existing names when the count is unchanged, else names them LABEL_0.. as HF.
    problem_type (one of PROBLEM_TYPES) is stored when given.
    """
    count = _num_labels(config)
    label2id = config.extra.get("label2id")
    if num_labels is not None:
        _check_count(num_labels)
    if id2label is not None:
        by_index = _parse_id2label(id2label)
        if num_labels is not None and num_labels != len(by_index):
            raise ValueError(f"num_labels={num_labels} but id2label has {len(by_index)} labels")
        label2id = None
    elif num_labels is not None and num_labels != count:
        by_index, label2id = {i: f"LABEL_{i}" for i in range(num_labels)}, None
    elif config.extra.get("id2label") is not None:
        by_index = _parse_id2label(config.extra["id2label"])
    else:
        by_index = {i: f"LABEL_{i}" for i in range(count)}
    extra = {k: v for k, v in config.extra.items() if k != "num_labels"}
    extra["id2label"] = {str(i): by_index[i] for i in range(len(by_index))}
    if not isinstance(label2id, dict) or len(label2id) != len(by_index):
        label2id = {name: i for i, name in by_index.items()}
    extra["label2id"] = dict(label2id)
    if problem_type is not None:
        extra["problem_type"] = problem_type
    if extra.get("problem_type") not in (None, *PROBLEM_TYPES):
        raise ValueError(f"problem_type must be one of {PROBLEM_TYPES}, got {extra['problem_type']!r}")
    return dataclasses.replace(config, extra=extra)

# ----------------------------------------------------------------------------- outputs


@dataclasses.dataclass
class SequenceClassifierOutput:
    logits: object              # [B, num_labels]
    hidden_states: list         # L+1 arrays [B, T, H]


@dataclasses.dataclass
class TokenClassifierOutput:
    logits: object              # [B, T, num_labels]
    hidden_states: list


@dataclasses.dataclass
class QuestionAnsweringModelOutput:
    start_logits: object        # [B, T]
    end_logits: object          # [B, T]
    hidden_states: list


@dataclasses.dataclass
class MultipleChoiceModelOutput:
    logits: object              # [B, C]
    hidden_states: list         # L+1 arrays [B*C, T, H]

# ------------------------------------------------------------------------- batch checks


def _require(batch, keys, what):
    if not isinstance(batch, dict) or any(k not in batch or batch[k] is None for k in keys):
        found = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
        raise ValueError(f"a {what} batch is a dict with at least {list(keys)}, got {found}")


def _as_real_array(batch, key, where):
    """Float labels (regression, multi-label): any int or float array, finite -> float64."""
    a = numpy.asarray(to_host(batch[key]))
    real = numpy.issubdtype(a.dtype, numpy.integer) or numpy.issubdtype(a.dtype, numpy.floating)
    if a.dtype == bool or not real:
        raise ValueError(f"{where}: {key} must be a real-valued array, got dtype {a.dtype}")
    a = a.astype(numpy.float64)
    if not numpy.isfinite(a).all():
        index = tuple(int(i) for i in numpy.argwhere(~numpy.isfinite(a))[0])
        raise ValueError(f"{key}[{', '.join(map(str, index))}] = {a[index]} is not finite")
    return a


def _shape_error(key, shape, expected):
    return ValueError(f"batch: {key} has shape {shape}, expected {' or '.join(map(str, expected))}")

# ------------------------------------------------------------------------- the heads


class BertForTask(BertPreTrainedModel):
    """What every task head shares: the encoder (with or without the pooler), num_labels
    from config, the forward/backward composition, and from_pretrained from any BERT."""
    base_prefix = "bert."
    uses_pooler = True           # False for token classification and QA, as in transformers
    head_ignores_num_labels = False      # True where num_labels plays no part in the head's shape

    def __init__(self, config, seed=0, dtype=numpy.float32, device=None, params=None):
        if isinstance(config, BertConfig):
            config = with_labels(config)   # saved config.json gets id2label / label2id
        super().__init__(config, seed=seed, dtype=dtype, device=device, params=params)
        self.num_labels = num_labels(config)
        dropout = config.extra.get("classifier_dropout")
        self.classifier_dropout = config.hidden_dropout_prob if dropout is None else float(dropout)
        if not 0.0 <= self.classifier_dropout < 1.0:
            raise ValueError(f"classifier_dropout must be in [0, 1), got {dropout}")

    @classmethod
    def head_shapes(cls, config):
        raise NotImplementedError

    @classmethod
    def param_shapes(cls, config):
        return {**bert_param_shapes(config, "bert.", pooler=cls.uses_pooler), **cls.head_shapes(config)}

    # Each subclass defines: _inputs (validate, flatten), _check_targets, _head_forward /
    # _head_backward, _loss_forward / _loss_backward and _output.

    def _inputs(self, input_ids, token_type_ids, attention_mask):
        """-> host int64 arrays [B, T] (HF's keys), validated."""
        return check_inputs(self.config, input_ids, token_type_ids, attention_mask)

    def _forward(self, host):
        """Encoder + head on a checked batch -> logits, caches, hidden_states."""
        xp = self.xp
        ids, types, mask = (to_device(host[k], xp) for k in INPUT_KEYS)
        sequence, pooled, hidden_states, bert_cache = bert_forward(
            self.params, "bert.", self.config, ids, types, mask, self.rng, self.training)
        logits, head_cache = self._head_forward(sequence, pooled, host)
        return logits, (bert_cache, head_cache), hidden_states

    def __call__(self, input_ids, token_type_ids=None, attention_mask=None):
        host = self._inputs(input_ids, token_type_ids, attention_mask)
        logits, _, hidden_states = self._forward(host)
        return self._output(logits, hidden_states)

    def check_batch(self, batch):
        """Validate a training batch on the host -> dict of NumPy arrays (inputs + targets)."""
        _require(batch, ("input_ids", *self.target_keys), type(self).__name__)
        host = self._inputs(batch["input_ids"], batch.get("token_type_ids"), batch.get("attention_mask"))
        host.update(self._check_targets(batch, host))
        return host

    def loss(self, batch):
        """Forward only (evaluation): the loss of one batch, as a float."""
        host = self.check_batch(batch)
        logits, _, _ = self._forward(host)
        return self._loss_forward(logits, host)[0]

    def loss_and_grads(self, batch, return_outputs=False):
        """Forward and backward over one batch -> (loss, grads), grads keyed like self.params;
        with return_outputs also a dict with the logits, hidden_states and loss details."""
        host = self.check_batch(batch)
        logits, (bert_cache, head_cache), hidden_states = self._forward(host)
        loss, loss_cache, outputs = self._loss_forward(logits, host)
        grads = {}
        dlogits = self._loss_backward(loss_cache)
        dsequence, dpooled = self._head_backward(dlogits, head_cache, grads)
        bert_backward(dsequence, dpooled, bert_cache, self.params, "bert.", grads)
        for name, p in self.params.items():
            if name not in grads:
                grads[name] = self.xp.zeros_like(p)
        if not return_outputs:
            return loss, grads
        output = self._output(logits, hidden_states)
        outputs.update({f.name: getattr(output, f.name) for f in dataclasses.fields(output)})
        return loss, grads, outputs

    # -------------------------------------------------------------- from any checkpoint

    @classmethod
    def from_pretrained(cls, path, num_labels=None, id2label=None, reinit_head=False,
                        dtype=numpy.float32, device=None, seed=0):
        """Load the encoder from any BERT checkpoint folder (config.json + model.safetensors):
        with or without the `bert.` prefix, with or without a pooler, with or without heads.

        Tensors of other heads (cls.* of a pretraining checkpoint, a classifier the task does
        not use) and a pooler this class does not use are ignored; a missing head and a
        missing pooler are initialised fresh (truncated normal(initializer_range), bias 0,
        from `seed`). Both are reported on stdout, as transformers warns. A head whose number
        of labels differs from num_labels is a ValueError; reinit_head=True starts a fresh head
        instead (whether or not its shape matches).
        """
        path = resolve_model(path)
        if not os.path.isdir(path):
            raise FileNotFoundError(f"checkpoint folder not found: {path}")
        config = BertConfig.from_json_file(os.path.join(path, CONFIG_NAME))
        config = with_labels(config, num_labels=num_labels, id2label=id2label)
        weights = os.path.join(path, WEIGHTS_NAME)
        if not os.path.exists(weights):
            raise FileNotFoundError(f"no {WEIGHTS_NAME} in {path} (nanobert reads safetensors only)")
        expected = cls.param_shapes(config)
        head = cls.head_shapes(config)
        tensors = adapt_state_dict(safetensors.load_file(weights), "bert.", expected)

        other_heads = ("cls.", "classifier.", "qa_outputs.", "bert.pooler.")
        unused = sorted(k for k in tensors if k not in expected and k.startswith(other_heads))
        for k in unused:
            del tensors[k]
        fresh = sorted(k for k in expected if k.startswith("bert.pooler.") and k not in tensors)
        encoder = {k: s for k, s in expected.items() if k not in head}
        encoder_tensors = {k: v for k, v in tensors.items() if k not in head}
        encoder_tensors.update(init_params({k: expected[k] for k in fresh}, config, seed))
        check_state_dict(encoder, encoder_tensors,
                         what=f"{cls.__name__} with {os.path.join(path, CONFIG_NAME)}")

        mismatched = [k for k, shape in head.items() if k in tensors and tuple(tensors[k].shape) != shape]
        if mismatched and not reinit_head:
            k = mismatched[0]
            found, needed = tuple(tensors[k].shape), head[k]
            model_name = cls.__name__
            if not cls.head_ignores_num_labels:
                model_name += f" with num_labels={_num_labels(config)}"
            raise ValueError(
                f"{path}: the checkpoint's head {k} has shape {found} ({found[0]} labels) but "
                f"{model_name} needs {needed} ({needed[0]} labels); pass reinit_head=True to start "
                f"a fresh head, or num_labels={found[0]} to keep it")
        reasons = {k: f"found shape {tuple(tensors[k].shape)} in the checkpoint and {head[k]} in the model"
                   for k in mismatched}
        if reinit_head:
            reasons.update({k: "reinit_head=True" for k in head if k in tensors and k not in reasons})
        head_tensors = {k: tensors[k] for k in head if k in tensors and k not in reasons}
        missing_head = sorted(k for k in head if k not in tensors)
        head_tensors.update(init_params({k: head[k] for k in head if k not in head_tensors},
                                        config, seed + 1))
        fresh += missing_head

        if unused:
            print(f"Some weights of the model checkpoint at {path} were not used when initializing "
                  f"{cls.__name__}: {unused}")
        if reasons:
            print(f"Some weights of {cls.__name__} were not initialized from the model checkpoint at "
                  f"{path} and are newly initialized:\n"
                  + "\n".join(f"- {k}: {why}" for k, why in sorted(reasons.items())))
        if fresh:
            print(f"Some weights of {cls.__name__} were not initialized from the model checkpoint at "
                  f"{path} and are newly initialized: {sorted(fresh)}")
        if reasons or fresh:
            print("You should probably TRAIN this model on a down-stream task to be able to use it "
                  "for predictions and inference.")
        model = cls(config, seed=seed, dtype=dtype, device=device, params={**encoder_tensors, **head_tensors})
        return model.eval()


class BertForSequenceClassification(BertForTask):
    """Classification (or regression) of a single sentence or an A [SEP] B pair from the
    pooled [CLS]: logits = classifier(dropout(pooler_output)), [B, num_labels].

    The loss follows config problem_type, or, when unset, transformers' rule:
    num_labels == 1 -> "regression": MSE between the squeezed logits [B] and labels [B] (float);
    integer labels -> "single_label_classification": cross-entropy, labels [B] in
    [0, num_labels) or -100 (ignored, as torch's CrossEntropyLoss);
    float labels [B, num_labels] -> "multi_label_classification": mean binary cross-entropy.
    transformers stores the inferred problem_type into its config on the first call; nanobert
    decides per batch and leaves the config alone.
    """
    target_keys = ("labels",)

    @classmethod
    def head_shapes(cls, config):
        return {"classifier.weight": (num_labels(config), config.hidden_size),
                "classifier.bias": (num_labels(config),)}

    def problem_type(self, labels):
        kind = self.config.extra.get("problem_type")
        if kind is not None:
            return kind
        if self.num_labels == 1:
            return "regression"
        return ("single_label_classification" if numpy.issubdtype(numpy.asarray(labels).dtype, numpy.integer)
                else "multi_label_classification")

    def _check_targets(self, batch, host):
        B, C = host["input_ids"].shape[0], self.num_labels
        kind = self.problem_type(to_host(batch["labels"]))
        if kind == "single_label_classification":
            labels = _as_int_array(batch, "labels", "batch")
            if labels.shape not in ((B,), (B, 1)):
                raise _shape_error("labels", labels.shape, [(B,)])
            labels = labels.reshape(B)
            _check_range(labels, "labels", 0, C, allowed=(ops.IGNORE_INDEX,))
            return {"labels": labels.astype(numpy.int64), "problem_type": kind}
        labels = _as_real_array(batch, "labels", "batch")
        if kind == "regression" and C == 1:
            if labels.shape not in ((B,), (B, 1)):   # HF squeezes logits and labels
                raise _shape_error("labels", labels.shape, [(B,)])
            return {"labels": labels.reshape(B), "problem_type": kind}
        if labels.shape != (B, C):
            raise _shape_error("labels", labels.shape, [(B, C)])
        if kind == "multi_label_classification" and ((labels < 0) | (labels > 1)).any():
            index = tuple(int(i) for i in numpy.argwhere((labels < 0) | (labels > 1))[0])
            raise ValueError(f"labels[{', '.join(map(str, index))}] = {labels[index]} is outside [0, 1] "
                             f"(multi-label targets are probabilities)")
        return {"labels": labels, "problem_type": kind}

    def _head_forward(self, sequence, pooled, host):
        x, drop_cache = ops.dropout_forward(pooled, self.classifier_dropout, self.rng, self.training)
        logits, linear_cache = ops.linear_forward(x, self.params["classifier.weight"],
                                                  self.params["classifier.bias"])   # [B, C]
        return logits, (drop_cache, linear_cache)

    def _head_backward(self, dlogits, cache, grads):
        drop_cache, linear_cache = cache
        dx = linear_backward_into(dlogits, linear_cache, grads, "classifier")
        return None, ops.dropout_backward(dx, drop_cache)        # dsequence, dpooled

    def _loss_forward(self, logits, host):
        kind = host["problem_type"]
        float_labels = kind != "single_label_classification"
        labels = to_device(host["labels"], self.xp, logits.dtype if float_labels else None)
        if kind == "single_label_classification":
            loss, cache = ops.cross_entropy_forward(logits, labels)
            return loss, (kind, cache, logits.shape), {"problem_type": kind, "num_counted": cache[-1]}
        if kind == "regression":
            prediction = logits.reshape(labels.shape)                # [B, 1] -> [B] when C == 1
            loss, cache = mse_forward(prediction, labels)
        else:
            loss, cache = bce_with_logits_forward(logits, labels)
        return loss, (kind, cache, logits.shape), {"problem_type": kind}

    def _loss_backward(self, loss_cache):
        kind, cache, shape = loss_cache
        if kind == "single_label_classification":
            return ops.cross_entropy_backward(1.0, cache)
        if kind == "regression":
            return mse_backward(1.0, cache).reshape(shape)
        return bce_with_logits_backward(1.0, cache)

    def _output(self, logits, hidden_states):
        return SequenceClassifierOutput(logits, hidden_states)


class BertForTokenClassification(BertForTask):
    """A label for every position (NER: the first sub-token of each word, -100 on the rest):
    logits = classifier(dropout(sequence_output)), [B, T, num_labels]; cross-entropy over
    the positions whose label is not -100. No pooler, as in transformers. Padding is not
    masked by the loss: label it -100, as HF's data collators do.
    """
    uses_pooler = False
    target_keys = ("labels",)

    @classmethod
    def head_shapes(cls, config):
        return {"classifier.weight": (num_labels(config), config.hidden_size),
                "classifier.bias": (num_labels(config),)}

    def _check_targets(self, batch, host):
        labels = _as_int_array(batch, "labels", "batch")
        if labels.shape != host["input_ids"].shape:
            raise _shape_error("labels", labels.shape, [host["input_ids"].shape])
        _check_range(labels, "labels", 0, self.num_labels, allowed=(ops.IGNORE_INDEX,))
        return {"labels": labels.astype(numpy.int64)}

    def _head_forward(self, sequence, pooled, host):
        x, drop_cache = ops.dropout_forward(sequence, self.classifier_dropout, self.rng, self.training)
        logits, linear_cache = ops.linear_forward(x, self.params["classifier.weight"],
                                                  self.params["classifier.bias"])   # [B, T, C]
        return logits, (drop_cache, linear_cache)

    def _head_backward(self, dlogits, cache, grads):
        drop_cache, linear_cache = cache
        dx = linear_backward_into(dlogits, linear_cache, grads, "classifier")
        return ops.dropout_backward(dx, drop_cache), None

    def _loss_forward(self, logits, host):
        C = logits.shape[-1]
        labels = to_device(host["labels"].reshape(-1), self.xp)
        loss, cache = ops.cross_entropy_forward(logits.reshape(-1, C), labels)   # [B*T, C]
        return loss, (cache, logits.shape), {"num_counted": cache[-1]}

    def _loss_backward(self, loss_cache):
        cache, shape = loss_cache
        return ops.cross_entropy_backward(1.0, cache).reshape(shape)

    def _output(self, logits, hidden_states):
        return TokenClassifierOutput(logits, hidden_states)


class BertForQuestionAnswering(BertForTask):
    """Extractive QA (SQuAD): qa_outputs maps every position to a start and an end logit,
    [B, T] each. No pooler and no dropout on the head, as in transformers.

    loss = (cross-entropy of start_positions + cross-entropy of end_positions) / 2, with
    transformers' rule for positions outside the sequence: each is clamped to [0, T] and
    T is ignored. So a position >= T drops out of its side's mean, and a negative one becomes
    0, the [CLS] position (where SQuAD 2.0 puts "no answer"); outputs count both. Where every
    position of a side is ignored, that side adds 0 (transformers gives NaN).
    """
    uses_pooler = False
    target_keys = ("start_positions", "end_positions")

    def __init__(self, config, seed=0, dtype=numpy.float32, device=None, params=None):
        if isinstance(config, BertConfig) and num_labels(config) != 2:
            raise ValueError(f"BertForQuestionAnswering needs num_labels == 2 (start and end), "
                             f"got {num_labels(config)}")
        super().__init__(config, seed=seed, dtype=dtype, device=device, params=params)

    @classmethod
    def head_shapes(cls, config):
        return {"qa_outputs.weight": (2, config.hidden_size), "qa_outputs.bias": (2,)}

    def _check_targets(self, batch, host):
        B, T = host["input_ids"].shape
        out = {}
        for key in self.target_keys:
            positions = _as_int_array(batch, key, "batch")
            if positions.shape not in ((B,), (B, 1)):
                raise _shape_error(key, positions.shape, [(B,)])
            positions = positions.reshape(B).astype(numpy.int64)
            clamped = numpy.clip(positions, 0, T)
            out[key] = numpy.where(clamped == T, ops.IGNORE_INDEX, clamped)
            out[key + "_clamped_to_0"] = int((positions < 0).sum())
            out[key + "_ignored"] = int((positions >= T).sum())
        return out

    def _head_forward(self, sequence, pooled, host):
        logits, linear_cache = ops.linear_forward(sequence, self.params["qa_outputs.weight"],
                                                  self.params["qa_outputs.bias"])   # [B, T, 2]
        return logits, linear_cache

    def _head_backward(self, dlogits, linear_cache, grads):
        return linear_backward_into(dlogits, linear_cache, grads, "qa_outputs"), None

    def _loss_forward(self, logits, host):
        xp = self.xp
        start_loss, start_cache = ops.cross_entropy_forward(
            logits[..., 0], to_device(host["start_positions"], xp))
        end_loss, end_cache = ops.cross_entropy_forward(
            logits[..., 1], to_device(host["end_positions"], xp))
        outputs = {"start_loss": start_loss, "end_loss": end_loss}
        outputs.update({k: v for k, v in host.items() if k.endswith(("_clamped_to_0", "_ignored"))})
        return (start_loss + end_loss) / 2, (start_cache, end_cache), outputs

    def _loss_backward(self, loss_cache):
        start_cache, end_cache = loss_cache
        dstart = ops.cross_entropy_backward(0.5, start_cache)          # [B, T]
        dend = ops.cross_entropy_backward(0.5, end_cache)
        return self.xp.stack([dstart, dend], axis=-1)                  # [B, T, 2]

    def _output(self, logits, hidden_states):
        return QuestionAnsweringModelOutput(logits[..., 0].copy(), logits[..., 1].copy(), hidden_states)


class BertForMultipleChoice(BertForTask):
    """SWAG-style multiple choice: inputs [B, C, T] (each choice its own A [SEP] B sequence)
    run through BERT as B*C sequences; one score per choice from the pooled [CLS]:
    logits = classifier(dropout(pooler_output)) reshaped to [B, C]; cross-entropy over the
    choices, labels [B] in [0, C) (or -100, ignored). num_labels plays no part here.
    """
    target_keys = ("labels",)
    head_ignores_num_labels = True

    @classmethod
    def head_shapes(cls, config):
        return {"classifier.weight": (1, config.hidden_size), "classifier.bias": (1,)}

    def _inputs(self, input_ids, token_type_ids, attention_mask):
        """[B, C, T] -> [B*C, T] each, and num_choices C."""
        ids = numpy.asarray(to_host(input_ids))
        if ids.ndim != 3:
            raise ValueError(f"inputs: input_ids must be [batch, num_choices, seq_len], "
                             f"got shape {ids.shape}")
        B, C, T = ids.shape
        flat = []
        for key, a in (("token_type_ids", token_type_ids), ("attention_mask", attention_mask)):
            if a is not None:
                a = numpy.asarray(to_host(a))
                if a.shape != ids.shape:
                    raise ValueError(f"inputs: {key} has shape {a.shape} but input_ids has {ids.shape}")
                a = a.reshape(B * C, T)
            flat.append(a)
        host = check_inputs(self.config, ids.reshape(B * C, T), *flat)
        host["num_choices"] = C
        return host

    def _check_targets(self, batch, host):
        B, C = host["input_ids"].shape[0] // host["num_choices"], host["num_choices"]
        labels = _as_int_array(batch, "labels", "batch")
        if labels.shape not in ((B,), (B, 1)):
            raise _shape_error("labels", labels.shape, [(B,)])
        labels = labels.reshape(B)
        _check_range(labels, "labels", 0, C, allowed=(ops.IGNORE_INDEX,))
        return {"labels": labels.astype(numpy.int64)}

    def _head_forward(self, sequence, pooled, host):
        x, drop_cache = ops.dropout_forward(pooled, self.classifier_dropout, self.rng, self.training)
        scores, linear_cache = ops.linear_forward(x, self.params["classifier.weight"],
                                                  self.params["classifier.bias"])   # [B*C, 1]
        return scores.reshape(-1, host["num_choices"]), (drop_cache, linear_cache)  # [B, C]

    def _head_backward(self, dlogits, cache, grads):
        drop_cache, linear_cache = cache
        dx = linear_backward_into(dlogits.reshape(-1, 1), linear_cache, grads, "classifier")
        return None, ops.dropout_backward(dx, drop_cache)

    def _loss_forward(self, logits, host):
        loss, cache = ops.cross_entropy_forward(logits, to_device(host["labels"], self.xp))
        return loss, cache, {"num_counted": cache[-1]}

    def _loss_backward(self, cache):
        return ops.cross_entropy_backward(1.0, cache)

    def _output(self, logits, hidden_states):
        return MultipleChoiceModelOutput(logits, hidden_states)


TASK_HEADS = (BertForSequenceClassification, BertForTokenClassification, BertForQuestionAnswering,
              BertForMultipleChoice)
