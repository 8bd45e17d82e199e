"""The generate extension for tensor models (decoupled ones above all), in Triton's form.

``POST /v2/models/{m}/generate_stream`` sends each response of the model as one Server-Sent Event;
``/generate`` answers the model's one response as a JSON document, and refuses (400) a model that
sends another number of them, in Triton's words. Text generators keep their own form
(``generate_routes``); any other model takes this one.

The request is one JSON object. A key that names one of the model's inputs is that input: a value
or a flat list, shaped as Triton shapes it (the fixed dimensions take what they need, the innermost
dynamic one the rest, any other dynamic one 1). Every other key, and each entry of ``parameters``,
is a request parameter (``priority`` and ``timeout`` mean what they mean on ``/infer``). A response
is ``{"model_name", "model_version", <output>: value or list, ...}``: an output of one element as
that value, a longer one as a flat list. An error after the first event is an event of its own,
``{"error": "..."}``, as Triton sends it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tensorgate.decoupled import ResponseStream
from tensorgate.errors import InvalidInput
from tensorgate.models.target import Target
from tensorgate.protocols.http.exchange import Call, Responder, Send
from tensorgate.protocols.http.streaming import EventSender
from tensorgate.protocols.http.v2_codec import dumps
from tensorgate.protocols.parameters import priority_and_timeout
from tensorgate.protocols.tensor_codec import from_json_data, to_json_data
from tensorgate.types import Array, DataType, InferRequest, TensorSpec

# Triton's words for /generate on a model that did not answer exactly once.
EXACTLY_ONE = (
    "generate expects model to produce exactly 1 response, use generate stream for model that "
    "generates various number of responses"
)
_JSON = (b"content-type", b"application/json")


def generate_request(
    document: Mapping[str, Any], name: str, version: int | None, specs: tuple[TensorSpec, ...]
) -> InferRequest:
    """A generate body as a request for a tensor model with these input specs."""
    by_name = {spec.name: spec for spec in specs}
    parameters: dict[str, Any] = {}
    nested = document.get("parameters") if "parameters" not in by_name else None
    if nested is not None:
        if not isinstance(nested, dict):
            raise InvalidInput("'parameters' must be an object")
        for key, value in nested.items():
            parameters[key] = _parameter(key, value)
    inputs: dict[str, Array] = {}
    for key, value in document.items():
        spec = by_name.get(key)
        if spec is not None:
            inputs[key] = _tensor(spec, value)
        elif key != "parameters":
            parameters[key] = _parameter(key, value)
    priority, timeout = priority_and_timeout(parameters)
    return InferRequest(
        model=name, inputs=inputs, version=version, parameters=parameters, priority=priority, timeout_s=timeout
    )


def _parameter(key: str, value: Any) -> Any:
    if isinstance(value, bool | int | float | str):
        return value
    raise InvalidInput(f"parameter '{key}' must be a string, a number or a boolean")


def _tensor(spec: TensorSpec, value: Any) -> Array:
    values = value if isinstance(value, list) else [value]
    if any(isinstance(v, list | dict) for v in values) or isinstance(value, dict):
        raise InvalidInput(f"input '{spec.name}': generate takes a value or a flat list of values")
    shape = _shape(spec, len(values))
    return from_json_data(values, spec.datatype, shape, len(values), spec.name)


def _shape(spec: TensorSpec, count: int) -> tuple[int, ...]:
    """Triton's two passes: fixed dimensions divide the count; the innermost dynamic one takes the
    rest, every other dynamic one is 1."""
    remaining = count
    for dim in spec.shape:
        if dim != -1:
            if dim == 0 or remaining % dim:
                raise InvalidInput(f"The schema can not convert input '{spec.name}' to tensor with proper shape")
            remaining //= dim
    dims = list(spec.shape)
    for index in range(len(dims) - 1, -1, -1):
        if dims[index] == -1:
            dims[index], remaining = remaining, 1
    if remaining != 1:
        raise InvalidInput(f"The schema can not convert input '{spec.name}' to tensor with proper shape")
    return tuple(dims)


def response_document(stream: ResponseStream, outputs: Mapping[str, Array]) -> bytes:
    document: dict[str, Any] = {"model_name": stream.model, "model_version": str(stream.version)}
    for name, array in outputs.items():
        data = to_json_data(array, DataType.from_numpy(array.dtype))
        document[name] = data[0] if array.size == 1 else data
    return dumps(document)


async def serve_generate(
    call: Call,
    target: Target,
    specs: tuple[TensorSpec, ...],
    stream_mode: bool,
    document: Mapping[str, Any],
    responder: Responder,
    send: Send,
) -> None:
    """One generate call on a tensor model. A client that leaves cancels this task (the listener's
    connection watch): the request is cancelled in the model, as it is when it stops early here."""
    request = generate_request(document, target.name, target.version, specs)
    request = request.with_context(call.request_id, call.header(b"traceparent"), request.tenant)
    stream = await target.stream(request)
    call.version = str(stream.version)
    try:
        if stream_mode:
            await _events(call, stream, send)
        else:
            await _one(call, stream, responder, send)
    finally:
        stream.cancel()


async def _one(call: Call, stream: ResponseStream, responder: Responder, send: Send) -> None:
    answer: Mapping[str, Array] | None = None
    async for event in stream:
        if event.error is not None:
            raise event.error
        if event.outputs is not None:
            if answer is not None:  # a second response: the model streams, and this route cannot
                raise InvalidInput(EXACTLY_ONE)
            answer = event.outputs
    if answer is None:
        raise InvalidInput(EXACTLY_ONE)
    await responder.body(call, send, 200, response_document(stream, answer), [_JSON])


async def _events(call: Call, stream: ResponseStream, send: Send) -> None:
    sender = EventSender(call, send)
    async for event in stream:
        if event.error is not None:
            if not sender.started:  # nothing sent yet: a plain error answer with its status
                raise event.error
            await sender.event({"error": event.error.message})
        elif event.outputs is not None:
            await sender.event(response_document(stream, event.outputs))
    await sender.open()  # a model that sent no response still answers 200, with no events
    await sender.close()
