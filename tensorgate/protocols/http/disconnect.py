"""Noticing that an HTTP client went away while its request waits, so the request leaves the queue.

Our listener says so itself: each connection carries a :class:`ConnectionWatch` in the ASGI scope's
extensions, and its ``connection_lost`` cancels the request running on it at once, with no task
and no delay. Served by another ASGI server, the app falls back to :class:`DisconnectWatches`,
which ask ``receive()`` for ``http.disconnect`` once a request has outlived ``WATCH_AFTER_S``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from tensorgate.protocols.http.body import Receive

# Most requests are answered within this; only then is a task spent on watching the connection.
# At 64 clients on a small model the median request takes ~20 ms, so a shorter wait started a
# watch task for most of them. A client that leaves sooner costs at most its one batch row.
WATCH_AFTER_S = 0.1
# Sweeps for requests that outlived WATCH_AFTER_S run at most this often, so that under load the
# timer is not re-armed for every request; a watch starts up to this much later.
_SWEEP_EVERY_S = WATCH_AFTER_S / 4


# The ASGI scope extension under which our listener hands each request its connection's watch.
CONNECTION_EXTENSION = "tensorgate.connection"


class ConnectionWatch:
    """One per HTTP connection: the request running on it, cancelled when the connection is lost.

    An HTTP/1.1 connection runs one request at a time (pipelined ones wait their turn), so one
    watch per connection serves them all: the app arms it with its task around the inference and
    closes it after; the listener calls :meth:`lost` from ``connection_lost``.
    """

    __slots__ = ("_gone", "_task", "disconnected")

    def __init__(self) -> None:
        self._task: asyncio.Task[Any] | None = None
        self._gone = False  # the connection is lost (perhaps before a request armed the watch)
        self.disconnected = False

    def arm(self, task: asyncio.Task[Any]) -> ConnectionWatch:
        """Watch for ``task``; if the client already left (while its body was decoded), cancel it now."""
        self._task = task
        if self._gone:
            self.lost()
        return self

    def lost(self) -> None:
        self._gone = True
        task, self._task = self._task, None
        if task is not None and not task.done():
            self.disconnected = True
            task.cancel()

    def close(self) -> None:
        self._task = None


class DisconnectWatch:
    """Cancels a request's task when its client disconnects, so the request leaves the queue."""

    __slots__ = ("_receive", "_task", "_watcher", "disconnected")

    def __init__(self, receive: Receive, task: asyncio.Task[Any]) -> None:
        self._receive: Receive | None = receive
        self._task: asyncio.Task[Any] | None = task
        self._watcher: asyncio.Task[None] | None = None
        self.disconnected = False

    def start(self) -> None:
        if self._task is not None:
            self._watcher = self._task.get_loop().create_task(self._watch())

    async def _watch(self) -> None:
        assert self._receive is not None
        message = await self._receive()
        if message["type"] == "http.disconnect" and self._task is not None:
            self.disconnected = True
            self._task.cancel()

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
        self._receive = self._task = None  # a closed watch kept until the next sweep holds nothing


class DisconnectWatches:
    """Starts the watch of every request still running ``WATCH_AFTER_S`` after it began.

    A task that waits on ``receive()`` for ``http.disconnect`` costs about ten times a timer, and
    most requests finish before it would be needed, so it starts late. One timer serves all
    requests, armed for the oldest: a timer per request (made, then cancelled) cost ~5 us of the
    event loop per request, 1-2 % of a small model's whole request at 64 clients.
    """

    def __init__(self) -> None:
        self._due: deque[tuple[float, DisconnectWatch]] = deque()
        self._timer: asyncio.TimerHandle | None = None

    def watch(self, receive: Receive, task: asyncio.Task[Any]) -> DisconnectWatch:
        watch = DisconnectWatch(receive, task)
        loop = task.get_loop()
        due = loop.time() + WATCH_AFTER_S
        self._due.append((due, watch))
        if self._timer is None:
            self._timer = loop.call_at(due, self._sweep, loop)
        return watch

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        now = loop.time()
        due = self._due
        while due and due[0][0] <= now:
            due.popleft()[1].start()
        if due:
            self._timer = loop.call_at(max(due[0][0], now + _SWEEP_EVERY_S), self._sweep, loop)
