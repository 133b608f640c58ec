"""The installed tracer: OpenTelemetry's SDK behind the facade of `router.telemetry.spans`.

Imported only when tracing is configured (`router.telemetry.setup`), so an unconfigured service
never loads the SDK. The tracer provider is this object's own, not OpenTelemetry's global one: a
library in the same process that traces through the global API is not exported by accident, and
tests can run an app with an in-memory exporter beside another.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
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


class OtelTracer:
    """Spans from `provider`, parented explicitly; W3C trace context in and out."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("tierroute")
        for name in _CLIENT_INPUT_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)

    def start(
        self, name: str, parent: Span | None, kind: Kind, attributes: Mapping[str, Any] | None, links: Sequence[Span]
    ) -> Span:
        context = trace.set_span_in_context(parent) if isinstance(parent, trace.Span) else None
        found = [Link(s.get_span_context()) for s in links if isinstance(s, trace.Span)]
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
