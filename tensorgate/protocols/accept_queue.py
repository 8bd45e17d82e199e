"""Connections the kernel has completed but the event loop not yet accepted, taken before a
listening socket closes.

Closing a listening socket resets every connection still in its accept queue, and their clients
have sent, or are sending, a request. The HTTP listener (at shutdown) and the gRPC server (at
shutdown and when it pauses while not ready) take them first and serve them like any other.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)


def take_queued(
    servers: Iterable[asyncio.Server],
    protocol_factory: Callable[[], asyncio.Protocol],
    tls: ssl.SSLContext | None,
    handshake_timeout_s: float,
) -> list[asyncio.Task[object]]:
    """Accept every queued connection of ``servers`` now and make each a connection of
    ``protocol_factory`` (over TLS when ``tls`` is given); one task per connection, done once it is
    made (a TLS handshake first, bounded by ``handshake_timeout_s``)."""
    loop = asyncio.get_running_loop()
    taken: list[asyncio.Task[object]] = []
    for server in servers:
        for listening in server.sockets:
            with socket.socket(fileno=os.dup(listening.fileno())) as sock:
                sock.setblocking(False)
                while True:
                    try:
                        conn, _ = sock.accept()
                    except OSError:  # BlockingIOError: the queue is empty
                        break
                    conn.setblocking(False)
                    if tls is None:
                        made = loop.connect_accepted_socket(protocol_factory, conn)
                    else:
                        made = loop.connect_accepted_socket(
                            protocol_factory, conn, ssl=tls, ssl_handshake_timeout=handshake_timeout_s
                        )
                    task: asyncio.Task[object] = loop.create_task(made)
                    task.add_done_callback(_logged)
                    taken.append(task)
    return taken


def _logged(task: asyncio.Task[object]) -> None:
    """A taken connection that never became one (its TLS handshake failed): logged."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("a connection taken from the accept queue failed: %s", task.exception())
