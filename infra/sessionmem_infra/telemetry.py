"""The ``memory.<op>`` spans every component emits, and tracer set-up.

A tracer provider is passed in explicitly (dependency injection) instead of being set globally, so
frameworks that instrument themselves when a global provider exists stay quiet: the spans we emit are
the ones we mean. Without ``OTEL_EXPORTER_OTLP_ENDPOINT`` nothing is exported and the tracer is a no-op.
"""

from __future__ import annotations

import os
import time
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from sessionmem_core import api, env
from sessionmem_core.errors import SessionMemError

_PROPAGATOR = TraceContextTextMapPropagator()

ATTR_SCOPE = "memory.scope"
ATTR_ENTRIES = "memory.entries"
ATTR_VERSION = "memory.version"
ATTR_OUTCOME = "memory.outcome"
ATTR_LATENCY_MS = "memory.latency_ms"
ATTR_CONVERSATION = "memory.conversation_id"
ATTR_COMPONENT = "memory.component"
# OpenTelemetry's GenAI semantic conventions (development status), set beside the ``memory.*`` names until
# they are stable: the conversation, and the operation where the conventions name a memory operation
# that fits (``api.MemoryOperation.genai``).
ATTR_GENAI_CONVERSATION = "gen_ai.conversation.id"
ATTR_GENAI_OPERATION = "gen_ai.operation.name"
_GENAI_OPERATIONS = {operation.op: operation.genai for operation in api.MEMORY_OPERATIONS if operation.genai}


def tracer_provider_from_env(service_name: str, environ: Mapping[str, str] | None = None) -> TracerProvider:
    environ = os.environ if environ is None else environ
    if not environ.get(env.OTEL_EXPORTER_OTLP_ENDPOINT):
        return trace.NoOpTracerProvider()
    # Imported here: the SDK and exporter cost start-up time and memory a pod without OTLP never needs.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = SdkTracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


def parent_context(traceparent: str | None, tracestate: str | None = None) -> Context | None:
    if not traceparent:
        return None
    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    return _PROPAGATOR.extract(carrier)


def inject_traceparent(headers: dict[str, str]) -> None:
    """Write the current span's context into outgoing headers."""
    _PROPAGATOR.inject(headers)


class MemorySpan:
    """Collects the attributes of one memory operation while it runs."""

    __slots__ = ("_span", "entries", "outcome", "scope", "version")

    def __init__(self, span: trace.Span) -> None:
        self._span = span
        self.scope: str | None = None
        self.entries: int | None = None
        self.version: int | None = None
        self.outcome: str | None = None

    def fail(self, outcome: str) -> None:
        """Mark an operation failed that returned an error answer instead of raising one."""
        self.outcome = outcome
        self._span.set_status(Status(StatusCode.ERROR, outcome))

    def set(self, key: str, value: Any) -> None:
        self._span.set_attribute(key, value)


class _UnrecordedSpan(AbstractContextManager[MemorySpan]):
    """The span of a tracer that exports nothing: attributes are collected and dropped."""

    __slots__ = ()

    def __enter__(self) -> MemorySpan:
        return MemorySpan(trace.INVALID_SPAN)

    def __exit__(self, *exc_info: object) -> None:
        return None


_UNRECORDED = _UnrecordedSpan()


