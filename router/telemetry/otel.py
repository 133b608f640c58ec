"""The installed tracer: OpenTelemetry's SDK behind the facade of `router.telemetry.spans`.

Imported only when tracing is configured (`router.telemetry.setup`), so an unconfigured service
never loads the SDK. The tracer provider is this object's own, not OpenTelemetry's global one: a
library in the same process that traces through the global API is not exported by accident, and
tests can run an app with an in-memory exporter beside another.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from router.telemetry.otlp_encode import encode_spans
from router.telemetry.spans import Kind, Span

_KINDS = {"internal": SpanKind.INTERNAL, "server": SpanKind.SERVER, "client": SpanKind.CLIENT}
_PROPAGATOR = TraceContextTextMapPropagator()
# OpenTelemetry warns of every malformed traceparent or tracestate a client sends, quoting the
# tracestate member as sent: a log line per request, in words and bytes of the client's choosing.
# These two loggers speak only of that input, which the spec says to ignore, so they are quieted.
_CLIENT_INPUT_LOGGERS = ("opentelemetry.trace.propagation.tracecontext", "opentelemetry.trace.span")


class OtlpExporter(OTLPSpanExporter):
    """OpenTelemetry's OTLP/HTTP exporter (endpoint, headers, compression, retries, timeout as it
    reads them) sending what `router.telemetry.otlp_encode` writes: the same request, for about a
    quarter of the CPU its own encoder takes on the batch thread. An exporter version without the
    HTTP client this relies on (its `_client`, as in 1.45) encodes as it always did."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        client = getattr(self, "_client", None)
        if client is None or getattr(self, "_shutdown", True):
            return super().export(spans)
        try:
            data = encode_spans(spans)
        except Exception:  # noqa: BLE001 - as OpenTelemetry's exporter: a batch that cannot be encoded is dropped
            logging.getLogger(__name__).exception("a span batch could not be encoded; dropped")
            return SpanExportResult.FAILURE
        limit = getattr(self, "_max_request_size", 0) or 0
        if 0 < limit < len(data):
            logging.getLogger(__name__).warning("a span batch of %d bytes is over max_request_size; dropped", len(data))
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS if client.export(data).success else SpanExportResult.FAILURE


