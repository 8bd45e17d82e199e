"""Where a server's event loop runs, for comparisons between two servers up at once.

On this 2-core host, of two servers left to the kernel, the event loop that lands on CPU 1 got
about 5 % more requests/s than the one on CPU 0 (an A/A test, two identical tensorgate servers:
0.95-1.05 whichever was started second; the kernel keeps a busy thread where it started). A cost
measured as a 5 % ratio cannot carry that, so a comparison pins each server's event-loop thread
(its main thread: the threads it starts later keep their own placement) to one CPU per block of
runs, the CPU alternating from block to block, and both configurations see both CPUs equally.
"""

from __future__ import annotations

import os


def cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def pin_event_loops(pids: list[int], block: int) -> int:
    """Pin the main thread of each process to the CPU for this block (alternating); returns the CPU."""
    available = cpus()
    cpu = available[block % len(available)]
    for pid in pids:
        os.sched_setaffinity(pid, {cpu})
    return cpu
