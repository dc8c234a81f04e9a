"""AdamW in the two flavours people compare against, the original BERT learning-rate
schedule, global-norm clipping and gradient accumulation.

mode="bert":  google-research/bert's AdamWeightDecayOptimizer. No bias correction (the
              original omits it; warmup keeps the first steps small anyway), eps 1e-6,
              and the decay term is added to the Adam update: p -= lr * (m/(sqrt(v)+eps) + wd*p).
mode="torch": torch.optim.AdamW: bias-corrected moments, eps 1e-8, decoupled decay
              applied first: p *= 1 - lr*wd.
Both skip weight decay for parameters whose name contains LayerNorm, layer_norm or bias.
"""
import math

import numpy

from ..backend import array_module, to_device, to_host

NO_DECAY = ("LayerNorm", "layer_norm", "bias")
MODES = ("bert", "torch")


def learning_rate(step, peak_lr, warmup_steps, num_train_steps):
    """The original schedule, `step` = updates done so far (so the first update has lr 0
    when warming up): linear warmup to peak_lr, then peak_lr * (1 - step / num_train_steps)
    (the decay is measured from step 0, not from the end of warmup, as in the original)."""
    if step < warmup_steps:
        return peak_lr * step / warmup_steps
    return peak_lr * max(0.0, 1.0 - step / num_train_steps)


def warmup_steps(warmup, num_train_steps):
    """A --warmup flag as a step count: a fraction of the schedule (< 1) or a count."""
    return int(warmup * num_train_steps) if warmup < 1 else int(warmup)


def global_norm(grads):
    """sqrt of the sum of squares of every gradient, as one float."""
    total = 0.0
    for g in grads.values():
        flat = g.reshape(-1)
        total += float(array_module(g).vdot(flat, flat))    # BLAS dot: no g*g temporary
    return math.sqrt(total)


def clip_by_global_norm(grads, max_norm=1.0, mode="bert"):
    """Scale all gradients in place so their global norm is at most max_norm.

    bert: g *= max_norm / max(norm, max_norm) (tf.clip_by_global_norm);
    torch: g *= min(1, max_norm / (norm + 1e-6)) (torch.nn.utils.clip_grad_norm_).
    Returns the norm before clipping.
    """
    norm = global_norm(grads)
    if mode == "bert":
        scale = max_norm / max(norm, max_norm)
    else:
        scale = min(1.0, max_norm / (norm + 1e-6))
    if scale < 1.0:
        for g in grads.values():
            g *= scale
    return norm


def average_gradients(loss_and_grads, micro_batches, weights=None):
    """Gradient accumulation: -> (loss, grads, outputs), the weighted sums over micro-batches
    of what loss_and_grads(batch) returns. weights default to 1/n each (HF Trainer's
    convention: one big batch when the micro-batches are equal); give rows / total rows to
    weigh a short last micro-batch less. loss_and_grads may return (loss, grads, out): the
    outs are handed back in order (outputs[i] is None when it returns two things)."""
    if not micro_batches:
        raise ValueError("average_gradients needs at least one micro-batch")
    n = len(micro_batches)
    weights = [1.0 / n] * n if weights is None else weights
    total_loss, total, outputs = 0.0, None, []
    for batch, weight in zip(micro_batches, weights, strict=True):
        loss, grads, *out = loss_and_grads(batch)
        outputs.append(out[0] if out else None)
        total_loss += weight * loss
        if total is None:
            total = grads
            for g in total.values():
                g *= weight
        else:
            for name, g in grads.items():
                total[name] += weight * g
    return total_loss, total, outputs


class AdamW:
    """Adam with decoupled weight decay over a flat parameter dict, updated in place."""

    def __init__(self, params, lr=1e-4, mode="bert", betas=(0.9, 0.999), eps=None,
                 weight_decay=0.01, no_decay=NO_DECAY):
        if mode not in MODES:
            raise ValueError(f"AdamW mode must be one of {MODES}, got {mode!r}")
        self.params, self.lr, self.mode = params, lr, mode
        self.beta1, self.beta2 = betas
        self.eps = eps if eps is not None else (1e-6 if mode == "bert" else 1e-8)
        self.weight_decay = {name: (0.0 if any(s in name for s in no_decay) else weight_decay)
                             for name in params}
        xp = array_module(next(iter(params.values())))
        self.m = {name: xp.zeros_like(p) for name, p in params.items()}   # first moment
        self.v = {name: xp.zeros_like(p) for name, p in params.items()}   # second moment
        self.step_count = 0

    def step(self, grads, lr=None):
        """One update of every parameter from `grads` (same keys), at lr (default self.lr)."""
        lr = self.lr if lr is None else lr
        self.step_count += 1
        t = self.step_count
        for name, p in self.params.items():
            g, m, v, wd = grads[name], self.m[name], self.v[name], self.weight_decay[name]
            m *= self.beta1
            m += (1.0 - self.beta1) * g
            v *= self.beta2
            update = g * g                                  # one scratch buffer per tensor
            update *= 1.0 - self.beta2
            v += update
            xp = array_module(v)
            if self.mode == "bert":
                xp.sqrt(v, out=update)
                update += self.eps
                xp.divide(m, update, out=update)            # m / (sqrt(v) + eps)
                if wd:
                    update += wd * p
                update *= lr
            else:
                if wd:
                    p *= 1.0 - lr * wd
                xp.sqrt(v, out=update)
                update /= math.sqrt(1.0 - self.beta2 ** t)
                update += self.eps
                xp.divide(m, update, out=update)
                update *= lr / (1.0 - self.beta1 ** t)
            p -= update

    def state_dict(self):
        """Host arrays + step count, for checkpoints (keys m/<name>, v/<name>)."""
        state = {"step": numpy.asarray(self.step_count)}
        for name in self.params:
            state["m/" + name] = to_host(self.m[name])
            state["v/" + name] = to_host(self.v[name])
        return state

    def load_state_dict(self, state):
        missing = [k for n in self.params for k in ("m/" + n, "v/" + n) if k not in state]
        if missing or "step" not in state:
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise ValueError(f"optimizer state does not fit the model: "
                             f"missing {missing[:5] or ['step']}{more}")
        xp = array_module(next(iter(self.params.values())))
        for name, p in self.params.items():
            for moments, key in ((self.m, "m/" + name), (self.v, "v/" + name)):
                if tuple(state[key].shape) != tuple(p.shape):
                    raise ValueError(f"optimizer state {key} has shape {tuple(state[key].shape)}, "
                                     f"parameter has {tuple(p.shape)}")
                moments[name] = to_device(state[key], xp, p.dtype)
        self.step_count = int(state["step"])
