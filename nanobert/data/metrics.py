"""The scores the BERT paper reports, in plain NumPy: accuracy, F1, Matthews correlation
(GLUE), Pearson / Spearman (STS-B), entity-level precision / recall / F1 with the rules of
conlleval.pl (CoNLL-2003 NER), and exact match / F1 with the official SQuAD v1.1 / v2.0
answer normalisation.

Every function takes host arrays or lists and returns plain Python floats. Scores are
fractions in [0, 1] except where the official script prints percentages (conlleval, SQuAD),
which are kept as percentages so they compare with published numbers digit for digit.
"""
import collections
import re
import string

import numpy

# ---------------------------------------------------------------- classification (GLUE)


def _pair(predictions, labels):
    predictions, labels = numpy.asarray(predictions), numpy.asarray(labels)
    if predictions.shape != labels.shape:
        raise ValueError(f"predictions have shape {predictions.shape}, labels {labels.shape}")
    if predictions.size == 0:
        raise ValueError("no predictions to score")
    return predictions, labels


def accuracy(predictions, labels):
    predictions, labels = _pair(predictions, labels)
    return float((predictions == labels).mean())


def _f1(precision, recall):
    """The harmonic mean of precision and recall; 0.0 when both are 0."""
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


def precision_recall_f1(predictions, labels, positive=1):
    """Binary precision, recall and F1 of the `positive` class (MRPC / QQP report F1).
    A score whose denominator is zero is 0.0 (as sklearn with zero_division=0)."""
    predictions, labels = _pair(predictions, labels)
    true_positive = int(((predictions == positive) & (labels == positive)).sum())
    predicted = int((predictions == positive).sum())
    actual = int((labels == positive).sum())
    precision = true_positive / predicted if predicted else 0.0
    recall = true_positive / actual if actual else 0.0
    return precision, recall, _f1(precision, recall)


def f1_score(predictions, labels, positive=1):
    return precision_recall_f1(predictions, labels, positive)[2]


def matthews_corrcoef(predictions, labels):
    """Matthews correlation (CoLA), for any number of classes (Gorodkin's R_K, as sklearn):
    (c*s - sum_k p_k*t_k) / sqrt((s^2 - sum p_k^2)(s^2 - sum t_k^2)) with c correct, s total,
    p_k / t_k the predicted / true counts of class k. 0.0 when a denominator is zero."""
    predictions, labels = _pair(predictions, labels)
    classes, index = numpy.unique(numpy.concatenate([labels.ravel(), predictions.ravel()]),
                                  return_inverse=True)
    n = labels.size
    true_index, predicted_index = index[:n], index[n:]
    t = numpy.bincount(true_index, minlength=len(classes)).astype(numpy.float64)
    p = numpy.bincount(predicted_index, minlength=len(classes)).astype(numpy.float64)
    c = float((true_index == predicted_index).sum())
    s = float(n)
    denominator = (s * s - p @ p) * (s * s - t @ t)
    if denominator <= 0:
        return 0.0
    return float((c * s - p @ t) / numpy.sqrt(denominator))

# ----------------------------------------------------------------- regression (STS-B)


def pearson(x, y):
    x, y = (numpy.asarray(a, dtype=numpy.float64).ravel() for a in (x, y))
    if x.shape != y.shape or x.size < 2:
        raise ValueError(f"pearson needs two equally long series of at least 2 values, got "
                         f"{x.size} and {y.size}")
    x, y = x - x.mean(), y - y.mean()
    denominator = numpy.sqrt((x @ x) * (y @ y))
    return float(x @ y / denominator) if denominator > 0 else 0.0


def rankdata(a):
    """Ranks 1..n, ties get the average of the ranks they span (scipy's method='average')."""
    a = numpy.asarray(a, dtype=numpy.float64).ravel()
    order = numpy.argsort(a, kind="stable")
    sorted_a = a[order]
    # start of each run of equal values
    starts = numpy.flatnonzero(numpy.r_[True, sorted_a[1:] != sorted_a[:-1]])
    ends = numpy.r_[starts[1:], a.size]                    # one past each run
    average = (starts + ends + 1) / 2.0                    # mean of ranks starts+1 .. ends
    ranks = numpy.empty(a.size)
    ranks[order] = numpy.repeat(average, ends - starts)
    return ranks


