"""The algorithm of the original BERT's create_pretraining_data.py: documents in, MLM + NSP
instances out, in plain Python over lists of token ids and one random.Random. Storing the
instances (memory-mappable shards, streaming, the global shuffle without holding them) and
reading them back as batches is nanobert/pretraining_data.py.

The pipeline, in the order the original runs it:

  1. read_documents: one sentence per line, a blank line ends a document (so does the end
     of a file); each line is tokenized with the BertTokenizer, lines with no WordPiece
     token and documents with no line are dropped;
  2. the documents are shuffled once;
  3. dupe_factor passes over all documents; each document is cut into instances by
     create_instances_from_document: sentences are gathered into a chunk until it holds
     target_seq_length tokens (max_seq_length - 3, or with short_seq_prob a random length
     in [2, max_seq_length - 3]); a random number of the chunk's sentences become segment
     A; with p = 0.5 (always, if the chunk is one sentence) segment B is a random stretch
     of another document - "random next", NSP label 1 - and the sentences it did not use
     are put back, otherwise B is the rest of the chunk (label 0); truncate_seq_pair trims
     the longer segment from the front or the back at random; [CLS] A [SEP] B [SEP];
  4. create_masked_lm_predictions: min(max_predictions_per_seq, max(1, round(length *
     masked_lm_prob))) positions other than [CLS]/[SEP] are predicted; each is replaced by
     [MASK] 80% of the time, kept 10%, replaced by a random vocab token 10%; positions
     sorted. Whole-word masking picks words (a piece and its "##" continuations) instead
     of pieces and skips a word that would overshoot the count, as the original does;
  5. all instances are shuffled.

Randomness: a Python random.Random(seed), and every draw is the same call, in the same
order, as in the original script - so for the same corpus and seed the instances, their
masks and their order are the ones it writes (tests/test_pretraining_data.py checks this
against reference/pretraining_data_reference.py, a separate port of the original working on
token strings). Python's random is used rather than a numpy.random.Generator for exactly
that reason; the only numpy Generator is the one a caller passes to
PretrainingDataset.batches, for the order of the rows and for dynamic masking.

Deviations from the original, each deliberate:
  - the end of a file ends a document (the original joins the last document of one file
    with the first of the next when a file lacks a trailing blank line);
  - "random next" tries 10 random documents, as the original, and if all 10 are A's own
    document (probability (1/n)^10 with n documents) takes the next document in the
    shuffled order instead of A's own, so B never comes from A's document when there are
    two or more (counted as random_next_fallbacks in the manifest). This draws nothing
    from the rng, so everything before such an event is unchanged. With a single document
    there is no other one: B comes from the same document, as in the original, with a
    warning.
Everything the original leaves as is stays: the target length is drawn once per document
(not per chunk); a random replacement token may be any vocab entry, special tokens
included; in whole-word masking a "##" piece at the start of B joins the last word of A
and the 80/10/10 choice is made per piece.
"""
import array
import collections
import gzip
import os
import random
import warnings
import zlib

import numpy

from ..formats.fileio import check_regular_file

RANDOM_NEXT_TRIES = 10        # the original's tries at a document other than A's


# ----------------------------------------------------------------------------- documents

