"""What a learner must read to follow one training step: the project functions that one
pretraining step executes (model.loss_and_grads + clip_by_global_norm + AdamW.step), per
file, with their source lines, in both modes: the fast layer and the reference
(`--reference-ops`: every op from ops.py).

    python -m bench.reading_cost                 # both modes, a table per mode
    python -m bench.reading_cost --functions     # and every function executed, file:line
    python -m bench.reading_cost --walkthrough   # docs/walkthrough.md's list, train.py's step
    python -m bench.reading_cost --walkthrough-update docs/walkthrough.md
                                                 # its file:line (lines), figures and diagram
                                                 # rewritten

A function counts once, with all of its source lines (its def to its last line, docstring and
comments included: a reader reads them), however often it runs and whichever of its branches
run; a closure's lines count within its enclosing function's. The step: BERT nano's shape
(2 layers, H=64, 2 heads), B=8, T=32, one row in three padded, dropout on, MLM and NSP
labels: the fast layer then runs its packed attention (packing.py) and its thread pool, as
`python train.py` does. tests/test_reference_mode.py holds the reference figure to its
target (at most 800 lines). The report ends with the ops ops.py alone defines: they run as
written there in the fast mode too (active.missing_twins()).

docs/walkthrough.md lists train.py's step math first (the ops, the encoder and heads that
compose them, the update's math: is_math), the harness after, each in the order first
called; its diagram of one step's tensors (step_diagram) comes from a trace too.
"""
import argparse
import collections
import datetime
import inspect
import os
import re
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
    from nanobert.model import threads
    seen = {}
    files = tuple(files)
    # threading.setprofile reaches the threads started after it: a fresh pool, so that what
    # its workers run is traced too (else the count depends on which thread took a block)
    if threads._pool is not None:
        threads._pool.shutdown()
        threads._pool, threads._pool_size = None, 0

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


# In the model's files, what is not the math: the skeleton's plumbing (checks, devices, the
# outputs dict) and the targets' checks.
MATH_FILES = ("nanobert/model/ops.py", "nanobert/model/special.py", "nanobert/model/bert.py",
              "nanobert/model/pretraining.py", "nanobert/model/heads.py")
UPDATE_MATH = ("clip_by_global_norm", "ReferenceAdamW.step")     # in optim.py
SCATTER_ADD = ("nanobert/backend.py", "scatter_add")             # the lookup's gradient


def is_math(path, name):
    """Whether function `name` of file `path` is the step's math (the walkthrough's first
    part): the ops, the composition of the encoder and the heads, the update's math."""
    if path == "nanobert/model/optim.py":
        return name in UPDATE_MATH
    if (path, name) == SCATTER_ADD:
        return True
    return (path in MATH_FILES and not name.startswith("BertPreTrainedModel.")
            and not name.endswith("._check_targets") and name not in ("host_scalar",
                                                                       "host_scalars"))


def walkthrough_items(functions):
    """The lines of docs/walkthrough.md's list: `file:line` qualified name (lines), the math
    first, then the harness, each in the order of `functions`."""
    ordered = ([f for f in functions if is_math(f[0], f[2])]
               + [f for f in functions if not is_math(f[0], f[2])])
    return [f"`{path}:{line}` {name} ({lines})" for path, line, name, lines in ordered]


def math_count(functions):
    """How many of the walkthrough's items are the math (its first part)."""
    return sum(is_math(f[0], f[2]) for f in functions)

# ------------------------------------------------------------------ the step's diagram
# The composition's functions, (file, name): each call's first array in and array out become a
# node of docs/walkthrough.md's flowchart of one step; a run of calls alike, one node.


DIAGRAM = (("nanobert/model/bert.py", "embeddings_forward"),
           ("nanobert/model/bert.py", "encoder_layer_forward"),
           ("nanobert/model/ops.py", "tanh_forward"),
           ("nanobert/model/pretraining.py", "mlm_head_forward"),
           ("nanobert/model/pretraining.py", "nsp_head_forward"),
           ("nanobert/model/ops.py", "cross_entropy_forward"),
           ("nanobert/model/ops.py", "cross_entropy_backward"),
           ("nanobert/model/pretraining.py", "mlm_head_backward"),
           ("nanobert/model/pretraining.py", "nsp_head_backward"),
           ("nanobert/model/ops.py", "tanh_backward"),
           ("nanobert/model/bert.py", "encoder_layer_backward"),
           ("nanobert/model/bert.py", "embeddings_backward"),
           ("nanobert/model/ops.py", "clip_by_global_norm"),
           ("nanobert/model/optim.py", "ReferenceAdamW.step"))
