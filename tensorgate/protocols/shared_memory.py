"""Triton's system shared-memory extension: tensors read from and written to POSIX regions that a
client on the same host registered, instead of travelling through the socket.

A client creates ``/dev/shm/<key>`` (``tritonclient.utils.shared_memory``), registers a window of it
(``offset``, ``byte_size``) under a region name, and names that region in an input's or requested
output's parameters (``shared_memory_region``, ``shared_memory_byte_size``,
``shared_memory_offset``). An input is then a numpy view of the mapping (no copy reaches the model
unless batching joins it with other requests); an output is copied into the region once, and the
answer carries no data for it.

What keeps this safe (checklist S-12):

- off unless ``server.shared_memory: system``; only callers on this host (a loopback peer) may
  register or use a region, since a region is a file of this host; with authentication on, each
  caller registers, sees and uses only its own regions;
- a key is one name inside ``/dev/shm``: no ``/`` inside it, no ``.``/``..``, opened without
  following a symlink, and only a regular file;
- the window is checked against the file's real size when it is registered, and again (the file
  may have shrunk) before every request that uses it; every tensor's offset and size is checked
  against the window before a byte is read; sizes and offsets are non-negative integers;
- errors name the region, never the path;
- a region unregistered while requests use it leaves the namespace at once and stays mapped until
  the last of them ends: Python's buffer references keep the pages of any array made from it, so
  nothing reads memory that was unmapped.
"""

from __future__ import annotations

import ipaddress
import mmap
import os
import re
import stat
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorgate.errors import InvalidInput, NotFound, PermissionDenied
from tensorgate.protocols.tensor_codec import from_raw, to_raw
from tensorgate.security.identity import Identity
from tensorgate.types import Array, DataType

SHM_DIRECTORY = "/dev/shm"
MAX_REGIONS = 256  # per caller
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_KEY = re.compile(r"^/?[A-Za-z0-9_.:-]{1,250}$")
_PARAMETERS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")

OFF_MESSAGE = "system shared memory is off on this server (server.shared_memory: system turns it on)"
REMOTE_MESSAGE = "shared memory is only for clients on the server's own host (a loopback connection)"


def check_region_name(name: Any) -> str:
    """A region name as a client may give one: 400 for anything else."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidInput("a shared-memory region name is 1-128 letters, digits, '_', '.', ':' or '-'")
    return name


class CudaRegions:
    """Triton's CUDA shared-memory extension as a server without GPU support answers it (Triton built
    without one does the same): nothing can be registered, so the status lists nothing and unregistering
    (one region or all) succeeds doing nothing. Triton's example clients and perf_analyzer unregister
    CUDA regions whether they used any or not. Whatever the host has: tensors from the GPU come
    through system shared memory (docs/shared-memory.md)."""

    @staticmethod
    def status(name: str | None) -> list[dict[str, Any]]:
        if name is not None:
            raise NotFound(f"Unable to find cuda shared memory region: '{check_region_name(name)}'")
        return []

    @staticmethod
    def register(name: str) -> None:
        raise InvalidInput(
            f"failed to register CUDA shared memory region: '{check_region_name(name)}', GPUs not supported "
            "(this server takes tensors through system shared memory)"
        )

    @staticmethod
    def unregister(name: str | None) -> None:
        if name is not None:
            check_region_name(name)  # a name no region could have is a client's error, as everywhere
        # No region was ever registered: unregistering one, or all, is done.


def is_local_peer(host: str | None) -> bool:
    """Whether a connection's peer address is loopback (``None``: a Unix socket, also local)."""
    if host is None:
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)  # a dual-stack socket's view of an IPv4 peer
    return bool((mapped or address).is_loopback)


def grpc_peer_host(peer: str) -> str | None:
    """The address in gRPC's peer form (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``, ``unix:...``)."""
    kind, _, rest = peer.partition(":")
    if kind == "unix":
        return None
    return rest.rpartition(":")[0] if kind in ("ipv4", "ipv6") else "unknown"


