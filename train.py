"""Pretrain a BERT from raw text with masked LM + next sentence prediction.

    python train.py                # the shipped Brown corpus, a tiny BERT, ~10 minutes on CPU
    python train.py --preset mini --minutes 60 --out runs/mini
    python train.py --data my_corpus/ --vocab my_vocab.txt --steps 100000 --device gpu
    python train.py --out runs/pretrain --resume          # continue exactly where it stopped
    mpiexec -n 2 python train.py --steps 20   # data parallel: each rank a slice of each batch

Reads like a recipe: arguments, vocab, data, model, optimizer, loop (log, evaluate,
checkpoint), final evaluation and a fill-mask example. Input text: one sentence per line,
a blank line between documents (.txt or .txt.gz files, or folders of them).
Writes to --out: checkpoint/ (config.json, model.safetensors, vocab.txt - loadable by
transformers.BertForPreTraining - plus optimizer.safetensors and trainer_state.json),
metrics.jsonl, loss_curve.png (needs matplotlib) and eval.json.

Under mpiexec every rank builds the same global batch and takes its slice; gradients are
summed by MPI allreduce (NCCL on GPUs), so the run is the same for any number of ranks (but
for summation order and dropout masks, which are drawn per rank). Rank 0 alone prepares the
data, prints, and writes checkpoints and metrics.
"""
import argparse
import dataclasses
import errno
import functools
import hashlib
import json
import math
import os
import signal
import sys
import time
import types

import numpy

from nanobert import (AdamW, BertConfig, BertForPreTraining, average_gradients,
                      clip_by_global_norm, flags, learning_rate)
from nanobert.distributed import allreduce_grads, end_job, process_group, rank_slice
from nanobert.backend import (default_rng, matmul_precision, resolve_device, reuse_freed_memory,
                              set_tf32, to_host)
from nanobert.data.pretraining_data import PretrainingDataset, create_pretraining_data, sha256_file
from nanobert.data.pretraining_instances import read_documents
from nanobert.data.tokenizer import BertTokenizer, load_vocab, save_vocab, train_wordpiece_vocab
from nanobert.formats.checkpoint import (NonFiniteError, first_non_finite,
                                         load_training_checkpoint, save_training_checkpoint)
from nanobert.formats.fileio import (atomic_open, output_folder, read_json, recover_folder,
                                     recover_folders_in)
from nanobert.model.flat import flat_buffer
from nanobert.model.flops import gpu_peak_tflops, step_flops
from nanobert.model.ops import IGNORE_INDEX, cross_entropy_forward, softmax_forward
from nanobert.model.optim import LossScaler, warmup_steps

HERE = os.path.dirname(os.path.abspath(__file__))
BROWN = os.path.join(HERE, "data", "brown")
# (layers, hidden, heads, dropout, default peak lr): the BERT sizes of the paper and of Turc et
# al. (2019) with BERT's dropout, and "nano", the ten-minute CPU default (12,000-16,000 steps
# there).
# nano trains without dropout: its masked LM leaves the plateau sooner (held-out MLM accuracy
# 16.9% against 14.7% with dropout after 3,000 steps at T=40) and its held-out loss keeps
# falling (the train loss drops below it: ten minutes see each instance ~4 times); without
# dropout 1.5e-3 beats 1e-3. BERT-Tiny with dropout stalls at 1e-3: the others take 5e-4.
PRESETS = {
    "nano": (2, 64, 2, 0.0, 1.5e-3), "tiny": (2, 128, 2, 0.1, 5e-4),
    "mini": (4, 256, 4, 0.1, 5e-4), "small": (4, 512, 8, 0.1, 5e-4),
    "medium": (8, 512, 8, 0.1, 5e-4), "base": (12, 768, 12, 0.1, 5e-4),
    "large": (24, 1024, 16, 0.1, 5e-4),
}
# Per-window sums: losses weighted by their counts, so that means are per token / sequence.
SUM_KEYS = ("mlm_loss", "nsp_loss", "mlm_correct", "nsp_correct", "masked", "sequences",
            "random_next")
