"""`tierroute serve` as an operator runs it, with the standard OTEL_* variables and
TIERROUTE_LOGGING__FORMAT=json: its spans reach a real OTLP/HTTP receiver process (protobuf,
decoded with opentelemetry-proto), its stderr is JSON lines, and neither holds the API key or the
prompt; the request id is the same in the response, the log line, the trace and the ledger, and
shadow work is a trace of its own linked to its request."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from scripts.stack_trace_check import check
from tests.support.accounting import auth, chat, keys_section, read_ledger
from tests.support.fault_upstream import FaultUpstream
from tests.support.servers import serve_process
from tests.support.telemetry import PROMPT_MARK, config, leaks, otlp_receiver, received

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
SECOND_TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
VERIFIERS = '[[tiers.verifiers]]\nname = "confidence"\n[[tiers.verifiers]]\nname = "format"\n'

pytestmark = pytest.mark.slow


def test_a_served_process_exports_to_a_live_receiver_and_logs_json_without_secrets(tmp_path: Path) -> None:
    body, raw = keys_section({"ops": {}})
    key = raw["ops"]
    out = tmp_path / "spans.jsonl"
    with FaultUpstream() as upstream, otlp_receiver(out) as receiver:
        # the upstream's answer is ~0.53 sure of itself: accepted at 0.4 as free text, escalated
        # when the format verifier finds it is not the JSON that was asked for
        cfg = config(tmp_path, upstream.base_url, server=body, small_verifiers=VERIFIERS, threshold=0.4, shadow=True)
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver,
            "OTEL_SERVICE_NAME": "gateway-test",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "TIERROUTE_LOGGING__FORMAT": "json",
        }
        log_path = tmp_path / "serve.log"
        with serve_process(cfg, log_path=log_path, env=env) as (_proc, url, _output):
            traceparent = f"00-{CLIENT_TRACE}-b7ad6b7169203331-01"
            accepted = httpx.post(
                f"{url}/v1/chat/completions",
                json=chat(PROMPT_MARK),
                headers={**auth(key), "traceparent": traceparent},
                timeout=60,
            )
            asked_json = {**chat(PROMPT_MARK), "response_format": {"type": "json_object"}}
            escalated = httpx.post(
                f"{url}/v1/chat/completions",
                json=asked_json,
                headers={**auth(key), "traceparent": SECOND_TRACEPARENT},
                timeout=60,
            )
            assert accepted.status_code == 200 and escalated.status_code == 200, (accepted.text, escalated.text)
            deadline = time.monotonic() + 30  # the shadow work runs after the answer
            while time.monotonic() < deadline and not any(
                s["name"].startswith("tierroute.shadow") for s in received(out)
            ):
                time.sleep(0.2)
        # stopped (SIGTERM): the batch processor has flushed what it held
        spans = received(out)
        log_text = log_path.read_text()

    rid, rid2 = accepted.json()["id"], escalated.json()["id"]
    assert escalated.json()["tierroute"]["escalated"] is True
    assert accepted.json()["tierroute"]["escalated"] is False
    servers = {
        s["attributes"].get("tierroute.request_id"): s for s in spans if s["name"] == "POST /v1/chat/completions"
    }
    assert {rid, rid2} <= set(servers)
    assert {s["service"] for s in spans} == {"gateway-test"}

    # the client's trace is kept, and every span of the request is in it
    first = servers[rid]
    assert first["trace_id"] == CLIENT_TRACE and first["parent_span_id"] == "b7ad6b7169203331"
    in_first = [s for s in spans if s["trace_id"] == CLIENT_TRACE]
    names = {s["name"] for s in in_first}
    assert {"chat small", "verify confidence", "verify format", "tierroute.decision", "tierroute.ledger.write"} <= names
    assert any(n.startswith("POST 127.0.0.1") for n in names)

    # the escalated request: both tiers in one trace, tokens as the client was told
    second = [s for s in spans if s["trace_id"] == servers[rid2]["trace_id"]]
    attempts = {a["tier"]: a for a in escalated.json()["tierroute"]["attempts"]}
    for tier in ("small", "large"):
        (span,) = [s for s in second if s["name"] == f"chat {tier}"]
        assert span["attributes"]["gen_ai.usage.output_tokens"] == attempts[tier]["completion_tokens"]
        assert span["attributes"]["tierroute.cost_usd"] == pytest.approx(attempts[tier]["cost_usd"])

    # the stack test's check (scripts/stack_trace_check.py) finds both requests whole
    assert check(accepted.json(), spans, traceparent)[1] == []
    assert check(escalated.json(), spans, SECOND_TRACEPARENT)[1] == []

    # shadow work: a trace of its own, linked to the request it shadows
    shadows = [s for s in spans if s["name"] == "tierroute.shadow large"]
    assert shadows, [s["name"] for s in spans]
    shadow = next(s for s in shadows if s["attributes"]["tierroute.request_id"] == rid)
    assert shadow["trace_id"] != CLIENT_TRACE
    assert shadow["links"] == [{"trace_id": CLIENT_TRACE, "span_id": first["span_id"]}]

    # JSON lines only, one per request with the same id as the response, the span and the ledger
    lines = [json.loads(line) for line in log_text.splitlines() if line.strip()]
    requests = {line["request_id"]: line for line in lines if line["logger"] == "tierroute.request"}
    assert requests[rid]["key"] == "ops" and requests[rid]["status"] == 200
    assert requests[rid2]["tiers_tried"] == ["small", "large"]
    assert any(line["logger"].startswith("uvicorn") for line in lines)
    ledger = read_ledger(tmp_path / "ledger.sqlite3")
    assert rid in ledger and rid2 in ledger

    # nothing holds the key or the prompt
    assert leaks(log_text, key, PROMPT_MARK) == []
    assert leaks(out.read_text(), key, PROMPT_MARK) == []


def test_unconfigured_the_service_never_imports_the_sdk(tmp_path: Path) -> None:
    """Off means free: building the app and serving a request loads no OpenTelemetry SDK, exporter
    or protobuf code, nor the module that wraps them (FastAPI itself imports OpenTelemetry's API)."""
    import subprocess
    import sys

    from tests.support.markers import FastLoop

    FastLoop.check("starts a Python process")
    cfg = config(tmp_path, "http://127.0.0.1:9/v1", server="allow_unauthenticated = true", small_verifiers="")
    code = (
        "import sys, asyncio, httpx\n"
        "from router.api.app import create_app\n"
        "from router.config import load_settings\n"
        f"app = create_app(load_settings({str(cfg)!r}))\n"
        "async def main():\n"
        "    async with app.router.lifespan_context(app):\n"
        "        t = httpx.ASGITransport(app=app)\n"
        "        async with httpx.AsyncClient(transport=t, base_url='http://localhost') as c:\n"
        "            assert (await c.get('/healthz')).status_code == 200\n"
        "asyncio.run(main())\n"
        "heavy = ('opentelemetry.sdk', 'opentelemetry.exporter', 'opentelemetry.proto', 'router.telemetry.otel')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
