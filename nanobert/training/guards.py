"""Non-finite numbers stop a run at once, naming the 1-based step (the step just taken, as
the log lines count) and the first bad tensor, before anything is saved: a diverged run
never replaces a good checkpoint."""
import math

import numpy

from nanobert.formats.checkpoint import first_non_finite

ADVICE = "Lower --lr or use --dtype float64 to investigate."


def check_loss(loss, step, model, keep=None):
    """A non-finite loss stops the run naming the step and the first non-finite weight;
    keep=(path, arrays) saves the batch there for a look."""
    if math.isfinite(loss):
        return
    if keep is not None:
        numpy.savez(keep[0], **keep[1])
    bad = first_non_finite(model.params)
    raise SystemExit(f"error: loss is {loss} at step {step}"
                     + (f" (first non-finite weight: {bad})" if bad else "")
                     + (f"; the batch is in {keep[0]}" if keep is not None else "")
                     + f"; nothing was saved at this step. {ADVICE}")


def check_norm(norm, step, grads):
    """A non-finite gradient norm (a host float) stops the run naming the first bad gradient."""
    if not math.isfinite(norm):
        raise SystemExit(f"error: the gradient norm is {norm} at step {step} (first non-finite "
                         f"gradient: {first_non_finite(grads)}); nothing was saved at this "
                         f"step. {ADVICE}")


def check_weights(model, step):
    """Before a model is scored or saved: every weight finite (every rank: same weights)."""
    bad = first_non_finite(model.params)
    if bad is not None:
        raise SystemExit(f"error: the weights are not finite after step {step} (first: {bad}); "
                         f"nothing was saved at this step. {ADVICE}")
