"""Learning a WordPiece vocab from text (train.py does it when no --vocab is given): words
counted with the BasicTokenizer that tokenizing uses, then pairs of pieces merged by score."""
import collections
import heapq
import itertools
import math
import re

from .wordpiece import SPECIAL_TOKENS, BasicTokenizer

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
