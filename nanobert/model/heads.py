"""The fine-tuning heads of BERT (section 4 of the paper), built as transformers builds them,
so that a fine-tuned nanobert checkpoint is a transformers checkpoint and back:

    BertForSequenceClassification   pooled [CLS] -> dropout -> classifier   [B, num_labels]
                                    (single sentences and A [SEP] B pairs; single-label,
                                    multi-label or regression: config.problem_type)
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

Each class is a head on the skeleton of bert.BertPreTrainedModel: it names its parameters
(head_shapes), checks its targets and writes its head and loss as forward/backward pairs.
The label count and names live in config.json (config.num_labels / with_labels).
`from_pretrained` loads the encoder of any BERT checkpoint and starts a missing head fresh.
"""
import dataclasses

import numpy

# `active.x` is the op x of the layer that runs: ops.py's in reference mode, else the fast
# layer's (active.py, the one switch).
from . import active
from .ops import IGNORE_INDEX
from ..backend import to_host
from .pretrained import load_for_task
from ..formats.hub import resolve_model
from .bert import BertPreTrainedModel, labels_padding, linear_backward_into
from .config import BertConfig, num_labels, with_labels
from .params import bias, weight
from .inputs import (as_int_array, as_real_array, check_inputs, check_per_example, check_range,
                     shape_error)

# ----------------------------------------------------------------------------- outputs


@dataclasses.dataclass
class SequenceClassifierOutput:
    logits: object              # [B, num_labels]
    hidden_states: list         # L+1 arrays [B, T, H]
    attentions: tuple = None    # L arrays [B, A, T, T], with output_attentions=True


@dataclasses.dataclass
class TokenClassifierOutput:
    logits: object              # [B, T, num_labels]
    hidden_states: list
    attentions: tuple = None


@dataclasses.dataclass
class QuestionAnsweringModelOutput:
    start_logits: object        # [B, T]
    end_logits: object          # [B, T]
    hidden_states: list
    attentions: tuple = None


@dataclasses.dataclass
class MultipleChoiceModelOutput:
    logits: object              # [B, C]
    hidden_states: list         # L+1 arrays [B*C, T, H]
    attentions: tuple = None    # L arrays [B*C, A, T, T]

# ------------------------------------------------------------------------- the heads


def classifier_forward(params, x, dropout_p, rng, training):
    """The task layer of the paper: dropout, then one dense layer named "classifier".
    x [..., H] -> logits [..., num_labels]."""
    x, dropout = active.dropout_forward(x, dropout_p, rng, training)
    logits, linear = active.linear_forward(x, params["classifier.weight"],
                                           params["classifier.bias"])
    return logits, (dropout, linear)


def classifier_backward(dlogits, cache, grads):
    """dlogits [..., num_labels] -> dx [..., H]."""
    dropout, linear = cache
    dx = linear_backward_into(dlogits, linear, grads, "classifier")
    return active.dropout_backward(dx, dropout)


def counted(host_labels):
    """How many labels the loss counts (not -100), from the host copy: no device read."""
    return int((numpy.asarray(host_labels) != IGNORE_INDEX).sum())


def problem_type_of(config):
    """What a sequence classifier's labels are: config.problem_type when declared, else
    "regression" for one label and "single_label_classification" for more (transformers' rule
    for integer labels). Single-label with one label is refused, as transformers does."""
    count = num_labels(config)
    kind = config.problem_type or ("regression" if count == 1 else "single_label_classification")
    if kind == "single_label_classification" and count == 1:
        raise ValueError("problem_type 'single_label_classification' needs num_labels >= 2 "
                         "(one output: 'regression', or 'multi_label_classification')")
    return kind


