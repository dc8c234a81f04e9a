"""Pretraining data on disk: the instances of the original create_pretraining_data.py
algorithm (nanobert/pretraining_instances.py) written as memory-mappable shards, and read
back as batches.

    python -m nanobert.data.pretraining_data --input data/brown/train.txt.gz \
        --output runs/data --vocab vocab.txt

Streaming, and the global shuffle. Memory does not grow with the corpus:
  - the tokenized corpus is written to disk (one flat array of ids and the offsets of the
    sentences and documents) and memory-mapped, so a random document for "random next" is
    a page read, not something held in RAM;
  - instances are produced in the original's order and written out in blocks of
    instances_per_shard rows;
  - the original's last step, rng.shuffle(instances), needs only the number of instances
    and the rng's state, not the instances: the same call on the list 0..N-1 gives the
    permutation, and a second pass gathers the rows in that order into the final shards
    (memory: 4 bytes per instance for the permutation, plus one shard). So the output is
    the original's, order included, whatever instances_per_shard is - no shuffle buffer or
    per-shard shuffle that would make the result depend on the shard size. The cost is
    one extra pass over the instances and twice their size on disk while it runs.

Storage (one folder): manifest.json, vocab.txt (a copy of the vocab the ids refer to) and
per shard k one .npy file per array, loadable with numpy.load(mmap_mode="r"):

    shard-0000k.input_ids.npy            [N, max_seq_length]  uint16 (int32 if the vocab
                                                              has more than 65,536 tokens)
    shard-0000k.input_lengths.npy        [N]    uint16  tokens before the padding (the
                                                        original's input_mask is 1 there)
    shard-0000k.segment_b_start.npy      [N]    uint16  index of B's first token (the
                                                        original's segment_ids are 1 from
                                                        there to the length)
    shard-0000k.masked_lm_positions.npy  [N, max_predictions_per_seq]  uint16, padded with 0
    shard-0000k.masked_lm_ids.npy        [N, max_predictions_per_seq]  as input_ids, padded 0
    shard-0000k.num_masked.npy           [N]    uint16  (masked_lm_weights = 1 for the first
                                                        num_masked entries)
    shard-0000k.next_sentence_labels.npy [N]    uint8   0 = B follows A, 1 = B is random

A length and a segment boundary per row carry the same information as the original's
[N, T] input_mask and segment_ids, in two bytes instead of 2T.

Dynamic masking (RoBERTa's idea; off by default): the stored masks are the original's
static ones, and because masked_lm_ids holds the true token at every masked position, the
unmasked sequence is recovered exactly (input_ids with masked_lm_ids written back). So
PretrainingDataset.batches(dynamic_masking=True) re-masks every time it is called from
those tokens with the caller's numpy Generator - same rules, same counts - and nothing
extra is stored. The A/B pairs stay those chosen at creation (dupe_factor gives more).
"""
import argparse
import array
import collections
import hashlib
import json
import os
import random
import shutil
import sys
import time
import warnings

import numpy

from .. import flags
from ..formats.fileio import atomic_folder, atomic_open, read_json, recover_folder
from ..model.ops import IGNORE_INDEX
from .pretraining_instances import (VocabInfo, _vocab_tokens, create_training_instances,
                                    read_documents, shuffle_permutation)

FORMAT = "nanobert-pretraining-data"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
VOCAB_NAME = "vocab.txt"

# name -> (kind of dtype, trailing shape) of each array in a shard; "id" = the token id dtype
ARRAYS = {
    "input_ids": ("id", ("max_seq_length",)),
    "input_lengths": ("uint16", ()),
    "segment_b_start": ("uint16", ()),
    "masked_lm_positions": ("uint16", ("max_predictions_per_seq",)),
    "masked_lm_ids": ("id", ("max_predictions_per_seq",)),
    "num_masked": ("uint16", ()),
    "next_sentence_labels": ("uint8", ()),
}


# ----------------------------------------------------------------------------- tokenized corpus

class _Appender:
    """Append integers to a raw binary file in blocks (bounded memory)."""

    def __init__(self, path, typecode, dtype, block=1 << 20):
        self.path, self.dtype, self.block = path, numpy.dtype(dtype), block
        self.buffer = array.array(typecode)
        self.count = 0
        self.file = open(path, "wb")

    def extend(self, values):
        self.buffer.extend(values)
        if len(self.buffer) >= self.block:
            self.flush()

    def append(self, value):
        self.buffer.append(value)
        if len(self.buffer) >= self.block:
            self.flush()

    def flush(self):
        values = numpy.frombuffer(self.buffer, dtype=self.buffer.typecode)
        values.astype(self.dtype).tofile(self.file)
        self.count += len(self.buffer)
        self.buffer = array.array(self.buffer.typecode)

    def close(self):
        self.flush()
        self.file.close()

    def memmap(self):
        if self.count == 0:
            return numpy.zeros(0, self.dtype)
        return numpy.memmap(self.path, dtype=self.dtype, mode="r", shape=(self.count,))


