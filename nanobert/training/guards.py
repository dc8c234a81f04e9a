"""Non-finite numbers stop a run at once, naming the 1-based step (the step just taken, as
the log lines count) and the first bad tensor, before anything is saved: a diverged run
never replaces a good checkpoint. A batch too large for the memory is one line too."""
import contextlib
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


@contextlib.contextmanager
def batch_fits(shape, batch_size, grad_accum, device):
    """Around a step on a micro-batch of `shape` [B, T]: running out of memory (CuPy's
    OutOfMemoryError on the GPU, NumPy's MemoryError on the CPU; both are MemoryErrors)
    stops the run with one line naming the batch, its shape and the memory it needed."""
    try:
        yield
    except MemoryError as e:
        raise SystemExit(out_of_memory(e, shape, batch_size, grad_accum, device)) from None


def out_of_memory(error, shape, batch_size, grad_accum, device):
    """The line for `error`, from what it says: CuPy's the size it failed to allocate and
    what was allocated before (_size, _total), NumPy's the array's size (_total_size)."""
    size = getattr(error, "_size", None) or getattr(error, "_total_size", None)
    held = getattr(error, "_total", None)
    batch = f"--batch-size {batch_size}" + (f" in {grad_accum} micro-batches" if grad_accum > 1
                                            else "")
    where = "the GPU's" if device == "gpu" else "host"
    if size is None:
        needed = f"({type(error).__name__}: {error})"
    elif held and held > 0:
        needed = (f"it needs more than {gib(held + size)}: {gib(size)} more failed with "
                  f"{gib(held)} in use")
    else:
        needed = f"allocating {gib(size)} failed"
    return (f"error: a batch does not fit in {where} memory: {batch}, input_ids "
            f"{list(shape)} per step; {needed}. Lower --batch-size or --max-seq-length, or "
            f"raise --grad-accum")


def gib(nbytes):
    return f"{nbytes / 2 ** 30:.2f} GiB"
