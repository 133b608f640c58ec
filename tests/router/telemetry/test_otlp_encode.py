"""router/telemetry/otlp_encode.py writes what OpenTelemetry's own encoder writes: both outputs,
parsed by opentelemetry-proto, are the same `ExportTraceServiceRequest`, for spans with every kind
of attribute value, events, links, a remote parent, a trace state, an error status, and spans of
two resources and two scopes; an attribute value it cannot encode is left out, the rest kept. The
service's OTLP exporter sends it (tests/router/telemetry/test_otlp_export.py: a live receiver)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as otel_encode
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from router.config import TelemetrySettings
from router.telemetry.otlp_encode import encode_spans
from router.telemetry.setup import Tracing

VALUES: dict[str, Any] = {
    "text": "chat small",
    "empty": "",
    "unicode": "naïve — 漢字 🚀",
    "yes": True,
    "no": False,
    "zero": 0,
    "int": 68,
    "negative": -5,
    "big": 2**63 - 1,
    "smallest": -(2**63),
    "float": 0.000825837434,
    "float_zero": 0.0,
    "neg_float": -1.5,
    "texts": ["small", "large"],
    "ints": [1, 2, 300],
    "bools": [True, False],
    "floats": [0.5, 2.0],
    "empty_list": [],
}


def finished(provider_spans: list[tuple[TracerProvider, InMemorySpanExporter]]) -> list[ReadableSpan]:
    return [s for _, memory in provider_spans for s in memory.get_finished_spans()]


def pipeline(resource: dict[str, Any]) -> tuple[TracerProvider, InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create(resource))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return provider, memory


def same(spans: Sequence[ReadableSpan]) -> None:
    theirs, ours = ExportTraceServiceRequest(), ExportTraceServiceRequest()
    theirs.ParseFromString(otel_encode(spans).SerializePartialToString())
    ours.ParseFromString(encode_spans(spans))
    assert ours == theirs


def test_every_field_and_value_as_opentelemetry_encodes_them() -> None:
    first, second = pipeline({"service.name": "tierroute-a"}), pipeline({"service.name": "b", "n": 2})
    tracer = first[0].get_tracer("tierroute", "1.2.3")
    remote = SpanContext(
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
        is_remote=True,
        trace_flags=TraceFlags(1),
        trace_state=TraceState([("vendor", "x1"), ("other", "y")]),
    )
    server = tracer.start_span(
        "POST /v1/chat/completions",
        context=trace.set_span_in_context(NonRecordingSpan(remote)),
        kind=SpanKind.SERVER,
        attributes=VALUES,
    )
    child = tracer.start_span(
        "chat small",
        context=trace.set_span_in_context(server),
        links=[Link(remote, {"why": "shadowed"}), Link(server.get_span_context())],
    )
    child.add_event("first token", {"tokens": 1})
    child.add_event("")
    child.set_status(Status(StatusCode.ERROR, "upstream failed"))
    child.end()
    server.set_status(Status(StatusCode.OK))
    server.end()
    other_scope = first[0].get_tracer("another", schema_url="https://opentelemetry.io/schemas/1.21.0")
    other_scope.start_span("", kind=SpanKind.CLIENT).end()
    for kind in (SpanKind.PRODUCER, SpanKind.CONSUMER):
        second[0].get_tracer("x").start_span("queue", kind=kind).end()
    spans = finished([first, second])
    assert len(spans) == 5
    same(spans)
    same(spans[:1])
    same([])


def test_the_service_spans_as_exported() -> None:
    """The spans a request makes, through the service's own tracer (`Tracing`)."""
    from router.telemetry import spans as facade

    memory = InMemorySpanExporter()
    tracing = Tracing.to(memory, TelemetrySettings())
    tracing.install()
    try:
        server = facade.server(
            "POST /v1/chat/completions",
            [(b"traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01")],
            {"url.path": "/v1"},
        )
        attempt = facade.start("chat small", server, attributes={"gen_ai.request.model": "small"})
        facade.start("verify confidence", attempt, attributes={"gen_ai.evaluation.score.value": 0.5}).end()
        attempt.set_attributes({"gen_ai.response.finish_reasons": ["stop"], "tierroute.cost_usd": 1e-6})
        attempt.end()
        server.end()
    finally:
        tracing.close()
    same(memory.get_finished_spans())


@pytest.mark.parametrize("bad", [2**63, -(2**63) - 1, object()])
def test_a_value_it_cannot_encode_is_left_out(bad: Any, caplog: pytest.LogCaptureFixture) -> None:
    provider, memory = pipeline({"service.name": "x"})
    span = provider.get_tracer("t").start_span("s", attributes={"kept": 1})
    span._attributes._dict["bad"] = bad  # past the SDK's checks, as a span another SDK version let through
    span.end()
    request = ExportTraceServiceRequest()
    with caplog.at_level(logging.WARNING, logger="router.telemetry.otlp_encode"):
        request.ParseFromString(encode_spans(memory.get_finished_spans()))
    (exported,) = request.resource_spans[0].scope_spans[0].spans
    assert [kv.key for kv in exported.attributes] == ["kept"]
    assert "bad" in caplog.text


def test_the_service_exporter_takes_this_path() -> None:
    """The OTLP exporter finds the HTTP client it sends through: with another OpenTelemetry
    version it would still work, encoding the slow way, and this test says so."""
    from router.telemetry.otel import OtlpExporter

    tracing = Tracing.otlp(TelemetrySettings(endpoint="http://127.0.0.1:9"))
    try:
        assert isinstance(tracing.exporter, OtlpExporter)
        assert getattr(tracing.exporter, "_client", None) is not None
    finally:
        tracing.close()