class TokenizedCorpus:
    """The documents of a corpus as token ids, in three flat arrays on disk, memory-mapped:
    ids (all sentences, concatenated), sentence_offsets (into ids) and document_offsets (into
    sentences). len() is the number of documents; corpus[k] is document k as a list of
    sentences (lists of ids)."""

    def __init__(self, ids, sentence_offsets, document_offsets):
        self.ids = ids                              # [num_tokens]
        self.sentence_offsets = sentence_offsets    # [num_sentences + 1], into ids
        self.document_offsets = document_offsets    # [num_documents + 1], into sentences

    @classmethod
    def build(cls, documents, tokenizer, folder, id_dtype, progress=None):
        """Tokenize a stream of documents (lists of lines) into `folder`. Lines without any
        WordPiece token and documents without such a line are dropped, as in the original."""
        os.makedirs(folder, exist_ok=True)
        id_code = "H" if numpy.dtype(id_dtype) == numpy.uint16 else "i"
        ids = _Appender(os.path.join(folder, "ids.bin"), id_code, id_dtype)
        sentences = _Appender(os.path.join(folder, "sentence_offsets.bin"), "q", numpy.int64)
        docs = _Appender(os.path.join(folder, "document_offsets.bin"), "q", numpy.int64)
        sentences.append(0)
        docs.append(0)
        encode = _encoder(tokenizer)
        n_tokens = n_sentences = 0
        try:
            for document in documents:
                kept = 0
                for line in document:
                    line_ids = encode(line)
                    if line_ids:
                        ids.extend(line_ids)
                        n_tokens += len(line_ids)
                        sentences.append(n_tokens)
                        kept += 1
                if kept:
                    n_sentences += kept
                    docs.append(n_sentences)
                if progress is not None:
                    progress.update(1, tokens=n_tokens)
        finally:
            for appender in (ids, sentences, docs):
                appender.close()
        # plain ndarray views of the maps: slicing a numpy.memmap costs more per call
        return cls(*(numpy.asarray(a.memmap()) for a in (ids, sentences, docs)))

    @classmethod
    def from_lists(cls, documents):
        """In memory, from documents as lists of lists of ids (tests, small corpora)."""
        flat = [t for doc in documents for sentence in doc for t in sentence]
        lengths = [len(sentence) for doc in documents for sentence in doc]
        if any(n == 0 for n in lengths):
            raise ValueError("a sentence without tokens")
        per_doc = [len(doc) for doc in documents]
        return cls(numpy.asarray(flat, dtype=numpy.int64), numpy.cumsum([0] + lengths),
                   numpy.cumsum([0] + per_doc))

    def __len__(self):
        return len(self.document_offsets) - 1

    @property
    def num_sentences(self):
        return len(self.sentence_offsets) - 1

    @property
    def num_tokens(self):
        return int(self.sentence_offsets[-1]) if len(self.sentence_offsets) else 0

    def __getitem__(self, k):
        """Document k: a sequence of its sentences (lists of ids), read when indexed - "random
        next" reads only the few sentences it uses of a long document."""
        s0, s1 = int(self.document_offsets[k]), int(self.document_offsets[k + 1])
        return _Document(self.ids, self.sentence_offsets[s0:s1 + 1].tolist())


class _Document:
    def __init__(self, ids, bounds):
        self.ids, self.bounds = ids, bounds

    def __len__(self):
        return len(self.bounds) - 1

    def __getitem__(self, j):
        if not 0 <= j < len(self.bounds) - 1:
            raise IndexError(j)
        return self.ids[self.bounds[j]:self.bounds[j + 1]].tolist()


def _encoder(tokenizer):
    """line -> ids. encode(add_special_tokens=False) is HF's one call for this (and the fast
    path of nanobert's tokenizer, whose word cache makes repeated words a dict lookup)."""
    if hasattr(tokenizer, "encode"):
        return lambda line: tokenizer.encode(line, add_special_tokens=False)
    return lambda line: tokenizer.convert_tokens_to_ids(tokenizer.tokenize(line))


# ----------------------------------------------------------------------------- writing

def id_dtype(vocab_size):
    return numpy.dtype(numpy.uint16 if vocab_size <= 1 << 16 else numpy.int32)


def _array_dtype(name, token_dtype):
    kind = ARRAYS[name][0]
    return numpy.dtype(token_dtype if kind == "id" else kind)


def _array_shape(name, rows, max_seq_length, max_predictions_per_seq):
    sizes = {"max_seq_length": max_seq_length, "max_predictions_per_seq": max_predictions_per_seq}
    return (rows,) + tuple(sizes[s] for s in ARRAYS[name][1])


class _RowBlock:
    """Up to `capacity` instances as fixed-width arrays (the layout of the shards)."""

    def __init__(self, capacity, max_seq_length, max_predictions_per_seq, token_dtype):
        self.arrays = {
            name: numpy.zeros(_array_shape(name, capacity, max_seq_length, max_predictions_per_seq),
                              _array_dtype(name, token_dtype))
            for name in ARRAYS}
        self.rows = 0

    def add(self, instance):
        r, a = self.rows, self.arrays
        a["input_ids"][r, :len(instance.tokens)] = instance.tokens
        a["input_lengths"][r] = len(instance.tokens)
        a["segment_b_start"][r] = instance.segment_b_start
        k = len(instance.masked_lm_positions)
        a["masked_lm_positions"][r, :k] = instance.masked_lm_positions
        a["masked_lm_ids"][r, :k] = instance.masked_lm_ids
        a["num_masked"][r] = k
        a["next_sentence_labels"][r] = instance.is_random_next
        self.rows += 1

    def clear(self):
        for x in self.arrays.values():
            x[:self.rows] = 0
        self.rows = 0

    def write_to(self, files):
        """Append the rows to the raw files {name: open file}, then start an empty block."""
        for name, f in files.items():
            self.arrays[name][:self.rows].tofile(f)
        self.clear()


