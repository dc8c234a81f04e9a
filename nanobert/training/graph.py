"""A training step on the GPU replayed as one CUDA graph, so that the host issues a step in
one call instead of ~700 kernel launches at ~15 us each (measured on an H100: BERT-base
B=32 spent 18-30 ms of host time a step, the GPU 17-24 ms; 100 launches replayed from a
graph took 0.03 us of host each, bench.gpu_host --graph).

    step = StepGraph(xp, device_step)      # device_step(buffers) -> outputs (device arrays)
    outputs = step(host_arrays)            # each call: host_arrays copied into fixed buffers

How it works, and what a step captured this way must respect:
- Layouts. Each distinct layout of the inputs (their names, shapes and dtypes) gets fixed
  device buffers. Its first call runs device_step eagerly on them (that compiles the CUDA
  kernels and plans the cuBLAS calls, which must not happen during capture); its second
  call captures device_step into a graph, then launches it; later calls only copy the
  inputs (pinned memory, asynchronously: backend.PinnedStaging) and launch. At most
  `max_graphs` layouts are kept (the least recently used goes, with its memory).
- Nothing the step reads may come from the host: a graph replays the launches with the
  arguments it captured. Everything that varies per step is an input (the batch, the
  learning rate, the losses' denominators) or lives on the device and is updated in place
  (AdamW's moments and step count, the loss scale, the dropout generator's step counter:
  model/counter_rng.py draws inside the kernels from (seed, device step, call, element)).
  Host state the step changes (AdamW's host step count; the dropout draws' call index starts
  at 0 each step anyway) is advanced by `host_update` after each replay.
- Memory. Capture allocates from a memory pool of the graph's own, kept as long as the
  graph: an array the step frees goes back to that pool, never to another array, while the
  graph still writes it (PyTorch's graph-private pools do the same). CuPy's cached blocks
  (the warm-up's) go back to the GPU first, so a capture needs the step's memory once. The
  outputs are arrays of that pool: each replay rewrites them, so read them before the next
  call. memory_pools(xp) lists every pool the GPU path holds memory in (CuPy's default pool
  and each live graph's): what a figure of nanobert's memory must add up.
- Streams. Everything runs on one blocking stream of this object (capture needs one that is
  not the legacy default; blocking, so work on the default stream, e.g. an evaluation, stays
  ordered with it).
- cuBLAS runs through ctypes (model/cublas.py) with a fixed workspace: CuPy's wrapper
  refuses capture.

capture=False runs device_step eagerly every time on the same fixed buffers (--no-cuda-graph):
the same arithmetic in the same order, which is what the tests compare a replay with. A step
that cannot be captured (CUDA refuses something in it) is said in one line and runs eagerly
from then on, its host state (host_state: AdamW's step count) put back first. `mode` says
how the steps ran ("graph", "eager", or "capture failed: <reason>"), for a benchmark to
report instead of timing an eager step under a graph's name.
"""
import collections
import weakref

import numpy

from nanobert.backend import PinnedStaging
from nanobert.model.optim import average_gradients

from .step import update

_GRAPHS = weakref.WeakSet()        # every live StepGraph: their pools hold device memory


def memory_pools(xp):
    """Every memory pool the GPU path holds memory in: CuPy's default pool, then the private
    pool of each layout captured by a live StepGraph."""
    return [xp.get_default_memory_pool()] + [
        layout.pool for graph in list(_GRAPHS) if graph.xp is xp
        for layout in graph.layouts.values() if layout.pool is not None]


class _Layout:
    """One layout's fixed input buffers and, once captured, its graph, pool and outputs."""

    def __init__(self, xp, inputs):
        self.buffers = {name: xp.empty(a.shape, a.dtype) for name, a in inputs.items()}
        self.calls = 0
        self.graph = self.pool = self.outputs = None


class StepGraph:
    """device_step replayed from a CUDA graph per input layout (see the module's doc)."""

    def __init__(self, xp, device_step, capture=True, max_graphs=4, host_update=None,
                 host_state=None):
        self.xp, self.device_step, self.capture = xp, device_step, capture
        self.max_graphs, self.host_update, self.host_state = max_graphs, host_update, host_state
        self.stream = xp.cuda.Stream()
        self.staging = PinnedStaging(xp)
        self.layouts = collections.OrderedDict()      # layout key -> _Layout, oldest first
        self.failure = None                           # why a capture failed, if one did
        _GRAPHS.add(self)

    def __call__(self, inputs):
        """inputs: name -> host (NumPy) array. -> device_step's outputs for them."""
        key = tuple((name, a.shape, a.dtype.str) for name, a in inputs.items())
        layout = self.layouts.get(key)
        if layout is None:
            layout = self._new_layout(key, inputs)
        self.layouts.move_to_end(key)
        with self.stream:
            for name, a in inputs.items():          # one staging slot a step
                self.staging.put(a, inputs, out=layout.buffers[name])
            layout.calls += 1
            if not self.capture or layout.calls == 1:
                return self.device_step(layout.buffers)   # eager (the first: a warm-up)
            if layout.graph is None:
                try:
                    self._capture(layout)  # its Python ran once: the host state advanced
                except Exception as error:
                    return self._give_up(layout, error)
            elif self.host_update is not None:
                self.host_update()
            layout.graph.launch(self.stream)
        return layout.outputs

    def _new_layout(self, key, inputs):
        if len(self.layouts) >= self.max_graphs:
            _, oldest = self.layouts.popitem(last=False)
            if oldest.pool is not None:
                oldest.pool.free_all_blocks()
        layout = self.layouts[key] = _Layout(self.xp, inputs)
        return layout

    def _capture(self, layout):
        """device_step captured into layout.graph (not run: the caller launches it), its
        arrays from a pool of the graph's own."""
        xp = self.xp
        saved = self.host_state[0]() if self.host_state else None
        # the warm-up's arrays, cached by CuPy's pool, go back to the GPU first: the graph's
        # pool takes the step's memory once more, not beside them
        xp.get_default_memory_pool().free_all_blocks()
        layout.pool = xp.cuda.MemoryPool()
        with xp.cuda.using_allocator(layout.pool.malloc):
            self.stream.begin_capture()
            try:
                layout.outputs = self.device_step(layout.buffers)
            except BaseException:
                self._end_failed_capture(saved)
                raise
            try:
                layout.graph = self.stream.end_capture()
            except BaseException:
                if self.host_state:
                    self.host_state[1](saved)
                raise

    def _end_failed_capture(self, saved):
        """The capture's end after device_step raised (CUDA may refuse to end it: the capture
        is invalid either way), and the host state as it was before."""
        try:
            self.stream.end_capture()
        except Exception:
            pass
        if self.host_state:
            self.host_state[1](saved)

    def _give_up(self, layout, error):
        """A step that cannot be captured runs eagerly from now on, said once: the training
        goes on at the eager step's speed."""
        self.failure = f"{type(error).__name__}: {str(error)[:200]}"
        print(f"note: the CUDA graph capture of the training step failed ({self.failure}); "
              f"every step runs eagerly from here (--no-cuda-graph skips the attempt)",
              flush=True)
        self.capture = False
        layout.pool = None
        return self.device_step(layout.buffers)

    @property
    def graphs(self):
        """How many layouts have a captured graph."""
        return sum(layout.graph is not None for layout in self.layouts.values())

    @property
    def mode(self):
        """How the steps so far ran: "graph" (a layout's graph replayed), "eager" (capture
        off, or no layout called twice yet), or "capture failed: <reason>"."""
        if self.failure:
            return f"capture failed: {self.failure}"
        return "graph" if self.graphs else "eager"


