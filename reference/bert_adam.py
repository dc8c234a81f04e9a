"""The original BERT optimizer, rewritten in a few lines of torch.

google-research/bert trains with `AdamWeightDecayOptimizer` (optimization.py), which is not
torch's AdamW:

- no bias correction of m and v (so early steps are smaller than Adam's), eps = 1e-6 added
  to sqrt(v) rather than to a bias-corrected sqrt(v_hat);
- the decay term wd * p is added to the Adam direction and scaled by the learning rate,
  but never enters m or v ("decoupled" decay);
- no decay for LayerNorm parameters and biases, chosen by name;
- gradients are first clipped by their global norm the TensorFlow way;
- the learning rate warms up linearly from 0 and then decays linearly to 0.

This module is a reference for nanobert.model.optim and is used by reference/pretraining.py to
write the optimizer part of tests/fixtures/pretraining_float64.npz.
"""

import math

import torch

NO_DECAY_NAME_PARTS = ("LayerNorm", "layer_norm", "bias")


def uses_weight_decay(name):
    """True when the original excludes nothing in `name` from weight decay."""
    return not any(part in name for part in NO_DECAY_NAME_PARTS)


def bert_learning_rate(step, peak_lr, warmup_steps, num_train_steps):
    """Learning rate for the update that follows `step` earlier updates (step 0 gets lr 0).

    Warmup: peak * step / warmup. After it: polynomial_decay with power 1 and end 0,
    i.e. peak * (1 - step / num_train_steps), floored at 0 (TF clamps step to the end).
    """
    if step < warmup_steps:
        return peak_lr * (step / warmup_steps)
    return peak_lr * (1.0 - min(step, num_train_steps) / num_train_steps)


@torch.no_grad()
def clip_by_global_norm(grads, clip_norm):
    """Scale `grads` in place by clip_norm / max(global_norm, clip_norm); return global_norm.

    Unlike torch.nn.utils.clip_grad_norm_ there is no 1e-6 in the denominator, and a norm
    below clip_norm leaves the gradients exactly as they were.
    """
    global_norm = math.sqrt(sum(float(torch.sum(g * g)) for g in grads))
    scale = clip_norm / max(global_norm, clip_norm)
    for g in grads:
        g.mul_(scale)
    return global_norm


class AdamWeightDecay:
    """AdamWeightDecayOptimizer from the original BERT, for a list of (name, parameter)."""

    def __init__(self, named_params, weight_decay=0.01, beta1=0.9, beta2=0.999, eps=1e-6):
        self.named_params = list(named_params)
        self.weight_decay = weight_decay
        self.beta1, self.beta2, self.eps = beta1, beta2, eps
        self.m = [torch.zeros_like(p) for _, p in self.named_params]
        self.v = [torch.zeros_like(p) for _, p in self.named_params]

    @torch.no_grad()
    def step(self, lr):
        for (name, p), m, v in zip(self.named_params, self.m, self.v):
            g = p.grad
            m.mul_(self.beta1).add_((1.0 - self.beta1) * g)
            v.mul_(self.beta2).add_((1.0 - self.beta2) * g * g)
            # No bias correction: this is what the released checkpoints were trained with.
            update = m / (torch.sqrt(v) + self.eps)
            if uses_weight_decay(name):
                update = update + self.weight_decay * p
            p.sub_(lr * update)
