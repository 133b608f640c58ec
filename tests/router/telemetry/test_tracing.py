"""Traces of a request through two OpenAI-compatible tiers on a scripted upstream, read from the
SDK's in-memory exporter: one trace per request, a span for each tier attempt, verifier, decision,
upstream call and the ledger write, the client's `traceparent` kept and passed upstream, and the
same request id in the response, the span and the ledger."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from router.config import TelemetrySettings
from router.telemetry import setup, spans
from router.telemetry.setup import Tracing
from tests.support.accounting import ESCALATE_ON_MARK, MARK, chat, read_ledger, running, tierroute_of
from tests.support.fault_upstream import FaultUpstream, ok, status
from tests.support.telemetry import config

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"


@pytest.fixture(scope="module")
def upstream() -> Iterator[FaultUpstream]:
    with FaultUpstream() as up:
        yield up


@pytest.fixture
def cfg(tmp_path: Path, upstream: FaultUpstream) -> Path:
    return config(tmp_path, upstream.base_url, server="allow_unauthenticated = true", small_verifiers=ESCALATE_ON_MARK)


def by_name(found: list[ReadableSpan]) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for s in found:
        out.setdefault(s.name, []).append(s)
    return out


def hexid(span: ReadableSpan) -> tuple[str, str]:
    assert span.context is not None
    return f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}"


def parent_of(span: ReadableSpan) -> str | None:
    return None if span.parent is None else f"{span.parent.span_id:016x}"


async def test_one_trace_covers_every_tier_verifier_upstream_call_and_the_ledger_write(
    cfg: Path, upstream: FaultUpstream
) -> None:
    exporter = InMemorySpanExporter()
    sent_before = len(upstream.requests)
    async with running(cfg, tracing=Tracing.to(exporter)) as client:
        r = await client.post(
            "/v1/chat/completions", json=chat(f"{MARK} what is 2+2?"), headers={"traceparent": TRACEPARENT}
        )
        assert r.status_code == 200, r.text
    rid = r.json()["id"]
    ext = tierroute_of(r.text, stream=False)
    assert ext is not None and ext["tier"] == "large" and ext["escalated"]
    found = exporter.get_finished_spans()
    named = by_name(list(found))

    # one trace, the client's: every span in it, the server span a child of the client's span
    assert {hexid(s)[0] for s in found} == {CLIENT_TRACE}
    (server,) = named["POST /v1/chat/completions"]
    assert parent_of(server) == CLIENT_SPAN
    server_id = hexid(server)[1]
    # the same request id in the response, the span and the ledger
    assert server.attributes is not None and server.attributes["tierroute.request_id"] == rid
    assert rid in read_ledger(cfg.parent / "ledger.sqlite3")
    assert server.attributes["http.response.status_code"] == 200
    assert server.attributes["tierroute.final_tier"] == "large"
    assert list(server.attributes["tierroute.tiers_tried"]) == ["small", "large"]  # type: ignore[arg-type]

    # a span per tier attempt, under the request's, with the tokens and cost the client was told
    attempts = {a["tier"]: a for a in ext["attempts"]}
    for tier in ("small", "large"):
        (span,) = named[f"chat {tier}"]
        a = span.attributes
        assert a is not None and parent_of(span) == server_id
        assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == tier
        assert a["gen_ai.usage.input_tokens"] == attempts[tier]["prompt_tokens"]
        assert a["gen_ai.usage.output_tokens"] == attempts[tier]["completion_tokens"]
        assert a["tierroute.cost_usd"] == pytest.approx(attempts[tier]["cost_usd"])
        assert a["tierroute.verifier_cost_usd"] == pytest.approx(attempts[tier]["verifier_cost_usd"])
        assert a["tierroute.accepted"] == attempts[tier]["accepted"]
        assert a["tierroute.threshold"] == attempts[tier]["threshold"]
    small_id = hexid(named["chat small"][0])[1]
    large_id = hexid(named["chat large"][0])[1]

    # the small tier's verifier, with its score and cost, under its attempt
    (verify,) = named["verify escalate_marked"]
    assert parent_of(verify) == small_id
    assert verify.attributes is not None
    assert verify.attributes["gen_ai.evaluation.score.value"] == 0.0
    assert verify.attributes["tierroute.verifier.abstained"] is False
    assert verify.attributes["tierroute.verifier.tokens"] == attempts["small"]["verifier_tokens"] == 7
    # its dollars, the attempt's verifier cost (it is the attempt's one verifier), nonzero here
    assert verify.attributes["tierroute.verifier.cost_usd"] == pytest.approx(attempts["small"]["verifier_cost_usd"])
    assert attempts["small"]["verifier_cost_usd"] > 0

    # each decision, under its attempt
    decisions = {parent_of(s): s.attributes for s in named["tierroute.decision"]}
    assert decisions[small_id] is not None and decisions[small_id]["tierroute.decision"] == "escalated"
    assert decisions[large_id] is not None and decisions[large_id]["tierroute.decision"] == "accepted"
    assert decisions[small_id]["tierroute.threshold"] == 0.5
    assert decisions[small_id]["tierroute.task"] == ext["task"]

    # the upstream calls, under their attempts, and the traceparent each one sent
    calls = [s for s in found if s.name.startswith("POST 127.0.0.1")]
    assert sorted(parent_of(s) or "" for s in calls) == sorted([small_id, large_id])
    for s in calls:
        assert s.attributes is not None
        assert s.attributes["tierroute.upstream.attempts"] == 1 and s.attributes["tierroute.upstream.retries"] == 0
        assert s.attributes["tierroute.breaker.state"] == "closed"
    sent = [req.headers.get("traceparent") for req in upstream.requests[sent_before:]]
    assert sorted(sent) == sorted(f"00-{CLIENT_TRACE}-{hexid(s)[1]}-01" for s in calls)

    # the ledger write, under the request
    (write,) = named["tierroute.ledger.write"]
    assert parent_of(write) == server_id
    assert write.attributes is not None and write.attributes["tierroute.request_id"] == rid


async def test_a_stream_is_traced_and_a_bad_traceparent_starts_a_new_trace(cfg: Path) -> None:
    exporter = InMemorySpanExporter()
    async with running(cfg, tracing=Tracing.to(exporter)) as client:
        r = await client.post(
            "/v1/chat/completions", json=chat("hello", stream=True), headers={"traceparent": "00-zz-nonsense-01"}
        )
        assert r.status_code == 200
    first = json.loads(r.text.splitlines()[0][len("data: ") :])
    found = exporter.get_finished_spans()
    named = by_name(list(found))
    (server,) = named["POST /v1/chat/completions"]
    assert server.parent is None  # the malformed header is ignored: a trace of its own
    assert server.attributes is not None and server.attributes["tierroute.request_id"] == first["id"]
    assert len({hexid(s)[0] for s in found}) == 1
    (small,) = named["chat small"]
    assert small.attributes is not None and small.attributes["tierroute.accepted"] is True
    assert "chat large" not in named


async def test_the_upstream_span_counts_the_retries_and_each_attempt_sends_its_traceparent(
    cfg: Path, upstream: FaultUpstream
) -> None:
    exporter = InMemorySpanExporter()
    sent_before = len(upstream.requests)
    upstream.script(status(503), ok())
    async with running(cfg, tracing=Tracing.to(exporter)) as client:
        r = await client.post("/v1/chat/completions", json=chat("hello", model="large"))
        assert r.status_code == 200, r.text
    (call,) = [s for s in exporter.get_finished_spans() if s.name.startswith("POST 127.0.0.1")]
    assert call.attributes is not None
    assert call.attributes["tierroute.upstream.attempts"] == 2 and call.attributes["tierroute.upstream.retries"] == 1
    assert call.attributes["tierroute.breaker.state_after"] == "closed"
    sent = [req.headers.get("traceparent") for req in upstream.requests[sent_before:]]
    trace_id, span_id = hexid(call)
    assert [h[:-3] if h else h for h in sent] == [f"00-{trace_id}-{span_id}"] * 2  # the flags: sampled


async def test_off_the_app_installs_no_tracer_and_no_middleware(cfg: Path) -> None:
    async with running(cfg) as client:
        assert not spans.active()
        assert spans.start("anything") is spans.NOOP
        r = await client.post("/v1/chat/completions", json=chat("hello"))
        assert r.status_code == 200
        app: Any = client.app  # type: ignore[attr-defined]
        assert all(m.cls.__name__ != "RequestTelemetry" for m in app.user_middleware)


@pytest.mark.parametrize(
    ("endpoint", "env", "on"),
    [
        (None, {}, False),
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, True),
        (None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
        (None, {"OTEL_SERVICE_NAME": "gw"}, True),
        ("http://c:4318", {}, True),
        ("http://c:4318", {"OTEL_SDK_DISABLED": "true"}, False),
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": ""}, False),
    ],
)
def test_tracing_is_wanted_only_when_an_endpoint_or_a_standard_variable_says_so(
    endpoint: str | None, env: dict[str, str], on: bool
) -> None:
    assert setup.wanted(TelemetrySettings(endpoint=endpoint), env) is on


def test_a_base_endpoint_gets_the_traces_path_and_a_full_one_is_kept() -> None:
    assert setup.traces_url("http://c:4318") == "http://c:4318/v1/traces"
    assert setup.traces_url("http://c:4318/") == "http://c:4318/v1/traces"
    assert setup.traces_url("http://c:4318/custom/traces") == "http://c:4318/custom/traces"
    with pytest.raises(ValueError, match="http"):
        TelemetrySettings(endpoint="grpc://c:4317")
