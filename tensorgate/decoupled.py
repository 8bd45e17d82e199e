"""Decoupled models' vocabulary: one request answered by any number of responses.

Triton's decoupled transaction policy (``model_transaction_policy: {decoupled: true}``): the model
gets a response sender per request and sends zero, one or many responses through it, then the final
flag, from ``execute`` or from a thread it started. ``execute`` returning frees the instance for its
next batch; the request lives on until its final flag.

- :class:`StreamEvent`: one thing the model sent: outputs, an error, the final flag (or several of them).
- :class:`ResponseChannel`: one request's events on the event loop, from the instance that runs it
  (:meth:`~ResponseChannel.push`) to the protocol that sends them (:meth:`~ResponseChannel.next`). Its
  ``cancelled`` flag is what the model's ``is_cancelled()`` reads, from any thread.
- :class:`ResponseStream`: what a protocol holds: the channel, and the task that takes the request
  through its version's scheduler. Cancelling it cancels the request in the model.

A leaf: it imports nothing of the request path, so every layer may use it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from tensorgate.errors import Cancelled, InternalError, TensorgateError, TooLarge
from tensorgate.types import Array, InferResponse

log = logging.getLogger(__name__)

# A request's responses waiting for its protocol to send them, at most. Past it the client has not
# read for that long (a stalled connection): the request is cancelled rather than held in memory.
MAX_WAITING_RESPONSES = 4096

EndListener = Callable[[TensorgateError | None], None]


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """What the model sent for a request: ``outputs`` (None: no response, only a flag or an error),
    an ``error`` (the model's, or the server's when the request ends early), and whether it is the
    request's last (``final``)."""

    outputs: Mapping[str, Array] | None = None
    error: TensorgateError | None = None
    final: bool = False


