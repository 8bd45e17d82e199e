"""Text generation over HTTP, shared plumbing plus the KServe/Triton generate extension.

``POST /v2/models/{m}[/versions/{v}]/generate`` answers one JSON document;
``.../generate_stream`` answers Server-Sent Events, one ``data: {...}`` per token. The plumbing
here (finding a generative version, reading a JSON body, SSE, disconnect watching) also serves
the OpenAI routes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, cast, runtime_checkable

import orjson

from tensorgate.errors import Cancelled, InvalidInput, TensorgateError
from tensorgate.generation import FinishReason, GenerationStream, SamplingParams, TokenEvent
from tensorgate.models.service import InferenceService
from tensorgate.protocols.http.body import Receive, read_body
from tensorgate.protocols.http.security_headers import NOSNIFF

Send = Callable[[dict[str, Any]], Awaitable[None]]

_JSON = (b"content-type", b"application/json")
_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"), NOSNIFF]
MAX_JSON_BYTES = 4 * 1024 * 1024


class CallLike(Protocol):
    """The parts of the app's per-exchange record these routes read and fill in."""

    method: str
    path: str
    request_id: str
    model: str
    version: str
    status: int

    def header(self, name: bytes) -> str | None: ...

    def allow_model(self, name: str) -> None:
        """403 for a caller limited to other models (nothing where authentication is off)."""

    def may_use(self, name: str) -> bool:
        """Whether ``allow_model`` would pass, counting nothing (to filter a list)."""


@runtime_checkable
class TextGenerator(Protocol):
    """What a generative model version offers the protocols (see ``models.generative``)."""

    name: str
    version: int
    max_model_len: int

    def encode(self, text: str) -> list[int]: ...

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]: ...

    def token_text(self, token_id: int) -> str: ...

    def submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        priority: int | None = ...,
        timeout_s: float | None = ...,
        incremental: bool = ...,
    ) -> GenerationStream: ...


# isinstance() against a runtime-checkable Protocol looks up each of its members on every call
# (~30 us here); a model version's class does not change, so the answer is kept per class.
_GENERATES: dict[type, bool] = {}


def generates_text(target: object) -> bool:
    kind = type(target)
    known = _GENERATES.get(kind)
    if known is None:
        known = _GENERATES[kind] = isinstance(target, TextGenerator)
    return known


def find_generator(service: InferenceService, name: str, version: int | None) -> TextGenerator:
    target = service.router.route(name, version)
    if not generates_text(target):
        raise InvalidInput(f"model '{name}' does not generate text")
    return cast(TextGenerator, target)


async def read_json(receive: Receive, call: CallLike, limit: int) -> dict[str, Any]:
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


async def send_json(call: CallLike, send: Send, status: int, document: Any) -> None:
    call.status = status
    body = orjson.dumps(document)
    headers = [
        _JSON,
        (b"content-length", str(len(body)).encode()),
        (b"x-request-id", call.request_id.encode()),
        NOSNIFF,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class EventSender:
    """Server-Sent Events on one response: ``data: {...}`` lines, started on the first event."""

    def __init__(self, call: CallLike, send: Send) -> None:
        self._call = call
        self._send = send
        self.started = False

    async def event(self, data: Any) -> None:
        payload = data if isinstance(data, bytes) else orjson.dumps(data)
        if not self.started:
            self.started = True
            self._call.status = 200
            headers = [*_SSE, (b"x-request-id", self._call.request_id.encode())]
            await self._send({"type": "http.response.start", "status": 200, "headers": headers})
        await self._send({"type": "http.response.body", "body": b"data: " + payload + b"\n\n", "more_body": True})

    async def close(self) -> None:
        if self.started:
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})


async def merged(streams: list[GenerationStream], *, coalesce: bool) -> AsyncIterator[tuple[int, TokenEvent]]:
    """Events of several streams (the ``n`` choices of one request) as they come."""
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


