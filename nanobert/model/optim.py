"""AdamW in the two flavours people compare against, the original BERT learning-rate
schedule, global-norm clipping and gradient accumulation.

mode="bert":  google-research/bert's AdamWeightDecayOptimizer. No bias correction (the
              original omits it; warmup keeps the first steps small anyway), eps 1e-6,
              and the decay term is added to the Adam update: p -= lr * (m/(sqrt(v)+eps) + wd*p).
mode="torch": torch.optim.AdamW: bias-corrected moments, eps 1e-8, decoupled decay
              applied first: p *= 1 - lr*wd.
Both skip weight decay where the model's parameter table says so (decay=, params.decays:
LayerNorm's gain and shift, biases), or, for a plain dict of arrays, where the name contains
LayerNorm, layer_norm or bias (the original's rule).
lr_scale (layer_decay_scales: layer-wise rate decay, fine-tuning) multiplies a parameter's
rate: its update is the one a run at lr * scale would take (on the CPU; the GPU kernel takes
one rate and refuses scales).

On CuPy nothing here reads the device inside a step: clipping computes the global norm of
the flat gradient buffer on the device and scales by a device scalar (5-6 launches), AdamW
is one fused kernel over the flat buffers (kernels.ADAMW_BODY, whose readable twin is the
NumPy loop of AdamW.step), and LossScaler (float16) keeps its scale and its count of clean
steps on the device and skips an overflowing step inside the AdamW kernel. clip_and_step,
the update a training step takes, folds the unscale and the clip into that kernel there: two
passes over the flat gradients (the norm's, AdamW's) instead of three (four when unscaled).
"""
import functools
import math
import re

import numpy

from ..backend import array_module, to_device, to_host
from . import active, kernels, ops
from .flat import flat_buffer, flat_offsets
from .threads import in_row_blocks, run_tasks, thread_count

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


# Elements per pass on NumPy. A whole-buffer AdamW makes ~14 passes over ~440 MB (BERT-base);
# in chunks those passes run in cache (measured 0.31 s -> 0.18 s). CuPy takes one span at once.
CHUNK = 1 << 16
# Elements per partial sum of the norm: a float32 dot over 110M elements drifts by ~3e-3
# (sequential accumulation); per 1M-element chunk, added in float64, by ~3e-6.
NORM_CHUNK = 1 << 20


def layer_decay_scales(names, num_layers, decay):
    """Layer-wise rate decay (ELECTRA, Clark et al. 2020; Sun et al. 2019 fine-tune BERT so):
    name -> decay ** (num_layers + 1 - depth), where the embeddings have depth 0, encoder
    layer i depth i + 1 and the rest (pooler, task head) num_layers + 1: the top runs at the
    full rate, each layer below at `decay` times the one above it, so that fine-tuning moves
    what pretraining learnt first the least."""
    scales = {}
    for name in names:
        layer = re.search(r"(?:^|\.)encoder\.layer\.(\d+)\.", name)
        if layer:
            depth = int(layer.group(1)) + 1
        elif re.search(r"(?:^|\.)embeddings\.", name):
            depth = 0
        else:
            depth = num_layers + 1
        scales[name] = decay ** (num_layers + 1 - depth)
    return scales


def chunks(xp, n, size):
    """(start, stop) pairs covering range(n): `size` at a time on NumPy, everything on CuPy."""
    size = size if xp is numpy else max(n, 1)
    return [(start, min(start + size, n)) for start in range(0, n, size)]


def flat_arrays(grads):
    """The arrays to sweep: the one flat buffer the gradients are views of, else each."""
    buffer = flat_buffer(grads)
    return [buffer] if buffer is not None else list(grads.values())