class GPUTrainStep:
    """The harness's training step on the GPU, replayed from a CUDA graph (StepGraph) unless
    cuda_graph is False: forward and backward of each micro-batch (the model's
    loss_and_grads_checked), their gradients summed with weights, then step.update (sum over
    ranks, unscale, clip, loss scaler, AdamW). Inputs of the graph: every array of the
    micro-batches' check_batch dicts (or those named by `keys`), their weights, the learning
    rate and the losses' denominators. The dicts' other entries (a problem type, a number of
    choices, a count only reported) are read as they were when the graph was captured: they
    must be fixed for a batch shape.

        step = GPUTrainStep(model, group, optimizer, scaler, outputs=("mlm_loss",))
        loss, outputs = step(hosts, lr, weights=[0.5, 0.5], denominators=None)

    -> the weighted loss and, per micro-batch, the `outputs` entries of loss_and_grads'
    outputs dict (0-d device arrays, rewritten by the next call: read them before)."""

    def __init__(self, model, group, optimizer, scaler, mode="bert", max_grad_norm=1.0,
                 cuda_graph=True, keys=None, outputs=()):
        self.model, self.group, self.optimizer, self.scaler = model, group, optimizer, scaler
        self.mode, self.max_grad_norm, self.keys, self.outputs = mode, max_grad_norm, keys, outputs
        self.hosts = None                  # this call's dicts: their entries that are not inputs
        # NCCL inside a capture is not built: several ranks run the same step eagerly
        self.graph = StepGraph(model.xp, self.device_step,
                               capture=cuda_graph and group.world_size == 1,
                               host_update=self.host_update,
                               host_state=(self.step_count, self.set_step_count))

    def __call__(self, hosts, lr, weights=None, denominators=None):
        weights = [1.0 / len(hosts)] * len(hosts) if weights is None else weights
        inputs = {"lr": numpy.float64(lr)}
        for m, (host, weight) in enumerate(zip(hosts, weights, strict=True)):
            inputs[f"weight/{m}"] = numpy.asarray(weight, self.model.master_dtype)
            inputs.update({f"{m}/{k}": v for k, v in host.items() if self._is_input(k, v)})
        for name, count in (denominators or {}).items():
            inputs[f"denominator/{name}"] = numpy.int64(count)
        self.hosts = hosts
        return self.graph(inputs)

    def _is_input(self, key, value):
        return isinstance(value, numpy.ndarray) and (self.keys is None or key in self.keys)

    def device_step(self, buffers):
        """The step on the fixed device buffers -> (loss, [outputs of each micro-batch])."""
        model = self.model
        model.rng.begin_step()                       # new dropout masks, drawn in the kernels
        micro = [{k: buffers.get(f"{m}/{k}", v) for k, v in host.items()
                  if not isinstance(v, numpy.ndarray) or self._is_input(k, v)}
                 for m, host in enumerate(self.hosts)]
        denominators = {key.split("/", 1)[1]: value for key, value in buffers.items()
                        if key.startswith("denominator/")} or None

        def loss_and_grads(host):
            return model.loss_and_grads_checked(
                host, return_outputs=True, denominators=denominators, on_device=True,
                loss_scale=self.scaler.scale if self.scaler else None)
        weights = [buffers[f"weight/{m}"] for m in range(len(micro))]
        loss, grads, outputs = average_gradients(loss_and_grads, micro, weights)
        update(self.group, model, self.optimizer, self.scaler, grads, buffers["lr"], None,
               self.max_grad_norm, self.mode)
        return loss, [{k: out[k] for k in self.outputs} for out in outputs]

    def host_update(self):
        """What device_step's Python does to the host's state, for a replay that skips it."""
        self.optimizer.step_count += 1

    def step_count(self):
        return self.optimizer.step_count

    def set_step_count(self, count):
        self.optimizer.step_count = count
