"""Batches reach the GPU from pinned memory without a host wait (backend.PinnedStaging), and
the stand-in that proves it: a copy from pageable memory is a host wait, an async copy from
pinned memory is in flight until the host has seen it done, and a pinned buffer written
while its copy is in flight is caught. On the CPU (the stand-in) this proves what is copied
and when the host may wait; nothing about the speed of a real GPU."""
import numpy
import pytest

import cupy_standin
from conftest import assert_close
from counter_reference import dropout_generator, numpy_draws_like_the_gpu
from nanobert.backend import PinnedStaging
from nanobert.model.config import BertConfig
from nanobert.model.pretraining import BertForPreTraining
from test_cupy_standin import TINY, pretraining_batch


@pytest.fixture
def cupy():
    with cupy_standin.installed() as module:
        module.counts.reset()
        yield module


def test_standin_counts_a_pageable_copy_as_a_host_wait_and_a_pinned_one_not(cupy):
    import cupyx
    host = numpy.arange(6, dtype=numpy.int64).reshape(2, 3)
    pinned = cupyx.empty_pinned((2, 3), dtype=numpy.int64)
    pinned[...] = host
    assert cupy_standin.is_pinned(pinned) and not cupy_standin.is_pinned(host)
    device = cupy.empty((2, 3), dtype=numpy.int64)
    device.set(pinned, stream=cupy.cuda.get_current_stream())
    assert (cupy.counts.pinned_copies, cupy.counts.pageable_copies, cupy.counts.syncs) == (1, 0, 0)
    device.set(host)                                   # pageable: CUDA may wait to stage it
    cupy.asarray(host)                                 # CuPy stages it: a pool that may grow
    assert (cupy.counts.pageable_copies, cupy.counts.host_waits, cupy.counts.syncs) == (2, 2, 0)
    cupy.asarray(numpy.int64(3))                       # 0-d: a fill kernel's argument
    cupy.asarray(pinned)                               # pinned: async, no wait
    assert (cupy.counts.pageable_copies, cupy.counts.pinned_copies) == (2, 2)
    with pytest.raises(TypeError, match="int32 array cannot be set to int64"):
        device.set(pinned.astype(numpy.int32))
    with pytest.raises(ValueError, match="Shape mismatch"):
        device.set(pinned[:1])


def test_standin_catches_a_pinned_buffer_written_while_its_copy_is_in_flight(cupy):
    import cupyx
    pinned = cupyx.zeros_pinned(4, dtype=numpy.float32)
    stream = cupy.cuda.get_current_stream()
    cupy.empty(4, dtype=numpy.float32).set(pinned, stream=stream)
    event = cupy.cuda.Event(disable_timing=True)
    event.record(stream)
    pinned[0] = 1.0                                    # too early: the copy may not have run
    with pytest.raises(TypeError, match="written while the copy was in flight"):
        cupy.empty(4, dtype=numpy.float32).set(pinned, stream=stream)
    cupy_standin._IN_FLIGHT.clear()
    cupy.empty(4, dtype=numpy.float32).set(pinned, stream=stream)
    event.record(stream)
    assert event.done and cupy.counts.syncs == 0       # a query: the host learns, no wait
    pinned[0] = 2.0                                    # the copy is done: free to refill
    cupy.empty(4, dtype=numpy.float32).set(pinned, stream=stream)
    event.synchronize()                                # may wait on a GPU: a host wait
    assert cupy.counts.sync_sites == {"Event.synchronize": 1}


class OneBufferNoWait(PinnedStaging):
    """A planted bug: every batch refills the same pinned buffer without asking whether the
    last batch's copies are done."""

    def _next_slot(self, batch):
        self.batch, self.used = batch, 0
        self.stream = self.xp.cuda.get_current_stream()


def batches(count=7, seed=0):
    """Host batches of changing shapes and dtypes, as check_batch's dicts are."""
    rng = numpy.random.default_rng(seed)
    for b in range(count):
        B, T, M = 2, int(rng.integers(3, 40)), int(rng.integers(1, 9))
        yield {"input_ids": rng.integers(0, 1000, (B, T)),
               "attention_mask": rng.integers(0, 2, (B, T)),
               "masked_lm_positions": numpy.sort(rng.choice(B * T, M, replace=False)),
               "labels": rng.random(B).astype(numpy.float32)}


@pytest.mark.parametrize("slots", [1, 2, 3])
def test_staging_hands_over_every_batch_as_the_host_built_it(cupy, slots):
    """Batches of changing shapes (the pinned buffers outgrown and refilled): every device
    array, read after all the batches were staged, equals its host array; no host wait and
    no pageable copy on the way; a cast on the way (float labels to float64) as to_device."""
    staging = PinnedStaging(cupy, slots=slots)
    sent = []
    for batch in batches():
        for key, a in batch.items():
            dtype = numpy.float64 if key == "labels" else None
            sent.append((a.astype(dtype or a.dtype), staging.put(a, batch, dtype)))
    assert (cupy.counts.syncs, cupy.counts.pageable_copies) == (0, 0)
    assert cupy.counts.pinned_copies == len(sent)
    for host, device in sent:
        assert device.dtype == host.dtype
        numpy.testing.assert_array_equal(device.get(), host)


def test_staging_without_waiting_for_the_copies_is_caught(cupy):
    staging = OneBufferNoWait(cupy)
    with pytest.raises(TypeError, match="written while the copy was in flight"):
        for batch in batches():
            for a in batch.values():
                staging.put(a, batch)
    cupy_standin._IN_FLIGHT.clear()


def test_staging_on_numpy_is_never_built():
    model = BertForPreTraining(BertConfig(**TINY))
    assert model._staging is None
    batch = model.check_batch(pretraining_batch(model.config, 2, 6))
    assert model._device(batch, "input_ids") is batch["input_ids"]     # no copy, no cost


def steps(device, counts=None):
    """Five training steps of a tiny BERT in float64 with dropout, batches of changing
    length -> each step's loss, unread (device arrays on the GPU); counts (the stand-in's)
    reset once the model is built."""
    config = BertConfig(**TINY)
    model = BertForPreTraining(config, seed=3, dtype=numpy.float64, device=device).train()
    model.packs = False         # CuPy runs the padded batch: NumPy the same draws and math
    if counts is not None:
        counts.reset()
    losses = []
    for step, T in enumerate((12, 7, 14, 9, 5)):
        model.rng = dropout_generator(model.xp, step)   # the same masks on both sides
        with numpy_draws_like_the_gpu():
            loss, _ = model.loss_and_grads(pretraining_batch(config, 2, T, seed=step),
                                           on_device=True)
        losses.append(loss)
    return losses


def test_each_step_computes_on_its_own_batch_without_a_host_wait():
    """Five steps on the stand-in against NumPy, float64: no host wait in any of them (each
    batch goes over as 6 async copies from pinned memory), and each step's loss, read after
    the last step, is the NumPy path's: the device read the batch the host built for that
    step, not a neighbour's."""
    expected = [float(loss) for loss in steps("cpu")]
    with cupy_standin.installed() as cupy:
        losses = steps("gpu", counts=cupy.counts)
        counts = cupy.counts
        print(f"5 steps on the stand-in: {counts.pinned_copies} pinned copies, "
              f"{counts.pageable_copies} pageable, {counts.syncs} syncs")
        assert (counts.syncs, counts.pageable_copies, counts.pinned_copies) == (0, 0, 5 * 6)
        actual = [float(loss) for loss in losses]
    assert_close(actual, expected, 1e-12, "stand-in vs NumPy losses through pinned staging")