class _Progress:
    """A plain-text progress line on a stream: rewritten in place on a terminal (at most 10
    times a second), a new line every 10 s otherwise (logs)."""

    def __init__(self, stream, label, total=None, unit="documents"):
        self.stream, self.label, self.total, self.unit = stream, label, total, unit
        self.tty = stream is not None and hasattr(stream, "isatty") and stream.isatty()
        self.interval = 0.1 if self.tty else 10.0
        self.count = 0
        self.extra = {}
        self.start = self.last = time.perf_counter()

    def update(self, n=1, **extra):
        self.count += n
        self.extra.update(extra)
        now = time.perf_counter()
        if self.stream is not None and now - self.last >= self.interval:
            self.last = now
            self._write(now, end="\r" if self.tty else "\n")

    def _write(self, now, end):
        elapsed = max(now - self.start, 1e-9)
        rate = self.count / elapsed
        done = f"{self.count:,}"
        if self.total:
            done += f"/{self.total:,} ({100 * self.count / max(self.total, 1):.0f}%)"
        extra = "".join(f", {v:,} {k}" for k, v in self.extra.items())
        eta = ""
        if self.total and rate > 0 and self.count < self.total:
            eta = f", {(self.total - self.count) / rate:.0f} s left"
        self.stream.write(f"{self.label}: {done} {self.unit}, {rate:,.0f} {self.unit}/s{extra}, "
                          f"{elapsed:.1f} s{eta}   {end}")
        self.stream.flush()

    def close(self):
        if self.stream is not None:
            self._write(time.perf_counter(), end="\n")
        return time.perf_counter() - self.start


# The options of create_pretraining_data, checked and as int / float.
Options = collections.namedtuple("Options", (
    "max_seq_length", "max_predictions_per_seq", "masked_lm_prob", "dupe_factor",
    "short_seq_prob", "seed", "whole_word_mask", "instances_per_shard"))


def _check_options(max_seq_length, max_predictions_per_seq, masked_lm_prob, dupe_factor,
                   short_seq_prob, seed, whole_word_mask, instances_per_shard):
    """ValueError naming the first bad option; -> Options."""
    def integer(name, value, low, high=None):
        if not isinstance(value, (int, numpy.integer)) or isinstance(value, bool) \
                or value < low or (high is not None and value > high):
            bound = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
            raise ValueError(f"{name} must be {bound}, got {value!r}")

    def probability(name, value, low_open):
        if not isinstance(value, (int, float)) or isinstance(value, bool) \
                or not ((0 < value <= 1) if low_open else (0 <= value <= 1)):
            interval = "(0, 1]" if low_open else "[0, 1]"
            raise ValueError(f"{name} must be a number in {interval}, got {value!r}")

    # [CLS] A [SEP] B [SEP] with A and B at least one token each; positions fit in uint16
    integer("max_seq_length", max_seq_length, 5, 65535)
    integer("max_predictions_per_seq", max_predictions_per_seq, 1, 65535)
    integer("dupe_factor", dupe_factor, 1)
    integer("instances_per_shard", instances_per_shard, 1)
    integer("seed", seed, -(1 << 63))
    probability("masked_lm_prob", masked_lm_prob, low_open=True)
    probability("short_seq_prob", short_seq_prob, low_open=False)
    return Options(int(max_seq_length), int(max_predictions_per_seq), float(masked_lm_prob),
                   int(dupe_factor), float(short_seq_prob), int(seed), whole_word_mask,
                   int(instances_per_shard))


def _as_tokenizer(tokenizer):
    if isinstance(tokenizer, (str, os.PathLike)):
        from .tokenizer import BertTokenizer
        return BertTokenizer.from_pretrained(tokenizer)
    return tokenizer


def _check_output(output_dir, overwrite):
    """FileExistsError unless output_dir may receive a dataset: new, empty, or (with
    overwrite) holding a dataset. Makes its parent folder."""
    if os.path.exists(output_dir):
        if not os.path.isdir(output_dir):
            raise FileExistsError(f"output {output_dir!r} exists and is not a folder")
        entries = os.listdir(output_dir)
        if entries:
            if not overwrite:
                raise FileExistsError(f"output folder {output_dir!r} is not empty; choose another "
                                      "one or pass overwrite=True (--overwrite) to replace the "
                                      "dataset in it")
            if MANIFEST_NAME not in entries:
                raise FileExistsError(f"output folder {output_dir!r} is not empty and holds no "
                                      f"{MANIFEST_NAME}: refusing to replace something that is "
                                      "not a dataset")
    os.makedirs(os.path.dirname(output_dir) or ".", exist_ok=True)


def _save_npy(path, array):
    with atomic_open(path, "wb") as f:
        numpy.lib.format.write_array(f, numpy.ascontiguousarray(array), allow_pickle=False)


def _token_id(tokenizer, kind):
    return int(getattr(tokenizer, f"{kind}_token_id"))


