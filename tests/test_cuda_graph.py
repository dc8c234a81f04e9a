"""A training step captured as a CUDA graph and replayed (nanobert/training/graph.py), proven on
the CPU stand-in of CuPy, which records a capture's operations and replays them from memory
with the host values the capture saw (tests/cupy_standin.py, 'CUDA graphs'): a replayed step
that read a host value which changed since (a Python learning rate, a host draw, a count)
diverges from the eager one. So N replayed steps are compared with N eager steps on the same
fixed buffers, with everything that varies varying: the batch, the learning rate, dropout,
the loss scale (a float16 overflow skips a step), clipping, micro-batches, a resume."""
import types

import numpy
import pytest

import cupy_standin
from nanobert import backend
from nanobert.data.tasks import Features
from nanobert.model import fast_gpu
from nanobert.model.config import BertConfig, with_labels
from nanobert.model.heads import (TASK_HEADS, BertForMultipleChoice,
                                  BertForQuestionAnswering, BertForTokenClassification)
from nanobert.model.optim import AdamW, LossScaler, learning_rate
from nanobert.model.pretraining import BertForPreTraining
from nanobert.training import tasks
from nanobert.training.graph import GPUTrainStep, StepGraph
from nanobert.training.pretraining import GPUStep
from test_cupy_standin import TINY, pretraining_batch


@pytest.fixture
def cupy():
    with cupy_standin.installed() as module:
        module.counts.reset()
        yield module

# ------------------------------------------------------------- the stand-in's capture


def test_a_capture_runs_nothing_and_a_replay_recomputes_from_memory(cupy):
    """Capture leaves existing memory as it was; each replay reads its inputs as they are
    then (an input written between replays is seen), through ufuncs, a RawModule kernel's
    emulation and cuBLAS called through ctypes."""
    x = cupy.arange(12, dtype=numpy.float32).reshape(3, 4)
    w = cupy.ones((4, 4), numpy.float32)
    out = cupy.zeros((3, 4), numpy.float32)
    stream = cupy.cuda.Stream()
    with stream, cupy.cuda.using_allocator(cupy.cuda.MemoryPool().malloc):
        stream.begin_capture()
        fast_gpu.gemm(x, w, out)                      # ctypes cuBLAS: out = x @ w
        cupy.multiply(out, 2.0, out=out)
        graph = stream.end_capture()
    assert (out.get() == 0).all() and (x.get() == numpy.arange(12).reshape(3, 4)).all()
    graph.launch(stream)
    expected = 2 * numpy.arange(12, dtype=numpy.float32).reshape(3, 4) @ numpy.ones((4, 4))
    assert (out.get() == expected).all()
    x[...] = 1.0                                       # new input, same address
    graph.launch(stream)
    assert (out.get() == 8.0).all()
    assert cupy.counts.graph_launches == 2


def test_a_replay_keeps_the_host_values_the_capture_saw(cupy):
    """The fault the graph tests must catch: a Python float read at capture is baked in, so a
    step whose learning rate changes on the host replays the old one."""
    p = cupy.ones(4, numpy.float32)
    lr = [0.5]

    def step(buffers):
        p.__imul__(numpy.float32(lr[0]))
        return p
    eager = StepGraph(cupy, step, capture=False)
    graphed = StepGraph(cupy, step)
    host = {"unused": numpy.zeros(1)}
    results = []
    for runner in (eager, graphed):
        p[...] = 1.0
        for lr[0] in (0.5, 0.25, 0.125):
            runner(host)
        results.append(float(p[0]))
    assert results[0] == 0.5 * 0.25 * 0.125
    assert results[1] == 0.5 * 0.25 * 0.25             # the third step replayed 0.25


def test_capture_refuses_what_cuda_and_cupy_refuse(cupy):
    x = cupy.ones(4, numpy.float32)
    stream = cupy.cuda.Stream()
    with pytest.raises(TypeError, match="default pool"):
        stream.begin_capture()
    with cupy.cuda.using_allocator(cupy.cuda.MemoryPool().malloc):
        with pytest.raises(TypeError, match="null stream"):
            cupy.cuda.Stream.null.begin_capture()
        for fault, error in ((lambda: float(x.sum()), "host reads the device"),
                             (lambda: cupy.asarray(numpy.ones(4)), "pageable"),
                             (lambda: cupy.dot(x[None], x[:, None]),
                              "cuBLAS API during stream capture"),
                             (lambda: x[None] @ x[:, None], "cuBLAS API during stream capture")):
            with stream:
                stream.begin_capture()
                with pytest.raises((TypeError, NotImplementedError), match=error):
                    fault()
                stream.end_capture()


