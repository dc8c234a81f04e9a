"""BERT's tokenizer with the call API of transformers' BertTokenizer: text or pairs, batches,
truncation, padding, overflowing windows, offsets, word ids, special-token masks, decoding.
The algorithm itself (text -> words -> WordPiece ids) is in wordpiece.py: read that first.

Values follow transformers: ids as its Python BertTokenizer (and the original BERT) give them,
the call options' outputs (offsets, word ids, overflowing windows, padding, lengths) as its
Rust-backed BertTokenizer (transformers 5's default) gives them; docs/tokenizer.md lists what is
supported, what is not and why. tests/test_tokenizer_api.py compares every option with
transformers on generated text.

Two paths, one answer. The plain call (ids, token types, attention mask; truncation; padding)
runs on the cached word -> ids tables with no per-token Python. An option that needs to know
where each token came from (offsets, word ids, overflowing windows, pre-split words) runs the
detailed path, which follows every token back to its characters (character by character
where cleaning changed the text); its ids are the plain path's (tested), and
BatchEncoding.word_ids() on a plain call re-runs that call on the detailed path. How a pair is
truncated "longest_first" is the Python tokenizer's and the original BERT's.
"""
import itertools
import json
import os
import re
import unicodedata

import numpy

from ..formats.fileio import read_json
from .vocab_training import count_words, train_wordpiece_vocab
from .wordpiece import (SPECIAL_TOKENS, TOKENIZER_CONFIG_NAME, TOKENIZER_JSON_NAME, VOCAB_NAME,
                        BasicTokenizer, WordpieceTokenizer, _Cache, _check_required, load_vocab,
                        packaged_vocab_path, save_vocab)

__all__ = ["BasicTokenizer", "BatchEncoding", "BertTokenizer", "SPECIAL_TOKENS",
           "TOKENIZER_CONFIG_NAME", "TOKENIZER_JSON_NAME", "VOCAB_NAME", "WordpieceTokenizer",
           "count_words", "load_vocab", "packaged_vocab_path", "read_tokenizer_json",
           "save_vocab", "train_wordpiece_vocab"]

# transformers' model_max_length when nothing sets it: no length limit.
VERY_LARGE_INTEGER = int(1e30)
_NON_SPACE = re.compile(r"\S+")        # str.split's whitespace, as \s: Python's isspace()


class _WhitespaceSplitter:
    """BertTokenizer(do_basic_tokenize=False): words are the whitespace-separated tokens as
    they stand - no cleaning, no lower-casing, no punctuation split (as transformers)."""
    never_split = frozenset()
    _clean = {}

    @staticmethod
    def whitespace_words(text):
        return text.split()

    @staticmethod
    def split_word(token):
        return [token]


class BatchEncoding(dict):
    """What BertTokenizer.__call__ returns: a dict of the model inputs ("input_ids",
    "token_type_ids", "attention_mask", and the keys the options asked for), readable as
    attributes too, with transformers' per-row accessors: word_ids(i) (the index of the word
    each token came from, None for [CLS], [SEP] and padding), sequence_ids(i) (0 for text A,
    1 for B, None for the rest) and tokens(i)."""

    def __init__(self, data, columns=None, recompute=None, tokenizer=None):
        super().__init__(data)
        # every per-token list of every row (_Row's fields), padded: "word_ids" is None
        # where the call took the lean path
        self._columns, self._recompute, self._tokenizer = columns, recompute, tokenizer

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"BatchEncoding has no key {name!r}") from None

    def _row(self, key, batch_index):
        words = self._columns.get("word_ids") if self._columns else None
        if not words or words[0] is None:
            if self._recompute is None:
                raise ValueError("word_ids / sequence_ids / tokens need an encoding that "
                                 "BertTokenizer.__call__ made from text")
            self._columns = self._recompute()._columns   # the same call, on the detailed path
        rows = self._columns[key]
        if not -len(rows) <= batch_index < len(rows):
            raise ValueError(f"batch_index {batch_index} is outside the {len(rows)} rows")
        return list(rows[batch_index])

    def word_ids(self, batch_index=0):
        return self._row("word_ids", batch_index)

    def sequence_ids(self, batch_index=0):
        return self._row("sequence_ids", batch_index)

    def tokens(self, batch_index=0):
        return self._tokenizer.convert_ids_to_tokens(self._row("input_ids", batch_index))


class _Seq:
    """One text's tokens: ids, and (detailed path only) each token's word index and character
    span in the text; None where not computed."""
    __slots__ = ("ids", "words", "offsets")

    def __init__(self, ids, words=None, offsets=None):
        self.ids, self.words, self.offsets = ids, words, offsets

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, index):            # a slice of every list kept
        return _Seq(self.ids[index], None if self.words is None else self.words[index],
                    None if self.offsets is None else self.offsets[index])


class _Row:
    """One row of the output: [CLS] A [SEP] (B [SEP]) and, per token, everything an option
    may ask for."""
    __slots__ = ("input_ids", "token_type_ids", "attention_mask", "special_tokens_mask",
                 "offset_mapping", "word_ids", "sequence_ids")

    def __init__(self, **values):
        for key in self.__slots__:
            setattr(self, key, values[key])


# ----------------------------------------------------------------------------- BertTokenizer

