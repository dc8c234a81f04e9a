"""Fine-tuning data: readers for the files people already have, and their featurisation into
BERT inputs ([CLS] A [SEP] B [SEP], segment ids, labels).

Readers (each error names the file and line):
  read_tsv / read_glue   GLUE-style TSV, one example per line (GLUE_TASKS documents the
                         column layout of each GLUE task)
  read_conll             CoNLL-2003 columns: "word ... tag", a blank line between sentences,
                         -DOCSTART- lines between documents; BIO (IOB2) or IOB1 tags
  read_swag              SWAG CSV: sent1, sent2, ending0..ending3, label
  (SQuAD JSON is in nanobert/squad.py; the packaged real data sets in nanobert/datasets.py.)

Truncation rules (every cut is counted and reported, never silent):
  one text       keep its first max_seq_length - 2 WordPieces;
  a pair         the original run_classifier.py rule (_truncate_seq_pair): drop the last
                 WordPiece of the longer text (of B when both are equally long) until
                 [CLS] A [SEP] B [SEP] fits - BertTokenizer.truncate_sequences("longest_first");
  NER sentence   keep the first max_seq_length - 2 WordPieces; a word whose first piece is
                 cut gets no prediction (scored as "O") and is counted;
  choices        each (context, ending) pair as a pair above.
"""
import csv
import dataclasses
import io
import os

import numpy

from ..model.ops import IGNORE_INDEX          # label of positions the loss skips
from .tokenizer import BertTokenizer

# ----------------------------------------------------------------------------- files


