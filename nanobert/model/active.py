"""The one switch between the two layers of ops: which one the model runs.

bert.py, pretraining.py and heads.py call every op as `active.<name>` (active.linear_forward,
active.self_attention_backward, ...). Those names are bound here, either to ops.py's functions
(reference mode: the math a learner reads is what runs; no packing, no thread pool, and
AdamW and clipping as the update's math, optim.py) or to fast.py's (the same contract, made
fast: in place, threaded, packed, CUDA). Both layers are proven equal, op by op
(tests/test_fast.py) and as a whole training run (tests/test_reference_mode.py), as llm.c
proves train_gpt2.cu equal to train_gpt2.c.

    from nanobert.model import active
    active.use_reference_ops()          # = train.py / finetune.py --reference-ops,
                                       #   or NANOBERT_REFERENCE=1 in the environment

Switch before building a model: reference mode runs on the CPU in float32 or float64 (ops.py
has no mixed-precision case and the GPU's step is the fast layer's CUDA graph).
"""
import os

from . import fast, ops

# The ops the model calls, each with the same signature and cache in both layers.
OPS = ("embedding_forward", "embedding_backward", "linear_forward", "linear_backward",
       "layernorm_forward", "layernorm_backward", "tanh_forward", "tanh_backward",
       "dropout_forward", "dropout_backward", "linear_gelu_forward", "linear_gelu_backward",
       "dropout_add_layernorm_forward", "dropout_add_layernorm_backward",
       "attention_mask_bias", "self_attention_forward", "self_attention_backward",
       "cross_entropy_forward", "cross_entropy_backward", "mse_forward", "mse_backward",
       "bce_with_logits_forward", "bce_with_logits_backward")

_reference = False


def use_reference_ops(on=True):
    """From now on the model runs ops.py's functions (on=True) or the fast layer's (False)."""
    global _reference
    _reference = bool(on)
    globals().update({name: getattr(ops if on else fast, name) for name in OPS})


def reference_ops():
    """Whether the model runs ops.py (reference mode)."""
    return _reference


def check_reference_mode(device, dtype):
    """ValueError where reference mode cannot run: a GPU or float16 (mixed precision)."""
    if _reference and (device != "cpu" or str(dtype) == "float16"):
        raise ValueError(f"reference mode (--reference-ops, NANOBERT_REFERENCE=1) runs ops.py on "
                         f"the CPU in float32 or float64, not on {device} in {dtype}: drop "
                         f"--reference-ops or use --device cpu and --dtype float32/float64")


use_reference_ops(os.environ.get("NANOBERT_REFERENCE", "0") not in ("", "0"))
