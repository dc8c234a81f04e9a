"""Pretraining data (nanobert/data/pretraining_instances.py, nanobert/data/pretraining_data.py):
the original create_pretraining_data.py algorithm, its shards on disk, and the errors for bad
input.

The strongest check is the first: on real text (the Brown held-out split) nanobert's output
equals, array for array and row for row, that of reference/pretraining_data_reference.py - a
separate port of the original that works on token strings and calls random.Random's own
methods - for the same seed, with and without whole-word masking. The rest are properties
(hypothesis), frequencies within binomial bounds, and round trips.
"""
import gzip
import io
import json
import math
import os
import pathlib
import random

import numpy
import pytest
from hypothesis import given, settings, strategies as st

from nanobert import BertConfig, BertForPreTraining
from nanobert.data.pretraining_data import (PretrainingDataset, TokenizedCorpus,
                                            create_pretraining_data, main)
from nanobert.data.pretraining_instances import (VocabInfo, create_masked_lm_predictions,
                                                 create_training_instances, num_to_predict,
                                                 read_documents, shuffle, shuffle_permutation,
                                                 truncate_seq_pair)
from nanobert.data.tokenizer import BertTokenizer, train_wordpiece_vocab
from nanobert.model.ops import IGNORE_INDEX
from reference import pretraining_data_reference as reference

BROWN = pathlib.Path(__file__).resolve().parents[1] / "data" / "brown"
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
CLS, SEP, MASK = 2, 3, 4


def sigma_bound(count, n, p, sigmas=5.0):
    """|count - n p| <= sigmas * sqrt(n p (1 - p)), with the numbers in the message."""
    expected, sd = n * p, math.sqrt(n * p * (1 - p))
    assert abs(count - expected) <= sigmas * sd, \
        f"{count} of {n} (expected {expected:.1f} +- {sigmas} x {sd:.1f}, p = {p})"


# ----------------------------------------------------------------------------- synthetic corpora
# Document d uses only the ids [5 + 40 d, 5 + 40 (d + 1)): any token tells its document. Odd
# ids are "##" pieces, so whole-word masking has words of several pieces.

WORDS_PER_DOC = 40


def synthetic_vocab(n_docs):
    tokens = list(SPECIALS)
    for i in range(n_docs * WORDS_PER_DOC):
        tokens.append(f"##p{i}" if i % 2 else f"w{i}")
    return tokens


def doc_of(token_id):
    return (token_id - len(SPECIALS)) // WORDS_PER_DOC


def synthetic_documents(rng, n_docs, max_sentences=8, max_len=20):
    docs = []
    for d in range(n_docs):
        base = len(SPECIALS) + d * WORDS_PER_DOC
        docs.append([[base + rng.randrange(WORDS_PER_DOC) for _ in range(rng.randint(1, max_len))]
                     for _ in range(rng.randint(1, max_sentences))])
    return docs


def unmasked(instance):
    tokens = list(instance.tokens)
    for p, label in zip(instance.masked_lm_positions, instance.masked_lm_ids):
        tokens[p] = label
    return tokens


def word_groups(tokens, vocab):
    """Whole words as create_masked_lm_predictions forms them: [CLS]/[SEP] skipped, a "##" piece
    joins the word before it."""
    groups = []
    for i, t in enumerate(tokens):
        if t in (vocab.cls_id, vocab.sep_id):
            continue
        if groups and vocab.is_subword[t]:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


@settings(max_examples=120, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_docs=st.integers(1, 5), max_seq_length=st.integers(5, 64),
       masked_lm_prob=st.floats(0.01, 0.5), max_predictions=st.integers(1, 30),
       short_seq_prob=st.sampled_from([0.0, 0.1, 0.5, 1.0]), whole_word_mask=st.booleans(),
       max_len=st.sampled_from([3, 20, 70]))
