"""nanobert.formats.safetensors: round trips, the reference package, malformed files, atomic
save."""
import errno
import io
import json
import os
import struct

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from nanobert.formats import safetensors as nst

DTYPES = {np.float32: "F32", np.float64: "F64", np.float16: "F16", np.int64: "I64",
          np.int32: "I32", np.bool_: "BOOL"}

shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)  # 0-d and zero-size too
arrays = st.sampled_from(list(DTYPES)).flatmap(lambda dtype: hnp.arrays(dtype, shapes))
names = st.text(max_size=12).filter(lambda name: name != "__metadata__")
tensor_dicts = st.dictionaries(names, arrays, max_size=5)
metadata_dicts = st.dictionaries(st.text(max_size=8), st.text(max_size=8), min_size=1, max_size=3)


def assert_same_tensors(expected, actual):
    """Same names, dtypes, shapes and bytes (bitwise, so NaN payloads and -0.0 count)."""
    assert sorted(actual) == sorted(expected), \
        f"names: expected {sorted(expected)}, got {sorted(actual)}"
    for name, want in expected.items():
        got = actual[name]
        assert (got.dtype, got.shape) == (want.dtype, want.shape), \
            f"{name!r}: expected {want.dtype} {want.shape}, got {got.dtype} {got.shape}"
        assert got.tobytes() == want.tobytes(), f"{name!r}: expected {want!r}, got {got!r}"


def raw_file(path, header, data=b"", pad=True):
    """Write a safetensors file by hand; `header` is a dict or the exact header bytes."""
    header_bytes = header if isinstance(header, bytes) else json.dumps(header).encode()
    if pad:
        header_bytes += b" " * (-len(header_bytes) % 8)
    path.write_bytes(struct.pack("<Q", len(header_bytes)) + header_bytes + data)
    return path


