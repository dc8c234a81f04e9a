"""finetune.py end to end on a tiny random-init BERT saved to a temporary folder (the
plumbing, the files written, the training loss falling), plus its argument handling and
the errors it gives for bad input. Real-data scores are benchmarks, not tests."""
import json
import os
import string

import numpy
import pytest

import finetune
from nanobert import BertConfig, BertForSequenceClassification, BertModel
from nanobert.data.tokenizer import BertTokenizer
from conftest import attended

DATA = os.path.join(os.path.dirname(__file__), "data", "finetune")
WORDS = ["the", "good", "bad", "great", "awful", "film", "movie", "story", "france", "norse",
         "rollo", "king", "charles", "iii", "normans", "normandy", "who", "what", "in"]


def data(name):
    return os.path.join(DATA, name)


def make_tiny_bert(folder, dropout=0.1):
    """A 2-layer, H=32 BERT with random weights and a vocab of letters, ## letters, punctuation
    and a few words: config.json, model.safetensors, vocab.txt, as any checkpoint folder."""
    folder.mkdir(parents=True, exist_ok=True)
    chars = string.ascii_lowercase + string.digits
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *string.punctuation,
             *("##" + c for c in chars)]
    vocab += [w for w in WORDS if w not in vocab]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=128,
                        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    BertModel(config, seed=0).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


def run(*argv):
    assert finetune.main([str(a) for a in argv]) == 0


def records(out, kind):
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
        return [r for r in map(json.loads, f) if r["kind"] == kind]


def assert_loss_falls(out):
    losses = [r["loss"] for r in records(out, "train")]
    first, last = numpy.mean(losses[:3]), numpy.mean(losses[-3:])
    assert last < 0.7 * first, \
        f"training loss did not fall: first steps {losses[:3]}, last {losses[-3:]}"