def test_instances_have_the_shape_segments_and_masks_of_the_original(
        seed, n_docs, max_seq_length, masked_lm_prob, max_predictions, short_seq_prob,
        whole_word_mask, max_len):
    documents = synthetic_documents(random.Random(seed), n_docs, max_len=max_len)
    vocab = VocabInfo.from_tokens(synthetic_vocab(n_docs))
    instances = list(create_training_instances(
        documents, random.Random(seed), vocab, max_seq_length, short_seq_prob, masked_lm_prob,
        max_predictions, dupe_factor=2, whole_word_mask=whole_word_mask))
    assert len(instances) >= 2 * n_docs                  # every document gives an instance per pass
    for inst in instances:
        n, b = len(inst.tokens), inst.segment_b_start
        tokens = unmasked(inst)
        assert n <= max_seq_length, f"length {n} > max_seq_length {max_seq_length}"
        # [CLS] A [SEP] B [SEP], A and B not empty, no [CLS]/[SEP] anywhere else
        assert 3 <= b <= n - 2, (b, n)
        assert (tokens[0], tokens[b - 1], tokens[-1]) == (CLS, SEP, SEP)
        assert all(t not in (CLS, SEP) for t in tokens[1:b - 1] + tokens[b:-1])
        # [CLS]/[SEP] never predicted; positions sorted and distinct
        positions = inst.masked_lm_positions
        assert positions == sorted(set(positions))
        assert not {0, b - 1, n - 1} & set(positions), (positions, b, n)
        expected = min(num_to_predict(n, masked_lm_prob, max_predictions), n - 3)
        if whole_word_mask:
            # a word that would overshoot the count is skipped, so fewer (even none) may be masked
            assert len(positions) <= expected
            chosen = set(positions)
            for group in word_groups(tokens, vocab):
                assert len(chosen & set(group)) in (0, len(group)), \
                    f"word {group} partly masked: {positions}"
        else:
            assert len(positions) == expected, \
                f"{len(positions)} masked, expected {expected} (length {n})"
        # tokens not predicted are the true ones
        assert all(inst.tokens[i] == tokens[i] for i in range(n) if i not in set(positions))
        # A from its document; B from it too (actual next) or from another one (random next)
        assert {doc_of(t) for t in tokens[1:b - 1]} == {inst.document_index}
        b_docs = {doc_of(t) for t in tokens[b:-1]}
        if inst.is_random_next:
            assert b_docs == {inst.random_document_index}
            if n_docs > 1:
                assert inst.random_document_index != inst.document_index, \
                    "random B from A's own document"
            else:
                assert inst.random_document_index == inst.document_index
        else:
            assert b_docs == {inst.document_index} and inst.num_chunk_segments >= 2


def test_actual_next_b_continues_a_in_the_document():
    documents = synthetic_documents(random.Random(3), 4, max_sentences=30, max_len=6)
    vocab = VocabInfo.from_tokens(synthetic_vocab(4))
    checked = 0
    for inst in create_training_instances(documents, random.Random(0), vocab, 64, dupe_factor=10,
                                          masked_lm_prob=0.2):
        if inst.is_random_next:
            continue
        b, tokens = inst.segment_b_start, unmasked(inst)
        pair = tokens[1:b - 1] + tokens[b:-1]
        if len(pair) >= 64 - 3:
            continue                                # possibly truncated
        checked += 1
        text = [t for sentence in documents[inst.document_index] for t in sentence]
        assert any(text[i:i + len(pair)] == pair for i in range(len(text) - len(pair) + 1)), \
            "A + B is not a stretch of the document"
    assert checked > 20


def test_random_b_never_comes_from_a_when_all_ten_tries_hit_it():
    # With two documents all 10 of the original's tries land on A's own document once in
    # 1024 negatives; nanobert then takes the other document (and counts it).
    documents = synthetic_documents(random.Random(8), 2, max_sentences=40, max_len=5)
    vocab = VocabInfo.from_tokens(synthetic_vocab(2))
    stats = {}
    instances = list(create_training_instances(documents, random.Random(0), vocab, 24,
                                               dupe_factor=300, stats=stats))
    negatives = [inst for inst in instances if inst.is_random_next]
    assert stats["random_next_fallbacks"] >= 1, f"no fallback in {len(negatives)} negatives"
    assert all(inst.random_document_index != inst.document_index for inst in negatives)


def test_the_fast_shuffle_is_random_shuffle():
    for seed in range(5):
        for n in (0, 1, 2, 5, 64, 127, 128, 129, 3000):
            a, b = list(range(n)), list(range(n))
            r1, r2 = random.Random(seed), random.Random(seed)
            r1.shuffle(a)
            shuffle(b, r2)
            assert a == b and r1.random() == r2.random(), (seed, n)


# ----------------------------------------------------------------------------- frequencies

def test_masked_tokens_are_80_percent_mask_10_kept_10_random():
    V = 1000
    vocab = VocabInfo.from_tokens(SPECIALS + [f"w{i}" for i in range(V - 5)])
    tokens = [CLS] + list(range(10, 70)) + [SEP] + list(range(100, 160)) + [SEP]
    rng = random.Random(0)
    counts = {"mask": 0, "kept": 0, "other": 0}
    n = 0
    for _ in range(2000):
        out, positions, labels = create_masked_lm_predictions(tokens, 0.15, 20, vocab, rng)
        for p, label in zip(positions, labels):
            counts["mask" if out[p] == MASK else "kept" if out[p] == label else "other"] += 1
        n += len(positions)
    # a random token is [MASK] or the true one with probability 1/V each
    sigma_bound(counts["mask"], n, 0.8 + 0.1 / V)
    sigma_bound(counts["kept"], n, 0.1 + 0.1 / V)
    sigma_bound(counts["other"], n, 0.1 * (1 - 2 / V))


