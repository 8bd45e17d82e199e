"""Batch formation: which queued requests to dispatch now, or when to look again.

Pure: takes the queue, ``now`` and how many instances are idle or busy; returns a decision.

Unlike Triton, MLServer or LitServe, a request that finds the whole pool idle is dispatched at
once: holding it for the delay window would only add latency, because nothing else is running
whose completion could bring more requests to share its batch. Batches form from what accumulates
while instances are busy, and the delay window applies only while at least one instance is busy,
and only while holding a batch open pays on this model (``batch_cost``).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from tensorgate.scheduling.pending import Pending
from tensorgate.scheduling.request_queue import RequestQueue


class ReleaseReason(enum.Enum):
    FULL = "full"  # max rows reached, or the next request's rows would pass it
    SHAPE = "shape"  # the next request's non-batch shape differs, so nothing behind it can join
    PREFERRED = "preferred"  # the queued requests make a preferred batch size
    DELAY = "delay"  # the oldest request has waited max_queue_delay
    DEADLINE = "deadline"  # a member's deadline falls inside the delay window
    IDLE = "idle"  # every instance is idle: waiting cannot bring more work to batch with
    SINGLE = "single"  # the model does not batch requests together
    # Measured: the batch already has more rows than arrive during one fixed per-call cost, so
    # waiting would only idle an instance.
    NO_GAIN = "no_gain"


@dataclass(frozen=True, slots=True)
class BatchSettings:
    max_rows: int  # rows per execution; 0 means the model has no batch axis
    batching: bool  # may several requests share one execution?
    max_queue_delay_s: float
    preferred_rows: tuple[int, ...] = ()
    adaptive_delay: bool = True  # skip the window while the model's batch costs show it cannot pay


@dataclass(frozen=True, slots=True)
class Decision:
    batch: list[Pending] | None
    reason: ReleaseReason | None = None
    wake_at: float | None = None  # when to decide again if nothing else happens first

    def __init__(
        self, batch: list[Pending] | None, reason: ReleaseReason | None = None, wake_at: float | None = None
    ) -> None:
        # Written out: a generated dataclass __init__ stays interpreted under mypyc (see types.py).
        object.__setattr__(self, "batch", batch)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "wake_at", wake_at)


def form_batch(queue: RequestQueue, settings: BatchSettings) -> tuple[list[Pending], ReleaseReason | None]:
    """The head of the queue as one batch, and what stops it from growing (None while it still can).

    The queue is FIFO within a level, so a request that cannot join ends the batch: requests behind
    it wait their turn rather than overtake it.
    """
    batch: list[Pending] = []
    rows = 0
    for item in queue.in_order():
        if not batch:
            batch.append(item)
            rows = item.rows
            if not settings.batching:
                return batch, ReleaseReason.SINGLE
            continue
        if item.shape_key != batch[0].shape_key:
            return batch, ReleaseReason.SHAPE
        if rows + item.rows > settings.max_rows:
            return batch, ReleaseReason.FULL
        batch.append(item)
        rows += item.rows
    return batch, ReleaseReason.FULL if rows >= settings.max_rows else None


def preferred_cut(batch: list[Pending], preferred: tuple[int, ...]) -> int:
    """How many of the batch's requests make the largest preferred size they reach exactly; 0 if none.

    As in Triton: once the queued requests make a preferred size, that batch goes at once, cut at the
    largest preferred size the queue can make, rather than waiting for a bigger batch that is not there.
    """
    largest = max(preferred)
    rows = cut = 0
    for index, item in enumerate(batch, start=1):
        rows += item.rows
        if rows > largest:
            break
        if rows in preferred:
            cut = index
    return cut


def decide(
    queue: RequestQueue,
    settings: BatchSettings,
    now: float,
    idle: int,
    busy: int,
    hold_below_rows: float = math.inf,
) -> Decision:
    """``hold_below_rows``: holding an idle instance for company pays only while the batch has fewer
    rows than this (``batch_cost``); ``inf`` always waits out the window, as Triton does."""
    if len(queue) == 0:
        return Decision(None)
    if idle == 0:
        return Decision(None, wake_at=queue.next_deadline)
    batch, stop = form_batch(queue, settings)
    if stop is not None:  # full, single, or blocked by a request of another shape: waiting cannot grow it
        return Decision(batch, stop)
    if busy == 0:
        return Decision(batch, ReleaseReason.IDLE)
    if sum(p.rows for p in batch) >= hold_below_rows:
        return Decision(batch, ReleaseReason.NO_GAIN)
    if settings.preferred_rows and (cut := preferred_cut(batch, settings.preferred_rows)):
        return Decision(batch[:cut], ReleaseReason.PREFERRED)
    window_end = min(p.arrival for p in batch) + settings.max_queue_delay_s
    if now >= window_end:
        return Decision(batch, ReleaseReason.DELAY)
    deadlines = [p.deadline for p in batch if p.deadline is not None]
    if deadlines and min(deadlines) <= window_end:
        return Decision(batch, ReleaseReason.DEADLINE)
    wake_at = window_end if queue.next_deadline is None else min(window_end, queue.next_deadline)
    return Decision(None, wake_at=wake_at)
