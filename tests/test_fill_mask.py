"""python -m nanobert.fill_mask: the top-k WordPieces per [MASK], as transformers'
pipeline("fill-mask") gives them (same tokens, token_str and sequence; scores within float32
rounding), on a small random BertForPreTraining saved with its vocab (and, where train.py has
written it, on runs/pretrain/checkpoint); and one line for each input it cannot take."""
import os

import numpy
import pytest

from nanobert import BertConfig, BertForPreTraining
from nanobert import fill_mask as fm
from nanobert.data.tokenizer import BertTokenizer
from nanobert.formats.checkpoint import write_checkpoint
from nanobert.model.pretrained import saved_form
import test_attentions
from conftest import record
from test_finetune import make_tiny_bert

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRETRAINED = os.path.join(ROOT, "runs", "pretrain", "checkpoint")     # python train.py's
WORDS = ["the", "a", "man", "woman", "dog", "cat", "sat", "ran", "on", "in", "his", "her", "old",
         "chair", "house", "he", "she", "told", "saw", "door", "was", "over", "united", "states",
         "of", "president", "##s", "##ing", "##ed", ".", ",", "'"]
TEXTS = ["the old man sat in his [MASK].", "he [MASK] the [MASK].", "[MASK]",
         "She saw the dog's [MASK] , the cat [MASK] on the [MASK]."]


def make_masked_lm(folder, seed=0):
    """A 2-layer BertForPreTraining with random weights (initializer_range 0.5, so that its
    guesses are peaked, not near-uniform) and a vocab of words: config.json,
    model.safetensors, vocab.txt."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    config = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=32, max_position_embeddings=24,
                        initializer_range=0.5)
    BertForPreTraining(config, seed=seed).save_pretrained(folder)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return str(folder)


@pytest.fixture(scope="module")
def masked_lm(tmp_path_factory):
    return make_masked_lm(tmp_path_factory.mktemp("masked-lm"))


def guesses(folder, text, top_k=5, dtype=numpy.float32):
    model, folder = fm.load_masked_lm(folder, dtype=dtype)
    tokenizer = BertTokenizer.from_pretrained(folder)
    return fm.fill_mask(model, tokenizer, fm.encode(tokenizer, model.config, text), top_k)


def one_line_error(argv):
    return test_attentions.one_line_error(argv, fm.main)


def test_each_mask_gets_the_top_k_of_the_softmax_over_the_vocab_at_its_position(masked_lm):
    model, _ = fm.load_masked_lm(masked_lm)
    tokenizer = BertTokenizer.from_pretrained(masked_lm)
    input_ids = fm.encode(tokenizer, model.config, TEXTS[1])
    logits = model(numpy.array([input_ids])).prediction_logits[0].astype(numpy.float64)
    probs = numpy.exp(logits) / numpy.exp(logits).sum(-1, keepdims=True)     # [T, V]
    result = fm.fill_mask(model, tokenizer, input_ids, top_k=3)
    positions = [i for i, t in enumerate(input_ids) if t == tokenizer.mask_token_id]
    assert len(result) == len(positions) == 2, "one list per [MASK]"
    for position, row in zip(positions, result):
        assert [g["token"] for g in row] == numpy.argsort(-probs[position])[:3].tolist()
        numpy.testing.assert_allclose([g["score"] for g in row],
                                      numpy.sort(probs[position])[::-1][:3], rtol=1e-12)
        for g in row:
            assert g["token_str"] == tokenizer.convert_ids_to_tokens(g["token"])
            filled = [g["token"] if i == position else t for i, t in enumerate(input_ids)]
            filled = [t for t in filled if t != tokenizer.pad_token_id]   # as HF, even a guess
            assert g["sequence"] == tokenizer.decode(filled), "the other mask stays, as HF"
    assert guesses(masked_lm, TEXTS[0])[0][0]["sequence"].startswith("the old man"), \
        "a single mask: the sequence without [CLS] and [SEP]"


def test_the_command_prints_a_table_per_mask(masked_lm, capsys):
    assert fm.main([TEXTS[0], TEXTS[1], "--model", masked_lm, "--top-k", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    first, second = guesses(masked_lm, TEXTS[0], 2), guesses(masked_lm, TEXTS[1], 2)
    assert lines[0] == TEXTS[0] and lines[3] == TEXTS[1] and len(lines) == 3 + 1 + 2 * 3
    assert lines[4] == "  [MASK] 1 of 2:" and lines[7] == "  [MASK] 2 of 2:"
    for line, guess in zip(lines[1:3] + lines[5:7] + lines[8:10], first[0] + second[0] + second[1]):
        score, token_str, sequence = line.split(maxsplit=2)
        assert (float(score), token_str, sequence) == (round(guess["score"], 4),
                                                       guess["token_str"], guess["sequence"])


def test_a_masked_lm_checkpoint_without_nsp_head_and_pooler_still_fills(masked_lm, tmp_path):
    """transformers' BertForMaskedLM saves neither: fill-mask does not need them."""
    config, tensors = saved_form(BertForPreTraining.from_pretrained(masked_lm))
    kept = {k: v for k, v in tensors.items()
            if not k.startswith(("cls.seq_relationship.", "bert.pooler."))}
    assert len(kept) == len(tensors) - 4
    write_checkpoint(tmp_path, config, kept)
    (tmp_path / "vocab.txt").write_bytes(open(os.path.join(masked_lm, "vocab.txt"), "rb").read())
    assert guesses(str(tmp_path), TEXTS[3]) == guesses(masked_lm, TEXTS[3])