def entry(name, begin, end, shape=None, dtype="F32"):
    """One header entry; the shape defaults to the F32 vector the offsets describe."""
    shape = [(end - begin) // 4] if shape is None else shape
    return {name: {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}}


# ---------------------------------------------------------------- round trips

@settings(max_examples=60, deadline=None)
@given(tensors=tensor_dicts, metadata=st.none() | metadata_dicts)
def test_round_trip_keeps_names_dtypes_shapes_bits_and_metadata(tmp_path_factory, tensors,
                                                                metadata):
    path = tmp_path_factory.mktemp("round_trip") / "model.safetensors"
    nst.save_file(tensors, path, metadata=metadata)
    assert_same_tensors(tensors, nst.load_file(path))
    header = nst.read_header(path)
    expected = {name: (DTYPES[array.dtype.type], array.shape) for name, array in tensors.items()}
    assert header == expected, f"read_header: expected {expected}, got {header}"
    loaded_metadata = nst.load_metadata(path)
    assert loaded_metadata == (metadata or {}), \
        f"metadata: expected {metadata}, got {loaded_metadata}"
    data_start = 8 + struct.unpack("<Q", path.read_bytes()[:8])[0]
    assert data_start % 8 == 0, f"data buffer starts at byte {data_start}, not a multiple of 8"


def test_loaded_arrays_are_writable_aligned_and_own_their_memory(tmp_path):
    path = tmp_path / "model.safetensors"
    nst.save_file({"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.int8)},
                  path)
    loaded = nst.load_file(path)
    for name, array in loaded.items():
        flags = array.flags
        assert flags.writeable and flags.aligned and flags.c_contiguous and flags.owndata, \
            f"{name!r}: {flags}"
    loaded["a"][0, 0] = 42.0
    assert nst.load_file(path)["a"][0, 0] == 0.0, "writing to a loaded array changed the file"


def test_non_contiguous_and_big_endian_arrays_are_saved_as_their_values(tmp_path):
    path = tmp_path / "model.safetensors"
    tensors = {"strided": np.arange(12, dtype=np.float64).reshape(3, 4)[:, ::2],
               "transposed": np.arange(6, dtype=np.int32).reshape(2, 3).T,
               "big_endian": np.array([1.5, -2.0, 3.25], dtype=">f4")}
    nst.save_file(tensors, path)
    loaded = nst.load_file(path)
    for name, want in tensors.items():
        assert np.array_equal(loaded[name], want), f"{name!r}: expected {want}, got {loaded[name]}"
    assert loaded["big_endian"].dtype.isnative, loaded["big_endian"].dtype


def test_load_dtype_casts_floating_tensors_and_keeps_integer_and_bool_ones(tmp_path):
    path = tmp_path / "model.safetensors"
    nst.save_file({"weight": np.array([0.1, 0.2], np.float32), "position_ids": np.arange(3),
                   "flag": np.array([True, False])}, path)
    loaded = nst.load_file(path, dtype=np.float64)
    got = {name: array.dtype for name, array in loaded.items()}
    want = {"weight": np.dtype(np.float64), "position_ids": np.dtype(np.int64),
            "flag": np.dtype(bool)}
    assert got == want, f"dtypes after load_file(dtype=float64): expected {want}, got {got}"
    assert loaded["weight"][0] == np.float64(np.float32(0.1)), loaded["weight"]


def test_save_file_lays_out_a_known_example_as_the_reference_writer_does(tmp_path):
    # Descending dtype alignment first (F64 before I8), then names; spaces pad the header.
    path = tmp_path / "model.safetensors"
    nst.save_file({"b": np.zeros(1, np.int8), "a": np.zeros(1, np.int8),
                   "c": np.zeros((), np.float64)}, path)
    header = (b'{"c":{"dtype":"F64","shape":[],"data_offsets":[0,8]},'
              b'"a":{"dtype":"I8","shape":[1],"data_offsets":[8,9]},'
              b'"b":{"dtype":"I8","shape":[1],"data_offsets":[9,10]}}')
    header += b" " * (-len(header) % 8)
    expected = struct.pack("<Q", len(header)) + header + bytes(10)
    assert path.read_bytes() == expected, f"expected {expected!r}\n     got {path.read_bytes()!r}"


FakeCupyArray = type("ndarray", (), {"__module__": "cupy"})


@pytest.mark.parametrize("value, what", [([1.0, 2.0], "list"), (3.0, "float"), (None, "NoneType"),
                                         (FakeCupyArray(), "cupy.ndarray")])
def test_save_rejects_values_that_are_not_numpy_arrays(tmp_path, value, what):
    path = tmp_path / "model.safetensors"
    with pytest.raises(ValueError, match=f"'w' is a .*{what}, not a numpy.ndarray") as info:
        nst.save_file({"w": value}, path)
    assert str(path) in str(info.value), info.value
    assert os.listdir(tmp_path) == [], f"a failed save left {os.listdir(tmp_path)}"


@pytest.mark.parametrize("tensors, metadata, message", [
    ({"w": np.zeros(2, np.complex64)}, None, "dtype complex64"),
    ({"w": np.array(["a"])}, None, "dtype <U1"),
    ({"__metadata__": np.zeros(1)}, None, "name '__metadata__'"),
    ({1: np.zeros(1)}, None, "name 1 must be a string"),
    ({"w": np.zeros(1)}, {"step": 3}, "metadata must map strings to strings"),
])
def test_save_rejects_what_safetensors_cannot_store(tmp_path, tensors, metadata, message):
    with pytest.raises(ValueError, match=message):
        nst.save_file(tensors, tmp_path / "model.safetensors", metadata=metadata)


# ---------------------------------------------------------------- BF16 and F16

def test_bf16_is_the_top_half_of_a_float32(tmp_path):
    # 1, -2.5, 0, -0, inf, -inf and the smallest BF16 subnormal
    bits = np.array([0x3F80, 0xC020, 0x0000, 0x8000, 0x7F80, 0xFF80, 0x0001], "<u2")
    path = raw_file(tmp_path / "bf16.safetensors", entry("w", 0, 14, [7], "BF16"), bits.tobytes())
    got = nst.load_file(path)["w"]
    want = np.array([1.0, -2.5, 0.0, -0.0, np.inf, -np.inf, 2.0**-133], np.float32)
    assert got.dtype == np.float32 and got.tobytes() == want.tobytes(), \
        f"expected {want}, got {got}"
    assert nst.read_header(path) == {"w": ("BF16", (7,))}, nst.read_header(path)


def test_bf16_and_f16_written_by_torch_read_as_torch_widens_them(tmp_path):
    torch = pytest.importorskip("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    special = torch.tensor([0.0, -0.0, 1.0, -2.5, float("inf"), float("-inf"), float("nan"),
                            1e-40, 3.0e38, 1e-45])
    values = torch.cat([special, torch.randn(50, generator=torch.Generator().manual_seed(0)) * 100])
    tensors = {"bf16": values.to(torch.bfloat16).reshape(6, 10), "f16": values.to(torch.float16),
               "bf16_scalar": torch.tensor(0.1, dtype=torch.bfloat16)}
    path = tmp_path / "torch.safetensors"
    safetensors_torch.save_file(tensors, str(path))
    loaded = nst.load_file(path)
    for name, tensor in tensors.items():
        want = tensor.float().numpy() if tensor.dtype == torch.bfloat16 else tensor.numpy()
        got = loaded[name]
        assert (got.dtype, got.shape) == (want.dtype, want.shape), \
            f"{name}: {got.dtype} {got.shape} vs {want.dtype} {want.shape}"
        assert got.tobytes() == want.tobytes(), f"{name}: expected {want}, got {got}"


# ---------------------------------------------------------------- the reference package

@settings(max_examples=40, deadline=None)
@given(tensors=tensor_dicts, metadata=st.none() | metadata_dicts)
def test_reference_reads_what_nanobert_writes(tmp_path_factory, tensors, metadata):
    safetensors = pytest.importorskip("safetensors")
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    path = tmp_path_factory.mktemp("to_reference") / "model.safetensors"
    nst.save_file(tensors, path, metadata=metadata)
    assert_same_tensors(tensors, safetensors_numpy.load_file(str(path)))
    with safetensors.safe_open(str(path), framework="np") as f:
        assert f.metadata() == metadata, f"reference sees metadata {f.metadata()}, wrote {metadata}"


@settings(max_examples=40, deadline=None)
@given(tensors=tensor_dicts, metadata=st.none() | metadata_dicts)
def test_nanobert_reads_what_reference_writes(tmp_path_factory, tensors, metadata):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    path = tmp_path_factory.mktemp("from_reference") / "model.safetensors"
    safetensors_numpy.save_file(tensors, str(path), metadata=metadata)
    assert_same_tensors(tensors, nst.load_file(path))
    loaded_metadata = nst.load_metadata(path)
    assert loaded_metadata == (metadata or {}), f"expected {metadata}, got {loaded_metadata}"


one_key = st.dictionaries(st.text(), st.text(), min_size=1, max_size=1)


@settings(max_examples=40, deadline=None)
@given(tensors=tensor_dicts, metadata=st.none() | one_key)
def test_nanobert_writes_the_same_bytes_as_the_reference(tmp_path_factory, tensors, metadata):
    # One metadata key at most: the reference writes several in hash-map (random) order.
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    path = tmp_path_factory.mktemp("bytes") / "model.safetensors"
    nst.save_file(tensors, path, metadata=metadata)
    expected = safetensors_numpy.save(tensors, metadata=metadata)
    assert path.read_bytes() == expected, f"expected {expected!r}\n     got {path.read_bytes()!r}"


ONE = b"\x00\x00\x80\x3f"  # 1.0f


@pytest.mark.parametrize("header, data, pad", [
    (entry("a", 0, 4), ONE, False),  # unpadded header, so the data is not aligned
    (b'  \n{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', ONE, True),
    ({**entry("b", 4, 8), **entry("a", 0, 4)}, bytes(4) + ONE, True),  # not in offset order
    ({}, b"", True),
    ({"__metadata__": {"format": "pt"}, **entry("z", 0, 0, [0, 3])}, b"", True),
], ids=["unpadded", "leading whitespace", "unordered", "no tensors", "zero-size"])
def test_reads_unusual_files_the_reference_accepts(tmp_path, header, data, pad):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    path = raw_file(tmp_path / "unusual.safetensors", header, data, pad=pad)
    assert_same_tensors(safetensors_numpy.load_file(str(path)), nst.load_file(path))


# ---------------------------------------------------------------- malformed files

DUPLICATE = json.dumps(entry("a", 0, 4))[:-1] + "," + json.dumps(entry("a", 4, 8))[1:]
MALFORMED = {  # id: (file bytes, or (header, data) for raw_file; expected message)
    "empty file": (b"", "0 bytes, shorter than the 8-byte header length"),
    "5-byte file": (b"\x08\x00\x00\x00\x00", "5 bytes, shorter than the 8-byte header length"),
    "header length past the end":
        (struct.pack("<Q", 64) + b"{}      ", "header length 64 runs past the end"),
    "header length 2**64-1":
        (struct.pack("<Q", 2**64 - 1), "header length 18446744073709551615 runs past"),
    "header not UTF-8": ((b'{"\xff":1}', b""), "not valid UTF-8 JSON"),
    "header not JSON": ((b'{"a": ', b""), "not valid UTF-8 JSON"),
    "header a JSON list": ((b"[]", b""), r"header is not a JSON object \(it starts with b'\['\)"),
    "unknown dtype": ((entry("a", 0, 1, [1], "Q7"), b"\x00"), "unsupported dtype 'Q7'"),
    "missing data_offsets":
        (({"a": {"dtype": "F32", "shape": [1]}}, bytes(4)), "needs dtype, shape and data_offsets"),
    "negative dimension": ((entry("a", 0, 4, [-1]), bytes(4)), "invalid shape"),
    "boolean dimension": ((entry("a", 0, 4, [True]), bytes(4)), "invalid shape"),
    "three data_offsets":
        (({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}}, bytes(8)),
         "invalid data_offsets"),
    "offsets past the data":
        ((entry("a", 0, 8), bytes(4)), r"\[0, 8\] out of range of the 4-byte data buffer"),
    "offsets reversed": ((entry("a", 4, 0, [1]), bytes(4)), r"\[4, 0\] out of range"),
    "offsets overlap":
        (({**entry("a", 0, 8), **entry("b", 4, 12)}, bytes(12)),
         r"'b' data_offsets \[4, 12\] overlap"),
    "offsets leave a gap":
        (({**entry("a", 0, 4), **entry("b", 8, 12)}, bytes(12)),
         r"'b' data_offsets \[8, 12\] leave a gap"),
    "trailing data":
        ((entry("a", 0, 4), bytes(8)), "tensors end at byte 4 of a 8-byte data buffer"),
    "bytes do not match shape":
        ((entry("a", 0, 8, [3]), bytes(8)), r"hold 8 bytes, but F32 \[3\] needs 12"),
    "duplicate names": ((DUPLICATE.encode(), bytes(8)), r"duplicate name\(s\) \['a'\]"),
    "metadata not strings":
        (({"__metadata__": {"step": 3}}, b""), "__metadata__ must map strings to strings"),
}


