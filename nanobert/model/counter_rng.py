"""The model's dropout generators (default_rng): NumPy's Generator on the CPU, and on the GPU
a counter-based one (Philox4x32-10, kernels.cu), so that each CUDA kernel draws its elements'
numbers itself and a backward regenerates its forward's mask.

A counter-based generator has no stream to advance: a number is a pure function of a key and
a counter (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011). The layout
(kernels.cu says the same):

    key     = (seed lo32, seed hi32)
    counter = (element index // 4, call index, step lo32, step hi32)
    element i takes word i % 4 of its block; u = (word >> 8) * 2^-24 in the statistics'
    type (float32 for float16 and float32 activations, float64 for float64): exact, so NumPy
    and CUDA agree bitwise; kept where u >= p, as ops.dropout_forward.

`step` is a counter on the device, advanced in place at the start of each optimizer step
(begin_step), and `calls` numbers a step's dropout draws on the host. Within a step the
dropouts come in the same order every step, so a CUDA graph captured once bakes each draw's
call index in as a constant while the device step makes every replay's masks new (a draw
from cuRAND's host API would be replayed with the same numbers every step).
"""
import numpy

from . import fast_gpu

WORD = 2 ** 32


def default_rng(xp, seed):
    """A seeded random generator for dropout on the device of `xp` arrays: numpy's Generator
    on NumPy; on CuPy the CounterGenerator below, whose numbers the CUDA kernels draw
    themselves (a CUDA graph can replay it, a backward regenerates its masks)."""
    if xp is numpy:
        return numpy.random.default_rng(seed)
    return CounterGenerator(xp, seed)


class CounterGenerator:
    """Dropout's random numbers on the device of namespace xp (CuPy). seed: a host int of
    up to 64 bits (Philox's key); step: a 0-d uint64 device array whose address never
    changes (kernels read it, a graph replays its increment); calls: the host count of this
    step's draws."""

    def __init__(self, xp, seed):
        self.xp, self.seed, self.calls = xp, _unsigned64(seed, "CounterGenerator: seed"), 0
        self.step = xp.zeros((), numpy.uint64)

    @property
    def key(self):
        """Philox's key: the seed's (low, high) 32-bit words, as the kernels take them."""
        return numpy.uint32(self.seed % WORD), numpy.uint32(self.seed // WORD)

    def begin_step(self):
        """A new optimizer step: the device step + 1 in place (one launch, no host read),
        and the call index back to 0."""
        self.step += 1
        self.calls = 0

    def next_call(self):
        """The call index of the next dropout draw of this step (a host int), counted."""
        if self.calls >= WORD:
            raise ValueError(f"CounterGenerator: {self.calls} draws in one step exhaust the "
                             f"32-bit call index; call begin_step() at each optimizer step")
        self.calls += 1
        return self.calls - 1

    def random(self, shape, dtype=numpy.float64):
        """Uniforms in [0, 1) of this shape and dtype (float32 or float64, as numpy's
        Generator.random), one call index's numbers in the counter layout: the numbers the
        dropout kernels compare with p, so ops.dropout_forward run with this generator keeps
        what the fused kernels keep when both draw in the same order."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        dtype = numpy.dtype(dtype)
        if dtype not in (numpy.float32, numpy.float64):
            raise ValueError(f"CounterGenerator.random: dtype {dtype}: float32 or float64")
        return fast_gpu.uniform(self.step, self.key, self.next_call(), shape, dtype)

    def state_dict(self):
        """{"seed", "step", "calls"} as host ints (step read from the device: checkpoint
        time only)."""
        return {"seed": self.seed, "step": int(self.step), "calls": self.calls}

    def load_state_dict(self, state):
        """Where state_dict left it: the step written into the same device array."""
        missing = {"seed", "step", "calls"} - set(state)
        if missing:
            raise ValueError(f"CounterGenerator.load_state_dict: no {sorted(missing)} in "
                             f"{sorted(state)}")
        where = "CounterGenerator.load_state_dict:"
        step = _unsigned64(state["step"], f"{where} step")
        self.seed = _unsigned64(state["seed"], f"{where} seed")
        self.calls = int(state["calls"])
        self.step[...] = numpy.uint64(step)


def _unsigned64(value, what):
    """value as a host int in [0, 2^64), else ValueError naming `what`."""
    value = int(value)
    if not 0 <= value < WORD ** 2:
        raise ValueError(f"{what} {value} is not a 64-bit unsigned int")
    return value
