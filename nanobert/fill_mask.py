"""Fill-mask: what a pretrained BERT's masked LM puts in place of each [MASK] in your text,
the top-k WordPieces with their probabilities, as transformers' pipeline("fill-mask") gives.

    python -m nanobert.fill_mask "the old man sat in his [MASK] ." --model runs/pretrain/checkpoint
    python -m nanobert.fill_mask "he [MASK] the [MASK] ." "she was [MASK] ." --top-k 3

Each [MASK] gets its own list: the softmax over the whole vocabulary at its position (the
other masks stay masked). Per guess the table shows its probability (score), the WordPiece
(token_str, "##" and all) and the text with the guess in place (sequence; with several
masks it keeps [CLS], [SEP] and the other [MASK]s, as the pipeline's does); fill_mask()
gives the pipeline's dicts, the id (token) too. Needs a
checkpoint with its masked-LM head (cls.predictions.*): runs/pretrain/checkpoint after
`python train.py`, or any BertForPreTraining / BertForMaskedLM folder.
"""
import os

import numpy

from nanobert import BertForPreTraining, flags
from nanobert.backend import to_host
from nanobert.data.tokenizer import BertTokenizer
from nanobert.formats.hub import resolve_model
from nanobert.model.params import init_params
from nanobert.model.pretrained import (adapt_state_dict, check_state_dict, read_checkpoint,
                                       read_weights)
from nanobert.model.pretraining import top_k_at_masks
from nanobert.training.run import run_command, setup_device

DEFAULT_MODEL = os.path.join("runs", "pretrain", "checkpoint")      # what train.py writes
MLM_HEAD = "cls.predictions.transform.dense.weight"
# What fill-mask never reads, started fresh where a checkpoint lacks it (BertForMaskedLM
# keeps neither the NSP classifier nor, often, the pooler).
UNUSED_HERE = ("cls.seq_relationship.", "bert.pooler.")


def parse_args(argv=None):
    p = flags.parser(__doc__, prog="python -m nanobert.fill_mask")
    p.add_argument("texts", nargs="+", metavar="TEXT", help="texts with one or more [MASK]")
    flags.add(p, "--model", default=DEFAULT_MODEL,
              help=f"checkpoint folder with a masked-LM head (default {DEFAULT_MODEL}, "
                   "what python train.py writes) or a known model name")
    p.add_argument("--top-k", type=flags.positive_int, default=5, metavar="K",
                   help="guesses per [MASK] (default 5, as the pipeline)")
    flags.add(p, "--device", "--no-tf32")
    return p.parse_args(argv)


def load_masked_lm(name_or_path, device=None, dtype=numpy.float32):
    """BertForPreTraining (eval mode) from a checkpoint that has the masked-LM head; a
    missing NSP classifier or pooler starts fresh (fill-mask does not use them). A checkpoint
    without the head is a ValueError saying what to use instead."""
    folder = resolve_model(name_or_path)
    config, tensors = read_checkpoint(folder)
    expected = BertForPreTraining.param_shapes(config)
    tensors = adapt_state_dict(tensors, BertForPreTraining.base_prefix, expected)
    if MLM_HEAD not in tensors:
        raise ValueError(f"{name_or_path} has no masked-LM head (no cls.predictions.* tensors: "
                         "an encoder alone, as sentence-embedding models such as "
                         "all-MiniLM-L6-v2 are), so it cannot fill [MASK]; give a checkpoint "
                         f"with the head: {DEFAULT_MODEL} after python train.py, or a "
                         "BertForPreTraining / BertForMaskedLM folder")
    fresh = {k: s for k, s in expected.items() if k not in tensors and k.startswith(UNUSED_HERE)}
    config_file = os.path.join(folder, "config.json")
    check_state_dict({k: s for k, s in expected.items() if k not in fresh}, tensors,
                     what=f"BertForPreTraining with {config_file}")    # before any is read
    tensors = read_weights(folder, config, tensors)
    tensors.update(init_params(fresh, config, seed=0))
    model = BertForPreTraining(config, dtype=dtype, device=device, params=tensors)
    return model.eval(), folder


def encode(tokenizer, config, text, index=1):
    """[CLS] text [SEP] -> input_ids [T]; a text without [MASK] or longer than the model's
    positions is a ValueError naming it (`index`: its place on the command line)."""
    input_ids = tokenizer.encode(text)
    shown = text if len(text) <= 60 else text[:57] + "..."
    if tokenizer.mask_token_id not in input_ids:
        raise ValueError(f"text {index} ({shown!r}) has no {tokenizer.mask_token}: mark each "
                         f"WordPiece to guess with {tokenizer.mask_token}")
    if len(input_ids) > config.max_position_embeddings:
        raise ValueError(f"text {index} ({shown!r}) is {len(input_ids)} WordPieces with [CLS] "
                         f"and [SEP], but the model takes at most "
                         f"{config.max_position_embeddings} (max_position_embeddings)")
    return input_ids


def fill_mask(model, tokenizer, input_ids, top_k=5):
    """-> per [MASK] of input_ids (left to right), a list of top_k dicts with the pipeline's
    keys: score, token, token_str, sequence."""
    logits = to_host(model(numpy.array([input_ids])).prediction_logits[0])      # [T, V]
    guesses = top_k_at_masks(logits, input_ids, tokenizer.mask_token_id, top_k)
    single_mask = len(guesses) == 1
    result = []
    for position, ids, probs in guesses:
        row = []
        for token, score in zip(ids.tolist(), probs.tolist()):
            filled = list(input_ids)
            filled[position] = token
            # as the pipeline: no [PAD] in the sequence, even where [PAD] is the guess
            filled = [t for t in filled if t != tokenizer.pad_token_id]
            row.append({"score": score, "token": token, "token_str": tokenizer.decode([token]),
                        "sequence": tokenizer.decode(filled, skip_special_tokens=single_mask)})
        result.append(row)
    return result


def show(text, result):
    """Print one text's guesses: a table per [MASK]."""
    print(text)
    for i, row in enumerate(result):
        if len(result) > 1:
            print(f"  [MASK] {i + 1} of {len(result)}:")
        width = max(len(guess["token_str"]) for guess in row)
        for guess in row:
            print(f"  {guess['score']:7.4f}  {guess['token_str']:<{width}}  {guess['sequence']}")


def main(argv=None):
    args = parse_args(argv)
    setup_device(args)
    model, folder = load_masked_lm(args.model, args.device)
    tokenizer = BertTokenizer.from_pretrained(folder)
    encoded = [encode(tokenizer, model.config, text, i + 1) for i, text in enumerate(args.texts)]
    for text, input_ids in zip(args.texts, encoded):
        show(text, fill_mask(model, tokenizer, input_ids, args.top_k))
    return 0


if __name__ == "__main__":
    run_command(main)
