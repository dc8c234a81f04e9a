"""The scores: hand-computed values, and scipy / sklearn where they are installed (never
required)."""
import numpy
import pytest

from nanobert.data import metrics


def approx(x):
    return pytest.approx(x, rel=1e-12, abs=1e-12)

# ----------------------------------------------------------------------- classification


def test_accuracy_and_binary_f1_by_hand():
    labels = [1, 1, 1, 0, 0, 0]
    predictions = [1, 1, 0, 0, 0, 1]          # TP 2, FN 1, TN 2, FP 1
    assert metrics.accuracy(predictions, labels) == approx(4 / 6)
    precision, recall, f1 = metrics.precision_recall_f1(predictions, labels)
    assert (precision, recall, f1) == (approx(2 / 3), approx(2 / 3), approx(2 / 3))
    assert metrics.precision_recall_f1([0, 0], [1, 0]) == (0.0, 0.0, 0.0), \
        "no positive prediction: 0, not NaN"


def test_matthews_by_hand():
    # (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (4 - 1) / sqrt(3*3*3*3) = 1/3
    assert metrics.matthews_corrcoef([1, 1, 0, 0, 0, 1], [1, 1, 1, 0, 0, 0]) == approx(1 / 3)
    assert metrics.matthews_corrcoef([0, 1, 0, 1], [0, 1, 0, 1]) == approx(1.0)
    assert metrics.matthews_corrcoef([1, 0, 1, 0], [0, 1, 0, 1]) == approx(-1.0)
    assert metrics.matthews_corrcoef([1, 1, 1, 1], [0, 1, 0, 1]) == 0.0, \
        "constant prediction: 0 (as sklearn)"


def test_matthews_and_f1_match_sklearn():
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    rng = numpy.random.default_rng(0)
    for classes in (2, 3, 5):
        labels, predictions = rng.integers(0, classes, 200), rng.integers(0, classes, 200)
        predictions[:100] = labels[:100]
        assert metrics.matthews_corrcoef(predictions, labels) == pytest.approx(
            sklearn_metrics.matthews_corrcoef(labels, predictions), abs=1e-12)
    labels, predictions = rng.integers(0, 2, 100), rng.integers(0, 2, 100)
    assert metrics.f1_score(predictions, labels) == \
        pytest.approx(sklearn_metrics.f1_score(labels, predictions))

# --------------------------------------------------------------------------- regression


def test_pearson_and_spearman_by_hand():
    x = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert metrics.pearson(x, [2, 4, 6, 8, 10]) == approx(1.0)
    assert metrics.pearson(x, [5, 4, 3, 2, 1]) == approx(-1.0)
    # monotone but not linear: Spearman 1, Pearson below 1
    assert metrics.spearman(x, [1, 8, 27, 64, 125]) == approx(1.0)
    assert metrics.pearson(x, [1, 8, 27, 64, 125]) < 0.99


def test_ranks_average_ties():
    assert metrics.rankdata([10, 20, 20, 30]).tolist() == [1.0, 2.5, 2.5, 4.0]
    assert metrics.rankdata([3, 3, 3]).tolist() == [2.0, 2.0, 2.0]
    # x ranks [1, 2.5, 2.5, 4], y ranks [1, 2, 3, 4]: Pearson of the ranks
    expected = numpy.corrcoef([1, 2.5, 2.5, 4], [1, 2, 3, 4])[0, 1]
    assert metrics.spearman([10, 20, 20, 30], [1, 2, 3, 4]) == approx(expected)


def test_pearson_and_spearman_match_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = numpy.random.default_rng(1)
    x = rng.integers(0, 6, 300).astype(float)           # many ties
    y = x + rng.normal(0, 2, 300)
    y[::7] = numpy.round(y[::7])
    assert metrics.pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0], abs=1e-12)
    assert metrics.spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0], abs=1e-12)
    assert metrics.rankdata(y).tolist() == pytest.approx(stats.rankdata(y).tolist())

# --------------------------------------------------------------------------- conlleval


def test_conlleval_by_hand():
    gold = [["B-PER", "I-PER", "O", "B-LOC", "O"],
            ["I-ORG", "I-ORG", "O", "I-MISC", "B-MISC"],   # IOB1: B- only between two MISC chunks
            ["O", "B-LOC", "I-LOC"]]
    predicted = [["B-PER", "I-PER", "O", "B-ORG", "O"],       # PER right, LOC called ORG
                 ["B-ORG", "I-ORG", "O", "I-MISC", "I-MISC"],  # ORG right (B-/I- start alike),
                                                               # MISC x2 merged
                 ["B-LOC", "I-LOC", "I-LOC"]]                  # LOC one word too long
    # gold chunks PER LOC ORG MISC MISC LOC = 6, predicted PER ORG ORG MISC LOC = 5,
    # correct PER ORG = 2
    result = metrics.conlleval(gold, predicted)
    assert (result["found_gold"], result["found_predicted"], result["correct"]) == (6, 5, 2)
    assert result["precision"] == approx(40.0)
    assert result["recall"] == approx(100 * 2 / 6)
    assert result["f1"] == approx(2 * 40.0 * (100 / 3) / (40.0 + 100 / 3))
    assert result["accuracy"] == approx(100 * 8 / 13)
    assert result["per_type"]["PER"]["f1"] == approx(100.0)
    assert result["per_type"]["ORG"]["precision"] == approx(50.0)
    assert result["per_type"]["LOC"]["f1"] == 0.0
    # the report conlleval.pl prints for this input (checked against the Perl script)
    assert metrics.format_conlleval(result).splitlines()[:2] == [
        "processed 13 tokens with 6 phrases; found: 5 phrases; correct: 2.",
        "accuracy:  61.54%; precision:  40.00%; recall:  33.33%; FB1:  36.36"]


