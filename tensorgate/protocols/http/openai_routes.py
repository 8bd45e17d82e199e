"""OpenAI-compatible routes: ``/v1/completions``, ``/v1/chat/completions`` (SSE with ``stream``),
``/v1/models``.

Thin: decode with ``openai_codec``, submit to the model's engine, encode the events. A client that
disconnects cancels its sequences (their slots and cache are freed at the next step).
"""

from __future__ import annotations

from typing import Any

from tensorgate.errors import InvalidInput, TensorgateError
from tensorgate.generation import GenerationStream
from tensorgate.models.servable import TextGenerator
from tensorgate.models.service import InferenceService
from tensorgate.names import check_model_name
from tensorgate.protocols.http.body import Receive
from tensorgate.protocols.http.exchange import Call, Responder, Send
from tensorgate.protocols.http.openai_codec import (
    ChatRequest,
    CompletionRequest,
    completion_logprobs,
    new_id,
    now_s,
    parse,
    usage,
)
from tensorgate.protocols.http.routes import Params, RouteTable
from tensorgate.protocols.http.streaming import FINISH_REASONS, EventSender, merged, read_json

DEFAULT_COMPLETION_TOKENS = 16


class OpenAIRoutes:
    def __init__(self, service: InferenceService, responder: Responder, max_body_bytes: int) -> None:
        self._service = service
        self._out = responder
        self._limit = max_body_bytes

    def register(self, routes: RouteTable) -> None:
        routes.add("GET", "/v1/models", self.models)
        routes.add("POST", "/v1/completions", self.completions)
        routes.add("POST", "/v1/chat/completions", self.chat)

    async def models(self, call: Call, params: Params, receive: Receive, send: Send) -> None:
        await self._out.json(call, send, 200, self._models(call))

    async def completions(self, call: Call, params: Params, receive: Receive, send: Send) -> None:
        await self._completions(call, await read_json(receive, call, self._limit), send)

    async def chat(self, call: Call, params: Params, receive: Receive, send: Send) -> None:
        await self._chat(call, await read_json(receive, call, self._limit), send)

    def _models(self, call: Call) -> dict[str, Any]:
        data = []
        for model in self._service.models():
            if model.generates_text and call.may_use(model.name):
                data.append({"id": model.name, "object": "model", "created": 0, "owned_by": "tensorgate"})
        return {"object": "list", "data": data}

    async def _model(self, call: Call, name: str) -> TextGenerator:
        check_model_name(name)
        call.model = name
        call.allow_model(name)
        generator = await self._service.resolve(name, None, call.text_header).generator()
        call.version = str(generator.version)
        return generator

    # -- /v1/completions -------------------------------------------------------------------------

    async def _completions(self, call: Call, document: dict[str, Any], send: Send) -> None:
        request = parse(CompletionRequest, document)
        generator = await self._model(call, request.model)
        prompts = _prompts(generator, request.prompt)
        max_tokens = request.max_tokens or DEFAULT_COMPLETION_TOKENS
        streams: list[GenerationStream] = []
        try:
            for prompt in prompts:
                for i in range(request.n):
                    params = request.sampling(max_tokens, request.logprobs, i)
                    streams.append(
                        generator.submit(prompt, params, priority=request.priority or None, incremental=request.stream)
                    )
        except TensorgateError:
            for stream in streams:
                stream.cancel()
            raise
        rid, created = new_id("cmpl"), now_s()
        head = {"id": rid, "object": "text_completion", "created": created, "model": request.model}
        prompt_tokens = sum(len(p) for p in prompts)
        logs: list[dict[str, list[Any]]] = [{"tokens": [], "lp": [], "top": [], "off": []} for _ in streams]
        if request.stream:
            sender = EventSender(call, send)
            try:
                async for index, event in merged(streams, coalesce=request.logprobs is None):
                    choice: dict[str, Any] = {"index": index, "text": event.text, "logprobs": None}
                    if request.logprobs is not None and event.token_id is not None:
                        one = _log_entry(generator, event.token_id, event.logprob, event.top, 0)
                        choice["logprobs"] = completion_logprobs(*one)
                    choice["finish_reason"] = (
                        FINISH_REASONS[event.finish_reason] if event.finish_reason is not None else None
                    )
                    await sender.event({**head, "choices": [choice]})
                if request.include_usage:
                    completion = sum(len(s.output_ids) for s in streams)
                    await sender.event({**head, "choices": [], "usage": usage(prompt_tokens, completion)})
                await sender.event(b"[DONE]")
            except TensorgateError as exc:
                if not sender.started:
                    raise
                await sender.event({"error": {"message": exc.message, "type": exc.code.value}})
            await sender.close()
            return
        async for index, event in merged(streams, coalesce=request.logprobs is None):
            if request.logprobs is not None and event.token_id is not None:
                log = logs[index]
                tokens, lps, tops, offs = _log_entry(
                    generator, event.token_id, event.logprob, event.top, sum(len(t) for t in log["tokens"])
                )
                log["tokens"] += tokens
                log["lp"] += lps
                log["top"] += tops
                log["off"] += offs
        choices = []
        for index, stream in enumerate(streams):
            log = logs[index]
            choices.append(
                {
                    "index": index,
                    "text": stream.text,
                    "logprobs": None
                    if request.logprobs is None
                    else completion_logprobs(log["tokens"], log["lp"], log["top"], log["off"]),
                    "finish_reason": FINISH_REASONS.get(stream.finish_reason, "stop")
                    if stream.finish_reason
                    else "stop",
                }
            )
        completion = sum(len(s.output_ids) for s in streams)
        await self._out.json(call, send, 200, {**head, "choices": choices, "usage": usage(prompt_tokens, completion)})

    # -- /v1/chat/completions --------------------------------------------------------------------

    async def _chat(self, call: Call, document: dict[str, Any], send: Send) -> None:
        request = parse(ChatRequest, document)
        generator = await self._model(call, request.model)
        prompt = generator.chat_prompt([{"role": m.role, "content": m.text()} for m in request.messages])
        max_tokens = (
            request.max_completion_tokens or request.max_tokens or max(1, generator.max_model_len - len(prompt))
        )
        top = request.top_logprobs if request.logprobs else None
        streams: list[GenerationStream] = []
        try:
            for i in range(request.n):
                params = request.sampling(max_tokens, top if request.logprobs else None, i)
                streams.append(
                    generator.submit(prompt, params, priority=request.priority or None, incremental=request.stream)
                )
        except TensorgateError:
            for stream in streams:
                stream.cancel()
            raise
        rid, created = new_id("chatcmpl"), now_s()
        if request.stream:
            head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": request.model}
            sender = EventSender(call, send)
            try:
                for index in range(len(streams)):
                    first = {"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                    await sender.event({**head, "choices": [first]})
                async for index, event in merged(streams, coalesce=not request.logprobs):
                    delta = {"content": event.text} if event.text or event.finish_reason is None else {}
                    reason = FINISH_REASONS[event.finish_reason] if event.finish_reason is not None else None
                    choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}
                    await sender.event({**head, "choices": [choice]})
                if request.include_usage:
                    completion = sum(len(s.output_ids) for s in streams)
                    await sender.event({**head, "choices": [], "usage": usage(len(prompt), completion)})
                await sender.event(b"[DONE]")
            except TensorgateError as exc:
                if not sender.started:
                    raise
                await sender.event({"error": {"message": exc.message, "type": exc.code.value}})
            await sender.close()
            return
        contents: list[list[dict[str, Any]]] = [[] for _ in streams]
        async for index, event in merged(streams, coalesce=not request.logprobs):
            if request.logprobs and event.token_id is not None:
                token = generator.token_text(event.token_id)
                contents[index].append(
                    {
                        "token": token,
                        "logprob": event.logprob,
                        "bytes": list(token.encode()),
                        "top_logprobs": [
                            {"token": generator.token_text(t), "logprob": lp, "bytes": None} for t, lp in event.top
                        ],
                    }
                )
        choices = [
            {
                "index": index,
                "message": {"role": "assistant", "content": stream.text},
                "logprobs": {"content": contents[index]} if request.logprobs else None,
                "finish_reason": FINISH_REASONS.get(stream.finish_reason, "stop") if stream.finish_reason else "stop",
            }
            for index, stream in enumerate(streams)
        ]
        completion = sum(len(s.output_ids) for s in streams)
        document_out = {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": request.model,
            "choices": choices,
            "usage": usage(len(prompt), completion),
        }
        await self._out.json(call, send, 200, document_out)


def _prompts(generator: TextGenerator, prompt: str | list[str] | list[int] | list[list[int]]) -> list[list[int]]:
    if isinstance(prompt, str):
        return [generator.encode(prompt)]
    if not prompt:
        raise InvalidInput("the prompt is empty")
    if all(isinstance(p, str) for p in prompt):
        return [generator.encode(str(p)) for p in prompt]
    if all(isinstance(p, int) for p in prompt):
        return [[int(p) for p in prompt]]  # type: ignore[arg-type]
    return [list(p) for p in prompt if isinstance(p, list)]


def _log_entry(
    generator: TextGenerator, token_id: int, logprob: float, top: tuple[tuple[int, float], ...], offset: int
) -> tuple[list[str], list[float], list[dict[str, float]], list[int]]:
    token = generator.token_text(token_id)
    return [token], [logprob], [{generator.token_text(t): lp for t, lp in top}], [offset]
