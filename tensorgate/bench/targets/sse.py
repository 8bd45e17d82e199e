"""Server-sent events: bytes in, complete ``data`` payloads out. Pure, so it is tested without a server.

Events end at a blank line; lines may end in LF or CRLF; ``data:`` lines of one event are
joined with newlines; comments (``:``) and other fields are ignored, as the SSE spec says.
"""

from __future__ import annotations


class SseParser:
    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        """The data payloads of every event completed by ``chunk``."""
        self._buffer += chunk
        events: list[str] = []
        while True:
            newline = self._buffer.find(b"\n")
            if newline < 0:
                return events
            line = self._buffer[:newline].rstrip(b"\r").decode("utf-8", "replace")
            self._buffer = self._buffer[newline + 1 :]
            if not line:
                if self._data:
                    events.append("\n".join(self._data))
                    self._data = []
            elif line.startswith("data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(" ") else value)
