"""Triton's statistics extension: the cumulative counters of one model version, and their document.

Every servable keeps one :class:`InferenceStatistics` (a scheduler's batches, a pipeline's runs, a
generative model's requests) and the service renders it with :meth:`InferenceStatistics.document`
for ``GET /v2/models/{m}/stats`` and ``ModelStatistics``. Durations are nanoseconds, as in Triton.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class InferenceStatistics:
    inference_count: int = 0  # rows run (a batch of 8 counts 8)
    execution_count: int = 0  # model executions (a batch of 8 counts 1)
    success_count: int = 0
    success_ns: int = 0
    fail_count: int = 0
    fail_ns: int = 0
    queue_count: int = 0
    queue_ns: int = 0
    compute_count: int = 0
    compute_ns: int = 0
    last_inference_ms: int = 0  # a wall-clock timestamp (Triton's field), not a duration
    batch_stats: dict[int, list[int]] = field(default_factory=dict)  # rows -> [count, compute_ns]

    def refused(self) -> None:
        """A request turned away at admission: Triton counts its scheduler's rejections as failures."""
        self.fail_count += 1

    def ended(self, success: bool, elapsed_s: float) -> None:
        """A request ended ``elapsed_s`` after it arrived."""
        if success:
            self.success_count += 1
            self.success_ns += int(elapsed_s * 1e9)
        else:
            self.fail_count += 1
            self.fail_ns += int(elapsed_s * 1e9)

    def cache_hit(self, elapsed_ns: int) -> None:
        """A request answered from the response cache: a success that ran nothing (``inference_count``
        and ``execution_count`` do not move, as in Triton)."""
        self.success_count += 1
        self.success_ns += elapsed_ns

    def waited(self, seconds: float) -> None:
        """A request left the queue for an instance after ``seconds``."""
        self.queue_count += 1
        self.queue_ns += int(seconds * 1e9)

    def executed(self, rows: int, elapsed_s: float, requests: int) -> None:
        """One execution of ``rows`` rows from ``requests`` requests took ``elapsed_s``."""
        self.last_inference_ms = int(time.time() * 1000)
        self.execution_count += 1
        self.inference_count += rows
        self.compute_count += requests
        ns = int(elapsed_s * 1e9)
        # Per request, as Triton: each request of the batch spent the whole execution computing, so
        # compute_ns / compute_count is a request's compute time (batch_stats hold the per-batch view).
        self.compute_ns += ns * requests
        entry = self.batch_stats.setdefault(rows, [0, 0])
        entry[0] += 1
        entry[1] += ns

    def ran_steps(self, success: bool, elapsed_s: float) -> None:
        """A request whose work other models ran (a pipeline's steps, counted by their own models):
        here one inference and one execution when it succeeded, and no compute of its own."""
        self.last_inference_ms = int(time.time() * 1000)
        if success:
            self.inference_count += 1
            self.execution_count += 1
        self.ended(success, elapsed_s)

    def document(self, name: str, version: int, cache: dict[str, Any]) -> dict[str, Any]:
        """One ``model_stats`` entry of Triton's statistics extension; ``cache`` holds its
        ``cache_hit`` and ``cache_miss`` entries."""
        return {
            "name": name,
            "version": str(version),
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": {"count": self.success_count, "ns": self.success_ns},
                "fail": {"count": self.fail_count, "ns": self.fail_ns},
                "queue": {"count": self.queue_count, "ns": self.queue_ns},
                "compute_input": {"count": self.compute_count, "ns": 0},
                "compute_infer": {"count": self.compute_count, "ns": self.compute_ns},
                "compute_output": {"count": self.compute_count, "ns": 0},
                **cache,
            },
            "batch_stats": [
                {
                    "batch_size": rows,
                    "compute_input": {"count": count, "ns": 0},
                    "compute_infer": {"count": count, "ns": ns},
                    "compute_output": {"count": count, "ns": 0},
                }
                for rows, (count, ns) in sorted(self.batch_stats.items())
            ],
        }
