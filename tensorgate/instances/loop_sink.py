"""A decoupled request's responses, from the model's threads to its channel on the event loop.

A thread instance hands one :class:`LoopSink` per request to the backend. The model may send from
the instance's thread while ``execute`` runs or from a thread of its own afterwards; either way
each event is handed to the loop with ``call_soon_threadsafe``, so the events of one request reach
its channel in the order they were sent, and those sent during ``execute`` reach it before the
batch's end is reported (both travel the same queue of loop callbacks).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from tensorgate.decoupled import ResponseChannel, StreamEvent
from tensorgate.errors import InternalError
from tensorgate.types import Array


class LoopSink:
    """The sink of one request (``backends.base.ResponseSink``), for a model in this process."""

    __slots__ = ("_channel", "_loop", "revoked")

    def __init__(self, loop: asyncio.AbstractEventLoop, channel: ResponseChannel) -> None:
        self._loop = loop
        self._channel = channel
        # Its batch was given up (a hung thread, a reload): the request may run again elsewhere, and
        # whatever the abandoned call still sends must not reach its channel twice.
        self.revoked = False

    def send(self, outputs: Mapping[str, Array] | None, error: str | None, final: bool) -> None:
        if self.revoked:
            return
        # An error the model sends reaches the client in the model's own words, as in Triton.
        event = StreamEvent(outputs, None if error is None else InternalError(error), final)
        try:
            self._loop.call_soon_threadsafe(self._channel.push, event)
        except RuntimeError:  # the loop closed (the server stopped): nobody is listening
            pass

    def is_cancelled(self) -> bool:
        return self._channel.cancelled  # a plain attribute the loop sets: safe to read from any thread
