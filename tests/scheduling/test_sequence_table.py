"""The sequence table and the sequence parameters, on an injected clock: which requests begin,
continue or are refused, and when an idle sequence ends."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tensorgate.clock import ManualClock
from tensorgate.errors import InvalidInput, Unavailable
from tensorgate.scheduling.sequences import MAX_UINT64, Sequence, SequenceFlags, SequenceTable, sequence_flags

V1, V2 = object(), object()  # two versions of the model, as the table sees them (opaque)


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({}, "must specify a non-zero or non-empty correlation ID"),
        ({"sequence_id": 0}, "must specify a non-zero or non-empty correlation ID"),
        ({"sequence_id": ""}, "must specify a non-zero or non-empty correlation ID"),
        ({"sequence_id": True}, "must be an integer or a string"),
        ({"sequence_id": 1.5}, "must be an integer or a string"),
        ({"sequence_id": [1]}, "must be an integer or a string"),
        ({"sequence_id": -1}, "unsigned 64-bit integer"),
        ({"sequence_id": MAX_UINT64 + 1}, "unsigned 64-bit integer"),
        ({"sequence_id": 1, "sequence_start": "yes"}, "'sequence_start' for model 'm' must be a boolean"),
        ({"sequence_id": 1, "sequence_end": 1}, "'sequence_end' for model 'm' must be a boolean"),
    ],
)
def test_bad_sequence_parameters_are_refused_naming_what_is_wrong(parameters: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        sequence_flags("m", parameters)


@pytest.mark.parametrize("sequence_id", [1, MAX_UINT64, "utterance-7", "0"])
def test_integer_and_string_ids_are_read_with_their_flags(sequence_id: int | str) -> None:
    flags = sequence_flags("m", {"sequence_id": sequence_id, "sequence_start": True})
    assert flags == SequenceFlags(sequence_id, True, False)


def _table(clock: ManualClock, idle_s: float = 1.0) -> tuple[SequenceTable, list[tuple[Any, str]]]:
    ended: list[tuple[Any, str]] = []
    table = SequenceTable("m", clock, lambda sequence, reason: ended.append((sequence.id, reason)))
    table.idle_after(lambda sequence: idle_s)
    return table, ended


async def test_a_sequence_begins_continues_and_ends() -> None:
    table, ended = _table(ManualClock())
    opened = table.open(SequenceFlags(7, True, False), V1, capacity=4)
    assert table.find(SequenceFlags(7, False, False)) is opened and opened.servable is V1
    table.close(opened, "end", "has ended (its last request carried sequence_end)")
    assert ended == [(7, "end")] and len(table) == 0
    with pytest.raises(InvalidInput, match="sequence 7 of model 'm' has ended"):
        table.find(SequenceFlags(7, False, False))
    assert table.open(SequenceFlags(7, True, False), V2, capacity=4).servable is V2  # the id may begin again


async def test_unknown_ids_a_second_start_and_a_full_table_are_refused() -> None:
    table, _ = _table(ManualClock())
    with pytest.raises(InvalidInput, match="sequence 9 to model 'm' must specify the START flag"):
        table.find(SequenceFlags(9, False, False))
    table.open(SequenceFlags("a", True, False), V1, capacity=2)
    with pytest.raises(InvalidInput, match="sequence a of model 'm' is already in progress"):
        table.open(SequenceFlags("a", True, False), V1, capacity=2)
    table.open(SequenceFlags("b", True, False), V1, capacity=2)
    with pytest.raises(Unavailable, match="has 2 sequences in progress"):
        table.open(SequenceFlags("c", True, False), V1, capacity=2)
    table.open(SequenceFlags("c", True, False), V2, capacity=2)  # each version counts its own


async def test_an_idle_sequence_ends_and_its_id_says_why() -> None:
    clock = ManualClock()
    table, ended = _table(clock, idle_s=0.5)
    busy = table.open(SequenceFlags(1, True, False), V1, capacity=8)
    idle = table.open(SequenceFlags(2, True, False), V1, capacity=8)
    busy.pending = 1  # a request of it waits or runs: never idle meanwhile
    idle.state = {"h": object()}  # type: ignore[dict-item]
    clock.advance(0.4)
    table.reap()
    assert len(table) == 2
    clock.advance(0.2)
    table.reap()
    assert ended == [(2, "idle")] and idle.state == {} and table.get(1) is busy
    with pytest.raises(InvalidInput, match=r"sequence 2 of model 'm' was ended after 0.5 s idle"):
        table.find(SequenceFlags(2, False, False))
    table.close_all()


async def test_the_timer_ends_idle_sequences_on_its_own() -> None:
    table, ended = _table(ManualClock(), idle_s=0.0)
    done = asyncio.Event()
    table._on_end = lambda sequence, reason: (ended.append((sequence.id, reason)), done.set())  # type: ignore[assignment]
    table.open(SequenceFlags(3, True, False), V1, capacity=8)
    await asyncio.wait_for(done.wait(), 5)
    assert ended == [(3, "idle")]


async def test_a_retired_version_waits_for_its_open_sequences_then_cuts_the_rest() -> None:
    table, ended = _table(ManualClock(), idle_s=3600)
    finishing = table.open(SequenceFlags(1, True, False), V1, capacity=8)
    table.open(SequenceFlags(2, True, False), V2, capacity=8)
    waiting = asyncio.ensure_future(table.wait_drained(V1, timeout_s=5))
    await asyncio.sleep(0)
    assert not waiting.done()
    table.close(finishing, "end", "has ended")
    assert await asyncio.wait_for(waiting, 5) == 0
    lingering = table.open(SequenceFlags(3, True, False), V1, capacity=8)
    assert await table.wait_drained(V1, timeout_s=0.01) == 1
    assert lingering.closed and (3, "unloaded") in ended and table.get(2) is not None


def test_sequence_turns_are_first_come_first_served() -> None:
    async def run() -> list[int]:
        sequence = Sequence(1, V1, 0.0)
        order: list[int] = []

        async def request(n: int) -> None:
            async with sequence.turn:
                order.append(n)
                await asyncio.sleep(0)

        await asyncio.gather(*(request(n) for n in range(20)))
        return order

    assert asyncio.run(run()) == list(range(20))