def input_files(paths):
    """Files (.txt, .txt.gz, or any file given by name) and folders (every *.txt and *.txt.gz
    directly inside, sorted by name; hidden files skipped) -> list of file paths, in order."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files = []
    for path in paths:
        path = os.fspath(path)
        if os.path.isdir(path):
            inside = sorted(name for name in os.listdir(path)
                            if name.endswith((".txt", ".txt.gz")) and not name.startswith(".")
                            and os.path.isfile(os.path.join(path, name)))
            if not inside:
                raise ValueError(f"folder {path!r} holds no .txt or .txt.gz file")
            files += [os.path.join(path, name) for name in inside]
        else:
            files.append(check_regular_file(path, "input"))   # not /dev/zero, a FIFO, ...
    if not files:
        raise ValueError("no input paths given")
    return files


def read_documents(paths, errors="strict", stats=None):
    """Stream the documents of a corpus in BERT's input format: one sentence per line, a
    blank (or whitespace-only) line between documents. Yields each document as a list of
    its lines, stripped. The end of a file also ends a document.

    paths: a file or folder, or a list of them (see input_files); checked at once - a
    missing one raises FileNotFoundError before anything is read.
    errors: "strict" - bytes that are not UTF-8 raise ValueError naming the file, the line
    and the byte offset (in the decompressed text for .gz); "replace" - each invalid
    sequence becomes U+FFFD (which the tokenizer drops) and is counted in
    stats["utf8_replacements"][file] (and reported with a warning).
    stats: an optional dict, filled with "files", "lines", "documents" and
    "utf8_replacements" as the stream is read.
    A corpus with no non-blank line raises ValueError naming the files (once it is read).
    """
    if errors not in ("strict", "replace"):
        raise ValueError(f"errors must be 'strict' or 'replace', got {errors!r}")
    files = input_files(paths)
    stats = {} if stats is None else stats
    stats.update(files=list(files), lines=0, documents=0, utf8_replacements={})
    return _documents(files, errors, stats)


def _documents(files, errors, stats):
    for path in files:
        document = []
        for line in _lines(path, errors, stats):
            stats["lines"] += 1
            line = line.strip()
            if line:
                document.append(line)
            elif document:
                stats["documents"] += 1
                yield document
                document = []
        if document:
            stats["documents"] += 1
            yield document
    replaced = {path: n for path, n in stats["utf8_replacements"].items() if n}
    if replaced:
        warnings.warn("replaced invalid UTF-8 byte sequences with U+FFFD: " +
                      ", ".join(f"{n} in {path}" for path, n in replaced.items()), stacklevel=2)
    if stats["documents"] == 0:
        raise ValueError(f"no text in {', '.join(map(repr, files))}: the corpus is empty or "
                         "whitespace only")


def _lines(path, errors, stats):
    """Decoded lines of one file, split at b"\\n" only (as the original's reader)."""
    gz = path.endswith(".gz")
    where = " of the decompressed text" if gz else ""
    replaced = 0
    offset = 0
    try:
        with (gzip.open(path, "rb") if gz else open(path, "rb")) as f:
            for number, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    if errors == "strict":
                        raise ValueError(
                            f"{path}: line {number} is not valid UTF-8: byte 0x{raw[e.start]:02x} "
                            f"at byte offset {offset + e.start}{where} (--utf8-errors replace, "
                            "errors='replace' in Python, replaces such bytes with U+FFFD and "
                            "counts them)") from None
                    line, n = _decode_replacing(raw)
                    replaced += n
                    stats["utf8_replacements"][path] = replaced
                offset += len(raw)
                yield line
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise ValueError(f"{path}: not a readable gzip file ({e})") from None


def _decode_replacing(raw):
    """bytes -> (text, number of invalid sequences), each sequence -> U+FFFD exactly as
    bytes.decode(errors="replace") does."""
    parts, count, start = [], 0, 0
    while True:
        try:
            parts.append(raw[start:].decode("utf-8"))
            return "".join(parts), count
        except UnicodeDecodeError as e:
            parts.append(raw[start:start + e.start].decode("utf-8"))
            parts.append("\ufffd")
            count += 1
            start += e.end


# ----------------------------------------------------------------------------- the algorithm

TrainingInstance = collections.namedtuple("TrainingInstance", [
    "tokens",                 # [CLS] A [SEP] B [SEP] after masking, ids
    "segment_b_start",        # len(A) + 2: index of B's first token
    "masked_lm_positions",    # sorted
    "masked_lm_ids",          # the true ids at those positions
    "is_random_next",         # NSP label: True = B is from another document
    "document_index",         # A's document (index into the documents given), for tests
    "random_document_index",  # B's document if is_random_next, else None
    "num_chunk_segments",     # sentences in the chunk A was cut from
])


class VocabInfo(collections.namedtuple("VocabInfo", "size cls_id sep_id mask_id is_subword")):
    """What the algorithm needs to know of the vocab: its size (a random token is any id in
    [0, size)), the ids of [CLS], [SEP], [MASK], and is_subword[id] = 1 for "##" pieces
    (whole-word masking)."""

    @classmethod
    def from_tokens(cls, tokens, cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]"):
        tokens = list(tokens)
        index = {t: i for i, t in enumerate(tokens)}
        missing = [t for t in (cls_token, sep_token, mask_token) if t not in index]
        if missing:
            raise ValueError(f"the vocab lacks the special token(s) {', '.join(missing)}")
        is_subword = bytes(t.startswith("##") for t in tokens)
        return cls(len(tokens), index[cls_token], index[sep_token], index[mask_token], is_subword)

    @classmethod
    def from_tokenizer(cls, tokenizer):
        return cls.from_tokens(_vocab_tokens(tokenizer), tokenizer.cls_token, tokenizer.sep_token,
                               tokenizer.mask_token)


def _vocab_tokens(tokenizer):
    """The vocab as a list, id = position; the ids must be exactly 0 .. size-1 (a random token
    is drawn as a random id, as the original draws a random entry of its vocab list)."""
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else tokenizer.vocab
    tokens = [None] * len(vocab)
    for token, i in vocab.items():
        if not 0 <= i < len(tokens) or tokens[i] is not None:
            raise ValueError(f"the vocab's ids are not 0 .. {len(vocab) - 1} "
                             f"(token {token!r} has id {i})")
        tokens[i] = token
    return tokens


def num_to_predict(length, masked_lm_prob, max_predictions_per_seq):
    """The original's count of MLM predictions for a sequence of `length` tokens (Python's
    round: halves to even)."""
    return min(max_predictions_per_seq, max(1, int(round(length * masked_lm_prob))))


def create_training_instances(documents, rng, vocab, max_seq_length=128, short_seq_prob=0.1,
                              masked_lm_prob=0.15, max_predictions_per_seq=20, dupe_factor=10,
                              whole_word_mask=False, stats=None):
    """Steps 2-4 of the module docstring: yields TrainingInstances in the original's order,
    before its final shuffle (the caller does that: shuffle_permutation(rng, count) right
    after the last instance, with the same rng).

    documents: a sequence (len and indexing) of documents, each a list of sentences, each a
    non-empty list of token ids. rng: a random.Random. vocab: a VocabInfo.
    stats: an optional dict; gets "random_next_fallbacks" (see the module docstring).
    """
    n = len(documents)
    if n == 0:
        raise ValueError("no documents")
    order = array.array("q", range(n))
    shuffle(order, rng)                            # the original shuffles its list of documents
    shuffled = _Reordered(documents, order)
    stats = {} if stats is None else stats
    stats.setdefault("random_next_fallbacks", 0)
    for _ in range(dupe_factor):
        for document_index in range(n):
            for instance in create_instances_from_document(
                    shuffled, document_index, rng, vocab, max_seq_length, short_seq_prob,
                    masked_lm_prob, max_predictions_per_seq, whole_word_mask, stats):
                # report documents by their index in `documents`, not in the shuffled order
                other = instance.random_document_index
                yield instance._replace(
                    document_index=order[document_index],
                    random_document_index=None if other is None else order[other])


def shuffle_permutation(rng, count):
    """The permutation rng.shuffle(instances) applies to `count` instances: row k of the
    shuffled list is instance perm[k]. (Shuffle draws depend only on the length.)"""
    perm = array.array("i" if count < 2**31 else "q", range(count))
    shuffle(perm, rng)
    # no copy: 4 bytes per instance
    return numpy.frombuffer(perm, dtype=numpy.dtype(perm.typecode))


class _Reordered:
    """documents seen through a permutation of their indices."""

    def __init__(self, documents, order):
        self.documents, self.order = documents, order

    def __len__(self):
        return len(self.order)

    def __getitem__(self, i):
        return self.documents[self.order[i]]


def create_instances_from_document(documents, document_index, rng, vocab, max_seq_length,
                                   short_seq_prob, masked_lm_prob, max_predictions_per_seq,
                                   whole_word_mask=False, stats=None):
    """Cut one document into [CLS] A [SEP] B [SEP] instances (step 3 of the module docstring)."""
    document = documents[document_index]
    max_num_tokens = max_seq_length - 3             # room for [CLS], [SEP], [SEP]
    # Mostly fill the sequence (padding is wasted compute), but sometimes - short_seq_prob -
    # make it shorter, so that pretraining also sees the short inputs of fine-tuning. Drawn
    # once per document, as in the original.
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)

    instances = []
    chunk, chunk_length = [], 0
    i, num_sentences = 0, len(document)
    while i < num_sentences:
        chunk.append(document[i])
        chunk_length += len(document[i])
        if i == num_sentences - 1 or chunk_length >= target_seq_length:
            # A is the chunk's first a_end sentences: real sentence boundaries, so that NSP
            # cannot be solved by spotting a sentence cut in half.
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            tokens_a = [t for sentence in chunk[:a_end] for t in sentence]
            random_document_index = None
            if len(chunk) == 1 or rng.random() < 0.5:
                is_random_next = True
                target_b_length = target_seq_length - len(tokens_a)
                random_document_index = _random_other_document(documents, document_index, rng,
                                                               stats)
                random_document = documents[random_document_index]
                tokens_b = []
                for j in range(rng.randint(0, len(random_document) - 1), len(random_document)):
                    tokens_b += random_document[j]
                    if len(tokens_b) >= target_b_length:
                        break
                # The chunk's sentences after A were not used: put them back for the next chunk.
                i -= len(chunk) - a_end
            else:
                is_random_next = False
                tokens_b = [t for sentence in chunk[a_end:] for t in sentence]
            tokens_a, tokens_b = truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
            tokens = [vocab.cls_id, *tokens_a, vocab.sep_id, *tokens_b, vocab.sep_id]
            tokens, positions, labels = create_masked_lm_predictions(
                tokens, masked_lm_prob, max_predictions_per_seq, vocab, rng, whole_word_mask)
            instances.append(TrainingInstance(tokens, len(tokens_a) + 2, positions, labels,
                                              is_random_next, document_index,
                                              random_document_index, len(chunk)))
            chunk, chunk_length = [], 0
        i += 1
    return instances