def assert_checkpoint(out, labels):
    best = os.path.join(out, "best")
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json",
                 "best.json"):
        assert os.path.isfile(os.path.join(best, name)), f"best/{name} missing"
    with open(os.path.join(best, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    if labels:
        assert [config["id2label"][str(i)] for i in range(len(labels))] == labels
    assert not [n for n in os.listdir(out) if n.endswith((".tmp", ".old"))], \
        "no half-written checkpoint left"


def test_classify_end_to_end(tiny_bert, tmp_path):
    out = tmp_path / "classify"
    run("--glue-task", "sst-2", "--train", data("sst2_train.tsv"), "--dev", data("sst2_dev.tsv"),
        "--test", data("sst2_test.tsv"), "--model", tiny_bert, "--out", out, "--epochs", 20,
        "--batch-size", 10, "--lr", 1e-3, "--log-every", 1)
    assert_loss_falls(out)
    assert_checkpoint(out, ["0", "1"])
    evaluations = records(out, "eval")
    assert len(evaluations) == 20, "one dev evaluation per epoch"
    assert {"accuracy", "f1", "matthews", "loss"} <= set(evaluations[0])
    with open(out / "test_predictions.tsv", encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 7, \
        "GLUE submission format for an unlabeled test set"
    assert {line.split("\t")[1] for line in lines[1:]} <= {"0", "1"}
    with open(out / "dev_predictions.tsv", encoding="utf-8") as f:
        assert f.readline().strip() == "index\tprediction\tlabel"
    results = json.loads((out / "results.json").read_text())
    assert results["best"]["metric"] == "accuracy" and results["data"]["train"]["examples"] == 20


def test_ner_end_to_end(tiny_bert, tmp_path):
    out = tmp_path / "ner"
    run("--task", "ner", "--train", data("conll_train.txt"), "--dev", data("conll_dev.txt"),
        "--test", data("conll_dev.txt"), "--model", tiny_bert, "--out", out, "--epochs", 30,
        "--batch-size", 5, "--lr", 1e-3, "--max-seq-length", 64, "--log-every", 1)
    assert_loss_falls(out)
    assert_checkpoint(out, ["O", "B-LOC", "B-MISC", "B-ORG", "B-PER", "I-MISC", "I-PER"])
    assert {"f1", "precision", "recall", "per_type"} <= set(records(out, "eval")[0])
    with open(out / "test_predictions.txt", encoding="utf-8") as f:
        sentences = f.read().strip().split("\n\n")
    assert len(sentences) == 2 and sentences[0].splitlines()[0].split()[:2] == ["Peter", "B-PER"], \
        "conlleval input: word gold predicted"


def test_squad_end_to_end(tiny_bert, tmp_path):
    out = tmp_path / "squad"
    run("--task", "squad", "--train", data("squad_v2.json"), "--dev", data("squad_v2.json"),
        "--model", tiny_bert, "--out", out, "--epochs", 4, "--batch-size", 16, "--lr", 1e-3,
        "--max-seq-length", 64, "--doc-stride", 32, "--max-query-length", 16, "--log-every", 1)
    assert_loss_falls(out)
    assert_checkpoint(out, None)
    predictions = json.loads((out / "dev_predictions.json").read_text())
    assert sorted(predictions) == ["q1", "q2", "q3", "q4", "q5", "q6"], \
        "the official {id: answer} format"
    assert all(isinstance(v, str) for v in predictions.values())
    assert set(json.loads((out / "dev_null_odds.json").read_text())) == set(predictions), \
        "v2.0 null odds"
    scores = records(out, "eval")[-1]
    assert {"exact", "f1", "HasAns_f1", "NoAns_f1", "best_f1_thresh"} <= set(scores)


def test_regress_and_choice_run(tiny_bert, tmp_path):
    run("--task", "regress", "--train", data("stsb_dev.tsv"), "--dev", data("stsb_dev.tsv"),
        "--glue-task", "sts-b", "--model", tiny_bert, "--out", tmp_path / "regress", "--epochs", 2,
        "--batch-size", 2, "--lr", 1e-3)               # one rate: one run, not the small grid
    assert {"pearson", "spearman"} <= set(records(tmp_path / "regress", "eval")[0])
    run("--task", "choice", "--train", data("swag.csv"), "--dev", data("swag.csv"),
        "--test", data("swag_test.csv"), "--model", tiny_bert, "--out", tmp_path / "choice",
        "--epochs", 2, "--batch-size", 2, "--lr", 1e-3)
    assert "accuracy" in records(tmp_path / "choice", "eval")[0]
    lines = (tmp_path / "choice" / "test_predictions.tsv").read_text().splitlines()
    assert lines[1].split("\t")[1] in "0123"


def test_gradient_accumulation_takes_the_same_step(tmp_path):
    from nanobert.formats import safetensors
    model = make_tiny_bert(tmp_path / "no-dropout", dropout=0.0)
    weights = []
    for accumulate in (1, 2, 4):
        out = tmp_path / f"accumulate-{accumulate}"
        run("--glue-task", "sst-2", "--train", data("sst2_train.tsv"),
            "--dev", data("sst2_dev.tsv"), "--model", model, "--out", out, "--batch-size", 8,
            "--grad-accum", accumulate, "--max-steps", 1, "--lr", 1e-3, "--dtype", "float64")
        weights.append(safetensors.load_file(out / "best" / "model.safetensors"))
    for other in weights[1:]:
        for name, w in weights[0].items():
            assert numpy.allclose(other[name], w, rtol=0, atol=1e-12), \
                f"{name} differs after one step"


def test_from_scratch_keeps_the_architecture_and_drops_the_weights(tiny_bert):
    """--from-scratch: the checkpoint's config, a fresh initialisation from --seed (the
    ablation's random-init baseline), nothing of the pretrained weights."""
    args = finetune.resolve_task(finetune.parse_args(
        ["--glue-task", "sst-2", "--train", data("sst2_train.tsv"), "--dev", data("sst2_dev.tsv"),
         "--model", tiny_bert, "--from-scratch", "--seed", "3"]))
    model = finetune.model_with_head(args, finetune.TASKS[args.task], tiny_bert, ["0", "1"])
    fresh = BertForSequenceClassification(model.config, seed=3)
    pretrained = BertModel.from_pretrained(tiny_bert)
    assert model.params["classifier.weight"].shape == (2, 32)
    assert model.params.keys() == fresh.params.keys()
    for name, value in model.params.items():
        numpy.testing.assert_array_equal(value, fresh.params[name], err_msg=name)
    assert not numpy.array_equal(model.params["bert.embeddings.word_embeddings.weight"],
                                 pretrained.params["embeddings.word_embeddings.weight"])


def test_dropout_replaces_the_checkpoints_and_keeps_its_weights(tmp_path):
    """--dropout P: a checkpoint pretrained without dropout fine-tunes with P in every dropout
    (hidden, attention, head: the ablation's recipe), the weights untouched, and best/config.json
    says P; out of [0, 1) is refused by the parser."""
    folder = make_tiny_bert(tmp_path / "no-dropout", dropout=0.0)
    common = ["--glue-task", "sst-2", "--train", data("sst2_train.tsv"),
              "--dev", data("sst2_dev.tsv"), "--model", folder]
    args = finetune.resolve_task(finetune.parse_args([*common, "--dropout", "0.25"]))
    model = finetune.model_with_head(args, finetune.TASKS[args.task], folder, ["0", "1"])
    assert (model.config.hidden_dropout_prob, model.config.attention_probs_dropout_prob,
            model.classifier_dropout) == (0.25, 0.25, 0.25)
    pretrained = BertModel.from_pretrained(folder)
    for name, value in pretrained.params.items():
        numpy.testing.assert_array_equal(model.params["bert." + name], value, err_msg=name)
    batch = {"input_ids": numpy.array([[2, 40, 41, 42, 3]]), "labels": numpy.array([1])}
    assert model.loss(batch) != model.loss(batch), "training-mode losses equal: no dropout drawn"
    run(*common, "--dropout", "0.25", "--out", tmp_path / "run", "--max-steps", 1)
    with open(tmp_path / "run" / "best" / "config.json", encoding="utf-8") as f:
        saved = json.load(f)
    assert (saved["hidden_dropout_prob"], saved["attention_probs_dropout_prob"]) == (0.25, 0.25)
    with pytest.raises(SystemExit):
        finetune.parse_args([*common, "--dropout", "1"])


def test_a_head_with_another_label_count_needs_reinit_head(tiny_bert, tmp_path):
    first = tmp_path / "two-labels"
    run("--glue-task", "sst-2", "--train", data("sst2_train.tsv"), "--dev", data("sst2_dev.tsv"),
        "--model", tiny_bert, "--out", first, "--max-steps", 1)
    three = ["--task", "pair", "--glue-task", "mnli", "--train", data("mnli_dev.tsv"),
             "--dev", data("mnli_dev.tsv"), "--model", first / "best",
             "--out", tmp_path / "three-labels", "--max-steps", 1, "--lr", 1e-3]
    with pytest.raises(ValueError, match="reinit_head"):
        run(*three)
    run(*three, "--reinit-head")
    assert_checkpoint(tmp_path / "three-labels", ["contradiction", "entailment", "neutral"])


def test_bad_input_stops_with_the_file_and_line(tiny_bert, tmp_path):
    common = ["--model", tiny_bert, "--out", tmp_path / "bad", "--max-steps", 1]
    with pytest.raises(ValueError, match="bad_label.tsv:3: label 'maybe' is not in the label set"):
        run("--glue-task", "sst-2", "--train", data("sst2_train.tsv"),
            "--dev", data("bad_label.tsv"), *common)
    with pytest.raises(ValueError, match="conll_malformed.txt:3"):
        run("--task", "ner", "--train", data("conll_malformed.txt"), "--dev", data("conll_dev.txt"),
            *common)
    with pytest.raises(ValueError, match="empty.tsv: the file is empty"):
        run("--glue-task", "sst-2", "--train", data("empty.tsv"), "--dev", data("sst2_dev.tsv"),
            *common)
    with pytest.raises(FileNotFoundError, match="not a known model name"):
        run("--glue-task", "sst-2", "--train", data("sst2_train.tsv"),
            "--dev", data("sst2_dev.tsv"), "--model", "no-such-model", "--out", tmp_path / "x")
    with pytest.raises(SystemExit, match="needs --train and --dev"):
        run("--task", "ner", "--train", data("conll_train.txt"))


def test_long_texts_are_truncated_and_counted(tiny_bert, tmp_path, capsys):
    out = tmp_path / "short"
    run("--glue-task", "sst-2", "--train", data("sst2_train.tsv"), "--dev", data("sst2_dev.tsv"),
        "--model", tiny_bert, "--out", out, "--max-steps", 1, "--max-seq-length", 6)
    assert "train: examples 20, truncated 18" in capsys.readouterr().out
    assert json.loads((out / "results.json").read_text())["data"]["train"]["truncated"] == 18


def test_features(tiny_bert, tmp_path):
    texts = tmp_path / "texts.txt"
    # the blank line is a text too
    texts.write_text("a good film\nthe story\n\nrollo\n", encoding="utf-8")
    run("--task", "features", "--model", tiny_bert, "--input", texts, "--out", tmp_path / "mean",
        "--normalize")
    mean = numpy.load(tmp_path / "mean" / "embeddings.npy")
    assert mean.shape == (4, 32) and numpy.allclose(numpy.linalg.norm(mean, axis=1), 1.0, atol=1e-6)
    run("--task", "features", "--model", tiny_bert, "--input", texts, "--out", tmp_path / "tokens",
        "--pooling", "tokens", "--layers", -2, -1)
    tokens = numpy.load(tmp_path / "tokens" / "embeddings.npy")
    offsets = numpy.load(tmp_path / "tokens" / "offsets.npy")
    # [CLS] a good film [SEP] / [CLS] the story [SEP] / [CLS] [SEP] / [CLS] rollo [SEP]
    assert offsets.tolist() == [0, 5, 9, 11, 14] and tokens.shape == (14, 64)
    # mean pooling = the mean of the token vectors of the last layer
    run("--task", "features", "--model", tiny_bert, "--input", texts, "--out", tmp_path / "raw")
    raw = numpy.load(tmp_path / "raw" / "embeddings.npy")
    assert numpy.allclose(raw[0], tokens[0:5, 32:].mean(0), atol=1e-5)


def test_no_arguments_is_the_movie_review_demo():
    args = finetune.resolve_task(finetune.parse_args([]))
    assert (args.task, args.model, args.demo) == ("classify", "all-MiniLM-L6-v2", True)
    assert (args.max_train_examples, args.epochs, args.lr, args.batch_size,
            args.max_seq_length) == (4000, [1], [3e-5], [32], 128)
    paper = finetune.resolve_task(finetune.parse_args(["--max-train-examples", "0",
                                                       "--epochs", "3"]))
    assert (paper.max_train_examples, paper.epochs) == (None, [3])
    squad_args = finetune.resolve_task(finetune.parse_args(["--task", "squad", "--train", "a",
                                                            "--dev", "b"]))
    assert (squad_args.max_seq_length, squad_args.doc_stride, squad_args.max_query_length) == \
        (384, 128, 64)
    assert (squad_args.n_best_size, squad_args.max_answer_length, squad_args.epochs) == \
        (20, 30, [3])


EXPORT_RUNS = {   # task -> finetune arguments, the transformers class that must load best/
    "classify": (("--glue-task", "sst-2", "--train", "sst2_train.tsv", "--dev", "sst2_dev.tsv"),
                 "BertForSequenceClassification"),
    "ner": (("--task", "ner", "--train", "conll_train.txt", "--dev", "conll_dev.txt",
             "--max-seq-length", 64), "BertForTokenClassification"),
    "squad": (("--task", "squad", "--train", "squad_v2.json", "--dev", "squad_v2.json",
               "--max-seq-length", 64, "--doc-stride", 32, "--max-query-length", 16),
              "BertForQuestionAnswering"),
    "choice": (("--task", "choice", "--train", "swag.csv", "--dev", "swag.csv"),
               "BertForMultipleChoice"),
}


@pytest.mark.parametrize("task", EXPORT_RUNS)
def test_transformers_runs_the_best_checkpoint_to_the_same_logits(tiny_bert, tmp_path, task):
    """best/ is a transformers folder: its BertFor* class and BertTokenizer load it with
    nothing missing, and give the same ids and logits (float32, 1e-5) on the dev data."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    argv, hf_class = EXPORT_RUNS[task]
    argv = [data(a) if isinstance(a, str) and a.endswith((".tsv", ".txt", ".json", ".csv"))
            else str(a) for a in argv]
    out = tmp_path / task
    run(*argv, "--model", tiny_bert, "--out", out, "--epochs", 1, "--batch-size", 4, "--lr", 1e-3)
    best = out / "best"
    args = finetune.resolve_task(finetune.parse_args([*argv, "--model", str(best)]))
    tokenizer = BertTokenizer.from_pretrained(best)
    loaded = finetune.load_data(args, tokenizer)
    _, features = loaded.splits["dev"]
    rows = list(range(min(4, len(features))))
    batch = features.batch(rows)
    hf_tokenizer = transformers.BertTokenizer.from_pretrained(best)
    assert hf_tokenizer.do_lower_case == tokenizer.do_lower_case
    ids = batch["input_ids"].ravel()
    assert hf_tokenizer.convert_tokens_to_ids(tokenizer.convert_ids_to_tokens(ids)) == ids.tolist()
    ours = finetune.TASKS[task].head.from_pretrained(best, dtype=numpy.float32)
    ours.eval()
    hf, info = getattr(transformers, hf_class).from_pretrained(best, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    hf.eval()
    names = ("input_ids", "token_type_ids", "attention_mask")
    got = ours(*(batch[n] for n in names))
    with torch.no_grad():
        want = hf(**{n: torch.from_numpy(numpy.asarray(batch[n], dtype=numpy.int64))
                     for n in names})
    for name in ("start_logits", "end_logits") if task == "squad" else ("logits",):
        ours, theirs = getattr(got, name), getattr(want, name).numpy()
        if ours.ndim == 3:                  # per-token logits: packed, equal where attended
            ours, theirs = (attended(a, batch["attention_mask"]) for a in (ours, theirs))
        numpy.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)
    if loaded.label_list:
        assert hf.config.id2label == dict(enumerate(loaded.label_list))
