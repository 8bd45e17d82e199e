"""Prometheus metrics. The registry is passed in (no global), so a test builds a fresh one.

Label values come only from loaded models (name, version, instance), never from request URLs:
a flood of requests for unknown models cannot create series. Tenant labels, which clients name,
are a bounded set (``tenant_window``). The families are updated on the
event loop only, without locks (see ``loop_metrics``); process, platform and GPU figures come
from collectors read at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector

from tensorgate.clock import Clock, MonotonicClock
from tensorgate.errors import OUTCOME_BY_CODE
from tensorgate.observability.buckets import LATENCY_BUCKETS
from tensorgate.observability.generation_metrics import GenerationMetrics
from tensorgate.observability.gpu import register_gpu_metrics
from tensorgate.observability.loop_metrics import (
    Counter,
    CounterChild,
    Gauge,
    GaugeChild,
    Histogram,
    HistogramChild,
    LoopCollector,
)
from tensorgate.observability.status_window import StatusWindows
from tensorgate.observability.tenant_window import TenantWindows
from tensorgate.observability.worker_metrics import WorkerCollector

BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256)
LOAD_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
# The largest absolute difference between a shadow's outputs and the served ones: 0 to large.
DIFFERENCE_BUCKETS = (0.0, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0)
# Responses a decoupled model sends per request: none, one (the plain case), a few, a long stream.
RESPONSE_COUNT_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
# Every outcome a request can end with: success, queue_full, deadline_refused (refused at admission
# for a deadline it could not meet), and each reason of the error table.
OUTCOMES = ("success", "queue_full", "deadline_refused", *dict.fromkeys(OUTCOME_BY_CODE.values()))


class Metrics:
    """Every metric family the server exports. ``enabled=False`` records nothing (no metrics port)."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        process: bool = True,
        enabled: bool = True,
        clock: Clock | None = None,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        # The last minute of every version, for the status page: fed by the children for_version
        # binds, so it hears exactly what the families count (and keeps counting with metrics off).
        self.status = StatusWindows(clock if clock is not None else MonotonicClock())
        self.enabled = enabled
        self.workers = WorkerCollector()
        if process and enabled:
            ProcessCollector(namespace="tensorgate", registry=self.registry)
            PlatformCollector(registry=self.registry)
            register_gpu_metrics(self.registry)
            self.registry.register(self.workers)
        loop = LoopCollector()
        r = loop.add
        mv = ["model", "version"]
        self.requests = r(Counter("tensorgate_requests", "Inference requests by outcome.", [*mv, "outcome"]))
        self.request_seconds = r(
            Histogram(
                "tensorgate_request_duration_seconds",
                "End-to-end time in the server, admission to answer.",
                mv,
                buckets=LATENCY_BUCKETS,
            )
        )
        self.queue_seconds = r(
            Histogram(
                "tensorgate_queue_duration_seconds",
                "Time from admission to dispatch to an instance.",
                mv,
                buckets=LATENCY_BUCKETS,
            )
        )
        self.compute_seconds = r(
            Histogram(
                "tensorgate_compute_duration_seconds",
                "Time an instance spent executing each batch.",
                mv,
                buckets=LATENCY_BUCKETS,
            )
        )
        self.batch_size = r(
            Histogram(
                "tensorgate_batch_size",
                "Rows per executed batch.",
                mv,
                buckets=BATCH_BUCKETS,
            )
        )
        self.batch_releases = r(
            Counter(
                "tensorgate_batch_releases",
                "Why each batch was released.",
                [*mv, "reason"],
            )
        )
        self.executions = r(Counter("tensorgate_executions", "Model executions (batches run).", mv))
        self.response_cache = r(
            Counter("tensorgate_response_cache_lookups", "Response cache lookups by result.", [*mv, "result"])
        )
        self.response_cache_bytes = r(
            Gauge("tensorgate_response_cache_bytes", "Bytes of outputs the response cache holds.", [])
        )
        self.retries = r(
            Counter(
                "tensorgate_request_retries",
                "Requests run again: their instance died (retried once), or the model raised on their batch.",
                mv,
            )
        )
        self.hedged_batches = r(
            Counter(
                "tensorgate_hedged_batches",
                "Suspect batches whose requests were also sent to another instance (the first answer wins).",
                mv,
            )
        )
        self.hedge_wins = r(
            Counter(
                "tensorgate_hedge_wins",
                "Hedged requests by the run that answered first: the suspect batch (original) or its copy (hedge).",
                [*mv, "side"],
            )
        )
        self.sequences_open = r(
            Gauge("tensorgate_sequences_open", "Sequences in progress (sequence_batching models).", mv)
        )
        self.sequences_ended = r(
            Counter(
                "tensorgate_sequences_ended",
                "Sequences ended, by why: end (its last request), idle (max_sequence_idle_microseconds), "
                "failed (its first request failed), unloaded.",
                [*mv, "reason"],
            )
        )
        self.suspect_batches = r(
            Counter(
                "tensorgate_suspect_batches",
                "Batches that ran past the pace their instance keeps (hang detection).",
                [*mv, "instance"],
            )
        )
        self.instance_suspect = r(
            Gauge(
                "tensorgate_instance_suspect",
                "1 while the instance runs a suspect batch (it takes no new work until that batch ends).",
                [*mv, "instance"],
            )
        )
        self.responses_per_request = r(
            Histogram(
                "tensorgate_responses_per_request",
                "Responses a decoupled model sent per request, counted when the request ended.",
                mv,
                buckets=RESPONSE_COUNT_BUCKETS,
            )
        )
        self.stream_cancellations = r(
            Counter(
                "tensorgate_stream_cancellations",
                "Decoupled requests cancelled while their model held them (the client left or the deadline "
                "passed); the model's is_cancelled() turned true.",
                mv,
            )
        )
        self.queue_depth = r(
            Gauge(
                "tensorgate_queue_depth",
                "Requests waiting, per priority level.",
                [*mv, "priority"],
            )
        )
        self.inflight = r(
            Gauge(
                "tensorgate_inflight_requests",
                "Requests admitted and not yet answered (queued or running), per priority level.",
                [*mv, "priority"],
            )
        )
        self.instance_healthy = r(
            Gauge(
                "tensorgate_instance_healthy",
                "1 when the instance can take work.",
                [*mv, "instance"],
            )
        )
        self.instance_restarts = r(
            Counter(
                "tensorgate_instance_restarts",
                "Instance (worker process) restarts.",
                [*mv, "instance"],
            )
        )
        self.instance_probes = r(
            Counter(
                "tensorgate_instance_probes",
                "Health probes run on each instance, by outcome (ok, failed).",
                [*mv, "instance", "outcome"],
            )
        )
        self.load_seconds = r(
            Histogram(
                "tensorgate_model_load_duration_seconds",
                "Time to load a model version.",
                mv,
                buckets=LOAD_BUCKETS,
            )
        )
        self.warmup_seconds = r(
            Histogram(
                "tensorgate_model_warmup_duration_seconds",
                "Time to warm up a model version.",
                mv,
                buckets=LOAD_BUCKETS,
            )
        )
        self.model_ready = r(Gauge("tensorgate_model_ready", "1 when the version is READY.", mv))
        self.load_failures = r(Counter("tensorgate_model_load_failures", "Loads of a model version that failed.", mv))
        self.config_errors = r(
            Counter(
                "tensorgate_model_config_errors",
                "Model configurations found invalid by a repository poll or load; the old one kept serving.",
                ["model"],
            )
        )
        self.residency_loads = r(
            Counter(
                "tensorgate_model_residency_loads",
                "Loads of on-demand models on a request (cold starts), by outcome "
                "(loaded, failed, no_room, too_large).",
                ["model", "outcome"],
            )
        )
        self.residency_evictions = r(
            Counter(
                "tensorgate_model_evictions",
                "On-demand models unloaded to make room within server.memory_budget_bytes.",
                ["model"],
            )
        )
        self.cold_start_seconds = r(
            Histogram(
                "tensorgate_model_cold_start_duration_seconds",
                "From a request finding an on-demand model not resident to the model READY "
                "(evictions, load and warm-up).",
                ["model"],
                buckets=LOAD_BUCKETS,
            )
        )
        self.resident_bytes = r(
            Gauge(
                "tensorgate_model_resident_bytes",
                "Memory a model's loaded versions hold, as measured at their loads (0 once unloaded).",
                ["model"],
            )
        )
        self.memory_budget_bytes = r(
            Gauge("tensorgate_memory_budget_bytes", "server.memory_budget_bytes (absent: no budget).", [])
        )
        self.traffic_share = r(
            Gauge(
                "tensorgate_traffic_share",
                "Percentage of the requests that name no version sent to each version (traffic split or canary).",
                mv,
            )
        )
        self.rollout_state = r(
            Gauge(
                "tensorgate_rollout_state",
                "1 for the state a model's canary rollout is in (stepping, promoted, rolled_back), 0 for the others.",
                ["model", "state"],
            )
        )
        self.shadow_requests = r(
            Counter(
                "tensorgate_shadow_requests",
                "Copies of served requests sent to a shadow version, by outcome (compared, shed, failed).",
                [*mv, "outcome"],
            )
        )
        self.shadow_mismatches = r(
            Counter(
                "tensorgate_shadow_mismatches",
                "Shadow answers whose outputs differ from the served ones beyond the relative tolerance.",
                mv,
            )
        )
        self.shadow_class_changes = r(
            Counter(
                "tensorgate_shadow_class_changes",
                "Shadow answers whose argmax differs from the served one's on a classification output.",
                mv,
            )
        )
        self.shadow_difference = r(
            Histogram(
                "tensorgate_shadow_max_abs_difference",
                "The largest absolute difference between a shadow answer's outputs and the served ones.",
                mv,
                buckets=DIFFERENCE_BUCKETS,
            )
        )
        self.refused = r(
            Counter(
                "tensorgate_refused_requests",
                "Requests refused before they were read: unauthenticated, forbidden or rate_limited, by "
                "identity (an API key's name; one label per token issuer; '-' when no caller was known).",
                ["identity", "outcome"],
            )
        )
        self.tenant_requests = r(
            Counter(
                "tensorgate_tenant_requests",
                "Requests that reached a model's queue, by tenant and outcome: tenants named in server.tenants "
                "and the busiest others up to a cap have their own label, the rest count under 'other', "
                "the requests that name no tenant under '-' (recorded once any request names one).",
                ["tenant", "outcome"],
            )
        )
        self.server_info = r(
            Gauge(
                "tensorgate_server_info",
                "Always 1: the server's version and replica id as labels.",
                ["version", "replica"],
            )
        )
        self._generation: GenerationMetrics | None = None
        # Every tenant's last minute and its counter, fed by the schedulers (``Scheduler._finish``).
        self.tenants = TenantWindows(self.status.clock, self.tenant_requests)
        if enabled:
            self.registry.register(loop)
        else:  # the families hand out children that record nothing, and nothing is exported
            for family in loop.families:
                family.recording = False

    def generation(self) -> GenerationMetrics:
        """The text-generation families, registered when the first generative model loads."""
        if self._generation is None:
            self._generation = GenerationMetrics(self.registry, self.status)
        return self._generation

    def for_version(self, model: str, version: int) -> VersionMetrics:
        v = str(version)
        # Every request's outcome and duration, and every batch's size, reach the status window
        # through these children: the one place they are bound, whoever records them.
        feed = self.status.feed(model, v)
        outcomes = {o: self.requests.labels(model, v, o) for o in OUTCOMES}
        for name, child in outcomes.items():
            child.listener = feed.outcome_listener(name)
        request_seconds = self.request_seconds.labels(model, v)
        request_seconds.listener = feed.latency
        batch_size = self.batch_size.labels(model, v)
        batch_size.listener = feed.batch
        return VersionMetrics(
            metrics=self,
            model=model,
            version=v,
            outcomes=outcomes,
            request_seconds=request_seconds,
            queue_seconds=self.queue_seconds.labels(model, v),
            compute_seconds=self.compute_seconds.labels(model, v),
            batch_size=batch_size,
            executions=self.executions.labels(model, v),
            retries=self.retries.labels(model, v),
        )