def write_malformed(path, content):
    if isinstance(content, bytes):
        path.write_bytes(content)
        return path
    return raw_file(path, *content)


@pytest.mark.parametrize("case", MALFORMED)
@pytest.mark.parametrize("reader", [nst.load_file, nst.read_header, nst.load_metadata])
def test_malformed_file_raises_value_error_naming_the_file_and_the_problem(tmp_path, case, reader):
    content, message = MALFORMED[case]
    path = write_malformed(tmp_path / "bad.safetensors", content)
    with pytest.raises(ValueError, match=message) as info:
        reader(path)
    assert str(path) in str(info.value), f"message does not name the file: {info.value}"


@pytest.mark.parametrize("case", MALFORMED)
def test_reference_rejects_the_same_malformed_files(tmp_path, case):
    # We are never stricter than the reference: every file we refuse, it refuses too.
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    path = write_malformed(tmp_path / "bad.safetensors", MALFORMED[case][0])
    with pytest.raises(Exception) as info:
        safetensors_numpy.load_file(str(path))
    assert type(info.value).__name__ == "SafetensorError", repr(info.value)


def test_unsupported_reference_dtype_is_refused_with_the_list_we_read(tmp_path):
    path = raw_file(tmp_path / "fp8.safetensors", entry("a", 0, 2, [2], "F8_E4M3"), bytes(2))
    with pytest.raises(ValueError,
                       match=r"unsupported dtype 'F8_E4M3' \(nanobert reads BOOL, .*BF16"):
        nst.load_file(path)