def test_the_legacy_stream_invalidates_a_capture_on_a_blocking_stream(cupy):
    """CUDA's rule: while a blocking stream is captured, work on the legacy default stream (a
    kernel, a copy, cuBLAS bound to stream 0) or a device-wide synchronisation (a pool's
    cudaFree) fails and invalidates the capture: end_capture raises."""
    x = cupy.ones(4, numpy.float32)
    stream = cupy.cuda.Stream()
    faults = {"a kernel": lambda: cupy.multiply(x, 2.0, out=x),
              "a pool's free": lambda: cupy.get_default_memory_pool().free_all_blocks()}
    with cupy.cuda.using_allocator(cupy.cuda.MemoryPool().malloc):
        for what, fault in faults.items():
            stream.begin_capture()
            with pytest.raises(cupy_standin.CUDARuntimeError, match="StreamCaptureImplicit"):
                if what == "a kernel":
                    fault()                        # no `with stream`: the legacy stream
                else:
                    with stream:
                        fault()
            with pytest.raises(cupy_standin.CUDARuntimeError, match="Invalidated"):
                stream.end_capture()


def test_cublas_bound_to_the_legacy_stream_invalidates_a_capture(cupy, monkeypatch):
    """cuBLAS's handle bound to stream 0 during a capture (the fault: cublas.py passing 0, not
    the current stream): its product fails (a status, here 13) and the capture is invalid."""
    library = cupy_standin.nanobert_cublas.library(cupy)
    bind = library.cublasSetStream_v2
    monkeypatch.setattr(library, "cublasSetStream_v2", lambda handle, stream: bind(handle, 0))
    w = cupy.ones((4, 4), numpy.float32)
    out = cupy.zeros((4, 4), numpy.float32)
    stream = cupy.cuda.Stream()
    with cupy.cuda.using_allocator(cupy.cuda.MemoryPool().malloc), stream:
        stream.begin_capture()
        with pytest.raises(RuntimeError, match="status 13"):
            fast_gpu.gemm(w, w, out)
        with pytest.raises(cupy_standin.CUDARuntimeError, match="cuBLAS product on the legacy"):
            stream.end_capture()


def gemm_graph(cupy, capture=True):
    """A StepGraph whose step is one cuBLAS product and a kernel, called three times."""
    w = cupy.ones((4, 4), numpy.float32)

    def step(buffers):
        out = cupy.empty((3, 4), numpy.float32)
        fast_gpu.gemm(buffers["x"], w, out)
        return cupy.multiply(out, 2.0)
    graph = StepGraph(cupy, step, capture=capture)
    for i in range(3):
        result = graph({"x": numpy.full((3, 4), i, numpy.float32)})
    return graph, result


def test_a_step_with_cublas_is_captured_and_says_so(cupy):
    """The step's products go through cuBLAS on the capturing stream with our workspace: the
    graph is captured (mode "graph", not the eager fallback) and replays the right product.
    Catches cuBLAS bound to stream 0 and the workspace not set again after SetStream (the
    stand-in resets it there, as cuBLAS does), each of which makes the capture fail."""
    graph, result = gemm_graph(cupy)
    assert graph.mode == "graph" and graph.graphs == 1, graph.mode
    assert (result.get() == 2 * 2 * 4).all()
    assert cupy.counts.graph_launches == 2           # the second call and the third
    assert gemm_graph(cupy, capture=False)[0].mode == "eager"


def test_cublas_runs_every_product_on_our_workspace(cupy):
    """cublasSetStream resets cuBLAS's workspace (the stand-in models it): every product, eager
    or captured, must find ours set again after it."""
    library = cupy_standin.nanobert_cublas.library(cupy)
    library.workspaces.clear()
    gemm_graph(cupy)
    _, workspace = cupy_standin.nanobert_cublas._BOUND[cupy]
    assert library.workspaces == [(workspace.data.ptr, workspace.nbytes)] * 2, \
        library.workspaces                        # the warm-up's and the capture's


def test_a_capture_that_fails_says_why(cupy, monkeypatch):
    """A step CUDA refuses to capture runs eagerly, and mode says so with the reason."""
    library = cupy_standin.nanobert_cublas.library(cupy)
    bind = library.cublasSetStream_v2
    monkeypatch.setattr(library, "cublasSetStream_v2", lambda handle, stream: bind(handle, 0))
    graph, result = gemm_graph(cupy)
    assert graph.mode.startswith("capture failed: RuntimeError: cuBLAS returned status 13"), \
        graph.mode
    assert graph.graphs == 0 and (result.get() == 2 * 2 * 4).all()

