"""Packing (nanobert/model/packing.py): the encoder run on the attended tokens only.

Against the same model run on the padded batch (model.packs = False), float64, on batches
hypothesis draws (right padding and holes, rows attending to [CLS] alone): the attended
positions' hidden states, the pooler, the logits, the loss and every parameter gradient are
equal up to summation order; every padded position's hidden state is exactly 0. And the
cases where packing would change what a loss reads run padded: QA, a token label on the
padding, a pooler over a padded first position; as do float16, the attention maps, and a
batch without padding.
"""
import numpy
import pytest
from hypothesis import given, settings, strategies as st

from conftest import assert_close, attended, record, vanishes
from nanobert.model.bert import BertModel
from nanobert.model.flops import step_flops
from nanobert.model.heads import (BertForMultipleChoice, BertForQuestionAnswering,
                                  BertForSequenceClassification, BertForTokenClassification)
from nanobert.model.packing import pack, packing_of, unpack
from nanobert.model.pretraining import BertForPreTraining
from nanobert.testing import make_batch, tiny_bert_config

TOL = 1e-12
PACKED = {"pretraining": BertForPreTraining, "sequence_classification":
          BertForSequenceClassification, "token_classification": BertForTokenClassification,
          "multiple_choice": BertForMultipleChoice}


def drawn_batch(seed, task, B, T, config):
    """make_batch's batch (padding with holes, row 0 attending to [CLS] alone), with the
    pretraining labels moved off the padding, where the loss would read them."""
    batch = make_batch(numpy.random.default_rng(seed), config, task, B, T, num_choices=2)
    if task == "pretraining":
        batch["labels"][batch["attention_mask"] == 0] = -100
    return batch


def perturbed(cls, config, seed):
    """A float64 model away from LayerNorm 1 / bias 0, so that no gradient is trivially 0."""
    model = cls(config, seed=seed, dtype=numpy.float64).train()
    rng = numpy.random.default_rng(seed)
    for p in model.params.values():
        p += 0.1 * rng.standard_normal(p.shape)
    return model


def padded_twin(model):
    """The same weights with packing off."""
    twin = type(model)(model.config, dtype=model.dtype, params=model.params).train(model.training)
    twin.packs = False
    return twin


def flat_mask(batch):
    mask = numpy.asarray(batch["attention_mask"])
    return mask.reshape(-1, mask.shape[-1])                # multiple choice: [B*C, T]


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), task=st.sampled_from(sorted(PACKED)),
       B=st.integers(2, 4), T=st.integers(2, 9), layers=st.integers(1, 2),
       heads=st.integers(1, 3))
