"""SQuAD v1.1 / v2.0 for BERT, as the original run_squad.py does it: read the JSON, cut each
(question, paragraph) into overlapping windows, and turn the start / end logits of the
windows back into one answer per question.

Reading. The paragraph is split at whitespace into words (char_to_word_offset maps each
character to its word). A training answer is located by answer_start; when the words at
that place do not contain the answer text (bad offsets, odd Unicode), the question is
skipped and counted, as the original does ("Could not find answer"). Training uses the
first answer of a question; evaluation keeps all answer texts for the official scorer.

Windows. [CLS] question [SEP] window-of-paragraph [SEP] with the question cut to
max_query_length WordPieces; windows of max_seq_length - len(question) - 3 pieces, each
starting doc_stride pieces after the previous one. A training window that does not hold
the whole answer (and every window of an unanswerable v2.0 question) points at [CLS]
(start = end = 0). Each paragraph piece belongs to the window where it has the most context
on both sides (token_is_max_context); answers are only read from there.

Post-processing (write_predictions). For each question, over all its windows: the
n_best_size best starts x the n_best_size best ends, dropping spans outside the paragraph,
not in their max-context window, reversed or longer than max_answer_length pieces; the best
start+end score wins, mapped back to the original text by get_final_text (which undoes
lower-casing / accent stripping / punctuation splitting). v2.0: the null score is the
smallest start[0] + end[0] over the windows, and the answer is "" (no answer) iff
null_score - best_non_null_score > null_score_diff_threshold (default 0.0).
"""
import collections
import dataclasses
import json
import os

import numpy

from .tasks import Features, read_text
from .tokenizer import BasicTokenizer


def _is_whitespace(c):
    return c in " \t\r\n" or ord(c) == 0x202F


@dataclasses.dataclass
class SquadExample:
    qas_id: str
    question_text: str
    doc_tokens: list               # the paragraph's whitespace-separated words
    answers: list                  # every gold answer text ([] when unanswerable)
    orig_answer_text: str = None   # training: the answer trained on
    start_position: int = None     # training: its first and last word
    end_position: int = None
    is_impossible: bool = False
    where: str = ""


def _field(obj, key, kind, where):
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if key not in obj:
        raise ValueError(f"{where}: missing {key!r}")
    value = obj[key]
    if not isinstance(value, kind):
        raise ValueError(f"{where}.{key}: expected {getattr(kind, '__name__', kind)}, "
                         f"got {type(value).__name__}")
    return value


def _has_impossible_questions(dataset, data):
    """A "version" starting with "v2", or any is_impossible key: SQuAD v2.0."""
    return str(dataset.get("version", "")).startswith("v2") or any(
        "is_impossible" in qa for entry in data if isinstance(entry, dict)
        for p in entry.get("paragraphs", []) if isinstance(p, dict)
        for qa in p.get("qas", []) if isinstance(qa, dict))


def _split_words(context):
    """-> (doc_tokens: the whitespace-separated words, char_to_word_offset: per character,
    the index of its word (of the last word before it for whitespace; -1 before the first))."""
    doc_tokens, char_to_word_offset = [], []
    previous_is_whitespace = True
    for c in context:
        if _is_whitespace(c):
            previous_is_whitespace = True
        else:
            if previous_is_whitespace:
                doc_tokens.append(c)
            else:
                doc_tokens[-1] += c
            previous_is_whitespace = False
        char_to_word_offset.append(len(doc_tokens) - 1)
    return doc_tokens, char_to_word_offset


def _answers(qa, where, is_impossible):
    """The answers of a question, each checked for text and an int answer_start."""
    answers = [] if is_impossible else _field(qa, "answers", list, where)
    for k, answer in enumerate(answers):
        _field(answer, "text", str, f"{where}.answers[{k}]")
        start = _field(answer, "answer_start", int, f"{where}.answers[{k}]")
        if isinstance(start, bool):
            raise ValueError(f"{where}.answers[{k}].answer_start: expected int, got bool")
    return answers