class _Child(trace.Span):
    """A span under a sampled parent of this process, made and ended without the SDK's `Span`.

    The SDK's `start_span` asks the sampler, builds locked attribute maps and span limits, and
    looks up the current context: about three quarters of tracing's cost per request, four spans in
    five. Under a sampled parent the parent-based sampler's answer is known (sampled), and a span
    of ours is set from one thread, with a handful of attributes our code chose. So a child is this
    plain object, and its end hands the SDK's own `ReadableSpan` (what `Span.end` hands on) to the
    same span processor, exporter and resource: the export is the same. Roots, and children of an
    unsampled or remote-only parent, are the SDK's (`OtelTracer.start`). Every sampler
    OpenTelemetry names for OTEL_TRACES_SAMPLER samples the child of a sampled span of its own
    trace (parent-based ones by the parent; `always_on`; `traceidratio` decides by the trace id
    alone); a custom sampler plugged in by entry point is not asked about children. Attribute
    values are kept as the SDK keeps valid ones (None is dropped, a list becomes a tuple)."""

    __slots__ = (
        "_owner",
        "_name",
        "_context",
        "_parent",
        "_kind",
        "_attributes",
        "_links",
        "_start",
        "_status",
        "_events",
        "_ended",
    )

    def __init__(
        self,
        owner: OtelTracer,
        name: str,
        parent: SpanContext,
        kind: SpanKind,
        attributes: Mapping[str, Any] | None,
        links: Sequence[Link],
    ) -> None:
        self._owner = owner
        self._name = name
        # the parent's flags, as the SDK's parent-based sampling gives a child: sampled, and a
        # root's "random trace id" bit (W3C trace context level 2) kept for upstreams to read
        self._context = SpanContext(
            parent.trace_id,
            owner.new_span_id(),
            is_remote=False,
            trace_flags=parent.trace_flags,
            trace_state=parent.trace_state,
        )
        self._parent = parent
        self._kind = kind
        self._attributes: dict[str, Any] = {}
        self._links = tuple(links)
        self._status = Status(StatusCode.UNSET)
        self._events: list[Event] = []
        self._ended = False
        if attributes:
            self.set_attributes(attributes)
        self._start = time.time_ns()

    def get_span_context(self) -> SpanContext:
        return self._context

    def set_attribute(self, key: str, value: Any) -> None:
        if self._ended or value is None:
            return
        self._attributes[key] = tuple(value) if isinstance(value, list) else value

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        for key, value in attributes.items():
            self.set_attribute(key, value)

    def add_event(self, name: str, attributes: Any = None, timestamp: int | None = None) -> None:
        if not self._ended:
            self._events.append(Event(name, attributes, timestamp or time.time_ns()))

    def add_link(self, context: SpanContext, attributes: Any = None) -> None:
        if not self._ended:
            self._links += (Link(context, attributes),)

    def update_name(self, name: str) -> None:
        if not self._ended:
            self._name = name

    def is_recording(self) -> bool:
        return not self._ended

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        if not self._ended:
            self._status = status if isinstance(status, Status) else Status(status, description)

    def record_exception(
        self, exception: BaseException, attributes: Any = None, timestamp: int | None = None, escaped: bool = False
    ) -> None:
        # the type only: a message may quote client input (`spans.fail`)
        self.add_event("exception", {"exception.type": type(exception).__name__}, timestamp)

    def end(self, end_time: int | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        owner = self._owner
        owner.processor.on_end(
            ReadableSpan(
                self._name,
                context=self._context,
                parent=self._parent,
                resource=owner.provider.resource,
                attributes=self._attributes,
                events=tuple(self._events),
                links=self._links,
                kind=self._kind,
                status=self._status,
                start_time=self._start,
                end_time=end_time or time.time_ns(),
                instrumentation_scope=owner.scope,
            )
        )


class OtelTracer:
    """Spans from `provider`, parented explicitly; W3C trace context in and out. `processor` is
    the one span processor added to `provider` (its children end into it: `_Child`)."""

    def __init__(self, provider: TracerProvider, processor: SpanProcessor) -> None:
        self.provider = provider
        self.processor = processor
        self.tracer = provider.get_tracer("tierroute")
        scope = getattr(self.tracer, "_instrumentation_scope", None)
        self.scope = scope if isinstance(scope, InstrumentationScope) else InstrumentationScope("tierroute")
        self.new_span_id = provider.id_generator.generate_span_id
        for name in _CLIENT_INPUT_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)

    def start(
        self, name: str, parent: Span | None, kind: Kind, attributes: Mapping[str, Any] | None, links: Sequence[Span]
    ) -> Span:
        found = [Link(s.get_span_context()) for s in links if isinstance(s, trace.Span)]
        if isinstance(parent, trace.Span):
            under = parent.get_span_context()
            if under.is_valid and under.trace_flags.sampled:
                return _Child(self, name, under, _KINDS[kind], attributes, found)
        context = trace.set_span_in_context(parent) if isinstance(parent, trace.Span) else None
        span: Span = self.tracer.start_span(
            name, context=context, kind=_KINDS[kind], attributes=attributes, links=found or None
        )
        return span

    def server(self, name: str, headers: Iterable[tuple[bytes, bytes]], attributes: Mapping[str, Any]) -> Span:
        found: dict[str, list[str]] = {"traceparent": [], "tracestate": []}
        for k, v in headers:
            if k in (b"traceparent", b"tracestate"):
                found[k.decode("latin-1")].append(v.decode("latin-1"))
        # an absent, malformed or repeated traceparent gives an empty context: a new trace, as the
        # spec says (two of them name two parents, and neither may be chosen); repeated tracestate
        # headers are one list, their entries combined in order (RFC 9110, section 5.3)
        carrier = {k: v for k, v in found.items() if v}
        context = _PROPAGATOR.extract(carrier) if len(found["traceparent"]) == 1 else None
        span: Span = self.tracer.start_span(name, context=context, kind=SpanKind.SERVER, attributes=attributes)
        return span

    def fail(self, span: Span, exc: BaseException) -> None:
        if isinstance(span, trace.Span):
            span.set_attribute("error.type", type(exc).__name__)
            span.set_status(Status(StatusCode.ERROR))

    def traceparent(self, span: Span) -> str | None:
        if not isinstance(span, trace.Span):
            return None
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        return carrier.get("traceparent")
