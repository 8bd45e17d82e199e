"""OpenAI-compatible routes: ``/v1/completions``, ``/v1/chat/completions`` (SSE with ``stream``),
``/v1/models``; and the dispatcher the app calls for every generation route.

Thin: decode with ``openai_codec``, submit to the model's engine, encode the events. A client that
disconnects cancels its sequences (their slots and cache are freed at the next step).
"""

from __future__ import annotations

from typing import Any

from tensorgate.errors import InvalidInput, MethodNotAllowed, NotFound, TensorgateError
from tensorgate.generation import GenerationStream
from tensorgate.models.service import InferenceService
from tensorgate.protocols.http.body import Receive
from tensorgate.protocols.http.generate_routes import (
    FINISH_REASONS,
    CallLike,
    EventSender,
    Send,
    TextGenerator,
    find_generator,
    generates_text,
    handle_generate,
    merged,
    read_json,
    send_json,
    watching_disconnect,
)
from tensorgate.protocols.http.openai_codec import (
    ChatRequest,
    CompletionRequest,
    completion_logprobs,
    new_id,
    now_s,
    parse,
    usage,
)
from tensorgate.repository.names import check_model_name, parse_version

DEFAULT_COMPLETION_TOKENS = 16


def is_generation_route(parts: list[str]) -> bool:
    """Whether a split path is one of ours (the app calls this first, then :meth:`GenerationRoutes.handle`)."""
    last = parts[-1]  # checked first: most requests end in "infer" or "ready", and leave at once
    if last in ("generate", "generate_stream"):
        return len(parts) in (4, 6) and parts[0] == "v2" and parts[1] == "models"
    return last in ("completions", "models") and parts in (
        ["v1", "completions"],
        ["v1", "chat", "completions"],
        ["v1", "models"],
    )


class GenerationRoutes:
    def __init__(self, service: InferenceService, max_body_bytes: int) -> None:
        self._service = service
        self._limit = max_body_bytes

    async def handle(self, call: CallLike, parts: list[str], receive: Receive, send: Send) -> None:
        if parts == ["v1", "models"]:
            _only(call, "GET")
            await send_json(call, send, 200, self._models(call))
            return
        _only(call, "POST")
        if parts[0] == "v2":
            name = check_model_name(parts[2])
            call.model = name
            call.allow_model(name)
            version = None
            if len(parts) == 6:
                if parts[3] != "versions":
                    raise NotFound(f"no route for {call.path[:200]}")
                version = parse_version(parts[4])
            stream = parts[-1] == "generate_stream"
            await handle_generate(self._service, call, name, version, stream, receive, send, self._limit)
            return
        document = await read_json(receive, call, self._limit)
        if parts[1] == "chat":
            await self._chat(call, document, receive, send)
        else:
            await self._completions(call, document, receive, send)

    def _models(self, call: CallLike) -> dict[str, Any]:
        data = []
        for name, entry in sorted(self._service.manager.models.items()):
            if generates_text(entry.latest_ready()) and call.may_use(name):
                data.append({"id": name, "object": "model", "created": 0, "owned_by": "tensorgate"})
        return {"object": "list", "data": data}

    def _model(self, call: CallLike, name: str) -> TextGenerator:
        check_model_name(name)
        call.model = name
        call.allow_model(name)
        generator = find_generator(self._service, name, None)
        call.version = str(generator.version)
        return generator

    # -- /v1/completions -------------------------------------------------------------------------

    async def _completions(self, call: CallLike, document: dict[str, Any], receive: Receive, send: Send) -> None:
        request = parse(CompletionRequest, document)
        generator = self._model(call, request.model)
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
                async with watching_disconnect(receive, streams):
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
        async with watching_disconnect(receive, streams):
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
        await send_json(call, send, 200, {**head, "choices": choices, "usage": usage(prompt_tokens, completion)})

    # -- /v1/chat/completions --------------------------------------------------------------------

    async def _chat(self, call: CallLike, document: dict[str, Any], receive: Receive, send: Send) -> None:
        request = parse(ChatRequest, document)
        generator = self._model(call, request.model)
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
                async with watching_disconnect(receive, streams):
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
        async with watching_disconnect(receive, streams):
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
        await send_json(call, send, 200, document_out)


def _only(call: CallLike, method: str) -> None:
    if call.method != method:
        raise MethodNotAllowed(f"{call.method} is not allowed on {call.path[:200]}; use {method}")


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