def global_norm(grads):
    """sqrt of the sum of squares of every gradient, as one float: one sweep of the flat
    gradient buffer (BLAS dots on chunks, summed in float64 in chunk order). On NumPy the
    chunks' dots run on the thread pool, one core each (threads.py: a dot BLAS threads
    itself would leave its idle threads spinning into the AdamW sweep that follows)."""
    total = 0.0
    for g in flat_arrays(grads):
        flat = g.reshape(-1)
        xp = array_module(flat)
        spans = chunks(xp, flat.size, NORM_CHUNK)
        if xp is numpy:
            squares = numpy.zeros(len(spans))                # float64, one per chunk
            in_row_blocks(_chunk_squares, (numpy.array(spans), squares), flat,
                          uses_blas=True, rows_per_block=1)
        else:
            squares = [xp.vdot(flat[start:stop], flat[start:stop]) for start, stop in spans]
        for s in squares:
            total += float(s)
    return math.sqrt(total)


def _chunk_squares(spans, squares, flat):
    """squares[i] = the sum of squares of flat[start:stop] for each (start, stop) in spans."""
    for i, (start, stop) in enumerate(spans):
        part = flat[start:stop]
        squares[i] = numpy.vdot(part, part)                  # no g*g temporary


def clip_by_global_norm(grads, max_norm=1.0, mode="bert"):
    """Scale all gradients in place so their global norm is at most max_norm (the math:
    ops.clip_by_global_norm, which reference mode runs) -> the norm before clipping."""
    if active.reference_ops():
        return ops.clip_by_global_norm(grads, max_norm, mode)
    return clip_flat_by_global_norm(grads, max_norm, mode)


def clip_flat_by_global_norm(grads, max_norm=1.0, mode="bert"):
    """ops.clip_by_global_norm on the flat gradient buffer, one sweep:

    bert: g *= max_norm / max(norm, max_norm) (tf.clip_by_global_norm);
    torch: g *= min(1, max_norm / (norm + 1e-6)) (torch.nn.utils.clip_grad_norm_).
    Returns the norm before clipping: a float on NumPy; on CuPy, with flat gradients, a 0-d
    device array, computed and applied without the host reading it (the multiply by a scale
    of exactly 1 when not clipping costs one pass; a read would cost a host wait). A NaN or
    inf gradient makes the norm and every gradient NaN: LossScaler.update reads that as an
    overflow.
    """
    buffer = flat_buffer(grads)
    xp = array_module(buffer) if buffer is not None else numpy
    if xp is not numpy:
        # one reduction, on device: CuPy's vdot of two vectors is a multiply and CUB's sum
        # (tensordot_core's m = n = 1 path), no cuBLAS call, so a CUDA graph captures it
        norm = xp.sqrt(xp.vdot(buffer, buffer))
        buffer *= clip_factor(xp, norm, max_norm, mode).astype(buffer.dtype, copy=False)
        return norm
    norm = global_norm(grads)
    if mode == "bert":
        scale = max_norm / max(norm, max_norm)
    else:
        scale = min(1.0, max_norm / (norm + 1e-6))
    if scale < 1.0:
        with numpy.errstate(invalid="ignore"):  # an inf gradient (float16 overflow) -> NaN
            for g in flat_arrays(grads):
                g *= scale
    return norm


def clip_factor(xp, norm, max_norm, mode):
    """The device's clip factor for a 0-d device norm: max_norm / max(norm, max_norm) (bert),
    min(1, max_norm / (norm + 1e-6)) (torch); a 0-d array of the norm's dtype."""
    if mode == "bert":
        return max_norm / xp.maximum(norm, max_norm)
    return xp.minimum(max_norm / (norm + 1e-6), 1.0)


def average_gradients(loss_and_grads, micro_batches, weights=None):
    """Gradient accumulation: -> (loss, grads, outputs), the weighted sums over micro-batches
    of what loss_and_grads(batch) returns. weights default to 1/n each (HF Trainer's
    convention: one big batch when the micro-batches are equal); give rows / total rows to
    weigh a short last micro-batch less. loss_and_grads may return (loss, grads, out): the
    outs are handed back in order (outputs[i] is None when it returns two things).
    Each call's grads are consumed: scaled in place and added (one pass over the flat
    buffers when they are flat)."""
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
            for g in flat_arrays(total):
                g *= weight
        else:
            add_scaled(total, grads, weight)
    return total_loss, total, outputs


