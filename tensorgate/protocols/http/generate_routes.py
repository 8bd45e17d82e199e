"""The KServe / Triton generate extension: ``POST /v2/models/{m}[/versions/{v}]/generate`` answers one
JSON document; ``.../generate_stream`` answers Server-Sent Events, one ``data: {...}`` per token.

That is for text generators; any other model (a decoupled one above all) takes Triton's tensor form,
its inputs and outputs by name (``generate_tensors``)."""

from __future__ import annotations

from typing import Any

from tensorgate.errors import InvalidInput, TensorgateError
from tensorgate.generation import FinishReason, SamplingParams
from tensorgate.models.service import InferenceService
from tensorgate.models.target import generates_text
from tensorgate.names import check_model_name, parse_version
from tensorgate.protocols.http.body import Receive
from tensorgate.protocols.http.exchange import Call, Responder, Send
from tensorgate.protocols.http.generate_tensors import serve_generate
from tensorgate.protocols.http.routes import Params, RouteTable
from tensorgate.protocols.http.streaming import FINISH_REASONS, EventSender, read_json

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


class GenerateRoutes:
    def __init__(self, service: InferenceService, responder: Responder, max_body_bytes: int) -> None:
        self._service = service
        self._out = responder
        self._limit = max_body_bytes

    def register(self, routes: RouteTable) -> None:
        for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            routes.add("POST", f"{prefix}/generate", self.generate)
            routes.add("POST", f"{prefix}/generate_stream", self.generate_stream)

    async def generate(self, call: Call, params: Params, receive: Receive, send: Send) -> None:
        await self._handle(call, params, False, receive, send)

    async def generate_stream(self, call: Call, params: Params, receive: Receive, send: Send) -> None:
        await self._handle(call, params, True, receive, send)

    async def _handle(self, call: Call, params: Params, stream_mode: bool, receive: Receive, send: Send) -> None:
        name = check_model_name(params["model"])
        call.model = name
        call.allow_model(name)
        version = parse_version(params["version"]) if "version" in params else None
        target = self._service.resolve(name, version, call.text_header)
        servable = await target.servable()
        if not generates_text(servable):  # a tensor model: its inputs and outputs by name
            document = await read_json(receive, call, self._limit)
            await serve_generate(call, target, servable.specs.inputs, stream_mode, document, self._out, send)
            return
        generator = await target.generator()
        document = await read_json(receive, call, self._limit)
        text, sampling, priority, timeout = generate_params(document)
        stream = generator.submit(
            generator.encode(text), sampling, priority=priority or None, timeout_s=timeout, incremental=stream_mode
        )
        call.version = str(generator.version)
        head = {"model_name": generator.name, "model_version": str(generator.version)}
        if not stream_mode:
            async for _ in stream.events(coalesce=True):
                pass
            reason = FINISH_REASONS.get(stream.finish_reason or FinishReason.STOP, "stop")
            answer = {**head, "text_output": stream.text, "finish_reason": reason}
            await self._out.json(call, send, 200, {**answer, "completion_tokens": len(stream.output_ids)})
            return
        sender = EventSender(call, send)
        try:
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
