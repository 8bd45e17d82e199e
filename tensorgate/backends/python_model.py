"""The public base class for models written in Python (``backend: python``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensorgate.types import Array

if TYPE_CHECKING:
    from tensorgate.backends.base import ResponseSink


@dataclass(frozen=True, slots=True)
class ModelContext:
    """What a Python model learns about itself at load time."""

    name: str
    version: int
    directory: Path
    device: str
    parameters: Mapping[str, Any] = field(default_factory=dict)
    instance: str = ""  # this instance's name: one per instance of the version, as in the metrics


class ModelError(Exception):
    """Raise it from ``execute`` to refuse a request with a message meant for the client (an input
    the model cannot use): the client gets 500 with this message. Any other exception's message
    stays in the server log (it may hold paths or data), and the client gets a generic one."""


class SenderClosed(RuntimeError):
    """A response was sent after the request's final flag (or after the model's execute raised)."""


class ResponseSender:
    """One request's way back to its client, for a decoupled model (``model_transaction_policy:
    {decoupled: true}``).

    Call :meth:`send` once per response, then ``send(final=True)`` (or ``final=True`` on the last
    response), from :meth:`PythonModel.execute_decoupled` or later from a thread of the model's own:
    it is thread-safe. After the final flag the sender is closed and sending raises
    :class:`SenderClosed`. :meth:`is_cancelled` turns true when the client goes away or the request's
    deadline passes; what is sent after that is dropped, so a model checks it to stop early.
    """

    __slots__ = ("_check", "_closed", "_lock", "_sink")

    def __init__(self, sink: ResponseSink, check: Callable[[Mapping[str, object]], dict[str, Array]]) -> None:
        self._sink = sink
        self._check = check  # the outputs as the configuration declares them, or ValueError naming one
        self._lock = threading.Lock()
        self._closed = False

    def send(
        self, outputs: Mapping[str, object] | None = None, *, error: str | None = None, final: bool = False
    ) -> None:
        """Send one response (``outputs``: arrays by output name), an error response (``error``: a
        message for the client), and/or the final flag. Raises ModelError for outputs the
        configuration does not declare, or of the wrong datatype."""
        if outputs is None and error is None and not final:
            raise ValueError("send needs outputs, an error or final=True")
        checked = None if outputs is None or error is not None else self._check(outputs)
        with self._lock:  # responses leave in the order they were sent, and none after the final flag
            if self._closed:
                raise SenderClosed("Unable to send response. Response sender has been closed.")
            if final:
                self._closed = True
            self._sink.send(checked, error, final)

    def is_cancelled(self) -> bool:
        """True once the request is cancelled: the client went away or its deadline passed."""
        return self._sink.is_cancelled()

    @property
    def closed(self) -> bool:
        """The final flag was sent (or the model's execute raised): nothing more can be sent."""
        return self._closed

    def close_after_failure(self) -> None:
        """The model's execute raised: the request is answered with its error, so the model's threads
        can send nothing more."""
        with self._lock:
            self._closed = True


class PythonModel:
    """Derive from this in ``<version>/model.py``.

    ``load`` runs once per instance before any request; ``execute`` runs one batch at a time (inputs
    and outputs are numpy arrays keyed by tensor name, batch on axis 0 when the model batches);
    ``unload`` runs once at shutdown. Model code comes from the repository and is trusted; request
    data reaches it only as arrays.

    A decoupled model (``model_transaction_policy: {decoupled: true}``) implements
    :meth:`execute_decoupled` instead of ``execute``.
    """

    def load(self, context: ModelContext) -> None:
        """Prepare the model (read weights, build state). Raise to fail the load."""

    def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        raise NotImplementedError

    def execute_decoupled(self, inputs: Mapping[str, Array], sender: ResponseSender) -> None:
        """Answer one request with any number of responses through ``sender`` (a decoupled model).

        Send each response with ``sender.send(outputs)`` and end with ``sender.send(final=True)``,
        here or later from a thread the model starts. The instance takes its next request when this
        returns, so a model that streams from its own thread serves several requests at once. With
        dynamic batching each request of a batch is one call, in turn. Raising answers the request
        with the error (unless it was ended already).
        """
        raise NotImplementedError

    def unload(self) -> None:
        """Release what ``load`` took."""
