"""A loaded version's configuration in the shape of Triton's ``model_config`` (its JSON form).

One dict serves both protocols: ``GET /v2/models/{m}[/versions/{v}]/config`` returns it as JSON (what
``tritonclient.http.get_model_config`` reads) and the ModelConfig RPC parses it into the protobuf
message, so the two can never disagree. Field names are the protobuf's (snake_case), enums by name,
as Triton's HTTP endpoint writes them. Only what tensorgate really applies is reported.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from tensorgate.backends.base import Device
from tensorgate.scheduling.batch_policy import BatchSettings
from tensorgate.scheduling.scheduler import QueueSettings
from tensorgate.types import DataType, ModelMetadata, TensorSpec

# What Triton reports as ``backend`` for each platform tensorgate serves.
_BACKENDS = {"onnxruntime_onnx": "onnxruntime", "python": "python"}
# Triton's instance kinds; an NPU has none of its own, so it is reported as the model's choice.
_KINDS = {"cpu": "KIND_CPU", "gpu": "KIND_GPU", "npu": "KIND_MODEL"}


def config_type(datatype: DataType) -> str:
    """Triton's configuration name of a datatype (``TYPE_FP32``; BYTES is ``TYPE_STRING``)."""
    return "TYPE_STRING" if datatype is DataType.BYTES else f"TYPE_{datatype.value}"


def _tensor(spec: TensorSpec, batched: bool) -> dict[str, Any]:
    # With a batch dimension, Triton's dims leave it out.
    return {
        "name": spec.name,
        "data_type": config_type(spec.datatype),
        "dims": list(spec.shape[1:] if batched else spec.shape),
    }


def _instance_groups(devices: Sequence[Device]) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = []
    for kind, count in Counter(d.kind for d in devices).items():
        group: dict[str, Any] = {"name": f"{kind}_instances", "kind": _KINDS[kind], "count": count}
        if kind == "gpu":
            group["gpus"] = sorted({d.index for d in devices if d.kind == kind})
        groups.append(group)
    return groups


def triton_config(
    metadata: ModelMetadata, batch: BatchSettings, queue: QueueSettings, devices: Sequence[Device]
) -> dict[str, Any]:
    batched = metadata.max_batch_size > 0
    config: dict[str, Any] = {
        "name": metadata.name,
        "platform": metadata.platform,
        "backend": _BACKENDS.get(metadata.platform, metadata.platform),
        "max_batch_size": metadata.max_batch_size,
        "input": [_tensor(s, batched) for s in metadata.inputs],
        "output": [_tensor(s, batched) for s in metadata.outputs],
        "instance_group": _instance_groups(devices),
    }
    if batch.batching:
        levels = queue.priority_levels if queue.priority_levels > 1 else 0  # Triton: 0 is no priorities
        timeout_us = 0 if queue.default_timeout_s is None else round(queue.default_timeout_s * 1_000_000)
        config["dynamic_batching"] = {
            "preferred_batch_size": list(batch.preferred_rows),
            "max_queue_delay_microseconds": round(batch.max_queue_delay_s * 1_000_000),
            "priority_levels": levels,
            "default_priority_level": (queue.default_priority or queue.priority_levels) if levels else 0,
            "default_queue_policy": {
                "timeout_action": "REJECT",  # an expired request is answered 504, never run late
                "default_timeout_microseconds": timeout_us,
                "allow_timeout_override": True,  # a request's own timeout parameter wins
                "max_queue_size": queue.max_queue_size,
            },
        }
    return config
