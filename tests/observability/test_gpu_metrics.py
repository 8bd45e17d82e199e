"""The NVML collector, against a stand-in for the NVML bindings (this machine has no GPU).

What is tested is our side: how NVML's answers become Prometheus samples, and that an NVML which
fails (no driver, a GPU that fell off the bus) never stops a scrape or the server's start.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tensorgate.observability.gpu import NvmlCollector, register_gpu_metrics


@dataclass
class _Rates:
    gpu: int


@dataclass
class _Memory:
    used: int
    total: int


class _Nvml:
    """Two GPUs; the second one fails to answer when ``broken`` is set."""

    def __init__(self, *, broken: bool = False, count_fails: bool = False) -> None:
        self.broken = broken
        self.count_fails = count_fails

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        if self.count_fails:
            raise RuntimeError("NVML_ERROR_UNINITIALIZED")
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if self.broken and index == 1:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> _Rates:
        return _Rates(gpu=40 + handle * 20)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> _Memory:
        return _Memory(used=(handle + 1) * 1024**3, total=80 * 1024**3)


def _samples(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    text = generate_latest(registry).decode()
    return {
        (sample.name, sample.labels["gpu"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_each_gpu_reports_utilization_and_memory() -> None:
    registry = CollectorRegistry()
    registry.register(NvmlCollector(_Nvml()))
    samples = _samples(registry)
    assert samples[("tensorgate_gpu_utilization_ratio", "0")] == pytest.approx(0.4)
    assert samples[("tensorgate_gpu_utilization_ratio", "1")] == pytest.approx(0.6)
    assert samples[("tensorgate_gpu_memory_used_bytes", "1")] == 2 * 1024**3
    assert samples[("tensorgate_gpu_memory_total_bytes", "0")] == 80 * 1024**3


def test_a_gpu_that_stops_answering_is_left_out_of_the_scrape() -> None:
    registry = CollectorRegistry()
    registry.register(NvmlCollector(_Nvml(broken=True)))
    samples = _samples(registry)
    assert ("tensorgate_gpu_utilization_ratio", "0") in samples
    assert not any(gpu == "1" for _, gpu in samples)


def test_an_nvml_that_fails_registers_nothing_and_raises_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("pynvml")
    failing = _Nvml(count_fails=True)
    for name in ("nvmlInit", "nvmlDeviceGetCount"):
        setattr(module, name, getattr(failing, name))
    monkeypatch.setitem(sys.modules, "pynvml", module)
    registry = CollectorRegistry()
    assert register_gpu_metrics(registry) is False
    assert generate_latest(registry) == b""