@pytest.mark.parametrize("reader", [nst.load_file, nst.read_header, nst.load_metadata])
def test_missing_file_raises_file_not_found_naming_the_path(tmp_path, reader):
    path = tmp_path / "missing.safetensors"
    with pytest.raises(FileNotFoundError) as info:
        reader(path)
    assert str(path) in str(info.value), info.value


def test_read_header_reads_only_the_header_bytes(tmp_path, monkeypatch):
    path = tmp_path / "model.safetensors"
    nst.save_file({"big": np.zeros((256, 256), np.float32)}, path)
    header_length = struct.unpack("<Q", path.read_bytes()[:8])[0]
    opened = []

    class CountingReader(io.BufferedReader):
        asked = 0

        def read(self, size=-1):
            data = super().read(size)
            self.asked += len(data)
            return data

        def readinto(self, buffer):
            count = super().readinto(buffer)
            self.asked += count
            return count

    def counting_open(file, mode="r"):
        opened.append(CountingReader(io.FileIO(file, mode)))
        return opened[-1]

    monkeypatch.setattr(nst, "open", counting_open, raising=False)
    assert nst.read_header(path) == {"big": ("F32", (256, 256))}
    asked = [f.asked for f in opened]
    assert asked == [8 + header_length], f"read {asked} bytes, header is {8 + header_length}"


