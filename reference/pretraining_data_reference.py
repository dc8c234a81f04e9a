"""A port of google-research/bert's create_pretraining_data.py (the instance-making part),
kept as close to the original's behaviour as Python allows, for the parity test of
nanobert/pretraining_instances.py (through nanobert/pretraining_data.py).

It deliberately shares nothing with nanobert's implementation: it works on WordPiece token
*strings* (as the original does), holds every document and instance in memory, calls
random.Random's own methods (shuffle, randint, random) one draw at a time, truncates by
deleting one token at a time, and gives up on finding another document after 10 tries
exactly as the original (no fallback). Only the tokenizer is passed in. No TensorFlow: the
instances come back as the padded feature arrays the original writes into its TFRecords.

    python -m reference.pretraining_data_reference corpus.txt vocab.txt   # prints a summary
"""
import gzip
import random
import sys

import numpy


class Instance:
    def __init__(self, tokens, segment_ids, masked_lm_positions, masked_lm_labels, is_random_next):
        self.tokens = tokens
        self.segment_ids = segment_ids
        self.masked_lm_positions = masked_lm_positions
        self.masked_lm_labels = masked_lm_labels
        self.is_random_next = is_random_next


def read_corpus(input_files, tokenizer):
    """All documents (lists of tokenized lines) of the files, in order. As the original: a
    line is stripped; an empty one starts a new document; a line that tokenizes to nothing
    is dropped; files are read one after the other into the same running list (no document
    break between files); empty documents are removed at the end."""
    documents = [[]]
    for path in input_files:
        opener = gzip.open if str(path).endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8", newline="\n") as reader:
            for raw in reader:
                line = raw.strip()
                if not line:
                    documents.append([])
                tokens = tokenizer.tokenize(line)
                if tokens:
                    documents[-1].append(tokens)
    return [d for d in documents if d]


def create_training_instances(documents, tokenizer, max_seq_length, dupe_factor, short_seq_prob,
                              masked_lm_prob, max_predictions_per_seq, rng,
                              do_whole_word_mask=False):
    documents = list(documents)
    rng.shuffle(documents)
    vocab_words = list(tokenizer.vocab.keys())
    instances = []
    for _ in range(dupe_factor):
        for index in range(len(documents)):
            instances += instances_from_document(
                documents, index, max_seq_length, short_seq_prob, masked_lm_prob,
                max_predictions_per_seq, vocab_words, rng, do_whole_word_mask)
    rng.shuffle(instances)
    return instances


def instances_from_document(documents, document_index, max_seq_length, short_seq_prob,
                            masked_lm_prob, max_predictions_per_seq, vocab_words, rng,
                            do_whole_word_mask):
    document = documents[document_index]
    max_num_tokens = max_seq_length - 3
    target = max_num_tokens
    if rng.random() < short_seq_prob:
        target = rng.randint(2, max_num_tokens)

    out = []
    chunk = []
    length = 0
    i = 0
    while i < len(document):
        chunk.append(document[i])
        length += len(document[i])
        if i == len(document) - 1 or length >= target:
            if chunk:
                a_end = 1
                if len(chunk) >= 2:
                    a_end = rng.randint(1, len(chunk) - 1)
                first = []
                for sentence in chunk[:a_end]:
                    first.extend(sentence)
                second = []
                if len(chunk) == 1 or rng.random() < 0.5:
                    random_next = True
                    target_b = target - len(first)
                    for _ in range(10):
                        other = rng.randint(0, len(documents) - 1)
                        if other != document_index:
                            break
                    other_document = documents[other]
                    start = rng.randint(0, len(other_document) - 1)
                    for j in range(start, len(other_document)):
                        second.extend(other_document[j])
                        if len(second) >= target_b:
                            break
                    i -= len(chunk) - a_end
                else:
                    random_next = False
                    for sentence in chunk[a_end:]:
                        second.extend(sentence)
                truncate_pair(first, second, max_num_tokens, rng)
                assert first and second
                tokens = ["[CLS]"] + first + ["[SEP]"] + second + ["[SEP]"]
                segment_ids = [0] * (len(first) + 2) + [1] * (len(second) + 1)
                tokens, positions, labels = masked_lm_predictions(
                    tokens, masked_lm_prob, max_predictions_per_seq, vocab_words, rng,
                    do_whole_word_mask)
                out.append(Instance(tokens, segment_ids, positions, labels, random_next))
            chunk = []
            length = 0
        i += 1
    return out


