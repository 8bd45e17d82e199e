"""Creating instances from an instance group: which device, which isolation."""

from __future__ import annotations

from tensorgate.backends.base import Device, LoadSpec
from tensorgate.backends.registry import create_backend
from tensorgate.config.model_config import InstanceGroup
from tensorgate.instances.base import Instance
from tensorgate.instances.thread_instance import ThreadInstance


def placements(groups: list[InstanceGroup], device_id: int | None = None) -> list[tuple[Device, str]]:
    """(device, isolation) for every instance the groups ask for: ``count`` per listed device."""
    result: list[tuple[Device, str]] = []
    for group in groups:
        devices = group.devices or ([device_id] if device_id is not None else [0])
        if group.kind == "cpu":
            devices = [0]
        for index in devices:
            for _ in range(group.count):
                result.append((Device(group.kind, index), group.isolation))
    return result


def create_instance(name: str, backend: str, spec: LoadSpec, isolation: str) -> Instance:
    if isolation == "process":
        from tensorgate.instances.process_instance import ProcessInstance

        instance: Instance = ProcessInstance(name, backend, spec)
        return instance
    return ThreadInstance(name, create_backend(backend), spec)
