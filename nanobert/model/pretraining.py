"""BERT's pretraining heads (section 3.1 of the paper) and BertForPreTraining.

    masked LM:   sequence_output at the masked positions -> dense + GELU + LayerNorm
                 -> logits = x @ word_embeddings.T + bias   (decoder tied to the input table)
    NSP:         pooled [CLS] -> cls.seq_relationship -> 2 logits (0: B follows A, 1: random)
    loss:        MLM mean cross-entropy + NSP mean cross-entropy

Both heads are op pairs with the encoder's calling convention (bert.py); BertForPreTraining
plugs them into the same skeleton as every fine-tuning head.
"""
import dataclasses

import numpy

# `active.x` is the op x of the layer that runs: ops.py's in reference mode, else the fast
# layer's (active.py, the one switch).
from . import active
from .ops import IGNORE_INDEX, softmax_forward
from ..backend import array_module
from .bert import (BertPreTrainedModel, cache_fields, labels_padding, layernorm_backward_into,
                   linear_backward_into, linear_gelu_backward_into, norm_forward)
from .inputs import as_int_array, check_range
from .params import bias, norm_shapes, weight


def pretraining_head_shapes(config):
    """The MLM transform + output bias (its decoder weight is the tied word embedding
    table, so it has no entry of its own) and the NSP classifier."""
    H = config.hidden_size
    return {
        "cls.predictions.bias": bias(config.vocab_size),
        "cls.predictions.transform.dense.weight": weight(H, H),
        "cls.predictions.transform.dense.bias": bias(H),
        **norm_shapes("cls.predictions.transform.LayerNorm", config),
        "cls.seq_relationship.weight": weight(2, H),
        "cls.seq_relationship.bias": bias(2),
    }

# ------------------------------------------------------------------------ masked LM head


@cache_fields
class MLMCache:
    prefix: str                # the encoder's, for the tied word-embedding table
    dense: tuple               # linear_gelu: the transform's dense layer and its GELU
    layernorm: tuple
    decoder: tuple
    positions: object          # [M] indices into B*T
    sequence_shape: tuple      # [B, T, H]


def mlm_head_forward(params, prefix, sequence_output, positions, config):
    """Masked-LM logits at the masked positions only, as the original (gather first: the
    [M, V] vocabulary projection is the costliest matmul, so skip the unmasked rows).

    sequence_output [B, T, H], positions [M] indices into B*T -> logits [M, V].
    The decoder is the encoder's word-embedding table (prefix + "embeddings...") itself,
    plus an output bias.
    """
    H = sequence_output.shape[-1]
    x = sequence_output.reshape(-1, H)[positions]                  # [M, H]
    t = "cls.predictions.transform."
    x, dense = active.linear_gelu_forward(x, params[t + "dense.weight"], params[t + "dense.bias"],
                                          config.hidden_act)
    x, layernorm = norm_forward(params, t + "LayerNorm", x, config)
    logits, decoder = active.linear_forward(x, params[prefix + "embeddings.word_embeddings.weight"],
                                            params["cls.predictions.bias"])
    cache = MLMCache(prefix=prefix, dense=dense, layernorm=layernorm, decoder=decoder,
                     positions=positions, sequence_shape=sequence_output.shape)
    return logits, cache


def mlm_head_backward(dlogits, cache, grads):
    """dlogits [M, V] -> dsequence_output [B, T, H] (zero except at the masked positions)."""
    xp = array_module(dlogits)
    # The tied decoder writes the dense word-embedding gradient; the lookup adds to it later.
    dx, _, _ = active.linear_backward(dlogits, cache.decoder,
                                      grads[cache.prefix + "embeddings.word_embeddings.weight"],
                                      grads["cls.predictions.bias"])
    dx = layernorm_backward_into(dx, cache.layernorm, grads, "cls.predictions.transform.LayerNorm")
    dx = linear_gelu_backward_into(dx, cache.dense, grads, "cls.predictions.transform.dense")
    B, T, H = cache.sequence_shape
    dsequence = xp.zeros((B * T, H), dtype=dx.dtype)
    dsequence[cache.positions] = dx                                # positions are distinct
    return dsequence.reshape(B, T, H)

# ------------------------------------------------------------------------------ NSP head


def nsp_head_forward(params, pooled_output):
    """pooled_output [B, H] -> NSP logits [B, 2]."""
    return active.linear_forward(pooled_output, params["cls.seq_relationship.weight"],
                                 params["cls.seq_relationship.bias"])


def nsp_head_backward(dlogits, cache, grads):
    """dlogits [B, 2] -> dpooled_output [B, H]."""
    return linear_backward_into(dlogits, cache, grads, "cls.seq_relationship")

# ------------------------------------------------------------------------ fill-mask


def top_k_at_masks(prediction_logits, input_ids, mask_token_id, top_k=5):
    """The masked LM's guesses for one sequence, as transformers' fill-mask pipeline makes
    them: the softmax over the whole vocabulary at each [MASK] position, its top_k entries.

    prediction_logits [T, V] (host), input_ids [T] -> one (position, ids [k], probabilities
    [k]) per [MASK], left to right, each most likely first."""
    input_ids = numpy.asarray(input_ids)
    guesses = []
    for position in numpy.flatnonzero(input_ids == mask_token_id):
        logits = numpy.asarray(prediction_logits[position], dtype=numpy.float64)   # [V]
        probs, _ = softmax_forward(logits)
        ids = numpy.argsort(-probs, kind="stable")[:top_k]
        guesses.append((int(position), ids, probs[ids]))
    return guesses

