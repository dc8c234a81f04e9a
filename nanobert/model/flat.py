"""Flat buffers, as llm.c: many named tensors stored as views of one contiguous 1-D array.

The model's parameters live in one buffer and the HF-named dict holds views into it;
each backward pass gets one zeroed gradient buffer laid out the same way. Whatever treats
all tensors alike (the global norm, AdamW, gradient accumulation, an allreduce) then makes
one pass over one array instead of a loop over ~200 small ones.

    layout = FlatLayout(shapes)              name -> (offset, shape) in buffer order
    buffer = layout.zeros(xp, dtype)         [layout.size]
    tensors = layout.views(buffer)           name -> buffer[offset:offset+size].reshape(shape)
    flat_buffer(tensors)                     -> buffer, or None for a dict of separate arrays
"""
import math

from ..backend import array_module


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


def data_pointer(a):
    """Address of an array's first element (NumPy or CuPy)."""
    if array_module(a).__name__ == "numpy":
        return a.__array_interface__["data"][0]
    return a.data.ptr


def flat_offsets(tensors):
    """-> (buffer, {name: offset}) when the tensors of this dict tile one 1-D array exactly
    (each a C-contiguous view of it, no gap, no overlap, in any order); else (None, None),
    and callers loop over the tensors one by one."""
    arrays = list(tensors.values())
    buffer = arrays[0].base if arrays else None
    if buffer is None or buffer.ndim != 1 or not buffer.flags.c_contiguous:
        return None, None
    if any(a.base is not buffer or not a.flags.c_contiguous for a in arrays):
        return None, None
    start = data_pointer(buffer)
    offsets = {name: (data_pointer(a) - start) // buffer.itemsize for name, a in tensors.items()}
    end = 0
    for offset, name in sorted((offset, name) for name, offset in offsets.items()):
        if offset != end:
            return None, None
        end += tensors[name].size
    return (buffer, offsets) if end == buffer.size else (None, None)


def flat_buffer(tensors):
    """The 1-D array the tensors of this dict tile exactly, or None (see flat_offsets)."""
    return flat_offsets(tensors)[0]


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
