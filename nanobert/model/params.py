"""The parameter table of BERT: every tensor's Hugging Face name and shape, and the original
initialisation. Models, checkpoints and the optimizer all key on these names."""
import numpy


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
