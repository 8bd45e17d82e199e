"""The scheduler of one model version: admission, priorities, deadlines, dynamic batching.

A thin driver around the pure policies in ``request_queue`` and ``batch_policy``. It has no loop
task of its own: :meth:`_pump` runs when a request arrives, when a batch finishes and when a
timer set for the policy's ``wake_at`` fires, so a lone request on an idle pool is dispatched in
the same event-loop turn that admitted it.

Guarantee: every admitted request ends exactly once, with a response or a typed error
(queue full, deadline exceeded, cancelled, model failure, instance failure after one retry).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from tensorgate.clock import Clock
from tensorgate.errors import (
    DEADLINE_CANCEL,
    DeadlineExceeded,
    InternalError,
    InvalidInput,
    QueueFull,
    TensorgateError,
    Unavailable,
    WouldMissDeadline,
)
from tensorgate.instances.base import Instance, InstanceDied, ModelFailed
from tensorgate.instances.batch_tensors import split_outputs
from tensorgate.instances.health import HealthMonitor
from tensorgate.instances.pool import InstancePool
from tensorgate.observability.metrics import VersionMetrics
from tensorgate.observability.trace_context import sampled
from tensorgate.observability.tracing import NOOP_BATCH, NOOP_TRACER, BatchSpan, Tracer
from tensorgate.scheduling.batch_cost import BatchCost
from tensorgate.scheduling.batch_policy import BatchSettings, ReleaseReason, decide
from tensorgate.scheduling.deadline_admission import completion_estimate
from tensorgate.scheduling.pace import Pace
from tensorgate.scheduling.pending import Fault, Pending
from tensorgate.scheduling.request_queue import RETRY_AFTER_S, RequestQueue
from tensorgate.scheduling.statistics import InferenceStatistics
from tensorgate.types import SHARED_TENANT, Array, InferRequest, InferResponse, Tenant

T = TypeVar("T")

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class QueueSettings:
    priority_levels: int = 1
    default_priority: int | None = None  # None: the lowest level
    max_queue_size: int = 1024
    default_timeout_s: float | None = None
    order: str = "fifo"  # within a level: fifo (fair between tenants) or deadline (request_queue.ORDERS)
    deadline_admission: bool = False  # refuse at once what cannot meet its deadline (deadline_admission.py)


def settle(future: asyncio.Future[T] | None, result: T | BaseException) -> None:
    """Resolve a future once; a future already done or cancelled is left alone."""
    if future is None or future.done():
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)


class RunningBatch:
    """One batch on an instance, from dispatch until it ends."""

    __slots__ = ("batch", "done", "ended", "hedged", "instance", "span", "started", "suspect", "timer")

    def __init__(
        self, instance: Instance, batch: list[Pending], started: float, span: BatchSpan, ended: asyncio.Future[None]
    ) -> None:
        self.instance = instance
        self.batch = batch
        self.started = started
        self.span = span
        self.ended = ended  # done when it ends (``Scheduler.drain`` waits on these)
        self.timer: asyncio.TimerHandle | None = None  # fires when the batch becomes suspect
        self.done = False
        self.suspect = False  # it ran past its instance's pace
        self.hedged = False  # its requests were sent to another instance too


class Scheduler:
    def __init__(
        self,
        model: str,
        version: int,
        pool: InstancePool,
        batch: BatchSettings,
        queue: QueueSettings,
        clock: Clock,
        metrics: VersionMetrics,
        tracer: Tracer = NOOP_TRACER,
    ) -> None:
        self._tracer = tracer  # opens one span per executed batch (tensorgate.observability.tracing)
        self._tracing = tracer.enabled
        self._tracing_sampled_only = tracer.sampled_only
        self.model = model
        self.version = version
        self._pool = pool
        self._batch = batch
        self._queue_settings = queue
        self._queue = RequestQueue(queue.priority_levels, queue.max_queue_size, queue.order)
        self._clock = clock
        self._metrics = metrics
        # The metric children themselves, bound once: every request ends with an outcome and two
        # observations, and a call through ``VersionMetrics`` (interpreted) cost more than the update.
        self._outcomes = metrics.outcomes
        self._request_seconds = metrics.request_seconds
        self._queue_seconds = metrics.queue_seconds
        self._compute_seconds = metrics.compute_seconds
        self._batch_size = metrics.batch_size
        self._executions = metrics.executions
        self._depth_gauges = metrics.queue_depth_gauges(queue.priority_levels)
        self._inflight_gauges = metrics.inflight_gauges(queue.priority_levels)
        self._tenants = metrics.metrics.tenants  # each request's end by its tenant (the status page)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._running: set[asyncio.Future[None]] = set()  # one per batch on an instance, done when it ends
        self._closed = False
        self._pump_scheduled = False
        self.stats = InferenceStatistics()  # Triton's statistics extension
        # The measured cost line: what the adaptive batching window and deadline admission judge by.
        self._adaptive = batch.batching and batch.adaptive_delay
        self._deadline_admission = queue.deadline_admission
        self.batch_cost = BatchCost() if self._adaptive or self._deadline_admission else None
        self.health: HealthMonitor | None = None  # set once the version serves: hears how batches end
        self._parts = itertools.count(1)  # numbers the parts a failed batch is split into
        # Hang detection (set with the health checks): each instance's pace, and how many batches
        # in a row each has run past it.
        self.pace: Pace | None = None
        self._suspects: dict[Instance, int] = {}
        # Requests bound to an instance (a direct sequence batcher) are batched per instance.
        self.affinity = False

    # -- admission -----------------------------------------------------------------------------

    def _priority(self, request: InferRequest) -> int:
        levels = self._queue_settings.priority_levels
        if request.priority is None or request.priority == 0:
            default = self._queue_settings.default_priority
            return default if default is not None else levels
        if not 1 <= request.priority <= levels:
            raise InvalidInput(f"priority {request.priority} is outside 1..{levels} for model '{self.model}'")
        return request.priority

    async def submit(
        self, request: InferRequest, rows: int, shape_key: tuple[tuple[int, ...], ...], bound: Instance | None = None
    ) -> InferResponse:
        """Admit, wait for the batch that carries this request, and return its own outputs. A
        ``bound`` request runs on that instance while it is in rotation (``affinity``)."""
        try:
            if self._closed:
                raise Unavailable(f"model '{self.model}' version {self.version} is shutting down", retry_after_s=1.0)
            priority = self._priority(request)
        except TensorgateError as exc:
            self._refused(exc.outcome, request.tenant)
            raise
        now = self._clock.now()
        timeout = request.timeout_s if request.timeout_s is not None else self._queue_settings.default_timeout_s
        deadline = None if timeout is None else now + timeout
        loop = asyncio.get_running_loop()
        item = Pending(
            request=request,
            rows=rows,
            shape_key=shape_key,
            priority=priority,
            arrival=now,
            deadline=deadline,
            future=loop.create_future(),
        )
        item.bound = bound
        try:
            if deadline is not None and self._deadline_admission:
                self._check_deadline(item, deadline - now)
            self._admit(item)
        except QueueFull:
            self._refused("queue_full", request.tenant)
            raise
        except WouldMissDeadline:
            self._refused("deadline_refused", request.tenant)
            raise
        self._inflight_gauges[priority - 1].inc()
        if self.batch_cost is not None:
            self.batch_cost.admitted(rows)
        self._pump_soon()
        assert item.future is not None
        try:
            if deadline is None:
                response = await item.future
            else:
                # Also bounds time spent executing: a result that arrives after the deadline is dropped.
                response = await asyncio.wait_for(asyncio.shield(item.future), max(0.0, deadline - now))
        except TimeoutError:
            if self._queue.remove(item):
                self._publish_depth()
            item.future.cancel()  # a result that still arrives is dropped
            self._finish(item, "timeout")
            raise DeadlineExceeded(
                f"request to model '{self.model}' exceeded its deadline of {timeout * 1000:.0f} ms"  # type: ignore[operator]
            ) from None
        except asyncio.CancelledError as exc:
            # The client went away: leave the queue (or drop the result when already running).
            if self._queue.remove(item):
                self._pump()
            item.future.cancel()
            # A cancellation at the deadline is the deadline (gRPC's own timer fired first).
            expired = DEADLINE_CANCEL in exc.args or (deadline is not None and self._clock.now() >= deadline)
            self._finish(item, "timeout" if expired else "cancelled")
            raise
        except TensorgateError as exc:
            self._finish(item, exc.outcome)
            raise
        self._finish(item, "success")
        return response

    def _admit(self, item: Pending) -> None:
        """Queue ``item``, or raise QueueFull at once (never block).

        A full queue is first offered to idle instances: requests that arrived in this loop turn
        wait for the turn's end to be dispatched together (``_pump_soon``), and one that an idle
        instance would take is not waiting, so it must not count against the queue's size. A
        request another tenant's newcomer displaced from a full queue is answered 503 at once.
        """
        try:
            displaced = self._queue.admit(item)
        except QueueFull:
            self._pump()
            displaced = self._queue.admit(item)
        if displaced is not None:
            settle(
                displaced.future,
                QueueFull(
                    f"model '{self.model}' queue is full ({self._queue.max_size} requests waiting) and "
                    f"tenant '{displaced.request.tenant.name}' holds the most of it; retry later",
                    retry_after_s=RETRY_AFTER_S,
                ),
            )

    def _check_deadline(self, item: Pending, remaining: float) -> None:
        """Raise WouldMissDeadline when the work ahead of ``item`` cannot be done in ``remaining`` seconds."""
        assert self.batch_cost is not None
        ahead = self._queue.rows_ahead(item.priority, item.request.tenant, item.deadline)
        max_rows = self._batch.max_rows if self._batch.batching else 1
        estimate = completion_estimate(
            ahead,
            item.rows,
            max_rows,
            self._pool.idle_count() + self._pool.busy_count(),
            len(self._running),
            self.batch_cost.cost,
        )
        if estimate is not None and estimate > remaining:
            raise WouldMissDeadline(
                f"request to model '{self.model}' cannot finish within its deadline of {remaining * 1000:.0f} ms: "
                f"{ahead} rows are queued ahead of it, about {estimate * 1000:.0f} ms of work; retry later",
                retry_after_s=estimate - remaining,
            )

    def _refused(self, outcome: str, tenant: Tenant) -> None:
        """A request turned away at admission: a failure in the metrics and in the statistics
        (Triton counts its scheduler's rejections as failures too)."""
        self._outcomes[outcome].inc()
        self.stats.refused()
        if tenant is not SHARED_TENANT or self._tenants.active:
            self._tenants.ended(tenant.name, outcome, None)

    def _finish(self, item: Pending, outcome: str) -> None:
        if item.faults is not None:
            self._settle_faults(item.faults, outcome == "success")
        elapsed = self._clock.now() - item.arrival
        self._inflight_gauges[item.priority - 1].dec()
        self._outcomes[outcome].inc()
        self._request_seconds.observe(elapsed)
        tenant = item.request.tenant
        if tenant is not SHARED_TENANT or self._tenants.active:  # nothing to show until one is named
            self._tenants.ended(tenant.name, outcome, elapsed)
        self.stats.ended(outcome == "success", elapsed)

    def _settle_faults(self, faults: list[Fault], answered: bool) -> None:
        """A request that was in failed batches ended: an instance whose failed batch was answered in
        full elsewhere counts a failure of its own."""
        health = self.health
        for fault in faults:
            if fault.ended(answered) and health is not None:
                health.batch_failed(fault.instance, ModelFailed(f"{fault.message} (answered by another instance)"))

    # -- dispatch --------------------------------------------------------------------------------

    def _pump_soon(self) -> None:
        """Pump at the end of this event-loop turn, once, however many requests arrived in it.

        Under load the loop parses many requests per turn; letting them all reach the queue before
        deciding turns a burst into one batch instead of a string of single-request calls. A lone
        request waits one loop turn (microseconds), not a batch window.
        """
        if not self._pump_scheduled:
            self._pump_scheduled = True
            asyncio.get_running_loop().call_soon(self._scheduled_pump)

    def _scheduled_pump(self) -> None:
        self._pump_scheduled = False
        self._pump()

    def poke(self) -> None:
        """Look at the queue again: an instance rejoined the pool (restarted, or became healthy)."""
        self._pump()

    def fail_stranded(self) -> None:
        """With no healthy instance left (a restart failed, a thread hung), answer the queue now with 503.

        Without this, requests with no deadline would wait for as long as a crash loop lasts;
        while a restart is only under way they wait for it, since it may well succeed.
        """
        if self._pool.any_healthy() or len(self._queue) == 0:
            return
        message = f"model '{self.model}' has no healthy instance to run the request; retry later"
        self._answer_queue(lambda: Unavailable(message, retry_after_s=1.0))
        self._publish_depth()

    def _answer_queue(self, error: Callable[[], TensorgateError]) -> None:
        """Take every queued request out and answer each with an error of its own (raised in each
        caller, one shared exception object would collect all their tracebacks)."""
        for item in list(self._queue.in_order()):
            self._queue.remove(item)
            settle(item.future, error())

    def _pump(self) -> None:
        """Expire, then dispatch every batch the policy releases; arm a timer for the next look."""
        try:
            now = self._clock.now()
            for item in self._queue.expire(now):
                waited_ms = ((item.deadline or now) - item.arrival) * 1000
                message = f"request to model '{self.model}' exceeded its deadline of {waited_ms:.0f} ms in the queue"
                settle(item.future, DeadlineExceeded(message))
            if self.affinity:
                self._pump_bound(now)
                return
            hold_below = math.inf if self.batch_cost is None or not self._adaptive else self.batch_cost.hold_below_rows
            while True:
                decision = decide(
                    self._queue, self._batch, now, self._pool.idle_count(), self._pool.busy_count(), hold_below
                )
                if decision.batch is None:
                    self._arm(decision.wake_at)
                    break
                # A retried request may sit behind a higher-priority one: any member's failed instance counts.
                failed_on = next((p.failed_on for p in decision.batch if p.failed_on is not None), None)
                instance = self._pool.acquire(avoid=failed_on)
                if instance is None:  # the idle one is the retry's failed instance: wait for another
                    self._arm(None)
                    break
                self._queue.take(decision.batch)
                self._dispatch(instance, decision.batch, decision.reason, now)
            self._publish_depth()
        except Exception:  # the exception boundary: a policy bug must not strand the queue
            log.exception("scheduler for %s/%s failed to dispatch", self.model, self.version)
            self._answer_queue(lambda: InternalError("the scheduler failed; see the server log"))

    def _pump_bound(self, now: float) -> None:
        """Dispatch for bound requests: each idle instance takes the oldest requests bound to it
        (or to an instance out of rotation, whose sequences any instance may run, their state being
        the server's), of one shape, up to a full batch, at once. Requests for a busy instance do not
        hold up those behind them for another."""
        dispatched = True
        while dispatched and len(self._queue):
            dispatched = False
            for instance in self._pool.instances:
                if not self._pool.take(instance):
                    continue
                batch = self._bound_batch(instance)
                if not batch:
                    self._pool.release(instance)
                    continue
                for item in batch:  # not a prefix of the queue's order: the others stay in theirs
                    self._queue.remove(item)
                self._dispatch(instance, batch, ReleaseReason.IDLE, now)
                dispatched = True
        self._arm(self._queue.next_deadline)
        self._publish_depth()

    def _bound_batch(self, instance: Instance) -> list[Pending]:
        batch: list[Pending] = []
        rows = 0
        limit = self._batch.max_rows if self._batch.batching else 1
        for item in self._queue.in_order():
            bound = item.bound
            if bound is not None and bound is not instance and bound.available:
                continue
            if batch and item.shape_key != batch[0].shape_key:
                continue
            if batch and rows + item.rows > max(limit, 1):
                break
            batch.append(item)
            rows += item.rows
        return batch

    def _publish_depth(self) -> None:
        for level, gauge in enumerate(self._depth_gauges, start=1):
            gauge.set(self._queue.depth(level))

    def _arm(self, wake_at: float | None) -> None:
        if wake_at == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = wake_at
        if wake_at is not None and not self._closed:
            delay = max(0.0, wake_at - self._clock.now())
            self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self._pump()

    def _dispatch(self, instance: Instance, batch: list[Pending], reason: ReleaseReason | None, now: float) -> None:
        live = [p for p in batch if p.future is not None and not p.future.done()]
        if not live:
            self._pool.release(instance)
            return
        try:
            if reason is not None:
                self._metrics.release(reason.value)
            for item in live:
                if item.dispatched_at is None:
                    item.dispatched_at = now
                    wait = now - item.arrival
                    self._queue_seconds.observe(wait)
                    self.stats.waited(wait)
            span = NOOP_BATCH
            if self._tracing and (not self._tracing_sampled_only or any(sampled(p.request.traceparent) for p in live)):
                span = self._tracer.batch((p.request for p in live), sum(p.rows for p in live))
        except Exception:  # taken from the queue already: the pump's boundary would not see these
            log.exception("scheduler for %s/%s failed to dispatch a batch", self.model, self.version)
            self._pool.release(instance)
            for item in live:
                settle(item.future, InternalError("the scheduler failed; see the server log"))
            return
        loop = asyncio.get_running_loop()
        run = RunningBatch(instance, live, self._clock.now(), span, loop.create_future())
        self._running.add(run.ended)
        if self.pace is not None:
            limit = self.pace.suspect_after(instance, sum(p.rows for p in live))
            if limit is not None:
                run.timer = loop.call_later(limit, self._suspect, run, limit)
        on_done = functools.partial(self._finished, run)
        try:
            instance.run_batch([p.request.inputs for p in live], on_done)
        except Exception as exc:  # the batch never started: answer it, and free the instance
            on_done(None, exc)

    def _finished(self, run: RunningBatch, outputs: dict[str, Array] | None, error: BaseException | None) -> None:
        """A batch ended (on the event loop): answer its requests, or retry or fail them."""
        instance, batch, started = run.instance, run.batch, run.started
        retry: list[Pending] = []
        released = False
        run.done = True
        if run.timer is not None:
            run.timer.cancel()
        elif run.suspect:
            self._metrics.instance_suspect(instance.name, False)
        try:
            run.span.end()
            if error is not None and run.hedged:
                # Its requests have copies elsewhere: those answer them (or fail them) now.
                batch = [p for p in batch if not self._left_to_copy(run, p)]
            if isinstance(error, InstanceDied):
                log.warning("instance %s died running a batch of %d: %s", instance.name, len(batch), error)
                for item in batch:
                    item.attempts += 1
                    item.failed_on = instance
                    if item.attempts > 1:
                        settle(item.future, InternalError(f"model '{self.model}' failed twice: its instance died"))
                    else:
                        retry.append(item)
                if self.health is not None:
                    self.health.batch_failed(instance, error)
                return
            if isinstance(error, ModelFailed):
                log.warning("model %s/%s raised on a batch of %d: %s", self.model, self.version, len(batch), error)
                retry = self._isolate(instance, batch, error) if batch else []
                return
            if error is not None:
                raise error
            assert outputs is not None
            if self.health is not None:
                self._report_health(instance, batch)
            elapsed = self._clock.now() - started
            rows = [p.rows for p in batch]
            total_rows = sum(rows)
            self._record_execution(total_rows, elapsed, len(batch))
            if self.pace is not None:
                # A suspect batch that another instance beat (its copies answered first) was this
                # instance's fault, not the model's pace: learning a hung batch's 20 s would stop the
                # next hung batch from being suspected at all. One that won, or had no copies, is the
                # model's pace (a longer input mix, a slower host) and is learned.
                if not (run.hedged and any(p.future is not None and p.future.done() for p in batch)):
                    self.pace.observe(instance, total_rows, elapsed)
                if not run.suspect and self._suspects:
                    self._suspects.pop(instance, None)  # a batch at its pace ends a run of suspect ones
            responses = [
                self._response(item, own, started, elapsed)
                for item, own in zip(batch, split_outputs(outputs, rows, self._batch.max_rows > 0), strict=True)
            ]
            # The instance takes its next batch before this one's callers wake: their tasks (encode,
            # send) then run while the model computes, instead of the model waiting behind them
            # (profiled with image-sized requests: the instance sat idle ~13 % of the time).
            for item in batch:
                if item.hedge_of is not None:
                    self._answer_hedged(run, item)  # before the release: its queued copy must not run
            released = True
            self._release(instance, retry)
            for item, response in zip(batch, responses, strict=True):
                settle(item.future, response)
        except TensorgateError as exc:
            for item in batch:
                settle(item.future, exc)
        except BaseException:  # a bug, or a cancelled task: logged, and every caller still answered
            log.exception("batch for %s/%s failed", self.model, self.version)
            for item in batch:
                settle(item.future, InternalError(f"model '{self.model}' failed to execute the request"))
        finally:
            if not released:
                self._release(instance, retry)
            self._running.discard(run.ended)
            run.ended.set_result(None)

    # -- hang detection: a batch past its instance's pace is hedged --------------------------------

    def _suspect(self, run: RunningBatch, limit: float) -> None:
        """``run`` has outlasted what its instance's pace allows: send its requests to another
        instance too (the first answer wins), and take out an instance that does this twice in a row.

        The instance keeps the batch (a hung model cannot be interrupted mid-call; a slow one may
        still answer first) and, being busy, takes no new work until it ends or reaches the hard
        cap (``batch_timeout_s``), where the instance's own watch fails it as hung.
        """
        run.timer = None
        if run.done or self._closed:
            return
        instance = run.instance
        run.suspect = True
        self._metrics.instance_suspect(instance.name, True)
        streak = self._suspects[instance] = self._suspects.get(instance, 0) + 1
        copies = [p for p in run.batch if p.future is not None and not p.future.done() and p.hedge_of is None]
        others = self._pool.available_count() - (1 if instance.available else 0)
        hedge = bool(copies) and others > 0
        log.warning(
            "instance %s of %s/%s has run a batch of %d for over %.2f s, past its pace%s",
            instance.name,
            self.model,
            self.version,
            len(run.batch),
            limit,
            ": sending its requests to another instance as well" if hedge else "",
        )
        if hedge:
            run.hedged = True
            self._metrics.hedged()
            for item in reversed(copies):
                item.hedge_of = run
                item.failed_on = instance
                self._queue.requeue_front(item)
        if streak >= 2 and self.health is not None:
            del self._suspects[instance]
            self.health.batch_failed(instance, InstanceDied(f"{streak} batches in a row ran past its pace"))
        if hedge:
            self._pump()

    def _left_to_copy(self, run: RunningBatch, item: Pending) -> bool:
        """A run of hedged ``item`` failed: is another run of it (still) to answer it?"""
        original = item.hedge_of
        if item.future is None or item.future.done():
            return True  # answered already
        if original is None:
            return False
        if original is run:
            return True  # the suspect batch failed: its copy (queued or running) answers
        item.hedge_of = None  # the copy failed: the suspect batch, if still running, is its last run
        return not original.done

    def _answer_hedged(self, run: RunningBatch, item: Pending) -> None:
        """``run`` answers a hedged request: count which side won, and drop a copy still queued."""
        if item.future is None or item.future.done():
            return
        self._metrics.hedge_won("original" if item.hedge_of is run else "hedge")
        if self._queue.remove(item):
            self._publish_depth()

    def _isolate(self, instance: Instance, batch: list[Pending], error: ModelFailed) -> list[Pending]:
        """The model raised on a batch: which of its requests does the model itself refuse?

        Inference is idempotent, so the requests run again, on another instance where there is one:
        a batch of several split in two halves, each its own batch from then on (and split again
        should it raise too), down to single requests. A request the model raised on alone, on two
        instances (or on the only one), is refused: it alone fails, with the model's message. The
        instance is charged (its health) only once every request of its failed batch is answered
        elsewhere: then the fault was the instance's, a device error, and not the inputs'. Halving
        bounds the extra executions of a batch of N to about 2N.
        """
        message = str(error)
        public = error.public  # what the client may read: the model's own words, when it meant them
        fault = Fault(instance, message, len(batch))
        others = self._pool.available_count() - (1 if instance.available else 0)
        retry: list[Pending] = []
        for item in batch:
            if item.faults is None:
                item.faults = []
            item.faults.append(fault)
            item.failed_on = instance
            item.attempts += 1
        if self.health is None:  # no health checks: no isolation either, as the configuration asks
            for item in batch:
                self._refuse(item, public)
            return retry
        if len(batch) == 1:
            item = batch[0]
            if others < 1 or (item.failed_alone is not None and item.failed_alone is not instance):
                self._refuse(item, public)  # raised alone on two instances, or there is no other to try
            else:
                item.failed_alone = instance
                retry.append(item)
            return retry
        half = len(batch) // 2
        for part in (batch[:half], batch[half:]):
            number = next(self._parts)
            for item in part:
                if item.own_key is None:
                    item.own_key = item.shape_key
                item.shape_key = (*item.own_key, (-number,))  # no real dimension is negative
                retry.append(item)
        return retry

    def _refuse(self, item: Pending, public: str | None) -> None:
        """Fail a request the model refuses: with the model's message when it meant one for the client
        (``tensorgate.ModelError``); any other exception's text stays in the server log."""
        detail = "" if public is None else f": {public}"
        settle(item.future, InternalError(f"model '{self.model}' failed to execute the request{detail}"))

    def _report_health(self, instance: Instance, batch: list[Pending]) -> None:
        """A batch succeeded: its instance is well."""
        health = self.health
        assert health is not None
        health.batch_ok(instance)
        if health.wants_sample:  # a probe sends only inputs the model has answered
            health.learn_sample(batch[0].request.inputs)

    def _release(self, instance: Instance, retry: list[Pending]) -> None:
        """The instance is free again: requeue what must be retried (first in line), dispatch."""
        self._pool.release(instance)
        for item in reversed(retry):
            if item.future is not None and not item.future.done():  # its client may have gone meanwhile
                self._queue.requeue_front(item)
                self._metrics.retries.inc()
        if retry and self._pool.any_ejected() and not self._pool.any_healthy():
            self.fail_stranded()  # its health checks took the last instance out: no retry will come soon
        self._pump()

    def _record_execution(self, rows: int, elapsed: float, requests: int) -> None:
        if self.batch_cost is not None:
            self.batch_cost.observe(rows, elapsed, self._clock.now())
        self._compute_seconds.observe(elapsed)
        self._batch_size.observe(rows)
        self._executions.inc()
        self.stats.executed(rows, elapsed, requests)

    def _response(self, item: Pending, outputs: Mapping[str, Array], started: float, elapsed: float) -> InferResponse:
        wanted = item.request.outputs
        if wanted:
            outputs = {name: outputs[name] for name in wanted}
        return InferResponse(
            model=self.model,
            version=self.version,
            outputs=outputs,
            id=item.request.id,
            queue_s=started - item.arrival,
            compute_s=elapsed,
        )

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def queue_settings(self) -> QueueSettings:
        return self._queue_settings

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> int:
        return len(self._running)

    async def drain(self, timeout_s: float) -> None:
        """Wait until nothing is queued or running (or ``timeout_s`` passes)."""
        deadline = self._clock.now() + timeout_s
        while (len(self._queue) or self._running) and self._clock.now() < deadline:
            pending = set(self._running)
            if pending:
                await asyncio.wait(pending, timeout=max(0.0, deadline - self._clock.now()))
            else:
                await asyncio.sleep(0.01)  # queued items wait for an instance; poll at a coarse grain

    async def aclose(self, timeout_s: float | None = None) -> None:
        """Refuse what is queued, then wait for the running batches (at most ``timeout_s``: a batch
        stuck in its model must not hold up a shutdown)."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        self._answer_queue(lambda: Unavailable(f"model '{self.model}' is unloading", retry_after_s=1.0))
        if self._running:
            _, stuck = await asyncio.wait(set(self._running), timeout=timeout_s)
            if stuck:
                log.warning("model %s/%s: %d batch(es) still running at unload", self.model, self.version, len(stuck))
