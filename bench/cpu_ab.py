"""A/B timing of the CPU workloads issue 20 targets: all-MiniLM-L6-v2 inference (BertModel
forward) and a fine-tuning step (sequence classification: loss_and_grads, clip, AdamW), batch
32 x 128 with lengths 64-128, float32. Run from a checkout (its nanobert is imported):

    python -m bench.cpu_ab --repeat 5 [--profile forward|step]

Prints one JSON line of medians in seconds: wall time, and CPU time of the process (all its
threads). To compare two checkouts, run it from each in turn, alternating, and compare the
medians; on a shared machine the numbers are noisy (say so). --profile prints cProfile's
top functions (wall time) instead.
"""
import argparse
import cProfile
import json
import pstats
import statistics
import time

import numpy

from nanobert import backend
from nanobert.model.bert import BertModel
from nanobert.model.heads import BertForSequenceClassification
from nanobert.model.optim import AdamW, clip_by_global_norm


def make_batch(B=32, T=128, seed=0):
    rng = numpy.random.default_rng(seed)
    lengths = rng.integers(64, T + 1, size=B)
    lengths[0] = T
    ids = rng.integers(1000, 30000, size=(B, T))
    mask = (numpy.arange(T) < lengths[:, None]).astype(numpy.int64)
    ids = ids * mask
    ids[:, 0] = 101
    return {"input_ids": ids, "token_type_ids": numpy.zeros_like(ids), "attention_mask": mask,
            "labels": rng.integers(0, 2, size=B)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", choices=["forward", "step"])
    parser.add_argument("--only", choices=["forward", "step"])
    args = parser.parse_args()
    backend.reuse_freed_memory()
    batch = make_batch()
    encoder = BertModel.from_pretrained("all-MiniLM-L6-v2")
    classifier = BertForSequenceClassification.from_pretrained("all-MiniLM-L6-v2", num_labels=2)
    classifier.train()
    optimizer = AdamW(classifier.params, mode="torch")

    def forward():
        encoder(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])

    def step():
        loss, grads = classifier.loss_and_grads(batch)
        clip_by_global_norm(grads, 1.0)
        optimizer.step(grads, lr=1e-5)

    work = {"forward": forward, "step": step}
    if args.profile:
        work[args.profile]()
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(args.repeat):
            work[args.profile]()
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        return
    names = [args.only] if args.only else list(work)
    times = {n: [] for n in names}
    cpu = {n: [] for n in names}
    for n in names:
        work[n]()                                   # warm-up
    for _ in range(args.repeat):
        for n in names:
            start, start_cpu = time.perf_counter(), time.process_time()
            work[n]()
            times[n].append(time.perf_counter() - start)
            cpu[n].append(time.process_time() - start_cpu)
    print(json.dumps({**{n: round(statistics.median(t), 4) for n, t in times.items()},
                      **{n + " cpu": round(statistics.median(t), 4) for n, t in cpu.items()}}))


if __name__ == "__main__":
    main()
