"""GPU utilization and memory through NVML, when a GPU and the NVML bindings are present.

A Prometheus collector, so the numbers are read at scrape time, never on the request path.
On a machine without a GPU (or without ``nvidia-ml-py``: ``pip install 'tensorgate[gpu]'``) it
registers nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

log = logging.getLogger(__name__)


class NvmlCollector:
    """A custom collector: prometheus_client calls ``collect`` on every scrape."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self.count = int(nvml.nvmlDeviceGetCount())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        utilization = GaugeMetricFamily(
            "tensorgate_gpu_utilization_ratio", "GPU busy fraction over the last sample period.", labels=["gpu"]
        )
        used = GaugeMetricFamily("tensorgate_gpu_memory_used_bytes", "GPU memory in use.", labels=["gpu"])
        total = GaugeMetricFamily("tensorgate_gpu_memory_total_bytes", "GPU memory in all.", labels=["gpu"])
        for index in range(self.count):
            try:
                handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
                rates = self._nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            except Exception:  # a GPU that fell off the bus must not break the scrape
                log.warning("NVML could not read GPU %d", index)
                continue
            utilization.add_metric([str(index)], rates.gpu / 100.0)
            used.add_metric([str(index)], float(memory.used))
            total.add_metric([str(index)], float(memory.total))
        yield utilization
        yield used
        yield total


def register_gpu_metrics(registry: CollectorRegistry) -> bool:
    """Register the NVML collector if NVML works here; returns whether it did."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        collector = NvmlCollector(pynvml)
    except Exception:  # no bindings, no driver, or no GPU: nothing to report, and the server still starts
        log.info("no GPU metrics: NVML is not available here")
        return False
    if collector.count == 0:
        return False
    registry.register(collector)
    return True