STEP_KEYS = SUM_KEYS + ("tokens",)      # one vector per step: on the GPU it stays there


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("data")
    g.add_argument("--data", nargs="+", default=[os.path.join(BROWN, "train.txt.gz")],
                   help="training text: files and/or folders (default: the shipped Brown corpus)")
    g.add_argument("--heldout", nargs="*", default=[os.path.join(BROWN, "heldout.txt.gz")],
                   help="held-out text for evaluation (default: Brown's held-out documents; "
                        "none to skip)")
    g.add_argument("--heldout-dupe-factor", type=flags.positive_int, default=1,
                   help="passes over the held-out text (more pairs/masks for a tighter estimate)")
    g.add_argument("--vocab", help="vocab.txt to use (default: <first data folder>/"
                                   "vocab-<size>.txt, trained from --data if missing)")
    g.add_argument("--vocab-size", type=flags.positive_int, default=8192,
                   help="size of a vocab trained here (default 8192)")
    g.add_argument("--cased", action="store_true",
                   help="keep case and accents (default: uncased)")
    g.add_argument("--dupe-factor", type=flags.positive_int, default=5,
                   help="passes over the corpus with new masks/pairs (default 5)")
    g.add_argument("--max-predictions-per-seq", type=flags.positive_int, default=20)
    g.add_argument("--whole-word-mask", action="store_true")
    g.add_argument("--no-nsp", action="store_true",
                   help="train with the masked LM alone (the paper's 'No NSP' ablation, Table 5): "
                        "same instances, the NSP loss left out; held-out NSP is still reported")
    g.add_argument("--dynamic-masking", action="store_true",
                   help="draw new masks every time an instance is used")
    g.add_argument("--utf8-errors", choices=("strict", "replace"), default="strict",
                   help="non-UTF-8 bytes: stop naming file and offset (strict), or replace "
                        "and count")
    g = p.add_argument_group("model")
    g.add_argument("--preset", choices=PRESETS, default="nano",
                   help="model size (default nano: L=2, H=64, A=2; tiny is BERT-Tiny, L=2, "
                        "H=128)")
    g.add_argument("--config",
                   help="a config.json instead of --preset (vocab_size is set from the vocab)")
    g.add_argument("--max-seq-length", type=flags.in_range(int, 5), default=40,
                   help="phase-1 sequence length (default 40: in the ten-minute default the "
                        "masked LM learns to use the words around a [MASK] at 40, not at 48 or "
                        "64, and NSP still learns, not at 32; the paper's is 128)")
    g.add_argument("--phase2-max-seq-length", type=flags.non_negative_int, default=0,
                   help="if set (BERT: 512), the last --phase2-fraction of the steps use this "
                        "length")
    g.add_argument("--phase2-fraction", default=0.1,
                   type=flags.in_range(float, 0.0, 1.0, low_open=True, high_open=True))
    g = p.add_argument_group("optimisation")
    g.add_argument("--batch-size", type=flags.positive_int, default=52,
                   help="sequences per optimizer step (default 52: ~2,000 tokens at the "
                        "default length; the paper's 256 x 128 is 16 times that)")
    g.add_argument("--grad-accum", type=flags.positive_int, default=1,
                   help="split each batch into this many micro-batches")
    g.add_argument("--lr", type=flags.learning_rate,
                   help="peak learning rate (default: the preset's, 1.5e-3 for nano and 5e-4 "
                        "for the others - BERT-Tiny's learning stalls at 1e-3; 5e-4 with "
                        "--config)")
    g.add_argument("--warmup", type=flags.non_negative_float, default=0.05,
                   help="warmup: a fraction of the steps (<1) or a count")
    g.add_argument("--steps", type=flags.positive_int,
                   help="optimizer steps (default: as many as --minutes allows, estimated from "
                        "the first steps)")
    g.add_argument("--minutes", type=flags.in_range(float, 0.0, low_open=True),
                   help="time budget for training: stop there (a checkpoint; --resume goes on) "
                        "even if --steps are left (default: 10 without --steps, none with it "
                        "or with --resume)")
    g.add_argument("--optimizer", choices=("bert", "torch"), default="bert",
                   help="AdamW flavour: the original AdamWeightDecay (default) or "
                        "torch.optim.AdamW's")
    g.add_argument("--weight-decay", type=flags.non_negative_float, default=0.01)
    g = p.add_argument_group("run")
    g.add_argument("--out", default=os.path.join("runs", "pretrain"),
                   help="output folder (default runs/pretrain)")
    g.add_argument("--resume", action="store_true",
                   help="continue from <out>/checkpoint exactly (a flag that would change the "
                        "steps, e.g. --lr or --grad-accum, must keep its value)")
    g.add_argument("--seed", type=flags.non_negative_int, default=0)
    g.add_argument("--device", choices=("cpu", "gpu"), help="default: $NANOBERT_DEVICE or cpu")
    g.add_argument("--dtype", choices=("float32", "float64", "float16"), default="float32",
                   help="float16: mixed precision (float32 master weights and statistics, "
                        "float16 matmuls, dynamic loss scaling)")
    g.add_argument("--no-tf32", action="store_true",
                   help="GPU: keep float32 matmuls in full float32 (default: TF32)")
    g.add_argument("--log-every", type=flags.positive_int, default=20)
    g.add_argument("--eval-every", type=flags.non_negative_int, default=500,
                   help="held-out evaluation interval in steps (0: only at the end)")
    g.add_argument("--eval-batches", type=flags.positive_int, default=50,
                   help="held-out batches per evaluation (default 50)")
    g.add_argument("--checkpoint-every", type=flags.positive_int, default=500)
    g.add_argument("--check-sync-every", type=flags.non_negative_int, default=100,
                   help="under mpiexec: every N steps compare a hash of every rank's weights "
                        "and stop if they differ (0: never; default 100)")
    g.add_argument("--stop-at-step", type=flags.positive_int,
                   help="checkpoint and stop at this step (the schedule still spans --steps; "
                        "continue with --resume)")
    args = p.parse_args(argv)
    if args.lr is None:
        args.lr = 5e-4 if args.config else PRESETS[args.preset][4]
    if args.minutes is None and args.steps is None and not args.resume:
        args.minutes = 10.0                     # the no-argument run: a ten-minute budget
    return args

