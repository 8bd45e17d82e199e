"""``ModelStreamInfer``: many requests on one call, answered in Triton's order.

Requests run concurrently (so they can share batches). Answers to models that answer once come back
in the order their requests came, as Triton sends them; a decoupled model's responses go out as the
model sends them, interleaved with the others (Triton does the same: it queues only the former in
request order). One bounded queue holds what is ready to write; the order of the first kind is kept
by a chain of turns, each request putting its answer only once the one before it has.

A request takes a place in the window (``STREAM_WINDOW``) until its last answer is queued; with the
window full the call stops reading, so HTTP/2 flow control pushes back on the client. When the call
ends (the client cancelled or closed it, or its deadline passed) every request still running is
cancelled: a queued one leaves its queue, and a decoupled model is told through ``is_cancelled()``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from typing import Any, Protocol

from tensorgate.protocols.grpc.raw_inputs import ReceivedInfer

# Requests of one stream being decoded or run at once. Past it the servicer stops reading the
# stream, so HTTP/2 flow control pushes back on the client instead of the server buffering.
STREAM_WINDOW = 64


class StreamHandler(Protocol):
    """What the servicer does for each request of a stream."""

    def is_decoupled(self, received: ReceivedInfer) -> bool:
        """Whether the request's model streams its responses (decided before it runs, from its name)."""
        ...

    def answer(self, received: ReceivedInfer) -> Coroutine[Any, Any, Any]:
        """The one answer of a request (a ``ModelStreamInferResponse``, its error included)."""
        ...

    def answers(self, received: ReceivedInfer) -> AsyncGenerator[Any, None]:
        """A decoupled request's answers, as the model sends them (errors included)."""
        ...


async def stream_infer(handler: StreamHandler, requests: AsyncIterator[ReceivedInfer]) -> AsyncIterator[Any]:
    out: asyncio.Queue[Any] = asyncio.Queue(maxsize=STREAM_WINDOW)
    window = asyncio.Semaphore(STREAM_WINDOW)
    running: set[asyncio.Task[None]] = set()
    loop = asyncio.get_running_loop()
    failure: list[BaseException] = []

    async def in_turn(received: ReceivedInfer, after: asyncio.Future[None] | None, turn: asyncio.Future[None]) -> None:
        try:
            answer = await handler.answer(received)
            if after is not None:
                await after
            await out.put(answer)
        finally:
            if not turn.done():  # also when this one failed or was cancelled: the next is not held up
                turn.set_result(None)
            window.release()

    async def as_they_come(received: ReceivedInfer) -> None:
        try:
            async with contextlib.aclosing(handler.answers(received)) as answers:
                async for answer in answers:
                    await out.put(answer)
        finally:
            window.release()

    def start(work: Coroutine[Any, Any, None]) -> None:
        task = loop.create_task(work)
        running.add(task)
        task.add_done_callback(running.discard)

    async def read() -> None:
        previous: asyncio.Future[None] | None = None
        try:
            async for received in requests:
                await window.acquire()
                if handler.is_decoupled(received):
                    start(as_they_come(received))
                else:
                    turn: asyncio.Future[None] = loop.create_future()
                    start(in_turn(received, previous, turn))
                    previous = turn
        except Exception as exc:  # an error reading the stream: surfaced once what was read is answered
            failure.append(exc)
        while running:
            await asyncio.wait(set(running))
        await out.put(None)

    reader = loop.create_task(read())
    try:
        while (answer := await out.get()) is not None:
            yield answer
        await reader
        if failure:
            raise failure[0]
    finally:
        reader.cancel()
        for task in list(running):
            task.cancel()


def decoupled_checker(decoupled: Callable[[str], bool]) -> Callable[[ReceivedInfer], bool]:
    """``StreamHandler.is_decoupled`` from the service's answer by model name; a malformed request is
    not (its error is answered in turn)."""

    def check(received: ReceivedInfer) -> bool:
        return received.error is None and decoupled(received.message.model_name)

    return check