def test_every_position_but_cls_sep_is_equally_likely_to_be_masked():
    vocab = VocabInfo.from_tokens(SPECIALS + [f"w{i}" for i in range(95)])
    # 41 tokens, 38 candidates
    tokens = [CLS] + list(range(10, 30)) + [SEP] + list(range(40, 58)) + [SEP]
    hits = numpy.zeros(len(tokens), dtype=numpy.int64)
    draws = 4000
    rng = random.Random(1)
    for _ in range(draws):
        hits[create_masked_lm_predictions(tokens, 0.15, 20, vocab, rng)[1]] += 1
    k = num_to_predict(len(tokens), 0.15, 20)
    assert hits[[0, 21, 40]].sum() == 0
    for position in set(range(len(tokens))) - {0, 21, 40}:
        sigma_bound(hits[position], draws, k / 38)


def test_random_next_is_half_of_the_instances_that_could_have_an_actual_next():
    documents = synthetic_documents(random.Random(5), 6, max_sentences=40, max_len=5)
    vocab = VocabInfo.from_tokens(synthetic_vocab(6))
    instances = list(create_training_instances(documents, random.Random(2), vocab, 32,
                                               dupe_factor=80))
    could = [inst.is_random_next for inst in instances if inst.num_chunk_segments >= 2]
    forced = [inst.is_random_next for inst in instances if inst.num_chunk_segments == 1]
    assert all(forced), "a one-sentence chunk must take a random next"
    sigma_bound(sum(could), len(could), 0.5)
    assert len(could) > 2000


def test_truncation_cuts_front_and_back_half_the_time_and_the_longer_side():
    rng = random.Random(0)
    front = total = 0
    for _ in range(300):
        a, b = truncate_seq_pair(list(range(100)), [1000, 1001], 52, rng)
        assert len(a) + len(b) == 52 and b == [1000, 1001]
        front += a[0]
        total += 50
    sigma_bound(front, total, 0.5)
    a, b = truncate_seq_pair([1, 2, 3], [4, 5, 6], 5, random.Random(0))   # a tie trims B
    assert (len(a), len(b)) == (3, 2)


# ------------------------------------------------------------------ parity with the original

@pytest.fixture(scope="module")
def brown_tokenizer():
    with gzip.open(BROWN / "heldout.txt.gz", "rt", encoding="utf-8") as f:
        lines = f.read().split("\n")
    return BertTokenizer(train_wordpiece_vocab(lines, 2000))


@pytest.mark.parametrize("whole_word_mask", [False, True])
def test_same_instances_masks_and_order_as_the_original_script(tmp_path, brown_tokenizer,
                                                               whole_word_mask):
    options = dict(max_seq_length=64, max_predictions_per_seq=10, masked_lm_prob=0.2, dupe_factor=2,
                   short_seq_prob=0.2, seed=4321)
    corpus = str(BROWN / "heldout.txt.gz")
    expected = reference.run([corpus], brown_tokenizer, do_whole_word_mask=whole_word_mask,
                             **options)
    manifest = create_pretraining_data(corpus, tmp_path / "data", brown_tokenizer,
                                       whole_word_mask=whole_word_mask, instances_per_shard=1000,
                                       log=None, **options)
    got = PretrainingDataset(tmp_path / "data").features()
    assert manifest["statistics"]["random_next_fallbacks"] == 0
    assert len(manifest["shards"]) > 1
    for key, want in expected.items():
        assert got[key].shape == want.shape, f"{key}: {got[key].shape} != {want.shape}"
        rows = numpy.flatnonzero((got[key] != want).reshape(len(want), -1).any(1))
        assert len(rows) == 0, f"{key}: {len(rows)} of {len(want)} rows differ, first {rows[:5]}"


# ----------------------------------------------------------------------------- shards

def write_corpus(path, documents, vocab_tokens):
    """documents of ids -> a text file in BERT's input format (the synthetic words tokenize back
    to the same ids: "w12" is a word, "##p13" glues as "p13" onto the word before)."""
    lines = []
    for doc in documents:
        for sentence in doc:
            text = ""
            for t in sentence:
                token = vocab_tokens[t]
                if token.startswith("##") and text:
                    text += token[2:]
                else:
                    text += (" " if text else "") + token.lstrip("#")
            lines.append(text)
        lines.append("")
    pathlib.Path(path).write_text("\n".join(lines), encoding="utf-8")


