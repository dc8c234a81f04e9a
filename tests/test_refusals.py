"""What nanobert refuses, and what survives a failure: no non-finite tensor is ever saved and
the previous checkpoint stays; a full disk is one line; hostile or mistyped checkpoint files
are refused with the loader's ordinary one-line error."""
import errno
import os

import numpy
import pytest

from nanobert import AdamW, BertConfig, BertForPreTraining
from nanobert.formats import safetensors
from nanobert.formats.checkpoint import NonFiniteError
from nanobert.model.pretrained import load_training_checkpoint, save_training_checkpoint
from test_checkpoint import CONFIG


def small_model(seed=0):
    return BertForPreTraining(BertConfig(**CONFIG), seed=seed)


@pytest.mark.parametrize("bad", [numpy.nan, numpy.inf])
def test_a_non_finite_weight_is_never_saved_and_the_previous_checkpoint_stays(tmp_path, bad):
    model = small_model()
    optimizer = AdamW(model.params)
    folder = tmp_path / "checkpoint"
    save_training_checkpoint(folder, model, optimizer, {"step": 3})
    before = safetensors.load_file(folder / "model.safetensors")
    model.params["bert.encoder.layer.1.output.dense.weight"][2, 3] = bad
    with pytest.raises(NonFiniteError, match=r"bert\.encoder\.layer\.1\.output\.dense\.weight "
                                             r"holds 1 non-finite value"):
        save_training_checkpoint(folder, model, optimizer, {"step": 4})
    _, params, _, state = load_training_checkpoint(BertForPreTraining, folder)
    assert state == {"step": 3}
    for name, p in before.items():
        numpy.testing.assert_array_equal(params[name], p, err_msg=name)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint"], "no half-written folder left"


def test_non_finite_optimizer_moments_are_never_saved(tmp_path):
    model = small_model()
    optimizer = AdamW(model.params)
    optimizer.v["cls.predictions.bias"][0] = numpy.nan
    with pytest.raises(NonFiniteError, match=r"v/cls\.predictions\.bias"):
        save_training_checkpoint(tmp_path / "checkpoint", model, optimizer, {"step": 1})
    assert not (tmp_path / "checkpoint").exists()


def test_save_pretrained_refuses_nan_weights(tmp_path):
    model = small_model()
    model.params["cls.seq_relationship.bias"][:] = numpy.nan
    with pytest.raises(NonFiniteError, match=r"cls\.seq_relationship\.bias holds 2 non-finite"):
        model.save_pretrained(tmp_path / "out")
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_a_full_disk_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model = small_model()
    optimizer = AdamW(model.params)
    folder = tmp_path / "checkpoint"
    save_training_checkpoint(folder, model, optimizer, {"step": 1})

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as caught:
        save_training_checkpoint(folder, model, optimizer, {"step": 2})
    message = str(caught.value)
    assert "\n" not in message and str(folder) in message and "MB" in message, message
    assert caught.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert load_training_checkpoint(BertForPreTraining, folder)[3] == {"step": 1}


def test_deeply_nested_header_is_the_ordinary_refusal(tmp_path):
    header = b'{"a": ' + b"[" * 200_000
    path = tmp_path / "hostile.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(ValueError, match="hostile.safetensors: header JSON is nested too deeply"):
        safetensors.load_file(path)


def test_an_integer_tensor_for_a_float_parameter_is_refused(tmp_path):
    model = small_model()
    model.save_pretrained(tmp_path)
    tensors = safetensors.load_file(tmp_path / "model.safetensors")
    name = "bert.embeddings.word_embeddings.weight"
    tensors[name] = numpy.zeros(tensors[name].shape, dtype=numpy.int32)
    safetensors.save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=rf"{name} is stored as int32"):
        BertForPreTraining.from_pretrained(tmp_path)


def test_float16_is_mixed_precision_and_what_cannot_work_is_refused():
    """float16 is real now (float32 master weights, tests/test_mixed_precision.py); what
    still cannot work is refused clearly: other dtypes, and AdamW on float16 weights (its
    updates and v = g^2 would vanish in float16)."""
    model = BertForPreTraining(BertConfig(**CONFIG), dtype=numpy.float16)
    assert model.dtype == numpy.float16 and model.master_dtype == numpy.float32
    for dtype in (numpy.int32, numpy.complex64):
        with pytest.raises(ValueError, match="dtype must be float16 \\(mixed precision\\), "
                                             "float32 or float64"):
            BertForPreTraining(BertConfig(**CONFIG), dtype=dtype)
    half = {name: p.astype(numpy.float16) for name, p in model.params.items()}
    with pytest.raises(ValueError, match="AdamW refuses float16 parameters"):
        AdamW(half)
