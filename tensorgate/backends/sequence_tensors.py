"""The tensors a sequence model takes and gives beyond its clients': its control inputs and its
implicit state (``sequence_batching`` in its configuration).

A model that reads its signature from its artifact (an ONNX graph) lists them there; a Python
model's signature is its configuration's ``inputs`` and ``outputs``, which, as in Triton, name
only the client's tensors. These specs complete it.
"""

from __future__ import annotations

from tensorgate.config.model_config import SequenceBatching
from tensorgate.types import DataType, TensorSpec


def triton_datatype(name: str) -> DataType:
    """A datatype as a Triton configuration spells it (TYPE_FP32, TYPE_STRING) or as ours do (FP32)."""
    bare = name.removeprefix("TYPE_")
    return DataType.BYTES if bare == "STRING" else DataType.parse(bare)


def control_datatype(control: object) -> DataType:
    if getattr(control, "data_type", None):
        return triton_datatype(control.data_type)  # type: ignore[attr-defined]
    if getattr(control, "int32_false_true", None):
        return DataType.INT32
    if getattr(control, "fp32_false_true", None):
        return DataType.FP32
    return DataType.BOOL


def sequence_specs(config: SequenceBatching, batched: bool) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """(inputs, outputs): the control and state inputs, and the state outputs."""
    lead = (-1,) if batched else ()
    inputs = [TensorSpec(c.name, control_datatype(c.control[0]), (*lead, 1)) for c in config.control_input]
    outputs = []
    for state in config.state:
        datatype = triton_datatype(state.data_type)
        inputs.append(TensorSpec(state.input_name, datatype, (*lead, *state.dims)))
        outputs.append(TensorSpec(state.output_name, datatype, (*lead, *state.dims)))
    return tuple(inputs), tuple(outputs)
