"""Read and write the safetensors format (Hugging Face checkpoints) with NumPy only.

A safetensors file is an 8-byte little-endian length N, then N bytes of UTF-8 JSON mapping each
tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (plus an optional "__metadata__"
object of string -> string), then the raw little-endian C-order bytes of every tensor, with the
offsets counted from the start of that data buffer. The tensors tile the buffer exactly: sorted by
offset each begins where the previous ends and the last ends at the end of the file.

`load_file` reads every tensor straight into its own freshly allocated NumPy array (aligned,
writable, owning its memory; nothing stays tied to the file). A file is a download from a
stranger: only a regular file is opened, its header is capped (`max_header_bytes`, 100 MB as the
format's own reader, or less where the caller knows better) and checked whole before anything
else is read, and `read_entries` + `read_tensors` let a caller check what the header declares
(names, dtypes, shapes: `Entry`) against what it expects before a byte of tensor data is read
or allocated. `save_file` lays the file out as
the reference writer does (tensors by descending dtype alignment, then by name; compact JSON
padded with spaces to a multiple of 8) and replaces the target atomically.
"""
from __future__ import annotations

import json
import os
import stat
from collections import Counter
from typing import NamedTuple

import numpy as np

from .fileio import atomic_open, check_regular_file

MAX_HEADER_BYTES = 100 * 1000 * 1000      # the format's own reader refuses a larger header

# safetensors dtype -> little-endian NumPy dtype, in the reference's order of increasing
# alignment (the writer puts the most-aligned tensors first so every tensor stays aligned).
# NumPy has no bfloat16: BF16 is read as its raw 16 bits and widened to float32.
_DTYPES = {"BOOL": "|b1", "U8": "|u1", "I8": "|i1", "I16": "<i2", "U16": "<u2", "F16": "<f2",
           "BF16": "<u2", "I32": "<i4", "U32": "<u4", "F32": "<f4", "F64": "<f8", "I64": "<i8",
           "U64": "<u8"}
_NAMES = {numpy_dtype: name for name, numpy_dtype in _DTYPES.items() if name != "BF16"}
_RANK = {name: rank for rank, name in enumerate(_DTYPES)}


def _no_duplicates(pairs):
    duplicates = sorted(key for key, count in Counter(key for key, _ in pairs).items() if count > 1)
    if duplicates:
        raise ValueError(f"duplicate name(s) {duplicates} in header")
    return dict(pairs)


def _is_count(value):  # JSON true/false parse as Python ints; they are not counts
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


class Entry(NamedTuple):
    """A tensor as the header declares it: `name` in the file, safetensors `kind` ("F32"),
    `shape`, and its bytes [begin, end) of the data buffer. `dtype` is what reading it gives."""
    name: str
    kind: str
    shape: tuple
    begin: int
    end: int

    @property
    def dtype(self):
        return np.dtype("float32" if self.kind == "BF16" else _DTYPES[self.kind].replace("<", "="))


def _open_regular(path):
    """Open `path` for reading only if it is a regular file: a FIFO would block the open
    itself, /dev/zero never end (O_NONBLOCK: the open returns, fstat then says what it is)."""
    check_regular_file(path, "safetensors file")
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):      # replaced since the check
        os.close(descriptor)
        raise ValueError(f"safetensors file {os.fspath(path)!r} is not a regular file")
    return open(descriptor, "rb")


