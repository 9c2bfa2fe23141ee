"""W3C trace context, and OpenTelemetry spans when (and only when) an OTLP endpoint is configured.

OpenTelemetry is an optional dependency (`pip install execbox[otel]`): without an endpoint, or
without the package, spans are not recorded and nothing leaves the host.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)
_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


@dataclass(frozen=True)
class TraceContext:
    trace_id: str
    span_id: str
    flags: str = "01"

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"

    def child(self) -> TraceContext:
        return TraceContext(self.trace_id, secrets.token_hex(8), self.flags)


def parse_traceparent(header: str | None) -> TraceContext | None:
    """The context exactly as given (its own span id), or None when absent or malformed."""
    match = _TRACEPARENT.match((header or "").strip().lower())
    if match and set(match.group(1)) != {"0"} and set(match.group(2)) != {"0"}:
        return TraceContext(match.group(1), match.group(2), match.group(3))
    return None


def from_traceparent(header: str | None) -> TraceContext:
    """Continue the caller's trace with a span of our own; an absent or malformed header (per W3C)
    starts a new trace."""
    caller = parse_traceparent(header)
    return caller.child() if caller else TraceContext(secrets.token_hex(16), secrets.token_hex(8))


class Spans:
    """Records spans under a given trace context; a no-op unless set up with an endpoint."""

    def __init__(self, tracer: Any = None) -> None:
        self._tracer = tracer

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    @contextmanager
    def span(self, name: str, parent: TraceContext, attributes: Mapping[str, str | int | float] | None = None,
             start_ns: int | None = None) -> Iterator[Any]:  # fmt: skip
        if self._tracer is None:
            yield None
            return
        with self._tracer.start_as_current_span(
            name, context=_context(parent), attributes=dict(attributes or {}), start_time=start_ns
        ) as span:
            yield span

    def record(self, name: str, parent: TraceContext, start_ns: int, end_ns: int,
               attributes: Mapping[str, str | int | float] | None = None) -> None:  # fmt: skip
        """A span for a phase already over (queue wait, sandbox start, run, collect)."""
        if self._tracer is None:
            return
        span = self._tracer.start_span(name, context=_context(parent), attributes=dict(attributes or {}),
                                       start_time=start_ns)  # fmt: skip
        span.end(end_time=end_ns)

    def shutdown(self) -> None:
        if self._tracer is not None:
            from opentelemetry import trace

            provider = trace.get_tracer_provider()
            if hasattr(provider, "force_flush"):
                provider.force_flush()


def _context(parent: TraceContext) -> Any:
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    remote = SpanContext(
        trace_id=int(parent.trace_id, 16),
        span_id=int(parent.span_id, 16),
        is_remote=True,
        trace_flags=TraceFlags(int(parent.flags, 16)),
    )
    return trace.set_span_in_context(NonRecordingSpan(remote))


def setup(endpoint: str | None, service_name: str) -> Spans:
    """Spans exported over OTLP/HTTP to endpoint; a no-op Spans when unset or unavailable."""
    if not endpoint:
        return Spans()
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("an OTLP endpoint is set but OpenTelemetry is not installed (pip install execbox[otel]); "
                    "no spans are exported")  # fmt: skip
        return Spans()
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint), schedule_delay_millis=200))
    trace.set_tracer_provider(provider)
    return Spans(trace.get_tracer("execbox"))