WHAT = {"embeddings_forward": "input_ids to vectors", "encoder_layer_forward": "the layers",
        "tanh_forward": "pooler", "mlm_head_forward": "MLM at the masked positions",
        "nsp_head_forward": "NSP", "cross_entropy_forward": "loss",
        "cross_entropy_backward": "dloss to dlogits", "encoder_layer_backward": "the layers",
        "embeddings_backward": "into the tables", "clip_by_global_norm": "global norm to 1.0",
        "ReferenceAdamW.step": "every parameter"}


def shape_of(value):
    """[a, b, ...] of an array, "0-d" of a scalar array, "" of anything else."""
    shape = getattr(value, "shape", None)
    if shape is None:
        return ""
    return f"[{', '.join(map(str, shape))}]" if shape else "0-d"


def step_diagram(seed=0):
    """The lines of a Mermaid flowchart of one reference step (bench.reading_cost's model
    and batch): the DIAGRAM functions in the order called, each with the shape of its first
    array argument and of its (first) result."""
    was = active.reference_ops()
    active.use_reference_ops(True)
    wanted = {(os.path.join(ROOT, path), name) for path, name in DIAGRAM}
    calls, inputs = [], {}

    def profile(frame, event, arg):
        code = frame.f_code
        if (code.co_filename, code.co_qualname) not in wanted:
            return
        if event == "call":
            names = code.co_varnames[:code.co_argcount]
            inputs[id(frame)] = next((shape_of(frame.f_locals[n]) for n in names
                                      if shape_of(frame.f_locals[n])), "")
        elif event == "return":
            out = arg[0] if isinstance(arg, tuple) else arg
            calls.append((code.co_qualname, inputs.pop(id(frame), ""), shape_of(out)))
    try:
        model = nano_model(seed)
        optimizer = AdamW(model.params, lr=1e-3)
        batch = nano_batch(model.config, seed=seed)
        sys.setprofile(profile)
        try:
            one_step(model, optimizer, batch)
        finally:
            sys.setprofile(None)
    finally:
        active.use_reference_ops(was)
    runs = []                                    # [(call, count)]: a run of calls alike
    for call in calls:
        if runs and runs[-1][0] == call:
            runs[-1][1] += 1
        else:
            runs.append([call, 1])
    lines = ["```mermaid", "flowchart TD"]
    for n, ((name, shape_in, shape_out), count) in enumerate(runs):
        times = f" × {count}" if count > 1 else ""
        shapes = " → ".join(s for s in (shape_in, shape_out) if s)
        label = "<br/>".join(part for part in (f"{name}{times}", WHAT.get(name, ""), shapes)
                             if part)
        lines.append(f'    n{n}["{label}"]' + (f" --> n{n + 1}" if n + 1 < len(runs) else ""))
    return lines + ["```"]


# docs/walkthrough.md's list items: "- `file:line` qualified.name (lines) — what it does"
ITEM = re.compile(r"- (`(?P<path>[^`:]+):(?P<line>\d+)` (?P<name>\S+) \((?P<lines>\d+)\))")
FIGURES = ("<!-- figures: python -m bench.reading_cost --walkthrough-update -->",
           "<!-- end of figures -->")
DIAGRAM_MARKS = ("<!-- diagram: python -m bench.reading_cost --walkthrough-update -->",
                 "<!-- end of diagram -->")


def page_items(text):
    """[(line index, item, description)] of a page's list items ("- `file:line` name (lines)"
    and what follows " — "), in order; lines inside fenced blocks are not items."""
    items, fence = [], False
    for index, line in enumerate(text.splitlines()):
        if line.lstrip().startswith("```"):
            fence = not fence
        found = None if fence else ITEM.match(line)
        if found:
            items.append((index, found.group(1), line[found.end():].removeprefix(" — ")))
    return items


def item_key(item):
    """`file:line` name (lines) -> (file, name): what stays when only line numbers move."""
    found = ITEM.match("- " + item)
    return found.group("path"), found.group("name")


def between(lines, marks):
    """(start, end): the indices of the lines `marks` (two markers) in `lines`; ValueError
    where the page lacks them."""
    start, end = (next((n for n, line in enumerate(lines) if line.strip() == marker), None)
                  for marker in marks)
    if start is None or end is None or end < start:
        raise ValueError(f"the page has no lines between {marks[0]} and {marks[1]}")
    return start, end