class BertTokenizer:
    """BERT's WordPiece tokenizer, with the behaviour, method names and call options of
    transformers' BertTokenizer.

    vocab_file: the path of a vocab.txt, or the tokens themselves (a list, id = position).
    [UNK], [CLS] and [SEP] must be in the vocab; a missing [PAD] or [MASK] is appended after
    the last id, as transformers does. cache_size bounds the word -> pieces caches.
    model_max_length: what truncation=True / padding="max_length" use when no max_length is
    given (transformers' default: no limit). padding_side / truncation_side: "right" or
    "left", as transformers' attributes of those names.
    """

    def __init__(self, vocab_file, do_lower_case=True, strip_accents=None, never_split=None,
                 tokenize_chinese_chars=True, max_input_chars_per_word=100, unk_token="[UNK]",
                 sep_token="[SEP]", pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]",
                 cache_size=1 << 18, do_basic_tokenize=True, model_max_length=None,
                 padding_side="right", truncation_side="right",
                 clean_up_tokenization_spaces=True):
        if isinstance(vocab_file, (list, tuple)):
            self.vocab_file = None
            self.vocab = {}
            for index, token in enumerate(vocab_file):
                if token in self.vocab:
                    raise ValueError(f"vocab: duplicate token {token!r} at ids "
                                     f"{self.vocab[token]} and {index}")
                self.vocab[token] = index
            where = "vocab"
        else:
            self.vocab_file = os.fspath(vocab_file)
            self.vocab = load_vocab(vocab_file, required=())
            where = f"vocab file {self.vocab_file!r}"
        _check_required(self.vocab, (unk_token, cls_token, sep_token), where)
        for token in (pad_token, mask_token):       # transformers adds them as new tokens
            self.vocab.setdefault(token, len(self.vocab))
        self.ids_to_tokens = list(self.vocab)
        self.do_lower_case = do_lower_case
        self.strip_accents = strip_accents
        self.tokenize_chinese_chars = tokenize_chinese_chars
        self.do_basic_tokenize = do_basic_tokenize
        self.max_input_chars_per_word = max_input_chars_per_word
        self.model_max_length = VERY_LARGE_INTEGER if model_max_length is None \
            else model_max_length
        self.padding_side = _side("padding_side", padding_side)
        self.truncation_side = _side("truncation_side", truncation_side)
        self.clean_up_tokenization_spaces = clean_up_tokenization_spaces
        self.unk_token, self.sep_token, self.pad_token = unk_token, sep_token, pad_token
        self.cls_token, self.mask_token = cls_token, mask_token
        self.never_split = frozenset(never_split or ())
        self.added_tokens = {}            # add_tokens: token -> special (True / False)
        self.unk_token_id, self.sep_token_id = self.vocab[unk_token], self.vocab[sep_token]
        self.pad_token_id, self.cls_token_id = self.vocab[pad_token], self.vocab[cls_token]
        self.mask_token_id = self.vocab[mask_token]
        self.pad_token_type_id = 0
        self.model_input_names = ["input_ids", "token_type_ids", "attention_mask"]

        if do_basic_tokenize:
            self.basic_tokenizer = BasicTokenizer(
                do_lower_case=do_lower_case, tokenize_chinese_chars=tokenize_chinese_chars,
                strip_accents=strip_accents)
        else:
            self.basic_tokenizer = _WhitespaceSplitter()
        self.wordpiece_tokenizer = WordpieceTokenizer(self.vocab, unk_token,
                                                      max_input_chars_per_word)
        self._cache_size = cache_size
        self._rebuild()

    def _rebuild(self):
        """The special and added tokens' tables and patterns, and empty word caches: at
        construction and after add_tokens."""
        extra = [t for t, special in self.added_tokens.items() if special]
        # HF's order, then the added special tokens
        self.all_special_tokens = [self.unk_token, self.sep_token, self.pad_token,
                                   self.cls_token, self.mask_token] + extra
        self.all_special_ids = [self.vocab[t] for t in self.all_special_tokens]
        specials = set(self.all_special_tokens)
        if isinstance(self.basic_tokenizer, BasicTokenizer):
            # (added special tokens are cut out of the raw text only: "<ENT>" is not "<ent>")
            self.basic_tokenizer.never_split = self.never_split | set(self.all_special_tokens[:5])
            # Added tokens that are not special are matched in the normalized text (as
            # transformers' Rust tokenizer does: "Foo" added matches "FOO" when uncased).
            normal = {self.basic_tokenizer.normalize(t): self.vocab[t]
                      for t, special in self.added_tokens.items() if not special}
            self._added_ids = normal
            self.basic_tokenizer.added_pattern = _literals(normal) if normal else None
        else:
            self._added_ids = {}
        # Special tokens are cut out of the raw text with one regex of literals.
        self._special_pattern = _literals(specials)
        self._special_split = self._special_pattern.split
        # The one character all special tokens start with ("[" for BERT's): a text without it
        # holds none. "" (found in every text) if they start differently.
        heads = {t[0] for t in specials}
        self._special_head = heads.pop() if len(heads) == 1 else ""
        # Two levels: whitespace token ("dog,") -> ids, and its words ("dog", ",") -> ids.
        size = self._cache_size
        self._pieces = _Cache(self._token_pieces, size)
        self._ids = _Cache(self._token_ids, size)
        self._word_pieces = _Cache(self._word_pieces_uncached, size)
        self._word_ids = _Cache(self._word_ids_uncached, size)
        self._token_details = _Cache(self._token_details_uncached, size)

    def add_tokens(self, new_tokens, special_tokens=False):
        """Add tokens to the vocab (new ids after the last), matched in the text before
        WordPiece and never split; as transformers' Rust tokenizer: a token not special is
        matched in the lower-cased (uncased) text, anywhere, a special one in the raw text.
        A token already in the vocab keeps its id and is matched the same way. Saved with the
        vocab by save_pretrained. -> how many tokens became added tokens."""
        if isinstance(new_tokens, str):
            new_tokens = [new_tokens]
        if not isinstance(self.basic_tokenizer, BasicTokenizer):
            raise ValueError("add_tokens needs do_basic_tokenize=True")
        count = 0
        for token in new_tokens:
            if not isinstance(token, str) or not token or any(c.isspace() for c in token):
                raise ValueError(f"an added token must be a str without whitespace, got "
                                 f"{token!r}")
            if token in self.added_tokens:
                continue
            if token not in self.vocab:
                self.vocab[token] = len(self.vocab)
                self.ids_to_tokens.append(token)
            self.added_tokens[token] = bool(special_tokens)
            count += 1
        self._rebuild()
        return count

    def add_special_tokens(self, special_tokens_dict):
        """{"additional_special_tokens": [...]} -> add them as special tokens (never split,
        matched in the raw text, left out by decode(skip_special_tokens=True)). The five named
        special tokens cannot be replaced here (give them to the constructor)."""
        count = 0
        for key, value in special_tokens_dict.items():
            if key in ("additional_special_tokens", "extra_special_tokens"):
                count += self.add_tokens(list(value), special_tokens=True)
            elif getattr(self, key, None) != value:
                raise ValueError(f"add_special_tokens: {key}={value!r} is not supported (only "
                                 "additional_special_tokens; the five named special tokens "
                                 "are set by the constructor)")
        return count

    # -- the pipeline (wordpiece.py explains each step)

    def wordpiece(self, word):
        """Greedy longest-match-first WordPiece of one word -> list of pieces, or [unk]."""
        return self.wordpiece_tokenizer.wordpiece(word)

    def _word_pieces_uncached(self, word):
        if word in self._added_ids:
            return (self.ids_to_tokens[self._added_ids[word]],)
        if word in self.basic_tokenizer.never_split:
            return (word,)                           # as HF: kept as is, even if not in the vocab
        return tuple(self.wordpiece(word))

    def _word_ids_uncached(self, word):
        if word in self._added_ids:
            return (self._added_ids[word],)
        if word in self.basic_tokenizer.never_split:
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

    # -- the detailed path: where each token came from

    def _detailed(self, text):
        """Text -> _Seq of its ids, each token's word index (the BasicTokenizer's words, and
        each special token cut out of the text, counted from 0) and its character span
        (start, end) in `text`. The same ids as _text_ids."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids, words, offsets = [], [], []
        word, start = 0, 0
        specials = list(self._special_pattern.finditer(text)) if self._special_head in text \
            else []
        for match in specials + [None]:
            end = match.start() if match else len(text)
            if start < end:
                word = self._detailed_part(text, start, end, word, ids, words, offsets)
            if match:
                ids.append(self.vocab[match.group()])
                words.append(word)
                offsets.append(match.span())
                word, start = word + 1, match.end()
        return _Seq(ids, words, offsets)

    def _detailed_part(self, text, start, end, word, ids, words, offsets):
        """The tokens of text[start:end] (no special token inside) appended to the lists;
        -> the next word index."""
        part, origin = text[start:end], None
        if self.do_basic_tokenize and not (part.isascii() and part.isprintable()):
            # Cleaning deletes some characters and spaces out CJK ones: origin[i] is the
            # index in `part` of the i-th character of the cleaned text.
            table, pieces, origin = self.basic_tokenizer._clean, [], []
            for i, char in enumerate(part):
                cleaned = char.translate(table)
                pieces.append(cleaned)
                origin.extend([i] * len(cleaned))
            part = "".join(pieces)
        details = self._token_details
        for match in _NON_SPACE.finditer(part):
            token_ids, token_words, spans, n_words = details[match.group()]
            base = match.start()
            ids += token_ids
            words += [word + w for w in token_words]
            if origin is None:                      # nothing cleaned: positions are as given
                shift = start + base
                offsets += [(shift + s, shift + e) for s, e in spans]
            else:
                offsets += [(start + origin[base + s], start + origin[base + e - 1] + 1)
                            for s, e in spans]
            word += n_words
        return word

    def _token_details_uncached(self, token):
        """One whitespace token (cleaned, before NFC) -> (ids, word index of each id within
        the token, span of each id in the token, number of words)."""
        nfc = token if token.isascii() else unicodedata.normalize("NFC", token)
        token_words = self.basic_tokenizer.split_word(nfc)
        spans = _char_spans(token, token_words, self._split_normalized)
        ids, word_index, piece_spans, pos = [], [], [], 0
        for w, word in enumerate(token_words):
            pieces = self._word_pieces[word]
            lengths = [len(word)] if len(pieces) == 1 else \
                [len(p) - 2 if k else len(p) for k, p in enumerate(pieces)]
            for piece_id, n in zip(self._word_ids[word], lengths):
                ids.append(piece_id)
                word_index.append(w)
                piece_spans.append((spans[pos][0], spans[pos + n - 1][1]))
                pos += n
        return ids, word_index, piece_spans, len(token_words)

    def _split_normalized(self, token):
        nfc = token if token.isascii() else unicodedata.normalize("NFC", token)
        return self.basic_tokenizer.split_word(nfc) if nfc else []

    def _detailed_words(self, words):
        """is_split_into_words: a list of words -> _Seq; each word is tokenized on its own,
        its tokens get the word's index, and offsets are spans within the word."""
        if isinstance(words, str) or not isinstance(words, (list, tuple)):
            raise ValueError("is_split_into_words=True needs each text as a list of words, got "
                             f"{type(words).__name__}")
        ids, word_ids, offsets = [], [], []
        for index, word in enumerate(words):
            seq = self._detailed(word)
            ids += seq.ids
            word_ids += [index] * len(seq)
            offsets += seq.offsets
        return _Seq(ids, word_ids, offsets)

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

    def decode(self, ids, skip_special_tokens=False, clean_up_tokenization_spaces=None):
        """ids -> text: tokens joined by spaces, each "##" piece glued to the one before, then
        HF's clean-up of spaces before punctuation. Lower-casing and accents stay undone."""
        if isinstance(ids, numpy.ndarray):
            ids = ids.reshape(-1).tolist()
        elif isinstance(ids, (int, numpy.integer)):
            ids = [int(ids)]
        text = self.convert_tokens_to_string(self.convert_ids_to_tokens(ids, skip_special_tokens))
        if clean_up_tokenization_spaces is None:
            clean_up_tokenization_spaces = self.clean_up_tokenization_spaces
        return self.clean_up_tokenization(text) if clean_up_tokenization_spaces else text

    def batch_decode(self, sequences, skip_special_tokens=False, clean_up_tokenization_spaces=None):
        """A batch of id lists (or a 2-D array) -> a list of texts, each as decode gives it."""
        return [self.decode(ids, skip_special_tokens, clean_up_tokenization_spaces)
                for ids in sequences]

    # -- special tokens of the model inputs

    def build_inputs_with_special_tokens(self, ids_a, ids_b=None):
        """[CLS] A [SEP], or [CLS] A [SEP] B [SEP]."""
        if ids_b is None:
            return [self.cls_token_id, *ids_a, self.sep_token_id]
        return [self.cls_token_id, *ids_a, self.sep_token_id, *ids_b, self.sep_token_id]

    def create_token_type_ids_from_sequences(self, ids_a, ids_b=None):
        """Segment ids of build_inputs_with_special_tokens(ids_a, ids_b): 0 for [CLS] A [SEP],
        1 for B [SEP]."""
        return [0] * (len(ids_a) + 2) + ([] if ids_b is None else [1] * (len(ids_b) + 1))

    def get_special_tokens_mask(self, ids_a, ids_b=None, already_has_special_tokens=False):
        """1 where build_inputs_with_special_tokens puts [CLS]/[SEP], 0 for text tokens; with
        already_has_special_tokens, 1 for every special token's id in ids_a."""
        if already_has_special_tokens:
            if ids_b is not None:
                raise ValueError("already_has_special_tokens=True takes one list of ids "
                                 "(the model input), not a pair")
            special = set(self.all_special_ids)
            return [1 if int(i) in special else 0 for i in ids_a]
        return [1] + [0] * len(ids_a) + [1] + ([] if ids_b is None else [0] * len(ids_b) + [1])

    def num_special_tokens_to_add(self, pair=False):
        return 3 if pair else 2

    @staticmethod
    def truncate_sequences(ids_a, ids_b=None, num_tokens_to_remove=0,
                           truncation_strategy="longest_first", truncation_side="right"):
        """Remove num_tokens_to_remove tokens from the ends (the starts with
        truncation_side="left"), as HF's Python tokenizer and the original BERT do.

        "longest_first" with a pair takes one token at a time from the longer sequence, from
        B when they are equally long (HF computes the same split in closed form; transformers'
        Rust tokenizer splits ties the other way, see docs/tokenizer.md). A single sequence,
        or "only_first" / "only_second", loses them all from the one sequence.
        """
        remove_a, remove_b = _removals(len(ids_a), None if ids_b is None else len(ids_b),
                                       num_tokens_to_remove, truncation_strategy)
        return (_cut(ids_a, remove_a, truncation_side),
                None if ids_b is None else _cut(ids_b, remove_b, truncation_side))

    # -- model inputs: the call API

    def __call__(self, text, text_pair=None, *, add_special_tokens=True, padding=False,
                 truncation=None, max_length=None, stride=0, is_split_into_words=False,
                 pad_to_multiple_of=None, padding_side=None, return_tensors=None,
                 return_token_type_ids=None, return_attention_mask=None,
                 return_overflowing_tokens=False, return_special_tokens_mask=False,
                 return_offsets_mapping=False, return_length=False, verbose=True):
        """Text(s) -> BatchEncoding {"input_ids", "token_type_ids", "attention_mask", ...},
        with transformers' options, names and defaults (docs/tokenizer.md has the table).

        text: a str, a list of str, or a list of (A, B) pairs (with is_split_into_words: a
        list of words, or a list of such lists); text_pair: the B side(s). truncation: True /
        "longest_first", "only_first", "only_second", False; None truncates only when
        max_length is given and padding is off, as transformers. padding: False, True /
        "longest", "max_length". return_tensors="np" gives int64 arrays [B, T] ([1, T] for a
        single text), otherwise lists. return_overflowing_tokens: the tokens truncation cut
        become further rows (windows overlapping by `stride` tokens), with
        "overflow_to_sample_mapping" naming each row's input.
        """
        options = dict(add_special_tokens=add_special_tokens, padding=padding,
                       truncation=truncation, max_length=max_length, stride=stride,
                       is_split_into_words=is_split_into_words,
                       pad_to_multiple_of=pad_to_multiple_of, padding_side=padding_side,
                       return_tensors=return_tensors, return_token_type_ids=return_token_type_ids,
                       return_attention_mask=return_attention_mask,
                       return_overflowing_tokens=return_overflowing_tokens,
                       return_special_tokens_mask=return_special_tokens_mask,
                       return_offsets_mapping=return_offsets_mapping, return_length=return_length)
        return self._encode(text, text_pair, options, detailed=False)

    def _encode(self, text, text_pair, options, detailed):
        """__call__: check the options, make the rows, pad them, pick the keys asked for.
        detailed: take the character-walking path even if no option needs it (word_ids)."""
        strategy, max_length, pad_to = self._strategies(
            options["padding"], options["truncation"], options["max_length"])
        if options["return_tensors"] not in (None, "np"):
            raise ValueError(f"return_tensors must be None or 'np', got "
                             f"{options['return_tensors']!r}")
        multiple = options["pad_to_multiple_of"]
        if strategy and pad_to and multiple and max_length is not None and max_length % multiple:
            raise ValueError(f"truncation to max_length={max_length} and padding to a multiple "
                             f"of {multiple} contradict each other (as transformers refuses)")
        padding_side = _side("padding_side", options["padding_side"] or self.padding_side)
        overflow = options["return_overflowing_tokens"]
        detailed = detailed or options["is_split_into_words"] or overflow \
            or options["return_offsets_mapping"]
        batched, columns, sample = self._columns(text, text_pair, options, strategy, max_length,
                                                 detailed)
        if pad_to is not None:
            width = max_length if pad_to == "max_length" else max(
                map(len, columns["input_ids"]), default=0)
            if multiple:
                width = -(-width // multiple) * multiple
            self._pad_columns(columns, width, padding_side)
        out = _outputs(columns, sample, options)
        if options["return_tensors"] == "np":
            out = {key: _array(key, value) for key, value in out.items()}
        elif not batched and not overflow:      # as transformers: "length" stays a list
            out = {key: value if key == "length" else value[0] for key, value in out.items()}
        recompute = None if detailed else \
            lambda: self._encode(text, text_pair, options, detailed=True)
        return BatchEncoding(out, columns, recompute, self)

    def _columns(self, text, text_pair, options, strategy, max_length, detailed):
        """The inputs -> (batched, {key: per-row lists of _Row's fields}, each row's input
        index), truncated (into windows with overflow), special tokens added, not padded."""
        split = options["is_split_into_words"]
        lean = (not detailed and isinstance(text, (list, tuple)) and text_pair is None
                and options["add_special_tokens"] and (strategy is None or max_length is None)
                and all(type(t) is str for t in text))
        if lean:
            # The common case, kept lean: a batch of single texts, nothing to truncate, no
            # per-token work beyond the ids.
            input_ids = list(map(self._single_input_ids, text))
            columns = {"input_ids": input_ids,
                       "token_type_ids": [[0] * len(ids) for ids in input_ids],
                       "attention_mask": [[1] * len(ids) for ids in input_ids]}
            if options["return_special_tokens_mask"]:
                columns["special_tokens_mask"] = [[1] + [0] * (len(ids) - 2) + [1]
                                                  for ids in input_ids]
            batched, sample = True, None
        else:
            batched, items = _batch_items(text, text_pair, split)
            encode = (self._detailed_words if split else self._detailed) if detailed \
                else lambda t: _Seq(self._text_ids(t))
            rows, sample = [], []
            for index, (a, b) in enumerate(items):
                seq_a, seq_b = encode(a), None if b is None else encode(b)
                for row in self._rows(seq_a, seq_b, options["add_special_tokens"], strategy,
                                      max_length, options["stride"],
                                      options["return_overflowing_tokens"]):
                    rows.append(row)
                    sample.append(index)
            columns = {key: [getattr(row, key) for row in rows] for key in _Row.__slots__}
        return batched, columns, sample

    def _strategies(self, padding, truncation, max_length):
        """transformers' rules -> (truncation strategy or None, max_length, padding or None)."""
        if max_length is not None and padding in (False, None) and truncation is None:
            truncation = "longest_first"         # as transformers: max_length alone truncates
        strategy = _truncation_strategy(truncation)
        if padding in (False, None, "do_not_pad"):
            pad_to = None
        elif padding is True or padding == "longest":
            pad_to = "longest"
        elif padding == "max_length":
            pad_to = "max_length"
        else:
            raise ValueError("padding must be False, True, 'longest' or 'max_length', got "
                             f"{padding!r}")
        if max_length is None and self.model_max_length < VERY_LARGE_INTEGER:
            if pad_to == "max_length" or strategy is not None:
                max_length = self.model_max_length
        if pad_to == "max_length" and max_length is None:
            raise ValueError("padding='max_length' needs max_length (this tokenizer has no "
                             "model_max_length)")
        if max_length is None:
            strategy = None                      # nothing to truncate to
        elif max_length < 0:
            raise ValueError(f"max_length must be at least 0, got {max_length}")
        return strategy, max_length, pad_to

    def _rows(self, seq_a, seq_b, add_special_tokens, strategy, max_length, stride, overflow):
        """One input's rows: truncated to max_length (the cut tokens as further windows with
        overflow), each with [CLS]/[SEP] added."""
        n_special = self.num_special_tokens_to_add(seq_b is not None) if add_special_tokens \
            else 0
        total = len(seq_a) + (len(seq_b) if seq_b is not None else 0) + n_special
        if strategy is None or total <= max_length:
            return [self._row(seq_a, seq_b, add_special_tokens)]
        if max_length < n_special:
            raise ValueError(f"max_length={max_length} leaves no room for the {n_special} "
                             "special tokens")
        excess, side = total - max_length, self.truncation_side
        if not overflow:
            remove_a, remove_b = _removals(len(seq_a), None if seq_b is None else len(seq_b),
                                           excess, strategy)
            return [self._row(_cut(seq_a, remove_a, side),
                              None if seq_b is None else _cut(seq_b, remove_b, side),
                              add_special_tokens)]
        if seq_b is not None and strategy == "longest_first":
            raise ValueError("return_overflowing_tokens with a pair needs truncation="
                             "'only_first' or 'only_second' (windows over both sides of a pair "
                             "are not supported)")
        second = seq_b is not None and strategy == "only_second"
        if strategy == "only_second" and seq_b is None:
            raise ValueError("truncation='only_second' needs a text pair")
        cut = seq_b if second else seq_a
        room = len(cut) - excess
        if room <= 0:
            raise ValueError(f"cannot remove {excess} tokens from a "
                             f"{'second' if second else 'first'} sequence of {len(cut)}")
        if stride >= room:
            raise ValueError(f"stride={stride} must be less than the {room} tokens each "
                             "window holds")
        return [self._row(seq_a, cut[s:e], add_special_tokens) if second
                else self._row(cut[s:e], seq_b, add_special_tokens)
                for s, e in _windows(len(cut), room, stride, side)]

    def _row(self, seq_a, seq_b, add_special_tokens):
        """[CLS] A [SEP] (B [SEP]) -> _Row (word ids, offsets: None unless both seqs have them)."""
        n_a, n_b = len(seq_a), 0 if seq_b is None else len(seq_b)
        detailed = seq_a.words is not None
        if add_special_tokens:
            input_ids = self.build_inputs_with_special_tokens(
                seq_a.ids, None if seq_b is None else seq_b.ids)
            token_type_ids = self.create_token_type_ids_from_sequences(
                seq_a.ids, None if seq_b is None else seq_b.ids)
            special = self.get_special_tokens_mask(seq_a.ids, None if seq_b is None else seq_b.ids)
            none, zero = [None], [(0, 0)]
            sequence_ids = none + [0] * n_a + none + ([] if seq_b is None else [1] * n_b + none)
            if detailed:
                word_ids = none + seq_a.words + none + ([] if seq_b is None else seq_b.words + none)
                offsets = zero + seq_a.offsets + zero + \
                    ([] if seq_b is None else seq_b.offsets + zero)
        else:
            input_ids = seq_a.ids + ([] if seq_b is None else seq_b.ids)
            token_type_ids = [0] * n_a + [1] * n_b      # as transformers' Rust tokenizer
            special = [0] * len(input_ids)
            sequence_ids = [0] * n_a + [1] * n_b
            if detailed:
                word_ids = seq_a.words + ([] if seq_b is None else seq_b.words)
                offsets = seq_a.offsets + ([] if seq_b is None else seq_b.offsets)
        if not detailed:
            word_ids = offsets = None
        return _Row(input_ids=input_ids, token_type_ids=token_type_ids,
                    attention_mask=[1] * len(input_ids), special_tokens_mask=special,
                    offset_mapping=offsets, word_ids=word_ids, sequence_ids=sequence_ids)

    def _pad_columns(self, columns, width, side):
        """Pad every row of every per-token list in `columns` to `width`, on `side`."""
        fill = {"input_ids": self.pad_token_id, "token_type_ids": self.pad_token_type_id,
                "attention_mask": 0, "special_tokens_mask": 1, "offset_mapping": (0, 0),
                "word_ids": None, "sequence_ids": None}
        for key, value in fill.items():
            rows = columns.get(key)
            if rows and rows[0] is not None:
                columns[key] = [_pad_list(row, width, value, side) for row in rows]

    def encode(self, text, text_pair=None, add_special_tokens=True, *, max_length=None,
               truncation=None, **options):
        """Text (and an optional pair) -> one list of ids (__call__'s input_ids; the other
        options by keyword, as __call__ takes them)."""
        if max_length is None and not options and text_pair is None:
            ids = self._text_ids(text)                   # the common case, kept lean
            return self.build_inputs_with_special_tokens(ids) if add_special_tokens else ids
        return self(text, text_pair, add_special_tokens=add_special_tokens,
                    max_length=max_length, truncation=truncation, **options)["input_ids"]

    def encode_plus(self, text, text_pair=None, **options):
        """transformers 4's name for __call__ on one text (or pair)."""
        if isinstance(text, (list, tuple)) and not options.get("is_split_into_words"):
            raise ValueError("encode_plus takes one text; use batch_encode_plus for a batch")
        return self(text, text_pair, **options)

    def batch_encode_plus(self, batch_text_or_text_pairs, **options):
        """transformers 4's name for __call__ on a list of texts or (A, B) pairs."""
        if not isinstance(batch_text_or_text_pairs, (list, tuple)):
            raise ValueError("batch_encode_plus takes a list of texts or (A, B) pairs")
        return self(list(batch_text_or_text_pairs), **options)

    def prepare_for_model(self, ids, pair_ids=None, *, add_special_tokens=True, padding=False,
                          truncation=None, max_length=None, pad_to_multiple_of=None,
                          padding_side=None, return_tensors=None, return_token_type_ids=None,
                          return_attention_mask=None, return_special_tokens_mask=False,
                          return_length=False):
        """Ids already tokenized (one input, or a pair) -> the model inputs, as __call__ makes
        them from text: truncated, [CLS]/[SEP] added, padded."""
        strategy, max_length, pad_to = self._strategies(padding, truncation, max_length)
        row, = self._rows(_Seq(list(ids)), None if pair_ids is None else _Seq(list(pair_ids)),
                          add_special_tokens, strategy, max_length, 0, False)
        columns = {key: [getattr(row, key)] for key in _Row.__slots__}
        if pad_to is not None:
            width = max_length if pad_to == "max_length" else len(row.input_ids)
            if pad_to_multiple_of:
                width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
            self._pad_columns(columns, width,
                              _side("padding_side", padding_side or self.padding_side))
        keys = ["input_ids"] + ["token_type_ids"] * (return_token_type_ids is not False) \
            + ["attention_mask"] * (return_attention_mask is not False) \
            + ["special_tokens_mask"] * bool(return_special_tokens_mask)
        out = {key: columns[key][0] for key in keys}
        if return_length:
            out["length"] = len(out["input_ids"])
        if return_tensors == "np":
            out = {k: _array(k, [v]) for k, v in out.items()}
        return BatchEncoding(out, None, None, self)

    def pad(self, encoded_inputs, padding=True, max_length=None, pad_to_multiple_of=None,
            padding_side=None, return_attention_mask=None, return_tensors=None):
        """Pad encodings made without padding: a dict of lists of rows, a dict of one row,
        or a list of such dicts (what a data collator holds). input_ids get [PAD],
        token_type_ids 0, special_tokens_mask 1, attention_mask 0 (made if missing); other
        keys are left as they are."""
        if isinstance(encoded_inputs, (list, tuple)):
            if not encoded_inputs:
                raise ValueError("pad: no encodings given")
            encoded_inputs = {k: [dict(e)[k] for e in encoded_inputs] for k in encoded_inputs[0]}
        if "input_ids" not in encoded_inputs:
            raise ValueError(f"pad: the encodings have no input_ids (keys: "
                             f"{sorted(encoded_inputs)})")
        data = {k: (v.tolist() if isinstance(v, numpy.ndarray) else v)
                for k, v in encoded_inputs.items()}
        batched = bool(data["input_ids"]) and isinstance(data["input_ids"][0], (list, tuple))
        if not batched:
            data = {k: [v] for k, v in data.items()}
        if return_attention_mask is not False and "attention_mask" not in data:
            data["attention_mask"] = [[1] * len(ids) for ids in data["input_ids"]]
        _, max_length, pad_to = self._strategies(padding, False, max_length)
        side = _side("padding_side", padding_side or self.padding_side)
        fill = {"input_ids": self.pad_token_id, "token_type_ids": self.pad_token_type_id,
                "attention_mask": 0, "special_tokens_mask": 1}
        if pad_to is not None:
            width = max_length if pad_to == "max_length" else max(map(len, data["input_ids"]))
            if pad_to_multiple_of:
                width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
            if return_attention_mask is False:
                del fill["attention_mask"]              # as transformers: left as it is
            for key, value in fill.items():
                if key in data:
                    data[key] = [_pad_list(list(row), width, value, side) for row in data[key]]
        if return_tensors == "np":                   # one row: [T] arrays, as transformers
            data = {k: _array(k, v) if batched else _array(k, v)[0] for k, v in data.items()}
            return BatchEncoding(data, None, None, self)
        if not batched:
            data = {k: v[0] for k, v in data.items()}
        return BatchEncoding(data, None, None, self)

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
        added, config_path = {}, None
        if os.path.isdir(path):
            vocab = os.path.join(path, VOCAB_NAME)
            json_path = os.path.join(path, TOKENIZER_JSON_NAME)
            if not os.path.exists(vocab) and os.path.exists(json_path):
                vocab, options = read_tokenizer_json(json_path)
                for key, value in options.items():
                    kwargs.setdefault(key, value)
            config_path = os.path.join(path, TOKENIZER_CONFIG_NAME)
            if os.path.isfile(config_path):
                config = read_tokenizer_config(config_path)
                for key in ("do_lower_case", "strip_accents", "tokenize_chinese_chars",
                            "never_split", "unk_token", "sep_token", "pad_token", "cls_token",
                            "mask_token", "do_basic_tokenize", "padding_side",
                            "truncation_side", "clean_up_tokenization_spaces"):
                    if isinstance(config.get(key), (bool, str, list)):
                        kwargs.setdefault(key, config[key])
                length = config.get("model_max_length")
                if isinstance(length, int) and 0 < length < VERY_LARGE_INTEGER:
                    kwargs.setdefault("model_max_length", length)
                added = config.get("added_tokens_decoder") or {}
            path = vocab
        tokenizer = cls(path, **kwargs)
        for index, entry in sorted(added.items(), key=lambda item: int(item[0])):
            content = entry.get("content")
            if content in tokenizer.all_special_tokens:
                continue
            tokenizer.add_tokens([content], special_tokens=bool(entry.get("special")))
            if tokenizer.vocab[content] != int(index):
                raise ValueError(f"{config_path}: added token {content!r} has id {index} there "
                                 f"but {tokenizer.vocab[content]} after the vocab's "
                                 f"{tokenizer.vocab_size - 1} tokens")
        return tokenizer

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
                  "cls_token": self.cls_token, "mask_token": self.mask_token,
                  "do_basic_tokenize": self.do_basic_tokenize,
                  "padding_side": self.padding_side, "truncation_side": self.truncation_side,
                  "clean_up_tokenization_spaces": self.clean_up_tokenization_spaces}
        if self.model_max_length < VERY_LARGE_INTEGER:
            config["model_max_length"] = self.model_max_length
        if self.added_tokens:
            # vocab.txt holds them at their ids; this marks them added, in transformers' form
            config["added_tokens_decoder"] = {
                str(self.vocab[t]): {"content": t, "lstrip": False, "normalized": not special,
                                     "rstrip": False, "single_word": False, "special": special}
                for t, special in self.added_tokens.items()}
            extra = [t for t, special in self.added_tokens.items() if special]
            if extra:
                config["extra_special_tokens"] = extra
        config_path = os.path.join(save_directory, TOKENIZER_CONFIG_NAME)
        with open(config_path, "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2)
            f.write("\n")
        return vocab_path, config_path


# tokenizer_config.json's options that from_pretrained reads: (key, the JSON types it may
# have, in words); null is always allowed (transformers' default). A value of another type
# ("do_lower_case": "no" would lower-case) is refused, never skipped or taken as truthy.
TOKENIZER_CONFIG_TYPES = (
    *((key, (bool,), "true or false") for key in (
        "do_lower_case", "strip_accents", "tokenize_chinese_chars", "do_basic_tokenize",
        "clean_up_tokenization_spaces")),
    ("model_max_length", (int, float), "a number"),
    ("never_split", (list,), "a list of strings"),
    *((key, (str, dict), "a string (or transformers' AddedToken object)") for key in (
        "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")),
)


def read_tokenizer_config(path):
    """tokenizer_config.json as a dict, its added_tokens_decoder checked to be what
    transformers writes ({"id": {"content": token, "special": bool, ...}}): a torn file, a
    JSON array or a wrong type is a ValueError naming the file and the key."""
    config = read_json(path, TOKENIZER_CONFIG_NAME)
    for key, allowed, kinds in TOKENIZER_CONFIG_TYPES:
        value = config.get(key)
        if value is not None and (type(value) not in allowed or (
                type(value) is list and not all(isinstance(v, str) for v in value))):
            raise ValueError(f"{path}: {key} must be {kinds}, got {value!r:.80}")
    for key in ("padding_side", "truncation_side"):
        if config.get(key) not in (None, "left", "right"):
            raise ValueError(f"{path}: {key} must be \"left\" or \"right\", got "
                             f"{config[key]!r:.80}")
    added = config.get("added_tokens_decoder") or {}
    if not isinstance(added, dict):
        raise ValueError(f"{path}: added_tokens_decoder must be an object, got "
                         f"{type(added).__name__}")
    for index, entry in added.items():
        if not (index.isdigit() and isinstance(entry, dict)
                and isinstance(entry.get("content"), str)):
            raise ValueError(f"{path}: added_tokens_decoder entry {index!r} must map a token id "
                             f"to {{\"content\": token, ...}}, got {entry!r:.80}")
    return config


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


# ----------------------------------------------------------------------------- call helpers

def _literals(strings):
    """A regex matching any of `strings` (captured), the longest first, so one that is a
    prefix of another cannot cut it short."""
    by_length = sorted(set(strings), key=lambda t: (-len(t), t))
    return re.compile("(" + "|".join(map(re.escape, by_length)) + ")")


def _side(name, side):
    if side not in ("right", "left"):
        raise ValueError(f"{name} must be 'right' or 'left', got {side!r}")
    return side


def _truncation_strategy(truncation):
    if truncation is True:
        return "longest_first"
    if truncation in (False, None, "do_not_truncate"):
        return None
    if truncation in ("longest_first", "only_first", "only_second"):
        return truncation
    raise ValueError("truncation must be True, False, 'longest_first', 'only_first' or "
                     f"'only_second', got {truncation!r}")


def _batch_items(text, text_pair, split):
    """__call__'s inputs -> (batched, [(A, B or None), ...])."""
    def is_one(t):                                  # one input: a str, or a word list if split
        return isinstance(t, str) or (split and isinstance(t, (list, tuple))
                                      and all(isinstance(w, str) for w in t))
    batched = isinstance(text, (list, tuple)) and not (split and is_one(text) and not (
        text and isinstance(text[0], (list, tuple))))
    if not batched:
        if isinstance(text_pair, (list, tuple)) and not split:
            raise ValueError("text is one str but text_pair is a list")
        return False, [(text, text_pair)]
    if text_pair is not None:
        if not isinstance(text_pair, (list, tuple)) or len(text_pair) != len(text):
            raise ValueError(f"with a batch of {len(text)} texts, text_pair must be a list of "
                             f"{len(text)} texts")
        return True, list(zip(text, text_pair))
    items = []
    for i, t in enumerate(text):
        if is_one(t):
            items.append((t, None))
        elif isinstance(t, (list, tuple)) and len(t) == 2:
            items.append(tuple(t))
        else:
            raise ValueError(f"batch item {i}: expected a str or an (A, B) pair, got "
                             f"{type(t).__name__}" + (f" of {len(t)} items"
                                                      if isinstance(t, (list, tuple)) else ""))
    return True, items


def _removals(len_a, len_b, n, strategy):
    """How many tokens truncation takes from A and from B (len_b None: no pair)."""
    if n <= 0:
        return 0, 0
    if strategy == "only_second" and len_b is None:
        raise ValueError("truncation='only_second' needs a text pair")
    if strategy == "only_first" or len_b is None:
        if n > len_a:
            raise ValueError(f"cannot remove {n} tokens from a first sequence of {len_a}")
        return n, 0
    if strategy == "only_second":
        if n > len_b:
            raise ValueError(f"cannot remove {n} tokens from a second sequence of {len_b}")
        return 0, n
    first = min(abs(len_a - len_b), n)        # from the longer, down to equal length
    rest = n - first                          # then alternately, B first
    if len_a > len_b:
        return first + rest // 2, rest - rest // 2
    return rest // 2, first + rest - rest // 2


def _cut(seq, n, side):
    """seq without n tokens at its end (side "right") or start ("left")."""
    if n <= 0:
        return seq
    return seq[:len(seq) - n] if side == "right" else seq[n:]


def _windows(n, room, stride, side):
    """The (start, end) windows of `room` tokens that overflowing truncation cuts n tokens
    into, each sharing `stride` tokens with the one before: from the start (side "right":
    the first window is what plain truncation keeps) or from the end ("left"), as
    transformers' Rust tokenizer does."""
    step, windows = room - stride, []
    if side == "right":
        for start in range(0, n, step):
            windows.append((start, min(start + room, n)))
            if start + room >= n:
                break
    else:
        for end in range(n, 0, -step):
            windows.append((max(end - room, 0), end))
            if end - room <= 0:
                break
    return windows


def _char_spans(token, words, split):
    """For each character of "".join(words) (the words `split` makes of `token`), the span
    (start, end) of the characters of `token` it comes from. ASCII maps one to one; otherwise
    split(token[:k]) for k = 1, 2, ...: the characters the k-th one adds come from it, and
    where it changes earlier ones (NFC composing "e" + U+0301 into "é") they span both."""
    joined = "".join(words)
    if token.isascii() and len(joined) == len(token):
        return [(i, i + 1) for i in range(len(token))]
    spans, previous = [], ""
    for k in range(1, len(token) + 1):
        current = "".join(split(token[:k]))
        same = 0
        for x, y in zip(previous, current):
            if x != y:
                break
            same += 1
        start = spans[same][0] if same < len(spans) else k - 1
        del spans[same:]
        spans.extend((start, k) for _ in range(len(current) - same))
        previous = current
    if previous != joined:                     # a normalisation no prefix predicts: whole token
        return [(0, len(token))] * len(joined)
    return spans


def _outputs(columns, sample, options):
    """The keys the options ask for, in transformers' order."""
    out = {"input_ids": columns["input_ids"]}
    if options["return_token_type_ids"] is not False:
        out["token_type_ids"] = columns["token_type_ids"]
    if options["return_attention_mask"] is not False:
        out["attention_mask"] = columns["attention_mask"]
    if options["return_special_tokens_mask"]:
        out["special_tokens_mask"] = columns["special_tokens_mask"]
    if options["return_offsets_mapping"]:
        out["offset_mapping"] = columns["offset_mapping"]
    if options["return_length"]:
        out["length"] = list(map(len, columns["input_ids"]))
    if options["return_overflowing_tokens"]:
        out["overflow_to_sample_mapping"] = sample
    return out


def _pad_list(values, width, fill, side):
    """values (a list of ours: extended in place on the right) padded to width."""
    n = width - len(values)
    if n <= 0:
        return values
    if side == "left":
        return [fill] * n + values
    values += [fill] * n
    return values


def _array(key, rows):
    """A key's rows -> int64 array [B, T] ([B, T, 2] for offsets, [B] for per-row values)."""
    if key in ("length", "overflow_to_sample_mapping"):
        return numpy.array(rows, dtype=numpy.int64)
    lengths = set(map(len, rows))
    if len(lengths) > 1:
        raise ValueError(f"return_tensors='np' needs sequences of one length, got lengths "
                         f"{min(lengths)}..{max(lengths)}; pass padding='longest' or "
                         "'max_length'")
    width = lengths.pop() if lengths else 0
    shape = (len(rows), width, 2) if key == "offset_mapping" else (len(rows), width)
    return numpy.array(rows, dtype=numpy.int64).reshape(shape)
