"""Flat buffers, as llm.c: many named tensors stored as views of one contiguous 1-D array.

The model's parameters live in one buffer and the HF-named dict holds views into it;
each backward pass gets one zeroed gradient buffer laid out the same way. Whatever treats
all tensors alike (the global norm, AdamW, gradient accumulation, an allreduce) then makes
one pass over one array instead of a loop over ~200 small ones.

    layout = FlatLayout(shapes)              name -> (offset, shape) in buffer order
    buffer = layout.zeros(xp, dtype)         [layout.size]
    tensors = layout.views(buffer)           name -> buffer[offset:offset+size].reshape(shape)
    flat_buffer(tensors)                     -> buffer, or None for a dict of separate arrays

flat_buffer and flat_offsets, which only look at arrays, live in backend.py (below the model,
so that distributed.py's allreduce finds the buffer too); they are importable from here.
"""
import math

from ..backend import data_pointer, flat_buffer, flat_offsets

__all__ = ["FlatLayout", "flat_buffer", "flat_offsets", "stacked_view"]


class FlatLayout:
    """Where each named tensor lives in a flat buffer: tensors in the order given, packed."""

    def __init__(self, shapes):
        self.shapes = {name: tuple(shape) for name, shape in shapes.items()}
        self.offsets = {}
        offset = 0
        for name, shape in self.shapes.items():
            self.offsets[name] = offset
            offset += math.prod(shape)
        self.size = offset

    def zeros(self, xp, dtype):
        # NumPy's zeros is calloc: fresh pages come zeroed from the OS, so this costs no pass.
        return xp.zeros(self.size, dtype=dtype)

    def views(self, buffer, order=None):
        """name -> view of `buffer`, in the order of `order` (default: the layout's)."""
        names = self.shapes if order is None else order
        return {name: self.view(buffer, name) for name in names}

    def view(self, buffer, name):
        start, shape = self.offsets[name], self.shapes[name]
        return buffer[start:start + math.prod(shape)].reshape(shape)


def stacked_view(arrays):
    """The arrays concatenated along axis 0, as a view, when they lie back to back in one
    flat buffer (as buffer_order places a layer's query, key and value); else None."""
    buffer = arrays[0].base
    if buffer is None or buffer.ndim != 1 or any(a.base is not buffer for a in arrays):
        return None
    start = (data_pointer(arrays[0]) - data_pointer(buffer)) // buffer.itemsize
    stop = start
    for a in arrays:
        if not a.flags.c_contiguous or data_pointer(a) != data_pointer(buffer[stop:]):
            return None
        stop += a.size
    return buffer[start:stop].reshape(-1, *arrays[0].shape[1:])
