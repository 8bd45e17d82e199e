"""``backend: torch``: a TorchScript file (``model.pt``) or a ``torch.export`` program (``model.pt2``),
served as exported.

Neither file says what its inputs and outputs are called, so ``config.yaml`` declares them (in the
order the model's ``forward`` takes and returns them), and the load runs the model once on zeros of
the declared shapes to check that it returns what the configuration says: a model that returns
three tensors where two are declared, or INT64 where FP32 is, fails its load with that, not its
first request. The model runs under ``torch.inference_mode()``, which releases the GIL inside
torch's operators as onnxruntime's sessions do, so thread instances run side by side.

Devices: ``cpu``; ``gpu`` maps to ``cuda:N``; ``npu`` to ``npu:N`` through ``torch_npu``. A missing
runtime fails the load with what to install, never a silent fallback to the CPU.
``onnxruntime.intra_op_threads``' counterpart is ``torch.intra_op_threads`` (0: torch's default);
torch's thread pool is one per process, so it is set by the first instance loaded in a process.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from tensorgate.backends.base import Backend, Device, LoadSpec, declared_specs
from tensorgate.errors import ModelLoadError
from tensorgate.types import Array, DataType, TensorSpec

_DTYPES: dict[DataType, torch.dtype] = {
    DataType.BOOL: torch.bool,
    DataType.UINT8: torch.uint8,
    DataType.INT8: torch.int8,
    DataType.INT16: torch.int16,
    DataType.INT32: torch.int32,
    DataType.INT64: torch.int64,
    DataType.FP16: torch.float16,
    DataType.FP32: torch.float32,
    DataType.FP64: torch.float64,
}
_BY_DTYPE = {dtype: datatype for datatype, dtype in _DTYPES.items()}
ARTIFACTS = ("model.pt", "model.pt2")


def torch_device(device: Device) -> torch.device:
    """The torch device of an instance; a runtime this host lacks fails the load with its name."""
    if device.kind == "cpu":
        return torch.device("cpu")
    if device.kind == "gpu":
        if not torch.cuda.is_available():
            raise ModelLoadError(
                f"device {device} needs a CUDA build of torch and a GPU; this torch ({torch.__version__}) has "
                "no CUDA device; install a CUDA build of torch or use kind: cpu"
            )
        if device.index >= torch.cuda.device_count():
            raise ModelLoadError(f"device {device}: only {torch.cuda.device_count()} CUDA device(s) are present")
        return torch.device("cuda", device.index)
    try:
        importlib.import_module("torch_npu")  # registers the "npu" device with torch
    except ModuleNotFoundError:
        raise ModelLoadError(
            f"device {device} needs torch_npu (Ascend's torch plugin), which is not installed"
        ) from None
    return torch.device("npu", device.index)


class TorchBackend(Backend):
    platform = "pytorch_libtorch"

    def __init__(self) -> None:
        self._module: Any = None
        self._device = torch.device("cpu")
        self._inputs: tuple[TensorSpec, ...] = ()
        self._outputs: tuple[TensorSpec, ...] = ()

    def load(self, spec: LoadSpec) -> None:
        self._inputs = declared_specs(spec.config.inputs, "inputs", spec, "a torch model")
        self._outputs = declared_specs(spec.config.outputs, "outputs", spec, "a torch model")
        for tensor in (*self._inputs, *self._outputs):
            if tensor.datatype not in _DTYPES:
                raise ModelLoadError(f"tensor {tensor.name!r}: torch has no {tensor.datatype.value} tensors")
        threads = spec.config.torch.intra_op_threads
        if threads and torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        self._device = torch_device(spec.device)
        self._module = self._read(spec)
        self._check_sample(spec)

    def _read(self, spec: LoadSpec) -> Any:
        where = f"{spec.model}/{spec.version}/{spec.artifact.name}"
        try:
            if spec.artifact.suffix == ".pt2":
                module = torch.export.load(str(spec.artifact)).module()
                return module.to(self._device) if self._device.type != "cpu" else module
            module = torch.jit.load(str(spec.artifact), map_location=self._device)
            module.eval()
            return module
        except Exception as exc:  # torch raises its own untyped errors for a bad file
            first = _first_line(exc).replace(str(spec.directory), "")
            raise ModelLoadError(f"torch could not load {where}: {first}") from exc

    def _check_sample(self, spec: LoadSpec) -> None:
        """Run zeros of the declared shapes once: the outputs must be what config.yaml declares."""
        sample = {s.name: np.zeros([d if d >= 0 else 1 for d in s.shape], dtype=s.datatype.numpy) for s in self._inputs}
        try:
            results = self._run(sample)
        except Exception as exc:
            raise ModelLoadError(
                f"{spec.model}: run on zeros of the declared input shapes, the model does not fit config.yaml: "
                f"{_first_line(exc)}"
            ) from exc
        for declared in self._outputs:
            got = results[declared.name]
            datatype = DataType.from_numpy(got.dtype)
            if datatype is not declared.datatype:
                raise ModelLoadError(
                    f"{spec.model}: output {declared.name!r} is declared {declared.datatype.value} but the model "
                    f"returns {datatype.value}"
                )
            if len(got.shape) != len(declared.shape) or any(
                d not in (-1, g) for d, g in zip(declared.shape, got.shape, strict=True)
            ):
                raise ModelLoadError(
                    f"{spec.model}: output {declared.name!r} is declared with shape {list(declared.shape)} but "
                    f"the model returns {list(got.shape)} for the sample"
                )

    def inputs(self) -> tuple[TensorSpec, ...]:
        return self._inputs

    def outputs(self) -> tuple[TensorSpec, ...]:
        return self._outputs

    def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        return self._run(inputs)

    def _run(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        assert self._module is not None, "execute before load"
        # Read-only arrays (views of a request body or of shared memory) are copied: torch would
        # otherwise hand the model memory it may write to.
        args = [torch.from_numpy(_writable(inputs[s.name])).to(self._device, non_blocking=True) for s in self._inputs]
        with torch.inference_mode():
            result = self._module(*args)
        return self._outputs_of(result)

    def _outputs_of(self, result: Any) -> dict[str, Array]:
        names = [s.name for s in self._outputs]
        if isinstance(result, torch.Tensor):
            tensors: Sequence[Any] = [result]
        elif isinstance(result, Mapping):
            missing = [n for n in names if n not in result]
            if missing:
                raise ValueError(f"the model's output dict lacks {', '.join(missing)}")
            tensors = [result[n] for n in names]
        elif isinstance(result, list | tuple):
            tensors = list(result)
        else:
            raise ValueError(f"the model returned {type(result).__name__}; expected tensors")
        if len(tensors) != len(names):
            raise ValueError(f"the model returns {len(tensors)} output(s); config.yaml declares {len(names)}")
        out: dict[str, Array] = {}
        for name, tensor in zip(names, tensors, strict=True):
            if not isinstance(tensor, torch.Tensor) or tensor.dtype not in _BY_DTYPE:
                raise ValueError(f"output {name!r} is not a tensor tensorgate can serve")
            out[name] = tensor.detach().to("cpu").contiguous().numpy()
        return out

    def close(self) -> None:
        self._module = None


def _writable(array: Array) -> Array:
    return array if array.flags.writeable else array.copy()


def _first_line(exc: Exception) -> str:
    """What a load error tells the client of torch's own (often long, multi-line) message."""
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
