"""W3C trace context through the request path, exported with OpenTelemetry when asked.

Where spans come from:

- ``request`` (a SERVER span): opened by the protocol layer (HTTP route, gRPC servicer) around one
  request, as a child of the client's ``traceparent`` when one came in;
- ``queue`` and ``compute``: children of the request span, reconstructed when the response comes
  back from its timings (``InferResponse.queue_s`` / ``compute_s``), so the scheduler needs no
  per-request hook;
- ``encode``: the protocol layer encoding the answer;
- ``batch`` (with ``tensorgate.batch_size``): one span per executed batch, opened by the scheduler
  through :meth:`Tracer.batch`; it is a child of the first request's span and links to every
  request it carries (a batch belongs to several traces).

Exporters: ``none`` (the default: :data:`NOOP_TRACER`, which imports nothing and creates no span
object: each hook is a method call on a shared singleton), ``console`` and ``otlp`` (needs
``opentelemetry-exporter-otlp``; configured by the standard ``OTEL_EXPORTER_OTLP_*`` variables).
Sampling is parent-based with a trace-id ratio for new traces, so a client's sampling decision
carried in ``traceparent`` is honoured.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any, Literal, Protocol

from tensorgate.errors import ConfigError, TensorgateError
from tensorgate.observability.trace_context import sampled
from tensorgate.types import InferRequest, InferResponse

TraceExporter = Literal["none", "console", "otlp"]
Attributes = Mapping[str, str | int | float | bool]


class RequestSpan(Protocol):
    """One request's span as the protocol layer sees it."""

    @property
    def traceparent(self) -> str | None:
        """This span's context as a ``traceparent`` to pass down the request path; None when not tracing."""
        ...

    def record(self, response: InferResponse) -> None:
        """Add the ``queue`` and ``compute`` child spans from the response's timings. Call once, right after
        ``infer`` returns: the spans end now."""
        ...

    def child(self, name: str) -> AbstractContextManager[None]:
        """A child span around a step of the protocol layer (``encode``)."""
        ...


class BatchSpan(Protocol):
    def end(self) -> None: ...


class Tracer(Protocol):
    """What the protocol layer and the scheduler call. Implementations never raise into the request path."""

    @property
    def enabled(self) -> bool: ...

    @property
    def sampled_only(self) -> bool:
        """True when only requests whose ``traceparent`` is marked sampled are traced (ratio 0): the
        callers then pass the others to :data:`NOOP_TRACER` without calling this tracer at all."""
        ...

    def request(
        self, name: str, traceparent: str | None, attributes: Attributes
    ) -> AbstractContextManager[RequestSpan]:
        """The SERVER span of one request. A :class:`TensorgateError` escaping the block is recorded on the
        span (an error status only for server faults: 5xx)."""
        ...

    def batch(self, requests: Iterable[InferRequest], rows: int) -> BatchSpan:
        """The span of one batch execution (the scheduler seam), started now and ended by the
        scheduler when the batch ends. Called on the event loop; must not block. ``requests`` is
        only iterated when tracing is on."""
        ...

    def shutdown(self) -> None:
        """Flush and stop the exporter (server shutdown, after the listeners closed)."""
        ...


_NULL: AbstractContextManager[None] = contextlib.nullcontext()  # reusable: entering it does nothing


class _Noop:
    """Tracer, request span and its context manager at once: exporter ``none`` allocates nothing per request."""

    enabled = False
    sampled_only = False

    @property
    def traceparent(self) -> str | None:
        return None

    def request(self, name: str, traceparent: str | None, attributes: Attributes) -> _Noop:
        return self

    def batch(self, requests: Iterable[InferRequest], rows: int) -> _Noop:
        return self

    def end(self) -> None:
        return None

    def child(self, name: str) -> AbstractContextManager[None]:
        return _NULL

    def record(self, response: InferResponse) -> None:
        return None

    def shutdown(self) -> None:
        return None

    def __enter__(self) -> _Noop:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None


_NOOP = _Noop()
NOOP_TRACER: Tracer = _NOOP
NOOP_BATCH: BatchSpan = _NOOP  # what a batch gets when it is not traced


