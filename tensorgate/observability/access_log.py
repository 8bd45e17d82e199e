"""The access log: one line per request, cheap enough to leave on at thousands of requests per second.

The ``logging`` module costs tens of microseconds a record (record objects, handler locks, a write
per line); at 8k requests/s on two cores that is a tenth of the server. Access records are instead
queued as they come (msgspec structs) and encoded in one call per flush interval, written in one.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import IO, Final

from tensorgate.observability.access_lines import JSON_LINES, AccessLine

# Final: compiled, each is a constant in the code instead of a module-dict lookup per record.
FLUSH_INTERVAL_S: Final = 0.05
FLUSH_RECORDS: Final = 256  # about 64 KiB of JSON lines
# A line's milliseconds, formatted once: a tuple index and one concatenation instead of a format
# spec whenever the millisecond changes (bench_protocols.py counts the access log's instructions).
_MILLISECONDS: Final = tuple(f".{ms:03d}Z" for ms in range(1000))
_INFO: Final = "info"
_LOGGER: Final = "tensorgate.access"


class AccessLog:
    """Each request's line is a msgspec struct, made as it ends; a flush encodes them all at once.

    Work in the middle of a request costs several times what the same code costs in a tight loop
    (the request path has pushed it out of the caches by then), so the request pays only for
    recording its values: a struct is built in C from positional values, and ``encode_lines``
    writes a batch of them at flush with no dict in between. ``benchmarks/bench_protocols.py``
    measures what the access log, metrics and tracing cost a saturated server.
    """

    def __init__(
        self, stream: IO[bytes] | None = None, *, fmt: str = "json", enabled: bool = True, replica: str | None = None
    ) -> None:
        self._stream = stream if stream is not None else sys.stderr.buffer
        self._replica = replica
        self._json = fmt == "json"
        self.enabled = enabled
        self._pending: list[AccessLine] = []
        self._scheduled: asyncio.TimerHandle | None = None
        self._second = -1
        self._second_text = ""
        self._millisecond = -1
        self._stamp = ""

    def _timestamp(self, now: float) -> str:
        """ISO 8601 in UTC like the other log lines, made once per millisecond (at thousands of
        requests per second most lines share theirs); the seconds part once a second."""
        millisecond = int(now * 1000)
        if millisecond != self._millisecond:
            self._millisecond = millisecond
            second = int(now)
            if second != self._second:
                self._second = second
                self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._stamp = self._second_text + _MILLISECONDS[millisecond - second * 1000]
        return self._stamp

    def record(
        self,
        request_id: str,
        protocol: str,
        method: str,
        path: str | None,
        model: str,
        version: str,
        status: int | str,
        queue_s: float,
        compute_s: float,
        total_s: float,
        identity: str | None = None,
    ) -> None:
        """Queue one line (``path`` None for gRPC; ``identity`` the caller's name, never a key or
        token, where authentication is on); called on the event loop."""
        if not self.enabled:
            return
        # A wall-clock timestamp for the log line, not a duration.
        stamp = self._timestamp(time.time())
        line = AccessLine(
            stamp,
            _INFO,
            _LOGGER,
            request_id,
            protocol,
            method,
            model,
            version,
            status,
            queue_s * 1000,
            compute_s * 1000,
            total_s * 1000,
            path,
            self._replica,
            identity,
        )
        self._pending.append(line)
        if len(self._pending) >= FLUSH_RECORDS:
            self.flush()
        elif self._scheduled is None:
            try:
                self._scheduled = asyncio.get_running_loop().call_later(FLUSH_INTERVAL_S, self.flush)
            except RuntimeError:  # no running loop (a test calling directly): write at once
                self.flush()

    def flush(self) -> None:
        if self._scheduled is not None:
            self._scheduled.cancel()
            self._scheduled = None
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        data = JSON_LINES.encode_lines(pending) if self._json else "".join(map(_text_line, pending)).encode()
        try:
            self._stream.write(data)
            self._stream.flush()
        except (OSError, ValueError):  # a closed or full stream must not take a request down
            pass


def _text_line(line: AccessLine) -> str:
    """The same fields for a terminal: what was asked, how it ended, where the time went."""
    target = line.path or line.model
    return (
        f"{line.ts} ACCESS  {line.protocol} {line.method} {target} {line.status} model={line.model} "
        f"version={line.version} queue_ms={line.queue_ms:.2f} compute_ms={line.compute_ms:.2f} "
        f"total_ms={line.total_ms:.2f} request_id={line.request_id}"
        + ("" if line.replica is None else f" replica={line.replica}")
        + ("" if line.identity is None else f" identity={line.identity}")
        + "\n"
    )