@pytest.fixture
def small_corpus(tmp_path):
    """A text file and its tokenizer, with words that tokenize to exactly the ids written."""
    n_docs = 5
    documents = synthetic_documents(random.Random(11), n_docs, max_sentences=12, max_len=15)
    tokens = synthetic_vocab(n_docs)
    # "##p" pieces must not start a sentence or a word in the text: make them heads there
    for doc in documents:
        for sentence in doc:
            if tokens[sentence[0]].startswith("##"):
                sentence[0] -= 1
    path = tmp_path / "corpus.txt"
    write_corpus(path, documents, tokens)
    tokenizer = BertTokenizer(tokens)
    check = [[tokenizer.convert_tokens_to_ids(tokenizer.tokenize(line)) for line in doc]
             for doc in read_documents(path)]
    assert check == documents
    return path, documents, tokenizer


def expected_rows(documents, tokenizer, seed, max_seq_length, **options):
    """The instances create_pretraining_data must write, made in memory, in the shuffled order."""
    rng = random.Random(seed)
    instances = list(create_training_instances(TokenizedCorpus.from_lists(documents), rng,
                                               VocabInfo.from_tokenizer(tokenizer), max_seq_length,
                                               **options))
    return [instances[i] for i in shuffle_permutation(rng, len(instances))]


def test_shards_round_trip_memory_mapped_and_batches_are_the_instances(tmp_path, small_corpus):
    path, documents, tokenizer = small_corpus
    options = dict(short_seq_prob=0.3, masked_lm_prob=0.15, max_predictions_per_seq=8,
                   dupe_factor=3)
    create_pretraining_data(path, tmp_path / "out", tokenizer, max_seq_length=40, seed=9,
                            instances_per_shard=10, log=None, **options)
    data = PretrainingDataset(tmp_path / "out")
    expected = expected_rows(documents, tokenizer, 9, 40, **options)
    assert len(data) == len(expected)
    assert all(isinstance(a, numpy.memmap) for shard in data.shards for a in shard.values())
    batches = list(data.batches(7, shuffle=False))
    full, rest = divmod(len(data), 7)
    assert [len(b["input_ids"]) for b in batches] == [7] * full + ([rest] if rest else [])
    rows = {k: numpy.concatenate([b[k] for b in batches]) for k in batches[0]}
    for r, inst in enumerate(expected):
        n, b = len(inst.tokens), inst.segment_b_start
        assert rows["input_ids"][r, :n].tolist() == inst.tokens
        assert not rows["input_ids"][r, n:].any()
        assert rows["attention_mask"][r].tolist() == [1] * n + [0] * (40 - n)
        assert rows["token_type_ids"][r].tolist() == [0] * b + [1] * (n - b) + [0] * (40 - n)
        labels = rows["labels"][r]
        assert numpy.flatnonzero(labels != IGNORE_INDEX).tolist() == inst.masked_lm_positions
        assert labels[inst.masked_lm_positions].tolist() == inst.masked_lm_ids
        assert rows["next_sentence_label"][r] == int(inst.is_random_next)
        item = data[r]
        assert item["tokens"].tolist() == inst.tokens
        assert item["masked_lm_ids"].tolist() == inst.masked_lm_ids
    assert all(b["input_ids"].dtype == numpy.int64 for b in batches)


