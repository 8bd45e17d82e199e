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


class AccessLog:
    """Records are kept as they come (a timestamp and the caller's dict) and formatted at flush.

    Formatting a few hundred lines in one loop costs less than formatting each in the middle of
    its request: measured on a saturated server, the per-request formatting made the access log
    ~5 % of the server's CPU per request, several times what the same code costs in a tight loop.
    """

    def __init__(self, stream: IO[bytes] | None = None, *, fmt: str = "json", enabled: bool = True) -> None:
        self._stream = stream if stream is not None else sys.stderr.buffer
        self._json = fmt == "json"
        self.enabled = enabled
        self._pending: list[tuple[float, dict[str, Any]]] = []
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
        """Everything a JSON line holds before the caller's fields, made once per millisecond: at
        thousands of requests per second most records share their millisecond."""
        millisecond = int(now * 1000)
        if millisecond != self._millisecond:
            self._millisecond = millisecond
            self._prefix = b"".join((b'{"ts":"', self._timestamp(now).encode(), _CONSTANT))
        return self._prefix

    def record(self, fields: dict[str, Any]) -> None:
        """Queue one line; called on the event loop. ``fields`` must not change afterwards."""
        if not self.enabled:
            return
        # A wall-clock timestamp for the log line, not a duration.
        self._pending.append((time.time(), fields))
        if len(self._pending) >= FLUSH_RECORDS:
            self.flush()
        elif self._scheduled is None:
            try:
                self._scheduled = asyncio.get_running_loop().call_later(FLUSH_INTERVAL_S, self.flush)
            except RuntimeError:  # no running loop (a test calling directly): write at once
                self.flush()

    def _text(self, pending: list[tuple[float, dict[str, Any]]]) -> bytes:
        return b"".join([_text_line(self._timestamp(now), fields).encode() for now, fields in pending])

    def _json_lines(self, pending: list[tuple[float, dict[str, Any]]]) -> bytes:
        # The constant part of every line is written as bytes, not merged into the dict, and the
        # lines are joined once (a join per line, or memoryviews in the join, cost several times more).
        parts: list[bytes] = []
        append = parts.append
        prefix = self._json_prefix
        dumps = orjson.dumps
        for now, fields in pending:
            append(prefix(now))
            append(dumps(fields, option=_NEWLINE)[1:])
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


def _text_line(stamp: str, fields: dict[str, Any]) -> str:
    """The same fields for a terminal: what was asked, how it ended, where the time went."""
    target = fields.get("path") or fields.get("model", "")
    return (
        f"{stamp} ACCESS  {fields.get('protocol', '')} {fields.get('method', '')} {target} {fields.get('status', '')} "
        f"model={fields.get('model', '-')} version={fields.get('version', '-')} "
        f"queue_ms={fields.get('queue_ms', 0):.2f} compute_ms={fields.get('compute_ms', 0):.2f} "
        f"total_ms={fields.get('total_ms', 0):.2f} request_id={fields.get('request_id', '')}\n"
    )
