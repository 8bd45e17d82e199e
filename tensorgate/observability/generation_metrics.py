"""Prometheus metrics for text generation, on the registry passed in (no global registry)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tensorgate.observability.buckets import LATENCY_BUCKETS
from tensorgate.observability.status_window import StatusWindows

TOKEN_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5)


class Incrementing(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class _TokenCounter:
    """The generated-tokens child, also telling the status window (tokens/s over the last seconds)."""

    __slots__ = ("_child", "_listener")

    def __init__(self, child: Counter, listener: Callable[[float], None]) -> None:
        self._child = child
        self._listener = listener

    def inc(self, amount: float = 1) -> None:
        self._child.inc(amount)
        self._listener(amount)


class GenerationMetrics:
    def __init__(self, registry: CollectorRegistry, status: StatusWindows | None = None) -> None:
        self._status = status
        mv = ["model", "version"]
        r = registry
        self.ttft = Histogram(
            "tensorgate_time_to_first_token_seconds",
            "Admission to the first token.",
            mv,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "tensorgate_time_per_output_token_seconds",
            "Mean time between output tokens of a request, after the first.",
            mv,
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "tensorgate_generation_duration_seconds",
            "Admission to the last token.",
            mv,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.running = Gauge("tensorgate_running_sequences", "Sequences in the running set.", mv, registry=r)
        self.waiting = Gauge("tensorgate_waiting_sequences", "Sequences waiting to run.", mv, registry=r)
        self.kv_usage = Gauge("tensorgate_kv_cache_usage_ratio", "Share of KV cache blocks in use.", mv, registry=r)
        self.preemptions = Counter("tensorgate_preemptions", "Sequences preempted for cache.", mv, registry=r)
        self.prompt_tokens = Counter("tensorgate_prompt_tokens", "Prompt tokens admitted.", mv, registry=r)
        self.generated_tokens = Counter("tensorgate_generation_tokens", "Tokens generated.", mv, registry=r)

    def for_version(self, model: str, version: int) -> VersionGenerationMetrics:
        v = str(version)
        generated: Incrementing = self.generated_tokens.labels(model, v)
        if self._status is not None:
            generated = _TokenCounter(self.generated_tokens.labels(model, v), self._status.feed(model, v).tokens)
        return VersionGenerationMetrics(
            ttft=self.ttft.labels(model, v),
            tpot=self.tpot.labels(model, v),
            e2e=self.e2e.labels(model, v),
            running=self.running.labels(model, v),
            waiting=self.waiting.labels(model, v),
            kv_usage=self.kv_usage.labels(model, v),
            preemptions=self.preemptions.labels(model, v),
            prompt_tokens=self.prompt_tokens.labels(model, v),
            generated_tokens=generated,
        )


@dataclass(frozen=True, slots=True)
class VersionGenerationMetrics:
    """The children of one model version, bound once."""

    ttft: Histogram
    tpot: Histogram
    e2e: Histogram
    running: Gauge
    waiting: Gauge
    kv_usage: Gauge
    preemptions: Counter
    prompt_tokens: Counter
    generated_tokens: Incrementing  # a Counter child (that may also feed the status window)