class MemoryTracer:
    def __init__(self, provider: TracerProvider, component: str) -> None:
        self._tracer: Tracer = provider.get_tracer("sessionmem")
        self._component = component
        self.recording = not isinstance(provider, trace.NoOpTracerProvider)

    def span(
        self, op: str, conversation_id: str, traceparent: str | None, tracestate: str | None = None
    ) -> AbstractContextManager[MemorySpan]:
        if not self.recording:
            # No exporter: skip the OpenTelemetry context machinery, and a generator's, on the hot path.
            return _UNRECORDED
        return self._recorded_span(op, conversation_id, traceparent, tracestate)

    @contextmanager
    def _recorded_span(
        self, op: str, conversation_id: str, traceparent: str | None, tracestate: str | None
    ) -> Iterator[MemorySpan]:
        started = time.perf_counter()
        with self._tracer.start_as_current_span(
            f"memory.{op}",
            context=parent_context(traceparent, tracestate),
            kind=SpanKind.SERVER,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            memory_span = MemorySpan(span)
            outcome = "ok"
            try:
                yield memory_span
            except SessionMemError as exc:
                outcome = exc.error_type
                span.set_status(Status(StatusCode.ERROR, exc.message))
                raise
            except BaseException as exc:
                outcome = "internal"
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                raise
            finally:
                if span.is_recording():
                    span.set_attribute(ATTR_COMPONENT, self._component)
                    span.set_attribute(ATTR_CONVERSATION, conversation_id)
                    if conversation_id:
                        span.set_attribute(ATTR_GENAI_CONVERSATION, conversation_id)
                    genai = _GENAI_OPERATIONS.get(op)
                    if genai is not None:
                        span.set_attribute(ATTR_GENAI_OPERATION, genai)
                    span.set_attribute(ATTR_OUTCOME, memory_span.outcome or outcome)
                    span.set_attribute(ATTR_LATENCY_MS, (time.perf_counter() - started) * 1000.0)
                    if memory_span.scope is not None:
                        span.set_attribute(ATTR_SCOPE, memory_span.scope)
                    if memory_span.entries is not None:
                        span.set_attribute(ATTR_ENTRIES, memory_span.entries)
                    if memory_span.version is not None:
                        span.set_attribute(ATTR_VERSION, memory_span.version)


# --- Prometheus text exposition of the proxy's request counters and latencies (no client library needed
# for a handful of series).

_BUCKETS_MS = (0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 1000.0)


class ProxyMetrics:
    def __init__(self) -> None:
        self._requests: dict[tuple[str, str], int] = defaultdict(int)
        self._latency_buckets: dict[str, list[int]] = defaultdict(lambda: [0] * (len(_BUCKETS_MS) + 1))
        self._latency_sum_ms: dict[str, float] = defaultdict(float)

    def observe(self, op: str, outcome: str, latency_ms: float) -> None:
        self._requests[(op, outcome)] += 1
        # The first bucket whose bound is at least the latency; past the last bound, the overflow bucket.
        self._latency_buckets[op][bisect_left(_BUCKETS_MS, latency_ms)] += 1
        self._latency_sum_ms[op] += latency_ms

    def render(self, token_reviews: Mapping[str, Mapping[str, int]] | None = None) -> str:
        """``token_reviews``: TokenReview calls by who was being identified (``agent``, ``admin``), then by
        result (``authenticated``, ``rejected``, ``unavailable``)."""
        lines = [
            "# HELP sessionmem_proxy_requests_total Memory operations served, by operation and outcome.",
            "# TYPE sessionmem_proxy_requests_total counter",
        ]
        for (op, outcome), count in sorted(self._requests.items()):
            lines.append(f'sessionmem_proxy_requests_total{{op="{op}",outcome="{outcome}"}} {count}')
        lines += [
            "# HELP sessionmem_proxy_latency_ms Memory operation latency in milliseconds.",
            "# TYPE sessionmem_proxy_latency_ms histogram",
        ]
        for op, buckets in sorted(self._latency_buckets.items()):
            cumulative = 0
            for bound, count in zip((*_BUCKETS_MS, float("inf")), buckets, strict=True):
                cumulative += count
                le = "+Inf" if bound == float("inf") else repr(bound)
                lines.append(f'sessionmem_proxy_latency_ms_bucket{{op="{op}",le="{le}"}} {cumulative}')
            lines.append(f'sessionmem_proxy_latency_ms_sum{{op="{op}"}} {self._latency_sum_ms[op]:.3f}')
            lines.append(f'sessionmem_proxy_latency_ms_count{{op="{op}"}} {cumulative}')
        lines += [
            "# HELP sessionmem_proxy_token_reviews_total TokenReview calls to the API server, by caller and result.",
            "# TYPE sessionmem_proxy_token_reviews_total counter",
        ]
        for kind, results in sorted((token_reviews or {}).items()):
            for result, count in sorted(results.items()):
                lines.append(f'sessionmem_proxy_token_reviews_total{{kind="{kind}",result="{result}"}} {count}')
        return "\n".join(lines) + "\n"