def _read_header(f, path, max_header_bytes=MAX_HEADER_BYTES):
    """Parse and check the header of open file `f`, reading at most `max_header_bytes` of it.

    Returns ({name: (dtype, shape, begin, end)} sorted by offset, metadata, data start)."""
    size = os.fstat(f.fileno()).st_size
    if size < 8:
        raise ValueError(f"{path}: file is {size} bytes, shorter than the 8-byte header length")
    n = int.from_bytes(f.read(8), "little")
    if n > size - 8:
        raise ValueError(f"{path}: header length {n} runs past the end of the file ({size} bytes)")
    if n > max_header_bytes:
        raise ValueError(f"{path}: header length {n:,} bytes is more than the {max_header_bytes:,} "
                         "a header of this model can need: not read")
    head = f.read(min(n, 4096))        # a JSON object: zeros (a sparse file) stop here
    first = head.lstrip(b" \t\n\r")[:1]
    if first not in (b"{", b""):
        raise ValueError(f"{path}: header is not a JSON object (it starts with {first!r})")
    try:
        header = json.loads((head + f.read(n - len(head))).decode("utf-8"),
                            object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: header is not valid UTF-8 JSON: {error}") from None
    except RecursionError:  # e.g. 200,000 nested "[": hostile, never a real header
        raise ValueError(f"{path}: header JSON is nested too deeply to be a tensor table") from None
    except ValueError as error:  # raised by _no_duplicates
        raise ValueError(f"{path}: {error}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: header is a JSON {type(header).__name__}, not an object")
    metadata = header.pop("__metadata__", {})
    if not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise ValueError(f"{path}: __metadata__ must map strings to strings, got {metadata!r}")
    entries = {}
    for name, info in header.items():
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
            raise ValueError(f"{path}: tensor {name!r} needs dtype, shape and data_offsets, "
                             f"got {info!r}")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in _DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {dtype!r} "
                             f"(nanobert reads {', '.join(_DTYPES)})")
        if not (isinstance(shape, list) and all(map(_is_count, shape))):
            raise ValueError(f"{path}: tensor {name!r} has invalid shape {shape!r}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_count, offsets))):
            raise ValueError(f"{path}: tensor {name!r} has invalid data_offsets {offsets!r}")
        entries[name] = (dtype, tuple(shape), *offsets)
    entries = dict(sorted(entries.items(), key=lambda item: item[1][2:]))
    data_size, end = size - 8 - n, 0
    for name, (dtype, shape, begin, stop) in entries.items():
        where = f"{path}: tensor {name!r} data_offsets [{begin}, {stop}]"
        if begin > stop or stop > data_size:
            raise ValueError(f"{where} out of range of the {data_size}-byte data buffer")
        if begin != end:
            problem = "overlap the previous tensor" if begin < end else "leave a gap after it"
            raise ValueError(f"{where} {problem}, which ends at {end}")
        expected = int(np.prod(shape, dtype=object)) * np.dtype(_DTYPES[dtype]).itemsize
        if stop - begin != expected:
            raise ValueError(f"{where} hold {stop - begin} bytes, "
                             f"but {dtype} {list(shape)} needs {expected}")
        end = stop
    if end != data_size:
        raise ValueError(f"{path}: tensors end at byte {end} of a {data_size}-byte data buffer")
    return entries, metadata, 8 + n


def read_header(path, max_header_bytes=MAX_HEADER_BYTES) -> dict:
    """{name: (safetensors dtype string, shape tuple)} in data order, reading no tensor data."""
    return {name: (e.kind, e.shape) for name, e in read_entries(path, max_header_bytes).items()}


def read_entries(path, max_header_bytes=MAX_HEADER_BYTES) -> dict:
    """{name: Entry} in data order, checked (dtypes, shapes, byte ranges that tile the file),
    reading no tensor data: what read_tensors may then be asked for."""
    with _open_regular(path) as f:
        entries, _, _ = _read_header(f, path, max_header_bytes)
    return {name: Entry(name, *entry) for name, entry in entries.items()}


def load_metadata(path) -> dict:
    """The file's "__metadata__" (string -> string); {} when it has none."""
    with _open_regular(path) as f:
        return _read_header(f, path)[1]


def read_tensors(path, wanted, dtype=None, max_header_bytes=MAX_HEADER_BYTES) -> dict:
    """{key: numpy.ndarray} for `wanted` {key: Entry of read_entries} (keys may rename them,
    an entry may be wanted twice), each a fresh writable array (BF16 becomes float32); the
    header is read again and each entry must still be in it as it was.

    `dtype` casts the floating-point tensors only: integer and bool tensors (token ids,
    position_ids buffers) keep their own dtype."""
    tensors = {}
    with _open_regular(path) as f:
        entries, _, data_start = _read_header(f, path, max_header_bytes)
        for key, entry in wanted.items():
            if entries.get(entry.name) != tuple(entry[1:]):
                raise ValueError(f"{path}: tensor {entry.name!r} is not in the header as it was "
                                 "when checked (the file changed while it was read)")
            array = np.empty(entry.shape, dtype=_DTYPES[entry.kind])
            f.seek(data_start + entry.begin)
            if f.readinto(array.reshape(-1).view(np.uint8)) != entry.end - entry.begin:
                raise ValueError(f"{path}: file ended while reading tensor {entry.name!r}")
            if entry.kind == "BF16":  # bfloat16 is the top half of a float32
                array = (array.astype("<u4") << 16).view("<f4")
            array = array.astype(array.dtype.newbyteorder("="), copy=False)
            if dtype is not None and array.dtype.kind == "f":
                array = array.astype(dtype, copy=False)
            tensors[key] = array
    return tensors


def load_file(path, dtype=None, max_header_bytes=MAX_HEADER_BYTES) -> dict:
    """{name: numpy.ndarray} in data order, each a fresh writable array (BF16 becomes float32).

    `dtype` casts the floating-point tensors only: integer and bool tensors (token ids,
    position_ids buffers) keep their own dtype."""
    return read_tensors(path, read_entries(path, max_header_bytes), dtype, max_header_bytes)


def save_file(tensors: dict, path, metadata: dict | None = None) -> None:
    """Write `tensors` (host NumPy arrays: convert CuPy ones first) to `path` atomically: a crash
    mid-save leaves any previous file at `path` untouched and no temporary file behind."""
    arrays = {}
    for name, array in tensors.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise ValueError(f"{path}: tensor name {name!r} must be a string "
                             f"other than '__metadata__'")
        if not isinstance(array, np.ndarray):
            raise ValueError(f"{path}: tensor {name!r} is a {type(array).__module__}."
                             f"{type(array).__name__}, not a numpy.ndarray "
                             f"(copy device arrays to the host first: backend.to_host)")
        kind = _NAMES.get(array.dtype.newbyteorder("<").str)
        if kind is None:
            raise ValueError(f"{path}: tensor {name!r} has dtype {array.dtype}, "
                             f"which safetensors cannot store")
        arrays[name] = (kind, np.asarray(array, dtype=_DTYPES[kind], order="C"))
    if metadata is not None and not all(isinstance(key, str) and isinstance(value, str)
                                        for key, value in metadata.items()):
        raise ValueError(f"{path}: metadata must map strings to strings, got {metadata!r}")
    order = sorted(arrays, key=lambda name: (-_RANK[arrays[name][0]], name))
    header, offset = {} if metadata is None else {"__metadata__": metadata}, 0
    for name in order:
        kind, array = arrays[name]
        header[name] = {"dtype": kind, "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    header_bytes = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    header_bytes += b" " * (-len(header_bytes) % 8)  # keeps the data buffer 8-byte aligned

    with atomic_open(path, "wb") as f:
        f.write(len(header_bytes).to_bytes(8, "little") + header_bytes)
        for name in order:
            f.write(arrays[name][1].reshape(-1).view(np.uint8))