def _shuffle_like_random(x, rng):
    """random.Random.shuffle(x), inlined: the same draws (getrandbits with rejection, as
    Random._randbelow) and the same swaps, at about half the cost - the MLM candidate
    shuffle is the inner loop of the whole algorithm."""
    getrandbits = rng.getrandbits
    for i in range(len(x) - 1, 0, -1):
        n = i + 1
        k = n.bit_length()
        j = getrandbits(k)
        while j >= n:
            j = getrandbits(k)
        x[i], x[j] = x[j], x[i]


def _shuffle_with_method(x, rng):
    rng.shuffle(x)


def _pick_shuffle():
    """The inlined shuffle where it reproduces this Python's random.Random.shuffle exactly
    (checked here on a few lengths and seeds), else Random.shuffle itself."""
    for seed in range(3):
        for n in (0, 1, 2, 3, 7, 100, 1000):
            a, b = list(range(n)), list(range(n))
            r1, r2 = random.Random(seed), random.Random(seed)
            random.Random.shuffle(r1, a)
            _shuffle_like_random(b, r2)
            if a != b or r1.getstate() != r2.getstate():
                return _shuffle_with_method
    return _shuffle_like_random


def shuffle(x, rng):
    """rng.shuffle(x) for a random.Random rng, fast where possible (see _pick_shuffle)."""
    if type(rng) is not random.Random:
        return rng.shuffle(x)                       # a subclass may draw differently
    return _SHUFFLE(x, rng)


