"""Malloc tuning: large buffers allocated and freed per request stop faulting their pages in each time.

The server-level effect (page faults and CPU per 600 KB request) is measured in ``tensorgate.memory``'s
docstring; this checks the mechanism: after tuning, a buffer size used over and over is served from
pages the process already has.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tensorgate.memory import tune_malloc

# Allocate and free a 4 MiB buffer 50 times (as a request's tensor would be) and print the page
# faults that took; in a fresh interpreter each time, so the test process keeps its own malloc.
SNIPPET = """
import resource, sys
from tensorgate.memory import tune_malloc
if sys.argv[1] == "tuned":
    assert tune_malloc()
bytearray(4 << 20)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    buffer = bytearray(4 << 20)
    del buffer
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", SNIPPET, mode], capture_output=True, text=True, timeout=60, check=True)
    return int(done.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_tuned_malloc_reuses_large_buffers_instead_of_faulting_them_in_again() -> None:
    if not tune_malloc():
        pytest.skip("this C library has no mallopt")
    # 50 buffers of 4 MiB (1024 pages each): faulted in once, then reused from the heap.
    assert _faults("tuned") < 2 * 1024