def _say(log, text):
    if log is not None:
        log.write(text + "\n")
        log.flush()


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def create_pretraining_data(input_paths, output_dir, tokenizer, max_seq_length=128,
                            max_predictions_per_seq=20, masked_lm_prob=0.15, dupe_factor=10,
                            short_seq_prob=0.1, seed=12345, whole_word_mask=False,
                            instances_per_shard=100_000, errors="strict", overwrite=False,
                            log="stderr"):
    """Build the pretraining instances of a corpus and write them to output_dir (see the
    module docstring). Returns the manifest (a dict).

    input_paths: files (.txt / .txt.gz) and/or folders, BERT's input format.
    tokenizer: a BertTokenizer (or anything with HF's encode/get_vocab and the special token
    attributes), or the path of a vocab.txt / tokenizer folder.
    errors: "strict" or "replace" for bytes that are not UTF-8 (see read_documents).
    overwrite: replace a dataset already in output_dir (only once the new one is complete).
    log: a text stream for the progress lines and the summary; "stderr" (default) is
    sys.stderr at the time of the call, None is silent.

    The folder is built beside output_dir (fileio.atomic_folder) and swapped into place when
    complete, and every file in it is written to a temporary name and renamed: an
    interrupted run leaves no half-written dataset and destroys no finished one. What a
    killed run left beside output_dir (a build folder, or the previous dataset moved aside
    mid-swap) is cleaned up or put back first (fileio.recover_folder), and said so.
    """
    options = _check_options(max_seq_length, max_predictions_per_seq, masked_lm_prob,
                             dupe_factor, short_seq_prob, seed, whole_word_mask,
                             instances_per_shard)
    log = sys.stderr if log == "stderr" else log
    tokenizer = _as_tokenizer(tokenizer)
    vocab_tokens = _vocab_tokens(tokenizer)
    vocab = VocabInfo.from_tokens(vocab_tokens, tokenizer.cls_token, tokenizer.sep_token,
                                  tokenizer.mask_token)
    token_dtype = id_dtype(vocab.size)
    read_stats = {}
    documents = read_documents(input_paths, errors=errors, stats=read_stats)  # checks the paths
    output_dir = os.path.abspath(os.fspath(output_dir))
    recover_folder(output_dir, log)          # a build or an --overwrite swap cut short
    _check_output(output_dir, overwrite)
    with atomic_folder(output_dir) as building:
        scratch = os.path.join(building, "tmp")
        # 1. tokenize, to disk
        corpus, corpus_summary = _tokenize_corpus(documents, read_stats, tokenizer, scratch,
                                                  token_dtype, log)
        # 2. instances, in the original's order, to scratch files
        rng = random.Random(options.seed)
        statistics = _write_instances(corpus, rng, vocab, options, scratch, token_dtype, log)
        # 3. the original's final shuffle, applied while gathering rows into the shards
        permutation = shuffle_permutation(rng, statistics["count"])
        shards = _write_shards(permutation, scratch, building, options, token_dtype, log)
        del permutation, corpus             # corpus maps the scratch files: unmap them first
        shutil.rmtree(scratch)
        # 4. vocab copy and manifest; leaving the block swaps the folder into place
        manifest = _write_manifest(building, tokenizer, vocab, vocab_tokens, options, shards,
                                   read_stats, corpus_summary, statistics)
    count = max(statistics["count"], 1)
    _say(log, f"wrote {statistics['count']:,} instances in {len(shards)} shard(s) to "
              f"{output_dir} ({statistics['random_next'] / count:.1%} random next, "
              f"{statistics['tokens'] / count:.1f} tokens and "
              f"{statistics['masked'] / count:.1f} predictions per instance; "
              f"{statistics['count'] / max(statistics['seconds'], 1e-9):,.0f} instances/s)")
    return manifest


def _tokenize_corpus(documents, read_stats, tokenizer, scratch, token_dtype, log):
    """Step 1: the documents as token ids in memory-mapped scratch files -> (TokenizedCorpus,
    its summary for the manifest). ValueError if no line has a token; a warning if there is
    only one document."""
    progress = _Progress(log, "tokenizing")
    corpus = TokenizedCorpus.build(documents, tokenizer, scratch, token_dtype, progress)
    progress.close()
    if corpus.num_tokens == 0:
        raise ValueError(f"no WordPiece token in {', '.join(map(repr, read_stats['files']))}: "
                         "every line is empty after the tokenizer's cleaning")
    if len(corpus) == 1:
        message = ("the corpus has a single document: every NSP negative ('random next') takes "
                   "its segment B from that same document, as the original "
                   "create_pretraining_data.py does; give more documents (blank lines between "
                   "them) for a meaningful NSP task")
        warnings.warn(message, stacklevel=3)
        _say(log, "warning: " + message)
    summary = {"lines": read_stats["lines"], "documents_read": read_stats["documents"],
               "documents": len(corpus), "sentences": corpus.num_sentences,
               "tokens": corpus.num_tokens}
    return corpus, summary


def _write_instances(corpus, rng, vocab, options, scratch, token_dtype, log):
    """Step 2: create_training_instances in the original's order, written in blocks to one
    raw file per array in `scratch` (bounded memory) -> statistics (count, random_next,
    masked, tokens, random_next_fallbacks, single_document, seconds)."""
    block = _RowBlock(min(options.instances_per_shard, 1 << 14), options.max_seq_length,
                      options.max_predictions_per_seq, token_dtype)
    scratch_files = {name: open(os.path.join(scratch, name + ".bin"), "wb") for name in ARRAYS}
    statistics = {"count": 0, "random_next": 0, "masked": 0, "tokens": 0}
    generation = {}
    progress = _Progress(log, "instances", total=len(corpus) * options.dupe_factor)
    try:
        last_document = None
        for instance in create_training_instances(
                corpus, rng, vocab, options.max_seq_length, options.short_seq_prob,
                options.masked_lm_prob, options.max_predictions_per_seq, options.dupe_factor,
                options.whole_word_mask, generation):
            block.add(instance)
            statistics["count"] += 1
            statistics["random_next"] += instance.is_random_next
            statistics["masked"] += len(instance.masked_lm_positions)
            statistics["tokens"] += len(instance.tokens)
            if block.rows == len(block.arrays["input_lengths"]):
                block.write_to(scratch_files)
            if instance.document_index != last_document:
                progress.update(1, instances=statistics["count"])
                last_document = instance.document_index
        block.write_to(scratch_files)
    finally:
        for f in scratch_files.values():
            f.close()
    progress.count = len(corpus) * options.dupe_factor
    progress.extra["instances"] = statistics["count"]
    statistics["seconds"] = progress.close()
    statistics["random_next_fallbacks"] = generation.get("random_next_fallbacks", 0)
    statistics["single_document"] = len(corpus) == 1
    return statistics


