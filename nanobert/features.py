"""Features from a pretrained BERT, no training (the paper's feature-based approach, Section
5.3): run the encoder once over a text file, one text per line, and keep a vector per text
(or per WordPiece).

    python -m nanobert.features --input texts.txt --out feats/ --pooling mean --normalize
    python -m nanobert.features --input texts.txt --layers -4 -3 -2 -1 --pooling tokens

(`python finetune.py --task features ...` runs the same, with finetune.py's flags.)
Writes to --out: embeddings.npy (float32; for --pooling tokens also offsets.npy and
tokens.txt) and features.json.
"""
import json
import os
import time

import numpy

from nanobert import BertModel, flags
from nanobert.backend import to_host
from nanobert.data import tasks
from nanobert.data.tokenizer import BertTokenizer
from nanobert.formats.fileio import atomic_open, output_folder
from nanobert.formats.hub import resolve_model
from nanobert.training.run import run_command, setup_device


def parse_args(argv=None):
    p = flags.parser(__doc__, prog="python -m nanobert.features")
    flags.add(p, "--model")
    p.add_argument("--out", metavar="DIR", default=os.path.join("runs", "features"),
                   help="output folder (default runs/features)")
    p.add_argument("--max-seq-length", type=flags.in_range(int, 3), metavar="N", default=128,
                   help="WordPieces per text, [CLS]/[SEP] included; longer texts are truncated "
                        "(default 128)")
    p.add_argument("--eval-batch-size", type=flags.positive_int, metavar="N", default=64,
                   help="texts per forward pass (default 64)")
    flags.add(p, "--device", "--dtype", "--no-tf32")
    add_features_arguments(p, required=True)
    return p.parse_args(argv)


def add_features_arguments(g, required=False):
    g.add_argument("--input", metavar="FILE", required=required,
                   help="text file, one text per line")
    g.add_argument("--pooling", choices=("mean", "cls", "pooler", "tokens"), default="mean",
                   help="mean of the tokens (sentence-transformers), the [CLS] vector, the "
                        "pooler output, or every token (default mean)")
    g.add_argument("--layers", type=int, nargs="+", default=[-1],
                   help="hidden layers to concatenate, e.g. --layers -4 -3 -2 -1 (the paper's "
                        "best feature-based NER input); 0 = the embeddings, -1 = the last layer "
                        "(default)")
    g.add_argument("--normalize", action="store_true", help="L2-normalise each vector")


def extract_features(args):
    """The paper's feature-based approach: run the encoder once, keep vectors, no training."""
    folder = resolve_model(args.model)
    tokenizer = BertTokenizer.from_pretrained(folder)
    model = BertModel.from_pretrained(folder, dtype=numpy.dtype(args.dtype), device=args.device)
    texts = tasks.read_text_lines(args.input)
    while texts and not texts[-1].strip():
        texts.pop()
    L = model.config.num_hidden_layers
    for layer in args.layers:
        if not -(L + 1) <= layer <= L:
            raise SystemExit(f"error: --layers {layer}: the model has hidden states 0..{L} "
                             f"(or -1..-{L + 1})")
    encoded = [tasks.encode_pair(tokenizer, t, None, args.max_seq_length) for t in texts]
    truncated = sum(e[2] for e in encoded)
    features = tasks.Features([e[0] for e in encoded], [e[1] for e in encoded])
    print(f"{len(texts):,} texts from {args.input}; {truncated:,} truncated to "
          f"{args.max_seq_length} WordPieces")
    vectors = embed(args, model, features)
    width = model.config.hidden_size * len(args.layers)
    info = {"model": args.model, "input": args.input, "texts": len(texts), "truncated": truncated,
            "pooling": args.pooling, "layers": args.layers, "normalize": args.normalize}
    save_features(args, tokenizer, features, vectors, width, info)
    return 0


def embed(args, model, features):
    """Per text, its pooled vector of the --layers hidden states (or, for --pooling tokens,
    one vector per WordPiece), in text order. Texts are batched by length."""
    order = sorted(range(len(features)), key=features.length)
    vectors = [None] * len(features)
    start_time = time.time()
    for start in range(0, len(order), args.eval_batch_size):
        rows = order[start:start + args.eval_batch_size]
        batch = features.batch(rows)
        out = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        hidden = numpy.concatenate([to_host(out.hidden_states[layer]) for layer in args.layers],
                                   axis=-1)                                      # [B, T, D]
        mask = batch["attention_mask"][..., None].astype(hidden.dtype)
        if args.pooling == "mean":
            pooled = (hidden * mask).sum(1) / numpy.maximum(mask.sum(1), 1e-9)
        elif args.pooling == "cls":
            pooled = hidden[:, 0]
        elif args.pooling == "pooler":
            if out.pooler_output is None:
                raise SystemExit(f"error: {args.model} has no pooler; use --pooling cls or mean")
            pooled = to_host(out.pooler_output)
        for i, r in enumerate(rows):
            vectors[r] = hidden[i, :features.length(r)] if args.pooling == "tokens" else pooled[i]
        print(f"\r  {min(start + len(rows), len(order)):,}/{len(order):,} texts", end="",
              flush=True)
    print(f"  ({time.time() - start_time:.1f} s)")
    return vectors


def save_features(args, tokenizer, features, vectors, width, info):
    """embeddings.npy (float32; for --pooling tokens also offsets.npy and tokens.txt) and
    features.json in --out."""
    output_folder(args.out)
    tokens = args.pooling == "tokens"
    if not vectors:
        array = numpy.zeros((0, width))
    else:
        array = numpy.concatenate(vectors) if tokens else numpy.stack(vectors)
    array = array.astype(numpy.float32)
    if args.normalize:
        array /= numpy.maximum(numpy.linalg.norm(array, axis=-1, keepdims=True), 1e-12)
    path = os.path.join(args.out, "embeddings.npy")
    with atomic_open(path, "wb") as f:
        numpy.save(f, array)
    written = [path]
    if tokens:
        with atomic_open(os.path.join(args.out, "offsets.npy"), "wb") as f:
            numpy.save(f, numpy.cumsum([0] + [len(v) for v in vectors]))
        with atomic_open(os.path.join(args.out, "tokens.txt"), "w", encoding="utf-8") as f:
            for ids in features.input_ids:
                f.write(" ".join(tokenizer.convert_ids_to_tokens(ids)) + "\n")
        written += [os.path.join(args.out, "offsets.npy"), os.path.join(args.out, "tokens.txt")]
    info.update(shape=list(array.shape), max_seq_length=args.max_seq_length)
    with atomic_open(os.path.join(args.out, "features.json"), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=1)
    print(f"wrote {', '.join(written)}: {array.shape} float32"
          + (" (row i of text j: offsets[j] + i)" if tokens else ""))


def main(argv=None):
    args = parse_args(argv)
    setup_device(args)
    return extract_features(args)


if __name__ == "__main__":
    run_command(main)