# ----------------------------------------------------------------------------- vocab and data


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


def batch_rows(dataset_size, batch_size, seed, position):
    """Rows of the batch at `position` of an endless stream of epochs, each a permutation
    drawn from (seed, epoch): any batch can be found again from its position (exact resume)."""
    epoch, start = divmod(position * batch_size, dataset_size)
    rows = []
    while len(rows) < batch_size:
        order = numpy.random.default_rng([seed, epoch]).permutation(dataset_size)
        rows.extend(order[start:start + batch_size - len(rows)])
        epoch, start = epoch + 1, 0
    return numpy.array(rows)


def trim(batch):
    """Drop the columns that are padding in every row: same loss (padded keys get exactly zero
    attention weight), less work."""
    T = int(batch["attention_mask"].sum(1).max())
    return {k: (v[:, :T] if v.ndim == 2 else v) for k, v in batch.items()}

# ------------------------------------------------------------------- model and optimizer


def model_config(args, vocab_size):
    if args.config:
        config = BertConfig.from_json_file(args.config)
        config.vocab_size = vocab_size
    else:
        layers, hidden, heads, dropout, _ = PRESETS[args.preset]
        config = BertConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                            num_attention_heads=heads, intermediate_size=4 * hidden,
                            hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    longest = max(args.max_seq_length, args.phase2_max_seq_length)
    if longest > config.max_position_embeddings:
        raise SystemExit(f"error: max_seq_length {longest} exceeds the model's "
                         f"max_position_embeddings {config.max_position_embeddings}")
    return BertConfig.from_dict(config.to_dict())   # re-validated


def new_model(args, vocab_size, metrics_path):
    """A freshly initialised model and optimizer -> (config, model, optimizer, state)."""
    config = model_config(args, vocab_size)
    model = BertForPreTraining(config, seed=args.seed, dtype=numpy.dtype(args.dtype),
                               device=args.device)
    optimizer = AdamW(model.params, lr=args.lr, mode=args.optimizer,
                      weight_decay=args.weight_decay)
    if metrics_path and os.path.exists(metrics_path):      # None: not rank 0
        os.remove(metrics_path)
    return config, model, optimizer, {"step": 0, "train_seconds": 0.0, "tokens": 0}


def resumed_model(args, checkpoint_dir, vocab_file, metrics_path):
    """Model, optimizer and state from <out>/checkpoint, refused if the run's options differ
    -> (config, model, optimizer, state). Sets args.steps to the checkpoint's schedule."""
    config, params, optimizer_state, state = load_training_checkpoint(BertForPreTraining,
                                                                      checkpoint_dir)
    refuse_another_vocab(state, checkpoint_dir, vocab_file)
    args.steps = state["total_steps"]
    model = BertForPreTraining(config, dtype=numpy.dtype(args.dtype), device=args.device,
                               params=params)
    optimizer = AdamW(model.params, lr=args.lr, mode=args.optimizer,
                      weight_decay=args.weight_decay)
    optimizer.load_state_dict(optimizer_state)
    print(f"resumed {checkpoint_dir} at step {state['step']} of {args.steps}")
    if metrics_path and os.path.exists(metrics_path):   # forget what was logged after it
        keep_metrics_until(metrics_path, state["step"])
    return config, model, optimizer, state


