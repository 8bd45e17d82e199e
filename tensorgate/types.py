"""The core vocabulary: datatypes, tensor specs, requests and responses.

Everything below the protocol layer speaks in these types; nothing here knows HTTP or gRPC.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

Array: TypeAlias = npt.NDArray[Any]


class DataType(enum.Enum):
    """The KServe V2 tensor datatypes, by their protocol names."""

    BOOL = "BOOL"
    UINT8 = "UINT8"
    UINT16 = "UINT16"
    UINT32 = "UINT32"
    UINT64 = "UINT64"
    INT8 = "INT8"
    INT16 = "INT16"
    INT32 = "INT32"
    INT64 = "INT64"
    FP16 = "FP16"
    FP32 = "FP32"
    FP64 = "FP64"
    BYTES = "BYTES"

    @classmethod
    def parse(cls, name: object) -> DataType:
        found = _BY_NAME.get(name) if isinstance(name, str) else None  # a dict: Enum lookup is slow
        if found is not None:
            return found
        raise ValueError(f"unknown datatype {name!r}; expected one of {', '.join(d.value for d in cls)}")

    @property
    def numpy(self) -> np.dtype[Any]:
        return _TO_NUMPY[self]

    @property
    def itemsize(self) -> int:
        """Bytes per element in the raw encoding; 0 for BYTES, whose elements vary."""
        return 0 if self is DataType.BYTES else self.numpy.itemsize

    @classmethod
    def from_numpy(cls, dtype: np.dtype[Any]) -> DataType:
        found = _FROM_NUMPY.get(dtype)  # the common dtypes in one lookup
        if found is not None:
            return found
        if dtype.kind in ("O", "S", "U"):
            return cls.BYTES
        try:
            return _FROM_NUMPY[np.dtype(dtype)]
        except KeyError:
            raise ValueError(f"numpy dtype {dtype} has no V2 datatype") from None


_TO_NUMPY: dict[DataType, np.dtype[Any]] = {
    DataType.BOOL: np.dtype(np.bool_),
    DataType.UINT8: np.dtype(np.uint8),
    DataType.UINT16: np.dtype(np.uint16),
    DataType.UINT32: np.dtype(np.uint32),
    DataType.UINT64: np.dtype(np.uint64),
    DataType.INT8: np.dtype(np.int8),
    DataType.INT16: np.dtype(np.int16),
    DataType.INT32: np.dtype(np.int32),
    DataType.INT64: np.dtype(np.int64),
    DataType.FP16: np.dtype(np.float16),
    DataType.FP32: np.dtype(np.float32),
    DataType.FP64: np.dtype(np.float64),
    DataType.BYTES: np.dtype(object),
}
_BY_NAME: dict[str, DataType] = {d.value: d for d in DataType}
_FROM_NUMPY: dict[np.dtype[Any], DataType] = {v: k for k, v in _TO_NUMPY.items() if k is not DataType.BYTES}


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """A named tensor as V2 metadata reports it: shape includes the batch dimension; -1 is dynamic."""

    name: str
    datatype: DataType
    shape: tuple[int, ...]

    def to_metadata(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype.value, "shape": list(self.shape)}


@dataclass(frozen=True, slots=True)
class Tenant:
    """Who a request is queued for, in fair sharing: its name, its share, and its own queue bound.

    Resolved by the protocol layer (the authenticated identity, else a header), so the scheduler
    reads the share from the request instead of a table of its own.
    """

    name: str
    weight: float = 1.0
    max_queued: int | None = None  # per model version's queue; None: only the queue's own bound

    def __init__(self, name: str, weight: float = 1.0, max_queued: int | None = None) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "weight", weight)
        object.__setattr__(self, "max_queued", max_queued)


# Every request of a server without fair sharing, and of clients that name no tenant.
SHARED_TENANT = Tenant("")


@dataclass(frozen=True, slots=True)
class InferRequest:
    """One client request, decoded and validated against the model's tensor specs.

    ``inputs`` hold numpy arrays; for a batching model axis 0 is the batch. ``timeout_s`` is the
    client's relative deadline (from the V2 ``timeout`` parameter or a gRPC deadline); the
    scheduler turns it into an absolute deadline on its own clock at admission.
    """

    model: str
    inputs: Mapping[str, Array]
    version: int | None = None
    outputs: tuple[str, ...] = ()
    parameters: Mapping[str, Any] = field(default_factory=dict)
    priority: int | None = None
    timeout_s: float | None = None
    id: str = ""
    request_id: str = ""
    traceparent: str | None = None
    tenant: Tenant = SHARED_TENANT

    # The __init__ methods here and on the other per-request classes are written out: compiled with
    # mypyc, a dataclass keeps the generated __init__, which stays interpreted (about 1 us for ten
    # fields, against 0.1 us compiled; a small model's request builds several of these objects).
    def __init__(
        self,
        model: str,
        inputs: Mapping[str, Array],
        version: int | None = None,
        outputs: tuple[str, ...] = (),
        parameters: Mapping[str, Any] | None = None,
        priority: int | None = None,
        timeout_s: float | None = None,
        id: str = "",
        request_id: str = "",
        traceparent: str | None = None,
        tenant: Tenant = SHARED_TENANT,
    ) -> None:
        _set = object.__setattr__  # frozen
        _set(self, "model", model)
        _set(self, "inputs", inputs)
        _set(self, "version", version)
        _set(self, "outputs", outputs)
        _set(self, "parameters", {} if parameters is None else parameters)
        _set(self, "priority", priority)
        _set(self, "timeout_s", timeout_s)
        _set(self, "id", id)
        _set(self, "request_id", request_id)
        _set(self, "traceparent", traceparent)
        _set(self, "tenant", tenant)

    # Copies with what the protocols and the service add after decoding, written out: on this
    # class dataclasses.replace costs several microseconds a request, a constructor call a fraction.
    def with_context(self, request_id: str, traceparent: str | None, tenant: Tenant) -> InferRequest:
        """The same request with its ids, its trace context and its tenant."""
        return self._copy(self.timeout_s, request_id, traceparent, tenant)

    def with_timeout(self, timeout_s: float | None) -> InferRequest:
        """The same request with another relative deadline."""
        return self._copy(timeout_s, self.request_id, self.traceparent, self.tenant)

    def _copy(self, timeout_s: float | None, request_id: str, traceparent: str | None, tenant: Tenant) -> InferRequest:
        return InferRequest(
            self.model,
            self.inputs,
            self.version,
            self.outputs,
            self.parameters,
            self.priority,
            timeout_s,
            self.id,
            request_id,
            traceparent,
            tenant,
        )


@dataclass(frozen=True, slots=True)
class InferResponse:
    model: str
    version: int
    outputs: Mapping[str, Array]
    id: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)
    queue_s: float = 0.0  # admission to dispatch
    compute_s: float = 0.0  # the batch's execution on its instance

    def __init__(
        self,
        model: str,
        version: int,
        outputs: Mapping[str, Array],
        id: str = "",
        parameters: Mapping[str, Any] | None = None,
        queue_s: float = 0.0,
        compute_s: float = 0.0,
    ) -> None:
        _set = object.__setattr__  # frozen
        _set(self, "model", model)
        _set(self, "version", version)
        _set(self, "outputs", outputs)
        _set(self, "id", id)
        _set(self, "parameters", {} if parameters is None else parameters)
        _set(self, "queue_s", queue_s)
        _set(self, "compute_s", compute_s)


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    name: str
    versions: tuple[int, ...]
    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int

    def to_v2(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "versions": [str(v) for v in self.versions],
            "platform": self.platform,
            "inputs": [s.to_metadata() for s in self.inputs],
            "outputs": [s.to_metadata() for s in self.outputs],
        }