def read_text(path):
    """The text of a UTF-8 file (a BOM is dropped). Missing file -> FileNotFoundError; empty
    file or bad UTF-8 -> ValueError naming file, line and byte offset."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such file: {path}")
    with open(path, "rb") as f:
        raw = f.read()
    if not raw.strip():
        raise ValueError(f"{path}: the file is empty")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise ValueError(f"{path}:{line}: not UTF-8 (byte {raw[e.start]:#04x} at offset "
                         f"{e.start})") from None


def read_text_lines(path):
    """The lines of a UTF-8 text file (see read_text), line ends removed."""
    # split on "\n" only: str.splitlines would also split at U+2028, U+0085, ... inside a text
    lines = read_text(path).split("\n")
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _where(path, line):
    return f"{path}:{line}"

# ------------------------------------------------------------------------ text examples


@dataclasses.dataclass
class TextExample:
    """One sentence (text_b None) or sentence pair, with its label: a str for classification,
    a float for regression, a tuple of str for multi-label (empty: none of the labels), None in
    a file without labels. `where` is "file:line"."""
    text_a: str
    text_b: str = None
    label: object = None
    where: str = ""


@dataclasses.dataclass(frozen=True)
class GlueLayout:
    task: str            # classify | pair | regress
    columns: tuple       # text column(s): header names, or 0-based numbers when header=False
    label: object        # label column
    labels: tuple        # the label set (None: regression)
    metric: str          # the score GLUE / the paper reports, used to pick the best checkpoint
    header: bool = True
    test_columns: tuple = None   # text columns of a headed, unlabeled test file (CoLA)


# The GLUE TSV layouts (train.tsv / dev.tsv; test.tsv lacks the label column and is read as
# unlabeled), by the column names of each file's header:
#   task   task kind  text A      text B      label         labels
#   CoLA   classify   column 3    -           column 1      0 / 1   (no header: source, label,
#                                                                   original mark, sentence;
#                                                                   its test.tsv: index, sentence)
#   SST-2  classify   sentence    -           label         0 / 1
#   MRPC   pair       #1 String   #2 String   Quality       0 / 1   (file starts with a BOM)
#   RTE    pair       sentence1   sentence2   label         entailment / not_entailment
#   MNLI   pair       sentence1   sentence2   gold_label    contradiction / entailment / neutral
#   QNLI   pair       question    sentence    label         entailment / not_entailment
#   QQP    pair       question1   question2   is_duplicate  0 / 1
#   STS-B  regress    sentence1   sentence2   score         a number in [0, 5]
#   WNLI   pair       sentence1   sentence2   label         0 / 1
ENTAILMENT_LABELS = ("entailment", "not_entailment")
GLUE_TASKS = {
    "cola": GlueLayout("classify", (3,), 1, ("0", "1"), "matthews", header=False,
                       test_columns=("sentence",)),
    "sst-2": GlueLayout("classify", ("sentence",), "label", ("0", "1"), "accuracy"),
    "mrpc": GlueLayout("pair", ("#1 String", "#2 String"), "Quality", ("0", "1"), "f1"),
    "rte": GlueLayout("pair", ("sentence1", "sentence2"), "label", ENTAILMENT_LABELS, "accuracy"),
    "mnli": GlueLayout("pair", ("sentence1", "sentence2"), "gold_label",
                       ("contradiction", "entailment", "neutral"), "accuracy"),
    "qnli": GlueLayout("pair", ("question", "sentence"), "label", ENTAILMENT_LABELS, "accuracy"),
    "qqp": GlueLayout("pair", ("question1", "question2"), "is_duplicate", ("0", "1"), "f1"),
    "sts-b": GlueLayout("regress", ("sentence1", "sentence2"), "score", None, "spearman"),
    "wnli": GlueLayout("pair", ("sentence1", "sentence2"), "label", ("0", "1"), "accuracy"),
}
GLUE_ALIASES = {"sst2": "sst-2", "stsb": "sts-b", "sts": "sts-b", "mnli-mm": "mnli",
                "mnli-m": "mnli"}


def glue_layout(name):
    key = GLUE_ALIASES.get(name.lower(), name.lower())
    if key not in GLUE_TASKS:
        raise ValueError(f"unknown GLUE task {name!r}; known: {', '.join(GLUE_TASKS)}")
    return GLUE_TASKS[key]


def parse_columns(spec):
    """'0,1' -> (0, 1); 'sentence1,sentence2' -> ('sentence1', 'sentence2')."""
    if isinstance(spec, str):
        items = [s.strip() for s in spec.split(",") if s.strip()]
    else:
        items = list(spec)
    return tuple(int(s) if isinstance(s, int) or s.isdigit() else s for s in items)


def read_tsv(path, text_columns, label_column=None, header=True, regression=False,
             require_labels=True, multi_label=False):
    """Tab-separated examples, one per line, no quoting (as GLUE's files: csv with quotechar
    None). Columns are header names or 0-based numbers. With a header every line must have
    as many fields as the header; without one, at least enough for the columns used.
    A label column missing from the header makes an unlabeled file (a GLUE test set) unless
    require_labels. Labels are kept as stripped strings, or floats with regression=True, or
    with multi_label=True tuples of the comma-separated names ("sports,politics"; an empty
    field: no label). Trailing blank lines are ignored; a blank line inside is an error."""
    path = os.fspath(path)
    lines = read_text_lines(path)
    while lines and not lines[-1].strip():
        lines.pop()
    names = lines[0].split("\t") if header else None
    if len(lines) <= bool(header):
        raise ValueError(f"{path}: no examples (only a header line)")
    text_index, label_index = _column_indexes(path, names, text_columns, label_column,
                                              require_labels)
    needed = max(text_index + ([label_index] if label_index is not None else [])) + 1
    examples = []
    for number, line in enumerate(lines[1 if header else 0:], 2 if header else 1):
        where = _where(path, number)
        if not line.strip():
            raise ValueError(f"{where}: blank line (one example per line)")
        fields = line.split("\t")
        if names is not None and len(fields) != len(names):
            raise ValueError(f"{where}: {len(fields)} tab-separated fields, but the header has "
                             f"{len(names)}")
        if len(fields) < needed:
            raise ValueError(f"{where}: {len(fields)} tab-separated fields, expected at least "
                             f"{needed}")
        texts = [fields[i] for i in text_index]
        label = None
        if label_index is not None:
            label = _label(fields[label_index].strip(), regression, where, multi_label)
        examples.append(TextExample(texts[0], texts[1] if len(texts) > 1 else None, label, where))
    return examples


def _column_indexes(path, names, text_columns, label_column, require_labels):
    """-> (text column indexes, label column index or None) of a TSV with header `names`
    (None: no header, columns must be numbers)."""
    def index(column, role):
        if isinstance(column, int):
            return column
        if names is None:
            raise ValueError(f"{path}: {role} column {column!r} is given by name, but the file is "
                             "read without a header (use column numbers, or a header)")
        if column not in names:
            return None
        return names.index(column)

    text_index = [index(c, "text") for c in text_columns]
    for column, i in zip(text_columns, text_index):
        if i is None:
            raise ValueError(f"{path}:1: no column {column!r} in the header {names}")
    label_index = index(label_column, "label") if label_column is not None else None
    if label_index is None and require_labels:
        raise ValueError(f"{path}:1: no label column {label_column!r} in the header {names}"
                         if label_column is not None else f"{path}: a label column is needed")
    return text_index, label_index


def _label(text, regression, where, multi_label=False):
    """A TSV label: the stripped string, a finite float for regression, or a tuple of names
    for multi-label."""
    if multi_label:
        return _label_set(text, where)
    if not regression:
        if not text:
            raise ValueError(f"{where}: empty label")
        return text
    try:
        label = float(text)
    except ValueError:
        raise ValueError(f"{where}: label {text!r} is not a number") from None
    if not numpy.isfinite(label):
        raise ValueError(f"{where}: label {label!r} is not a finite number")
    return label


def _label_set(text, where):
    """"sports,politics" -> ("sports", "politics"); "" -> () (an example with none of them)."""
    names = tuple(name.strip() for name in text.split(",")) if text else ()
    if "" in names:
        raise ValueError(f"{where}: empty label name in {text!r} (labels: comma-separated names)")
    twice = [name for name in set(names) if names.count(name) > 1]
    if twice:
        raise ValueError(f"{where}: label {twice[0]!r} given twice in {text!r}")
    return names


def read_glue(path, task, require_labels=True):
    """A GLUE task's train / dev / test TSV (see GLUE_TASKS for the layouts)."""
    layout = glue_layout(task)
    header = layout.header
    columns, label = layout.columns, layout.label
    if not header and layout.test_columns:
        first = read_text_lines(path)[0]
        if first.split("\t")[0] == "index":            # CoLA's test.tsv: a header, no labels
            header, columns, label = True, layout.test_columns, None
    return read_tsv(path, columns, label, header=header, regression=layout.labels is None,
                    require_labels=require_labels and label is not None)