class OtelTracer:
    """Spans through an OpenTelemetry SDK ``TracerProvider`` owned by this object (no global provider)."""

    enabled = True

    def __init__(self, provider: Any, sample_ratio: float = 1.0) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._provider = provider
        # Sampling off (ratio 0): only a client's sampled traceparent is traced. Every other request
        # skips the SDK, whose non-recording span would cost more than the rest of a small model's
        # request, and keeps the client's traceparent (if any) as it came.
        self.sampled_only = sample_ratio == 0.0
        self._trace = trace
        self._tracer = provider.get_tracer("tensorgate")
        self._propagator = TraceContextTextMapPropagator()

    def _parent(self, traceparent: str | None) -> Any:
        return self._propagator.extract({"traceparent": traceparent} if traceparent else {})

    def request(
        self, name: str, traceparent: str | None, attributes: Attributes
    ) -> AbstractContextManager[RequestSpan]:
        if self.sampled_only and not sampled(traceparent):
            return _NOOP
        return self._request(name, traceparent, attributes)

    @contextlib.contextmanager
    def _request(self, name: str, traceparent: str | None, attributes: Attributes) -> Iterator[RequestSpan]:
        span = self._tracer.start_span(
            name, context=self._parent(traceparent), kind=self._trace.SpanKind.SERVER, attributes=attributes
        )
        try:
            with self._trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
                yield _OtelRequestSpan(self, span)
        except TensorgateError as exc:
            span.set_attribute("tensorgate.error_code", exc.code.value)
            if exc.http_status >= 500:
                span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, exc.message))
            raise
        except BaseException as exc:  # cancelled, or a bug: both worth seeing in the trace
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, type(exc).__name__))
            raise
        finally:
            span.end()

    def child_span(self, parent: Any, name: str, start_ns: int | None = None) -> Any:
        return self._tracer.start_span(name, context=self._trace.set_span_in_context(parent), start_time=start_ns)

    def traceparent_of(self, span: Any) -> str | None:
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=self._trace.set_span_in_context(span))
        return carrier.get("traceparent")

    def batch(self, requests: Iterable[InferRequest], rows: int) -> BatchSpan:
        contexts = []
        for request in requests:
            if self.sampled_only and not sampled(request.traceparent):
                continue
            if request.traceparent:
                context = self._trace.get_current_span(self._parent(request.traceparent)).get_span_context()
                if context.is_valid:
                    contexts.append(context)
        if not contexts and self.sampled_only:
            return _NOOP
        parent = self._parent(None)
        if contexts:
            parent = self._trace.set_span_in_context(self._trace.NonRecordingSpan(contexts[0]))
        links = [self._trace.Link(c) for c in contexts]
        attributes = {"tensorgate.batch_size": rows, "tensorgate.batch_requests": len(contexts)}
        span: BatchSpan = self._tracer.start_span("batch", context=parent, links=links, attributes=attributes)
        return span

    def shutdown(self) -> None:
        self._provider.shutdown()


class _OtelRequestSpan:
    def __init__(self, tracer: OtelTracer, span: Any) -> None:
        self._tracer = tracer
        self._span = span

    @property
    def traceparent(self) -> str | None:
        return self._tracer.traceparent_of(self._span)

    def record(self, response: InferResponse) -> None:
        if not self._span.is_recording():
            return
        end = time.time_ns()
        compute_start = end - int(response.compute_s * 1e9)
        queue_start = compute_start - int(response.queue_s * 1e9)
        queue = self._tracer.child_span(self._span, "queue", queue_start)
        queue.end(end_time=compute_start)
        compute = self._tracer.child_span(self._span, "compute", compute_start)
        compute.set_attribute("tensorgate.model_version", response.version)
        compute.end(end_time=end)

    @contextlib.contextmanager
    def child(self, name: str) -> Iterator[None]:
        span = self._tracer.child_span(self._span, name)
        try:
            yield
        finally:
            span.end()


def build_tracer(exporter: TraceExporter, sample_ratio: float = 1.0, *, span_exporter: Any = None) -> Tracer:
    """The server's tracer. ``span_exporter`` (an SDK ``SpanExporter``) is for tests: spans go to it
    synchronously, whatever ``exporter`` says."""
    if exporter == "none" and span_exporter is None:
        return NOOP_TRACER
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    except ImportError as exc:
        raise ConfigError(
            f"trace_exporter '{exporter}' needs the OpenTelemetry SDK: pip install 'tensorgate[otel]'"
        ) from exc
    if not 0.0 <= sample_ratio <= 1.0:
        raise ConfigError(f"trace_sample_ratio must be between 0 and 1, got {sample_ratio}")
    provider = TracerProvider(
        sampler=ParentBased(TraceIdRatioBased(sample_ratio)),
        resource=Resource.create({"service.name": "tensorgate"}),
    )
    if span_exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    elif exporter == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    else:
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise ConfigError(
                "trace_exporter 'otlp' needs opentelemetry-exporter-otlp: pip install 'tensorgate[otel]'"
            ) from exc
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return OtelTracer(provider, sample_ratio)