# --------------------------------------------------------------- the training step


def step_args(grad_accum=1, optimizer="bert"):
    return types.SimpleNamespace(grad_accum=grad_accum, optimizer=optimizer,
                                 max_predictions_per_seq=4, no_nsp=False)


def train_steps(cuda_graph, steps, dtype=numpy.float32, grad_accum=1, optimizer="bert",
                start=None, max_grad_norm=1.0, vocab_size=TINY["vocab_size"]):
    """`steps` GPUSteps of a tiny BERT on the stand-in (dropout on, lr changing every step,
    fresh batches) -> (model, optimizer, scaler, losses); start: a state to resume from."""
    config = BertConfig(**{**TINY, "vocab_size": vocab_size}, hidden_dropout_prob=0.1,
                        attention_probs_dropout_prob=0.1)
    model = BertForPreTraining(config, seed=3, dtype=dtype, device="gpu").train()
    model.rng = model.rng.__class__(model.xp, 11)
    optimizer_ = AdamW(model.params, mode=optimizer)
    # float16: from 2^18 the first steps overflow (skipped, the scale halved), then train
    scaler = LossScaler(model.xp, init_scale=2.0 ** 18) if dtype == numpy.float16 else None
    first = 0
    if start is not None:
        first, params, optimizer_state, scaler_state, rng_state = start
        model.buffer[...] = model.xp.asarray(params)
        optimizer_.load_state_dict(optimizer_state)
        if scaler:
            scaler.load_state_dict(scaler_state)
        model.rng.load_state_dict(rng_state)
    group = types.SimpleNamespace(world_size=1, is_main=True)
    step = GPUStep(step_args(grad_accum, optimizer), group, model, optimizer_, scaler,
                   cuda_graph=cuda_graph)
    losses = []
    for i in range(first, first + steps):
        whole = pretraining_batch(config, 4, 12, seed=i)
        micro = 4 // grad_accum
        batches = [{k: v[m * micro:(m + 1) * micro] for k, v in whole.items()}
                   for m in range(grad_accum)]
        denominators = {"masked_lm": int((whole["labels"] != -100).sum()), "next_sentence": 4}
        outputs = step(batches, denominators, learning_rate(i, 1e-2, 2, 40))
        losses.append([float(out["mlm_loss"]) for out in outputs])
    state = (first + steps, model.buffer.get(), optimizer_.state_dict(),
             scaler.state_dict() if scaler else None, model.rng.state_dict())
    return model, step, state, losses


@pytest.mark.parametrize("dtype, grad_accum, optimizer", [
    (numpy.float64, 1, "bert"), (numpy.float32, 2, "bert"), (numpy.float32, 1, "torch"),
    (numpy.float16, 1, "bert")])
def test_replayed_steps_equal_eager_steps(cupy, dtype, grad_accum, optimizer):
    """Six steps replayed from a graph (after the warm-up and the capture) give bitwise the
    weights, losses and optimizer state of six eager steps on the same buffers: dropout
    masks that change every step (drawn in the kernels from the device step), an lr that
    changes every step, gradients clipped (the norm is above 1 at lr 1e-2), float16's first
    steps overflowing at the scale 2^18 and skipped (the scale halved in place: a scaler that
    made a new array instead would leave the graph reading the old one)."""
    eager, _, eager_state, eager_losses = train_steps(False, 6, dtype, grad_accum, optimizer)
    cupy.counts.reset()
    graphed, step, state, losses = train_steps(True, 6, dtype, grad_accum, optimizer)
    assert cupy.counts.captures == 1 and cupy.counts.graph_launches == 5
    assert step.step.graph.graphs == 1
    assert losses == eager_losses
    assert (graphed.buffer.get() == eager.buffer.get()).all()
    for key, value in eager_state[2].items():
        assert (numpy.asarray(state[2][key]) == numpy.asarray(value)).all(), key
    assert state[3] == eager_state[3]                                   # the loss scaler
    if dtype == numpy.float16:
        assert eager_state[3]["loss_scale"] < 2.0 ** 18                 # it did overflow
    initial = BertForPreTraining(eager.config, seed=3, dtype=dtype).buffer
    assert (eager.buffer.get() != initial).any()                       # and it did train
    assert len({tuple(loss) for loss in losses}) == len(losses)        # the batches varied