def _answer_words(answer, doc_tokens, char_to_word_offset):
    """-> (first word, last word) of a training answer, or None when the words at
    answer_start do not hold its text (as the original: "Could not find answer")."""
    text, offset = answer["text"], answer["answer_start"]
    last = offset + len(text) - 1
    if not text or offset < 0 or last >= len(char_to_word_offset):
        return None
    start_position, end_position = char_to_word_offset[offset], char_to_word_offset[last]
    actual = " ".join(doc_tokens[max(start_position, 0):end_position + 1])
    if start_position < 0 or actual.find(" ".join(text.split())) == -1:
        return None
    return start_position, end_position


def read_squad(path, is_training, version_2_with_negative=None):
    """-> (examples, stats). version_2_with_negative None: detected from the file (a
    "version" starting with "v2", or any is_impossible key). stats: questions, examples,
    answer_mismatch (skipped training questions), impossible, version ("1.1" / "2.0")."""
    path = os.fspath(path)
    try:
        dataset = json.loads(read_text(path))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}:{e.colno}: not valid JSON: {e.msg}") from None
    data = _field(dataset, "data", list, path)
    if version_2_with_negative is None:
        version_2_with_negative = _has_impossible_questions(dataset, data)
    stats = {"questions": 0, "examples": 0, "answer_mismatch": 0, "impossible": 0,
             "version": "2.0" if version_2_with_negative else "1.1"}
    examples, first_seen = [], {}
    if not data:
        raise ValueError(f"{path}: 'data' is empty")
    for a, entry in enumerate(data):
        for p, paragraph in enumerate(_field(entry, "paragraphs", list, f"{path}: data[{a}]")):
            at = f"{path}: data[{a}].paragraphs[{p}]"
            doc_tokens, char_to_word_offset = _split_words(_field(paragraph, "context", str, at))
            for q, qa in enumerate(_field(paragraph, "qas", list, at)):
                where = f"{at}.qas[{q}]"
                qas_id = _field(qa, "id", (str, int), where)
                if str(qas_id) in first_seen:    # scores are per id: a repeat would be lost
                    raise ValueError(f"{where}: question id {str(qas_id)!r} repeats "
                                     f"{first_seen[str(qas_id)]}")
                first_seen[str(qas_id)] = where
                question = _field(qa, "question", str, where)
                is_impossible = (bool(qa.get("is_impossible", False)) if version_2_with_negative
                                 else False)
                answers = _answers(qa, where, is_impossible)
                stats["questions"] += 1
                stats["impossible"] += is_impossible
                example = SquadExample(str(qas_id), question, doc_tokens,
                                       [x["text"] for x in answers],
                                       is_impossible=is_impossible, where=where)
                if is_training and not is_impossible:
                    if not answers:
                        raise ValueError(f"{where}: a training question needs an answer "
                                         "(or is_impossible: true in SQuAD v2.0)")
                    words = _answer_words(answers[0], doc_tokens, char_to_word_offset)
                    if words is None:
                        stats["answer_mismatch"] += 1         # as the original: skip, counted
                        continue
                    example.orig_answer_text = answers[0]["text"]
                    example.start_position, example.end_position = words
                examples.append(example)
    stats["examples"] = len(examples)
    if not stats["questions"]:
        raise ValueError(f"{path}: no questions")
    if is_training and not examples:
        raise ValueError(f"{path}: no usable training question: all {stats['questions']} were "
                         f"skipped ({stats['answer_mismatch']} whose answer text is not at its "
                         f"answer_start in the context)")
    return examples, stats


@dataclasses.dataclass
class DocSpan:
    start: int
    length: int


def _improve_answer_span(doc_tokens, start, end, tokenizer, orig_answer_text):
    """The sub-span of pieces that spells the tokenized answer exactly, if there is one
    ("(1895-1943)." holds the answer "1895" as its own pieces)."""
    answer = " ".join(tokenizer.tokenize(orig_answer_text))
    for new_start in range(start, end + 1):
        for new_end in range(end, new_start - 1, -1):
            if " ".join(doc_tokens[new_start:new_end + 1]) == answer:
                return new_start, new_end
    return start, end


def _check_is_max_context(doc_spans, current, position):
    """Is window `current` the one where piece `position` has the most context: the largest
    min(left, right) context, + 0.01 * window length to break ties."""
    best_score, best_index = None, None
    for index, span in enumerate(doc_spans):
        end = span.start + span.length - 1
        if position < span.start or position > end:
            continue
        score = min(position - span.start, end - position) + 0.01 * span.length
        if best_score is None or score > best_score:
            best_score, best_index = score, index
    return current == best_index


