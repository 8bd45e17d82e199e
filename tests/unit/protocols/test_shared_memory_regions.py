"""SharedMemoryRegions over a temporary directory standing in for /dev/shm: windows checked
against the region and the file, regions kept apart by caller, views alive past an unregister."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tensorgate.errors import InvalidInput, PermissionDenied
from tensorgate.protocols.shared_memory import (
    MAX_REGIONS,
    SharedMemoryRegions,
    SharedMemoryUse,
    grpc_peer_host,
    is_local_peer,
)
from tensorgate.types import DataType


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    (tmp_path / "data").write_bytes(np.arange(64, dtype=np.float32).tobytes())
    return tmp_path


def test_a_view_reads_the_registered_window(directory: Path) -> None:
    regions = SharedMemoryRegions(True, str(directory))
    regions.register("", "r", "/data", 16, 64)
    use = SharedMemoryUse(regions, "")
    params = {"shared_memory_region": "r", "shared_memory_byte_size": 16, "shared_memory_offset": 8}
    array = use.read(params, DataType.FP32, (4,), 4, "x")
    np.testing.assert_array_equal(array, [6, 7, 8, 9])  # 16 + 8 bytes in: the sixth float
    assert not array.flags.writeable  # a model cannot scribble on a client's memory


def test_an_array_outlives_the_unregister_of_its_region(directory: Path) -> None:
    regions = SharedMemoryRegions(True, str(directory))
    regions.register("", "r", "data", 0, 256)
    array = SharedMemoryUse(regions, "").read(
        {"shared_memory_region": "r", "shared_memory_byte_size": 256}, DataType.FP32, (64,), 64, "x"
    )
    regions.unregister("", "r")
    (directory / "data").unlink()
    np.testing.assert_array_equal(array, np.arange(64, dtype=np.float32))
    with pytest.raises(InvalidInput, match="no shared-memory region 'r'"):
        regions.window("", "r", 0, 4, "input 'x'")


def test_callers_see_only_their_own_regions(directory: Path) -> None:
    regions = SharedMemoryRegions(True, str(directory))
    regions.register("alice", "r", "data", 0, 64)
    regions.register("bob", "r", "data", 64, 64)  # the same name, another caller: no clash
    assert [r["offset"] for r in regions.status("alice", None)] == [0]
    with pytest.raises(InvalidInput):
        SharedMemoryUse(regions, "carol").read(
            {"shared_memory_region": "r", "shared_memory_byte_size": 4}, DataType.FP32, (1,), 1, "x"
        )
    regions.unregister("alice", None)
    assert regions.status("alice", None) == []
    assert len(regions.status("bob", None)) == 1


def test_regions_per_caller_are_bounded(directory: Path) -> None:
    regions = SharedMemoryRegions(True, str(directory))
    for index in range(MAX_REGIONS):
        regions.register("", f"r{index}", "data", 0, 4)
    with pytest.raises(InvalidInput, match=f"at most {MAX_REGIONS}"):
        regions.register("", "one-more", "data", 0, 4)
    regions.unregister("", None)


def test_outputs_are_written_in_place_and_checked_for_room(directory: Path) -> None:
    regions = SharedMemoryRegions(True, str(directory))
    regions.register("", "out", "data", 0, 64)
    use = SharedMemoryUse(regions, "")
    use.target("y", {"shared_memory_region": "out", "shared_memory_byte_size": 8, "shared_memory_offset": 4})
    use.write("y", np.array([1.5, -2.0], dtype=np.float32), DataType.FP32)
    written = np.frombuffer((directory / "data").read_bytes()[4:12], dtype=np.float32)
    np.testing.assert_array_equal(written, [1.5, -2.0])
    use.target("z", {"shared_memory_region": "out", "shared_memory_byte_size": 4})
    with pytest.raises(InvalidInput, match="needs 8 bytes"):
        use.write("z", np.zeros(2, dtype=np.float32), DataType.FP32)
    regions.unregister("", None)


def test_off_and_remote_callers_are_refused() -> None:
    with pytest.raises(PermissionDenied, match=r"server\.shared_memory"):
        SharedMemoryRegions(False).register("", "r", "data", 0, 4)
    with pytest.raises(PermissionDenied, match="own host"):
        SharedMemoryRegions(True).check_caller(local=False)
    use = SharedMemoryUse(SharedMemoryRegions(True), "", local=False)
    with pytest.raises(PermissionDenied):
        use.target("y", {"shared_memory_region": "r", "shared_memory_byte_size": 4})


@pytest.mark.parametrize(
    ("host", "local"),
    [
        *[("127.0.0.1", True), ("127.8.0.2", True), ("::1", True), ("[::1]", True), ("::ffff:127.0.0.1", True)],
        *[(None, True), ("10.0.0.5", False), ("192.168.1.2", False), ("::ffff:10.0.0.1", False), ("unknown", False)],
    ],
)
def test_local_peers(host: str | None, local: bool) -> None:
    assert is_local_peer(host) is local


def test_grpc_peer_forms() -> None:
    assert grpc_peer_host("ipv4:127.0.0.1:50051") == "127.0.0.1"
    assert grpc_peer_host("ipv6:[::1]:50051") == "[::1]"
    assert grpc_peer_host("unix:/run/tg.sock") is None
    assert grpc_peer_host("unknown") == "unknown"
