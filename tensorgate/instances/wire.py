"""The wire between the server and a worker process: framed messages, tensors in shared memory.

Each frame is a fixed binary header plus a small JSON description of the tensors (names, datatypes,
shapes, offsets). Tensor bytes never travel in the frame: they sit in a memfd-backed shared memory
region that both processes map. Nothing on this wire is ever unpickled; JSON and fixed-width
integers cannot run code.
"""

from __future__ import annotations

import enum
import mmap
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from tensorgate import bytes_elements
from tensorgate.instances.batch_tensors import batch_shape, copy_rows
from tensorgate.types import Array, DataType

MAGIC = b"TGW1"
HEADER = struct.Struct("<4sBIQI")  # magic, kind, sequence number, region size, JSON length
MAX_META_BYTES = 1 << 20
ALIGN = 64


class Kind(enum.IntEnum):
    READY = 1  # worker -> server: loaded; meta holds input and output specs
    EXECUTE = 2  # server -> worker: run the batch described by meta, inputs in the input region
    RESULT = 3  # worker -> server: outputs in the output region
    ERROR = 4  # worker -> server: the model raised; meta holds the message
    LOAD_FAILED = 5  # worker -> server: the load failed; meta holds the message


class WireError(Exception):
    """A malformed frame: the peer is not a tensorgate worker (or is broken)."""


@dataclass(frozen=True, slots=True)
class Frame:
    kind: Kind
    seq: int
    region_size: int
    meta: dict[str, Any]


def encode_frame(kind: Kind, seq: int, region_size: int, meta: Mapping[str, Any]) -> bytes:
    body = orjson.dumps(meta)
    if len(body) > MAX_META_BYTES:
        raise WireError("frame metadata too large")
    return HEADER.pack(MAGIC, int(kind), seq, region_size, len(body)) + body


def decode_header(raw: bytes) -> tuple[Kind, int, int, int]:
    magic, kind, seq, region_size, meta_len = HEADER.unpack(raw)
    if magic != MAGIC or meta_len > MAX_META_BYTES:
        raise WireError("bad frame header")
    try:
        return Kind(kind), seq, region_size, meta_len
    except ValueError:
        raise WireError(f"unknown frame kind {kind}") from None


def decode_meta(raw: bytes) -> dict[str, Any]:
    try:
        meta = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise WireError("frame metadata is not JSON") from None
    if not isinstance(meta, dict):
        raise WireError("frame metadata must be an object")
    return meta


class Region:
    """A growable shared-memory region over a memfd that both processes hold."""

    def __init__(self, fd: int, size: int = 0) -> None:
        self.fd = fd
        self.size = 0
        self._map: mmap.mmap | None = None
        if size:
            self.ensure(size, grow_file=True)

    @classmethod
    def create(cls, name: str, size: int) -> Region:
        fd = os.memfd_create(name, 0)
        return cls(fd, size)

    def ensure(self, size: int, *, grow_file: bool) -> None:
        """Map at least ``size`` bytes; the writer grows the file, the reader only remaps."""
        if size <= self.size and self._map is not None:
            return
        if grow_file:
            size = max(size, self.size * 2, 1 << 16)
            os.ftruncate(self.fd, size)
        old = self._map
        self._map = mmap.mmap(self.fd, size)
        self.size = size
        if old is not None:
            try:
                old.close()
            except BufferError:  # an array still views the old map; it goes when that array does
                pass

    @property
    def buffer(self) -> mmap.mmap:
        assert self._map is not None, "region not mapped"
        return self._map

    def close(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass
            self._map = None
        try:
            os.close(self.fd)
        except OSError:
            pass


def write_tensors(region: Region, tensors: Mapping[str, Array]) -> list[dict[str, Any]]:
    """Lay tensors out in the region (64-byte aligned); returns their descriptions for the frame."""
    return write_batch(region, [tensors])


def write_batch(
    region: Region, parts: Sequence[Mapping[str, Array]], pads: Mapping[str, float] | None = None
) -> list[dict[str, Any]]:
    """Lay out the batch that ``parts`` (each request's inputs) make, merged along axis 0.

    Each part is copied once, straight to its rows in the region: merging first and then copying
    the merged batch in would move every byte twice on the event loop. BYTES tensors are packed
    from the merged elements. ``pads``: the ragged inputs' pad values (``batch_tensors``).
    """
    first = parts[0]
    payloads: list[tuple[str, DataType, tuple[int, ...], list[Array] | bytes, int]] = []
    total = 0
    for name, array in first.items():
        datatype = DataType.from_numpy(array.dtype)
        arrays = [part[name] for part in parts]
        if datatype is DataType.BYTES:
            merged = arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0)
            blob = bytes_elements.pack(merged)
            payloads.append((name, datatype, tuple(merged.shape), blob, len(blob)))
            nbytes = len(blob)
        else:
            shape = batch_shape(arrays)
            nbytes = int(np.prod(shape, dtype=np.int64)) * datatype.itemsize
            payloads.append((name, datatype, shape, arrays, nbytes))
        total += (nbytes + ALIGN - 1) // ALIGN * ALIGN
    region.ensure(total, grow_file=True)
    described = []
    offset = 0
    buf = region.buffer
    for name, datatype, shape, payload, nbytes in payloads:
        if isinstance(payload, bytes):
            buf[offset : offset + nbytes] = payload
        elif nbytes:
            target = np.ndarray(shape, dtype=datatype.numpy, buffer=buf, offset=offset)
            if len(payload) == 1:
                np.copyto(target, payload[0])
            else:
                copy_rows(target, payload, None if pads is None else pads.get(name))
        described.append(
            {"name": name, "datatype": datatype.value, "shape": list(shape), "offset": offset, "nbytes": nbytes}
        )
        offset += (nbytes + ALIGN - 1) // ALIGN * ALIGN
    return described


def read_tensors(region: Region, described: Any, *, copy: bool) -> dict[str, Array]:
    """Arrays for the described tensors; every offset and size is checked against the region."""
    if not isinstance(described, list):
        raise WireError("tensor descriptions must be a list")
    out: dict[str, Array] = {}
    buf = region.buffer
    for entry in described:
        try:
            name, datatype = str(entry["name"]), DataType.parse(entry["datatype"])
            shape = tuple(int(d) for d in entry["shape"])
            offset, nbytes = int(entry["offset"]), int(entry["nbytes"])
        except (KeyError, TypeError, ValueError) as exc:
            raise WireError(f"bad tensor description: {exc}") from None
        if offset < 0 or nbytes < 0 or offset + nbytes > region.size or any(d < 0 for d in shape):
            raise WireError(f"tensor '{name}' lies outside the shared region")
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if datatype is DataType.BYTES:
            try:
                out[name] = bytes_elements.unpack(memoryview(buf)[offset : offset + nbytes], count).reshape(shape)
            except ValueError as exc:
                raise WireError(f"tensor '{name}': {exc}") from None
            continue
        if count * datatype.itemsize != nbytes:
            raise WireError(f"tensor '{name}' size does not match its shape")
        array = np.ndarray(shape, dtype=datatype.numpy, buffer=buf, offset=offset)
        out[name] = array.copy() if copy else array
    return out