def _write_shards(permutation, scratch, building, options, token_dtype, log):
    """Step 3: the scratch rows gathered in the order of `permutation` into shards of
    instances_per_shard rows (.npy files in `building`) -> the manifest's shard entries."""
    count = len(permutation)
    generated = {name: numpy.memmap(os.path.join(scratch, name + ".bin"), mode="r",
                                    dtype=_array_dtype(name, token_dtype),
                                    shape=_array_shape(name, count, options.max_seq_length,
                                                       options.max_predictions_per_seq))
                 for name in ARRAYS}
    shards = []
    progress = _Progress(log, "writing shards", total=count, unit="instances")
    for shard, start in enumerate(range(0, count, options.instances_per_shard)):
        rows = permutation[start:start + options.instances_per_shard]
        order = numpy.argsort(rows, kind="stable")       # read the scratch files front to back
        entry = {"name": f"shard-{shard:05d}", "rows": int(len(rows)), "files": {}}
        for name, source in generated.items():
            out = numpy.empty((len(rows),) + source.shape[1:], source.dtype)
            out[order] = source[rows[order]]
            filename = f"{entry['name']}.{name}.npy"
            _save_npy(os.path.join(building, filename), out)
            entry["files"][name] = filename
        shards.append(entry)
        progress.update(len(rows))
    progress.close()
    return shards


