"""Noticing that an HTTP client went away while its request waits, so the request leaves the queue."""

from __future__ import annotations

import asyncio
from typing import Any

from tensorgate.protocols.http.body import Receive

# Most requests are answered within this; only then is a task spent on watching the connection.
WATCH_AFTER_S = 0.02


class DisconnectWatch:
    """Cancels a request's task when its client disconnects, so the request leaves the queue.

    A timer costs about a tenth of a task, and most requests finish before it fires, so the task
    that waits on ``receive()`` for ``http.disconnect`` starts only after ``WATCH_AFTER_S``.
    """

    def __init__(self, receive: Receive, task: asyncio.Task[Any]) -> None:
        self._receive = receive
        self._task = task
        self._watcher: asyncio.Task[None] | None = None
        self.disconnected = False
        self._timer: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(WATCH_AFTER_S, self._start)

    def _start(self) -> None:
        self._timer = None
        self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        message = await self._receive()
        if message["type"] == "http.disconnect":
            self.disconnected = True
            self._task.cancel()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._watcher is not None:
            self._watcher.cancel()
