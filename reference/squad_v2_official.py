"""The logic of the official SQuAD v2.0 evaluation (evaluate-v2.0.py, Rajpurkar & Jia et al.),
written out again from its definitions so that tests can compare nanobert.data.metrics with it
on many random cases. Kept deliberately literal: the same order of operations, the same dict
iteration orders, the same places where the official script would raise.

    official_v2(dataset, predictions, na_probs=None, na_prob_thresh=1.0) -> dict of scores

dataset: the "data" list of a SQuAD v2.0 file; predictions: {qid: text}; na_probs: {qid:
probability of no answer}, in the order the null-odds file lists them (ties in the best-
threshold sweep are broken by that order, as json.load keeps it).
"""
import collections
import re
import string


def normalize(text):
    """Lower case, drop punctuation and the articles a / an / the, squeeze whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text, flags=re.UNICODE)
    return " ".join(text.split())


def tokens(text):
    return normalize(text).split() if text else []


def exact(gold, prediction):
    return int(normalize(gold) == normalize(prediction))


def f1(gold, prediction):
    gold_tokens, predicted_tokens = tokens(gold), tokens(prediction)
    if not gold_tokens or not predicted_tokens:     # no-answer on either side: all or nothing
        return int(gold_tokens == predicted_tokens)
    shared = collections.Counter(gold_tokens) & collections.Counter(predicted_tokens)
    common = sum(shared.values())
    if common == 0:
        return 0
    precision, recall = common / len(predicted_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def has_answer_by_id(dataset):
    """A question "has an answer" when its answer list is non-empty, before normalising."""
    return {qa["id"]: bool(qa["answers"])
            for article in dataset for paragraph in article["paragraphs"]
            for qa in paragraph["qas"]}


def raw_scores(dataset, predictions):
    exact_scores, f1_scores = {}, {}
    for article in dataset:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                qid = qa["id"]
                golds = [a["text"] for a in qa["answers"] if normalize(a["text"])] or [""]
                if qid not in predictions:                 # the official prints and skips
                    continue
                exact_scores[qid] = max(exact(g, predictions[qid]) for g in golds)
                f1_scores[qid] = max(f1(g, predictions[qid]) for g in golds)
    return exact_scores, f1_scores


def thresholded(scores, na_probs, has_answer, threshold):
    return {qid: (float(not has_answer[qid]) if na_probs[qid] > threshold else score)
            for qid, score in scores.items()}


def averages(exact_scores, f1_scores, qids=None):
    if not qids:
        total = len(exact_scores)
        return {"exact": 100.0 * sum(exact_scores.values()) / total,
                "f1": 100.0 * sum(f1_scores.values()) / total, "total": total}
    total = len(qids)
    return {"exact": 100.0 * sum(exact_scores[q] for q in qids) / total,
            "f1": 100.0 * sum(f1_scores[q] for q in qids) / total, "total": total}


def best_threshold(predictions, scores, na_probs, has_answer):
    """Start from "every question answered with no-answer" and lower the bar one question
    at a time, in increasing na_prob (stable: ties in na_probs' own order)."""
    current = best = sum(1 for q in has_answer if not has_answer[q])
    threshold = 0.0
    for qid in sorted(na_probs, key=lambda q: na_probs[q]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            current += scores[qid]
        elif predictions[qid]:
            current -= 1
        if current > best:
            best, threshold = current, na_probs[qid]
    return 100.0 * best / len(scores), threshold


def official_v2(dataset, predictions, na_probs=None, na_prob_thresh=1.0):
    given_na_probs = na_probs is not None
    if not given_na_probs:
        na_probs = {qid: 0.0 for qid in predictions}
    has_answer = has_answer_by_id(dataset)
    with_answer = [q for q, v in has_answer.items() if v]
    without_answer = [q for q, v in has_answer.items() if not v]
    exact_raw, f1_raw = raw_scores(dataset, predictions)
    exact_scores = thresholded(exact_raw, na_probs, has_answer, na_prob_thresh)
    f1_scores = thresholded(f1_raw, na_probs, has_answer, na_prob_thresh)
    result = averages(exact_scores, f1_scores)
    for name, qids in (("HasAns", with_answer), ("NoAns", without_answer)):
        if qids:
            result.update({f"{name}_{k}": v
                           for k, v in averages(exact_scores, f1_scores, qids).items()})
    if given_na_probs:
        for name, raw in (("exact", exact_raw), ("f1", f1_raw)):
            best, threshold = best_threshold(predictions, raw, na_probs, has_answer)
            result[f"best_{name}"], result[f"best_{name}_thresh"] = best, threshold
    return result
