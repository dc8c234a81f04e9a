"""How big is the NSP gradient beside the masked LM's, weight by weight? BERT's loss is their
sum, so every encoder weight gets both; Adam divides each weight's step by the root of its
mean squared gradient, so where NSP's part is the larger one it sets the step size and the
masked LM moves by a fraction of it. A diagnostic, not part of the tests:

    python -m bench.nsp_gradients                        # runs/pretrain (the default run)
    python -m bench.nsp_gradients --run runs/ablation/pretrain-brown-mlm-nsp --batches 20

Reads a train.py output folder: its checkpoint (dropout off, so that the two parts are
exact) and its held-out instances (data/heldout-*). For each weight it takes the gradient of
the masked LM loss alone (the batch without next_sentence_label) and of the sum, and the NSP
part as their difference; it prints the root-mean-square over batches of each part's norm and
their ratio, and the same over the whole encoder (embeddings and layers: the weights both
losses reach).
"""
import argparse
import glob
import os

import numpy

from nanobert import BertForPreTraining, flags
from nanobert.data.pretraining_data import PretrainingDataset


def gradient_parts(model, batch):
    """-> {weight: (masked-LM gradient, NSP gradient)} for one batch."""
    _, both = model.loss_and_grads(batch)
    _, mlm = model.loss_and_grads({k: v for k, v in batch.items() if k != "next_sentence_label"})
    return {k: (mlm[k], both[k] - mlm[k]) for k in both}


def squared_norms(model, dataset, batch_size, num_batches):
    """Sum over batches of each part's squared norm -> {weight: [mlm, nsp]}, batches used."""
    sums = {}
    used = 0
    for batch in dataset.batches(batch_size, shuffle=False, drop_last=True):
        if used == num_batches:
            break
        for k, (g_mlm, g_nsp) in gradient_parts(model, batch).items():
            pair = sums.setdefault(k, [0.0, 0.0])
            pair[0] += float(numpy.square(g_mlm, dtype=numpy.float64).sum())
            pair[1] += float(numpy.square(g_nsp, dtype=numpy.float64).sum())
        used += 1
    return sums, used


def report(sums, used):
    """The table: per weight the RMS norm of each part and NSP / MLM; then the encoder's."""
    print(f"{'weight':56s} {'MLM':>8s} {'NSP':>8s} {'NSP/MLM':>8s}")
    for k, (mlm, nsp) in sums.items():
        ratio = f"{(nsp / mlm) ** 0.5:8.2f}" if mlm and nsp else f"{'-':>8s}"
        print(f"{k:56s} {(mlm / used) ** 0.5:8.4f} {(nsp / used) ** 0.5:8.4f} {ratio}")
    shared = [sums[k] for k in sums if k.startswith(("bert.embeddings.", "bert.encoder."))]
    ratio = (sum(nsp for _, nsp in shared) / sum(mlm for mlm, _ in shared)) ** 0.5
    larger = sum(nsp > mlm for mlm, nsp in shared)
    print(f"encoder (embeddings and layers): NSP / MLM gradient norm {ratio:.2f}; the NSP "
          f"part is the larger in {larger} of {len(shared)} weights ({used} batches)")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--run", default=os.path.join("runs", "pretrain"),
                   help="a train.py output folder (default runs/pretrain)")
    p.add_argument("--batches", type=flags.positive_int, default=8)
    p.add_argument("--batch-size", type=flags.positive_int, default=32)
    args = p.parse_args(argv)
    checkpoint = os.path.join(args.run, "checkpoint")
    held = sorted(glob.glob(os.path.join(args.run, "data", "heldout-*")))
    if not os.path.isdir(checkpoint) or not held:
        raise SystemExit(f"error: {args.run} is not a train.py output folder with a checkpoint "
                         "and held-out data (checkpoint/, data/heldout-*)")
    model = BertForPreTraining.from_pretrained(checkpoint)      # eval mode: no dropout
    dataset = PretrainingDataset(held[-1])
    dataset.check_compatible(model.config)
    sums, used = squared_norms(model, dataset, args.batch_size, args.batches)
    if not used:
        raise SystemExit(f"error: {held[-1]} has fewer than {args.batch_size} instances")
    report(sums, used)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
