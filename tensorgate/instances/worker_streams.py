"""A worker process serving a decoupled model: several responses per request, on the same wire.

The plain worker loop answers each EXECUTE with one RESULT. A decoupled model answers each request
of a batch with any number of RESPONSE frames, from the thread running ``execute`` or from threads
the model starts, also after ``execute`` returned (DONE frees the instance for its next batch). So:

- a reader thread takes every frame from the server: batches go to the main thread, which runs them
  one at a time; CANCEL marks a request cancelled (its sender's ``is_cancelled()``); ACK releases
  the output region; the server closing the channel ends the process;
- one response at a time holds the output region: its outputs are written there, the RESPONSE frame
  names them, and the next response waits for the server's ACK (it has copied them out). Frames are
  written whole under one lock, whichever thread sends;
- a batch's inputs are copied out of the input region before the model sees them: the next batch
  overwrites the region, and a model's thread may still hold the last one's arrays.
"""

from __future__ import annotations

import queue
import socket
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from tensorgate.backends.base import Backend
from tensorgate.backends.python_model import ModelError
from tensorgate.instances.wire import (
    HEADER,
    Kind,
    Region,
    WireError,
    decode_header,
    decode_meta,
    encode_frame,
    read_tensors,
    write_tensors,
)
from tensorgate.types import Array

_Batch = tuple[int, int, dict[str, Any]]  # sequence number, input region size, meta


class _Responses:
    """What the batches' senders share: the socket, the output region, and the live requests."""

    def __init__(self, control: socket.socket, outputs: Region) -> None:
        self._control = control
        self._outputs = outputs
        self._write_lock = threading.Lock()  # one frame at a time on the socket
        self._region_lock = threading.Lock()  # one response at a time in the output region
        self._acked = threading.Event()
        self._closed = False  # the server is gone: senders stop waiting
        self._live: dict[tuple[int, int], _WireSink] = {}
        self._live_lock = threading.Lock()

    def write(self, frame: bytes) -> None:
        with self._write_lock:
            self._control.sendall(frame)

    def sink(self, seq: int, index: int) -> _WireSink:
        sink = _WireSink(self, seq, index)
        with self._live_lock:
            self._live[(seq, index)] = sink
        return sink

    def respond(self, sink: _WireSink, outputs: Mapping[str, Array] | None, error: str | None, final: bool) -> None:
        with self._region_lock:
            if self._closed:
                return  # the server went away; this process ends with it
            described = write_tensors(self._outputs, outputs) if outputs else []
            meta = {"request": sink.index, "final": final, "error": error, "tensors": described}
            self._acked.clear()
            self.write(encode_frame(Kind.RESPONSE, sink.seq, self._outputs.size, meta))
            self._acked.wait()
        if final:
            with self._live_lock:
                self._live.pop((sink.seq, sink.index), None)

    def forget_batch(self, seq: int) -> None:
        """The batch's execute raised: the server answers its requests; their senders are closed."""
        with self._live_lock:
            for key in [key for key in self._live if key[0] == seq]:
                del self._live[key]

    def acked(self) -> None:
        self._acked.set()

    def cancel(self, seq: int, index: int) -> None:
        with self._live_lock:
            sink = self._live.get((seq, index))
        if sink is not None:
            sink.cancelled = True

    def close(self) -> None:
        self._closed = True
        self._acked.set()


class _WireSink:
    """One request's sink (``backends.base.ResponseSink``) in the worker."""

    __slots__ = ("_responses", "cancelled", "index", "seq")

    def __init__(self, responses: _Responses, seq: int, index: int) -> None:
        self._responses = responses
        self.seq = seq
        self.index = index
        self.cancelled = False

    def send(self, outputs: Mapping[str, Array] | None, error: str | None, final: bool) -> None:
        self._responses.respond(self, outputs, error, final)

    def is_cancelled(self) -> bool:
        return self.cancelled


def _recv_exact(sock: socket.socket, size: int) -> bytes | None:
    chunks = []
    while size:
        try:
            chunk = sock.recv(size)
        except OSError:
            return None
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _read_frames(control: socket.socket, responses: _Responses, batches: queue.SimpleQueue[_Batch | None]) -> None:
    """The reader thread: every frame the server sends, until it closes the channel."""
    try:
        while True:
            header = _recv_exact(control, HEADER.size)
            if header is None:
                return
            kind, seq, region_size, meta_len = decode_header(header)
            raw = _recv_exact(control, meta_len)
            if raw is None:
                return
            meta = decode_meta(raw)
            if kind is Kind.EXECUTE:
                batches.put((seq, region_size, meta))
            elif kind is Kind.ACK:
                responses.acked()
            elif kind is Kind.CANCEL:
                responses.cancel(seq, int(meta.get("request", -1)))
    except WireError:
        return
    finally:
        responses.close()
        batches.put(None)


def _split(batch: dict[str, Array], rows: list[int]) -> list[dict[str, Array]]:
    """Each request's inputs from the batch's, by its rows on axis 0."""
    if len(rows) <= 1:
        return [batch]
    bounds = np.cumsum([0, *rows])
    return [{name: array[bounds[i] : bounds[i + 1]] for name, array in batch.items()} for i in range(len(rows))]


def serve_decoupled(backend: Backend, control: socket.socket, inputs: Region, outputs: Region) -> int:
    responses = _Responses(control, outputs)
    batches: queue.SimpleQueue[_Batch | None] = queue.SimpleQueue()
    reader = threading.Thread(target=_read_frames, args=(control, responses, batches), name="wire-reader", daemon=True)
    reader.start()
    while (job := batches.get()) is not None:
        seq, region_size, meta = job
        try:
            inputs.ensure(region_size, grow_file=False)
            batch = read_tensors(inputs, meta.get("tensors"), copy=True)
            rows = [int(r) for r in meta.get("rows") or []]
            sinks = [responses.sink(seq, index) for index in range(max(1, len(rows)))]
            backend.execute_decoupled(_split(batch, rows), sinks)
            reply = encode_frame(Kind.DONE, seq, 0, {})
        except Exception as exc:
            responses.forget_batch(seq)
            failure = {"error": f"{type(exc).__name__}: {exc}"}
            if isinstance(exc, ModelError):  # a message the model meant for the client
                failure["public"] = str(exc)
            reply = encode_frame(Kind.ERROR, seq, 0, failure)
        try:
            responses.write(reply)
        except OSError:
            break
    backend.close()
    return 0