def test_tiny_shards_hold_the_same_instances_as_one_shard(tmp_path, small_corpus):
    path, _, tokenizer = small_corpus
    options = dict(max_seq_length=32, dupe_factor=2, seed=5, log=None)
    one = create_pretraining_data(path, tmp_path / "one", tokenizer, instances_per_shard=10**6,
                                  **options)
    many = create_pretraining_data(path, tmp_path / "many", tokenizer, instances_per_shard=3,
                                   **options)
    assert len(one["shards"]) == 1
    assert [s["rows"] for s in many["shards"]] == [3] * (many["total_instances"] // 3) + \
        ([many["total_instances"] % 3] if many["total_instances"] % 3 else [])
    a = PretrainingDataset(tmp_path / "one").features()
    b = PretrainingDataset(tmp_path / "many").features()
    for key in a:
        assert numpy.array_equal(a[key], b[key]), key


def test_same_seed_same_bytes_other_seed_other_data(tmp_path, small_corpus):
    path, _, tokenizer = small_corpus
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        create_pretraining_data(path, tmp_path / name, tokenizer, max_seq_length=32, dupe_factor=2,
                                seed=seed, instances_per_shard=8, log=None)
    files = sorted(f.name for f in (tmp_path / "a").glob("*.npy"))
    assert files and files == sorted(f.name for f in (tmp_path / "b").glob("*.npy"))
    for f in files + ["manifest.json", "vocab.txt"]:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    a = PretrainingDataset(tmp_path / "a").features()
    c = PretrainingDataset(tmp_path / "c").features()
    assert a["input_ids"].shape != c["input_ids"].shape \
        or not numpy.array_equal(a["input_ids"], c["input_ids"])


def test_manifest_records_the_options_and_the_progress_goes_to_the_log(tmp_path, small_corpus):
    path, _, tokenizer = small_corpus
    log = io.StringIO()
    m = create_pretraining_data([path], tmp_path / "out", tokenizer, max_seq_length=48,
                                max_predictions_per_seq=7, masked_lm_prob=0.1, dupe_factor=2,
                                short_seq_prob=0.25, seed=3,
                                whole_word_mask=True, instances_per_shard=9, log=log)
    on_disk = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert on_disk == json.loads(json.dumps(m))
    for key, value in dict(max_seq_length=48, max_predictions_per_seq=7, masked_lm_prob=0.1,
                           dupe_factor=2, short_seq_prob=0.25, seed=3, whole_word_mask=True,
                           format_version=1).items():
        assert m[key] == value, key
    assert m["total_instances"] == sum(s["rows"] for s in m["shards"])
    assert m["source_files"][0]["path"] == os.path.abspath(path)
    assert len(m["vocab_sha256"]) == 64 and m["dtypes"]["input_ids"] == "uint16"
    assert "documents/s" in log.getvalue() and "wrote" in log.getvalue()
    assert sorted(os.listdir(tmp_path)) == ["corpus.txt", "out"], "temporary folders left behind"


def test_a_model_trains_on_the_batches(tmp_path, small_corpus):
    path, _, tokenizer = small_corpus
    create_pretraining_data(path, tmp_path / "out", tokenizer, max_seq_length=32, dupe_factor=1,
                            log=None)
    data = PretrainingDataset(tmp_path / "out")
    config = BertConfig(vocab_size=len(tokenizer.vocab), hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32, max_position_embeddings=32)
    data.check_compatible(config, tokenizer)
    batch = next(data.batches(4, numpy.random.default_rng(0), dynamic_masking=True))
    loss, grads = BertForPreTraining(config, seed=0).loss_and_grads(batch)
    assert numpy.isfinite(float(loss))
    with pytest.raises(ValueError, match="max_position_embeddings 16"):
        data.check_compatible(BertConfig(vocab_size=len(tokenizer.vocab), hidden_size=16,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         intermediate_size=32, max_position_embeddings=16))
    with pytest.raises(ValueError, match="not the one the data"):
        data.check_compatible(tokenizer=BertTokenizer(list(tokenizer.vocab) + ["extra"]))


# ----------------------------------------------------------------------------- dynamic masking

@pytest.mark.parametrize("whole_word_mask", [False, True])
def test_dynamic_masking_draws_new_masks_with_the_same_rules(tmp_path, small_corpus,
                                                             whole_word_mask):
    path, _, tokenizer = small_corpus
    create_pretraining_data(path, tmp_path / "out", tokenizer, max_seq_length=48, dupe_factor=4,
                            whole_word_mask=whole_word_mask, masked_lm_prob=0.2, log=None)
    data = PretrainingDataset(tmp_path / "out")
    vocab = VocabInfo.from_tokenizer(tokenizer)
    static = data.batch(numpy.arange(len(data)))
    truth = static["input_ids"].copy()
    truth[static["labels"] != IGNORE_INDEX] = static["labels"][static["labels"] != IGNORE_INDEX]
    rng = numpy.random.default_rng(0)
    first = data.batch(numpy.arange(len(data)), rng, dynamic_masking=True)
    second = data.batch(numpy.arange(len(data)), rng, dynamic_masking=True)
    assert not numpy.array_equal(first["labels"], second["labels"]), "two epochs, same masks"
    kinds = {"mask": 0, "kept": 0, "other": 0}
    for batch in (first, second):
        for key in ("token_type_ids", "attention_mask", "next_sentence_label"):
            assert numpy.array_equal(batch[key], static[key])
        chosen = batch["labels"] != IGNORE_INDEX
        assert numpy.array_equal(batch["labels"][chosen], truth[chosen])
        assert numpy.array_equal(batch["input_ids"][~chosen], truth[~chosen])
        assert not chosen[numpy.isin(truth, [CLS, SEP])].any(), "[CLS]/[SEP] masked"
        for r in range(len(truth)):
            n = int(batch["attention_mask"][r].sum())
            count = int(chosen[r].sum())
            if whole_word_mask:
                assert count <= num_to_predict(n, 0.2, 20)
                for group in word_groups(truth[r, :n].tolist(), vocab):
                    assert chosen[r, group].sum() in (0, len(group))
            else:
                assert count == num_to_predict(n, 0.2, 20)
        got, want = batch["input_ids"][chosen], truth[chosen]
        kinds["mask"] += int((got == MASK).sum())
        kinds["kept"] += int((got == want).sum())
        kinds["other"] += int(((got != MASK) & (got != want)).sum())
    n, V = sum(kinds.values()), vocab.size
    sigma_bound(kinds["mask"], n, 0.8 + 0.1 / V)
    sigma_bound(kinds["kept"], n, 0.1 + 0.1 / V)


def test_batches_shuffle_every_epoch_and_need_a_generator(tmp_path, small_corpus):
    path, _, tokenizer = small_corpus
    create_pretraining_data(path, tmp_path / "out", tokenizer, max_seq_length=32, dupe_factor=2,
                            log=None)
    data = PretrainingDataset(tmp_path / "out")
    rng = numpy.random.default_rng(1)
    epochs = [numpy.concatenate([b["input_ids"] for b in data.batches(5, rng)]) for _ in range(2)]
    assert not numpy.array_equal(epochs[0], epochs[1])

    def rows(a):                                  # the rows as a multiset: order ignored
        return sorted(map(tuple, a.tolist()))

    assert rows(epochs[0]) == rows(epochs[1]) == rows(data.features()["input_ids"])
    dropped = data.batches(5, rng, drop_last=True)
    assert sum(len(b["input_ids"]) for b in dropped) == len(data) // 5 * 5
    with pytest.raises(ValueError, match="numpy.random.Generator"):
        next(data.batches(4))


# ----------------------------------------------------------------------------- reading documents

def test_documents_end_at_blank_lines_and_at_the_end_of_each_file(tmp_path):
    (tmp_path / "b.txt").write_bytes(b"b one\r\nb two\n \t \n\n\nb three")
    with gzip.open(tmp_path / "a.txt.gz", "wb") as f:
        f.write(b"a one\n\na two\n")
    (tmp_path / "notes.md").write_text("ignored")
    stats = {}
    docs = list(read_documents(tmp_path, stats=stats))
    assert docs == [["a one"], ["a two"], ["b one", "b two"], ["b three"]]
    assert stats["documents"] == 4
    assert [os.path.basename(f) for f in stats["files"]] == ["a.txt.gz", "b.txt"]


@pytest.mark.parametrize("content", [b"", b"  \n\n\t\r\n \n"])
def test_empty_or_whitespace_only_corpus_is_an_error_naming_the_file(tmp_path, content,
                                                                     small_corpus):
    path = tmp_path / "empty.txt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="empty.txt.*empty or whitespace only"):
        list(read_documents(path))
    with pytest.raises(ValueError, match="empty.txt"):
        create_pretraining_data(path, tmp_path / "out", small_corpus[2], log=None)
    assert not (tmp_path / "out").exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]