def _write_manifest(building, tokenizer, vocab, vocab_tokens, options, shards, read_stats,
                    corpus_summary, statistics):
    """Step 4: the vocab copy and manifest.json in `building` -> the manifest."""
    vocab_path = os.path.join(building, VOCAB_NAME)
    with atomic_open(vocab_path, "w", encoding="utf-8") as f:
        f.write("".join(token + "\n" for token in vocab_tokens))
    tokenizer_keys = ("do_lower_case", "strip_accents", "tokenize_chinese_chars",
                      "max_input_chars_per_word")
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "algorithm": "google-research/bert create_pretraining_data.py, Python "
                     "random.Random(seed), same draws in the same order; final global shuffle "
                     "applied",
        "vocab_file": VOCAB_NAME,
        "vocab_sha256": sha256_file(vocab_path),
        "vocab_size": vocab.size,
        "special_token_ids": {"pad": _token_id(tokenizer, "pad"),
                              "unk": _token_id(tokenizer, "unk"),
                              "cls": vocab.cls_id, "sep": vocab.sep_id, "mask": vocab.mask_id},
        "tokenizer": {key: getattr(tokenizer, key) for key in tokenizer_keys
                      if hasattr(tokenizer, key)},
        "max_seq_length": options.max_seq_length,
        "max_predictions_per_seq": options.max_predictions_per_seq,
        "masked_lm_prob": options.masked_lm_prob,
        "dupe_factor": options.dupe_factor,
        "short_seq_prob": options.short_seq_prob,
        "seed": options.seed,
        "whole_word_mask": bool(options.whole_word_mask),
        "instances_per_shard": options.instances_per_shard,
        "dtypes": {name: _array_dtype(name, id_dtype(vocab.size)).name for name in ARRAYS},
        "shards": shards,
        "total_instances": statistics["count"],
        "source_files": [{"path": os.path.abspath(p), "bytes": os.path.getsize(p)}
                         for p in read_stats["files"]],
        "corpus": corpus_summary,
    }
    manifest["statistics"] = {
        "random_next": statistics["random_next"],
        "random_next_fallbacks": statistics["random_next_fallbacks"],
        "single_document": statistics["single_document"],
        "masked_positions": statistics["masked"],
        "tokens": statistics["tokens"],
        "utf8_replacements": {os.path.abspath(p): n
                              for p, n in read_stats["utf8_replacements"].items() if n},
    }
    with atomic_open(os.path.join(building, MANIFEST_NAME), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    return manifest


# ----------------------------------------------------------------------------- reading

class PretrainingDataset:
    """A folder written by create_pretraining_data, memory-mapped.

        data = PretrainingDataset("runs/data")
        for batch in data.batches(32, numpy.random.default_rng(0)):
            loss, grads = model.loss_and_grads(batch)

    Opening checks the manifest against the files - every shard present, each array's
    dtype, shape and row count as the manifest says, the vocab copy's sha256, the per-row
    lengths and counts in range - and raises ValueError (FileNotFoundError for a missing
    file) naming the file and what is wrong.
    """

    REQUIRED = ("format", "format_version", "vocab_file", "vocab_sha256", "vocab_size",
                "special_token_ids", "max_seq_length", "max_predictions_per_seq", "masked_lm_prob",
                "whole_word_mask", "dtypes", "shards", "total_instances")

    def __init__(self, folder):
        self.folder = os.fspath(folder)
        recover_folder(self.folder)              # an --overwrite swap cut short by a crash
        path = os.path.join(self.folder, MANIFEST_NAME)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no {MANIFEST_NAME} in {self.folder!r}: not a pretraining "
                                    "dataset (or an unfinished one)")
        manifest = read_json(path, MANIFEST_NAME)
        missing = [key for key in self.REQUIRED if key not in manifest]
        if missing:
            raise ValueError(f"{path}: missing key(s) {', '.join(missing)}")
        if manifest["format"] != FORMAT:
            raise ValueError(f"{path}: format is {manifest['format']!r}, expected {FORMAT!r}")
        if manifest["format_version"] != FORMAT_VERSION:
            raise ValueError(f"{path}: format_version {manifest['format_version']!r} is not "
                             f"supported (this nanobert reads version {FORMAT_VERSION})")
        self.manifest = manifest
        self.max_seq_length = _manifest_int(manifest, "max_seq_length", path, 5)
        self.max_predictions_per_seq = _manifest_int(manifest, "max_predictions_per_seq", path, 1)
        self.vocab_size = _manifest_int(manifest, "vocab_size", path, 5)
        self.masked_lm_prob = manifest["masked_lm_prob"]
        self.whole_word_mask = bool(manifest["whole_word_mask"])
        ids = manifest["special_token_ids"]
        for key in ("cls", "sep", "mask"):
            if not isinstance(ids, dict) or not isinstance(ids.get(key), int) \
                    or not 0 <= ids[key] < self.vocab_size:
                raise ValueError(f"{path}: special_token_ids lacks a valid {key!r} id")
        self.special_token_ids = ids

        vocab_path = os.path.join(self.folder, manifest["vocab_file"])
        if not os.path.isfile(vocab_path):
            raise FileNotFoundError(f"{vocab_path}: the dataset's vocab copy is missing")
        digest = sha256_file(vocab_path)
        if digest != manifest["vocab_sha256"]:
            raise ValueError(f"{vocab_path}: sha256 {digest} differs from the manifest's "
                             f"{manifest['vocab_sha256']}")
        self.vocab_file = vocab_path

        token_dtype = id_dtype(self.vocab_size)
        expected_dtypes = {name: _array_dtype(name, token_dtype) for name in ARRAYS}
        if not isinstance(manifest["shards"], list) or not manifest["shards"]:
            raise ValueError(f"{path}: shards must be a non-empty list")
        self.shards = []
        for number, entry in enumerate(manifest["shards"]):
            self.shards.append(self._open_shard(entry, number, expected_dtypes, path))
        rows = [len(shard["input_lengths"]) for shard in self.shards]
        self._starts = numpy.cumsum([0] + rows)
        if self._starts[-1] != manifest["total_instances"]:
            raise ValueError(f"{path}: total_instances is {manifest['total_instances']} but the "
                             f"shards hold {int(self._starts[-1])} rows")

    def _open_shard(self, entry, number, expected_dtypes, path):
        if not isinstance(entry, dict) or not isinstance(entry.get("rows"), int) or \
                not isinstance(entry.get("files"), dict):
            raise ValueError(f"{path}: shard {number} must have 'rows' (int) and 'files' (object)")
        arrays = {}
        for name, dtype in expected_dtypes.items():
            if name not in entry["files"]:
                raise ValueError(f"{path}: shard {number} lists no file for {name!r}")
            file = os.path.join(self.folder, entry["files"][name])
            if not os.path.isfile(file):
                raise FileNotFoundError(f"{file}: missing (shard {number} of {path})")
            try:
                a = numpy.load(file, mmap_mode="r", allow_pickle=False)
            except (ValueError, OSError, EOFError) as e:
                raise ValueError(f"{file}: not a readable .npy file ({e})") from None
            shape = _array_shape(name, entry["rows"], self.max_seq_length,
                                 self.max_predictions_per_seq)
            if a.dtype != dtype:
                raise ValueError(f"{file}: dtype {a.dtype}, expected {dtype}")
            if a.shape != shape:
                if a.shape[1:] == shape[1:]:
                    raise ValueError(f"{file}: has {a.shape[0]} rows, the manifest says {shape[0]}")
                raise ValueError(f"{file}: has {a.shape} shape, the manifest says {shape}")
            arrays[name] = a
        self._check_rows(arrays, entry["files"]["input_lengths"])
        return arrays

    def _check_rows(self, a, where):
        """Per-row checks on the small [N] arrays: cheap, and they catch a corrupted shard
        before it turns into a confusing error inside the model."""
        lengths = a["input_lengths"].astype(numpy.int64)
        b_start = a["segment_b_start"].astype(numpy.int64)
        masked = a["num_masked"].astype(numpy.int64)
        checks = (
            ((lengths < 5) | (lengths > self.max_seq_length),
             "input_lengths outside [5, max_seq_length]"),
            ((b_start < 3) | (b_start > lengths - 2), "segment_b_start outside [3, length - 2]"),
            ((masked < 0) | (masked > self.max_predictions_per_seq),
             "num_masked above max_predictions_per_seq"),
            (a["next_sentence_labels"] > 1, "next_sentence_labels not 0/1"))
        for bad, what in checks:
            if bad.any():
                row = int(numpy.flatnonzero(bad)[0])
                raise ValueError(f"{os.path.join(self.folder, where)} (and its shard): row {row}: "
                                 f"{what}")

    def __len__(self):
        return int(self._starts[-1])

    def rows(self, indices):
        """The stored arrays (ARRAYS) of the given instances, in the given order."""
        indices = numpy.asarray(indices, dtype=numpy.int64).reshape(-1)
        if len(indices) and (indices.min() < 0 or indices.max() >= len(self)):
            raise IndexError(f"instance index out of range [0, {len(self)})")
        shard_of = numpy.searchsorted(self._starts, indices, side="right") - 1
        first = self.shards[0]
        out = {name: numpy.empty((len(indices),) + first[name].shape[1:], first[name].dtype)
               for name in ARRAYS}
        for shard in numpy.unique(shard_of):
            where = numpy.flatnonzero(shard_of == shard)
            local = indices[where] - self._starts[shard]
            order = numpy.argsort(local, kind="stable")        # read each shard front to back
            for name in ARRAYS:
                out[name][where[order]] = self.shards[shard][name][local[order]]
        return out

    def features(self, indices=None):
        """The instances in the original's TFRecord layout: input_ids, input_mask, segment_ids
        [N, T]; masked_lm_positions, masked_lm_ids, masked_lm_weights [N, P];
        next_sentence_labels [N] (int64, weights float32)."""
        r = self.rows(numpy.arange(len(self)) if indices is None else indices)
        position = numpy.arange(self.max_seq_length)
        lengths = r["input_lengths"].astype(numpy.int64)[:, None]              # [N, 1]
        b_start = r["segment_b_start"].astype(numpy.int64)[:, None]            # [N, 1]
        num_masked = r["num_masked"].astype(numpy.int64)[:, None]              # [N, 1]
        input_mask = position < lengths                                         # [N, T]
        segment_ids = input_mask & (position >= b_start)                        # [N, T]
        weights = numpy.arange(self.max_predictions_per_seq) < num_masked       # [N, P]
        return {"input_ids": r["input_ids"].astype(numpy.int64),
                "input_mask": input_mask.astype(numpy.int64),
                "segment_ids": segment_ids.astype(numpy.int64),
                "masked_lm_positions": r["masked_lm_positions"].astype(numpy.int64),
                "masked_lm_ids": r["masked_lm_ids"].astype(numpy.int64),
                "masked_lm_weights": weights.astype(numpy.float32),
                "next_sentence_labels": r["next_sentence_labels"].astype(numpy.int64)}

    def __getitem__(self, index):
        """One instance, unpadded: tokens, token_type_ids, masked_lm_positions, masked_lm_ids,
        next_sentence_label."""
        if not -len(self) <= index < len(self):
            raise IndexError(f"instance {index} out of range [0, {len(self)})")
        f = self.features([index % len(self)])
        n, k = int(f["input_mask"][0].sum()), int(f["masked_lm_weights"][0].sum())
        return {"tokens": f["input_ids"][0, :n], "token_type_ids": f["segment_ids"][0, :n],
                "masked_lm_positions": f["masked_lm_positions"][0, :k],
                "masked_lm_ids": f["masked_lm_ids"][0, :k],
                "next_sentence_label": int(f["next_sentence_labels"][0])}

    def batch(self, indices, rng=None, dynamic_masking=False):
        """A model batch (the dict BertForPreTraining.loss_and_grads takes, int64 arrays):
        input_ids, token_type_ids, attention_mask, labels [B, T] (-100 where not predicted),
        next_sentence_label [B]. dynamic_masking: draw new masks with rng (a numpy Generator)
        from the unmasked tokens instead of using the stored ones."""
        f = self.features(indices)
        B = len(f["input_ids"])
        if dynamic_masking:
            if not isinstance(rng, numpy.random.Generator):
                raise ValueError("dynamic masking needs rng, a numpy.random.Generator")
            input_ids, labels = self._remask(f, rng)
        else:
            input_ids = f["input_ids"]
            labels = numpy.full(input_ids.shape, IGNORE_INDEX, dtype=numpy.int64)
            row, k = numpy.nonzero(f["masked_lm_weights"])
            labels[row, f["masked_lm_positions"][row, k]] = f["masked_lm_ids"][row, k]
        assert input_ids.shape == (B, self.max_seq_length)
        return {"input_ids": input_ids, "token_type_ids": f["segment_ids"],
                "attention_mask": f["input_mask"], "labels": labels,
                "next_sentence_label": f["next_sentence_labels"]}

    def batches(self, batch_size, rng=None, shuffle=True, drop_last=False, dynamic_masking=False):
        """One pass over the instances in batches of batch_size (see batch). shuffle: a new
        random order from rng (a numpy.random.Generator) on every call - i.e. every epoch -
        otherwise the stored order (which is already the original's shuffled order). The
        last batch is smaller unless drop_last."""
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if (shuffle or dynamic_masking) and not isinstance(rng, numpy.random.Generator):
            raise ValueError("batches needs rng, a numpy.random.Generator, to shuffle or to mask "
                             "(pass shuffle=False for the stored order)")
        order = rng.permutation(len(self)) if shuffle else numpy.arange(len(self))
        stop = len(order) - len(order) % batch_size if drop_last else len(order)
        for start in range(0, stop, batch_size):
            yield self.batch(order[start:start + batch_size], rng, dynamic_masking)

    # -- dynamic masking

    def _vocab_info(self):
        if not hasattr(self, "_vocab"):
            with open(self.vocab_file, encoding="utf-8") as f:
                tokens = f.read().split("\n")[:-1]
            ids = self.special_token_ids
            self._vocab = VocabInfo(len(tokens), ids["cls"], ids["sep"], ids["mask"],
                                    numpy.array([t.startswith("##") for t in tokens], dtype=bool))
        return self._vocab

    def _remask(self, f, rng):
        """New MLM masks for a batch, with the rules of create_masked_lm_predictions: the same
        count per row, [CLS]/[SEP] never chosen, 80% [MASK] / 10% kept / 10% random token,
        whole words if the dataset was made with whole_word_mask."""
        vocab = self._vocab_info()
        ids = f["input_ids"].copy()
        row, k = numpy.nonzero(f["masked_lm_weights"])
        ids[row, f["masked_lm_positions"][row, k]] = f["masked_lm_ids"][row, k]   # unmasked tokens
        B, T = ids.shape
        lengths = f["input_mask"].sum(1)
        candidate = f["input_mask"].astype(bool) & (ids != vocab.cls_id) & (ids != vocab.sep_id)
        # num_to_predict = min(max_predictions_per_seq, max(1, round(len(tokens) * prob)))
        counts = numpy.rint(lengths * self.masked_lm_prob).astype(numpy.int64)   # [B]
        counts = numpy.minimum(self.max_predictions_per_seq, numpy.maximum(1, counts))
        if self.whole_word_mask:
            chosen = numpy.zeros((B, T), dtype=bool)
            for b in range(B):
                words = _whole_words_to_mask(ids[b], candidate[b], vocab.is_subword, counts[b],
                                             rng)
                chosen[b, words] = True
        else:
            keys = rng.random((B, T))
            keys[~candidate] = 2.0                       # after every candidate
            rank = numpy.empty((B, T), dtype=numpy.int64)
            numpy.put_along_axis(rank, numpy.argsort(keys, axis=1), numpy.arange(T)[None, :],
                                 axis=1)
            # the counts[b] lowest random keys: a uniformly random subset of the candidates
            chosen = (rank < counts[:, None]) & candidate
        u, v = rng.random((B, T)), rng.random((B, T))
        random_ids = rng.integers(0, vocab.size, (B, T))
        labels = numpy.where(chosen, ids, IGNORE_INDEX)
        input_ids = ids.copy()
        input_ids[chosen & (u < 0.8)] = vocab.mask_id
        replace = chosen & (u >= 0.8) & (v >= 0.5)
        input_ids[replace] = random_ids[replace]
        return input_ids, labels

    def check_compatible(self, config=None, tokenizer=None):
        """ValueError unless a model config (BertConfig) and/or a tokenizer fit this data:
        the sequences fit the position table, the ids fit the vocab, the vocab is the same."""
        if config is not None:
            if self.max_seq_length > config.max_position_embeddings:
                raise ValueError(f"the data's max_seq_length {self.max_seq_length} exceeds the "
                                 f"model's max_position_embeddings "
                                 f"{config.max_position_embeddings}")
            if self.vocab_size > config.vocab_size:
                raise ValueError(f"the data's vocab has {self.vocab_size} tokens, the model's "
                                 f"vocab_size is {config.vocab_size}")
        if tokenizer is not None:
            tokens = _vocab_tokens(tokenizer)
            digest = hashlib.sha256("".join(t + "\n" for t in tokens).encode("utf-8")).hexdigest()
            if digest != self.manifest["vocab_sha256"]:
                raise ValueError(f"the tokenizer's vocab ({len(tokens)} tokens) is not the one the "
                                 f"data in {self.folder!r} was made with ({self.vocab_size} "
                                 "tokens, sha256 "
                                 f"{self.manifest['vocab_sha256'][:12]}...)")