@pytest.mark.parametrize("dtype", [numpy.float64, numpy.float32, numpy.float16])
def test_replayed_steps_with_a_padded_vocab_equal_eager_steps(cupy, dtype):
    """An odd vocab (1,027), whose logits' rows are padded to 1,088 and whose decoder
    products are split in two (fast_gpu._output_rows, _split_wide): four replayed steps give
    bitwise the losses and weights of four eager ones (the padded arrays are the step's own
    allocations from the graph's pool, nothing of the host's)."""
    eager, _, _, eager_losses = train_steps(False, 4, dtype, vocab_size=1027)
    cupy.counts.reset()
    graphed, _, _, losses = train_steps(True, 4, dtype, vocab_size=1027)
    assert cupy.counts.captures == 1 and cupy.counts.graph_launches == 3
    assert any(1088 in (g.lda, g.ldb, g.ldc) for g in cupy.counts.gemms)     # padded
    assert losses == eager_losses
    assert (graphed.buffer.get() == eager.buffer.get()).all()


def test_a_resumed_graph_run_equals_an_uninterrupted_one(cupy):
    """Four steps, a checkpoint's state (weights, AdamW, the dropout generator), a new
    model and graph, four more: the weights of eight uninterrupted replayed steps."""
    whole, _, whole_state, _ = train_steps(True, 8)
    _, _, half_state, _ = train_steps(True, 4)
    resumed, _, _, _ = train_steps(True, 4, start=half_state)
    assert (resumed.buffer.get() == whole.buffer.get()).all()


def test_a_replayed_step_issues_one_launch_and_never_waits(cupy):
    """After the warm-up and the capture, a step is its input copies (pinned, async) and one
    graph launch: no kernel issued one by one, no read of the device."""
    config = BertConfig(**TINY, hidden_dropout_prob=0.1)
    model = BertForPreTraining(config, seed=3, device="gpu").train()
    step = GPUStep(step_args(), types.SimpleNamespace(world_size=1), model,
                   AdamW(model.params), None)
    batch = pretraining_batch(config, 4, 12)
    for _ in range(2):
        step([batch], {"masked_lm": 9, "next_sentence": 4}, 1e-3)
    cupy.counts.reset()
    step([batch], {"masked_lm": 9, "next_sentence": 4}, 1e-3)
    counts = cupy.counts
    assert counts.graph_launches == 1 and counts.kernel_launches == 0, dict(counts.kernels)
    assert counts.syncs == 0 and counts.host_waits == 0
    # the batch, the lr, the micro-batch's weight, the two denominators
    assert counts.copies == counts.pinned_copies == 6 + 1 + 1 + 2
    assert counts.graph_nodes > 100                                   # the whole step

# ------------------------------------------------------------------------ fine-tuning


def random_features(model_class, n, seed=0, lengths=(5, 16)):
    """n rows of made-up features for a task head: lengths drawn in [5, 16], targets that
    count differently per batch (token labels -100 at random)."""
    rng = numpy.random.default_rng(seed)

    def row(length):
        return rng.integers(5, 97, size=length).tolist()
    lengths_ = rng.integers(*lengths, size=n, endpoint=True)
    if model_class is BertForMultipleChoice:
        ids = [[row(length), row(max(5, length - 2)), row(length)] for length in lengths_]
        types = [[[0] * len(s) for s in r] for r in ids]
        return Features(ids, types, {"labels": rng.integers(0, 3, size=n).tolist()})
    ids = [row(length) for length in lengths_]
    types = [[0] * len(r) for r in ids]
    if model_class is BertForTokenClassification:
        targets = {"labels": [[int(v) if rng.random() > 0.3 else -100 for v in
                               rng.integers(0, 2, size=len(r))] for r in ids]}
    elif model_class is BertForQuestionAnswering:
        starts = [int(rng.integers(0, len(r))) for r in ids]
        targets = {"start_positions": starts,
                   "end_positions": [int(rng.integers(s, len(r))) for s, r in zip(starts, ids)]}
    else:
        targets = {"labels": rng.integers(0, 2, size=n).tolist()}
    return Features(ids, types, targets)