def spearman(x, y):
    """Pearson correlation of the ranks (ties averaged)."""
    return pearson(rankdata(x), rankdata(y))

# -------------------------------------------------------------- NER: conlleval.pl rules


def split_tag(tag):
    """'B-PER' -> ('B', 'PER'); 'O' -> ('O', ''). Splits at the first hyphen, as conlleval's
    /^([^-]*)-(.*)$/ does (types may contain hyphens)."""
    prefix, hyphen, kind = tag.partition("-")
    return (prefix, kind) if hyphen else (tag, "")


def end_of_chunk(prev_tag, tag, prev_type, kind):
    """conlleval.pl's endOfChunk: did a chunk end between the previous word and this one?
    Covers IOB1, IOB2 (BIO) and IOE alike, which is why one scorer serves every scheme."""
    return ((prev_tag, tag) in {("B", "B"), ("B", "O"), ("I", "B"), ("I", "O"),
                                ("E", "E"), ("E", "I"), ("E", "O")}
            or (prev_tag not in ("O", ".") and prev_type != kind)
            or prev_tag in ("[", "]"))


def start_of_chunk(prev_tag, tag, prev_type, kind):
    """conlleval.pl's startOfChunk: did a chunk start at this word? ("I" after "O" starts one:
    that is IOB1's rule, and it makes a stray I- in BIO count as a chunk, as conlleval does.)"""
    return ((prev_tag, tag) in {("B", "B"), ("I", "B"), ("O", "B"), ("O", "I"),
                                ("E", "E"), ("E", "I"), ("O", "E")}
            or (tag not in ("O", ".") and prev_type != kind)
            or tag in ("[", "]"))


def conlleval(gold_sentences, predicted_sentences):
    """Entity-level scores exactly as conlleval.pl computes them.

    gold_sentences, predicted_sentences: lists of sentences, each a list of tags
    ("B-PER", "I-LOC", "O", ...). A sentence boundary is an "O" for both sides (conlleval
    reads the blank line as "-X- O O"), so no chunk crosses sentences.

    Returns {"precision", "recall", "f1", "accuracy" (token level), all in percent as the
    script prints them, "found_gold", "found_predicted", "correct", "tokens", "per_type":
    {type: {"precision", "recall", "f1", "found_gold", "found_predicted", "correct"}}}.
    """
    if len(gold_sentences) != len(predicted_sentences):
        raise ValueError(f"{len(gold_sentences)} gold sentences but {len(predicted_sentences)} "
                         "predicted")
    correct_chunk, found_gold, found_guessed = (collections.Counter() for _ in range(3))
    correct_tags = tokens = 0
    in_correct = False
    last_correct, last_correct_type, last_guessed, last_guessed_type = "O", "", "O", ""

    def items():
        for i, (gold, guess) in enumerate(zip(gold_sentences, predicted_sentences)):
            if len(gold) != len(guess):
                raise ValueError(f"sentence {i}: {len(gold)} gold tags but {len(guess)} predicted")
            yield from ((g, p, False) for g, p in zip(gold, guess))
            yield "O", "O", True                                   # the sentence boundary

    for gold, guess, boundary in items():
        correct, correct_type = split_tag(gold)
        guessed, guessed_type = split_tag(guess)
        if in_correct:
            gold_end = end_of_chunk(last_correct, correct, last_correct_type, correct_type)
            guess_end = end_of_chunk(last_guessed, guessed, last_guessed_type, guessed_type)
            if gold_end and guess_end and last_guessed_type == last_correct_type:
                in_correct = False
                correct_chunk[last_correct_type] += 1
            elif gold_end != guess_end or guessed_type != correct_type:
                in_correct = False
        gold_start = start_of_chunk(last_correct, correct, last_correct_type, correct_type)
        guess_start = start_of_chunk(last_guessed, guessed, last_guessed_type, guessed_type)
        if gold_start and guess_start and guessed_type == correct_type:
            in_correct = True
        if gold_start:
            found_gold[correct_type] += 1
        if guess_start:
            found_guessed[guessed_type] += 1
        if not boundary:
            correct_tags += correct == guessed and guessed_type == correct_type
            tokens += 1
        last_correct, last_correct_type = correct, correct_type
        last_guessed, last_guessed_type = guessed, guessed_type
    if in_correct:
        correct_chunk[last_correct_type] += 1

    def prf(correct, guessed, gold):
        precision = 100.0 * correct / guessed if guessed else 0.0
        recall = 100.0 * correct / gold if gold else 0.0
        return {"precision": precision, "recall": recall, "f1": _f1(precision, recall)}

    total = sum(correct_chunk.values())
    result = prf(total, sum(found_guessed.values()), sum(found_gold.values()))
    result.update(accuracy=100.0 * correct_tags / tokens if tokens else 0.0, tokens=tokens,
                  correct=total, found_gold=sum(found_gold.values()),
                  found_predicted=sum(found_guessed.values()))
    result["per_type"] = {
        kind: {**prf(correct_chunk[kind], found_guessed[kind], found_gold[kind]),
               "correct": correct_chunk[kind], "found_gold": found_gold[kind],
               "found_predicted": found_guessed[kind]}
        for kind in sorted(set(found_gold) | set(found_guessed))}
    return result


