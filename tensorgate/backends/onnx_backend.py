"""ONNX Runtime: one InferenceSession per instance, created at load, never per request."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnxruntime as ort

from tensorgate.backends.base import Backend, Device, LoadSpec
from tensorgate.errors import ModelLoadError
from tensorgate.types import Array, DataType, TensorSpec

_DATATYPES = {
    "tensor(bool)": DataType.BOOL,
    "tensor(uint8)": DataType.UINT8,
    "tensor(uint16)": DataType.UINT16,
    "tensor(uint32)": DataType.UINT32,
    "tensor(uint64)": DataType.UINT64,
    "tensor(int8)": DataType.INT8,
    "tensor(int16)": DataType.INT16,
    "tensor(int32)": DataType.INT32,
    "tensor(int64)": DataType.INT64,
    "tensor(float16)": DataType.FP16,
    "tensor(float)": DataType.FP32,
    "tensor(double)": DataType.FP64,
    "tensor(string)": DataType.BYTES,
}

_PROVIDERS = {
    "cpu": ("CPUExecutionProvider", "onnxruntime"),
    "gpu": ("CUDAExecutionProvider", "onnxruntime-gpu (CUDA)"),
    "npu": ("CANNExecutionProvider", "onnxruntime built with the Ascend CANN execution provider"),
}


def providers_for(device: Device) -> list[Any]:
    """The execution provider for a device kind; a missing one is a load failure, never a fallback."""
    name, package = _PROVIDERS[device.kind]
    available = ort.get_available_providers()
    if name not in available:
        raise ModelLoadError(
            f"device {device} needs onnxruntime's {name}, which this installation lacks "
            f"(available: {', '.join(available)}); install {package}"
        )
    if device.kind == "cpu":
        return [name]
    return [(name, {"device_id": device.index})]


def _spec(arg: Any) -> TensorSpec:
    datatype = _DATATYPES.get(arg.type)
    if datatype is None:
        raise ModelLoadError(f"tensor {arg.name!r} has type {arg.type}, which tensorgate cannot serve")
    shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (arg.shape or []))
    return TensorSpec(arg.name, datatype, shape)


class OnnxBackend(Backend):
    platform = "onnxruntime_onnx"

    def __init__(self) -> None:
        self._session: ort.InferenceSession | None = None
        self._inputs: tuple[TensorSpec, ...] = ()
        self._outputs: tuple[TensorSpec, ...] = ()
        self._string_inputs: frozenset[str] = frozenset()

    def load(self, spec: LoadSpec) -> None:
        options = ort.SessionOptions()
        threads = spec.config.onnxruntime
        options.intra_op_num_threads = threads.intra_op_threads
        options.inter_op_num_threads = threads.inter_op_threads
        if not threads.allow_spinning:
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        providers = providers_for(spec.device)
        try:
            self._session = ort.InferenceSession(str(spec.artifact), sess_options=options, providers=providers)
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise ModelLoadError(f"onnxruntime could not load {spec.artifact.name}: {_short(exc, spec)}") from exc
        self._inputs = tuple(_spec(a) for a in self._session.get_inputs())
        self._outputs = tuple(_spec(a) for a in self._session.get_outputs())
        self._string_inputs = frozenset(s.name for s in self._inputs if s.datatype is DataType.BYTES)

    def inputs(self) -> tuple[TensorSpec, ...]:
        return self._inputs

    def outputs(self) -> tuple[TensorSpec, ...]:
        return self._outputs

    def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        assert self._session is not None, "execute before load"
        feed = {name: _to_ort(name, array, self._string_inputs) for name, array in inputs.items()}
        names = [s.name for s in self._outputs]
        results = self._session.run(names, feed)
        return {name: _from_ort(value) for name, value in zip(names, results, strict=True)}

    def close(self) -> None:
        self._session = None


def _to_ort(name: str, array: Array, string_inputs: frozenset[str]) -> Array:
    if name in string_inputs:
        # ORT string tensors take str objects; V2 BYTES arrive as bytes.
        decode = np.vectorize(
            lambda b: b.decode("utf-8", "replace") if isinstance(b, bytes) else str(b), otypes=[object]
        )
        return decode(array) if array.size else array.astype(object)
    return array


def _from_ort(value: Any) -> Array:
    array = np.asarray(value)
    if array.dtype.kind in ("U", "O"):
        encode = np.vectorize(lambda s: s.encode("utf-8") if isinstance(s, str) else bytes(s), otypes=[object])
        return encode(array) if array.size else array.astype(object)
    return array


_ABSOLUTE_PATH = re.compile(r"(?<![\w.-])(?:/[^/\s:'\"]+)+/([^/\s:'\"]*)")


def _short(exc: Exception, spec: LoadSpec) -> str:
    """The first line of an onnxruntime error, with no absolute path left in it (clients may read it)."""
    line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    line = line.replace(str(spec.artifact), f"{spec.model}/{spec.version}/{spec.artifact.name}")
    return _ABSOLUTE_PATH.sub(r"\1", line)[:300]
