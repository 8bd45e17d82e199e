"""A request waiting in a scheduler, as the pure policies see it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from tensorgate.types import InferRequest, InferResponse


@dataclass(slots=True, eq=False)
class Pending:
    """One admitted request. ``eq=False``: identity, not value, decides membership in a queue."""

    request: InferRequest
    rows: int  # rows on the batch axis this request contributes (1 for an unbatched model)
    shape_key: tuple[tuple[int, ...], ...]  # non-batch dimensions; only equal keys share a batch
    priority: int  # 1 is highest
    arrival: float
    deadline: float | None
    future: asyncio.Future[InferResponse] | None = field(default=None, repr=False)
    attempts: int = 0
    failed_on: Any = None  # the instance a failed attempt ran on: its retry goes elsewhere when it can
    dispatched_at: float | None = None
    # The model raised on this request's first attempt (a Fault shared by that batch's requests): if
    # another instance then answers it, the failure was the first instance's, not the input's.
    fault: Any = None
    # Its place in a fair queue: the virtual time its tenant's turn starts (queue_order.FairLevel).
    tag: float = 0.0

    def __init__(
        self,
        request: InferRequest,
        rows: int,
        shape_key: tuple[tuple[int, ...], ...],
        priority: int,
        arrival: float,
        deadline: float | None,
        future: asyncio.Future[InferResponse] | None = None,
        attempts: int = 0,
        failed_on: Any = None,
        dispatched_at: float | None = None,
    ) -> None:
        # Written out: a generated dataclass __init__ stays interpreted under mypyc (see types.py).
        self.request = request
        self.rows = rows
        self.shape_key = shape_key
        self.priority = priority
        self.arrival = arrival
        self.deadline = deadline
        self.future = future
        self.attempts = attempts
        self.failed_on = failed_on
        self.dispatched_at = dispatched_at
        self.fault = None
        self.tag = 0.0


class Fault:
    """One batch that raised on an instance, shared by its requests while they are retried elsewhere."""

    __slots__ = ("counted", "instance", "message")

    def __init__(self, instance: Any, message: str) -> None:
        self.instance = instance
        self.message = message
        self.counted = False
