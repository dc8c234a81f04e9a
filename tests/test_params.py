"""The parameter table declares each parameter's start and weight decay (params.Param): the
original's rules (truncated normal matrices and tables, LayerNorm gain 1, biases 0; no decay
for LayerNorm and biases) come from the declaration, not from the name, so that a variant's
parameter (an RMSNorm gain, say) starts and decays as declared whatever it is called."""
import numpy
import pytest

from nanobert import BertForPreTraining, BertModel
from nanobert.model.heads import (BertForMultipleChoice, BertForQuestionAnswering,
                                  BertForSequenceClassification, BertForTokenClassification)
from nanobert.model.optim import NO_DECAY, AdamW
from nanobert.model.params import Param, decays, gain, init_params, weight
from nanobert.testing import tiny_bert_config

CLASSES = [BertModel, BertForPreTraining, BertForSequenceClassification,
           BertForTokenClassification, BertForQuestionAnswering, BertForMultipleChoice]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_parameter_declares_what_the_original_does_by_name(cls):
    """For BERT's own names the declarations give the original's rules exactly: the change
    from names to declarations changes no run."""
    config = tiny_bert_config(layers=2)
    for name, shape in cls.param_shapes(config).items():
        assert isinstance(shape, Param), name
        by_name = "ones" if name.endswith("LayerNorm.weight") else \
            "zeros" if name.endswith("bias") else "normal"
        assert shape.init == by_name, name
        assert shape.decay == (not any(s in name for s in NO_DECAY)), name


def test_a_variant_parameter_starts_and_decays_as_declared_whatever_its_name():
    """An RMSNorm gain declared gain(H): ones and no decay, where the name rule would give it
    a random start and decay it (no "LayerNorm" in its name)."""
    config = tiny_bert_config()
    shapes = {"encoder.layer.0.RMSNorm.weight": gain(4), "encoder.layer.0.dense.weight":
              weight(3, 4)}
    params = init_params(shapes, config, seed=0)
    assert (params["encoder.layer.0.RMSNorm.weight"] == 1).all()
    assert params["encoder.layer.0.dense.weight"].std() > 0
    declared = AdamW(params, decay=decays(shapes))
    assert declared.weight_decay == {"encoder.layer.0.RMSNorm.weight": 0.0,
                                     "encoder.layer.0.dense.weight": 0.01}
    by_name = AdamW(params)                                 # a plain dict: the original's rule
    assert by_name.weight_decay["encoder.layer.0.RMSNorm.weight"] == 0.01


def test_a_param_is_its_shape():
    """Code that reads a table as shapes (checkpoints, flat buffers) sees plain shapes."""
    p = weight(3, 4)
    assert p == (3, 4) and tuple(p) == (3, 4) and numpy.zeros(p).shape == (3, 4)
    with pytest.raises(ValueError, match="AdamW decay= has no entry"):
        AdamW({"a": numpy.zeros(2)}, decay={})