def test_conlleval_chunk_boundaries():
    # a stray I- after O starts a chunk (conlleval's IOB1 reading), also in BIO data
    result = metrics.conlleval([["O", "I-PER", "I-PER"]], [["O", "B-PER", "I-PER"]])
    assert result["f1"] == approx(100.0)
    # B- after I- of the same type starts a new chunk; I- of another type too
    r = metrics.conlleval([["B-PER", "I-PER", "B-PER", "I-LOC"]],
                          [["B-PER", "I-PER", "I-PER", "I-LOC"]])
    assert (r["found_gold"], r["found_predicted"], r["correct"]) == (3, 2, 1)
    # a sentence boundary ends every chunk: I- at the start of the next sentence is a new one
    r = metrics.conlleval([["B-PER"], ["I-PER"]], [["B-PER"], ["I-PER"]])
    assert (r["found_gold"], r["correct"]) == (2, 2)
    # types split at the first hyphen: "MISC-X" is one type
    assert set(metrics.conlleval([["B-MISC-X"]], [["B-MISC-X"]])["per_type"]) == {"MISC-X"}


def test_conlleval_scores_bio_and_iob1_alike():
    from nanobert.data.tasks import iob1_to_bio
    iob1 = [["I-ORG", "O", "I-PER", "I-PER", "B-PER", "O", "I-LOC"]]
    guess = [["I-ORG", "O", "I-PER", "I-PER", "I-PER", "O", "I-MISC"]]
    bio = [iob1_to_bio(s) for s in iob1]
    assert bio == [["B-ORG", "O", "B-PER", "I-PER", "B-PER", "O", "B-LOC"]]
    a = metrics.conlleval(iob1, guess)
    b = metrics.conlleval(bio, [iob1_to_bio(s) for s in guess])
    assert (a["precision"], a["recall"], a["f1"]) == (b["precision"], b["recall"], b["f1"])

# ------------------------------------------------------------------------------- SQuAD


def test_squad_normalisation():
    assert metrics.normalize_answer("The Cat!") == "cat"
    assert metrics.normalize_answer("an apple, a day; THE end") == "apple day end"
    assert metrics.normalize_answer("  Theatre  of\tthe  absurd ") == "theatre of absurd", \
        "only whole words"
    assert metrics.normalize_answer("U.S.A.") == "usa"


def test_squad_exact_and_f1_by_hand():
    assert metrics.squad_exact("The Eiffel Tower", "eiffel tower.") == 1
    # gold "eiffel tower paris", predicted "tower in paris": common {tower, paris} = 2,
    # precision 2/3, recall 2/3
    assert metrics.squad_f1("the Eiffel Tower, Paris", "tower in Paris") == approx(2 / 3)
    assert metrics.squad_f1("red", "blue") == 0.0
    # no-answer rules: v2.0 scores "" against "" as 1, v1.1 as 0
    assert metrics.squad_f1("", "") == 1.0
    assert metrics.squad_f1("", "something") == 0.0
    assert metrics.squad_f1("", "", version="1.1") == 0.0


def test_squad_v1_evaluation():
    gold = {"a": ["Denver Broncos", "The Denver Broncos"], "b": ["Santa Clara"], "c": ["1"]}
    # c has no prediction: it scores 0
    predictions = {"a": "the denver broncos", "b": "Santa Clara, California"}
    result = metrics.squad_evaluate(gold, predictions, "1.1")
    f1_b = 2 * (2 / 3 * 1) / (2 / 3 + 1)
    assert result == {"exact_match": approx(100 / 3), "f1": approx(100 * (1 + f1_b) / 3),
                      "total": 3}


def test_squad_v2_evaluation_and_null_threshold():
    gold = {"has": ["Paris"], "none": [], "none2": []}
    predictions = {"has": "Paris", "none": "", "none2": "somewhere"}
    result = metrics.squad_evaluate(gold, predictions, "2.0")
    assert result["exact"] == approx(200 / 3)
    assert (result["HasAns_exact"], result["NoAns_exact"], result["NoAns_total"]) == \
        (100.0, 50.0, 2)
    # null odds: above the threshold the prediction becomes "no answer"
    odds = {"has": -3.0, "none": 2.0, "none2": 1.5}
    thresholded = metrics.squad_evaluate(gold, predictions, "2.0", odds, no_answer_threshold=1.0)
    assert thresholded["exact"] == approx(100.0)
    assert thresholded["best_exact"] == approx(100.0) and thresholded["best_exact_thresh"] == -3.0


def test_squad_v2_an_answer_list_of_empty_text_still_has_an_answer():
    """evaluate-v2.0.py: has_answer = bool(qa["answers"]), before normalising; the empty text
    is then scored against gold [""] (so only "no answer" matches it)."""
    gold = {"has": ["Paris"], "none": [], "empty_text": [""]}
    predictions = {"has": "Paris", "none": "", "empty_text": "somewhere"}
    result = metrics.squad_evaluate(gold, predictions, "2.0")
    assert (result["HasAns_exact"], result["HasAns_total"], result["NoAns_total"]) == \
        (50.0, 2, 1)