def _manifest_int(manifest, key, path, low):
    value = manifest[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{path}: {key} must be an integer >= {low}, got {value!r}")
    return value


def _whole_words_to_mask(ids, candidate, is_subword, count, rng):
    """Positions of whole words to mask in one row, as create_masked_lm_predictions chooses
    them (words in random order, a word that would overshoot the count skipped)."""
    words = []
    for i in numpy.flatnonzero(candidate).tolist():
        if words and is_subword[ids[i]]:
            words[-1].append(i)
        else:
            words.append([i])
    chosen = []
    for w in rng.permutation(len(words)).tolist():
        if len(chosen) >= count:
            break
        if len(chosen) + len(words[w]) <= count:
            chosen += words[w]
    return numpy.asarray(chosen, dtype=numpy.int64)


# ----------------------------------------------------------------------------- command line

def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m nanobert.data.pretraining_data",
        description="Make BERT pretraining instances (masked LM + next sentence prediction) from "
                    "raw text, with the algorithm of the original create_pretraining_data.py, and "
                    "write them as memory-mappable shards (.npy) plus manifest.json.",
        epilog="Input format: one sentence per line, a blank line between documents (UTF-8, "
               "optionally gzipped). Example:\n  python -m nanobert.data.pretraining_data --input "
               "data/brown/train.txt.gz --output runs/brown-128 --vocab vocab.txt --dupe-factor 5\n"
               "Read the result with nanobert.data.pretraining_data.PretrainingDataset(folder).",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--input", nargs="+", required=True, metavar="PATH",
        help="text files (.txt, .txt.gz) and/or folders (all *.txt / *.txt.gz inside)")
    add("--output", required=True, metavar="FOLDER",
        help="folder to write (must be empty or new)")
    add("--vocab", required=True, metavar="PATH",
        help="vocab.txt, or a tokenizer folder holding vocab.txt (and tokenizer_config.json)")
    add("--do-lower-case", action=argparse.BooleanOptionalAction, default=None,
        help="lower-case and strip accents (uncased model); default: the folder's "
             "tokenizer_config.json, else yes")
    add("--max-seq-length", type=flags.in_range(int, 5), default=128,
        help="tokens per instance, with [CLS] and 2x [SEP] (default 128)")
    add("--max-predictions-per-seq", type=flags.positive_int, default=20,
        help="most masked positions per instance (default 20)")
    add("--masked-lm-prob", type=flags.in_range(float, 0.0, 1.0, low_open=True), default=0.15,
        help="fraction of tokens to predict (default 0.15)")
    add("--dupe-factor", type=flags.positive_int, default=10,
        help="passes over the corpus, each with new pairs and masks (default 10)")
    add("--short-seq-prob", type=flags.probability, default=0.1,
        help="probability of a shorter target length per document (default 0.1)")
    add("--seed", type=flags.non_negative_int, default=12345,
        help="seed of the Python random.Random that drives everything (default 12345)")
    add("--whole-word-mask", action="store_true",
        help="mask whole words (a piece and its ## pieces) together")
    add("--instances-per-shard", type=flags.positive_int, default=100_000,
        help="rows per shard (default 100000)")
    add("--errors", "--utf8-errors", choices=("strict", "replace"), default="strict",
        help="bytes that are not UTF-8: stop with an error naming the file and byte "
             "offset (strict, default) or replace them with U+FFFD and count them "
             "(--utf8-errors: the name train.py uses)")
    add("--overwrite", action="store_true",
        help="replace a dataset already in --output (once the new one is complete)")
    add("--quiet", action="store_true", help="no progress output")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    from .tokenizer import BertTokenizer
    options = {} if args.do_lower_case is None else {"do_lower_case": args.do_lower_case}
    try:
        tokenizer = BertTokenizer.from_pretrained(args.vocab, **options)
        create_pretraining_data(
            args.input, args.output, tokenizer, max_seq_length=args.max_seq_length,
            max_predictions_per_seq=args.max_predictions_per_seq,
            masked_lm_prob=args.masked_lm_prob, dupe_factor=args.dupe_factor,
            short_seq_prob=args.short_seq_prob, seed=args.seed,
            whole_word_mask=args.whole_word_mask, instances_per_shard=args.instances_per_shard,
            errors=args.errors, overwrite=args.overwrite,
            log=None if args.quiet else sys.stderr)
    except (ValueError, OSError) as e:
        parser.exit(2, f"error: {e}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