# ---------------------------------------------------------------------------- the model


@dataclasses.dataclass
class BertForPreTrainingOutput:
    prediction_logits: object          # [B, T, V]
    seq_relationship_logits: object    # [B, 2]
    hidden_states: list
    attentions: tuple = None           # L arrays [B, A, T, T], with output_attentions=True


class BertForPreTraining(BertPreTrainedModel):
    """BERT + the masked-LM and next-sentence heads; loss = MLM mean + NSP mean.

    batch: input_ids, token_type_ids, attention_mask, labels [B, T] (the original token at
    a masked position, -100 elsewhere), next_sentence_label [B] (optional; without it the
    loss is MLM alone and the NSP head gets zero gradients).
    """
    target_keys = ("labels",)
    takes_denominators = True

    @classmethod
    def head_shapes(cls, config):
        return pretraining_head_shapes(config)

    def _check_targets(self, batch, host):
        B, T = host["input_ids"].shape
        labels = as_int_array(batch, "labels", "batch")
        if labels.shape != (B, T):
            raise ValueError(f"batch: labels has shape {labels.shape} but input_ids has {(B, T)}")
        check_range(labels, "labels", 0, self.config.vocab_size, allowed=(IGNORE_INDEX,))
        flat_labels = labels.reshape(-1).astype(numpy.int64)
        positions = numpy.flatnonzero(flat_labels != IGNORE_INDEX)   # sorted, [M]
        targets = {"labels": labels.astype(numpy.int64), "masked_lm_positions": positions,
                   "masked_lm_ids": flat_labels[positions], "num_masked": len(positions)}
        if batch.get("next_sentence_label") is not None:
            nsp = as_int_array(batch, "next_sentence_label", "batch")
            if nsp.shape != (B,):
                raise ValueError(f"batch: next_sentence_label has shape {nsp.shape}, "
                                 f"expected {(B,)}")
            check_range(nsp, "next_sentence_label", 0, 2, allowed=(IGNORE_INDEX,))
            targets["next_sentence_label"] = nsp.astype(numpy.int64)
            targets["num_next_sentence"] = int((nsp != IGNORE_INDEX).sum())
        return targets

    def _reads_padding(self, host):
        """NSP reads the first position (the pooler); the MLM loss each labelled one."""
        return super()._reads_padding(host) or labels_padding(host)

    def _head_forward(self, sequence, pooled, host):
        """-> (MLM logits [M, V] at the masked positions, or [B*T, V] at inference;
        NSP logits [B, 2])."""
        B, T, _ = sequence.shape
        positions = host.get("masked_lm_positions")
        positions = (self.xp.arange(B * T) if positions is None
                     else self._device(host, "masked_lm_positions"))
        mlm_logits, mlm_cache = mlm_head_forward(self.weights, self.base_prefix, sequence,
                                                 positions, self.config)
        nsp_logits, nsp_cache = nsp_head_forward(self.weights, pooled)
        return (mlm_logits, nsp_logits), (mlm_cache, nsp_cache)

    def _head_backward(self, dlogits, cache, grads):
        (dmlm, dnsp), (mlm_cache, nsp_cache) = dlogits, cache
        dsequence = mlm_head_backward(dmlm, mlm_cache, grads)
        dpooled = None if dnsp is None else nsp_head_backward(dnsp, nsp_cache, grads)
        return dsequence, dpooled

    def _loss_forward(self, logits, host, denominators=None):
        mlm_logits, nsp_logits = logits
        denominators = denominators or {}
        # Counts come from the host labels and accuracies stay device scalars: no host wait.
        num_masked = host["num_masked"]
        mlm_labels = self._device(host, "masked_lm_ids")
        mlm_loss, mlm_cache = active.cross_entropy_forward(mlm_logits, mlm_labels,
                                                           denominators.get("masked_lm"),
                                                           count=num_masked)
        outputs = {"mlm_loss": mlm_loss, "nsp_loss": None, "mlm_logits": mlm_logits,
                   "nsp_logits": None, "num_masked": num_masked,
                   "mlm_correct": (mlm_logits.argmax(-1) == mlm_labels).sum()}
        if "next_sentence_label" not in host:
            return mlm_loss, (mlm_cache, None), outputs
        nsp_labels = self._device(host, "next_sentence_label")
        nsp_loss, nsp_cache = active.cross_entropy_forward(
            nsp_logits, nsp_labels, denominators.get("next_sentence"),
            count=host["num_next_sentence"])
        outputs.update(nsp_loss=nsp_loss, nsp_logits=nsp_logits,
                       nsp_correct=(nsp_logits.argmax(-1) == nsp_labels).sum())
        return mlm_loss + nsp_loss, (mlm_cache, nsp_cache), outputs

    def _loss_backward(self, cache, dloss=1.0):
        mlm_cache, nsp_cache = cache
        dnsp = None if nsp_cache is None else active.cross_entropy_backward(dloss, nsp_cache)
        return active.cross_entropy_backward(dloss, mlm_cache), dnsp

    def _output(self, logits, hidden_states):
        mlm_logits, nsp_logits = logits                    # inference: every position
        B, T, _ = hidden_states[-1].shape
        return BertForPreTrainingOutput(mlm_logits.reshape(B, T, -1), nsp_logits, hidden_states)