def masked_lm_predictions(tokens, masked_lm_prob, max_predictions_per_seq, vocab_words, rng,
                          do_whole_word_mask):
    candidates = []
    for i, token in enumerate(tokens):
        if token in ("[CLS]", "[SEP]"):
            continue
        if do_whole_word_mask and candidates and token.startswith("##"):
            candidates[-1].append(i)
        else:
            candidates.append([i])
    rng.shuffle(candidates)
    output = list(tokens)
    count = min(max_predictions_per_seq, max(1, int(round(len(tokens) * masked_lm_prob))))
    chosen = []                                   # (index, true token)
    covered = set()
    for group in candidates:
        if len(chosen) >= count:
            break
        if len(chosen) + len(group) > count:
            continue
        if any(index in covered for index in group):
            continue
        for index in group:
            covered.add(index)
            if rng.random() < 0.8:
                replacement = "[MASK]"
            elif rng.random() < 0.5:
                replacement = tokens[index]
            else:
                replacement = vocab_words[rng.randint(0, len(vocab_words) - 1)]
            output[index] = replacement
            chosen.append((index, tokens[index]))
    assert len(chosen) <= count
    chosen.sort(key=lambda pair: pair[0])
    return output, [index for index, _ in chosen], [label for _, label in chosen]


def truncate_pair(first, second, max_num_tokens, rng):
    while len(first) + len(second) > max_num_tokens:
        longer = first if len(first) > len(second) else second
        assert longer
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def features(instances, tokenizer, max_seq_length, max_predictions_per_seq):
    """The arrays write_instance_to_example_files puts in the TFRecords, stacked: input_ids,
    input_mask, segment_ids [N, T]; masked_lm_positions, masked_lm_ids, masked_lm_weights
    [N, P]; next_sentence_labels [N]."""
    rows = {k: [] for k in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions",
                            "masked_lm_ids", "masked_lm_weights", "next_sentence_labels")}
    for instance in instances:
        ids = tokenizer.convert_tokens_to_ids(instance.tokens)
        assert len(ids) <= max_seq_length
        pad = max_seq_length - len(ids)
        rows["input_ids"].append(ids + [0] * pad)
        rows["input_mask"].append([1] * len(ids) + [0] * pad)
        rows["segment_ids"].append(list(instance.segment_ids) + [0] * pad)
        k = len(instance.masked_lm_positions)
        pad = max_predictions_per_seq - k
        rows["masked_lm_positions"].append(list(instance.masked_lm_positions) + [0] * pad)
        rows["masked_lm_ids"].append(
            tokenizer.convert_tokens_to_ids(instance.masked_lm_labels) + [0] * pad)
        rows["masked_lm_weights"].append([1.0] * k + [0.0] * pad)
        rows["next_sentence_labels"].append(1 if instance.is_random_next else 0)
    return {k: numpy.asarray(v, dtype=numpy.float32 if k == "masked_lm_weights" else numpy.int64)
            for k, v in rows.items()}


def run(input_files, tokenizer, max_seq_length=128, max_predictions_per_seq=20, masked_lm_prob=0.15,
        dupe_factor=10, short_seq_prob=0.1, seed=12345, do_whole_word_mask=False):
    """The original main(): random.Random(seed), read, make, shuffle -> feature arrays."""
    rng = random.Random(seed)
    documents = read_corpus(input_files, tokenizer)
    instances = create_training_instances(documents, tokenizer, max_seq_length, dupe_factor,
                                          short_seq_prob, masked_lm_prob, max_predictions_per_seq,
                                          rng, do_whole_word_mask)
    return features(instances, tokenizer, max_seq_length, max_predictions_per_seq)


if __name__ == "__main__":
    from nanobert.data.tokenizer import BertTokenizer
    out = run([sys.argv[1]], BertTokenizer(sys.argv[2]), dupe_factor=1)
    print({k: v.shape for k, v in out.items()}, "random next:", out["next_sentence_labels"].mean())
