"""Worker process figures: read from /proc for the processes tracked, nothing for one that is gone."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from prometheus_client import CollectorRegistry

from tensorgate.observability.worker_metrics import WorkerCollector

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc")


def test_tracked_processes_report_cpu_and_memory_and_gone_ones_nothing() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: its pid names no process now
    registry = CollectorRegistry()
    workers = WorkerCollector()
    registry.register(workers)
    workers.track(("m", "1", "m_1_0"), os.getpid)
    workers.track(("m", "1", "m_1_1"), lambda: gone.pid)
    workers.track(("m", "1", "m_1_2"), lambda: None)  # restarting: no process at the moment
    labels = {"model": "m", "version": "1"}
    rss = registry.get_sample_value("tensorgate_worker_resident_memory_bytes", {**labels, "instance": "m_1_0"})
    cpu = registry.get_sample_value("tensorgate_worker_cpu_seconds_total", {**labels, "instance": "m_1_0"})
    assert rss is not None and rss > 10 * 1024 * 1024
    assert cpu is not None and cpu > 0
    for instance in ("m_1_1", "m_1_2"):
        assert (
            registry.get_sample_value("tensorgate_worker_resident_memory_bytes", {**labels, "instance": instance})
            is None
        )
    workers.untrack(("m", "1", "m_1_0"))
    assert registry.get_sample_value("tensorgate_worker_cpu_seconds_total", {**labels, "instance": "m_1_0"}) is None