@contextlib.asynccontextmanager
async def watching_disconnect(receive: Receive, streams: list[GenerationStream]) -> AsyncIterator[None]:
    """While the body runs, a client that disconnects cancels every stream (freed at the next step)."""

    async def watch() -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                for stream in streams:
                    stream.cancel()
                return

    watcher = asyncio.create_task(watch())
    try:
        yield
    finally:
        watcher.cancel()
    if any(s.finish_reason is FinishReason.CANCELLED for s in streams) and watcher.done() and not watcher.cancelled():
        raise Cancelled("the client disconnected")


FINISH_REASONS = {
    FinishReason.STOP: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.CANCELLED: "abort",
    FinishReason.EXPIRED: "abort",
    FinishReason.ERROR: "abort",
}


# -- the KServe / Triton generate extension ----------------------------------------------------------

_PARAMS = {"max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "ignore_eos", "priority", "timeout"}


def _number(params: dict[str, Any], key: str, kind: type, default: Any, low: float | None = None) -> Any:
    value: Any = params.get(key, default)
    if value is None:
        return default
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, (int, float)) or not isinstance(value, kind) or isinstance(value, bool):
        raise InvalidInput(f"parameter '{key}' must be {'an integer' if kind is int else 'a number'}")
    if low is not None and value < low:
        raise InvalidInput(f"parameter '{key}' must be at least {low}")
    return value


def generate_params(document: dict[str, Any]) -> tuple[str, SamplingParams, int | None, float | None]:
    text = document.get("text_input")
    if not isinstance(text, str):
        raise InvalidInput("'text_input' must be a string")
    params = dict(document.get("parameters") or {})
    if not isinstance(document.get("parameters") or {}, dict):
        raise InvalidInput("'parameters' must be an object")
    for key in _PARAMS:  # Triton also accepts parameters at the top level
        if key in document and key not in params:
            params[key] = document[key]
    stop = params.get("stop") or ()
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise InvalidInput("parameter 'stop' must be a string or a list of strings")
    ignore_eos = params.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise InvalidInput("parameter 'ignore_eos' must be a boolean")
    sampling = SamplingParams(
        max_tokens=_number(params, "max_tokens", int, 16, 1),
        temperature=_number(params, "temperature", float, 0.0, 0.0),
        top_p=_number(params, "top_p", float, 1.0, 0.0),
        top_k=_number(params, "top_k", int, 0, 0),
        seed=_number(params, "seed", int, None),
        stop=tuple(stop),
        ignore_eos=ignore_eos,
    )
    timeout = _number(params, "timeout", float, None, 0.0)
    return text, sampling, _number(params, "priority", int, None, 0), timeout


async def handle_generate(
    service: InferenceService,
    call: CallLike,
    name: str,
    version: int | None,
    stream_mode: bool,
    receive: Receive,
    send: Send,
    limit: int,
) -> None:
    generator = find_generator(service, name, version)
    document = await read_json(receive, call, limit)
    text, params, priority, timeout = generate_params(document)
    stream = generator.submit(
        generator.encode(text), params, priority=priority or None, timeout_s=timeout, incremental=stream_mode
    )
    call.version = str(generator.version)
    head = {"model_name": generator.name, "model_version": str(generator.version)}
    if not stream_mode:
        async with watching_disconnect(receive, [stream]):
            async for _ in stream.events(coalesce=True):
                pass
        reason = FINISH_REASONS.get(stream.finish_reason or FinishReason.STOP, "stop")
        await send_json(
            call,
            send,
            200,
            {**head, "text_output": stream.text, "finish_reason": reason, "completion_tokens": len(stream.output_ids)},
        )
        return
    sender = EventSender(call, send)
    try:
        async with watching_disconnect(receive, [stream]):
            async for event in stream.events(coalesce=True):
                out: dict[str, Any] = {**head, "text_output": event.text}
                if event.finish_reason is not None:
                    out["finish_reason"] = FINISH_REASONS[event.finish_reason]
                await sender.event(out)
    except TensorgateError as exc:
        if not sender.started:
            raise
        await sender.event({"error": exc.message})
    await sender.close()
