"""From outside, a client's W3C trace context as a hostile client sends it: every form the spec
says to refuse starts a new trace (and the upstream never sees the client's ids), a traceparent
sent twice is refused rather than one of them chosen, repeated tracestate headers are one list,
and an unsampled traceparent is carried to the upstream as the client's trace, not replaced by a
new sampled one. Neither tracestate nor baggage is passed upstream."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from router.telemetry.setup import Tracing
from tests.support.accounting import ESCALATE_ON_MARK, chat, running
from tests.support.fault_upstream import FaultUpstream
from tests.support.telemetry import config

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"

# each refused by the spec (W3C Trace Context, section 3.2 and its test suite): a new trace
REFUSED: dict[str, list[tuple[str, str]]] = {
    "uppercase hex": [("traceparent", f"00-{TRACE.upper()}-{SPAN}-01")],
    "all-zero trace id": [("traceparent", f"00-{'0' * 32}-{SPAN}-01")],
    "all-zero parent id": [("traceparent", f"00-{TRACE}-{'0' * 16}-01")],
    "version ff": [("traceparent", f"ff-{TRACE}-{SPAN}-01")],
    "version 00 with trailing data": [("traceparent", f"00-{TRACE}-{SPAN}-01-extra")],
    "over 512 characters": [("traceparent", f"00-{TRACE}-{SPAN}-01" + " " * 600)],
    "sent twice": [("traceparent", f"00-{'a' * 32}-{SPAN}-01"), ("traceparent", f"00-{TRACE}-{SPAN}-01")],
}


@pytest.fixture(scope="module")
def upstream() -> Iterator[FaultUpstream]:
    with FaultUpstream() as up:
        yield up


@pytest.fixture
def cfg(tmp_path: Path, upstream: FaultUpstream) -> Path:
    return config(tmp_path, upstream.base_url, server="allow_unauthenticated = true", small_verifiers=ESCALATE_ON_MARK)


def server_span(found: tuple[ReadableSpan, ...], request_id: str) -> ReadableSpan:
    (span,) = [
        s
        for s in found
        if s.kind is SpanKind.SERVER and s.attributes and s.attributes["tierroute.request_id"] == request_id
    ]
    return span


def trace_of(span: ReadableSpan) -> str:
    assert span.context is not None
    return f"{span.context.trace_id:032x}"


async def test_every_refused_traceparent_starts_a_new_trace_the_upstream_never_sees(
    cfg: Path, upstream: FaultUpstream
) -> None:
    exporter = InMemorySpanExporter()
    ids: dict[str, str] = {}
    sent: dict[str, list[str | None]] = {}
    async with running(cfg, tracing=Tracing.to(exporter)) as client:
        for case, headers in REFUSED.items():
            before = len(upstream.requests)
            r = await client.post("/v1/chat/completions", json=chat("hello"), headers=headers)
            assert r.status_code == 200, (case, r.text)
            ids[case] = r.json()["id"]
            sent[case] = [q.headers.get("traceparent") for q in upstream.requests[before:]]
    found = exporter.get_finished_spans()
    for case, rid in ids.items():
        span = server_span(found, rid)
        assert span.parent is None, case  # a root: no client parent chosen
        assert trace_of(span) not in (TRACE, "a" * 32), case
        assert sent[case] and all(tp is not None and TRACE not in tp and "a" * 32 not in tp for tp in sent[case]), case


async def test_tracestate_headers_are_one_list_and_neither_it_nor_baggage_goes_upstream(
    cfg: Path, upstream: FaultUpstream
) -> None:
    exporter = InMemorySpanExporter()
    headers = [
        ("traceparent", f"00-{TRACE}-{SPAN}-01"),
        ("tracestate", "vendora=1"),
        ("tracestate", "vendorb=2"),
        ("baggage", "user=admin,tenant=other"),
    ]
    async with running(cfg, tracing=Tracing.to(exporter)) as client:
        before = len(upstream.requests)
        r = await client.post("/v1/chat/completions", json=chat("hello"), headers=headers)
    assert r.status_code == 200
    span = server_span(exporter.get_finished_spans(), r.json()["id"])
    assert trace_of(span) == TRACE
    assert span.context is not None and dict(span.context.trace_state) == {"vendora": "1", "vendorb": "2"}
    for q in upstream.requests[before:]:
        assert q.headers["traceparent"].startswith(f"00-{TRACE}-")
        assert "tracestate" not in q.headers and "baggage" not in q.headers


async def test_an_unsampled_client_trace_reaches_the_upstream_as_itself(cfg: Path, upstream: FaultUpstream) -> None:
    """The client asked not to record (flags 00): nothing is exported, and the upstream is told
    the client's trace, unsampled; not a new sampled trace of the router's own."""
    exporter = InMemorySpanExporter()
    async with running(cfg, tracing=Tracing.to(exporter)) as client:
        before = len(upstream.requests)
        r = await client.post(
            "/v1/chat/completions", json=chat("hello"), headers={"traceparent": f"00-{TRACE}-{SPAN}-00"}
        )
    assert r.status_code == 200
    sent = [q.headers.get("traceparent") for q in upstream.requests[before:]]
    assert sent and all(tp is not None and tp.startswith(f"00-{TRACE}-") and tp.endswith("-00") for tp in sent), sent
    assert [s.name for s in exporter.get_finished_spans()] == []


async def test_a_malformed_trace_context_writes_no_log_line(cfg: Path, caplog: pytest.LogCaptureFixture) -> None:
    """OpenTelemetry warns of each malformed header, quoting a tracestate member as sent: a
    client could write a line per request into the service's log, in words (and bytes) of its
    choosing. The header is refused silently, as the spec asks."""
    exporter = InMemorySpanExporter()
    parent = (b"traceparent", f"00-{TRACE}-{SPAN}-01".encode())
    sent: list[list[tuple[bytes, bytes]]] = [
        [(b"traceparent", parent[1] + b" " * 600)],
        [parent, (b"tracestate", b"forged log line \x85\x9b[2J")],  # obs-text bytes, as HTTP allows
        [parent, (b"tracestate", b"k=" + b"v" * 600)],
        [parent, (b"tracestate", b",".join(b"k%d=v" % i for i in range(40)))],
    ]
    with caplog.at_level(logging.INFO):
        async with running(cfg, tracing=Tracing.to(exporter)) as client:
            for headers in sent:
                r = await client.post("/v1/chat/completions", json=chat("hello"), headers=headers)
                assert r.status_code == 200
    # (other OpenTelemetry loggers, the exporter's, speak of the collector, not of the client)
    propagation = ("opentelemetry.trace.propagation.tracecontext", "opentelemetry.trace.span")
    assert [(r.name, r.getMessage()) for r in caplog.records if r.name in propagation] == []