class BertForTask(BertPreTrainedModel):
    """What every task head shares: num_labels and label names from config, the classifier
    dropout, and from_pretrained from any BERT checkpoint (model/pretrained.py's load_for_task
    decides what is kept and what starts fresh)."""
    head_ignores_num_labels = False      # True where num_labels plays no part in the head
    counted_keys = ("labels",)           # targets whose cross-entropy divides by their count

    def __init__(self, config, seed=0, dtype=numpy.float32, device=None, params=None):
        if isinstance(config, BertConfig):
            config = with_labels(config)   # saved config.json gets id2label / label2id
        super().__init__(config, seed=seed, dtype=dtype, device=device, params=params)
        self.num_labels = num_labels(config)
        dropout = config.extra.get("classifier_dropout")
        self.classifier_dropout = config.hidden_dropout_prob if dropout is None else float(dropout)
        if not 0.0 <= self.classifier_dropout < 1.0:
            raise ValueError(f"classifier_dropout must be in [0, 1), got {dropout}")

    def _cross_entropy(self, logits, host, key, shape=None):
        """layer.cross_entropy_forward of logits against the targets host[key] (reshaped to
        `shape` if given), divided by how many of them count (not -100): from the host copy,
        or, in a step replayed from a CUDA graph (training/graph.py), from host["count/<key>"],
        a device count given each step."""
        labels = self._device(host, key)
        labels = labels if shape is None else labels.reshape(shape)
        count = host.get("count/" + key)
        if count is not None:
            return active.cross_entropy_forward(logits, labels, denominator=count)
        return active.cross_entropy_forward(logits, labels, count=counted(host[key]))

    def graph_counts(self, host):
        """check_batch's dict -> the "count/<key>" entries _cross_entropy reads in a step
        replayed from a CUDA graph: each counted target's count (at least 1, as a mean over
        no label divides by 1), a 0-d host array."""
        return {"count/" + key: numpy.asarray(max(counted(host[key]), 1))
                for key in self.counted_keys if key in host}

    def _classifier_forward(self, x):
        return classifier_forward(self.weights, x, self.classifier_dropout, self.rng,
                                  self.training)

    @classmethod
    def from_pretrained(cls, path, num_labels=None, id2label=None, reinit_head=False,
                        dtype=numpy.float32, device=None, seed=0, problem_type=None):
        """Load the encoder from any BERT checkpoint folder (config.json + model.safetensors):
        with or without the `bert.` prefix, with or without a pooler, with or without heads.

        Tensors of other heads (cls.* of a pretraining checkpoint, a classifier the task does
        not use) and a pooler this class does not use are ignored; a missing head and a
        missing pooler are initialised fresh (truncated normal(initializer_range), bias 0,
        from `seed`). Both are reported on stdout, as transformers warns. A head whose number
        of labels differs from num_labels is a ValueError; reinit_head=True starts a fresh head
        instead (whether or not its shape matches). problem_type, when given, replaces the
        checkpoint's (BertForSequenceClassification's loss).
        """
        config, params = load_for_task(cls, resolve_model(path), num_labels, id2label,
                                       reinit_head, seed, problem_type)
        model = cls(config, seed=seed, dtype=dtype, device=device, params=params)
        return model.eval()


