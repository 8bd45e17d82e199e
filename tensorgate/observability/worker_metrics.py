"""CPU and memory of the worker processes (``isolation: process``), read from ``/proc`` at scrape time.

The server's own process figures (``tensorgate_process_*``) leave out its workers, which is where a
process-isolated model's memory lives. A worker that is restarted has a new process, so its CPU
counter starts again from zero (a counter reset, which Prometheus' ``rate`` handles).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

Labels = tuple[str, str, str]  # model, version, instance

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _usage(pid: int) -> tuple[float, int] | None:
    """CPU seconds (user and system) and resident bytes of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    # After the command name: state is field 3, utime 14, stime 15, rss 24 (proc(5)).
    return (int(fields[11]) + int(fields[12])) / _TICKS, int(fields[21]) * _PAGE


class WorkerCollector:
    """A custom collector: the manager tracks each worker instance with a way to find its process id."""

    def __init__(self) -> None:
        self._workers: dict[Labels, Callable[[], int | None]] = {}

    def track(self, labels: Labels, pid: Callable[[], int | None]) -> None:
        self._workers[labels] = pid

    def untrack(self, labels: Labels) -> None:
        self._workers.pop(labels, None)

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        names = ["model", "version", "instance"]
        cpu = CounterMetricFamily(
            "tensorgate_worker_cpu_seconds", "CPU time of a worker process (user and system).", labels=names
        )
        memory = GaugeMetricFamily(
            "tensorgate_worker_resident_memory_bytes", "Resident memory of a worker process.", labels=names
        )
        for labels, pid_of in list(self._workers.items()):
            pid = pid_of()
            usage = None if pid is None else _usage(pid)
            if usage is None:  # restarting, or not on Linux
                continue
            cpu.add_metric(list(labels), usage[0])
            memory.add_metric(list(labels), float(usage[1]))
        yield cpu
        yield memory
