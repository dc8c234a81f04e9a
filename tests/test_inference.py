"""Inference, the one forward with cache=False (bert.bert_forward; each fast op on its no-cache
path), which the models' __call__ and loss() run, against the same forward keeping the caches
the backward uses, in eval mode, for the bare encoder and every head, float32 and
float64, with arrays large enough to be split over the thread pool: bitwise equal outputs
without trailing padding, within a rounding bound with rows of mixed lengths (the
attention skips each row's padded keys); the attention probabilities it returns on
request; and the memory it saves (tracemalloc peaks, recorded).
"""
import tracemalloc

import numpy
import pytest

from conftest import record
from nanobert.model import bert
from nanobert.model.bert import BertModel
from nanobert.model.config import BertConfig
from nanobert.model.heads import (BertForMultipleChoice, BertForQuestionAnswering,
                                  BertForSequenceClassification, BertForTokenClassification)
from nanobert.model.pretraining import BertForPreTraining

# scores [4, 4, 96, 96] and the intermediate [4, 96, 256] pass threads.MIN_PARALLEL
CONFIG = dict(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=256, max_position_embeddings=128)
MODELS = (BertModel, BertForPreTraining, BertForSequenceClassification,
          BertForTokenClassification, BertForQuestionAnswering, BertForMultipleChoice)


def inputs(B=4, T=96, choices=None, seed=0):
    """Random ids with a spread of lengths (padding after each row's length), pairs of
    segments; [B, choices, T] for multiple choice."""
    rng = numpy.random.default_rng(seed)
    shape = (B, T) if choices is None else (B, choices, T)
    lengths = rng.integers(T // 2, T + 1, size=shape[:-1])
    mask = (numpy.arange(T) < lengths[..., None]).astype(numpy.int64)
    ids = rng.integers(5, CONFIG["vocab_size"], size=shape) * mask
    types = (numpy.arange(T) >= lengths[..., None] // 2) * mask
    return ids, types, mask


def outputs_of(out):
    """Every array of an output object: logits (or start/end logits), pooler_output, and
    each hidden state."""
    arrays = {k: v for k, v in vars(out).items() if k != "hidden_states" and v is not None}
    arrays.update({f"hidden_states[{i}]": h for i, h in enumerate(out.hidden_states)})
    return arrays


def training_path_call(model, args):
    """__call__ on the forward that keeps its caches (cache=True), as loss_and_grads runs it."""
    host = model._inputs(*args)
    if isinstance(model, BertModel):
        return model._encode(host, cache=True)[0]
    forward = model._forward(host, cache=True)
    return model._output(forward.logits, forward.hidden_states)


# The inference path's attention stops at each row's last attended key: the padded keys'
# probabilities are exactly 0 either way, so only the order of the roundings differs
# (softmax sum, context dot products). Relative to the largest value of each output;
# measured over these tests: float32 3.0e-7, float64 4.6e-16 (attentions 5.6e-9, 6.9e-18).
PADDED_BOUND = {numpy.float32: 1e-5, numpy.float64: 1e-13}


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
@pytest.mark.parametrize("cls", MODELS, ids=lambda c: c.__name__)
def test_inference_equals_the_training_forward_in_eval_mode(cls, dtype, padded):
    """Bitwise without trailing padding; with it, within PADDED_BOUND."""
    model = cls(BertConfig(**CONFIG), seed=1, dtype=dtype).eval()
    ids, types, mask = inputs(choices=2 if cls is BertForMultipleChoice else None)
    if not padded:
        mask = numpy.ones_like(mask)
    fast = outputs_of(model(ids, types, mask))
    slow = outputs_of(training_path_call(model, (ids, types, mask)))
    assert fast.keys() == slow.keys()
    for name, value in slow.items():
        assert fast[name].dtype == value.dtype, name
        error = numpy.abs(fast[name].astype(float) - value).max() / numpy.abs(value).max()
        where = f"{cls.__name__} {numpy.dtype(dtype)} {name}"
        if not padded:
            assert error == 0, f"{where}: not bitwise equal, relative error {error:.3e}"
            continue
        record(f"inference vs training forward, padded, {numpy.dtype(dtype)} (relative)", error)
        assert error <= PADDED_BOUND[dtype], f"{where}: relative error {error:.3e}"


def test_loss_in_eval_mode_keeps_no_cache_and_equals_loss_and_grads(monkeypatch):
    model = BertForSequenceClassification(BertConfig(**CONFIG), seed=2).eval()
    ids, types, mask = inputs()
    batch = {"input_ids": ids, "token_type_ids": types, "attention_mask": numpy.ones_like(mask),
             "labels": numpy.array([0, 1, 1, 0])}
    ref_loss, _, ref_outputs = model.loss_and_grads(batch, return_outputs=True)

    forward = bert.bert_forward

    def no_cache_forward(*args, cache=True, **kwargs):
        assert not cache, "loss() asked the encoder for a cache"
        return forward(*args, cache=cache, **kwargs)
    monkeypatch.setattr(bert, "bert_forward", no_cache_forward)
    loss, outputs = model.loss(batch, return_outputs=True)
    assert loss == ref_loss
    assert numpy.array_equal(outputs["logits"], ref_outputs["logits"])


def test_training_mode_call_still_draws_dropout():
    model = BertModel(BertConfig(**CONFIG, hidden_dropout_prob=0.5), seed=3).train()
    args = inputs()
    first, second = model(*args).last_hidden_state, model(*args).last_hidden_state
    assert not numpy.array_equal(first, second)


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_attention_probabilities_are_each_layers_masked_softmax(dtype):
    model = BertModel(BertConfig(**CONFIG), seed=4, dtype=dtype).eval()
    ids, types, mask = inputs(seed=5)
    out, kept = bert.bert_forward(model.params, "", ids, types, mask, model.config, None, False,
                                  cache=False, output_attentions=True)
    assert kept is None
    attentions = out.attentions
    _, cache = bert.bert_forward(model.params, "", ids, types, mask, model.config, None, False)
    B, T = ids.shape
    assert len(attentions) == CONFIG["num_hidden_layers"]
    for probs, layer in zip(attentions, cache.layers):
        assert probs.shape == (B, CONFIG["num_attention_heads"], T, T)
        error = record(f"inference attentions vs training forward's {numpy.dtype(dtype)}",
                       numpy.abs(probs - layer.attention.probs).max())
        assert error <= PADDED_BOUND[dtype]
        assert not probs[numpy.broadcast_to(mask[:, None, None, :] == 0, probs.shape)].any()
    assert bert.bert_forward(model.params, "", ids, types, mask, model.config, None, False,
                             cache=False)[0].attentions is None


def peak_bytes(function):
    tracemalloc.start()
    try:
        function()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_inference_allocates_less_than_the_training_forward():
    """tracemalloc peak of one call, L=4 H=128 I=512 A=4, batch 8 x 128, float32: the
    inference path frees each layer's temporaries and computes in place; the forward for the
    backward keeps every layer's cache until the call returns."""
    config = BertConfig(**{**CONFIG, "num_hidden_layers": 4, "hidden_size": 128,
                           "intermediate_size": 512})
    model = BertModel(config, seed=6).eval()
    args = inputs(B=8, T=128)
    inference = peak_bytes(lambda: model(*args))
    forward = peak_bytes(lambda: training_path_call(model, args))
    record("inference peak / training-forward peak (tracemalloc, L4 H128 B8 T128)",
           inference / forward)
    print(f"tracemalloc peak: inference {inference / 2**20:.1f} MiB, "
          f"training forward {forward / 2**20:.1f} MiB")
    assert inference < 0.6 * forward