def test_text_without_any_token_is_an_error(tmp_path, small_corpus):
    path = tmp_path / "control.txt"
    path.write_text("\x00\x01\n\x02\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no WordPiece token"):
        create_pretraining_data(path, tmp_path / "out", small_corpus[2], log=None)


def test_non_utf8_is_an_error_with_file_and_byte_offset_unless_replaced(tmp_path, small_corpus):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"w0 w2\n\nw4 \xffw6 \xc3\n")
    with pytest.raises(ValueError, match=r"bad.txt: line 3 .*0xff at byte offset 10\b"):
        list(read_documents(path))
    gz = tmp_path / "bad.txt.gz"
    with gzip.open(gz, "wb") as f:
        f.write(b"w0\n\xe9\n")
    with pytest.raises(ValueError, match=r"bad.txt.gz: line 2 .*byte offset 3 of the decompressed"):
        list(read_documents(gz))
    stats = {}
    with pytest.warns(UserWarning, match="2 in .*bad.txt"):
        docs = list(read_documents(path, errors="replace", stats=stats))
    assert docs == [["w0 w2"], ["w4 \ufffdw6 \ufffd"]]
    assert stats["utf8_replacements"] == {str(path): 2}
    with pytest.warns(UserWarning):
        m = create_pretraining_data(path, tmp_path / "out", small_corpus[2], errors="replace",
                                    log=None)
    assert list(m["statistics"]["utf8_replacements"].values()) == [2]
    with pytest.raises(ValueError, match="errors must be"):
        read_documents(path, errors="ignore")


def test_missing_inputs_are_file_not_found_before_anything_is_written(tmp_path, small_corpus):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        read_documents([small_corpus[0], tmp_path / "nope.txt"])
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        create_pretraining_data(tmp_path / "nope.txt", tmp_path / "out", small_corpus[2], log=None)
    (tmp_path / "folder").mkdir()
    with pytest.raises(ValueError, match="holds no .txt"):
        read_documents(tmp_path / "folder")
    assert not (tmp_path / "out").exists()


def test_a_single_document_works_and_says_negatives_come_from_it(tmp_path, small_corpus):
    path = tmp_path / "one.txt"
    lines = (f"w{2 * i} w{2 * i + 2} w{2 * i + 4}" for i in range(30))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.warns(UserWarning, match="single document.*same document"):
        m = create_pretraining_data(path, tmp_path / "out", small_corpus[2], max_seq_length=16,
                                    dupe_factor=3, log=None)
    assert m["statistics"]["single_document"]
    assert 0 < m["statistics"]["random_next"] < m["total_instances"]
    assert len(PretrainingDataset(tmp_path / "out")) == m["total_instances"]