class ResponseChannel:
    """One decoupled request's responses, on the event loop.

    The instance pushes the model's events in the order it sent them; the protocol reads them with
    :meth:`next` until it returns None. The channel ends once: at the final flag, when it fails
    (:meth:`fail`: a deadline, the model raised, its instance died) or when the client goes away
    (:meth:`cancel`); events after that are dropped. Everything here runs on the event loop except
    reading ``cancelled``, which the model's threads do through their sender.
    """

    __slots__ = (
        "_cancel_listeners",
        "_end_error",
        "_end_listeners",
        "_events",
        "_waiter",
        "cancelled",
        "ended",
        "max_waiting",
        "responses",
        "started",
    )

    def __init__(self, max_waiting: int = MAX_WAITING_RESPONSES) -> None:
        self._events: deque[StreamEvent] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._end_listeners: list[EndListener] = []
        self._cancel_listeners: list[Callable[[], None]] = []
        self._end_error: TensorgateError | None = None
        self.max_waiting = max_waiting
        self.cancelled = False  # the model is told to stop: the client left, or the deadline passed
        self.ended = False  # the last event is in; later ones are dropped
        self.responses = 0  # responses with outputs the model sent (the per-request metric)
        self.started = False  # the model sent something: a request that sent nothing may be retried

    # -- the instance's side ---------------------------------------------------------------------

    def push(self, event: StreamEvent) -> None:
        """An event from the model. Dropped once the channel has ended (the client left, the
        deadline passed): the model may go on sending until it sees ``is_cancelled()``."""
        if self.ended:
            return
        self.started = True
        if event.outputs is not None:
            self.responses += 1
        if len(self._events) >= self.max_waiting:
            self.fail(
                TooLarge(
                    f"{self.max_waiting} responses of this request waited for the client to read them; "
                    "the request is cancelled"
                )
            )
            return
        self._events.append(event)
        self._wake()
        if event.final:
            self._end(event.error)

    def fail(self, error: TensorgateError, *, stop_model: bool = True) -> None:
        """End the request with ``error`` as its last event. ``stop_model``: the model is still
        running it and is told to stop (a deadline); not when the model itself failed or died."""
        if self.ended:
            return
        self._events.append(StreamEvent(None, error, True))
        self._wake()
        if stop_model:
            self._stop_model()
        self._end(error)

    def cancel(self) -> None:
        """The client is gone: drop what waits, tell the model, end."""
        self._events.clear()
        if self.ended:
            return
        self._stop_model()
        self._end(Cancelled("the client cancelled the request"))
        self._wake()

    def on_cancel(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` when the model is told to stop (a worker process is sent word)."""
        self._cancel_listeners.append(listener)

    def on_end(self, listener: EndListener) -> None:
        """Call ``listener(error)`` once the channel ends: None after a final flag without an error,
        the error otherwise (a :class:`Cancelled` when the client went away). At once when it has."""
        if self.ended:
            listener(self._end_error)
        else:
            self._end_listeners.append(listener)

    # -- the protocol's side ---------------------------------------------------------------------

    async def next(self) -> StreamEvent | None:
        """The next event, in the order the model sent them; None once the channel has ended and
        every event has been read."""
        while not self._events:
            if self.ended:
                return None
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        return self._events.popleft()

    # -- internals -------------------------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _stop_model(self) -> None:
        if self.cancelled:
            return
        self.cancelled = True
        for listener in self._cancel_listeners:
            try:
                listener()
            except Exception:  # a listener's failure must not keep the others from hearing
                log.exception("a cancellation listener failed")

    def _end(self, error: TensorgateError | None) -> None:
        self.ended = True
        self._end_error = error
        listeners, self._end_listeners = self._end_listeners, []
        for listener in listeners:
            try:
                listener(error)
            except Exception:
                log.exception("a stream end listener failed")


class ResponseStream:
    """One request as its protocol reads it: ``async for event in stream`` yields its events in
    order until its last; ``cancel()`` when the client goes away (it also cancels a request still
    queued). ``model`` and ``version`` name what serves it, ``id`` is the request's own id.

    ``run`` is the coroutine that takes the request to its end (a version's scheduler): an error it
    raises before the model ended the channel becomes the stream's last event. ``outputs``, when
    given, are the outputs the client asked for: each response carries only those.
    """

    __slots__ = ("_task", "_wanted", "channel", "id", "model", "version")

    def __init__(
        self,
        channel: ResponseChannel,
        run: Coroutine[Any, Any, object],
        model: str,
        version: int,
        request_id: str = "",
        outputs: tuple[str, ...] = (),
    ) -> None:
        self.channel = channel
        self.model = model
        self.version = version
        self.id = request_id
        self._wanted = outputs
        self._task = asyncio.get_running_loop().create_task(self._run(run))

    async def _run(self, run: Coroutine[Any, Any, object]) -> None:
        channel = self.channel
        try:
            await run
        except TensorgateError as exc:
            channel.fail(exc)
        except asyncio.CancelledError:
            channel.cancel()
            raise
        except Exception:
            log.exception("a stream of model '%s' failed", self.model)
            channel.fail(InternalError(f"model '{self.model}' failed to execute the request"))

    def __aiter__(self) -> ResponseStream:
        return self

    async def __anext__(self) -> StreamEvent:
        event = await self.channel.next()
        if event is None:
            raise StopAsyncIteration
        wanted = self._wanted
        if wanted and event.outputs is not None:
            event = StreamEvent({n: event.outputs[n] for n in wanted if n in event.outputs}, event.error, event.final)
        return event

    def response(self, outputs: Mapping[str, Array]) -> InferResponse:
        """One response of the stream as the codecs encode an answer."""
        return InferResponse(self.model, self.version, outputs, id=self.id)

    @property
    def done(self) -> bool:
        """Every event is in (the protocol may still be reading them)."""
        return self.channel.ended

    def cancel(self) -> None:
        """The client is gone (or stopped reading): the request leaves its queue, or the model is
        told through ``is_cancelled()``; what it sends from now on is dropped. A stream that ended
        is left to finish on its own."""
        if self.channel.ended:
            return
        self._task.cancel()
        self.channel.cancel()


async def single_response(run: Coroutine[Any, Any, InferResponse], channel: ResponseChannel) -> None:
    """A request of a model that is not decoupled, as a stream of its one response (for routes that
    stream from any model, such as ``generate_stream``)."""
    response = await run
    channel.push(StreamEvent(response.outputs, None, True))