class BertForSequenceClassification(BertForTask):
    """Classification (or regression) of a single sentence or an A [SEP] B pair from the
    pooled [CLS]: logits = classifier(dropout(pooler_output)), [B, num_labels].

    The loss follows config.problem_type (transformers' names and loss rules):
    "single_label_classification": cross-entropy, labels [B] class ids in [0, num_labels) or
    -100 (ignored, as torch's CrossEntropyLoss);
    "multi_label_classification": mean binary cross-entropy with logits, labels [B, num_labels]
    in [0, 1] (1: the example has that label);
    "regression": MSE between the logits and real labels, [B] when num_labels == 1 (HF
    squeezes both), else [B, num_labels].
    Undeclared (None: a config.json without it), the type is decided when the model is built,
    by problem_type_of: "regression" when num_labels == 1, else "single_label_classification";
    the config keeps it, so config.json says it. transformers decides on the first batch instead
    (float labels -> multi-label), so one labelled example in float would change the task; here
    a batch whose labels do not fit the type is a ValueError that names it.
    """
    target_keys = ("labels",)

    def __init__(self, config, seed=0, dtype=numpy.float32, device=None, params=None):
        if isinstance(config, BertConfig):
            config = dataclasses.replace(config, problem_type=problem_type_of(config))
        super().__init__(config, seed=seed, dtype=dtype, device=device, params=params)
        self.problem_type = self.config.problem_type

    @classmethod
    def head_shapes(cls, config):
        return {"classifier.weight": weight(num_labels(config), config.hidden_size),
                "classifier.bias": bias(num_labels(config))}

    def _check_targets(self, batch, host):
        B, C, kind = host["input_ids"].shape[0], self.num_labels, self.problem_type
        labels = numpy.asarray(to_host(batch["labels"]))
        fits = {"single_label_classification": ([(B,), (B, 1)], "integer class ids"),
                "multi_label_classification": ([(B, C)], "0/1 targets, one per label"),
                "regression": ([(B,), (B, 1)] if C == 1 else [(B, C)], "real numbers")}
        shapes, what = fits[kind]
        class_ids = kind != "single_label_classification" or numpy.issubdtype(labels.dtype,
                                                                              numpy.integer)
        if labels.shape not in shapes or not class_ids:
            raise ValueError(
                f"batch: labels {labels.dtype} {labels.shape} do not fit the model's problem_type "
                f"{kind!r} ({what}, shape {' or '.join(map(str, shapes))}); another task declares "
                "its own: config.problem_type, or from_pretrained(..., problem_type=...)")
        if kind == "single_label_classification":
            labels = check_per_example(batch, "labels", B, 0, C, allowed=(IGNORE_INDEX,))
            return {"labels": labels, "problem_type": kind}
        labels = as_real_array(batch, "labels", "batch")
        if kind == "multi_label_classification" and ((labels < 0) | (labels > 1)).any():
            index = tuple(int(i) for i in numpy.argwhere((labels < 0) | (labels > 1))[0])
            raise ValueError(f"labels[{', '.join(map(str, index))}] = {labels[index]} is outside "
                             f"[0, 1] (multi-label targets are probabilities)")
        return {"labels": labels.reshape(shapes[0]), "problem_type": kind}

    def _head_forward(self, sequence, pooled, host):
        return self._classifier_forward(pooled)                        # [B, C]

    def _head_backward(self, dlogits, cache, grads):
        return None, classifier_backward(dlogits, cache, grads)        # dsequence, dpooled

    def _loss_forward(self, logits, host, denominators=None):
        kind = host["problem_type"]
        if kind == "single_label_classification":
            loss, cache = self._cross_entropy(logits, host, "labels")
            outputs = {"logits": logits, "problem_type": kind, "num_counted": cache.count}
            return loss, (kind, cache, logits.shape), outputs
        labels = self._device(host, "labels", logits.dtype)
        if kind == "regression":
            prediction = logits.reshape(labels.shape)                # [B, 1] -> [B] when C == 1
            loss, cache = active.mse_forward(prediction, labels)
        else:
            loss, cache = active.bce_with_logits_forward(logits, labels)
        return loss, (kind, cache, logits.shape), {"logits": logits, "problem_type": kind}

    def _loss_backward(self, loss_cache, dloss=1.0):
        kind, cache, shape = loss_cache
        if kind == "single_label_classification":
            return active.cross_entropy_backward(dloss, cache)
        if kind == "regression":
            return active.mse_backward(dloss, cache).reshape(shape)
        return active.bce_with_logits_backward(dloss, cache)

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
        return {"classifier.weight": weight(num_labels(config), config.hidden_size),
                "classifier.bias": bias(num_labels(config))}

    def _check_targets(self, batch, host):
        labels = as_int_array(batch, "labels", "batch")
        if labels.shape != host["input_ids"].shape:
            raise shape_error("labels", labels.shape, [host["input_ids"].shape])
        check_range(labels, "labels", 0, self.num_labels, allowed=(IGNORE_INDEX,))
        return {"labels": labels.astype(numpy.int64)}

    def _reads_padding(self, host):
        return labels_padding(host)

    def _head_forward(self, sequence, pooled, host):
        return self._classifier_forward(sequence)                      # [B, T, C]

    def _head_backward(self, dlogits, cache, grads):
        return classifier_backward(dlogits, cache, grads), None

    def _loss_forward(self, logits, host, denominators=None):
        C = logits.shape[-1]
        loss, cache = self._cross_entropy(logits.reshape(-1, C), host, "labels", -1)  # [B*T, C]
        return loss, (cache, logits.shape), {"logits": logits, "num_counted": cache.count}

    def _loss_backward(self, loss_cache, dloss=1.0):
        cache, shape = loss_cache
        return active.cross_entropy_backward(dloss, cache).reshape(shape)

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
    counted_keys = target_keys

    def __init__(self, config, seed=0, dtype=numpy.float32, device=None, params=None):
        if isinstance(config, BertConfig) and num_labels(config) != 2:
            raise ValueError(f"BertForQuestionAnswering needs num_labels == 2 (start and end), "
                             f"got {num_labels(config)}")
        super().__init__(config, seed=seed, dtype=dtype, device=device, params=params)

    @classmethod
    def head_shapes(cls, config):
        return {"qa_outputs.weight": weight(2, config.hidden_size), "qa_outputs.bias": bias(2)}

    def _check_targets(self, batch, host):
        B, T = host["input_ids"].shape
        out = {}
        for key in self.target_keys:
            positions = as_int_array(batch, key, "batch")
            if positions.shape not in ((B,), (B, 1)):
                raise shape_error(key, positions.shape, [(B,)])
            positions = positions.reshape(B).astype(numpy.int64)
            clamped = numpy.clip(positions, 0, T)
            out[key] = numpy.where(clamped == T, IGNORE_INDEX, clamped)
            out[key + "_clamped_to_0"] = int((positions < 0).sum())
            out[key + "_ignored"] = int((positions >= T).sum())
        return out

    def _reads_padding(self, host):
        """Always: each side's softmax runs over every position, the padded ones too (as
        the original BERT and transformers), so their logits count."""
        return True

    def _head_forward(self, sequence, pooled, host):
        logits, linear_cache = active.linear_forward(sequence, self.weights["qa_outputs.weight"],
                                                     self.weights["qa_outputs.bias"])   # [B, T, 2]
        return logits, linear_cache

    def _head_backward(self, dlogits, linear_cache, grads):
        return linear_backward_into(dlogits, linear_cache, grads, "qa_outputs"), None

    def _loss_forward(self, logits, host, denominators=None):
        start_loss, start_cache = self._cross_entropy(logits[..., 0], host, "start_positions")
        end_loss, end_cache = self._cross_entropy(logits[..., 1], host, "end_positions")
        outputs = {"start_loss": start_loss, "end_loss": end_loss,
                   "start_logits": logits[..., 0].copy(), "end_logits": logits[..., 1].copy()}
        counts = ("_clamped_to_0", "_ignored")
        outputs.update({k: v for k, v in host.items() if k.endswith(counts)})
        return (start_loss + end_loss) / 2, (start_cache, end_cache), outputs

    def _loss_backward(self, loss_cache, dloss=1.0):
        start_cache, end_cache = loss_cache
        dstart = active.cross_entropy_backward(0.5 * dloss, start_cache)  # [B, T]
        dend = active.cross_entropy_backward(0.5 * dloss, end_cache)
        return self.xp.stack([dstart, dend], axis=-1)                  # [B, T, 2]

    def _output(self, logits, hidden_states):
        return QuestionAnsweringModelOutput(logits[..., 0].copy(), logits[..., 1].copy(),
                                            hidden_states)


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
        return {"classifier.weight": weight(1, config.hidden_size), "classifier.bias": bias(1)}

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
                    raise ValueError(f"inputs: {key} has shape {a.shape} "
                                     f"but input_ids has {ids.shape}")
                a = a.reshape(B * C, T)
            flat.append(a)
        host = check_inputs(self.config, ids.reshape(B * C, T), *flat)
        host["num_choices"] = C
        return host

    def _check_targets(self, batch, host):
        B, C = host["input_ids"].shape[0] // host["num_choices"], host["num_choices"]
        labels = check_per_example(batch, "labels", B, 0, C, allowed=(IGNORE_INDEX,))
        return {"labels": labels}

    def _head_forward(self, sequence, pooled, host):
        scores, cache = self._classifier_forward(pooled)               # [B*C, 1]
        return scores.reshape(-1, host["num_choices"]), cache          # [B, C]

    def _head_backward(self, dlogits, cache, grads):
        return None, classifier_backward(dlogits.reshape(-1, 1), cache, grads)

    def _loss_forward(self, logits, host, denominators=None):
        loss, cache = self._cross_entropy(logits, host, "labels")
        return loss, cache, {"logits": logits, "num_counted": cache.count}

    def _loss_backward(self, cache, dloss=1.0):
        return active.cross_entropy_backward(dloss, cache)

    def _output(self, logits, hidden_states):
        return MultipleChoiceModelOutput(logits, hidden_states)


TASK_HEADS = (BertForSequenceClassification, BertForTokenClassification, BertForQuestionAnswering,
              BertForMultipleChoice)
