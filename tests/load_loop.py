"""Steady load from concurrent HTTP clients, every answer recorded: for tests that change a server
under traffic (hot swaps, unloads, traffic splits) and then check what each client saw."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass(frozen=True, slots=True)
class Answer:
    client: int
    sent: float  # time.time(), to compare with the server's log timestamps
    received: float
    status: int
    version: str  # the answer's model_version ("" for an error)
    computed_by: float | None  # the first element of OUTPUT: VERSION_MODEL writes its version there
    body: str = ""


@dataclass
class Load:
    """``clients`` tasks, each sending its next request when the last one is answered."""

    url: str
    clients: int = 16
    body: dict[str, Any] = field(default_factory=dict)
    headers: Callable[[int, int], dict[str, str]] | None = None  # (client, n) -> headers
    timeout_s: float = 30.0  # each request's, at the client: one that runs out is a failure (status 0)
    answers: list[Answer] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def __aenter__(self) -> Load:
        self._client = httpx.AsyncClient(timeout=self.timeout_s, limits=httpx.Limits(max_connections=self.clients))
        self._tasks = [asyncio.create_task(self._run(i)) for i in range(self.clients)]
        return self

    async def _run(self, client: int) -> None:
        n = 0
        while not self._stop.is_set():
            headers = self.headers(client, n) if self.headers is not None else None
            sent = time.time()
            try:
                response = await self._client.post(self.url, json=self.body, headers=headers)
            except httpx.TransportError as exc:
                self.answers.append(Answer(client, sent, time.time(), 0, "", None, repr(exc)))
                continue
            received = time.time()
            version, computed = "", None
            if response.status_code == 200:
                document = response.json()
                version = document["model_version"]
                outputs = document["outputs"]
                data = outputs[0]["data"] if outputs else []
                computed = float(data[0]) if data and isinstance(data[0], int | float) else None
            self.answers.append(
                Answer(client, sent, received, response.status_code, version, computed, response.text[:300])
            )
            n += 1

    async def until(self, predicate: Callable[[list[Answer]], bool], timeout_s: float = 60.0) -> None:
        """Keep the load on until ``predicate(answers so far)`` holds (fails after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while not predicate(self.answers):
            if time.monotonic() > deadline:
                raise TimeoutError(f"condition not reached under load ({len(self.answers)} answers)")
            await asyncio.sleep(0.02)

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._client.aclose()

    def failures(self) -> list[Answer]:
        return [a for a in self.answers if a.status != 200]
