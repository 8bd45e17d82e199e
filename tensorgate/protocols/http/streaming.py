"""What the text-generation routes share: reading their JSON body, Server-Sent Events, and merging the
streams of one request's choices.

A client that disconnects needs nothing here: the listener's connection watch cancels the route's
task, and a stream that is cancelled while it is read frees its sequence at the engine's next step.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson

from tensorgate.errors import InvalidInput
from tensorgate.generation import FinishReason, GenerationStream, TokenEvent
from tensorgate.protocols.http.body import Receive, read_body
from tensorgate.protocols.http.exchange import Call, Send
from tensorgate.protocols.http.security_headers import NOSNIFF

_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"), NOSNIFF]
MAX_JSON_BYTES = 4 * 1024 * 1024

FINISH_REASONS = {
    FinishReason.STOP: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.CANCELLED: "abort",
    FinishReason.EXPIRED: "abort",
    FinishReason.ERROR: "abort",
}


async def read_json(receive: Receive, call: Call, limit: int) -> dict[str, Any]:
    length_header = call.header(b"content-length")
    length = int(length_header) if length_header and length_header.isdigit() else None
    body = await read_body(receive, length, min(limit, MAX_JSON_BYTES))
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise InvalidInput("the request body is not valid JSON") from None
    if not isinstance(document, dict):
        raise InvalidInput("the request body must be a JSON object")
    return document


class EventSender:
    """Server-Sent Events on one response: ``data: {...}`` lines, started on the first event."""

    def __init__(self, call: Call, send: Send) -> None:
        self._call = call
        self._send = send
        self.started = False

    async def event(self, data: Any) -> None:
        payload = data if isinstance(data, bytes) else orjson.dumps(data)
        await self.open()
        await self._send({"type": "http.response.body", "body": b"data: " + payload + b"\n\n", "more_body": True})

    async def open(self) -> None:
        """Start the response (200, ``text/event-stream``) if no event has yet."""
        if not self.started:
            self.started = True
            self._call.status = 200
            headers = [*_SSE, (b"x-request-id", self._call.request_id.encode())]
            await self._send({"type": "http.response.start", "status": 200, "headers": headers})

    async def close(self) -> None:
        if self.started:
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})


async def merged(streams: list[GenerationStream], *, coalesce: bool) -> AsyncIterator[tuple[int, TokenEvent]]:
    """Events of several streams (the ``n`` choices of one request) as they come; every stream is
    cancelled when the reader stops early (an error, or the client gone)."""
    if len(streams) == 1:
        async for event in streams[0].events(coalesce=coalesce):
            yield 0, event
        return
    queue: asyncio.Queue[tuple[int, TokenEvent] | tuple[int, BaseException] | None] = asyncio.Queue()

    async def pump(index: int, stream: GenerationStream) -> None:
        try:
            async for event in stream.events(coalesce=coalesce):
                await queue.put((index, event))
        except Exception as exc:
            await queue.put((index, exc))
        finally:
            await queue.put(None)

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
                continue
            index, got = item
            if isinstance(got, BaseException):
                raise got
            yield index, got
    finally:
        for task in tasks:
            task.cancel()
        for stream in streams:
            stream.cancel()
