"""An asyncio event loop on virtual time, for code that times itself with its loop's clock.

The loop's clock jumps to the next timer whenever nothing is ready to run and no I/O is waiting,
as trio's autojump clock does: a 0.3 s timeout fires after no wall time at all, and timers fire in
the order of their deadlines however loaded the host is. The code under test and the test's own
client run on the one loop, over loopback sockets: bytes written there are readable on the other
end as soon as the write returns, so the loop sees them before it would jump. Work in other
threads or processes is not waited for; a test that needs it keeps real time.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class _AutojumpSelector(selectors.DefaultSelector):
    def __init__(self, jump: Callable[[float], None]) -> None:
        super().__init__()
        self._jump = jump

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events: list[tuple[selectors.SelectorKey, int]] = super().select(0)
        if events or (timeout is not None and timeout <= 0):
            return events
        if timeout is None:  # no timer at all: only I/O can wake the loop
            return super().select(None)
        self._jump(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._virtual_now = 0.0
        super().__init__(_AutojumpSelector(self._advance))

    def time(self) -> float:
        return self._virtual_now

    def _advance(self, seconds: float) -> None:
        self._virtual_now += seconds


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on a :class:`VirtualTimeLoop`."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(main)