def fine_tune(model_class, cuda_graph, steps=7, micro=2):
    """`steps` GPU fine-tuning steps (tasks.fine_tuning_step) of a tiny head on made-up rows,
    batches of 4 in `micro` micro-batches padded to multiples of 4 positions -> (the weights,
    the losses, the GPUTrainStep)."""
    config = with_labels(BertConfig(**TINY, hidden_dropout_prob=0.1,
                                    attention_probs_dropout_prob=0.1), 2)
    model = model_class(config, seed=3, device="gpu").train()
    model.rng = model.rng.__class__(model.xp, 5)
    optimizer = AdamW(model.params)
    args = types.SimpleNamespace(max_seq_length=16, max_grad_norm=1.0, optimizer="bert")
    group = types.SimpleNamespace(world_size=1, sum=lambda values: values)
    gpu_step = GPUTrainStep(model, group, optimizer, None, cuda_graph=cuda_graph)
    features = random_features(model_class, 4 * steps)
    losses = []
    for step in range(steps):
        rows = numpy.arange(4 * step, 4 * step + 4)
        parts = [rows[m:m + 4 // micro] for m in range(0, 4, 4 // micro)]
        losses.append(tasks.fine_tuning_step(args, group, model, optimizer, None, gpu_step,
                                             features, parts, len(rows),
                                             learning_rate(step, 1e-2, 2, 20), step + 1))
    return model.buffer.get(), losses, gpu_step


@pytest.mark.parametrize("model_class", TASK_HEADS, ids=lambda c: c.__name__)
def test_fine_tuning_replays_equal_eager_steps(cupy, model_class, monkeypatch):
    """Each task head fine-tuned 7 steps on the GPU path, replayed from CUDA graphs and
    eagerly: the same weights and losses bitwise. Batches padded to a multiple of 4 positions
    (tasks.GRAPH_LENGTH_MULTIPLE, 32 in use) give several lengths, one graph each, reused
    across steps; the token labels' count, which the loss divides by, changes every step and
    comes in as an input (model.graph_counts)."""
    monkeypatch.setattr(tasks, "GRAPH_LENGTH_MULTIPLE", 4)
    eager_weights, eager_losses, _ = fine_tune(model_class, False)
    weights, losses, step = fine_tune(model_class, True)
    assert losses == eager_losses
    assert (weights == eager_weights).all()
    assert cupy.counts.captures >= 1 and cupy.counts.graph_launches >= 1
    lengths = {shape[-1] for key in step.graph.layouts for name, shape, _ in key
               if name == "0/input_ids"}
    assert lengths <= {8, 12, 16} and len(lengths) > 1, lengths


def test_a_step_that_cannot_be_captured_runs_eagerly(cupy, capsys, monkeypatch):
    """A capture that fails (here: the step reads its loss on the host, which CUDA refuses
    during capture) is said in one line, and the run goes on eagerly with the weights,
    losses and AdamW step count of a run that never tried."""
    eager, _, eager_state, eager_losses = train_steps(False, 4)
    device_step = GPUTrainStep.device_step

    def reading_step(self, buffers):
        loss, outputs = device_step(self, buffers)
        float(loss)
        return loss, outputs
    monkeypatch.setattr(GPUTrainStep, "device_step", reading_step)
    graphed, step, state, losses = train_steps(True, 4)
    printed = capsys.readouterr().out
    assert printed.count("CUDA graph capture of the training step failed") == 1, printed
    assert step.step.graph.capture is False and cupy.counts.graph_launches == 0
    assert losses == eager_losses and (graphed.buffer.get() == eager.buffer.get()).all()
    assert int(state[2]["step"]) == int(eager_state[2]["step"]) == 4


@pytest.mark.gpu
@pytest.mark.skipif(not backend.gpu_available(), reason="needs a real GPU: CuPy sees none")
@pytest.mark.parametrize("dtype", [numpy.float64, numpy.float32, numpy.float16])
def test_on_a_gpu_replayed_steps_equal_eager_steps(dtype):
    """On CUDA itself: the step captured by a real stream capture and replayed gives the
    eager step's weights (float64 bitwise; float32 and float16 within a few ulps, should
    cuBLAS pick another algorithm under capture)."""
    eager, _, eager_state, eager_losses = train_steps(False, 6, dtype)
    graphed, step, state, losses = train_steps(True, 6, dtype)
    assert step.step.graph.graphs == 1
    weights, expected = graphed.buffer.get(), eager.buffer.get()
    if dtype == numpy.float64:
        assert (weights == expected).all() and losses == eager_losses
    else:
        err = numpy.abs(weights - expected).max() / numpy.abs(expected).max()
        assert err <= 1e-5, err
    assert state[3] == eager_state[3]