def _doc_pieces(tokenizer, doc_tokens):
    """The paragraph's WordPieces -> (pieces, piece -> its word, word -> its first piece)."""
    tok_to_orig_index, orig_to_tok_index, all_doc_tokens = [], [], []
    for i, token in enumerate(doc_tokens):
        orig_to_tok_index.append(len(all_doc_tokens))
        for sub_token in tokenizer.tokenize(token):
            tok_to_orig_index.append(i)
            all_doc_tokens.append(sub_token)
    return all_doc_tokens, tok_to_orig_index, orig_to_tok_index


def _answer_pieces(tokenizer, example, all_doc_tokens, orig_to_tok_index):
    """-> (first, last) piece of a training example's answer."""
    tok_start = orig_to_tok_index[example.start_position]
    if example.end_position < len(example.doc_tokens) - 1:
        tok_end = orig_to_tok_index[example.end_position + 1] - 1
    else:
        tok_end = len(all_doc_tokens) - 1
    return _improve_answer_span(all_doc_tokens, tok_start, tok_end, tokenizer,
                                example.orig_answer_text)


def _doc_spans(num_pieces, max_tokens_for_doc, doc_stride):
    """Windows of at most max_tokens_for_doc pieces, each doc_stride after the previous one,
    until the last piece is covered; an empty paragraph gets one empty window (so that its
    question still gets an answer)."""
    doc_spans, start_offset = [], 0
    while start_offset < num_pieces:
        length = min(num_pieces - start_offset, max_tokens_for_doc)
        doc_spans.append(DocSpan(start_offset, length))
        if start_offset + length == num_pieces:
            break
        start_offset += min(length, doc_stride)
    return doc_spans or [DocSpan(0, 0)]


def featurize_squad(tokenizer, examples, max_seq_length=384, doc_stride=128, max_query_length=64,
                    is_training=False):
    """Examples -> Features, one row per window. Training rows carry start_positions /
    end_positions; every row's meta holds example_index, tokens, token_to_orig_map and
    token_is_max_context for post-processing. stats: examples, windows, questions_truncated,
    answers_outside (training windows pointing at [CLS] because the answer is elsewhere)."""
    if max_seq_length <= max_query_length + 3:
        raise ValueError(f"max_seq_length ({max_seq_length}) must be greater than "
                         f"max_query_length ({max_query_length}) + 3")
    rows = collections.defaultdict(list)
    stats = {"examples": len(examples), "windows": 0, "questions_truncated": 0,
             "answers_outside": 0}
    for example_index, example in enumerate(examples):
        query_tokens = tokenizer.tokenize(example.question_text)
        if len(query_tokens) > max_query_length:
            query_tokens = query_tokens[:max_query_length]
            stats["questions_truncated"] += 1
        all_doc_tokens, tok_to_orig_index, orig_to_tok_index = _doc_pieces(tokenizer,
                                                                           example.doc_tokens)
        answer = None
        if is_training and not example.is_impossible:
            answer = _answer_pieces(tokenizer, example, all_doc_tokens, orig_to_tok_index)
        max_tokens_for_doc = max_seq_length - len(query_tokens) - 3      # [CLS], [SEP], [SEP]
        doc_spans = _doc_spans(len(all_doc_tokens), max_tokens_for_doc, doc_stride)
        for span_index, span in enumerate(doc_spans):
            tokens = ["[CLS]", *query_tokens, "[SEP]"]
            segment_ids = [0] * len(tokens)
            token_to_orig_map, token_is_max_context = {}, {}
            for split_index in range(span.start, span.start + span.length):
                token_to_orig_map[len(tokens)] = tok_to_orig_index[split_index]
                token_is_max_context[len(tokens)] = _check_is_max_context(doc_spans, span_index,
                                                                          split_index)
                tokens.append(all_doc_tokens[split_index])
                segment_ids.append(1)
            tokens.append("[SEP]")
            segment_ids.append(1)
            rows["input_ids"].append(tokenizer.convert_tokens_to_ids(tokens))
            rows["token_type_ids"].append(segment_ids)
            rows["example_index"].append(example_index)
            rows["tokens"].append(tokens)
            rows["token_to_orig_map"].append(token_to_orig_map)
            rows["token_is_max_context"].append(token_is_max_context)
            if is_training:
                start_position = end_position = 0            # [CLS]: no answer in this window
                if answer is not None:
                    if span.start <= answer[0] and answer[1] <= span.start + span.length - 1:
                        offset = len(query_tokens) + 2 - span.start
                        start_position, end_position = answer[0] + offset, answer[1] + offset
                    else:
                        stats["answers_outside"] += 1
                rows["start_positions"].append(start_position)
                rows["end_positions"].append(end_position)
    stats["windows"] = len(rows["input_ids"])
    targets = {}
    if is_training:
        targets = {"start_positions": numpy.array(rows["start_positions"], dtype=numpy.int64),
                   "end_positions": numpy.array(rows["end_positions"], dtype=numpy.int64)}
    meta = {k: rows[k] for k in ("example_index", "tokens", "token_to_orig_map",
                                 "token_is_max_context")}
    return Features(rows["input_ids"], rows["token_type_ids"], targets, meta=meta, stats=stats)

