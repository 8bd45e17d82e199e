"""Noticing that an HTTP client went away, so its request stops: the one mechanism for every route.

The listener says so itself: each connection carries a :class:`ConnectionWatch` in the ASGI scope's
extensions, and its ``connection_lost`` cancels the request running on it at once, with no task
per request and no delay. The app arms it around every request, so an inference leaves its
queue and a generation frees its sequence the moment the client is gone. (Served by another ASGI
server, which hands no watch, a request notices only when its answer cannot be written.)
"""

from __future__ import annotations

import asyncio
from typing import Any

# The ASGI scope extension under which our listener hands each request its connection's watch.
CONNECTION_EXTENSION = "tensorgate.connection"


class ConnectionWatch:
    """One per HTTP connection: the request running on it, cancelled when the connection is lost.

    An HTTP/1.1 connection runs one request at a time (pipelined ones wait their turn), so one
    watch per connection serves them all: the app arms it with the request's task and closes it
    after; the listener calls :meth:`lost` from ``connection_lost``.
    """

    __slots__ = ("_gone", "_task", "disconnected")

    def __init__(self) -> None:
        self._task: asyncio.Task[Any] | None = None
        self._gone = False  # the connection is lost (perhaps before a request armed the watch)
        self.disconnected = False

    def arm(self, task: asyncio.Task[Any]) -> ConnectionWatch:
        """Watch for ``task``; if the client already left, cancel it now."""
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