def test_packed_loss_outputs_and_gradients_equal_the_padded_batch(seed, task, B, T, layers,
                                                                   heads):
    config = tiny_bert_config(vocab_size=11, layers=layers, heads=heads, head_size=2,
                              max_position_embeddings=9)
    batch = drawn_batch(seed, task, B, T, config)
    model = perturbed(PACKED[task], config, seed)
    assert model._packing(model.check_batch(batch)) is not None      # it does pack
    loss, grads, out = model.loss_and_grads(batch, return_outputs=True)
    loss_p, grads_p, out_p = padded_twin(model).loss_and_grads(batch, return_outputs=True)
    assert_close(loss, loss_p, TOL, "packed vs padded float64 loss")
    largest = max(numpy.abs(g).max() for g in grads_p.values())
    for name in grads:
        if vanishes("choice" if task == "multiple_choice" else task, name, config):
            # 0 in exact arithmetic: both sides hold rounding noise (conftest.vanishes)
            err = record("packed vs padded float64 vanishing gradients / largest",
                         float(numpy.abs(grads[name] - grads_p[name]).max() / largest))
            assert err <= TOL, name
            continue
        assert_close(grads[name], grads_p[name], TOL, "packed vs padded float64 gradients")
    mask = flat_mask(batch)
    for h, h_p in zip(out["hidden_states"], out_p["hidden_states"]):
        assert_close(attended(h, mask), attended(h_p, mask), TOL,
                     "packed vs padded float64 hidden states")
    for h in out["hidden_states"][1:]:                                # the layers' outputs
        assert not h[mask == 0].any(), "a padded position's hidden state is not 0"
    if out["pooler_output"] is not None:
        assert_close(out["pooler_output"], out_p["pooler_output"], TOL,
                     "packed vs padded float64 pooler")


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), B=st.integers(2, 4), T=st.integers(2, 9))
def test_packed_inference_equals_the_padded_batch_where_it_attends(seed, B, T):
    config = tiny_bert_config(vocab_size=11, layers=2, heads=2, head_size=3,
                              max_position_embeddings=9)
    batch = drawn_batch(seed, "token_classification", B, T, config)
    inputs = [batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")]
    mask = batch["attention_mask"]
    for cls in (BertModel, BertForTokenClassification):
        model = perturbed(cls, config, seed).eval()
        assert model._packing(model._inputs(*inputs)) is not None     # it does pack
        out, out_p = model(*inputs), padded_twin(model)(*inputs)
        for h, h_p in zip(out.hidden_states, out_p.hidden_states):
            assert_close(attended(h, mask), attended(h_p, mask), TOL,
                         "packed vs padded float64 inference")
        last = out.hidden_states[-1]
        assert not last[mask == 0].any()
        if cls is BertForTokenClassification:
            assert_close(attended(out.logits, mask), attended(out_p.logits, mask), TOL,
                         "packed vs padded float64 inference")


@pytest.mark.parametrize("why", ["qa", "token label on padding", "pooler on padding",
                                 "float16", "attention maps", "no padding", "packs off"])
def test_runs_padded_where_packing_would_change_the_result(why):
    config = tiny_bert_config(vocab_size=11, layers=1, heads=2, head_size=2,
                              max_position_embeddings=9)
    task = {"qa": "question_answering", "token label on padding": "token_classification",
            "pooler on padding": "sequence_classification"}.get(why, "sequence_classification")
    batch = drawn_batch(0, task, 3, 8, config)
    cls = {"question_answering": BertForQuestionAnswering,
           "token_classification": BertForTokenClassification}.get(task,
                                                                   BertForSequenceClassification)
    model = cls(config, dtype=numpy.float16 if why == "float16" else numpy.float64)
    host = model.check_batch(batch)
    assert not host["attention_mask"].all()
    if why == "token label on padding":
        labels = batch["labels"].copy()
        labels[host["attention_mask"] == 0] = 1
        host = model.check_batch({**batch, "labels": labels})
    elif why == "pooler on padding":
        host["attention_mask"][1, 0] = 0
    elif why == "no padding":
        host["attention_mask"][:] = 1
    elif why == "packs off":
        model.packs = False
    assert model._packing(host, output_attentions=why == "attention maps") is None, why


def test_packing_of_a_mask_and_back():
    mask = numpy.array([[1, 1, 0, 0], [1, 0, 1, 1], [1, 1, 1, 0]])
    packing = packing_of(mask)
    assert packing.index.tolist() == [0, 1, 4, 6, 7, 8, 9, 10]
    assert packing.starts.tolist() == [0, 2, 5] and packing.lengths.tolist() == [2, 3, 3]
    x = numpy.arange(12.0).reshape(3, 4) + 1
    packed = pack(x, packing)
    assert packed.tolist() == [1, 2, 5, 7, 8, 9, 10, 11]
    assert (unpack(packed, packing) == x * mask).all()
    assert packing_of(numpy.ones((2, 3))) is None                    # nothing to drop
    assert packing_of(numpy.array([[1, 0], [0, 0]])) is None          # a row with no token


def test_step_flops_count_the_packed_tokens():
    """flops.step_flops(lengths=): the padded count when every row is full; packed, the
    dense layers scale with the tokens and QK^T / PV with each row's squared length."""
    config = tiny_bert_config(vocab_size=11, layers=2, heads=2, head_size=4,
                              intermediate_size=12, max_position_embeddings=9)
    H, I, L = 8, 12, 2
    assert step_flops(config, 3, 6, 4, lengths=[6, 6, 6]) == step_flops(config, 3, 6, 4)
    full, packed = step_flops(config, 3, 6, 4), step_flops(config, 3, 6, 4, lengths=[2, 6, 5])
    dense, attention = 3 * L * 2 * (4 * H * H + 2 * H * I), 3 * L * 4 * H
    assert full - packed == dense * (18 - 13) + attention * (3 * 36 - (4 + 36 + 25))