# ----------------------------------------------------------------------- post-processing


def get_final_text(pred_text, orig_text, do_lower_case, strip_accents=None):
    """Project the predicted (normalised, WordPiece-joined) text back onto the original
    words: "steve smith" in "Steve Smith's" -> "Steve Smith". Aligns the two texts character
    by character with spaces removed; when that fails, returns orig_text (as the original)."""
    def strip_spaces(text):
        chars, ns_to_s = [], {}
        for i, c in enumerate(text):
            if c == " ":
                continue
            ns_to_s[len(chars)] = i
            chars.append(c)
        return "".join(chars), ns_to_s

    basic = BasicTokenizer(do_lower_case=do_lower_case, strip_accents=strip_accents)
    tok_text = " ".join(basic.tokenize(orig_text))
    start = tok_text.find(pred_text)
    if start == -1:
        return orig_text
    end = start + len(pred_text) - 1
    orig_ns_text, orig_ns_to_s = strip_spaces(orig_text)
    tok_ns_text, tok_ns_to_s = strip_spaces(tok_text)
    if len(orig_ns_text) != len(tok_ns_text):
        return orig_text
    tok_s_to_ns = {s: ns for ns, s in tok_ns_to_s.items()}
    if start not in tok_s_to_ns or end not in tok_s_to_ns:
        return orig_text
    orig_start = orig_ns_to_s.get(tok_s_to_ns[start])
    orig_end = orig_ns_to_s.get(tok_s_to_ns[end])
    if orig_start is None or orig_end is None:
        return orig_text
    return orig_text[orig_start:orig_end + 1]


def _best_indexes(logits, n_best_size):
    """Positions of the n largest logits, ties in position order (a stable sort, as the
    original)."""
    order = numpy.argsort(-numpy.asarray(logits, dtype=numpy.float64), kind="stable")
    return order[:n_best_size].tolist()


def _candidates(features, rows, start_logits, end_logits, n_best_size, max_answer_length,
                version_2_with_negative):
    """The spans of one question over its windows (rows), best first: (score, row, start,
    end, start_logit, end_logit), v2.0's null span (row, 0, 0) among them; and the null score
    (the smallest start[0] + end[0] over the windows; 1e6 when there is none)."""
    prelim = []
    score_null, null_row, null_start, null_end = 1e6, None, 0.0, 0.0
    for row in rows:
        starts, ends = numpy.asarray(start_logits[row]), numpy.asarray(end_logits[row])
        tokens = features.meta["tokens"][row]
        to_orig = features.meta["token_to_orig_map"][row]
        max_context = features.meta["token_is_max_context"][row]
        if version_2_with_negative:
            feature_null = float(starts[0] + ends[0])
            if feature_null < score_null:
                score_null, null_row = feature_null, row
                null_start, null_end = float(starts[0]), float(ends[0])
        for s in _best_indexes(starts, n_best_size):
            for e in _best_indexes(ends, n_best_size):
                if s >= len(tokens) or e >= len(tokens) or s not in to_orig or e not in to_orig:
                    continue
                if not max_context.get(s, False) or e < s or e - s + 1 > max_answer_length:
                    continue
                prelim.append((float(starts[s]) + float(ends[e]), row, s, e,
                               float(starts[s]), float(ends[e])))
    if version_2_with_negative and null_row is not None:
        prelim.append((null_start + null_end, null_row, 0, 0, null_start, null_end))
    prelim.sort(key=lambda p: p[0], reverse=True)        # stable: ties keep their order
    return prelim, score_null


