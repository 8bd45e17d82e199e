"""Stateful sequences: the correlation ids a model's requests carry, and the table of open sequences.

A sequence model (``sequence_batching`` in its config) serves streams of requests that belong
together: the chunks of one utterance, the steps of one session. Each request names its sequence
with Triton's parameters ``sequence_id`` (an unsigned 64-bit integer or a string), ``sequence_start``
and ``sequence_end``. The table here is the server's memory of the open sequences of one model:
which version each runs on (a hot reload leaves open sequences on the version they began on), the
implicit state each carries between its requests (kept here, not in an instance, so a sequence
outlives the instance that ran its last request), and when each was last heard from (an idle one
is ended and its state freed). One request of a sequence runs at a time, in the order they came:
the next one's state is the last one's output.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tensorgate.clock import Clock
from tensorgate.errors import InvalidInput, Unavailable
from tensorgate.types import Array

log = logging.getLogger(__name__)

SequenceId = int | str
# Ids of sequences ended lately, kept to tell a client why its next request is refused; bounded,
# as every id a client ever sent would otherwise be remembered.
RECENTLY_ENDED = 4096
MAX_UINT64 = 2**64 - 1


@dataclass(frozen=True, slots=True)
class SequenceFlags:
    id: SequenceId
    start: bool
    end: bool


def _flag(model: str, parameters: Mapping[str, Any], name: str) -> bool:
    value = parameters.get(name, False)
    if not isinstance(value, bool):
        raise InvalidInput(f"parameter '{name}' for model '{model}' must be a boolean, not {value!r}")
    return value


def sequence_flags(model: str, parameters: Mapping[str, Any]) -> SequenceFlags:
    """The sequence a request to sequence model ``model`` belongs to, from its parameters."""
    value = parameters.get("sequence_id")
    if isinstance(value, bool) or not isinstance(value, int | str | None):
        raise InvalidInput(f"parameter 'sequence_id' for model '{model}' must be an integer or a string, not {value!r}")
    if isinstance(value, int) and not 0 <= value <= MAX_UINT64:
        raise InvalidInput(f"parameter 'sequence_id' for model '{model}' must be an unsigned 64-bit integer")
    if value is None or value == 0 or value == "":
        raise InvalidInput(f"inference request to model '{model}' must specify a non-zero or non-empty correlation ID")
    return SequenceFlags(value, _flag(model, parameters, "sequence_start"), _flag(model, parameters, "sequence_end"))


class Sequence:
    """One open sequence: where it runs, its state, and the turn its requests take one at a time."""

    __slots__ = ("closed", "id", "instance", "last_seen", "pending", "servable", "state", "turn")

    def __init__(self, sequence_id: SequenceId, servable: Any, now: float) -> None:
        self.id = sequence_id
        self.servable = servable  # the version it began on serves all of it
        self.instance: Any = None  # the instance it is bound to (the direct strategy)
        self.state: dict[str, Array] = {}  # each state input's value for the next request
        self.last_seen = now
        self.pending = 0  # its requests waiting for their turn or running: never idle meanwhile
        self.turn = asyncio.Lock()  # FIFO: its requests run in the order they came
        self.closed = ""  # why it ended ("" while open)


class SequenceTable:
    """The open sequences of one model, across its versions.

    Ends idle sequences on a timer (each version's ``max_sequence_idle_microseconds``), and
    remembers recently ended ids so a late request hears why it is refused.
    """

    def __init__(self, model: str, clock: Clock, on_end: Callable[[Sequence, str], None] | None = None) -> None:
        self.model = model
        self._clock = clock
        self._open: dict[SequenceId, Sequence] = {}
        self._ended: OrderedDict[SequenceId, str] = OrderedDict()
        self._on_end = on_end  # metrics: each sequence's end and why
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._idle_s: Callable[[Sequence], float] = lambda sequence: float("inf")
        self._drained: dict[Any, asyncio.Event] = {}  # a draining version's wait for its last sequence

    def __len__(self) -> int:
        return len(self._open)

    def idle_after(self, idle_s: Callable[[Sequence], float]) -> None:
        """How long each sequence may stay idle (its version's setting)."""
        self._idle_s = idle_s

    def sequences_on(self, servable: Any) -> list[Sequence]:
        return [s for s in self._open.values() if s.servable is servable]

    def running_on(self, servable: Any) -> int:
        return sum(1 for s in self._open.values() if s.servable is servable)

    def get(self, sequence_id: SequenceId) -> Sequence | None:
        return self._open.get(sequence_id)

    def open(self, flags: SequenceFlags, servable: Any, capacity: int) -> Sequence:
        """Begin the sequence a START request names, on ``servable``."""
        if flags.id in self._open:
            raise InvalidInput(
                f"sequence {flags.id} of model '{self.model}' is already in progress: end it (sequence_end) "
                "before starting it again"
            )
        if self.running_on(servable) >= capacity:
            raise Unavailable(
                f"model '{self.model}' has {capacity} sequences in progress, as many as it takes at once; retry later",
                retry_after_s=1.0,
            )
        sequence = Sequence(flags.id, servable, self._clock.now())
        self._open[flags.id] = sequence
        self._ended.pop(flags.id, None)
        self._arm()
        return sequence

    def find(self, flags: SequenceFlags) -> Sequence:
        """The open sequence a request that does not start one continues."""
        sequence = self._open.get(flags.id)
        if sequence is not None:
            return sequence
        why = self._ended.get(flags.id)
        if why is not None:
            raise InvalidInput(
                f"sequence {flags.id} of model '{self.model}' {why}; a request must specify the START flag "
                "(sequence_start) to begin it again"
            )
        raise InvalidInput(
            f"inference request for sequence {flags.id} to model '{self.model}' must specify the START flag on "
            "the first request of the sequence"
        )

    def close(self, sequence: Sequence, reason: str, why: str) -> None:
        """End ``sequence`` (``reason`` for metrics: end, idle, failed, unloaded; ``why`` for a
        late request's error)."""
        if sequence.closed:
            return
        sequence.closed = why
        sequence.state = {}
        if self._open.get(sequence.id) is sequence:
            del self._open[sequence.id]
        self._ended[sequence.id] = why
        self._ended.move_to_end(sequence.id)
        while len(self._ended) > RECENTLY_ENDED:
            self._ended.popitem(last=False)
        if self._on_end is not None:
            self._on_end(sequence, reason)
        event = self._drained.get(sequence.servable)
        if event is not None and self.running_on(sequence.servable) == 0:
            event.set()

    def touch(self, sequence: Sequence) -> None:
        sequence.last_seen = self._clock.now()
        if self._timer is None:  # a timer already set fires no later than this one's new due time
            self._arm()

    async def wait_drained(self, servable: Any, timeout_s: float) -> int:
        """Wait until no open sequence runs on ``servable`` (a retired version); the sequences
        left after ``timeout_s`` are ended. Returns how many were cut short."""
        if self.running_on(servable) == 0:
            return 0
        event = self._drained.setdefault(servable, asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except TimeoutError:
            pass
        finally:
            self._drained.pop(servable, None)
        left = [s for s in self._open.values() if s.servable is servable]
        for sequence in left:
            self.close(sequence, "unloaded", "was ended when the version it ran on was unloaded")
        return len(left)

    # -- idle sequences ------------------------------------------------------------------------

    def _arm(self) -> None:
        due = self._next_due()
        if due is None or (self._timer_at is not None and self._timer_at <= due):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = due
        self._timer = asyncio.get_running_loop().call_later(max(0.0, due - self._clock.now()), self.reap)

    def _next_due(self) -> float | None:
        due = [s.last_seen + self._idle_s(s) for s in self._open.values() if s.pending == 0]
        return min(due) if due else None

    def reap(self) -> None:
        """End the sequences idle past their limit (the timer calls it; so may a test)."""
        self._timer = self._timer_at = None
        now = self._clock.now()
        for sequence in list(self._open.values()):
            idle_s = self._idle_s(sequence)
            if sequence.pending == 0 and now - sequence.last_seen >= idle_s:
                log.info("sequence %s of model %s ended after %.3g s idle", sequence.id, self.model, idle_s)
                self.close(sequence, "idle", f"was ended after {idle_s:g} s idle (max_sequence_idle_microseconds)")
        self._arm()

    def close_all(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = self._timer_at = None
        for sequence in list(self._open.values()):
            self.close(sequence, "unloaded", "was ended when the model was unloaded")