def test_bad_options_are_value_errors(tmp_path, small_corpus):
    path, _, tokenizer = small_corpus
    for bad in (dict(max_seq_length=4), dict(masked_lm_prob=0.0), dict(dupe_factor=0),
                dict(short_seq_prob=1.5), dict(instances_per_shard=0),
                dict(max_predictions_per_seq=True)):
        name = next(iter(bad))
        with pytest.raises(ValueError, match=name):
            create_pretraining_data(path, tmp_path / "out", tokenizer, log=None, **bad)


# ------------------------------------------------------------------ existing output, damage

def test_an_existing_dataset_is_kept_unless_replaced_by_a_complete_one(tmp_path, small_corpus):
    path, _, tokenizer = small_corpus
    out = tmp_path / "out"
    create_pretraining_data(path, out, tokenizer, max_seq_length=32, dupe_factor=1, log=None)
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    with pytest.raises(FileExistsError, match="overwrite"):
        create_pretraining_data(path, out, tokenizer, max_seq_length=32, log=None)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"w0\n\xff\n")
    with pytest.raises(ValueError, match="byte offset 3"):
        create_pretraining_data(bad, out, tokenizer, max_seq_length=32, overwrite=True, log=None)
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before, \
        "a failed run touched the old dataset"
    create_pretraining_data(path, out, tokenizer, max_seq_length=40, dupe_factor=2, overwrite=True,
                            log=None)
    assert PretrainingDataset(out).max_seq_length == 40
    other = tmp_path / "other"
    other.mkdir()
    (other / "thesis.tex").write_text("precious")
    with pytest.raises(FileExistsError, match="not a dataset"):
        create_pretraining_data(path, other, tokenizer, overwrite=True, log=None)
    assert sorted(p for p in os.listdir(tmp_path) if p.startswith(".")) == []


@pytest.fixture
def dataset(tmp_path, small_corpus):
    path, _, tokenizer = small_corpus
    create_pretraining_data(path, tmp_path / "data", tokenizer, max_seq_length=32, dupe_factor=2,
                            instances_per_shard=10, log=None)
    return tmp_path / "data"


def edit_manifest(folder, change):
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


@pytest.mark.parametrize("damage, error, message", [
    (lambda d: (d / "manifest.json").write_text("{not json"), ValueError, "not valid JSON"),
    (lambda d: (d / "manifest.json").unlink(), FileNotFoundError, "no manifest.json"),
    (lambda d: edit_manifest(d, lambda m: m.pop("shards")), ValueError, "missing key.*shards"),
    (lambda d: edit_manifest(d, lambda m: m["shards"][1].update(rows=11)), ValueError,
     r"shard-00001.*has 10 rows, the manifest says 11"),
    (lambda d: edit_manifest(d, lambda m: m.update(total_instances=m["total_instances"] + 1)),
     ValueError, "total_instances"),
    (lambda d: edit_manifest(d, lambda m: m.update(format_version=99)), ValueError,
     "format_version 99"),
    (lambda d: edit_manifest(d, lambda m: m.update(max_seq_length=64)), ValueError,
     r"shard-00000.input_ids.npy: has \(10, 32\) shape"),
    (lambda d: (d / "shard-00001.masked_lm_ids.npy").unlink(), FileNotFoundError,
     "shard-00001.masked_lm_ids.npy"),
    (lambda d: (d / "shard-00000.input_ids.npy").write_bytes(b"\x93NUMPY garbage"), ValueError,
     "shard-00000.input_ids.npy: not a readable"),
    (lambda d: numpy.save(d / "shard-00000.input_lengths.npy", numpy.full(10, 99, numpy.uint16)),
     ValueError, "row 0: input_lengths outside"),
    (lambda d: numpy.save(d / "shard-00000.num_masked.npy", numpy.zeros(10, numpy.int32)),
     ValueError, "dtype int32, expected uint16"),
    (lambda d: (d / "vocab.txt").write_text("[PAD]\n"), ValueError, "sha256"),
], ids=["json", "no-manifest", "missing-key", "row-count", "total", "version", "shape",
        "missing-shard", "truncated-npy", "row-values", "dtype", "vocab"])
def test_damaged_datasets_are_clear_errors(dataset, damage, error, message):
    PretrainingDataset(dataset)
    damage(dataset)
    with pytest.raises(error, match=message):
        PretrainingDataset(dataset)


# ----------------------------------------------------------------------------- command line

