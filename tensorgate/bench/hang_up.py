"""Ending a run's connections before its event loop closes.

Closing a TLS transport starts a shutdown exchange that needs further loop iterations, and
uvloop refuses to close a loop while a handle is still open (EBUSY). So at the end of a run each
connection is aborted (a benchmark has nothing left to flush) and the run waits for its
``connection_lost``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Protocol


class Connected(Protocol):
    transport: asyncio.Transport | None
    lost: asyncio.Future[None] | None  # set by connection_lost; None before connection_made


async def hang_up(connections: Iterable[Connected], timeout_s: float = 5.0) -> None:
    waits: list[asyncio.Future[None]] = []
    for connection in connections:
        if connection.transport is not None and connection.lost is not None:
            connection.transport.abort()
            waits.append(connection.lost)
    if waits:
        await asyncio.wait(waits, timeout=timeout_s)


def mark_lost(lost: asyncio.Future[None] | None) -> None:
    if lost is not None and not lost.done():
        lost.set_result(None)
