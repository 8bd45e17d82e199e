"""OpenAI-compatible ``/v1/completions`` and ``/v1/chat/completions`` with ``stream: true``.

Each server-sent event that carries text counts as one token (servers send one token per event
when streaming; a server that batches several per event makes ITL look longer and TTFT is
unaffected). The clock reading of each such event goes back to the runner, which derives time
to first token, inter-token latency and tokens per second.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from tensorgate.bench.http_client import ConnectionPool, encode_request
from tensorgate.bench.targets.base import Endpoint, Outcome
from tensorgate.bench.targets.sse import SseParser
from tensorgate.clock import Clock

DEFAULT_PROMPT = "Write a short story about a lighthouse keeper."


def completion_body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True}


def chat_body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
    }


def event_text(payload: str, chat: bool) -> str | None:
    """The text an SSE payload carries; None for ``[DONE]`` and events without text.

    Raises ValueError for an event that reports an error, so the call is counted as failed.
    """
    if payload.strip() == "[DONE]":
        return None
    document = orjson.loads(payload)
    if not isinstance(document, dict):
        return None
    if "error" in document:
        raise ValueError("the stream reported an error")
    choices = document.get("choices") or []
    if not choices:
        return None
    choice = choices[0]
    text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
    return text if isinstance(text, str) and text else None


class OpenAiTarget:
    """Streams one completion per call and timestamps each token as its event arrives."""

    def __init__(self, endpoint: Endpoint, bodies: Sequence[Mapping[str, Any]], chat: bool, clock: Clock) -> None:
        if not bodies:
            raise ValueError("no requests to send")
        path = f"{endpoint.prefix}/v1/chat/completions" if chat else f"{endpoint.prefix}/v1/completions"
        headers = [("Content-Type", "application/json"), ("Accept", "text/event-stream")]
        headers += endpoint.request_headers
        self._requests = [
            encode_request("POST", endpoint.authority, path, orjson.dumps({**b, "stream": True}), tuple(headers))
            for b in bodies
        ]
        self._pool = ConnectionPool(endpoint.host, endpoint.port, endpoint.ssl_context("http/1.1"))
        self._chat = chat
        self._clock = clock

    async def call(self, index: int) -> Outcome:
        parser = SseParser()
        outcome = Outcome()
        chat, now = self._chat, self._clock.now

        def on_body(chunk: bytes) -> None:
            if outcome.error is not None:
                return
            for payload in parser.feed(chunk):
                try:
                    text = event_text(payload, chat)
                except ValueError:
                    outcome.error = "stream error"
                    return
                if text is not None:
                    outcome.token_times.append(now())

        response = await self._pool.request(self._requests[index % len(self._requests)], on_body)
        if response.status != 200:
            outcome.error = f"http {response.status}"
        return outcome

    async def aclose(self) -> None:
        await self._pool.aclose()