# ---------------------------------------------------------------- atomic save

class DiskFullAfterHeader(io.BufferedWriter):
    """A file whose second write (the first tensor) stores half its bytes, then fails."""
    writes = 0

    def write(self, buffer):
        self.writes += 1
        if self.writes == 1:
            return super().write(buffer)
        super().write(memoryview(buffer)[: len(buffer) // 2])
        self.flush()
        raise OSError(errno.ENOSPC, "No space left on device (simulated)")


def disk_full_while_writing(monkeypatch):
    def fdopen(fd, mode, **kw):
        return DiskFullAfterHeader(io.FileIO(fd, mode))

    monkeypatch.setattr(os, "fdopen", fdopen)
    return OSError


def fsync_fails(monkeypatch):
    def fsync(fd):
        raise OSError(errno.EIO, "I/O error (simulated)")
    monkeypatch.setattr(os, "fsync", fsync)
    return OSError


def interrupted_before_replace(monkeypatch):
    def replace(source, destination):
        raise KeyboardInterrupt
    monkeypatch.setattr(os, "replace", replace)
    return KeyboardInterrupt


@pytest.mark.parametrize("inject_failure",
                         [disk_full_while_writing, fsync_fails, interrupted_before_replace])
def test_failed_save_keeps_the_previous_file_and_no_temporary(tmp_path, monkeypatch,
                                                              inject_failure):
    path = tmp_path / "model.safetensors"
    nst.save_file({"w": np.arange(4, dtype=np.float32)}, path)
    before = path.read_bytes()
    error = inject_failure(monkeypatch)
    with pytest.raises(error):
        nst.save_file({"w": np.full(1000, 7.0, np.float32), "b": np.ones(10)}, path)
    monkeypatch.undo()
    assert path.read_bytes() == before, "the previous file changed after a failed save"
    assert os.listdir(tmp_path) == ["model.safetensors"], f"left behind: {os.listdir(tmp_path)}"
    assert np.array_equal(nst.load_file(path)["w"], np.arange(4, dtype=np.float32))


def test_save_syncs_the_data_before_replacing_the_target(tmp_path, monkeypatch):
    calls, real_fsync, real_replace = [], os.fsync, os.replace

    def fsync(fd):
        calls.append("fsync")
        return real_fsync(fd)

    def replace(a, b):
        calls.append("replace")
        return real_replace(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    nst.save_file({"w": np.zeros(3)}, tmp_path / "model.safetensors")
    assert calls[:2] == ["fsync", "replace"], f"calls in order: {calls}"


@pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")
def test_saved_file_gets_umask_permissions_not_the_temporary_files_0600(tmp_path):
    umask = os.umask(0o022)
    try:
        path = tmp_path / "model.safetensors"
        nst.save_file({"w": np.zeros(3)}, path)
        mode = path.stat().st_mode & 0o777
    finally:
        os.umask(umask)
    assert mode == 0o644, f"mode {oct(mode)}, expected 0o644 (0o666 under umask 0o022)"