def uses_shared_memory(parameters: Any) -> bool:
    return "shared_memory_region" in parameters


def region_owner(identity: Identity | None) -> str:
    """Whose regions a caller sees: its identity's, or everyone's ("") where authentication is off."""
    return "" if identity is None else identity.name


@dataclass(slots=True)
class _Region:
    name: str
    key: str
    offset: int
    byte_size: int
    fd: int
    mapping: mmap.mmap
    window: memoryview  # the registered bytes: mapping[offset : offset + byte_size]

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def check_size(self) -> None:
        """The file may have been truncated since: reading past its end would be a SIGBUS."""
        if os.fstat(self.fd).st_size < self.offset + self.byte_size:
            raise InvalidInput(f"shared-memory region '{self.name}' is smaller than when it was registered")


def _non_negative(value: Any, what: str) -> int:
    if type(value) is not int or value < 0:
        raise InvalidInput(f"{what} must be a non-negative integer")
    return value


class SharedMemoryRegions:
    """The registered regions, by caller (the identity's name, or "" where authentication is off)."""

    def __init__(self, enabled: bool, directory: str = SHM_DIRECTORY) -> None:
        self.enabled = enabled
        self._directory = directory
        self._regions: dict[tuple[str, str], _Region] = {}
        self._lock = threading.Lock()  # decoding runs off the loop for large bodies

    def _on(self) -> None:
        if not self.enabled:
            raise PermissionDenied(OFF_MESSAGE)

    def check_caller(self, local: bool) -> None:
        """Refuse a caller that shared memory cannot be for (403): off here, or not on this host."""
        self._on()
        if not local:
            raise PermissionDenied(REMOTE_MESSAGE)

    def register(self, owner: str, name: str, key: Any, offset: Any, byte_size: Any) -> None:
        self._on()
        check_region_name(name)
        if not isinstance(key, str) or not _KEY.match(key) or key.strip("/") in (".", ".."):
            raise InvalidInput(f"region '{name}': the key must name one shared-memory object, like '/my_region'")
        offset = _non_negative(offset, f"region '{name}': offset")
        byte_size = _non_negative(byte_size, f"region '{name}': byte_size")
        if byte_size == 0:
            raise InvalidInput(f"region '{name}': byte_size must be positive")
        with self._lock:
            if (owner, name) in self._regions:
                raise InvalidInput(f"shared-memory region '{name}' is already registered; unregister it first")
            if sum(1 for o, _ in self._regions if o == owner) >= MAX_REGIONS:
                raise InvalidInput(f"at most {MAX_REGIONS} shared-memory regions may be registered at once")
            self._regions[(owner, name)] = self._open(name, key, offset, byte_size)

    def _open(self, name: str, key: str, offset: int, byte_size: int) -> _Region:
        path = os.path.join(self._directory, key.lstrip("/"))
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            raise InvalidInput(f"region '{name}': no shared-memory object with that key can be opened") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidInput(f"region '{name}': the key does not name a shared-memory object")
            if offset + byte_size > info.st_size:
                raise InvalidInput(
                    f"region '{name}': offset {offset} + byte_size {byte_size} runs past the end of the "
                    f"shared-memory object ({info.st_size} bytes)"
                )
            mapping = mmap.mmap(fd, offset + byte_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        window = memoryview(mapping)[offset : offset + byte_size]
        return _Region(name, key, offset, byte_size, fd, mapping, window)

    def unregister(self, owner: str, name: str | None) -> None:
        """One region, or every region of ``owner`` (``name`` empty or None). Requests already using a
        region finish with it; the mapping goes when the last reference to its pages does."""
        self._on()
        with self._lock:
            if name:
                region = self._regions.pop((owner, name), None)
                if region is None:
                    raise InvalidInput(f"no shared-memory region '{name}' is registered")
                gone = [region]
            else:
                gone = [self._regions.pop(k) for k in [k for k in self._regions if k[0] == owner]]
        for region in gone:
            os.close(region.fd)

    def status(self, owner: str, name: str | None) -> list[dict[str, Any]]:
        self._on()
        with self._lock:
            if name:
                region = self._regions.get((owner, name))
                if region is None:
                    raise InvalidInput(f"no shared-memory region '{name}' is registered")
                return [region.status()]
            return [r.status() for (o, _), r in sorted(self._regions.items()) if o == owner]

    def window(self, owner: str, name: Any, offset: Any, byte_size: Any, tensor: str) -> tuple[memoryview, str]:
        """The bytes ``[offset, offset + byte_size)`` of a registered region, checked against it."""
        if not isinstance(name, str):
            raise InvalidInput(f"{tensor}: shared_memory_region must be a string")
        size = _non_negative(byte_size, f"{tensor}: shared_memory_byte_size")
        start = _non_negative(0 if offset is None else offset, f"{tensor}: shared_memory_offset")
        with self._lock:
            region = self._regions.get((owner, name))
            if region is None:
                raise InvalidInput(f"{tensor}: no shared-memory region '{name[:128]}' is registered")
            region.check_size()
            if start + size > region.byte_size:
                raise InvalidInput(
                    f"{tensor}: offset {start} + byte size {size} runs past the end of shared-memory region "
                    f"'{name}' ({region.byte_size} bytes)"
                )
            return region.window[start : start + size], name


class SharedMemoryUse:
    """The shared memory one request reads and writes: its inputs' views, its outputs' targets."""

    def __init__(self, regions: SharedMemoryRegions | None, owner: str, local: bool = True) -> None:
        self._regions = regions
        self._owner = owner
        self._local = local
        self.targets: dict[str, tuple[memoryview, str, int]] = {}  # output -> (window, region, offset)

    def _window(self, parameters: Any, tensor: str) -> tuple[memoryview, str]:
        if self._regions is None:
            raise PermissionDenied(OFF_MESSAGE)
        self._regions.check_caller(self._local)
        if "shared_memory_byte_size" not in parameters:
            raise InvalidInput(f"{tensor}: shared_memory_byte_size is required with shared_memory_region")
        return self._regions.window(
            self._owner,
            parameters["shared_memory_region"],
            parameters.get("shared_memory_offset"),
            parameters["shared_memory_byte_size"],
            tensor,
        )

    def read(self, parameters: Any, datatype: DataType, shape: tuple[int, ...], count: int, name: str) -> Array:
        """The input as a view of the region (BYTES elements are copied out: they are objects)."""
        view, _ = self._window(parameters, f"input '{name}'")
        return from_raw(view.toreadonly(), datatype, shape, count, name)

    def target(self, name: str, parameters: Any) -> None:
        view, region = self._window(parameters, f"output '{name}'")
        offset = parameters.get("shared_memory_offset") or 0
        self.targets[name] = (view, region, offset)

    def write(self, name: str, array: Array, datatype: DataType) -> None:
        """Copy an output into its region (its answer then carries its name, datatype and shape only)."""
        view, region, _ = self.targets[name]
        if datatype is DataType.BYTES:
            raw = to_raw(array, datatype)
            size = len(raw)
            self._fits(name, region, size, len(view))
            view[:size] = raw
        else:
            size = array.size * datatype.itemsize
            self._fits(name, region, size, len(view))
            destination = np.frombuffer(view, dtype=np.dtype(datatype.numpy).newbyteorder("<"), count=array.size)
            np.copyto(destination.reshape(array.shape), array, casting="same_kind")

    @staticmethod
    def _fits(name: str, region: str, size: int, room: int) -> None:
        if size > room:
            raise InvalidInput(
                f"output '{name}' needs {size} bytes, but its window of shared-memory region '{region}' holds {room}"
            )


# Where the server has no shared memory for a request: naming a region is refused as "off".
NO_SHARED_MEMORY = SharedMemoryUse(None, "")
