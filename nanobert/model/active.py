"""The one switch between the two layers of ops: which one the model runs.

bert.py, pretraining.py and heads.py call every op as `active.<name>` (active.linear_forward,
active.self_attention_backward, ...). Every public function of ops.py has its name bound here,
either to ops.py's function (reference mode: the math a learner reads is what runs; no
packing, no thread pool, and AdamW and clipping as the update's math, optim.py) or, in the
default mode, to fast.py's twin of it (the same contract, made fast: in place, threaded,
CUDA) where fast.py has one, else to ops.py's own: an op written in ops.py alone runs in both
modes (missing_twins() lists them). Both layers are proven equal, twin by twin
(tests/test_twins.py) and as a whole training run (tests/test_reference_mode.py), as llm.c
proves train_gpt2.cu equal to train_gpt2.c. Inference is the same forward with cache=False.

What does not go through here: packed attention (packing.py, the fast mode's attention over
the attended tokens alone, which the model never runs in reference mode) and the optimiser,
which optim.py picks when it is made (AdamW(...): its step refuses a switch made after).

    from nanobert.model import active
    active.use_reference_ops()          # = train.py / finetune.py --reference-ops,
                                       #   or NANOBERT_REFERENCE=1 in the environment

Switch before building a model and its optimiser: reference mode runs on the CPU in float32
or float64 (ops.py has no mixed-precision case and the GPU's step is the fast layer's CUDA
graph).
"""
import inspect
import os

from . import fast, ops


def _public_functions(module):
    """name -> function for each public function defined in module (not imported into it)."""
    return {name: f for name, f in vars(module).items()
            if inspect.isfunction(f) and not name.startswith("_")
            and f.__module__ == module.__name__}


# Every op of ops.py, by name: what the model may call as active.<name>.
OPS = tuple(_public_functions(ops))

_reference = False


def twins():
    """The ops fast.py has a twin of: a public function of the same name as ops.py's."""
    return tuple(name for name in _public_functions(fast) if name in OPS)


def missing_twins():
    """The ops fast.py has no twin of: ops.py's function runs in the fast mode too."""
    return tuple(name for name in OPS if name not in twins())


def use_reference_ops(on=True):
    """From now on the model runs ops.py's functions (on=True) or the fast layer's (False),
    ops.py's where the fast layer has no twin."""
    global _reference
    _reference = bool(on)
    fast_ops = {} if on else _public_functions(fast)
    globals().update({name: fast_ops.get(name, getattr(ops, name)) for name in OPS})


def reference_ops():
    """Whether the model runs ops.py (reference mode)."""
    return _reference


def describe():
    """Which layer runs, for the `model:` line the command lines print."""
    return "reference mode (ops.py)" if _reference else "fast layer (fast.py)"


def check_reference_mode(device, dtype):
    """ValueError where reference mode cannot run: a GPU or float16 (mixed precision)."""
    if _reference and (device != "cpu" or str(dtype) == "float16"):
        raise ValueError(f"reference mode (--reference-ops, NANOBERT_REFERENCE=1) runs ops.py on "
                         f"the CPU in float32 or float64, not on {device} in {dtype}: drop "
                         f"--reference-ops or use --device cpu and --dtype float32/float64")


use_reference_ops(os.environ.get("NANOBERT_REFERENCE", "0") not in ("", "0"))
