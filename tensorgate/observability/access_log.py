"""The access log: one line per request, cheap enough to leave on at thousands of requests per second.

The ``logging`` module costs tens of microseconds a record (record objects, handler locks, a write
per line); at 8k requests/s on two cores that is a tenth of the server. Access records are instead
queued as they come and formatted with orjson in one loop per flush interval, written in one call.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import IO, Any

import orjson

FLUSH_INTERVAL_S = 0.05
FLUSH_RECORDS = 256  # about 64 KiB of JSON lines
_CONSTANT = b'","level":"info","logger":"tensorgate.access",'
_NEWLINE = orjson.OPT_APPEND_NEWLINE


# One request as kept until the flush: when it ended (wall clock, seconds), then request id,
# protocol, method, path (None for gRPC), model, version, status, and queue, compute and total seconds.
Record = tuple[float, str, str, str, str | None, str, str, int | str, float, float, float]


class AccessLog:
    """Records are kept as they come (a tuple of the request's values) and formatted at flush.

    Work in the middle of a request costs several times what the same code costs in a tight loop
    (the request path has pushed it out of the caches by then): measured on a saturated server, a
    line formatted per request made the access log ~5 % of the server's CPU per request, and a dict
    of the fields built per request still ~4 %. A record is one tuple; the dicts and the JSON are
    made in one loop per flush.
    """

    def __init__(self, stream: IO[bytes] | None = None, *, fmt: str = "json", enabled: bool = True) -> None:
        self._stream = stream if stream is not None else sys.stderr.buffer
        self._json = fmt == "json"
        self.enabled = enabled
        self._pending: list[Record] = []
        self._scheduled: asyncio.TimerHandle | None = None
        self._second = -1
        self._second_text = ""
        self._millisecond = -1
        self._prefix = b""

    def _timestamp(self, now: float) -> str:
        """ISO 8601 in UTC like the other log lines; the seconds part is formatted once a second."""
        second = int(now)
        if second != self._second:
            self._second = second
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._second_text}.{int((now - second) * 1000):03d}Z"

    def _json_prefix(self, now: float) -> bytes:
        """Everything a JSON line holds before the request's fields, made once per millisecond: at
        thousands of requests per second most records share their millisecond."""
        millisecond = int(now * 1000)
        if millisecond != self._millisecond:
            self._millisecond = millisecond
            self._prefix = b"".join((b'{"ts":"', self._timestamp(now).encode(), _CONSTANT))
        return self._prefix

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
    ) -> None:
        """Queue one line; called on the event loop."""
        if not self.enabled:
            return
        # A wall-clock timestamp for the log line, not a duration.
        self._pending.append(
            (time.time(), request_id, protocol, method, path, model, version, status, queue_s, compute_s, total_s)
        )
        if len(self._pending) >= FLUSH_RECORDS:
            self.flush()
        elif self._scheduled is None:
            try:
                self._scheduled = asyncio.get_running_loop().call_later(FLUSH_INTERVAL_S, self.flush)
            except RuntimeError:  # no running loop (a test calling directly): write at once
                self.flush()

    def _text(self, pending: list[Record]) -> bytes:
        return b"".join([_text_line(self._timestamp(r[0]), r).encode() for r in pending])

    def _json_lines(self, pending: list[Record]) -> bytes:
        # The constant part of every line is written as bytes, not merged into the dict, and the
        # lines are joined once (a join per line, or memoryviews in the join, cost several times more).
        parts: list[bytes] = []
        append = parts.append
        prefix = self._json_prefix
        dumps = orjson.dumps
        for r in pending:
            append(prefix(r[0]))
            append(dumps(_fields(r), option=_NEWLINE)[1:])
        return b"".join(parts)

    def flush(self) -> None:
        if self._scheduled is not None:
            self._scheduled.cancel()
            self._scheduled = None
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        data = self._json_lines(pending) if self._json else self._text(pending)
        try:
            self._stream.write(data)
            self._stream.flush()
        except (OSError, ValueError):  # a closed or full stream must not take a request down
            pass


def _fields(r: Record) -> dict[str, Any]:
    fields: dict[str, Any] = {"request_id": r[1], "protocol": r[2], "method": r[3]}
    if r[4] is not None:
        fields["path"] = r[4]
    fields["model"] = r[5]
    fields["version"] = r[6]
    fields["status"] = r[7]
    fields["queue_ms"] = r[8] * 1000
    fields["compute_ms"] = r[9] * 1000
    fields["total_ms"] = r[10] * 1000
    return fields


def _text_line(stamp: str, r: Record) -> str:
    """The same fields for a terminal: what was asked, how it ended, where the time went."""
    target = r[4] or r[5]
    return (
        f"{stamp} ACCESS  {r[2]} {r[3]} {target} {r[7]} model={r[5]} version={r[6]} "
        f"queue_ms={r[8] * 1000:.2f} compute_ms={r[9] * 1000:.2f} total_ms={r[10] * 1000:.2f} request_id={r[1]}\n"
    )
