"""What a learner must read to follow one training step: the project functions that one
pretraining step executes (model.loss_and_grads + clip_by_global_norm + AdamW.step), per
file, with their source lines, in both modes: the fast layer and the reference
(`--reference-ops`: every op from ops.py).

    python -m bench.reading_cost                 # both modes, a table per mode
    python -m bench.reading_cost --functions     # and every function executed, file:line

A function counts once, with all of its source lines (its def to its last line, docstring and
comments included: a reader reads them), however often it runs and whichever of its branches
run; a closure's lines count within its enclosing function's. The step: BERT nano's shape
(2 layers, H=64, 2 heads), B=8, T=32, one row in three padded, dropout on, MLM and NSP
labels: the fast layer then runs its packed attention (packing.py) and its thread pool, as
`python train.py` does. tests/test_reference_mode.py holds the reference figure to its
target (at most 800 lines, ops.py the largest share).
"""
import argparse
import collections
import inspect
import os
import sys

import numpy

import nanobert
from nanobert.model import active
from nanobert.model.config import BertConfig
from nanobert.model.optim import AdamW, clip_by_global_norm
from nanobert.model.pretraining import BertForPreTraining

PACKAGE = os.path.dirname(os.path.abspath(nanobert.__file__))
ROOT = os.path.dirname(PACKAGE)


def nano_batch(config, B=8, T=32, seed=0):
    """A pretraining batch [B, T]: every third row padded after T*2/3, 15% of the attended
    positions labelled, NSP labels."""
    rng = numpy.random.default_rng(seed)
    ids = rng.integers(5, config.vocab_size, size=(B, T))
    mask = numpy.ones((B, T), dtype=numpy.int64)
    mask[::3, 2 * T // 3:] = 0
    labels = numpy.where((rng.random((B, T)) < 0.15) & (mask == 1), ids, -100)
    labels[:, 1] = ids[:, 1]
    return {"input_ids": ids, "token_type_ids": (numpy.arange(T) >= T // 2) * numpy.ones(
                (B, 1), dtype=numpy.int64),
            "attention_mask": mask, "labels": labels,
            "next_sentence_label": rng.integers(0, 2, size=B)}


def nano_model(seed=0):
    config = BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=256,
                        max_position_embeddings=64, hidden_dropout_prob=0.1,
                        attention_probs_dropout_prob=0.1)
    return BertForPreTraining(config, seed=seed).train()


def one_step(model, optimizer, batch):
    """The step the figure is of: loss and gradients, clipping, the AdamW update."""
    loss, grads = model.loss_and_grads(batch)
    clip_by_global_norm(grads, 1.0)
    optimizer.step(grads, lr=1e-3)
    return loss


def trace(step, files=(PACKAGE,)):
    """Run step() under sys.setprofile -> the code objects of the project functions it
    called (Python functions only; NumPy's C functions are not the project's) whose file
    starts with one of `files`, in the order first called. Threads the step starts are
    traced too (threading.setprofile)."""
    import threading
    seen = {}
    files = tuple(files)

    def profile(frame, event, arg):
        if event == "call":
            code = frame.f_code
            if code.co_filename.startswith(files) and code not in seen:
                seen[code] = None
    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        step()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    # a comprehension's or a closure's lines are its enclosing function's: counted there
    return [code for code in seen
            if not code.co_name.startswith("<") and "<locals>" not in code.co_qualname]


def source_lines(code):
    """The function's source lines, its def to its last line."""
    return len(inspect.getsourcelines(code)[0])


def relative(path):
    return os.path.relpath(path, ROOT)


def executed_functions(reference, seed=0):
    """[(file, first line, qualified name, lines)] of one step in the chosen mode (a warm-up
    step first, so that one-off set-up such as the thread pool's start is not counted)."""
    was = active.reference_ops()
    active.use_reference_ops(reference)
    try:
        model = nano_model(seed)
        optimizer = AdamW(model.params, lr=1e-3)
        batch = nano_batch(model.config, seed=seed)
        one_step(model, optimizer, batch)
        codes = trace(lambda: one_step(model, optimizer, batch))
    finally:
        active.use_reference_ops(was)
    return [(relative(c.co_filename), c.co_firstlineno, c.co_qualname, source_lines(c))
            for c in codes]


def train_py_step(reference, seed=0):
    """[(file, first line, qualified name, lines)], in the order first called, of one step of
    train.py's loop on the CPU (docs/walkthrough.md follows it): the micro-batches' losses and
    gradients (train.loss_and_grads, optim.average_gradients), the sums the log reads
    (train.step_sums), then training/step.update: allreduce, guards, clipping, AdamW."""
    import train
    from nanobert.distributed import process_group
    from nanobert.model.optim import average_gradients
    from nanobert.training.step import update
    args = argparse.Namespace(no_nsp=False, batch_size=8, grad_accum=1, device="cpu",
                              optimizer="bert")
    was = active.reference_ops()
    active.use_reference_ops(reference)
    try:
        model = nano_model(seed)
        optimizer = AdamW(model.params, lr=1e-3)
        group = process_group("cpu")
        batch = nano_batch(model.config, seed=seed)
        denominators = {"masked_lm": int((batch["labels"] != -100).sum()),
                        "next_sentence": len(batch["next_sentence_label"])}

        def step():        # train.py's loop body between the batch and the log line, CPU
            _, grads, outputs = average_gradients(
                train.loss_and_grads(args, model, None, denominators), [batch], weights=[1.0])
            sums = train.step_sums(group, model.xp, [batch], outputs, denominators)
            update(group, model, optimizer, None, grads, 1e-3, 1, mode=args.optimizer,
                   loss=train.total_loss(train.host_sums(sums)))
        step()
        codes = trace(step, (PACKAGE, os.path.join(ROOT, "train.py")))
    finally:
        active.use_reference_ops(was)
    return [(relative(c.co_filename), c.co_firstlineno, c.co_qualname, source_lines(c))
            for c in codes]


def walkthrough_items(functions):
    """The lines of docs/walkthrough.md's list: `file:line` qualified name (lines)."""
    return [f"`{path}:{line}` {name} ({lines})" for path, line, name, lines in functions]


def per_file(functions):
    """file -> (functions, lines), largest first."""
    totals = collections.defaultdict(lambda: [0, 0])
    for path, _, _, lines in functions:
        totals[path][0] += 1
        totals[path][1] += lines
    return dict(sorted(totals.items(), key=lambda item: -item[1][1]))


def report(name, functions, show_functions=False):
    files = per_file(functions)
    total = sum(lines for _, lines in files.values())
    print(f"{name}: {len(functions)} functions, {total} lines, {len(files)} files")
    for path, (count, lines) in files.items():
        print(f"  {path:<36} {count:>4} functions {lines:>5} lines")
    if show_functions:
        for path, line, qualname, lines in sorted(functions):
            print(f"    {path}:{line} {qualname} ({lines})")
    return total


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--functions", action="store_true", help="list every function executed")
    p.add_argument("--walkthrough", action="store_true",
                   help="print the list of docs/walkthrough.md: train.py's step in reference "
                        "mode, function by function in the order first called")
    args = p.parse_args(argv)
    if args.walkthrough:
        for item in walkthrough_items(train_py_step(reference=True)):
            print(f"- {item}")
        return
    for name, reference in (("reference mode (--reference-ops)", True), ("fast layer", False)):
        report(name, executed_functions(reference), args.functions)
        print()


if __name__ == "__main__":
    main()