def format_conlleval(result):
    """The report conlleval.pl prints, from conlleval()'s result."""
    lines = [f"processed {result['tokens']} tokens with {result['found_gold']} phrases; "
             f"found: {result['found_predicted']} phrases; correct: {result['correct']}.",
             f"accuracy: {result['accuracy']:6.2f}%; precision: {result['precision']:6.2f}%; "
             f"recall: {result['recall']:6.2f}%; FB1: {result['f1']:6.2f}"]
    for kind, r in result["per_type"].items():
        lines.append(f"{kind:>17}: precision: {r['precision']:6.2f}%; recall: {r['recall']:6.2f}%; "
                     f"FB1: {r['f1']:6.2f}  {r['found_predicted']}")
    return "\n".join(lines)

# --------------------------------------------------- SQuAD: the official evaluation scripts

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(s):
    """Lower-case, drop ASCII punctuation, drop the articles a / an / the, collapse
    whitespace: the official evaluate-v1.1.py / evaluate-v2.0.py normalisation, in its order."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", s).split())


def squad_exact(gold, prediction):
    return int(normalize_answer(gold) == normalize_answer(prediction))


def squad_f1(gold, prediction, version="2.0"):
    """Token F1 of the normalised answers. v2.0: an empty answer (no-answer) scores 1 against
    an empty answer and 0 otherwise; v1.1 has no such rule (two empty answers score 0)."""
    gold_tokens = normalize_answer(gold).split() if gold else []
    predicted_tokens = normalize_answer(prediction).split() if prediction else []
    if version == "2.0" and (not gold_tokens or not predicted_tokens):
        return float(gold_tokens == predicted_tokens)
    same = sum((collections.Counter(gold_tokens) & collections.Counter(predicted_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted_tokens), same / len(gold_tokens)
    return _f1(precision, recall)


def squad_evaluate(gold_answers, predictions, version="1.1", no_answer_probabilities=None,
                   no_answer_threshold=1.0):
    """The official SQuAD scores, in percent.

    gold_answers: {question id: [answer texts]} (an empty list for an unanswerable v2.0
    question); predictions: {question id: text} ("" = no answer).

    v1.1 (evaluate-v1.1.py): every question counts, a missing prediction scores 0; EM and F1
    are the maximum over the gold answers.
    v2.0 (evaluate-v2.0.py): a question "has an answer" when its answer list is non-empty
    (before normalising, as the official script); for scoring, gold answers that normalise
    to "" are dropped and a question without any is scored against gold [""]; questions
    without a prediction are left out; reports HasAns_* / NoAns_* splits. With
    no_answer_probabilities ({id: score}, e.g. the null-odds that post-processing writes) a
    score above no_answer_threshold turns the prediction into "no answer", and best_exact /
    best_f1 give the best threshold over them.
    """
    if version not in ("1.1", "2.0"):
        raise ValueError(f"SQuAD version must be '1.1' or '2.0', got {version!r}")
    exact, f1, has_answer = {}, {}, {}
    for qid, answers in gold_answers.items():
        if version == "1.1":
            prediction = predictions.get(qid)
            if prediction is None:
                exact[qid] = f1[qid] = 0.0
                continue
            golds = list(answers)
        else:
            golds = [a for a in answers if normalize_answer(a)] or [""]
            has_answer[qid] = bool(answers)
            if qid not in predictions:
                continue
            prediction = predictions[qid]
        exact[qid] = float(max(squad_exact(a, prediction) for a in golds)) if golds else 0.0
        f1[qid] = max(squad_f1(a, prediction, version) for a in golds) if golds else 0.0
    if not exact:
        raise ValueError("no question to score: gold answers and predictions share no id")
    if version == "1.1":
        return {"exact_match": 100.0 * sum(exact.values()) / len(exact),
                "f1": 100.0 * sum(f1.values()) / len(f1), "total": len(exact)}

    raw_exact, raw_f1 = exact, f1
    if no_answer_probabilities is not None:
        missing = [q for q in exact if q not in no_answer_probabilities]
        if missing:
            raise ValueError(f"no no-answer probability for {len(missing)} scored question(s), "
                             f"e.g. {missing[0]!r}")
        def thresholded(scores):
            return {q: (float(not has_answer[q])
                        if no_answer_probabilities[q] > no_answer_threshold else s)
                    for q, s in scores.items()}
        exact, f1 = thresholded(raw_exact), thresholded(raw_f1)
    result = {"exact": 100.0 * sum(exact.values()) / len(exact),
              "f1": 100.0 * sum(f1.values()) / len(f1), "total": len(exact)}
    for name, wanted in (("HasAns", True), ("NoAns", False)):
        ids = [q for q in exact if has_answer[q] == wanted]
        if ids:
            result[f"{name}_exact"] = 100.0 * sum(exact[q] for q in ids) / len(ids)
            result[f"{name}_f1"] = 100.0 * sum(f1[q] for q in ids) / len(ids)
            result[f"{name}_total"] = len(ids)
    if no_answer_probabilities is not None:
        for name, scores in (("exact", raw_exact), ("f1", raw_f1)):
            best, threshold = _best_threshold(predictions, scores, no_answer_probabilities,
                                              has_answer)
            result[f"best_{name}"], result[f"best_{name}_thresh"] = best, threshold
    return result


def _best_threshold(predictions, scores, no_answer_probabilities, has_answer):
    """evaluate-v2.0.py's find_best_thresh, as a running sum: start from 'every question
    answered with no-answer' (counted over all gold questions), then let questions answer in
    increasing no-answer probability (ties in the order of no_answer_probabilities, the
    null-odds file's, as the official stable sort): an answerable one gains its score, an
    unanswerable one with a non-empty prediction loses 1. The best threshold is the
    probability where the running total first reaches its maximum (the official updates only
    on a strict improvement), 0.0 when no prefix beats the start."""
    start = sum(1 for q in has_answer if not has_answer[q])
    order = [q for q in sorted(no_answer_probabilities, key=no_answer_probabilities.get)
             if q in scores]
    gains = [scores[q] if has_answer[q] else -float(bool(predictions[q])) for q in order]
    running = numpy.cumsum([start, *gains])[1:]          # added one by one from the start,
                                                         # in the official's order
    if not order or running.max() <= start:
        return 100.0 * start / len(scores), 0.0
    first = int(numpy.argmax(running))                   # the first index of the maximum
    return 100.0 * float(running[first]) / len(scores), no_answer_probabilities[order[first]]
