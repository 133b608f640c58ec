"""From outside, text a client or an upstream chooses, on its way into the JSON logs and the spans:
a verifier's own words quote the answer (a schema error names the value; `arithmetic` names the
prompt's sum), so the log line's escalation reason and the spans' reasons carry the verifiers'
names and scores but not their words (the ledger keeps those); and characters a line-splitting
reader takes for a line break cannot split a JSON line."""

from __future__ import annotations

import io
import json
import logging
import sqlite3
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from router.telemetry.setup import Tracing
from tests.support.accounting import chat, running
from tests.support.fault_upstream import Action, FaultUpstream, ok, raw, sse, status
from tests.support.telemetry import config, leaks
from verifiers.base import Registry
from verifiers.builtins import register_verifiers

ANSWER_MARK = "ANSWER-MARK-5519"  # in the small tier's answer, which its schema check rejects
SUM = "73919 * 4"  # the prompt's arithmetic, which the `arithmetic` verifier names in its reason
VERIFIERS = """
[[tiers.verifiers]]
name = "format"
params = { json_schema = { type = "object", properties = { n = { type = "integer" } } } }

[[tiers.verifiers]]
name = "arithmetic"
"""


def span_text(exporter: InMemorySpanExporter) -> str:
    found = exporter.get_finished_spans()
    return json.dumps([[s.name, dict(s.attributes or {})] for s in found], default=str)


async def test_the_verifiers_words_stay_out_of_the_log_line_and_the_spans(
    tmp_path: Path, captured: io.StringIO
) -> None:
    exporter = InMemorySpanExporter()
    with FaultUpstream() as upstream:
        cfg = config(
            tmp_path, upstream.base_url, server="allow_unauthenticated = true", small_verifiers=VERIFIERS,
            extra='[logging]\nformat = "json"',
        )  # fmt: skip
        upstream.script(ok(tokens=('{"n": "', ANSWER_MARK, '"}')), ok())
        registry = Registry()
        register_verifiers(registry.register)
        async with running(cfg, tracing=Tracing.to(exporter), registry=registry) as client:
            r = await client.post("/v1/chat/completions", json=chat(f"What is {SUM}?"))
    assert r.status_code == 200, r.text
    rid = r.json()["id"]
    (line,) = [json.loads(x) for x in captured.getvalue().splitlines() if '"tierroute.request"' in x]
    assert line["request_id"] == rid and line["tiers_tried"] == ["small", "large"]
    # the reason still says what the verifiers found, by name and score
    assert line["escalation_reason"].startswith("score 0.000 < threshold 0.50: ")
    assert "format=0.000" in line["escalation_reason"] and "arithmetic=0.000" in line["escalation_reason"]
    assert leaks(captured.getvalue(), ANSWER_MARK, SUM) == []
    assert leaks(span_text(exporter), ANSWER_MARK, SUM) == []
    # the ledger, the place of record, keeps the verifiers' words
    with sqlite3.connect(tmp_path / "ledger.sqlite3") as db:
        (kept,) = db.execute("SELECT reason FROM attempts WHERE request_id = ? AND idx = 0", (rid,)).fetchone()
    assert ANSWER_MARK in kept and SUM in kept


FORGED = 'INFO:uvicorn.access:10.0.0.9 - "POST /admin/keys HTTP/1.1" 200'


@pytest.mark.parametrize(
    "reply",
    [
        status(400, f"bad request\n{FORGED}\x1b[2J"),
        raw(400, f"bad request\r\n{FORGED}\x1b[2J".encode(), content_type="text/plain"),
        sse({"error": {"message": f"cut\n{FORGED}\x1b[2J"}}),
    ],
    ids=["error message", "plain-text body", "stream error event"],
)
async def test_an_upstreams_words_cannot_forge_a_text_log_line(tmp_path: Path, reply: Action) -> None:
    """Text logs (the default) quote a failed upstream's words: a line break or a terminal escape
    in them is written escaped, so a hostile upstream (or one echoing the prompt) adds no line."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s:%(name)s:%(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with FaultUpstream() as upstream:
            cfg = config(tmp_path, upstream.base_url, server="allow_unauthenticated = true", small_verifiers="")
            upstream.script(reply, reply)
            async with running(cfg) as client:
                r = await client.post("/v1/chat/completions", json=chat("hello", model="large", stream=True))
    finally:
        root.removeHandler(handler)
    text = out.getvalue()
    assert "bad request" in text or "cut" in text, text  # the upstream's words are logged
    assert not [line for line in text.splitlines() if line.startswith(FORGED)], text
    assert "\x1b" not in text
    assert r.status_code in (200, 400, 502, 503)


async def test_a_json_line_stays_one_line_whatever_the_client_puts_in_the_path(
    tmp_path: Path, captured: io.StringIO
) -> None:
    """JSON escapes the C0 controls; U+2028, U+2029 and NEL are line breaks to Python's
    `splitlines` (and to editors and some log shippers), and C1 controls (8-bit CSI) to some
    terminals: a path that carries them still leaves one JSON object per line."""
    cfg = config(
        tmp_path, "http://127.0.0.1:9/v1", server="allow_unauthenticated = true", small_verifiers="",
        extra='[logging]\nformat = "json"',
    )  # fmt: skip
    path = "/v1/x%E2%80%A8%7B%22level%22%3A%22error%22%7D%C2%85y%E2%80%A9z%C2%9B2J"
    async with running(cfg) as client:
        r = await client.get(path)
    assert r.status_code == 404
    lines = captured.getvalue().splitlines()
    parsed = [json.loads(line) for line in lines]  # each line is a whole object
    (line,) = [p for p in parsed if p["logger"] == "tierroute.request"]
    assert line["path"] == '/v1/x\u2028{"level":"error"}\x85y\u2029z\x9b2J'  # the value, unchanged
    assert not {"\u2028", "\u2029", "\x85", "\x9b"} & set(captured.getvalue())


async def test_a_server_span_is_named_by_route_not_by_the_clients_path(tmp_path: Path) -> None:
    """Span names are meant to be few (OpenTelemetry: `{method} {route}`, else the method alone):
    a scanner's paths or a model name in the path must not each make a new name, nor put 4 KB
    of the client's text in one. The path itself stays in `url.path`."""
    exporter = InMemorySpanExporter()
    cfg = config(tmp_path, "http://127.0.0.1:9/v1", server="allow_unauthenticated = true", small_verifiers="")
    scanned = "/v1/" + "A" * 4000
    async with running(cfg, tracing=Tracing.to(exporter)) as client:
        assert (await client.get("/v1/models/small")).status_code == 200
        assert (await client.get(scanned)).status_code == 404
        assert (await client.get("/wp-login.php")).status_code == 404
        assert (await client.request("FROBNICATE", "/v1/models")).status_code == 405
    found = exporter.get_finished_spans()
    names = {(s.attributes or {})["url.path"]: s.name for s in found if s.kind is SpanKind.SERVER}
    assert names == {
        "/v1/models/small": "GET /v1/models/{model}",
        scanned: "GET",
        "/wp-login.php": "GET",
        "/v1/models": "HTTP",
    }