def label_list_from(examples, given=None, where="training data"):
    """The label set: `given` (a list), or the sorted distinct labels of `examples` (each name
    of a multi-label example's set; numerically when they are all integers)."""
    if given:
        labels = list(given)
        if len(set(labels)) != len(labels):
            raise ValueError(f"duplicate labels in {labels}")
        return labels
    found = {name for e in examples if e.label is not None
             for name in (e.label if isinstance(e.label, tuple) else (e.label,))}
    if not found:
        raise ValueError(f"no labels in the {where}")
    if all(isinstance(x, str) and x.lstrip("-").isdigit() for x in found):
        return sorted(found, key=int)
    return sorted(found)


def encode_labels(examples, label_list):
    """Label strings -> ids; a label outside the set is an error naming it and its line."""
    index = {label: i for i, label in enumerate(label_list)}
    ids = []
    for e in examples:
        if e.label not in index:
            raise ValueError(f"{e.where}: label {e.label!r} is not in the label set {label_list}")
        ids.append(index[e.label])
    return ids


def multi_hot_labels(examples, label_list):
    """Label sets -> [N, C] float64 targets, 1 where the example has the label (the multi-label
    head's binary cross-entropy targets); a name outside the set is an error naming its line."""
    index = {label: i for i, label in enumerate(label_list)}
    targets = numpy.zeros((len(examples), len(label_list)))
    for row, e in enumerate(examples):
        for name in e.label:
            if name not in index:
                raise ValueError(f"{e.where}: label {name!r} is not in the label set "
                                 f"{label_list}")
            targets[row, index[name]] = 1.0
    return targets

# ---------------------------------------------------------------------------- splits


def split_examples(examples, seed=0):
    """A fixed 80/10/10 train/dev/test split: a permutation drawn from `seed` (not the
    training seed, so the split never changes); dev and test get n // 10 each, train the
    rest. Each part keeps the file order."""
    n = len(examples)
    order = numpy.random.default_rng(seed).permutation(n)
    tenth = n // 10
    dev, test, train = order[:tenth], order[tenth:2 * tenth], order[2 * tenth:]
    return tuple([examples[i] for i in sorted(part)] for part in (train, dev, test))


def subsample(examples, n, seed=0):
    """At most n examples, chosen by a seeded permutation, in their original order."""
    if n is None or n >= len(examples):
        return list(examples)
    keep = numpy.random.default_rng(seed).permutation(len(examples))[:n]
    return [examples[i] for i in sorted(keep)]

# ---------------------------------------------------------------------------- features