def softmax(scores):
    """Probabilities of a few host scores (the n-best), float64: exp(s - max) / sum. A
    post-processing step on the host, not the model's softmax_forward (no cache, no device)."""
    e = numpy.exp(scores - scores.max())
    return e / e.sum()


def _nbest(example, features, prelim, n_best_size, do_lower_case, strip_accents):
    """The n_best_size best distinct answer texts ("" for the null span), with their logits
    and their softmax probability over the n-best."""
    seen, nbest = set(), []
    for score, row, s, e, start_logit, end_logit in prelim:
        if len(nbest) >= n_best_size:
            break
        if s > 0:
            tokens = features.meta["tokens"][row]
            to_orig = features.meta["token_to_orig_map"][row]
            tok_text = " ".join(tokens[s:e + 1]).replace(" ##", "").replace("##", "")
            tok_text = " ".join(tok_text.strip().split())
            orig_text = " ".join(example.doc_tokens[to_orig[s]:to_orig[e] + 1])
            text = get_final_text(tok_text, orig_text, do_lower_case, strip_accents)
            if text in seen:
                continue
        else:
            text = ""
        seen.add(text)
        nbest.append({"text": text, "start_logit": start_logit, "end_logit": end_logit})
    null = next((p for p in prelim if p[2] == 0), None)    # v2.0's null span: the one at [CLS]
    if null is not None and "" not in seen:
        nbest.append({"text": "", "start_logit": null[4], "end_logit": null[5]})
    if null is not None and len(nbest) == 1:
        # Only the null answer survived: a nonce span as transformers' run_squad, so that the
        # null odds (null - best non-null score) exist for every v2.0 question.
        nbest.insert(0, {"text": "empty", "start_logit": 0.0, "end_logit": 0.0})
    if not nbest:                        # no valid span at all (as the original: a nonce answer)
        nbest.append({"text": "empty", "start_logit": 0.0, "end_logit": 0.0})
    scores = numpy.array([n["start_logit"] + n["end_logit"] for n in nbest], dtype=numpy.float64)
    for n, p in zip(nbest, softmax(scores).tolist()):
        n["probability"] = p
    return nbest


def write_predictions(examples, features, start_logits, end_logits, n_best_size=20,
                      max_answer_length=30, do_lower_case=True, version_2_with_negative=False,
                      null_score_diff_threshold=0.0, strip_accents=None):
    """The original write_predictions, without the files.

    start_logits / end_logits: per feature row, a 1-D array (padding beyond the row's tokens
    is ignored). Returns (predictions {id: text}, nbest {id: [{text, probability,
    start_logit, end_logit}]}, null_odds {id: null_score - best_non_null_score} (v2.0 only)).
    """
    by_example = collections.defaultdict(list)
    for row, example_index in enumerate(features.meta["example_index"]):
        by_example[example_index].append(row)
    predictions, all_nbest, null_odds = {}, {}, {}
    for example_index, example in enumerate(examples):
        prelim, score_null = _candidates(features, by_example.get(example_index, []),
                                         start_logits, end_logits, n_best_size,
                                         max_answer_length, version_2_with_negative)
        nbest = _nbest(example, features, prelim, n_best_size, do_lower_case, strip_accents)
        best_non_null = next((n for n in nbest if n["text"]), None)   # never None in v2.0
        if not version_2_with_negative:
            predictions[example.qas_id] = nbest[0]["text"]
        else:
            score_diff = score_null - best_non_null["start_logit"] - best_non_null["end_logit"]
            null_odds[example.qas_id] = score_diff
            predictions[example.qas_id] = ("" if score_diff > null_score_diff_threshold
                                           else best_non_null["text"])
        all_nbest[example.qas_id] = nbest
    return predictions, all_nbest, null_odds


def gold_answers(examples):
    """{question id: [answer texts]} for metrics.squad_evaluate."""
    return {e.qas_id: list(e.answers) for e in examples}
