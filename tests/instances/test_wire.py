"""The worker wire: frames and tensors in shared memory, and what a malformed peer gets."""

from __future__ import annotations

import numpy as np
import pytest

from tensorgate.instances.batch_tensors import merge_inputs
from tensorgate.instances.wire import (
    HEADER,
    Kind,
    Region,
    WireError,
    decode_header,
    decode_meta,
    encode_frame,
    read_tensors,
    write_batch,
    write_tensors,
)


@pytest.fixture()
def region() -> Region:
    r = Region.create("test-wire", 1024)
    yield r
    r.close()


def test_tensors_round_trip_through_a_region_that_grows(region: Region) -> None:
    tensors = {
        "big": np.arange(100_000, dtype=np.float32).reshape(1000, 100),
        "flags": np.array([[True, False]]),
        "text": np.array([b"a", b"", b"\x00nul"], dtype=object),
        "half": np.array([1.5, -2.0], dtype=np.float16),
    }
    described = write_tensors(region, tensors)
    assert region.size >= 400_000
    reader = Region(region.fd)  # the other process maps the same memfd
    reader.ensure(region.size, grow_file=False)
    back = read_tensors(reader, described, copy=True)
    for name, array in tensors.items():
        np.testing.assert_array_equal(back[name], array)
        assert back[name].dtype == array.dtype


def test_a_batch_written_from_its_parts_is_the_merged_batch(region: Region) -> None:
    """Each request's rows land where the merged batch has them, whatever their layout."""
    rng = np.random.default_rng(0)
    parts = [
        {
            "x": rng.standard_normal((rows, 3, 4)).astype(np.float32),
            "ids": np.arange(rows * 2, dtype=np.int64).reshape(rows, 2) + 100 * rows,
            "text": np.array([[f"r{rows}-{i}".encode()] for i in range(rows)], dtype=object),
        }
        for rows in (1, 3, 2)
    ]
    parts[1]["x"] = np.asfortranarray(parts[1]["x"])  # a request's tensor need not be C-contiguous
    merged = merge_inputs(parts)
    described = write_batch(region, parts)
    back = read_tensors(region, described, copy=True)
    assert [d["shape"] for d in described] == [[6, 3, 4], [6, 2], [6, 1]]
    for name, array in merged.items():
        np.testing.assert_array_equal(back[name], array)
        assert back[name].dtype == array.dtype


def test_frames_round_trip() -> None:
    frame = encode_frame(Kind.EXECUTE, 7, 4096, {"tensors": []})
    kind, seq, size, meta_len = decode_header(frame[: HEADER.size])
    assert (kind, seq, size) == (Kind.EXECUTE, 7, 4096)
    assert decode_meta(frame[HEADER.size : HEADER.size + meta_len]) == {"tensors": []}


@pytest.mark.parametrize(
    "described",
    [
        [{"name": "x", "datatype": "FP32", "shape": [4], "offset": 1 << 30, "nbytes": 16}],
        [{"name": "x", "datatype": "FP32", "shape": [4], "offset": -8, "nbytes": 16}],
        [{"name": "x", "datatype": "FP32", "shape": [5], "offset": 0, "nbytes": 16}],
        [{"name": "x", "datatype": "FP99", "shape": [4], "offset": 0, "nbytes": 16}],
        [{"name": "x", "datatype": "BYTES", "shape": [3], "offset": 0, "nbytes": 4}],
        [{"name": "x"}],
        "not a list",
    ],
)
def test_descriptions_outside_the_region_or_malformed_are_refused(region: Region, described: object) -> None:
    with pytest.raises(WireError):
        read_tensors(region, described, copy=True)


def test_a_frame_that_is_not_ours_is_refused() -> None:
    with pytest.raises(WireError):
        decode_header(b"XXXX" + bytes(HEADER.size - 4))
    with pytest.raises(WireError):
        decode_meta(b"\x80\x04pickle")
