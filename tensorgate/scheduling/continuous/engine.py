"""The continuous-batching engine: a thin driver around the pure :class:`StepScheduler`.

The driver runs on the engine's own thread: ask the scheduler for a step plan, run it on the
model, report the sampled tokens back, hand them to the event loop, repeat. Keeping the whole
cycle on one thread matters: with the loop on the event loop and the model on a worker, every
step paid two thread hand-offs and waited for the event loop's turn (profiled: ~10 % of a step
of 100 sequences, and much more when the host's other core was busy). The event loop only
delivers tokens to the waiting streams, concurrently with the next step.

The scheduler is shared: the driver plans and updates under the engine's lock, and requests
arriving or cancelling (on the event loop) take the same lock, so they take effect at the next
step. A failing step fails its sequences, not the driver.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Protocol

from tensorgate.clock import Clock
from tensorgate.errors import DeadlineExceeded, InternalError, Unavailable
from tensorgate.generation import (
    FinishReason,
    GenerationStream,
    Sampled,
    SamplingParams,
    StepPlan,
    StepRunner,
    TokenEvent,
)
from tensorgate.observability.generation_metrics import VersionGenerationMetrics
from tensorgate.scheduling.continuous.detokenize import IncrementalText
from tensorgate.scheduling.continuous.sequence import Sequence
from tensorgate.scheduling.continuous.step_scheduler import SeqUpdate, StepScheduler
from tensorgate.scheduling.scheduler import settle

log = logging.getLogger(__name__)


class Detokenizer(Protocol):
    def decode(self, token_ids: Seq[int]) -> str: ...


@dataclass(frozen=True, slots=True)
class EngineSettings:
    default_priority: int = 1
    default_timeout_s: float | None = None


class Engine:
    def __init__(
        self,
        runner: StepRunner,
        scheduler: StepScheduler,
        detokenizer: Detokenizer,
        clock: Clock,
        metrics: VersionGenerationMetrics | None = None,
        settings: EngineSettings | None = None,
    ) -> None:
        self._runner = runner
        self.scheduler = scheduler
        self._detok = detokenizer
        self._clock = clock
        self._metrics = metrics
        self._settings = settings or EngineSettings()
        self._streams: dict[int, GenerationStream] = {}  # touched on the event loop only
        self._texts: dict[int, IncrementalText] = {}  # an incremental stream's text, decoded as it comes
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # the scheduler's: driver thread and event loop both use it
        self._work = threading.Condition(self._lock)  # wakes an idle driver
        self._quiet = asyncio.Event()  # set while nothing is queued or running
        self._quiet.set()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        started: asyncio.Future[None] = loop.create_future()
        self._thread = threading.Thread(target=self._drive, args=(started,), name="llm-engine", daemon=True)
        self._thread.start()
        await started

    async def drain(self, timeout_s: float) -> None:
        """Wait until every admitted sequence has finished, or ``timeout_s`` has passed."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._quiet.wait(), timeout_s)

    async def aclose(self) -> None:
        for seq_id in list(self._streams):
            self.abort(seq_id, Unavailable("the model is shutting down", retry_after_s=1.0))
        with self._work:
            self._closed = True
            self._work.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting

    @property
    def num_running(self) -> int:
        return self.scheduler.num_running

    # -- requests --------------------------------------------------------------------------------

    def submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        priority: int | None = None,
        timeout_s: float | None = None,
        incremental: bool = True,
    ) -> GenerationStream:
        """Admit a request or raise at once (InvalidInput, QueueFull); never blocks.

        ``incremental=False`` (a caller that only wants the whole answer) skips detokenizing after
        every token: the text is decoded once, at the end (unless stop strings need it earlier).
        """
        if self._closed:
            raise Unavailable("the model is shutting down", retry_after_s=1.0)
        now = self._clock.now()
        timeout = timeout_s if timeout_s is not None else self._settings.default_timeout_s
        seq = Sequence(
            seq_id=next(self._ids),
            prompt_ids=list(prompt_ids),
            params=params,
            priority=priority or self._settings.default_priority,
            arrival=now,
            deadline=None if timeout is None else now + timeout,
            quiet=not (incremental or params.stop) and params.logprobs is None,
        )
        with self._work:
            self.scheduler.add(seq)
            self._work.notify()
        stream = GenerationStream(
            seq.seq_id,
            len(prompt_ids),
            self.abort,
            arrival=now,
            stop=params.stop,
            incremental=incremental or bool(params.stop),
        )
        self._streams[seq.seq_id] = stream
        if stream.incremental:
            self._texts[seq.seq_id] = IncrementalText(self._detok.decode, params.stop)
        if self._metrics is not None:
            self._metrics.prompt_tokens.inc(len(prompt_ids))
        self._quiet.clear()
        return stream

    def abort(self, seq_id: int, error: BaseException | None = None) -> None:
        stream = self._streams.pop(seq_id, None)
        self._texts.pop(seq_id, None)
        if stream is None:
            return
        with self._work:
            self.scheduler.finish(seq_id, FinishReason.CANCELLED)
            self._work.notify()  # its cache is freed at the next step, even when nothing else runs
        stream.finish_reason = FinishReason.CANCELLED
        stream.put(error or TokenEvent(None, "", finish_reason=FinishReason.CANCELLED, count=0))

    # -- the driver (engine thread) ----------------------------------------------------------------

    def _drive(self, started: asyncio.Future[None]) -> None:
        try:
            self._runner.reset()  # on this thread: per-thread settings (torch threads) land here
        except BaseException as exc:
            self._post(settle, started, exc)
            return
        self._post(settle, started, None)
        while True:
            with self._work:
                plan, ended = self._next_plan()
                if plan is None:
                    return
            if ended:
                self._post(self._end_all, ended)
            try:
                sampled = self._runner.run_step(plan)
            except Exception as exc:  # the model raised: fail this step's sequences, keep serving
                log.exception("a generation step failed")
                failed = [chunk.seq_id for chunk in plan.chunks]
                with self._lock:  # out of the scheduler now, so the next plan does not retry them
                    for seq_id in failed:
                        self.scheduler.finish(seq_id, FinishReason.ERROR)
                error = InternalError(f"the model failed: {type(exc).__name__}")
                self._post(self._abort_all, failed, error)
                continue
            produced_at = self._clock.now()
            with self._lock:
                updates = self.scheduler.update(plan, {k: v.token_id for k, v in sampled.items()})
            if updates:
                # A quiet sequence's tokens in the middle of its answer stay here (they are in its
                # record): at 100 sequences, handing each over cost the event loop ~0.15 ms a step,
                # taken from the driver too, which waits for the interpreter lock meanwhile.
                delivering = [
                    (update, sampled[update.seq.seq_id])
                    for update in updates
                    if not update.seq.quiet or update.finished or len(update.seq.output_ids) == 1
                ]
                self._post(self._deliver_all, delivering, len(updates), produced_at)

    def _post(self, callback: Callable[..., None], *args: object) -> None:
        """Run ``callback`` on the event loop; dropped if the loop has closed (nobody is waiting)."""
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(callback, *args)

    def _next_plan(self) -> tuple[StepPlan | None, list[Sequence]]:
        """The next step to run, waiting (lock held, released while waiting) until there is one.

        None once the engine closes. Sequences that ended while planning come back with it.
        """
        ended: list[Sequence] = []
        while not self._closed:
            if not self.scheduler.has_work():
                self._publish()
                self._post(self._mark_quiet)
                self._work.wait()
                continue
            plan, gone = self.scheduler.schedule(self._clock.now())
            ended += gone
            if plan.preempted and self._metrics is not None:
                self._metrics.preemptions.inc(len(plan.preempted))
            self._publish()
            if not plan.empty:
                return plan, ended
            # Nothing fits now (waiting sequences the cache cannot hold): wait for a change or a deadline.
            deadline = self.scheduler.next_deadline()
            self._work.wait(None if deadline is None else max(0.0, deadline - self._clock.now()))
        return None, ended

    # -- on the event loop -------------------------------------------------------------------------

    def _mark_quiet(self) -> None:
        if not self.scheduler.has_work():  # a request may have arrived since the driver looked
            self._quiet.set()

    def _end_all(self, ended: list[Sequence]) -> None:
        for seq in ended:
            self._end(seq)

    def _abort_all(self, seq_ids: list[int], error: BaseException) -> None:
        for seq_id in seq_ids:
            self.abort(seq_id, error)

    def _deliver_all(self, delivering: list[tuple[SeqUpdate, Sampled]], generated: int, now: float) -> None:
        for update, sampled in delivering:
            self._deliver(update, sampled, now)
        if self._metrics is not None:
            self._metrics.generated_tokens.inc(generated)

    def _publish(self) -> None:
        m = self._metrics
        if m is not None:
            m.running.set(self.scheduler.num_running)
            m.waiting.set(self.scheduler.num_waiting)
            m.kv_usage.set(self.scheduler.kv.usage)

    def _end(self, seq: Sequence) -> None:
        stream = self._streams.pop(seq.seq_id, None)
        texts = self._texts.pop(seq.seq_id, None)
        if stream is None:
            return
        stream.finish_reason = seq.finish_reason
        if seq.quiet:  # a finished record is no longer written to
            stream.output_ids = seq.output_ids[:]
        rest = ""  # what an incremental stream held back, in case a stop string began in it
        if texts is not None:
            texts.add(stream.output_ids, final=True)
            rest = texts.take(final=True)
            stream.text = texts.text
        elif stream.output_ids:
            stream.text = self._detok.decode(stream.output_ids)
        if seq.finish_reason is FinishReason.EXPIRED and not stream.output_ids:
            stream.put(DeadlineExceeded("the request's deadline passed before it was scheduled"))
        else:
            stream.put(TokenEvent(None, rest, finish_reason=seq.finish_reason, count=0))

    def _deliver(self, update: SeqUpdate, sampled: Sampled, now: float) -> None:
        """Hand one token to its stream (a quiet one's last: all of them), unless the stream is gone."""
        stream = self._streams.get(update.seq.seq_id)
        if stream is None:
            return
        m = self._metrics
        if stream.first_token_at is None:
            stream.first_token_at = now
            if m is not None:
                m.ttft.observe(now - stream.arrival)
        if update.seq.quiet:
            if update.finished:  # a finished record is no longer written to
                stream.output_ids = update.seq.output_ids[:]
        else:
            stream.output_ids.append(sampled.token_id)
        finish = update.seq.finish_reason if update.finished else None
        if not stream.incremental and finish is None:
            if update.seq.params.logprobs is not None:  # the caller collects per-token log-probabilities
                stream.put(TokenEvent(sampled.token_id, "", sampled.logprob, sampled.top))
            return  # otherwise nobody needs waking before the end
        texts = self._texts.get(stream.seq_id)
        if texts is None:  # the whole answer, decoded once now that it has ended
            stream.text = delta = self._detok.decode(stream.output_ids)
        else:
            texts.add(stream.output_ids, final=finish is not None)
            if texts.stopped and finish is None:  # a stop string: the sequence ends here
                with self._work:
                    self.scheduler.finish(update.seq.seq_id, FinishReason.STOP)
                    self._work.notify()
            if texts.stopped:
                finish = FinishReason.STOP
            delta = texts.take(final=finish is not None)
            stream.text = texts.text
        stream.put(TokenEvent(sampled.token_id, delta, sampled.logprob, sampled.top, finish))
        if finish is not None:
            stream.finish_reason = finish
            del self._streams[stream.seq_id]
            self._texts.pop(stream.seq_id, None)
            if m is not None:
                m.e2e.observe(now - stream.arrival)
                if len(stream.output_ids) > 1 and stream.first_token_at is not None:
                    m.tpot.observe((now - stream.first_token_at) / (len(stream.output_ids) - 1))
