"""SQuAD v2.0 as the official evaluate-v2.0.py: the scores equal it on every field, on
hundreds of random dev sets (unanswerable questions, gold answers that normalise to "" ("the",
"."), empty predictions, no-answer probabilities with many ties, listed in another order than
the questions: the official threshold sweep breaks ties in the null-odds file's order); every
question gets null odds; a repeated question id and a training file with no usable question
are refused."""
import json

import numpy
import pytest

from nanobert.data import metrics, squad
from reference.squad_v2_official import official_v2
from test_tasks import fake_logits, path, squad_tokenizer

WORDS = ["the", "a", "cat", "dog", "sat", "on", "mat", "red", ".", "An", "Paris", "1984"]


def random_case(rng):
    """-> (dataset, gold {id: [texts]}, predictions, na_probs) for one random dev set."""
    qas, gold, predictions, na_probs = [], {}, {}, {}

    def text(most=4):
        return " ".join(rng.choice(WORDS, size=int(rng.integers(1, most + 1))))
    for i in range(int(rng.integers(1, 12))):
        qid = f"q{i}"
        kind = rng.random()
        if kind < 0.3:
            answers = []                                   # unanswerable
        elif kind < 0.4:
            answers = [rng.choice(["the", ".", "a an", " "])]   # normalises to ""
        else:
            answers = [text() for _ in range(int(rng.integers(1, 4)))]
        qas.append({"id": qid, "question": "?", "answers": [{"text": a, "answer_start": 0}
                                                            for a in answers]})
        gold[qid] = answers
        predictions[qid] = "" if rng.random() < 0.35 else text()
    for qid in rng.permutation(list(gold)):                # another order than the questions
        na_probs[str(qid)] = float(rng.choice([-2.0, -0.5, 0.0, 0.0, 0.5, 1.0, 1.5, 3.0]))
    dataset = [{"title": "t", "paragraphs": [{"context": "c", "qas": qas}]}]
    return dataset, gold, predictions, na_probs


@pytest.mark.parametrize("seed", range(300))
def test_v2_scores_equal_the_official_script(seed):
    rng = numpy.random.default_rng(seed)
    dataset, gold, predictions, na_probs = random_case(rng)
    for probabilities in (None, na_probs):
        expected = official_v2(dataset, predictions, probabilities)
        got = metrics.squad_evaluate(gold, predictions, "2.0",
                                     no_answer_probabilities=probabilities)
        assert set(got) == set(expected), (sorted(got), sorted(expected))
        for key, value in expected.items():
            assert got[key] == pytest.approx(value, abs=1e-12), (key, got[key], value)


def test_every_v2_question_gets_null_odds_even_when_only_the_null_answer_survives():
    """No valid span at all (max_answer_length 0 rules every one out): the n-best holds the
    null answer alone, yet the null odds exist, so the evaluation with them runs."""
    tok = squad_tokenizer()
    examples, _ = squad.read_squad(path("squad_v2.json"), is_training=False)
    features = squad.featurize_squad(tok, examples, max_seq_length=64, doc_stride=16,
                                     max_query_length=16)
    starts, ends = fake_logits(features, [])
    predictions, nbest, odds = squad.write_predictions(
        examples, features, starts, ends, max_answer_length=0, version_2_with_negative=True)
    assert set(odds) == set(predictions) == {e.qas_id for e in examples}
    assert all(any(n["text"] == "" for n in nbest[q]) for q in nbest)
    scores = metrics.squad_evaluate(squad.gold_answers(examples), predictions, "2.0",
                                    no_answer_probabilities=odds)
    assert "best_f1" in scores


def squad_file(tmp_path, qas):
    context = "Paris is the capital of France."
    data = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [
        {"context": context, "qas": qas}]}]}
    file = tmp_path / "squad.json"
    file.write_text(json.dumps(data))
    return str(file)


def test_a_repeated_question_id_is_refused(tmp_path):
    qa = {"id": "q1", "question": "What?", "answers": [{"text": "Paris", "answer_start": 0}]}
    file = squad_file(tmp_path, [qa, {**qa, "question": "Again?"}])
    with pytest.raises(ValueError, match=r"qas\[1\]: question id 'q1' repeats .*qas\[0\]"):
        squad.read_squad(file, is_training=False)


def test_a_training_file_without_a_usable_question_is_a_clear_error(tmp_path):
    qas = [{"id": f"q{i}", "question": "What?", "answers": [{"text": "Paris", "answer_start": 9}]}
           for i in range(3)]                                   # "Paris" is not at 9
    file = squad_file(tmp_path, qas)
    with pytest.raises(ValueError, match="no usable training question: all 3 were skipped "
                                         r"\(3 whose answer text is not at its answer_start"):
        squad.read_squad(file, is_training=True)
