"""One optimizer update on the flat gradient buffer, the micro-batches already summed into it
(model.optim.average_gradients): allreduce over the ranks -> guard -> unscale (float16) ->
clip -> AdamW (model.optim.clip_and_step; on the GPU the unscale and the clip are folded
into the AdamW kernel, the gradient buffer left scaled and unclipped). On the GPU nothing is
read back here: the norm stays on the device (the loss scaler reads an overflow from it
inside the AdamW kernel), and the recipe reads its losses once per log line."""
import numpy

from nanobert.distributed import allreduce_grads
from nanobert.model.optim import clip_and_step

from .guards import check_loss, check_norm


def update(group, model, optimizer, scaler, grads, lr, step, max_grad_norm=1.0, mode="bert",
           loss=None, keep=None):
    """Sum `grads` over the ranks, unscale them (float16: an overflow skips the step), clip
    their global norm to max_grad_norm and take the AdamW step at `lr`. `step` (1-based) and
    `loss` (the whole batch's, a host float; None: not read here) are for the guards, which
    stop the run on a non-finite loss or (on the CPU, without a loss scaler) gradient norm;
    keep=(path, arrays) saves the batch of a non-finite loss."""
    allreduce_grads(group, grads)
    if loss is not None:
        check_loss(loss, step, model, keep)
    # the CPU's norm guard, before the step (a float16 overflow is the loss scaler's to skip)
    check = None if scaler or model.xp is not numpy else \
        (lambda norm: check_norm(norm, step, grads))
    clip_and_step(optimizer, grads, lr, scaler, max_grad_norm, mode, check)
