"""Creating instances from an instance group: which device, which isolation."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from tensorgate.backends.base import Device, LoadSpec
from tensorgate.backends.registry import create_backend
from tensorgate.config.model_config import InstanceGroup
from tensorgate.errors import ModelLoadError
from tensorgate.instances.base import Instance
from tensorgate.instances.thread_instance import ThreadInstance


@dataclass(frozen=True, slots=True)
class Placement:
    device: Device
    isolation: str
    cpus: frozenset[int] | None = None  # None: wherever the OS schedules it


def placements(groups: list[InstanceGroup], device_id: int | None = None) -> list[Placement]:
    """Where every instance the groups ask for runs: ``count`` per listed device."""
    result: list[Placement] = []
    for group in groups:
        devices = group.devices or ([device_id] if device_id is not None else [0])
        if group.kind == "cpu":
            devices = [0]
        nth = 0  # this instance's place in its group: the group's cpu sets wrap around its own instances
        for index in devices:
            for _ in range(group.count):
                cpus = frozenset(group.cpus[nth % len(group.cpus)]) if group.cpus else None
                result.append(Placement(Device(group.kind, index), group.isolation, cpus))
                nth += 1
    return result


def check_cpus(cpus: frozenset[int] | None) -> None:
    """Refuse, before anything starts, CPUs this process may not run on (a container's cpuset)."""
    if cpus is None:
        return
    allowed = os.sched_getaffinity(0)
    if not cpus <= allowed:
        raise ModelLoadError(
            f"instance_group cpus {sorted(cpus - allowed)} are not available to this server "
            f"(it may run on CPUs {sorted(allowed)})"
        )


def create_instance(name: str, backend: str, spec: LoadSpec, placement: Placement) -> Instance:
    check_cpus(placement.cpus)
    instance: Instance
    if placement.isolation == "process":
        from tensorgate.instances.process_instance import ProcessInstance

        instance = ProcessInstance(name, backend, spec, placement.cpus)
    else:
        instance = ThreadInstance(
            name,
            create_backend(backend),
            spec,
            placement.cpus,
            hung_after_s=spec.config.health_check.batch_timeout_s,
            backend_factory=functools.partial(create_backend, backend),
        )
    instance.pads = spec.config.ragged_pads()
    return instance
