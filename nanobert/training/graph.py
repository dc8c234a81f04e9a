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
  Host state the step changes (AdamW's host step count, the dropout calls) is advanced by
  `host_update` after each replay.
- Memory. Capture allocates from a memory pool of the graph's own, kept as long as the
  graph: an array the step frees goes back to that pool, never to another array, while the
  graph still writes it (PyTorch's graph-private pools do the same). The outputs are arrays
  of that pool: each replay rewrites them, so read them before the next call.
- Streams. Everything runs on one blocking stream of this object (capture needs one that is
  not the legacy default; blocking, so work on the default stream, e.g. an evaluation, stays
  ordered with it).
- cuBLAS runs through ctypes (model/cublas.py) with a fixed workspace: CuPy's wrapper
  refuses capture.

capture=False runs device_step eagerly every time on the same fixed buffers (--no-cuda-graph):
the same arithmetic in the same order, which is what the tests compare a replay with.
"""
import collections

from nanobert.backend import PinnedStaging


class _Layout:
    """One layout's fixed input buffers and, once captured, its graph, pool and outputs."""

    def __init__(self, xp, inputs):
        self.buffers = {name: xp.empty(a.shape, a.dtype) for name, a in inputs.items()}
        self.calls = 0
        self.graph = self.pool = self.outputs = None


class StepGraph:
    """device_step replayed from a CUDA graph per input layout (see the module's doc)."""

    def __init__(self, xp, device_step, capture=True, max_graphs=4, host_update=None):
        self.xp, self.device_step, self.capture = xp, device_step, capture
        self.max_graphs, self.host_update = max_graphs, host_update
        self.stream = xp.cuda.Stream()
        self.staging = PinnedStaging(xp)
        self.layouts = collections.OrderedDict()      # layout key -> _Layout, oldest first

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
                self._capture(layout)      # its Python ran once: the host state advanced
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
        layout.pool = xp.cuda.MemoryPool()
        with xp.cuda.using_allocator(layout.pool.malloc):
            self.stream.begin_capture()
            try:
                layout.outputs = self.device_step(layout.buffers)
            finally:
                layout.graph = self.stream.end_capture()
        # the eager warm-up's arrays are free again: the graph has its own memory
        xp.get_default_memory_pool().free_all_blocks()

    @property
    def graphs(self):
        """How many layouts have a captured graph."""
        return sum(layout.graph is not None for layout in self.layouts.values())