def update_walkthrough(text, functions, figures=None, diagram=None):
    """The page `text` with each list item's `file:line` name (lines) rewritten from
    `functions` (train_py_step's), its description kept, and the figures between the FIGURES
    markers replaced by `figures` (if given), the diagram between DIAGRAM_MARKS by `diagram`
    (if given). ValueError, naming them, where the functions are not the page's, in the
    page's order: a person writes what a new one does."""
    lines = text.splitlines()
    page = page_items(text)
    new = walkthrough_items(functions)
    old_keys, new_keys = [item_key(i) for _, i, _ in page], [item_key(i) for i in new]
    if old_keys != new_keys:
        added = [i for i, k in zip(new, new_keys) if k not in old_keys]
        removed = [i for _, i, _ in page if item_key(i) not in new_keys]
        problem = ((["functions the step now runs, not on the page (write their "
                     "descriptions):"] + [f"  + {i}" for i in added] if added else [])
                   + (["functions on the page the step no longer runs:"]
                      + [f"  - {i}" for i in removed] if removed else []))
        if not added and not removed:
            at = next(n for n, (a, b) in enumerate(zip(old_keys, new_keys)) if a != b)
            problem = [f"the step now calls them in another order: item {at + 1} is "
                       f"{new[at]}, the page has {page[at][1]} (move the items)"]
        raise ValueError("\n".join(problem))
    for (index, _, description), item in zip(page, new):
        lines[index] = f"- {item}" + (f" — {description}" if description else "")
    for new_lines, marks in ((figures, FIGURES), (diagram, DIAGRAM_MARKS)):
        if new_lines is not None:
            start, end = between(lines, marks)
            lines[start + 1:end] = new_lines
    return "\n".join(lines) + "\n"


def figures_table(reference, fast, walkthrough, date=None):
    """The markdown lines of docs/walkthrough.md's figures: per file, the functions and lines
    of bench.reading_cost's step in both modes, and the size of the walkthrough's list."""
    date = date or datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    ref, fst = per_file(reference), per_file(fast)
    rows = list(ref) + [path for path in fst if path not in ref]

    def cells(files, path):
        count, lines = files.get(path, (0, 0))
        return f"{count} | {lines}" if count else "| "

    def total(functions):
        return f"{len(functions)} functions, {sum(f[3] for f in functions):,} lines"
    return ([f"Measured {date} by `python -m bench.reading_cost` (one step of "
             f"loss_and_grads + clip + AdamW.step, BERT nano's shape, B=8, T=32, one row in "
             f"three padded): reference mode {total(reference)} in {len(ref)} files; fast "
             f"layer {total(fast)} in {len(fst)} files. The list above (train.py's whole "
             f"step): {total(walkthrough)}.", "",
             "| file | reference mode: functions | lines | fast layer: functions | lines |",
             "|---|---:|---:|---:|---:|"]
            + [f"| `{path}` | {cells(ref, path)} | {cells(fst, path)} |" for path in rows])


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
    p.add_argument("--walkthrough-update", metavar="PAGE",
                   help="rewrite the `file:line` name (lines) of each list item of PAGE "
                        "(docs/walkthrough.md) and its figures, keeping the descriptions; "
                        "fails, naming them, where functions were added, removed or reordered")
    args = p.parse_args(argv)
    if args.walkthrough_update:
        with open(args.walkthrough_update) as f:
            text = f.read()
        walkthrough = train_py_step(reference=True)
        figures = figures_table(executed_functions(True), executed_functions(False), walkthrough)
        try:
            text = update_walkthrough(text, walkthrough, figures, step_diagram())
        except ValueError as e:
            raise SystemExit(f"{args.walkthrough_update} is not updated:\n{e}\n"
                             f"(python -m bench.reading_cost --walkthrough prints the list)")
        with open(args.walkthrough_update, "w") as f:
            f.write(text)
        print(f"updated {args.walkthrough_update}: {len(walkthrough)} items, the figures and "
              f"the diagram")
        return
    if args.walkthrough:
        for item in walkthrough_items(train_py_step(reference=True)):
            print(f"- {item}")
        return
    for name, reference in (("reference mode (--reference-ops)", True), ("fast layer", False)):
        report(name, executed_functions(reference), args.functions)
        print()
    print(f"ops.py's functions with no fast twin (they run as written there in both modes): "
          f"{', '.join(active.missing_twins())}")


if __name__ == "__main__":
    main()
