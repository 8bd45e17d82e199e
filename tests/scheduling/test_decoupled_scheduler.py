"""Decoupled requests through the scheduler: admission, queue bound, priorities, deadlines, batching,
cancellation and failures, with a fake instance whose responses the test sends. Interleavings are
forced with events, never sleeps."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pytest
from fake_instances import FakeInstance
from prometheus_client import CollectorRegistry

from tensorgate.clock import MonotonicClock
from tensorgate.decoupled import ResponseChannel, ResponseStream, StreamEvent
from tensorgate.errors import DeadlineExceeded, InternalError, QueueFull, TensorgateError, Unavailable
from tensorgate.instances.base import InstanceDied, ModelFailed
from tensorgate.instances.pool import InstancePool
from tensorgate.observability.metrics import Metrics
from tensorgate.scheduling.batch_policy import BatchSettings
from tensorgate.scheduling.scheduler import QueueSettings, Scheduler
from tensorgate.types import Array, InferRequest


class StreamingInstance(FakeInstance):
    """A decoupled model's instance: a batch's execute returns when the test opens the gate (or
    fails as told); the test sends each request's responses through the channels it records."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.decoupled = True
        self.gate = asyncio.Event()
        self.gate.set()
        self.batches: list[list[ResponseChannel]] = []
        self.values: list[list[float]] = []
        self.failure: BaseException | None = None

    async def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        return await self.first_response(inputs)

    async def _execute_decoupled(
        self, parts: Sequence[Mapping[str, Array]], channels: Sequence[ResponseChannel]
    ) -> dict[str, Array]:
        self.batches.append(list(channels))
        self.values.append([float(part["x"][0, 0]) for part in parts])
        await self.gate.wait()
        if self.failure is not None:
            if isinstance(self.failure, InstanceDied):
                self.alive = False
            raise self.failure
        return {}


class Setup:
    def __init__(
        self, *instances: StreamingInstance, batching: bool = True, queue: QueueSettings | None = None
    ) -> None:
        self.registry = CollectorRegistry()
        metrics = Metrics(self.registry, process=False).for_version("m", 1)
        self.scheduler = Scheduler(
            "m",
            1,
            InstancePool(instances),
            BatchSettings(8, batching, 0.0),
            queue or QueueSettings(),
            MonotonicClock(),
            metrics,
        )

    def stream(self, value: float, **kwargs: object) -> ResponseStream:
        request = InferRequest(model="m", inputs={"x": np.full((1, 2), value, np.float32)}, **kwargs)  # type: ignore[arg-type]
        channel = ResponseChannel()
        return ResponseStream(channel, self.scheduler.submit(request, 1, ((2,),), channel=channel), "m", 1)

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, {"model": "m", "version": "1", **labels}) or 0.0


def response(value: float, final: bool = False) -> StreamEvent:
    return StreamEvent({"x": np.full((1, 2), value, np.float32)}, None, final)