def _random_other_document(documents, document_index, rng, stats):
    for _ in range(RANDOM_NEXT_TRIES):
        index = rng.randint(0, len(documents) - 1)
        if index != document_index:
            return index
    if len(documents) > 1:
        # All tries hit A's own document (rare unless there are very few documents): take the
        # next one in the (shuffled) order instead; no rng draw, so the stream is unchanged.
        if stats is not None:
            stats["random_next_fallbacks"] = stats.get("random_next_fallbacks", 0) + 1
        return (document_index + 1) % len(documents)
    return index                # a single document: B from A's own, as the original does


def truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng):
    """Trim the longer segment (B on a tie), one token at a time, from the front or the back at
    random (so that neither end is always the one lost), until both fit. Returns the trimmed
    (A, B). Counts the cuts first and slices once: the same draws as popping one at a time."""
    len_a, len_b = len(tokens_a), len(tokens_b)
    cut = [[0, 0], [0, 0]]                          # [A, B] x [front, back]
    random_ = rng.random
    while len_a + len_b > max_num_tokens:
        side = 0 if len_a > len_b else 1
        cut[side][0 if random_() < 0.5 else 1] += 1
        if side == 0:
            len_a -= 1
        else:
            len_b -= 1
    (a_front, a_back), (b_front, b_back) = cut
    return (tokens_a[a_front:len(tokens_a) - a_back], tokens_b[b_front:len(tokens_b) - b_back])


def create_masked_lm_predictions(tokens, masked_lm_prob, max_predictions_per_seq, vocab, rng,
                                 whole_word_mask=False):
    """Choose the MLM positions of one sequence and mask them (step 4 of the module
    docstring). Returns (masked tokens, sorted positions, true ids at those positions)."""
    special = (vocab.cls_id, vocab.sep_id)
    if whole_word_mask:
        # A word is a piece and the "##" pieces after it; [CLS]/[SEP] are skipped, so a "##"
        # piece right after [SEP] joins the word before it, as in the original.
        is_subword = vocab.is_subword
        candidates = []
        for i, t in enumerate(tokens):
            if t in special:
                continue
            if candidates and is_subword[t]:
                candidates[-1].append(i)
            else:
                candidates.append([i])
    elif tokens.count(vocab.cls_id) == 1 and tokens.count(vocab.sep_id) == 2:
        # the usual case, [CLS] and [SEP] only where we put them: every other position
        sep = tokens.index(vocab.sep_id)
        candidates = [*range(1, sep), *range(sep + 1, len(tokens) - 1)]
    else:
        candidates = [i for i, t in enumerate(tokens) if t not in special]
    shuffle(candidates, rng)

    count = num_to_predict(len(tokens), masked_lm_prob, max_predictions_per_seq)
    output = list(tokens)
    positions = []
    random_, randint = rng.random, rng.randint
    for word in candidates:
        if len(positions) >= count:
            break
        if whole_word_mask:
            if len(positions) + len(word) > count:
                continue                            # the whole word would overshoot: skip it
        else:
            word = (word,)
        for i in word:
            if random_() < 0.8:
                output[i] = vocab.mask_id
            elif random_() < 0.5:
                pass                                # 10%: keep the true token
            else:
                output[i] = randint(0, vocab.size - 1)   # 10%: any vocab entry
            positions.append(i)
    positions.sort()
    return output, positions, [tokens[i] for i in positions]


_SHUFFLE = _pick_shuffle()
