"""The in-process ceiling of the ResNet-18-shaped model, measured next to every served run.

On this shared 2-core host the same tight loop ran anywhere from ~50 to ~80 images/s within one
minute (measured: four 3-second runs in a row gave 77, 71, 55, 50), so a ceiling taken once per
benchmark says little about a served run made half a minute later. Each served run therefore gets
its own ceiling, measured right before and right after it and averaged; the run after one served
run is the run before the next.

The ceiling is the best in-process arrangement we know of, so the ratio cannot flatter the server:
one session with onnxruntime's default threads (one per core) at batch 1 and at batch 8, two
single-thread sessions side by side at batch 8, and the served arrangement itself (two single-thread
sessions pinned one per CPU, at batch 1, as most of the served batches are at 10 clients). Which one
is best is decided once per section, by the highest median over all its samples, and every served
run is compared with that arrangement. Taking the best of them afresh around each run would
compare it with the largest of several noisy figures: whenever two arrangements are close, that
overstates the ceiling (in the 2026-11-30 07:54 run, by 3 % for binary).

The served arrangement's own figure splits a served run's shortfall in two: what serving costs
(the event loop, the client, hand-offs), against that arrangement in-process; and what the
arrangement itself gives up against the best one.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import onnxruntime as ort

T = TypeVar("T")

# The served configuration: two instances of one onnxruntime thread each, one per CPU. With one
# instance of two threads every parallel operator waits for its slowest thread, and on a 2-core
# host the server's own threads (HTTP, decoding) keep preempting one of them; two single-thread
# instances lose only the CPU those threads take. Pinned (instance_group cpus), the OS no longer
# moves the model threads around the event loop: 0.93 of the ceiling against 0.83 unpinned (medians
# of 12 alternating runs each). Pinning the ceiling's own two-session loop made no difference there
# (5 alternating pairs: 68.5 pinned, 73.0 free, images/s), so the ceiling keeps the free loop.
_CPUS = sorted(os.sched_getaffinity(0))
_SERVED_CPUS = (_CPUS[0], _CPUS[-1])  # one per instance
RESNET_INSTANCES = {
    "instance_group": [{"count": len(_SERVED_CPUS), "cpus": [[cpu] for cpu in _SERVED_CPUS]}],
    "onnxruntime": {"intra_op_threads": 1},
}


@dataclass(frozen=True)
class CeilingSample:
    batch1: float  # images/s, one session, default threads
    batch8: float
    pair8: float  # two single-thread sessions side by side, batch 8
    served: float  # two single-thread sessions pinned one per CPU, batch 1: what the server runs


ARRANGEMENTS = {
    "batch1": "batch 1, default threads",
    "batch8": "batch 8, default threads",
    "pair8": "batch 8, 2 sessions x 1 thread",
    "served": "batch 1, 2 sessions x 1 thread, pinned (as served)",
}


@dataclass(frozen=True)
class Bracket:
    """The ceiling samples measured right before and right after one served run."""

    before: CeilingSample
    after: CeilingSample


class Ceiling:
    def __init__(self, onnx_path: Path, seconds: float) -> None:
        self._seconds = seconds
        self._wide = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self._narrow = [
            ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"]) for _ in range(2)
        ]
        rng = np.random.default_rng(0)
        self._one = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
        self._eight = rng.standard_normal((8, 3, 224, 224)).astype(np.float32)
        self._last: CeilingSample | None = None
        self.samples: list[CeilingSample] = []

    def measure(self) -> CeilingSample:
        sample = CeilingSample(
            self._rate([self._wide], self._one),
            self._rate([self._wide], self._eight),
            self._rate(self._narrow, self._eight),
            self._rate(self._narrow, self._one, pinned=True),
        )
        self.samples.append(sample)
        self._last = sample
        return sample

    @property
    def arrangement(self) -> str:
        """The arrangement with the highest median over every sample so far (a CeilingSample field)."""
        return max(ARRANGEMENTS, key=lambda name: statistics.median(getattr(s, name) for s in self.samples))

    def of(self, bracket: Bracket, arrangement: str | None = None) -> float:
        """The ceiling for the run ``bracket`` surrounds: the best arrangement (or the one named),
        before and after, averaged."""
        name = arrangement or self.arrangement
        return statistics.fmean([getattr(bracket.before, name), getattr(bracket.after, name)])

    def table(self) -> list[str]:
        """Every sample so far, in the order measured, as markdown rows (images/s), and which arrangement
        the ratios use."""
        name = self.arrangement
        chosen = [getattr(s, name) for s in self.samples]
        return [
            "| # | " + " | ".join(ARRANGEMENTS.values()) + " |",
            "|---:|" + "---:|" * len(ARRANGEMENTS),
            *[
                f"| {i} | " + " | ".join(f"{getattr(c, name):.1f}" for name in ARRANGEMENTS) + " |"
                for i, c in enumerate(self.samples, start=1)
            ],
            "",
            f"The ratios use the arrangement with the highest median here, {ARRANGEMENTS[name]} "
            f"({statistics.median(chosen):.1f} images/s; it moved between {min(chosen):.1f} and {max(chosen):.1f}).",
        ]

    def around(self, run: Callable[[], T]) -> tuple[T, Bracket]:
        """``run()`` and the ceiling samples right before and right after it (see :meth:`of`)."""
        before = self._last or self.measure()
        result = run()
        return result, Bracket(before, self.measure())

    def _rate(self, sessions: list[ort.InferenceSession], batch: np.ndarray, pinned: bool = False) -> float:
        """Images/s of ``sessions`` each running ``batch`` in a tight loop, side by side; ``pinned``:
        each loop's thread on a CPU of its own, as the served instances (``RESNET_INSTANCES``).

        Each loop's rate is its own images over its own time, to the end of its last call: over
        the slowest loop's time, a loop that finished first would count as idle while the other
        ran its last call past the deadline, up to one call (two sessions at batch 8: ~145 ms,
        5 % of 3 seconds on this host), which would understate the ceiling.
        """
        rates = [0.0] * len(sessions)
        for session in sessions:
            session.run(None, {"input": batch})  # warm

        def loop(index: int, started: float, deadline: float) -> None:
            if pinned:
                os.sched_setaffinity(0, {_SERVED_CPUS[index]})  # 0: this thread only
            count = 0
            while time.perf_counter() < deadline:
                sessions[index].run(None, {"input": batch})
                count += len(batch)
            rates[index] = count / (time.perf_counter() - started)

        started = time.perf_counter()
        deadline = started + self._seconds
        threads = [threading.Thread(target=loop, args=(i, started, deadline)) for i in range(len(sessions))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return sum(rates)