class Features:
    """The model inputs of one data split, unpadded; batch(rows) pads to the longest row.

    input_ids / token_type_ids: per row a list of ids, or for multiple choice a list of C
    such lists. targets: name -> per-row values ("labels" [B] or per-token lists,
    "start_positions", "end_positions"); token-level targets are padded with -100.
    meta: anything the predictions need back (word alignment, SQuAD windows).
    """

    def __init__(self, input_ids, token_type_ids, targets=None, meta=None, stats=None):
        self.input_ids, self.token_type_ids = input_ids, token_type_ids
        self.targets = targets or {}
        self.meta = meta or {}
        self.stats = stats or {}

    def __len__(self):
        return len(self.input_ids)

    def length(self, row):
        ids = self.input_ids[row]
        return max(map(len, ids)) if ids and isinstance(ids[0], list) else len(ids)

    def batch(self, rows, pad_to_multiple_of=1, max_length=None):
        """-> dict of int64 arrays input_ids / token_type_ids / attention_mask [B, T] (or
        [B, C, T]) plus the targets, padded to the longest row, rounded up to a multiple of
        pad_to_multiple_of (as transformers' collators; at most max_length): on the GPU
        each length is a CUDA graph of its own, so few lengths."""
        rows = list(rows)
        T = max(self.length(r) for r in rows)
        padded = -(-T // pad_to_multiple_of) * pad_to_multiple_of
        T = max(T, padded if max_length is None else min(padded, max_length))
        choice = isinstance(self.input_ids[rows[0]][0], list) if self.input_ids[rows[0]] else False

        def pad(sequences, value=0):
            out = numpy.full((len(sequences), T), value, dtype=numpy.int64)
            for i, s in enumerate(sequences):
                out[i, :len(s)] = s
            return out

        if choice:
            C = len(self.input_ids[rows[0]])
            ids = pad([s for r in rows for s in self.input_ids[r]]).reshape(len(rows), C, T)
            types = pad([s for r in rows for s in self.token_type_ids[r]]).reshape(len(rows), C, T)
            lengths = numpy.array([[len(s) for s in self.input_ids[r]] for r in rows])
            mask = (numpy.arange(T) < lengths[..., None]).astype(numpy.int64)
        else:
            ids = pad([self.input_ids[r] for r in rows])
            types = pad([self.token_type_ids[r] for r in rows])
            lengths = numpy.array([len(self.input_ids[r]) for r in rows])
            mask = (numpy.arange(T) < lengths[:, None]).astype(numpy.int64)
        batch = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
        for name, values in self.targets.items():
            first = values[rows[0]]
            if isinstance(first, list):
                batch[name] = pad([values[r] for r in rows], IGNORE_INDEX)
            else:
                batch[name] = numpy.asarray([values[r] for r in rows])
        return batch


def encode_pair(tokenizer, text_a, text_b, max_seq_length):
    """-> (input_ids, token_type_ids, truncated?) for [CLS] A [SEP] (B [SEP]), cut by the
    rule in the module docstring."""
    ids_a = tokenizer.encode(text_a, add_special_tokens=False)
    ids_b = None if text_b is None else tokenizer.encode(text_b, add_special_tokens=False)
    special = 2 if ids_b is None else 3
    if max_seq_length <= special:
        raise ValueError(f"max_seq_length {max_seq_length} leaves no room for text")
    excess = len(ids_a) + (len(ids_b) if ids_b is not None else 0) + special - max_seq_length
    if excess > 0:
        if ids_b is None:
            ids_a = ids_a[:max_seq_length - 2]
        else:
            ids_a, ids_b = BertTokenizer.truncate_sequences(ids_a, ids_b, excess, "longest_first")
    input_ids = tokenizer.build_inputs_with_special_tokens(ids_a, ids_b)
    n_a = len(ids_a) + 2                               # [CLS] A [SEP] are segment A (0)
    return input_ids, [0] * n_a + [1] * (len(input_ids) - n_a), excess > 0


def featurize_texts(tokenizer, examples, max_seq_length, label_list=None, regression=False,
                    multi_label=False):
    """Sentences / pairs -> Features with targets["labels"] (ids, floats for regression, or
    [N, C] 0/1 rows for multi-label) when the examples are labeled. stats: examples, truncated."""
    encoded = [encode_pair(tokenizer, e.text_a, e.text_b, max_seq_length) for e in examples]
    targets = {}
    if examples and all(e.label is not None for e in examples):
        if multi_label:
            targets["labels"] = multi_hot_labels(examples, label_list)
        elif regression:
            targets["labels"] = numpy.array([e.label for e in examples], dtype=numpy.float64)
        else:
            targets["labels"] = numpy.array(encode_labels(examples, label_list),
                                            dtype=numpy.int64)
    return Features([ids for ids, _, _ in encoded], [types for _, types, _ in encoded], targets,
                    stats={"examples": len(examples),
                           "truncated": sum(cut for _, _, cut in encoded)})

# -------------------------------------------------------------------------- CoNLL NER


@dataclasses.dataclass
class TokenExample:
    """One sentence: words, their tags (None in a file without tags), and the line of each word."""
    words: list
    tags: list
    lines: list
    path: str = ""

    @property
    def where(self):
        return _where(self.path, self.lines[0])


def _check_tag(tag, where):
    prefix, hyphen, kind = tag.partition("-")
    if tag != "O" and not (hyphen and prefix in ("B", "I") and kind):
        raise ValueError(f"{where}: tag {tag!r} is not O, B-TYPE or I-TYPE (BIO / IOB1)")


def read_conll(path):
    """CoNLL-2003 style columns separated by whitespace: the word first, the tag last (the
    columns between, e.g. POS and chunk tags, are ignored). Blank lines end sentences;
    -DOCSTART- lines separate documents. Every line must have the column count of the first;
    a file with one column throughout has words only (no tags, for prediction)."""
    path = os.fspath(path)
    lines = read_text_lines(path)
    sentences, words, tags, numbers = [], [], [], []
    columns = None

    def flush():
        if words:
            sentences.append(TokenExample(list(words), list(tags) if columns > 1 else None,
                                          list(numbers), path))
            words.clear(), tags.clear(), numbers.clear()

    for number, line in enumerate(lines, 1):
        fields = line.split()
        if not fields:
            flush()
            continue
        if fields[0] == "-DOCSTART-":
            flush()
            continue
        where = _where(path, number)
        if columns is None:
            columns = len(fields)
        elif len(fields) != columns:
            raise ValueError(f"{where}: {len(fields)} columns, but the first line of the file "
                             f"has {columns} (expected 'word ... tag'): {line!r}")
        if columns > 1:
            _check_tag(fields[-1], where)
            tags.append(fields[-1])
        words.append(fields[0])
        numbers.append(number)
    flush()
    if not sentences:
        raise ValueError(f"{path}: no sentences (only blank or -DOCSTART- lines)")
    return sentences


def iob1_to_bio(tags):
    """IOB1 (CoNLL-2003's original: I- unless a chunk follows one of the same type) -> BIO
    (every chunk starts with B-). Chunk boundaries, and so conlleval's scores, are unchanged."""
    out, previous = [], "O"
    for tag in tags:
        prefix, _, kind = tag.partition("-")
        if prefix == "I" and (previous == "O" or previous.partition("-")[2] != kind):
            tag = "B-" + kind
        out.append(tag)
        previous = tag
    return out


def conll_label_list(examples, given=None):
    """"O" first, then the other tags sorted."""
    if given:
        return label_list_from([], given)
    found = {t for e in examples for t in (e.tags or ())}
    if not found:
        raise ValueError("no tags in the training data")
    return ["O"] + sorted(found - {"O"})


def featurize_tokens(tokenizer, examples, max_seq_length, label_list=None):
    """Sentences -> [CLS] pieces [SEP], the word's tag id on its first WordPiece and -100 on
    the others (and on [CLS]/[SEP]). meta["first_token"]: per sentence, per word, the
    position of its first piece, or -1 when the word has none (cut, or no WordPiece at all).
    stats: sentences, truncated (sentences), words_cut, words_without_pieces."""
    index = {t: i for i, t in enumerate(label_list)} if label_list else None
    labeled = index is not None and all(e.tags is not None for e in examples)
    input_ids, token_type_ids, labels, first_token = [], [], [], []
    stats = {"examples": len(examples), "truncated": 0, "words_cut": 0, "words_without_pieces": 0}
    budget = max_seq_length - 2
    for e in examples:
        for k, tag in enumerate(e.tags if labeled else ()):
            if tag not in index:
                raise ValueError(f"{_where(e.path, e.lines[k])}: tag {tag!r} is not in the "
                                 f"label set {label_list}")
        encoded = tokenizer(e.words, is_split_into_words=True, add_special_tokens=False)
        starts = {}                                  # word -> the position of its first piece
        for position, word in enumerate(encoded.word_ids()):
            starts.setdefault(word, position)
        firsts = [starts[k] + 1 if starts.get(k, budget) < budget else -1
                  for k in range(len(e.words))]      # + 1: after [CLS]
        stats["words_without_pieces"] += len(e.words) - len(starts)
        stats["words_cut"] += sum(position >= budget for position in starts.values())
        stats["truncated"] += len(encoded["input_ids"]) > budget
        ids = [tokenizer.cls_token_id, *encoded["input_ids"][:budget], tokenizer.sep_token_id]
        row_labels = [IGNORE_INDEX] * len(ids)
        for k, first in enumerate(firsts if labeled else ()):
            if first >= 0:
                row_labels[first] = index[e.tags[k]]
        input_ids.append(ids)
        token_type_ids.append([0] * len(ids))
        labels.append(row_labels)
        first_token.append(firsts)
    targets = {"labels": labels} if labeled else {}
    return Features(input_ids, token_type_ids, targets, meta={"first_token": first_token},
                    stats=stats)

# ----------------------------------------------------------------------- SWAG (choice)


@dataclasses.dataclass
class ChoiceExample:
    context: str          # sentence A (SWAG's sent1)
    start: str            # the start of the continuation (sent2), put before every ending
    endings: list
    label: int = None
    where: str = ""


def read_swag(path, require_labels=True):
    """SWAG's CSV (header: ,video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,
    ..., ending3,label), read by column name: sentence A = sent1, each choice's sentence B =
    sent2 + " " + ending_k (as the original run_swag). A file without a label column (the test
    set) is unlabeled unless require_labels."""
    path = os.fspath(path)
    lines = read_text_lines(path)
    reader = csv.reader(io.StringIO("\n".join(lines)))
    try:
        header = next(reader)
    except csv.Error as e:
        raise ValueError(f"{path}:1: {e}") from None
    endings = sorted((c for c in header if c.startswith("ending") and c[6:].isdigit()),
                     key=lambda c: int(c[6:]))
    missing = [c for c in ("sent1", "sent2") if c not in header] + ([] if endings else ["ending0"])
    if missing:
        raise ValueError(f"{path}:1: the header lacks the column(s) {missing} (SWAG: sent1, "
                         "sent2, ending0..)")
    if "label" not in header and require_labels:
        raise ValueError(f"{path}:1: the header has no 'label' column")
    col = {c: header.index(c) for c in header}
    examples = []
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as e:
            raise ValueError(f"{path}:{reader.line_num}: {e}") from None
        where = _where(path, reader.line_num)
        if not row or not any(field.strip() for field in row):
            if reader.line_num >= len(lines):            # a trailing blank line
                continue
            raise ValueError(f"{where}: blank line")
        if len(row) != len(header):
            raise ValueError(f"{where}: {len(row)} fields, but the header has {len(header)}")
        label = None
        if "label" in col:
            text = row[col["label"]].strip()
            if not (text.isdigit() and int(text) < len(endings)):
                raise ValueError(f"{where}: label {text!r} is not a choice number "
                                 f"0..{len(endings) - 1}")
            label = int(text)
        examples.append(ChoiceExample(row[col["sent1"]], row[col["sent2"]],
                                      [row[col[c]] for c in endings], label, where))
    if not examples:
        raise ValueError(f"{path}: no examples (only a header line)")
    return examples


def featurize_choices(tokenizer, examples, max_seq_length):
    """Each example -> C sequences [CLS] context [SEP] start ending [SEP] (pair truncation);
    targets["labels"] the right choice. stats: examples, truncated (examples with a cut)."""
    input_ids, token_type_ids, truncated = [], [], 0
    for e in examples:
        rows = [encode_pair(tokenizer, e.context, f"{e.start} {ending}".strip(), max_seq_length)
                for ending in e.endings]
        input_ids.append([r[0] for r in rows])
        token_type_ids.append([r[1] for r in rows])
        truncated += any(r[2] for r in rows)
    targets = {}
    if examples and all(e.label is not None for e in examples):
        targets["labels"] = numpy.array([e.label for e in examples], dtype=numpy.int64)
    return Features(input_ids, token_type_ids, targets,
                    stats={"examples": len(examples), "truncated": truncated})