def test_command_line_help_and_run(tmp_path, small_corpus, capsys):
    path, _, tokenizer = small_corpus
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    help_text = capsys.readouterr().out
    for option in ("--input", "--output", "--vocab", "--whole-word-mask", "--errors",
                   "blank line between documents"):
        assert option in help_text
    tokenizer.save_pretrained(tmp_path / "tok")
    assert main(["--input", str(path), "--output", str(tmp_path / "out"),
                 "--vocab", str(tmp_path / "tok"),
                 "--max-seq-length", "32", "--dupe-factor", "2", "--quiet"]) == 0
    assert len(PretrainingDataset(tmp_path / "out")) > 0
    with pytest.raises(SystemExit) as exit_:
        main(["--input", str(tmp_path / "missing.txt"), "--output", str(tmp_path / "o2"), "--vocab",
              str(tmp_path / "tok")])
    assert exit_.value.code == 2 and "input not found" in capsys.readouterr().err


def test_a_vocab_over_65536_tokens_is_stored_as_int32(tmp_path):
    tokens = SPECIALS + [f"w{i}" for i in range(70_000)]
    path = tmp_path / "big.txt"
    path.write_text("w69990 w3 w69999\nw5 w70 w65536\n\nw1 w2\nw65537 w4\n", encoding="utf-8")
    m = create_pretraining_data(path, tmp_path / "out", BertTokenizer(tokens), max_seq_length=16,
                                dupe_factor=3, log=None)
    assert m["dtypes"]["input_ids"] == m["dtypes"]["masked_lm_ids"] == "int32"
    f = PretrainingDataset(tmp_path / "out").features()
    assert f["input_ids"].max() >= 65536 + 5 or f["masked_lm_ids"].max() >= 65536 + 5


# ------------------------------------------------------------------ crash leftovers, odd inputs

def test_a_dataset_moved_aside_by_an_interrupted_overwrite_is_put_back(tmp_path, small_corpus,
                                                                      capsys):
    """A crash inside --overwrite's swap (between its two renames) leaves the dataset at
    <out>.old and no <out>: reading it, or building it again, puts it back first and says so."""
    path, _, tokenizer = small_corpus
    out = tmp_path / "out"
    create_pretraining_data(path, out, tokenizer, max_seq_length=32, dupe_factor=1, log=None)
    rows = len(PretrainingDataset(out))
    os.replace(out, tmp_path / "out.old")
    (tmp_path / "out.tmp").mkdir()                       # the new build, unfinished
    assert len(PretrainingDataset(out)) == rows
    assert "restored" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["corpus.txt", "out"]
    os.replace(out, tmp_path / "out.old")
    log = io.StringIO()
    create_pretraining_data(path, out, tokenizer, max_seq_length=40, dupe_factor=1,
                            overwrite=True, log=log)
    assert f"restored {out} from {out}.old" in log.getvalue(), log.getvalue()
    assert PretrainingDataset(out).max_seq_length == 40
    assert sorted(os.listdir(tmp_path)) == ["corpus.txt", "out"]


def test_a_build_folder_left_by_a_kill_is_removed_by_the_next_run(tmp_path, small_corpus):
    path, _, tokenizer = small_corpus
    stale = tmp_path / "out.tmp"
    (stale / "tmp").mkdir(parents=True)
    log = io.StringIO()
    create_pretraining_data(path, tmp_path / "out", tokenizer, max_seq_length=32, dupe_factor=1,
                            log=log)
    assert f"removed the unfinished {stale}" in log.getvalue(), log.getvalue()
    assert sorted(os.listdir(tmp_path)) == ["corpus.txt", "out"]


def test_inputs_that_are_not_regular_files_are_named_as_such(tmp_path, small_corpus):
    os.mkfifo(tmp_path / "pipe.txt")
    for path, kind in (("/dev/zero", "a character device"),
                       (tmp_path / "pipe.txt", r"a FIFO \(named pipe\)")):
        with pytest.raises(ValueError, match=f"is not a regular file: it is {kind}"):
            read_documents([small_corpus[0], path])
        with pytest.raises(ValueError, match="is not a regular file"):
            create_pretraining_data(path, tmp_path / "out", small_corpus[2], log=None)
    assert not (tmp_path / "out").exists()


def test_the_strict_utf8_error_names_the_flag_both_command_lines_take(tmp_path, small_corpus,
                                                                     capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"w0 w2\n\nw4 \xffw6\n")
    with pytest.raises(ValueError, match="--utf8-errors replace"):
        list(read_documents(bad))
    small_corpus[2].save_pretrained(tmp_path / "tok")
    with pytest.warns(UserWarning, match="replaced invalid UTF-8"):
        assert main(["--input", str(bad), "--output", str(tmp_path / "out"), "--vocab",
                     str(tmp_path / "tok"), "--max-seq-length", "16", "--dupe-factor", "1",
                     "--utf8-errors", "replace", "--quiet"]) == 0
