"""A request waiting in a scheduler, as the pure policies see it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from tensorgate.decoupled import ResponseChannel
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
    # Each batch that raised with this request in it (a Fault shared by that batch's requests): when
    # all of them are answered elsewhere, the failure was that instance's, not the inputs'.
    faults: list[Any] | None = None
    failed_alone: Any = None  # an instance it raised on in a batch of its own: proof against the input
    # Poison isolation: the request runs only with the others of its part of a batch that failed
    # (its shape key carries the part's number); the key it came with is kept here.
    own_key: tuple[tuple[int, ...], ...] | None = None
    # The suspect batch (scheduler.RunningBatch) this request was hedged from: a copy of it waits
    # or runs elsewhere, and the first answer wins.
    hedge_of: Any = None
    bound: Any = None  # the instance its sequence is bound to (a direct sequence batcher), if any
    # Its place in a fair queue: the virtual time its tenant's turn starts (queue_order.FairLevel).
    tag: float = 0.0
    # A decoupled model's request: where its responses go. It ends when the channel does, which may
    # be after its batch ended (the model sends from a thread of its own).
    channel: ResponseChannel | None = None

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
        self.faults = None
        self.failed_alone = None
        self.own_key = None
        self.hedge_of = None
        self.bound = None
        self.tag = 0.0
        self.channel = None


class Fault:
    """One batch that raised on an instance, shared by its requests while they run elsewhere (whole,
    or split to find the ones the model refuses). The instance is at fault only when every one of
    them is then answered: a batch that held a request the model refuses anywhere was not its fault.
    """

    __slots__ = ("answered", "instance", "message", "remaining", "size")

    def __init__(self, instance: Any, message: str, size: int) -> None:
        self.instance = instance
        self.message = message
        self.size = size
        self.remaining = size  # its requests not ended yet
        self.answered = 0  # of those ended, the ones answered

    def ended(self, answered: bool) -> bool:
        """One of its requests ended; True when it was the last, and every one was answered."""
        self.remaining -= 1
        self.answered += answered
        return self.remaining == 0 and self.answered == self.size
