"""The live progress line on long runs: stderr, rewritten in place, only when stderr is a terminal."""

from __future__ import annotations

import asyncio
import sys
from typing import TextIO

from tensorgate.bench.results import RunResult
from tensorgate.clock import Clock


def progress_line(elapsed_s: float, planned_s: float | None, result: RunResult) -> str:
    """``  12.0/30 s   4,812 req   401.0 req/s   2 errors``: what an operator glances at."""
    planned = f"/{planned_s:.0f}" if planned_s else ""
    rate = result.completed / elapsed_s if elapsed_s > 0 else 0.0
    return (
        f"{elapsed_s:6.1f}{planned} s  {result.completed:>9,} req  {rate:>10,.1f} req/s  {result.error_count:,} errors"
    )


class Progress:
    """Redraws the line every ``interval_s`` until cancelled; the runner owns its task."""

    def __init__(self, clock: Clock, planned_s: float | None, stream: TextIO = sys.stderr, interval_s: float = 1.0):
        self._clock = clock
        self._planned_s = planned_s
        self._stream = stream
        self._interval_s = interval_s

    @staticmethod
    def wanted(stream: TextIO = sys.stderr) -> bool:
        return stream.isatty()

    async def run(self, result: RunResult, started: float) -> None:
        try:
            while True:
                await asyncio.sleep(self._interval_s)
                line = progress_line(self._clock.now() - started, self._planned_s, result)
                self._stream.write("\r" + line + "\x1b[K")
                self._stream.flush()
        finally:
            self._stream.write("\r\x1b[K")
            self._stream.flush()