def add_scaled(total, grads, weight):
    """total += weight * grads, scaling grads in place (no temporary): one pass over the flat
    buffers when both are laid out alike, else tensor by tensor."""
    total_buffer, total_offsets = flat_offsets(total)
    grads_buffer, grads_offsets = flat_offsets(grads)
    if total_buffer is not None and total_offsets == grads_offsets:
        pairs = [(total_buffer, grads_buffer)]
    else:
        pairs = [(total[name], g) for name, g in grads.items()]
    for t, g in pairs:
        g *= weight
        t += g


# A step refuses a switch of mode (active.use_reference_ops) made after its AdamW(...): the
# model would run one layer and the update the other.
SWITCHED = ("active.use_reference_ops() switched the mode after AdamW(...) was made, which "
            "picked the update of the other: call it before AdamW(...), then make the "
            "optimiser again")


class AdamW:
    """Adam with decoupled weight decay over a flat parameter dict, updated in place.

    When the parameters are views of one flat buffer (a model's params), the moments are
    flat buffers of the same layout and a step sweeps the three buffers and the gradient
    buffer in cache-sized chunks, one run of equal weight decay at a time; for a dict of
    separate arrays (or gradients laid out otherwise) it updates tensor by tensor.
    In reference mode (active.py) AdamW(...) makes a ReferenceAdamW: ops.adamw_update, one
    parameter at a time.
    """

    def __new__(cls, *args, **kwargs):
        if cls is AdamW and active.reference_ops():
            cls = ReferenceAdamW
        return super().__new__(cls)

    def __init__(self, params, lr=1e-4, mode="bert", betas=(0.9, 0.999), eps=None,
                 weight_decay=0.01, no_decay=NO_DECAY, lr_scale=None, decay=None):
        self._hyperparameters(params, lr, mode, betas, eps, weight_decay, no_decay, lr_scale,
                              decay)
        xp = array_module(next(iter(params.values())))
        if xp is not numpy and any(s != 1.0 for s in self.lr_scale.values()):
            raise ValueError("AdamW's lr_scale (layer-wise rate decay) runs on the CPU: the GPU "
                             "kernel updates every parameter at one rate")
        self.buffer, self.offsets = flat_offsets(params)
        if any(p.dtype == numpy.float16 for p in params.values()):
            raise ValueError("AdamW refuses float16 parameters: updates below 2^-11 of a weight "
                             "would vanish and v = g^2 underflows. Train with a model of "
                             "dtype=float16, whose params are its float32 master weights")
        if self.buffer is not None:
            self.flat_m, self.flat_v = xp.zeros_like(self.buffer), xp.zeros_like(self.buffer)
            self.m = self._views(self.flat_m)                   # first moment
            self.v = self._views(self.flat_v)                   # second moment
            self.decay_runs = self._decay_runs()
            # One scratch chunk per thread: NumPy's ufuncs release the GIL, so the chunks of
            # a step are shared between threads.py's pool (the cores BLAS uses are idle here).
            self.threads = thread_count() if xp is numpy else 1
            self.scratch = [xp.empty(min(CHUNK, self.buffer.size), self.buffer.dtype)
                            for _ in range(self.threads)]
            if xp is not numpy:         # one kernel per step: which elements decay, as a mask
                decay = numpy.zeros(self.buffer.size, dtype=bool)
                for start, stop, wd, _ in self.decay_runs:
                    decay[start:stop] = wd != 0.0
                self.decay_mask = to_device(decay, xp)
        else:
            self.m = {name: xp.zeros_like(p) for name, p in params.items()}
            self.v = {name: xp.zeros_like(p) for name, p in params.items()}
        self.step_count = 0

    def _hyperparameters(self, params, lr, mode, betas, eps, weight_decay, no_decay, lr_scale,
                         decay):
        """The constructor's arguments, checked; weight decay and rate scale per parameter.
        decay: name -> whether weight decay applies (params.decays of the model's table);
        None: the original's rule, by name (no_decay's substrings)."""
        self.reference = active.reference_ops()     # the mode it was made in (step checks)
        if mode not in MODES:
            raise ValueError(f"AdamW mode must be one of {MODES}, got {mode!r}")
        self.params, self.lr, self.mode = params, lr, mode
        self.beta1, self.beta2 = betas
        self.eps = eps if eps is not None else (1e-6 if mode == "bert" else 1e-8)
        if decay is None:
            decay = {name: not any(s in name for s in no_decay) for name in params}
        missing = [name for name in params if name not in decay]
        if missing:
            raise ValueError(f"AdamW decay= has no entry for {missing[:3]}")
        self.weight_decay = {name: weight_decay if decay[name] else 0.0 for name in params}
        # name -> multiplier of the rate (1 where absent): layer-wise decay's lower layers
        self.lr_scale = {name: float((lr_scale or {}).get(name, 1.0)) for name in params}

    def _views(self, buffer):
        """name -> the view of `buffer` where that parameter sits in the parameter buffer."""
        return {name: buffer[o:o + p.size].reshape(p.shape)
                for (name, p), o in zip(self.params.items(), self.offsets.values())}

    def _decay_runs(self):
        """[(start, stop, weight decay, lr scale)]: the flat buffer cut where the weight decay
        or the rate's scale changes (a matrix is decayed, its bias and LayerNorm are not)."""
        runs = []
        for offset, name in sorted((o, name) for name, o in self.offsets.items()):
            stop = offset + self.params[name].size
            wd, scale = self.weight_decay[name], self.lr_scale[name]
            if runs and runs[-1][2:] == (wd, scale):
                runs[-1] = (runs[-1][0], stop, wd, scale)
            elif stop > offset:
                runs.append((offset, stop, wd, scale))
        return runs

    def _spans(self, grads):
        """[(p, g, m, v, weight decay, lr scale)], arrays of one shape: chunks of the flat
        buffers when the gradients share the parameters' layout (-> True), else tensor by
        tensor."""
        if self.buffer is not None:
            g_buffer, g_offsets = flat_offsets(grads)
            if g_offsets == self.offsets:
                xp = array_module(self.buffer)
                spans = []
                for run_start, run_stop, wd, scale in self.decay_runs:
                    for start, stop in chunks(xp, run_stop - run_start, CHUNK):
                        s = slice(run_start + start, run_start + stop)
                        spans.append((self.buffer[s], g_buffer[s], self.flat_m[s],
                                      self.flat_v[s], wd, scale))
                return spans, True
        return [(p, grads[name], self.m[name], self.v[name], self.weight_decay[name],
                 self.lr_scale[name]) for name, p in self.params.items()], False

    def folds(self, grads):
        """Whether a step takes the one-kernel path (CuPy, gradients laid out as the
        parameters' flat buffer), where a grad_scale costs no pass of its own."""
        return (self.buffer is not None and array_module(self.buffer) is not numpy
                and flat_offsets(grads)[1] == self.offsets)

    def step(self, grads, lr=None, skip=None, grad_scale=None):
        """One update of every parameter from `grads` (same keys), at lr (default self.lr).

        lr: a number, or on CuPy a 0-d device array (a step replayed from a CUDA graph reads
        its learning rate from the device: training/graph.py).
        skip (LossScaler.update's overflow flag, a 0-d bool array): when true, nothing is
        updated (parameters and moments keep their values); on CuPy the kernel decides, so
        the host never reads it. A skipped step still advances step_count, as it advances
        the learning-rate schedule (torch's bias correction then counts it: a small
        difference from torch's GradScaler, which does not call the optimizer).
        grad_scale: None, or a number (on CuPy a 0-d device array) each gradient is
        multiplied by as it is read, in both flavours: the update is that of grads *
        grad_scale, and `grads` is left as it is (clip_and_step hands the loss scaler's
        unscale times the clip factor here)."""
        if self.reference != active.reference_ops():
            raise RuntimeError(SWITCHED)
        lr = self.lr if lr is None else lr
        self.step_count += 1
        t = self.step_count
        if self.folds(grads):
            return self._step_kernel(flat_buffer(grads), lr, t, skip, grad_scale)
        if skip is not None and bool(skip):
            return
        spans, chunked = self._spans(grads)
        if not chunked:
            self._update(spans, None, lr, t, grad_scale)
            return
        share = -(-len(spans) // self.threads)             # contiguous shares, one per thread
        run_tasks([functools.partial(self._update, spans[i * share:(i + 1) * share],
                                     self.scratch[i], lr, t, grad_scale)
                   for i in range(self.threads)], self.threads)

    def _update(self, spans, scratch, lr, t, grad_scale=None):
        """The Adam(W) update of each span in place; `scratch` (at least a span long) holds
        the update, else a temporary per span."""
        for p, g, m, v, wd, scale in spans:
            xp = array_module(p)
            lr_p = lr * scale                               # this parameter's rate
            if grad_scale is not None:
                g = g * grad_scale                          # a temporary: grads stay as given
            update = xp.empty_like(g) if scratch is None else scratch[:g.size]
            m *= self.beta1
            xp.multiply(g, 1.0 - self.beta1, out=update)
            m += update
            v *= self.beta2
            xp.multiply(g, g, out=update)
            update *= 1.0 - self.beta2
            v += update
            if self.mode == "bert":
                xp.sqrt(v, out=update)
                update += self.eps
                xp.divide(m, update, out=update)            # m / (sqrt(v) + eps)
                if wd:
                    update += wd * p
                update *= lr_p
            else:
                if wd:
                    p *= 1.0 - lr_p * wd
                xp.sqrt(v, out=update)
                update /= math.sqrt(1.0 - self.beta2 ** t)
                update += self.eps
                xp.divide(m, update, out=update)
                update *= lr_p / (1.0 - self.beta1 ** t)
            p -= update

    def _step_kernel(self, g_buffer, lr, t, skip, grad_scale):
        """CuPy: the whole step as one fused kernel (kernels.ADAMW_BODY) over the flat
        buffers; the scalars make the one body either flavour of the NumPy loop above. With a
        device lr they are device scalars too, and "torch"'s bias corrections count the steps
        on the device (self.device_step): a replayed graph bakes in no host number. The
        kernel reads each gradient times grad_scale (1 when None)."""
        xp = array_module(self.buffer)
        wd = next((wd for _, _, wd, _ in self.decay_runs if wd), 0.0)
        on_device = isinstance(lr, xp.ndarray)
        if on_device:
            lr = lr.astype(self.buffer.dtype)
        if self.mode == "bert":
            step_size, v_divisor, decay_factor, coupled_decay = lr, 1.0, 1.0, wd
        else:
            if on_device:
                t = self._count_on_device(t)
                step_size = lr / (1.0 - xp.power(self.beta1, t))
                v_divisor = xp.sqrt(1.0 - xp.power(self.beta2, t))
            else:
                step_size = lr / (1.0 - self.beta1 ** t)
                v_divisor = math.sqrt(1.0 - self.beta2 ** t)
            decay_factor, coupled_decay = 1.0 - lr * wd, 0.0
        if grad_scale is None:
            grad_scale = 1.0
        elif isinstance(grad_scale, xp.ndarray):
            grad_scale = grad_scale.astype(self.buffer.dtype, copy=False)
        kernels.adamw_kernel(array_module(self.buffer))(
            g_buffer, grad_scale, self.decay_mask, False if skip is None else skip,
            self.beta1, 1.0 - self.beta1, self.beta2, 1.0 - self.beta2, self.eps,
            step_size, v_divisor, decay_factor, coupled_decay,
            self.buffer, self.flat_m, self.flat_v)

    def _count_on_device(self, t):
        """The step number t as a 0-d device array of the buffer's dtype, counted up in place
        (one launch; its address never changes): made from the host count the first time."""
        if getattr(self, "device_step", None) is None:
            xp = array_module(self.buffer)
            self.device_step = xp.full((), t - 1, self.buffer.dtype)
        self.device_step += 1
        return self.device_step

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
                moments[name][...] = to_device(state[key], xp, p.dtype)   # in place: views
        self.step_count = int(state["step"])
        self.device_step = None                 # counted from step_count again


class ReferenceAdamW(AdamW):
    """AdamW as its math, what reference mode runs: a loop over the parameters, each updated by
    ops.adamw_update (as llm.c's adamw_update), the moments one array per parameter. Equal to
    AdamW's flat sweep (tests/test_reference_mode.py)."""

    def __init__(self, params, lr=1e-4, mode="bert", betas=(0.9, 0.999), eps=None,
                 weight_decay=0.01, no_decay=NO_DECAY, lr_scale=None, decay=None):
        self._hyperparameters(params, lr, mode, betas, eps, weight_decay, no_decay, lr_scale,
                              decay)
        xp = array_module(next(iter(params.values())))
        self.m = {name: xp.zeros_like(p) for name, p in params.items()}   # first moment
        self.v = {name: xp.zeros_like(p) for name, p in params.items()}   # second moment
        self.buffer = None                                        # no flat buffer
        self.step_count = 0

    def step(self, grads, lr=None, skip=None):
        """One update of every parameter from grads (same keys), at lr (default self.lr);
        none when skip (a loss scaler's overflow flag) is true."""
        if self.reference != active.reference_ops():     # a switch after AdamW(...)
            raise RuntimeError(SWITCHED)
        lr = self.lr if lr is None else lr
        self.step_count += 1
        if skip is not None and bool(skip):
            return
        for name, p in self.params.items():
            ops.adamw_update(p, grads[name], self.m[name], self.v[name],
                             lr * self.lr_scale[name], self.step_count,
                             self.weight_decay[name], self.beta1, self.beta2, self.eps, self.mode)


class LossScaler:
    """Dynamic loss scaling for float16 training, NVIDIA's BERT recipe: the backward starts
    from `scale` (2^16 at first) so that small float16 gradients do not flush to zero; the
    gradients are divided by it before clipping; a step whose gradients overflowed (inf or
    NaN) is skipped and the scale halved; after `growth_interval` (2,000) clean steps in a
    row the scale doubles.

    The scale and the clean-step count live on the device (0-d float32 / int32 arrays) and
    the skip happens inside the AdamW kernel: nothing is read back inside a step.

        scaler = LossScaler(model.xp)
        loss, grads = model.loss_and_grads(batch, loss_scale=scaler.scale, on_device=True)
        scaler.unscale(grads)                           # grads /= scale
        norm = clip_by_global_norm(grads, 1.0)
        found_inf = scaler.update(norm)                 # overflow? halve : count, maybe double
        optimizer.step(grads, lr=lr, skip=found_inf)    # skipped on overflow

    (clip_and_step(optimizer, grads, lr, scaler) is those four lines; on the GPU it folds the
    unscale and the clip into the AdamW kernel.) The scale stays a power of two (the factors
    and every scale loaded are refused otherwise): dividing by it is then exact, which is
    what lets the folded update equal these lines bit for bit.
    """

    def __init__(self, xp, init_scale=2.0 ** 16, growth_interval=2000, backoff_factor=0.5,
                 growth_factor=2.0):
        for name, value in (("init_scale", init_scale), ("backoff_factor", backoff_factor),
                            ("growth_factor", growth_factor)):
            power_of_two(value, f"LossScaler's {name}")
        self.xp = xp
        self.scale = xp.asarray(numpy.float32(init_scale))           # 0-d, on the device
        self.clean_steps = xp.asarray(numpy.int32(0))
        self.growth_interval = growth_interval
        self.backoff_factor, self.growth_factor = backoff_factor, growth_factor

    def inverse(self):
        """1 / scale, a 0-d float32 array on the device (exact: the scale is a power of 2)."""
        return (1.0 / self.scale).astype(numpy.float32)

    def unscale(self, grads):
        """grads /= scale, in place: one pass over the flat buffer (or each tensor)."""
        inverse = self.inverse()
        for g in flat_arrays(grads):
            g *= inverse.astype(g.dtype, copy=False)

    def update(self, norm):
        """After clipping, from the (unscaled) global norm: -> found_inf, a 0-d bool array
        (true when a gradient overflowed: the norm is inf or NaN) to hand to AdamW.step."""
        xp = self.xp
        found_inf = xp.logical_not(xp.isfinite(xp.asarray(norm)))
        clean = xp.where(found_inf, 0, self.clean_steps + 1).astype(numpy.int32)
        grow = clean >= self.growth_interval
        scale = xp.where(grow, self.scale * self.growth_factor, self.scale)
        # in place: a step replayed from a CUDA graph reads the scale where it was captured
        self.scale[...] = xp.where(found_inf, self.scale * self.backoff_factor, scale)
        self.clean_steps[...] = xp.where(grow, 0, clean)
        return found_inf

    def state_dict(self):
        """Host values (a device read: at checkpoint time only), for trainer_state.json."""
        return {"loss_scale": float(self.scale), "clean_steps": int(self.clean_steps)}

    def load_state_dict(self, state):
        power_of_two(state["loss_scale"], "the loss scale loaded")
        self.scale[...] = numpy.float32(state["loss_scale"])        # in place (see update)
        self.clean_steps[...] = numpy.int32(state["clean_steps"])


def power_of_two(value, what):
    """ValueError unless value is a positive power of two (2^k for an integer k)."""
    if not (value > 0 and math.isfinite(value) and math.frexp(value)[0] == 0.5):
        raise ValueError(f"{what} must be a power of two (dividing by it is then exact), "
                         f"got {value!r}")


def clip_and_step(optimizer, grads, lr=None, scaler=None, max_norm=1.0, mode="bert",
                  check=None):
    """The update after the backward: unscale the gradients (float16: by the loss scaler),
    clip their global norm to max_norm (clip_by_global_norm's `mode`), let the scaler see an
    overflow (the step is then skipped) and take optimizer's AdamW step at lr.
    -> the global norm of the unscaled gradients before clipping (on CuPy a 0-d array).

    On the GPU's flat buffers (optimizer.folds) in two passes over the gradients instead of
    four (unscale, the norm, the clip, AdamW; three without a scaler): the norm of the
    gradients as the backward left them, divided by the scale S, then AdamW reading each
    gradient times one device scalar, (1/S) * clip. S is a power of two, so this is the
    unscale-first sequence bit for bit: sum((g/S)^2) = sum(g^2) / S^2 and sqrt of that =
    sqrt(sum(g^2)) / S (each partial sum scaled by an exact power of two), and g * ((1/S) *
    clip) rounds once, as (g/S) * clip did, barring subnormals (an unscaled square or
    product below 2^-126: a float16 backward's gradients are 0 or at least 2^-24 in
    magnitude, so none for S <= 2^39 before accumulation weights) and a sum of squares above
    float32's range before the division (read as an overflow: the step is skipped and S
    halved). The gradient buffer is left as the backward wrote it: scaled, not clipped.
    Elsewhere (NumPy, gradients laid out otherwise) the four steps run as written below, and
    check(norm) (if given: a guard that stops the run) sees the host norm before the step."""
    if not optimizer.folds(grads):
        if scaler:
            scaler.unscale(grads)
        norm = clip_by_global_norm(grads, max_norm, mode=mode)
        if check is not None:
            check(norm)
        optimizer.step(grads, lr=lr, skip=scaler.update(norm) if scaler else None)
        return norm
    buffer = flat_buffer(grads)
    xp = array_module(buffer)
    norm = xp.sqrt(xp.vdot(buffer, buffer))              # the norm of what the backward wrote
    inverse = scaler.inverse().astype(norm.dtype, copy=False) if scaler else None
    if scaler:
        norm *= inverse                                   # exact: 1/S is a power of two
    clip = clip_factor(xp, norm, max_norm, mode)
    optimizer.step(grads, lr=lr, skip=scaler.update(norm) if scaler else None,
                   grad_scale=clip if inverse is None else inverse * clip)
    return norm
