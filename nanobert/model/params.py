"""The parameter table of BERT: every tensor's Hugging Face name and shape, declared with how
it starts and whether weight decay applies to it. Models, checkpoints and the optimizer all key
on these names; nothing reads a parameter's role from its name."""
import numpy


class Param(tuple):
    """A parameter's shape (the tuple itself: a table of Params is a table of shapes) and what
    the model declares with it: `init`, how it starts ("normal": a truncated normal of
    initializer_range; "ones"; "zeros"), and `decay`, whether AdamW's weight decay applies
    (the original decays matrices and tables, not LayerNorm's gain and shift nor biases)."""

    def __new__(cls, shape, init="normal", decay=True):
        param = super().__new__(cls, shape)
        param.init, param.decay = init, decay
        return param


def weight(*shape):
    """A matrix or an embedding table: truncated normal, decayed."""
    return Param(shape)


def bias(size):
    """A bias, or LayerNorm's shift (beta): zeros, not decayed."""
    return Param((size,), "zeros", decay=False)


def gain(size):
    """LayerNorm's gain (gamma): ones, not decayed."""
    return Param((size,), "ones", decay=False)


def norm_shapes(name, config):
    """The parameters of the normalisation called `name` ("embeddings.LayerNorm", ...): the one
    place they are declared, as bert.norm_forward is the one place that names the op; a
    variant of the norm reads its choice from config here and there."""
    H = config.hidden_size
    return {name + ".weight": gain(H), name + ".bias": bias(H)}


def bert_param_shapes(config, prefix="", pooler=True):
    """HF names -> Params (shapes) of the encoder (BertModel): embeddings, layers and (unless
    pooler=False, as HF's token-classification and QA models) the pooler."""
    H, I = config.hidden_size, config.intermediate_size
    shapes = {
        "embeddings.word_embeddings.weight": weight(config.vocab_size, H),
        "embeddings.position_embeddings.weight": weight(config.max_position_embeddings, H),
        "embeddings.token_type_embeddings.weight": weight(config.type_vocab_size, H),
        **norm_shapes("embeddings.LayerNorm", config),
    }
    for i in range(config.num_hidden_layers):
        layer = f"encoder.layer.{i}."
        for proj in ("query", "key", "value"):
            shapes[layer + f"attention.self.{proj}.weight"] = weight(H, H)
            shapes[layer + f"attention.self.{proj}.bias"] = bias(H)
        shapes.update({
            layer + "attention.output.dense.weight": weight(H, H),
            layer + "attention.output.dense.bias": bias(H),
            **norm_shapes(layer + "attention.output.LayerNorm", config),
            layer + "intermediate.dense.weight": weight(I, H),
            layer + "intermediate.dense.bias": bias(I),
            layer + "output.dense.weight": weight(H, I),
            layer + "output.dense.bias": bias(H),
            **norm_shapes(layer + "output.LayerNorm", config),
        })
    if pooler:
        shapes["pooler.dense.weight"] = weight(H, H)
        shapes["pooler.dense.bias"] = bias(H)
    return {prefix + name: shape for name, shape in shapes.items()}


def decays(shapes):
    """name -> whether AdamW's weight decay applies, as each Param declares (AdamW(decay=))."""
    return {name: shape.decay for name, shape in shapes.items()}


def truncated_normal(rng, shape, std):
    """N(0, std) redrawn outside two standard deviations, as TF's truncated_normal."""
    x = rng.standard_normal(shape)
    outside = numpy.abs(x) > 2.0
    while outside.any():
        x[outside] = rng.standard_normal(int(outside.sum()))
        outside = numpy.abs(x) > 2.0
    return x * std


def init_params(shapes, config, seed):
    """Original BERT init on the host, as each Param declares: "normal" (matrices, embedding
    tables) from a truncated normal(initializer_range), "ones" (LayerNorm's gain), "zeros"
    (biases). Returns float64 NumPy arrays."""
    rng = numpy.random.default_rng(seed)
    params = {}
    for name, shape in shapes.items():
        if shape.init == "ones":
            params[name] = numpy.ones(shape)
        elif shape.init == "zeros":
            params[name] = numpy.zeros(shape)
        elif shape.init == "normal":
            params[name] = truncated_normal(rng, shape, config.initializer_range)
        else:
            raise ValueError(f"{name}: init must be normal, ones or zeros, got {shape.init!r}")
    return params


QKV = ("query", "key", "value")


def buffer_order(shapes):
    """The parameter table in flat-buffer order: the table's own, except that each layer's
    query, key and value weights are adjacent, then their three biases, so that the stacked
    [3H, H] projection and its [3H] bias (one matmul for all three) are views, not copies."""
    ordered = {}
    for name, shape in shapes.items():
        if name.endswith("attention.self.query.weight"):
            prefix = name[:-len("query.weight")]
            for kind in ("weight", "bias"):
                ordered.update({f"{prefix}{proj}.{kind}": shapes[f"{prefix}{proj}.{kind}"]
                                for proj in QKV})
        elif name not in ordered:
            ordered[name] = shape
    return ordered
