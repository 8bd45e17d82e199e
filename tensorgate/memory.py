"""Process memory: tuning malloc, and reading what a process holds (to measure a model's load).

Tuning keeps large tensor buffers in the heap instead of mapping them per request.

glibc's malloc serves every allocation over its mmap threshold (128 KiB to start) with a fresh
``mmap`` and returns it with ``munmap`` when freed, so each page of it is faulted in and zeroed
again on the next request. A request carrying a 600 KB tensor allocates several such buffers
(socket reads, gRPC's message assembly, protobuf fields, the batch), and the threshold's own
adaptation does not catch them: each request pays page faults and zeroing for every one of them
(``tests/test_memory.py`` checks that, tuned, a freed buffer is reused instead).
``benchmarks/bench_protocols.py`` measures the server's CPU per ResNet-sized request (its section
"What a ResNet-sized request costs outside the model").

The cost is memory held: freed buffers under the threshold stay in the process for reuse (up to
``TRIM_THRESHOLD_BYTES`` free at the top of the heap before it is given back). Larger buffers
are mapped as before. Only glibc has these knobs; elsewhere this does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from collections.abc import Callable

log = logging.getLogger(__name__)

# mallopt parameter numbers from glibc's malloc.h.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

# Buffers up to this size come from the heap: an image-sized FP32 tensor (640x640x3 is 4.9 MB)
# and a batch of several fit.
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
TRIM_THRESHOLD_BYTES = 128 * 1024 * 1024


def tune_malloc() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; False where malloc is not glibc's."""
    applied = False
    try:
        # The process's own symbols (the C library among them): no ldconfig run to find libc.
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt), or no dynamic symbols
        pass
    else:
        mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        mallopt.restype = ctypes.c_int
        applied = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
        applied = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1 and applied
    if not applied:
        log.info("malloc tuning is not available here; large buffers are mapped per allocation")
    return applied


_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes(pid: int | None = None) -> int | None:
    """The resident set size of a process (this one when ``pid`` is None) from ``/proc``; None
    where it cannot be read (the process is gone, or this is not Linux)."""
    try:
        with open(f"/proc/{'self' if pid is None else pid}/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return None


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


@functools.cache
def _mallinfo2() -> Callable[[], _MallInfo2] | None:
    try:
        function = ctypes.CDLL(None).mallinfo2  # glibc 2.33 and later
    except (OSError, AttributeError):
        return None
    function.argtypes = ()
    function.restype = _MallInfo2
    return function


def allocated_bytes() -> int | None:
    """Bytes this process's malloc has handed out and not had back (every arena, and the blocks it
    mapped); None where malloc is not glibc's.

    Why beside :func:`resident_bytes`: with the trim threshold raised (:func:`tune_malloc`), memory
    a model frees when it unloads stays resident for reuse, so the next model loaded into it grows
    the resident size by little or nothing. What malloc has handed out grows by what it allocated.
    """
    function = _mallinfo2()
    if function is None:
        return None
    info = function()
    return int(info.uordblks) + int(info.hblkhd)
