"""Bad configs and bad batches get a ValueError that names the offending value."""
import numpy
import pytest

from nanobert import AdamW, BertConfig, BertForPreTraining
from nanobert.backend import get_xp, gpu_available, resolve_device
from conftest import vanishes
from test_checkpoint import CONFIG, tiny_batch


@pytest.fixture(scope="module")
def model():
    return BertForPreTraining(BertConfig(**CONFIG), seed=0)


def test_hidden_size_must_divide_into_heads():
    with pytest.raises(ValueError,
                       match=r"hidden_size \(30\) is not divisible by num_attention_heads \(4\)"):
        BertConfig(hidden_size=30, num_attention_heads=4)


@pytest.mark.parametrize("field, value, pattern", [
    ("hidden_act", "relu", "hidden_act"), ("num_hidden_layers", 0, "num_hidden_layers"),
    ("hidden_dropout_prob", 1.0, "hidden_dropout_prob"), ("vocab_size", 2.5, "vocab_size")])
def test_bad_config_values_are_named(field, value, pattern):
    with pytest.raises(ValueError, match=pattern):
        BertConfig(**{**CONFIG, field: value})


def test_non_absolute_position_embeddings_are_refused():
    with pytest.raises(ValueError, match="relative_key"):
        BertConfig.from_dict({**CONFIG, "position_embedding_type": "relative_key"})


def test_config_round_trips_unknown_keys():
    config = BertConfig.from_dict({**CONFIG, "id2label": {"0": "NEG"}, "architectures": ["X"]})
    assert config.to_dict()["id2label"] == {"0": "NEG"}
    assert BertConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize("change, pattern", [
    (lambda b: b.update(input_ids=b["input_ids"] + 100),
     r"input_ids\[0, 0\] = \d+ is outside \[0, 50\)"),
    (lambda b: b["input_ids"].__setitem__((1, 3), -1), r"input_ids\[1, 3\] = -1"),
    (lambda b: b["token_type_ids"].__setitem__((2, 4), 2),
     r"token_type_ids\[2, 4\] = 2 is outside \[0, 2\)"),
    (lambda b: b["labels"].__setitem__((0, 1), 50), r"labels\[0, 1\] = 50"),
    (lambda b: b["attention_mask"].__setitem__((0, 1), 3), r"attention_mask\[0, 1\] = 3"),
    (lambda b: b.update(next_sentence_label=numpy.array([0, 2, 1])),
     r"next_sentence_label\[1\] = 2"),
    (lambda b: b.update(input_ids=b["input_ids"].astype(numpy.float32)),
     "input_ids must be an integer array"),
    (lambda b: b.update(labels=b["labels"][:, :4]),
     r"labels has shape \(3, 4\) but input_ids has \(3, 9\)"),
    (lambda b: b.update(attention_mask=b["attention_mask"][:2]),
     r"attention_mask has shape \(2, 9\)"),
    (lambda b: b.update(next_sentence_label=numpy.zeros(2, dtype=int)),
     r"next_sentence_label has shape \(2,\)"),
    (lambda b: b.update(input_ids=b["input_ids"][0]), r"input_ids must be \[batch, seq_len\]"),
    (lambda b: b.pop("labels"), "at least 'input_ids' and 'labels'"),
])
def test_bad_batches_are_named(model, change, pattern):
    batch = tiny_batch()
    change(batch)
    with pytest.raises(ValueError, match=pattern):
        model.loss_and_grads(batch)


def test_sequence_longer_than_the_position_table_is_refused(model):
    ids = numpy.zeros((1, 21), dtype=numpy.int64)
    with pytest.raises(ValueError, match="sequence length 21 exceeds max_position_embeddings 20"):
        model(ids)


def test_boolean_attention_mask_is_accepted(model):
    batch = tiny_batch()
    loss_int = model.eval().loss_and_grads(batch)[0]
    batch["attention_mask"] = batch["attention_mask"].astype(bool)
    assert model.loss_and_grads(batch)[0] == loss_int


def test_device_switch():
    assert get_xp("cpu") is numpy
    with pytest.raises(ValueError, match="'tpu'"):
        resolve_device("tpu")


def test_device_from_environment(monkeypatch):
    monkeypatch.setenv("NANOBERT_DEVICE", "cpu")
    assert resolve_device() == "cpu"
    monkeypatch.setenv("NANOBERT_DEVICE", "metal")
    with pytest.raises(ValueError, match="NANOBERT_DEVICE"):
        resolve_device()


def test_optimizer_mode_and_state_are_checked(model):
    with pytest.raises(ValueError, match="'adam'"):
        AdamW(model.params, mode="adam")
    optimizer = AdamW(model.params)
    state = optimizer.state_dict()
    del state["m/cls.predictions.bias"]
    with pytest.raises(ValueError, match="m/cls.predictions.bias"):
        AdamW(model.params).load_state_dict(state)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a GPU")
def test_gpu_matches_cpu_in_float64():
    cpu = BertForPreTraining(BertConfig(**CONFIG), seed=1, dtype=numpy.float64).eval()
    gpu = BertForPreTraining(BertConfig(**CONFIG), seed=1, dtype=numpy.float64, device="gpu").eval()
    batch = tiny_batch()
    loss_cpu, grads_cpu = cpu.loss_and_grads(batch)
    loss_gpu, grads_gpu = gpu.loss_and_grads(batch)
    assert abs(loss_cpu - loss_gpu) <= 1e-12 * abs(loss_cpu)
    largest = max(numpy.abs(g).max() for g in grads_cpu.values())
    for name, g in grads_cpu.items():
        other = grads_gpu[name].get()
        # a gradient that is 0 in exact arithmetic holds rounding noise on both sides (and the
        # GPU's erf and summation order make other noise): measured against the largest one
        scale = largest if vanishes("pretraining", name, cpu.config) else numpy.abs(g).max()
        err = numpy.abs(other - g).max() / scale
        assert err <= 1e-10, f"{name}: {err:.2e}"


def test_the_gradients_vanishes_names_are_the_noise_level_ones():
    """The rule test_gpu_matches_cpu_in_float64 compares by, checked on the CPU: in float64
    the gradients vanishes() names are rounding noise against the largest gradient, and
    every other gradient is far above that."""
    model = BertForPreTraining(BertConfig(**CONFIG), seed=1, dtype=numpy.float64).eval()
    _, grads = model.loss_and_grads(tiny_batch())
    largest = max(numpy.abs(g).max() for g in grads.values())
    named = set()
    for name, g in grads.items():
        size = numpy.abs(g).max() / largest
        if vanishes("pretraining", name, model.config):
            named.add(name)
            assert size <= 1e-14, f"{name}: {size:.1e} of the largest gradient, not noise"
        else:
            assert size >= 1e-8, f"{name}: {size:.1e} of the largest gradient, noise unnamed"
    assert len(named) == CONFIG["num_hidden_layers"], named