def check_resume(args, checkpoint_dir):
    """Before any data is built: finish a save that a crash cut short, read trainer_state.json
    (a ValueError naming it if it is not what a save writes) and refuse flags and a model that
    differ from the checkpoint's."""
    recover_folder(checkpoint_dir)
    path = os.path.join(checkpoint_dir, "trainer_state.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"no resumable checkpoint at {checkpoint_dir} (missing "
                                "trainer_state.json)")
    state = read_json(path, "trainer_state.json")
    missing = [k for k in ("step", "total_steps", "vocab_sha256", "args") if k not in state]
    if missing or not isinstance(state["args"], dict):
        raise ValueError(f"{path}: not a trainer state written by train.py (missing or bad: "
                         f"{', '.join(missing) or 'args'})")
    if args.vocab and os.path.isfile(args.vocab):     # else checked once the vocab is made
        refuse_another_vocab(state, checkpoint_dir, args.vocab)
    refuse_changed_flags(args, state)
    refuse_changed_model(args, BertConfig.from_json_file(os.path.join(checkpoint_dir,
                                                                      "config.json")))


def refuse_another_vocab(state, checkpoint_dir, vocab_file):
    if state["vocab_sha256"] != sha256_file(vocab_file):
        raise SystemExit(f"error: {checkpoint_dir} was trained with another vocab than "
                         f"{vocab_file}")


# Flags whose change breaks exact continuation: they change the data (corpus, casing, pairs,
# masks, sequence lengths), which batch each step reads (seed, batch size, micro-batches), the
# learning-rate schedule (lr, warmup, steps) or the update itself (the loss with or without
# NSP, weight decay, optimizer, dtype). The rest may change on resume: logging, evaluation,
# checkpoint interval, time budget, --stop-at-step, the held-out set, --utf8-errors (a corpus
# that read strictly reads the same with replace; one that needed replace fails strictly) and
# --device.
RESUME_FIXED = ("data", "seed", "cased", "dupe_factor", "max_predictions_per_seq",
                "whole_word_mask", "no_nsp", "dynamic_masking", "max_seq_length",
                "phase2_max_seq_length", "phase2_fraction", "batch_size", "grad_accum", "lr",
                "warmup", "steps", "weight_decay", "optimizer", "dtype")


def refuse_changed_flags(args, state):
    """SystemExit naming the first flag of RESUME_FIXED whose value differs from the
    checkpoint's (a flag the checkpoint did not record is not compared)."""
    saved = state["args"]
    for key in RESUME_FIXED:
        if key not in saved:
            continue
        new, old = vars(args)[key], saved[key]
        if key == "data":
            new, old = ([os.path.abspath(p) for p in paths] for paths in (new, old))
        elif key == "steps":
            old = state["total_steps"]            # the schedule, also when --minutes set it
            if new is None:
                continue
        elif key == "phase2_fraction" and not (args.phase2_max_seq_length
                                               or saved.get("phase2_max_seq_length")):
            continue                              # unused without a phase 2
        if new != old:
            flag = "--" + key.replace("_", "-")
            if isinstance(new, bool):             # a switch: "--x" against "no --x"
                new, old = (flag if v else f"no {flag}" for v in (new, old))
            else:
                new, old = (" ".join(map(str, v)) if isinstance(v, list) else v
                            for v in (new, old))
                new = f"{flag} {new}"
            raise SystemExit(f"error: resuming with {new}, but the checkpoint used {old}; "
                             "exact continuation needs the same value (or start a new run "
                             "without --resume)")


def refuse_changed_model(args, config):
    """SystemExit if --preset / --config describe another model than the checkpoint's (the
    checkpoint's would be used, silently)."""
    wanted = model_config(args, config.vocab_size)
    for field in dataclasses.fields(config):     # the model's settings, not config.json's extras
        k = field.name
        if k != "extra" and getattr(wanted, k) != getattr(config, k):
            flag = f"--config {args.config}" if args.config else f"--preset {args.preset}"
            raise SystemExit(f"error: resuming with {flag} ({k} {getattr(wanted, k)}), but the "
                             f"checkpoint's model has {k} {getattr(config, k)}")


def keep_metrics_until(metrics_path, step):
    """Rewrite metrics.jsonl with the records up to `step` (those logged after the checkpoint
    will be logged again). A crash mid-write leaves a torn last line: it is dropped, and said
    so; a bad line before the last is an error naming the file and the line."""
    with open(metrics_path, "rb") as f:
        lines = f.read().split(b"\n")
    if lines[-1] == b"":
        lines.pop()                               # the newline that ends the last line
    records = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            step_of = record["step"]
        except (ValueError, TypeError, KeyError) as e:
            if number < len(lines):
                raise ValueError(f"{metrics_path}: line {number} is not a metrics record "
                                 f"({type(e).__name__}: {e})") from None
            print(f"dropped the torn last line of {metrics_path} (line {number}, {len(line)} "
                  "bytes): a crash cut its write short")
            break
        if step_of <= step:
            records.append(line.decode("utf-8") + "\n")
    with atomic_open(metrics_path, "w", encoding="utf-8") as f:
        f.writelines(records)


def steps_for_budget(model, data, micro_batch, grad_accum, minutes):
    """Time forward+backward passes (the fastest of three after a warm-up; parameters are
    untouched) and return how many optimizer steps fit in the budget, leaving ~10% for the
    optimizer, logging and evaluation. Longer phase-2 sequences are not accounted for."""
    batch = trim(data.batch(numpy.arange(min(micro_batch, len(data)))))
    model.loss_and_grads(batch)
    times = []
    for _ in range(3):
        start = time.time()
        model.loss_and_grads(batch)
        times.append(time.time() - start)
    per_step = min(times) * grad_accum * 1.1
    steps = max(1, int(60 * minutes / per_step))
    print(f"~{per_step:.2f} s per step: {steps} steps fit in {minutes:g} minutes")
    return steps

# ---------------------------------------------------------------------------- evaluation


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


def means(sums):
    """MLM loss/accuracy per masked token and NSP loss/accuracy per sequence."""
    masked, sequences = max(sums["masked"], 1), max(sums["sequences"], 1)
    return {"mlm_loss": sums["mlm_loss"] / masked, "mlm_accuracy": sums["mlm_correct"] / masked,
            "nsp_loss": sums["nsp_loss"] / sequences,
            "nsp_accuracy": sums["nsp_correct"] / sequences}


# What the input holds at a predicted position: BERT replaces a chosen token by [MASK] 80% of
# the time, by a random token 10%, and keeps it 10% (a random draw of the token itself counts
# as kept: the model cannot tell them apart).
MASKED_INPUTS = {"mask": "[MASK]", "random": "random token", "kept": "kept token"}   # kind: name


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
    was_training = model.training
    model.eval()
    sums = dict.fromkeys(SUM_KEYS, 0)
    by_input = {kind: [0, 0] for kind in MASKED_INPUTS}       # kind -> [correct, count]
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
    model.train(was_training)
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
                # [1, T, V] -> the [MASK] position's logits, [V] (+1: [CLS] comes first)
                logits = to_host(model(numpy.array([ids])).prediction_logits[0, target + 1])
                top = numpy.argsort(-logits)[:5]
                probs, _ = softmax_forward(logits)
                guesses = ", ".join(f"{tok} ({p:.2f})" for tok, p in zip(
                    tokenizer.convert_ids_to_tokens(top.tolist()), probs[top]))
                return {"sentence": " ".join(masked), "answer": tokens[target], "top5": guesses}
    return None

# ------------------------------------------------------------------------------- logging


def append_metrics(metrics_path, record):
    with open(metrics_path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def log_train(args, model, metrics_path, window, step, lr, elapsed, peak):
    """Print and append the means of the steps since the last log line (the whole job's
    throughput, and per rank under mpiexec). The window's sums are read here, once per log
    line (on the GPU the only read of the loop), and a non-finite loss stops the run."""
    sums = host_sums(window["sums"])
    stop_if_not_finite(args, model, None, sums, step)
    record = {"kind": "train", "step": step, "lr": lr, **means(sums),
              "tokens_per_second": sums["tokens"] / window["seconds"], "elapsed": elapsed}
    if args.no_nsp:                       # nothing was predicted: no zeros that look measured
        del record["nsp_loss"], record["nsp_accuracy"]
    line = (f"step {step:>6}/{args.steps}  "
            f"mlm {record['mlm_loss']:.3f} acc {record['mlm_accuracy']:.3f}  "
            + ("" if args.no_nsp else
               f"nsp {record['nsp_loss']:.3f} acc {record['nsp_accuracy']:.3f}  ")
            + f"lr {lr:.2e}  {record['tokens_per_second']:,.0f} tok/s")
    ranks = window.get("ranks", 1)
    if ranks > 1:
        record["ranks"] = ranks
        record["tokens_per_second_per_rank"] = record["tokens_per_second"] / ranks
        line += f" ({record['tokens_per_second_per_rank']:,.0f} per rank)"
    if peak:
        record["mfu"] = window["flops"] / window["seconds"] / (peak * 1e12)
        line += f"  MFU {100 * record['mfu']:.1f}%"
    if metrics_path:
        print(line, flush=True)
        append_metrics(metrics_path, record)


def log_evaluation(metrics_path, model, heldout, step, batch_size, max_batches, mask_id):
    result = evaluate(model, heldout, batch_size, max_batches, mask_id)
    print(f"  held-out: mlm {result['mlm_loss']:.3f} acc {result['mlm_accuracy']:.3f}  "
          f"nsp {result['nsp_loss']:.3f} acc {result['nsp_accuracy']:.3f}")
    append_metrics(metrics_path, {"kind": "eval", "step": step, **result})


def plot(metrics_path, png_path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no loss_curve.png (pip install matplotlib)")
        return
    with open(metrics_path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    train = [r for r in rows if r["kind"] == "train"]
    held = [r for r in rows if r["kind"] == "eval"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key in zip(axes, ("mlm_loss", "nsp_loss")):
        logged = [r for r in train if key in r]        # --no-nsp logs no train NSP loss
        ax.plot([r["step"] for r in logged], [r[key] for r in logged], label="train", lw=1)
        if held:
            ax.plot([r["step"] for r in held], [r[key] for r in held], "o-", label="held-out")
        ax.set_xlabel("step")
        ax.set_title(key.replace("_", " ").upper().replace("LOSS", "loss"))
        ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    print(f"wrote {png_path}")


def gpu_name():
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    except Exception:
        return ""


def peak_tflops(args):
    """The peak of the GPU in use at the precision its matmuls run in (TF32, float16, ...),
    for MFU; None on the CPU or on an unknown GPU."""
    if args.device != "gpu":
        return None
    return gpu_peak_tflops(gpu_name(), matmul_precision(args.dtype, args.device))

# ------------------------------------------------------------------------------ training


class StopFlag:
    """Ctrl-C / SIGTERM ask the loop to save a checkpoint and stop after the current step."""

    def __init__(self):
        self.stop = False
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self.handle)

    def handle(self, signum, frame):
        if self.stop:                  # a second Ctrl-C: stop now (the checkpoint swap is atomic)
            raise KeyboardInterrupt
        print(f"\n{signal.Signals(signum).name}: saving a checkpoint after this step, "
              "then stopping", flush=True)
        self.stop = True


def train_step(args, group, model, optimizer, scaler, data, phase, step):
    """One optimizer step on the global batch at `step` of the phase's stream: this rank's
    slice in --grad-accum micro-batches, each loss divided by the global batch's counts so
    that the sum over micro-batches and ranks (allreduce) is exactly the global batch's;
    then global-norm clipping and AdamW at the scheduled learning rate (in float16, through
    the loss scaler: an overflow skips the step). On the GPU nothing is read back here: the
    step's sums stay on the device until the next log line.
    -> (lr, this rank's micro-batches, the step's sums over every rank as one vector, the
    global batch's tokens)."""
    rows = batch_rows(len(data), args.batch_size, args.seed + phase, step)
    # Masks from (seed, step), dropout from (seed, step, rank), not from running streams:
    # exact resume, with any number of ranks. (On the GPU the run keeps one Generator.)
    mask_rng = numpy.random.default_rng([args.seed, step, 1])
    if model.xp is numpy:
        seed = numpy.random.SeedSequence([args.seed, step, group.rank]).generate_state(1)[0]
        model.rng = default_rng(numpy, int(seed))
    whole = data.batch(rows, mask_rng, args.dynamic_masking)      # the same on every rank
    denominators = {"masked_lm": int((whole["labels"] != IGNORE_INDEX).sum()),
                    "next_sentence": int((whole["next_sentence_label"] != IGNORE_INDEX).sum())}
    mine = rank_slice(numpy.arange(args.batch_size), group)
    micro = len(mine) // args.grad_accum
    batches = [trim({k: v[mine[m * micro:(m + 1) * micro]] for k, v in whole.items()})
               for m in range(args.grad_accum)]
    # --no-nsp: the model sees no NSP labels, so its loss is the MLM alone (the sums below
    # still count the random-next pairs)
    inputs = [{k: v for k, v in b.items() if k != "next_sentence_label"} for b in batches] \
        if args.no_nsp else batches
    loss_and_grads = functools.partial(
        model.loss_and_grads, return_outputs=True, denominators=denominators,
        on_device=model.xp is not numpy, loss_scale=scaler.scale if scaler else None)
    _, grads, outputs = average_gradients(loss_and_grads, inputs, weights=[1.0] * len(inputs))
    allreduce_grads(group, grads)
    if scaler:
        scaler.unscale(grads)
    sums = step_sums(group, model.xp, batches, outputs, denominators)
    norm = clip_by_global_norm(grads, 1.0, mode=args.optimizer)
    skip = scaler.update(norm) if scaler else None
    if model.xp is numpy:                 # on the GPU these wait for the log line
        stop_if_not_finite(args, model, whole if group.is_main else None, host_sums(sums),
                           step + 1)
        if not scaler and not math.isfinite(norm):
            raise SystemExit(f"error: the gradient norm is {norm} at step {step + 1} (first "
                             f"non-finite gradient: {first_non_finite(grads)}); nothing was "
                             "saved at this step. Lower --lr or use --dtype float64 to "
                             "investigate.")
    lr = learning_rate(step, args.lr, warmup_steps(args.warmup, args.steps), args.steps)
    if scaler:
        optimizer.step(grads, lr=lr, skip=skip)       # skipped when the gradients overflowed
    else:
        optimizer.step(grads, lr=lr)
    return lr, batches, sums, int(whole["attention_mask"].sum())


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


def host_sums(vector):
    """The step (or window) sums vector, read to the host, by name."""
    return dict(zip(STEP_KEYS, to_host(vector).tolist()))


def stop_if_not_finite(args, model, whole, total, step):
    """A non-finite loss (from the host sums `total`) stops the run naming the step (and the
    first non-finite weight), before anything is saved; the batch is kept for a look."""
    loss = total["mlm_loss"] / max(total["masked"], 1) + total["nsp_loss"] / max(
        total["sequences"], 1)
    if math.isfinite(loss):
        return
    save_debug = os.path.join(args.out, "nonfinite_batch.npz")
    if whole is not None:
        numpy.savez(save_debug, **whole)
    bad = first_non_finite(model.params)
    raise SystemExit(f"error: loss is {loss} at step {step}"
                     + (f" (first non-finite weight: {bad})" if bad else "")
                     + (f"; the batch is in {save_debug}" if whole is not None else "")
                     + "; nothing was saved at this step. Lower --lr or use --dtype float64 "
                       "to investigate.")


def add_step(window, config, batches, sums, seconds):
    """Add one step's sums (a vector over every rank), this rank's model FLOPs and the time
    to the logging window."""
    window["sums"] = sums if window["steps"] == 0 else window["sums"] + sums
    for batch in batches:
        masked = int((batch["labels"] != IGNORE_INDEX).sum())
        window["flops"] += step_flops(config, *batch["input_ids"].shape, masked)
    window["seconds"] += seconds
    window["steps"] += 1


def new_window():
    return {"sums": None, "flops": 0, "seconds": 0.0, "steps": 0}


def replan_steps(args, step, budget_end):
    """Fit the step count to the speed measured over the first `step` steps of a fresh run:
    the probe before training may have met a busy machine, and it times steps alone, while
    the budget also pays for held-out evaluations and checkpoints. Wall time per step counts
    them, so the schedule ends (lr at 0) within the budget. -> the new step count."""
    now = time.time()
    per_step = (now - (budget_end - 60 * args.minutes)) / step    # the budget began the loop
    steps = max(step + 1, step + int((budget_end - now) / per_step * 0.95))
    print(f"re-planned from the measured speed: {steps} steps in all")
    return steps


def train(args, group, config, model, optimizer, scaler, state, data, stop, save,
          metrics_path):
    """The loop, from state["step"] until args.steps, the time budget, --stop-at-step or
    Ctrl-C: steps, log lines, held-out evaluations and checkpoints. -> the last step.
    Under mpiexec every decision (when to stop, how many steps fit) is taken together, and
    rank 0 alone logs, evaluates and writes (metrics_path is None on the others)."""
    micro = args.batch_size // group.world_size // args.grad_accum
    peak = peak_tflops(args)
    window = new_window()
    step = state["step"]
    replan = args.steps is None and not args.resume
    if args.steps is None:       # the schedule needs a step count: fit it to the time budget
        args.steps = group.broadcast_object(
            steps_for_budget(model, data.train_sets[0], micro, args.grad_accum, args.minutes))
    budget_end = time.time() + 60 * args.minutes if args.minutes else math.inf
    while step < args.steps:
        stopping, over_budget = group.sum([stop.stop, time.time() > budget_end])
        stop.stop = stopping > 0                 # Ctrl-C on any rank stops every rank
        if over_budget:
            print(f"the time budget (--minutes {args.minutes:g}) ends the run at step {step} of "
                  f"{args.steps}; --resume continues it")
        if stop.stop or over_budget or step == args.stop_at_step:
            break
        phase = 0 if len(data.phases) == 1 or step < data.phases[0][1] * args.steps else 1
        start = time.time()
        lr, batches, sums, tokens = train_step(args, group, model, optimizer, scaler,
                                               data.train_sets[phase], phase, step)
        step += 1
        seconds = time.time() - start
        add_step(window, config, batches, sums, seconds)
        window["ranks"] = group.world_size
        state["tokens"] += tokens
        state["train_seconds"] += seconds
        if replan and group.broadcast_object(state["train_seconds"] > min(60.0,
                                                                          6 * args.minutes)):
            replan = False                       # once, after a minute of real steps
            args.steps = group.broadcast_object(replan_steps(args, step, budget_end))
        if group.world_size > 1 and args.check_sync_every and step % args.check_sync_every == 0:
            group.digest(flat_buffer(model.params))      # identical weights, or a loud stop
        if step % args.log_every == 0 or step == args.steps or stop.stop:
            log_train(args, model, metrics_path, window, step, lr, state["train_seconds"], peak)
            window = new_window()
        if metrics_path and data.heldout and args.eval_every and step % args.eval_every == 0 \
                and step != args.steps:
            log_evaluation(metrics_path, model, data.heldout, step, micro, args.eval_batches,
                           data.mask_id)
        if step % args.checkpoint_every == 0:
            save(step)
    return step


def save_checkpoint(args, checkpoint_dir, model, optimizer, state, vocab_file, step, write=True):
    """Swap in a checkpoint of `step`, or stop with one line naming the step: weights or Adam
    moments that are not finite (the previous checkpoint stays: a diverged run never replaces
    a good one), or a full disk. write=False (ranks other than 0): the check alone."""
    bad = first_non_finite(model.params)
    try:
        if bad is not None:
            raise NonFiniteError(f"first non-finite weight: {bad}")
        if not write:
            return
        state.update(step=step, total_steps=args.steps, vocab_sha256=sha256_file(vocab_file),
                     args=vars(args))
        save_training_checkpoint(checkpoint_dir, model, optimizer, state, vocab_file)
    except NonFiniteError as e:
        raise SystemExit(f"error: the training state is not finite after step {step} ({e}); "
                         f"nothing was saved, {kept_checkpoint(checkpoint_dir)}. Lower --lr or "
                         "use --dtype float64 to investigate.") from None
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise SystemExit(f"error: step {step} was not saved: {e.strerror or e}; "
                         f"{kept_checkpoint(checkpoint_dir)}") from None


def kept_checkpoint(checkpoint_dir):
    """What the checkpoint folder holds, for the error that says a save did not happen."""
    try:
        step = read_json(os.path.join(checkpoint_dir, "trainer_state.json"))["step"]
    except (OSError, ValueError, KeyError):
        return f"and there is no earlier checkpoint in {checkpoint_dir}"
    return f"{checkpoint_dir} still holds step {step}"


def final_evaluation(args, config, model, tokenizer, data, metrics_path, summary):
    """Held-out MLM/NSP against the unigram baseline and the majority class, and a fill-mask
    example: printed, logged and added to `summary`."""
    micro = args.batch_size // args.grad_accum
    result = evaluate(model, data.heldout, micro, args.eval_batches, data.mask_id)
    baseline, baseline_accuracy, commonest = unigram_baseline(
        data.train_sets[0], data.heldout, config.vocab_size, args.eval_batches, micro)
    append_metrics(metrics_path, {"kind": "eval", "step": summary["step"], **result})
    # how far NSP is above always guessing the majority class, in standard errors of a
    # coin-flip accuracy on this many pairs
    margin = (result["nsp_accuracy"] - result["nsp_majority_accuracy"]) / math.sqrt(
        0.25 / result["sequences"])
    print(f"held-out ({result['sequences']} sequences, {result['masked_tokens']} masked tokens):\n"
          f"  MLM loss {result['mlm_loss']:.3f} (unigram baseline {baseline:.3f}), "
          f"MLM accuracy {result['mlm_accuracy']:.3f} (always "
          f"\"{tokenizer.convert_ids_to_tokens([commonest])[0]}\": {baseline_accuracy:.3f});"
          " by input: " + ", ".join(f"{MASKED_INPUTS[k]} {a:.3f}" for k, a in
                                    result["mlm_accuracy_by_input"].items()) + "\n"
          f"  NSP accuracy {result['nsp_accuracy']:.3f} (majority class "
          f"{result['nsp_majority_accuracy']:.3f}: {margin:+.1f} standard errors)")
    example = fill_mask_example(model, tokenizer, args.heldout, args.utf8_errors)
    if example:
        print(f"fill-mask: {example['sentence']}\n"
              f"  answer: {example['answer']}   model: {example['top5']}")
    summary.update(heldout=result, unigram_baseline=baseline,
                   unigram_accuracy=baseline_accuracy, nsp_standard_errors=margin,
                   fill_mask=example)


def prepare(args, checkpoint_dir):
    """The resume checks, the vocab, the tokenizer and the data sets (built when missing)."""
    if args.resume:
        check_resume(args, checkpoint_dir)
    vocab_file = prepare_vocab(args)
    tokenizer = BertTokenizer(vocab_file, do_lower_case=not args.cased)
    return vocab_file, tokenizer, prepare_datasets(args, tokenizer, vocab_file)


def main(argv=None):
    args = parse_args(argv)
    reuse_freed_memory()                          # each step's arrays land in mapped memory
    args.device = resolve_device(args.device)
    set_tf32(not args.no_tf32)
    group = process_group(args.device)
    if not group.is_main:
        sys.stdout = open(os.devnull, "w")            # rank 0 alone prints
    output_folder(args.out)
    checkpoint_dir = os.path.join(args.out, "checkpoint")
    metrics_path = os.path.join(args.out, "metrics.jsonl") if group.is_main else None
    if args.batch_size % (group.world_size * args.grad_accum):
        ranks = f"{group.world_size} ranks x " if group.world_size > 1 else ""
        raise SystemExit(f"error: --batch-size {args.batch_size} is not divisible by "
                         f"{ranks}--grad-accum {args.grad_accum}")

    # vocab, tokenizer and data: rank 0 writes them, then the others read them
    if group.is_main:
        vocab_file, tokenizer, data = prepare(args, checkpoint_dir)
    group.barrier()
    if not group.is_main:
        vocab_file, tokenizer, data = prepare(args, checkpoint_dir)

    # model and optimizer, fresh or resumed; every rank starts from rank 0's weights
    if args.resume:
        config, model, optimizer, state = resumed_model(args, checkpoint_dir, vocab_file,
                                                        metrics_path)
    else:
        config, model, optimizer, state = new_model(args, tokenizer.vocab_size, metrics_path)
    if group.world_size > 1:
        group.broadcast_(flat_buffer(model.params))
    if model.xp is not numpy:     # one Generator for the run: a new one per step would cost
        model.rng = default_rng(model.xp, args.seed + 1_000_003 * group.rank)   # launches
    scaler = LossScaler(model.xp) if args.dtype == "float16" else None
    if scaler and "loss_scaler" in state:
        scaler.load_state_dict(state["loss_scaler"])
    for dataset in data.train_sets + ([data.heldout] if data.heldout else []):
        dataset.check_compatible(config, tokenizer)
    model.train()
    print(f"model: {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
          f"{config.num_attention_heads} heads, vocab {config.vocab_size}: "
          f"{model.num_parameters() / 1e6:.2f}M parameters, {args.dtype} on {args.device}, "
          f"{group.describe()}")
    sizes = (f"{len(d):,} instances of length {d.max_seq_length}" for d in data.train_sets)
    print(f"data: {', '.join(sizes)}"
          + (f"; held-out {len(data.heldout):,}" if data.heldout else ""))

    # the loop, then a last checkpoint (written by rank 0; every rank checks it is finite)
    def save(step):
        if scaler:
            state["loss_scaler"] = scaler.state_dict()
        save_checkpoint(args, checkpoint_dir, model, optimizer, state, vocab_file, step,
                        write=group.is_main)

    stop = StopFlag()
    step = train(args, group, config, model, optimizer, scaler, state, data, stop, save,
                 metrics_path)
    save(step)
    print(f"saved {checkpoint_dir} at step {step} "
          f"({state['train_seconds'] / 60:.1f} min of training)")
    if stop.stop or step == args.stop_at_step or not group.is_main:
        return 0

    # final evaluation, eval.json and the loss curve
    summary = {"step": step, "train_minutes": state["train_seconds"] / 60}
    if data.heldout:
        final_evaluation(args, config, model, tokenizer, data, metrics_path, summary)
    with open(os.path.join(args.out, "eval.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    plot(metrics_path, os.path.join(args.out, "loss_curve.png"))
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except (ValueError, OSError) as e:    # bad input, a full disk: one clear line, no traceback
        code = f"error: {e}"
    except SystemExit as e:
        code = e.code
    end_job(code)                         # under mpiexec a failing rank ends every rank