async def until(condition: Callable[[], bool], turns: int = 10_000) -> None:
    """Let the loop turn until ``condition`` holds; bounded, so a failing test fails, never hangs."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


async def collect(stream: ResponseStream) -> list[StreamEvent]:
    return [event async for event in stream]


async def test_responses_arrive_in_order_and_the_instance_is_free_when_execute_returns() -> None:
    instance = StreamingInstance("a")
    setup = Setup(instance)
    first = setup.stream(1.0)
    await until(lambda: len(instance.batches) == 1)
    channel = instance.batches[0][0]
    channel.push(response(1.0))
    # Its execute returned: the one instance takes the next request while the first still streams.
    second = setup.stream(2.0)
    await until(lambda: len(instance.batches) == 2)
    channel.push(response(2.0))
    channel.push(StreamEvent(None, None, True))
    events = await asyncio.wait_for(collect(first), 5.0)
    assert [e.outputs["x"][0, 0] for e in events if e.outputs is not None] == [1.0, 2.0]
    assert events[-1].final and events[-1].outputs is None
    instance.batches[1][0].push(response(9.0, final=True))
    assert [e.final for e in await asyncio.wait_for(collect(second), 5.0)] == [True]
    await until(lambda: setup.metric("tensorgate_requests_total", outcome="success") == 2)
    assert setup.metric("tensorgate_responses_per_request_sum") == 3
    assert setup.metric("tensorgate_responses_per_request_count") == 2


async def test_each_request_of_a_batch_has_a_channel_of_its_own() -> None:
    instance = StreamingInstance("a")
    instance.gate.clear()
    setup = Setup(instance)
    streams = [setup.stream(0.0)]
    await until(lambda: len(instance.batches) == 1)
    streams += [setup.stream(float(v)) for v in (1, 2, 3)]
    await until(lambda: setup.scheduler.queued == 3)
    instance.gate.set()
    await until(lambda: len(instance.batches) == 2)
    assert instance.values == [[0.0], [1.0, 2.0, 3.0]]
    for channels in instance.batches:
        for channel in channels:
            channel.push(response(float(id(channel) % 97), final=True))
    for stream, channel in zip(streams, [c for channels in instance.batches for c in channels], strict=True):
        (event,) = await asyncio.wait_for(collect(stream), 5.0)
        assert event.outputs is not None and event.outputs["x"][0, 0] == float(id(channel) % 97)


async def test_a_full_queue_refuses_at_once() -> None:
    instance = StreamingInstance("a")
    instance.gate.clear()
    setup = Setup(instance, queue=QueueSettings(max_queue_size=1))
    setup.stream(0.0)
    await until(lambda: len(instance.batches) == 1)
    setup.stream(1.0)
    await until(lambda: setup.scheduler.queued == 1)
    (event,) = await asyncio.wait_for(collect(setup.stream(2.0)), 5.0)
    assert isinstance(event.error, QueueFull) and event.final


async def test_a_higher_priority_request_runs_first() -> None:
    instance = StreamingInstance("a")
    instance.gate.clear()
    setup = Setup(instance, batching=False, queue=QueueSettings(priority_levels=2))
    setup.stream(0.0)
    await until(lambda: len(instance.batches) == 1)
    setup.stream(1.0, priority=2)
    setup.stream(2.0, priority=1)
    await until(lambda: setup.scheduler.queued == 2)
    instance.gate.set()
    await until(lambda: len(instance.batches) == 3)
    assert instance.values == [[0.0], [2.0], [1.0]]


async def test_a_deadline_ends_a_queued_request_and_a_streaming_one() -> None:
    instance = StreamingInstance("a")
    instance.gate.clear()
    setup = Setup(instance, batching=False)
    running = setup.stream(0.0, timeout_s=0.05)
    await until(lambda: len(instance.batches) == 1)
    queued = setup.stream(1.0, timeout_s=0.05)
    (event,) = await asyncio.wait_for(collect(queued), 5.0)
    assert isinstance(event.error, DeadlineExceeded) and len(instance.batches) == 1  # never reached the model
    instance.gate.set()
    channel = instance.batches[0][0]
    channel.push(response(1.0))
    events = await asyncio.wait_for(collect(running), 5.0)
    assert isinstance(events[-1].error, DeadlineExceeded) and events[-1].final
    assert channel.cancelled  # the model is told through is_cancelled()
    assert setup.metric("tensorgate_stream_cancellations_total") == 1
    assert setup.metric("tensorgate_requests_total", outcome="timeout") == 2


async def test_a_client_that_leaves_takes_its_request_out_of_the_queue_or_the_model() -> None:
    instance = StreamingInstance("a")
    instance.gate.clear()
    setup = Setup(instance, batching=False)
    running = setup.stream(0.0)
    await until(lambda: len(instance.batches) == 1)
    queued = setup.stream(1.0)
    await until(lambda: setup.scheduler.queued == 1)
    queued.cancel()
    await until(lambda: setup.scheduler.queued == 0)
    instance.gate.set()
    channel = instance.batches[0][0]
    channel.push(response(1.0))
    running.cancel()
    assert channel.cancelled
    channel.push(response(2.0))  # the model goes on until it looks: dropped
    assert await asyncio.wait_for(collect(running), 5.0) == []
    await until(lambda: setup.metric("tensorgate_requests_total", outcome="cancelled") == 2)
    assert setup.metric("tensorgate_stream_cancellations_total") == 1  # the queued one never reached it
    # Nothing is left holding the instance: the next request runs.
    after = setup.stream(3.0)
    await until(lambda: len(instance.batches) == 2)
    instance.batches[1][0].push(response(3.0, final=True))
    assert len(await asyncio.wait_for(collect(after), 5.0)) == 1


async def test_an_instance_that_dies_before_a_response_is_retried_after_one_it_is_not() -> None:
    dying, also_dying, spare = StreamingInstance("a"), StreamingInstance("b"), StreamingInstance("c")
    spare.alive = False  # joins once the others are gone: the retry runs there
    for instance in (dying, also_dying):
        instance.gate.clear()
    setup = Setup(dying, also_dying, spare, batching=False)
    streamed, silent = setup.stream(0.0), setup.stream(1.0)
    await until(lambda: len(dying.batches) == 1 and len(also_dying.batches) == 1)
    streamed_on = dying if dying.values[0] == [0.0] else also_dying
    streamed_on.batches[0][0].push(response(0.0))
    for instance in (dying, also_dying):
        instance.failure = InstanceDied("killed by the test")
        instance.gate.set()
    events = await asyncio.wait_for(collect(streamed), 5.0)
    assert events[0].outputs is not None  # it streamed: running it again would repeat that response
    assert isinstance(events[-1].error, InternalError) and "instance died" in events[-1].error.message
    spare.alive = True
    setup.scheduler.poke()
    await until(lambda: len(spare.batches) == 1)
    assert spare.values == [[1.0]]
    spare.batches[0][0].push(response(1.0, final=True))
    assert len(await asyncio.wait_for(collect(silent), 5.0)) == 1


async def test_a_model_that_raises_ends_every_request_of_its_batch_not_yet_ended() -> None:
    instance = StreamingInstance("a")
    instance.gate.clear()
    setup = Setup(instance)
    streams = [setup.stream(0.0)]
    await until(lambda: len(instance.batches) == 1)
    instance.batches[0][0].push(response(0.0, final=True))
    streams += [setup.stream(1.0), setup.stream(2.0)]
    await until(lambda: setup.scheduler.queued == 2)
    instance.failure = ModelFailed("ModelError: no", "no")
    instance.gate.set()
    await until(lambda: len(instance.batches) == 2)
    instance.batches[1][0].push(response(1.0, final=True))  # ended before the execute raised
    _, done, failed = [await asyncio.wait_for(collect(s), 5.0) for s in streams]
    assert len(done) == 1 and done[0].error is None
    assert isinstance(failed[-1].error, InternalError)
    assert failed[-1].error.message == "model 'm' failed to execute the request: no"
    assert not instance.batches[1][1].cancelled  # a failed model is not "told": it failed


async def test_closing_ends_the_streams_left_open() -> None:
    instance = StreamingInstance("a")
    setup = Setup(instance)
    stream = setup.stream(0.0)
    await until(lambda: len(instance.batches) == 1)
    await setup.scheduler.drain(0.01)
    await setup.scheduler.aclose(timeout_s=1.0)
    (event,) = await asyncio.wait_for(collect(stream), 5.0)
    assert isinstance(event.error, Unavailable) and event.final


@pytest.mark.parametrize("events", [[], [response(1.0)], [response(1.0), response(2.0)]])
async def test_a_channel_ends_once_and_drops_what_comes_after(events: list[StreamEvent]) -> None:
    channel = ResponseChannel()
    ended: list[TensorgateError | None] = []
    channel.on_end(ended.append)
    for event in events:
        channel.push(event)
    channel.push(StreamEvent(None, None, True))
    channel.push(response(3.0))
    channel.fail(InternalError("late"))
    assert ended == [None] and channel.responses == len(events) and not channel.cancelled
    read = []
    while (event := await channel.next()) is not None:
        read.append(event)
    assert read == [*events, StreamEvent(None, None, True)]


async def test_a_client_that_stops_reading_is_cancelled_not_buffered_without_end() -> None:
    channel = ResponseChannel(max_waiting=3)
    for value in range(5):
        channel.push(response(float(value)))
    assert channel.ended and channel.cancelled
    events = [event async for event in _drain(channel)]
    assert len(events) == 4 and events[-1].final and "waited for the client" in str(events[-1].error)


async def _drain(channel: ResponseChannel):  # type: ignore[no-untyped-def]
    while (event := await channel.next()) is not None:
        yield event