@dataclass(frozen=True, slots=True)
class VersionMetrics:
    """The metric children of one model version, bound once so the hot path skips label lookups."""

    metrics: Metrics
    model: str
    version: str
    outcomes: dict[str, CounterChild]  # the children of the families (null children when metrics are off)
    request_seconds: HistogramChild
    queue_seconds: HistogramChild
    compute_seconds: HistogramChild
    batch_size: HistogramChild
    executions: CounterChild
    retries: CounterChild

    def outcome(self, name: str) -> None:
        self.outcomes[name].inc()

    def release(self, reason: str) -> None:
        self.metrics.batch_releases.labels(self.model, self.version, reason).inc()

    def queue_depth_gauges(self, levels: int) -> list[GaugeChild]:
        """One bound gauge per priority level (index 0 is level 1), for the scheduler to keep."""
        return [self.metrics.queue_depth.labels(self.model, self.version, str(level)) for level in range(1, levels + 1)]

    def inflight_gauges(self, levels: int) -> list[GaugeChild]:
        """One bound in-flight gauge per priority level (index 0 is level 1)."""
        return [self.metrics.inflight.labels(self.model, self.version, str(level)) for level in range(1, levels + 1)]

    def instance_health(self, instance: str, healthy: bool) -> None:
        self.metrics.instance_healthy.labels(self.model, self.version, instance).set(1 if healthy else 0)

    def track_worker(self, instance: str, pid: Callable[[], int | None]) -> None:
        """Report a worker process's CPU and memory under this version's labels."""
        self.metrics.workers.track((self.model, self.version, instance), pid)

    def untrack_worker(self, instance: str) -> None:
        self.metrics.workers.untrack((self.model, self.version, instance))

    def instance_probe(self, instance: str, ok: bool) -> None:
        self.metrics.instance_probes.labels(self.model, self.version, instance, "ok" if ok else "failed").inc()

    def sequence_started(self) -> None:
        self.metrics.sequences_open.labels(self.model, self.version).inc()

    def sequence_ended(self, reason: str) -> None:
        self.metrics.sequences_open.labels(self.model, self.version).dec()
        self.metrics.sequences_ended.labels(self.model, self.version, reason).inc()

    def hedged(self) -> None:
        self.metrics.hedged_batches.labels(self.model, self.version).inc()

    def hedge_won(self, side: str) -> None:
        self.metrics.hedge_wins.labels(self.model, self.version, side).inc()

    def instance_suspect(self, instance: str, suspect: bool) -> None:
        if suspect:
            self.metrics.suspect_batches.labels(self.model, self.version, instance).inc()
        self.metrics.instance_suspect.labels(self.model, self.version, instance).set(1 if suspect else 0)

    def instance_restart(self, instance: str) -> None:
        self.metrics.instance_restarts.labels(self.model, self.version, instance).inc()

    def responses_sent(self, count: int) -> None:
        """A decoupled request ended after ``count`` responses."""
        self.metrics.responses_per_request.labels(self.model, self.version).observe(count)

    def stream_cancelled(self) -> None:
        """A decoupled request was cancelled while its model held it."""
        self.metrics.stream_cancellations.labels(self.model, self.version).inc()