# ------------------------------------------------------------------ one line per bad input


def test_a_checkpoint_without_the_masked_lm_head_says_what_to_use(tmp_path):
    encoder = make_tiny_bert(tmp_path / "encoder")           # BertModel: no cls.* at all
    message = one_line_error(["the [MASK]", "--model", encoder])
    assert "has no masked-LM head" in message and "runs/pretrain/checkpoint" in message, message


def test_a_text_without_mask_is_named(masked_lm):
    message = one_line_error([TEXTS[0], "the old man", "--model", masked_lm])
    assert "text 2 ('the old man') has no [MASK]" in message, message


def test_a_text_longer_than_the_models_positions_is_named(masked_lm):
    message = one_line_error(["the " * 30 + "[MASK]", "--model", masked_lm])
    assert "text 1" in message and "33 WordPieces" in message and "at most 24" in message, \
        message


def test_a_missing_folder_is_one_line(tmp_path):
    message = one_line_error(["the [MASK]", "--model", str(tmp_path / "nowhere")])
    assert "no such folder" in message, message

# ------------------------------------------------ against transformers' pipeline("fill-mask")


@pytest.mark.reference
@pytest.mark.parametrize("which", ["random", "pretrained"])
@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_same_guesses_as_transformers_fill_mask_pipeline(masked_lm, which, dtype):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    folder = masked_lm if which == "random" else PRETRAINED
    if not os.path.isdir(folder):
        pytest.skip(f"{folder} is written by python train.py")
    torch_dtype = torch.float32 if dtype == numpy.float32 else torch.float64
    pipe = transformers.pipeline("fill-mask", model=folder, tokenizer=folder, device="cpu",
                                 dtype=torch_dtype)
    tag = numpy.dtype(dtype).name
    for text in TEXTS:
        theirs = pipe(text, top_k=4)
        theirs = [theirs] if isinstance(theirs[0], dict) else theirs    # one mask: unwrapped
        ours = guesses(folder, text, top_k=4, dtype=dtype)
        assert len(ours) == len(theirs), text
        for our_row, their_row in zip(ours, theirs):
            for a, b in zip(our_row, their_row, strict=True):
                assert (a["token"], a["token_str"]) == (b["token"], b["token_str"]), text
                # transformers 5 decodes with the Rust tokenizer, which cleans up spaces one
                # WordPiece at a time, so "dog ' s" stays apart; nanobert's decode is the
                # Python BertTokenizer's, which also joins contractions: "dog's".
                assert a["sequence"] == BertTokenizer.clean_up_tokenization(b["sequence"]), text
                err = record(f"fill-mask scores vs transformers' pipeline (max abs, {tag})",
                             abs(a["score"] - b["score"]))
                assert err <= (1e-5 if dtype == numpy.float32 else 1e-12), (text, a, b)
