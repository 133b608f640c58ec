"""router/telemetry/otel.py's `_Child`: a span under a sampled parent is made without the SDK's
`Span`, and what it exports is what the SDK's span would have exported (the same trace, parent,
resource, scope object, kind, links, status and valid attributes); under an unsampled parent the
SDK decides, so nothing is recorded."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from router.config import TelemetrySettings
from router.telemetry import spans as facade
from router.telemetry.setup import Tracing

SAMPLED = [(b"traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01")]
UNSAMPLED = [(b"traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-00")]


def traced(headers: list[tuple[bytes, bytes]]) -> tuple[InMemorySpanExporter, list[str | None]]:
    memory = InMemorySpanExporter()
    tracing = Tracing.to(memory, TelemetrySettings())
    tracing.install()
    parents: list[str | None] = []
    try:
        server = facade.server("POST /v1/chat/completions", headers, {"url.path": "/v1"})
        attempt = facade.start("chat small", server, attributes={"gen_ai.request.model": "small", "none": None})
        upstream = facade.start("POST example", attempt, kind="client", links=[server])
        parents.append(facade.traceparent(upstream))
        upstream.end()
        verify = facade.start("verify judge", attempt, attributes={"gen_ai.evaluation.name": "judge"})
        facade.fail(verify, RuntimeError("a message quoting 'the prompt'"))
        verify.set_attribute("after", 1)
        verify.end()
        verify.end()  # a second end exports nothing more
        verify.set_attribute("ended", True)
        attempt.set_attributes({"gen_ai.response.finish_reasons": ["stop"], "tierroute.cost_usd": 1e-6})
        attempt.end()
        server.end()
    finally:
        tracing.close()
    return memory, parents


def test_children_of_a_sampled_parent_export_as_the_sdk_would() -> None:
    memory, parents = traced(SAMPLED)
    found = {s.name: s for s in memory.get_finished_spans()}
    assert list(found) == ["POST example", "verify judge", "chat small", "POST /v1/chat/completions"]
    server, attempt = found["POST /v1/chat/completions"], found["chat small"]
    upstream, verify = found["POST example"], found["verify judge"]
    trace_id = int("1" * 32, 16)
    for span in found.values():
        assert span.context.trace_id == trace_id and span.context.trace_flags.sampled
        assert span.resource is server.resource and span.instrumentation_scope is server.instrumentation_scope
        assert span.start_time is not None and span.end_time is not None and span.start_time <= span.end_time
    assert len({s.context.span_id for s in found.values()}) == 4
    assert attempt.parent is not None and attempt.parent.span_id == server.context.span_id
    assert upstream.parent is not None and upstream.parent.span_id == attempt.context.span_id
    assert verify.parent is not None and verify.parent.span_id == attempt.context.span_id
    assert upstream.kind is SpanKind.CLIENT and attempt.kind is SpanKind.INTERNAL
    assert [link.context.span_id for link in upstream.links] == [server.context.span_id]
    assert parents == [f"00-{trace_id:032x}-{upstream.context.span_id:016x}-01"]
    assert dict(attempt.attributes or {}) == {
        "gen_ai.request.model": "small",
        "gen_ai.response.finish_reasons": ("stop",),
        "tierroute.cost_usd": 1e-6,
    }
    assert verify.status.status_code is StatusCode.ERROR
    assert dict(verify.attributes or {}) == {
        "gen_ai.evaluation.name": "judge",
        "error.type": "RuntimeError",
        "after": 1,
    }


def test_under_an_unsampled_parent_nothing_is_recorded_and_the_trace_goes_on() -> None:
    memory, parents = traced(UNSAMPLED)
    assert memory.get_finished_spans() == ()
    assert parents[0] is not None and parents[0].startswith("00-" + "1" * 32 + "-") and parents[0].endswith("-00")


def test_under_a_root_the_flags_are_what_an_sdk_child_would_carry() -> None:
    """No client traceparent: the server span is a root, whose flags the SDK sets (sampled, and
    on recent versions W3C level 2's random-trace-id bit); a child and the traceparent sent
    upstream keep them, as a child the SDK made would."""
    memory = InMemorySpanExporter()
    tracing = Tracing.to(memory, TelemetrySettings())
    tracing.install()
    try:
        server = facade.server("POST /v1/chat/completions", [], {})
        ours = facade.start("chat small", server)
        sdk = tracing.tracer.tracer.start_span("sdk child", context=trace.set_span_in_context(server))  # type: ignore[arg-type]
        sent = facade.traceparent(ours)
        for span in (ours, sdk, server):
            span.end()
    finally:
        tracing.close()
    root = server.get_span_context()  # type: ignore[attr-defined]
    assert ours.get_span_context().trace_flags == sdk.get_span_context().trace_flags == root.trace_flags  # type: ignore[attr-defined]
    assert sent is not None and sent.endswith(f"-{root.trace_flags:02x}")
    assert root.trace_flags.sampled
